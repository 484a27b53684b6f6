"""The workloads every chapter measures, defined once.

The seed is the B300 worklog this project grew from: its grouped GEMM has E = 64 experts, K = 1024
and N = 2688 (one MoE expert projection), with 16,384 routed rows. Chapters sweep the rows and the
routing skew around that shape; chapter 06 adds a grid from decode-sized 512 rows to 65,536.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.model.problem import Problem, make_problem
from moe_gemm.model.routing import expert_counts

SEED_EXPERTS, SEED_K, SEED_N, SEED_TOKENS = 64, 1024, 2688, 16384
WORKLOAD_KEYS = ("tokens", "skew", "experts", "K", "N")  # the fields of a results record naming its workload


@dataclass(frozen=True)
class Workload:
    """One problem shape and routing: ``tokens`` rows over ``experts`` experts at skew ``skew``."""

    tokens: int
    skew: float
    experts: int = SEED_EXPERTS
    K: int = SEED_K  # noqa: N815
    N: int = SEED_N  # noqa: N815

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Workload:
        """The workload a results record was measured on."""
        return cls(int(record["tokens"]), float(record["skew"]), int(record["experts"]), int(record["K"]),
                   int(record["N"]))

    @property
    def seed_shape(self) -> bool:
        return (self.experts, self.K, self.N) == (SEED_EXPERTS, SEED_K, SEED_N)

    @property
    def label(self) -> str:
        extra = "" if self.seed_shape else f", E={self.experts} K={self.K} N={self.N}"
        return f"{self.tokens:,} rows, s={self.skew:g}{extra}"

    @property
    def short_label(self) -> str:
        """As a table column: '16k s=0', '2k s=1.2', '1,000 s=0'."""
        rows = f"{self.tokens // 1024}k" if self.tokens % 1024 == 0 else f"{self.tokens:,}"
        return f"{rows} s={self.skew:g}"

    @property
    def counts(self) -> np.ndarray:
        """Rows per expert under this routing (no inputs drawn)."""
        return expert_counts(self.experts, self.tokens, self.skew)

    def problem(self, seed: int) -> Problem:
        return make_problem(self.experts, self.tokens, self.K, self.N, self.skew, seed=seed)

    def matches(self, record: Mapping[str, Any]) -> bool:
        return tuple(record[k] for k in WORKLOAD_KEYS) == (self.tokens, self.skew, self.experts, self.K, self.N)


SEED = Workload(SEED_TOKENS, 0.0)
# Chapters 01-03 and 05: the seed balanced and skewed, and the memory-bound 2,048 rows.
SEED_WORKLOADS = (SEED, Workload(SEED_TOKENS, 1.2), Workload(2048, 0.0))
# Chapters 04 onward add 65,536 rows, where the tile walk is long enough for steady state.
SEED_FIVE = (*SEED_WORKLOADS, Workload(65536, 0.0), Workload(65536, 1.2))
# Chapter 06's grid: decode-sized to large prefill, balanced to heavily skewed.
GRID_TOKENS = (512, 2048, 4096, 16384, 65536)
GRID_SKEWS = (0.0, 0.4, 0.8, 1.2, 1.6)
