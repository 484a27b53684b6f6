"""Routing: how many rows each expert receives.

A router sends each token to one expert. We do not model the router itself, only the
result that matters to the GEMM: the integer row count ``m_e`` of every expert. Skew is a
power law, expert ``e`` receiving rows in proportion to ``(e + 1) ** -skew``:

* ``skew = 0`` spreads rows evenly (16,384 rows over 64 experts: 256 each);
* ``skew = 1.2`` gives the seed worklog's imbalance (largest expert 4,793 rows, smallest 32).

Integer counts come from flooring the proportional shares, then handing the leftover rows
(fewer than ``experts``) one each to the experts in index order, heaviest first. The counts
therefore sum exactly to ``tokens`` and never increase with the expert index.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.core.checks import MAX_EXPERTS, MAX_ROWS, require_int, require_nonnegative_float


# --8<-- [start:expert_counts]
def expert_counts(experts: int, tokens: int, skew: float) -> np.ndarray:
    """Rows per expert, int64 array of length ``experts``, summing exactly to ``tokens``."""
    require_int("experts", experts, minimum=1, limit=MAX_EXPERTS)
    require_int("tokens", tokens, minimum=0, limit=MAX_ROWS)
    require_nonnegative_float("skew", skew)
    weights = np.arange(1, experts + 1, dtype=np.float64) ** -float(skew)
    shares = tokens * weights / weights.sum()
    counts = np.floor(shares).astype(np.int64)
    leftover = tokens - int(counts.sum())
    counts[:leftover] += 1
    return counts
# --8<-- [end:expert_counts]


def expert_offsets(counts: np.ndarray) -> np.ndarray:
    """Row offsets, int64 array of length ``E + 1``: expert ``e`` owns rows ``off[e]:off[e+1]``."""
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"counts must be integers, got dtype {counts.dtype}")
    if (counts < 0).any():
        raise ValueError(f"counts must be >= 0, got a minimum of {int(counts.min())}")
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def counts_from_offsets(offsets: np.ndarray, tokens: int) -> np.ndarray:
    """Inverse of :func:`expert_offsets`, checking that the offsets describe ``tokens`` rows."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 2:
        raise ValueError(f"offsets must be 1-D with E + 1 >= 2 entries, got shape {offsets.shape}")
    if offsets[0] != 0:
        raise ValueError(f"offsets must start at 0, got {int(offsets[0])}")
    if offsets[-1] != tokens:
        raise ValueError(f"offsets must end at M_tot = {tokens}, got {int(offsets[-1])}")
    counts = np.diff(offsets)
    if (counts < 0).any():
        raise ValueError("offsets must be non-decreasing (every m_e >= 0)")
    return counts


def routing_summary(counts: np.ndarray) -> dict[str, int | float]:
    """The few numbers that describe a routing: experts, rows, largest, smallest, empty experts."""
    counts = np.asarray(counts)
    return {
        "experts": int(counts.size),
        "tokens": int(counts.sum()),
        "largest": int(counts.max()),
        "smallest": int(counts.min()),
        "empty": int((counts == 0).sum()),
        "imbalance": float(counts.max() / counts.mean()) if counts.sum() else 0.0,
    }
