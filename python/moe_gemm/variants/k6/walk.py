"""The order k6 computes its units in (kernels/tile_walk.cuh), in numpy: the host-built unit list of
the ``-host`` rungs, the mirror the CPU tests hold the device walk to, and the offsets the device walk
makes of whatever expert ends it is given.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.model.routing import expert_offsets


# --8<-- [start:walk]
def expert_units(rows: int, n_units: int, unit_rows: int, group: int) -> np.ndarray:
    """(m unit, n unit) of one expert's units in walk order: its M units ``group`` at a time, each
    group column by column."""
    m_tiles = -(-rows // unit_rows)
    order = []
    for g0 in range(0, m_tiles, group):
        in_group = min(group, m_tiles - g0)
        for n in range(n_units):
            order.extend((g0 + m, n) for m in range(in_group))
    return np.array(order, dtype=np.int64).reshape(-1, 2)


def unit_list(counts: np.ndarray, N: int, unit_rows: int, unit_cols: int, group: int) -> np.ndarray:
    """int32 [units, 4]: (expert, row0, rows, col0) per unit of ``unit_rows`` x ``unit_cols``, experts in order."""
    if group < 1:
        raise ValueError(f"a raster group holds at least one M tile, got {group}")
    offsets = expert_offsets(np.asarray(counts, dtype=np.int64))
    n_units = -(-N // unit_cols)
    parts = []
    for e, rows in enumerate(np.asarray(counts, dtype=np.int64)):
        units = expert_units(int(rows), n_units, unit_rows, group)
        if not len(units):
            continue
        row0 = offsets[e] + units[:, 0] * unit_rows
        parts.append(np.stack([np.full(len(units), e), row0, np.minimum(unit_rows, offsets[e + 1] - row0),
                               units[:, 1] * unit_cols], axis=1))
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros((0, 4), dtype=np.int32)
# --8<-- [end:walk]


def walked_offsets(ends: np.ndarray, tokens: int) -> np.ndarray:
    """The expert offsets [E + 1] the device walk uses for the ends it is given (torch's ``offs``, never
    checked on the host): each end clamped to [0, M_tot], then the running maximum, so expert e owns rows
    offsets[e] .. offsets[e + 1] - 1, all inside A and C, and rows from offsets[E] on belong to no expert
    (kernels/tile_walk.cuh, Walk::build)."""
    clamped = np.clip(np.asarray(ends, dtype=np.int64), 0, tokens)
    return np.concatenate([np.zeros(1, np.int64), np.maximum.accumulate(clamped)])
