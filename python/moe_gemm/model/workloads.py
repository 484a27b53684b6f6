"""The workloads every chapter measures, defined once.

The seed is the B300 worklog this project grew from: its grouped GEMM has E = 64 experts, K = 1024
and N = 2688 (one MoE expert projection), with 16,384 routed rows. Chapters sweep the rows and the
routing skew around that shape; chapter 06 adds a grid from decode-sized 512 rows to 65,536.
Chapters 07 and 08 add the MoE layers of three real models (:data:`LAYERS`, chapter 08 runs them
whole) and four of their expert projections as grouped GEMMs (:data:`MODEL_PROJECTIONS`); chapter 07
also times the up and down projections of two more models (:data:`MORE_LAYERS`,
:data:`MORE_MODEL_PROJECTIONS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.model.problem import BF16_OPERANDS, OperandFormat, Problem, RaggedAxis, format_named, make_problem
from moe_gemm.model.routing import expert_counts

SEED_EXPERTS, SEED_K, SEED_N, SEED_TOKENS = 64, 1024, 2688, 16384
WORKLOAD_KEYS = ("tokens", "skew", "experts", "K", "N")  # the fields of a results record naming its workload


def short_count(n: int) -> str:
    """'16k' for a multiple of 1,024, else '1,000'."""
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


@dataclass(frozen=True)
class Workload:
    """One problem shape and routing: ``tokens`` rows over ``experts`` experts at skew ``skew``."""

    tokens: int
    skew: float
    experts: int = SEED_EXPERTS
    K: int = SEED_K
    N: int = SEED_N
    # "M": the forward (C = A_e B[e]); "K": the weight gradient dB[e] = A_e^T dC_e of the same layer, whose
    # reduction runs over each expert's rows (chapter 09). A record notes it only where it is "K".
    ragged: RaggedAxis = "M"
    # What A and B hold: bf16 (the default), or e4m3 with scales (chapter 10). A record notes it only where it
    # is not bf16.
    fmt: OperandFormat = BF16_OPERANDS

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Workload:
        """The workload a results record was measured on."""
        return cls(int(record["tokens"]), float(record["skew"]), int(record["experts"]), int(record["K"]),
                   int(record["N"]), record.get("ragged", "M"), format_named(record.get("format", "bf16")))

    @property
    def seed_shape(self) -> bool:
        return (self.experts, self.K, self.N) == (SEED_EXPERTS, SEED_K, SEED_N)

    @property
    def label(self) -> str:
        extra = "" if self.seed_shape else f", E={self.experts} K={self.K} N={self.N}"
        kind = "" if self.ragged == "M" else " (dB)"
        operands = "" if self.fmt == BF16_OPERANDS else f" {self.fmt}"
        return f"{self.tokens:,} rows, s={self.skew:g}{extra}{kind}{operands}"

    @property
    def short_label(self) -> str:
        """As a table column: '16k s=0', '2k s=1.2', '1,000 s=0'."""
        return f"{short_count(self.tokens)} s={self.skew:g}"

    @property
    def cell_label(self) -> str:
        """As a table cell beside others of other shapes: the short label, then the shape where it is not the
        seed's ('32k s=0.4 E16 K10752 N6144')."""
        return self.short_label if self.seed_shape else f"{self.short_label} E{self.experts} K{self.K} N{self.N}"

    @property
    def counts(self) -> np.ndarray:
        """Rows per expert under this routing (no inputs drawn)."""
        return expert_counts(self.experts, self.tokens, self.skew)

    def problem(self, seed: int) -> Problem:
        return make_problem(self.experts, self.tokens, self.K, self.N, self.skew, seed=seed, ragged=self.ragged,
                            fmt=self.fmt)

    def matches(self, record: Mapping[str, Any]) -> bool:
        return (tuple(record[k] for k in WORKLOAD_KEYS) == (self.tokens, self.skew, self.experts, self.K, self.N)
                and record.get("ragged", "M") == self.ragged and record.get("format", "bf16") == self.fmt.name)

    def weight_gradient(self) -> Workload:
        """The weight gradient of this forward projection over the same routed rows: dB [E, K, N] =
        A_e^T dC_e, ragged along its reduction (the same useful FLOPs, 2 M_tot K N)."""
        return dataclasses.replace(self, ragged="K")

    def in_format(self, fmt: OperandFormat) -> Workload:
        """The same shape and routing with operands in ``fmt`` (chapter 10: e4m3 with its scales)."""
        return dataclasses.replace(self, fmt=fmt)


