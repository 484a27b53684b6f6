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
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..bench import Prepared
from ..build import TensorMapArg, launch, max_active_clusters, prefer_shared_memory
from ..descriptors import OperandPlan, operand_plan, tma_write_box
from ..device import DeviceArray, DeviceProblem, to_device
from ..gpu import detect_gpu
from ..occupancy import residency
from ..tensormap import TiledMap, batched_matrix_map, check_tma_gemm, matrix_map
from ..tiles import tile_list
from .compiled import NamedConfigVariant

SOURCE = "k3_wgmma.cu"
KERNEL_FUNCTION = "k3_wgmma"  # the __global__ templates' common prefix (for profiler filters)
BK = 64  # one 128-byte swizzle row of bf16 per stage
BOX = 64  # B arrives in 64 x 64 boxes
SWIZZLE_ALIGN = 1024  # the kernel aligns its ring to 1 KB by hand, which may cost up to 1 KB
REQUIRED_CAPABILITY = (9, 0)
BLayout = Literal["kn", "nk"]  # B [E, K, N] as given (MN-major for the MMA), or B^T [E, N, K]

# The accumulator-free part of the kernel's OperandPlan struct, as the launch passes it by value.
PLAN_DTYPE = np.dtype([("bits", "<u8"), ("k16_bytes", "<u4"), ("mn64_bytes", "<u4")], align=True)


@dataclass(frozen=True)
class K3Config:
    """One instantiation of the kernel template plus how it is launched."""

    bm: int
    bn: int
    consumers: int  # consumer warpgroups: 1 or 2
    stages: int
    cluster: int = 1  # 2: B multicast across a cluster of two blocks
    persistent: bool = False  # one block (cluster) per SM slot instead of one per tile
    b_layout: BLayout = "kn"
    tma_store: bool = False  # the epilogue through shared memory (stmatrix + TMA store)

    @property
    def threads(self) -> int:
        return 128 * self.consumers + (128 if self.consumers == 2 else 32)

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def staging_bytes(self) -> int:
        """The C tile staged for the TMA store: each warpgroup's slice, bf16."""
        return self.bm * self.bn * 2 if self.tma_store else 0

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + self.staging_bytes + SWIZZLE_ALIGN

    @property
    def kernel_name(self) -> str:
        entry = KERNEL_FUNCTION if self.cluster == 1 else f"{KERNEL_FUNCTION}_cluster2"
        flags = ", ".join("true" if flag else "false" for flag in (self.b_layout == "nk", self.tma_store))
        return f"{entry}<{self.bm}, {self.bn}, {self.consumers}, {self.stages}, {flags}>"


# --8<-- [start:ladder]
LADDER: dict[str, K3Config] = {
    # (a) one consumer warpgroup + a producer warp; 3 x 32 KB stages so that two blocks share an SM
    "k3/1wg-bn128": K3Config(bm=128, bn=128, consumers=1, stages=3),
    # (b) two consumer warpgroups + a producer warpgroup, setmaxnreg 40 / 232; one block per SM
    "k3/2wg-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6),
    "k3/2wg-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4),
    # (c) persistent: one block per SM walks the tile list; as many stages as fit 227 KB
    "k3/persistent-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6, persistent=True),
    "k3/persistent-bn192": K3Config(bm=128, bn=192, consumers=2, stages=5, persistent=True),
    "k3/persistent-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    "k3/persistent-bm64-bn256": K3Config(bm=64, bn=256, consumers=2, stages=5, persistent=True),
    # (d) clusters of two with B multicast
    "k3/multicast-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6, cluster=2, persistent=True),
    "k3/multicast-bn192": K3Config(bm=128, bn=192, consumers=2, stages=5, cluster=2, persistent=True),
    "k3/multicast-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4, cluster=2, persistent=True),
    # (e) the epilogue through shared memory and TMA stores; the C staging costs a stage
    "k3/tmastore-bn128": K3Config(bm=128, bn=128, consumers=2, stages=5, persistent=True, tma_store=True),
    "k3/tmastore-bn192": K3Config(bm=128, bn=192, consumers=2, stages=4, persistent=True, tma_store=True),
    "k3/tmastore-bn256": K3Config(bm=128, bn=256, consumers=2, stages=3, persistent=True, tma_store=True),
    "k3/tmastore-bm64-bn256": K3Config(bm=64, bn=256, consumers=2, stages=4, persistent=True, tma_store=True),
    "k3/multicast-tmastore-bn192": K3Config(bm=128, bn=192, consumers=2, stages=4, cluster=2, persistent=True,
                                            tma_store=True),
    "k3/multicast-tmastore-bn256": K3Config(bm=128, bn=256, consumers=2, stages=3, cluster=2, persistent=True,
                                            tma_store=True),
    # B^T [E, N, K]: both operands K-major
    "k3/persistent-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=5, persistent=True, b_layout="nk"),
    "k3/multicast-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=5, cluster=2, persistent=True,
                                          b_layout="nk"),
    "k3/tmastore-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=4, persistent=True, tma_store=True,
                                         b_layout="nk"),
}
# --8<-- [end:ladder]

# The rungs compute-sanitizer runs on: together they take every branch of the template (producer
# warp and warpgroup, one and two M slices per warpgroup, split by rows and by columns, one block
# per tile and persistent, cluster with and without multicast pairs, register and TMA-store
# epilogues, both B layouts) at a fraction of the ladder's sanitizer time.
SANITIZED = ("k3/1wg-bn128", "k3/2wg-bn256", "k3/tmastore-bm64-bn256", "k3/multicast-tmastore-bn192",
             "k3/multicast-bn192-kmajor", "k3/persistent-bn128")


