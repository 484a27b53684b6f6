"""Chapter 02's figures and generated docs tables.

    python chapters/02/figures.py          # writes site_docs/figures/02/*.png and *.md

Two kinds of output, both included into site_docs/02-mma-sync.md by pymdownx.snippets:

* from the compiler alone (no GPU, no results file): the compile report of every k1
  configuration for sm_90a, the register arithmetic behind each one's blocks per SM, the main
  loop's SASS per K slice by kind of instruction, and the ldmatrix / mma.sync fragment layouts;
* from chapters/02/results/h200.json only: the BM sweep (two and three stages), tile fill at
  2,048 rows, the issue model and the stall breakdown from Nsight Compute's counters, the
  measured ceilings, every measurement, and the ``findings_*.md`` snippets: the sentences of the
  page that carry measured numbers, formatted here so that no number on the site is typed by
  hand. When the file is absent (or lacks what a snippet needs), each says so and no figure is
  drawn: no number is ever made up.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm import fragments
from moe_gemm.cli import chapter_parser, run_main
from moe_gemm.notebook import PEER, Workload, find_measurement
from moe_gemm.occupancy import HOPPER, registers_per_warp, residency
from moe_gemm.report import markdown_table
from moe_gemm.results import load_results, results_path
from moe_gemm.roofline import H200_COPY_TBPS, H200_DENSE_BF16_TFLOPS, roofline_tflops
from moe_gemm.routing import expert_counts
from moe_gemm.style import BM_COLORS, COLORS, FIGURE_ROOT, new_figure, save_figure
from moe_gemm.tiles import eta, eta_estimate

CHAPTER = "02"
GPU = "h200"
ARCH = "sm_90a"
# Every k1 variant the chapter measures, grouped by BM: two stages, three stages, FRAG_DB.
SWEEP = ("k1/bm32", "k1/bm32-s3", "k1/bm64", "k1/bm64-s3", "k1/bm64-fragdb", "k1/bm128", "k1/bm128-s3")
BMS = (32, 64, 128)
# Two stages in a light tint of the BM colour, three stages in the full colour; FRAG_DB hatched.
LIGHT = {32: "#aec7e8", 64: "#98df8a", 128: "#ff9896"}
VARIANT_COLORS = {**{f"k1/bm{bm}": LIGHT[bm] for bm in BMS}, **{f"k1/bm{bm}-s3": BM_COLORS[bm] for bm in BMS},
                  "k1/bm64-fragdb": LIGHT[64], PEER: COLORS["peer"]}
BALANCED, SKEWED, SMALL = Workload(16384, 0.0), Workload(16384, 1.2), Workload(2048, 0.0)
WORKLOADS = (BALANCED, SKEWED, SMALL)
TARGET_TFLOPS = 250.0  # SPEC section 7: k1 (best BM) >= 250 useful TFLOP/s at 16,384 rows, s = 0
MMA_FLOP = 2 * 16 * 8 * 16  # one mma.sync.m16n8k16 per warp
# Written down before k1/bm128-s3 was measured (the pipeline-depth section of the page tells the
# story): three stages at BM = 128 should gain 4 to 8 % over two. Kept here so that the verdict
# next to the measurement is computed, not typed.
PREDICTED_GAIN_BM128_S3 = (4.0, 8.0)
# Stall reasons drawn separately in the stall figure (cycles per issued instruction); the rest
# are summed as "other".
STALLS_SHOWN = ("long_scoreboard", "barrier", "mio_throttle", "short_scoreboard", "wait", "math_pipe_throttle",
                "not_selected", "selected")
STALL_COLORS = {"long_scoreboard": "#d62728", "barrier": "#ff7f0e", "mio_throttle": "#9467bd",
                "short_scoreboard": "#e377c2", "wait": "#8c564b", "math_pipe_throttle": "#17becf",
                "not_selected": "#bcbd22", "selected": "#7f7f7f", "other": "#dddddd"}
NOT_MEASURED = ("*Not measured yet: this table is generated from `chapters/02/results/h200.json`, which "
                "`python chapters/02/run.py` writes on a GPU.*\n")


# --------------------------------------------------------------------------- no GPU needed

def compile_report_markdown(rows: list[dict[str, Any]]) -> str:
    headers = ["kernel", "registers", "regs/block", "smem KB", "spill bytes", "blocks/SM", "limited by",
               "HMMA", "LDSM", "LDSM.T", "LDGSTS", "BAR"]
    body = [[r["variant"], r["registers"], r["registers_per_block"], f"{r['smem_bytes'] / 1024:.1f}",
             r["spill_bytes"], r["blocks_per_sm"], r["limiter"],
             *(r["sass"][op] for op in ("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS",
                                        "BAR.SYNC"))] for r in rows]
    return markdown_table(headers, body)


def register_arithmetic_markdown(rows: list[dict[str, Any]]) -> str:
    """R -> registers per warp (rounded to 256) -> per block -> blocks by registers, beside the other limits."""
    headers = ["kernel", "R", "32 R", "regs/warp", "regs/block (8 warps)", "65,536 / block", "by smem",
               "by warps", "blocks/SM", "warps/scheduler"]
    body = []
    for r in rows:
        per_warp = registers_per_warp(r["registers"])
        fit = residency(r["registers"], r["warps_per_block"], r["smem_bytes"])
        body.append([r["variant"], r["registers"], 32 * r["registers"], per_warp, per_warp * r["warps_per_block"],
                     f"{HOPPER.registers / (per_warp * r['warps_per_block']):.2f}", fit.by_smem, fit.by_warps,
                     fit.blocks, f"{fit.blocks * r['warps_per_block'] / HOPPER.schedulers:g}"])
    return markdown_table(headers, body)


def eta_markdown() -> str:
    """eta for each BM on the chapter's three workloads: the padding-only prediction, before any run."""
    headers = ["workload", *(f"eta, BM = {bm}" for bm in (32, 64, 128))]
    body = [[w.label, *(f"{eta(expert_counts(w.experts, w.tokens, w.skew), bm):.3f}" for bm in (32, 64, 128))]
            for w in WORKLOADS]
    return markdown_table(headers, body)


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
# Opcode prefix -> column of the main-loop table, first match wins; everything else is integer
# and address arithmetic, predicates and moves.
_LOOP_CLASSES = (("HMMA", "HMMA"), ("LDSM", "LDSM"), ("LDGSTS", "LDGSTS"), ("BAR", "barrier + waits"),
                 ("DEPBAR", "barrier + waits"), ("LDGDEPBAR", "barrier + waits"), ("BRA", "branch, NOP"),
                 ("NOP", "branch, NOP"))
LOOP_COLUMNS = ("HMMA", "LDSM", "LDGSTS", "barrier + waits", "branch, NOP", "integer, address, other")


