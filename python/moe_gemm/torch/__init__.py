"""Our grouped GEMM for torch: ``moe_gemm.torch.grouped_mm(a, b, offs)``, a drop-in for torch._grouped_mm's
2D x 3D form (moe_gemm.torch.ops), its weight gradient ``weight_grad(a, dc, offs)`` on k7
(moe_gemm.torch.weight_gradient, chapter 09; what the op's backward runs), and an MoE layer built on them
(moe_gemm.torch.layer, chapter 08).

``grouped_mm`` and ``MoELayer`` import torch when first used; the rules the op follows
(moe_gemm.torch.rules) never do, so they are tested where torch is not installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MoELayer", "grouped_mm", "weight_grad"]


def __getattr__(name: str) -> Any:
    if name == "grouped_mm":
        from moe_gemm.torch.ops import grouped_mm

        return grouped_mm
    if name == "weight_grad":
        from moe_gemm.torch.weight_gradient import weight_grad

        return weight_grad
    if name == "MoELayer":
        from moe_gemm.torch.layer import MoELayer

        return MoELayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
