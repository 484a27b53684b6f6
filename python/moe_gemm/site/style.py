"""One figure style for every chapter: the same fonts, colours and file format everywhere.

A figure is read at the size the page shows it, not at its file's size: the page's content column
(about :data:`DISPLAY_WIDTH_PX` wide on a 1400 px screen) scales a wider PNG down, text and all.
:func:`save_figure` therefore refuses a figure whose smallest text would show smaller than
:data:`MIN_TEXT_PX` at that width; a click still opens the file full size (glightbox).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; no display is needed or wanted
import matplotlib.pyplot as plt
from matplotlib.text import Text

from moe_gemm.core.paths import FIGURE_ROOT

DPI = 130
# The article's width on a 1400 px screen with both sidebars shown (site_docs/stylesheets/extra.css);
# tests/test_docs.py measures it in Chromium and checks this value against it.
DISPLAY_WIDTH_PX = 850
# The article's width in a 400 px window (a phone), where every figure is scaled to this width;
# tests/test_docs.py checks it too. A figure whose numbers are the point keeps them legible there.
NARROW_DISPLAY_WIDTH_PX = 350
MIN_TEXT_PX = 11.0  # the body text is 16 px; figure labels may be smaller, not much

# One colour per kernel family, kept across chapters so a reader can follow k1 from page to page.
COLORS = {
    "k0": "#7f7f7f",
    "k1": "#1f77b4",
    "k2": "#2ca02c",
    "k3": "#9467bd",
    "peer": "#d62728",
    "ceiling": "#000000",
    "seed": "#ff7f0e",
}
BM_COLORS = {16: "#17becf", 32: "#1f77b4", 64: "#2ca02c", 128: "#d62728", 256: "#9467bd"}


def family_color(variant: str) -> str:
    """'k1/bm64' -> k1's colour; 'peer/torch_grouped_mm' -> the peer colour."""
    return COLORS.get(variant.split("/", 1)[0], "#8c564b")


def apply_style() -> None:
    plt.rcParams.update({
        "figure.dpi": 110,
        "savefig.dpi": DPI,
        "font.size": 12,
        "axes.titlesize": 13,
        "axes.labelsize": 12,
        "xtick.labelsize": 11,
        "ytick.labelsize": 11,
        "legend.fontsize": 11,
        "legend.title_fontsize": 11,
        "figure.titlesize": 14,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
    })


def new_figure(width: float = 7.0, height: float = 3.6, **kwargs):
    """A styled figure and axes (``plt.subplots`` arguments pass through)."""
    apply_style()
    return plt.subplots(figsize=(width, height), **kwargs)


def model_bars(ticks: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], legend_size: int = 9):
    """Useful TFLOP/s of several kernels side by side at each model projection (``ticks``: their labels);
    ``series``: (label, colour, one value per tick). The legend sits in a row above the bars: inside the
    axes it can hide a swatch behind a bar of the same colour."""
    fig, ax = new_figure(9.0, 3.8)
    width = 0.8 / len(series)
    for k, (label, color, values) in enumerate(series):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(ticks))], values, width, color=color,
               label=label)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=9)
    ax.set_ylabel("useful TFLOP/s")
    ax.legend(fontsize=legend_size, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    ax.grid(axis="x", visible=False)
    return fig


def projection_tick(label: str) -> str:
    """A model projection's label as a two-line tick: the model, then the rest, without the parenthesis."""
    return label.split(" (")[0].replace(" ", "\n", 1)


def displayed_text_px(fig, display_width_px: float = DISPLAY_WIDTH_PX) -> dict[str, float]:
    """Each visible text of ``fig`` and its height in screen pixels once the page scales the PNG to fit."""
    width_px = fig.get_figwidth() * DPI
    scale = min(1.0, display_width_px / width_px)
    return {t.get_text(): t.get_fontsize() * DPI / 72 * scale
            for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}


def ratio_heatmap(ax, ratios: Sequence[Sequence[float | None]], vmin: float = 0.8, vmax: float = 1.5) -> None:
    """``ratios`` (rows of ours-over-theirs) drawn on ``ax``, white at 1, blue where ours is faster,
    each cell's value written in it; a None cell (not measured) is left blank."""
    from matplotlib.colors import TwoSlopeNorm

    ax.imshow([[float("nan") if v is None else v for v in row] for row in ratios], cmap="RdBu",
              norm=TwoSlopeNorm(vcenter=1.0, vmin=vmin, vmax=vmax), aspect="auto")
    for i, row in enumerate(ratios):
        for j, value in enumerate(row):
            if value is not None:
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=13,
                        color="white" if abs(value - 1) > 0.3 else "black")
    ax.grid(False)


def grid_heatmaps(panels: Sequence[tuple[str, Callable[[int, float], float | None]]], title: str,
                  vmin: float = 0.8, vmax: float = 1.5):
    """Chapter 06's grid as heatmaps side by side, M_tot down and skew across, one panel per
    (title, ratio(tokens, skew)); a cell whose ratio is None (not measured) is left blank."""
    from moe_gemm.model.workloads import GRID_SKEWS, GRID_TOKENS

    fig, axes = new_figure(5.0 * len(panels), 4.6, ncols=len(panels))
    for ax, (panel_title, ratio) in zip(axes, panels):
        ratio_heatmap(ax, [[ratio(t, s) for s in GRID_SKEWS] for t in GRID_TOKENS], vmin, vmax)
        ax.set_xticks(range(len(GRID_SKEWS)), [f"{s:g}" for s in GRID_SKEWS])
        ax.set_yticks(range(len(GRID_TOKENS)), [f"{t // 1024}k" if t >= 1024 else str(t) for t in GRID_TOKENS])
        ax.set_xlabel("skew s")
        ax.set_title(panel_title, fontsize=13)
    axes[0].set_ylabel("M_tot (rows)")
    fig.suptitle(title, fontsize=12)
    return fig


def save_figure(fig, chapter: str, name: str, root: Path = FIGURE_ROOT) -> Path:
    """Save as site_docs/figures/<chapter>/<name>.png and close the figure; refuse unreadable text."""
    small = {text: px for text, px in displayed_text_px(fig).items() if px < MIN_TEXT_PX}
    if small:
        plt.close(fig)
        worst = sorted(small.items(), key=lambda kv: kv[1])[:3]
        raise ValueError(f"figure {chapter}/{name}: text would show below {MIN_TEXT_PX:g} px at the page's width "
                         f"({DISPLAY_WIDTH_PX} px): " + "; ".join(f"{t[:40]!r} {px:.1f} px" for t, px in worst))
    path = root / chapter / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def figures_main(description: str | None, write_outputs: Callable[[Path], list[Path]], chapter: str,
                 argv: Sequence[str] | None = None) -> int:
    """What a chapter's ``figures.py main()`` does: parse ``--out``, write everything, list the files."""
    from moe_gemm.core.cli import chapter_parser

    parser = chapter_parser(description)
    parser.add_argument("--out", type=Path, default=FIGURE_ROOT,
                        help=f"figure root; files go to OUT/{chapter}/ (default {FIGURE_ROOT})")
    args = parser.parse_args(argv)
    for path in write_outputs(args.out):
        print(path)
    return 0
