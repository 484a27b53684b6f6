"""k6's configurations: the template instantiations of kernels/k6_persistent.cu and how each launches.

Each rung of chapter 07's ladder is one :class:`K6Config` in :data:`LADDER`, named for what it adds;
``k6/auto`` picks one of :data:`AUTO_CANDIDATES` per shape (moe_gemm.variants.k6.auto).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from moe_gemm.variants.k6.walk import Raster
from moe_gemm.variants.sm90.config import BK, BOX, SWIZZLE_ALIGN, WARPGROUP, BLayout

SOURCE = "k6_persistent.cu"
KERNEL_FUNCTION = "k6_persistent"  # the __global__ templates' common prefix (for profiler filters)
MAX_EXPERTS = 256  # kernels/tile_walk.cuh, walk::MAX_EXPERTS: the device walk's prefix sums in shared memory
LISTED = 128  # kernels/tile_walk.cuh, walk::LISTED: the units a block lists before its main loop (16 bytes each)
# The static shared memory beside the ring and the staging, within sm90.config.SMEM_LIMIT: barriers, the
# device walk (2 KB) and the tile slots, rounded up (kernels/k6_persistent.cu asserts the same budget).
STATIC_SMEM_ALLOWANCE = 2_304
WG_ROWS = 128  # every consumer warpgroup owns 128 rows
THREADS = 3 * WARPGROUP  # two consumer warpgroups and a producer warpgroup (the kernels' __launch_bounds__)
Mode = Literal["pingpong", "cooperative"]
Schedule = Literal["device", "host"]
InElement = Literal["bf16", "fp16"]
OutElement = Literal["bf16", "fp16", "fp32"]
# kernels/epilogues.cuh, sm90::Element: the IN and OUT template arguments
ELEMENT_CODES: dict[str, int] = {"bf16": 0, "fp16": 1, "fp32": 2}


@dataclass(frozen=True)
class K6Config:
    """One instantiation of the kernel template plus how it is launched."""

    mode: Mode
    bn: int
    stages: int
    cluster: int = 1  # 2: a cluster of two blocks, along N (A multicast) or along M (B multicast)
    cluster_along: Literal["n", "m"] = "n"
    staging_boxes: int = 2  # 64 x 64 C staging boxes per ring (ping-pong: one ring; cooperative: one per warpgroup)
    group: int = 1  # M tiles per raster group of the tile walk (1: row-major within an expert)
    # what a raster group gathers: "m", ``group`` M tiles with the columns walked inside; "n", ``group`` columns of
    # units with the expert's M tiles walked inside, every other group upward (quack's varlen order; the template's
    # RASTER_N, the device walk's unit lookup only)
    raster: Raster = "m"
    schedule: Schedule = "device"
    b_layout: BLayout = "kn"
    # swiglu: C = silu(gate) * up, [M_tot, N / 2]; dswiglu: C = dh [M_tot, 2N] from the saved pre-activation
    # (and the activation [M_tot, N] beside it), SwiGLU's backward after the dA GEMM of GEMM 2
    epilogue: Literal["none", "swiglu", "dswiglu"] = "none"
    element: InElement = "bf16"  # A's and B's (wgmma .bf16 or .f16: one rate, one layout)
    out: OutElement = "bf16"  # C's: rounded to bf16 or fp16, or the fp32 accumulators as they are
    # (h) programmatic dependent launch: launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, the
    # kernel sets up its barriers while the launch before it on the stream finishes (the template's PDL)
    pdl: bool = False
    # dswiglu only: the saved pre-activation h fetched by TMA into shared memory while the tile's main loop runs
    # (k6::PrefetchH), instead of loaded by the epilogue from global memory
    prefetch_h: bool = False
    # ping-pong only: a staging ring per consumer warpgroup, as cooperative tiles have, so that the epilogues no
    # longer take turns, at the price of a stage of the operand ring (the template's PRIVATE_RINGS)
    private_rings: bool = False
    # clusters only: the blocks end on the producer's wait for the ring to drain (CUTLASS's producer tail) instead
    # of the closing cluster barrier, so the idle producer warps leave at once (the template's PRODUCER_TAIL)
    producer_tail: bool = False
    # device walk, plain GEMM: the producer finds each unit from the last one's place, a cursor over the experts,
    # instead of a binary search and three divisions per unit (the template's CURSOR; walk::Walk::unit with a Cursor)
    cursor: bool = False
    # device walk, plain GEMM: the block's first LISTED units looked up by all its threads at once before the main loop,
    # into dynamic shared memory after the staging ring, so the producer reads each from shared memory as it reads the
    # host list from global memory (the template's LIST_UNITS; walk::Walk::list); the units past them as ``cursor`` says
    listed: bool = False
    # dswiglu, h loaded by the epilogue: W_down's boxes loaded evict-last, h loaded and dh and the activation stored
    # evict-first, so that the epilogue's use-once streams do not push out of L2 the column tiles a raster group's
    # other M tiles read next (the template's L2_HINTS; ptx.cuh, l2_hints)
    l2_hints: bool = False
    # bytes each L2 miss of A's and B's loads fetches (the tensor maps' L2 promotion, a launch argument: the same
    # machine code): 256, or 128 as CuTe's TMA descriptors ask (cute/atom/copy_traits_sm90_tma.hpp)
    l2_promotion: int = 256

    def __post_init__(self) -> None:
        if self.l2_promotion not in (128, 256):
            raise ValueError(f"k6's operand maps promote L2 misses to 128 or 256 bytes, got {self.l2_promotion}")
        if self.element not in ("bf16", "fp16") or self.out not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"k6 takes bf16 or fp16 operands and writes bf16, fp16 or fp32; got {self.element} "
                             f"operands and {self.out} out")
        if self.pdl and self.epilogue != "none":
            raise ValueError("programmatic dependent launch is a rung of the plain GEMM (epilogue 'none')")
        if self.producer_tail and (self.cluster != 2 or self.epilogue != "none"):
            raise ValueError("the producer tail replaces the closing cluster barrier of the plain GEMM's clusters")
        if self.raster == "n" and (self.schedule != "device" or self.epilogue != "none" or self.cursor
                                   or self.listed):
            raise ValueError("the raster along N is a rung of the plain GEMM's device walk, without the cursor or "
                             "the unit list")
        for on, what in ((self.cursor, "the walk's cursor"), (self.listed, "the unit list")):
            if on and (self.schedule != "device" or self.epilogue != "none"):
                raise ValueError(f"{what} is a rung of the plain GEMM's device walk (schedule 'device', epilogue "
                                 "'none')")
        if self.private_rings and (self.mode != "pingpong" or self.epilogue != "none" or self.cluster != 1):
            raise ValueError("private staging rings are a rung of the plain ping-pong GEMM without a cluster")
        if self.l2_hints and (self.epilogue != "dswiglu" or self.prefetch_h):
            raise ValueError("the L2 hints are a rung of the SwiGLU backward whose epilogue loads h (epilogue "
                             "'dswiglu', prefetch_h off)")
        if self.epilogue == "dswiglu" and self.cluster > 1 and (self.cluster_along != "m" or self.l2_hints):
            raise ValueError("the SwiGLU backward's cluster is two blocks along M sharing W_down (cluster_along 'm', "
                             "no L2 hints)")
        if self.prefetch_h and (self.epilogue != "dswiglu" or self.mode != "pingpong" or self.cluster != 1):
            raise ValueError("h is prefetched for the SwiGLU backward's ping-pong tiles without a cluster (epilogue "
                             "'dswiglu')")

    @property
    def bm(self) -> int:
        return WG_ROWS if self.mode == "pingpong" else 2 * WG_ROWS

    @property
    def unit_cols(self) -> int:
        """Columns of one unit of work: one N tile per block of a cluster along N."""
        return self.bn * (self.cluster if self.cluster_along == "n" else 1)

    @property
    def unit_rows(self) -> int:
        """Rows of one unit of work: one M tile per block of a cluster along M."""
        return self.bm * (self.cluster if self.cluster_along == "m" else 1)

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def dynamic_smem_bytes(self) -> int:
        rings = 1 if self.mode == "pingpong" and not self.private_rings else 2  # ping-pong: one, shared
        staging = rings * self.staging_boxes * BOX * BOX * 2
        return self.stages * self.stage_bytes + staging + self.h_buffer_bytes + self.list_bytes + SWIZZLE_ALIGN

    @property
    def h_buffer_bytes(self) -> int:
        """prefetch_h: one tile's h, 128 rows of BN gate and BN up columns in 16-bit, and its two 8-byte barriers
        (k6::PrefetchH); else 0."""
        return WG_ROWS * 2 * self.bn * 2 + 16 if self.prefetch_h else 0

    @property
    def list_bytes(self) -> int:
        """listed: the block's first LISTED units, an int4 each; else 0."""
        return LISTED * 16 if self.listed else 0

    def out_columns(self, N: int) -> int:
        """C's width for a GEMM N columns wide: N / 2 after the SwiGLU, 2N (dh) after its backward."""
        return N // 2 if self.epilogue == "swiglu" else 2 * N if self.epilogue == "dswiglu" else N

    @property
    def kernel_name(self) -> str:
        types = f"{ELEMENT_CODES[self.element]}, {ELEMENT_CODES[self.out]}"
        mode = 0 if self.mode == "pingpong" else 1
        if self.epilogue == "dswiglu":
            entry = f"{KERNEL_FUNCTION}_dswiglu" + ("_prefetch" if self.prefetch_h else "") + (
                "_cluster2" if self.cluster > 1 else "")
            hints = ", true" if self.l2_hints else ""
            return f"{entry}<{mode}, {self.stages}, {ELEMENT_CODES[self.element]}{hints}>"
        if self.epilogue == "swiglu":
            entry = f"{KERNEL_FUNCTION}_swiglu" + ("" if self.cluster == 1 else "_cluster2")
            return f"{entry}<{mode}, {self.stages}, {self.staging_boxes}, {types}>"
        entry = KERNEL_FUNCTION if self.cluster == 1 else f"{KERNEL_FUNCTION}_cluster2"
        flag = "true" if self.b_layout == "nk" else "false"
        device = "true" if self.schedule == "device" else "false"
        along = (", true" if self.cluster_along == "m" else ", false") if self.cluster > 1 else ""
        # the trailing template parameters, false by default, written up to the last one set: PDL, then
        # PRODUCER_TAIL (clusters) or PRIVATE_RINGS, then CURSOR, then LIST_UNITS, then RASTER_N
        flags = [self.pdl, self.producer_tail if self.cluster > 1 else self.private_rings, self.cursor, self.listed,
                 self.raster == "n"]
        while flags and not flags[-1]:
            flags.pop()
        trailing = "".join(f", {str(f).lower()}" for f in flags)
        return (f"{entry}<{mode}, {self.bn}, {self.stages}, {flag}, {self.staging_boxes}, {device}{along}, {types}"
                f"{trailing}>")

    @property
    def label(self) -> str:
        """What a results record keeps of the configuration: '128x192 pingpong 1x2 g8 s4'."""
        cluster = "" if self.cluster == 1 else " 1x2" if self.cluster_along == "n" else " 2x1"
        group = f" {'g' if self.raster == 'm' else 'n'}{self.group}" if self.group > 1 or self.raster == "n" else ""
        types = "" if (self.element, self.out) == ("bf16", "bf16") else f" {self.element}->{self.out}"
        extra = "".join(f" {word}" for word, on in (("pdl", self.pdl), ("rings", self.private_rings),
                                                    ("tail", self.producer_tail), ("cursor", self.cursor),
                                                    ("listed", self.listed), ("L2 hints", self.l2_hints),
                                                    ("L2 128 B", self.l2_promotion == 128)) if on)
        return f"{self.bm}x{self.bn} {self.mode}{cluster}{group} s{self.stages}{types}{extra}"

    def replace(self, **changes) -> K6Config:
        return dataclasses.replace(self, **changes)


