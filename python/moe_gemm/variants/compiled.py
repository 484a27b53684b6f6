"""What every NVRTC-compiled variant (k1, k2, ...) shares: compiling, resources, input checks."""

from __future__ import annotations

from ..bench import Resources
from ..build import CompiledKernel, compile_kernel
from ..device import DeviceProblem
from ..problem import BF16


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
        """NVRTC-compile for ``arch`` (default: the running GPU's); spills and local memory are an error."""
        return compile_kernel(self.source, self.kernel_name, arch=arch).require_no_spills()

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
