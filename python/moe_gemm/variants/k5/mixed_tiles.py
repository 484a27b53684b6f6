"""Chapter 06's mixed tile list: each expert's rows cut into tiles of three shapes.

An expert's first ``m_e // 128 * 128`` rows always go in 128-row tiles. The ``r = m_e % 128``
rows left over, its *remainder*, take one tile whose shape a :class:`Policy` picks from ``r``::

    kind   rows x columns   computes                          scheduled rows for r
    M128   128 x 192        C tile, 2 warpgroups x m64n192     128
    M64     64 x 192        C tile, 2 warpgroups split K       64
    SWAP   <=64 x 128       C^T = B^T A^T, wgmma N = tokens    r rounded up to 16

so a 5-row remainder costs 16 rows of math instead of 128. A descriptor is the int32 quadruple
``(expert, row0, rows | kind << 16, col0)`` that ``kernels/k5_adaptive.cu`` decodes.

Two orders: ``"expert"`` (expert-major, each expert's 128-row tiles then its remainder tile: k3's
order, and the one the kernel's device schedule produces) and ``"kind"`` (every M128 tile, then
every M64, then every SWAP tile, expert-major within a kind: longest processing time first).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np

from moe_gemm.core.checks import require_int
from moe_gemm.model.routing import expert_offsets
from moe_gemm.model.tiles import ceil_div, checked_counts

BM = 128  # full tiles, and the M128 remainder tile
BN = 192  # columns of M128 and M64 tiles
SWAP_COLS = 128  # weight columns of a SWAP tile (the wgmma's M: 64 per warpgroup)
SWAP_MAX_ROWS = 64  # tokens of a SWAP tile (the wgmma's N), in steps of SWAP_STEP
SWAP_STEP = 16
KIND_SHIFT = 16
Order = Literal["kind", "expert"]


class TileKind(IntEnum):
    M128 = 0
    M64 = 1
    SWAP = 2


@dataclass(frozen=True)
class Policy:
    """The remainder rule: ``r <= swap_max`` -> SWAP, ``r <= m64_max`` -> M64, else M128."""

    swap_max: int = 0  # 0: no swap tiles
    m64_max: int = 0  # <= swap_max: no M64 tiles

    def __post_init__(self) -> None:
        if not 0 <= self.swap_max <= SWAP_MAX_ROWS or self.swap_max % SWAP_STEP:
            raise ValueError(f"swap_max must be a multiple of {SWAP_STEP} in [0, {SWAP_MAX_ROWS}], got {self.swap_max}")
        if self.m64_max not in (0, 64) and self.m64_max != self.swap_max:
            raise ValueError(f"m64_max must be 0, 64 or swap_max, got {self.m64_max}")

    def kind(self, remainder: int) -> TileKind:
        return (TileKind.SWAP if remainder <= self.swap_max
                else TileKind.M64 if remainder <= self.m64_max else TileKind.M128)

    @property
    def label(self) -> str:
        parts = [f"swap<={self.swap_max}"] if self.swap_max else []
        if self.m64_max > self.swap_max:
            parts.append(f"m64<={self.m64_max}")
        return ", ".join(parts) or "m128 only"


FIXED_128 = Policy()  # chapter 04's tiling: every remainder in a 128-row tile

# Every policy the cost model chooses from: swap tiles up to 0..64 rows, M64 tiles on or off.
POLICIES = tuple(dict.fromkeys(Policy(s, m) for s in range(0, SWAP_MAX_ROWS + 1, SWAP_STEP) for m in (s, 64)
                               if m >= s))


def columns(kind: TileKind, N: int) -> int:
    """Column tiles per row tile of ``kind``."""
    return int(ceil_div(N, SWAP_COLS if kind == TileKind.SWAP else BN))


def width(kind: TileKind) -> int:
    return SWAP_COLS if kind == TileKind.SWAP else BN


def scheduled_rows(kind: TileKind, rows: int) -> int:
    """The rows of math a tile of ``kind`` holding ``rows`` real rows issues."""
    if kind == TileKind.SWAP:
        return int(ceil_div(rows, SWAP_STEP)) * SWAP_STEP
    return 64 if kind == TileKind.M64 else BM


def _checked(counts: np.ndarray, N: int) -> np.ndarray:
    counts = checked_counts(counts)  # ValueError for negative or fractional counts, before N's
    require_int("N", N, minimum=1)
    return counts


# --8<-- [start:row_tiles]
def row_tiles(counts: np.ndarray, policy: Policy) -> list[tuple[int, int, int, TileKind]]:
    """(expert, first row within the expert, rows, kind) of every row tile, expert-major."""
    out = []
    for e, m in enumerate(np.asarray(counts, dtype=np.int64).tolist()):
        full, r = divmod(m, BM)
        out += [(e, i * BM, BM, TileKind.M128) for i in range(full)]
        if r:
            out.append((e, full * BM, r, policy.kind(r)))
    return out
# --8<-- [end:row_tiles]


# --8<-- [start:tile_list]
def mixed_tile_list(counts: np.ndarray, N: int, policy: Policy, order: Order = "expert") -> np.ndarray:
    """int32 [tiles, 4] descriptors ``(expert, row0, rows | kind << 16, col0)`` in ``order``."""
    counts = _checked(counts, N)
    offsets = expert_offsets(counts)
    tiles = [(kind, e, int(offsets[e]) + start, rows, c * width(kind))
             for e, start, rows, kind in row_tiles(counts, policy) for c in range(columns(kind, N))]
    if order == "kind":
        tiles.sort(key=lambda t: t[0])  # stable: expert-major within a kind
    elif order != "expert":
        raise ValueError(f"order must be 'kind' or 'expert', got {order!r}")
    out = np.array([(e, row0, rows | int(kind) << KIND_SHIFT, col0) for kind, e, row0, rows, col0 in tiles],
                   dtype=np.int32)
    return out.reshape(-1, 4)
# --8<-- [end:tile_list]


def unpack(tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kind, rows) columns of a descriptor list."""
    z = np.asarray(tiles)[:, 2]
    return z >> KIND_SHIFT, z & ((1 << KIND_SHIFT) - 1)


