"""Where a training step's GPU time goes: one eager step under torch's profiler (CUPTI records every kernel of the
process, ours launched through the driver included), each kernel's time summed by what it does.

A way that loses to another by milliseconds loses them somewhere: this splits both ways' kernel time into the
same kinds so that their difference can be read kind by kind. It imports torch when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Kernel name -> kind, the first kind any of whose fragments the lower-cased name contains. Ours first (our
# kernels' names are the entry points of kernels/k6_persistent.cu and kernels/k7_weight_grad.cu), then what
# torch launches: its grouped GEMMs (CUTLASS and cuBLAS's nvjet kernels), the routing's gathers and scatters,
# copies, reductions, and elementwise passes (SwiGLU and its backward in the torch layer).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dA + dSwiGLU (ours)", ("k6_persistent_dswiglu",)),
    ("GEMM 1 + SwiGLU (ours)", ("k6_persistent_swiglu",)),
    ("GEMM (ours)", ("k6_persistent",)),
    ("dW (ours)", ("k7_weight_grad",)),
    ("GEMM (torch)", ("cutlass", "nvjet", "gemm", "xmma", "grouped_mm")),
    ("gather, scatter, sort", ("index", "gather", "scatter", "sort", "radix", "histogram", "bincount", "cumsum",
                               "scan")),
    ("copies", ("copy", "cat", "fill", "memset", "memcpy")),
    ("reductions", ("reduce",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)
OTHER = "other"


def kind_of(kernel: str) -> str:
    """The KINDS label of one kernel's name (OTHER where none matches)."""
    name = kernel.lower()
    return next((kind for kind, fragments in KINDS if any(f in name for f in fragments)), OTHER)


def split_by_kind(kernel_ms: Mapping[str, float]) -> dict[str, float]:
    """Milliseconds per kernel name summed by kind, in KINDS' order then OTHER, the kinds with no time left out."""
    totals: dict[str, float] = {}
    for kernel, ms in kernel_ms.items():
        kind = kind_of(kernel)
        totals[kind] = totals.get(kind, 0.0) + ms
    order = [kind for kind, _ in KINDS] + [OTHER]
    return {kind: totals[kind] for kind in order if totals.get(kind)}


def kernel_ms(step: Callable[[], Any], release: Callable[[], None] | None = None, steps: int = 3) -> dict[str, float]:
    """Each kernel name's GPU milliseconds per ``step``, averaged over ``steps`` eager steps under torch's profiler
    after one unprofiled warm-up; ``release`` after each step (a training step's gradients dropped)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")

    def once() -> None:
        step()
        if release is not None:
            release()

    once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            once()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / 1e3 / steps for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0}
