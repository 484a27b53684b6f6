"""An MoE layer's experts in training: GEMM 1, SwiGLU and GEMM 2 as one autograd function whose saved
tensors are chosen for memory, and whose backward runs k6 for the two dA GEMMs and k7 for the two dW.

    y = experts(x, order, offs, w_gate_up, w_down, top_k)   # [tokens x top_k, H], rows in expert order

What autograd would keep, per routed row, of torch operations on these steps (the torch layer's): the
gathered token row [H] (GEMM 1's A, for dW_gate_up), the product h = [gate | up] [2I] (SwiGLU's input),
silu(gate) [I] (the product's other factor) and the activation [I] (GEMM 2's A, for dW_down). This
function keeps h alone: the token rows are gathered again from x (which the caller holds anyway) and the
activation is recomputed from h by the backward's own SwiGLU pass, which needs h's two halves in any
case. Per routed row that is 2I elements instead of H + 4I; with the combine's saved expert output [H],
H + 2I against 2H + 4I: half (moe_gemm.model.workloads.LayerShape.saved_elements_per_row). And h is held no
longer than it is read: the backward empties its storage once SwiGLU's backward is done (:func:`release`).

The forward runs GEMM 1 without the fused SwiGLU epilogue, because the backward needs h and the fused
kernel never writes it (the inference forward, MoELayer under no_grad, keeps the fused launch). The
backward: dact = dY W_down^T with SwiGLU's backward after it (moe_gemm.torch.fused_backward: dh and the
activation again: the GEMM on k6, then moe_gemm.torch.swiglu.dswiglu as torch operations, since the fused
kernel measured slower at some sizes), dW_down = act^T dY (k7), dX_rows = dh
W_gate_up^T (k6), each token's rows summed back into dx by the combine kernel with unit weights (one owner
per output row: no atomics), and dW_gate_up = rows^T dh (k7).
"""

from __future__ import annotations

from typing import Any

import torch

from moe_gemm.torch.combine import inverse_permutation  # the module registers torch.ops.moe_gemm.combine
from moe_gemm.torch.fused_backward import grouped_mm_dswiglu
from moe_gemm.torch.ops import grouped_mm
from moe_gemm.torch.swiglu import swiglu
from moe_gemm.torch.weight_gradient import weight_grad


def token_sums(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """dx[t] = the sum of the rows of token t's top_k (token, choice) pairs: the combine with unit weights
    (each token's rows read once, its sum written once in fp32-summed bf16: no atomics)."""
    ones = torch.ones((order.numel() // top_k, top_k), dtype=torch.float32, device=rows.device)
    return torch.ops.moe_gemm.combine(rows, inverse_permutation(order), ones, top_k)


# --8<-- [start:release]
def release(saved: torch.Tensor) -> None:
    """Free a saved tensor's memory once the backward has used it. Autograd holds what save_for_backward kept
    until the whole backward returns, and h [M, 2I] is the largest of it: held to the end it sits beside dh,
    the gathered token rows and both weight gradients at the backward's peak. Emptying its storage frees it
    where the saved-tensor hooks (offloading, activation checkpointing) still see it saved. Not under
    torch.compile, which traces the backward as a graph and plans its buffers itself."""
    if not torch.compiler.is_compiling():
        saved.untyped_storage().resize_(0)
# --8<-- [end:release]


def released(saved: torch.Tensor) -> bool:
    """Whether :func:`release` emptied ``saved`` (a second backward through the same forward would read it)."""
    return not torch.compiler.is_compiling() and saved.numel() > 0 and saved.untyped_storage().nbytes() == 0


# --8<-- [start:experts]
class _Experts(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, order: torch.Tensor, offs: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor, top_k: int) -> torch.Tensor:
        h = grouped_mm(x[order // top_k], w_gate_up, offs, x.dtype)  # the rows: freed when GEMM 1 is done
        y = grouped_mm(swiglu(h).contiguous(), w_down, offs, x.dtype)
        ctx.save_for_backward(x, order, offs, h, w_gate_up, w_down)  # x and the weights: the caller's own
        ctx.top_k = top_k
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, order, offs, h, w_gate_up, w_down = ctx.saved_tensors
        if released(h):
            raise RuntimeError("moe_gemm's experts: a second backward through one forward; the first freed the "
                               "saved pre-activation once used (retain_graph=True cannot keep it)")
        needs_x, needs_gate_up, needs_down = ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        dy = dy.contiguous().to(h.dtype)
        dh, act = grouped_mm_dswiglu(dy, w_down, offs, h)  # dact never leaves the GEMM where k6 fuses it
        release(h)
        dw_down = weight_grad(act, dy, offs, w_down.dtype) if needs_down else None
        del act, dy
        dx = None
        if needs_x:
            dx = token_sums(grouped_mm(dh, w_gate_up.transpose(1, 2), offs, x.dtype), order, ctx.top_k)
        dw_gate_up = weight_grad(x[order // ctx.top_k], dh, offs, w_gate_up.dtype) if needs_gate_up else None
        return dx, None, None, dw_gate_up, dw_down, None
# --8<-- [end:experts]


def experts(x: torch.Tensor, order: torch.Tensor, offs: torch.Tensor, w_gate_up: torch.Tensor,
            w_down: torch.Tensor, top_k: int) -> torch.Tensor:
    """The expert outputs [tokens x top_k, H] in expert order: row i is token ``order[i] // top_k`` through
    GEMM 1 (``w_gate_up`` [E, H, 2I]), SwiGLU and GEMM 2 (``w_down`` [E, I, H]) of its expert, the experts'
    rows as ``offs`` (int32 cumulative ends) says; differentiable in x and both weights (see the module)."""
    return _Experts.apply(x, order, offs, w_gate_up, w_down, top_k)

