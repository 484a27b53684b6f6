"""k7: the weight gradient dB[e] = A_e^T dC_e of the expert GEMM (kernels/k7_weight_grad.cu), chapter 09.

=====================  ===================================================================================
``k7/bn192``           128 x 192 tiles of dB, 5 stages of 64 rows: k6's ping-pong at its widest tile
``k7/bn128``           128 x 128 tiles, 6 stages
``k7/bn192-rings``     k7/bn192 with a staging ring per consumer warpgroup, 4 stages
``k7/bn128-rings``     k7/bn128 likewise, 5 stages
``k7/bn192-boxes``     k7/bn192 with the first version's producer: a TMA copy per 64-column box
``k7/coop-bn256``      128 x 256 tiles, both warpgroups on each (64 rows of K apiece), 3 stages; not yet run
``k7/coop-bn192``      the same at 128 x 192, 4 stages; not yet run
=====================  ===================================================================================

A problem ragged along K (``Problem(ragged="K")``): A [M_tot, K] and dC [M_tot, N] row-major, as the
forward stored them, rows grouped by expert; out dB [E, K, N] in bf16, fp16 or fp32, exact zeros for an
expert with no rows. Like k6 it reads only the expert ends on the device (torch's ``offs``), trusts none of
them, and can be captured in a CUDA graph once for any routing. Refused before any launch, with a
ValueError naming the rule (:func:`moe_gemm.variants.k7.config.refusals`): K a multiple of 64, N of 8,
1 to 256 experts, 16-byte-aligned operands, an sm_90a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceArray, DeviceProblem
from moe_gemm.cuda.launch import PackedArguments, TensorMapArg, launch, prefer_shared_memory
from moe_gemm.cuda.tensormap import TiledMap, matrix_map, panel_map
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.edge_cases import RAGGED_K_EDGE_CASES, EdgeCase
from moe_gemm.model.problem import BF16, BF16_OPERANDS, FP16, FP16_OPERANDS, FP32, Problem, dtype_name
from moe_gemm.variants.compiled import NamedConfigVariant
from moe_gemm.variants.k7.config import (
    KERNEL_FUNCTION,
    LADDER,
    NOT_YET_RUN,
    SOURCE,
    STATIC_SMEM_ALLOWANCE,
    THREADS,
    TILE_K,
    K7Config,
    refusals,
)
from moe_gemm.variants.sm90.config import BK, BOX
from moe_gemm.variants.sm90.maps import output_map, require_sm90a


# --8<-- [start:maps]
def tensor_maps(config: K7Config, a_address: int, dc_address: int, db_address: int, tokens: int, experts: int,
                K: int, N: int) -> tuple[TiledMap, TiledMap, TiledMap]:
    """A [M_tot, K] and dC [M_tot, N] as panel maps, so that one copy brings a stage's 64 rows of a whole
    operand (A: 128 of K, two 64-column panels; dC: BN columns, BN / 64 panels); dC as a plain matrix in
    64 x 64 boxes where N is not a multiple of 64. dB as the matrix [E x K, N] in 64 x 64 boxes (each
    64-row slice of a tile lies in one expert's K rows)."""
    def operand(name: str, address: int, cols: int, panels: int) -> TiledMap:
        # the first version (config.panels False) copies each 64 x 64 box on its own, as does dC where N % 64 != 0
        if config.panels and cols % BOX == 0:
            return panel_map(name, address, rows=tokens, cols=cols, box_rows=BK, box_panels=panels,
                             element=config.element)
        return matrix_map(name, address, rows=tokens, cols=cols, box_rows=BK, box_cols=BOX, element=config.element)

    return (operand("A", a_address, K, TILE_K // BOX), operand("dC", dc_address, N, config.bn // BOX),
            output_map(db_address, experts * K, N, config.out))
# --8<-- [end:maps]


def arguments(config: K7Config, a_address: int, dc_address: int, db_address: int, ends_address: int, tokens: int,
              experts: int, K: int, N: int) -> tuple[Any, ...]:
    """The kernel's arguments in K7_PARAMS order (the maps not yet encoded)."""
    return (*tensor_maps(config, a_address, dc_address, db_address, tokens, experts, K, N), db_address,
            ends_address, np.int32(tokens), np.int32(experts), np.int32(config.group), np.int32(K), np.int32(N))


class K7WeightGrad(NamedConfigVariant):
    """One rung of chapter 09's kernel: ``K7WeightGrad("k7/bn192")``, or any configuration:
    ``K7WeightGrad("k7/mine", K7Config(...))``."""

    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    configs = LADDER
    family = "k7"
    static_smem_allowance = STATIC_SMEM_ALLOWANCE
    shape_rules = staticmethod(refusals)  # check_shape's rules
    warps_per_block = THREADS // 32
    ragged_axes = ("K",)
    formats = (BF16_OPERANDS, FP16_OPERANDS)
    out_dtypes = (BF16, FP16, FP32)
    # compute-sanitizer's extra cases: several tiles per block (both warpgroups, the hand-overs, the staging
    # ring), K ending half-way into a tile, and the other types.
    sanitize_cases = (EdgeCase("dB: several tiles per block", (300, 0, 77, 1, 130) * 8, K=256, N=392, ragged="K"),
                      EdgeCase("dB: K ends half-way into a tile", (65, 0, 190), K=192, N=136, ragged="K"),
                      EdgeCase("dB: fp16 in and out", (64, 3, 129), K=128, N=256, ragged="K", fmt=FP16_OPERANDS,
                               out_dtype=FP16),
                      EdgeCase("dB: fp32 out, several tiles", (300, 0, 77, 1) * 6, K=256, N=200, ragged="K",
                               out_dtype=FP32))
    edge_cases = RAGGED_K_EDGE_CASES

    def __init__(self, name: str, config: K7Config | None = None) -> None:
        super().__init__(name, config)

    def typed(self, problem: Problem) -> K7WeightGrad:
        """This rung compiled for the problem's operand and output types."""
        types = (problem.fmt.element, dtype_name(problem.out_dtype))
        if types == (self.config.element, self.config.out):
            return self
        typed = self.__dict__.setdefault("_typed", {})
        if types not in typed:
            typed[types] = K7WeightGrad(self.name, self.config.replace(element=types[0], out=types[1]))
        return typed[types]

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        self.check_shape(problem.experts, problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        if self.typed(problem) is not self:
            return self.typed(problem).prepare(dev)
        gpu = require_sm90a(self.name)
        resources = self.resources(gpu.arch)
        output = dev.new_output()  # dB [E, K, N], poisoned
        if problem.tokens == 0:  # no rows: dB is exactly zero (a tensor map cannot describe 0 rows)
            return Prepared(launch=functools.partial(zero, output), output=output, bm=TILE_K, bn=self.config.bn,
                            resources=resources)
        kernel = self.compile()
        prefer_shared_memory(kernel)
        ends = dev.offsets.ptr + 4  # offsets [E + 1] from 0: the ends are offsets[1:], torch's offs
        args = arguments(self.config, dev.a.ptr, dev.b.ptr, output.ptr, ends, problem.tokens, problem.experts,
                         problem.K, problem.N)
        packed = PackedArguments(tuple(TensorMapArg(a.encode()) if isinstance(a, TiledMap) else a for a in args))
        grid, smem = gpu.sm_count, self.config.dynamic_smem_bytes  # persistent: one block per SM

        def run() -> None:
            launch(kernel, grid, THREADS, smem, packed)

        info = {"grid": grid, "config": self.config.label}
        return Prepared(launch=run, output=output, bm=TILE_K, bn=self.config.bn, resources=resources,
                        keep_alive=[dev, output, packed], launch_info=info)


def zero(output: DeviceArray) -> None:
    """dB = 0 on the harness stream: the whole answer when there are no rows."""
    if output.dtype.itemsize == 2:
        output.fill_u16(0)
    else:
        output.fill_u32(0)


def ladder(pending: bool = False) -> list[K7WeightGrad]:
    """Every rung the chapter checks and times; with ``pending``, also those not yet run on a GPU
    (moe_gemm.variants.k7.config.NOT_YET_RUN), which its compile report shows."""
    return [K7WeightGrad(name) for name in LADDER if pending or name not in NOT_YET_RUN]


__all__ = ["SANITIZED", "VARIANTS"]  # what the registry reads (variants/registry.py)
VARIANTS: dict[str, Any] = {name: functools.partial(K7WeightGrad, name) for name in LADDER}
# compute-sanitizer's rungs: every one that has run (`validation run k7 --admit` adds those not yet run)
SANITIZED = tuple(name for name in LADDER if name not in NOT_YET_RUN)
