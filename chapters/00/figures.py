"""Chapter 00's figures and generated docs tables (no GPU, no results file: pure routing arithmetic).

    python chapters/00/figures.py                  # writes site_docs/figures/00/*.png and *.md

The markdown tables are included into site_docs/00-problem.md by pymdownx.snippets, so every
number on that page comes from the harness, not from a hand-typed table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.patches import Patch, Rectangle

from moe_gemm.chapter import GRID_SKEWS, SEED, SEED_WORKLOADS, Table, figures_main, run_main
from moe_gemm.model.occupancy import issue_rate, max_registers_for, registers_per_warp, residency, sm_ipc
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import eta
from moe_gemm.site.style import BM_COLORS, new_figure, save_figure
from moe_gemm.site.workload_tables import (
    SEED_B300_K2_LABEL,
    SEED_B300_K2_TFLOPS,
    estimate_table,
    roofline_table,
    routing_table,
    skew_label,
    tile_count_table,
)

CHAPTER = "00"
EXPERTS, K, N = SEED.experts, SEED.K, SEED.N
ROWS = (SEED.tokens, 2048)  # the seed's routed rows, and the memory-bound 2,048 of SEED_WORKLOADS
ROOFLINE_ROWS = (2048, 4096, 16384, 65536)
SKEWS = GRID_SKEWS  # the skews the seed's worklog sweeps, which chapter 06's grid keeps
# Experts shown in the tile picture: a spread of sizes at s=1.2, 16k rows (695 down to 32 rows),
# each leaving a different amount of padding in its last tile.
PICTURE_EXPERTS = (4, 10, 20, 33, 50, 63)
SKEW_COLORS = {0.0: "#000000", 0.4: "#1f77b4", 0.8: "#2ca02c", 1.2: "#d62728", 1.6: "#9467bd"}


def tokens_per_expert(tokens: int = SEED.tokens):
    fig, ax = new_figure(7.0, 3.8)
    experts = np.arange(EXPERTS)
    for skew in SKEWS:
        counts = expert_counts(EXPERTS, tokens, skew)
        ax.plot(experts, counts, marker="o", markersize=2.5, linewidth=1.2, color=SKEW_COLORS[skew],
                label=f"s = {skew_label(skew)} (largest {counts.max():,}, smallest {counts.min():,})")
    # A tile edge as a reference line: experts below it leave most of their one tile empty.
    for bm in (64, 128):
        ax.axhline(bm, color="#777777", linestyle=":", linewidth=1)
        ax.text(0, bm * 1.05, f"one {bm}-row tile", color="#555555", ha="left", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(5, 4e4)  # headroom above the largest expert for the legend
    ax.set_xlabel("expert index e (heaviest first)")
    ax.set_ylabel("rows $m_e$ (log scale)")
    ax.set_title(f"Rows per expert: E = {EXPERTS}, {tokens:,} routed rows, $m_e \\propto (e+1)^{{-s}}$")
    ax.set_xlim(-1, EXPERTS)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def _draw_expert_tiles(ax, y: float, rows: int, bm: int, color: str) -> None:
    """One expert's M tiles along x: real rows filled, the last tile's padding hatched."""
    for start in range(0, rows, bm):
        real = min(bm, rows - start)
        ax.add_patch(Rectangle((start, y - 0.35), real, 0.7, facecolor=color, alpha=0.75, linewidth=0))
        if real < bm:
            ax.add_patch(Rectangle((start + real, y - 0.35), bm - real, 0.7, facecolor="white",
                                   edgecolor="#555555", hatch="////", linewidth=0))
        ax.add_patch(Rectangle((start, y - 0.35), bm, 0.7, fill=False, edgecolor="black", linewidth=0.6))


def tile_quantisation(tokens: int = SEED.tokens, skew: float = 1.2):
    counts = expert_counts(EXPERTS, tokens, skew)
    fig, axes = new_figure(7.5, 5.6, nrows=2, sharex=True)
    widest = max(-(-int(counts[e]) // 128) * 128 for e in PICTURE_EXPERTS)
    for ax, bm in zip(axes, (64, 128)):
        for y, e in enumerate(PICTURE_EXPERTS):
            m_e = int(counts[e])
            _draw_expert_tiles(ax, y, m_e, bm, BM_COLORS[bm])
            tiles = -(-m_e // bm)
            ax.text(widest * 1.01, y, f"{tiles} tile{'s' if tiles > 1 else ''}, $\\eta_e$ = {m_e / (tiles * bm):.2f}",
                    va="center", fontsize=8)
        ax.set_yticks(range(len(PICTURE_EXPERTS)))
        ax.set_yticklabels([f"e = {e}, $m_e$ = {int(counts[e])}" for e in PICTURE_EXPERTS], fontsize=8)
        ax.invert_yaxis()
        ax.set_ylim(len(PICTURE_EXPERTS) - 0.4, -0.6)
        ax.grid(False)
        ax.set_title(f"BM = {bm}: $\\eta$ over all {EXPERTS} experts = {eta(counts, bm):.3f}")
    axes[-1].set_xlim(0, widest * 1.25)
    axes[-1].set_xlabel("rows scheduled for the expert (each box is one M tile, BM rows)")
    handles = [Patch(facecolor="#888888", label="real rows"),
               Patch(facecolor="white", edgecolor="#555555", hatch="////", label="padding (still computed)")]
    axes[0].legend(handles=handles, loc="lower center", bbox_to_anchor=(0.6, 0.02), fontsize=8, frameon=True)
    fig.suptitle(f"Tile quantisation: six of the {EXPERTS} experts at s = {skew_label(skew)}, {tokens:,} rows")
    return fig


def eta_against_skew():
    fig, ax = new_figure(7.0, 4.4)
    skews = np.linspace(0.0, 2.0, 201)
    for tokens, style in zip(ROWS, ("-", "--")):
        for bm in (32, 64, 128):
            values = [eta(expert_counts(EXPERTS, tokens, float(s)), bm) for s in skews]
            ax.plot(skews, values, style, color=BM_COLORS[bm], linewidth=1.4, label=f"BM = {bm}, {tokens:,} rows")
            # Dots at the sweep's skews: the curve is jagged, and s = 0 is a point of its own
            # (16,384 / 64 = 256 rows fill whole tiles; any s > 0 breaks that).
            ax.plot(SKEWS, [eta(expert_counts(EXPERTS, tokens, s), bm) for s in SKEWS], "o",
                    color=BM_COLORS[bm], markersize=4)
    ax.set_xlabel("routing skew s")
    ax.set_ylabel(r"row utilisation $\eta$")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(0, 2)
    small = ROWS[1]
    first_empty = next(float(s) for s in skews if (expert_counts(EXPERTS, small, float(s)) == 0).any())
    ax.annotate(f"from s = {first_empty:.2f} the lightest experts get\n0 of 2,048 rows and schedule no tiles",
                xy=(first_empty, eta(expert_counts(EXPERTS, small, first_empty), 32)), xytext=(0.9, 0.48), va="center",
                fontsize=8, arrowprops={"arrowstyle": "->", "color": "#555555"})
    ax.set_title(f"Row utilisation against skew, E = {EXPERTS}\n"
                 "solid: 16,384 rows, dashed: 2,048 rows, dots: the five sweep skews")
    ax.legend(fontsize=8, ncol=2, loc="lower left")
    return fig


def occupancy_checks() -> Table:
    """The seed's register-limit checks, recomputed by moe_gemm.model.occupancy."""
    rows = []
    for label, regs, warps in (("k1/BM=128", 95, 8), ("k2/S3", 123, 9), ("k2/S2", 94, 9)):
        per_warp = registers_per_warp(regs)
        rows.append((label, regs, warps, per_warp, per_warp * warps, residency(regs, warps).by_registers))
    regs = max_registers_for(3, 9)
    rows.append(("third 9-warp block", regs, 9, registers_per_warp(regs), registers_per_warp(regs) * 9,
                 residency(regs, 9).by_registers))
    return Table(("kernel (seed, B300)", "R regs/thread", "warps/block", "regs/warp", "regs/block",
                  "blocks by registers"), tuple(rows),
                 legend="regs/warp = ceil(32 R / 256) x 256; blocks by registers = floor(65,536 / regs/block); "
                        "the last row is the most registers a third 9-warp block allows.")


