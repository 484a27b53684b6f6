"""The MoE layer's combine as one kernel launch (kernels/moe_combine.cu), a torch op:

    out = torch.ops.moe_gemm.combine(y, row_of, weights, top_k)   # [tokens, H]

``y`` [tokens x top_k, H] bf16 holds the expert outputs in expert order, ``row_of`` (int64) says
where each (token, choice) pair's row is in y (the inverse of the sort), ``weights`` [tokens, top_k]
are the routing weights. out[t] = sum_j weights[t, j] * y[row_of[t * top_k + j]], summed in fp32
and rounded to bf16 once. The kernel reads y once and writes out once; elsewhere (a CPU tensor,
another dtype, H not a multiple of 8) the same sum runs as torch operations.

Autograd (torch operations, CPU and GPU): row_of is a permutation of y's rows, so the gradient of y is
a scatter without collisions, dy[row_of[t k + j]] = weights[t, j] dout[t], and the weights' gradient
is a dot product per (token, choice), dweights[t, j] = <dout[t], y[row_of[t k + j]]>, in fp32. Both run
one choice j at a time: temporaries of [tokens, H], not [tokens x top_k, H] (7.5 GB in fp32 at
DeepSeek-V3's H = 7168 with 32,768 tokens x 8).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

THREADS = 256  # kernels/moe_combine.cu: __launch_bounds__(256); each thread owns 8 columns of a row
PIECE = 8  # bf16 values per 16-byte load


@functools.cache
def _kernel():
    from moe_gemm.cuda.nvrtc import compile_kernel
    from moe_gemm.torch.kernels import COMBINE

    return compile_kernel(*COMBINE)  # for the running GPU's architecture


def _runs_the_kernel(y: torch.Tensor) -> bool:
    return y.is_cuda and y.dtype == torch.bfloat16 and y.shape[1] % PIECE == 0


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """row_of for the op: where each (token, choice) pair's row is in expert order, from the sort ``order``
    (``inverse[order[i]] = i``), as a scatter on the device (no host sync)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device, dtype=order.dtype)
    return inverse


def combine_reference(y: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """The same sum as torch operations (a gather, then an fp32 weighted sum over each token's rows)."""
    rows = y[row_of].view(-1, top_k, y.shape[1]).float()
    return (weights.float().unsqueeze(-1) * rows).sum(dim=1).to(y.dtype)


@torch.library.custom_op("moe_gemm::combine", mutates_args=())
def combine(y: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    if not _runs_the_kernel(y):
        return combine_reference(y, row_of, weights, top_k)
    from moe_gemm.cuda.launch import launch

    y, row_of = y.contiguous(), row_of.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    tokens, pieces = row_of.numel() // top_k, y.shape[1] // PIECE
    out = y.new_empty((tokens, y.shape[1]))
    if tokens:
        launch(_kernel(), tokens, min(THREADS, pieces), 0, y.data_ptr(), row_of.data_ptr(), weights.data_ptr(),
               out.data_ptr(), np.int32(top_k), np.int32(pieces),
               stream=torch.cuda.current_stream(y.device).cuda_stream)
    return out


@combine.register_fake
def _(y: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    return y.new_empty((row_of.shape[0] // top_k, y.shape[1]))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    y, row_of, weights, top_k = inputs
    ctx.save_for_backward(y, row_of, weights)
    ctx.top_k = top_k


def _backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
    y, row_of, weights = ctx.saved_tensors
    rows = row_of.view(-1, ctx.top_k)  # rows[t, j]: where token t's choice j is in y
    dout = dout.float()
    dy = dweights = None
    if ctx.needs_input_grad[0]:  # each row of y is one (token, choice): every row written once
        dy = y.new_empty(y.shape)
        for j in range(ctx.top_k):
            dy.index_copy_(0, rows[:, j], (weights[:, j, None].float() * dout).to(y.dtype))
    if ctx.needs_input_grad[2]:
        dweights = torch.stack([(y[rows[:, j]].float() * dout).sum(dim=1) for j in range(ctx.top_k)], dim=1)
        dweights = dweights.to(weights.dtype)
    return dy, None, dweights, None


combine.register_autograd(_backward, setup_context=_setup_context)
