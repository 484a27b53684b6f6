"""The grouped GEMM problems of a Mixture-of-Experts layer: inputs, shapes and their checks.

The forward, ragged along M: expert ``e`` multiplies its own ``m_e`` rows of ``A`` by its own weight
``B[e]``::

        A  [M_tot, K]           B  [E, K, N]              C  [M_tot, N]
      +-------------+        +-----------+             +---------------+
 off0 | expert 0    |        | B[0] K x N|        off0 | A_0 @ B[0]    |
      |  m_0 rows   |        +-----------+             |               |
 off1 +-------------+        | B[1]      |        off1 +---------------+
      | expert 1    |   x    +-----------+    =        | A_1 @ B[1]    |
 off2 +-------------+        |  ...      |        off2 +---------------+
      | (m_2 = 0)   |        +-----------+             |               |
      | expert 3    |        | B[E-1]    |             | A_3 @ B[3]    |
      |  ...        |        +-----------+             |  ...          |
 M_tot+-------------+                                  +---------------+

Rows are grouped by expert (``off[e] .. off[e] + m_e``); an expert may own no rows at all. K and N
are the same for every expert, only M is ragged, and the ``m_e`` are decided at run time by the router.

The weight gradient of the same layer is ragged along K: ``dB[e] = A_e^T dC_e``, the reduction
running over expert ``e``'s rows of A [M_tot, K] and of the output gradient dC [M_tot, N], both
row-major as the forward stored them; dB is [E, K, N], and an expert with no rows gets exact zeros.
It keeps the forward's names: ``a`` is A, ``b`` is dC, K and N are the forward's, and its useful work
is the forward's 2 M_tot K N.

Operands are bf16 (the default), fp16, or fp8 e4m3 with fp32 scales (rowwise or blockwise, see
:mod:`moe_gemm.model.quantize`); the output is bf16 (the default) or fp32, accumulated in fp32.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np

from moe_gemm.core.checks import require_int
from moe_gemm.model.quantize import BLOCK, E4M3, SCALINGS, Scaling, groups, quantize, scale_grid
from moe_gemm.model.routing import expert_counts, expert_offsets

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
FP32 = np.dtype(np.float32)
Values = Literal["random", "integer"]
RaggedAxis = Literal["M", "K"]
RAGGED_AXES: tuple[RaggedAxis, ...] = ("M", "K")
# what a kernel writes: bf16 or fp16 (rounded as torch rounds a 16-bit output), or fp32 where a weight
# gradient is kept in full
OUT_DTYPES = (BF16, FP16, FP32)

# Integer-valued inputs stay exact through bf16 (8 significant bits hold |x| <= 256) and
# through fp32 accumulation (|sum| <= K * 3 * 3 stays far below 2**24), so a kernel's output
# must equal the float64 product rounded once to bf16, bit for bit.
INTEGER_RANGE = 3

Element = Literal["bf16", "fp16", "e4m3"]
ELEMENT_DTYPES: dict[str, np.dtype] = {"bf16": BF16, "fp16": FP16, "e4m3": E4M3}


@dataclass(frozen=True)
class OperandFormat:
    """What A and B hold: 16-bit floats, or fp8 e4m3 with fp32 scales of one granularity."""

    element: Element = "bf16"
    scaling: Scaling | None = None  # e4m3 only

    def __post_init__(self) -> None:
        if self.element not in ELEMENT_DTYPES:
            raise ValueError(f"operands must be one of {', '.join(ELEMENT_DTYPES)}, got {self.element!r}")
        if self.element == "e4m3" and self.scaling not in SCALINGS:
            raise ValueError(f"e4m3 operands need a scale granularity, one of {SCALINGS}, got {self.scaling!r}")
        if self.element != "e4m3" and self.scaling is not None:
            raise ValueError(f"{self.element} operands take no scales, got scaling {self.scaling!r}")

    @property
    def dtype(self) -> np.dtype:
        return ELEMENT_DTYPES[self.element]

    @property
    def scaled(self) -> bool:
        return self.scaling is not None

    @property
    def name(self) -> str:
        """``bf16``, ``fp16``, ``e4m3-rowwise`` or ``e4m3-blockwise``: as messages and records spell it."""
        return self.element if self.scaling is None else f"{self.element}-{self.scaling}"

    def __str__(self) -> str:
        return self.name


BF16_OPERANDS = OperandFormat()
FP16_OPERANDS = OperandFormat("fp16")
FP8_ROWWISE = OperandFormat("e4m3", "rowwise")
FP8_BLOCKWISE = OperandFormat("e4m3", "blockwise")


FORMATS: dict[str, OperandFormat] = {f.name: f for f in (BF16_OPERANDS, FP16_OPERANDS, FP8_ROWWISE, FP8_BLOCKWISE)}


def format_named(name: str) -> OperandFormat:
    """The operand format a results record names (``bf16``, ``e4m3-blockwise``, ...); ValueError if unknown."""
    if name not in FORMATS:
        raise ValueError(f"unknown operand format {name!r}; one of {', '.join(FORMATS)}")
    return FORMATS[name]


def dtype_name(dtype: np.dtype) -> str:
    """bf16, fp16 or fp32, as the GEMM literature writes them (numpy says bfloat16, float32)."""
    return {BF16: "bf16", FP16: "fp16", FP32: "fp32", E4M3: "e4m3"}.get(np.dtype(dtype), np.dtype(dtype).name)


@dataclass(frozen=True)
class Problem:
    """One grouped GEMM: host inputs plus the routing that shaped them, and what kind of GEMM it is."""

    a: np.ndarray  # A [M_tot, K], rows grouped by expert
    b: np.ndarray  # ragged M: B [E, K, N]; ragged K: dC [M_tot, N], rows grouped as A's
    counts: np.ndarray  # [E] int64, rows per expert
    skew: float = float("nan")  # the routing skew that produced ``counts``, if any
    ragged: RaggedAxis = "M"  # "M": the forward (and dA); "K": the weight gradient dB
    fmt: OperandFormat = BF16_OPERANDS
    out_dtype: np.dtype = BF16
    # fp8 only, fp32. rowwise: scale_a [M_tot], scale_b [E, N] (one per expert and column of B[e]).
    # blockwise: scale_a [M_tot, ceil(K / 128)], indexed [row, K block]; scale_b [E, ceil(K / 128),
    # ceil(N / 128)], indexed [expert, K block, N block] of the logical B [E, K, N].
    scale_a: np.ndarray | None = None
    scale_b: np.ndarray | None = None

    @property
    def tokens(self) -> int:
        return int(self.a.shape[0])

    @property
    def experts(self) -> int:
        return int(np.asarray(self.counts).size)

    @property
    def K(self) -> int:
        return int(self.a.shape[1])

    @property
    def N(self) -> int:
        return int(self.b.shape[-1])

    @property
    def offsets(self) -> np.ndarray:
        return expert_offsets(self.counts)

    @property
    def useful_flops(self) -> int:
        return useful_flops(self.tokens, self.K, self.N)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """C [M_tot, N] for ragged M; dB [E, K, N] for ragged K."""
        return output_shape(self.ragged, self.tokens, self.experts, self.K, self.N)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dtype", np.dtype(self.out_dtype))
        validate_inputs(self.a, self.b, self.counts, ragged=self.ragged, fmt=self.fmt, out_dtype=self.out_dtype,
                        scale_a=self.scale_a, scale_b=self.scale_b)


def useful_flops(tokens: int, K: int, N: int) -> int:
    """2 * M_tot * K * N: the multiply-adds on real rows, whatever the tiling (and whichever axis is ragged)."""
    return 2 * tokens * K * N


def output_shape(ragged: RaggedAxis, tokens: int, experts: int, K: int, N: int) -> tuple[int, ...]:
    return (tokens, N) if ragged == "M" else (experts, K, N)


def scale_shapes(scaling: Scaling, tokens: int, experts: int, K: int, N: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of scale_a and scale_b (see :class:`Problem`): a partial last block along K or N
    has a scale of its own."""
    if scaling == "rowwise":
        return (tokens,), (experts, N)
    return (tokens, math.ceil(K / BLOCK)), (experts, math.ceil(K / BLOCK), math.ceil(N / BLOCK))