def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:  # noqa: N803
    """ValueError naming the first rule of TMA or of the kernel that these inputs break."""
    check_tma_gemm("k3", K, N, BK, a_address, b_address)


def require_sm90a(variant: str) -> Any:
    """The GPU, if it runs sm_90a code (compute capability 9.0 exactly); ValueError otherwise."""
    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    if gpu.compute_capability != REQUIRED_CAPABILITY:
        have = f"sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
        raise ValueError(f"{variant} needs an sm_90a GPU (compute capability 9.0: wgmma and setmaxnreg exist only "
                         f"in that target); {gpu.name} is {have}")
    return gpu


# --8<-- [start:tensor_maps]
def operand_maps(config: K3Config, a_address: int, b_address: int, tokens: int, experts: int, K: int,  # noqa: N803
                 N: int) -> tuple[TiledMap, TiledMap]:  # noqa: N803
    """A [M_tot, K] in boxes of BM rows x 64 of K; B in 64 x 64 boxes of one expert, either
    B [E, K, N] (64 of K x 64 columns) or B^T [E, N, K] (64 columns x 64 of K). Chapter 05's k4
    loads its operands through the same maps."""
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=config.bm, box_cols=BK)
    if config.b_layout == "kn":
        b_map = batched_matrix_map("B", b_address, batch=experts, rows=K, cols=N, box_rows=BK, box_cols=BOX)
    else:
        b_map = batched_matrix_map("B^T", b_address, batch=experts, rows=N, cols=K, box_rows=BOX, box_cols=BK)
    return a_map, b_map


def output_map(c_address: int, tokens: int, N: int) -> TiledMap:  # noqa: N803
    """C [M_tot, N] in 64 x 64 boxes, for the TMA-store epilogue."""
    return matrix_map("C", c_address, rows=tokens, cols=N, box_rows=64, box_cols=BOX)
# --8<-- [end:tensor_maps]


def plans(config: K3Config) -> tuple[OperandPlan, OperandPlan]:
    """The descriptor plans the kernel gets for A (always K-major) and B."""
    return operand_plan("K"), operand_plan("MN" if config.b_layout == "kn" else "K")


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
    plan_a, plan_b = plans(config)
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


def plan_argument(plan: OperandPlan) -> np.void:
    """An OperandPlan as the 16-byte struct the kernel takes by value."""
    return np.array([(plan.bits, plan.k16_bytes, plan.mn64_bytes)], dtype=PLAN_DTYPE)[0]


# --8<-- [start:pairs]
def cluster_pairs(counts: np.ndarray, N: int, bm: int, bn: int) -> np.ndarray:  # noqa: N803
    """The tile list for clusters of two: int32 [2 * units, 4], the two tiles of unit u in rows 2u, 2u+1.

    M tiles 2j and 2j+1 of one expert and one N column form a unit, so the two blocks read the
    same B boxes and multicast them. An expert's last M tile, when it has an odd number, is a
    *lone* tile: lone tiles are paired with the next lone tile in list order (another column or
    another expert: no multicast, each block loads its own B), and a last one left over is paired
    with a copy of itself that stores no rows. Units stay in expert-major order, as the flat list is.
    """
    flat = tile_list(counts, N, bm, bn)
    units: list[np.ndarray] = []
    waiting: np.ndarray | None = None  # a lone tile looking for a partner
    n_tiles = -(-N // bn)
    start = 0
    for count in np.asarray(counts, dtype=np.int64):
        m_tiles = -(-int(count) // bm)
        block = flat[start: start + m_tiles * n_tiles].reshape(m_tiles, n_tiles, 4)
        start += m_tiles * n_tiles
        for m in range(0, m_tiles - 1, 2):
            for n in range(n_tiles):
                units.append(np.stack([block[m, n], block[m + 1, n]]))
        if m_tiles % 2:
            for n in range(n_tiles):
                if waiting is None:
                    waiting = block[-1, n]
                else:
                    units.append(np.stack([waiting, block[-1, n]]))
                    waiting = None
    if waiting is not None:
        idle = waiting.copy()
        idle[2] = 0  # same expert and columns (so the pair multicasts), no rows to store
        units.append(np.stack([waiting, idle]))
    return np.concatenate(units).astype(np.int32) if units else np.zeros((0, 4), dtype=np.int32)
# --8<-- [end:pairs]


def transposed_b(dev: DeviceProblem) -> DeviceArray:
    """B^T [E, N, K] on the device, made once per uploaded problem (the offline layout step)."""
    cached = getattr(dev, "_b_transposed", None)
    if cached is None:
        cached = to_device(np.ascontiguousarray(dev.problem.b.transpose(0, 2, 1)))
        dev._b_transposed = cached  # noqa: SLF001 - a cache on the harness's upload object
    return cached


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

    def tiles(self, counts: np.ndarray, N: int) -> np.ndarray:  # noqa: N803
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
        self.require_bf16_inputs(dev)
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
        a_map, b_map = operand_maps(self.config, dev.a.ptr, b.ptr, problem.tokens, problem.experts, problem.K,
                                    problem.N)
        maps = tuple(TensorMapArg(m.encode()) for m in (a_map, b_map, output_map(output.ptr, problem.tokens,
                                                                                   problem.N)))
        plan_a, plan_b = plans(self.config)
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
VARIANTS = {name: functools.partial(K3Wgmma, name) for name in LADDER}