SEED = Workload(SEED_TOKENS, 0.0)
# Chapters 01-03 and 05: the seed balanced and skewed, and the memory-bound 2,048 rows.
SEED_WORKLOADS = (SEED, Workload(SEED_TOKENS, 1.2), Workload(2048, 0.0))
# Chapters 04 onward add 65,536 rows, where the tile walk is long enough for steady state.
SEED_FIVE = (*SEED_WORKLOADS, Workload(65536, 0.0), Workload(65536, 1.2))
# Chapter 06's grid: decode-sized to large prefill, balanced to heavily skewed.
GRID_TOKENS = (512, 2048, 4096, 16384, 65536)
GRID_SKEWS = (0.0, 0.4, 0.8, 1.2, 1.6)


def grid(tokens: Sequence[int] = GRID_TOKENS) -> list[Workload]:
    """Chapter 06's grid at the seed's shape: every skew at each row count, row by row."""
    return [Workload(t, skew) for t in tokens for skew in GRID_SKEWS]


# --------------------------------------------------------------------------- real models' MoE layers

@dataclass(frozen=True)
class LayerShape:
    """An MoE feed-forward layer with the sizes of ``model``'s: ``experts`` SwiGLU experts of width
    ``intermediate`` on ``hidden``, ``top_k`` per token."""

    model: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    @property
    def label(self) -> str:
        """'Mixtral-8x7B-like': the model's sizes, not its weights (chapter 08's are random)."""
        return f"{self.model}-like"

    def fields(self, tokens: int) -> dict[str, Any]:
        """What every layer record carries. The routing is the router's own (random weights), not a
        skew parameter: skew is recorded as NaN."""
        return {"hidden": self.hidden, "intermediate": self.intermediate, "experts": self.experts,
                "top_k": self.top_k, "tokens": tokens, "skew": float("nan")}

    def gate(self, rows: int, skew: float) -> Workload:
        """The gate projection, hidden -> intermediate, over ``rows`` routed rows."""
        return Workload(rows, skew, self.experts, self.hidden, self.intermediate)

    def gate_up(self, rows: int, skew: float) -> Workload:
        """The gate and up projections as one GEMM, hidden -> 2 x intermediate (GEMM 1 of a SwiGLU expert)."""
        return Workload(rows, skew, self.experts, self.hidden, 2 * self.intermediate)

    def down(self, rows: int, skew: float) -> Workload:
        """The down projection, intermediate -> hidden (GEMM 2)."""
        return Workload(rows, skew, self.experts, self.intermediate, self.hidden)

    def saved_elements_per_row(self, way: str) -> int:
        """Elements of the layer's dtype a training forward keeps for the backward per routed row
        (moe_gemm.torch.experts says why; tests/test_experts.py counts them): ``"torch"``, autograd over the
        torch layer's operations, keeps the token row (H), the product [gate | up] (2I), silu(gate) (I),
        the activation (I) and the combine's expert output (H); ``"ours"`` keeps the product and the
        expert output alone, half as much at every size. (Both also keep indices and routing weights.)"""
        per_row = {"torch": 2 * self.hidden + 4 * self.intermediate, "ours": self.hidden + 2 * self.intermediate}
        if way not in per_row:
            raise ValueError(f"way must be one of {', '.join(per_row)}, got {way!r}")
        return per_row[way]

    def projection_label(self, name: str, workload: Workload) -> str:
        """'Mixtral-8x7B w1 (16k tokens, top-2)': the projection as the model names it, and the tokens
        whose top-k choices make the workload's routed rows."""
        return f"{self.model} {name} ({short_count(workload.tokens // self.top_k)} tokens, top-{self.top_k})"


