"""What ``moe_gemm.torch.grouped_mm`` takes, and which kernel runs it: plain Python on shapes, strides
and dtypes, so that the rules are tested without torch or a GPU.

Two kinds of answer:

* a **ValueError** naming the rule, for inputs that are malformed for any grouped GEMM (ranks, K
  that does not match, offs of the wrong length or dtype or on another device than a): raised before
  any launch, where torch._grouped_mm's own checks raise (a kernel given offs in host memory would
  read host addresses on the GPU); an argument that is no tensor at all is a TypeError
  (:func:`check_tensors`), as torch's own ops answer;
* a :class:`Route`: our kernel (k6, device-walked, B in either layout, bf16 or fp16 in, the input's
  dtype or fp32 out), or torch._grouped_mm with the reason ours cannot take the inputs (fp32 operands,
  K not a multiple of 64, a GPU other than sm_90a, ...). The op warns once per reason. What k6 itself
  takes (shapes, strides, addresses) is k6's to say: moe_gemm.variants.k6.rules, which the harness's
  variants ask too.

The weight gradient dB[e] = a[rows of e]^T dc[rows of e] (``moe_gemm.torch.weight_grad``, the op's
backward) has rules of its own in the same two kinds: :func:`check_weight_grad` and
:func:`route_weight_grad`, k7 or torch._grouped_mm's 2D x 2D form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moe_gemm.model.quantize import BLOCK, padded_rows
from moe_gemm.model.reference import SWIGLU_BLOCK
from moe_gemm.variants.k6.rules import b_layout, refusals
from moe_gemm.variants.k7.config import refusals as k7_refusals
from moe_gemm.variants.sm90.config import REQUIRED_CAPABILITY as SM90A
from moe_gemm.variants.sm90.maps import other_target


@dataclass(frozen=True)
class Operands:
    """What the rules look at: shapes, strides (in elements), dtypes (torch's names, e.g. 'bfloat16')."""

    a_shape: Sequence[int]
    a_strides: Sequence[int]
    a_dtype: str
    b_shape: Sequence[int]
    b_strides: Sequence[int]
    b_dtype: str
    offs_shape: Sequence[int]
    offs_dtype: str
    out_dtype: str = "bfloat16"
    a_device: str = "cuda:0"  # torch's names, e.g. 'cuda:1', 'cpu'
    b_device: str = "cuda:0"
    offs_device: str = "cuda:0"
    capability: tuple[int, int] | None = SM90A
    a_address: int = 0
    b_address: int = 0


# The (operands, output) dtypes k6 runs, by torch's names, and k6's names for them (K6Config.element, .out):
# wgmma takes bf16 and fp16 at one rate; the epilogue rounds to the operands' type or keeps fp32.
K6_ELEMENTS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
K6_TYPES = {("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"), ("float16", "float32")}


@dataclass(frozen=True)
class Route:
    kernel: str  # "k6", "k7" (the weight gradient) or "torch"
    b_layout: str | None = None  # "kn": B [E, K, N] row-major; "nk": each B[e] column-major (B^T row-major)
    reason: str | None = None  # why torch._grouped_mm runs instead
    element: str | None = None  # k6's operand type, "bf16" or "fp16"
    out: str | None = None  # k6's output type, "bf16", "fp16" or "fp32"


GROUPED_MM_TYPES = ("bfloat16", "float16", "float32")  # the op's types: ours take the first two, torch all three


def check_tensors(op: str, tensor_type: type, **named: object) -> None:
    """TypeError naming the first of ``named`` that is not a ``tensor_type`` (torch.Tensor, passed in so that the
    rules stay torch-free): None, a list of row ends or a numpy array would otherwise fail deep inside the op with
    an AttributeError, or in torch's dispatcher with its schema."""
    for what, value in named.items():
        if not isinstance(value, tensor_type):
            raise TypeError(f"{op}: {what} must be a torch.Tensor, got {type(value).__name__}")


def check_types(op: str, *named: tuple[str, str]) -> None:
    """ValueError naming the first of ``named`` (what, dtype) whose dtype is not one of GROUPED_MM_TYPES."""
    for what, dtype in named:
        if dtype not in GROUPED_MM_TYPES:
            raise ValueError(f"{op}: {what} must be one of {', '.join(GROUPED_MM_TYPES)} (torch._grouped_mm's "
                             f"types), got {dtype}")


def check(op: Operands) -> None:
    """ValueError naming the first rule of a 2D x 3D grouped GEMM these operands break."""
    if len(op.a_shape) != 2:
        raise ValueError(f"grouped_mm: a must be 2-D [M_tot, K], got {len(op.a_shape)}-D {tuple(op.a_shape)}")
    if len(op.b_shape) != 3:
        raise ValueError(f"grouped_mm: b must be 3-D [E, K, N], got {len(op.b_shape)}-D {tuple(op.b_shape)}")
    if len(op.offs_shape) != 1:
        raise ValueError(f"grouped_mm: offs must be 1-D [E], got {len(op.offs_shape)}-D {tuple(op.offs_shape)}")
    experts, k_b, n = op.b_shape
    if k_b < 1 or n < 1:  # torch._grouped_mm refuses them too, and k6 would run with no K step to load
        raise ValueError(f"grouped_mm: K and N must be >= 1, got K = {k_b}, N = {n}")
    if op.a_shape[1] != k_b:
        raise ValueError(f"grouped_mm: a's K ({op.a_shape[1]}) must equal b's K ({k_b}): a [M_tot, K], b [E, K, N]")
    if op.offs_shape[0] != experts:
        raise ValueError(f"grouped_mm: offs must hold one cumulative row end per expert ({experts}), got "
                         f"{op.offs_shape[0]}")
    if op.offs_dtype != "int32":
        raise ValueError(f"grouped_mm: offs must be int32 (the cumulative row ends), got {op.offs_dtype}")
    if op.b_device != op.a_device or op.offs_device != op.a_device:
        raise ValueError(f"grouped_mm: b and offs must be on a's device ({op.a_device}), got b on {op.b_device} "
                         f"and offs on {op.offs_device}")
    if op.a_dtype != op.b_dtype:
        raise ValueError(f"grouped_mm: a and b must share a dtype, got {op.a_dtype} and {op.b_dtype}")
    check_types("grouped_mm", ("a and b", op.a_dtype), ("out_dtype", op.out_dtype))


def check_offsets(ends: Sequence[int], tokens: int) -> None:
    """ValueError unless the row ends are non-decreasing from 0 and end at or below M_tot (values read
    from the device: the op does this only when asked, eagerly and not capturing). Ending below M_tot
    is legal, as in torch._grouped_mm: rows past offs[-1] belong to no expert and are not written."""
    previous = 0
    for e, end in enumerate(ends):
        if end < previous:
            raise ValueError(f"grouped_mm: offs must be non-decreasing from 0; offs[{e}] = {end} after {previous}")
        previous = end
    if previous > tokens:
        raise ValueError(f"grouped_mm: offs must end at or below M_tot = {tokens} (a's rows), ends at {previous}")


SWIGLU_COLUMNS = 2 * SWIGLU_BLOCK  # one 64-column gate block and its up block: k6's fused epilogue's BN


def route(op: Operands, epilogue: str = "none") -> Route:
    """Our kernel when it can take these operands, else torch._grouped_mm and the reason.
    ``epilogue="swiglu"``: the first GEMM of an MoE layer with k6's fused SwiGLU epilogue; ``"dswiglu"``: the
    dA GEMM of its second, dY W_down^T, with the SwiGLU's backward fused (b is W_down [E, I, H] transposed)."""
    check(op)
    experts, K, N = op.b_shape
    reasons = []
    if epilogue == "dswiglu":
        if b_layout(op.b_shape, op.b_strides) != "nk":
            reasons.append("the fused SwiGLU backward reads W_down [E, I, H] as stored (b = w_down.transpose(1, 2))")
        if op.out_dtype != op.a_dtype:
            reasons.append(f"the fused SwiGLU backward writes dh in the operands' dtype ({op.a_dtype}), not "
                           f"{op.out_dtype}")
    if epilogue == "swiglu":
        if N % SWIGLU_COLUMNS:
            raise ValueError(f"grouped_mm_swiglu: N = {N} must be a multiple of {SWIGLU_COLUMNS} (each fused "
                             f"tile pairs 64 gate columns with the 64 up columns N / 2 further)")
        if b_layout(op.b_shape, op.b_strides) == "nk":
            reasons.append("the fused SwiGLU epilogue reads B [E, K, N] row-major only")
    if not op.a_device.startswith("cuda"):
        reasons.append(f"the tensors are on {op.a_device}, not a CUDA GPU")
    elif (have := other_target(op.capability)) is not None:
        reasons.append(f"our kernels need an sm_90a GPU (wgmma); this is {have}")
    if (op.a_dtype, op.out_dtype) not in K6_TYPES:
        reasons.append(f"our kernels take bf16 or fp16 in and the same or fp32 out, got {op.a_dtype} in, "
                       f"{op.out_dtype} out")
    reasons += refusals(experts, K, N, op.a_strides, op.b_strides, op.a_address, op.b_address)
    if reasons:
        return Route("torch", reason="; ".join(reasons))
    return Route("k6", b_layout=b_layout(op.b_shape, op.b_strides), element=K6_ELEMENTS[op.a_dtype],
                 out=K6_ELEMENTS[op.out_dtype])


# --8<-- [start:weight_grad]
@dataclass(frozen=True)
class GradOperands:
    """The weight gradient's view of the tensors: a [M_tot, K] and dc [M_tot, N] (the forward's input and
    its output's gradient, rows grouped by expert), offs [E], out dB [E, K, N] in ``out_dtype``."""

    a_shape: Sequence[int]
    a_strides: Sequence[int]
    a_dtype: str
    dc_shape: Sequence[int]
    dc_strides: Sequence[int]
    dc_dtype: str
    offs_shape: Sequence[int]
    offs_dtype: str
    out_dtype: str = "bfloat16"
    a_device: str = "cuda:0"
    dc_device: str = "cuda:0"
    offs_device: str = "cuda:0"
    capability: tuple[int, int] | None = SM90A
    a_address: int = 0
    dc_address: int = 0
    accumulate: bool = False  # dB += A^T dC into an existing fp32 dB


def check_weight_grad(op: GradOperands) -> None:
    """ValueError naming the first rule of dB[e] = a[rows of e]^T dc[rows of e] these operands break."""
    if len(op.a_shape) != 2 or len(op.dc_shape) != 2:
        raise ValueError(f"weight_grad: a and dc must be 2-D [M_tot, K] and [M_tot, N], got {tuple(op.a_shape)} "
                         f"and {tuple(op.dc_shape)}")
    if op.a_shape[0] != op.dc_shape[0]:
        raise ValueError(f"weight_grad: a and dc must have the same rows (M_tot), got {op.a_shape[0]} and "
                         f"{op.dc_shape[0]}")
    if len(op.offs_shape) != 1 or op.offs_shape[0] < 1:
        raise ValueError(f"weight_grad: offs must be 1-D with one cumulative row end per expert (at least one), "
                         f"got shape {tuple(op.offs_shape)}")
    if op.offs_dtype != "int32":
        raise ValueError(f"weight_grad: offs must be int32 (the cumulative row ends), got {op.offs_dtype}")
    if op.dc_device != op.a_device or op.offs_device != op.a_device:
        raise ValueError(f"weight_grad: dc and offs must be on a's device ({op.a_device}), got dc on "
                         f"{op.dc_device} and offs on {op.offs_device}")
    if op.a_dtype != op.dc_dtype:
        raise ValueError(f"weight_grad: a and dc must share a dtype, got {op.a_dtype} and {op.dc_dtype}")
    check_types("weight_grad", ("a and dc", op.a_dtype), ("the output", op.out_dtype))
    if op.accumulate and op.out_dtype != "float32":
        raise ValueError(f"weight_grad: accumulate=True adds into an fp32 out (a 16-bit sum would round at every "
                         f"micro-batch), got out of {op.out_dtype}")


def route_weight_grad(op: GradOperands) -> Route:
    """k7 when it can take these operands (kernels/k7_weight_grad.cu), else torch._grouped_mm's 2D x 2D form
    and the reason."""
    check_weight_grad(op)
    (_, K), (_, N), experts = op.a_shape, op.dc_shape, op.offs_shape[0]
    reasons = []
    if not op.a_device.startswith("cuda"):
        reasons.append(f"the tensors are on {op.a_device}, not a CUDA GPU")
    elif (have := other_target(op.capability)) is not None:
        reasons.append(f"our kernels need an sm_90a GPU (wgmma); this is {have}")
    if (op.a_dtype, op.out_dtype) not in K6_TYPES:
        reasons.append(f"our kernels take bf16 or fp16 in and the same or fp32 out, got {op.a_dtype} in, "
                       f"{op.out_dtype} out")
    if tuple(op.a_strides) != (K, 1) or tuple(op.dc_strides) != (N, 1):
        reasons.append(f"a and dc must be row-major (strides ({K}, 1) and ({N}, 1)), got {tuple(op.a_strides)} "
                       f"and {tuple(op.dc_strides)}")
    reasons += k7_refusals(experts, K, N, op.a_address, op.dc_address)
    if reasons:
        return Route("torch", reason="; ".join(reasons))
    return Route("k7", element=K6_ELEMENTS[op.a_dtype], out=K6_ELEMENTS[op.out_dtype])
# --8<-- [end:weight_grad]


# --8<-- [start:scaled]
@dataclass(frozen=True)
class ScaledOperands:
    """The FP8 grouped GEMM's view of the tensors (``moe_gemm.torch.scaled_grouped_mm``): a [M_tot, K] and b
    [E, K, N] in e4m3, offs [E], and the scales, whose ranks say the scaling: rowwise scale_a [M_tot] and
    scale_b [E, N] (torch._scaled_grouped_mm's sm_90 form); blockwise scale_a [ceil(K/128), M_pad] (MN-major,
    M_pad = M_tot rounded up to 4) and scale_b [E, ceil(N/128), ceil(K/128)], as moe_gemm.torch.quantize writes
    them."""

    a_shape: Sequence[int]
    a_strides: Sequence[int]
    a_dtype: str
    b_shape: Sequence[int]
    b_strides: Sequence[int]
    b_dtype: str
    scale_a_shape: Sequence[int]
    scale_a_strides: Sequence[int]
    scale_a_dtype: str
    scale_b_shape: Sequence[int]
    scale_b_strides: Sequence[int]
    scale_b_dtype: str
    offs_shape: Sequence[int]
    offs_dtype: str
    out_dtype: str = "bfloat16"
    devices: Sequence[str] = ("cuda:0",) * 5  # a, b, scale_a, scale_b, offs
    capability: tuple[int, int] | None = SM90A
    addresses: Sequence[int] = (0,) * 4  # a, b, scale_a, scale_b

    @property
    def scaling(self) -> str:
        return "rowwise" if len(self.scale_a_shape) == 1 else "blockwise"


FP8_OUT_DTYPES = ("bfloat16", "float32")


def _scale_shapes(scaling: str, tokens: int, experts: int, K: int, N: int) -> tuple[tuple[int, ...], ...]:
    if scaling == "rowwise":
        return (tokens,), (experts, N)
    blocks = -(-K // BLOCK)
    return (blocks, padded_rows(tokens)), (experts, -(-N // BLOCK), blocks)


def check_scaled(op: ScaledOperands) -> None:
    """ValueError naming the first rule of the FP8 grouped GEMM these operands break."""
    name = "scaled_grouped_mm"
    if len(op.a_shape) != 2 or len(op.b_shape) != 3:
        raise ValueError(f"{name}: a must be 2-D [M_tot, K] and b 3-D [E, K, N], got {tuple(op.a_shape)} and "
                         f"{tuple(op.b_shape)}")
    (tokens, K), (experts, k_b, N) = op.a_shape, op.b_shape
    if K != k_b or K < 1 or N < 1:
        raise ValueError(f"{name}: a [M_tot, K] and b [E, K, N] must share K >= 1 and have N >= 1, got K = {K} and "
                         f"{k_b}, N = {N}")
    if op.a_dtype != "float8_e4m3fn" or op.b_dtype != "float8_e4m3fn":
        raise ValueError(f"{name}: a and b must be float8_e4m3fn, got {op.a_dtype} and {op.b_dtype}")
    if len(op.offs_shape) != 1 or op.offs_shape[0] != experts or op.offs_dtype != "int32":
        raise ValueError(f"{name}: offs must be int32 [E] = [{experts}] (the cumulative row ends), got "
                         f"{op.offs_dtype} {tuple(op.offs_shape)}")
    if len(set(op.devices)) != 1:
        raise ValueError(f"{name}: a, b, scale_a, scale_b and offs must be on one device, got {', '.join(op.devices)}")
    if op.out_dtype not in FP8_OUT_DTYPES:
        raise ValueError(f"{name}: out_dtype must be bfloat16 or float32, got {op.out_dtype}")
    if len(op.scale_a_shape) not in (1, 2):
        raise ValueError(f"{name}: scale_a must be 1-D [M_tot] (rowwise) or 2-D [ceil(K / 128), M_pad] (blockwise), "
                         f"got {tuple(op.scale_a_shape)}")
    want_a, want_b = _scale_shapes(op.scaling, tokens, experts, K, N)
    if tuple(op.scale_a_shape) != want_a or tuple(op.scale_b_shape) != want_b:
        raise ValueError(f"{name}: {op.scaling} scales must be scale_a {list(want_a)} and scale_b {list(want_b)}, "
                         f"got {list(op.scale_a_shape)} and {list(op.scale_b_shape)}")
    if op.scale_a_dtype != "float32" or op.scale_b_dtype != "float32":
        raise ValueError(f"{name}: the scales must be float32, got {op.scale_a_dtype} and {op.scale_b_dtype}")


def route_scaled(op: ScaledOperands, epilogue: str = "store") -> Route:
    """k8 when it can take these operands (kernels/k8_fp8.cu; ``epilogue``: its store or its SwiGLU), else torch
    (rowwise: torch._scaled_grouped_mm; blockwise, which torch has no kernel for on sm_90: the dequantized
    product) and the reason."""
    from moe_gemm.variants.k8.config import refusals as k8_refusals

    check_scaled(op)
    (_, K), (experts, _, N) = op.a_shape, op.b_shape
    reasons = []
    if not k8_passed_on_gpu():
        reasons.append("k8 has not passed its GPU tests yet (chapter 10)")
    if not op.devices[0].startswith("cuda"):
        reasons.append(f"the tensors are on {op.devices[0]}, not a CUDA GPU")
    elif (have := other_target(op.capability)) is not None:
        reasons.append(f"our kernels need an sm_90a GPU (wgmma); this is {have}")
    if tuple(op.a_strides) != (K, 1):
        reasons.append(f"a must be row-major (strides ({K}, 1)), got {tuple(op.a_strides)}")
    if tuple(op.b_strides) != (N * K, 1, K):
        reasons.append(f"b must be the [E, K, N] view of a contiguous [E, N, K] (strides ({N * K}, 1, {K}): FP8 "
                       f"wgmma reads B K-major), got {tuple(op.b_strides)}")
    contiguous = (tuple(op.scale_a_strides) == ((1,) if op.scaling == "rowwise" else (op.scale_a_shape[1], 1))
                  and tuple(op.scale_b_strides) == tuple(_contiguous_strides(op.scale_b_shape)))
    if not contiguous:
        reasons.append("the scales must be contiguous")
    reasons += k8_refusals(experts, K, N, op.addresses[0], op.addresses[1], epilogue=epilogue)
    if any(address % 8 for address in op.addresses[2:]):  # k8 reads rowwise B's scales as 8-byte pairs
        reasons.append("the scales must start on 8-byte boundaries")
    if reasons:
        return Route("torch", reason="; ".join(reasons))
    return Route("k8", out="bf16" if op.out_dtype == "bfloat16" else "fp32")


def route_swiglu(op: ScaledOperands) -> Route:
    """GEMM 1 of the FP8 layer with its SwiGLU (moe_gemm.torch.scaled.swiglu_scaled_grouped_mm): b is
    [W_gate | W_up] [E, K, 2I], the scales blockwise. k8's SwiGLU kernel where route_scaled would take k8 and I is
    a multiple of 128; else the blockwise product then the separate SwiGLU pass, and the reason. A ValueError for
    operands no path takes."""
    name = "swiglu_scaled_grouped_mm"
    check_scaled(op)
    if op.scaling != "blockwise":
        raise ValueError(f"{name}: the scales must be blockwise (scale_a [ceil(K / 128), M_pad], scale_b "
                         f"[E, ceil(2I / 128), ceil(K / 128)]): GEMM 2 reads the activation in 1 x 128 groups")
    N = op.b_shape[2]
    if N % 16:
        raise ValueError(f"{name}: b's N = 2I = {N} must be [gate | up] with I a multiple of 8 (16-byte pieces of "
                         f"each half)")
    return route_scaled(op, epilogue="swiglu")


def k8_passed_on_gpu() -> bool:
    """Whether chapter 10's kernels have passed their GPU tests (moe_gemm.core.chapters): until they have, the op
    never launches them."""
    from moe_gemm.core.chapters import CHAPTERS

    return next(c for c in CHAPTERS if c.family == "k8").passed_on_gpu


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides
# --8<-- [end:scaled]
