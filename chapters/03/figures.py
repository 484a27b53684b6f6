"""Chapter 03's figures and generated docs tables.

    python chapters/03/figures.py          # writes site_docs/figures/03/*.png and *.md

Everything measured comes from chapters/03/results/h200.json; when that file is absent the
measured tables say so and no measured figure is drawn. Three outputs need no GPU and are always
written: the compile report (NVRTC for sm_90a), the scheduled-against-useful work of BM = 128
tiles at the seed workloads, and the schematic of the producer/consumer ring. The seed's B300
numbers appear in the progression figure as a labelled reference series, never as measurements.

The findings_*.md snippets are the page's numeric sentences (target, k1, peer, ceilings, STAGES,
skew, residency against Nsight Compute, where the cycles go), formatted here from the results
file (and chapter 02's, for its measured ceilings and k1's counters) so that a rerun rewrites
them; tests/test_chapter03.py checks the page's prose claims against the same files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from matplotlib.lines import Line2D

from moe_gemm.notebook import find_measurement, short_label
from moe_gemm.cli import chapter_parser, run_main
from moe_gemm.occupancy import HOPPER, registers_per_warp, residency
from moe_gemm.report import Table, markdown_table
from moe_gemm.results import results_path
from moe_gemm.roofline import H200_COPY_TBPS, H200_DENSE_BF16_TFLOPS, compulsory_bytes, roofline_tflops
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
# Constants the findings compare against. None is a measurement of ours: the first two are the
# SPEC's targets (section 7), the third the seed's B300 numbers (cited as such on the page).
TARGET_K2 = 380.0          # k2 at 16,384 rows, s = 0, useful TFLOP/s (written for S = 2)
TARGET_SMALL = 110.0       # the project's target at 2,048 rows, s = 0 (chapter 06's scoreboard)
SEED_B300_SKEWED = (357.0, 343.3)  # the seed's k2/S2 at s = 1.2: measured, and 440.1 x 0.780 estimated
FLOP_PER_MMA = 2 * 16 * 8 * 16     # one mma.sync.m16n8k16
BALANCED, SKEWED, SMALL = "16k s=0", "16k s=1.2", "2k s=0"
FINDINGS = ("findings_headline.md", "findings_stages.md", "findings_skew.md", "findings_residency.md",
            "residency_arithmetic.md", "findings_limit.md")


def _load_run():
    """chapters/03/run.py as a module (chapter folders are not packages)."""
    spec = importlib.util.spec_from_file_location("chapter03_run", Path(__file__).with_name("run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_results() -> dict | None:
    path = results_path(CHAPTER, GPU_SLUG)
    return json.loads(path.read_text()) if path.is_file() else None


def load_chapter02() -> dict | None:
    """Chapter 02's recorded results: the measured ceilings and k1's Nsight Compute counters."""
    path = results_path("02", GPU_SLUG)
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

def ring_diagram(stages: int = 3, steps: int = 6):
    """The producer/consumer protocol over K steps: which stage each step fills and consumes, the
    parity each side waits on, and what completes each barrier's phase."""
    fig, (ax, notes) = new_figure(10.0, 6.2, nrows=2, gridspec_kw={"height_ratios": [3.9, 1.3]})
    ax.set_axis_off()
    notes.set_axis_off()
    ax.grid(False)
    width, pitch = 1.3, 1.55
    lag = 0.85 * pitch  # a step's multiply starts once its TMA boxes have landed
    y_prod, y_cons, h = 2.6, 0.45, 0.85

    for label, y in (("producer warp\n(lane 0 of warp 8)", y_prod), ("compute warps\n0..7", y_cons)):
        ax.text(-0.25, y + h / 2, label, ha="right", va="center", fontsize=9, fontweight="bold")
    # one bracket per pass round the ring: the parity each side names during it
    for first in range(0, steps, stages):
        last = min(first + stages, steps) - 1
        n = first // stages
        x0, x1, y = first * pitch, last * pitch + width, y_prod + h + 0.95
        ax.plot([x0, x0, x1, x1], [y - 0.08, y, y, y - 0.08], color="#555555", linewidth=0.8)
        ax.text((x0 + x1) / 2, y + 0.06, f"pass {n}: full[s] parity {n % 2}, empty[s] parity {(n % 2) ^ 1}",
                ha="center", va="bottom", fontsize=8, color="#222222")

    for k in range(steps):
        stage, parity = k % stages, (k // stages) % 2
        color = STAGE_COLORS.get(stage + 2, "#888888")
        x_p, x_c = k * pitch, k * pitch + lag
        ax.add_patch(FancyBboxPatch((x_p, y_prod), width, h, boxstyle="round,pad=0.02", facecolor=color, alpha=0.3,
                                    edgecolor=color))
        ax.text(x_p + width / 2, y_prod + h / 2, f"k{k} → stage {stage}\nexpect_tx 32 KB\n3 TMA boxes",
                ha="center", va="center", fontsize=8)
        why = "(fresh: passes)" if k < stages else f"(k{k - stages} released it)"
        ax.text(x_p + width / 2, y_prod + h + 0.05, f"wait empty[{stage}]\nparity {parity ^ 1}\n{why}",
                ha="center", va="bottom", fontsize=7.5, color="#333333")
        ax.add_patch(FancyBboxPatch((x_c, y_cons), width, h, boxstyle="round,pad=0.02", facecolor=color, alpha=0.85,
                                    edgecolor=color))
        ax.text(x_c + width / 2, y_cons + h / 2, f"k{k} · stage {stage}\n24 ldmatrix\n64 mma", ha="center",
                va="center", fontsize=8, color="white")
        ax.text(x_c + width / 2, y_cons - 0.05, f"wait full[{stage}]\nparity {parity}\nthen arrive\nempty[{stage}]",
                ha="center", va="top", fontsize=7.5, color="#333333")
        ax.add_patch(FancyArrowPatch((x_p + width * 0.5, y_prod), (x_c + width * 0.3, y_cons + h),
                                     arrowstyle="-|>", mutation_scale=9, color="#555555", linewidth=0.9))
        if k + stages < steps:  # the release that lets the producer refill stage s
            x_next = (k + stages) * pitch
            ax.add_patch(FancyArrowPatch((x_c + width * 0.9, y_cons + h), (x_next + width * 0.15, y_prod),
                                         arrowstyle="-|>", mutation_scale=9, color=color, linewidth=1.2,
                                         linestyle="--"))
    ax.set_xlim(-2.3, (steps - 1) * pitch + lag + width + 0.1)
    ax.set_ylim(-0.95, y_prod + h + 1.35)
    handles = [Line2D([], [], color="#555555", linewidth=0.9,
                      label="full[s] completes: the producer's 1 arrival and TMA's 32,768 bytes are in"),
               Line2D([], [], color=STAGE_COLORS[2], linewidth=1.2, linestyle="--",
                      label="empty[s] completes: all 8 compute warps arrived; stage s may be refilled")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8, ncol=2,
              handlelength=2.5, columnspacing=1.5)
    ax.set_title(f"The k2 ring with STAGES = {stages} (schematic, not to scale)\nstep k uses stage s = k mod {stages}; "
                 f"pass n = floor(k / {stages}); consumers wait full[s] with parity n mod 2, "
                 "the producer waits empty[s] with (n mod 2) XOR 1", fontsize=9)

    cards = (
        ("full[s]: init count 1", "The producer's arrive.expect_tx is the one\narrival and adds 32,768 to tx; each TMA"
         "\nbox subtracts its bytes as they land. The\nphase completes when both counts are 0."),
        ("empty[s]: init count 8", "Each compute warp runs __syncwarp, then\nlane 0 arrives (release semantics). The "
         "8th\narrival completes the phase; the producer's\nwait (acquire) lets TMA overwrite stage s."),
        ("parity", "A completed phase flips the phase bit and\nre-arms the count; try_wait.parity(p) returns\nonce the "
         "phase of parity p is complete. A\nfresh barrier is in phase 0, so parity 1 (the\nphase before) counts as "
         "done: the first\nSTAGES waits of the producer pass at once."),
    )
    for i, (title, body) in enumerate(cards):
        x = 0.01 + i * 0.335
        notes.text(x, 1.0, title, transform=notes.transAxes, fontsize=8.5, fontweight="bold", va="top",
                   family="monospace")
        notes.text(x, 0.8, body, transform=notes.transAxes, fontsize=7.8, va="top", linespacing=1.3,
                   bbox={"facecolor": "#f6f6f6", "edgecolor": "#cccccc", "boxstyle": "round,pad=0.45"})
    return fig


# --------------------------------------------------------------------------- measured figures

def progression_figure(records: list[dict], run):
    keys = list(dict.fromkeys(short_label(r) for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, ax = new_figure(8.0, 4.2)
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = []
        for variant in variants:
            record = find_measurement(records, variant, key)
            values.append(record["useful_tflops"] if record else 0.0)
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(variants))]
        bars = ax.bar(xs, values, width * 0.95, label=key, color=[family_color(v) for v in variants],
                      alpha=1.0 - 0.3 * i, edgecolor="white")
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.0f}", ha="center", va="bottom",
                        fontsize=6.5, rotation=90,
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
    legend = ax.legend(handles=shades, title="workload (bar shade)", fontsize=7, title_fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.0, 1.0))
    ax.add_artist(legend)
    if seed_handles:
        ax.legend(handles=seed_handles, title="the seed's B300 k2/S2\n(reference, not run here)", fontsize=7,
                  title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.62))
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


