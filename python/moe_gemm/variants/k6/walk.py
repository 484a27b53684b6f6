"""The order k6 computes its units in (kernels/tile_walk.cuh), in numpy: the host-built unit list of
the ``-host`` rungs, the mirror the CPU tests hold the device walk to, and the offsets the device walk
makes of whatever expert ends it is given.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from moe_gemm.model.routing import expert_offsets

Raster = Literal["m", "n"]  # what a raster group gathers: M tiles (the columns walked inside) or columns


# --8<-- [start:walk]
def expert_units(rows: int, n_units: int, unit_rows: int, group: int, raster: Raster = "m") -> np.ndarray:
    """(m unit, n unit) of one expert's units in walk order. Raster "m": its M units ``group`` at a time, each
    group column by column. Raster "n" (quack's varlen order): its columns of units ``group`` at a time, the
    expert's M units walked inside each group row by row, every other group from the last M unit up."""
    m_tiles = -(-rows // unit_rows)
    order = []
    if raster == "n":
        for g, n0 in enumerate(range(0, n_units, group)):
            columns = range(n0, min(n0 + group, n_units))
            for m in (range(m_tiles) if g % 2 == 0 else range(m_tiles - 1, -1, -1)):
                order.extend((m, n) for n in columns)
        return np.array(order, dtype=np.int64).reshape(-1, 2)
    for g0 in range(0, m_tiles, group):
        in_group = min(group, m_tiles - g0)
        for n in range(n_units):
            order.extend((g0 + m, n) for m in range(in_group))
    return np.array(order, dtype=np.int64).reshape(-1, 2)


def unit_list(counts: np.ndarray, N: int, unit_rows: int, unit_cols: int, group: int,
              raster: Raster = "m") -> np.ndarray:
    """int32 [units, 4]: (expert, row0, rows, col0) per unit of ``unit_rows`` x ``unit_cols``, experts in order."""
    if group < 1:
        raise ValueError(f"a raster group holds at least one tile, got {group}")
    offsets = expert_offsets(np.asarray(counts, dtype=np.int64))
    n_units = -(-N // unit_cols)
    parts = []
    for e, rows in enumerate(np.asarray(counts, dtype=np.int64)):
        units = expert_units(int(rows), n_units, unit_rows, group, raster)
        if not len(units):
            continue
        row0 = offsets[e] + units[:, 0] * unit_rows
        parts.append(np.stack([np.full(len(units), e), row0, np.minimum(unit_rows, offsets[e + 1] - row0),
                               units[:, 1] * unit_cols], axis=1))
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros((0, 4), dtype=np.int32)
# --8<-- [end:walk]


def cursor_walk(counts: np.ndarray, N: int, unit_rows: int, unit_cols: int, group: int, first: int,
                stride: int) -> np.ndarray:
    """int32 [units, 4]: the units of one persistent block (first, first + stride, ...) as the device walk's
    cursor finds them (kernels/tile_walk.cuh, Walk::unit with a Cursor): the expert by stepping forward from
    the last one, the place within it by adding the step, split once into whole raster groups and a remainder.
    The CPU tests hold it to :func:`unit_list`'s rows first, first + stride, ..."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = expert_offsets(counts)
    n_units, span = -(-N // unit_cols), group * -(-N // unit_cols)
    starts = np.concatenate([[0], np.cumsum(-(-counts // unit_rows) * n_units)])
    expert, last, g, within, step, step_groups, step_within = -1, 0, 0, 0, 0, 0, 0
    found = []
    for index in range(first, int(starts[-1]), stride):
        if starts[expert + 1] <= index:  # a later expert: step to it, place the unit once
            while starts[expert + 1] <= index:
                expert += 1
            g, within = divmod(index - int(starts[expert]), span)
        else:  # the same expert, one step on
            if index - last != step:
                step = index - last
                step_groups, step_within = divmod(step, span)
            g, within = g + step_groups, within + step_within
            if within >= span:
                g, within = g + 1, within - span
        last = index
        row0, rows = int(offsets[expert]), int(counts[expert])
        m, n = g, within
        if group > 1:
            in_group = min(group, -(-rows // unit_rows) - g * group)
            m, n = g * group + within % in_group, within // in_group
        found.append((expert, row0 + m * unit_rows, min(unit_rows, rows - m * unit_rows), n * unit_cols))
    return np.array(found, dtype=np.int32).reshape(-1, 4)


def walked_offsets(ends: np.ndarray, tokens: int) -> np.ndarray:
    """The expert offsets [E + 1] the device walk uses for the ends it is given (torch's ``offs``, never
    checked on the host): each end clamped to [0, M_tot], then the running maximum, so expert e owns rows
    offsets[e] .. offsets[e + 1] - 1, all inside A and C, and rows from offsets[E] on belong to no expert
    (kernels/tile_walk.cuh, Walk::build)."""
    clamped = np.clip(np.asarray(ends, dtype=np.int64), 0, tokens)
    return np.concatenate([np.zeros(1, np.int64), np.maximum.accumulate(clamped)])
