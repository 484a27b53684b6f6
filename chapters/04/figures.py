"""Chapter 04's figures, drawn from chapters/04/results/h200.json.

    python chapters/04/figures.py          # writes site_docs/figures/04/*.png

* ladder.png: every rung (and k2/s3) at the five workloads: useful TFLOP/s, and its ratio to the
  faster torch._grouped_mm layout of the same run as the cell's colour;
* roofline.png: every measurement as a percentage of the roofline at its workload, on the run's
  own ceilings (cuBLAS bf16 8192^3 and the device copy);
* epilogue.png: the profiled launch of each rung Nsight Compute looked at, split into the time the
  tensor pipe was busy with wgmma and the time it idled.

and, with no GPU needed, compile_report.md: NVRTC's resource report and SASS counts of every rung
for sm_90a, the table chapters/04/run.py prints, generated when the site is built so that it
always describes the current kernels. When the results file is absent no figure is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_gemm.chapter import Workload, best_peer, chapter_module, figures_main, find, recorded, run_main
from moe_gemm.measure.ceilings import roofline_basis
from moe_gemm.site.compile_report import write_compile_report
from moe_gemm.site.style import COLORS, new_figure, save_figure

CHAPTER = "04"
RUN = chapter_module(CHAPTER)
WORKLOADS = RUN.WORKLOADS
# The rungs in ladder order, one colour per step of the ladder.
STEPS = (("1wg", "(a) one consumer warpgroup", "#c5b0d5"), ("2wg", "(b) two warpgroups", "#9467bd"),
         ("persistent", "(c) persistent", "#6a3d9a"), ("multicast-tmastore", "(d)+(e) multicast + TMA store",
                                                        "#e7969c"),
         ("multicast", "(d) B multicast", "#ad494a"), ("tmastore", "(e) TMA-store epilogue", "#17becf"))


def step_of(variant: str) -> tuple[str, str]:
    """(label, colour) of the ladder step a k3 rung belongs to."""
    rung = variant.split("/", 1)[1]
    for prefix, label, color in STEPS:
        if rung.startswith(prefix):
            return label, color
    raise ValueError(f"{variant} is on no step of the ladder")


def column_label(workload: Workload) -> str:
    """'16k, s=0': a workload as a column of the figures."""
    return f"{workload.tokens // 1024}k, s={workload.skew:g}"


def ladder_figure(data: dict[str, Any]):
    """Rungs x workloads: each cell's colour is the ratio to the faster peer, its text the TFLOP/s."""
    from matplotlib.colors import TwoSlopeNorm

    records = data["records"]
    rungs = list(data["ladder"]) + ["k2/s3"]
    ratios = [[find(records, name, w)["useful_tflops"] / best_peer(records, w)["useful_tflops"]
               for w in WORKLOADS] for name in rungs]
    fig, ax = new_figure(7.6, 8.6)
    image = ax.imshow(ratios, cmap="RdBu", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.6, vmax=1.4), aspect="auto")
    for i, name in enumerate(rungs):
        for j, w in enumerate(WORKLOADS):
            tflops = find(records, name, w)["useful_tflops"]
            ax.text(j, i, f"{tflops:.0f}\n{ratios[i][j]:.2f}x", ha="center", va="center", fontsize=10,
                    color="white" if abs(ratios[i][j] - 1) > 0.25 else "black")
    ax.set_xticks(range(len(WORKLOADS)), [column_label(w) for w in WORKLOADS])
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(rungs)), [name.removeprefix("k3/") for name in rungs])
    ax.grid(False)
    colorbar = fig.colorbar(image, ax=ax, shrink=0.6, pad=0.02)
    colorbar.set_label("useful TFLOP/s over the faster torch._grouped_mm layout")
    return fig


def roofline_figure(data: dict[str, Any]):
    """Every measurement as a percentage of the roofline at its workload (one column per workload)."""
    records = data["records"]
    basis = roofline_basis()
    fig, ax = new_figure(8.0, 4.8)
    for j, w in enumerate(WORKLOADS):
        limit = basis.tflops(w)
        k3 = sorted((r for r in records if r["variant"].startswith("k3/") and w.matches(r)),
                    key=lambda r: r["useful_tflops"])
        for i, record in enumerate(k3):
            x = j - 0.3 + 0.6 * i / max(1, len(k3) - 1)
            ax.scatter(x, 100 * record["useful_tflops"] / limit, s=26, color=step_of(record["variant"])[1], zorder=3)
        for name, color in (("k2/s3", COLORS["k2"]), ("peer", COLORS["peer"])):
            record = best_peer(records, w) if name == "peer" else find(records, name, w)
            ax.scatter(j, 100 * record["useful_tflops"] / limit, s=90, marker="D", facecolors="none",
                       edgecolors=color, linewidths=2, zorder=4)
        ax.text(j, 4, f"limit\n{limit:.0f}", ha="center", fontsize=10)
    ax.axhline(100, color=COLORS["ceiling"], linewidth=1.2)
    ax.set_xticks(range(len(WORKLOADS)), [column_label(w) for w in WORKLOADS])
    ax.set_ylabel("% of the roofline")
    ax.set_ylim(0, 115)
    ax.grid(axis="x", visible=False)
    for _, label, color in STEPS:
        ax.scatter([], [], s=26, color=color, label=label)
    ax.scatter([], [], s=90, marker="D", facecolors="none", edgecolors=COLORS["peer"], linewidths=2,
               label="torch._grouped_mm (faster layout)")
    ax.scatter([], [], s=90, marker="D", facecolors="none", edgecolors=COLORS["k2"], linewidths=2, label="k2/s3")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=10)
    ax.set_title(f"roofline: {basis.tensor_tflops:.0f} TFLOP/s and {basis.copy_tbps:.2f} TB/s, {basis.source}",
                 fontsize=11)
    return fig


def epilogue_figure(data: dict[str, Any]):
    """Kernel time split by what the tensor pipe was doing, for every profiled rung."""
    profile = {p["variant"]: p for p in data["profile"]}
    names = sorted(profile, key=lambda name: -profile[name]["duration_ns"])
    fig, ax = new_figure(8.0, 1.2 + 0.55 * len(names))
    for i, name in enumerate(names):
        total = profile[name]["duration_ns"] / 1e3
        busy = total * profile[name]["gmma_pipe_pct"] / 100
        ax.barh(i, busy, color="#9467bd", label="tensor pipe busy with wgmma" if i == 0 else None)
        ax.barh(i, total - busy, left=busy, color="#d9d9d9", label="tensor pipe idle" if i == 0 else None)
        ax.text(total + 2, i, f"{total:.0f} µs", va="center", fontsize=11)
    ax.set_yticks(range(len(names)), [name.removeprefix("k3/") for name in names])
    ax.invert_yaxis()
    ax.set_xlabel("kernel time at 16,384 rows, s = 0 (µs, one profiled launch)")
    ax.set_xlim(0, max(p["duration_ns"] for p in profile.values()) / 1e3 * 1.15)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=10, ncol=2)
    return fig


def write_outputs(root: Path) -> list[Path]:
    report = write_compile_report(RUN, CHAPTER, root)
    data = recorded(CHAPTER)
    if data is None:
        return [report]
    return [report, save_figure(ladder_figure(data), CHAPTER, "ladder", root),
            save_figure(roofline_figure(data), CHAPTER, "roofline", root),
            save_figure(epilogue_figure(data), CHAPTER, "epilogue", root)]


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
