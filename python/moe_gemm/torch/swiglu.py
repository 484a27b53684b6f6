"""SwiGLU and its backward as torch operations, on the product h = [gate | up] [M, 2I] of an MoE layer's first
GEMM: the layer's own pass (moe_gemm.torch.layer, moe_gemm.torch.experts) and what the fused kernels are checked
against and fall back to (moe_gemm.torch.ops, moe_gemm.torch.fused_backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for h = [gate | up] [M, 2I], in h's dtype: its own pass over GEMM 1's output."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


# --8<-- [start:dswiglu]
def dswiglu(dact: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU's backward from the saved pre-activation: (dh, act) for act = silu(gate) * up, h = [gate | up].

    dh = [dact * up * silu'(gate) | dact * silu(gate)] [M, 2I] and act [M, I] (what dW_down needs), in h's
    dtype, by the operations torch's autograd runs for :func:`swiglu` (silu, its backward, two products),
    so the gradient is bit-identical to autograd's and no fp32 copy of h is made. Eagerly the halves of dh
    are written in place (no concatenation pass); under torch.compile they are concatenated."""
    gate, up = h.chunk(2, dim=-1)
    silu = F.silu(gate)
    if torch.compiler.is_compiling():  # dynamo refuses out= into a strided view; inductor fuses the cat
        return torch.cat([torch.ops.aten.silu_backward(dact * up, gate), dact * silu], dim=-1), silu * up
    dh = torch.empty_like(h)
    dgate, dup = dh.chunk(2, dim=-1)
    torch.ops.aten.silu_backward.grad_input(dact * up, gate, grad_input=dgate)
    torch.mul(dact, silu, out=dup)
    return dh, silu.mul_(up)
# --8<-- [end:dswiglu]
