"""Chapter 10's quantizers as torch functions, in the layouts the FP8 GEMM's loads read:

    q, scale = quantize_1x128(x)        # x [M, K] bf16 -> q [M, K] e4m3; scale [ceil(K / 128), M_pad], MN-major
    q, scale = swiglu_quantize_1x128(h) # h [M, 2I] = [gate | up] bf16 -> silu(gate) x up as above, [M, I]
    qb, sb = quantize_128x128_t(b)      # b [E, K, N] bf16 -> qb [E, N, K] e4m3; sb [E, ceil(N/128), ceil(K/128)]

``scale[kb, m]`` belongs to row m's columns 128 kb .. 128 kb + 127; M_pad is M rounded up to 4 (the
padding's entries are unused). ``sb[e, nb, kb]`` belongs to the 128 x 128 block of b[e] at rows 128 kb
and columns 128 nb; ``qb`` is written transposed because FP8 wgmma reads B K-major. On an sm_89-or-newer
GPU each is one launch of kernels/k8_quantize.cu; elsewhere the numpy reference
(moe_gemm.model.quantize) computes the same bits.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from moe_gemm.model.quantize import BLOCK, padded_rows, quantize
from moe_gemm.torch import rules
from moe_gemm.torch.kernels import (
    PIECES,  # a block of THREADS quantizes 16 x PIECES groups
    QUANTIZE,
    QUANTIZE_STEPS,
    QUANTIZE_WEIGHTS,
    QUANTIZE_WEIGHTS_STEPS,
    SWIGLU_QUANTIZE,
    quantize_instance,
    weights_instance,
)

THREADS = 256  # kernels/k8_quantize.cu: __launch_bounds__(256), 16 threads per group of 128
LANES = 16
PIECE = 8  # bf16 elements per 16-byte load
MAX_GROUPS = 2**31  # the activation quantizers index groups in 32 bits


def _check(x: torch.Tensor, name: str = "quantize_1x128", halves: int = 1) -> None:
    """ValueError unless ``x`` is a contiguous 2-D bf16 tensor of ``halves`` halves each PIECE-aligned (TypeError
    unless a tensor)."""
    rules.check_tensors(name, torch.Tensor, x=x)
    if x.dim() != 2:
        raise ValueError(f"{name}: x must be 2-D [M, {'2I' if halves == 2 else 'K'}], got shape {tuple(x.shape)}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"{name}: x must be bf16, got {x.dtype}")
    if x.shape[1] % (halves * PIECE):
        width = "its width 2I" if halves == 2 else "K"
        raise ValueError(f"{name}: {width} = {x.shape[1]} must be a multiple of {halves * PIECE} (16-byte pieces"
                         f"{' of each half' if halves == 2 else ''})")
    if not x.is_contiguous():
        raise ValueError(f"{name}: x must be row-major (contiguous)")


@functools.cache
def _kernel(name: str):
    from moe_gemm.cuda.nvrtc import compile_kernel

    return compile_kernel(QUANTIZE[0], name)


def _on_fp8_gpu(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 9)


def _e4m3(q: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(q).view(np.uint8)).view(torch.float8_e4m3fn).to(device)


def _laid_out(values: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The numpy reference's bits for fp32 ``values`` [M, K], in quantize_1x128's layout."""
    q, scale = quantize(values, (1, BLOCK))
    laid_out = np.ones((scale.shape[1], padded_rows(values.shape[0])), dtype=np.float32)
    laid_out[:, :values.shape[0]] = scale.T
    return _e4m3(q, device), torch.from_numpy(laid_out).to(device)


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The numpy reference's bits in quantize_1x128's layout."""
    return _laid_out(x.float().cpu().numpy(), x.device)


def swiglu_reference(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """swiglu_quantize_1x128 in numpy: silu(gate) x up in fp32 (gate / (1 + e^-gate)), then the 1 x 128
    quantization. The GPU's expf and numpy's exp may differ in the last bit, so a kernel's e4m3 value can sit
    one step away where the activation lands next to a rounding boundary (tests/test_quantize_gpu.py)."""
    gate, up = np.split(h.float().cpu().numpy(), 2, axis=1)
    return _laid_out((gate / (np.float32(1) + np.exp(-gate)) * up).astype(np.float32), h.device)


def _launch_1x128(kernel: str, x: torch.Tensor, width: int, pieces: int = PIECES) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of an activation quantizer (its instance's name) writing q [M, width] and its MN-major scales;
    ``pieces``: the instance's pieces per thread."""
    from moe_gemm.cuda.device import make_context_current
    from moe_gemm.cuda.launch import launch

    M = x.shape[0]
    k_blocks = -(-width // BLOCK)
    groups = M * k_blocks
    if groups >= MAX_GROUPS:
        raise ValueError(f"{kernel}: {M:,} rows of {k_blocks:,} groups of {BLOCK} are {groups:,} groups; the kernel "
                         f"indexes fewer than 2^31")
    q = torch.empty((M, width), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.ones((k_blocks, padded_rows(M)), dtype=torch.float32, device=x.device)
    if groups:
        make_context_current(x.device.index)
        launch(_kernel(kernel), -(-groups // (THREADS // LANES * pieces)), THREADS, 0, x.data_ptr(), q.data_ptr(),
               scale.data_ptr(), np.int32(M), np.int32(width), np.int32(padded_rows(M)),
               stream=torch.cuda.current_stream(x.device).cuda_stream, device=x.device.index)
    return q, scale


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values of x [M, K] (bf16, K a multiple of 8, row-major) in 1 x 128 groups along K, and their
    fp32 scales [ceil(K / 128), M_pad], MN-major (module docstring). A ValueError for anything else."""
    _check(x)
    if not _on_fp8_gpu(x):
        return reference(x)
    return _launch_1x128(QUANTIZE[1], x, x.shape[1])


def quantize_1x128_step(x: torch.Tensor, step: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_1x128 by one of the activation quantizer's earlier steps (moe_gemm.torch.kernels.QUANTIZE_STEPS: the
    same bits, slower), which chapter 10 times beside it; on a GPU of compute capability 8.9 or newer only."""
    _check(x)
    pieces, divide_once = _step_flags("quantize_1x128_step", QUANTIZE_STEPS, step, "x", x)
    return _launch_1x128(quantize_instance(pieces, divide_once), x, x.shape[1], pieces)


def _step_flags(function: str, steps: dict[str, tuple], step: str, name: str, t: torch.Tensor) -> tuple:
    """The template arguments of ``step`` (one of ``steps``: a quantizer's earlier versions) for ``function``'s
    input ``name``, ``t``; a ValueError for another name or a tensor off a GPU that converts to e4m3."""
    if step not in steps:
        raise ValueError(f"{function}: step must be one of {sorted(steps)}, got {step!r}")
    if not _on_fp8_gpu(t):
        raise ValueError(f"{function}: {name} must be on a GPU of compute capability 8.9 or newer")
    return steps[step]


def swiglu_quantize_1x128(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation silu(gate) x up of h = [gate | up] [M, 2I] (bf16, I a multiple of 8, row-major: GEMM 1's
    output), quantized as quantize_1x128 quantizes: q [M, I] e4m3 and scales [ceil(I / 128), M_pad]. One pass
    over h; the activation is never written in bf16 (kernels/k8_quantize.cu, swiglu_quantize_1x128)."""
    _check(h, "swiglu_quantize_1x128", halves=2)
    if not _on_fp8_gpu(h):
        return swiglu_reference(h)
    return _launch_1x128(SWIGLU_QUANTIZE[1], h, h.shape[1] // 2)


def _check_weights(b: torch.Tensor) -> None:
    rules.check_tensors("quantize_128x128_t", torch.Tensor, b=b)
    if b.dim() != 3:
        raise ValueError(f"quantize_128x128_t: b must be 3-D [E, K, N], got shape {tuple(b.shape)}")
    if b.dtype != torch.bfloat16:
        raise ValueError(f"quantize_128x128_t: b must be bf16, got {b.dtype}")
    _, K, N = b.shape
    if K % 16 or N % PIECE:
        raise ValueError(f"quantize_128x128_t: K = {K} must be a multiple of 16 and N = {N} of {PIECE} (16-byte rows "
                         f"of q and of b)")
    if not b.is_contiguous():
        raise ValueError("quantize_128x128_t: b must be contiguous [E, K, N]")


def weights_reference(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The numpy reference's bits, expert by expert, in quantize_128x128_t's layout."""
    experts, K, N = b.shape
    q = np.zeros((experts, N, K), dtype=np.uint8)
    scale = np.zeros((experts, -(-N // BLOCK), -(-K // BLOCK)), dtype=np.float32)
    for e, w in enumerate(b.float().cpu().numpy()):
        q_e, scale_e = quantize(w, (BLOCK, BLOCK))
        q[e], scale[e] = q_e.view(np.uint8).T, scale_e.T
    return _e4m3(q, b.device), torch.from_numpy(scale).to(b.device)


def quantize_128x128_t(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values of the weights b [E, K, N] (bf16, contiguous, K % 16 == 0, N % 8 == 0) in 128 x 128 blocks,
    transposed to [E, N, K], and their fp32 scales [E, ceil(N / 128), ceil(K / 128)] (module docstring)."""
    _check_weights(b)
    if not _on_fp8_gpu(b):
        return weights_reference(b)
    return _launch_128x128_t(QUANTIZE_WEIGHTS[1], b)


def quantize_128x128_t_step(b: torch.Tensor, step: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_128x128_t by one of the weights' quantizer's earlier steps (moe_gemm.torch.kernels.
    QUANTIZE_WEIGHTS_STEPS: the same bits, slower), which chapter 10 times beside it; on a GPU of compute capability
    8.9 or newer only."""
    _check_weights(b)
    return _launch_128x128_t(weights_instance(*_step_flags("quantize_128x128_t_step", QUANTIZE_WEIGHTS_STEPS, step,
                                                           "b", b)), b)


def _launch_128x128_t(kernel: str, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from moe_gemm.cuda.device import make_context_current
    from moe_gemm.cuda.launch import launch

    experts, K, N = b.shape
    q = torch.empty((experts, N, K), dtype=torch.float8_e4m3fn, device=b.device)
    scale = torch.empty((experts, -(-N // BLOCK), -(-K // BLOCK)), dtype=torch.float32, device=b.device)
    if q.numel():
        make_context_current(b.device.index)
        launch(_kernel(kernel), (scale.shape[1], scale.shape[2], experts), THREADS, 0, b.data_ptr(),
               q.data_ptr(), scale.data_ptr(), np.int32(K), np.int32(N),
               stream=torch.cuda.current_stream(b.device).cuda_stream, device=b.device.index)
    return q, scale
