"""What every NVRTC-compiled variant (k1, k2, ...) shares: compiling, resources, input checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.cuda.nvrtc import CompiledKernel, compile_kernel
from moe_gemm.cuda.variant import Resources
from moe_gemm.model.problem import BF16


class CompiledVariant:
    """A kernel of ``kernels/<source>`` run with ``warps_per_block`` warps and dynamic shared memory.

    Subclasses name the source and warps, and give ``kernel_name`` (the C++ name expression NVRTC
    instantiates) and ``dynamic_smem_bytes`` (what the launch passes).
    """

    source: str
    warps_per_block: int
    name: str

    @property
    def kernel_name(self) -> str:
        raise NotImplementedError

    @property
    def dynamic_smem_bytes(self) -> int:
        raise NotImplementedError

    def compile(self, arch: str | None = None) -> CompiledKernel:
        """NVRTC-compile for ``arch`` (default: the running GPU's); spills and local memory are an error.

        Kept per variant: even a disk-cache hit hashes every kernel source to find the cubin, about a
        millisecond of host time, and a launch path that asks for its kernel on every call (the torch
        op) must not pay it each time."""
        key = (self.source, self.kernel_name, arch)
        compiled = self.__dict__.setdefault("_compiled", {})
        if key not in compiled:
            compiled[key] = compile_kernel(self.source, self.kernel_name, arch=arch).require_no_spills()
        return compiled[key]

    def resources(self, arch: str | None = None) -> Resources:
        report = self.compile(arch).report
        return Resources(registers=report.registers,
                         smem_bytes=report.static_smem_bytes + self.dynamic_smem_bytes,
                         spill_bytes=report.spill_bytes, warps_per_block=self.warps_per_block)

    def require_bf16_inputs(self, dev: DeviceProblem) -> None:
        """ValueError unless A and B are on the device as bf16 in the problem's shapes."""
        problem = dev.problem
        for label, array, shape in (("A", dev.a, problem.a.shape), ("B", dev.b, problem.b.shape)):
            if array.dtype != BF16 or array.shape != shape:
                raise ValueError(f"{self.name} needs {label} as bf16 {shape} on the device, "
                                 f"got {array.dtype} {array.shape}")


class NamedConfigVariant(CompiledVariant):
    """A variant picked by name from a table of configurations (``CONFIGS``), each of which knows its
    template instantiation (``kernel_name``) and launch shared memory (``dynamic_smem_bytes``)."""

    configs: Mapping[str, Any]
    family: str

    def __init__(self, name: str) -> None:
        if name not in self.configs:
            raise ValueError(f"unknown {self.family} variant {name!r}; {self.family} has {', '.join(self.configs)}")
        self.name = name
        self.config = self.configs[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @property
    def kernel_name(self) -> str:
        return self.config.kernel_name

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.config.dynamic_smem_bytes
