"""Chapter 06's figures, drawn from chapters/06/results/h200.json.

    python chapters/06/figures.py          # writes site_docs/figures/06/*.png

* grid.png: the 25 cells, fixed-shape k3 beside the host- and device-scheduled adaptive kernel,
  each cell coloured by its ratio to the faster torch._grouped_mm layout of the same run;
* eta.png: row utilisation under 128-row tiles only and under the two policies, per cell;
* model.png: the cost model's predicted time against the measured one, every cell and policy;
* calibration.png: what one remainder costs in each tile shape, as the policy compares them;

and, with no GPU needed, compile_report.md: NVRTC's resource report and SASS counts of both
schedules for sm_90a, generated when the site is built so that it describes the current kernel.
When the results file is absent no figure is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_gemm.chapter import Workload, chapter_module, figures_main, ratio_to_peer, recorded, run_main
from moe_gemm.site.compile_report import write_compile_report
from moe_gemm.site.progression import progression, progression_figure
from moe_gemm.site.style import COLORS, new_figure, save_figure

CHAPTER = "06"
RUN = chapter_module(CHAPTER)
PANELS = (("k3/tmastore-bn192", "k3 (128-row tiles)"), ("k5/host", "k5/host (cost model)"),
          ("k5/device", "k5/device (greedy rule)"))
POLICY_COLORS = {"fixed": COLORS["k3"], "host": "#17becf", "device": "#ff7f0e"}


def grid_figure(data: dict[str, Any]):
    """Three heatmaps, M_tot down and skew across, each cell's colour its ratio to the peer.

    Two by two, not three in a row: fifteen cells in a row scaled to a phone's width leave their
    numbers a few pixels tall, and the numbers, to two decimals (1.03 against 1.09), are what the
    figure is for. k3 sits above k5/host (the same tiles but for the remainders), k5/host beside
    k5/device (one kernel, scheduled on the host or on the device); the colour scale fills the fourth
    place.
    """
    from matplotlib.colors import TwoSlopeNorm

    records = data["records"]
    cells = RUN.cells_of(records)
    tokens = list(dict.fromkeys(c.tokens for c in cells))
    skews = list(dict.fromkeys(c.skew for c in cells))
    fig, axes = new_figure(7.6, 7.0, nrows=2, ncols=2)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=0.6, vmax=1.6)
    for ax, (name, title) in zip((axes[0, 0], axes[1, 0], axes[1, 1]), PANELS):
        ratios = [[ratio_to_peer(records, name, Workload(t, s)) for s in skews] for t in tokens]
        image = ax.imshow(ratios, cmap="RdBu", norm=norm, aspect="auto")
        for i, row in enumerate(ratios):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=16,
                        color="white" if abs(value - 1) > 0.35 else "black")
        ax.set_xticks(range(len(skews)), [f"{s:g}" for s in skews], fontsize=13)
        ax.set_xlabel("skew s", fontsize=13)
        left = ax is not axes[1, 1]
        ax.set_yticks(range(len(tokens)), [f"{t // 1024}k" if t >= 1024 else str(t) for t in tokens] if left else [],
                      fontsize=13)
        if left:
            ax.set_ylabel("M_tot (rows)", fontsize=13)
        ax.set_title(title, fontsize=14)
        ax.grid(False)
    legend = axes[0, 1]
    legend.axis("off")
    colorbar = fig.colorbar(image, cax=legend.inset_axes([0.06, 0.5, 0.88, 0.1]), orientation="horizontal",
                            ticks=[0.6, 0.8, 1.0, 1.2, 1.4, 1.6])
    colorbar.set_label("ratio to the faster torch._grouped_mm\n(blue: faster than the peer)", fontsize=13)
    colorbar.ax.tick_params(labelsize=12)
    return fig


def eta_figure(data: dict[str, Any]):
    """eta per cell: 128-row tiles only, the cost model's policy, the greedy rule."""
    model = data["model"]
    tokens = list(dict.fromkeys(r["tokens"] for r in model))
    fig, axes = new_figure(11.0, 3.6, ncols=len(tokens), sharey=True)
    for ax, t in zip(axes, tokens):
        rows = [r for r in model if r["tokens"] == t]
        skews = [r["skew"] for r in rows]
        for key, label in (("fixed", "128-row tiles (k3)"), ("host", "k5/host policy"), ("device", "k5/device rule")):
            ax.plot(skews, [r[f"eta_{key}"] for r in rows], marker="o", color=POLICY_COLORS[key], label=label)
        ax.set_title(f"M_tot = {t:,}", fontsize=12)
        ax.set_xlabel("skew s")
        ax.set_ylim(0, 1.05)
        ax.set_xticks([0, 0.8, 1.6])
    axes[0].set_ylabel("eta (real / issued rows)")
    axes[-1].legend(loc="lower right", fontsize=11)
    return fig


