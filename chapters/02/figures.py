"""Chapter 02's figures, and the tables only the compiler can give.

    python chapters/02/figures.py          # writes site_docs/figures/02/*.png and *.md

* From the compiler alone (no GPU, no results file): markdown tables of the compile report of every
  k1 configuration for sm_90a, the register arithmetic behind each one's blocks per SM, the main
  loop's SASS per K slice by kind of instruction, and the ldmatrix / mma.sync fragment layouts,
  included into site_docs/02-mma-sync.md by pymdownx.snippets.
* From chapters/02/results/h200.json: the BM sweep (two and three stages), tile fill at 2,048 rows,
  and the issue model and stall breakdown from Nsight Compute's counters. A figure whose data the
  file lacks is not drawn. The page's own tables and numbers come from the same file through
  moe_gemm.site.pages.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm.chapter import PEER, SEED_WORKLOADS, figures_main, find, recorded, run_main
from moe_gemm.core.tables import markdown_table
from moe_gemm.measure.ceilings import roofline_basis
from moe_gemm.model.occupancy import HOPPER, registers_per_warp, residency
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import eta, eta_estimate
from moe_gemm.site.style import BM_COLORS, COLORS, new_figure, save_figure
from moe_gemm.variants.k1 import fragments

CHAPTER = "02"
ARCH = "sm_90a"  # the compiler's tables are for the recorded GPU's target
# Every k1 variant the chapter measures, grouped by BM: two stages, three stages, FRAG_DB.
SWEEP = ("k1/bm32", "k1/bm32-s3", "k1/bm64", "k1/bm64-s3", "k1/bm64-fragdb", "k1/bm128", "k1/bm128-s3")
BMS = (32, 64, 128)
# Two stages in a light tint of the BM colour, three stages in the full colour; FRAG_DB hatched.
LIGHT = {32: "#aec7e8", 64: "#98df8a", 128: "#ff9896"}
VARIANT_COLORS = {**{f"k1/bm{bm}": LIGHT[bm] for bm in BMS}, **{f"k1/bm{bm}-s3": BM_COLORS[bm] for bm in BMS},
                  "k1/bm64-fragdb": LIGHT[64], PEER: COLORS["peer"]}
WORKLOADS = SEED_WORKLOADS
BALANCED, SKEWED, SMALL = WORKLOADS
TARGET_TFLOPS = 250.0  # the project's target for k1 (best BM): useful TFLOP/s at 16,384 rows, s = 0
MMA_FLOP = 2 * 16 * 8 * 16  # one mma.sync.m16n8k16 per warp
# Stall reasons drawn separately in the stall figure (cycles per issued instruction); the rest
# are summed as "other".
STALLS_SHOWN = ("long_scoreboard", "barrier", "mio_throttle", "short_scoreboard", "wait", "math_pipe_throttle",
                "not_selected", "selected")
STALL_COLORS = {"long_scoreboard": "#d62728", "barrier": "#ff7f0e", "mio_throttle": "#9467bd",
                "short_scoreboard": "#e377c2", "wait": "#8c564b", "math_pipe_throttle": "#17becf",
                "not_selected": "#bcbd22", "selected": "#7f7f7f", "other": "#dddddd"}


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
        "layout_a": fragments.a_layout_markdown(),
        "layout_b": fragments.b_layout_markdown(),
        "layout_c": fragments.c_layout_markdown(),
        "ldmatrix_addresses": fragments.ldmatrix_addresses_markdown(),
    }
    return [_write(root, name, text) for name, text in outputs.items()]


# --------------------------------------------------------------------------- from the results file

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


def per_mma(record: dict[str, Any], profile: dict[str, Any]) -> float:
    """Instructions issued per mma.sync (one per 4,096 scheduled FLOP) in one profiled launch."""
    mmas = record["tiles"] * record["bm"] * record["bn"] * record["K"] * 2 / MMA_FLOP
    return profile["instructions"] / mmas


# ---- the BM sweep, two stages against three

def _bar_label(ax, bars, values) -> None:
    ax.bar_label(bars, [f"{v:.0f}" if np.isfinite(v) else "" for v in values], fontsize=9.5, padding=1)


def bm_sweep_figure(data: dict[str, Any]):
    """One panel per workload: for each BM the two-stage and three-stage ring side by side, FRAG_DB
    beside BM = 64, torch._grouped_mm as a line, and the 250 target at 16k s = 0."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    records = data["records"]
    basis = roofline_basis()
    fig, axes = new_figure(10.0, 4.8, ncols=3)
    slots = {2: -0.3, 3: 0.0, "fragdb": 0.3}
    for ax, w in zip(axes, WORKLOADS):
        for bm_index, bm in enumerate(BMS):
            for key, variant in ((2, f"k1/bm{bm}"), (3, f"k1/bm{bm}-s3"), ("fragdb", f"k1/bm{bm}-fragdb")):
                rec = find(records, variant, w)
                if rec is None:
                    continue
                value = rec["useful_tflops"]
                bars = ax.bar(bm_index + slots[key], value, 0.28, color=VARIANT_COLORS.get(variant, LIGHT[bm]),
                              edgecolor=BM_COLORS[bm], linewidth=0.8, hatch="///" if key == "fragdb" else None)
                _bar_label(ax, bars, [value])
        top = max([r["useful_tflops"] for r in records if w.matches(r)] + [1.0])
        peer = find(records, PEER, w)
        limit = basis.tflops(w)
        notes = [f"roofline {limit:.0f}"]
        if peer:
            ax.axhline(peer["useful_tflops"], color=COLORS["peer"], linestyle=":", linewidth=1.3)
            notes.append(f"torch._grouped_mm {peer['useful_tflops']:.0f}")
        if w == BALANCED:
            ax.axhline(TARGET_TFLOPS, color="#444444", linestyle="--", linewidth=1)
        ax.set_ylim(0, top * 1.12)
        ax.set_xticks(range(len(BMS)), [f"BM = {bm}" for bm in BMS])
        ax.set_title(f"{w.label}\n({', '.join(notes)})", fontsize=10.5)
    axes[0].set_ylabel("useful TFLOP/s")
    handles = [Patch(facecolor="#dddddd", edgecolor="#666666", label="two stages"),
               Patch(facecolor="#666666", edgecolor="#666666", label="three stages"),
               Patch(facecolor="#dddddd", edgecolor="#666666", hatch="///", label="FRAG_DB (two stages)"),
               Line2D([], [], color=COLORS["peer"], linestyle=":", label="torch._grouped_mm, same run"),
               Line2D([], [], color="#444444", linestyle="--", label=f"target {TARGET_TFLOPS:.0f} (16k, s=0)")]
    # Inside the first panel, between the bars and the peer's line: a legend outside the axes would
    # squeeze the panels under save_figure's tight_layout.
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.86), fontsize=9.5, framealpha=0.9,
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
            rec, base = find(records, variant, SMALL), find(records, variant, BALANCED)
            x = i + (j - 0.5) * 0.42
            if rec:
                bars = ax.bar(x - 0.1, rec["useful_tflops"], 0.2, color=color, edgecolor=BM_COLORS[bm])
                _bar_label(ax, bars, [rec["useful_tflops"]])
            if base:
                ax.bar(x + 0.1, eta_estimate(base["useful_tflops"], e, base["eta"]), 0.2, color="white",
                       edgecolor=color if j else BM_COLORS[bm], hatch="//")
        ax.text(i, 2, f"eta = {e:.2f}", ha="center", va="bottom", fontsize=10, color="white",
                bbox={"facecolor": "#444444", "edgecolor": "none", "pad": 1.5})
    basis = roofline_basis()
    limit = basis.tflops(SMALL)
    ax.axhline(limit, color=COLORS["ceiling"], linestyle="--", linewidth=1)
    ax.text(2.55, limit, f"memory roofline {limit:.0f}", ha="right", va="bottom", fontsize=9.5)
    peer = find(records, PEER, SMALL)
    if peer:
        ax.axhline(peer["useful_tflops"], color=COLORS["peer"], linestyle=":", linewidth=1.3)
        ax.text(2.55, peer["useful_tflops"], f"torch._grouped_mm {peer['useful_tflops']:.0f}", ha="right",
                va="bottom", fontsize=9.5, color=COLORS["peer"])
    ax.set_xticks(range(len(BMS)), [f"BM = {bm}" for bm in BMS])
    ax.set_ylabel("useful TFLOP/s")
    ax.set_title("Tile fill at 2,048 balanced rows (32 rows per expert)")
    handles = [Patch(facecolor="#dddddd", edgecolor="#666666", label="measured, two stages"),
               Patch(facecolor="#666666", edgecolor="#666666", label="measured, three stages"),
               Patch(facecolor="white", edgecolor="#666666", hatch="//",
                     label="eta-only estimate, from the same variant at 16,384 rows")]
    ax.legend(handles=handles, fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
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
    left.bar_label(bars, [f"{p['warps_per_scheduler']:.2f}" for p in profiles], fontsize=9.5, padding=1)
    left.set_xticks(x, labels, rotation=35, ha="right", fontsize=10)
    left.set_ylabel("W, warps per scheduler")
    left.set_ylim(0, 9.5)
    left.set_title("Resident warps: model vs achieved")
    left.legend(fontsize=10, loc="upper right")
    model = [p["issue_model"] for p in profiles]
    measured = [_issue_active(p) for p in profiles]
    right.bar(x - 0.2, model, 0.4, color="#bbbbbb", label="W / L (ncu's W and L)")
    bars = right.bar(x + 0.2, measured, 0.4, color=colors, edgecolor="#444444", linewidth=0.5,
                     label="issue-active (ncu)")
    right.bar_label(bars, [f"{v:.3f}" for v in measured], fontsize=9.5, padding=1, rotation=90)
    right.set_xticks(x, labels, rotation=35, ha="right", fontsize=10)
    right.set_ylim(0, max(model + measured + [0.1]) * 1.3)
    right.set_ylabel("issued instructions per scheduler cycle")
    right.set_title("Issue rate: model vs counter")
    right.legend(fontsize=10, loc="upper left", ncol=2)
    return fig


def _has_stalls(data: dict[str, Any]) -> bool:
    return any("stall_long_scoreboard" in p and "instructions" in p for p in _profiled(data))


def stalls_figure(data: dict[str, Any]):
    """Left: L split by ncu's stall reasons. Right: instructions issued per mma.sync. Their product
    over W is the issue model's time per mma.sync."""
    profiles = [p for p in _profiled(data) if "stall_long_scoreboard" in p and "instructions" in p]
    names = [p["variant"] for p in profiles]
    x = np.arange(len(names))
    fig, (left, right) = new_figure(8.5, 9.5, nrows=2)
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
        left.text(xi, bottom[xi] + 0.3, f"{p['cycles_per_issue']:.1f}", ha="center", va="bottom", fontsize=9.5)
    left.set_xticks(x, [_short(n) for n in names], rotation=35, ha="right", fontsize=10)
    left.set_ylabel("L, warp cycles per\nissued instruction")
    left.set_ylim(0, max(bottom) * 1.12)
    left.set_title("Where a warp waits (ncu stall reasons, 16,384 rows, s = 0)")
    handles, labels = left.get_legend_handles_labels()
    per_mma_values = [per_mma(find(data["records"], n, BALANCED), p) for n, p in zip(names, profiles)]
    bars = right.bar(x, per_mma_values, 0.65, color=[VARIANT_COLORS.get(n, "#8c564b") for n in names],
                     edgecolor=[BM_COLORS.get(_parts(n)[0], "#444444") for n in names], linewidth=0.8,
                     hatch=["///" if _parts(n)[2] else None for n in names])
    right.bar_label(bars, [f"{v:.2f}" for v in per_mma_values], fontsize=9.5, padding=1)
    right.set_xticks(x, [_short(n) for n in names], rotation=35, ha="right", fontsize=10)
    right.set_ylabel("instructions issued\nper mma.sync")
    right.set_ylim(0, max(per_mma_values + [1.0]) * 1.15)
    right.set_title("What a warp issues (ncu instructions per mma.sync)")
    left.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9.5,
                title="stall reason\n(top of the stack first)", title_fontsize=9.5)
    return fig


# --------------------------------------------------------------------------- writing

def measured_outputs(root: Path, data: dict[str, Any]) -> list[Path]:
    """The figures drawn from the results file; one whose counters the file lacks is not drawn."""
    figures = {"bm_sweep": (bm_sweep_figure, None), "tile_fill": (tile_fill_figure, None),
               "issue_model": (issue_model_figure, lambda d: bool(_profiled(d))),
               "stalls": (stalls_figure, _has_stalls)}
    written = []
    for name, (draw, needs) in figures.items():
        if needs is None or needs(data):
            written.append(save_figure(draw(data), CHAPTER, name, root))
        else:
            (root / CHAPTER / f"{name}.png").unlink(missing_ok=True)  # never leave a stale figure behind
    return written


def _write(root: Path, name: str, text: str) -> Path:
    path = root / CHAPTER / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_outputs(root: Path) -> list[Path]:
    """The compiler's tables always; the figures where chapter 02 has recorded results."""
    written = static_outputs(root)
    data = recorded(CHAPTER)
    if data is None:
        print(f"chapter {CHAPTER} has no recorded results: only the compiler's tables are written")
        return written
    return written + measured_outputs(root, data)


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
