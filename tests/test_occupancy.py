"""The occupancy and issue model against the seed's B300 checks (its register and issue-rate arithmetic, recomputed)."""

from __future__ import annotations

import math

import pytest

from moe_gemm.model.occupancy import (
    HOPPER,
    Residency,
    SMLimits,
    blocks_per_sm,
    issue_rate,
    max_registers_for,
    registers_per_warp,
    residency,
    sm_ipc,
)


@pytest.mark.parametrize(
    ("registers", "per_warp"),
    [(1, 256), (8, 256), (9, 512), (56, 1792), (64, 2048), (72, 2304), (73, 2560), (94, 3072), (95, 3072),
     (96, 3072), (123, 4096), (128, 4096), (255, 8192)],
)
def test_registers_per_warp_rounds_up_to_256(registers: int, per_warp: int) -> None:
    assert registers_per_warp(registers) == per_warp
    assert per_warp == math.ceil(32 * registers / 256) * 256


@pytest.mark.parametrize(
    ("registers", "warps", "blocks"),
    [(95, 8, 2), (123, 9, 1), (94, 9, 2), (72, 9, 3), (73, 9, 2), (64, 8, 4), (56, 8, 4)],
)
def test_seed_register_limits(registers: int, warps: int, blocks: int) -> None:
    assert residency(registers, warps).by_registers == blocks
    assert blocks_per_sm(registers, warps) == blocks


def test_seed_register_arithmetic() -> None:
    # STAGES=3: 123 regs -> 4,096 per warp x 9 warps = 36,864 per block -> 1 block.
    assert registers_per_warp(123) * 9 == 36_864
    # STAGES=2: 94 regs -> 3,072 per warp x 9 warps = 27,648 per block -> 2 blocks.
    assert registers_per_warp(94) * 9 == 27_648
    # k1/BM=128: 95 regs, 8 warps -> 16 resident warps and 16K registers left idle.
    assert 65536 - 2 * registers_per_warp(95) * 8 == 16_384


def test_third_nine_warp_block_needs_72_registers() -> None:
    assert max_registers_for(3, 9) == 72
    assert blocks_per_sm(72, 9) == 3
    assert blocks_per_sm(73, 9) == 2


@pytest.mark.parametrize(("blocks", "warps"), [(1, 4), (2, 8), (3, 9), (4, 8), (2, 12), (7, 9)])
def test_max_registers_for_is_the_boundary(blocks: int, warps: int) -> None:
    r = max_registers_for(blocks, warps)
    assert residency(r, warps).by_registers >= blocks
    if r < HOPPER.max_registers_per_thread:
        assert residency(r + 1, warps).by_registers < blocks


def test_max_registers_capped_at_255() -> None:
    assert max_registers_for(1, 1) == 255


def test_seed_issue_model() -> None:
    assert issue_rate(3.90, 8.49) == pytest.approx(0.459, abs=5e-4)
    assert sm_ipc(3.90, 8.49) == pytest.approx(1.84, abs=5e-3)
    assert sm_ipc(3.90, 8.49) == pytest.approx(4 * 3.90 / 8.49)


def test_issue_rate_caps_at_one() -> None:
    assert issue_rate(16, 4) == 1.0
    assert sm_ipc(16, 4) == 4.0
    assert issue_rate(0, 4) == 0.0


@pytest.mark.parametrize(
    ("w", "cycles", "pattern"),
    [(-1, 8.0, "warps_per_scheduler"), (math.nan, 8.0, "warps_per_scheduler"), (4, 0, "cycles_per_issue"),
     (4, -2.0, "cycles_per_issue"), (4, math.nan, "cycles_per_issue"), (4, math.inf, "cycles_per_issue")],
)
def test_issue_rate_rejects_bad_values(w: float, cycles: float, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        issue_rate(w, cycles)


def test_shared_memory_limit() -> None:
    # The runtime reserves 1 KB per block: 228 KB / (100 KB + 1 KB) -> 2 blocks.
    assert residency(32, 4, 100 * 1024).by_smem == 2
    assert residency(32, 4, 75 * 1024).by_smem == 3
    assert residency(32, 4, 76 * 1024).by_smem == 2
    assert residency(32, 4, 227 * 1024).by_smem == 1
    with pytest.raises(ValueError, match="smem_per_block"):
        residency(32, 4, 227 * 1024 + 1)
    with pytest.raises(ValueError, match="smem_per_block"):
        residency(32, 4, -1)


def test_warp_and_block_limits() -> None:
    assert residency(32, 9).by_warps == 7  # 64 // 9: the seed's "Warps: 7"
    assert residency(32, 32).by_warps == 2
    assert residency(16, 1).by_blocks == 32
    assert blocks_per_sm(16, 1) == 32  # 1-warp blocks stop at the 32-block limit, not 64 warps


@pytest.mark.parametrize(
    ("args", "limiter", "blocks"),
    [
        ((94, 9, 65 * 1024), "registers", 2),
        ((32, 4, 100 * 1024), "shared memory", 2),
        ((16, 16, 0), "warps", 4),
        ((16, 1, 0), "blocks", 32),
    ],
)
def test_limiter_names_the_tightest_limit(args: tuple, limiter: str, blocks: int) -> None:
    result = residency(*args)
    assert result.limiter == limiter
    assert result.blocks == blocks


def test_residency_is_the_minimum() -> None:
    assert Residency(by_registers=3, by_smem=2, by_warps=7, by_blocks=32).blocks == 2


def test_other_limits() -> None:
    small = SMLimits(registers=32768, warps=48, blocks=16)
    assert residency(64, 8, limits=small).by_registers == 2  # 2,048 x 8 = 16,384 per block
    assert residency(16, 1, limits=small).by_blocks == 16


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: registers_per_warp(0), "registers_per_thread"),
        (lambda: registers_per_warp(256), "registers_per_thread"),
        (lambda: registers_per_warp(95.0), "registers_per_thread"),
        (lambda: residency(95, 0), "warps_per_block"),
        (lambda: max_registers_for(0, 8), "blocks"),
        (lambda: max_registers_for(2, 0), "warps_per_block"),
    ],
)
def test_bad_arguments_name_the_parameter(call, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        call()
