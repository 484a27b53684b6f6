"""Our MoE layer's weights run by the peers, for chapter 08's comparison of whole layers: the same
layer code on quack's varlen-M GEMMs, and transformers' own sparse MoE block holding the weights, once
per way transformers runs its experts.

    forward, how = quack_forward(layer)                 # None without quack
    forward, parameters, gradients = quack_training(layer)   # the training step's way; None without quack
    forward = transformers_forward_of(layer, "eager")   # one of TRANSFORMERS_WAYS' implementations
    y = forward(x)                                      # x [tokens, hidden] -> [tokens, hidden], as layer(x)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from moe_gemm.torch.experts import token_sums
from moe_gemm.torch.layer import MoELayer, combine, dispatch, permute, route, transformers_block, transformers_forward

Forward = Callable[[torch.Tensor], torch.Tensor]
# Chapter 08's rows for transformers' block, one per experts implementation transformers 5 ships that
# runs without a download: its default first (what from_pretrained picks where torch._grouped_mm
# exists), then the per-expert loop and the batched matmuls. "deepgemm" and "sonicmoe" fetch their
# kernels from the Hugging Face Hub on first use, so they are not among them.
TRANSFORMERS_WAYS = {"layer/transformers": "grouped_mm", "layer/transformers-eager": "eager",
                     "layer/transformers-batched_mm": "batched_mm"}


def cu_seqlens(offs: torch.Tensor) -> torch.Tensor:
    """quack's offsets, [E + 1] from 0, from torch's: the E cumulative row ends."""
    return torch.cat([offs.new_zeros(1), offs])


def interleaved(w_gate_up: torch.Tensor) -> torch.Tensor:
    """[E, H, 2I] as stored ([gate | up]) in quack's gated layout: g0, u0, g1, u1, ... along the last dim."""
    gate, up = w_gate_up.chunk(2, dim=2)
    return torch.stack([gate, up], dim=3).flatten(2).contiguous()


def quack_forward(layer: MoELayer) -> tuple[Forward, dict[str, str]] | None:
    """The same layer on quack, and how GEMM 1 ran (fields for its records): quack's gemm_act with its
    fused SwiGLU (gate and up columns interleaved one by one, quack's layout) where that works, else
    quack's gemm and SwiGLU as its own pass (as the torch way runs it), the fields saying why; GEMM 2
    through its gemm. None without quack."""
    from moe_gemm.variants.peer.quack import quack_available

    if quack_available() is not None:
        return None
    from quack.gemm_interface import gemm, gemm_act

    def quack_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return gemm(a, b, cu_seqlens_m=cu_seqlens(offs), tuned=True)

    w_interleaved = interleaved(layer.w_gate_up.detach())

    def fused(x: torch.Tensor) -> torch.Tensor:
        weights, order, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)
        _, act = gemm_act(rows, w_interleaved, activation="swiglu", cu_seqlens_m=cu_seqlens(offs), store_preact=False,
                          tuned=True)
        y = quack_grouped_mm(act, layer.w_down, offs)
        return combine(y, order, weights, layer.top_k).to(x.dtype)

    try:
        with torch.no_grad():
            fused(torch.randn(64, layer.gate.shape[1], device=layer.gate.device, dtype=layer.gate.dtype))
    except Exception as error:  # noqa: BLE001 - any failure inside quack's epilogue compiler: say it, go on unfused
        reason = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        return (lambda x: layer(x, gemm=quack_grouped_mm)), {"quack_gemm1": "gemm, then SwiGLU as its own pass",
                                                             "quack_gemm_act_error": reason}
    return fused, {"quack_gemm1": "gemm_act with its fused SwiGLU"}


