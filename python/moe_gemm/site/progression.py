"""The tutorial's progression on one figure: each measured kernel step's fastest variant beside
``torch._grouped_mm`` timed in the same run, at the seed's three workloads.

The steps were measured in different chapters' runs: k0, k1 and k2 in chapter 03's, k3 in
chapter 04's, k5 in chapter 06's. Peers drift between runs (chapter 06's page shows by how much),
so each bar is drawn beside the peer of its own run, never beside another run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matplotlib.lines import Line2D

from moe_gemm.core.chapters import CHAPTERS
from moe_gemm.measure.results import recorded
from moe_gemm.model.workloads import SEED_WORKLOADS, Workload
from moe_gemm.site.style import COLORS, new_figure
from moe_gemm.variants.peer.torch import GROUPED_MM_PEERS as PEERS  # either B layout: the faster counts
from moe_gemm.variants.registry import family_of

# (step, the chapter whose run measured it): the kernel family's bars come from that chapter's recorded run
STEPS = tuple((step, c.number) for c in CHAPTERS for step in c.progression)
STEP_COLORS = {**COLORS, "k5": "#8c564b"}


@dataclass(frozen=True)
class Bar:
    step: str
    chapter: str
    workload: Workload
    variant: str
    tflops: float
    peer_tflops: float


def fastest(records: list[dict[str, Any]], family: str, workload: Workload) -> dict[str, Any] | None:
    found = [r for r in records if family_of(r["variant"]) == family and workload.matches(r)]
    return max(found, key=lambda r: r["useful_tflops"]) if found else None


def progression(workloads: tuple[Workload, ...] = SEED_WORKLOADS) -> list[Bar]:
    """One bar per (step, workload) that its chapter's recorded run measured."""
    bars = []
    for step, chapter in STEPS:
        records = recorded(chapter)["records"]
        for workload in workloads:
            best = fastest(records, step, workload)
            peers = [r["useful_tflops"] for r in records if r["variant"] in PEERS and workload.matches(r)]
            if best is not None and peers:
                bars.append(Bar(step, chapter, workload, best["variant"], best["useful_tflops"], max(peers)))
    return bars


def progression_figure(bars: list[Bar]):
    workloads = list(dict.fromkeys(b.workload for b in bars))
    steps = list(dict.fromkeys(b.step for b in bars))
    fig, ax = new_figure(9.0, 4.6)
    width = 0.8 / len(steps)
    for i, step in enumerate(steps):
        for j, workload in enumerate(workloads):
            bar = next((b for b in bars if b.step == step and b.workload == workload), None)
            if bar is None:
                continue
            x = j + (i - (len(steps) - 1) / 2) * width
            ax.bar(x, bar.tflops, width * 0.9, color=STEP_COLORS[step], label=step if j == 0 else None)
            ax.text(x, bar.tflops + 8, f"{bar.tflops:.0f}", ha="center", va="bottom", fontsize=9.5, rotation=90,
                    zorder=4, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 0.5})
            ax.scatter(x, bar.peer_tflops, marker="_", s=260, color=COLORS["peer"], linewidths=2.5, zorder=3)
    ax.set_xticks(range(len(workloads)), [w.label for w in workloads])
    ax.set_ylabel("useful TFLOP/s (median)")
    ax.set_ylim(0, max(max(b.tflops, b.peer_tflops) for b in bars) * 1.18)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="_", markersize=16, markeredgewidth=2.5, linestyle="none",
                          color=COLORS["peer"]))
    labels.append("torch._grouped_mm, faster layout,\nin the same run as the bar")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=10)
    ax.set_title("Each step's fastest variant on the H200 (k0-k2: chapter 03's run,\n"
                 "k3: chapter 04's, k5: chapter 06's; E = 64, K = 1,024, N = 2,688)", fontsize=11.5)
    return fig