def model_figure(data: dict[str, Any]):
    """Predicted against measured time, log-log, with the line of perfect prediction and +-10%."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    model = data["model"]
    fig, ax = new_figure(6.4, 5.6)
    for key, label in (("fixed", "128-row tiles (k3 measured)"), ("host", "k5/host"), ("device", "k5/device")):
        ax.scatter([r[f"{key}_measured_us"] for r in model], [r[f"{key}_predicted_us"] for r in model], s=30,
                   color=POLICY_COLORS[key], label=label, zorder=3)
    low = min(min(r[f"{k}_{w}_us"] for k in POLICY_COLORS for w in ("measured", "predicted")) for r in model) * 0.8
    high = max(max(r[f"{k}_{w}_us"] for k in POLICY_COLORS for w in ("measured", "predicted")) for r in model) * 1.2
    ax.plot([low, high], [low, high], color=COLORS["ceiling"], linewidth=1)
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1], color="#d9d9d9", alpha=0.5,
                    label="within 10%")
    ticks = [t for t in (50, 100, 200, 500, 1000) if low <= t <= high]
    # The scale first: set_xscale("log") puts back log formatters, whose minor labels ("6 x 10^1",
    # "3 x 10^2", ...) crowd the axis. Only the round major ticks are labelled.
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured median time (µs)")
    ax.set_ylabel("cost model's prediction (µs)")
    ax.legend(loc="upper left", fontsize=10)
    return fig


def calibration_figure(data: dict[str, Any]):
    """Microseconds one remainder costs in each shape (tile cost x column tiles), as calibrated."""
    from moe_gemm.variants.k5.cost_model import COST_KEYS
    from moe_gemm.variants.k5.mixed_tiles import TileKind, columns

    calibration = data["calibration"]
    costs = [calibration["tile_us"][key] * columns(TileKind.SWAP if key.startswith("SWAP") else TileKind[key],
                                                   calibration["N"]) for key in COST_KEYS]
    fig, ax = new_figure(7.0, 3.4)
    colors = [COLORS["k3"] if key == "M128" else "#2ca02c" if key == "M64" else "#17becf" for key in COST_KEYS]
    ax.bar(range(len(COST_KEYS)), costs, color=colors)
    for i, cost in enumerate(costs):
        ax.text(i, cost + 2, f"{cost:.0f}", ha="center", fontsize=11)
    ax.axhline(costs[0], color=COLORS["k3"], linewidth=1, linestyle="--")
    ax.set_xticks(range(len(COST_KEYS)), ["M128", "M64", "swap 16", "swap 32", "swap 48", "swap 64"])
    ax.set_ylabel("µs of block time per remainder")
    ax.set_ylim(0, max(costs) * 1.2)
    ax.grid(axis="x", visible=False)
    return fig


def write_outputs(root: Path) -> list[Path]:
    report = write_compile_report(RUN, CHAPTER, root)
    data = recorded(CHAPTER)
    if data is None:
        return [report]
    return [report, save_figure(grid_figure(data), CHAPTER, "grid", root),
            save_figure(eta_figure(data), CHAPTER, "eta", root),
            save_figure(model_figure(data), CHAPTER, "model", root),
            save_figure(calibration_figure(data), CHAPTER, "calibration", root),
            # the home page's: every measured step so far, each beside the peer of its own run
            save_figure(progression_figure(progression()), CHAPTER, "progression", root)]


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
