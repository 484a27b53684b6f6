"""Chapter 03's figures, and the tables only the compiler and the routing can give.

    python chapters/03/figures.py          # writes site_docs/figures/03/*.png and *.md

Always written, no GPU needed: the compile report (NVRTC for sm_90a) and the scheduled-against-useful
work of BM = 128 tiles at the seed workloads, as markdown tables for site_docs/03-tma-warp-specialization.md,
and the schematic of the producer/consumer ring. From chapters/03/results/h200.json: the progression
and STAGES figures (the seed's B300 numbers appear in the progression as a labelled reference series,
never as measurements). The page's own tables and numbers come from the results file by moe_gemm.site.pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from moe_gemm.chapter import (
    SEED,
    SEED_WORKLOADS,
    Table,
    Workload,
    chapter_module,
    figures_main,
    find,
    recorded,
    run_main,
)
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import eta, scheduled_flops, tile_count
from moe_gemm.site.style import COLORS, family_color, new_figure, save_figure

CHAPTER = "03"
WORKLOADS = SEED_WORKLOADS
STAGE_COLORS = {2: "#2ca02c", 3: "#1f77b4", 4: "#9467bd"}


# --------------------------------------------------------------------------- tables needing no GPU

def compile_markdown(run) -> str:
    return run.compile_table(run.compile_report(run.ARCH)).markdown()


def waste_table() -> Table:
    """Useful against scheduled work of 128 x 128 tiles: what reading past an expert costs."""
    rows = []
    for w in WORKLOADS:
        counts = expert_counts(w.experts, w.tokens, w.skew)
        useful = 2 * w.tokens * w.K * w.N
        scheduled = scheduled_flops(counts, w.K, w.N, 128, 128)
        rows.append((f"{w.tokens:,} rows, s = {w.skew:g}", tile_count(counts, w.N, 128, 128), f"{useful / 1e9:.1f}",
                     f"{scheduled / 1e9:.1f}", f"{eta(counts, 128):.3f}", f"{100 * (1 - useful / scheduled):.1f}%"))
    return Table(("workload", "tiles", "useful GFLOP", "scheduled GFLOP", "eta (BM = 128)", "wasted"), tuple(rows),
                 legend="128 x 128 tiles; scheduled counts every row a tile multiplies; wasted = 1 - useful / "
                        "scheduled.")


# --------------------------------------------------------------------------- the ring schematic

def ring_diagram(stages: int = 3, steps: int = 6):
    """The producer/consumer protocol over K steps: which stage each step fills and consumes, the
    parity each side waits on, and what completes each barrier's phase (the page explains the rules;
    the picture keeps to what a reader needs to follow them step by step)."""
    fig, ax = new_figure(10.0, 5.8)
    ax.set_axis_off()
    ax.grid(False)
    width, pitch = 1.6, 1.9
    lag = 0.85 * pitch  # a step's multiply starts once its TMA boxes have landed
    y_prod, y_cons, h = 2.7, 0.45, 0.8

    for label, y in (("producer\nwarp", y_prod), ("8 compute\nwarps", y_cons)):
        ax.text(-0.25, y + h / 2, label, ha="right", va="center", fontsize=11, fontweight="bold")
    # one bracket per pass round the ring: the parity each side names during it
    for first in range(0, steps, stages):
        last = min(first + stages, steps) - 1
        n = first // stages
        x0, x1, y = first * pitch, last * pitch + width, y_prod + h + 0.85
        ax.plot([x0, x0, x1, x1], [y - 0.08, y, y, y - 0.08], color="#555555", linewidth=0.8)
        ax.text((x0 + x1) / 2, y + 0.06, f"pass {n}: full parity {n % 2}, empty parity {(n % 2) ^ 1}",
                ha="center", va="bottom", fontsize=10.5, color="#222222")

    for k in range(steps):
        stage, parity = k % stages, (k // stages) % 2
        color = STAGE_COLORS.get(stage + 2, "#888888")
        x_p, x_c = k * pitch, k * pitch + lag
        ax.add_patch(FancyBboxPatch((x_p, y_prod), width, h, boxstyle="round,pad=0.02", facecolor=color, alpha=0.3,
                                    edgecolor=color))
        ax.text(x_p + width / 2, y_prod + h / 2, f"k{k}: TMA\ninto stage {stage}", ha="center", va="center",
                fontsize=10.5)
        ax.text(x_p + width / 2, y_prod + h + 0.05, f"wait empty[{stage}]\nparity {parity ^ 1}", ha="center",
                va="bottom", fontsize=10, color="#333333")
        ax.add_patch(FancyBboxPatch((x_c, y_cons), width, h, boxstyle="round,pad=0.02", facecolor=color, alpha=0.85,
                                    edgecolor=color))
        ax.text(x_c + width / 2, y_cons + h / 2, f"k{k}: multiply\nstage {stage}", ha="center", va="center",
                fontsize=10.5, color="white")
        ax.text(x_c + width / 2, y_cons - 0.05, f"wait full[{stage}]\nparity {parity}", ha="center", va="top",
                fontsize=10, color="#333333")
        ax.add_patch(FancyArrowPatch((x_p + width * 0.5, y_prod), (x_c + width * 0.3, y_cons + h),
                                     arrowstyle="-|>", mutation_scale=10, color="#555555", linewidth=0.9))
        if k + stages < steps:  # the release that lets the producer refill stage s
            x_next = (k + stages) * pitch
            ax.add_patch(FancyArrowPatch((x_c + width * 0.9, y_cons + h), (x_next + width * 0.15, y_prod),
                                         arrowstyle="-|>", mutation_scale=10, color=color, linewidth=1.3,
                                         linestyle="--"))
    ax.set_xlim(-1.6, (steps - 1) * pitch + lag + width + 0.1)
    ax.set_ylim(-0.6, y_prod + h + 1.3)
    handles = [Line2D([], [], color="#555555", linewidth=0.9,
                      label="full[s] completes: the producer arrived once and TMA's 32,768 bytes landed"),
               Line2D([], [], color=STAGE_COLORS[2], linewidth=1.3, linestyle="--",
                      label="empty[s] completes: all 8 compute warps arrived, so stage s may be refilled")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), fontsize=10.5, ncol=1,
              handlelength=2.5)
    ax.set_title(f"The k2 ring with STAGES = {stages} (schematic): step k uses stage k mod {stages};\n"
                 f"the first {stages} waits on empty[s] pass at once (a fresh barrier's 'previous phase' is complete)",
                 fontsize=11.5)
    return fig


# --------------------------------------------------------------------------- measured figures

def progression_figure(records: list[dict], run):
    keys = list(dict.fromkeys(Workload.of(r).short_label for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, ax = new_figure(9.0, 4.8)
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = []
        for variant in variants:
            record = find(records, variant, key)
            values.append(record["useful_tflops"] if record else 0.0)
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(variants))]
        bars = ax.bar(xs, values, width * 0.95, label=key, color=[family_color(v) for v in variants],
                      alpha=1.0 - 0.3 * i, edgecolor="white")
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.0f}", ha="center", va="bottom",
                        fontsize=9.5, rotation=90,
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.3})
    # the seed's B300 numbers for k2/S2, as a labelled reference (not measured here): one line style
    # per workload, named in the legend rather than on the plot, where labels would cross the bars
    seed = run.SEED_B300["k2/S2"]
    styles = (":", "--", "-.")
    seed_handles = []
    for key, style in zip([k for k in keys if k in seed], styles):
        ax.axhline(seed[key], color=COLORS["seed"], linestyle=style, linewidth=1.0, zorder=0)
        seed_handles.append(Line2D([], [], color=COLORS["seed"], linestyle=style, linewidth=1.0,
                                   label=f"{key}: {seed[key]}"))
    shades = [Patch(facecolor="#777777", alpha=1.0 - 0.3 * i, label=key) for i, key in enumerate(keys)]
    legend = ax.legend(handles=shades, title="workload (bar shade)", fontsize=9.5, title_fontsize=9.5, loc="upper left",
                       bbox_to_anchor=(1.0, 1.0))
    ax.add_artist(legend)
    if seed_handles:
        ax.legend(handles=seed_handles, title="the seed's B300 k2/S2\n(reference, not run here)", fontsize=9.5,
                  title_fontsize=9.5, loc="upper left", bbox_to_anchor=(1.0, 0.62))
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=20, ha="right", fontsize=9.5)
    ax.set_ylabel("useful TFLOP/s (median)")
    ax.set_ylim(0, max([r["useful_tflops"] for r in records] + list(seed.values())) * 1.15)
    ax.set_title(f"k0, k1 and k2 beside the peers: same inputs, same run\n(E = {SEED.experts}, K = {SEED.K}, "
                 f"N = {SEED.N})")
    return fig


def stages_figure(stage_rows: list[dict]):
    fig, ax = new_figure(7.0, 3.8)
    labels = [("balanced_tflops", "16k s=0"), ("skewed_tflops", "16k s=1.2"),
              ("skewed_estimate", "16k s=1.2, eta-only"), ("small_tflops", "2k s=0")]
    width = 0.8 / len(labels)
    for i, (key, label) in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(stage_rows))]
        values = [row.get(key, 0.0) for row in stage_rows]
        hatch = "//" if "estimate" in key else None
        bars = ax.bar(xs, values, width * 0.95, label=label, hatch=hatch, alpha=0.55 + 0.15 * (i % 3),
                      color=["#2ca02c", "#1f77b4", "#ffffff", "#9467bd"][i], edgecolor="#333333", linewidth=0.6)
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.0f}", ha="center", va="bottom",
                        fontsize=9.5)
    ax.set_xticks(range(len(stage_rows)))
    ax.set_xticklabels([f"{r['variant']}\n{r['registers']} regs, {r['smem_bytes'] / 1024:.0f} KB\n"
                        f"{r['blocks_per_sm']} block(s)/SM" for r in stage_rows], fontsize=9.5)
    ax.set_ylabel("useful TFLOP/s (median)")
    ax.set_title("STAGES: measured, and the eta-only estimate for s = 1.2")
    ax.set_ylim(0, max([row.get(k, 0.0) for row in stage_rows for k, _ in labels] + [1.0]) * 1.3)
    ax.legend(fontsize=9.5, ncol=4, loc="upper center")
    return fig


# --------------------------------------------------------------------------- main

def write_outputs(root: Path) -> list[Path]:
    run = chapter_module(CHAPTER)
    folder = root / CHAPTER
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "compile_report.md", folder / "waste.md"]
    written[0].write_text(compile_markdown(run))
    written[1].write_text(waste_table().markdown())
    written.append(save_figure(ring_diagram(), CHAPTER, "ring", root=root))
    data = recorded(CHAPTER)
    if data is None:
        print(f"chapter {CHAPTER} has no recorded results: no measured figure drawn")
        return written
    records = data["records"]
    written.append(save_figure(progression_figure(records, run), CHAPTER, "progression", root=root))
    written.append(save_figure(stages_figure(data.get("stages") or run.stages_rows(records)), CHAPTER, "stages",
                               root=root))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
