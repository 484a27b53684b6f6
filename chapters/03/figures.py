"""Chapter 03's figures and generated docs tables.

    python chapters/03/figures.py          # writes site_docs/figures/03/*.png and *.md

Everything measured comes from chapters/03/results/h200.json; when that file is absent the
measured tables say so and no measured figure is drawn. Three outputs need no GPU and are always
written: the compile report (NVRTC for sm_90a), the scheduled-against-useful work of BM = 128
tiles at the seed workloads, and the schematic of the producer/consumer ring. The seed's B300
numbers appear in the progression figure as a labelled reference series, never as measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from moe_gemm.cli import chapter_parser, run_main
from moe_gemm.report import Table, markdown_table
from moe_gemm.results import results_path
from moe_gemm.routing import expert_counts
from moe_gemm.style import COLORS, FIGURE_ROOT, family_color, new_figure, save_figure
from moe_gemm.tiles import eta, scheduled_flops, tile_count

CHAPTER = "03"
GPU_SLUG = "h200"
EXPERTS, K, N = 64, 1024, 2688
WORKLOADS = ((16384, 0.0), (16384, 1.2), (2048, 0.0))
STAGE_COLORS = {2: "#2ca02c", 3: "#1f77b4", 4: "#9467bd"}
NOT_MEASURED = ("*Not measured yet: `chapters/03/results/h200.json` does not exist. Run "
                "`python chapters/03/run.py` on an H200 to record it.*\n")


def _load_run():
    """chapters/03/run.py as a module (chapter folders are not packages)."""
    spec = importlib.util.spec_from_file_location("chapter03_run", Path(__file__).with_name("run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_results() -> dict | None:
    path = results_path(CHAPTER, GPU_SLUG)
    return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------- tables needing no GPU

def compile_markdown(run) -> str:
    rows = run.compile_report("sm_90a")
    table = run.compile_table(rows)
    return markdown_table(table.headers, table.rows)


def waste_table() -> Table:
    """Useful against scheduled work of 128 x 128 tiles: what reading past an expert costs."""
    rows = []
    for tokens, skew in WORKLOADS:
        counts = expert_counts(EXPERTS, tokens, skew)
        useful = 2 * tokens * K * N
        scheduled = scheduled_flops(counts, K, N, 128, 128)
        rows.append((f"{tokens:,} rows, s = {skew:g}", tile_count(counts, N, 128, 128), f"{useful / 1e9:.1f}",
                     f"{scheduled / 1e9:.1f}", f"{eta(counts, 128):.3f}", f"{100 * (1 - useful / scheduled):.1f}%"))
    return Table(("workload", "tiles", "useful GFLOP", "scheduled GFLOP", "eta (BM = 128)", "wasted"), tuple(rows))


# --------------------------------------------------------------------------- the ring schematic

def ring_diagram(stages: int = 3, steps: int = 7):
    """Producer and consumers over K steps: which stage each step uses and the parity it waits on."""
    fig, ax = new_figure(9.0, 3.9)
    ax.set_axis_off()
    width, gap = 1.0, 0.25
    lanes = {"producer warp (lane 0)": 2.2, "8 compute warps": 0.6}
    for label, y in lanes.items():
        ax.text(-0.15, y + 0.35, label, ha="right", va="center", fontsize=9)
    for ks in range(steps):
        stage, parity = ks % stages, (ks // stages) % 2
        x_p, x_c = ks * (width + gap), (ks + 1.2) * (width + gap)
        color = STAGE_COLORS.get(stage + 2, "#888888")
        # producer: wait empty[s] (parity ^ 1), expect 32 KB, three TMA boxes
        ax.add_patch(FancyBboxPatch((x_p, 2.2), width, 0.7, boxstyle="round,pad=0.02", facecolor=color, alpha=0.35,
                                    edgecolor=color))
        ax.text(x_p + width / 2, 2.55, f"TMA k{ks}\nstage {stage}", ha="center", va="center", fontsize=7)
        ax.text(x_p + width / 2, 3.05, f"wait empty[{stage}]\nparity {parity ^ 1}", ha="center", va="bottom",
                fontsize=6.5, color="#444444")
        # consumers: wait full[s] (parity), ldmatrix + mma, arrive empty[s]
        ax.add_patch(FancyBboxPatch((x_c, 0.6), width, 0.7, boxstyle="round,pad=0.02", facecolor=color, alpha=0.8,
                                    edgecolor=color))
        ax.text(x_c + width / 2, 0.95, f"mma k{ks}\nstage {stage}", ha="center", va="center", fontsize=7,
                color="white")
        ax.text(x_c + width / 2, 0.45, f"wait full[{stage}]\nparity {parity}", ha="center", va="top",
                fontsize=6.5, color="#444444")
        ax.add_patch(FancyArrowPatch((x_p + width * 0.8, 2.2), (x_c + width * 0.2, 1.3), arrowstyle="->",
                                     mutation_scale=8, color="#666666", linewidth=0.8))
        if ks + stages < steps:  # the release that lets the producer refill this stage
            x_next = (ks + stages) * (width + gap)
            ax.add_patch(FancyArrowPatch((x_c + width * 0.9, 1.3), (x_next + width * 0.3, 2.2), arrowstyle="->",
                                         mutation_scale=8, color=color, linewidth=0.9, linestyle="--"))
    ax.set_xlim(-2.6, (steps + 1.3) * (width + gap))
    ax.set_ylim(-0.35, 3.7)
    ax.plot([], [], color="#666666", linewidth=0.8, label="full[s] completes: TMA has written the stage's 32 KB")
    ax.plot([], [], color=STAGE_COLORS[2], linewidth=0.9, linestyle="--",
            label="empty[s] completes: all 8 compute warps have arrived; the stage may be refilled")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.08), fontsize=7, ncol=2)
    ax.set_title(f"The ring with STAGES = {stages} (schematic, not to scale): step k uses stage k mod {stages} "
                 f"and waits on parity floor(k / {stages}) mod 2", fontsize=9)
    return fig


# --------------------------------------------------------------------------- measured figures

def progression_figure(records: list[dict], run):
    keys = list(dict.fromkeys(run.workload_key(r) for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, ax = new_figure(8.0, 4.2)
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = []
        for variant in variants:
            record = run._find(records, variant, key)
            values.append(record["useful_tflops"] if record else 0.0)
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(variants))]
        bars = ax.bar(xs, values, width * 0.95, label=key, color=[family_color(v) for v in variants],
                      alpha=1.0 - 0.3 * i, edgecolor="white")
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.0f}", ha="center", va="bottom",
                        fontsize=6.5, rotation=90)
    # the seed's B300 numbers for k2/S2, as a labelled reference (not measured here)
    seed = run.SEED_B300["k2/S2"]
    for key in keys:
        if key in seed:
            ax.axhline(seed[key], color=COLORS["seed"], linestyle=":", linewidth=1.0)
            ax.text(-0.45, seed[key], f"the seed's B300 k2/S2, {key}: {seed[key]}", fontsize=7,
                    color=COLORS["seed"], ha="left", va="bottom",
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5})
    shades = [Patch(facecolor="#777777", alpha=1.0 - 0.3 * i, label=key) for i, key in enumerate(keys)]
    ax.legend(handles=shades, title="workload (bar shade)", fontsize=7, title_fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("useful TFLOP/s (median)")
    ax.set_ylim(0, max([r["useful_tflops"] for r in records] + list(seed.values())) * 1.15)
    ax.set_title("k0 -> k1 -> k2 beside the peer, same inputs, same run (E = 64, K = 1024, N = 2688)")
    return fig


def stages_figure(stage_rows: list[dict]):
    fig, ax = new_figure(7.0, 3.8)
    labels = [("balanced_tflops", "16k s=0"), ("skewed_tflops", "16k s=1.2"), ("skewed_estimate", "16k s=1.2, eta-only"),
              ("small_tflops", "2k s=0")]
    width = 0.8 / len(labels)
    for i, (key, label) in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(stage_rows))]
        values = [row.get(key, 0.0) for row in stage_rows]
        hatch = "//" if "estimate" in key else None
        bars = ax.bar(xs, values, width * 0.95, label=label, hatch=hatch, alpha=0.55 + 0.15 * (i % 3),
                      color=["#2ca02c", "#1f77b4", "#ffffff", "#9467bd"][i], edgecolor="#333333", linewidth=0.6)
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(stage_rows)))
    ax.set_xticklabels([f"{r['variant']}\n{r['registers']} regs, {r['smem_bytes'] / 1024:.0f} KB\n"
                        f"{r['blocks_per_sm']} block(s)/SM" for r in stage_rows], fontsize=8)
    ax.set_ylabel("useful TFLOP/s (median)")
    ax.set_title("STAGES: measured, and the eta-only estimate for s = 1.2")
    ax.set_ylim(0, max([row.get(k, 0.0) for row in stage_rows for k, _ in labels] + [1.0]) * 1.3)
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    return fig


# --------------------------------------------------------------------------- main

def figure_markdown(name: str, alt: str) -> str:
    return f"![{alt}](figures/{CHAPTER}/{name}.png)\n"


def write_outputs(root: Path = FIGURE_ROOT) -> list[Path]:
    run = _load_run()
    folder = root / CHAPTER
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def write(name: str, text: str) -> None:
        path = folder / name
        path.write_text(text)
        written.append(path)

    write("compile_report.md", compile_markdown(run))
    write("waste.md", waste_table().markdown())
    written.append(save_figure(ring_diagram(), CHAPTER, "ring", root=root))

    data = load_results()
    if data is None:
        print(f"no recorded results at {results_path(CHAPTER, GPU_SLUG)}: measured tables say so, no figure drawn")
        for name in ("progression.md", "progression_figure.md", "stages.md", "stages_figure.md", "profile.md",
                     "provenance.md"):
            write(name, NOT_MEASURED)
        return written

    records = data["records"]
    prov = data["provenance"]
    write("provenance.md", f"*Measured on {prov['gpu']} (compute capability {prov['compute_capability']}, driver "
                           f"CUDA {prov['driver']}), {prov['date']}, commit `{prov['git_commit'][:12]}`.*\n")
    progression = run.progression_table(records)
    write("progression.md", markdown_table(progression.headers, progression.rows))
    written.append(save_figure(progression_figure(records, run), CHAPTER, "progression", root=root))
    write("progression_figure.md", figure_markdown("progression", "k0, k1 and k2 beside torch._grouped_mm"))

    stage_rows = data.get("stages") or run.stages_rows(records)
    stages = run.stages_table(stage_rows)
    write("stages.md", markdown_table(stages.headers, stages.rows))
    written.append(save_figure(stages_figure(stage_rows), CHAPTER, "stages", root=root))
    write("stages_figure.md", figure_markdown("stages", "k2 with 2, 3 and 4 stages"))

    profile = data.get("profile")
    report = data.get("compile_report") or run.compile_report("sm_90a")
    write("profile.md", run.occupancy_table(profile, report).markdown() if profile else
          "*No Nsight Compute counters recorded: run `python chapters/03/run.py --profile`.*\n")
    return written


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = chapter_parser(__doc__)
    parser.add_argument("--out", type=Path, default=FIGURE_ROOT,
                        help=f"folder that receives {CHAPTER}/*.png and *.md (default {FIGURE_ROOT})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for path in write_outputs(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    run_main(main)
