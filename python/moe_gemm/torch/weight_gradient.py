"""``moe_gemm.torch.weight_grad``: the weight gradient of the grouped GEMM on k7, as a torch op.

    db = weight_grad(a, dc, offs)                          # dB [E, K, N] = a[rows of e]^T dc[rows of e]
    weight_grad(a, dc, offs, out=main_grad, accumulate=True)   # main_grad [E, K, N] fp32 += the same

``a`` [M_tot, K] and ``dc`` [M_tot, N] are the forward's input and its output's gradient, row-major, rows
grouped by expert as ``offs`` (int32 [E], the cumulative row ends, on a's GPU) says; rows past ``offs[-1]``
count for no expert. An expert with no rows gets exact zeros (accumulating: its dB is left as it was).
This is what :func:`moe_gemm.torch.grouped_mm`'s backward runs for b's gradient, and, with
``accumulate=True``, Megatron-style gradient accumulation across micro-batches into an fp32 buffer (one
reduction per element in L2: ``red.add.f32``, which flushes subnormal sums to zero).

The ops are ``torch.ops.moe_gemm.weight_grad`` and ``torch.ops.moe_gemm.weight_grad_accumulate_``, with
fake implementations, so torch.compile traces the backward through them and a CUDA graph can hold them (k7
reads ``offs`` on the device and clamps every end into [0, M_tot]). Inputs k7 cannot take (rules in
moe_gemm.torch.rules.route_weight_grad) run torch._grouped_mm's 2D x 2D form, with one warning per reason;
malformed ones raise a ValueError before any launch.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from moe_gemm.torch import rules
from moe_gemm.torch.launches import TensorMapLaunches

# The fastest of k7's rungs at every cell of chapter 09's grid in its first version (H200); in the second
# version's H100 run, k7/bn128 leads it by up to 8% at 2,048 rows and skews up to 0.8, is level or behind elsewhere
CONFIG = "k7/bn192"
_warned: set[str] = set()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def operands(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype, accumulate: bool, *,
             meta: bool = False) -> rules.GradOperands:
    real = {} if meta else {"capability": torch.cuda.get_device_capability(a.device) if a.is_cuda else None,
                            "a_address": a.data_ptr(), "dc_address": dc.data_ptr()}
    return rules.GradOperands(a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_name(a.dtype),
                              dc_shape=tuple(dc.shape), dc_strides=dc.stride(), dc_dtype=_name(dc.dtype),
                              offs_shape=tuple(offs.shape), offs_dtype=_name(offs.dtype), out_dtype=_name(out_dtype),
                              a_device=str(a.device), dc_device=str(dc.device), offs_device=str(offs.device),
                              accumulate=accumulate, **real)


def _torch_weight_grad(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype,
                       reason: str) -> torch.Tensor:
    """torch._grouped_mm's 2D x 2D form (what autograd runs for torch._grouped_mm), warned once per reason.
    Its out_dtype must be a's (on the GPU as on the CPU), so another output type (fp32, the accumulate mode's)
    takes fp32 operands: torch's fp32 form (a loop over experts that reads offs on the host)."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moe_gemm.torch.weight_grad runs torch._grouped_mm instead: {reason}", stacklevel=4)
    if out_dtype == a.dtype:
        return torch._grouped_mm(a.t(), dc, offs=offs)
    return torch._grouped_mm(a.t().float(), dc.float(), offs=offs).to(out_dtype)


@functools.cache
def _k7(types: tuple[str, str], accumulate: bool) -> Any:
    """One K7WeightGrad per types and mode: compile() keeps its answer on it."""
    from moe_gemm.variants.k7 import K7WeightGrad
    from moe_gemm.variants.k7.config import LADDER

    return K7WeightGrad(CONFIG, LADDER[CONFIG].replace(element=types[0], out=types[1], accumulate=accumulate))


@functools.lru_cache(maxsize=256)
def _runner(types: tuple[str, str], accumulate: bool, index: int, tokens: int, experts: int, K: int,
            N: int) -> TensorMapLaunches:
    """k7 on one shape, types and GPU, launched on (a, dc, out, offs): three tensor maps per pointer set."""
    from moe_gemm.variants.k7 import arguments
    from moe_gemm.variants.k7.config import THREADS

    return TensorMapLaunches(_k7(types, accumulate), arguments, THREADS, index, (tokens, experts, K, N))


