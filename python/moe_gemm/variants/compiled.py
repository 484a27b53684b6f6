"""What every NVRTC-compiled variant (k1, k2, ...) shares: compiling, resources, input checks.

A variant declares the kind of problem it takes (its ragged axes, operand formats and output dtypes)
and :func:`require_takes` refuses any other before a launch, so a forward kernel handed a weight
gradient or FP8 operands says so instead of reading them as bf16 [E, K, N].
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.cuda.nvrtc import CompiledKernel, compile_kernel
from moe_gemm.cuda.variant import Resources
from moe_gemm.model.problem import BF16, BF16_OPERANDS, OperandFormat, Problem, RaggedAxis, dtype_name
from moe_gemm.variants.sm90.config import SMEM_LIMIT

# What every variant up to chapter 08 takes: the forward, ragged along M, bf16 operands, bf16 output.
FORWARD_RAGGED_AXES: tuple[RaggedAxis, ...] = ("M",)
FORWARD_FORMATS: tuple[OperandFormat, ...] = (BF16_OPERANDS,)
FORWARD_OUT_DTYPES: tuple[np.dtype, ...] = (BF16,)


def require_takes(
    variant: str, problem: Problem, ragged_axes: Sequence[RaggedAxis] = FORWARD_RAGGED_AXES,
    formats: Sequence[OperandFormat] = FORWARD_FORMATS, out_dtypes: Sequence[np.dtype] = FORWARD_OUT_DTYPES,
) -> None:
    """ValueError naming what ``variant`` takes unless the problem's ragged axis, operand format and
    output dtype are among ``ragged_axes``, ``formats`` and ``out_dtypes``. Needs no GPU."""
    takes = (f"{variant} takes {' or '.join(f'ragged-{axis}' for axis in ragged_axes)} "
             f"{' or '.join(map(str, formats))} problems with {' or '.join(map(dtype_name, out_dtypes))} output")
    if problem.ragged not in ragged_axes:
        raise ValueError(f"{takes}; this one is ragged along {problem.ragged}")
    if problem.fmt not in formats:
        raise ValueError(f"{takes}; this one has {problem.fmt} operands")
    if problem.out_dtype not in out_dtypes:
        raise ValueError(f"{takes}; this one wants {dtype_name(problem.out_dtype)} output")


class CompiledVariant:
    """A kernel of ``kernels/<source>`` run with ``warps_per_block`` warps and dynamic shared memory.

    Subclasses name the source and warps, and give ``kernel_name`` (the C++ name expression NVRTC
    instantiates) and ``dynamic_smem_bytes`` (what the launch passes).
    """

    source: str
    warps_per_block: int
    name: str
    # the kind of problem it takes (require_takes); a weight-gradient or FP8 kernel overrides them
    ragged_axes: tuple[RaggedAxis, ...] = FORWARD_RAGGED_AXES
    formats: tuple[OperandFormat, ...] = FORWARD_FORMATS
    out_dtypes: tuple[np.dtype, ...] = FORWARD_OUT_DTYPES

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

    def require_inputs(self, dev: DeviceProblem) -> None:
        """ValueError unless this variant takes the problem (:func:`require_takes`) and its inputs are on the
        device as the problem holds them (type and shape)."""
        problem = dev.problem
        require_takes(self.name, problem, self.ragged_axes, self.formats, self.out_dtypes)
        inputs = [("A", dev.a, problem.a), ("B" if problem.ragged == "M" else "dC", dev.b, problem.b)]
        if problem.fmt.scaled:
            inputs += [("scale_a", dev.scale_a, problem.scale_a), ("scale_b", dev.scale_b, problem.scale_b)]
        for label, array, host in inputs:
            if array.dtype != host.dtype or array.shape != host.shape:
                raise ValueError(f"{self.name} needs {label} as {dtype_name(host.dtype)} {host.shape} on the device, "
                                 f"got {array.dtype} {array.shape}")


class NamedConfigVariant(CompiledVariant):
    """A variant picked by name from a table of configurations (``CONFIGS``), each of which knows its
    template instantiation (``kernel_name``) and launch shared memory (``dynamic_smem_bytes``)."""

    configs: Mapping[str, Any]
    family: str
    # The static shared memory a block has beside the dynamic part: with it, a configuration whose sum passes
    # what an sm_90 block may have (SMEM_LIMIT) is refused at construction (None: not checked).
    static_smem_allowance: int | None = None
    # (experts, K, N, *operand addresses) -> one reason per rule the inputs break (staticmethod; see check_shape)
    shape_rules: Callable[..., list[str]]

    def __init__(self, name: str, config: Any = None) -> None:
        """The configuration called ``name`` in ``configs``, or any ``config`` under a name of one's choosing."""
        if config is None:
            if name not in self.configs:
                raise ValueError(f"unknown {self.family} variant {name!r}; {self.family} has {', '.join(self.configs)}")
            config = self.configs[name]
        self.name, self.config = name, config
        if self.static_smem_allowance is not None and \
                config.dynamic_smem_bytes + self.static_smem_allowance > SMEM_LIMIT:
            raise ValueError(f"{name}: {config.dynamic_smem_bytes:,} B of shared memory plus the static part pass "
                             f"the {SMEM_LIMIT:,} B a block may have")

    def check_shape(self, experts: int, K: int, N: int, *addresses: int) -> None:
        """ValueError naming every rule (``shape_rules``) these inputs break, before any launch (no GPU needed)."""
        reasons = self.shape_rules(experts, K, N, *addresses)
        if reasons:
            raise ValueError(f"{self.name} cannot take these inputs: {'; '.join(reasons)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @property
    def kernel_name(self) -> str:
        return self.config.kernel_name

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.config.dynamic_smem_bytes
