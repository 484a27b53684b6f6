"""k4: Blackwell tcgen05 with the accumulator in tensor memory (kernels/k4_tcgen05.cu), chapter 05.

One persistent 192-thread block per SM: a TMA producer warp fills chapter 04's 128-byte-swizzled
ring, one thread issues ``tcgen05.mma`` (M = 128, N = BN, K = 16) from shared-memory descriptors
into a double-buffered fp32 accumulator in tensor memory, and four epilogue warps read it back
with ``tcgen05.ld`` and store bf16. The host side is chapter 04's: the flat tile list, its tensor
maps (moe_gemm.variants.sm90.maps), and descriptor constants built on the host
(:func:`moe_gemm.variants.k4.tcgen05.smem_plan`) and interpreted in CI.

==================  ======================================================================
``k4/bn128``        128 x 128 tiles, 6 stages of 32 KB, 256 TMEM columns (two 128-column accumulators)
``k4/bn192``        128 x 192 tiles, 5 stages of 40 KB, 512 TMEM columns (2 x 192 rounded up)
``k4/bn256``        128 x 256 tiles, 4 stages of 48 KB, all 512 TMEM columns
``k4/bn192-kmajor`` as bn192, B given as B^T [E, N, K] (both operands K-major)
==================  ======================================================================

What the kernel cannot take is refused here, before any launch, with a ValueError naming the rule:
K and N multiples of 8 (TMA's 16-byte strides), K a multiple of BK = 64, A and B on 16-byte
boundaries, and a GPU of compute capability 10.x that runs sm_100a or sm_103a code (tcgen05 and
tensor memory exist only in those targets).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, to_device
from moe_gemm.cuda.gpu import GpuInfo, detect_gpu
from moe_gemm.cuda.launch import TensorMapArg, launch, prefer_shared_memory
from moe_gemm.cuda.tensormap import check_tma_gemm
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.occupancy import residency
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.compiled import NamedConfigVariant
from moe_gemm.variants.k4.tcgen05 import (
    TMEM_COLUMNS,
    InstrDescriptor,
    Tcgen05Plan,
    encode_instr,
    smem_plan,
    tmem_allocation,
)
from moe_gemm.variants.sm90.config import BLayout
from moe_gemm.variants.sm90.maps import operand_maps, plan_argument, transposed_b

SOURCE = "k4_tcgen05.cu"
KERNEL_FUNCTION = "k4_tcgen05"
BM = 128  # tcgen05.mma's M: one tensor-memory lane per tile row
BK = 64
WARPS_PER_BLOCK = 6  # 4 epilogue warps, a producer warp, an MMA warp
THREADS = 32 * WARPS_PER_BLOCK
ACCUMULATORS = 2  # accumulator buffers in tensor memory
SWIZZLE_ALIGN = 1024
ARCHES = ("sm_100a", "sm_103a")  # B200-class and B300 targets
SUPPORTED_CAPABILITIES = ((10, 0), (10, 3))  # the GPUs whose code those targets are


@dataclass(frozen=True)
class K4Config:
    """One instantiation of the kernel template. ``bm`` and ``b_layout`` are what chapter 04's tensor maps
    read (moe_gemm.variants.sm90.maps)."""

    bn: int
    stages: int
    b_layout: BLayout = "kn"
    bm: int = BM

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + SWIZZLE_ALIGN

    @property
    def tmem_columns(self) -> int:
        """The columns tcgen05.alloc takes: ACCUMULATORS x BN fp32 columns, rounded to a power of two."""
        return tmem_allocation(ACCUMULATORS * self.bn)

    @property
    def b_major(self) -> str:
        """B [E, K, N] is N-contiguous (MN-major for the MMA); B^T [E, N, K] is K-major."""
        return "MN" if self.b_layout == "kn" else "K"

    @property
    def kernel_name(self) -> str:
        k_major = "true" if self.b_layout == "nk" else "false"
        return f"{KERNEL_FUNCTION}<{self.bn}, {self.stages}, {k_major}>"


# --8<-- [start:ladder]
CONFIGS: dict[str, K4Config] = {
    # as many stages as fit 227 KB of shared memory with one block per SM
    "k4/bn128": K4Config(bn=128, stages=6),
    "k4/bn192": K4Config(bn=192, stages=5),
    "k4/bn256": K4Config(bn=256, stages=4),
    # B^T [E, N, K]: both operands K-major (the offline weight-layout step of chapter 04)
    "k4/bn192-kmajor": K4Config(bn=192, stages=5, b_layout="nk"),
}
# --8<-- [end:ladder]


def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of TMA or of the kernel that these inputs break."""
    check_tma_gemm("k4", K, N, BK, a_address, b_address)


