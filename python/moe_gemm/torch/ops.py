"""``moe_gemm.torch.grouped_mm``: torch._grouped_mm's 2D x 3D form on our kernel, as a torch op.

    out = grouped_mm(a, b, offs)   # a [M_tot, K] bf16, b [E, K, N] bf16 (either layout), offs int32 [E]

``offs`` holds each expert's cumulative row end, on the GPU, as torch._grouped_mm takes it. The op is
``torch.ops.moe_gemm.grouped_mm``, registered with ``torch.library.custom_op`` and a fake
implementation, so ``torch.compile(fullgraph=True)`` traces through it and a CUDA graph can hold it:
k6 finds its tile walk on the device from ``offs`` (kernels/tile_walk.cuh), so a captured launch is
right for any routing replayed into the same buffers.

Which kernel: k6 with the configuration ``k6/auto`` chose for this shape if it has one on disk
(moe_gemm.variants.k6.auto); else, on an eager call, the op tunes the shape as k6/auto does and keeps
the choice in the same file; inside CUDA-graph capture or torch.compile (where nothing may be timed)
:data:`DEFAULT_CONFIG`, or :data:`FUSED_CONFIG` for the fused SwiGLU GEMM. b given K-major (autograd's
dA) always runs :data:`K_MAJOR_CONFIG`, the K-major rung the GPU validation covers. Inputs k6 cannot take go to
torch._grouped_mm with one warning per reason (moe_gemm.torch.rules says which and why); malformed
ones raise a ValueError before any launch.

Autograd: dA = dC B^T through our kernel (B^T is b read in the other layout: no copy), dB = A^T dC per
expert (a ragged K) through torch._grouped_mm.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from moe_gemm.torch import rules

DEFAULT_CONFIG = "k6/pingpong-bn192"  # the rung closest to k6/auto's choices across chapter 07's shapes
FUSED_CONFIG = "k6/swiglu-bn128"  # the first GEMM of an MoE layer with the SwiGLU epilogue
# b given K-major (B^T: autograd's dA = dC B^T) runs the one K-major rung whose GPU tests and
# compute-sanitizer runs are on record; tuning would launch K-major instances of every candidate,
# which no test checks.
K_MAJOR_CONFIG = "k6/pingpong-cluster-bn192-kmajor"
_warned: set[str] = set()
_check_offsets = [True]


@contextlib.contextmanager
def offsets_unchecked() -> Iterator[None]:
    """Skip reading ``offs`` back to check it (a host sync per call): for timing eager launches. Under
    CUDA-graph capture and torch.compile the op never reads it back anyway."""
    _check_offsets.append(False)
    try:
        yield
    finally:
        _check_offsets.pop()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def operands(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> rules.Operands:
    capability = torch.cuda.get_device_capability(a.device) if a.is_cuda else None
    return rules.Operands(a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_dtype_name(a.dtype),
                          b_shape=tuple(b.shape), b_strides=b.stride(), b_dtype=_dtype_name(b.dtype),
                          offs_shape=tuple(offs.shape), offs_dtype=_dtype_name(offs.dtype),
                          out_dtype=_dtype_name(out_dtype), device=a.device.type, capability=capability,
                          a_address=a.data_ptr(), b_address=b.data_ptr())


def reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Expert by expert in fp32, for tensors torch._grouped_mm does not take (CPU ones)."""
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ b[e].float()).to(out_dtype)
        start = end
    return out


def _fallback(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype,
              reason: str) -> torch.Tensor:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moe_gemm.torch.grouped_mm runs torch._grouped_mm instead: {reason}", stacklevel=4)
    if a.is_cuda:
        return torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)
    return reference(a, b, offs, out_dtype)


def _capturing_or_compiling() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


@functools.cache
def _k6(name: str, layout: str) -> Any:
    """One K6Persistent per configuration and B layout: compile() and slots() keep their answers on it
    (before they did, re-reading the disk cache on every call cost the eager op 1.3-2.4 ms of host
    time, measured on the H200)."""
    from moe_gemm.variants.k6 import K6Persistent
    from moe_gemm.variants.k6.config import FUSED, LADDER

    return K6Persistent(name, FUSED[name] if name in FUSED else LADDER[name].replace(b_layout=layout))


