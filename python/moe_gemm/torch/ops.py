"""``moe_gemm.torch.grouped_mm``: torch._grouped_mm's 2D x 3D form on our kernel, as a torch op.

    out = grouped_mm(a, b, offs)   # a [M_tot, K], b [E, K, N] (either layout), offs int32 [E] on a's GPU

``offs`` holds each expert's cumulative row end, on a's device, as torch._grouped_mm takes it; rows
from ``offs[-1]`` to M_tot belong to no expert and are left as torch.empty left them, as torch leaves
them. The op is ``torch.ops.moe_gemm.grouped_mm``, defined with ``torch.library.Library`` (a CUDA, a
CPU and a fake implementation, autograd through ``torch.library.register_autograd``), so
``torch.compile(fullgraph=True)`` traces through it and a CUDA graph can hold it: k6 finds its tile
walk on the device from ``offs`` (kernels/tile_walk.cuh), clamping any ends into [0, M_tot], so a
captured launch is right, and stays inside its tensors, for any routing replayed into the same buffers.

Which kernel: k6 with the configuration ``k6/auto`` chose for this shape (M_tot in buckets:
moe_gemm.variants.k6.auto.rows_bucket) if it has one on disk; else, on an eager call, the op tunes the
shape as k6/auto does and keeps the choice in the same file; inside CUDA-graph capture or
torch.compile (where nothing may be timed) :data:`DEFAULT_CONFIG`, :data:`FUSED_CONFIG` for the fused
SwiGLU GEMM, :data:`K_MAJOR_CONFIG` for b given K-major. Inputs k6 cannot take go to
torch._grouped_mm with one warning per reason (moe_gemm.torch.rules says which and why); malformed
ones raise a ValueError before any launch.

Host time: everything a call's shapes, strides, dtypes, devices and alignment decide is worked out on
the first call with them and kept in one dict (:data:`_plans`); a later call is one lookup, an
allocation and a launch. Reading ``offs`` back to check it is a host sync, so it is opt-in:
``MOE_GEMM_CHECK_OFFS=1`` or :func:`offsets_checked`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from moe_gemm.torch import rules
from moe_gemm.torch.launches import PointerLaunches
from moe_gemm.torch.swiglu import dswiglu

DEFAULT_CONFIG = "k6/pingpong-bn192"  # the rung closest to k6/auto's choices across chapter 07's shapes
FUSED_CONFIG = "k6/swiglu-bn128"  # the first GEMM of an MoE layer with the SwiGLU epilogue
K_MAJOR_CONFIG = "k6/pingpong-cluster-bn192-kmajor"  # b given K-major (autograd's dA = dC B^T), untuned
CHECK_OFFS = "MOE_GEMM_CHECK_OFFS"  # =1: every eager call reads offs back and checks it (a host sync)
_warned: set[str] = set()
# Per thread (and asyncio task): True inside offsets_checked(), False inside offsets_unchecked(), else
# MOE_GEMM_CHECK_OFFS as it was when this module was imported (reading os.environ on every call costs
# more than a microsecond of the call's host time).
_check_offsets = contextvars.ContextVar("moe_gemm_check_offs", default=os.environ.get(CHECK_OFFS) == "1")


@contextlib.contextmanager
def offsets_checked() -> Iterator[None]:
    """Read ``offs`` back on every eager call in this block (this thread only) and raise a ValueError
    unless it is non-decreasing from 0 and ends at or below M_tot: a host sync per call, for debugging
    a router. Under CUDA-graph capture and torch.compile the op never reads it back."""
    token = _check_offsets.set(True)
    try:
        yield
    finally:
        _check_offsets.reset(token)


@contextlib.contextmanager
def offsets_unchecked() -> Iterator[None]:
    """Never read ``offs`` back in this block, even with MOE_GEMM_CHECK_OFFS=1: timing loops
    (torch/variant.py, measure/layer.py) must not time a host sync."""
    token = _check_offsets.set(False)
    try:
        yield
    finally:
        _check_offsets.reset(token)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def operands(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, *,
             meta: bool = False) -> rules.Operands:
    """The rules' view of the tensors: shapes, strides, dtypes and devices, and for real tensors the GPU's
    target and the addresses (``meta``: fake tensors at trace time have neither)."""
    real = {} if meta else {"capability": torch.cuda.get_device_capability(a.device) if a.is_cuda else None,
                            "a_address": a.data_ptr(), "b_address": b.data_ptr()}
    return rules.Operands(a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_dtype_name(a.dtype),
                          b_shape=tuple(b.shape), b_strides=b.stride(), b_dtype=_dtype_name(b.dtype),
                          offs_shape=tuple(offs.shape), offs_dtype=_dtype_name(offs.dtype),
                          out_dtype=_dtype_name(out_dtype), a_device=str(a.device), b_device=str(b.device),
                          offs_device=str(offs.device), **real)


def reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Expert by expert in fp32, for what torch._grouped_mm does not take (on the CPU, an out_dtype other
    than a's); rows past offs[-1] are left as torch.empty left them."""
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ b[e].float()).to(out_dtype)
        start = end
    return out


