"""k5 without a GPU: both schedules compile for sm_90a with no local memory and every wgmma width
the three tile shapes need, the swap tiles' descriptors read the right operands, the mixed tile
list covers every output element once, the Python mirror of the device schedule produces the
host's list, and the kernel and the Python agree on the constants they share."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.cuda.descriptors import decode_wgmma, read_operand, tma_write_box
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.model.problem import BF16
from moe_gemm.model.routing import expert_counts
from moe_gemm.variants.k5 import K5Adaptive
from moe_gemm.variants.k5.config import MAX_EXPERTS, TOKEN_BOX_ROWS, VARIANT_CONFIGS
from moe_gemm.variants.k5.mirror import swap_descriptors, swap_stage_image
from moe_gemm.variants.k5.mixed_tiles import (
    BM,
    BN,
    FIXED_128,
    POLICIES,
    SWAP_COLS,
    SWAP_MAX_ROWS,
    Policy,
    TileKind,
    device_schedule,
    kind_counts,
    mixed_eta,
    mixed_tile_list,
    unpack,
)

KERNEL = Path(__file__).resolve().parents[1] / "kernels" / "k5_adaptive.cu"
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SHFL", "USETMAXREG", "LDL", "STL")


@pytest.fixture(scope="module", params=["k5/host", "k5/device"])
def compiled(request):
    variant = K5Adaptive(request.param)
    kernel = variant.compile("sm_90a")
    return variant, kernel, opcode_counts(kernel.sass(), OPCODES)


def test_compiles_for_sm90a_without_local_memory(compiled):
    variant, kernel, counts = compiled
    assert kernel.report.spill_bytes == 0 and kernel.report.stack_frame_bytes == 0, kernel.log
    assert counts["LDL"] == counts["STL"] == 0
    assert counts["USETMAXREG"] == 2  # the producer gives registers back, the consumers take them
    resources = variant.resources("sm_90a")
    assert resources.smem_bytes <= 227 * 1024 and resources.blocks_per_sm == 1


def test_every_shape_has_its_wgmma(compiled):
    _, kernel, counts = compiled
    hgmma = [line for line in kernel.sass().splitlines() if "HGMMA" in line]
    wide = [line for line in hgmma if "HGMMA.64x192x16" in line]
    assert wide and all("tnspB" in line and "tnspA" not in line for line in wide)  # M128 and M64: B MN-major
    for tokens in (16, 32, 48, 64):  # SWAP: the weights MN-major as A, the tokens K-major as B
        swap = [line for line in hgmma if f"HGMMA.64x{tokens}x16" in line]
        assert len(swap) == 4, (tokens, len(swap))  # one k16-unrolled loop per width
        assert all("tnspA" in line and "tnspB" not in line for line in swap)
    assert len(hgmma) == len(wide) + 16
    assert counts["UTMASTG"] >= 1 and counts["STSM"] >= 1  # k3's TMA-store epilogue


def test_only_the_device_schedule_scans(compiled):
    variant, _, counts = compiled
    assert (counts["SHFL"] > 0) == (variant.config.schedule == "device"), counts


@pytest.mark.parametrize("tokens", [16, 32, 48, 64])
def test_swap_descriptors_read_the_weights_transposed_and_the_tokens(tokens):
    """Every (warpgroup, k16 step) of a swap stage: the weight operand is B's 64-column box as an
    MN-major 64 x 16 A, the token operand A's rows as a K-major B, and their products add up to
    (A B)^T for the tile."""
    rng = np.random.default_rng(tokens)
    a = rng.integers(-3, 4, (tokens, 64)).astype(BF16)
    b = rng.integers(-3, 4, (64, SWAP_COLS)).astype(BF16)
    smem, base = swap_stage_image(a, b, stage=2)
    product = np.zeros((SWAP_COLS, tokens))
    seen = 0
    for warpgroup, kk, desc_weights, desc_tokens in swap_descriptors(base):
        weights = read_operand(smem, decode_wgmma(desc_weights), "MN", 64)
        np.testing.assert_array_equal(weights, b[16 * kk:16 * kk + 16, 64 * warpgroup:64 * warpgroup + 64].T)
        token_rows = read_operand(smem, decode_wgmma(desc_tokens), "K", tokens)
        np.testing.assert_array_equal(token_rows, a[:, 16 * kk:16 * kk + 16])
        product[64 * warpgroup:64 * warpgroup + 64] += weights.astype(float) @ token_rows.astype(float).T
        seen += 1
    assert seen == 2 * 4
    np.testing.assert_array_equal(product, (a.astype(float) @ b.astype(float)).T)


def test_sixteen_row_boxes_stack_into_k3s_layout():
    """M64 tiles load A in four 16-row boxes: the bytes must be those one 64-row box would write,
    so that k3's descriptors (checked in test_descriptors.py) read them unchanged."""
    rows = np.random.default_rng(1).integers(-3, 4, (64, 64)).astype(BF16)
    one, four = np.zeros(16384, np.uint8), np.zeros(16384, np.uint8)
    tma_write_box(one, 1024, rows, 128)
    for box in range(64 // TOKEN_BOX_ROWS):
        box_rows = rows[box * TOKEN_BOX_ROWS:(box + 1) * TOKEN_BOX_ROWS]
        tma_write_box(four, 1024 + box * TOKEN_BOX_ROWS * 128, box_rows, 128)
    np.testing.assert_array_equal(one, four)


ROUTINGS = [np.array(c) for c in ([0, 70, 0, 0, 130, 0], [1, 5, 17, 31], [33, 65, 129, 200], [300], [0, 0, 0],
                                  [64, 128, 192, 256, 16, 48])]
ROUTINGS += [expert_counts(64, t, s) for t, s in ((512, 1.6), (2048, 0.0), (16384, 1.2))]


@pytest.mark.parametrize("counts", ROUTINGS, ids=lambda c: f"E{c.size}-M{int(c.sum())}")
@pytest.mark.parametrize("N", [200, 2688])
def test_every_output_element_is_covered_once(counts, N):
    for policy in POLICIES:
        tiles = mixed_tile_list(counts, N, policy)
        kinds, rows = unpack(tiles)
        cover = np.zeros((int(counts.sum()), N), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for (expert, row0, _, col0), kind, r in zip(tiles.tolist(), kinds.tolist(), rows.tolist()):
            assert offsets[expert] <= row0 and row0 + r <= offsets[expert + 1]  # inside its expert
            assert r <= (64 if kind != TileKind.M128 else BM)
            width = SWAP_COLS if kind == TileKind.SWAP else BN
            cover[row0:row0 + r, col0:min(col0 + width, N)] += 1
        assert (cover == 1).all(), policy


@pytest.mark.parametrize("counts", ROUTINGS, ids=lambda c: f"E{c.size}-M{int(c.sum())}")
def test_the_device_schedule_mirror_is_the_host_list(counts):
    for policy in POLICIES:
        np.testing.assert_array_equal(device_schedule(counts, 2688, policy), mixed_tile_list(counts, 2688, policy))


def test_longest_first_order_is_a_permutation_sorted_by_kind():
    counts = expert_counts(64, 16384, 1.2)
    policy = Policy(32, 64)
    expert, lpt = mixed_tile_list(counts, 2688, policy), mixed_tile_list(counts, 2688, policy, order="kind")
    assert sorted(map(tuple, expert.tolist())) == sorted(map(tuple, lpt.tolist()))
    kinds, _ = unpack(lpt)
    assert (np.diff(kinds) >= 0).all() and set(kind_counts(lpt).values()) != {0}
    with pytest.raises(ValueError, match="order must be 'kind' or 'expert'"):
        mixed_tile_list(counts, 2688, policy, order="random")


@pytest.mark.parametrize(("counts", "policy", "expected"), [
    ([5], FIXED_128, 5 / 128), ([5], Policy(64, 64), 5 / 16), ([60], Policy(0, 64), 60 / 64),
    ([200], Policy(64, 64), 200 / 256),  # r = 72 > 64: an M128 tile whatever the policy
    ([130], Policy(16, 16), 130 / 144), ([0, 0], FIXED_128, 1.0)])
def test_mixed_eta(counts, policy, expected):
    assert mixed_eta(np.array(counts), policy) == pytest.approx(expected)


def test_policies_refuse_what_the_kernel_cannot_do():
    with pytest.raises(ValueError, match="multiple of 16"):
        Policy(swap_max=20)
    with pytest.raises(ValueError, match=r"\[0, 64\]"):
        Policy(swap_max=80)
    with pytest.raises(ValueError, match="m64_max must be 0, 64 or swap_max"):
        Policy(16, 32)
    with pytest.raises(ValueError, match="unknown k5 variant"):
        K5Adaptive("k5/m256")
    assert len(POLICIES) == 9 and POLICIES[0] == FIXED_128


def test_the_kernel_and_the_python_share_their_constants():
    source = KERNEL.read_text()

    def constant(name: str) -> int:
        return int(re.search(rf"\b{name} = (\d+)", source).group(1))

    assert (constant("BM"), constant("BN")) == (BM, BN)
    assert constant("SWAP_COLS") == SWAP_COLS and constant("SWAP_MAX_ROWS") == SWAP_MAX_ROWS
    assert constant("MAX_EXPERTS") == MAX_EXPERTS and constant("TOKEN_BOX_ROWS") == TOKEN_BOX_ROWS
    assert [f"{k.name} = {k.value}" for k in TileKind] == re.findall(r"(M128 = 0|M64 = 1|SWAP = 2)", source)
    assert {c.kernel_name for c in VARIANT_CONFIGS.values()} == {"k5_adaptive<4, false>", "k5_adaptive<4, true>"}


def test_the_models_choice_is_made_once_per_routing_and_calibration(monkeypatch):
    import moe_gemm.variants.k5 as k5
    from moe_gemm.variants.k5.cost_model import nominal_calibration

    calls = []
    real = k5.choose_policy
    monkeypatch.setattr(k5, "choose_policy", lambda *a: calls.append(a) or real(*a))
    variant, counts = K5Adaptive("k5/host"), expert_counts(64, 2048, 1.2)
    first = variant.policy_for(counts, 1024, 2688, 132)
    assert variant.policy_for(counts.copy(), 1024, 2688, 132) == first and len(calls) == 1
    variant.policy_for(expert_counts(64, 2048, 0.0), 1024, 2688, 132)
    assert len(calls) == 2  # another routing
    variant.calibration = nominal_calibration()
    assert variant.policy_for(counts, 1024, 2688, 132) == first and len(calls) == 3  # another calibration