def _validate_kind(ragged: RaggedAxis, fmt: OperandFormat, out_dtype: np.dtype) -> None:
    """The ragged axis, operand format and output dtype, and the one combination not defined here."""
    if ragged not in RAGGED_AXES:
        raise ValueError(f"the ragged axis must be one of {RAGGED_AXES}, got {ragged!r}")
    if not isinstance(fmt, OperandFormat):
        raise ValueError(f"the operand format must be an OperandFormat, got {type(fmt).__name__}")
    if ragged == "K" and fmt.scaled:
        raise ValueError(f"{fmt} operands are defined for ragged-M problems only (their scale groups run along "
                         f"K, which the weight gradient reduces per expert); ragged K takes bf16 or fp16")
    if np.dtype(out_dtype) not in OUT_DTYPES:
        raise ValueError(f"the output must be bf16, fp16 or fp32, got {np.dtype(out_dtype)}")


def _require_array(name: str, array: object, dtype: np.dtype, ndim: int) -> None:
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype:
        raise ValueError(f"{name} must be {dtype.name}, got {array.dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (row-major)")


def validate_inputs(
    a: np.ndarray, b: np.ndarray, counts: np.ndarray, *, ragged: RaggedAxis = "M",
    fmt: OperandFormat = BF16_OPERANDS, out_dtype: np.dtype = BF16, scale_a: np.ndarray | None = None,
    scale_b: np.ndarray | None = None,
) -> None:
    """Raise ValueError naming the first constraint the inputs break."""
    _validate_kind(ragged, fmt, out_dtype)
    b_name = "B" if ragged == "M" else "dC"
    for name, array, ndim in (("A", a, 2), (b_name, b, 3 if ragged == "M" else 2)):
        _require_array(name, array, fmt.dtype, ndim)
    counts = np.asarray(counts)
    if counts.ndim != 1 or (ragged == "M" and counts.size != b.shape[0]):
        experts = f" ({b.shape[0]})" if ragged == "M" else ""
        raise ValueError(f"counts must list one row count per expert{experts}, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise ValueError("counts must be non-negative integers")
    if int(counts.sum()) != a.shape[0]:
        raise ValueError(f"counts sum to {int(counts.sum())} but A has M_tot = {a.shape[0]} rows")
    if ragged == "M" and a.shape[1] != b.shape[1]:
        raise ValueError(f"A has K = {a.shape[1]} but B has K = {b.shape[1]}")
    if ragged == "K" and a.shape[0] != b.shape[0]:
        raise ValueError(f"A has M_tot = {a.shape[0]} rows but dC has {b.shape[0]}")
    if a.shape[1] < 1 or b.shape[-1] < 1:
        raise ValueError(f"K and N must be >= 1, got K = {a.shape[1]}, N = {b.shape[-1]}")
    _validate_scales(fmt, scale_a, scale_b, scale_shapes(fmt.scaling, a.shape[0], counts.size, a.shape[1],
                                                         b.shape[-1]) if fmt.scaled else ())


def _validate_scales(fmt: OperandFormat, scale_a: np.ndarray | None, scale_b: np.ndarray | None,
                     shapes: tuple[tuple[int, ...], ...]) -> None:
    if not fmt.scaled:
        if scale_a is not None or scale_b is not None:
            raise ValueError(f"{fmt} operands take no scales")
        return
    for name, scale, shape in (("scale_a", scale_a, shapes[0]), ("scale_b", scale_b, shapes[1])):
        if isinstance(scale, np.ndarray) and scale.shape != shape:
            raise ValueError(f"{name} of {fmt} operands must be {list(shape)}, got {list(scale.shape)}")
        _require_array(name, scale, FP32, len(shape))
        if not (np.isfinite(scale) & (scale > 0)).all():
            raise ValueError(f"{name} must be finite and > 0 (an all-zero group has scale 1)")


# Above this many elements random values are drawn in threads, one child generator per slab: numpy's
# generator runs on one core, and DeepSeek-V3's down projection (E=256, K=2048, N=7168) has 3.8 G
# weights, minutes of one core. Smaller arrays keep the single stream (the same values as ever).
THREADED_ELEMENTS = 1 << 28
SLABS = 32
# Threads quantizing an FP8 problem's operands, at most one per core (each holds fp32 copies of its piece; more
# threads than cores ran slower on 2 cores: 6.5 s against 3.1 s with 2 and 4.5 s with 1, Mixtral w1's A and B).
QUANTIZE_WORKERS = 8


def random_values(rng: np.random.Generator, shape: tuple[int, ...], values: Values, scale: float,
                  dtype: np.dtype = BF16) -> np.ndarray:
    """``values`` drawn as ``dtype`` (bf16, fp16 or fp32). Random ones are never zeros: zeros hide
    unwritten outputs and can run faster than real data."""
    if values == "random" and len(shape) > 1 and shape[0] > 1 and int(np.prod(shape)) >= THREADED_ELEMENTS:
        return _random_threaded(rng, shape, scale, dtype)
    if values == "integer":
        data = rng.integers(-INTEGER_RANGE, INTEGER_RANGE + 1, size=shape)
    elif values == "random":
        data = rng.standard_normal(size=shape, dtype=np.float32) * np.float32(scale)
    else:
        raise ValueError(f"values must be 'random' or 'integer', got {values!r}")
    return np.ascontiguousarray(data.astype(np.float32).astype(dtype))


def _slab_bounds(rows: int) -> np.ndarray:
    """Where SLABS (at most one per row) slabs of ``rows`` rows start and end: the pieces a thread pool takes."""
    return np.linspace(0, rows, min(SLABS, max(rows, 1)) + 1).astype(int)


def _random_threaded(rng: np.random.Generator, shape: tuple[int, ...], scale: float, dtype: np.dtype) -> np.ndarray:
    """Standard normal times ``scale``, drawn slab by slab along the first axis in a thread pool
    (numpy releases the GIL while it fills and casts); deterministic for a given ``rng``."""
    out = np.empty(shape, dtype=dtype)
    bounds = _slab_bounds(shape[0])
    children = rng.spawn(len(bounds) - 1)

    def fill(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        slab = children[i].standard_normal(size=(hi - lo, *shape[1:]), dtype=np.float32)
        slab *= np.float32(scale)
        out[lo:hi] = slab.astype(dtype)

    with ThreadPoolExecutor() as pool:
        list(pool.map(fill, range(len(bounds) - 1)))
    return out


def draw_operands(
    counts: np.ndarray, K: int, N: int, *, values: Values = "random", seed: int | None = None,
    ragged: RaggedAxis = "M", dtype: np.dtype = BF16,
) -> tuple[np.ndarray, np.ndarray]:
    """A, then B [E, K, N] (ragged M) or dC [M_tot, N] (ragged K), drawn as ``dtype`` from one seeded
    stream. Random values give the forward unit-variance outputs (B scaled by K**-0.5); dC is
    unit-variance, so dB[e] has variance m_e."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts)
    tokens, experts = int(counts.sum()), int(counts.size)
    a = random_values(rng, (tokens, K), values, 1.0, dtype)
    if ragged == "M":
        return a, random_values(rng, (experts, K, N), values, K**-0.5, dtype)
    return a, random_values(rng, (tokens, N), values, 1.0, dtype)


def problem_from_values(
    a: np.ndarray, b: np.ndarray, counts: np.ndarray, *, skew: float = float("nan"), ragged: RaggedAxis = "M",
    fmt: OperandFormat = BF16_OPERANDS, out_dtype: np.dtype = BF16, power_of_two_scales: bool = False,
) -> Problem:
    """A problem from real-valued operands: cast to the format's 16-bit type, or quantized to e4m3 with
    scales of its granularity (:func:`~moe_gemm.model.quantize.quantize`; ``power_of_two_scales`` keeps
    integer-valued inputs exact)."""
    _validate_kind(ragged, fmt, out_dtype)
    counts = np.asarray(counts, dtype=np.int64)
    kind = {"counts": counts, "skew": skew, "ragged": ragged, "fmt": fmt, "out_dtype": out_dtype}
    if not fmt.scaled:
        return Problem(a=np.ascontiguousarray(a, dtype=fmt.dtype), b=np.ascontiguousarray(b, dtype=fmt.dtype), **kind)
    if b.ndim != 3:
        raise ValueError(f"B must be 3-D, got shape {b.shape}")
    group_a, group_b = groups(fmt.scaling, a.shape[1])
    q_a, scale_a = np.empty(a.shape, dtype=E4M3), np.empty(scale_grid(a.shape, group_a), FP32)
    q_b, scale_b = np.empty(b.shape, dtype=E4M3), np.empty((b.shape[0], *scale_grid(b.shape[1:], group_b)), FP32)

    # A's groups are one row high (1 x 128 or 1 x K), so A quantizes slab by slab of rows; B expert by expert (an
    # fp32 copy of all of B can be tens of GB). In a thread pool: numpy releases the GIL in its array loops,
    # and each piece is written where it belongs, so the result does not depend on the order they finish in.
    def quantize_a(rows: slice) -> None:
        q_a[rows], scale_a[rows] = quantize(a[rows], group_a, power_of_two=power_of_two_scales)

    def quantize_b(e: int) -> None:
        q_b[e], scale_b[e] = quantize(b[e], group_b, power_of_two=power_of_two_scales)

    bounds = _slab_bounds(a.shape[0])
    with ThreadPoolExecutor(max_workers=min(QUANTIZE_WORKERS, os.cpu_count() or 1)) as pool:
        done = [pool.submit(quantize_a, slice(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        done += [pool.submit(quantize_b, e) for e in range(b.shape[0])]
        for piece in done:
            piece.result()  # re-raise a piece's error here
    shape_a, shape_b = scale_shapes(fmt.scaling, a.shape[0], counts.size, a.shape[1], b.shape[2])
    return Problem(a=q_a, b=q_b, scale_a=scale_a.reshape(shape_a), scale_b=scale_b.reshape(shape_b), **kind)


def problem_from_counts(
    counts: np.ndarray, K: int, N: int, *, values: Values = "random", seed: int | None = None,
    skew: float = float("nan"), ragged: RaggedAxis = "M", fmt: OperandFormat = BF16_OPERANDS,
    out_dtype: np.dtype = BF16,
) -> Problem:
    """Inputs for a given routing (:func:`draw_operands`). fp8 operands are drawn as fp32 and quantized;
    integer-valued ones with power-of-two scales, so that they stay integers and the product exact."""
    require_int("K", K, minimum=1)
    require_int("N", N, minimum=1)
    _validate_kind(ragged, fmt, out_dtype)
    counts = np.asarray(counts, dtype=np.int64)
    expert_offsets(counts)  # validates the counts
    a, b = draw_operands(counts, K, N, values=values, seed=seed, ragged=ragged, dtype=FP32 if fmt.scaled else fmt.dtype)
    return problem_from_values(a, b, counts, skew=skew, ragged=ragged, fmt=fmt, out_dtype=out_dtype,
                               power_of_two_scales=values == "integer")


def make_problem(
    experts: int, tokens: int, K: int, N: int, skew: float = 0.0, *,
    values: Values = "random", seed: int | None = None, ragged: RaggedAxis = "M",
    fmt: OperandFormat = BF16_OPERANDS, out_dtype: np.dtype = BF16,
) -> Problem:
    """A problem routed with :func:`~moe_gemm.model.routing.expert_counts`."""
    counts = expert_counts(experts, tokens, skew)
    return problem_from_counts(counts, K, N, values=values, seed=seed, skew=skew, ragged=ragged, fmt=fmt,
                               out_dtype=out_dtype)
