"""The shared-memory descriptor module without a GPU: the swizzle, the TMA box model, the wgmma
descriptor's bit fields, and the interpreter against logical tiles, for every descriptor k3 builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.descriptors import (
    MatrixLayout,
    canonical_offset,
    decode_wgmma,
    encode_wgmma,
    operand_plan,
    read_operand,
    swizzle,
    tma_write_box,
)
from moe_gemm.model.problem import BF16
from moe_gemm.variants.k3.config import LADDER, K3Config
from moe_gemm.variants.k3.mirror import stage_image, warpgroup_descriptors
from moe_gemm.variants.sm90.maps import plans


def integer_tile(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct-ish small integers (exact in bf16), so a misplaced element shows."""
    return rng.integers(-120, 121, size=shape).astype(BF16)


# --------------------------------------------------------------------------- the swizzle

def test_128b_swizzle_is_chunk_xor_row():
    # chunk c of row r (128-byte rows) lands in slot c ^ (r % 8): PTX ISA #tensor-swizzling-modes
    for row in range(16):
        for chunk in range(8):
            logical = row * 128 + chunk * 16 + 6  # a byte inside the chunk keeps its offset
            assert swizzle(logical, 128) == row * 128 + ((chunk ^ (row % 8)) << 4) + 6


@pytest.mark.parametrize(("span", "xor_bits"), [(32, 0b1), (64, 0b11), (128, 0b111)])
def test_swizzle_is_cute_swizzle_b_4_3_and_a_permutation_of_each_atom(span, xor_bits):
    # Swizzle<B, 4, 3>: bits [7, 7 + B) XOR into bits [4, 4 + B), B = log2(span / 16)
    atom = np.arange(8 * span)
    moved = swizzle(atom, span)
    np.testing.assert_array_equal(moved, atom ^ (((atom >> 7) & xor_bits) << 4))
    assert sorted(moved.tolist()) == atom.tolist()


def test_no_swizzle_is_identity_and_bad_span_is_refused():
    assert swizzle(12345 * 16, 0) == 12345 * 16
    with pytest.raises(ValueError, match="swizzle span"):
        swizzle(0, 96)


def test_tma_box_rules():
    smem = np.zeros(8192, np.uint8)
    with pytest.raises(ValueError, match="must be 128 bytes"):
        tma_write_box(smem, 0, np.zeros((8, 32), BF16), 128)
    with pytest.raises(ValueError, match="not aligned to the 1024-byte swizzle atom"):
        tma_write_box(smem, 512, np.zeros((8, 64), BF16), 128)


# --------------------------------------------------------------------------- the descriptor's bits

def test_wgmma_descriptor_fields_match_the_isa_table():
    # PTX ISA "Matrix Descriptor Format": start>>4 in 0-13, LBO>>4 in 16-29, SBO>>4 in 32-45,
    # base offset in 49-51, swizzle in 62-63 with 1 = 128B, 2 = 64B, 3 = 32B.
    layout = MatrixLayout(start=0x1A400, lbo=8192, sbo=1024, span=128)
    bits = encode_wgmma(layout)
    assert bits & 0x3FFF == 0x1A400 >> 4
    assert bits >> 16 & 0x3FFF == 8192 >> 4
    assert bits >> 32 & 0x3FFF == 1024 >> 4
    assert bits >> 49 & 7 == 0
    assert bits >> 62 == 1
    assert decode_wgmma(bits) == layout
    for span, code in ((0, 0), (128, 1), (64, 2), (32, 3)):
        assert encode_wgmma(MatrixLayout(0, 16, 1024, span)) >> 62 == code


def test_k_major_plan_matches_the_well_known_constants():
    # The K-major 128B-swizzle bf16 descriptor every public Hopper GEMM builds: LBO field 1
    # (16 bytes, unused), SBO field 64 (1024 bytes), swizzle 1 (e.g. pranjalssh/fast.cu
    # examples/matmul/matmul_11.cuh, make_smem_desc).
    plan = operand_plan("K")
    assert plan.bits == (1 << 16) | (64 << 32) | (1 << 62)
    assert (plan.k16_bytes, plan.mn64_bytes) == (32, 8192)


