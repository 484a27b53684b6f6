"""k8's configurations (kernels/k8_fp8.cu) and the rules its inputs must follow.

Each rung is one :class:`K8Config` in :data:`LADDER`: the scaling (blockwise or rowwise), whether the sums
are promoted to fp32 every 128 of K, the tile's rows, the ring's depth, and the output type it is compiled
for (bf16 or fp32). :data:`SWIGLU` holds the FP8 layer's GEMM 1 with the SwiGLU epilogue (``k8_fp8_swiglu``),
writing the activation in bf16 or, quantized for GEMM 2, in e4m3 with 1 x 128 scales.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from moe_gemm.model.quantize import Scaling
from moe_gemm.variants.sm90.config import SWIZZLE_ALIGN, WARPGROUP

SOURCE = "k8_fp8.cu"
KERNEL_FUNCTION = "k8_fp8"
SWIGLU_FUNCTION = "k8_fp8_swiglu"  # GEMM 1 with the SwiGLU epilogue
MAX_EXPERTS = 256  # kernels/tile_walk.cuh, walk::MAX_EXPERTS: the clamped ends live in shared memory
BK = 128  # e4m3 of K per stage: one 128-byte swizzle row, one block of scales
BN = 128  # columns per tile: one block of B's scales
THREADS = 3 * WARPGROUP  # two consumer warpgroups and a producer warpgroup
STAGING_BOX_BYTES = 64 * 64 * 2  # one 64 x 64 bf16 box of C
# Static shared memory beside the ring: the device walk (2 KB), the barriers and the slots, rounded up
# (kernels/k8_fp8.cu asserts the same budget).
STATIC_SMEM_ALLOWANCE = 2_304
SCALING_CODES: dict[str, int] = {"blockwise": 0, "rowwise": 1}  # kernels/k8_fp8.cu, k8::Scaling
OUT_CODES: dict[str, int] = {"bf16": 0, "fp32": 2, "e4m3": 3}  # kernels/epilogues.cuh, sm90::Element; k8::E4M3
Epilogue = Literal["store", "swiglu"]


@dataclass(frozen=True)
class K8Config:
    """One instantiation of the kernel template plus its launch's raster group."""

    scaling: Scaling
    promote: bool  # add each 128-deep block's sum into fp32 accumulators (always, for blockwise)
    bm: int  # 128 or 256 rows, split between the two consumer warpgroups
    stages: int
    staging_boxes: int = 1  # 64 x 64 C staging boxes per consumer warpgroup
    group: int = 8  # M tiles per raster group of the walk (a run-time argument)
    out: Literal["bf16", "fp32", "e4m3"] = "bf16"
    # "swiglu": B^T is [W_gate | W_up]^T and C the activation, bf16 or e4m3 (blockwise, 128-row tiles only)
    epilogue: Epilogue = "store"
    # a second scratch accumulator: k-block ks + 1's wgmmas run while ks is promoted (promoted, 128-row tiles)
    overlap: bool = False
    # each k-block's scales loaded during the k-block before (blockwise, not overlapped, one block of B)
    prefetch: bool = False
    # the e4m3 activation's bytes transposed within each quad of threads, then stored 8 at a time (False: two at a
    # time, as each thread holds them: the first version, kept for comparison)
    quad_store: bool = True

    def __post_init__(self) -> None:
        if self.scaling not in SCALING_CODES:
            raise ValueError(f"k8's scaling is one of {', '.join(SCALING_CODES)}, got {self.scaling!r}")
        if self.scaling == "blockwise" and not self.promote:
            raise ValueError("k8's blockwise scales change every 128 of K: they apply by promotion (promote=True)")
        if self.bm not in (128, 256):
            raise ValueError(f"k8's BM is 128 or 256 rows (one or two m64 slices per warpgroup), got {self.bm}")
        if self.epilogue not in ("store", "swiglu"):
            raise ValueError(f"k8's epilogue is store or swiglu, got {self.epilogue!r}")
        outs = ("bf16", "e4m3") if self.epilogue == "swiglu" else ("bf16", "fp32")
        if self.out not in outs:
            raise ValueError(f"k8 with the {self.epilogue} epilogue writes {' or '.join(outs)}, got {self.out}")
        if self.epilogue == "swiglu" and (self.scaling, self.bm) != ("blockwise", 128):
            raise ValueError("k8's SwiGLU epilogue is GEMM 1's in the blockwise layer, on 128-row tiles")
        if self.overlap and not (self.promote and self.bm == 128 and self.epilogue == "store"):
            raise ValueError("k8's overlapped promotion needs promoted sums on 128-row tiles of one block of B")
        if self.prefetch and not (self.scaling == "blockwise" and not self.overlap and self.epilogue == "store"):
            raise ValueError("k8 prefetches the scales in the blockwise promoted loop of one block of B")
        if self.out == "e4m3" and self.staging_boxes:
            raise ValueError("k8's e4m3 activation is stored from registers: staging_boxes=0")
        if not self.quad_store and self.out != "e4m3":
            raise ValueError("k8's quad_store chooses how the e4m3 activation is stored: out='e4m3'")

    @property
    def b_blocks(self) -> int:
        """B^T boxes of 128 rows per stage: the gate block and its up block, or one."""
        return 2 if self.epilogue == "swiglu" else 1

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.b_blocks * BN) * BK  # A: BM rows, B^T: 128 rows a box, 128 bytes of K each

    @property
    def dynamic_smem_bytes(self) -> int:
        staging = 2 * self.staging_boxes * STAGING_BOX_BYTES
        return self.stages * self.stage_bytes + staging + SWIZZLE_ALIGN

    @property
    def kernel_name(self) -> str:
        if self.epilogue == "swiglu":
            store = "" if self.quad_store else ", false"  # trailing, true by default
            return f"{SWIGLU_FUNCTION}<{self.stages}, {self.staging_boxes}, {OUT_CODES[self.out]}{store}>"
        # trailing template parameters, false by default (the other instances keep their names)
        loop = ", false, true" if self.prefetch else ", true" if self.overlap else ""
        return (f"{KERNEL_FUNCTION}<{SCALING_CODES[self.scaling]}, {str(self.promote).lower()}, {self.bm}, "
                f"{self.stages}, {self.staging_boxes}, {OUT_CODES[self.out]}{loop}>")

    @property
    def label(self) -> str:
        """What a results record keeps of the configuration: '128x128 blockwise promoted s6 bf16'."""
        accumulation = "promoted" if self.promote else "fast accumulation"
        epilogue = " swiglu" if self.epilogue == "swiglu" else ""
        loop = " overlapped" if self.overlap else " prefetched scales" if self.prefetch else ""
        store = "" if self.quad_store else " stored in pairs"
        return (f"{self.bm}x{BN} {self.scaling} {accumulation}{loop}{epilogue} g{self.group} s{self.stages} "
                f"{self.out}{store}")

    def replace(self, **changes) -> K8Config:
        return dataclasses.replace(self, **changes)