# --8<-- [start:ladder]
LADDER: dict[str, K6Config] = {
    # (a) ping-pong: each consumer warpgroup owns a 128 x BN tile; 5 x 40 KB stages + one 16 KB staging
    # ring the two epilogues take turns on
    "k6/pingpong-bn192": K6Config("pingpong", 192, stages=5, staging_boxes=2),
    "k6/pingpong-bn128": K6Config("pingpong", 128, stages=6, staging_boxes=2),
    # (b) clusters of two along N, each block loading half of A for both
    "k6/pingpong-cluster-bn192": K6Config("pingpong", 192, stages=5, cluster=2, staging_boxes=2),
    "k6/pingpong-cluster-bn128": K6Config("pingpong", 128, stages=6, cluster=2, staging_boxes=2),
    # chapter 04's pairing for comparison: two M tiles share B
    "k6/pingpong-mcluster-bn192": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m", staging_boxes=2),
    # the staging ring one box deep: every box waits for the previous one's store to be read
    "k6/pingpong-bn192-box1": K6Config("pingpong", 192, stages=5, staging_boxes=1),
    # (c) 256-row cooperative tiles: 128 rows per warpgroup, B read once per 256 rows
    "k6/coop256-bn128": K6Config("cooperative", 128, stages=4, staging_boxes=1),
    "k6/coop256-cluster-bn128": K6Config("cooperative", 128, stages=4, cluster=2, staging_boxes=1),
    "k6/coop256-cluster-bn192": K6Config("cooperative", 192, stages=3, cluster=2, staging_boxes=3),
    # (d) the same walks in raster groups of 8 M tiles
    "k6/pingpong-cluster-bn192-g8": K6Config("pingpong", 192, stages=5, cluster=2, staging_boxes=2, group=8),
    "k6/coop256-cluster-bn128-g8": K6Config("cooperative", 128, stages=4, cluster=2, staging_boxes=1, group=8),
    # quack's pick at the model projections whose B[e] outgrows L2 (256 x 192 cooperative, a pair along N, raster
    # groups of 8): on a row-major walk every M tile of an expert streams B[e] from memory again; and the M pair so
    "k6/coop256-cluster-bn192-g8": K6Config("cooperative", 192, stages=3, cluster=2, staging_boxes=3, group=8),
    "k6/pingpong-mcluster-bn192-g8": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                              staging_boxes=2, group=8),
    # quack's tile in quack's order: raster groups of 8 columns of units, the expert's M tiles walked inside each,
    # every other group upward (its varlen scheduler's default); the profile of quack's pick read 0.57 of our
    # tile's DRAM bytes on the walk above
    "k6/coop256-cluster-bn192-n8": K6Config("cooperative", 192, stages=3, cluster=2, staging_boxes=3, group=8,
                                            raster="n"),
    # and the M pair so, the fastest candidate at the Mixtral-sized projection on the M-grouped walk
    "k6/pingpong-mcluster-bn192-n8": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                              staging_boxes=2, group=8, raster="n"),
    # quack's tile on the M-grouped walk with its operands' L2 misses promoted to 128 bytes, as CuTe's descriptors
    # (quack's) ask, where ours ask 256: the order of the walk did not explain the 1.7x DRAM bytes at DBRX's down
    # projection; this setting is the next difference (a launch argument: the g8 rung's machine code)
    "k6/coop256-cluster-bn192-g8-p128": K6Config("cooperative", 192, stages=3, cluster=2, staging_boxes=3, group=8,
                                                 l2_promotion=128),
    # the fused SwiGLU backward's tile (chapter 09) as a plain GEMM on the raster walk: what its memory traffic
    # falls to when the walk alone changes
    "k6/pingpong-bn128-g8": K6Config("pingpong", 128, stages=6, staging_boxes=2, group=8),
    # (f) the host-built walk, for the device walk's cost; B^T for chapter 08's backward pass
    "k6/pingpong-cluster-bn192-host": K6Config("pingpong", 192, stages=5, cluster=2, staging_boxes=2,
                                               schedule="host"),
    "k6/pingpong-cluster-bn192-kmajor": K6Config("pingpong", 192, stages=5, cluster=2, staging_boxes=2,
                                                 b_layout="nk"),
    # K-major twins of three more of k6/auto's candidates, for the torch op to tune among when b comes
    # K-major (autograd's dA = dC B^T): the same template with B_K_MAJOR = true
    "k6/pingpong-bn192-kmajor": K6Config("pingpong", 192, stages=5, staging_boxes=2, b_layout="nk"),
    "k6/pingpong-cluster-bn128-kmajor": K6Config("pingpong", 128, stages=6, cluster=2, staging_boxes=2,
                                                 b_layout="nk"),
    "k6/coop256-cluster-bn128-kmajor": K6Config("cooperative", 128, stages=4, cluster=2, staging_boxes=1,
                                                b_layout="nk"),
    # (h) programmatic dependent launch: the rung without a cluster and quack's own tile and cluster, each
    # launched to overlap its set-up with the end of the launch before it
    "k6/pingpong-bn192-pdl": K6Config("pingpong", 192, stages=5, staging_boxes=2, pdl=True),
    "k6/pingpong-mcluster-bn192-pdl": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                               staging_boxes=2, pdl=True),
    # a staging ring of three boxes per ping-pong warpgroup, so four stages, not five: the shared ring's question
    # (what its fifth stage is worth) asked of the same kernel
    "k6/pingpong-bn192-rings": K6Config("pingpong", 192, stages=4, staging_boxes=3, private_rings=True),
    # the M pair ending on the producer's tail, not a cluster barrier: the profile's barrier stalls without the
    # three idle producer warps that wait in that barrier for the whole launch
    "k6/pingpong-mcluster-bn192-tail": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                                staging_boxes=2, producer_tail=True),
    # the M pair (k6/auto's choice at 16,384 rows and more) with the device walk's cursor: the profile found the
    # walk's one per-tile difference from the host list in the producer's lookup; this shortens it
    "k6/pingpong-mcluster-bn192-cursor": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                                  staging_boxes=2, cursor=True),
    # the M pair whose block first lists its units, every thread looking one up at once before the main loop: the
    # producer's per-unit work becomes one shared-memory load, as on the host list, up to walk::LISTED units (past
    # them, the binary search: the cursor's state beside the list took the producer past its 40 registers, a spill)
    "k6/pingpong-mcluster-bn192-listed": K6Config("pingpong", 192, stages=5, cluster=2, cluster_along="m",
                                                  staging_boxes=2, listed=True),
}
# --8<-- [end:ladder]

