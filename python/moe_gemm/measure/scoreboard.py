"""Chapter 08's scoreboard: our op as a model calls it (op/grouped_mm: moe_gemm.torch.grouped_mm on torch
tensors) against torch._grouped_mm and quack over chapter 06's grid and the model projections chapter
07 times, each cell's ratios from the records of the run that timed the op there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.measure.graph_replay import graph_name
from moe_gemm.measure.results import best_ratio, find_measurement
from moe_gemm.model.workloads import GRID_TOKENS, MODEL_PROJECTIONS, Workload, grid
from moe_gemm.torch.variant import OP_KMAJOR_NAME as OP_KMAJOR
from moe_gemm.torch.variant import OP_NAME as OP
from moe_gemm.variants.peer.quack import QUACK_PEERS as QUACK
from moe_gemm.variants.peer.torch import GROUPED_MM_PEERS as TORCH  # either B layout: the faster counts
from moe_gemm.variants.peer.torch import PEER_GROUPED_MM_KMAJOR as TORCH_KMAJOR

MODELS_GROUP = "the model projections"  # the scoreboard's last group, after the grid's rows


def scoreboard_groups(rows: Sequence[int]) -> list[tuple[str, list[Workload]]]:
    """The scoreboard's cells in the groups a run measures and saves one after the other: chapter 06's
    grid row by row (M_tot in ``rows``, every skew), then the model projections."""
    return [*((f"{t:,}", grid([t])) for t in rows), (MODELS_GROUP, list(MODEL_PROJECTIONS.values()))]


def scoreboard_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured cell: our op over the faster torch layout and over quack's best, and our op
    given b K-major over torch given the same layout (None where a contender was not measured in the run
    that timed the op), as graph replays where the run has them, else eagerly."""
    rows = []
    for w in (cell for _, cells in scoreboard_groups(GRID_TOKENS) for cell in cells):
        graph = find_measurement(records, graph_name(OP), w) is not None
        if not graph and find_measurement(records, OP, w) is None:
            continue
        named = graph_name if graph else str
        pairs = (("torch", OP, TORCH), ("quack", OP, QUACK), ("kmajor", OP_KMAJOR, [TORCH_KMAJOR]))
        rows.append({"label": w.label, **{column: best_ratio(records, [named(ours)], [named(n) for n in names], w)
                                           for column, ours, names in pairs},
                     "timed": "graph replays" if graph else "eager"})
    return rows