# --------------------------------------------------------------------------- findings (generated prose)
#
# The sentences on the page that carry numbers are written here, from the results files, so a
# rerun rewrites them. Chapter 02's file supplies the ceilings measured in its run and k1's Nsight
# Compute counters; without it the ceilings fall back to SPEC section 2's H200 values, named so.

def _t(value: float) -> str:
    return f"{value:.1f}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _signed(fraction: float) -> str:
    return f"{100 * fraction:+.1f}%"


def _joined(values: Sequence[Any], spec: str = "") -> str:
    return " / ".join(format(v, spec) for v in values)


def _blocks(record: dict) -> int:
    """Blocks per SM of a record: as recorded, else the occupancy model's from its resources."""
    if "blocks_per_sm" in record:
        return record["blocks_per_sm"]
    return residency(record["registers"], record["warps_per_block"], record["smem_bytes"]).blocks


def _scheduled(record: dict) -> float:
    return record.get("scheduled_tflops", record["useful_tflops"] / record.get("eta", 1.0))


def _stage_of(variant: str) -> int:
    return int(variant.rsplit("s", 1)[1])


def _k2_names(records: list[dict]) -> list[str]:
    return sorted({r["variant"] for r in records if r["variant"].startswith("k2/")}, key=_stage_of)


def _k1_name(records: list[dict]) -> str | None:
    return next((r["variant"] for r in records if r["variant"].startswith("k1/")), None)