class _QuackExperts(torch.autograd.Function):
    """The experts' forward and backward on quack's kernels, keeping what ours keeps (the interleaved
    pre-activation; the token rows gathered again, the activation recomputed): gemm_act with its fused SwiGLU
    (store_preact), gemm; then gemm_dact (SwiGLU's backward fused into the dA GEMM, the activation recomputed
    beside it), the varlen-K gemm for both weight gradients, gemm for the rows' gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, order: torch.Tensor, cu_seqlens: torch.Tensor, w_interleaved: torch.Tensor,
                w_down: torch.Tensor, top_k: int) -> torch.Tensor:
        from quack.gemm_interface import gemm, gemm_act

        preact, act = gemm_act(x[order // top_k], w_interleaved, activation="swiglu", cu_seqlens_m=cu_seqlens,
                               store_preact=True, tuned=True)
        ctx.save_for_backward(x, order, cu_seqlens, preact, w_interleaved, w_down)
        ctx.top_k = top_k
        return gemm(act, w_down, cu_seqlens_m=cu_seqlens, tuned=True)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        from quack.gemm_interface import gemm, gemm_dact

        x, order, cu_seqlens, preact, w_interleaved, w_down = ctx.saved_tensors
        dy = dy.contiguous()
        dpreact, act = gemm_dact(dy, w_down.transpose(1, 2), preact, activation="swiglu", cu_seqlens_m=cu_seqlens,
                                 tuned=True)[:2]
        dw_down = torch.zeros_like(w_down)  # zeros: an expert with no rows keeps them
        gemm(act.t(), dy, out=dw_down, cu_seqlens_k=cu_seqlens, tuned=True)
        dw_interleaved = torch.zeros_like(w_interleaved)
        gemm(x[order // ctx.top_k].t(), dpreact, out=dw_interleaved, cu_seqlens_k=cu_seqlens, tuned=True)
        d_rows = gemm(dpreact, w_interleaved.transpose(1, 2), cu_seqlens_m=cu_seqlens, tuned=True)
        return token_sums(d_rows, order, ctx.top_k), None, None, dw_interleaved, dw_down, None


def quack_training(layer: MoELayer) -> tuple[Forward, list[torch.Tensor], Callable[[], list[torch.Tensor]]] | None:
    """The same layer trained on quack (None without quack): its forward pass, the tensors that get gradients
    (the router and W_down are the layer's own; W_gate_up is quack's interleaved copy, gate and up column by
    column, as quack's gated epilogues read it) and those gradients in our layer's layout. Router, permutation
    and combine are our layer's code."""
    from moe_gemm.variants.peer.quack import quack_available

    if quack_available() is not None:
        return None
    w_interleaved = torch.nn.Parameter(interleaved(layer.w_gate_up.detach()))

    def forward(x: torch.Tensor) -> torch.Tensor:
        weights, chosen = route(x, layer.gate, layer.top_k, layer.normalize)
        order, offs = permute(chosen, layer.gate.shape[0])
        y = _QuackExperts.apply(x, order, cu_seqlens(offs), w_interleaved, layer.w_down, layer.top_k)
        return combine(y, order, weights, layer.top_k).to(x.dtype)

    def gradients() -> list[torch.Tensor]:
        pairs = w_interleaved.grad.unflatten(2, (-1, 2))  # [E, H, I, (gate, up)]
        return [layer.gate.grad, torch.cat([pairs[..., 0], pairs[..., 1]], dim=2), layer.w_down.grad]

    return forward, [layer.gate, w_interleaved, layer.w_down], gradients


def transformers_block_of(layer: MoELayer, experts_implementation: str) -> torch.nn.Module:
    """transformers' MixtralSparseMoeBlock (renormalised top-k, as ours) holding a copy of ``layer``'s
    weights in its dtype, running its experts with ``experts_implementation``; its parameters train."""
    experts, hidden = layer.gate.shape
    block, _ = transformers_block("mixtral", hidden, layer.w_down.shape[1], experts, layer.top_k, device="meta",
                                  experts_implementation=experts_implementation)
    block = block.to_empty(device=layer.gate.device).to(layer.gate.dtype).eval()
    with torch.no_grad():
        block.gate.weight.copy_(layer.gate)
        block.experts.gate_up_proj.copy_(layer.w_gate_up.transpose(1, 2))
        block.experts.down_proj.copy_(layer.w_down.transpose(1, 2))
    return block


def transformers_forward_of(layer: MoELayer, experts_implementation: str = "grouped_mm") -> Forward:
    """The forward pass of transformers_block_of(layer, experts_implementation) on tokens [tokens, hidden]."""
    block = transformers_block_of(layer, experts_implementation)
    return lambda x: transformers_forward(block, x)
