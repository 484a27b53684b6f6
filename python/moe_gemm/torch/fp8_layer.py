"""An MoE layer for inference in FP8 (chapter 10): chapter 08's layer with its expert GEMMs on k8.

    fp8 = FP8MoELayer.from_layer(layer)   # the weights quantized once: 128 x 128 blocks, transposed
    y = fp8(x)                            # [..., H] bf16 in and out, like layer(x)

The router, the permutation and the combine are the bf16 layer's (moe_gemm.torch.layer). A layer of any dtype
converts: its router is kept in bf16, the tokens' dtype, and its weights are rounded to bf16 before they are
quantized, so the FP8 layer of an fp32 layer is that of its bf16 copy. The tokens are
quantized once, in 1 x 128 groups, before they are gathered into expert order, so the gather moves e4m3 rows
(one byte per element, where the bf16 layer gathers two) and the T x top_k rows are never quantized one by one.
GEMM 1 (k8, blockwise) computes SwiGLU in its epilogue and writes the activation already quantized in 1 x 128
groups for GEMM 2 (moe_gemm.torch.scaled.swiglu_scaled_grouped_mm): neither the [M, 2I] product nor the [M, I]
activation is written in bf16. Until that kernel has passed its GPU tests, GEMM 1 writes [gate | up] in bf16 and
one pass computes SwiGLU and quantizes (kernels/k8_quantize.cu). GEMM 2 (k8) writes bf16 for the combine.
Nothing reads the routing back to the host, so the whole layer is captured in one CUDA graph.
"""

from __future__ import annotations

import torch

from moe_gemm.model.quantize import padded_rows
from moe_gemm.torch.layer import MoELayer, check_input, combine, permute, route
from moe_gemm.torch.quantize import quantize_1x128, quantize_128x128_t
from moe_gemm.torch.scaled import scaled_grouped_mm, swiglu_scaled_grouped_mm


def gathered(q: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of quantized tokens ``q`` [T, K] and their MN-major scales [K/128, T_pad], as the op takes
    them: the e4m3 rows gathered as bytes, the scales' columns gathered and padded to a multiple of 4 rows."""
    picked = q.view(torch.uint8)[rows].view(torch.float8_e4m3fn)
    scales = scale.new_ones((scale.shape[0], padded_rows(rows.numel())))
    scales[:, :rows.numel()] = scale[:, rows]
    return picked, scales


class FP8MoELayer(torch.nn.Module):
    """The inference forward pass of an :class:`~moe_gemm.torch.layer.MoELayer` with e4m3 expert weights."""

    def __init__(self, layer: MoELayer) -> None:
        super().__init__()
        intermediate, hidden = layer.w_down.shape[1:]  # w_down [E, I, H]
        if hidden % 16 or intermediate % 16:  # each is the K of one GEMM and a row of the other's e4m3 weights
            raise ValueError(f"FP8MoELayer: hidden and intermediate must be multiples of 16 (16-byte rows of the e4m3 "
                             f"weights, transposed), got hidden = {hidden}, intermediate = {intermediate}")
        self.top_k, self.normalize = layer.top_k, layer.normalize
        with torch.no_grad():
            # The router in bf16 whatever the layer's dtype: it multiplies the bf16 tokens the FP8 layer takes.
            self.register_buffer("gate", layer.gate.detach().to(torch.bfloat16).clone())
            w1, s1 = quantize_128x128_t(layer.w_gate_up.detach().to(torch.bfloat16).contiguous())
            w2, s2 = quantize_128x128_t(layer.w_down.detach().to(torch.bfloat16).contiguous())
        for name, tensor in (("w_gate_up_t", w1), ("scale_gate_up", s1), ("w_down_t", w2), ("scale_down", s2)):
            self.register_buffer(name, tensor)

    @classmethod
    def from_layer(cls, layer: MoELayer) -> FP8MoELayer:
        return cls(layer)

    @torch.no_grad()
    def dispatch(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The routing of ``tokens`` [T, H] (bf16) and GEMM 1's operands: (rows, row_scales, offs, order,
        weights), the quantized rows in expert order and their MN-major scales, the experts' row ends, the
        permutation and the routing weights."""
        weights, experts = route(tokens, self.gate, self.top_k, self.normalize)
        order, offs = permute(experts, self.gate.shape[0])
        q, scale = quantize_1x128(tokens)  # T tokens, not T x top_k rows
        rows, row_scales = gathered(q, scale, order // self.top_k)
        return rows, row_scales, offs, order, weights

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input("FP8MoELayer", x, self.gate)
        if x.dtype != torch.bfloat16:
            raise ValueError(f"FP8MoELayer takes bf16 tokens, got {x.dtype}")
        rows, row_scales, offs, order, weights = self.dispatch(x.reshape(-1, x.shape[-1]).contiguous())
        a2, s2 = swiglu_scaled_grouped_mm(rows, self.w_gate_up_t.transpose(1, 2), row_scales, self.scale_gate_up,
                                          offs)  # the activation, quantized for GEMM 2
        y = scaled_grouped_mm(a2, self.w_down_t.transpose(1, 2), s2, self.scale_down, offs)
        return combine(y, order, weights, self.top_k).to(x.dtype).reshape(x.shape)