def _profile(data: dict | None, variant: str | None) -> dict | None:
    return next((p for p in (data or {}).get("profile") or [] if p["variant"] == variant), None)


def _fastest(records: list[dict], run, names: Sequence[str], key: str) -> dict:
    return max((find_measurement(records, name, key) for name in names), key=lambda r: r["useful_tflops"])


def ceilings(data: dict, ch02: dict | None) -> dict[str, tuple[float, str]]:
    """name -> (value, where it comes from): this run's, else chapter 02's run's, else SPEC's value."""
    from moe_gemm.ceilings import ceiling_value

    found: dict[str, tuple[float, str]] = {}
    for name in ("dense_bf16", "mma_sync", "copy"):
        for source, label in ((data, "measured in this run"), (ch02, "measured in chapter 02's run")):
            value = ceiling_value((source or {}).get("ceilings") or [], name)
            if value:
                found[name] = (value, label)
                break
    found.setdefault("dense_bf16", (H200_DENSE_BF16_TFLOPS, "SPEC section 2's H200 value"))
    found.setdefault("copy", (H200_COPY_TBPS, "SPEC section 2's H200 value"))
    return found


def headline_markdown(data: dict, ch02: dict | None, run) -> str:
    """Best k2 at 16k s=0 against the target, k1, the peer and the ceilings."""
    records = data["records"]
    names = _k2_names(records)
    best = _fastest(records, run, names, BALANCED)
    t = best["useful_tflops"]
    lines = [f"* **Target.** The fastest k2, `{best['variant']}`, runs the balanced 16,384-row workload at "
             f"**{_t(t)} TFLOP/s**: it {'meets' if t >= TARGET_K2 else 'misses'} the chapter's target of "
             f"≥ {TARGET_K2:.0f} ({_signed(t / TARGET_K2 - 1)})."]
    s2 = find_measurement(records, "k2/s2", BALANCED)
    if s2 is not None and s2 is not best:
        side = "above" if s2["useful_tflops"] >= TARGET_K2 else "short of"
        lines[-1] += (f" The target was written for S = 2; `k2/s2` reaches {_t(s2['useful_tflops'])}, "
                      f"{_pct(abs(s2['useful_tflops'] / TARGET_K2 - 1))} {side} it.")

    k1_name = _k1_name(records)
    k1 = find_measurement(records, k1_name, BALANCED) if k1_name else None
    if k1 is not None:
        k1_warps = _blocks(k1) * k1["warps_per_block"]
        k2_warps = _blocks(best) * (best["warps_per_block"] - 1)
        same = f"the same {k2_warps}" if k1_warps == k2_warps else f"{k2_warps} against k1's {k1_warps}"
        lines.append(
            f"* **Against k1.** `{k1_name}`, chapter 02's fastest, in the same run: {_t(k1['useful_tflops'])} "
            f"TFLOP/s, so `{best['variant']}` is **{t / k1['useful_tflops']:.2f}×** k1 on the same "
            f"{best['bm']} × {best['bn']} tile and the same `mma.sync.m16n8k16`, with {same} compute warps per SM "
            f"(k1: {_blocks(k1)} blocks × {k1['warps_per_block']} warps at {k1['registers']} registers; "
            f"k2: {_blocks(best)} blocks × ({best['warps_per_block'] - 1} + 1 producer) at "
            f"{best['registers']}).")
        p1, p2 = _profile(ch02, k1_name), _profile(data, best["variant"])
        if p1 and p2:
            fewer = p1["instructions"] / p2["instructions"]
            faster = (p2["instructions"] / p2["duration_ns"]) / (p1["instructions"] / p1["duration_ns"])
            lines.append(
                f"* **What changed, per Nsight Compute** (k1 from chapter 02's profile, k2 from this run's, both at "
                f"16,384 rows, s = 0): instructions issued {p1['instructions'] / 1e6:.1f} M → "
                f"{p2['instructions'] / 1e6:.1f} M ({_signed(p2['instructions'] / p1['instructions'] - 1)}); "
                f"barrier stall {p1['stall_barrier']:.2f} → {p2['stall_barrier']:.2f} and MIO-throttle stall "
                f"{p1['stall_mio_throttle']:.2f} → {p2['stall_mio_throttle']:.2f} cycles per issued instruction; "
                f"issue active {p1['issue_active']:.2f} → {p2['issue_active']:.2f} per scheduler; tensor pipe busy "
                f"{p1['tensor_pipe_pct']:.1f}% → {p2['tensor_pipe_pct']:.1f}%. k1 issues {fewer:.2f}× as many "
                f"instructions as k2, and k2 issues its own {faster:.2f}× as fast (instructions per ns of ncu's "
                f"duration): {fewer * faster:.2f}× in all.")

    peer = find_measurement(records, run.PEER, BALANCED)
    if peer is not None:
        lines.append(f"* **Against the peer.** `torch._grouped_mm` (CUTLASS, `wgmma`) in the same run: "
                     f"{_t(peer['useful_tflops'])} TFLOP/s; `{best['variant']}` reaches "
                     f"**{t / peer['useful_tflops']:.2f}** of it.")

    ceiling = ceilings(data, ch02)
    roof = roofline_tflops(best["experts"], best["tokens"], best["K"], best["N"])
    dense, dense_src = ceiling["dense_bf16"]
    text = (f"* **Against the ceilings.** {_pct(t / roof)} of the roofline ({roof:.0f} TFLOP/s at this shape, "
            f"compute-bound; SPEC section 7), {_pct(t / dense)} of the dense bf16 ceiling {dense_src} "
            f"({_t(dense)} TFLOP/s, cuBLAS 8192³)")
    if "mma_sync" in ceiling:
        mma, mma_src = ceiling["mma_sync"]
        text += f", {_pct(t / mma)} of the `mma.sync` ceiling {mma_src} ({_t(mma)} TFLOP/s), the instruction k2 issues"
    lines.append(text + ".")

    nbytes = compulsory_bytes(best["experts"], best["tokens"], best["K"], best["N"])
    copy, copy_src = ceiling["copy"]
    tbps = nbytes / (best["median_ms"] * 1e-3) / 1e12
    lines.append(f"* **Traffic.** The compulsory {nbytes / 1e6:.0f} MB (A, every expert's B, C) over the median "
                 f"{best['median_ms'] * 1e3:.1f} µs is {tbps:.2f} TB/s, {_pct(tbps / copy)} of the copy ceiling "
                 f"({copy:.2f} TB/s, {copy_src}). From L2 into the SMs a 128 × 128 tile moves one byte per 64 FLOP: "
                 f"{t / 64:.1f} TB/s at this rate (derived, not measured).")
    return "\n".join(lines) + "\n"


