"""k3: Hopper wgmma (kernels/k3_wgmma.cu), chapter 04.

Consumer warpgroups multiply straight from a 128-byte-swizzled TMA ring with
``wgmma.mma_async``; the variants are the rungs of the chapter's ladder:

======================  ===========================================================================
``k3/1wg-bn128``        (a) one consumer warpgroup (128 x 128 tile, two m64 wgmmas per k16) and a
                        producer warp; one block per tile, two blocks per SM
``k3/2wg-bn128/256``    (b) two consumer warpgroups (one m64 slice each) and a producer warpgroup
                        whose registers ``setmaxnreg`` hands to them; one block per tile
``k3/persistent-bn*``   (c) the same block, one per SM, walking the flat tile list with a stride
``k3/multicast-bn*``    (d) persistent clusters of two blocks on two M tiles of one expert and N
                        column, each loading half of B for both (TMA multicast)
``...-bm64-...``        64-row tiles, the two warpgroups splitting the columns (small experts)
``...-kmajor``          B given as B^T [E, N, K] (an offline weight-layout step, timed apart)
======================  ===========================================================================

What the kernel cannot take is refused here, before any launch, with a ValueError naming the rule:
K and N multiples of 8 (TMA's 16-byte strides), K a multiple of BK = 64, A and B on 16-byte
boundaries, and a GPU of compute capability 9.0 (``wgmma`` and ``setmaxnreg`` exist only in the
sm_90a target, whose code runs on no other architecture).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, to_device
from moe_gemm.cuda.launch import TensorMapArg, launch, max_active_clusters, prefer_shared_memory
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.occupancy import residency
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.compiled import NamedConfigVariant
from moe_gemm.variants.k3.clusters import cluster_pairs
from moe_gemm.variants.k3.config import KERNEL_FUNCTION, LADDER, SANITIZED, SOURCE
from moe_gemm.variants.sm90.config import BK
from moe_gemm.variants.sm90.maps import check_inputs as sm90_check_inputs
from moe_gemm.variants.sm90.maps import operand_maps, output_map, plan_argument, plans, require_sm90a, transposed_b


def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of TMA or of the kernel that these inputs break."""
    sm90_check_inputs("k3", K, N, a_address, b_address)


class K3Wgmma(NamedConfigVariant):
    """One rung of chapter 04's ladder: ``K3Wgmma("k3/persistent-bn192")``."""

    bk = BK
    kernel_function = KERNEL_FUNCTION
    source = SOURCE

    configs = LADDER
    family = "k3"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.bm, self.bn = self.config.bm, self.config.bn
        self.warps_per_block = self.config.threads // 32

    def tiles(self, counts: np.ndarray, N: int) -> np.ndarray:
        """The descriptors the launch walks: the flat tile list, or its cluster pairs."""
        if self.config.cluster == 2:
            return cluster_pairs(counts, N, self.bm, self.bn)
        return tile_list(counts, N, self.bm, self.bn)

    def grid(self, units: int, sm_count: int, blocks_per_sm: int, resident_clusters: int | None = None) -> int:
        """Blocks to launch: one per unit of work, or (persistent) one per SM slot at most; for
        clusters, no more than the driver says can be resident together."""
        if not self.config.persistent:
            return units * self.config.cluster
        slots = sm_count * blocks_per_sm // self.config.cluster
        if resident_clusters:
            slots = min(slots, resident_clusters)
        return min(units, slots) * self.config.cluster

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        b = transposed_b(dev) if self.config.b_layout == "nk" and problem.tokens else dev.b
        check_inputs(problem.K, problem.N, dev.a.ptr, b.ptr)
        gpu = require_sm90a(self.name)
        resources = self.resources(gpu.arch)
        output = dev.new_output()
        if problem.tokens == 0:  # nothing to compute; a tensor map cannot even describe 0 rows
            return Prepared(launch=lambda: None, output=output, bm=self.bm, bn=self.bn, resources=resources)

        kernel = self.compile(gpu.arch)
        prefer_shared_memory(kernel)  # 130-206 KB of ring per block: the carveout must lean fully to shared
        tiles_host = self.tiles(problem.counts, problem.N)
        tiles = to_device(tiles_host)
        a_map, b_map = operand_maps(self.bm, self.config.b_layout, dev.a.ptr, b.ptr, problem.tokens,
                                    problem.experts, problem.K, problem.N)
        maps = tuple(TensorMapArg(m.encode()) for m in (a_map, b_map, output_map(output.ptr, problem.tokens,
                                                                                   problem.N)))
        plan_a, plan_b = plans(self.config.b_layout)
        args: tuple[Any, ...] = (*maps, output.ptr, tiles.ptr, np.int32(tiles_host.shape[0]), np.int32(problem.K),
                                 np.int32(problem.N), plan_argument(plan_a), plan_argument(plan_b))
        fit = residency(resources.registers, resources.warps_per_block, resources.smem_bytes)
        threads, smem = self.config.threads, self.dynamic_smem_bytes
        resident = max_active_clusters(kernel, threads, smem, self.config.cluster) if self.config.cluster > 1 else None
        grid = self.grid(tiles_host.shape[0] // self.config.cluster, gpu.sm_count, fit.blocks, resident)

        def run() -> None:
            launch(kernel, grid, threads, smem, *args)

        info = {"grid": grid, "units": int(tiles_host.shape[0]) // self.config.cluster}
        if resident is not None:
            info["resident_clusters"] = resident
        return Prepared(launch=run, output=output, bm=self.bm, bn=self.bn, resources=resources,
                        keep_alive=[tiles, maps, dev, b], launch_info=info)


def ladder() -> list[K3Wgmma]:
    """Every rung the chapter compiles, tests and times, in ladder order."""
    return [K3Wgmma(name) for name in LADDER]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
__all__ = ["SANITIZED", "VARIANTS"]  # what the registry reads (variants/registry.py)
VARIANTS = {name: functools.partial(K3Wgmma, name) for name in LADDER}