LAYERS = {
    "mixtral": LayerShape("Mixtral-8x7B", 4096, 14336, 8, 2),
    "qwen3": LayerShape("Qwen3-30B-A3B", 2048, 768, 128, 8),
    "deepseek": LayerShape("DeepSeek-V3", 7168, 2048, 256, 8),
}
# Four of their projections, none with the seed's K and N, as grouped GEMMs over 32,768 routed rows
# (M_tot = tokens x top-k) at a moderate skew from the grid: label -> workload.
MODEL_ROWS, MODEL_SKEW = 32768, 0.4
MODEL_PROJECTIONS = {
    layer.projection_label(name, workload): workload
    for layer, name, workload in (
        (LAYERS["mixtral"], "w1", LAYERS["mixtral"].gate(MODEL_ROWS, MODEL_SKEW)),  # Mixtral's name for the gate
        (LAYERS["qwen3"], "gate_up", LAYERS["qwen3"].gate_up(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["qwen3"], "down", LAYERS["qwen3"].down(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["deepseek"], "down", LAYERS["deepseek"].down(MODEL_ROWS, MODEL_SKEW)),
    )
}

# Chapter 07 also times two more models' expert GEMMs, chosen so that E, K and N all differ from the
# four above and together spread the rows per expert (at 32,768 routed rows: 4,096 for Mixtral, 256 and
# 128 for Qwen3 and DeepSeek-V3) over 2,048 and 1,024. Sizes from each model's public config.json:
# * gpt-oss-20b (openai/gpt-oss-20b): hidden_size 2880, intermediate_size 2880, num_local_experts 32,
#   num_experts_per_tok 4. K = 2,880 is 45 k-steps of 64 but not a multiple of 128, which no other shape
#   here has. (gpt-oss-120b has the same K and N over 128 experts: Qwen3's E and rows per expert.)
# * DBRX (databricks/dbrx-base): d_model 6144, ffn_config.ffn_hidden_size 10752, moe_num_experts 16,
#   moe_top_k 4: the largest K (the down projection's 10,752) and N (gate and up, 21,504) here, where
#   torch._grouped_mm was strongest against k6 (K >= 4,096).
# Every K is a multiple of 64 and every N of 8, so k6 (moe_gemm.variants.k6.rules), quack and
# torch._grouped_mm all take them. They are not in LAYERS: chapter 08 runs every layer there whole, and
# not in MODEL_PROJECTIONS, on which chapter 08's scoreboard and its recorded results are keyed.
MORE_LAYERS = {
    "gpt-oss": LayerShape("gpt-oss-20b", 2880, 2880, 32, 4),
    "dbrx": LayerShape("DBRX", 6144, 10752, 16, 4),
}
MORE_MODEL_PROJECTIONS = {
    layer.projection_label(name, workload): workload
    for layer, name, workload in (
        (MORE_LAYERS["gpt-oss"], "gate_up", MORE_LAYERS["gpt-oss"].gate_up(MODEL_ROWS, MODEL_SKEW)),
        (MORE_LAYERS["gpt-oss"], "down", MORE_LAYERS["gpt-oss"].down(MODEL_ROWS, MODEL_SKEW)),
        (MORE_LAYERS["dbrx"], "w1+v1", MORE_LAYERS["dbrx"].gate_up(MODEL_ROWS, MODEL_SKEW)),  # DBRX's gate and up
        (MORE_LAYERS["dbrx"], "w2", MORE_LAYERS["dbrx"].down(MODEL_ROWS, MODEL_SKEW)),  # and its down projection
    )
}


# --------------------------------------------------------------------------- SonicMoE's training configurations

@dataclass(frozen=True)
class TrainingConfig:
    """A layer trained over ``tokens`` tokens, as SonicMoE (Guo, Mishra, Cheng, Stoica and Dao, 2025; arXiv
    2512.14080, on quack's kernels) benchmarks its layer: T tokens, hidden d, expert width n, E experts, top-K."""

    name: str
    layer: LayerShape
    tokens: int
    source: str

    @property
    def label(self) -> str:
        """'SonicMoE default (T=32k, d=4096, n=1024, E=128, K=8)'."""
        s = self.layer
        return (f"{self.name} (T={short_count(self.tokens)}, d={s.hidden}, n={s.intermediate}, E={s.experts}, "
                f"K={s.top_k})")

    def flops(self) -> dict[str, int]:
        """The FLOPs SonicMoE's benchmark divides its times by (benchmarks/moe-cute.py in its repository): the
        three GEMMs of a SwiGLU expert over T K routed rows, 6 T n d K forward (GEMM 1 is [d, 2n], GEMM 2 [n, d]),
        twice that backward (a dA and a dW GEMM for each), the router's left out."""
        s = self.layer
        forward = 6 * self.tokens * s.intermediate * s.hidden * s.top_k
        return {"forward": forward, "backward": 2 * forward, "step": 3 * forward}


# SonicMoE's benchmark default (the T, H, I, E, K of its README's command and of benchmarks/moe-cute.py), and two
# sizes its paper evaluates on H100, a fine-grained 7B (n = 256 under d = 1,536) and a 30B with half the experts
# of the default; the latter two are transcribed from the paper's configurations and not re-read from its
# repository, which names only the default.
SONICMOE = {
    "default": TrainingConfig("SonicMoE default", LayerShape("SonicMoE default", 4096, 1024, 128, 8), 32768,
                              "SonicMoE's README and benchmarks/moe-cute.py"),
    "7b": TrainingConfig("SonicMoE 7B", LayerShape("SonicMoE 7B", 1536, 256, 128, 8), 24576,
                         "SonicMoE's paper, its 7B configuration, as transcribed; not re-checked against "
                         "its table here"),
    "30b": TrainingConfig("SonicMoE 30B", LayerShape("SonicMoE 30B", 4096, 1024, 64, 4), 32768,
                          "SonicMoE's paper, its 30B configuration, as transcribed; not re-checked against "
                          "its table here"),
}