def stages_markdown(data: dict, run) -> str:
    """STAGES 2, 3, 4 against each other and against prediction 1, with ncu's counters."""
    records = data["records"]
    names = _k2_names(records)
    if not {"k2/s2", "k2/s3", "k2/s4"} <= set(names):
        return "*The run recorded fewer than three STAGES; no comparison.*\n"
    keys = [k for k in (BALANCED, SKEWED, SMALL) if all(find_measurement(records, n, k) for n in names)]
    orders = {k: sorted(names, key=lambda n: -find_measurement(records, n, k)["useful_tflops"]) for k in keys}
    values = "; ".join(f"{k}: {_joined([find_measurement(records, n, k)['useful_tflops'] for n in names], '.1f')}"
                       for k in keys)
    stages = _joined([_stage_of(n) for n in names])
    if len({tuple(o) for o in orders.values()}) == 1:
        head = f"the same at every workload, {' > '.join(f'`{n}`' for n in orders[keys[0]])}"
    else:
        head = "not the same at every workload: " + "; ".join(f"{k}: {' > '.join(o)}" for k, o in orders.items())
    lines = [f"* **Order.** Useful TFLOP/s for S = {stages}, {values}. The order is {head}."]

    s2, s3, s4 = (find_measurement(records, f"k2/s{s}", BALANCED) for s in (2, 3, 4))
    p2, p3, p4 = (_profile(data, f"k2/s{s}") for s in (2, 3, 4))
    text = (f"* **S = 3 against S = 2**: {_signed(s3['useful_tflops'] / s2['useful_tflops'] - 1)} at 16k s=0, with "
            f"{'the same' if s2['registers'] == s3['registers'] else 'different'} registers ({s2['registers']}, "
            f"{s3['registers']}) and blocks per SM ({_blocks(s2)}, {_blocks(s3)})")
    if p2 and p3:
        text += (f"; ncu: long-scoreboard stall {p2['stall_long_scoreboard']:.2f} → "
                 f"{p3['stall_long_scoreboard']:.2f} "
                 f"cycles per issued instruction, L {p2['cycles_per_issue']:.2f} → {p3['cycles_per_issue']:.2f}, "
                 f"tensor pipe {p2['tensor_pipe_pct']:.1f}% → {p3['tensor_pipe_pct']:.1f}%")
    lines.append(text + ".")
    fit = residency(s4["registers"], s4["warps_per_block"], s4["smem_bytes"])
    text = (f"* **S = 4**: {s4['registers']} registers and {s4['smem_bytes'] / 1024:.1f} KB give "
            f"{fit.blocks} block per SM (registers allow {fit.by_registers}, shared memory {fit.by_smem}); "
            f"{_signed(s4['useful_tflops'] / s3['useful_tflops'] - 1)} against S = 3 at 16k s=0")
    if p3 and p4:
        text += (f". W falls {p3['warps_per_scheduler']:.2f} → {p4['warps_per_scheduler']:.2f} "
                 f"({_signed(p4['warps_per_scheduler'] / p3['warps_per_scheduler'] - 1)}) while L falls "
                 f"{p3['cycles_per_issue']:.2f} → {p4['cycles_per_issue']:.2f} "
                 f"({_signed(p4['cycles_per_issue'] / p3['cycles_per_issue'] - 1)}), the short-scoreboard stall "
                 f"{p3['stall_short_scoreboard']:.2f} → {p4['stall_short_scoreboard']:.2f}: W/L "
                 f"{p3['issue_model']:.3f} → {p4['issue_model']:.3f}, tensor pipe {p4['tensor_pipe_pct']:.1f}%")
    lines.append(text + ".")
    return "\n".join(lines) + "\n"


