"""k7's configurations (kernels/k7_weight_grad.cu) and the rules its inputs must follow.

Each rung is one :class:`K7Config` in :data:`LADDER`: a tile width, a ring depth, and the element types it
is compiled for (bf16 or fp16 operands, a bf16, fp16 or fp32 dB).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from moe_gemm.variants.sm90.config import BK, BOX, SWIZZLE_ALIGN, WARPGROUP

SOURCE = "k7_weight_grad.cu"
KERNEL_FUNCTION = "k7_weight_grad"
MAX_EXPERTS = 256  # kernels/tile_walk.cuh, walk::MAX_EXPERTS: the clamped ends live in shared memory
TILE_K = 128  # dB rows (of K) per consumer warpgroup's tile
THREADS = 3 * WARPGROUP  # two consumer warpgroups and a producer warpgroup
# Static shared memory beside the ring and the staging: the device walk (the clamped ends and each expert's
# steps, 2 KB) and the barriers, rounded up (kernels/k7_weight_grad.cu asserts the same budget).
STATIC_SMEM_ALLOWANCE = 2_304
ELEMENT_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp32": 2}  # kernels/epilogues.cuh, sm90::Element


@dataclass(frozen=True)
class K7Config:
    """One instantiation of the kernel template plus its launch's raster group."""

    bn: int
    stages: int
    staging_boxes: int = 2  # 64 x 64 C staging boxes per ring
    group: int = 8  # K tiles per raster group of the walk (a run-time argument)
    rings: int = 1  # 1: one staging ring the ping-pong epilogues take in turns; 2: one per warpgroup, at once
    accumulate: bool = False  # dB += A_e^T dC_e into an fp32 dB (gradient accumulation across micro-batches)
    panels: bool = True  # one copy per operand per stage (panel maps); False: one per 64-column box (the first version)
    # both consumer warpgroups on every tile, each on 64 of its 128 rows of K (BN up to 256), storing at once through
    # a ring each; False: ping-pong, each warpgroup a whole tile in turn
    cooperative: bool = False
    element: Literal["bf16", "fp16"] = "bf16"
    out: Literal["bf16", "fp16", "fp32"] = "bf16"

    def __post_init__(self) -> None:
        if self.element not in ("bf16", "fp16") or self.out not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"k7 takes bf16 or fp16 operands and writes bf16, fp16 or fp32; got {self.element} "
                             f"operands and {self.out} out")
        if self.accumulate and self.out != "fp32":
            raise ValueError(f"k7 accumulates into an fp32 dB only (a bf16 or fp16 sum would round at every "
                             f"micro-batch), got {self.out} out")
        if self.rings not in (1, 2):
            raise ValueError(f"k7 stages dB through one ring or one per warpgroup (rings 1 or 2), got {self.rings}")
        if self.cooperative and self.rings != 2:
            raise ValueError("a cooperative k7 stores its two halves of a tile at once, through a ring each (rings 2)")
        widest = 256 if self.cooperative else 192
        if self.bn % BOX or not BOX <= self.bn <= widest:
            raise ValueError(f"k7's BN is a multiple of 64 up to {widest} (a warpgroup holds "
                             f"{64 if self.cooperative else 128} x BN fp32 accumulators), got {self.bn}")

    @property
    def stage_bytes(self) -> int:
        return (TILE_K + self.bn) * BK * 2  # A: 64 rows x 128 of K; dC: 64 rows x BN

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + self.rings * self.staging_boxes * BOX * BOX * 2 + SWIZZLE_ALIGN

    @property
    def kernel_name(self) -> str:
        # RINGS, ACCUMULATE, PANELS and COOP are the template's last parameters, with defaults (1, false, true, false),
        # written up to the last one set: the names from before them
        trailing = [str(self.rings), str(self.accumulate).lower(), str(self.panels).lower(),
                    str(self.cooperative).lower()]
        while trailing and trailing[-1] == ("1", "false", "true", "false")[len(trailing) - 1]:
            trailing.pop()
        tail = "".join(f", {value}" for value in trailing)
        return (f"{KERNEL_FUNCTION}<{self.bn}, {self.stages}, {self.staging_boxes}, {ELEMENT_CODES[self.element]}, "
                f"{ELEMENT_CODES[self.out]}{tail}>")

    @property
    def label(self) -> str:
        """What a results record keeps of the configuration: '128x192 pingpong g8 s5 bf16->fp32'."""
        types = "" if (self.element, self.out) == ("bf16", "bf16") else f" {self.element}->{self.out}"
        rings = "" if self.rings == 1 else " 2 rings"
        mode = " +=" if self.accumulate else ""
        boxes = "" if self.panels else " box copies"
        schedule = "cooperative" if self.cooperative else "pingpong"
        return f"{TILE_K}x{self.bn} {schedule} g{self.group} s{self.stages}{rings}{boxes}{types}{mode}"

    def replace(self, **changes) -> K7Config:
        return dataclasses.replace(self, **changes)