@functools.cache
def _gpu(index: int) -> tuple[str, int]:
    properties = torch.cuda.get_device_properties(index)
    return properties.name, properties.multi_processor_count


def _launcher(variant: Any, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor,
              sm_count: int) -> Callable[[], None]:
    """One launch of ``variant`` on these tensors, on torch's current stream, ready to repeat (k6's one
    launch path, moe_gemm.variants.k6.launch, which the harness's variants take too)."""
    from moe_gemm.variants.k6.launch import launcher

    (tokens, K), (experts, _, N) = a.shape, b.shape  # noqa: N806
    return launcher(variant.compile(), variant.config, variant.slots(sm_count), a.data_ptr(), b.data_ptr(),
                    out.data_ptr(), offs.data_ptr(), tokens, experts, K, N,
                    stream=torch.cuda.current_stream(a.device).cuda_stream)


def _median_ms(run: Callable[[], None], iterations: int) -> float:
    """A candidate's median launch time while tuning: two warm-up launches, then CUDA events around each."""
    from moe_gemm.torch.bench import time_call

    return time_call(run, graph=False, warmup=2, iterations=iterations).median_ms


_chosen: dict[str, str] = {}  # shape key -> configuration, for this process (a cache hit reads no file)


def _choice(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, layout: str, epilogue: str,
            gpu: str, sm_count: int) -> str:
    """k6's configuration for this shape: the one k6/auto's cache file holds for it (chapter 07's tuning
    and this op's share the file and the rule), else, on an eager call, tuned now on these operands as
    k6/auto tunes (every candidate on this routing and on a skewed one, the most robust kept; its
    time is this call's, once per shape and machine), else (inside CUDA-graph capture or
    torch.compile, or with MOE_GEMM_OP_TUNE=0) DEFAULT_CONFIG or FUSED_CONFIG. b K-major: always
    K_MAJOR_CONFIG."""
    from moe_gemm.variants.k6 import auto
    from moe_gemm.variants.k6.config import AUTO_CANDIDATES, FUSED

    if layout == "nk":
        return K_MAJOR_CONFIG
    (tokens, K), (experts, _, N) = a.shape, b.shape  # noqa: N806
    key = auto.shape_key(tokens, experts, K, N, layout, gpu, epilogue)
    if key not in _chosen:
        entry = auto.recall(key)
        if entry is None:
            if _capturing_or_compiling() or os.environ.get("MOE_GEMM_OP_TUNE", "1") == "0":
                return FUSED_CONFIG if epilogue == "swiglu" else DEFAULT_CONFIG
            candidates = tuple(FUSED) if epilogue == "swiglu" else AUTO_CANDIDATES

            def routed(counts: Any) -> torch.Tensor:  # the expert ends: offs, or the skewed routing's
                return offs if counts is None else torch.as_tensor(counts.cumsum(), dtype=torch.int32,
                                                                   device=offs.device)

            entry = auto.tune(key, candidates, experts, tokens, routed=routed,
                              launcher=lambda ends, name: _launcher(_k6(name, layout), a, b, ends, out, sm_count),
                              median_ms=lambda run: _median_ms(run, auto.TUNE_LAUNCHES))
        _chosen[key] = entry["choice"]
    return _chosen[key]


def _launch_k6(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, layout: str,
               epilogue: str = "none") -> None:
    gpu, sm_count = _gpu(a.device.index if a.device.index is not None else torch.cuda.current_device())
    name = _choice(a, b, offs, out, layout, epilogue, gpu, sm_count)
    _launcher(_k6(name, layout), a, b, offs, out, sm_count)()


