"""The cost model that picks chapter 06's tile shapes: calibrated tile costs, first reads of the
weights from DRAM, wave quantization and a memory floor.

A persistent launch of ``grid`` blocks hands tile ``i`` of the list to block ``i % grid``
(kernels/k5_adaptive.cu walks ``index = blockIdx.x, blockIdx.x + gridDim.x, ...``). A tile costs
its shape's calibrated time ``c(kind)``, measured with its weights already in L2, unless it is the
first tile of the list to read some of its 64-column boxes of ``B[e]``: those bytes come from DRAM
at the block's share of the copy bandwidth, and the tile takes the longer of the two::

    t(tile)   = max(c(kind), new B bytes / (copy bandwidth / grid))
    compute   = max_b  sum_{i = b mod grid} t(tile_i)          (wave quantization, exactly)
    memory    = (A + C + B of every expert that has rows) / copy bandwidth
    predicted = max(overhead + compute, memory)

``c`` and the overhead (launch and pipeline fill) are measured once on the GPU at the seed's K and
N, with this same model, and kept in the results file: :func:`calibration_routings` lists what is
timed, :func:`calibration_from_times` fits it. The model scales ``c`` linearly in K.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from moe_gemm.model.roofline import compulsory_bytes
from moe_gemm.model.workloads import SEED_K, SEED_N
from moe_gemm.variants.k5.mixed_tiles import (
    BM,
    POLICIES,
    SWAP_COLS,
    SWAP_MAX_ROWS,
    SWAP_STEP,
    Policy,
    TileKind,
    columns,
    mixed_tile_list,
    scheduled_rows,
    unpack,
)


def cost_key(kind: int, rows: int) -> str:
    """The calibration entry for one tile: 'M128', 'M64', or 'SWAP16' .. 'SWAP64' by wgmma N."""
    kind = TileKind(kind)
    return f"SWAP{scheduled_rows(kind, rows)}" if kind == TileKind.SWAP else kind.name


COST_KEYS = ("M128", "M64", *(f"SWAP{w}" for w in range(SWAP_STEP, SWAP_MAX_ROWS + 1, SWAP_STEP)))


@dataclass(frozen=True)
class Calibration:
    """Per-tile costs in microseconds at ``K`` (each the time one block spends on one tile while
    every SM is busy with the same kind), the empty-launch overhead and the copy bandwidth."""

    tile_us: Mapping[str, float]
    overhead_us: float
    copy_tbps: float
    K: int = SEED_K
    N: int = SEED_N
    source: str = "measured"
    measurements: list[dict[str, Any]] = field(default_factory=list)

    def cost(self, kind: int, rows: int, K: int) -> float:
        return self.tile_us[cost_key(kind, rows)] * K / self.K

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Calibration:
        return cls(**{k: record[k] for k in ("tile_us", "overhead_us", "copy_tbps", "K", "N", "source")},
                   measurements=list(record.get("measurements", [])))


def nominal_calibration() -> Calibration:
    """A first-principles stand-in for when no GPU calibration exists (CI, a first run): every tile
    at 650 TFLOP/s over 132 SMs for the math it issues, split-K M64 tiles 1.25x that, and 4 TB/s."""
    per_sm = 650e12 / 132
    math = {"M128": 2 * BM * 192 * 1024, "M64": 1.25 * 2 * 64 * 192 * 1024}
    math.update({f"SWAP{w}": 2 * SWAP_COLS * w * 1024 for w in range(SWAP_STEP, SWAP_MAX_ROWS + 1, SWAP_STEP)})
    return Calibration({k: v / per_sm * 1e6 for k, v in math.items()}, overhead_us=4.0, copy_tbps=4.0,
                       source="nominal (no GPU calibration)")


# --8<-- [start:predict]
@dataclass(frozen=True)
class Prediction:
    compute_us: float  # the busiest block's tile costs
    memory_us: float  # compulsory bytes at the copy bandwidth
    overhead_us: float

    @property
    def total_us(self) -> float:
        return max(self.overhead_us + self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.overhead_us + self.compute_us else "compute"


def fresh_bytes(tiles: np.ndarray, K: int) -> np.ndarray:
    """Bytes of B each tile is the first in the list to read (whole 64-column boxes of K rows)."""
    kinds, _ = unpack(tiles)
    seen: set[tuple[int, int]] = set()
    out = np.zeros(len(tiles))
    for i, (expert, col0) in enumerate(np.asarray(tiles)[:, [0, 3]].tolist()):
        width = SWAP_COLS if kinds[i] == TileKind.SWAP else 192
        boxes = {(expert, (col0 + c) // 64) for c in range(0, width, 64)}
        out[i] = len(boxes - seen) * 64 * K * 2
        seen |= boxes
    return out


def tile_times(tiles: np.ndarray, calibration: Calibration, grid: int, K: int,
               fresh: np.ndarray | None = None) -> np.ndarray:
    """Microseconds of every tile: its shape's cost, or the DRAM time of the B boxes it is the first
    in the list to read, whichever is longer (``fresh``: :func:`fresh_bytes` already computed)."""
    kinds, rows = unpack(tiles)
    shape = np.array([calibration.cost(k, r, K) for k, r in zip(kinds.tolist(), rows.tolist())])
    dram = (fresh_bytes(tiles, K) if fresh is None else fresh) / (calibration.copy_tbps * 1e6 / max(grid, 1))
    return np.maximum(shape, dram) if len(tiles) else np.zeros(0)


def makespan(times: np.ndarray, grid: int) -> float:
    """The busiest block's time, tile i on block i % grid."""
    per_block = np.zeros(max(grid, 1))
    np.add.at(per_block, np.arange(times.size) % max(grid, 1), times)
    return float(per_block.max()) if times.size else 0.0