def require_sm100(variant: str, gpu: GpuInfo | None) -> GpuInfo:
    """``gpu`` if it runs sm_100a or sm_103a code (compute capability 10.0 or 10.3); ValueError otherwise."""
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    if gpu.compute_capability not in SUPPORTED_CAPABILITIES:
        major, minor = gpu.compute_capability
        raise ValueError(f"{variant} needs compute capability 10.x (10.0 or 10.3: tcgen05 and tensor memory exist "
                         f"only in the sm_100a and sm_103a targets); {gpu.name} is {major}.{minor}")
    return gpu


def plans(config: K4Config) -> tuple[Tcgen05Plan, Tcgen05Plan]:
    """The shared-memory descriptor plans the kernel gets for A (always K-major) and B."""
    return smem_plan("K"), smem_plan(config.b_major)


def instr_descriptor(config: K4Config) -> int:
    """The kernel's instruction descriptor: M = 128, N = BN, bf16 x bf16 -> f32, A K-major."""
    return encode_instr(InstrDescriptor(m=BM, n=config.bn, a_major="K", b_major=config.b_major))


def tmem_blocks(config: K4Config) -> int:
    """Blocks whose accumulators fit one SM's tensor memory at once."""
    return TMEM_COLUMNS // config.tmem_columns


class K4Tcgen05(NamedConfigVariant):
    """One k4 configuration: ``K4Tcgen05("k4/bn192")``."""

    bk = BK
    bm = BM
    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    warps_per_block = WARPS_PER_BLOCK

    configs = CONFIGS
    family = "k4"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.bn = self.config.bn

    def blocks_per_sm(self, registers: int, smem_bytes: int) -> int:
        """The occupancy model's resident blocks, capped by tensor memory."""
        return min(residency(registers, WARPS_PER_BLOCK, smem_bytes).blocks, tmem_blocks(self.config))

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        b = transposed_b(dev) if self.config.b_layout == "nk" and problem.tokens else dev.b
        check_inputs(problem.K, problem.N, dev.a.ptr, b.ptr)
        gpu = require_sm100(self.name, detect_gpu())
        resources = self.resources(gpu.arch)
        output = dev.new_output()
        if problem.tokens == 0:  # nothing to compute; a tensor map cannot even describe 0 rows
            return Prepared(launch=lambda: None, output=output, bm=BM, bn=self.bn, resources=resources)

        kernel = self.compile(gpu.arch)
        prefer_shared_memory(kernel)  # 193-201 KB of ring per block: the carveout must lean fully to shared
        tiles_host = tile_list(problem.counts, problem.N, BM, self.bn)
        tiles = to_device(tiles_host)
        a_map, b_map = operand_maps(self.config.bm, self.config.b_layout, dev.a.ptr, b.ptr, problem.tokens,
                                    problem.experts, problem.K, problem.N)
        maps = (TensorMapArg(a_map.encode()), TensorMapArg(b_map.encode()))
        plan_a, plan_b = plans(self.config)
        args: tuple[Any, ...] = (*maps, output.ptr, tiles.ptr, np.int32(tiles_host.shape[0]), np.int32(problem.K),
                                 np.int32(problem.N), plan_argument(plan_a), plan_argument(plan_b),
                                 np.uint32(instr_descriptor(self.config)))
        slots = gpu.sm_count * self.blocks_per_sm(resources.registers, resources.smem_bytes)
        grid = min(tiles_host.shape[0], slots)  # persistent: block b takes tiles b, b + grid, ...
        smem = self.dynamic_smem_bytes

        def run() -> None:
            launch(kernel, grid, THREADS, smem, *args)

        return Prepared(launch=run, output=output, bm=BM, bn=self.bn, resources=resources,
                        keep_alive=[tiles, maps, dev, b])


def all_configs() -> list[K4Tcgen05]:
    """Every configuration the chapter compiles, tests and (on compute capability 10.x) times."""
    return [K4Tcgen05(name) for name in CONFIGS]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
VARIANTS = {name: functools.partial(K4Tcgen05, name) for name in CONFIGS}