# --8<-- [start:op]
@torch.library.custom_op("moe_gemm::grouped_mm", mutates_args=())
def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    chosen = rules.route(operands(a, b, offs, out_dtype))
    if chosen.kernel == "torch":
        return _fallback(a, b, offs, out_dtype, chosen.reason)
    if _check_offsets[-1] and not _capturing_or_compiling():
        rules.check_offsets(offs.tolist(), a.shape[0])  # a host sync: skipped inside graphs and compiles
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    if a.shape[0]:  # M_tot = 0: nothing to launch (a tensor map cannot describe 0 rows)
        _launch_k6(a, b, offs, out, chosen.b_layout)
    return out


@_grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    rules.check(operands_meta(a, b, offs, out_dtype))  # the shape rules hold at trace time too
    return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype)
# --8<-- [end:op]


def operands_meta(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> rules.Operands:
    """The rules' view of fake tensors: shapes, strides and dtypes, no addresses or device queries."""
    return rules.Operands(a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_dtype_name(a.dtype),
                          b_shape=tuple(b.shape), b_strides=b.stride(), b_dtype=_dtype_name(b.dtype),
                          offs_shape=tuple(offs.shape), offs_dtype=_dtype_name(offs.dtype),
                          out_dtype=_dtype_name(out_dtype))


# --8<-- [start:autograd]
def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, offs, out_dtype = inputs
    ctx.save_for_backward(a, b, offs)
    ctx.out_dtype = out_dtype


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b, offs = ctx.saved_tensors
    grad = grad.contiguous().to(a.dtype)
    da = db = None
    if ctx.needs_input_grad[0]:  # dA[rows of e] = dC[rows of e] B[e]^T: b read as B^T, the other layout
        da = torch.ops.moe_gemm.grouped_mm(grad, b.transpose(1, 2), offs, a.dtype)
    if ctx.needs_input_grad[1]:  # dB[e] = A[rows of e]^T dC[rows of e]: a ragged K, torch._grouped_mm's 2D x 2D
        if a.is_cuda:
            db = torch._grouped_mm(a.t(), grad, offs=offs, out_dtype=b.dtype)
        else:
            db = torch.stack([a[s:e].float().t() @ grad[s:e].float()
                              for s, e in zip([0, *offs.tolist()[:-1]], offs.tolist())]).to(b.dtype)
    return da, db, None, None


_grouped_mm.register_autograd(_backward, setup_context=_setup_context)
# --8<-- [end:autograd]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C[rows of e] = a[rows of e] @ b[e] for every expert e, rows of e = offs[e-1] .. offs[e] - 1."""
    return torch.ops.moe_gemm.grouped_mm(a, b, offs, out_dtype)


# --8<-- [start:swiglu]
def swiglu_halves(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32 of h = [gate | up] [M, 2I], the product with B = [W_gate | W_up]."""
    gate, up = h.float().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@torch.library.custom_op("moe_gemm::grouped_mm_swiglu", mutates_args=())
def _grouped_mm_swiglu(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    chosen = rules.route(operands(a, b, offs, torch.bfloat16), epilogue="swiglu")
    if chosen.kernel == "torch":
        return swiglu_halves(_fallback(a, b, offs, torch.bfloat16, chosen.reason)).to(torch.bfloat16)
    if _check_offsets[-1] and not _capturing_or_compiling():
        rules.check_offsets(offs.tolist(), a.shape[0])
    out = torch.empty((a.shape[0], b.shape[2] // 2), dtype=torch.bfloat16, device=a.device)
    if a.shape[0]:
        _launch_k6(a, b, offs, out, chosen.b_layout, epilogue="swiglu")
    return out


@_grouped_mm_swiglu.register_fake
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    rules.check(operands_meta(a, b, offs, torch.bfloat16))
    return a.new_empty((a.shape[0], b.shape[2] // 2), dtype=torch.bfloat16)
# --8<-- [end:swiglu]


def grouped_mm_swiglu(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the grouped product a @ b for b = [W_gate | W_up] [E, K, 2I] (the gate
    columns, then the up columns, as a checkpoint stores them): [M_tot, I], in one launch with k6's
    fused epilogue, which pairs each 64 gate columns with the 64 up columns I further. Forward only
    (no autograd)."""
    return torch.ops.moe_gemm.grouped_mm_swiglu(a, b, offs)
