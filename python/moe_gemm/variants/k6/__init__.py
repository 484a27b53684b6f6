"""k6: the last mile (kernels/k6_persistent.cu), chapter 07.

============================================  ===================================================================
``k6/pingpong-bn*``                           (a) each consumer warpgroup owns a 128 x BN tile; the two take turns
``k6/pingpong-cluster-bn*``                   (b) clusters of two blocks along N, A multicast
``k6/coop256-*``                              (c) 256-row tiles, 128 rows per warpgroup
``...-g8``                                    (d) the walk in raster groups of 8 M tiles
``...-n8``                                    the walk in raster groups of 8 columns, M walked inside (quack's order)
``k6/auto``                                   (e) the configuration for the shape, autotuned once and cached
``...-host``                                  (f) the host-built walk: every other rung finds its walk on the device
``...-kmajor``                                B given as B^T [E, N, K] (chapter 08's backward pass reads it so)
============================================  ===================================================================

Every rung but ``-host`` takes only the expert ends on the device (``offs``, as torch._grouped_mm):
a launch needs no host copy of the counts, so it can be captured in a CUDA graph once and replayed
for any routing. Refused before any launch, with a ValueError naming the rules
(moe_gemm.variants.k6.rules, which the torch op asks too): what chapter 04's k3 refuses (K a multiple
of 64, N of 8, 16-byte alignment, a GPU other than sm_90a) and, for the device walk, more than 256
experts.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceArray, DeviceProblem, to_device
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.edge_cases import EdgeCase
from moe_gemm.model.problem import BF16, BF16_OPERANDS, FP16, FP16_OPERANDS, FP32, Problem, dtype_name
from moe_gemm.variants.compiled import NamedConfigVariant
from moe_gemm.variants.k6 import launch
from moe_gemm.variants.k6.config import (
    FUSED,
    KERNEL_FUNCTION,
    LADDER,
    SANITIZED,
    SOURCE,
    STATIC_SMEM_ALLOWANCE,
    THREADS,
    K6Config,
)
from moe_gemm.variants.k6.rules import check_inputs
from moe_gemm.variants.k6.walk import unit_list
from moe_gemm.variants.sm90.config import BOX, SMEM_LIMIT
from moe_gemm.variants.sm90.maps import require_sm90a, transposed_b


class K6Persistent(NamedConfigVariant):
    """One rung of chapter 07's ladder: ``K6Persistent("k6/pingpong-cluster-bn192")``, or any
    configuration: ``K6Persistent("k6/mine", K6Config(...))``."""

    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    configs = {**LADDER, **FUSED}
    family = "k6"
    warps_per_block = THREADS // 32
    # bf16 or fp16 operands, a bf16, fp16 or fp32 C: each rung is compiled for the problem's types (typed)
    formats = (BF16_OPERANDS, FP16_OPERANDS)
    out_dtypes = (BF16, FP16, FP32)
    # compute-sanitizer's extra case: the edge cases give most blocks one tile; this one gives every
    # block several, so both ping-pong warpgroups, the hand-over and the staging ring all run.
    # The other types run too: fp16 through the staged TMA store, fp32 through the register stores.
    sanitize_cases = (EdgeCase("several tiles per block", (300,) * 40, K=128, N=392),
                      EdgeCase("several tiles per block, N for SwiGLU", (300,) * 40, K=128, N=384),
                      EdgeCase("ragged, N for SwiGLU", (0, 70, 1, 129, 300), K=64, N=256),
                      EdgeCase("fp16, several tiles per block", (300,) * 40, K=128, N=384, fmt=FP16_OPERANDS,
                               out_dtype=FP16),
                      EdgeCase("bf16 in, fp32 out, ragged", (0, 70, 1, 129, 300), K=64, N=384, out_dtype=FP32),
                      EdgeCase("fp16 in, fp32 out, ragged", (0, 70, 1, 129, 300), K=128, N=392, fmt=FP16_OPERANDS,
                               out_dtype=FP32))

    def __init__(self, name: str, config: K6Config | None = None) -> None:
        super().__init__(name, config)
        self.epilogue = self.config.epilogue  # what the harness's check compares with (measure.check.verify)
        if self.config.epilogue == "swiglu" and (self.config.bn, self.config.cluster_along, self.config.schedule,
                                                 self.config.b_layout) != (128, "n", "device", "kn"):
            raise ValueError(f"{self.name}: the SwiGLU epilogue runs with BN = 128, no cluster or one along N, the "
                             f"device walk and B [E, K, N]")
        if self.config.dynamic_smem_bytes + STATIC_SMEM_ALLOWANCE > SMEM_LIMIT:
            raise ValueError(f"{self.name}: {self.config.dynamic_smem_bytes:,} B of shared memory plus the static "
                             f"part pass the {SMEM_LIMIT:,} B a block may have")

    def typed(self, problem: Problem) -> K6Persistent:
        """This rung instantiated for the problem's operand and output types: the same tiles, ring and walk;
        the wgmma's input type and the epilogue's rounding (or its fp32 register stores) differ."""
        types = (problem.fmt.element, dtype_name(problem.out_dtype))
        if types == (self.config.element, self.config.out):
            return self
        typed = self.__dict__.setdefault("_typed", {})
        if types not in typed:
            typed[types] = K6Persistent(self.name, self.config.replace(element=types[0], out=types[1]))
        return typed[types]

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem, config = dev.problem, self.config
        self.require_inputs(dev)
        if self.typed(problem) is not self:
            return self.typed(problem).prepare(dev)
        b = transposed_b(dev) if config.b_layout == "nk" and problem.tokens else dev.b
        check_inputs(config, problem.experts, problem.K, problem.N, dev.a.ptr, b.ptr, self.name)
        if config.epilogue == "swiglu" and problem.N % (2 * BOX):
            raise ValueError(f"{self.name}: N = {problem.N} must be a multiple of 128 (each fused tile pairs 64 "
                             f"gate columns with the 64 up columns N / 2 further)")
        gpu = require_sm90a(self.name)
        resources = self.resources(gpu.arch)
        output = dev.new_output(config.out_columns(problem.N))
        if problem.tokens == 0:  # nothing to compute; a tensor map cannot even describe 0 rows
            return Prepared(launch=lambda: None, output=output, bm=config.bm, bn=config.bn, resources=resources)
        run, keep, info = self.launcher(dev, b, output, gpu.sm_count)
        return Prepared(launch=run, output=output, bm=config.bm, bn=config.bn, resources=resources,
                        keep_alive=keep, launch_info=info)

    def launcher(self, dev: DeviceProblem, b: DeviceArray, output: DeviceArray, sm_count: int):
        """The launch, what it must keep alive, and what the record notes. (Timed as a CUDA-graph
        replay, it is wrapped in moe_gemm.measure.graph_replay.GraphReplay, as every variant is.)"""
        problem, config = dev.problem, self.config
        kernel = self.compile()
        slots = self.slots(sm_count)
        units_host = unit_list(problem.counts, problem.N, config.unit_rows, config.unit_cols, config.group,
                               config.raster)
        units, units_address, count = None, 0, 0  # the device walk finds its units itself
        if config.schedule == "host":
            units = to_device(units_host if len(units_host) else np.zeros((1, 4), dtype=np.int32))
            units_address, count = units.ptr, len(units_host)
        ends = dev.offsets.ptr + 4  # offsets [E + 1] from 0: the ends are offsets[1:], torch's offs
        run = launch.launcher(kernel, config, slots, dev.a.ptr, b.ptr, output.ptr, ends, problem.tokens,
                              problem.experts, problem.K, problem.N, units_address=units_address, units=count)
        keep: list[Any] = [units, dev, b, output]
        info = {"grid": run.grid, "units": len(units_host), "schedule": config.schedule, "config": config.label}
        return run, keep, info

    def slots(self, sm_count: int) -> int:
        """Blocks (clusters) a persistent launch runs at once: one 384-thread block per SM and, for
        clusters, no more than the driver says can be resident together (asked once per variant)."""
        if getattr(self, "_slots", None) is None:
            self._slots = launch.resident_slots(self.compile(), self.config, sm_count)
        return self._slots


def ladder() -> list[K6Persistent]:
    """Every rung the chapter compiles, tests and times, in ladder order."""
    return [K6Persistent(name) for name in LADDER]


def _auto(schedule: str):
    from moe_gemm.variants.k6.auto import K6Auto

    return K6Auto(schedule)


__all__ = ["SANITIZED", "VARIANTS"]  # what the registry reads (variants/registry.py)
VARIANTS: dict[str, Any] = {name: functools.partial(K6Persistent, name) for name in {**LADDER, **FUSED}}
VARIANTS["k6/auto"] = functools.partial(_auto, "device")
VARIANTS["k6/auto-host"] = functools.partial(_auto, "host")