def device_schedule(counts: np.ndarray, N: int, policy: Policy) -> np.ndarray:
    """The list the kernel's device schedule walks, computed its way: a prefix sum of the experts'
    tile counts, then tile ``i`` found by a binary search (kernels/k5_adaptive.cu, scheduled_tile)."""
    counts = _checked(counts, N)
    offsets = expert_offsets(counts)
    n_full = columns(TileKind.M128, N)
    per_expert = [m // BM * n_full + (columns(policy.kind(m % BM), N) if m % BM else 0) for m in counts.tolist()]
    starts = np.concatenate([[0], np.cumsum(per_expert, dtype=np.int64)])
    out = []
    for index in range(int(starts[-1])):
        e = int(np.searchsorted(starts, index, side="right")) - 1
        rows, local = int(counts[e]), index - int(starts[e])
        full = rows // BM
        if local < full * n_full:
            out.append((e, int(offsets[e]) + local // n_full * BM, BM | TileKind.M128 << KIND_SHIFT,
                        local % n_full * BN))
        else:
            kind = policy.kind(rows % BM)
            out.append((e, int(offsets[e]) + full * BM, rows % BM | int(kind) << KIND_SHIFT,
                        (local - full * n_full) * width(kind)))
    return np.array(out, dtype=np.int32).reshape(-1, 4)


def kind_counts(tiles: np.ndarray) -> dict[str, int]:
    kinds, _ = unpack(tiles)
    return {kind.name: int((kinds == kind).sum()) for kind in TileKind}


# --8<-- [start:eta]
def mixed_eta(counts: np.ndarray, policy: Policy) -> float:
    """Real rows over the rows of math the policy's tiles issue (``tiles.eta`` for FIXED_128)."""
    counts = np.asarray(counts, dtype=np.int64)
    issued = sum(scheduled_rows(kind, rows) for _, _, rows, kind in row_tiles(counts, policy))
    return float(counts.sum()) / issued if issued else 1.0
# --8<-- [end:eta]