# The fused SwiGLU epilogue of an MoE layer's first GEMM (chapter 08): B = [W_gate | W_up],
# C = silu(gate) * up [M_tot, N / 2]. BN = 128 (64 gate columns and their 64 up columns per tile), the
# device walk; the cluster rungs are the fused twins of k6/pingpong-cluster-bn128 and
# k6/coop256-cluster-bn128, which k6/auto's tuning put ahead of the plain BN = 128 rung at the
# Mixtral-sized projection (chapter 07).
FUSED: dict[str, K6Config] = {
    "k6/swiglu-bn128": K6Config("pingpong", 128, stages=6, staging_boxes=2, epilogue="swiglu"),
    "k6/swiglu-coop256": K6Config("cooperative", 128, stages=4, staging_boxes=1, epilogue="swiglu"),
    "k6/swiglu-cluster-bn128": K6Config("pingpong", 128, stages=6, cluster=2, staging_boxes=2, epilogue="swiglu"),
    "k6/swiglu-coop256-cluster": K6Config("cooperative", 128, stages=4, cluster=2, staging_boxes=1,
                                          epilogue="swiglu"),
    # the raster walk (a run-time argument: the same kernel as the rung above) that GEMM 1 alone took at
    # the Mixtral-like layer's 32,768 tokens, 11% faster there than without it (chapter 08)
    "k6/swiglu-coop256-cluster-g8": K6Config("cooperative", 128, stages=4, cluster=2, staging_boxes=1,
                                             epilogue="swiglu", group=8),
}

