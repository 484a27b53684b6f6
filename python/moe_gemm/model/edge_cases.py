"""The routings every kernel must get right, small enough for any GPU test: empty experts, experts
smaller than a tile or not a multiple of it, one expert with every row, E = 1, N not a multiple of
the tile, and no rows at all.

Each case is a list of per-expert row counts. K = 128 and N = 200 keep them tiny while
exercising the awkward paths: N = 200 is not a multiple of 64 or 128 (a partial last N tile)
but is a multiple of 8 (TMA's 16-byte stride rule), and K = 128 is a multiple of every BK.

:data:`EDGE_CASES` are the forward's (ragged M, bf16). The weight gradient (ragged K) has its own in
:data:`RAGGED_K_EDGE_CASES`, where a routing decides where each expert's reduction starts and stops,
and the FP8 GEMM (ragged M, e4m3 with scales) in :data:`FP8_EDGE_CASES`, where the values decide the
scales.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from moe_gemm.model.problem import (
    BF16,
    BF16_OPERANDS,
    FP8_BLOCKWISE,
    FP8_ROWWISE,
    FP32,
    OperandFormat,
    Problem,
    RaggedAxis,
    draw_operands,
    problem_from_values,
)
from moe_gemm.model.quantize import E4M3_MAX, groups

EDGE_K = 128
EDGE_N = 200

# A planted value: twice e4m3's largest, so its group's power-of-two scale is 2 and it quantizes to 448
# exactly, while the group's other values (integers up to 3) become 0.5, 1 or 1.5, still exact. It goes
# into A's row 0 (expert 0's) and into the last expert's B, so the two planted groups never meet in one
# product: against an unplanted group (multiples of 128, up to 384) a planted group's products are
# multiples of 2**6 up to 448 * 384, and a 128-deep sum of them needs 12 significant bits, within the
# about 14 that FP8 tensor cores keep of a block's sum (DeepSeek-V3 technical report, section 3.3.2).
LARGE_VALUE = 2 * E4M3_MAX

Plant = Callable[[np.ndarray, np.ndarray, OperandFormat], None]


def zero_first_groups(a: np.ndarray, b: np.ndarray, fmt: OperandFormat) -> None:
    """Zero the first scale group of A and of B[0]: their scales must come out 1, not 0 / 448."""
    (ga_rows, ga_cols), (gb_rows, gb_cols) = groups(fmt.scaling, a.shape[1])
    a[:ga_rows, :ga_cols] = 0
    b[0, :gb_rows, :gb_cols] = 0


def plant_large_values(a: np.ndarray, b: np.ndarray, fmt: OperandFormat) -> None:
    """One :data:`LARGE_VALUE` in the first scale group of A and in that of the last expert's B."""
    a[0, 0] = LARGE_VALUE
    b[-1, 0, 0] = LARGE_VALUE


@dataclass(frozen=True)
class EdgeCase:
    name: str
    counts: tuple[int, ...]
    K: int = EDGE_K
    N: int = EDGE_N
    ragged: RaggedAxis = "M"
    fmt: OperandFormat = BF16_OPERANDS
    out_dtype: np.dtype = BF16
    plant: Plant | None = None  # edits the drawn values before they are cast or quantized

    @property
    def tokens(self) -> int:
        return sum(self.counts)

    def counts_array(self) -> np.ndarray:
        return np.array(self.counts, dtype=np.int64)

    def exact_problem(self, seed: int) -> Problem:
        """The case on integer-valued inputs, whose products every kernel must reproduce bit for bit
        (fp8 operands with power-of-two scales, which keep them integers)."""
        # drawn as fp32, then cast to the operands' type or quantized
        a, b = draw_operands(self.counts_array(), self.K, self.N, values="integer", seed=seed, ragged=self.ragged,
                             dtype=FP32)
        if self.plant is not None:
            self.plant(a, b, self.fmt)
        return problem_from_values(a, b, self.counts_array(), ragged=self.ragged, fmt=self.fmt,
                                   out_dtype=self.out_dtype, power_of_two_scales=True)


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

# m_e of 1, 65 and 129 in turn: expert e starts at row e mod 64, so the 64 experts' first rows meet every
# offset within a 64-row tile, and their lengths are below, across and past one tile.
EVERY_OFFSET_MOD_64 = tuple(1 + 64 * (e % 3) for e in range(64))

RAGGED_K_EDGE_CASES = (
    EdgeCase("dB: experts with no rows get zeros", (0, 70, 0, 0, 130, 0), ragged="K"),
    EdgeCase("dB: one expert holds every row", (0, 0, 300, 0), ragged="K"),
    EdgeCase("dB: a single expert (E = 1)", (257,), ragged="K"),
    EdgeCase("dB: expert boundaries at every row offset mod 64", EVERY_OFFSET_MOD_64, ragged="K"),
    EdgeCase("dB: no rows at all (M_tot = 0), all zeros", (0, 0, 0), ragged="K"),
    EdgeCase("dB in fp32", (0, 70, 1, 129), ragged="K", out_dtype=FP32),
)

# Expert ends (torch's offs) a model could pass by mistake, for four experts over 640 rows: nothing checks them
# on the host (reading them back would cost a synchronisation per launch), so every kernel that walks them on
# the device (k6, k7) must clamp them and stay inside its tensors whatever they hold.
ADVERSARIAL_ENDS = {
    "decreasing": (300, 120, 500, 640),
    "beyond M_tot": (100, 5000, 9000, 10**9),
    "negative": (-7, -1, 200, 640),
    "the last end short of M_tot": (64, 128, 129, 130),
    "every end zero": (0, 0, 0, 0),
}

# Expert 0 owns row 0 (where the planted values go) and expert 1 none.
FP8_COUNTS = (70, 0, 1, 129)

FP8_EDGE_CASES = (
    EdgeCase("e4m3-blockwise: an all-zero scale group", FP8_COUNTS, fmt=FP8_BLOCKWISE, plant=zero_first_groups),
    EdgeCase("e4m3-blockwise: a group with one large value", FP8_COUNTS, fmt=FP8_BLOCKWISE, plant=plant_large_values),
    EdgeCase("e4m3-blockwise: K not a multiple of 128 (a partial last K block)", FP8_COUNTS, K=192,
             fmt=FP8_BLOCKWISE),
    EdgeCase("e4m3-rowwise: an all-zero scale group", FP8_COUNTS, fmt=FP8_ROWWISE, plant=zero_first_groups),
    EdgeCase("e4m3-rowwise: a group with one large value", FP8_COUNTS, fmt=FP8_ROWWISE, plant=plant_large_values),
)


def edge_cases(ragged: RaggedAxis = "M", fmt: OperandFormat = BF16_OPERANDS) -> list[EdgeCase]:
    """The edge cases of a kind of problem: the weight gradient's, or the forward's routings in ``fmt`` and,
    for e4m3, the cases of its scales (an all-zero group, one large value, a partial last K block)."""
    if ragged == "K":
        return list(RAGGED_K_EDGE_CASES)
    if fmt == BF16_OPERANDS:
        return list(EDGE_CASES)
    return ([dataclasses.replace(case, name=f"{fmt}: {case.name}", fmt=fmt) for case in EDGE_CASES]
            + [case for case in FP8_EDGE_CASES if case.fmt == fmt])