# --8<-- [start:ladder]
LADDER: dict[str, K7Config] = {
    # 5 x 40 KB stages + a 16 KB staging ring: k6/pingpong-bn192's budget
    "k7/bn192": K7Config(192, stages=5),
    # 6 x 32 KB stages: more stages in flight for short reductions
    "k7/bn128": K7Config(128, stages=6),
    # A staging ring per warpgroup, so that the two ping-pong epilogues store at once, one stage fewer to make
    # room: the profile at 2,048 rows found the store stream the difference from quack (the same bytes
    # written at 52% of HBM's peak against quack's 70%).
    "k7/bn192-rings": K7Config(192, stages=4, staging_boxes=3, rings=2),
    "k7/bn128-rings": K7Config(128, stages=5, staging_boxes=2, rings=2),
    # The first version's producer, kept to be timed beside the rest: a TMA copy per 64-column box, five per stage
    # at BN = 192, where every rung above issues one per operand.
    "k7/bn192-boxes": K7Config(192, stages=5, panels=False),
    # Both warpgroups on one 128 x 256 tile, 64 rows of K each, as quack's pick at 4,096 rows is (a cooperative
    # 128 x 224 tile, ahead of its own ping-pong configurations there): 3 x 48 KB stages and a ring of 4 boxes each.
    "k7/coop-bn256": K7Config(256, stages=3, staging_boxes=4, rings=2, cooperative=True),
    # The same at 192 columns, which divide the seed's N = 2,688 (14 tiles, where 256 leave half a tile over):
    # 4 x 40 KB stages and a ring of 3 boxes each.
    "k7/coop-bn192": K7Config(192, stages=4, staging_boxes=3, rings=2, cooperative=True),
}
# --8<-- [end:ladder]
# Built and compiled, not yet run on a GPU: left out of the chapter's runs, the op and the validation record until
# `python -m moe_gemm.measure.validation run k7 --admit` has run their GPU tests and compute-sanitizer.
NOT_YET_RUN: frozenset[str] = frozenset({"k7/coop-bn256", "k7/coop-bn192"})


def refusals(experts: int, K: int, N: int, a_address: int = 0, dc_address: int = 0) -> list[str]:
    """Every rule of k7 that A [M_tot, K] and dC [M_tot, N] (dense, row-major) break, one reason each."""
    reasons = []
    if K < 1 or N < 1:
        reasons.append(f"K = {K} and N = {N}: dB [E, K, N] needs at least one row and one column")
    if K % BK:
        reasons.append(f"K = {K} is not a multiple of {BK} (A's 64-column boxes; dB's 64-row slices)")
    if N % 8:
        reasons.append(f"N = {N} is not a multiple of 8 (TMA's 16-byte rows)")
    if not 1 <= experts <= MAX_EXPERTS:
        reasons.append(f"E = {experts} experts: the kernel holds 1 to {MAX_EXPERTS} expert ends in shared memory")
    if a_address % 16 or dc_address % 16:
        reasons.append("A and dC must start on 16-byte boundaries (TMA)")
    return reasons