def main_loop(sass_text: str) -> tuple[list[str], int] | None:
    """The opcodes of the K loop and the K slices one pass through it covers.

    The loop is the longest span from a backward branch's target to the branch that contains a
    BAR.SYNC; ptxas unrolls some configurations by two, so the slices per pass are its BAR.SYNC
    count (one barrier per slice). None if there is no such span."""
    code = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _SASS_LINE.finditer(sass_text)]
    best: list[str] | None = None
    for address, opcode, operands in code:
        target = re.search(r"0x([0-9a-f]+)", operands) if opcode == "BRA" else None
        if target is None or int(target.group(1), 16) >= address:
            continue
        body = [op for a, op, _ in code if int(target.group(1), 16) <= a <= address]
        if any(op.startswith("BAR.SYNC") for op in body) and (best is None or len(body) > len(best)):
            best = body
    if best is None:
        return None
    return best, sum(op.startswith("BAR.SYNC") for op in best)


def main_loop_kinds(sass_text: str) -> dict[str, float] | None:
    """SASS instructions per K slice of the main loop, by LOOP_COLUMNS kind plus 'total'."""
    loop = main_loop(sass_text)
    if loop is None:
        return None
    ops, slices = loop
    kinds = Counter(next((kind for prefix, kind in _LOOP_CLASSES if op.startswith(prefix)), LOOP_COLUMNS[-1])
                    for op in ops)
    return {"total": len(ops) / slices, **{c: kinds[c] / slices for c in LOOP_COLUMNS}}


def main_loop_markdown(sass_by_variant: dict[str, str]) -> str:
    """SASS instructions per K slice in each plain (not FRAG_DB) variant's main loop, by kind."""
    headers = ["kernel", "SASS per K slice", *LOOP_COLUMNS]
    body = []
    for variant, text in sass_by_variant.items():
        kinds = main_loop_kinds(text)
        if kinds is not None:
            body.append([variant, *(f"{kinds[c]:g}" for c in ("total", *LOOP_COLUMNS))])
    return markdown_table(headers, body)


def static_outputs(root: Path) -> list[Path]:
    from moe_gemm.variants.k1 import all_configs, compile_report

    rows = compile_report(ARCH)
    plain = sorted((v for v in all_configs() if not v.frag_db), key=lambda v: (v.bm, v.stages))
    outputs = {
        "compile_report": compile_report_markdown(rows),
        "register_arithmetic": register_arithmetic_markdown(rows),
        "main_loop": main_loop_markdown({v.name: v.compile(ARCH).sass() for v in plain}),
        "eta_prediction": eta_markdown(),
        "layout_a": fragments.a_layout_markdown(),
        "layout_b": fragments.b_layout_markdown(),
        "layout_c": fragments.c_layout_markdown(),
        "ldmatrix_addresses": fragments.ldmatrix_addresses_markdown(),
    }
    return [_write(root, name, text) for name, text in outputs.items()]


# --------------------------------------------------------------------------- from the results file

def _ceilings(data: dict[str, Any]) -> tuple[float, float]:
    """Dense bf16 TFLOP/s and copy TB/s measured in the run, or the SPEC's H200 values if absent."""
    from moe_gemm.ceilings import ceiling_value

    ceilings = data.get("ceilings", [])
    return (ceiling_value(ceilings, "dense_bf16") or H200_DENSE_BF16_TFLOPS,
            ceiling_value(ceilings, "copy") or H200_COPY_TBPS)


def _parts(variant: str) -> tuple[int, int, bool]:
    """'k1/bm64-s3' -> (64, 3, False); 'k1/bm64-fragdb' -> (64, 2, True)."""
    m = re.fullmatch(r"k1/bm(\d+)(?:-s(\d))?(-fragdb)?", variant)
    if m is None:
        raise ValueError(f"not a k1 variant name: {variant!r}")
    return int(m.group(1)), int(m.group(2) or 2), bool(m.group(3))


def _short(variant: str) -> str:
    return variant.removeprefix("k1/")


def _issue_active(p: dict[str, Any]) -> float:
    """ncu's issue-active fraction; the percentage counter carries more digits than the ratio."""
    return p["issue_active_pct"] / 100 if "issue_active_pct" in p else p["issue_active"]


class Missing(LookupError):
    """A findings snippet needs a record, profile or field that this results file lacks."""


class Measured:
    """Look-ups into one results file for the findings snippets; anything absent raises Missing."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.records = data["records"]
        self.profiles = {p["variant"]: p for p in data.get("profile", [])}

    def record(self, variant: str, workload: Workload = BALANCED) -> dict[str, Any]:
        found = find_measurement(self.records, variant, workload)
        if found is None:
            raise Missing(f"no record of {variant} at {workload.label}")
        return found

    def has(self, variant: str, workload: Workload = BALANCED) -> bool:
        return find_measurement(self.records, variant, workload) is not None

    def tflops(self, variant: str, workload: Workload = BALANCED) -> float:
        return self.record(variant, workload)["useful_tflops"]

    def profile(self, variant: str, *fields: str) -> dict[str, Any]:
        p = self.profiles.get(variant)
        if p is None or any(f not in p for f in fields):
            raise Missing(f"no ncu profile of {variant} with {', '.join(fields) or 'counters'}")
        return p

    def ceiling(self, name: str) -> float:
        from moe_gemm.ceilings import ceiling_value

        value = ceiling_value(self.data.get("ceilings", []), name)
        if value is None:
            raise Missing(f"no ceiling/{name} in this run")
        return value

    def mma_count(self, variant: str) -> float:
        """mma.sync instructions (per warp) at the profiled workload: scheduled FLOP / 4,096."""
        r = self.record(variant)
        return r["tiles"] * r["bm"] * r["bn"] * r["K"] * 2 / MMA_FLOP

    def warp_slices(self, variant: str) -> float:
        """Warp passes over one BK = 32 slice of K at the profiled workload: tiles x warps x K / BK."""
        from moe_gemm.variants.k1 import BK

        r = self.record(variant)
        return r["tiles"] * r["warps_per_block"] * r["K"] / BK

    def per_slice(self, variant: str) -> float:
        """Instructions each warp issues per K slice (prologue and epilogue shared out)."""
        return self.profile(variant, "instructions")["instructions"] / self.warp_slices(variant)

    def per_mma(self, variant: str) -> float:
        return self.profile(variant, "instructions")["instructions"] / self.mma_count(variant)

    def counter_time(self, variant: str) -> float:
        """Issue model of the run time, up to a constant: instructions x L / W."""
        p = self.profile(variant, "instructions", "cycles_per_issue", "warps_per_scheduler")
        return p["instructions"] * p["cycles_per_issue"] / p["warps_per_scheduler"]

    def model_w(self, variant: str) -> float:
        row = next((r for r in self.data.get("compile_report", []) if r["variant"] == variant), None)
        if row is None:
            raise Missing(f"no compile report row for {variant}")
        return row["blocks_per_sm"] * row["warps_per_block"] / HOPPER.schedulers

    def present(self, variants: Sequence[str] = SWEEP, workload: Workload = BALANCED) -> list[str]:
        return [v for v in variants if self.has(v, workload)]


def _pct(new: float, old: float) -> str:
    """Signed relative change in percent: '+3.4 %'."""
    return f"{100 * (new / old - 1):+.1f} %"


def _arrow(p_old: dict[str, Any], p_new: dict[str, Any], key: str, spec: str = ".2f") -> str:
    return f"{format(p_old[key], spec)} → {format(p_new[key], spec)}"


# ---- the BM sweep, two stages against three

def _bar_label(ax, bars, values) -> None:
    ax.bar_label(bars, [f"{v:.0f}" if np.isfinite(v) else "" for v in values], fontsize=7, padding=1)


def bm_sweep_figure(data: dict[str, Any]):
    """One panel per workload: for each BM the two-stage and three-stage ring side by side, FRAG_DB
    beside BM = 64, torch._grouped_mm as a line, and the 250 target at 16k s = 0."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    records = data["records"]
    dense, copy = _ceilings(data)
    fig, axes = new_figure(10.5, 4.6, ncols=3)
    slots = {2: -0.3, 3: 0.0, "fragdb": 0.3}
    for ax, w in zip(axes, WORKLOADS):
        for bm_index, bm in enumerate(BMS):
            for key, variant in ((2, f"k1/bm{bm}"), (3, f"k1/bm{bm}-s3"), ("fragdb", f"k1/bm{bm}-fragdb")):
                rec = find_measurement(records, variant, w)
                if rec is None:
                    continue
                value = rec["useful_tflops"]
                bars = ax.bar(bm_index + slots[key], value, 0.28, color=VARIANT_COLORS.get(variant, LIGHT[bm]),
                              edgecolor=BM_COLORS[bm], linewidth=0.8, hatch="///" if key == "fragdb" else None)
                _bar_label(ax, bars, [value])
        top = max([r["useful_tflops"] for r in records if w.matches(r)] + [1.0])
        peer = find_measurement(records, PEER, w)
        limit = roofline_tflops(w.experts, w.tokens, w.K, w.N, peak_tflops=dense, bandwidth_tbps=copy)
        notes = [f"roofline {limit:.0f}"]
        if peer:
            ax.axhline(peer["useful_tflops"], color=COLORS["peer"], linestyle=":", linewidth=1.3)
            notes.append(f"torch._grouped_mm {peer['useful_tflops']:.0f}")
        if w == BALANCED:
            ax.axhline(TARGET_TFLOPS, color="#444444", linestyle="--", linewidth=1)
        ax.set_ylim(0, top * 1.12)
        ax.set_xticks(range(len(BMS)), [f"BM = {bm}" for bm in BMS])
        ax.set_title(f"{w.label}\n({', '.join(notes)})", fontsize=9)
    axes[0].set_ylabel("useful TFLOP/s")
    handles = [Patch(facecolor="#dddddd", edgecolor="#666666", label="two stages"),
               Patch(facecolor="#666666", edgecolor="#666666", label="three stages"),
               Patch(facecolor="#dddddd", edgecolor="#666666", hatch="///", label="FRAG_DB (two stages)"),
               Line2D([], [], color=COLORS["peer"], linestyle=":", label="torch._grouped_mm, same run"),
               Line2D([], [], color="#444444", linestyle="--", label=f"target {TARGET_TFLOPS:.0f} (16k, s=0)")]
    # Inside the first panel, between the bars and the peer's line: a legend outside the axes would
    # squeeze the panels under save_figure's tight_layout.
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.86), fontsize=7, framealpha=0.9,
                   frameon=True, edgecolor="#cccccc")
    fig.suptitle(f"k1: BM and ring depth beside torch._grouped_mm ({data['provenance']['gpu']}, same run)",
                 fontsize=11)
    return fig


