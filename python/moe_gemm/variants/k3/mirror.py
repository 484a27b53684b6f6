"""A numpy mirror of k3's shared memory: the ring stage the TMA boxes write and the descriptors each
consumer warpgroup builds, so the descriptor interpreter can check them on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_gemm.cuda.descriptors import tma_write_box
from moe_gemm.variants.k3.config import K3Config
from moe_gemm.variants.sm90.config import BK, BOX, SWIZZLE_ALIGN
from moe_gemm.variants.sm90.maps import plans


@dataclass(frozen=True)
class WarpgroupSplit:
    """How the consumer warpgroups share a BM x BN tile (sm90::Config of kernels/wgmma_config.cuh, in Python)."""

    wg_m: int  # warpgroups along M
    wg_n: int  # warpgroups along N
    rows: int  # rows per warpgroup
    cols: int  # columns per warpgroup: the wgmma's N
    m_iters: int  # m64 wgmmas per k16 step


def warpgroup_split(config: K3Config) -> WarpgroupSplit:
    wg_m = config.consumers if config.bm // 64 >= config.consumers else 1
    wg_n = config.consumers // wg_m
    rows = config.bm // wg_m
    return WarpgroupSplit(wg_m, wg_n, rows, config.bn // wg_n, rows // 64)


# --8<-- [start:mirror]
def stage_image(config: K3Config, a: np.ndarray, b: np.ndarray, stage: int) -> tuple[np.ndarray, int]:
    """Shared memory after the producer's TMA boxes for one K step landed in ring stage ``stage``.

    ``a`` is the A box [BM, 64], ``b`` the logical B tile [64, BN] (K x N) whatever its layout in
    global memory. Returns the bytes and the ring's address (1 KB-aligned, as the kernel makes it).
    Mirrors kernels/tma_pipeline.cuh, produce(): A at the stage's start, then BN/64 boxes of 8 KB.
    """
    ring = SWIZZLE_ALIGN
    smem = np.zeros(ring + (stage + 1) * config.stage_bytes, dtype=np.uint8)
    base = ring + stage * config.stage_bytes
    tma_write_box(smem, base, a, 128)
    for box in range(config.bn // BOX):
        panel = b[:, box * BOX: (box + 1) * BOX]  # 64 of K x 64 columns
        dst = base + config.bm * BK * 2 + box * BOX * BK * 2
        tma_write_box(smem, dst, panel if config.b_layout == "kn" else panel.T, 128)
    return smem, ring


def warpgroup_descriptors(config: K3Config, ring: int, stage: int):
    """Every (warpgroup, m64 slice, k16 step) descriptor pair the consumers build for one stage,
    with the rows and columns of the tile it must cover. Mirrors kernels/k3_wgmma.cu,
    multiply_tile(): A slice (wg_m * m_iters + i), B from 64-column block wg_n * cols / 64."""
    split = warpgroup_split(config)
    plan_a, plan_b = plans(config.b_layout)
    a_tile = ring + stage * config.stage_bytes
    b_tile = a_tile + config.bm * BK * 2
    for wg in range(config.consumers):
        wg_m, wg_n = wg % split.wg_m, wg // split.wg_m
        cols = slice(wg_n * split.cols, (wg_n + 1) * split.cols)
        for kk in range(BK // 16):
            desc_b = plan_b.descriptor(b_tile, wg_n * split.cols // BOX, kk)
            for i in range(split.m_iters):
                block = wg_m * split.m_iters + i
                rows = slice(64 * block, 64 * (block + 1))
                yield wg, i, kk, rows, cols, plan_a.descriptor(a_tile, block, kk), desc_b
# --8<-- [end:mirror]
