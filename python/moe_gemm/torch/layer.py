"""A whole MoE layer on the grouped GEMM, forward and backward: router, top-k, permutation, GEMM 1,
SwiGLU, GEMM 2 and the weighted combine, every step on the GPU and none reading the routing back to
the host, so the layer's forward can be captured whole in one CUDA graph.

    layer = MoELayer(hidden=2048, intermediate=768, experts=128, top_k=8)
    y = layer(x)                                  # x [..., hidden] -> [..., hidden]
    y = layer(x, gemm=torch_grouped_mm)           # the same layer on torch._grouped_mm
    y.backward(dy)                                # gradients of gate, w_gate_up, w_down (and x)

The weights follow the transformers MoE blocks' meaning (Mixtral, Qwen3-MoE): a router
``gate`` [E, H] (an nn.Linear's weight), per expert a gate and an up projection (SwiGLU:
silu(x W_gate) * (x W_up)) and a down projection. Here they are stored for a 2D x 3D grouped GEMM:
``w_gate_up`` [E, H, 2I] (gate columns, then up columns) and ``w_down`` [E, I, H].
:meth:`MoELayer.from_transformers` copies them out of a transformers block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from moe_gemm.model.reference import SWIGLU_BLOCK
from moe_gemm.torch import rules
from moe_gemm.torch.combine import inverse_permutation  # the module registers torch.ops.moe_gemm.combine
from moe_gemm.torch.experts import experts
from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu
from moe_gemm.torch.swiglu import swiglu

GroupedMM = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# The parameters' dtypes the layer runs: bf16 and fp16 on our kernels; fp32 through the op's fallback
# to torch._grouped_mm (moe_gemm.torch.rules: k6's wgmma takes 16-bit operands), whose path for it on
# the GPU loops over the experts with the offsets read back to the host, so it cannot be graph-captured.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def our_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """moe_gemm.torch.grouped_mm writing its output in a's dtype: the layer's GEMM."""
    return grouped_mm(a, b, offs, a.dtype)


def torch_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm with the same signature as ours: the layer's other GEMM."""
    return torch._grouped_mm(a, b, offs=offs, out_dtype=a.dtype)


