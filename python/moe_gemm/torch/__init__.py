"""Our grouped GEMM for torch: ``moe_gemm.torch.grouped_mm(a, b, offs)``, a drop-in for torch._grouped_mm's
2D x 3D form (moe_gemm.torch.ops), its weight gradient ``weight_grad(a, dc, offs)`` on k7
(moe_gemm.torch.weight_gradient, chapter 09; what the op's backward runs), an MoE layer built on them
(moe_gemm.torch.layer, chapter 08), and the FP8 grouped GEMM ``scaled_grouped_mm(a, b, scale_a, scale_b, offs)``
on k8 with the quantizers that feed it, ``quantize_1x128``, ``quantize_128x128_t`` and ``swiglu_quantize_1x128``,
and the FP8 layer's GEMM 1 with its SwiGLU, ``swiglu_scaled_grouped_mm`` (moe_gemm.torch.scaled and
moe_gemm.torch.quantize, chapter 10).

``grouped_mm`` and ``MoELayer`` import torch when first used; the rules the op follows
(moe_gemm.torch.rules) never do, so they are tested where torch is not installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MoELayer", "grouped_mm", "quantize_128x128_t", "quantize_1x128", "scaled_grouped_mm",
           "swiglu_quantize_1x128", "swiglu_scaled_grouped_mm", "weight_grad"]


def __getattr__(name: str) -> Any:
    if name == "grouped_mm":
        from moe_gemm.torch.ops import grouped_mm

        return grouped_mm
    if name == "weight_grad":
        from moe_gemm.torch.weight_gradient import weight_grad

        return weight_grad
    if name in ("scaled_grouped_mm", "swiglu_scaled_grouped_mm"):
        from moe_gemm.torch import scaled

        return getattr(scaled, name)
    if name in ("quantize_1x128", "quantize_128x128_t", "swiglu_quantize_1x128"):
        from moe_gemm.torch import quantize

        return getattr(quantize, name)
    if name == "MoELayer":
        from moe_gemm.torch.layer import MoELayer

        return MoELayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