def tile_fill_figure(data: dict[str, Any]):
    """At 2,048 balanced rows each expert has 32 rows: eta = 1, 0.5, 0.25 for BM = 32, 64, 128."""
    from matplotlib.patches import Patch

    records = data["records"]
    fig, ax = new_figure(8.0, 4.2)
    for i, bm in enumerate(BMS):
        e = eta(expert_counts(SMALL.experts, SMALL.tokens, SMALL.skew), bm)
        for j, (variant, color) in enumerate(((f"k1/bm{bm}", LIGHT[bm]), (f"k1/bm{bm}-s3", BM_COLORS[bm]))):
            rec, base = find_measurement(records, variant, SMALL), find_measurement(records, variant, BALANCED)
            x = i + (j - 0.5) * 0.42
            if rec:
                bars = ax.bar(x - 0.1, rec["useful_tflops"], 0.2, color=color, edgecolor=BM_COLORS[bm])
                _bar_label(ax, bars, [rec["useful_tflops"]])
            if base:
                ax.bar(x + 0.1, eta_estimate(base["useful_tflops"], e, base["eta"]), 0.2, color="white",
                       edgecolor=color if j else BM_COLORS[bm], hatch="//")
        ax.text(i, 2, f"eta = {e:.2f}", ha="center", va="bottom", fontsize=8, color="white",
                bbox={"facecolor": "#444444", "edgecolor": "none", "pad": 1.5})
    dense, copy = _ceilings(data)
    limit = roofline_tflops(SMALL.experts, SMALL.tokens, SMALL.K, SMALL.N, peak_tflops=dense, bandwidth_tbps=copy)
    ax.axhline(limit, color=COLORS["ceiling"], linestyle="--", linewidth=1)
    ax.text(2.55, limit, f"memory roofline {limit:.0f}", ha="right", va="bottom", fontsize=7)
    peer = find_measurement(records, PEER, SMALL)
    if peer:
        ax.axhline(peer["useful_tflops"], color=COLORS["peer"], linestyle=":", linewidth=1.3)
        ax.text(2.55, peer["useful_tflops"], f"torch._grouped_mm {peer['useful_tflops']:.0f}", ha="right",
                va="bottom", fontsize=7, color=COLORS["peer"])
    ax.set_xticks(range(len(BMS)), [f"BM = {bm}" for bm in BMS])
    ax.set_ylabel("useful TFLOP/s")
    ax.set_title("Tile fill at 2,048 balanced rows (32 rows per expert)")
    handles = [Patch(facecolor="#dddddd", edgecolor="#666666", label="measured, two stages"),
               Patch(facecolor="#666666", edgecolor="#666666", label="measured, three stages"),
               Patch(facecolor="white", edgecolor="#666666", hatch="//",
                     label="eta-only estimate from the same variant at 16,384 rows")]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    return fig


# ---- Nsight Compute: the issue model and the stall breakdown