def test_mn_major_plan():
    plan = operand_plan("MN")
    assert plan.bits == ((8192 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)
    assert (plan.k16_bytes, plan.mn64_bytes) == (2048, 8192)


def test_descriptor_refusals():
    with pytest.raises(ValueError, match="multiple of 16"):
        MatrixLayout(start=8, lbo=16, sbo=1024, span=128)
    with pytest.raises(ValueError, match="reserved bits"):
        decode_wgmma(1 << 14)
    with pytest.raises(ValueError, match="BK = 64"):
        operand_plan("K", bk=32)
    with pytest.raises(ValueError, match="major"):
        operand_plan("X")  # type: ignore[arg-type]


def test_swizzled_k_major_rows_hold_at_most_one_row_of_k():
    layout = MatrixLayout(0, 16, 1024, 128)
    with pytest.raises(ValueError, match="at most 64 K"):
        canonical_offset(np.array([0]), np.array([64]), layout, "K")


# --------------------------------------------------------------------------- the interpreter

def test_interpreter_reads_a_k_major_tile_for_every_k16_step():
    rng = np.random.default_rng(1)
    smem = np.zeros(64 * 1024, np.uint8)
    a = integer_tile(rng, (128, 64))
    base = 3 * 1024
    tma_write_box(smem, base, a, 128)
    plan = operand_plan("K")
    for block in range(2):
        for kk in range(4):
            got = read_operand(smem, plan.layout(base, block, kk), "K", 64)
            np.testing.assert_array_equal(got, a[64 * block: 64 * block + 64, 16 * kk: 16 * kk + 16])


def test_interpreter_reads_an_mn_major_tile_for_every_k16_step():
    rng = np.random.default_rng(2)
    smem = np.zeros(64 * 1024, np.uint8)
    b = integer_tile(rng, (64, 256))  # 64 of K x 256 columns, N contiguous
    base = 8 * 1024
    for box in range(4):
        tma_write_box(smem, base + box * 8192, b[:, 64 * box: 64 * box + 64], 128)
    plan = operand_plan("MN")
    for kk in range(4):
        got = read_operand(smem, plan.layout(base, 0, kk), "MN", 256)
        np.testing.assert_array_equal(got, b[16 * kk: 16 * kk + 16].T)


def test_the_wrong_major_reads_the_wrong_matrix():
    # The interpreter must be able to fail: the MN-major bytes read as K-major are something else.
    rng = np.random.default_rng(3)
    smem = np.zeros(32 * 1024, np.uint8)
    b = integer_tile(rng, (64, 64))
    tma_write_box(smem, 0, b, 128)
    wrong = read_operand(smem, MatrixLayout(0, 16, 1024, 128), "K", 64)
    assert not np.array_equal(wrong, b[:16].T)


def test_an_unswizzled_read_of_swizzled_bytes_differs():
    rng = np.random.default_rng(4)
    smem = np.zeros(32 * 1024, np.uint8)
    a = integer_tile(rng, (64, 64))
    tma_write_box(smem, 0, a, 128)
    plain = read_operand(smem, MatrixLayout(0, 128, 1024, 0), "K", 64)
    assert not np.array_equal(plain, a[:, :16])


# --------------------------------------------------------------------------- every descriptor k3 builds

@pytest.mark.parametrize("name", list(LADDER))
def test_every_k3_descriptor_reads_its_logical_sub_tile(name):
    """For each rung: fill one ring stage as the producer's TMA boxes would, then check every
    (warpgroup, m64 slice, k16 step) descriptor the consumers build against the logical tile."""
    config: K3Config = LADDER[name]
    rng = np.random.default_rng(5)
    a = integer_tile(rng, (config.bm, 64))
    b = integer_tile(rng, (64, config.bn))  # logical [K, N] whatever the layout in memory
    stage = 2  # not stage 0: the ring offset must be part of what is checked
    smem, ring = stage_image(config, a, b, stage)
    plan_a, plan_b = plans(config.b_layout)
    seen = 0
    for wg, i, kk, rows, cols, desc_a, desc_b in warpgroup_descriptors(config, ring, stage):
        got_a = read_operand(smem, decode_wgmma(desc_a), plan_a.major, 64)
        got_b = read_operand(smem, decode_wgmma(desc_b), plan_b.major, cols.stop - cols.start)
        np.testing.assert_array_equal(got_a, a[rows, 16 * kk: 16 * kk + 16], err_msg=f"{name} A wg{wg} i{i} k{kk}")
        np.testing.assert_array_equal(got_b, b[16 * kk: 16 * kk + 16, cols].T, err_msg=f"{name} B wg{wg} k{kk}")
        seen += 1
    per_wg = (config.bm // (64 * (config.consumers if config.bm >= 64 * config.consumers else 1))) * 4
    assert seen == config.consumers * per_wg


@pytest.mark.parametrize("name", ["k3/1wg-bn128", "k3/persistent-bn192", "k3/persistent-bm64-bn256",
                                  "k3/multicast-bn192-kmajor"])
def test_interpreted_wgmma_products_give_the_tile(name):
    """The four k16 steps of every warpgroup, multiplied as the tensor core would multiply what the
    descriptors name, add up to A @ B over the stage for that warpgroup's part of the tile."""
    config = LADDER[name]
    rng = np.random.default_rng(6)
    a = integer_tile(rng, (config.bm, 64))
    b = integer_tile(rng, (64, config.bn))
    smem, ring = stage_image(config, a, b, 1)
    plan_a, plan_b = plans(config.b_layout)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    out = np.zeros_like(expected)
    for _, _, kk, rows, cols, desc_a, desc_b in warpgroup_descriptors(config, ring, 1):
        tile_a = read_operand(smem, decode_wgmma(desc_a), plan_a.major, 64).astype(np.float64)
        tile_b = read_operand(smem, decode_wgmma(desc_b), plan_b.major, cols.stop - cols.start).astype(np.float64)
        out[rows, cols] += tile_a @ tile_b.T
    np.testing.assert_array_equal(out, expected)


def test_the_start_address_is_masked_to_its_18_bits():
    # Should a shared::cta address carry bits above 17 (the PTX ISA does not rule it out; CUTLASS's
    # sm_100 TMA code assumes a block's rank at bit 24), unmasked they would land in LBO (bit 16
    # up). The kernel masks (ptx.cuh, matrix_descriptor) and so must the mirror.
    for major in ("K", "MN"):
        plan = operand_plan(major)
        for high in (1 << 18, 1 << 24, 3 << 24):
            assert plan.descriptor(high + 0x2400, 1, 2) == plan.descriptor(0x2400, 1, 2)
            assert decode_wgmma(plan.descriptor(high + 0x2400, 1, 2)).lbo == decode_wgmma(plan.bits).lbo
    source = (Path(__file__).resolve().parents[1] / "kernels" / "ptx.cuh").read_text()
    assert "(smem_addr & 0x3FFFF) >> 4" in source