def _run(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype,
         accumulate: bool) -> torch.Tensor:
    offs = offs.contiguous()  # the kernel reads offs[e] at offs + 4e
    route = rules.route_weight_grad(operands(a, dc, offs, out_dtype, accumulate))
    experts, (tokens, K), N = offs.shape[0], a.shape, dc.shape[1]
    if route.reason is not None:
        db = _torch_weight_grad(a, dc, offs, torch.float32 if accumulate else out_dtype, route.reason)
        if accumulate:
            return out.add_(db)
        return db
    if out is None:
        out = torch.empty((experts, K, N), dtype=out_dtype, device=a.device)
    if tokens == 0:  # no rows: a tensor map cannot describe them, and every expert's gradient is zero
        return out if accumulate else out.zero_()
    _runner((route.element, route.out), accumulate, a.device.index, tokens, experts, K, N)(a, dc, out, offs)
    return out


# --8<-- [start:op]
_library = torch.library.Library("moe_gemm", "FRAGMENT")
_library.define("weight_grad(Tensor a, Tensor dc, Tensor offs, ScalarType? out_dtype=None) -> Tensor")
_library.define("weight_grad_accumulate_(Tensor a, Tensor dc, Tensor offs, Tensor(a!) out) -> ()")


def _weight_grad(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return _run(a, dc, offs, None, a.dtype if out_dtype is None else out_dtype, False)


def _weight_grad_accumulate(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> None:
    _check_out(a, dc, offs, out)
    _run(a, dc, offs, out, torch.float32, True)


def _check_out(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> None:
    want = (offs.shape[0], a.shape[-1], dc.shape[-1])
    if out.dtype != torch.float32 or tuple(out.shape) != want or not out.is_contiguous() or out.device != a.device:
        raise ValueError(f"weight_grad: accumulate=True needs out as a contiguous float32 [E, K, N] = {list(want)} "
                         f"on {a.device}, got {out.dtype} {list(out.shape)} on {out.device}"
                         f"{'' if out.is_contiguous() else ', not contiguous'}")


def _fake(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None = None):
    out_dtype = a.dtype if out_dtype is None else out_dtype
    rules.check_weight_grad(operands(a, dc, offs, out_dtype, False, meta=True))
    return a.new_empty((offs.shape[0], a.shape[1], dc.shape[1]), dtype=out_dtype)


def _fake_accumulate(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> None:
    rules.check_weight_grad(operands(a, dc, offs, out.dtype, True, meta=True))


for _device in ("CUDA", "CPU"):  # the CPU's: the rules send it to torch
    _library.impl("weight_grad", _weight_grad, _device)
    _library.impl("weight_grad_accumulate_", _weight_grad_accumulate, _device)
torch.library.register_fake("moe_gemm::weight_grad", _fake, lib=_library)
torch.library.register_fake("moe_gemm::weight_grad_accumulate_", _fake_accumulate, lib=_library)
# --8<-- [end:op]


def weight_grad(a: torch.Tensor, dc: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None = None, *,
                out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """dB[e] = a[rows of e]^T dc[rows of e] for every expert e, rows of e = offs[e-1] .. offs[e] - 1, as a new
    [E, K, N] tensor in ``out_dtype`` (None: a's dtype); with ``accumulate=True``, added into ``out`` (a
    contiguous fp32 [E, K, N]), which is returned."""
    rules.check_tensors("weight_grad", torch.Tensor, a=a, dc=dc, offs=offs, **({} if out is None else {"out": out}))
    if accumulate:
        if out is None:
            raise ValueError("weight_grad: accumulate=True adds into out: pass out, a float32 [E, K, N] tensor")
        if out_dtype not in (None, torch.float32):
            raise ValueError(f"weight_grad: accumulate=True adds into a float32 out, got out_dtype={out_dtype}")
        torch.ops.moe_gemm.weight_grad_accumulate_(a, dc, offs, out)
        return out
    if out is not None:
        raise ValueError("weight_grad: out is for accumulate=True; without it the gradient is a new tensor")
    return torch.ops.moe_gemm.weight_grad(a, dc, offs, out_dtype)