def _profiled(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Profiles with the issue model's counters, in SWEEP order."""
    profiles = {p["variant"]: p for p in data.get("profile", []) if p.get("issue_model") is not None}
    return [profiles[v] for v in SWEEP if v in profiles] + [p for v, p in profiles.items() if v not in SWEEP]


def issue_model_figure(data: dict[str, Any]):
    profiles = _profiled(data)
    fig, (left, right) = new_figure(10.0, 4.0, ncols=2)
    predicted_w = {r["variant"]: r["blocks_per_sm"] * r["warps_per_block"] / 4 for r in data.get("compile_report", [])}
    names = [p["variant"] for p in profiles]
    labels = [_short(n) for n in names]
    colors = [VARIANT_COLORS.get(n, "#8c564b") for n in names]
    x = np.arange(len(names))
    left.bar(x - 0.2, [predicted_w.get(n, np.nan) for n in names], 0.4, color="#bbbbbb", label="occupancy model")
    bars = left.bar(x + 0.2, [p["warps_per_scheduler"] for p in profiles], 0.4, color=colors, edgecolor="#444444",
                    linewidth=0.5, label="ncu (achieved)")
    left.bar_label(bars, [f"{p['warps_per_scheduler']:.2f}" for p in profiles], fontsize=6.5, padding=1)
    left.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    left.set_ylabel("W, warps per scheduler")
    left.set_ylim(0, 9.5)
    left.set_title("Resident warps: model vs achieved")
    left.legend(fontsize=8, loc="upper right")
    model = [p["issue_model"] for p in profiles]
    measured = [_issue_active(p) for p in profiles]
    right.bar(x - 0.2, model, 0.4, color="#bbbbbb", label="W / L (ncu's W and L)")
    bars = right.bar(x + 0.2, measured, 0.4, color=colors, edgecolor="#444444", linewidth=0.5,
                     label="issue-active (ncu)")
    right.bar_label(bars, [f"{v:.3f}" for v in measured], fontsize=6.5, padding=1, rotation=90)
    right.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    right.set_ylim(0, max(model + measured + [0.1]) * 1.3)
    right.set_ylabel("issued instructions per scheduler cycle")
    right.set_title("Issue rate: model vs counter")
    right.legend(fontsize=8, loc="upper left", ncol=2)
    return fig


def _has_stalls(data: dict[str, Any]) -> bool:
    return any("stall_long_scoreboard" in p and "instructions" in p for p in _profiled(data))


def stalls_figure(data: dict[str, Any]):
    """Left: L split by ncu's stall reasons. Right: instructions issued per mma.sync. Their product
    over W is the issue model's time per mma.sync."""
    measured = Measured(data)
    profiles = [p for p in _profiled(data) if "stall_long_scoreboard" in p and "instructions" in p]
    names = [p["variant"] for p in profiles]
    x = np.arange(len(names))
    fig, (left, right) = new_figure(10.0, 4.3, ncols=2)
    bottom = np.zeros(len(names))
    for reason in (*STALLS_SHOWN, "other"):
        if reason == "other":
            values = np.array([p["cycles_per_issue"] - sum(p.get(f"stall_{r}", 0.0) for r in STALLS_SHOWN)
                               for p in profiles]).clip(min=0)
        else:
            values = np.array([p.get(f"stall_{reason}", 0.0) for p in profiles])
        left.bar(x, values, 0.65, bottom=bottom, color=STALL_COLORS[reason], label=reason, edgecolor="white",
                 linewidth=0.4)
        bottom += values
    for xi, p in zip(x, profiles):
        left.text(xi, bottom[xi] + 0.3, f"{p['cycles_per_issue']:.1f}", ha="center", va="bottom", fontsize=7)
    left.set_xticks(x, [_short(n) for n in names], rotation=35, ha="right", fontsize=8)
    left.set_ylabel("warp cycles per issued instruction (L)")
    left.set_ylim(0, max(bottom) * 1.12)
    left.set_title("Where a warp waits (ncu stall reasons, 16k rows, s=0)")
    handles, labels = left.get_legend_handles_labels()
    per_mma = []
    for n in names:
        try:
            per_mma.append(measured.per_mma(n))
        except Missing:
            per_mma.append(np.nan)
    bars = right.bar(x, per_mma, 0.65, color=[VARIANT_COLORS.get(n, "#8c564b") for n in names],
                     edgecolor=[BM_COLORS.get(_parts(n)[0], "#444444") for n in names], linewidth=0.8,
                     hatch=["///" if _parts(n)[2] else None for n in names])
    right.bar_label(bars, [f"{v:.2f}" for v in per_mma], fontsize=7, padding=1)
    right.set_xticks(x, [_short(n) for n in names], rotation=35, ha="right", fontsize=8)
    right.set_ylabel("instructions issued per mma.sync")
    right.set_ylim(0, np.nanmax(per_mma + [1.0]) * 1.15)
    right.set_title("What a warp issues (ncu instructions / mma count)")
    left.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=7,
                title="stall reason, stacked from the bottom in this order (down each column)", title_fontsize=7)
    return fig


# ---- tables

def measurements_markdown(data: dict[str, Any]) -> str:
    dense, copy = _ceilings(data)
    order = {v: i for i, v in enumerate((*SWEEP, PEER))}
    workloads = {w.label: i for i, w in enumerate(WORKLOADS)}
    records = sorted((r for r in data["records"] if r["variant"] in order),
                     key=lambda r: (workloads.get(Workload(r["tokens"], r["skew"], r["experts"], r["K"], r["N"]).label,
                                                  len(workloads)), order[r["variant"]]))
    headers = ["variant", "workload", "median ms", "useful TFLOP/s", "vs peer", "% roofline", "eta", "tiles",
               "regs", "smem KB", "blocks/SM"]
    body = []
    for r in records:
        w = Workload(r["tokens"], r["skew"], r["experts"], r["K"], r["N"])
        peer = find_measurement(data["records"], PEER, w)
        limit = roofline_tflops(r["experts"], r["tokens"], r["K"], r["N"], peak_tflops=dense, bandwidth_tbps=copy)
        body.append([r["variant"], w.label, f"{r['median_ms']:.3f}", f"{r['useful_tflops']:.1f}",
                     f"{r['useful_tflops'] / peer['useful_tflops']:.2f}" if peer else "-",
                     f"{100 * r['useful_tflops'] / limit:.1f}", f"{r['eta']:.3f}" if r.get("eta") is not None else "-",
                     r.get("tiles") or "-", r.get("registers") or "-",
                     f"{r['smem_bytes'] / 1024:.1f}" if r.get("smem_bytes") else "-", r.get("blocks_per_sm") or "-"])
    return markdown_table(headers, body)


def model_markdown(data: dict[str, Any]) -> str:
    """The eta-only estimate from each variant's balanced 16k rate against the skewed and small runs."""
    records = data["records"]
    headers = ["variant", "16k s=0", "eta 16k s=1.2", "estimate", "measured 16k s=1.2", "measured / estimate",
               "eta 2k", "estimate 2k", "measured 2k", "measured / estimate 2k"]
    body = []
    for variant in SWEEP:
        base = find_measurement(records, variant, BALANCED)
        if base is None:
            continue
        row: list[Any] = [variant, f"{base['useful_tflops']:.1f}"]
        for w in (SKEWED, SMALL):
            rec = find_measurement(records, variant, w)
            e = eta(expert_counts(w.experts, w.tokens, w.skew), base["bm"])
            estimate = eta_estimate(base["useful_tflops"], e, base["eta"])
            row += [f"{e:.3f}", f"{estimate:.1f}", f"{rec['useful_tflops']:.1f}" if rec else "-",
                    f"{rec['useful_tflops'] / estimate:.3f}" if rec else "-"]
        body.append(row)
    return markdown_table(headers, body)


def ceilings_markdown(data: dict[str, Any]) -> str:
    ceilings = data.get("ceilings", [])
    if not ceilings:
        return "*No ceilings were measured in this run.*\n"
    body = [[c["variant"], f"{c['tbps']:.2f} TB/s" if "tbps" in c else f"{c['tflops']:.1f} TFLOP/s"]
            for c in ceilings]
    return markdown_table(["ceiling", f"measured on {data['provenance']['gpu']}"], body)