def predict(tiles: np.ndarray, counts: np.ndarray, calibration: Calibration, grid: int, K: int,
            N: int) -> Prediction:
    compute = makespan(tile_times(tiles, calibration, grid, K), grid)
    memory = compulsory_bytes(counts, K, N) / (calibration.copy_tbps * 1e12) * 1e6
    return Prediction(compute, memory, calibration.overhead_us)
# --8<-- [end:predict]


# --8<-- [start:choose]
def choose_policy(counts: np.ndarray, K: int, N: int, calibration: Calibration, grid: int,
                  policies: tuple[Policy, ...] = POLICIES) -> tuple[Policy, Prediction]:
    """The policy with the smallest predicted time on this routing (ties: the earlier, simpler one)."""
    best: tuple[Policy, Prediction] | None = None
    for policy in policies:
        prediction = predict(mixed_tile_list(counts, N, policy), counts, calibration, grid, K, N)
        if best is None or prediction.total_us < best[1].total_us - 1e-9:
            best = (policy, prediction)
    assert best is not None
    return best


def greedy_policy(calibration: Calibration, N: int) -> Policy:
    """The routing-independent rule a device-scheduled launch uses (it cannot see the counts): for
    each remainder r, the kind whose row of tiles costs least (tile cost x column tiles); then the
    largest swap_max and m64_max thresholds consistent with those choices."""
    def row_cost(kind: TileKind, r: int) -> float:
        return calibration.cost(kind, r, calibration.K) * columns(kind, N)

    best = {r: min(TileKind, key=lambda kind: (row_cost(kind, r), kind)) if r <= 64 else TileKind.M128
            for r in range(1, BM)}
    swap_max = 0
    while swap_max < SWAP_MAX_ROWS and all(best[r] == TileKind.SWAP
                                           for r in range(swap_max + 1, swap_max + SWAP_STEP + 1)):
        swap_max += SWAP_STEP
    m64 = all(best[r] in (TileKind.SWAP, TileKind.M64) for r in range(swap_max + 1, 65))
    return Policy(swap_max, 64 if m64 and swap_max < 64 else swap_max)
# --8<-- [end:choose]


# --------------------------------------------------------------------------- calibration

# --8<-- [start:calibration]
# The calibration measures each tile shape where the model uses it: in a real list, next to the
# full tiles of the same experts (so the remainder tile's B is in L2 as it is in a run, and its
# pipeline and epilogue share the block with 128-row tiles). Two lists of full tiles only (BASE_ROWS
# and twice that per expert) give the 128-row cost (slope) and the overhead (intercept); one list
# per remainder shape adds one remainder row of tiles to every expert, and the shape's cost is the
# value that makes the model's makespan of that list equal its measured time.
CALIBRATION_EXPERTS = 64
BASE_ROWS = 256  # per expert: two 128-row tiles
REMAINDERS = {"M64": (64, Policy(0, 64)),
              **{f"SWAP{w}": (w, Policy(64, 64)) for w in range(SWAP_STEP, SWAP_MAX_ROWS + 1, SWAP_STEP)}}


def calibration_routings() -> dict[str, tuple[np.ndarray, Policy]]:
    """Name -> (per-expert rows, policy) of every calibration list: 'base', 'base x2', then one per
    remainder shape (BASE_ROWS + r rows per expert)."""
    routings = {"base": (np.full(CALIBRATION_EXPERTS, BASE_ROWS), Policy()),
                "base x2": (np.full(CALIBRATION_EXPERTS, 2 * BASE_ROWS), Policy())}
    for key, (rows, policy) in REMAINDERS.items():
        routings[key] = (np.full(CALIBRATION_EXPERTS, BASE_ROWS + rows), policy)
    return routings


def calibration_rows() -> int:
    """Rows of A the calibration problem needs: the longest routing's."""
    return max(int(counts.sum()) for counts, _ in calibration_routings().values())


def _bisect(f, lo: float, hi: float) -> float:
    """The root of an increasing ``f`` in [lo, hi]."""
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def calibration_from_times(times_us: Mapping[str, float], copy_tbps: float, K: int, N: int, grid: int,
                           measurements: list[dict[str, Any]]) -> Calibration:
    """Costs and overhead that make the model reproduce the calibration lists' median times (keyed
    as calibration_routings): the 128-row cost from the two full-tile lists (their difference does
    not depend on the overhead), the overhead from the first, then each remainder shape's cost."""
    routings = calibration_routings()
    tiles = {name: mixed_tile_list(counts, N, policy) for name, (counts, policy) in routings.items()}
    fresh = {name: fresh_bytes(t, K) for name, t in tiles.items()}

    def span(name: str, costs: Mapping[str, float]) -> float:  # the model's busiest block with trial costs
        trial = Calibration(costs, 0.0, copy_tbps, K, N)
        return makespan(tile_times(tiles[name], trial, grid, K, fresh[name]), grid)

    growth = times_us["base x2"] - times_us["base"]
    m128 = _bisect(lambda c: span("base x2", {"M128": c}) - span("base", {"M128": c}) - growth, 0.0, 100.0)
    overhead = max(times_us["base"] - span("base", {"M128": m128}), 0.0)
    tile_us = {"M128": m128}
    for key in REMAINDERS:
        tile_us[key] = _bisect(lambda c, key=key: overhead + span(key, {"M128": m128, key: c}) - times_us[key],
                               0.0, 100.0)
    return Calibration(tile_us, overhead, copy_tbps, K, N, measurements=measurements)
# --8<-- [end:calibration]
