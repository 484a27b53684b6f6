"""The cost model that picks chapter 06's tile shapes: calibrated tile costs, wave quantization
and a memory floor.

A persistent launch of ``grid`` blocks hands tile ``i`` of the list to block ``i % grid``
(kernels/k5_adaptive.cu walks ``index = blockIdx.x, blockIdx.x + gridDim.x, ...``), so with a
per-tile cost ``c(tile)`` the compute part of the launch takes the busiest block's sum::

    compute = max_b  sum_{i = b mod grid} c(tile_i)          (wave quantization, exactly)
    memory  = (A + C + B of every expert that has rows) / copy bandwidth
    predicted = max(overhead + compute, memory)

where the overhead is the fitted intercept of the calibration: launch, pipeline fill, and the
first, DRAM-bound pass over each expert's weights that the per-tile slope does not see.

``c`` is measured once per tile shape on the GPU at the seed's K and N and kept in the results
file (:func:`calibration_routings` lists what is timed, :func:`calibration_from_times` turns the
times into costs); the model scales ``c`` linearly in K. The memory floor is what makes small batches cheap to
predict: at 512 rows every tile streams its weights once and no tile shape can beat the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .mixed_tiles import (BM, POLICIES, SWAP_COLS, SWAP_MAX_ROWS, SWAP_STEP, Policy, TileKind, columns,
                          mixed_tile_list, scheduled_rows, unpack)



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
    K: int = 1024  # noqa: N815
    N: int = 2688  # noqa: N815
    source: str = "measured"
    measurements: list[dict[str, Any]] = field(default_factory=list)

    def cost(self, kind: int, rows: int, K: int) -> float:  # noqa: N803
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


def compulsory_bytes(counts: np.ndarray, K: int, N: int) -> int:  # noqa: N803
    """A and C once, and the weights of every expert that has rows once: what any kernel moves."""
    counts = np.asarray(counts, dtype=np.int64)
    return 2 * (int(counts.sum()) * (K + N) + int((counts > 0).sum()) * K * N)


def block_times(tiles: np.ndarray, calibration: Calibration, grid: int, K: int) -> np.ndarray:  # noqa: N803
    """Microseconds of tiles per block, tile i on block i % grid."""
    kinds, rows = unpack(tiles)
    costs = np.array([calibration.cost(k, r, K) for k, r in zip(kinds.tolist(), rows.tolist())])
    per_block = np.zeros(max(grid, 1))
    np.add.at(per_block, np.arange(costs.size) % max(grid, 1), costs)
    return per_block


def predict(tiles: np.ndarray, counts: np.ndarray, calibration: Calibration, grid: int, K: int,  # noqa: N803
            N: int) -> Prediction:  # noqa: N803
    compute = float(block_times(tiles, calibration, grid, K).max()) if len(tiles) else 0.0
    memory = compulsory_bytes(counts, K, N) / (calibration.copy_tbps * 1e12) * 1e6
    return Prediction(compute, memory, calibration.overhead_us)
# --8<-- [end:predict]


# --8<-- [start:choose]
def choose_policy(counts: np.ndarray, K: int, N: int, calibration: Calibration, grid: int,  # noqa: N803
                  policies: tuple[Policy, ...] = POLICIES) -> tuple[Policy, Prediction]:
    """The policy with the smallest predicted time on this routing (ties: the earlier, simpler one)."""
    best: tuple[Policy, Prediction] | None = None
    for policy in policies:
        prediction = predict(mixed_tile_list(counts, N, policy), counts, calibration, grid, K, N)
        if best is None or prediction.total_us < best[1].total_us - 1e-9:
            best = (policy, prediction)
    assert best is not None
    return best


def greedy_policy(calibration: Calibration, N: int) -> Policy:  # noqa: N803
    """The routing-independent rule a device-scheduled launch uses (it cannot see the counts): for
    each remainder r, the kind whose row of tiles costs least (tile cost x column tiles); then the
    largest swap_max and m64_max thresholds consistent with those choices."""
    def row_cost(kind: TileKind, r: int) -> float:
        return calibration.cost(kind, r, calibration.K) * columns(kind, N)

    best = {r: min(TileKind, key=lambda kind: (row_cost(kind, r), kind)) if r <= 64 else TileKind.M128
            for r in range(1, BM)}
    swap_max = 0
    while swap_max < SWAP_MAX_ROWS and all(best[r] == TileKind.SWAP for r in range(swap_max + 1, swap_max + SWAP_STEP + 1)):
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
REMAINDERS = {"M64": (64, Policy(0, 64)), **{f"SWAP{w}": (w, Policy(64, 64)) for w in range(SWAP_STEP, SWAP_MAX_ROWS + 1,
                                                                                                SWAP_STEP)}}


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


def _makespan(tiles: np.ndarray, costs: Mapping[str, float], grid: int) -> float:
    kinds, rows = unpack(tiles)
    per_tile = np.array([costs[cost_key(k, r)] for k, r in zip(kinds.tolist(), rows.tolist())])
    per_block = np.zeros(grid)
    np.add.at(per_block, np.arange(per_tile.size) % grid, per_tile)
    return float(per_block.max())


def calibration_from_times(times_us: Mapping[str, float], copy_tbps: float, K: int, N: int, grid: int,  # noqa: N803
                           measurements: list[dict[str, Any]]) -> Calibration:
    """Costs and overhead from the calibration lists' median times (keyed as calibration_routings)."""
    routings = calibration_routings()

    def tiles_of(name: str) -> np.ndarray:
        counts, policy = routings[name]
        return mixed_tile_list(counts, N, policy)

    full = {"base": _makespan(tiles_of("base"), {"M128": 1.0}, grid),
            "base x2": _makespan(tiles_of("base x2"), {"M128": 1.0}, grid)}  # busiest block, in tiles
    m128 = (times_us["base x2"] - times_us["base"]) / (full["base x2"] - full["base"])
    overhead = max(times_us["base"] - full["base"] * m128, 0.0)
    tile_us = {"M128": m128}
    for key in REMAINDERS:
        target = times_us[key] - overhead
        lo, hi = 0.0, 4 * m128  # the makespan grows with the shape's cost: bisect for the measured time
        for _ in range(40):
            mid = (lo + hi) / 2
            if _makespan(tiles_of(key), {"M128": m128, key: mid}, grid) < target:
                lo = mid
            else:
                hi = mid
        tile_us[key] = (lo + hi) / 2
    return Calibration(tile_us, overhead, copy_tbps, K, N, measurements=measurements)
# --8<-- [end:calibration]
