"""k6's launch, one path for the harness's variants (K6Persistent, and k6/auto through it) and the torch
op (moe_gemm.torch.ops): the kernel's arguments in the order of K6_PARAMS (kernels/k6_persistent.cu),
packed once per configuration, pointers and shape, and a grid of the device's slots, on the stream the
caller names.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.cuda.launch import PackedArguments, TensorMapArg, launch, max_active_clusters, prefer_shared_memory
from moe_gemm.cuda.nvrtc import CompiledKernel
from moe_gemm.cuda.tensormap import TiledMap, matrix_map
from moe_gemm.variants.k6.config import THREADS, K6Config
from moe_gemm.variants.sm90.config import BK
from moe_gemm.variants.sm90.maps import output_map, weight_map

BStrides = tuple[int, int] | None  # B's (row, expert) strides in elements; None: dense


def strided_weight_map(b_layout: str, b_address: int, experts: int, K: int, N: int,
                       b_strides: BStrides, element: str = "bf16") -> TiledMap:
    """B's map (sm90.maps.weight_map) with the row and expert strides a torch view has (b[:, :, :N] of a
    wider tensor, b[::2]): the same boxes, the copy engine steps by the given strides."""
    dense = weight_map(b_layout, b_address, experts, K, N, element)
    if b_strides is None:
        return dense
    row, expert = b_strides
    size = dense.element_bytes
    return TiledMap(dense.name, b_address, dense.dims, (row * size, expert * size), dense.box, element=element)


def tensor_maps(config: K6Config, a_address: int, b_address: int, c_address: int, tokens: int, experts: int,
                K: int, N: int, b_strides: BStrides = None) -> tuple[TiledMap, TiledMap, TiledMap]:
    """A in boxes of BM / CLUSTER rows (each block of a cluster along N loads its share), B in 64 x 64
    boxes of one expert (B [E, K, N] or B^T [E, N, K]; 64 x 32 along M, each block's share), C in 64 x 64
    boxes (N / 2 columns wide after the SwiGLU epilogue), each in the configuration's element types."""
    a_rows = config.bm // config.cluster if config.cluster_along == "n" else config.bm
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=a_rows, box_cols=BK, element=config.element)
    b_map = strided_weight_map(config.b_layout, b_address, experts, K, N, b_strides, config.element)
    if config.cluster_along == "m":  # each block of the pair loads half of every box's rows for both
        b_map = dataclasses.replace(b_map, box=(b_map.box[0], b_map.box[1] // config.cluster, 1))
    a_map, b_map = (dataclasses.replace(m, l2_promotion_bytes=config.l2_promotion) for m in (a_map, b_map))
    return a_map, b_map, output_map(c_address, tokens, config.out_columns(N), config.out)


def arguments(config: K6Config, a_address: int, b_address: int, c_address: int, ends_address: int, tokens: int,
              experts: int, K: int, N: int, units_address: int = 0, units: int = 0,
              b_strides: BStrides = None, preact_address: int = 0, act_address: int = 0) -> tuple[Any, ...]:
    """The kernel's arguments in K6_PARAMS order: the three tensor maps (not yet encoded: that needs the
    driver), C, the host walk's unit list and its length (0 and 0 for the device walk), the expert
    ends, M_tot (the device walk clamps every end to it), E, the raster group, K and N; then, for the
    SwiGLU's backward (epilogue "dswiglu"), the saved pre-activation (its tensor map where the configuration
    prefetches it) and the activation it writes. (The descriptor plans are compile-time constants:
    kernels/descriptor_steps.cuh, K_MAJOR_PLAN and MN_MAJOR_PLAN.)"""
    if (config.epilogue == "dswiglu") != bool(preact_address and act_address):
        raise ValueError("the dswiglu epilogue, and it alone, takes the addresses of the pre-activation and the "
                         "activation")
    extra: tuple[Any, ...] = ()
    if config.prefetch_h:  # h [M_tot, 2N] by TMA, in boxes of a warpgroup's 128 rows x 64 columns (k6::PrefetchH)
        extra = (matrix_map("H", preact_address, rows=tokens, cols=2 * N, box_rows=128, box_cols=BK,
                            element=config.element), act_address)
    elif config.epilogue == "dswiglu":
        extra = (preact_address, act_address)
    return (*tensor_maps(config, a_address, b_address, c_address, tokens, experts, K, N, b_strides), c_address,
            units_address, np.int32(units), ends_address, np.int32(tokens), np.int32(experts), np.int32(config.group),
            np.int32(K), np.int32(N), *extra)


@functools.lru_cache(maxsize=256)
def packed_arguments(config: K6Config, a_address: int, b_address: int, c_address: int, ends_address: int,
                     tokens: int, experts: int, K: int, N: int, units_address: int, units: int,
                     b_strides: BStrides = None, preact_address: int = 0, act_address: int = 0) -> PackedArguments:
    """:func:`arguments` with the maps encoded, packed for cuLaunchKernel. Encoding the three TMA
    descriptors and packing the parameter array is tens of microseconds of host time, more than a small
    launch takes on the GPU, so the same configuration, pointers and shape (torch's caching allocator
    hands the same blocks out again) reuse them."""
    args = arguments(config, a_address, b_address, c_address, ends_address, tokens, experts, K, N, units_address,
                     units, b_strides, preact_address, act_address)
    return PackedArguments(tuple(TensorMapArg(arg.encode()) if isinstance(arg, TiledMap) else arg for arg in args))


def resident_slots(kernel: CompiledKernel, config: K6Config, sm_count: int, device: int | None = None) -> int:
    """Blocks (clusters) a persistent launch of ``kernel`` runs at once on GPU ``device`` (None: the
    harness's): one 384-thread block per SM and, for clusters, no more than the driver says can be
    resident together; the carveout is set to lean fully to shared memory first (200-220 KB of ring per
    block). The caller keeps the answer: each query is a driver call."""
    prefer_shared_memory(kernel, device=device)
    slots = sm_count // config.cluster
    if config.cluster > 1:
        resident = max_active_clusters(kernel, THREADS, config.dynamic_smem_bytes, config.cluster, device=device)
        slots = min(slots, resident or slots)
    return slots


def grid(config: K6Config, slots: int, units: int = 0) -> int:
    """Blocks to launch: every slot for the device walk, which finds its units whatever the routing; for
    the host walk, no more slots than it has units (and at least one)."""
    blocks = slots if config.schedule == "device" else max(1, min(units, slots))
    return blocks * config.cluster


@dataclass(frozen=True)
class Launch:
    """One k6 launch, ready to repeat: calling it enqueues the kernel on ``stream`` (a CUstream handle;
    None: the harness stream) of GPU ``device`` (None: the harness's)."""

    kernel: CompiledKernel
    grid: int
    smem: int
    args: PackedArguments
    stream: int | None = None
    device: int | None = None

    programmatic: bool = False  # the configuration's pdl: a programmatic dependent launch

    def __call__(self) -> None:
        launch(self.kernel, self.grid, THREADS, self.smem, self.args, stream=self.stream, device=self.device,
               programmatic=self.programmatic)


def launcher(kernel: CompiledKernel, config: K6Config, slots: int, a_address: int, b_address: int, c_address: int,
             ends_address: int, tokens: int, experts: int, K: int, N: int, *, stream: int | None = None,
             units_address: int = 0, units: int = 0, b_strides: BStrides = None, device: int | None = None,
             preact_address: int = 0, act_address: int = 0) -> Launch:
    """k6 built as ``config`` (``kernel``) on these operands: ``slots`` is how many blocks (clusters)
    the device holds at once (:func:`resident_slots`), ``ends_address`` the expert ends (torch's offs),
    ``units_address`` and ``units`` the host walk's unit list (the -host rungs), ``b_strides`` B's row
    and expert strides when they are not the dense ones, ``preact_address`` and ``act_address`` the SwiGLU
    backward's saved pre-activation and its activation output (epilogue "dswiglu" only)."""
    args = packed_arguments(config, a_address, b_address, c_address, ends_address, tokens, experts, K, N,
                            units_address, units, b_strides, preact_address, act_address)
    return Launch(kernel, grid(config, slots, units), config.dynamic_smem_bytes, args, stream, device, config.pdl)