def profile_markdown(data: dict[str, Any]) -> str:
    profiles = _profiled(data) or data.get("profile", [])
    if not profiles:
        return "*Not profiled yet: `python chapters/02/run.py --profile` records these counters with ncu.*\n"
    measured = Measured(data)
    predicted_w = {r["variant"]: r["blocks_per_sm"] * r["warps_per_block"] / 4 for r in data.get("compile_report", [])}
    headers = ["variant", "W (model)", "W (ncu)", "L (ncu)", "W / L", "issue-active (ncu)", "4 W / L",
               "IPC (ncu)", "instructions (M)", "per mma.sync"]
    body = []
    for p in profiles:
        model = p.get("issue_model")
        try:
            per_mma = f"{measured.per_mma(p['variant']):.2f}"
        except (Missing, KeyError):
            per_mma = "-"
        body.append([p["variant"], f"{predicted_w.get(p['variant'], float('nan')):g}",
                     f"{p['warps_per_scheduler']:.2f}", f"{p['cycles_per_issue']:.2f}",
                     "-" if model is None else f"{model:.3f}", f"{_issue_active(p):.3f}",
                     "-" if model is None else f"{4 * model:.2f}", f"{p['ipc']:.2f}" if "ipc" in p else "-",
                     f"{p['instructions'] / 1e6:.1f}" if "instructions" in p else "-", per_mma])
    return markdown_table(headers, body)


def stages_markdown(data: dict[str, Any]) -> str:
    """Two stages against three per BM: throughput, the issue model's terms and the stalls that moved."""
    m = Measured(data)
    headers = ["BM", "useful TFLOP/s, 2 → 3 stages", "measured gain", "L", "long_scoreboard", "mio_throttle",
               "short_scoreboard", "instructions per warp per K slice", "gain by I·L/W", "tensor pipe active %"]
    body = []
    for bm in BMS:
        two, three = f"k1/bm{bm}", f"k1/bm{bm}-s3"
        try:
            p2, p3 = m.profile(two, "stall_long_scoreboard"), m.profile(three, "stall_long_scoreboard")
            body.append([bm, f"{m.tflops(two):.1f} → {m.tflops(three):.1f}", _pct(m.tflops(three), m.tflops(two)),
                         _arrow(p2, p3, "cycles_per_issue"), _arrow(p2, p3, "stall_long_scoreboard"),
                         _arrow(p2, p3, "stall_mio_throttle"), _arrow(p2, p3, "stall_short_scoreboard"),
                         f"{m.per_slice(two):.1f} → {m.per_slice(three):.1f}",
                         _pct(m.counter_time(two), m.counter_time(three)),
                         _arrow(p2, p3, "tensor_pipe_pct", ".1f") if "tensor_pipe_pct" in p2 else "-"])
        except (Missing, KeyError):
            continue
    if not body:
        return "*Not in this results file: the stage comparison needs both rings profiled with stall reasons.*\n"
    return markdown_table(headers, body)


def provenance_markdown(data: dict[str, Any]) -> str:
    prov = data["provenance"]
    packages = prov.get("packages", {})
    body = [["GPU", f"{prov['gpu']} (compute capability {prov['compute_capability']})"],
            ["driver (CUDA)", str(prov.get("driver"))], ["NVRTC", str(prov.get("cuda", {}).get("nvrtc", "-"))],
            ["torch", packages.get("torch", "-")], ["cuda-core", packages.get("cuda-core", "-")],
            ["git commit", prov["git_commit"]], ["date", prov["date"]], ["command", f"`{prov['command']}`"]]
    return markdown_table(["", "recorded with"], body)


# --------------------------------------------------------------------------- findings: the page's measured sentences
#
# Each function returns markdown (bullets or a table) whose every number comes from the results
# file; the page includes them with --8<-- and writes its reasoning around them. A claim that
# depends on which way a measurement went (a prediction held or not) is worded from the data.

def _fastest(m: Measured, variants: Sequence[str], workload: Workload = BALANCED) -> str:
    present = m.present(variants, workload)
    if not present:
        raise Missing(f"no k1 record at {workload.label}")
    return max(present, key=lambda v: m.tflops(v, workload))


def _plain(stages: int) -> list[str]:
    return [v for v in SWEEP if _parts(v)[1] == stages and not _parts(v)[2]]


def _rank(m: Measured, variant: str, workload: Workload = BALANCED) -> tuple[int, int]:
    present = sorted(m.present(SWEEP, workload), key=lambda v: -m.tflops(v, workload))
    return present.index(variant) + 1, len(present)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def findings_headline(data: dict[str, Any]) -> str:
    m = Measured(data)
    best, best2 = _fastest(m, SWEEP), _fastest(m, _plain(2))
    top, top2, peer = m.tflops(best), m.tflops(best2), m.tflops(PEER)
    mma, dense = m.ceiling("mma_sync"), m.ceiling("dense_bf16")
    lines = [f"- **16,384 rows, s = 0.** The fastest k1 variant is `{best}` at **{top:.1f}** useful TFLOP/s, "
             f"{top / TARGET_TFLOPS:.2f}× the chapter's target of {TARGET_TFLOPS:.0f}: the target is "
             f"{'met' if top >= TARGET_TFLOPS else 'missed'}. The fastest two-stage variant, `{best2}`, reaches "
             f"{top2:.1f} ({top2 / TARGET_TFLOPS:.2f}× the target).",
             f"- **Against CUTLASS, same inputs, same run.** `torch._grouped_mm` reached {peer:.1f} useful "
             f"TFLOP/s; k1's best is {top / peer:.2f}× of it.",
             f"- **Against the instruction's own ceiling.** {top:.1f} is {100 * top / mma:.1f} % of the {mma:.1f} "
             f"TFLOP/s that the register-only `mma.sync` kernel reached in this run, and {100 * top / dense:.1f} % "
             f"of cuBLAS's dense bf16 rate ({dense:.1f})."]
    small32, small128 = m.tflops("k1/bm32", SMALL), m.tflops("k1/bm128", SMALL)
    seed = data.get("seed_b300_reference", {})
    seed_text = ""
    if "2k s=0" in seed.get("k1/bm32", {}) and "2k s=0" in seed.get("k1/bm128", {}):
        s32, s128 = seed["k1/bm32"]["2k s=0"], seed["k1/bm128"]["2k s=0"]
        seed_text = f" (the seed's B300 numbers: {s32:.1f} against {s128:.1f}, {s32 / s128:.2f}×)"
    best_small = _fastest(m, SWEEP, SMALL)
    peer_small = m.tflops(PEER, SMALL)
    lines.append(f"- **2,048 rows, s = 0.** `k1/bm32` runs at {small32:.1f} against `k1/bm128`'s {small128:.1f}, "
                 f"{small32 / small128:.2f}×{seed_text}: BM = 32 "
                 f"{'beats' if small32 > small128 else 'does not beat'} BM = 128. The fastest k1 variant there is "
                 f"`{best_small}` at {m.tflops(best_small, SMALL):.1f}, "
                 f"{m.tflops(best_small, SMALL) / peer_small:.2f}× `torch._grouped_mm` ({peer_small:.1f}).")
    return "\n".join(lines) + "\n"


