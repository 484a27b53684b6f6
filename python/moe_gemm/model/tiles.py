"""The flat tile list, row utilisation (eta) and the eta-only throughput estimate.

Every kernel in this tutorial launches once over a flat, expert-major list of output tiles.
A descriptor ``(expert, row0, rows, col0)`` names one BM x BN tile of ``C``: rows
``row0 .. row0 + rows`` (``rows <= BM``) all belong to ``expert``, so the block that takes it
multiplies by one weight matrix ``B[expert]`` and owns its whole K reduction. Tiles never
cross an expert boundary, which is what makes the problem ragged: every expert rounds its
``m_e`` up to a multiple of BM on its own, and the last tile of each expert is partial::

    expert 0 (m_0 = 150, BM = 64):  [ 64 rows ][ 64 rows ][ 22 rows + 42 padding ]
    expert 1 (m_1 =  64):           [ 64 rows ]
    expert 2 (m_2 =   0):           (no tiles)

A partial tile still runs the full MMA loop, so the padding rows cost as much as real ones.
``eta`` is the fraction of scheduled rows that are real.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.core.checks import require_int, require_tile_size, require_tile_width
from moe_gemm.model.routing import expert_offsets

TILE_FIELDS = ("expert", "row0", "rows", "col0")


def ceil_div(a: int | np.ndarray, b: int) -> int | np.ndarray:
    return -(-a // b)


def checked_counts(counts: np.ndarray) -> np.ndarray:
    # Validate before any cast: a negative or fractional m_e would otherwise be silently
    # rounded into a wrong (but plausible-looking) tile list.
    counts = np.asarray(counts)
    expert_offsets(counts)
    return counts.astype(np.int64)


def m_tiles_per_expert(counts: np.ndarray, bm: int) -> np.ndarray:
    """ceil(m_e / BM) for every expert (0 for an empty expert)."""
    require_tile_size("BM", bm)
    return ceil_div(checked_counts(counts), bm)


def tile_count(counts: np.ndarray, N: int, bm: int, bn: int) -> int:
    """sum_e ceil(m_e / BM) * ceil(N / BN): the number of descriptors, i.e. blocks."""
    require_int("N", N, minimum=1)
    require_tile_width("BN", bn)
    return int(m_tiles_per_expert(counts, bm).sum()) * int(ceil_div(N, bn))


# --8<-- [start:tile_list]
def tile_list(counts: np.ndarray, N: int, bm: int, bn: int) -> np.ndarray:
    """Expert-major int32 descriptors, shape [tiles, 4], columns :data:`TILE_FIELDS`.

    Within an expert, the N tiles of one M tile are adjacent, so consecutive blocks reuse
    the same rows of A and walk across B[expert].
    """
    counts = checked_counts(counts)
    n_tiles = int(ceil_div(require_int("N", N, minimum=1), require_tile_width("BN", bn)))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    per_expert = m_tiles_per_expert(counts, bm)
    expert = np.repeat(np.arange(counts.size), per_expert)
    m_index = np.arange(expert.size) - np.repeat(np.cumsum(per_expert) - per_expert, per_expert)
    row0 = offsets[expert] + m_index * bm
    rows = np.minimum(bm, counts[expert] - m_index * bm)
    tiles = np.empty((expert.size * n_tiles, 4), dtype=np.int32)
    tiles[:, 0] = np.repeat(expert, n_tiles)
    tiles[:, 1] = np.repeat(row0, n_tiles)
    tiles[:, 2] = np.repeat(rows, n_tiles)
    tiles[:, 3] = np.tile(np.arange(n_tiles) * bn, expert.size)
    return tiles
# --8<-- [end:tile_list]


# --8<-- [start:eta]
def eta(counts: np.ndarray, bm: int) -> float:
    """Row utilisation sum_e m_e / (BM * sum_e ceil(m_e / BM)); 1.0 when nothing is scheduled."""
    scheduled_rows = int(m_tiles_per_expert(counts, bm).sum()) * bm
    return float(np.sum(counts)) / scheduled_rows if scheduled_rows else 1.0
# --8<-- [end:eta]


def eta_estimate(balanced_tflops: float, eta_skewed: float, eta_balanced: float = 1.0) -> float:
    """Skewed throughput predicted from padding alone: T_skew ~= T_bal * eta_skew / eta_bal.

    It ignores everything but the padded rows' wasted math: per-block staging, tail effects,
    occupancy and caching all differ between the two grids.
    """
    if not 0 < eta_balanced <= 1:
        raise ValueError(f"eta_balanced must be in (0, 1], got {eta_balanced}")
    return balanced_tflops * eta_skewed / eta_balanced


def scheduled_flops(counts: np.ndarray, K: int, N: int, bm: int, bn: int) -> int:
    """2 * (BM * M tiles) * K * (BN * N tiles): the math the blocks really issue, padding included."""
    n_tiles = int(ceil_div(N, require_tile_width("BN", bn)))
    return 2 * bm * int(m_tiles_per_expert(counts, bm).sum()) * K * bn * n_tiles
