"""One figure style for every chapter: the same fonts, colours and file format everywhere."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; no display is needed or wanted
import matplotlib.pyplot as plt  # noqa: E402

from .results import REPO_ROOT  # noqa: E402

FIGURE_ROOT = REPO_ROOT / "site_docs" / "figures"

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
        "savefig.dpi": 130,
        "font.size": 10,
        "axes.titlesize": 11,
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


def save_figure(fig, chapter: str, name: str, root: Path = FIGURE_ROOT) -> Path:
    """Save as site_docs/figures/<chapter>/<name>.png and close the figure."""
    path = root / chapter / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
