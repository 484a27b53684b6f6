"""``grouped_mm_dswiglu``: the SwiGLU's backward fused into the dA GEMM that precedes it in an MoE layer's
backward pass, as a torch op.

    dh, act = grouped_mm_dswiglu(dy, w_down, offs, preact)

``dy`` [M_tot, H] is the gradient of the experts' output (rows in expert order, ``offs`` the int32 cumulative
row ends), ``w_down`` [E, I, H] GEMM 2's weights as stored, ``preact`` = [gate | up] [M_tot, 2I] the SwiGLU's
input that the forward saved. With dact = dy[rows of e] w_down[e]^T, it returns dh = [dact up silu'(gate) |
dact silu(gate)] [M_tot, 2I] and act = silu(gate) up [M_tot, I] (what dW_down reads), in dy's dtype.

The fused form is one launch of k6 with the "dswiglu" epilogue (kernels/k6_persistent.cu): the accumulators
meet gate and up in registers and dact [M_tot, I] is never written. It passed its GPU tests, but measured slower
than the unfused path (:data:`LAUNCH_FUSED`), so the op runs the GEMM on moe_gemm.torch.grouped_mm and then
moe_gemm.torch.swiglu.dswiglu; so it does where the kernel cannot run (a CPU tensor, another GPU, inputs k6 does
not take: a warning once per reason) or has not passed (moe_gemm.torch.kernels.NOT_YET_RUN).
Malformed inputs raise a ValueError before any launch. Rows past ``offs[-1]`` belong to no expert: the kernel
leaves them as torch.empty left them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from moe_gemm.torch import rules
from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS, NOT_YET_RUN
from moe_gemm.torch.launches import PointerLaunches
from moe_gemm.torch.ops import grouped_mm, operands
from moe_gemm.torch.swiglu import dswiglu

CONFIG = "k6/dswiglu-bn128"  # the configuration the op launches; chapter 09 also times the others of FUSED_BACKWARD
# Whether the op launches the fused kernel where it can: not while it is slower than the GEMM then the separate
# pass somewhere. Chapter 09 measured it on an H100 (chapters/09/results/h100.json) at 0.41-2.04 separate passes
# over the dA GEMM alone, the fastest of its three launches (plain, prefetching, raster walk): cheaper than the
# unfused path (which costs one pass) at the Qwen3-like size and at 4,096 tokens, dearer at 32,768 tokens at the
# Mixtral- and DeepSeek-V3-like sizes. One switch for every shape stays off until the op chooses per shape;
# tests/test_dswiglu.py holds it to the recorded measurement.
LAUNCH_FUSED = False
_warned: set[str] = set()


def has_run(config: str) -> bool:
    """Whether FUSED_BACKWARD's ``config`` has passed its GPU tests (its record name, moe_gemm.torch.kernels.
    FUSED_BACKWARD_RECORDS, is not in NOT_YET_RUN)."""
    return FUSED_BACKWARD_RECORDS[config] not in NOT_YET_RUN


def check(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor, preact: torch.Tensor) -> None:
    """ValueError naming the first rule these inputs break (besides the grouped GEMM's own, rules.check)."""
    if w_down.dim() != 3 or dy.dim() != 2:
        raise ValueError(f"grouped_mm_dswiglu: dy must be 2-D [M_tot, H] and w_down 3-D [E, I, H], got "
                         f"{tuple(dy.shape)} and {tuple(w_down.shape)}")
    width = 2 * w_down.shape[1]
    if preact.shape != (dy.shape[0], width):
        raise ValueError(f"grouped_mm_dswiglu: preact must be [M_tot, 2I] = [{dy.shape[0]}, {width}] (the saved "
                         f"[gate | up]), got {tuple(preact.shape)}")
    if preact.dtype != dy.dtype or preact.device != dy.device:
        raise ValueError(f"grouped_mm_dswiglu: preact must have dy's dtype and device ({dy.dtype} on {dy.device}), "
                         f"got {preact.dtype} on {preact.device}")


def refusal(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor, preact: torch.Tensor) -> str | None:
    """Why the fused kernel cannot take these inputs, or None; a ValueError for malformed ones."""
    check(dy, w_down, offs, preact)
    route = rules.route(operands(dy, w_down.transpose(1, 2), offs, dy.dtype), epilogue="dswiglu")
    reasons = [route.reason] if route.reason else []
    if not preact.is_contiguous():
        reasons.append("the fused SwiGLU backward reads preact row-major and contiguous")
    return "; ".join(reasons) or None


@functools.cache
def _variant(config: str, element: str) -> Any:
    from moe_gemm.variants.k6 import K6Persistent
    from moe_gemm.variants.k6.config import FUSED_BACKWARD

    return K6Persistent(config, FUSED_BACKWARD[config].replace(element=element, out=element))


class _Runner(PointerLaunches):
    """The fused kernel (configuration ``config``) on one shape and GPU, launched on (dy, w_down, dh, offs, preact,
    act)."""

    def __init__(self, config: str, element: str, index: int, tokens: int, experts: int, hidden: int,
                 inter: int) -> None:
        from moe_gemm.variants.k6.launch import resident_slots

        super().__init__(index)
        variant = _variant(config, element)
        self.kernel, self.config, self.shape = variant.compile(), variant.config, (tokens, experts, hidden, inter)
        with torch.cuda.device(index):
            sms = torch.cuda.get_device_properties(index).multi_processor_count
            self.slots = resident_slots(self.kernel, self.config, sms, device=index)

    def build(self, pointers: tuple[int, ...], stream: int) -> Callable[[], None]:
        from moe_gemm.variants.k6.launch import launcher

        dy, w_down, dh, offs, preact, act = pointers
        return launcher(self.kernel, self.config, self.slots, dy, w_down, dh, offs, *self.shape, stream=stream,
                        device=self.index, preact_address=preact, act_address=act)


@functools.lru_cache(maxsize=64)
def _runner(config: str, element: str, index: int, tokens: int, experts: int, hidden: int, inter: int) -> _Runner:
    return _Runner(config, element, index, tokens, experts, hidden, inter)


def fused(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor, preact: torch.Tensor,
          config: str = CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """The one k6 launch of ``config`` (one of FUSED_BACKWARD), for inputs the rules admit (the op calls it with
    CONFIG; its GPU tests and chapter 09 call it directly)."""
    tokens, hidden = dy.shape
    experts, inter, _ = w_down.shape
    dh, act = torch.empty_like(preact), dy.new_empty((tokens, inter))
    if tokens:  # a tensor map cannot describe 0 rows
        element = rules.K6_ELEMENTS[str(dy.dtype).removeprefix("torch.")]
        _runner(config, element, dy.device.index, tokens, experts, hidden, inter)(dy, w_down, dh, offs.contiguous(),
                                                                                   preact, act)
    return dh, act


def _grouped_mm_dswiglu(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
                        preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    reason = refusal(dy, w_down, offs, preact)
    if reason is None and LAUNCH_FUSED and has_run(CONFIG):
        return fused(dy, w_down, offs, preact)
    # A kernel not yet run or slower is the project's state, not the caller's input: that fallback is silent.
    if reason is not None and reason not in _warned and dy.is_cuda:
        _warned.add(reason)
        warnings.warn(f"grouped_mm_dswiglu runs the GEMM, then SwiGLU's backward as torch operations: {reason}",
                      stacklevel=3)
    return dswiglu(grouped_mm(dy, w_down.transpose(1, 2), offs, dy.dtype), preact)


_library = torch.library.Library("moe_gemm", "FRAGMENT")
_library.define("grouped_mm_dswiglu(Tensor dy, Tensor w_down, Tensor offs, Tensor preact) -> (Tensor, Tensor)")
_library.impl("grouped_mm_dswiglu", _grouped_mm_dswiglu, "CUDA")
_library.impl("grouped_mm_dswiglu", _grouped_mm_dswiglu, "CPU")


def _fake(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
          preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check(dy, w_down, offs, preact)
    return torch.empty_like(preact), dy.new_empty((dy.shape[0], w_down.shape[1]))


torch.library.register_fake("moe_gemm::grouped_mm_dswiglu", _fake, lib=_library)


def grouped_mm_dswiglu(dy: torch.Tensor, w_down: torch.Tensor, offs: torch.Tensor,
                       preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, act) of the SwiGLU's backward after dact = dy @ w_down[e]^T, per expert's rows (see the module)."""
    return torch.ops.moe_gemm.grouped_mm_dswiglu(dy, w_down, offs, preact)
