"""Chapter 07's figures, drawn from chapters/07/results/h200.json (the walk's and a model chart from the H100's).

    python chapters/07/figures.py          # writes site_docs/figures/07/*.png

* grid.png: k6/auto over quack and over the faster torch._grouped_mm layout in every cell measured
  (graph replays at 2,048 rows and fewer);
* models.png: useful TFLOP/s of k6/auto, quack and torch at the model shapes measured;
* models-<gpu>.png: the same from each other GPU's results file whose model part holds a shape (the H100's);
* ladder.png: every rung's share of the roofline at 65,536 rows, s=0, quack's and torch's beside it;
* walk.png: the device walk's and each remedy's extra time over the host list at the seed five, with the
  spread of one kernel timed twice (the walk part, from the first results file that holds it, the recorded
  GPU's first);

and, with no GPU needed, compile_report.md: NVRTC's resource report and SASS counts of every rung
for sm_90a. When the results file is absent only the compile report is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_gemm.chapter import Workload, chapter_module, figures_main, recorded, run_main
from moe_gemm.measure.results import recorded_gpus
from moe_gemm.site.compile_report import write_compile_report
from moe_gemm.site.style import COLORS, grid_heatmaps, model_bars, new_figure, save_figure

CHAPTER = "07"
RUN = chapter_module(CHAPTER)


def grid_figure(data: dict[str, Any]):
    """k6/auto over quack and over torch on chapter 06's grid; a cell not measured is left blank."""
    records = data["records"]
    panels = [(title, lambda t, s, peers=peers: RUN.ratio(records, RUN.AUTO, peers, Workload(t, s)))
              for peers, title in ((RUN.QUACK, "k6/auto / quack"), (RUN.TORCH, "k6/auto / torch._grouped_mm"))]
    return grid_heatmaps(panels, "ratio of useful TFLOP/s, same run (blue: k6/auto faster; blank: not measured)")


def tick_label(label: str) -> str:
    """'Qwen3-30B-A3B gate_up (4k tokens, top-8)' -> 'Qwen3-\n30B-A3B\ngate_up': the model over the
    projection, a long model name broken at its first hyphen, so that eight shapes fit side by side."""
    model, projection = label.split(" (")[0].split(" ", 1)
    return f"{model.replace('-', '-' + chr(10), 1) if len(model) > 12 else model}\n{projection}"


def models_figure(data: dict[str, Any]):
    """k6/auto, quack and torch at every model shape the records hold (a shape not measured is left out)."""
    records = RUN.of_part(data["records"], "models")
    shapes = [(label, w) for label, w in RUN.MODELS.items() if RUN.find(records, RUN.AUTO, w)]
    kernels = ((["k6/auto"], "k6/auto", COLORS["k3"]), (RUN.QUACK, "quack (best)", "#2ca02c"),
               (RUN.TORCH, "torch._grouped_mm (faster layout)", "#7f7f7f"))
    return model_bars([tick_label(label) for label, _ in shapes],
                      [(label, color, [(RUN.best_of(records, names, w) or {"useful_tflops": 0})["useful_tflops"]
                                       for _, w in shapes]) for names, label, color in kernels])


def ladder_figure(data: dict[str, Any]):
    from moe_gemm.measure.ceilings import roofline_basis

    records = RUN.of_part(data["records"], "ladder")
    cell = Workload(65536, 0.0)
    basis = roofline_basis()
    # the rungs, not k6/auto: k6/auto against the peers is the grid's measurement (grid.png), not the ladder's
    names = [n for n in (*RUN.ladder_names(), *RUN.EARLIER, *RUN.QUACK[:1], *RUN.TORCH[:1])
             if RUN.find(records, n, cell)]
    shares = [100 * RUN.find(records, n, cell)["useful_tflops"] / basis.tflops(cell) for n in names]
    fig, ax = new_figure(7.5, 0.32 * len(names) + 1.2)
    colors = ["#2ca02c" if n.startswith("peer/quack") else "#7f7f7f" if n.startswith("peer/") else COLORS["k3"]
              for n in names]
    ax.barh(range(len(names)), shares, color=colors)
    for i, share in enumerate(shares):
        ax.text(share + 0.5, i, f"{share:.0f}%", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the roofline at 65,536 rows, s=0 (%)")
    ax.grid(axis="y", visible=False)
    return fig


def walk_records() -> tuple[str, list[dict[str, Any]]] | None:
    """The walk part's records and their GPU, from the first results file that holds them (the recorded GPU's,
    then the others')."""
    for gpu in recorded_gpus(CHAPTER):
        walk = RUN.of_part((recorded(CHAPTER, gpu) or {}).get("records", []), "walk")
        if walk:
            return gpu, walk
    return None


def walk_figure(gpu: str, records: Sequence[dict[str, Any]]):
    """Per seed cell the cursor was timed at, the microseconds the M pair spends over its host-list twin on the
    device walk and with each remedy timed at all of them; the whisker is the spread (the same kernel timed
    twice), drawn on the device walk's bar."""
    times = {w: ms for w, ms in RUN.walk_times(records).items() if "cursor" in ms}
    shown = ["device", *(k for k in RUN.REMEDIES if all(k in ms for ms in times.values()))]
    spread = [1e3 * abs(ms["again"] - ms["device"]) for ms in times.values()]
    labels = {"device": ("device walk (binary search)", "#7f7f7f"), "cursor": ("with the cursor", COLORS["k3"]),
              "listed": ("with the unit list", COLORS["k1"])}
    fig, ax = new_figure(7.5, 3.4)
    x, width = range(len(times)), 0.8 / len(shown)
    for j, k in enumerate(shown):
        label, color = labels[k]
        ax.bar([i - 0.4 + (j + 0.5) * width for i in x], [1e3 * (ms[k] - ms["host"]) for ms in times.values()], width,
               yerr=spread if k == "device" else None, capsize=3, color=color, label=label)
    ax.set_xticks(list(x), [w.short_label for w in times])
    ax.set_ylabel("us over the host list")
    ax.set_title(f"The M pair's walk, {gpu.upper()}: extra time per launch", fontsize=11)
    ax.legend(fontsize=9)
    return fig


def write_outputs(root: Path) -> list[Path]:
    report = write_compile_report(RUN, CHAPTER, root)
    written = [report]
    walk = walk_records()
    if walk is not None:
        written.append(save_figure(walk_figure(*walk), CHAPTER, "walk", root))
    for gpu in recorded_gpus(CHAPTER)[1:]:  # the other GPUs' model shapes, each on its own chart
        other = recorded(CHAPTER, gpu) or {}
        if RUN.of_part(other.get("records", []), "models"):
            written.append(save_figure(models_figure(other), CHAPTER, f"models-{gpu}", root))
    data = recorded(CHAPTER)
    if data is None:
        return written
    return written + [save_figure(grid_figure(data), CHAPTER, "grid", root),
                      save_figure(models_figure(data), CHAPTER, "models", root),
                      save_figure(ladder_figure(data), CHAPTER, "ladder", root)]


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