# SwiGLU's backward fused into the dA GEMM of GEMM 2 (chapter 09): dY [M_tot, H] times W_down [E, I, H] read
# K-major, the epilogue writing dh [M_tot, 2I] and the activation from the saved pre-activation. BN = 128 and
# 6 stages as k6/swiglu-bn128; the register epilogue needs one staging box, unused.
FUSED_BACKWARD: dict[str, K6Config] = {
    "k6/dswiglu-bn128": K6Config("pingpong", 128, stages=6, staging_boxes=1, b_layout="nk", epilogue="dswiglu"),
    # h by TMA into a 64 KB buffer while the tile's main loop runs: four stages fit beside it
    "k6/dswiglu-prefetch-bn128": K6Config("pingpong", 128, stages=4, staging_boxes=1, b_layout="nk",
                                          epilogue="dswiglu", prefetch_h=True),
    # the first's kernel walking its units in raster groups of 8 M tiles (a launch argument, not a template one):
    # with one M tile at a time, every M tile of an expert streams all of W_down[e] again once it outgrows L2
    "k6/dswiglu-g8-bn128": K6Config("pingpong", 128, stages=6, staging_boxes=1, b_layout="nk", epilogue="dswiglu",
                                    group=8),
    # the raster walk with L2 eviction priorities: W_down's boxes evict-last, the epilogue's streams (h in, dh and
    # the activation out: 160 KB a unit) evict-first, so that they do not push W_down's column tiles out of L2
    # before the group's other M tiles read them
    "k6/dswiglu-hints-g8-bn128": K6Config("pingpong", 128, stages=6, staging_boxes=1, b_layout="nk",
                                          epilogue="dswiglu", group=8, l2_hints=True),
    # the first in a cluster of two blocks along M (k6_persistent_dswiglu_cluster2): the pair's two M tiles share
    # each W_down box by multicast, so W_down, which every M tile of an expert streams again, crosses from memory
    # once per pair of M tiles
    "k6/dswiglu-mcluster-bn128": K6Config("pingpong", 128, stages=6, cluster=2, cluster_along="m", staging_boxes=1,
                                          b_layout="nk", epilogue="dswiglu"),
}

