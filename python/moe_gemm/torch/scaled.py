"""``moe_gemm.torch.scaled_grouped_mm``: the FP8 grouped GEMM on k8 (chapter 10), as a torch op.

    out = scaled_grouped_mm(a, b, scale_a, scale_b, offs)   # [M_tot, N] bf16 (out_dtype: bf16 or fp32)

``a`` [M_tot, K] and ``b`` [E, K, N] are float8_e4m3fn, ``b`` the [E, K, N] view of a contiguous [E, N, K]
(``b_t.transpose(1, 2)``: FP8 wgmma reads B K-major, as torch._scaled_grouped_mm takes it too), ``offs`` the
int32 cumulative row ends on a's GPU. The scales' ranks say the scaling:

* **rowwise**, torch._scaled_grouped_mm's sm_90 form and arguments: ``scale_a`` [M_tot], ``scale_b`` [E, N];
  ``use_fast_accum=False`` promotes the tensor core's sums into fp32 every 128 of K, True lets it accumulate
  all of K (faster, less precise: chapter 10 measures both);
* **blockwise**, the DeepSeek-V3 recipe, in the layouts moe_gemm.torch.quantize writes: ``scale_a``
  [ceil(K / 128), M_pad] (1 x 128 groups, MN-major, M_pad = M_tot rounded up to 4) and ``scale_b``
  [E, ceil(N / 128), ceil(K / 128)] (128 x 128 blocks); always promoted.

The op is ``torch.ops.moe_gemm.scaled_grouped_mm`` with a fake implementation, so torch.compile traces through
it, and a CUDA graph can hold it: k8 reads ``offs`` on the device and clamps every end into [0, M_tot]. Inputs
k8 cannot take (moe_gemm.torch.rules.route_scaled) go to torch, with one warning per reason: rowwise to
torch._scaled_grouped_mm where it runs, else (blockwise, or on the CPU) to the product of the dequantized
values in fp32, expert by expert, which reads ``offs`` on the host. Malformed inputs raise a ValueError before
any launch.

``swiglu_scaled_grouped_mm(a, b, scale_a, scale_b, offs)`` is the FP8 layer's GEMM 1 with its SwiGLU: ``b`` =
[W_gate | W_up], blockwise, and what comes back is the activation silu(gate) x up quantized for GEMM 2 (or in bf16
with ``quantize=False``), computed by the GEMM's epilogue from its fp32 sums.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from moe_gemm.model.quantize import BLOCK, padded_rows
from moe_gemm.torch import rules
from moe_gemm.torch.launches import TensorMapLaunches
from moe_gemm.torch.quantize import swiglu_quantize_1x128
from moe_gemm.torch.swiglu import swiglu

# The blockwise rung the op launches, by the routed rows per expert. In chapter 10's H200 run the 256-row tile is
# the faster at every cell averaging 256 rows or more per expert (the grid's 16,384 and 65,536 rows at E = 64, the
# Mixtral-like projections: up to 1.2x), the 128-row one at 64 per expert (the grid's 4,096 rows), where half-empty
# 256-row tiles waste more than the larger tile saves; between the two nothing was measured, and the 128-row rung
# stays.
BLOCKWISE_CONFIGS = {128: "k8/blockwise-bm128", 256: "k8/blockwise-bm256"}
TALL_TILE_ROWS_PER_EXPERT = 256
ROWWISE_CONFIG, ROWWISE_FAST_CONFIG = "k8/rowwise-bm128", "k8/rowwise-fast-bm128"
SWIGLU_CONFIGS = {True: "k8/swiglu-e4m3-bm128", False: "k8/swiglu-bm128"}  # by quantize
_warned: set[str] = set()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def operands(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
             out_dtype: torch.dtype, *, meta: bool = False) -> rules.ScaledOperands:
    tensors = (a, b, scale_a, scale_b)
    real = {} if meta else {"capability": torch.cuda.get_device_capability(a.device) if a.is_cuda else None,
                            "addresses": tuple(t.data_ptr() for t in tensors)}
    return rules.ScaledOperands(
        a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_name(a.dtype), b_shape=tuple(b.shape),
        b_strides=b.stride(), b_dtype=_name(b.dtype), scale_a_shape=tuple(scale_a.shape),
        scale_a_strides=scale_a.stride(), scale_a_dtype=_name(scale_a.dtype), scale_b_shape=tuple(scale_b.shape),
        scale_b_strides=scale_b.stride(), scale_b_dtype=_name(scale_b.dtype), offs_shape=tuple(offs.shape),
        offs_dtype=_name(offs.dtype), out_dtype=_name(out_dtype),
        devices=tuple(str(t.device) for t in (*tensors, offs)), **real)


def dequantized(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The real values the product multiplies, in fp32: a [M_tot, K] and b [E, K, N] times their scales."""
    K, N = b.shape[1:]
    if scale_a.dim() == 1:  # rowwise
        return a.float() * scale_a[:, None], b.float() * scale_b[:, None, :]
    blocks = scale_b.transpose(1, 2).repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)[:, :K, :N]
    return dequantized_rows(a, scale_a), b.float() * blocks


