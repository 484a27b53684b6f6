"""Chapter 08's figures, drawn from chapters/08/results/h200.json.

    python chapters/08/figures.py          # writes site_docs/figures/08/*.png

* layers.png: the layer's forward time every way, per layer size and token count;
* steps.png: our layer's time split into router, permutation, GEMM 1 + SwiGLU, GEMM 2 and combine
  (shares, each bar's total above it);
* fused.png: GEMM 1 with the fused SwiGLU epilogue against GEMM 1 alone plus the SwiGLU pass;
* scoreboard.png: our op over torch._grouped_mm and over quack on chapter 06's grid;
* scoreboard-models.png: the same ratios at chapter 07's model projections.

When the results file is absent nothing is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_gemm.chapter import chapter_module, figures_main, recorded, run_main
from moe_gemm.site.style import COLORS, grid_heatmaps, new_figure, ratio_heatmap, save_figure

CHAPTER = "08"
RUN = chapter_module(CHAPTER)
SCOREBOARD_VMIN = 0.5  # the heatmaps' colour scale runs from 0.5 to 1.5, white at 1
WAY_COLORS = {"layer/ours": COLORS["k3"], "layer/torch_grouped_mm": "#7f7f7f", "layer/quack": "#2ca02c",
              "layer/transformers": "#ff7f0e", "layer/transformers-eager": "#d62728",
              "layer/transformers-batched_mm": "#9467bd"}


def _key(record: dict[str, Any]) -> tuple[int, int, int, int]:
    return record["hidden"], record["intermediate"], record["experts"], record["top_k"]


def layers_figure(data: dict[str, Any]):
    records = [r for r in data["records"] if r.get("part") == "layer"]
    shapes = list(dict.fromkeys(_key(r) for r in records))
    # three panels in 9.5 inches: a 9-point legend still prints at 11 px on the page's 850 px
    fig, axes = new_figure(min(9.5, 4.2 * len(shapes)), 3.8, ncols=len(shapes), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = [r for r in records if _key(r) == shape]
        tokens = sorted({r["tokens"] for r in rows})
        for way in RUN.WAYS:
            found = {r["tokens"]: r["median_ms"] for r in rows if r["variant"] == way}
            if found:
                ax.plot([t for t in tokens if t in found], [found[t] for t in tokens if t in found], marker="o",
                        color=WAY_COLORS[way], label=way.split("/", 1)[1])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_title(f"H={shape[0]} I={shape[1]} E={shape[2]} top-{shape[3]}", fontsize=11)
    axes[0][0].set_ylabel("forward ms (median)")
    axes[0][0].legend(fontsize=9, loc="center right")  # the first panel has room between its lines
    return fig


def steps_figure(data: dict[str, Any]):
    """Each bar one layer size and token count, split into its steps' shares; its total above it (the
    totals span orders of magnitude, so the bars are shares, not milliseconds)."""
    steps = data["steps"]
    labels = [f"H={s['hidden']}\n{s['tokens']:,} tok" for s in steps]
    fig, ax = new_figure(max(6.0, 0.7 * len(steps) + 2), 4.2)
    totals = [sum(s[f"{step}_ms"] for step in RUN.STEPS) for s in steps]
    bottom = [0.0] * len(steps)
    palette = ("#e377c2", "#8c564b", COLORS["k3"], "#17becf", "#bcbd22")
    for step, color in zip(RUN.STEPS, palette):
        shares = [100 * s[f"{step}_ms"] / total for s, total in zip(steps, totals)]
        ax.bar(range(len(steps)), shares, bottom=bottom, color=color, label=step)
        bottom = [b + v for b, v in zip(bottom, shares)]
    for i, total in enumerate(totals):
        ax.text(i, 101, f"{total:.2f} ms", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(steps)), labels, fontsize=8)
    ax.set_ylim(0, 112)
    ax.set_ylabel("share of the layer's time (%)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", visible=False)
    return fig


def fused_figure(data: dict[str, Any]):
    fused = data["fused_epilogue"]
    labels = [f"H={f['hidden']}\n{f['tokens']:,} tok" for f in fused]
    fig, ax = new_figure(max(6.0, 0.7 * len(fused) + 2), 3.8)
    x = range(len(fused))
    ax.bar([i - 0.2 for i in x], [f["fused_ms"] for f in fused], 0.4, color=COLORS["k3"], label="GEMM 1 + fused SwiGLU")
    ax.bar([i + 0.2 for i in x], [f["gemm1_ms"] for f in fused], 0.4, color="#7f7f7f", label="GEMM 1 alone")
    ax.bar([i + 0.2 for i in x], [f["swiglu_ms"] for f in fused], 0.4, bottom=[f["gemm1_ms"] for f in fused],
           color="#bcbd22", label="+ SwiGLU as its own pass")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("ms")
    ax.legend(fontsize=9)
    ax.grid(axis="x", visible=False)
    return fig


def scoreboard_figure(data: dict[str, Any]):
    """The scoreboard table's own ratios (graph replays wherever the run has them), as heatmaps."""
    from moe_gemm.model.workloads import Workload

    rows = {r["label"]: r for r in data["scoreboard_rows"]}
    panels = [(title, lambda t, s, key=key: rows.get(Workload(t, s).label, {}).get(key))
              for key, title in (("torch", "our op / torch._grouped_mm"), ("quack", "our op / quack"))]
    return grid_heatmaps(panels, "useful TFLOP/s ratio, same run, CUDA-graph replays (blue: ours faster; "
                                 "blank: not measured)", vmin=SCOREBOARD_VMIN)


def models_figure(data: dict[str, Any]):
    """The scoreboard's model projections as one heatmap: a row per projection, a column per peer, on
    the grid heatmaps' colour scale."""
    rows = [r for r in data["scoreboard_rows"] if "E=" in r["label"]]
    peers = (("torch", "/ torch._grouped_mm"), ("quack", "/ quack"))
    fig, ax = new_figure(7.0, 0.6 * len(rows) + 1.6)
    ratio_heatmap(ax, [[r[key] for key, _ in peers] for r in rows], vmin=SCOREBOARD_VMIN)
    ax.set_xticks(range(len(peers)), [title for _, title in peers])
    ax.set_yticks(range(len(rows)), [r["label"].split("s=0.4, ")[-1] for r in rows])
    ax.set_title(f"model projections, {rows[0]['label'].split(', E=')[0]}", fontsize=12)
    return fig


def write_outputs(root: Path) -> list[Path]:
    data = recorded(CHAPTER)
    if data is None:
        return []
    written = []
    if any(r.get("part") == "layer" for r in data["records"]):
        written += [save_figure(layers_figure(data), CHAPTER, "layers", root),
                    save_figure(steps_figure(data), CHAPTER, "steps", root),
                    save_figure(fused_figure(data), CHAPTER, "fused", root)]
    if any(r.get("part") == "scoreboard" for r in data["records"]):
        written.append(save_figure(scoreboard_figure(data), CHAPTER, "scoreboard", root))
        if any("E=" in r["label"] for r in data["scoreboard_rows"]):
            written.append(save_figure(models_figure(data), CHAPTER, "scoreboard-models", root))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