def findings_sweep(data: dict[str, Any]) -> str:
    m = Measured(data)
    lines = []
    for stages, label in ((2, "two stages"), (3, "three stages")):
        order = sorted(m.present(_plain(stages)), key=lambda v: -m.tflops(v))
        if not order:
            continue
        lead = m.tflops(order[0])
        rest = ", ".join(f"`{v}` {m.tflops(v):.1f} ({_pct(m.tflops(v), lead)})" for v in order[1:])
        lines.append(f"- **16,384 rows, s = 0, {label}:** `{order[0]}` {lead:.1f} first, then {rest}.")
    winners = {_parts(_fastest(m, _plain(stages)))[0] for stages in (2, 3) if m.present(_plain(stages))}
    if winners == {64}:
        verdict = "held: BM = 64 is fastest"
    else:
        verdict = (f"did not hold: BM = {' and '.join(str(bm) for bm in sorted(winners))} is fastest"
                   f"{' at either depth' if len(winners) == 1 else ''}")
    lines.append(f"- **Prediction 1** (BM = 64 fastest at 16,384 rows, s = 0) {verdict}.")
    mma = m.ceiling("mma_sync")
    rows, gaps = [], []
    for v in m.present(SWEEP):
        share = 100 * m.tflops(v) / mma
        pipe = m.profiles.get(v, {}).get("tensor_pipe_pct")
        if pipe is not None:
            gaps.append(abs(pipe - share))
        rows.append([f"`{v}`", f"{m.tflops(v):.1f}", f"{share:.1f}", "-" if pipe is None else f"{pipe:.1f}"])
    if gaps:
        lines.append(f"- **Tensor pipe.** For every profiled variant the tensor pipe's active fraction (ncu) is "
                     f"within {max(gaps):.1f} points of the fraction of the `mma.sync` ceiling ({mma:.1f} "
                     f"TFLOP/s) that the variant reaches:")
    text = "\n".join(lines) + "\n"
    if gaps:
        text += "\n" + markdown_table(["variant", "useful TFLOP/s", "% of mma.sync ceiling",
                                       "tensor pipe active % (ncu)"], rows)
    return text


def _wave_efficiency(tiles: int, slots: int) -> float:
    """Busy fraction of the SMs if every tile cost the same: waves / whole waves."""
    return (tiles / slots) / math.ceil(tiles / slots)