def skew_markdown(data: dict, run) -> str:
    """s = 1.2 and 2,048 rows against the eta-only estimate, the roofline and the peer."""
    records = data["records"]
    rows = data.get("stages") or run.stages_rows(records)
    names = [r["variant"] for r in rows]
    stages = _joined([_stage_of(n) for n in names])
    lines = []
    if all("skewed_estimate" in r for r in rows):
        ratios = [r["skewed_tflops"] / r["skewed_estimate"] for r in rows]
        seed = SEED_B300_SKEWED[0] / SEED_B300_SKEWED[1]
        verdict = "all above 1" if min(ratios) > 1 else "not all above 1"
        lines.append(f"* **s = 1.2 against the eta-only estimate** (T(16k, s=0) × {rows[0]['skewed_eta']:.3f}): "
                     f"measured/estimate {_joined(ratios, '.3f')} for S = {stages}, {verdict}. The seed's B300 "
                     f"k2/S2: {SEED_B300_SKEWED[0]} measured against {SEED_B300_SKEWED[1]} estimated, {seed:.3f}.")
        best = _fastest(records, run, names, SKEWED)
        balanced = find_measurement(records, best["variant"], BALANCED)
        if "tiles" in best and "tiles" in balanced:
            lines.append(f"* **Scheduled rate.** At s = 1.2 `{best['variant']}` runs its scheduled work "
                         f"({best['tiles']:,} tiles, eta {best['eta']:.3f}) at {_t(_scheduled(best))} TFLOP/s, "
                         f"against {_t(_scheduled(balanced))} on the balanced {balanced['tiles']:,} tiles "
                         f"({_signed(_scheduled(best) / _scheduled(balanced) - 1)}).")
            slots = data["provenance"].get("sm_count", 132) * _blocks(best)
            waves = [r["tiles"] / slots for r in (balanced, best)]
            fill = [w / math.ceil(w) for w in waves]
            lines.append(f"* **Waves.** {balanced['tiles']:,} and {best['tiles']:,} tiles over {slots} resident "
                         f"blocks ({slots // _blocks(best)} SMs × {_blocks(best)}) are {waves[0]:.2f} and "
                         f"{waves[1]:.2f} waves; waves / ⌈waves⌉ is {fill[0]:.3f} and {fill[1]:.3f}, "
                         f"{_pct(abs(fill[1] / fill[0] - 1))} apart.")
        peer = find_measurement(records, run.PEER, SKEWED)
        if peer is not None:
            lines.append(f"* **s = 1.2 against the peer**: `{best['variant']}` reaches "
                         f"{best['useful_tflops'] / peer['useful_tflops']:.2f} of `torch._grouped_mm` "
                         f"({_t(peer['useful_tflops'])} TFLOP/s), against "
                         f"{balanced['useful_tflops'] / find_measurement(records, run.PEER, BALANCED)['useful_tflops']:.2f} "
                         f"at s = 0.")
    if all("small_estimate" in r for r in rows):
        small = _fastest(records, run, names, SMALL)
        balanced = find_measurement(records, small["variant"], BALANCED)
        roof = roofline_tflops(small["experts"], small["tokens"], small["K"], small["N"])
        nbytes = compulsory_bytes(small["experts"], small["tokens"], small["K"], small["N"])
        floor_us = nbytes / (H200_COPY_TBPS * 1e12) * 1e6
        scheduled_gflop = small["useful_tflops"] / small["eta"] * small["median_ms"] * 1e-3 * 1e3
        at_balanced_us = scheduled_gflop * 1e9 / (balanced["useful_tflops"] * 1e12) * 1e6
        ratios = [r["small_tflops"] / r["small_estimate"] for r in rows]
        lines.append(f"* **2,048 rows.** `{small['variant']}` at {_t(small['useful_tflops'])} TFLOP/s is "
                     f"{_pct(small['useful_tflops'] / roof)} of the {roof:.0f}-TFLOP/s roofline, memory-bound at this "
                     f"size ({nbytes / 1e6:.1f} MB at {H200_COPY_TBPS} TB/s take {floor_us:.1f} µs). With eta = "
                     f"{small['eta']:.2f} at BM = {small.get('bm', 128)} the eta-only estimates give measured/estimate "
                     f"{_joined(ratios, '.3f')} for S = {stages}. The kernel's median is "
                     f"{small['median_ms'] * 1e3:.1f} µs; its {scheduled_gflop:.1f} scheduled GFLOP at its own "
                     f"balanced 16k rate would take {at_balanced_us:.1f} µs.")
        peer = find_measurement(records, run.PEER, SMALL)
        if peer is not None:
            seed = run.SEED_B300["k2/S2"].get(SMALL)
            text = (f"* **2,048 rows against the peer**: {small['useful_tflops'] / peer['useful_tflops']:.2f}× "
                    f"`torch._grouped_mm` ({_t(peer['useful_tflops'])} TFLOP/s in the same run)")
            if seed:
                text += f"; the seed's B300 k2/S2 reached {seed} here"
            lines.append(text + f", and the project's target for this workload is ≥ {TARGET_SMALL:.0f} "
                         "(SPEC section 7).")
    return "\n".join(lines) + "\n" if lines else "*No s = 1.2 or 2,048-row measurements recorded.*\n"