# --8<-- [start:steps]
def route(x: torch.Tensor, gate: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top_k experts and their weights: softmax over the router logits in fp32 (as the
    transformers blocks do), the k largest, renormalised to sum to one if ``normalize``."""
    probs = F.softmax(F.linear(x, gate), dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def permute(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs sorted by expert, and each expert's cumulative row end (int32 offs).

    ``order[i]`` indexes the flattened [tokens, top_k] choices; row i of the grouped GEMM's A is token
    ``order[i] // top_k``. A stable sort keeps each expert's tokens in token order. The counts are a
    scatter-add, not torch.bincount, whose output size depends on the data (a host sync)."""
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, torch.cumsum(counts, 0, dtype=torch.int32)


def combine(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """Back to token order: out[t] = sum over t's top_k choices of weight x the expert's output row.

    Every token has exactly top_k rows, so no atomics are needed: with the inverse of the sort each
    token knows where its rows are, and one kernel (moe_gemm.torch.combine, kernels/moe_combine.cu)
    reads them, weights and sums them in fp32 and writes the token's row once: y read once, out
    written once. (The first version added fp32 rows into out with index_add_ atomics; the second
    gathered y into token order and summed with a batched GEMM, two passes over [M, H].)"""
    return torch.ops.moe_gemm.combine(y, inverse_permutation(order), weights, top_k)
# --8<-- [end:steps]


class Dispatch(NamedTuple):
    """A batch of tokens routed and sorted for the grouped GEMMs."""

    weights: torch.Tensor  # [tokens, top_k] routing weights
    order: torch.Tensor  # the (token, choice) pairs sorted by expert (permute)
    offs: torch.Tensor  # int32 cumulative row ends per expert
    rows: torch.Tensor  # [tokens x top_k, H]: each sorted pair's token row, GEMM 1's A


def dispatch(x: torch.Tensor, gate: torch.Tensor, top_k: int, normalize: bool) -> Dispatch:
    """Router, top-k and permutation: what every way of running the experts starts from."""
    weights, experts = route(x, gate, top_k, normalize)
    order, offs = permute(experts, gate.shape[0])
    return Dispatch(weights, order, offs, x[order // top_k])


def trains(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether autograd will need the experts' backward: gradients on, and x or an expert weight needing one."""
    return torch.is_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad or w_down.requires_grad)


def moe_forward(x: torch.Tensor, gate: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int,
                normalize: bool = True, gemm: GroupedMM = our_grouped_mm, fused: bool = False) -> torch.Tensor:
    """The layer's forward pass on tokens ``x`` [tokens, H], step by step (see the module docstring).

    On our GEMM, when autograd will need the experts' backward (:func:`trains`), the experts run as
    moe_gemm.torch.experts, which saves the SwiGLU's pre-activation alone and trains on k6 and k7; else
    ``fused`` runs GEMM 1 and SwiGLU as one launch of k6's fused epilogue, reading W_gate_up as it is
    stored (that kernel does not write the pre-activation a backward would need)."""
    weights, chosen = route(x, gate, top_k, normalize)
    order, offs = permute(chosen, gate.shape[0])
    if gemm is our_grouped_mm and trains(x, w_gate_up, w_down):
        y = experts(x, order, offs, w_gate_up, w_down, top_k)
    else:
        rows = x[order // top_k]
        act = grouped_mm_swiglu(rows, w_gate_up, offs) if fused else swiglu(gemm(rows, w_gate_up, offs)).contiguous()
        y = gemm(act, w_down, offs)
    return combine(y, order, weights, top_k).to(x.dtype)


def check_input(layer: str, x: torch.Tensor, gate: torch.Tensor) -> None:
    """A TypeError unless x is a tensor, a ValueError unless it is [..., H] on the router's device (gate [E, H]):
    before anything runs, where a wrong hidden size would fail in the router's matmul and another device in
    the first kernel."""
    rules.check_tensors(layer, torch.Tensor, x=x)
    hidden = gate.shape[1]
    if x.dim() < 1 or x.shape[-1] != hidden:
        raise ValueError(f"{layer}: the input must be [..., hidden = {hidden}], got {tuple(x.shape)}")
    if x.device != gate.device:
        raise ValueError(f"{layer}: the input must be on the parameters' device {gate.device}, got {x.device}")


class MoELayer(torch.nn.Module):
    """An MoE feed-forward layer: ``hidden`` -> ``experts`` SwiGLU experts of width ``intermediate``, top_k of
    them per token -> ``hidden``, on inputs [..., hidden] of any leading shape (flattened to tokens and
    back).

    Dtypes: the parameters are made in ``dtype`` and the input must have it. bf16 and fp16 run our
    kernels (the combine kernel is bf16's; fp16 combines with torch operations); fp32 runs the same code
    through the op's fallback to torch._grouped_mm (eagerly: torch's path for it reads the expert
    offsets back to the host, so it cannot be graph-captured); any other dtype is refused here with a
    ValueError.

    ``fused`` (bf16 or fp16, the intermediate size a multiple of 64): in inference (no gradient needed
    by the experts), GEMM 1 runs with the SwiGLU epilogue, which reads W_gate_up itself (no copy of it
    that could go stale after load_state_dict or an edit of the weights).

    What trains: forward and backward through autograd; gradients reach the router ``gate`` (through
    the routing weights), ``w_gate_up``, ``w_down`` and the input. The experts train as
    moe_gemm.torch.experts: GEMM 1 unfused (the backward needs its product), dA on k6 and dW on k7 (chapter
    09), SwiGLU's backward as torch operations; the combine's backward is torch operations
    (moe_gemm.torch.combine). Saved for backward: the router's probabilities [tokens, E]; the SwiGLU's
    pre-activation [tokens x top_k, 2I] and the sort order (the token rows are gathered again from the
    input, the activation recomputed from the pre-activation); the expert outputs [.., H] and the inverse
    permutation and weights the combine reads; the input and the weights themselves."""

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int, normalize: bool = True,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None,
                 fused: bool = True) -> None:
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be in 1 .. experts ({experts}), got {top_k}")
        if dtype not in DTYPES:
            raise ValueError(f"MoELayer runs bf16 or fp16 (our kernels) or fp32 (torch._grouped_mm), got {dtype}")
        factory = {"dtype": dtype, "device": device}
        self.top_k, self.normalize = top_k, normalize
        self.gate = torch.nn.Parameter(torch.randn(experts, hidden, **factory) * hidden**-0.5)
        self.w_gate_up = torch.nn.Parameter(torch.randn(experts, hidden, 2 * intermediate, **factory) * hidden**-0.5)
        self.w_down = torch.nn.Parameter(torch.randn(experts, intermediate, hidden, **factory) * intermediate**-0.5)
        self.fused = fused and dtype != torch.float32 and intermediate % SWIGLU_BLOCK == 0

    def forward(self, x: torch.Tensor, gemm: GroupedMM = our_grouped_mm) -> torch.Tensor:
        check_input("MoELayer", x, self.gate)
        if x.dtype != self.gate.dtype:
            raise ValueError(f"MoELayer: the input must have the parameters' dtype {self.gate.dtype}, got {x.dtype}")
        fused = self.fused and gemm is our_grouped_mm  # other GEMMs run SwiGLU as its own pass
        tokens = x.reshape(-1, x.shape[-1])
        out = moe_forward(tokens, self.gate, self.w_gate_up, self.w_down, self.top_k, self.normalize, gemm, fused)
        return out.view(x.shape)

    @classmethod
    def from_transformers(cls, block: torch.nn.Module, top_k: int, normalize: bool) -> MoELayer:
        """The same layer as a transformers sparse MoE block (Mixtral's or Qwen3-MoE's), its weights copied."""
        gate, gate_up, down = transformers_weights(block)
        experts, hidden, width = gate_up.shape
        layer = cls(hidden, width // 2, experts, top_k, normalize, dtype=gate.dtype, device=gate.device)
        with torch.no_grad():
            layer.gate.copy_(gate)
            layer.w_gate_up.copy_(gate_up)
            layer.w_down.copy_(down)
        return layer


def transformers_refusal(block: torch.nn.Module) -> str | None:
    """Why this layer would not compute what ``block`` computes, or None: MoELayer is a softmax top-k router and
    SwiGLU experts without biases (Mixtral, Qwen3-MoE). Other transformers blocks share the attribute names but
    add terms a copy of the routed experts would silently drop."""
    name = type(block).__name__
    if not (hasattr(block, "gate") and hasattr(block, "experts")):
        return (f"takes a transformers sparse MoE block with a router `gate` and `experts` (Mixtral's, "
                f"Qwen3-MoE's), got {name}")
    if shared := [n for n in ("shared_expert", "shared_experts") if hasattr(block, n)]:
        return f"{name} also runs shared experts ({shared[0]}), which this layer does not compute"
    if hasattr(block.gate, "e_score_correction_bias"):
        return (f"{name} routes by sigmoid scores with a correction bias and expert groups (DeepSeek-V3's), not by "
                f"this layer's softmax top-k")
    if any("bias" in n for n, _ in block.experts.named_parameters()):
        return f"{name}'s experts have biases, which this layer's experts do not"
    return None


def transformers_weights(block: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(router [E, H], gate_up [E, H, 2I], down [E, I, H]) of a transformers MoE block, whichever way
    its version stores the experts: fused 3-D parameters (``experts.gate_up_proj`` [E, 2I, H],
    ``experts.down_proj`` [E, H, I], transformers 5) or a ModuleList of per-expert Linears (w1/w3/w2 in
    Mixtral, gate_proj/up_proj/down_proj in Qwen3-MoE, transformers 4). A ValueError for a block whose
    output this layer would not reproduce (:func:`transformers_refusal`)."""
    if (reason := transformers_refusal(block)) is not None:
        raise ValueError(f"MoELayer.from_transformers: {reason}")
    router = block.gate.weight if hasattr(block.gate, "weight") else block.gate
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):
        gate_up, down = experts.gate_up_proj, experts.down_proj
        if gate_up.shape[-1] != router.shape[1]:  # stored [E, H, 2I] already
            return router, gate_up, down
        return router, gate_up.transpose(1, 2), down.transpose(1, 2)
    names = ("w1", "w3", "w2") if hasattr(experts[0], "w1") else ("gate_proj", "up_proj", "down_proj")
    gate = torch.stack([getattr(e, names[0]).weight.t() for e in experts])
    up = torch.stack([getattr(e, names[1]).weight.t() for e in experts])
    down = torch.stack([getattr(e, names[2]).weight.t() for e in experts])
    return router, torch.cat([gate, up], dim=2), down


def transformers_block(family: str, hidden: int, intermediate: int, experts: int, top_k: int,
                       device: torch.device | str | None = None,
                       experts_implementation: str = "grouped_mm") -> tuple[torch.nn.Module, bool]:
    """transformers' own sparse MoE block, built from a config in code (no download), and whether it
    renormalises its top-k weights: ``"mixtral"`` (MixtralSparseMoeBlock, which does) or
    ``"qwen3_moe"`` (Qwen3MoeSparseMoeBlock with norm_topk_prob=False, which does not). Built under
    ``device`` (``"meta"`` allocates nothing: fill it with ``to_empty`` and a copy).

    ``experts_implementation``: how the block runs its experts (transformers 5's config setting, read
    on every forward): "grouped_mm" (torch._grouped_mm, what a transformers 5 model loaded with
    from_pretrained runs by default where torch has it), "eager" (a Python loop over the experts hit),
    "batched_mm" (each token's top_k experts' weights gathered, then batched matmuls). A block built
    from a config alone, as here, gets no default: it must be named."""
    import transformers

    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block

        config = transformers.MixtralConfig(hidden_size=hidden, intermediate_size=intermediate,
                                            num_local_experts=experts, num_experts_per_tok=top_k,
                                            experts_implementation=experts_implementation)
        normalize = True
    elif family == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block

        config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=intermediate,
                                             num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=False,
                                             experts_implementation=experts_implementation)
        normalize = False
    else:
        raise ValueError(f"family must be 'mixtral' or 'qwen3_moe', got {family!r}")
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return Block(config), normalize


def transformers_forward(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A transformers MoE block on tokens ``x`` [tokens, H], its output [tokens, H] as our layer gives
    it: the blocks take [batch, tokens, H], and transformers 4's return (hidden states, router logits)
    where 5's return the hidden states alone."""
    out = block(x.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out)[0]