def dequantized_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rows quantized in 1 x 128 groups, q [M, K] e4m3 with their MN-major scales [ceil(K / 128), M_pad], in
    fp32: a blockwise ``a``, or the activation swiglu_scaled_grouped_mm returns."""
    return q.float() * scale[:, :q.shape[0]].t().repeat_interleave(BLOCK, dim=1)[:, :q.shape[1]]


def reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """The dequantized product in fp32, expert by expert (offs read on the host); rows past offs[-1] are left as
    torch.empty left them."""
    a_real, b_real = dequantized(a, b, scale_a, scale_b)
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (a_real[start:end] @ b_real[e]).to(out_dtype)
        start = end
    return out


def _warn_once(reason: str, op: str = "scaled_grouped_mm") -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moe_gemm.torch.{op} runs torch instead: {reason}", stacklevel=4)


def _fallback(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
              out_dtype: torch.dtype, use_fast_accum: bool, reason: str) -> torch.Tensor:
    _warn_once(reason)
    if scale_a.dim() == 1 and a.is_cuda and out_dtype == torch.bfloat16 and hasattr(torch, "_scaled_grouped_mm"):
        try:
            return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=out_dtype,
                                            use_fast_accum=use_fast_accum)
        except RuntimeError:  # torch's own rules refuse it too (layout, alignment, GPU): the reference answers
            pass
    return reference(a, b, scale_a, scale_b, offs, out_dtype)


@functools.cache
def _k8(config: str, out: str) -> Any:
    """One K8Fp8 per configuration and output type: compile() keeps its answer on it."""
    from moe_gemm.variants.k8 import K8Fp8
    from moe_gemm.variants.k8.config import LADDER, SWIGLU

    return K8Fp8(config, {**LADDER, **SWIGLU}[config].replace(out=out))


def blockwise_config(tokens: int, experts: int) -> str:
    """The blockwise rung for ``tokens`` routed rows over ``experts`` (BLOCKWISE_CONFIGS): known on the host, from
    the operands' shapes, with no look at ``offs``."""
    return BLOCKWISE_CONFIGS[256 if tokens >= TALL_TILE_ROWS_PER_EXPERT * experts else 128]


@functools.lru_cache(maxsize=256)
def _runner(config: str, out: str, index: int, tokens: int, experts: int, K: int, N: int) -> TensorMapLaunches:
    """k8 on one shape, configuration and GPU, launched on (a, b, scale_a, scale_b, out, offs): four tensor maps
    per pointer set."""
    from moe_gemm.variants.k8 import arguments
    from moe_gemm.variants.k8.config import THREADS

    return TensorMapLaunches(_k8(config, out), arguments, THREADS, index, (tokens, experts, K, N))


def _scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       offs: torch.Tensor, out_dtype: torch.dtype | None = None,
                       use_fast_accum: bool = False) -> torch.Tensor:
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    offs = offs.contiguous()  # the kernel reads offs[e] at offs + 4e
    op = operands(a, b, scale_a, scale_b, offs, out_dtype)
    route = rules.route_scaled(op)
    if route.reason is not None:
        return _fallback(a, b, scale_a, scale_b, offs, out_dtype, use_fast_accum, route.reason)
    (tokens, K), (experts, _, N) = a.shape, b.shape
    out = torch.empty((tokens, N), dtype=out_dtype, device=a.device)
    if tokens == 0:
        return out
    config = (blockwise_config(tokens, experts) if op.scaling == "blockwise" else ROWWISE_FAST_CONFIG
              if use_fast_accum else ROWWISE_CONFIG)
    _runner(config, route.out, a.device.index, tokens, experts, K, N)(a, b, scale_a, scale_b, out, offs)
    return out


# --8<-- [start:op]
_library = torch.library.Library("moe_gemm", "FRAGMENT")
_library.define("scaled_grouped_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, "
                "ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor")


def _fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
          out_dtype: torch.dtype | None = None, use_fast_accum: bool = False) -> torch.Tensor:
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    rules.check_scaled(operands(a, b, scale_a, scale_b, offs, out_dtype, meta=True))
    return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype)


for _device in ("CUDA", "CPU"):  # the CPU's: the rules send it to the reference
    _library.impl("scaled_grouped_mm", _scaled_grouped_mm, _device)
torch.library.register_fake("moe_gemm::scaled_grouped_mm", _fake, lib=_library)
# --8<-- [end:op]


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offs: torch.Tensor, out_dtype: torch.dtype | None = None,
                      use_fast_accum: bool = False) -> torch.Tensor:
    """C [M_tot, N] = the product of the dequantized e4m3 operands, expert by expert (module docstring), in
    ``out_dtype`` (None: bf16; or fp32)."""
    rules.check_tensors("scaled_grouped_mm", torch.Tensor, a=a, b=b, scale_a=scale_a, scale_b=scale_b, offs=offs)
    return torch.ops.moe_gemm.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype, use_fast_accum)


