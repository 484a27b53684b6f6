"""The ragged-M grouped GEMM problem: inputs, shapes and their checks.

Expert ``e`` multiplies its own ``m_e`` rows of ``A`` by its own weight ``B[e]``::

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

Rows are grouped by expert (``off[e] .. off[e] + m_e``); an expert may own no rows at all.
``A``, ``B`` are bf16; ``C`` is bf16, accumulated in fp32. K and N are the same for every
expert, only M is ragged, and the ``m_e`` are decided at run time by the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np

from moe_gemm.core.checks import require_int
from moe_gemm.model.routing import expert_counts, expert_offsets

BF16 = np.dtype(ml_dtypes.bfloat16)
Values = Literal["random", "integer"]

# Integer-valued inputs stay exact through bf16 (8 significant bits hold |x| <= 256) and
# through fp32 accumulation (|sum| <= K * 3 * 3 stays far below 2**24), so a kernel's output
# must equal the float64 product rounded once to bf16, bit for bit.
INTEGER_RANGE = 3


@dataclass(frozen=True)
class Problem:
    """One grouped GEMM: host inputs plus the routing that shaped them."""

    a: np.ndarray  # [M_tot, K] bf16, rows grouped by expert
    b: np.ndarray  # [E, K, N] bf16
    counts: np.ndarray  # [E] int64, rows per expert
    skew: float = float("nan")  # the routing skew that produced ``counts``, if any

    @property
    def tokens(self) -> int:
        return int(self.a.shape[0])

    @property
    def experts(self) -> int:
        return int(self.b.shape[0])

    @property
    def K(self) -> int:  # noqa: N802 - the GEMM's K
        return int(self.a.shape[1])

    @property
    def N(self) -> int:  # noqa: N802 - the GEMM's N
        return int(self.b.shape[2])

    @property
    def offsets(self) -> np.ndarray:
        return expert_offsets(self.counts)

    @property
    def useful_flops(self) -> int:
        return useful_flops(self.tokens, self.K, self.N)

    def __post_init__(self) -> None:
        validate_inputs(self.a, self.b, self.counts)


def useful_flops(tokens: int, K: int, N: int) -> int:  # noqa: N803
    """2 * M_tot * K * N: the multiply-adds on real rows, whatever the tiling."""
    return 2 * tokens * K * N


def validate_inputs(a: np.ndarray, b: np.ndarray, counts: np.ndarray) -> None:
    """Raise ValueError naming the first constraint the inputs break."""
    for name, array, ndim in (("A", a, 2), ("B", b, 3)):
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{name} must be a numpy array, got {type(array).__name__}")
        if array.dtype != BF16:
            raise ValueError(f"{name} must be bfloat16, got {array.dtype}")
        if array.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (row-major)")
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size != b.shape[0]:
        raise ValueError(f"counts must list one row count per expert ({b.shape[0]}), got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise ValueError("counts must be non-negative integers")
    if int(counts.sum()) != a.shape[0]:
        raise ValueError(f"counts sum to {int(counts.sum())} but A has M_tot = {a.shape[0]} rows")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"A has K = {a.shape[1]} but B has K = {b.shape[1]}")
    if a.shape[1] < 1 or b.shape[2] < 1:
        raise ValueError(f"K and N must be >= 1, got K = {a.shape[1]}, N = {b.shape[2]}")


# Above this many elements random values are drawn in threads, one child generator per slab: numpy's
# generator runs on one core, and DeepSeek-V3's down projection (E=256, K=2048, N=7168) has 3.8 G
# weights, minutes of one core. Smaller arrays keep the single stream (the same values as ever).
THREADED_ELEMENTS = 1 << 28
SLABS = 32


def random_bf16(rng: np.random.Generator, shape: tuple[int, ...], values: Values, scale: float) -> np.ndarray:
    """Never zeros: zeros hide unwritten outputs and can run faster than real data."""
    if values == "random" and len(shape) > 1 and shape[0] > 1 and int(np.prod(shape)) >= THREADED_ELEMENTS:
        return _random_bf16_threaded(rng, shape, scale)
    if values == "integer":
        data = rng.integers(-INTEGER_RANGE, INTEGER_RANGE + 1, size=shape)
    elif values == "random":
        data = rng.standard_normal(size=shape, dtype=np.float32) * np.float32(scale)
    else:
        raise ValueError(f"values must be 'random' or 'integer', got {values!r}")
    return np.ascontiguousarray(data.astype(np.float32).astype(BF16))


def _random_bf16_threaded(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Standard normal times ``scale``, drawn slab by slab along the first axis in a thread pool
    (numpy releases the GIL while it fills and casts); deterministic for a given ``rng``."""
    from concurrent.futures import ThreadPoolExecutor

    out = np.empty(shape, dtype=BF16)
    bounds = np.linspace(0, shape[0], min(SLABS, shape[0]) + 1).astype(int)
    children = rng.spawn(len(bounds) - 1)

    def fill(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        slab = children[i].standard_normal(size=(hi - lo, *shape[1:]), dtype=np.float32)
        slab *= np.float32(scale)
        out[lo:hi] = slab.astype(BF16)

    with ThreadPoolExecutor() as pool:
        list(pool.map(fill, range(len(bounds) - 1)))
    return out


def problem_from_counts(
    counts: np.ndarray, K: int, N: int, *, values: Values = "random", seed: int | None = None,  # noqa: N803
    skew: float = float("nan"),
) -> Problem:
    """Inputs for a given routing. Random values have unit-variance outputs (B scaled by K**-0.5)."""
    require_int("K", K, minimum=1)
    require_int("N", N, minimum=1)
    counts = np.asarray(counts, dtype=np.int64)
    expert_offsets(counts)  # validates the counts
    rng = np.random.default_rng(seed)
    tokens, experts = int(counts.sum()), int(counts.size)
    a = random_bf16(rng, (tokens, K), values, 1.0)
    b = random_bf16(rng, (experts, K, N), values, K**-0.5)
    return Problem(a=a, b=b, counts=counts, skew=skew)


def make_problem(
    experts: int, tokens: int, K: int, N: int, skew: float = 0.0, *,  # noqa: N803
    values: Values = "random", seed: int | None = None,
) -> Problem:
    """A problem routed with :func:`~moe_gemm.model.routing.expert_counts`."""
    counts = expert_counts(experts, tokens, skew)
    return problem_from_counts(counts, K, N, values=values, seed=seed, skew=skew)