def _fallback(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype,
              reason: str) -> torch.Tensor:
    """torch._grouped_mm's answer (warned once per reason), or :func:`reference`'s where torch refuses a
    CPU out_dtype other than a's."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moe_gemm.torch.grouped_mm runs torch._grouped_mm instead: {reason}", stacklevel=4)
    if a.is_cuda or out_dtype == a.dtype:
        return torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)
    return reference(a, b, offs, out_dtype)


def _capturing_or_compiling() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


Types = tuple[str, str]  # k6's operand and output types: ("bf16", "bf16"), ("bf16", "fp32"), ("fp16", "fp16"), ...


@functools.cache
def _k6(name: str, layout: str, types: Types) -> Any:
    """One K6Persistent per configuration, B layout and types: compile() keeps its answer on it (re-reading
    the disk cache on every call cost the eager op 1.3-2.4 ms of host time, measured on the H200)."""
    from moe_gemm.variants.k6 import K6Persistent
    from moe_gemm.variants.k6.config import FUSED, LADDER

    config = FUSED[name] if name in FUSED else LADDER[name].replace(b_layout=layout)
    return K6Persistent(name, config.replace(element=types[0], out=types[1]))


@functools.cache
def _gpu(index: int) -> tuple[str, int]:
    properties = torch.cuda.get_device_properties(index)
    return properties.name, properties.multi_processor_count


@functools.cache
def _slots(name: str, layout: str, types: Types, index: int) -> int:
    """Blocks (clusters) a persistent launch of ``name`` runs at once on GPU ``index``, as k6's launch
    path counts them for the harness (moe_gemm.variants.k6.launch.resident_slots)."""
    from moe_gemm.variants.k6.launch import resident_slots

    variant = _k6(name, layout, types)
    with torch.cuda.device(index):  # the occupancy query runs in that GPU's context
        return resident_slots(variant.compile(), variant.config, _gpu(index)[1], device=index)


class _Runner(PointerLaunches):
    """k6 as one configuration on one shape, B layout and GPU, launched on (a, b, out, offs): its packed
    arguments (three encoded tensor maps) built once per pointer set (moe_gemm.torch.launches)."""

    def __init__(self, name: str, layout: str, types: Types, index: int, tokens: int, experts: int, K: int, N: int,
                 b_strides: tuple[int, int]) -> None:
        super().__init__(index)
        variant = _k6(name, layout, types)
        self.kernel, self.config, self.slots = variant.compile(), variant.config, _slots(name, layout, types, index)
        self.shape, self.b_strides = (tokens, experts, K, N), b_strides

    def build(self, pointers: tuple[int, ...], stream: int) -> Callable[[], None]:
        from moe_gemm.variants.k6.launch import launcher

        return launcher(self.kernel, self.config, self.slots, *pointers, *self.shape, stream=stream,
                        b_strides=self.b_strides, device=self.index)


def _launcher(name: str, layout: str, types: Types, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
              out: torch.Tensor) -> Callable[[], None]:
    """One launch of configuration ``name`` on these tensors, on torch's current stream of their GPU,
    ready to repeat (k6's one launch path, moe_gemm.variants.k6.launch, which the harness takes too)."""
    runner = _runner(name, layout, types, a, b)
    return lambda: runner(a, b, out, offs)


def _median_ms(run: Callable[[], None], iterations: int, index: int) -> float:
    """A candidate's median launch time on GPU ``index`` while tuning: two warm-up launches, then CUDA
    events around each, recorded on that GPU's current stream (the one the launches go to)."""
    from moe_gemm.torch.bench import time_call

    with torch.cuda.device(index):
        return time_call(run, graph=False, warmup=2, iterations=iterations).median_ms


_chosen: dict[tuple[str, int], str] = {}  # (shape key, GPU index) -> configuration, for this process


def tune_here(key: str, candidates: Sequence[str], a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
              out: torch.Tensor, layout: str, types: Types, index: int, path: Path | None = None) -> dict[str, Any]:
    """k6/auto's tuning loop (moe_gemm.variants.k6.auto.tune) run by the op on these tensors: every candidate
    launched on offs's routing and on a skewed one of the same shape, timed on GPU ``index``, the entry
    kept under ``key`` in ``path`` (default: the shared cache file)."""
    from moe_gemm.variants.k6 import auto

    def routed(counts: Any) -> torch.Tensor:  # the expert ends: offs, or the skewed routing's
        return offs if counts is None else torch.as_tensor(counts.cumsum(), dtype=torch.int32, device=offs.device)

    return auto.tune(key, candidates, b.shape[0], a.shape[0], routed=routed,
                     launcher=lambda ends, name: _launcher(name, layout, types, a, b, ends, out),
                     median_ms=lambda run: _median_ms(run, auto.TUNE_LAUNCHES, index), path=path)


def _choice(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, layout: str, epilogue: str,
            types: Types, index: int) -> str | None:
    """k6's configuration for this shape on GPU ``index``: the one k6/auto's cache file holds for it
    (chapter 07's tuning and this op's share the file and the rule; two GPUs of one name share an
    entry), else, on an eager call, tuned now on these operands as k6/auto tunes (every candidate on
    this routing and on a skewed one, the most robust kept; its time is this call's, once per M_tot
    bucket and machine), else None: inside CUDA-graph capture or torch.compile, or with
    MOE_GEMM_OP_TUNE=0, nothing is timed (the caller runs its default and asks again next call)."""
    from moe_gemm.variants.k6 import auto
    from moe_gemm.variants.k6.config import AUTO_CANDIDATES, FUSED, KMAJOR_CANDIDATES

    (tokens, K), (experts, _, N) = a.shape, b.shape
    key = auto.shape_key(tokens, experts, K, N, layout, _gpu(index)[0], epilogue, types)
    if (key, index) not in _chosen:
        entry = auto.recall(key)
        if entry is None:
            if _capturing_or_compiling() or os.environ.get("MOE_GEMM_OP_TUNE", "1") == "0":
                return None
            candidates = tuple(FUSED) if epilogue == "swiglu" else KMAJOR_CANDIDATES if layout == "nk" \
                else AUTO_CANDIDATES
            entry = tune_here(key, candidates, a, b, offs, out, layout, types, index)
        _chosen[key, index] = entry["choice"]
    return _chosen[key, index]


def _default(layout: str, epilogue: str) -> str:
    return FUSED_CONFIG if epilogue == "swiglu" else K_MAJOR_CONFIG if layout == "nk" else DEFAULT_CONFIG


class _Plan:
    """What every call with one key (:func:`_key`) runs, worked out on the first: torch's fallback and
    its reason, or k6 in B's layout with the runner of the configuration chosen for the shape."""

    __slots__ = ("reason", "out_shape", "layout", "types", "epilogue", "index", "runner")

    def __init__(self, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype,
                 epilogue: str) -> None:
        chosen = rules.route(operands(a, b, offs, out_dtype), epilogue=epilogue)
        self.reason, self.layout, self.epilogue = chosen.reason, chosen.b_layout, epilogue
        self.types = (chosen.element, chosen.out)
        self.out_shape = (a.shape[0], b.shape[2] // (2 if epilogue == "swiglu" else 1))
        self.index = a.device.index if a.is_cuda else None
        self.runner: _Runner | None = None  # chosen on the first launch (tuning needs the output)

    def launch(self, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> None:
        runner = self.runner
        if runner is None:
            name = _choice(a, b, offs, out, self.layout, self.epilogue, self.types, self.index)
            runner = _runner(name or _default(self.layout, self.epilogue), self.layout, self.types, a, b)
            if name is not None:  # kept once chosen; a default (nothing could be timed) is asked again next call
                self.runner = runner
        runner(a, b, out, offs)


@functools.lru_cache(maxsize=256)
def _runner_of(name: str, layout: str, types: Types, index: int, tokens: int, experts: int, K: int, N: int,
               b_strides: tuple[int, int]) -> _Runner:
    return _Runner(name, layout, types, index, tokens, experts, K, N, b_strides)


def _runner(name: str, layout: str, types: Types, a: torch.Tensor, b: torch.Tensor) -> _Runner:
    from moe_gemm.variants.k6.rules import b_strides_of

    return _runner_of(name, layout, types, a.device.index, a.shape[0], b.shape[0], a.shape[1], b.shape[2],
                      b_strides_of(b.shape, b.stride()))


_plans: dict[tuple, _Plan] = {}  # every key seen in this process -> its plan


def _key(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, epilogue: str) -> tuple:
    """Everything the rules and the configuration depend on: shapes, strides, dtypes, devices, and
    whether both operands start on 16-byte boundaries (TMA's alignment; the addresses themselves vary)."""
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, out_dtype, offs.shape, offs.dtype,
            a.device, b.device, offs.device, (a.data_ptr() | b.data_ptr()) % 16 == 0, epilogue)


def _run(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, epilogue: str) -> torch.Tensor:
    """The op's eager path: the plan for this key, then torch's fallback or one k6 launch."""
    offs = offs.contiguous()  # the kernel reads offs[e] at offs + 4e
    key = _key(a, b, offs, out_dtype, epilogue)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _Plan(a, b, offs, out_dtype, epilogue)  # a ValueError leaves nothing behind
    if plan.reason is not None:
        out = _fallback(a, b, offs, out_dtype, plan.reason)
        return swiglu_halves(out).to(out_dtype) if epilogue == "swiglu" else out
    if _check_offsets.get() and not _capturing_or_compiling():
        rules.check_offsets(offs.tolist(), a.shape[0])  # a host sync: opt-in, never inside graphs and compiles
    out = torch.empty(plan.out_shape, dtype=out_dtype, device=a.device)
    if a.shape[0]:  # M_tot = 0: nothing to launch (a tensor map cannot describe 0 rows)
        plan.launch(a, b, offs, out)
    return out


def _fake(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None,
          epilogue: str) -> torch.Tensor:
    out_dtype = a.dtype if out_dtype is None else out_dtype
    rules.check(operands(a, b, offs, out_dtype, meta=True))  # the shape rules hold at trace time too
    return a.new_empty((a.shape[0], b.shape[2] // (2 if epilogue == "swiglu" else 1)), dtype=out_dtype)


# --8<-- [start:op]
_library = torch.library.Library("moe_gemm", "FRAGMENT")  # torch.library.Library: ~2 us less dispatch than custom_op
_library.define("grouped_mm(Tensor a, Tensor b, Tensor offs, ScalarType? out_dtype=None) -> Tensor")


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return _run(a, b, offs, a.dtype if out_dtype is None else out_dtype, "none")


_library.impl("grouped_mm", _grouped_mm, "CUDA")
_library.impl("grouped_mm", _grouped_mm, "CPU")  # the fallback: the rules send CPU tensors to torch
torch.library.register_fake("moe_gemm::grouped_mm",
                            lambda a, b, offs, out_dtype=None: _fake(a, b, offs, out_dtype, "none"), lib=_library)
# --8<-- [end:op]


# --8<-- [start:autograd]
def _weight_grad(a: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dB[e] = A[rows of e]^T dC[rows of e]: a ragged K, k7's (chapter 09; moe_gemm.torch.weight_gradient, which
    runs torch._grouped_mm's 2D x 2D form for what k7 cannot take). Rows past offs[-1] count for no expert."""
    from moe_gemm.torch.weight_gradient import weight_grad

    return weight_grad(a, grad.to(a.dtype), offs, dtype)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, offs, *_ = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b, offs = ctx.saved_tensors
    grad = grad.contiguous().to(a.dtype)
    da = db = None
    if ctx.needs_input_grad[0]:  # dA[rows of e] = dC[rows of e] B[e]^T: b read as B^T, the other layout
        da = grouped_mm(grad, b.transpose(1, 2), offs, a.dtype)
    if ctx.needs_input_grad[1]:
        db = _weight_grad(a, grad, offs, b.dtype)
    return da, db, None, None


torch.library.register_autograd("moe_gemm::grouped_mm", _backward, setup_context=_setup_context, lib=_library)
# --8<-- [end:autograd]

_grouped_mm_op = torch.ops.moe_gemm.grouped_mm.default  # the overload itself: no overload lookup per call


def _dispatch_adds_nothing(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether calling the CUDA implementation directly does what torch's dispatcher would: plain CUDA
    tensors, no autograd graph to record, no torch.compile trace, no dispatch or function mode, no
    functorch transform (vmap, grad). The dispatcher costs ~12 us of host time per call, these checks
    under 1 us (measured on a CPU core here; the op's eager target is ~30 us a call)."""
    return (not torch.compiler.is_compiling() and type(a) is torch.Tensor and type(b) is torch.Tensor and a.is_cuda
            and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
            and not torch._C._len_torch_dispatch_stack() and not torch._C._is_torch_function_mode_enabled()
            and not torch._C._are_functorch_transforms_active())


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """C[rows of e] = a[rows of e] @ b[e] for every expert e, rows of e = offs[e-1] .. offs[e] - 1;
    torch._grouped_mm's 2D x 3D form and keywords (no ``bias``). ``out_dtype=None``: a's dtype."""
    if offs is None:  # torch._grouped_mm raises a RuntimeError here: the 2D x 3D form needs the row ends
        raise ValueError("grouped_mm: a 2-D a and a 3-D b need offs, the int32 cumulative row end of each expert")
    rules.check_tensors("grouped_mm", torch.Tensor, a=a, b=b, offs=offs)
    if _dispatch_adds_nothing(a, b):
        return _run(a, b, offs, a.dtype if out_dtype is None else out_dtype, "none")
    return _grouped_mm_op(a, b, offs, out_dtype)


# --8<-- [start:swiglu]
def swiglu_halves(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32 of h = [gate | up] [M, 2I], the product with B = [W_gate | W_up]."""
    gate, up = h.float().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


_library.define("grouped_mm_swiglu(Tensor a, Tensor b, Tensor offs) -> Tensor")


def _grouped_mm_swiglu(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return _run(a, b, offs, a.dtype, "swiglu")


_library.impl("grouped_mm_swiglu", _grouped_mm_swiglu, "CUDA")
_library.impl("grouped_mm_swiglu", _grouped_mm_swiglu, "CPU")
torch.library.register_fake("moe_gemm::grouped_mm_swiglu",
                            lambda a, b, offs: _fake(a, b, offs, a.dtype, "swiglu"), lib=_library)


def _swiglu_backward(ctx: Any, dact: torch.Tensor) -> tuple[Any, ...]:
    """Through the unfused formulas: h = a @ b recomputed with the plain op (the fused kernel never wrote
    it), SwiGLU's backward from it (moe_gemm.torch.swiglu.dswiglu), then dA and dB as the plain op's
    backward takes them from dh. (MoELayer trains through moe_gemm.torch.experts instead, which saves h.)"""
    a, b, offs = ctx.saved_tensors
    dh, _ = dswiglu(dact.contiguous().to(a.dtype), grouped_mm(a, b, offs, a.dtype))
    da = grouped_mm(dh, b.transpose(1, 2), offs, a.dtype) if ctx.needs_input_grad[0] else None
    db = _weight_grad(a, dh, offs, b.dtype) if ctx.needs_input_grad[1] else None
    return da, db, None


torch.library.register_autograd("moe_gemm::grouped_mm_swiglu", _swiglu_backward, setup_context=_setup_context,
                                lib=_library)
# --8<-- [end:swiglu]

_grouped_mm_swiglu_op = torch.ops.moe_gemm.grouped_mm_swiglu.default


def grouped_mm_swiglu(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the grouped product a @ b for b = [W_gate | W_up] [E, K, 2I] (the gate
    columns, then the up columns, as a checkpoint stores them): [M_tot, I] in a's dtype, for bf16 and fp16 in one
    launch with k6's fused epilogue, which pairs each 64 gate columns with the 64 up columns I further. Autograd
    recomputes a @ b and differentiates the unfused formulas."""
    rules.check_tensors("grouped_mm_swiglu", torch.Tensor, a=a, b=b, offs=offs)
    if _dispatch_adds_nothing(a, b):
        return _run(a, b, offs, a.dtype, "swiglu")
    return _grouped_mm_swiglu_op(a, b, offs)