@functools.lru_cache(maxsize=256)
def _swiglu_runner(config: str, index: int, tokens: int, experts: int, K: int, N: int) -> TensorMapLaunches:
    """k8's SwiGLU kernel on one shape, configuration and GPU, launched on (a, b, scale_a, scale_b, act, offs,
    act's scales or None)."""
    from moe_gemm.variants.k8 import swiglu_arguments
    from moe_gemm.variants.k8.config import SWIGLU, THREADS

    return TensorMapLaunches(_k8(config, SWIGLU[config].out), swiglu_arguments, THREADS, index,
                             (tokens, experts, K, N))


def swiglu_has_run() -> bool:
    """Whether k8's SwiGLU kernels have passed their GPU tests (moe_gemm.torch.kernels.NOT_YET_RUN)."""
    from moe_gemm.torch.kernels import FP8_SWIGLU_PENDING, NOT_YET_RUN

    return FP8_SWIGLU_PENDING not in NOT_YET_RUN


def swiglu_refusal(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   offs: torch.Tensor) -> str | None:
    """Why k8's SwiGLU kernel cannot take these operands, or None; a ValueError for malformed ones."""
    return rules.route_swiglu(operands(a, b, scale_a, scale_b, offs, torch.bfloat16)).reason


def fused_swiglu(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
                 quantize: bool = True, config: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """The one launch of k8's SwiGLU kernel, for operands it takes (swiglu_refusal is None): the op calls it once
    the kernel has run; its GPU tests and chapter 10 call it directly. ``config``: a configuration of
    moe_gemm.variants.k8.config.SWIGLU writing what ``quantize`` asks for (default: the op's, SWIGLU_CONFIGS)."""
    if config is None:  # the op's call: its configuration writes what quantize asks for
        config = SWIGLU_CONFIGS[quantize]
    else:
        from moe_gemm.variants.k8.config import SWIGLU

        if config not in SWIGLU or (SWIGLU[config].out == "e4m3") != quantize:
            outputs = [name for name, c in SWIGLU.items() if (c.out == "e4m3") == quantize]
            raise ValueError(f"fused_swiglu(quantize={quantize}) runs one of {', '.join(outputs)}, got {config!r}")
    tokens, (experts, K, N) = a.shape[0], b.shape
    act = torch.empty((tokens, N // 2), dtype=torch.float8_e4m3fn if quantize else torch.bfloat16, device=a.device)
    scale = (torch.ones((N // 2 // BLOCK, padded_rows(tokens)), dtype=torch.float32, device=a.device) if quantize
             else None)
    if tokens:  # a tensor map cannot describe 0 rows
        _swiglu_runner(config, a.device.index, tokens, experts, K, N)(
            a, b, scale_a, scale_b, act, offs.contiguous(), scale)
    return (act, scale) if quantize else act


# --8<-- [start:swiglu]
def swiglu_scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                             offs: torch.Tensor, *, quantize: bool = True
                             ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """GEMM 1 of the FP8 MoE layer and its SwiGLU: h = [gate | up], the blockwise product of ``a`` [M_tot, K]
    and ``b`` = [W_gate | W_up] [E, K, 2I] (as :func:`scaled_grouped_mm` takes them), then act = silu(gate) x up.
    ``quantize=True`` returns act quantized for GEMM 2 as moe_gemm.torch.quantize.swiglu_quantize_1x128 does,
    (q [M_tot, I] e4m3, scale [I / 128, M_pad] fp32); False returns act [M_tot, I] in bf16.

    On k8's SwiGLU kernel (kernels/k8_fp8.cu) the epilogue computes act from the fp32 accumulators: h is never
    written, nor, quantizing, act in bf16. Where that kernel cannot take the operands (swiglu_refusal: one
    warning per reason) or has not yet passed its GPU tests (silently: the project's state, not the caller's
    input), h is computed in bf16 and the separate pass follows. Rows past offs[-1] are left as torch.empty left
    them."""
    rules.check_tensors("swiglu_scaled_grouped_mm", torch.Tensor, a=a, b=b, scale_a=scale_a, scale_b=scale_b,
                        offs=offs)
    reason = swiglu_refusal(a, b, scale_a, scale_b, offs)
    if reason is None and swiglu_has_run():
        return fused_swiglu(a, b, scale_a, scale_b, offs, quantize)
    if reason is not None:
        _warn_once(reason, "swiglu_scaled_grouped_mm")
    h = _scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    return swiglu_quantize_1x128(h) if quantize else swiglu(h)
# --8<-- [end:swiglu]
