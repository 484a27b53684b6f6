"""Chapter 10's figures, drawn from chapters/10/results/h200.json.

    python chapters/10/figures.py          # writes site_docs/figures/10/*.png

* accuracy.png: each FP8 kernel's relative error against the fp32 product of the dequantized inputs, against K:
  promoted (k8's blockwise and rowwise rungs) and not (k8's fast-accumulation rung), torch._scaled_grouped_mm's
  two modes beside them;
* grid.png: useful TFLOP/s of k8 (blockwise and rowwise), torch._scaled_grouped_mm's two modes and our bf16 k6
  against the rows, one panel per skew measured;
* models.png: the same kernels at the model projections measured;

and, with no GPU needed, compile_report.md: NVRTC's resource report and SASS counts of every rung for sm_90a;
promotion_model.png: the accumulation model's predicted error against K, with and without promotion
(moe_gemm.model.accumulation). When the results file is absent only these two are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moe_gemm.chapter import chapter_module, figures_main, recorded, run_main
from moe_gemm.model.problem import BF16_OPERANDS, FP8_BLOCKWISE, FP8_ROWWISE
from moe_gemm.site.compile_report import write_compile_report
from moe_gemm.site.style import model_bars, new_figure, projection_tick, save_figure

CHAPTER = "10"
RUN = chapter_module(CHAPTER)
MODEL_K = (128, 256, 512, 1024, 2048, 4096, 7168, 16384)  # the accuracy part's K and those between
# (variants, their operand format, label, color, marker)
KERNELS = ((RUN.BLOCKWISE, FP8_BLOCKWISE, "k8 blockwise", "#1f77b4", "o-"),
           (RUN.ROWWISE_PROMOTED, FP8_ROWWISE, "k8 rowwise, promoted", "#9467bd", "s-"),
           ((RUN.TORCH,), FP8_ROWWISE, "torch FP8, promoted", "#7f7f7f", "^--"),
           ((RUN.TORCH_FAST,), FP8_ROWWISE, "torch FP8, fast accumulation", "#bcbd22", "v--"),
           ((RUN.K6,), BF16_OPERANDS, "k6 bf16", "#2ca02c", "d:"))


def accuracy_figure(rows: list[dict[str, Any]]):
    fig, ax = new_figure(7.5, 4.0)
    styles = {**{n: ("#1f77b4", "o-") for n in RUN.BLOCKWISE}, **{n: ("#9467bd", "s-") for n in RUN.ROWWISE_PROMOTED},
              **{n: ("#d62728", "x-") for n in RUN.ROWWISE_FAST}, RUN.TORCH: ("#7f7f7f", "^--"),
              RUN.TORCH_FAST: ("#bcbd22", "v--")}
    for name in dict.fromkeys(r["variant"] for r in rows):
        points = sorted((r["K"], r["rel_error"]) for r in rows if r["variant"] == name)
        out = next(r["out"] for r in rows if r["variant"] == name)
        color, style = styles.get(name, ("k", "o-"))
        ax.plot([k for k, _ in points], [e for _, e in points], style, color=color, label=f"{name} ({out} out)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K (the reduction's length)")
    ax.set_ylabel("relative error")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    return fig


def promotion_model_figure():
    """The accumulation model's prediction (moe_gemm.model.accumulation): error against K without and with
    promotion every 128 of K, for zero-mean and non-negative inputs, and the chapter's accuracy target."""
    from moe_gemm.model.accumulation import BITS, promotion_errors

    rows = promotion_errors(MODEL_K)
    fig, ax = new_figure(7.5, 3.8)
    for inputs, style in (("zero-mean", "-"), ("non-negative", "--")):
        for promoted, color, marker in ((False, "#d62728", "x"), (True, "#1f77b4", "o")):
            points = [(r["K"], r["rel_error"]) for r in rows if r["inputs"] == inputs and r["promoted"] == promoted]
            label = f"{'promoted every 128' if promoted else 'not promoted'}, {inputs} inputs"
            ax.plot([k for k, _ in points], [e for _, e in points], marker + style, color=color, label=label)
    ax.axhline(RUN.ACCURACY_TARGET, color="#7f7f7f", linewidth=1, linestyle=":")
    ax.text(MODEL_K[0], RUN.ACCURACY_TARGET * 1.15, "the chapter's target", fontsize=9, color="#555555")
    ax.set_xscale("log", base=2)
    ax.set_xticks(MODEL_K, [f"{k // 1024}k" if k >= 1024 else str(k) for k in MODEL_K])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("K (the reduction's length)")
    ax.set_ylabel(f"relative error (model, {BITS} bits)")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    return fig


def grid_figure(records: list[dict[str, Any]]):
    """One panel per skew on a shared axis, the rows on a log axis; the legend beside the last panel, where no
    line runs through it."""
    cells = RUN.cells_of(records, "grid")
    skews = sorted({c.skew for c in cells})
    fig, axes = new_figure(10.0, 3.8, ncols=len(skews), sharey=True)
    axes = axes if len(skews) > 1 else [axes]
    for ax, skew in zip(axes, skews):
        row_cells = sorted((c for c in cells if c.skew == skew), key=lambda c: c.tokens)
        rows = [c.tokens for c in row_cells]
        for names, fmt, label, color, style in KERNELS:
            values = [RUN.tflops(records, names, fmt, c) or float("nan") for c in row_cells]
            ax.plot(rows, values, style, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [f"{t // 1024}k" for t in rows])
        ax.set_xlim(rows[0] / 1.6, rows[-1] * 1.6)
        ax.set_xlabel("M_tot (rows)")
        ax.set_title(f"s = {skew:g}", fontsize=12)
    axes[0].set_ylabel("useful TFLOP/s")
    axes[-1].legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig


def models_figure(records: list[dict[str, Any]]):
    shapes = [(label, w) for label, w in RUN.MODELS.items() if w in RUN.cells_of(records, "models")]
    return model_bars([projection_tick(label) for label, _ in shapes],
                      [(label, color, [RUN.tflops(records, names, fmt, w) or 0 for _, w in shapes])
                       for names, fmt, label, color, _ in KERNELS], legend_size=9)


def write_outputs(root: Path) -> list[Path]:
    report = write_compile_report(RUN, CHAPTER, root)
    outputs = [report, save_figure(promotion_model_figure(), CHAPTER, "promotion_model", root)]
    data = recorded(CHAPTER)
    if data is None:
        return outputs
    if data.get("accuracy"):
        outputs.append(save_figure(accuracy_figure(data["accuracy"]), CHAPTER, "accuracy", root))
    records = data["records"]
    if RUN.cells_of(records, "grid"):
        outputs.append(save_figure(grid_figure(records), CHAPTER, "grid", root))
    if RUN.cells_of(records, "models"):
        outputs.append(save_figure(models_figure(records), CHAPTER, "models", root))
    return outputs


def main(argv=None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
