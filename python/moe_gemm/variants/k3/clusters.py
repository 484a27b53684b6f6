"""Cluster pairing for k3's multicast rungs: two M tiles of one expert and N column share B.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.model.tiles import tile_list


# --8<-- [start:pairs]
def cluster_pairs(counts: np.ndarray, N: int, bm: int, bn: int) -> np.ndarray:
    """The tile list for clusters of two: int32 [2 * units, 4], the two tiles of unit u in rows 2u, 2u+1.

    M tiles 2j and 2j+1 of one expert and one N column form a unit, so the two blocks read the
    same B boxes and multicast them. An expert's last M tile, when it has an odd number, is a
    *lone* tile: lone tiles are paired with the next lone tile in list order (another column or
    another expert: no multicast, each block loads its own B), and a last one left over is paired
    with a copy of itself that stores no rows. Units stay in expert-major order, as the flat list is.
    """
    flat = tile_list(counts, N, bm, bn)
    units: list[np.ndarray] = []
    waiting: np.ndarray | None = None  # a lone tile looking for a partner
    n_tiles = -(-N // bn)
    start = 0
    for count in np.asarray(counts, dtype=np.int64):
        m_tiles = -(-int(count) // bm)
        block = flat[start: start + m_tiles * n_tiles].reshape(m_tiles, n_tiles, 4)
        start += m_tiles * n_tiles
        for m in range(0, m_tiles - 1, 2):
            for n in range(n_tiles):
                units.append(np.stack([block[m, n], block[m + 1, n]]))
        if m_tiles % 2:
            for n in range(n_tiles):
                if waiting is None:
                    waiting = block[-1, n]
                else:
                    units.append(np.stack([waiting, block[-1, n]]))
                    waiting = None
    if waiting is not None:
        idle = waiting.copy()
        idle[2] = 0  # same expert and columns (so the pair multicasts), no rows to store
        units.append(np.stack([waiting, idle]))
    return np.concatenate(units).astype(np.int32) if units else np.zeros((0, 4), dtype=np.int32)
# --8<-- [end:pairs]
