"""Chapter 01's figures, from chapters/01/results/h200.json and from k0's thread map.

    python chapters/01/figures.py          # writes site_docs/figures/01/*.png

Every measured number drawn here comes from the recorded results file. The seed's B300 k0 numbers
and the page's own prediction are drawn beside them for reference, labelled as such, never as a
measurement of ours; tests/test_chapter01.py checks that they are the numbers the page states.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm.chapter import PEER, SEED, Workload, chapter_module, figures_main, find, recorded, run_main
from moe_gemm.site.style import COLORS, new_figure, save_figure
from moe_gemm.variants.peer.torch import PEER_LOOP as LOOP

CHAPTER = "01"
RUN = chapter_module(CHAPTER)
WORKLOADS = RUN.WORKLOADS
SHORT_LABELS = ("16,384 rows\ns = 0", "16,384 rows\ns = 1.2", "2,048 rows\ns = 0", "16,384 rows\ns = 0, K = 8192")
# The H200's FP32 datasheet rate, and the FFMA microbenchmark on this project's H200 before this
# chapter's run: the prediction's starting point, and the ceiling drawn when a results file has
# none of its own. run.py prints the same two.
FP32_DATASHEET_TFLOPS, FP32_FFMA_EARLIER_TFLOPS = RUN.FP32_DATASHEET_TFLOPS, RUN.FP32_FFMA_EARLIER_TFLOPS

# The seed's B300 numbers for its CUDA C++ k0 (useful TFLOP/s; the 2,048-row figure is the worklog's
# "about 9"). Reference only: measured on a different GPU, by a different kernel, never by us.
SEED_B300_K0 = {
    "label": "the seed's B300 numbers (its CUDA C++ k0; not measured here)",
    "tflops": {(16384, 0.0, 1024): 21.4, (16384, 1.2, 1024): 20.1, (2048, 0.0, 1024): 9.0,
               (16384, 0.0, 8192): 21.0},
}

# The page's prediction (site_docs/01-fp32-baseline.md, "Prediction, before measuring"), written before
# the H200 run; printed beside the measurement, never as one. tests/test_chapter01.py checks that these
# are the numbers the page states.
PREDICTION = {
    "tflops": {(16384, 0.0, 1024): 24.0, (16384, 1.2, 1024): 21.5, (2048, 0.0, 1024): 10.0,
               (16384, 0.0, 8192): 24.0},
    "registers": 56, "blocks_per_sm": 4, "limiter": "registers",
    "issue_fraction": 0.6,  # the guessed share of cycles on which a scheduler issues anything
    "ffma_share": 0.71,  # 256 FFMA of about 360 instructions per K slice (the page's SASS count)
    "ceiling": FP32_FFMA_EARLIER_TFLOPS,  # the FFMA ceiling the prediction scaled from
    "peer_ratio": 0.05,  # k0 / torch._grouped_mm at 16,384 rows, s=0, against an early probe of 453 TFLOP/s
}


def _tflops(records: Sequence[dict[str, Any]], variant: str, workload: Workload) -> float:
    record = find(records, variant, workload)
    return record["useful_tflops"] if record else float("nan")


def _seed(workload: Workload) -> float:
    return SEED_B300_K0["tflops"].get((workload.tokens, workload.skew, workload.K), float("nan"))


# --------------------------------------------------------------------------- figures

def throughput_figure(data: dict[str, Any]):
    """Top: k0 against the FP32 ceilings and the seed's B300 k0. Bottom: k0 beside the peers (log).

    The panels are stacked rather than side by side so that each is drawn at about the width the
    page shows it, and its labels stay readable."""
    records = data["records"]
    gpu = data["provenance"]["gpu"]
    ffma, measured = RUN.ffma_ceiling(data.get("ceilings", []))
    ffma_source = "measured in this run" if measured else "measured earlier"
    fig, (left, right) = new_figure(8.5, 9.6, nrows=2)
    x = np.arange(len(WORKLOADS))

    k0 = [_tflops(records, "k0", w) for w in WORKLOADS]
    seed = [_seed(w) for w in WORKLOADS]
    width = 0.38
    bars = left.bar(x - width / 2, k0, width, color=COLORS["k0"], label=f"k0, measured on {gpu}")
    left.bar_label(bars, fmt="%.1f", fontsize=10, padding=2)
    bars = left.bar(x + width / 2, seed, width, color="white", edgecolor=COLORS["seed"], hatch="///",
                    label=SEED_B300_K0["label"])
    left.bar_label(bars, fmt="%.1f", fontsize=10, padding=2, color=COLORS["seed"])
    predicted = [PREDICTION["tflops"].get((w.tokens, w.skew, w.K), np.nan) for w in WORKLOADS]
    left.hlines(predicted, x - width, x, colors="black", linewidth=2,
                label="the page's prediction for k0 (written before the run)")
    left.axhline(FP32_DATASHEET_TFLOPS, color=COLORS["ceiling"], linestyle="--", linewidth=1)
    left.text(len(WORKLOADS) - 0.5, FP32_DATASHEET_TFLOPS, f"H200 FP32, datasheet: {FP32_DATASHEET_TFLOPS:g}",
              ha="right", va="bottom", fontsize=10)
    left.axhline(ffma, color=COLORS["ceiling"], linestyle=":", linewidth=1)
    left.text(len(WORKLOADS) - 0.5, ffma, f"FFMA ceiling ({ffma_source}): {ffma:.1f}", ha="right", va="bottom",
              fontsize=10)
    left.set_ylim(0, FP32_DATASHEET_TFLOPS * 1.45)  # room for the legend above the datasheet line
    left.set_xticks(x, SHORT_LABELS)
    left.set_ylabel("useful TFLOP/s")
    left.set_title("k0 against the FP32 ceiling")
    handles, labels = left.get_legend_handles_labels()
    order = [labels.index(label) for label in sorted(labels, key=lambda t: ("prediction" in t, "seed" in t))]
    left.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=10, loc="upper left")

    variants = [v for v in ("k0", PEER, LOOP) if any(r["variant"] == v for r in records)]
    colors = {"k0": COLORS["k0"], PEER: COLORS["peer"], LOOP: "#f4a582"}
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        values = [_tflops(records, variant, w) for w in WORKLOADS]
        bars = right.bar(x + (i - (len(variants) - 1) / 2) * width, values, width, color=colors[variant],
                         label=variant)
        right.bar_label(bars, fmt="%.0f", fontsize=10, padding=1)
    if PEER in variants:
        for xi, w in zip(x, WORKLOADS):
            peer = _tflops(records, PEER, w)
            ratio = _tflops(records, "k0", w) / peer if peer else float("nan")
            if np.isfinite(ratio):
                right.text(xi, 0.84, f"k0 / peer\n{ratio:.3f}", ha="center", va="center", fontsize=10,
                           transform=right.get_xaxis_transform())
    right.set_yscale("log")
    shown = [r["useful_tflops"] for r in records if r["variant"] in variants and r["useful_tflops"] > 0]
    if shown:  # room below the slowest bar, and above the fastest for the legend and the ratios
        right.set_ylim(min(shown) / 2, max(shown) * 12)
    right.set_xticks(x, SHORT_LABELS)
    right.set_ylabel("useful TFLOP/s (log scale)")
    right.set_title("k0 beside torch._grouped_mm and a per-expert torch loop")
    right.legend(fontsize=10, loc="upper left", ncol=len(variants))
    fig.suptitle(f"Chapter 01 on {gpu}: E = {SEED.experts}, N = {SEED.N} (K = {SEED.K} unless shown)")
    return fig


def layout_figure():
    """The block's 64 x 64 tile: which warp owns which 16 x 32 patch, which lane which 4 x 4 micro-tile.

    Drawn from moe_gemm.variants.k0.micro_tile_origin, the kernel's thread map (no results needed).
    """
    from matplotlib.patches import Rectangle

    from moe_gemm.variants.k0 import BM, BN, THREADS, micro_tile_origin

    warp_colors = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5"]
    fig, ax = new_figure(6.4, 6.0)
    for t in range(THREADS):
        row, col = micro_tile_origin(t)
        warp, lane = divmod(t, 32)
        ax.add_patch(Rectangle((col, row), 4, 4, facecolor=warp_colors[warp], edgecolor="white", linewidth=0.6))
        if warp in (0, 1):
            ax.text(col + 2, row + 2, str(lane), ha="center", va="center", fontsize=7)
    for warp in range(THREADS // 32):
        row, col = micro_tile_origin(32 * warp)
        ax.add_patch(Rectangle((col, row), 32, 16, fill=False, edgecolor="black", linewidth=1.2))
        if warp < 2:  # its lanes are numbered: name it above the tile
            ax.text(col + 16, -1, f"warp {warp}: a 16 x 32 patch, lanes 4 x 8", ha="center", va="bottom",
                    fontsize=8, fontweight="bold")
        else:
            ax.text(col + 16, row + 12, f"warp {warp}", ha="center", va="center", fontsize=9, fontweight="bold")
    ax.add_patch(Rectangle((0, 0), 4, 4, fill=False, edgecolor="#d62728", linewidth=2))
    ax.annotate("thread 0 (warp 0, lane 0): rows 0-3, columns 0-3,\n16 fp32 accumulators",
                xy=(2, 4), xytext=(2, 20), fontsize=8, color="#d62728",
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#d62728"},
                arrowprops={"arrowstyle": "->", "color": "#d62728"})
    ax.set_xlim(0, BN)
    ax.set_ylim(BM, 0)
    ax.set_aspect("equal")
    ax.set_xticks(range(0, BN + 1, 16))
    ax.set_yticks(range(0, BM + 1, 16))
    ax.grid(False)
    ax.set_xlabel("column in the tile (N)")
    ax.set_ylabel("row in the tile (M)")
    ax.set_title("k0: the 256 threads of one block over its 64 x 64 tile of C", pad=20)
    return fig


def write_outputs(root: Path) -> list[Path]:
    """The layout figure (from the kernel's thread map) and, where chapter 01 has recorded results, the
    throughput figure. The page's tables and numbers come from the results file by moe_gemm.site.pages."""
    written = [save_figure(layout_figure(), CHAPTER, "layout", root)]
    data = recorded(CHAPTER)
    if data is None:
        print(f"chapter {CHAPTER} has no recorded results: no throughput figure drawn")
        return written
    written.append(save_figure(throughput_figure(data), CHAPTER, "throughput", root))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
