"""The routings every kernel must get right, small enough for any GPU test: empty experts, experts
smaller than a tile or not a multiple of it, one expert with every row, E = 1, N not a multiple of
the tile, and no rows at all.

Each case is a list of per-expert row counts. K = 128 and N = 200 keep them tiny while
exercising the awkward paths: N = 200 is not a multiple of 64 or 128 (a partial last N tile)
but is a multiple of 8 (TMA's 16-byte stride rule), and K = 128 is a multiple of every BK.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_gemm.model.problem import Problem, problem_from_counts

EDGE_K = 128
EDGE_N = 200


@dataclass(frozen=True)
class EdgeCase:
    name: str
    counts: tuple[int, ...]
    K: int = EDGE_K  # noqa: N815
    N: int = EDGE_N  # noqa: N815

    @property
    def tokens(self) -> int:
        return sum(self.counts)

    def counts_array(self) -> np.ndarray:
        return np.array(self.counts, dtype=np.int64)

    def exact_problem(self, seed: int) -> Problem:
        """The case on integer-valued inputs, whose products every kernel must reproduce bit for bit."""
        return problem_from_counts(self.counts_array(), self.K, self.N, values="integer", seed=seed)


EDGE_CASES = (
    EdgeCase("empty experts", (0, 70, 0, 0, 130, 0)),
    EdgeCase("m_e smaller than BM", (1, 5, 17, 31)),
    EdgeCase("m_e not a multiple of BM", (33, 65, 129, 200)),
    EdgeCase("one expert holds every row", (0, 0, 300, 0)),
    EdgeCase("a single expert (E = 1)", (257,)),
    EdgeCase("N not a multiple of BN", (64, 64), N=72),
    EdgeCase("K of one BK step", (40, 90), K=64),
    EdgeCase("no rows at all (M_tot = 0)", (0, 0, 0)),
)
