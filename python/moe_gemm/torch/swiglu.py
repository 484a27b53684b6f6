"""SwiGLU and its backward on the product h = [gate | up] [M, 2I] of an MoE layer's first GEMM: the layer's own
pass (moe_gemm.torch.layer, moe_gemm.torch.experts) and what the fused kernels are checked against and fall back
to (moe_gemm.torch.ops, moe_gemm.torch.fused_backward). The backward runs as one kernel (kernels/swiglu_backward.cu,
:func:`dswiglu_pass`) where it can and has passed its GPU tests, else as torch operations
(:func:`dswiglu_torch`).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from moe_gemm.torch.kernels import NOT_YET_RUN, SWIGLU_BACKWARD, SWIGLU_BACKWARD_PENDING

THREADS = 256  # kernels/swiglu_backward.cu: __launch_bounds__(256)
PIECE = 8  # 16-bit values per 16-byte load: a thread's piece of a row
BLOCKS_PER_SM = 16  # the grid strides over the pieces with this many blocks per SM at most


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for h = [gate | up] [M, 2I], in h's dtype: its own pass over GEMM 1's output."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def dswiglu(dact: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU's backward from the saved pre-activation: (dh, act) for act = silu(gate) * up, h = [gate | up],
    dh = [dact * up * silu'(gate) | dact * silu(gate)] [M, 2I] and act [M, I] (what dW_down needs), in h's
    dtype: one kernel launch where :func:`runs_the_pass_kernel` says it can run (eagerly), else torch's
    operations (:func:`dswiglu_torch`)."""
    if not torch.compiler.is_compiling() and runs_the_pass_kernel(dact, h):
        return dswiglu_pass(dact, h)
    return dswiglu_torch(dact, h)


def pass_kernel_refusal(dact: torch.Tensor, h: torch.Tensor) -> str | None:
    """Why the one-pass kernel cannot take these inputs, or None: CUDA tensors of one 16-bit type on one device,
    dact [M, I] and h [M, 2I] contiguous, I a multiple of 8 (whole 16-byte pieces), fewer than 2^31 pieces."""
    if not (dact.is_cuda and h.is_cuda and dact.device == h.device):
        return "dact and h must be CUDA tensors on one device"
    if dact.dtype not in (torch.bfloat16, torch.float16) or h.dtype != dact.dtype:
        return f"dact and h must both be bf16 or both fp16, got {dact.dtype} and {h.dtype}"
    if dact.dim() != 2 or h.dim() != 2 or h.shape != (dact.shape[0], 2 * dact.shape[1]):
        return f"dact must be [M, I] and h [M, 2I], got {tuple(dact.shape)} and {tuple(h.shape)}"
    if dact.shape[1] % PIECE or dact.numel() // PIECE >= 2**31:
        return f"I must be a multiple of {PIECE} and M x I / {PIECE} under 2^31, got {tuple(dact.shape)}"
    if not (dact.is_contiguous() and h.is_contiguous()):
        return "dact and h must be contiguous"
    return None


def runs_the_pass_kernel(dact: torch.Tensor, h: torch.Tensor) -> bool:
    """Whether :func:`dswiglu` launches the kernel: it has passed its GPU tests (its record name is not in
    moe_gemm.torch.kernels.NOT_YET_RUN) and takes these inputs."""
    return SWIGLU_BACKWARD_PENDING not in NOT_YET_RUN and pass_kernel_refusal(dact, h) is None


@functools.cache
def _pass_kernel(element: str):
    from moe_gemm.cuda.nvrtc import compile_kernel

    return compile_kernel(*SWIGLU_BACKWARD[element])  # for the running GPU's architecture


@functools.cache
def _blocks_at_most(index: int) -> int:
    return BLOCKS_PER_SM * torch.cuda.get_device_properties(index).multi_processor_count


# --8<-- [start:dswiglu_pass]
def dswiglu_pass(dact: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dswiglu` as one launch of kernels/swiglu_backward.cu: dact and h read once, dh and act written once,
    each element in fp32 and rounded once (as k6's fused epilogue computes it). A ValueError names the rule
    these inputs break (pass_kernel_refusal)."""
    from moe_gemm.cuda.device import make_context_current
    from moe_gemm.cuda.launch import launch

    reason = pass_kernel_refusal(dact, h)
    if reason is not None:
        raise ValueError(f"dswiglu_pass: {reason}")
    dh, act = torch.empty_like(h), torch.empty_like(dact)
    pieces, index = dact.numel() // PIECE, dact.device.index
    if pieces:
        element = "bf16" if dact.dtype == torch.bfloat16 else "fp16"
        make_context_current(index)
        launch(_pass_kernel(element), min(-(-pieces // THREADS), _blocks_at_most(index)), THREADS, 0,
               dact.data_ptr(), h.data_ptr(), dh.data_ptr(), act.data_ptr(), np.int32(pieces),
               np.int32(dact.shape[1] // PIECE), stream=torch.cuda.current_stream(dact.device).cuda_stream,
               device=index)
    return dh, act
# --8<-- [end:dswiglu_pass]


# --8<-- [start:dswiglu]
def dswiglu_torch(dact: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dswiglu` by the operations torch's autograd runs for :func:`swiglu` (silu, its backward, two
    products), so the gradient is bit-identical to autograd's and no fp32 copy of h is made. Eagerly the halves
    of dh are written in place (no concatenation pass); under torch.compile they are concatenated."""
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
