"""Chapter 09's figures, drawn from chapters/09/results/h200.json.

    python chapters/09/figures.py          # writes site_docs/figures/09/*.png

* roofline.png: useful TFLOP/s of k7 (its faster rung), quack's varlen-K (its best configuration) and
  torch._grouped_mm's 2D x 2D form against the rows, balanced and at s = 1.6, under the roofline;
* models.png: the same three at the model projections measured;

and, with no GPU needed, compile_report.md: NVRTC's resource report and SASS counts of every rung for
sm_90a. When the results file is absent only the compile report is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_gemm.chapter import best_of, chapter_module, figures_main, recorded, run_main
from moe_gemm.site.compile_report import write_compile_report
from moe_gemm.site.style import COLORS, model_bars, new_figure, projection_tick, save_figure

CHAPTER = "09"
RUN = chapter_module(CHAPTER)
KERNELS = ((RUN.K7, "k7 (faster rung)", COLORS["k3"]), (RUN.QUACK, "quack varlen-K (best)", "#2ca02c"),
           ((RUN.TORCH,), "torch._grouped_mm 2D x 2D", "#7f7f7f"))
SKEWS = (0.0, 1.6)


def roofline_figure(data: dict[str, Any]):
    """TFLOP/s against M_tot at the seed's shape, one panel per skew, the roofline drawn over them."""
    from moe_gemm.measure.ceilings import roofline_basis

    records = [r for r in data["records"] if r.get("part") == "grid"]
    basis = roofline_basis()
    fig, axes = new_figure(9.0, 3.8, ncols=len(SKEWS))
    for ax, skew in zip(axes, SKEWS):
        cells = [w for w in RUN.workloads_of(records, "grid") if w.skew == skew]
        rows = [w.tokens for w in cells]
        ax.plot(rows, [basis.tflops(w) for w in cells], "k--", lw=1, label="roofline")
        for names, label, color in KERNELS:
            values = [(best_of(records, names, w) or {"useful_tflops": float("nan")})["useful_tflops"] for w in cells]
            ax.plot(rows, values, "o-", color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [f"{t // 1024}k" for t in rows])
        ax.set_xlabel("M_tot (rows)")
        ax.set_title(f"s = {skew:g}", fontsize=12)
    axes[0].set_ylabel("useful TFLOP/s")
    axes[-1].legend(fontsize=11, loc="lower right", frameon=False)
    return fig


def models_figure(data: dict[str, Any]):
    """The three kernels at every model projection the records hold."""
    records = [r for r in data["records"] if r.get("part") == "models"]
    shapes = [(label, w) for label, w in RUN.MODELS.items() if best_of(records, RUN.K7, w)]
    return model_bars([projection_tick(label) for label, _ in shapes],
                      [(label, color, [(best_of(records, names, w) or {"useful_tflops": 0})["useful_tflops"]
                                       for _, w in shapes]) for names, label, color in KERNELS])


def write_outputs(root: Path) -> list[Path]:
    report = write_compile_report(RUN, CHAPTER, root)
    data = recorded(CHAPTER)
    if data is None:
        return [report]
    outputs = [report, save_figure(roofline_figure(data), CHAPTER, "roofline", root)]
    if any(r.get("part") == "models" for r in data["records"]):
        outputs.append(save_figure(models_figure(data), CHAPTER, "models", root))
    return outputs


def main(argv=None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
