"""``moe_gemm.torch.scaled_grouped_mm``: the FP8 grouped GEMM on k8 (chapter 10), as a torch op.

    out = scaled_grouped_mm(a, b, scale_a, scale_b, offs)   # [M_tot, N] bf16 (out_dtype: bf16 or fp32)

``a`` [M_tot, K] and ``b`` [E, K, N] are float8_e4m3fn, ``b`` the [E, K, N] view of a contiguous [E, N, K]
(``b_t.transpose(1, 2)``: FP8 wgmma reads B K-major, as torch._scaled_grouped_mm takes it too), ``offs`` the
int32 cumulative row ends on a's GPU. The scales' ranks say the scaling:

* **rowwise**, torch._scaled_grouped_mm's sm_90 form and arguments: ``scale_a`` [M_tot], ``scale_b`` [E, N];
  ``use_fast_accum=False`` promotes the tensor core's sums into fp32 every 128 of K, True lets it accumulate
  all of K (faster, less precise: chapter 10 measures both);
* **blockwise**, the DeepSeek-V3 recipe, in the layouts moe_gemm.torch.quantize writes: ``scale_a``
  [ceil(K / 128), M_pad] (1 x 128 groups, MN-major, M_pad = M_tot rounded up to 4) and ``scale_b``
  [E, ceil(N / 128), ceil(K / 128)] (128 x 128 blocks); always promoted.

The op is ``torch.ops.moe_gemm.scaled_grouped_mm`` with a fake implementation, so torch.compile traces through
it, and a CUDA graph can hold it: k8 reads ``offs`` on the device and clamps every end into [0, M_tot]. Inputs
k8 cannot take (moe_gemm.torch.rules.route_scaled) go to torch, with one warning per reason: rowwise to
torch._scaled_grouped_mm where it runs, else (blockwise, or on the CPU) to the product of the dequantized
values in fp32, expert by expert, which reads ``offs`` on the host. Malformed inputs raise a ValueError before
any launch.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from moe_gemm.model.quantize import BLOCK
from moe_gemm.torch import rules
from moe_gemm.torch.launches import TensorMapLaunches

BLOCKWISE_CONFIG = "k8/blockwise-bm128"
ROWWISE_CONFIG, ROWWISE_FAST_CONFIG = "k8/rowwise-bm128", "k8/rowwise-fast-bm128"
_warned: set[str] = set()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def operands(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
             out_dtype: torch.dtype, *, meta: bool = False) -> rules.ScaledOperands:
    tensors = (a, b, scale_a, scale_b)
    real = {} if meta else {"capability": torch.cuda.get_device_capability(a.device) if a.is_cuda else None,
                            "addresses": tuple(t.data_ptr() for t in tensors)}
    return rules.ScaledOperands(
        a_shape=tuple(a.shape), a_strides=a.stride(), a_dtype=_name(a.dtype), b_shape=tuple(b.shape),
        b_strides=b.stride(), b_dtype=_name(b.dtype), scale_a_shape=tuple(scale_a.shape),
        scale_a_strides=scale_a.stride(), scale_a_dtype=_name(scale_a.dtype), scale_b_shape=tuple(scale_b.shape),
        scale_b_strides=scale_b.stride(), scale_b_dtype=_name(scale_b.dtype), offs_shape=tuple(offs.shape),
        offs_dtype=_name(offs.dtype), out_dtype=_name(out_dtype),
        devices=tuple(str(t.device) for t in (*tensors, offs)), **real)


def dequantized(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The real values the product multiplies, in fp32: a [M_tot, K] and b [E, K, N] times their scales."""
    (tokens, K), (_, _, N) = a.shape, b.shape
    if scale_a.dim() == 1:  # rowwise
        return a.float() * scale_a[:, None], b.float() * scale_b[:, None, :]
    rows = scale_a[:, :tokens].t().repeat_interleave(BLOCK, dim=1)[:, :K]
    blocks = scale_b.transpose(1, 2).repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)[:, :K, :N]
    return a.float() * rows, b.float() * blocks


def reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """The dequantized product in fp32, expert by expert (offs read on the host); rows past offs[-1] are left as
    torch.empty left them."""
    a_real, b_real = dequantized(a, b, scale_a, scale_b)
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (a_real[start:end] @ b_real[e]).to(out_dtype)
        start = end
    return out


def _fallback(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
              out_dtype: torch.dtype, use_fast_accum: bool, reason: str) -> torch.Tensor:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"moe_gemm.torch.scaled_grouped_mm runs torch instead: {reason}", stacklevel=4)
    if scale_a.dim() == 1 and a.is_cuda and out_dtype == torch.bfloat16 and hasattr(torch, "_scaled_grouped_mm"):
        try:
            return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=out_dtype,
                                            use_fast_accum=use_fast_accum)
        except RuntimeError:  # torch's own rules refuse it too (layout, alignment, GPU): the reference answers
            pass
    return reference(a, b, scale_a, scale_b, offs, out_dtype)


@functools.cache
def _k8(config: str, out: str) -> Any:
    """One K8Fp8 per configuration and output type: compile() keeps its answer on it."""
    from moe_gemm.variants.k8 import K8Fp8
    from moe_gemm.variants.k8.config import LADDER

    return K8Fp8(config, LADDER[config].replace(out=out))


@functools.lru_cache(maxsize=256)
def _runner(config: str, out: str, index: int, tokens: int, experts: int, K: int, N: int) -> TensorMapLaunches:
    """k8 on one shape, configuration and GPU, launched on (a, b, scale_a, scale_b, out, offs): four tensor maps
    per pointer set."""
    from moe_gemm.variants.k8 import arguments
    from moe_gemm.variants.k8.config import THREADS

    return TensorMapLaunches(_k8(config, out), arguments, THREADS, index, (tokens, experts, K, N))


def _scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       offs: torch.Tensor, out_dtype: torch.dtype | None = None,
                       use_fast_accum: bool = False) -> torch.Tensor:
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    offs = offs.contiguous()  # the kernel reads offs[e] at offs + 4e
    op = operands(a, b, scale_a, scale_b, offs, out_dtype)
    route = rules.route_scaled(op)
    if route.reason is not None:
        return _fallback(a, b, scale_a, scale_b, offs, out_dtype, use_fast_accum, route.reason)
    (tokens, K), (experts, _, N) = a.shape, b.shape
    out = torch.empty((tokens, N), dtype=out_dtype, device=a.device)
    if tokens == 0:
        return out
    config = (BLOCKWISE_CONFIG if op.scaling == "blockwise" else ROWWISE_FAST_CONFIG if use_fast_accum
              else ROWWISE_CONFIG)
    _runner(config, route.out, a.device.index, tokens, experts, K, N)(a, b, scale_a, scale_b, out, offs)
    return out


# --8<-- [start:op]
_library = torch.library.Library("moe_gemm", "FRAGMENT")
_library.define("scaled_grouped_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, "
                "ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor")


def _fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, offs: torch.Tensor,
          out_dtype: torch.dtype | None = None, use_fast_accum: bool = False) -> torch.Tensor:
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    rules.check_scaled(operands(a, b, scale_a, scale_b, offs, out_dtype, meta=True))
    return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype)


for _device in ("CUDA", "CPU"):  # the CPU's: the rules send it to the reference
    _library.impl("scaled_grouped_mm", _scaled_grouped_mm, _device)
torch.library.register_fake("moe_gemm::scaled_grouped_mm", _fake, lib=_library)
# --8<-- [end:op]


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offs: torch.Tensor, out_dtype: torch.dtype | None = None,
                      use_fast_accum: bool = False) -> torch.Tensor:
    """C [M_tot, N] = the product of the dequantized e4m3 operands, expert by expert (module docstring), in
    ``out_dtype`` (None: bf16; or fp32)."""
    return torch.ops.moe_gemm.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype, use_fast_accum)