# What k6/auto chooses among (its chooser: moe_gemm.variants.k6.auto) once each has run on a GPU: AUTO_CANDIDATES
# below leaves out those still in NOT_YET_RUN.
CANDIDATES: tuple[str, ...] = (
    "k6/pingpong-bn192", "k6/pingpong-bn128", "k6/pingpong-cluster-bn192", "k6/pingpong-cluster-bn128",
    "k6/coop256-cluster-bn128", "k6/coop256-cluster-bn192", "k6/pingpong-cluster-bn192-g8",
    "k6/coop256-cluster-bn128-g8", "k6/pingpong-mcluster-bn192", "k6/coop256-cluster-bn192-g8",
    "k6/pingpong-mcluster-bn192-g8", "k6/coop256-cluster-bn192-n8", "k6/pingpong-mcluster-bn192-n8",
)

# The unit list, which chapter 07's walk part put within 1% of the host list at 65,536 balanced rows on the M pair,
# carried into each other candidate of k6/auto (but the walk along N, which looks its units up one by one): built
# and compiled, for k6/auto to choose among once they have run on a GPU (the change to every device-walked rung the
# chapter's page names as the walk's next step).
LISTED_TWINS: dict[str, K6Config] = {f"{name}-listed": LADDER[name].replace(listed=True) for name in CANDIDATES
                                     if f"{name}-listed" not in LADDER and LADDER[name].raster == "m"}
