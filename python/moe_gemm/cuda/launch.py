"""Loading compiled kernels and launching them on the harness stream.

:func:`launch` goes through cuda.core, or through ``cuLaunchKernel`` when an argument (a TMA
tensor map) has to be passed by value as a 128-byte struct. Kernel attributes (dynamic shared
memory above 48 KB, the carveout) are set once per kernel and device: cuKernelSetAttribute sets them
for one device (``device``: its index; None: the harness's device, moe_gemm.cuda.device.cuda_device).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.nvrtc import CompiledKernel

DEFAULT_SMEM_LIMIT = 48 * 1024  # more dynamic shared memory than this needs an explicit opt-in


class TensorMapArg:
    """A 128-byte CUtensorMap passed by value (a __grid_constant__ kernel parameter)."""

    def __init__(self, tensor_map: Any) -> None:
        self.tensor_map = tensor_map  # a cuda.bindings driver.CUtensorMap

    @property
    def address(self) -> int:
        return int(self.tensor_map.getPtr())


@functools.cache
def _loaded(cubin: bytes, symbol: str):
    from cuda.core import ObjectCode

    from moe_gemm.cuda.device import cuda_device

    cuda_device()
    return ObjectCode.from_cubin(cubin).get_kernel(symbol)


def _device_id(device: int | None) -> int:
    from moe_gemm.cuda.device import cuda_device

    return cuda_device().device_id if device is None else device


@functools.cache
def _allow_dynamic_smem(kernel, nbytes: int, device: int | None = None) -> None:
    """Opt in once per kernel, size and device (cached: launches in a timing loop skip the call)."""
    from cuda.bindings import driver

    from moe_gemm.cuda.device import check_driver

    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check_driver(driver.cuKernelSetAttribute(attribute, nbytes, kernel.handle, _device_id(device)))


@functools.cache
def prefer_shared_memory(compiled: CompiledKernel, percent: int = 100, device: int | None = None) -> None:
    """Ask for ``percent`` of the unified L1/shared-memory array as shared memory (a hint the
    driver may override), so the carveout it picks never limits resident blocks below what the
    registers allow. Once per kernel and device: cached."""
    from cuda.bindings import driver

    from moe_gemm.cuda.device import check_driver

    kernel = _loaded(compiled.cubin, compiled.symbol)
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    check_driver(driver.cuKernelSetAttribute(attribute, percent, kernel.handle, _device_id(device)))


def max_active_clusters(compiled: CompiledKernel, block: int, smem_bytes: int, cluster: int,
                        device: int | None = None) -> int | None:
    """How many clusters of ``cluster`` blocks the driver says can be resident at once (a persistent
    cluster grid larger than that would run its last clusters after the first ones finish); None
    where the driver cannot say. Clusters live inside one GPC, so this can be less than
    SMs / cluster when a GPC has an odd number of usable SMs. ``device``: asked in the current context
    (the caller makes that device's current), on its default stream."""
    from cuda.bindings import driver

    from moe_gemm.cuda.device import check_driver, stream_handle

    kernel = _loaded(compiled.cubin, compiled.symbol)
    if smem_bytes > DEFAULT_SMEM_LIMIT:
        _allow_dynamic_smem(kernel, smem_bytes, device)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem_bytes
    config.hStream = driver.CUstream(stream_handle() if device is None else 0)
    config.numAttrs = 0  # the kernel's __cluster_dims__ gives the size
    try:
        return int(check_driver(driver.cuOccupancyMaxActiveClusters(driver.CUfunction(int(kernel.handle)), config)))
    except (RuntimeError, TypeError, ValueError):
        return None


class PackedArguments:
    """A kernel's arguments laid out once as cuLaunchKernel's ``kernelParams``: one pointer per
    argument's bytes. Packing costs microseconds of numpy per argument (``ctypes.data``); a launch
    repeated with the same arguments (a timing loop, the torch op's cached arguments) packs once."""

    def __init__(self, args: tuple) -> None:
        holders: list[Any] = []
        for arg in args:
            if isinstance(arg, TensorMapArg):
                holders.append(arg)
            elif isinstance(arg, np.generic):
                holders.append(np.array([arg]))
            elif isinstance(arg, int):  # device pointers
                holders.append(np.array([arg], dtype=np.uint64))
            else:
                raise TypeError(f"cannot pass {type(arg).__name__} to a kernel")
        self.holders = holders  # the bytes the pointers point at: alive as long as this object
        self.pointers = np.array([h.address if isinstance(h, TensorMapArg) else h.ctypes.data for h in holders],
                                 dtype=np.uint64)
        self.address = self.pointers.ctypes.data


def _driver_launch(kernel, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
                   args: PackedArguments, stream: int | None = None, programmatic: bool = False) -> None:
    """cuLaunchKernel with the packed ``kernelParams``, on ``stream`` (a CUstream handle; the
    harness stream by default); ``programmatic``: cuLaunchKernelEx with programmatic_launch_config's
    attribute instead."""
    from cuda.bindings import driver

    from moe_gemm.cuda.device import check_driver, stream_handle

    handle = stream_handle() if stream is None else stream
    if programmatic:
        check_driver(driver.cuLaunchKernelEx(programmatic_launch_config(grid, block, smem, handle),
                                             driver.CUfunction(int(kernel.handle)), args.address, 0))
        return
    check_driver(driver.cuLaunchKernel(driver.CUfunction(int(kernel.handle)), *grid, *block, smem,
                                       driver.CUstream(handle), args.address, 0))


@functools.lru_cache(maxsize=64)
def programmatic_launch_config(grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int):
    """cuLaunchKernelEx's configuration for a programmatic dependent launch: the attribute
    PROGRAMMATIC_STREAM_SERIALIZATION lets this launch begin before the one before it on the stream has
    finished (the kernel's griddepcontrol.wait then orders its reads after that one's writes); a stream
    capture records it as a programmatic edge of the graph. Built once per grid, block, shared memory and
    stream (a launch in a timing loop repeats them), without the driver: a CPU test reads it."""
    from cuda.bindings import driver

    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem
    config.hStream = driver.CUstream(stream)
    config.attrs = [attribute]
    config.numAttrs = 1
    return config


def launch(compiled: CompiledKernel, grid: int | tuple[int, ...], block: int | tuple[int, ...], smem_bytes: int,
           *args: Any, stream: int | None = None, device: int | None = None, programmatic: bool = False) -> None:
    """Enqueue ``compiled`` on the harness stream, or on ``stream`` (a CUstream handle, e.g. torch's
    ``torch.cuda.current_stream().cuda_stream``, of GPU ``device``, whose context the caller made
    current). Pointers as int, scalars as numpy scalars, or one :class:`PackedArguments` made once for
    launches that repeat. ``programmatic``: a programmatic dependent launch (programmatic_launch_config), for
    a kernel that executes griddepcontrol.wait before it touches what the launch before it may write."""
    kernel = _loaded(compiled.cubin, compiled.symbol)
    if smem_bytes > DEFAULT_SMEM_LIMIT:
        _allow_dynamic_smem(kernel, smem_bytes, device)
    grid3 = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    block3 = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (block, 1, 1)
    if len(args) == 1 and isinstance(args[0], PackedArguments):
        _driver_launch(kernel, grid3, block3, smem_bytes, args[0], stream, programmatic)
    elif programmatic or stream is not None or any(isinstance(arg, TensorMapArg) for arg in args):
        _driver_launch(kernel, grid3, block3, smem_bytes, PackedArguments(args), stream, programmatic)
    else:  # (imported here, not above: three imports cost a repeated launch ~3.5 us of host time)
        from cuda.core import LaunchConfig
        from cuda.core import launch as core_launch

        from moe_gemm.cuda.device import harness_stream

        core_launch(harness_stream(), LaunchConfig(grid=grid3, block=block3, shmem_size=smem_bytes), kernel, *args)
