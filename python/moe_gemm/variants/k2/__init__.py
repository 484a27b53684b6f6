"""k2: TMA + mbarrier ring + warp specialization (kernels/k2_tma_ws.cu), chapter 03.

One 288-thread block per 128 x 128 tile of the flat tile list: warp 8 issues TMA copies into a
ring of ``stages`` shared-memory stages (32 KB each), warps 0-7 run ldmatrix + mma.sync on them.
The host side encodes two tensor maps (A as 2-D, B as 3-D with the expert outermost) and passes
them by value.

What TMA cannot take is refused here, before any launch, with a ValueError naming the rule:
K and N must be multiples of 8 (every row stride a multiple of 16 bytes), K a multiple of
BK = 64, A and B must start on 16-byte boundaries, and the GPU must be sm_90 or newer.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, to_device
from moe_gemm.cuda.gpu import detect_gpu, require_capability
from moe_gemm.cuda.launch import TensorMapArg, launch, prefer_shared_memory
from moe_gemm.cuda.tensormap import TiledMap, batched_matrix_map, check_tma_gemm, matrix_map
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.compiled import CompiledVariant

SOURCE = "k2_tma_ws.cu"
KERNEL_FUNCTION = "k2_tma_ws"  # the __global__ template's name (for profiler filters)
STAGE_CHOICES = (2, 3, 4)
BM, BN, BK = 128, 128, 64
PANEL_N = 64  # the 128-byte swizzle caps a box row at 64 bf16, so B comes as two panels
WARPS_PER_BLOCK = 9  # 8 compute warps + 1 producer warp
THREADS = 32 * WARPS_PER_BLOCK
STAGE_BYTES = (BM * BK + 2 * BK * PANEL_N) * 2  # 32,768: one A box and two B boxes
SWIZZLE_ALIGN = 1024  # the kernel aligns its ring to 1 KB by hand, which may cost up to 1 KB
MIN_CAPABILITY = (9, 0)


def dynamic_smem_bytes(stages: int) -> int:
    """What the kernel asks of dynamic shared memory: the ring plus the alignment slack."""
    return stages * STAGE_BYTES + SWIZZLE_ALIGN


def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of TMA or of the kernel that these inputs break."""
    check_tma_gemm("k2", K, N, BK, a_address, b_address)


# --8<-- [start:tensor_maps]
def tensor_maps(a_address: int, b_address: int, tokens: int, experts: int, K: int, N: int) -> tuple[TiledMap, TiledMap]:
    """A [M_tot, K] in boxes of 128 rows x 64 columns; B [E, K, N] in boxes of 64 x 64 of one expert."""
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=BM, box_cols=BK)
    b_map = batched_matrix_map("B", b_address, batch=experts, rows=K, cols=N, box_rows=BK, box_cols=PANEL_N)
    return a_map, b_map
# --8<-- [end:tensor_maps]


class K2TmaWs(CompiledVariant):
    """``K2TmaWs(stages)``: the k2 kernel with a ring of 2, 3 or 4 stages (variant ``k2/s<stages>``)."""

    bm, bn, bk = BM, BN, BK
    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    warps_per_block = WARPS_PER_BLOCK

    def __init__(self, stages: int = 2) -> None:
        if stages not in STAGE_CHOICES:
            raise ValueError(f"k2 STAGES must be one of {STAGE_CHOICES}, got {stages!r}")
        self.stages = stages
        self.name = f"k2/s{stages}"

    def __repr__(self) -> str:
        return f"K2TmaWs(stages={self.stages})"

    @property
    def kernel_name(self) -> str:
        return f"{KERNEL_FUNCTION}<{self.stages}>"

    @property
    def dynamic_smem_bytes(self) -> int:
        return dynamic_smem_bytes(self.stages)

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        check_inputs(problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        gpu = require_capability(detect_gpu(), MIN_CAPABILITY,
                                 f"{self.name} (TMA and mbarrier transaction counts)")
        output = dev.new_output()
        if problem.tokens == 0:  # nothing to compute; a tensor map cannot even describe 0 rows
            return Prepared(launch=lambda: None, output=output, bm=BM, bn=BN, resources=self.resources(gpu.arch))

        kernel = self.compile(gpu.arch)
        # Two blocks of 65-97 KB only fit if the unified L1/shared array leans fully to shared memory.
        prefer_shared_memory(kernel)
        tiles = to_device(tile_list(problem.counts, problem.N, BM, BN))
        a_map, b_map = tensor_maps(dev.a.ptr, dev.b.ptr, problem.tokens, problem.experts, problem.K, problem.N)
        maps = (TensorMapArg(a_map.encode()), TensorMapArg(b_map.encode()))
        args: tuple[Any, ...] = (*maps, output.ptr, tiles.ptr, np.int32(problem.K), np.int32(problem.N))
        grid, smem = int(tiles.shape[0]), self.dynamic_smem_bytes

        def run() -> None:
            launch(kernel, grid, THREADS, smem, *args)

        return Prepared(launch=run, output=output, bm=BM, bn=BN, resources=self.resources(gpu.arch),
                        keep_alive=[tiles, maps, dev])


def all_stages() -> list[K2TmaWs]:
    """Every configuration the chapter compiles, tests and times: STAGES = 2, 3, 4."""
    return [K2TmaWs(stages) for stages in STAGE_CHOICES]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
VARIANTS = {f"k2/s{stages}": functools.partial(K2TmaWs, stages) for stages in STAGE_CHOICES}