def residency_arithmetic_markdown(data: dict, run) -> str:
    """The occupancy model's arithmetic on the registers and shared memory each k2 was built with."""
    records = data["records"]
    body, warps = [], set()
    for name in _k2_names(records):
        r = find_measurement(records, name, BALANCED)
        per_warp = registers_per_warp(r["registers"])
        per_block = per_warp * r["warps_per_block"]
        fit = residency(r["registers"], r["warps_per_block"], r["smem_bytes"])
        warps.add(r["warps_per_block"])
        body.append((f"`{name}`", r["registers"], f"{per_warp:,}", f"{per_block:,}", fit.by_registers,
                     f"{r['smem_bytes'] / 1024:.1f} + 1", fit.by_smem, fit.blocks,
                     f"{fit.blocks * (r['warps_per_block'] - 1)} + {fit.blocks}"))
    headers = ("variant", "R (ptxas)", "per warp ⌈32R/256⌉·256", f"per block (× {_joined(sorted(warps))} warps)",
               "blocks by registers ⌊65,536 / block⌋", "smem KB (+ 1 reserved)",
               "blocks by smem ⌊228 / (smem + 1)⌋",
               "blocks/SM", "compute + producer warps/SM")
    return markdown_table(headers, body)


def residency_markdown(data: dict, run) -> str:
    """ncu's occupancy limits and resident warps against the model."""
    records = data["records"]
    names = [n for n in _k2_names(records) if _profile(data, n)]
    if not names:
        return "*No Nsight Compute counters recorded: run `python chapters/03/run.py --profile`.*\n"
    stages = _joined([_stage_of(n) for n in names])
    model = {n: residency(r["registers"], r["warps_per_block"], r["smem_bytes"])
             for n in names for r in [find_measurement(records, n, BALANCED)]}
    warps = {n: find_measurement(records, n, BALANCED)["warps_per_block"] for n in names}
    p = {n: _profile(data, n) for n in names}
    regs_ok = all(p[n]["occupancy_limit_registers"] == model[n].by_registers for n in names)
    smem_ok = all(p[n]["occupancy_limit_shared_mem"] == model[n].by_smem for n in names)
    verdict = ("equal to the model's blocks by registers and by shared memory for every STAGES"
               if regs_ok and smem_ok else "not what the model computes (registers: "
               f"{_joined([model[n].by_registers for n in names])}, shared memory: "
               f"{_joined([model[n].by_smem for n in names])})")
    lines = [f"* **Limits.** For S = {stages}, ncu's `launch__occupancy_limit_registers` is "
             f"{_joined([p[n]['occupancy_limit_registers'] for n in names], '.0f')} and "
             "`launch__occupancy_limit_shared_mem` "
             f"{_joined([p[n]['occupancy_limit_shared_mem'] for n in names], '.0f')}"
             f": {verdict}. ncu reads {_joined([p[n]['registers_per_thread'] for n in names], '.0f')} registers per "
             "thread, the compiler's count."]
    resident = [model[n].blocks * warps[n] for n in names]
    achieved = [p[n]["achieved_warps_per_sm"] for n in names]
    lines.append(f"* **Resident warps.** Achieved {_joined(achieved, '.2f')} warps per SM against the model's "
                 f"{_joined(resident)}: {_joined([f'{100 * a / m:.1f}%' for a, m in zip(achieved, resident)])}. Per "
                 f"scheduler W = {_joined([p[n]['warps_per_scheduler'] for n in names], '.2f')} against "
                 f"{_joined([m / HOPPER.schedulers for m in resident], '.2f')}.")
    lines.append(f"* **Issue model.** W/L = {_joined([p[n]['issue_model'] for n in names], '.3f')} against the "
                 f"measured issue active {_joined([p[n]['issue_active'] for n in names], '.3f')}: within "
                 f"{max(abs(p[n]['issue_model'] - p[n]['issue_active']) for n in names):.3f}.")
    return "\n".join(lines) + "\n"