def issue_check() -> Table:
    w, cycles = 3.90, 8.49  # the seed's k1/BM=128 profile: warps per scheduler, cycles per issue
    return Table(("W warps/scheduler", "L cycles/issue", "issue rate W/L", "SM IPC 4W/L"),
                 ((f"{w:.2f}", f"{cycles:.2f}", issue_rate(w, cycles), f"{sm_ipc(w, cycles):.2f}"),),
                 legend="W and L from the seed's Nsight Compute profile of its k1 at BM = 128 on B300; the "
                        "issue rate is per scheduler, IPC for the SM's four.")


def tables() -> dict[str, Table]:
    workloads = [(tokens, skew) for tokens in ROWS for skew in SKEWS]
    return {
        "routing_table": routing_table(EXPERTS, workloads),
        "tile_counts": tile_count_table(EXPERTS, N, [(w.tokens, w.skew) for w in SEED_WORKLOADS]),
        "eta_table": estimate_table(EXPERTS, workloads, (32, 64, 128), SEED_B300_K2_TFLOPS, estimate_bm=128,
                                    rate_label=SEED_B300_K2_LABEL),
        "roofline": roofline_table(EXPERTS, K, N, ROOFLINE_ROWS),
        "occupancy_checks": occupancy_checks(),
        "issue_check": issue_check(),
    }


def write_outputs(root: Path) -> list[Path]:
    written = [
        save_figure(tokens_per_expert(), CHAPTER, "tokens_per_expert", root),
        save_figure(tile_quantisation(), CHAPTER, "tile_quantisation", root),
        save_figure(eta_against_skew(), CHAPTER, "eta_vs_skew", root),
    ]
    for name, table in tables().items():
        path = root / CHAPTER / f"{name}.md"
        path.write_text(table.markdown())
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