# --8<-- [start:ladder]
LADDER: dict[str, K8Config] = {
    # 6 stages of 32 KB (A 128 x 128, B^T 128 x 128 bytes)
    "k8/blockwise-bm128": K8Config("blockwise", True, 128, stages=6),
    # B's box serves 256 rows: half of the L2 traffic of B per product; 4 stages of 48 KB
    "k8/blockwise-bm256": K8Config("blockwise", True, 256, stages=4),
    # the scales in the epilogue, the sums promoted as the blockwise kernel does (use_fast_accum=False)
    "k8/rowwise-bm128": K8Config("rowwise", True, 128, stages=6),
    # the tensor core accumulating all of K (use_fast_accum=True)
    "k8/rowwise-fast-bm128": K8Config("rowwise", False, 128, stages=6),
    # blockwise-bm128 with a second scratch accumulator: each k-block promoted while the next one's wgmmas run
    "k8/blockwise-bm128-overlap": K8Config("blockwise", True, 128, stages=6, overlap=True),
    # each k-block's scales loaded during the k-block before, a whole k-block for an L2 round trip
    "k8/blockwise-bm128-prefetch": K8Config("blockwise", True, 128, stages=6, prefetch=True),
    "k8/blockwise-bm256-prefetch": K8Config("blockwise", True, 256, stages=4, prefetch=True),
    # the promoted rowwise kernel on the blockwise kernel's faster tile and loop: 256 rows (B's box serves twice
    # the rows), and 128 rows with the promotion overlapped
    "k8/rowwise-bm256": K8Config("rowwise", True, 256, stages=4),
    "k8/rowwise-bm128-overlap": K8Config("rowwise", True, 128, stages=6, overlap=True),
}
# --8<-- [end:ladder]

