"""k3 without a GPU: every rung of the ladder compiles for sm_90a with no local memory and the
instructions chapter 04 is about, the residency the model reads from it, the cluster pairing, the
launch grid, and the inputs the kernel refuses."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.model.occupancy import residency
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.k3 import K3Wgmma, check_inputs
from moe_gemm.variants.k3.clusters import cluster_pairs
from moe_gemm.variants.k3.config import LADDER
from moe_gemm.variants.k3.mirror import warpgroup_split

OPCODES = ("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "UCGABAR",
           "LDSM", "HMMA", "LDL", "STL")


@pytest.fixture(scope="module", params=list(LADDER))
def compiled(request):
    variant = K3Wgmma(request.param)
    kernel = variant.compile("sm_90a")
    return variant, kernel, opcode_counts(kernel.sass(), OPCODES)


def test_compiles_for_sm90a_without_local_memory(compiled):
    variant, kernel, counts = compiled
    report = kernel.report
    assert report.spill_bytes == 0 and report.stack_frame_bytes == 0, kernel.log
    assert counts["LDL"] == counts["STL"] == 0
    assert "C7508" not in kernel.log, "ptxas ignored setmaxnreg"  # the warning it gives when it does


def test_the_mma_is_hgmma_from_shared_memory_descriptors(compiled):
    variant, kernel, counts = compiled
    split = warpgroup_split(variant.config)
    # 4 k16 steps x m_iters, unrolled once in the main loop; no ldmatrix and no mma.sync left
    assert counts["HGMMA"] == 4 * split.m_iters, counts
    assert counts["LDSM"] == 0 and counts["HMMA"] == 0, counts
    sass = kernel.sass()
    width = f"HGMMA.64x{split.cols}x16.F32.BF16"
    assert width in sass
    hgmma = [line for line in sass.splitlines() if "HGMMA" in line]
    assert all("gdesc" in line for line in hgmma)  # both operands through descriptors
    transposed = [("tnspB" in line) for line in hgmma]
    assert all(transposed) if variant.config.b_layout == "kn" else not any(transposed)
    assert counts["WARPGROUP.ARRIVE"] >= 1 and counts["WARPGROUP.DEPBAR"] >= 2  # fence; wait 1 and wait 0


def test_tma_barriers_and_register_handover(compiled):
    variant, _, counts = compiled
    assert counts["UTMALDG"] >= 2 and counts["SYNCS"] >= 4, counts
    assert counts["USETMAXREG"] == (2 if variant.config.consumers == 2 else 0), counts
    assert (counts["UCGABAR"] > 0) == (variant.config.cluster == 2), counts  # barrier.cluster


def test_resources_and_residency(compiled):
    variant, kernel, _ = compiled
    resources = variant.resources("sm_90a")
    config = variant.config
    assert resources.warps_per_block == config.threads // 32 == (12 if config.consumers == 2 else 5)
    assert resources.smem_bytes == kernel.report.static_smem_bytes + config.dynamic_smem_bytes
    assert kernel.report.static_smem_bytes == 2 * 8 * config.stages  # full[] and empty[]
    fit = residency(resources.registers, resources.warps_per_block, resources.smem_bytes)
    # 384 threads at the 168-register cap fill the register file; (a) fits two 160-thread blocks
    assert fit.blocks == (1 if config.consumers == 2 else 2)
    if config.consumers == 2:
        assert resources.registers == 168  # 65,536 / 384, rounded down to a multiple of 8


def test_ladder_names_and_configs():
    assert list(LADDER)[:3] == ["k3/1wg-bn128", "k3/2wg-bn128", "k3/2wg-bn256"]
    for name, config in LADDER.items():
        assert config.dynamic_smem_bytes <= 227 * 1024, name
        assert ("multicast" in name) == (config.cluster == 2)
        assert (not name.startswith(("k3/1wg", "k3/2wg"))) == config.persistent
        assert ("tmastore" in name) == config.tma_store
        assert name.endswith("-kmajor") == (config.b_layout == "nk")
    with pytest.raises(ValueError, match="unknown k3 variant"):
        K3Wgmma("k3/nope")


@pytest.mark.parametrize(("K", "N", "rule"), [
    (100, 2688, "K to be a multiple of 8"),
    (1024, 2690, "N to be a multiple of 8"),
    (1000, 2688, "multiple of BK = 64"),
    (0, 2688, "K to be a positive multiple of BK = 64"),
])
def test_shapes_the_kernel_cannot_take(K, N, rule):
    with pytest.raises(ValueError, match=rule):
        check_inputs(K, N)


def test_misaligned_addresses_are_refused():
    with pytest.raises(ValueError, match="B to start on a 16-byte boundary"):
        check_inputs(1024, 2688, 0, 8)


# --------------------------------------------------------------------------- cluster pairs

def _pairs(counts, N=2688, bm=128, bn=192):
    return cluster_pairs(np.array(counts), N, bm, bn).reshape(-1, 2, 4)


def test_pairs_cover_every_tile_once():
    counts = expert_counts(64, 16384, 1.2)
    flat = tile_list(counts, 2688, 128, 192)
    pairs = _pairs(counts).reshape(-1, 4)
    real = pairs[pairs[:, 2] > 0]
    as_set = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert as_set(real) == as_set(flat)


def test_pairs_share_expert_and_columns_where_they_can():
    pairs = _pairs([256, 384, 0, 128])  # 2 M tiles, 3 M tiles, none, 1 M tile; 14 N tiles each
    same = (pairs[:, 0, 0] == pairs[:, 1, 0]) & (pairs[:, 0, 3] == pairs[:, 1, 3])
    multicast = pairs[same & (pairs[:, 0, 1] != pairs[:, 1, 1])]
    assert len(multicast) == 14 + 14  # expert 0's pair and expert 1's first pair, per N column
    # rows 2j and 2j+1 of one expert: the second tile starts BM rows after the first
    assert np.all(multicast[:, 1, 1] - multicast[:, 0, 1] == 128)
    lone = pairs[~same]
    assert len(lone) == (14 + 14) // 2  # expert 1's third M tile and expert 3's tile, paired up
    assert len(pairs) == 28 + 14


def test_an_odd_lone_tile_is_paired_with_an_idle_copy():
    pairs = _pairs([128], N=192)  # one tile in all
    assert pairs.shape == (1, 2, 4)
    assert pairs[0, 1, 2] == 0 and np.array_equal(pairs[0, 0, [0, 1, 3]], pairs[0, 1, [0, 1, 3]])
    assert _pairs([0, 0]).shape == (0, 2, 4)


# --------------------------------------------------------------------------- the launch grid

def test_grid_is_one_block_per_tile_or_per_sm_slot():
    one_per_tile, persistent, multicast = (K3Wgmma(n) for n in ("k3/2wg-bn128", "k3/persistent-bn192",
                                                                  "k3/multicast-bn192"))
    assert one_per_tile.grid(2688, 132, 1) == 2688
    assert persistent.grid(2688, 132, 1) == 132
    assert persistent.grid(40, 132, 1) == 40  # fewer tiles than slots: one block each
    assert multicast.grid(900, 132, 1) == 132  # 66 clusters of two
    assert multicast.grid(10, 132, 1) == 20