LADDER.update(LISTED_TWINS)

# Rungs built, compiled and inspected on every machine that have not yet run on a GPU: chapter 07's run leaves
# them out (and says so), their GPU tests skip, and the validation record does not cover them. To admit them:
# `python -m moe_gemm.measure.validation run k6 --admit` on an sm_90a GPU runs their GPU tests and
# compute-sanitizer with the family's and records those that pass; then take their names out of here.
# Passed on an H100 so far: the PDL, private-ring, producer-tail, cursor and unit-list rungs (2026-12-06), the unit
# list's twins, the fused backward's tile on the raster walk and the two raster-walked candidates for the model
# projections with their unit-list twins, then quack's tile and the M pair in quack's order, and the raster rung with
# 128-byte L2 promotion (2026-12-07).
NOT_YET_RUN: frozenset[str] = frozenset()

AUTO_CANDIDATES: tuple[str, ...] = tuple(name for name in CANDIDATES if name not in NOT_YET_RUN)

# What the torch op chooses among for b given K-major: the -kmajor rungs, each validated on the GPU as
# a LADDER rung (four, not all nine candidates: every rung is compiled and tested in CI).
KMAJOR_CANDIDATES: tuple[str, ...] = tuple(name for name in LADDER if name.endswith("-kmajor"))

# compute-sanitizer's set: both modes, clusters of one and two, 1, 2 and 3 staging boxes, both walks,
# both B layouts.
SANITIZED = ("k6/pingpong-bn128", "k6/pingpong-cluster-bn192-g8", "k6/coop256-bn128", "k6/coop256-cluster-bn192",
             "k6/pingpong-cluster-bn192-host", "k6/pingpong-cluster-bn192-kmajor", "k6/swiglu-bn128",
             "k6/swiglu-coop256", "k6/swiglu-coop256-cluster")