# Rungs built, compiled and inspected on every machine but not yet run on a GPU: left out of the chapter's checks
# and timing and of the validation record; their GPU tests skip until `python -m moe_gemm.measure.validation run
# k8 --admit` runs them (and records them where they pass), after which their names leave this set. Passed on an
# H100: the prefetching rungs (2026-12-06), the 256-row and overlapped rowwise rungs (2026-12-07).
NOT_YET_RUN: frozenset[str] = frozenset()

# --8<-- [start:swiglu]
# The FP8 layer's GEMM 1 with the SwiGLU epilogue: 128 x 128 tiles of the activation, each stage 16 KB of A and
# the two 16 KB boxes of B^T (gate and up), 4 stages of 48 KB as k8/blockwise-bm256 (whose accumulators, two
# sets of 64 floats a thread, these match). "bf16" writes the activation as chapter 08's fused GEMM 1 does;
# "e4m3" writes it quantized for GEMM 2, the [M, I] activation never in bf16; "-pairs" stores it as the first
# version did, two bytes at a time (chapter 10 measures what the quad's transpose saves).
SWIGLU: dict[str, K8Config] = {
    "k8/swiglu-bm128": K8Config("blockwise", True, 128, stages=4, epilogue="swiglu"),
    "k8/swiglu-e4m3-bm128": K8Config("blockwise", True, 128, stages=4, staging_boxes=0, epilogue="swiglu",
                                     out="e4m3"),
    "k8/swiglu-e4m3-pairs-bm128": K8Config("blockwise", True, 128, stages=4, staging_boxes=0, epilogue="swiglu",
                                           out="e4m3", quad_store=False),
}
# --8<-- [end:swiglu]


def refusals(experts: int, K: int, N: int, a_address: int = 0, b_address: int = 0,
             epilogue: Epilogue = "store") -> list[str]:
    """Every rule of k8 that A [M_tot, K] and B^T [E, N, K] (e4m3, dense) break, one reason each (SwiGLU: B^T
    is [W_gate | W_up]^T, N = 2I)."""
    reasons = []
    if epilogue == "swiglu" and N % (2 * BN):
        reasons.append(f"2I = {N}: the SwiGLU epilogue needs I a multiple of {BN} (a tile's gate and up columns "
                       f"are one block of the weights' scales each, and its activation one 1 x {BN} group)")
    if K < 1 or N < 1:
        reasons.append(f"K = {K} and N = {N}: the product needs at least one of each")
    if K % 16:
        reasons.append(f"K = {K} is not a multiple of 16 (TMA's 16-byte rows of e4m3)")
    if N % 8:
        reasons.append(f"N = {N} is not a multiple of 8 (the scales' 8-byte pairs; C's 16-byte rows)")
    if not 1 <= experts <= MAX_EXPERTS:
        reasons.append(f"E = {experts} experts: the kernel holds 1 to {MAX_EXPERTS} expert ends in shared memory")
    if a_address % 16 or b_address % 16:
        reasons.append("A and B^T must start on 16-byte boundaries (TMA)")
    return reasons