STALL_LABELS = {"short_scoreboard": "short scoreboard (`ldmatrix` data)", "wait": "wait (fixed-latency dependencies)",
                "long_scoreboard": "long scoreboard", "math_pipe_throttle": "math-pipe throttle",
                "selected": "selected (the issue itself)", "not_selected": "not selected"}


SMEM_BYTES_PER_FLOP = 0.0625  # prediction 2: 3,072 B of ldmatrix per 65,536 FLOP + 32 KB of TMA per 2.1 MFLOP
SMEM_BYTES_PER_CLOCK = 128    # shared-memory bandwidth per SM per clock


def _sm_clock_mhz(provenance: dict) -> float | None:
    """The SM clock the run's provenance recorded ('1980 MHz'), if any."""
    text = (provenance.get("clocks") or {}).get("clocks.sm", "")
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def limit_markdown(data: dict, run) -> str:
    """Where the best k2's cycles go: tensor pipe, issue rate, instruction mix, stall reasons."""
    records = data["records"]
    names = [n for n in _k2_names(records) if _profile(data, n)]
    if not names:
        return "*No Nsight Compute counters recorded: run `python chapters/03/run.py --profile`.*\n"
    best = _fastest(records, run, names, BALANCED)
    p = _profile(data, best["variant"])
    stages = _joined([_stage_of(n) for n in names])
    lines = [f"* **Tensor pipe** busy {_joined([_profile(data, n)['tensor_pipe_pct'] for n in names], '.1f')}% of the "
             f"active cycles for S = {stages} (16k s=0); issue active "
             f"{_joined([_profile(data, n)['issue_active'] for n in names], '.2f')} per scheduler."]
    scheduled = _scheduled(best) * 1e12 * best["median_ms"] * 1e-3
    hmma = scheduled / FLOP_PER_MMA
    report = {r["variant"]: r for r in data.get("compile_report") or []}
    sass = report.get(best["variant"], {}).get("sass", {})
    text = (f"* **Instruction mix** (`{best['variant']}`): {hmma / 1e6:.1f} M `HMMA` (scheduled FLOP / "
            f"{FLOP_PER_MMA:,}) of {p['instructions'] / 1e6:.1f} M warp instructions issued, "
            f"{_pct(hmma / p['instructions'])}")
    if sass.get("HMMA.16816.F32.BF16") and sass.get("LDSM"):
        text += (f"; per stage each compute warp issues {sass['HMMA.16816.F32.BF16']} `HMMA` and {sass['LDSM']} "
                 "`LDSM` (static SASS count)")
    lines.append(text + ".")
    clock_mhz = _sm_clock_mhz(data["provenance"])
    if clock_mhz:
        per_clock = SMEM_BYTES_PER_FLOP * _scheduled(best) * 1e12 / (
            data["provenance"].get("sm_count", 132) * clock_mhz * 1e6)
        lines.append(f"* **Shared memory** (prediction 2's {SMEM_BYTES_PER_FLOP} bytes per FLOP: `ldmatrix` reads plus "
                     f"TMA writes): at {_t(_scheduled(best))} TFLOP/s that is {per_clock:.0f} bytes per clock "
                     f"per SM at the {clock_mhz:.0f} MHz SM clock the provenance records, "
                     f"{_pct(per_clock / SMEM_BYTES_PER_CLOCK)} of {SMEM_BYTES_PER_CLOCK} (derived, not measured; a "
                     "lower clock under load would raise it); ncu's MIO-throttle stall is "
                     f"{p['stall_mio_throttle']:.2f} cycles per issued instruction.")
    stalls = sorted(((k.removeprefix("stall_"), v) for k, v in p.items() if k.startswith("stall_")),
                    key=lambda kv: -kv[1])[:5]
    shown = ", ".join(f"{STALL_LABELS.get(k, k.replace('_', ' '))} {v:.2f}" for k, v in stalls)
    lines.append(f"* **Where L goes** (`{best['variant']}`: W = {p['warps_per_scheduler']:.2f}, "
                 f"L = {p['cycles_per_issue']:.2f} cycles per issued instruction): {shown}; these five make "
                 f"{sum(v for _, v in stalls):.2f} of the {p['cycles_per_issue']:.2f}.")
    return "\n".join(lines) + "\n"


def findings_outputs(data: dict, ch02: dict | None, run) -> dict[str, str]:
    """Every generated findings snippet, by file name. A results file that lacks what one snippet
    needs (an older schema, a run without --profile) gets a line saying so, not a failed build."""
    makers = {"findings_headline.md": lambda: headline_markdown(data, ch02, run),
              "findings_stages.md": lambda: stages_markdown(data, run),
              "findings_skew.md": lambda: skew_markdown(data, run),
              "residency_arithmetic.md": lambda: residency_arithmetic_markdown(data, run),
              "findings_residency.md": lambda: residency_markdown(data, run),
              "findings_limit.md": lambda: limit_markdown(data, run)}
    outputs = {}
    for name, make in makers.items():
        try:
            outputs[name] = make()
        except (KeyError, TypeError, ValueError, AttributeError) as missing:
            outputs[name] = (f"*Incomplete results: `{results_path(CHAPTER, GPU_SLUG).name}` lacks what this "
                             f"finding needs ({type(missing).__name__}: {missing}).*\n")
    return outputs


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
                     "provenance.md", *FINDINGS):
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

    for name, text in findings_outputs(data, load_chapter02(), run).items():
        write(name, text)
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
