"""k1: mma.sync tensor cores fed by cp.async and ldmatrix (kernels/k1_mma_sync.cu), chapter 02.

One 256-thread block per BM x 128 tile of the flat tile list, BM in {32, 64, 128}; eight warps
in a 2 x 4 grid each own a (BM/2) x 32 piece of the tile. ``stages`` is the depth of the cp.async
ring (2 or 3), held in dynamic shared memory; ``frag_db`` selects the kernel's fragment
double-buffering variant (two stages only). NVRTC compiles the kernel for the running GPU's architecture;
any spill is an error.

What the kernel cannot take is refused here, before any launch, with a ValueError naming the rule:
K must be a multiple of BK = 32, N a multiple of 8 (16-byte copies), A and B must start on
16-byte boundaries and C on a 4-byte one, and the GPU must be sm_80 or newer.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, to_device
from moe_gemm.cuda.gpu import detect_gpu, require_capability
from moe_gemm.cuda.launch import launch, prefer_shared_memory
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.compiled import CompiledVariant

SOURCE = "k1_mma_sync.cu"
KERNEL_FUNCTION = "k1_mma_sync"  # the __global__ template's name (for profiler filters)
BM_CHOICES = (32, 64, 128)
STAGE_CHOICES = (2, 3)
PAD = 8  # bf16 of padding per shared-memory row, as in the kernel
BN, BK = 128, 32
WARPS_PER_BLOCK = 8
THREADS = 32 * WARPS_PER_BLOCK
CHUNK_ELEMENTS = 8  # one 16-byte cp.async moves 8 bf16
MIN_CAPABILITY = (8, 0)  # cp.async, ldmatrix and bf16 mma.sync arrived with sm_80
# SASS each configuration must contain: the bf16 MMA, ldmatrix (plain for A, .trans for B),
# cp.async. A missing one means the compiler took another path than the chapter describes.
SASS_OPCODES = ("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS")


# --8<-- [start:checks]
def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0, c_address: int = 0) -> None:
    """ValueError naming the first rule of the kernel that these inputs break."""
    if K < 1 or K % BK:
        raise ValueError(f"k1 needs K to be a positive multiple of BK = {BK} (whole K slices per pipeline stage, "
                         f"at least one), got K = {K}")
    if N < 1:
        raise ValueError(f"k1 needs N >= 1, got N = {N}")
    if N % CHUNK_ELEMENTS:
        raise ValueError(f"k1 needs N to be a multiple of {CHUNK_ELEMENTS}: every 16-byte cp.async of a B row must "
                         f"lie wholly inside or wholly past column N, got N = {N}")
    for name, address, align in (("A", a_address, 16), ("B", b_address, 16), ("C", c_address, 4)):
        if address % align:
            raise ValueError(f"k1 needs {name} to start on a {align}-byte boundary "
                             f"({'16-byte cp.async' if align == 16 else '4-byte bf16x2 stores'}), got {address:#x}")
# --8<-- [end:checks]


def kernel_name(bm: int, frag_db: bool, stages: int = 2) -> str:
    """The C++ name expression NVRTC instantiates, e.g. 'k1_mma_sync<64, 2, false>'."""
    return f"{KERNEL_FUNCTION}<{bm}, {stages}, {'true' if frag_db else 'false'}>"


def variant_name(bm: int, frag_db: bool, stages: int = 2) -> str:
    """'k1/bm64', 'k1/bm64-fragdb', 'k1/bm64-s3': two stages is the unmarked default."""
    return f"k1/bm{bm}" + (f"-s{stages}" if stages != 2 else "") + ("-fragdb" if frag_db else "")


class K1MmaSync(CompiledVariant):
    """``K1MmaSync(bm, frag_db=False, stages=2)``: variant ``k1/bm<bm>[-s3][-fragdb]``."""

    bn, bk = BN, BK
    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    warps_per_block = WARPS_PER_BLOCK

    def __init__(self, bm: int = 64, frag_db: bool = False, stages: int = 2) -> None:
        if isinstance(bm, bool) or bm not in BM_CHOICES:
            raise ValueError(f"k1 BM must be one of {BM_CHOICES}, got {bm!r}")
        if not isinstance(frag_db, bool):
            raise ValueError(f"k1 frag_db must be True or False, got {frag_db!r}")
        if isinstance(stages, bool) or stages not in STAGE_CHOICES:
            raise ValueError(f"k1 stages must be one of {STAGE_CHOICES}, got {stages!r}")
        if stages == 3 and frag_db:
            raise ValueError("k1 FRAG_DB hands fragments over between exactly two stages: use stages = 2")
        self.bm, self.frag_db, self.stages = bm, frag_db, stages
        self.name = variant_name(bm, frag_db, stages)

    def __repr__(self) -> str:
        return f"K1MmaSync(bm={self.bm}, frag_db={self.frag_db}, stages={self.stages})"

    @property
    def kernel_name(self) -> str:
        return kernel_name(self.bm, self.frag_db, self.stages)

    @property
    def dynamic_smem_bytes(self) -> int:
        """Dynamic shared memory per block: STAGES x (A: BM x 40, B: 32 x 136) bf16."""
        return self.stages * (self.bm * (BK + PAD) + BK * (BN + PAD)) * 2

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        check_inputs(problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        gpu = require_capability(detect_gpu(), MIN_CAPABILITY, f"{self.name} (cp.async, ldmatrix, bf16 mma.sync)")
        kernel = self.compile(gpu.arch)
        resources = self.resources(gpu.arch)
        output = dev.new_output()
        check_inputs(problem.K, problem.N, c_address=output.ptr)
        tiles_host = tile_list(problem.counts, problem.N, self.bm, BN)
        if tiles_host.shape[0] == 0:  # M_tot = 0: no tile, no launch, an empty C
            return Prepared(launch=lambda: None, output=output, bm=self.bm, bn=BN, resources=resources)

        try:  # let registers, not the L1/shared split, decide residency
            prefer_shared_memory(kernel)
        except (RuntimeError, TypeError) as error:  # only a hint: never worth refusing to run over
            warnings.warn(f"{self.name}: the shared-memory carveout hint was not taken: {error}", stacklevel=2)
        tiles = to_device(tiles_host)
        grid = int(tiles_host.shape[0])
        args: tuple[Any, ...] = (dev.a.ptr, dev.b.ptr, output.ptr, tiles.ptr, np.int32(problem.K), np.int32(problem.N))

        def run() -> None:
            launch(kernel, grid, THREADS, self.dynamic_smem_bytes, *args)

        return Prepared(launch=run, output=output, bm=self.bm, bn=BN, resources=resources, keep_alive=[tiles, dev])


# (bm, frag_db, stages) of every configuration the chapter compiles and tests: BM 32 / 64 / 128 with
# two stages, with and without FRAG_DB, and with the three-stage ring.
CONFIGS = tuple([(bm, frag_db, 2) for bm in BM_CHOICES for frag_db in (False, True)]
                + [(bm, False, 3) for bm in BM_CHOICES])


def all_configs() -> list[K1MmaSync]:
    return [K1MmaSync(*config) for config in CONFIGS]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
VARIANTS = {variant_name(*config): functools.partial(K1MmaSync, *config) for config in CONFIGS}


# --8<-- [start:compile_report]
def compile_report(arch: str = "sm_90a") -> list[dict[str, Any]]:
    """Every configuration compiled for ``arch`` (no GPU needed): ptxas's resources, the occupancy
    model's blocks per SM and what limits them, and static counts of the chapter's SASS opcodes."""
    from moe_gemm.cuda.sass import opcode_counts
    from moe_gemm.model.occupancy import registers_per_warp, residency

    rows = []
    for variant in all_configs():
        compiled = variant.compile(arch)
        r = variant.resources(arch)
        fit = residency(r.registers, r.warps_per_block, r.smem_bytes)
        limits = {"registers": fit.by_registers, "shared memory": fit.by_smem, "warps": fit.by_warps,
                  "blocks": fit.by_blocks}
        rows.append({
            "variant": variant.name, "arch": arch, "bm": variant.bm, "frag_db": variant.frag_db,
            "stages": variant.stages,
            "registers": r.registers, "registers_per_block": registers_per_warp(r.registers) * r.warps_per_block,
            "smem_bytes": r.smem_bytes, "spill_bytes": r.spill_bytes,
            "stack_frame_bytes": compiled.report.stack_frame_bytes, "warps_per_block": r.warps_per_block,
            "blocks_per_sm": fit.blocks, "by_registers": fit.by_registers, "by_smem": fit.by_smem,
            "limiter": " = ".join(name for name, blocks in limits.items() if blocks == fit.blocks),
            "sass": opcode_counts(compiled.sass(), (*SASS_OPCODES, "BAR.SYNC")),
        })
    return rows
# --8<-- [end:compile_report]
