"""k8: the grouped GEMM in fp8 e4m3 with fp32 scales (kernels/k8_fp8.cu), chapter 10.

==============================  =======================================================================
``k8/blockwise-bm128``          1 x 128 scales of A, 128 x 128 of B (DeepSeek-V3's recipe), promoted to
                                fp32 every 128 of K; 128 x 128 tiles, 6 stages
``k8/blockwise-bm256``          the same on 256 x 128 tiles (each B box serves twice the rows), 4 stages
``k8/rowwise-bm128``            a scale per row of A and per expert column of B, applied in the epilogue,
                                the sums promoted (torch._scaled_grouped_mm's ``use_fast_accum=False``)
``k8/rowwise-fast-bm128``       the same, the tensor core accumulating all of K (``use_fast_accum=True``)
``k8/blockwise-bm128-overlap``  blockwise-bm128 with a second scratch accumulator: each k-block promoted
                                while the next one's wgmmas run
``k8/blockwise-bm*-prefetch``   blockwise-bm128 and -bm256 loading each k-block's scales during the one
                                before
``k8/rowwise-bm256``            rowwise-bm128 on 256 x 128 tiles, 4 stages
``k8/rowwise-bm128-overlap``    rowwise-bm128 with the overlapped promotion
==============================  =======================================================================

A ragged-M problem with e4m3 operands (``Problem(fmt=FP8_BLOCKWISE)`` or ``FP8_ROWWISE``): A [M_tot, K] and
the weights as the problem holds them; the variant lays B out as B^T [E, N, K] (FP8 wgmma reads both operands
K-major) and the scales as the kernel's loads read them, once per uploaded problem, as the weight layout step
of chapter 04 does (moe_gemm.torch.quantize writes these layouts directly). Like k6's device walk it reads
only the expert ends on the device, trusts none of them, and can be captured in a CUDA graph once for any
routing. Refused before any launch, with a ValueError naming the rule (:func:`moe_gemm.variants.k8.config.refusals`):
K a multiple of 16, N of 8, 1 to 256 experts, 16-byte-aligned operands, an sm_90a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceArray, DeviceProblem, to_device
from moe_gemm.cuda.launch import PackedArguments, TensorMapArg, launch, prefer_shared_memory
from moe_gemm.cuda.tensormap import TiledMap, batched_matrix_map, matrix_map
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.edge_cases import EdgeCase, edge_cases
from moe_gemm.model.problem import BF16, FP8_BLOCKWISE, FP8_ROWWISE, FP32, Problem, dtype_name
from moe_gemm.model.quantize import padded_rows
from moe_gemm.variants.compiled import NamedConfigVariant
from moe_gemm.variants.k8.config import (
    BK,
    BN,
    KERNEL_FUNCTION,
    LADDER,
    NOT_YET_RUN,
    SOURCE,
    STATIC_SMEM_ALLOWANCE,
    SWIGLU,
    THREADS,
    K8Config,
    refusals,
)
from moe_gemm.variants.sm90.maps import output_map, require_sm90a, transposed_b


# --8<-- [start:layouts]
def kernel_scales(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """The problem's scales as k8 reads them. Blockwise: A's MN-major, [K / 128, M_pad] (a k-block's scales
    of consecutive rows are consecutive floats: a warp's 8 rows are one 32-byte sector), the padding 1; B's
    [E, N / 128, K / 128] (a tile's scales of successive k-blocks are consecutive). Rowwise: as the problem
    holds them, [M_tot] and [E, N]."""
    if problem.fmt.scaling == "rowwise":
        return problem.scale_a, problem.scale_b
    k_blocks = problem.scale_a.shape[1]
    scale_a = np.ones((k_blocks, padded_rows(problem.tokens)), dtype=np.float32)
    scale_a[:, :problem.tokens] = problem.scale_a.T
    return scale_a, np.ascontiguousarray(problem.scale_b.transpose(0, 2, 1))
# --8<-- [end:layouts]


def device_scales(dev: DeviceProblem) -> tuple[DeviceArray, DeviceArray]:
    """:func:`kernel_scales` on the device, made once per uploaded problem."""
    cached = getattr(dev, "_k8_scales", None)
    if cached is None:
        cached = tuple(to_device(s) for s in kernel_scales(dev.problem))
        dev._k8_scales = cached
    return cached


# --8<-- [start:maps]
def tensor_maps(config: K8Config, a_address: int, b_address: int, c_address: int, tokens: int, experts: int,
                K: int, N: int) -> tuple[TiledMap, TiledMap, TiledMap]:
    """A [M_tot, K] e4m3 in boxes of BM rows x 128 of K; B^T [E, N, K] in boxes of 128 columns x 128 of K of
    one expert (both 128-byte rows, swizzled); C [M_tot, N] in 64 x 64 boxes. Every box starts on a multiple
    of 128 bytes along its rows, as TMA requires 16 (the scales, whose boxes would start at any row, are read
    without TMA: kernels/k8_fp8.cu says why). The SwiGLU epilogue's C is the activation [M_tot, N / 2]; in e4m3
    it is stored from registers, and its map (the kernel's slot) describes q in 64-row boxes all the same."""
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=config.bm, box_cols=BK, element="e4m3")
    b_map = batched_matrix_map("B^T", b_address, batch=experts, rows=N, cols=K, box_rows=BN, box_cols=BK,
                               element="e4m3")
    width = N // 2 if config.epilogue == "swiglu" else N
    if config.out == "e4m3":
        c_map = matrix_map("q", c_address, rows=tokens, cols=width, box_rows=64, box_cols=BK, element="e4m3")
    else:
        c_map = output_map(c_address, tokens, width, config.out)
    return a_map, b_map, c_map
# --8<-- [end:maps]


def arguments(config: K8Config, a_address: int, b_address: int, scale_a_address: int, scale_b_address: int,
              c_address: int, ends_address: int, tokens: int, experts: int, K: int, N: int) -> tuple[Any, ...]:
    """The kernel's arguments in K8_PARAMS order (the maps not yet encoded)."""
    return (*tensor_maps(config, a_address, b_address, c_address, tokens, experts, K, N), c_address,
            scale_a_address, scale_b_address, ends_address, np.int32(tokens), np.int32(experts),
            np.int32(config.group), np.int32(K), np.int32(N))


def swiglu_arguments(config: K8Config, a_address: int, b_address: int, scale_a_address: int,
                     scale_b_address: int, c_address: int, ends_address: int, scale_c_address: int, tokens: int,
                     experts: int, K: int, N: int) -> tuple[Any, ...]:
    """``k8_fp8_swiglu``'s arguments: K8_PARAMS with N = 2I and C the activation, then the activation's scales
    [I / 128, M_pad] (written for e4m3 only; 0 for bf16)."""
    return (*arguments(config, a_address, b_address, scale_a_address, scale_b_address, c_address, ends_address,
                       tokens, experts, K, N), scale_c_address)


class K8Fp8(NamedConfigVariant):
    """One rung of chapter 10's kernel: ``K8Fp8("k8/blockwise-bm128")``, or any configuration:
    ``K8Fp8("k8/mine", K8Config(...))``."""

    kernel_function = KERNEL_FUNCTION
    source = SOURCE
    configs = LADDER
    family = "k8"
    static_smem_allowance = STATIC_SMEM_ALLOWANCE
    shape_rules = staticmethod(refusals)  # check_shape's rules
    warps_per_block = THREADS // 32
    out_dtypes = (BF16, FP32)
    # compute-sanitizer's extra cases: several tiles per block (the ring's phases, both warpgroups, the staging
    # ring), a partial last K block and N tile, and fp32 out through the register stores.
    sanitize_cases = (EdgeCase("e4m3: several tiles per block", (300, 0, 77, 1, 130) * 8, K=256, N=392,
                               fmt=FP8_BLOCKWISE),
                      EdgeCase("e4m3: K ends inside a block", (65, 0, 190), K=208, N=136, fmt=FP8_BLOCKWISE),
                      EdgeCase("e4m3 rowwise: several tiles per block", (300, 0, 77, 1, 130) * 8, K=256, N=392,
                               fmt=FP8_ROWWISE),
                      EdgeCase("e4m3: fp32 out", (300, 0, 77, 1) * 6, K=256, N=200, fmt=FP8_BLOCKWISE,
                               out_dtype=FP32))

    def __init__(self, name: str, config: K8Config | None = None) -> None:
        super().__init__(name, config)
        fmt = FP8_BLOCKWISE if self.config.scaling == "blockwise" else FP8_ROWWISE
        self.formats = (fmt,)
        # the forward's routings in this format and the cases of its scales; under compute-sanitizer, the extra
        # cases in this format
        self.edge_cases = tuple(edge_cases("M", fmt))
        self.sanitize_cases = tuple(case for case in self.sanitize_cases if case.fmt == fmt)

    def typed(self, problem: Problem) -> K8Fp8:
        """This rung compiled for the problem's output type."""
        out = dtype_name(problem.out_dtype)
        if out == self.config.out:
            return self
        typed = self.__dict__.setdefault("_typed", {})
        if out not in typed:
            typed[out] = K8Fp8(self.name, self.config.replace(out=out))
        return typed[out]

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        self.require_inputs(dev)
        self.check_shape(problem.experts, problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        if self.typed(problem) is not self:
            return self.typed(problem).prepare(dev)
        gpu = require_sm90a(self.name)
        resources = self.resources(gpu.arch)
        output = dev.new_output()  # C [M_tot, N], poisoned
        if problem.tokens == 0:  # nothing to compute; a tensor map cannot even describe 0 rows
            return Prepared(launch=lambda: None, output=output, bm=self.config.bm, bn=BN, resources=resources)
        kernel = self.compile()
        prefer_shared_memory(kernel)
        b = transposed_b(dev) if dev.b_layout == "kn" else dev.b  # B^T [E, N, K]
        scale_a, scale_b = device_scales(dev)
        ends = dev.offsets.ptr + 4  # offsets [E + 1] from 0: the ends are offsets[1:], torch's offs
        args = arguments(self.config, dev.a.ptr, b.ptr, scale_a.ptr, scale_b.ptr, output.ptr, ends, problem.tokens,
                         problem.experts, problem.K, problem.N)
        packed = PackedArguments(tuple(TensorMapArg(a.encode()) if isinstance(a, TiledMap) else a for a in args))
        grid, smem = gpu.sm_count, self.config.dynamic_smem_bytes  # persistent: one block per SM

        def run() -> None:
            launch(kernel, grid, THREADS, smem, packed)

        info = {"grid": grid, "config": self.config.label}
        return Prepared(launch=run, output=output, bm=self.config.bm, bn=BN, resources=resources,
                        keep_alive=[dev, b, scale_a, scale_b, output, packed], launch_info=info)


def ladder(pending: bool = False) -> list[K8Fp8]:
    """Every rung the chapter checks and times; with ``pending``, also those not yet run on a GPU
    (moe_gemm.variants.k8.config.NOT_YET_RUN), which its compile report shows."""
    return [K8Fp8(name) for name in LADDER if pending or name not in NOT_YET_RUN]


def swiglu_kernels() -> list[K8Fp8]:
    """GEMM 1 with the SwiGLU epilogue, each output (moe_gemm.variants.k8.config.SWIGLU): compiled and reported
    beside the rungs; launched on torch tensors by moe_gemm.torch.scaled.fused_swiglu, not through the harness's
    problems (whose result is C = A B)."""
    return [K8Fp8(name, config) for name, config in SWIGLU.items()]


__all__ = ["SANITIZED", "VARIANTS"]  # what the registry reads (variants/registry.py)
VARIANTS: dict[str, Any] = {name: functools.partial(K8Fp8, name) for name in LADDER}
# compute-sanitizer's rungs: every one that has run (`validation run k8 --admit` adds those not yet run)
SANITIZED = tuple(name for name in LADDER if name not in NOT_YET_RUN)
