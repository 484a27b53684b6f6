"""Launches of our kernels on torch tensors, built once per set of pointers: the ops' hot path.

Building a launch costs far more than making one: k6 packs its arguments, k7 and k8 also ask the driver to
encode three or four tensor maps (tens of microseconds each). torch's caching allocator hands the same
addresses out again call after call, so each op keeps its launches per pointers and stream and rebuilds only
for a set it has not seen (at most MAX_PACKED kept, the oldest dropped first).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch


class PointerLaunches:
    """One compiled kernel on one shape and GPU ``index``, ready to launch on any tensors. A subclass says how
    to build the launch for a set of pointers (``build``); ``__call__`` takes the tensors in the order of the
    pointers ``build`` receives (None for a pointer this instance never dereferences: 0)."""

    MAX_PACKED = 64  # distinct pointer sets kept; past that the oldest are dropped

    def __init__(self, index: int) -> None:
        self.index = index
        self.launches: dict[tuple[int, ...], Callable[[], None]] = {}

    def build(self, pointers: tuple[int, ...], stream: int) -> Callable[[], None]:
        """The launch on these device addresses, on CUDA stream handle ``stream``."""
        raise NotImplementedError

    def __call__(self, *tensors: torch.Tensor | None) -> None:
        from moe_gemm.cuda.device import make_context_current

        make_context_current(self.index)  # autograd's backward thread may have no driver context current
        stream = torch._C._cuda_getCurrentRawStream(self.index)  # torch.cuda.current_stream's handle, 2 us sooner
        key = (*[0 if t is None else t.data_ptr() for t in tensors], stream)  # None: a pointer the kernel leaves
        run = self.launches.get(key)
        if run is None:
            if len(self.launches) >= self.MAX_PACKED:
                self.launches.pop(next(iter(self.launches)))
            run = self.launches[key] = self.build(key[:-1], stream)
        if torch.cuda.current_device() == self.index:
            run()
        else:  # a tensor on another GPU than the current one: its context for the launch
            with torch.cuda.device(self.index):
                run()


class TensorMapLaunches(PointerLaunches):
    """A persistent kernel (one block per SM) whose arguments hold tensor maps (k7, k8): ``arguments(config,
    *pointers, *shape)`` lists them in the kernel's order, maps not yet encoded; ``build`` encodes them."""

    def __init__(self, variant: Any, arguments: Callable[..., Sequence[Any]], threads: int, index: int,
                 shape: tuple[int, ...]) -> None:
        from moe_gemm.cuda.launch import prefer_shared_memory

        super().__init__(index)
        self.kernel, self.config, self.arguments = variant.compile(), variant.config, arguments
        self.threads, self.shape = threads, shape
        with torch.cuda.device(index):
            prefer_shared_memory(self.kernel, device=index)
            self.grid = torch.cuda.get_device_properties(index).multi_processor_count

    def build(self, pointers: tuple[int, ...], stream: int) -> Callable[[], None]:
        from moe_gemm.cuda.launch import PackedArguments, TensorMapArg, launch
        from moe_gemm.cuda.tensormap import TiledMap

        args = self.arguments(self.config, *pointers, *self.shape)
        packed = PackedArguments(tuple(TensorMapArg(x.encode()) if isinstance(x, TiledMap) else x for x in args))
        return functools.partial(launch, self.kernel, self.grid, self.threads, self.config.dynamic_smem_bytes,
                                 packed, stream=stream, device=self.index)