def findings_model(data: dict[str, Any]) -> str:
    m = Measured(data)
    ratios = {}
    for v in m.present(SWEEP):
        if m.has(v, SKEWED):
            base = m.record(v)
            ratios[v] = m.tflops(v, SKEWED) / eta_estimate(base["useful_tflops"], m.record(v, SKEWED)["eta"],
                                                            base["eta"])
    if not ratios:
        raise Missing("no skewed records")
    low, high = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    side = ("pessimistic" if min(ratios.values()) >= 1 else "optimistic" if max(ratios.values()) <= 1
            else "neither uniformly pessimistic nor optimistic")
    lines = ["- **Measured / estimate at 16,384 rows, s = 1.2:** "
             + ", ".join(f"`{_short(v)}` {r:.3f}" for v, r in ratios.items()) + ". "
             f"The estimate is {side} for every variant: the measurement differs from it by "
             f"{100 * (ratios[low] - 1):+.1f} % for `{low}` and {100 * (ratios[high] - 1):+.1f} % for `{high}`."]
    faster = []
    for v in _plain(2):
        if m.has(v) and m.has(v, SKEWED):
            faster.append(f"`{_short(v)}` {m.record(v, SKEWED)['scheduled_tflops']:.1f} against "
                          f"{m.record(v)['scheduled_tflops']:.1f}")
    lines.append("- **Scheduled TFLOP/s** (padded rows counted as work), s = 1.2 against s = 0: "
                 + "; ".join(faster) + ".")
    if m.has("k1/bm128") and m.has("k1/bm128", SMALL):
        small, base = m.record("k1/bm128", SMALL), m.record("k1/bm128")
        lines.append(f"- **Partial tiles at 2,048 rows** (one $M$ tile per expert, a quarter of each `k1/bm128` "
                     f"tile real rows): `bm128` {small['scheduled_tflops']:.1f} scheduled TFLOP/s against "
                     f"{base['scheduled_tflops']:.1f} at 16,384 balanced rows.")
    sms = data["provenance"].get("sm_count")
    if sms:
        parts = []
        for v in _plain(2):
            if m.has(v) and m.has(v, SKEWED):
                b, s = m.record(v), m.record(v, SKEWED)
                slots = sms * b["blocks_per_sm"]
                gain = _wave_efficiency(s["tiles"], slots) / _wave_efficiency(b["tiles"], slots) - 1
                parts.append(f"`{_short(v)}` {b['tiles'] / slots:.2f} → {s['tiles'] / slots:.2f} waves, "
                             f"{100 * gain:+.1f} %")
        lines.append(f"- **Tail of the grid** ({sms} SMs × blocks per SM; every tile assumed to cost the same), "
                     f"s = 0 → s = 1.2: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def findings_tile_fill(data: dict[str, Any]) -> str:
    from moe_gemm.roofline import compulsory_bytes
    from moe_gemm.problem import useful_flops

    m = Measured(data)
    w = SMALL
    b32, b128, b64 = m.tflops("k1/bm32", w), m.tflops("k1/bm128", w), m.tflops("k1/bm64", w)
    lines = [f"- **BM = 32 against BM = 128:** {b32:.1f} against {b128:.1f} useful TFLOP/s, {b32 / b128:.2f}×"
             + (f"; with three stages {m.tflops('k1/bm32-s3', w):.1f} against {m.tflops('k1/bm128-s3', w):.1f}, "
                f"{m.tflops('k1/bm32-s3', w) / m.tflops('k1/bm128-s3', w):.2f}×"
                if m.has("k1/bm32-s3", w) and m.has("k1/bm128-s3", w) else "") + "."]
    dense, copy = _ceilings(data)
    nbytes = compulsory_bytes(w.experts, w.tokens, w.K, w.N)
    b_bytes = 2 * w.experts * w.K * w.N
    floor_us = nbytes / (copy * 1e12) * 1e6
    limit = roofline_tflops(w.experts, w.tokens, w.K, w.N, peak_tflops=dense, bandwidth_tbps=copy)
    best = _fastest(m, SWEEP, w)
    lines.append(f"- **The memory bound:** the {nbytes / 1e6:.1f} MB of compulsory traffic ({b_bytes / 1e6:.1f} MB "
                 f"of it $B$) takes {floor_us:.1f} µs at the measured {copy:.2f} TB/s, a roofline of {limit:.0f} "
                 f"TFLOP/s. `k1/bm32` takes {1e3 * m.record('k1/bm32', w)['median_ms']:.1f} µs, "
                 f"{100 * b32 / limit:.1f} % of the roofline; the fastest k1, `{best}`, "
                 f"{1e3 * m.record(best, w)['median_ms']:.1f} µs, {100 * m.tflops(best, w) / limit:.1f} %.")
    lines.append(f"- **BM = 64 against BM = 32:** {b64:.1f} against {b32:.1f} ({_pct(b64, b32)}), although "
                 f"BM = 64 schedules {1 / m.record('k1/bm64', w)['eta']:.0f}× the math "
                 f"({useful_flops(w.tokens, w.K, w.N) / m.record('k1/bm64', w)['eta'] / 1e9:.1f} GFLOP against "
                 f"{useful_flops(w.tokens, w.K, w.N) / 1e9:.1f}).")
    parts = []
    for v in _plain(2):
        if m.has(v) and m.has(v, w):
            base = m.record(v)
            estimate = eta_estimate(base["useful_tflops"], m.record(v, w)["eta"], base["eta"])
            ratio = m.tflops(v, w) / estimate
            parts.append(f"`{_short(v)}` estimated {estimate:.1f}, measured {m.tflops(v, w):.1f} ({ratio:.2f}×, "
                         f"{'overshoots' if ratio < 1 else 'undershoots'})")
    lines.append("- **The η-only estimate from 16,384 rows:** " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def findings_issue(data: dict[str, Any]) -> str:
    m = Measured(data)
    profiled = [v for v in SWEEP if v in m.profiles and m.profiles[v].get("issue_model") is not None]
    if not profiled:
        raise Missing("no profile")
    w_ratio = {v: m.profiles[v]["warps_per_scheduler"] / m.model_w(v) for v in profiled}
    models = sorted({f"{m.model_w(v):g}" for v in profiled}, key=float, reverse=True)
    lines = [f"- **W:** the achieved warps per scheduler are {100 * min(w_ratio.values()):.1f} to "
             f"{100 * max(w_ratio.values()):.1f} % of the occupancy model's W ({', '.join(models)}) "
             f"for all {len(profiled)} profiled variants."]
    diffs = {v: m.profiles[v]["issue_model"] - _issue_active(m.profiles[v]) for v in profiled}
    worst = max(diffs, key=lambda v: abs(diffs[v]))
    lines.append(f"- **W / L against issue-active:** the largest difference is {abs(diffs[worst]):.4f} "
                 f"(`{_short(worst)}`, {100 * abs(diffs[worst]) / _issue_active(m.profiles[worst]):.2f} % of its "
                 f"issue-active), over issue rates from {min(_issue_active(m.profiles[v]) for v in profiled):.3f} "
                 f"to {max(_issue_active(m.profiles[v]) for v in profiled):.3f}.")
    busiest = max(profiled, key=lambda v: _issue_active(m.profiles[v]))
    quietest = min(profiled, key=lambda v: _issue_active(m.profiles[v]))
    rank, total = _rank(m, busiest)
    fastest = _fastest(m, SWEEP)
    lines.append(f"- **Most issue, least speed:** `{busiest}` has the highest issue rate "
                 f"({_issue_active(m.profiles[busiest]):.3f}) and is the {_ordinal(rank)} fastest of {total} "
                 f"({m.tflops(busiest):.1f} TFLOP/s); `{quietest}` has the lowest "
                 f"({_issue_active(m.profiles[quietest]):.3f}) and is the {_ordinal(_rank(m, quietest)[0])} fastest; "
                 f"the fastest, `{fastest}`, issues on {_issue_active(m.profiles[fastest]):.3f} of its cycles.")
    most = max(profiled, key=lambda v: m.profiles[v]["instructions"])
    i32, i128 = m.profiles["k1/bm32"]["instructions"], m.profiles["k1/bm128"]["instructions"]
    share = {v: 100 * m.mma_count(v) / m.profiles[v]["instructions"] for v in profiled}
    lines.append(f"- **Instructions for the same useful work:** `k1/bm32` issues {i32 / 1e6:.1f} M, `k1/bm128` "
                 f"{i128 / 1e6:.1f} M ({i32 / i128:.2f}×): {m.per_mma('k1/bm32'):.2f} instructions per `mma.sync` "
                 f"against {m.per_mma('k1/bm128'):.2f}. `mma.sync` is {share['k1/bm32']:.1f} % of BM = 32's "
                 f"instruction stream and {share['k1/bm128']:.1f} % of BM = 128's. The most instructions: "
                 f"`{most}`, {m.profiles[most]['instructions'] / 1e6:.1f} M, the {_ordinal(_rank(m, most)[0])} "
                 f"fastest of {total}.")
    return "\n".join(lines) + "\n"


def findings_fragdb(data: dict[str, Any]) -> str:
    m = Measured(data)
    plain, fdb = "k1/bm64", "k1/bm64-fragdb"
    keys = ("warps_per_scheduler", "cycles_per_issue", "instructions", "stall_long_scoreboard")
    p, f = m.profile(plain, *keys), m.profile(fdb, *keys)
    w_drop = 1 - f["warps_per_scheduler"] / p["warps_per_scheduler"]
    l_drop = 1 - f["cycles_per_issue"] / p["cycles_per_issue"]
    lines = [f"- **W:** {_arrow(p, f, 'warps_per_scheduler')} warps per scheduler ({-100 * w_drop:+.1f} %), so "
             f"W / L breaks even only if L falls by more than {100 * w_drop:.1f} %. **L:** "
             f"{_arrow(p, f, 'cycles_per_issue')} ({-100 * l_drop:+.1f} %): "
             f"{'more' if l_drop > w_drop else 'less'} than needed. The issue rate W / L went from "
             f"{p['issue_model']:.3f} to {f['issue_model']:.3f} ({_pct(f['issue_model'], p['issue_model'])}).",
             f"- **Instructions:** {p['instructions'] / 1e6:.1f} M → {f['instructions'] / 1e6:.1f} M "
             f"({_pct(f['instructions'], p['instructions'])}); per warp per K slice {m.per_slice(plain):.1f} → "
             f"{m.per_slice(fdb):.1f}.",
             f"- **Net:** the issue model's time I·L/W puts FRAG_DB at "
             f"{m.counter_time(fdb) / m.counter_time(plain):.3f}× "
             f"the plain kernel's; measured, {m.tflops(fdb):.1f} against {m.tflops(plain):.1f} useful TFLOP/s "
             f"({_pct(m.tflops(fdb), m.tflops(plain))}), and {m.tflops(fdb, SMALL):.1f} against "
             f"{m.tflops(plain, SMALL):.1f} at 2,048 rows.",
             "- **Stalls per issued instruction, plain → FRAG_DB:** "
             + ", ".join(f"{r} {_arrow(p, f, 'stall_' + r)}" for r in
                         ("long_scoreboard", "barrier", "short_scoreboard", "mio_throttle") if "stall_" + r in p)
             + "."]
    return "\n".join(lines) + "\n"


def _top_stalls(p: dict[str, Any], n: int = 4) -> list[tuple[str, float]]:
    stalls = [(k.removeprefix("stall_"), v) for k, v in p.items()
              if k.startswith("stall_") and k not in ("stall_selected",)]
    return sorted(stalls, key=lambda kv: -kv[1])[:n]


def findings_stages_before(data: dict[str, Any]) -> str:
    m = Measured(data)
    lines = ["- **Two stages, 16,384 rows, s = 0:** " + ", ".join(
        f"`{v}` {m.tflops(v):.1f}" for v in sorted(m.present(_plain(2)), key=lambda v: -m.tflops(v)))
        + f" useful TFLOP/s, against the target of {TARGET_TFLOPS:.0f}."]
    for v in ("k1/bm64", "k1/bm128"):
        p = m.profile(v, "stall_long_scoreboard", "cycles_per_issue")
        top = _top_stalls(p)
        lines.append(f"- **`{v}`, stall reasons (warp cycles per issued instruction):** L = "
                     f"{p['cycles_per_issue']:.2f}, of which " + ", ".join(
                         f"{r} {c:.2f}" + (f" ({100 * c / p['cycles_per_issue']:.0f} %)" if i == 0 else "")
                         for i, (r, c) in enumerate(top)) + ".")
    return "\n".join(lines) + "\n"


def findings_stages_bm64(data: dict[str, Any]) -> str:
    return _stages_outcome(Measured(data), 64)


def findings_stages_bm128(data: dict[str, Any]) -> str:
    text = _stages_outcome(Measured(data), 128)
    m = Measured(data)
    gain = 100 * (m.tflops("k1/bm128-s3") / m.tflops("k1/bm128") - 1)
    lo, hi = PREDICTED_GAIN_BM128_S3
    where = "above" if gain > hi else "below" if gain < lo else "within"
    return text + (f"- **Against the prediction:** {gain:+.1f} % is {where} the predicted +{lo:g} to +{hi:g} %; "
                   f"`k1/bm128-s3` {'meets' if m.tflops('k1/bm128-s3') >= TARGET_TFLOPS else 'misses'} the "
                   f"target of {TARGET_TFLOPS:.0f}.\n")


def _stages_outcome(m: Measured, bm: int) -> str:
    two, three = f"k1/bm{bm}", f"k1/bm{bm}-s3"
    keys = ("cycles_per_issue", "warps_per_scheduler", "instructions", "stall_long_scoreboard")
    p2, p3 = m.profile(two, *keys), m.profile(three, *keys)
    moved = sorted(((r, p3[f"stall_{r}"] - p2[f"stall_{r}"]) for r in STALLS_SHOWN
                    if r != "selected" and f"stall_{r}" in p2 and f"stall_{r}" in p3), key=lambda kv: kv[1])
    fell = [f"{r} {_arrow(p2, p3, 'stall_' + r)}" for r, d in moved if d <= -0.2]
    rose = [f"{r} {_arrow(p2, p3, 'stall_' + r)}" for r, d in reversed(moved) if d >= 0.2]
    i_gain = p2["instructions"] / p3["instructions"]
    l_gain = p2["cycles_per_issue"] / p3["cycles_per_issue"]
    w_gain = p3["warps_per_scheduler"] / p2["warps_per_scheduler"]
    lines = [f"- **`{three}`:** {m.tflops(three):.1f} useful TFLOP/s against {m.tflops(two):.1f} with two stages "
             f"({_pct(m.tflops(three), m.tflops(two))}).",
             f"- **Stalls per issued instruction:** fell: {', '.join(fell) or 'none'}; rose: "
             f"{', '.join(rose) or 'none'}. L {_arrow(p2, p3, 'cycles_per_issue')} "
             f"({_pct(p3['cycles_per_issue'], p2['cycles_per_issue'])}).",
             f"- **Instructions per warp per K slice:** {m.per_slice(two):.1f} → {m.per_slice(three):.1f} "
             f"({_pct(p3['instructions'], p2['instructions'])}); W {_arrow(p2, p3, 'warps_per_scheduler')}.",
             f"- **The issue model, I·L/W:** {100 * (i_gain * l_gain * w_gain - 1):+.1f} % in throughput; "
             f"the change in L alone is worth {100 * (l_gain - 1):+.1f} %, the change in instruction count "
             f"{100 * (i_gain - 1):+.1f} %, the change in W {100 * (w_gain - 1):+.1f} %. Measured: "
             f"{_pct(m.tflops(three), m.tflops(two))} with events"
             + (f" and {_pct(p2['duration_ns'], p3['duration_ns'])} in ncu's profiled launch "
                f"({p2['duration_ns'] / 1e3:.1f} → {p3['duration_ns'] / 1e3:.1f} µs)"
                if "duration_ns" in p2 and "duration_ns" in p3 else "") + "."]
    return "\n".join(lines) + "\n"


FINDINGS: dict[str, Callable[[dict[str, Any]], str]] = {
    "findings_headline": findings_headline, "findings_sweep": findings_sweep, "findings_model": findings_model,
    "findings_tile_fill": findings_tile_fill, "findings_issue": findings_issue, "findings_fragdb": findings_fragdb,
    "findings_stages_before": findings_stages_before, "findings_stages_bm64": findings_stages_bm64,
    "findings_stages_bm128": findings_stages_bm128,
}


def findings_markdown(name: str, data: dict[str, Any]) -> str:
    """A findings snippet, or a line saying what the results file lacks for it (never a made-up number)."""
    try:
        return FINDINGS[name](data)
    except (Missing, KeyError, ValueError, ZeroDivisionError) as missing:
        return f"*Not available from this results file ({type(missing).__name__}: {missing}).*\n"


# --------------------------------------------------------------------------- writing

def _image(name: str, alt: str) -> str:
    return f"![{alt}](figures/{CHAPTER}/{name}.png)\n"


def measured_outputs(root: Path, data: dict[str, Any] | None) -> list[Path]:
    written = []
    figures = {"bm_sweep": ("k1's BM sweep, two and three stages, beside torch._grouped_mm", bm_sweep_figure, None),
               "tile_fill": ("tile fill at 2,048 rows", tile_fill_figure, None),
               "issue_model": ("the issue model against Nsight Compute", issue_model_figure,
                               lambda d: bool(_profiled(d))),
               "stalls": ("stall reasons and instructions per mma.sync from Nsight Compute", stalls_figure,
                          _has_stalls)}
    for name, (alt, draw, needs) in figures.items():
        if data is not None and (needs is None or needs(data)):
            written.append(save_figure(draw(data), CHAPTER, name, root))
            written.append(_write(root, f"{name}_figure", _image(name, alt)))
        else:
            (root / CHAPTER / f"{name}.png").unlink(missing_ok=True)  # never leave a stale figure behind
            written.append(_write(root, f"{name}_figure", NOT_MEASURED if data is None else
                                  "*Not profiled yet: `python chapters/02/run.py --profile` records these counters "
                                  "with ncu.*\n"))
    tables: dict[str, Callable[[dict[str, Any]], str]] = {
        "measurements": measurements_markdown, "model": model_markdown, "ceilings": ceilings_markdown,
        "profile": profile_markdown, "stages": stages_markdown, "provenance": provenance_markdown,
        **{name: functools.partial(findings_markdown, name) for name in FINDINGS}}
    for name, make in tables.items():
        written.append(_write(root, name, NOT_MEASURED if data is None else make(data)))
    return written


def _write(root: Path, name: str, text: str) -> Path:
    path = root / CHAPTER / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = chapter_parser(__doc__)
    parser.add_argument("--out", type=Path, default=FIGURE_ROOT,
                        help=f"figure root; files go to OUT/{CHAPTER}/ (default {FIGURE_ROOT})")
    args = parser.parse_args(argv)
    path = results_path(CHAPTER, GPU)
    data = load_results(path) if path.is_file() else None
    if data is None:
        print(f"no results at {path}: the measured figures and tables say 'not measured yet'")
    for written in static_outputs(args.out) + measured_outputs(args.out, data):
        print(written)
    return 0


if __name__ == "__main__":
    run_main(main)
