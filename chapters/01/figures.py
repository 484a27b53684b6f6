"""Chapter 01's figures and generated docs tables, from chapters/01/results/h200.json only.

    python chapters/01/figures.py          # writes site_docs/figures/01/*.png and *.md

Every number drawn or tabulated here comes from the recorded results file, except the seed's
B300 k0 numbers and the page's own prediction (shown for reference, labelled as such, never as a
measurement of ours) and a few constants named below with their source. When the results file is
absent nothing is drawn: the generated markdown says so, and the docs page that includes it still
builds.

findings.md holds the measured half of the page's interpretation, in named snippet sections
(``--8<-- "site_docs/figures/01/findings.md:skew"``): every number the page's reading of the
results quotes is formatted here from the results file, so a rerun cannot leave stale prose numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm.cli import chapter_parser, run_main
from moe_gemm.notebook import PEER, Workload, find_measurement
from moe_gemm.report import markdown_table
from moe_gemm.results import load_results, results_path
from moe_gemm.style import COLORS, FIGURE_ROOT, new_figure, save_figure

CHAPTER = "01"
GPU = "h200"
LOOP = "peer/torch_loop"
WORKLOADS = (Workload(16384, 0.0), Workload(16384, 1.2), Workload(2048, 0.0), Workload(16384, 0.0, K=8192))
SHORT_LABELS = ("16,384 rows\ns = 0", "16,384 rows\ns = 1.2", "2,048 rows\ns = 0", "16,384 rows\ns = 0, K = 8192")
FP32_DATASHEET_TFLOPS = 67.0  # H200: 132 SMs x 128 FP32 lanes x 2 FLOP x 1.98 GHz
FP32_FFMA_SPEC_TFLOPS = 55.6  # SPEC section 2, used only when the results file has no measured FFMA ceiling

# The seed's B300 numbers for its CUDA C++ k0 (useful TFLOP/s; the 2,048-row figure is the worklog's
# "about 9"). Reference only: measured on a different GPU, by a different kernel, never by us.
SEED_B300_K0 = {
    "label": "the seed's B300 numbers (its CUDA C++ k0; not measured here)",
    "tflops": {(16384, 0.0, 1024): 21.4, (16384, 1.2, 1024): 20.1, (2048, 0.0, 1024): 9.0,
               (16384, 0.0, 8192): 21.0},
}

# The page's prediction (site_docs/01-fp32-baseline.md, "Prediction, before measuring"), written before
# the H200 run; printed beside the measurement, never as one. tests/test_chapter01.py checks that these
# are the numbers the page states.
PREDICTION = {
    "tflops": {(16384, 0.0, 1024): 24.0, (16384, 1.2, 1024): 21.5, (2048, 0.0, 1024): 10.0,
               (16384, 0.0, 8192): 24.0},
    "registers": 56, "blocks_per_sm": 4, "limiter": "registers",
    "issue_fraction": 0.6,  # the guessed share of cycles on which a scheduler issues anything
    "ffma_share": 0.71,  # 256 FFMA of about 360 instructions per K slice (the page's SASS count)
    "ceiling": FP32_FFMA_SPEC_TFLOPS,  # the FFMA ceiling the prediction scaled from
    "peer_ratio": 0.05,  # k0 / torch._grouped_mm at 16,384 rows, s=0, from SPEC's anchor below
}
SPEC_PEER_ANCHOR_TFLOPS = 453.0  # SPEC section 7: torch._grouped_mm at 16,384 rows, s=0 (not this run)
TARGET_TFLOPS = 20.0  # SPEC section 7: k0 at 16,384 rows, s=0, useful TFLOP/s
SEED_B300_SMS, SEED_B300_CLOCK_GHZ = 160, 1.94  # the seed's worklog: its FP32 peak of 79.5 TFLOP/s
FLOP_PER_SM_CYCLE = 4 * 32 * 2  # four schedulers x 32 FP32 lanes x 2 FLOP per FFMA
K0_INSTRUCTIONS_PER_SLICE = 360  # about 360 instructions per K slice in k0's sm_90 SASS, 256 of them FFMA
# kernels/ceiling_ffma.cu as NVRTC 13.0 builds it for sm_90a: one trip of its loop (unrolled 4 times,
# 8 chains) is 32 FFMA plus IADD3, ISETP and BRA, every FFMA with a stall count of 1.
CEILING_LOOP_FFMA, CEILING_LOOP_INSTRUCTIONS = 32, 35
SHARED_WAVEFRONTS_PER_LDS128 = 1  # k0's warp layout: 4 distinct A or 8 distinct B fragments, <= 128 bytes
FLOP_PER_WARP_FFMA = 32 * 2

NOT_MEASURED = ("*No H200 measurement is recorded yet: this {what} is generated from "
                "`chapters/01/results/h200.json`, which `python chapters/01/run.py` writes on a GPU.*\n")


def _tflops(records: Sequence[dict[str, Any]], variant: str, workload: Workload) -> float:
    record = find_measurement(records, variant, workload)
    return record["useful_tflops"] if record else float("nan")


def _seed(workload: Workload) -> float:
    return SEED_B300_K0["tflops"].get((workload.tokens, workload.skew, workload.K), float("nan"))


def ffma_ceiling(data: dict[str, Any]) -> tuple[float, str]:
    """The FFMA ceiling measured in the recorded run, else SPEC section 2's figure."""
    for record in data.get("ceilings", []):
        if record.get("variant") == "ceiling/ffma" and record.get("tflops"):
            return float(record["tflops"]), "measured in this run"
    return FP32_FFMA_SPEC_TFLOPS, "SPEC section 2"


# --------------------------------------------------------------------------- figures

def throughput_figure(data: dict[str, Any]):
    """Left: k0 against the FP32 ceilings and the seed's B300 k0. Right: k0 beside the peers (log)."""
    records = data["records"]
    gpu = data["provenance"]["gpu"]
    ffma, ffma_source = ffma_ceiling(data)
    fig, (left, right) = new_figure(11.0, 4.4, ncols=2, gridspec_kw={"width_ratios": [1.0, 1.15]})
    x = np.arange(len(WORKLOADS))

    k0 = [_tflops(records, "k0", w) for w in WORKLOADS]
    seed = [_seed(w) for w in WORKLOADS]
    width = 0.38
    bars = left.bar(x - width / 2, k0, width, color=COLORS["k0"], label=f"k0, measured on {gpu}")
    left.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    bars = left.bar(x + width / 2, seed, width, color="white", edgecolor=COLORS["seed"], hatch="///",
                    label=SEED_B300_K0["label"])
    left.bar_label(bars, fmt="%.1f", fontsize=8, padding=2, color=COLORS["seed"])
    predicted = [PREDICTION["tflops"].get((w.tokens, w.skew, w.K), np.nan) for w in WORKLOADS]
    left.hlines(predicted, x - width, x, colors="black", linewidth=2,
                label="the page's prediction for k0 (written before the run)")
    left.axhline(FP32_DATASHEET_TFLOPS, color=COLORS["ceiling"], linestyle="--", linewidth=1)
    left.text(len(WORKLOADS) - 0.5, FP32_DATASHEET_TFLOPS, f"H200 FP32, datasheet: {FP32_DATASHEET_TFLOPS:g}",
              ha="right", va="bottom", fontsize=8)
    left.axhline(ffma, color=COLORS["ceiling"], linestyle=":", linewidth=1)
    left.text(len(WORKLOADS) - 0.5, ffma, f"FFMA ceiling ({ffma_source}): {ffma:.1f}", ha="right", va="bottom",
              fontsize=8)
    left.set_ylim(0, FP32_DATASHEET_TFLOPS * 1.45)  # room for the legend above the datasheet line
    left.set_xticks(x, SHORT_LABELS, fontsize=8)
    left.set_ylabel("useful TFLOP/s")
    left.set_title("k0 against the FP32 ceiling")
    handles, labels = left.get_legend_handles_labels()
    order = [labels.index(label) for label in sorted(labels, key=lambda t: ("prediction" in t, "seed" in t))]
    left.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="upper left")

    variants = [v for v in ("k0", PEER, LOOP) if any(r["variant"] == v for r in records)]
    colors = {"k0": COLORS["k0"], PEER: COLORS["peer"], LOOP: "#f4a582"}
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        values = [_tflops(records, variant, w) for w in WORKLOADS]
        bars = right.bar(x + (i - (len(variants) - 1) / 2) * width, values, width, color=colors[variant],
                         label=variant)
        right.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    if PEER in variants:
        for xi, w in zip(x, WORKLOADS):
            peer = _tflops(records, PEER, w)
            ratio = _tflops(records, "k0", w) / peer if peer else float("nan")
            if np.isfinite(ratio):
                right.text(xi, 0.84, f"k0 / peer\n{ratio:.3f}", ha="center", va="center", fontsize=7,
                           transform=right.get_xaxis_transform())
    right.set_yscale("log")
    shown = [r["useful_tflops"] for r in records if r["variant"] in variants and r["useful_tflops"] > 0]
    if shown:  # room below the slowest bar, and above the fastest for the legend and the ratios
        right.set_ylim(min(shown) / 2, max(shown) * 12)
    right.set_xticks(x, SHORT_LABELS, fontsize=8)
    right.set_ylabel("useful TFLOP/s (log scale)")
    right.set_title("k0 beside torch._grouped_mm and a per-expert torch loop")
    right.legend(fontsize=8, loc="upper left", ncol=len(variants))
    fig.suptitle(f"Chapter 01 on {gpu}: E = 64, N = 2688 (K = 1024 unless shown)", fontsize=10)
    return fig


def layout_figure():
    """The block's 64 x 64 tile: which warp owns which 16 x 32 patch, which lane which 4 x 4 micro-tile.

    Drawn from moe_gemm.variants.k0.micro_tile_origin, the kernel's thread map (no results needed).
    """
    from matplotlib.patches import Rectangle

    from moe_gemm.variants.k0 import BM, BN, THREADS, micro_tile_origin

    warp_colors = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5"]
    fig, ax = new_figure(6.4, 6.0)
    for t in range(THREADS):
        row, col = micro_tile_origin(t)
        warp, lane = divmod(t, 32)
        ax.add_patch(Rectangle((col, row), 4, 4, facecolor=warp_colors[warp], edgecolor="white", linewidth=0.6))
        if warp in (0, 1):
            ax.text(col + 2, row + 2, str(lane), ha="center", va="center", fontsize=5.5)
    for warp in range(THREADS // 32):
        row, col = micro_tile_origin(32 * warp)
        ax.add_patch(Rectangle((col, row), 32, 16, fill=False, edgecolor="black", linewidth=1.2))
        if warp < 2:  # its lanes are numbered: name it above the tile
            ax.text(col + 16, -1, f"warp {warp}: a 16 x 32 patch, lanes 4 x 8", ha="center", va="bottom",
                    fontsize=8, fontweight="bold")
        else:
            ax.text(col + 16, row + 12, f"warp {warp}", ha="center", va="center", fontsize=9, fontweight="bold")
    ax.add_patch(Rectangle((0, 0), 4, 4, fill=False, edgecolor="#d62728", linewidth=2))
    ax.annotate("thread 0 (warp 0, lane 0): rows 0-3, columns 0-3,\n16 fp32 accumulators",
                xy=(2, 4), xytext=(2, 20), fontsize=8, color="#d62728",
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#d62728"},
                arrowprops={"arrowstyle": "->", "color": "#d62728"})
    ax.set_xlim(0, BN)
    ax.set_ylim(BM, 0)
    ax.set_aspect("equal")
    ax.set_xticks(range(0, BN + 1, 16))
    ax.set_yticks(range(0, BM + 1, 16))
    ax.grid(False)
    ax.set_xlabel("column in the tile (N)")
    ax.set_ylabel("row in the tile (M)")
    ax.set_title("k0: the 256 threads of one block over its 64 x 64 tile of C", pad=20)
    return fig


# --------------------------------------------------------------------------- markdown

def _provenance_line(data: dict[str, Any]) -> str:
    p = data["provenance"]
    packages = p.get("packages", {})
    versions = ", ".join(f"{name} {packages[name]}" for name in ("numba-cuda", "numba", "torch", "numpy")
                         if name in packages)
    clocks = p.get("clocks") or {}
    clock = f", SM clock {clocks['clocks.sm']} (max {clocks.get('clocks.max.sm', '?')})" if "clocks.sm" in clocks else ""
    return (f"*Measured on {p['gpu']} (compute capability {p['compute_capability']}, driver CUDA {p['driver']}"
            f"{clock}); {versions}; commit `{p['git_commit'][:12]}`, {p['date']}.*\n")


def results_markdown(data: dict[str, Any]) -> str:
    records = data["records"]
    ffma, _ = ffma_ceiling(data)
    headers = ["workload", "k0 TFLOP/s", "scheduled TFLOP/s", "eta", "% of FFMA ceiling", "torch._grouped_mm",
               "k0 / peer", "torch loop", "seed's B300 k0", "median ms (min-max)"]
    body = []
    for w in WORKLOADS:
        r = find_measurement(records, "k0", w)
        if r is None:
            continue
        peer, loop = find_measurement(records, PEER, w), find_measurement(records, LOOP, w)
        seed = _seed(w)
        body.append([
            w.label, f"{r['useful_tflops']:.1f}", f"{r['scheduled_tflops']:.1f}", f"{r['eta']:.3f}",
            f"{100 * r['useful_tflops'] / ffma:.1f}%",
            f"{peer['useful_tflops']:.1f}" if peer else "-",
            f"{r['useful_tflops'] / peer['useful_tflops']:.3f}" if peer else "-",
            f"{loop['useful_tflops']:.1f}" if loop else "-",
            f"{seed:.1f}" if np.isfinite(seed) else "-",
            f"{r['median_ms']:.3f} ({r['min_ms']:.3f}-{r['max_ms']:.3f})",
        ])
    return markdown_table(headers, body) + "\n" + _provenance_line(data)


def resources_markdown(data: dict[str, Any]) -> str:
    """k0's registers and shared memory (numba's report) and the blocks per SM they allow."""
    occ = data.get("k0_occupancy")
    if not occ:
        return NOT_MEASURED.format(what="table")
    headers = ["registers/thread", "shared memory/block", "local memory/thread", "warps/block",
               "blocks by registers", "by shared memory", "by warps", "blocks/SM", "limited by"]
    row = [occ["registers"], f"{occ['smem_bytes']:,} B", f"{occ['local_bytes']} B", occ["warps_per_block"],
           occ["blocks_by_registers"], occ["blocks_by_smem"], occ["blocks_by_warps"], occ["blocks_per_sm"],
           occ["limiter"]]
    text = markdown_table(headers, [row])
    sass = data.get("k0_sass")
    if sass:
        # Counts are by mnemonic prefix (moe_gemm.build.opcode_counts): "LDS" includes every LDS.128.
        headers = ["LDS (any width)" if op == "LDS" and "LDS.128" in sass else op for op in sass]
        text += ("\nStatic SASS instruction counts of the same build (whole kernel; the main loop is "
                 "unrolled over one K slice):\n\n" + markdown_table(headers, [list(sass.values())]))
    return text


# --------------------------------------------------------------------------- findings

FINDING_WORKLOADS = dict(zip(("balanced", "skewed", "small", "long_k"), WORKLOADS))
FINDING_SECTIONS = ("checks", "headline", "prediction", "skew", "small", "long_k", "peer", "ceiling")
NAN = float("nan")


def _mhz(provenance: dict[str, Any], key: str) -> float:
    """'1980 MHz' from nvidia-smi's clocks, in GHz; nan if not recorded."""
    try:
        return float(str((provenance.get("clocks") or {})[key]).split()[0]) / 1e3
    except (KeyError, ValueError, IndexError):
        return NAN


def _ceiling(data: dict[str, Any], name: str) -> float:
    for record in data.get("ceilings", []):
        if record.get("variant") == f"ceiling/{name}":
            return float(record.get("tflops", record.get("tbps", NAN)))
    return NAN


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b and np.isfinite(b) else NAN


def findings(data: dict[str, Any]) -> dict[str, Any]:
    """Every derived quantity the page's interpretation quotes, computed from one results file.

    Missing pieces (no peer, no ceiling, no clock) come out as nan and their sentences as '-'.
    """
    records, prov = data["records"], data["provenance"]
    ffma, ffma_source = ffma_ceiling(data)
    sms = float(prov.get("sm_count") or NAN)
    clock = _mhz(prov, "clocks.max.sm")
    peak = sms * FLOP_PER_SM_CYCLE * clock / 1e3  # TFLOP/s at the maximum SM clock
    copy_tbps = _ceiling(data, "copy")
    work: dict[str, dict[str, Any]] = {}
    for name, w in FINDING_WORKLOADS.items():
        r = find_measurement(records, "k0", w) or {}
        peer, loop = find_measurement(records, PEER, w), find_measurement(records, LOOP, w)
        useful, scheduled = r.get("useful_tflops", NAN), r.get("scheduled_tflops", NAN)
        predicted = PREDICTION["tflops"].get((w.tokens, w.skew, w.K), NAN)
        compulsory = 2 * (w.tokens * w.K + w.experts * w.K * w.N + w.tokens * w.N)  # bf16 A, B, C once
        compulsory_ms = compulsory / (copy_tbps * 1e12) * 1e3
        flop = 2 * w.tokens * w.K * w.N
        roofline_ms = max(flop / (_ceiling(data, "dense_bf16") * 1e12) * 1e3, compulsory_ms)
        work[name] = {
            "label": w.label, "useful": useful, "scheduled": scheduled, "eta": r.get("eta", NAN),
            "tiles": r.get("tiles", 0), "median_ms": r.get("median_ms", NAN),
            "spread": _ratio(r.get("max_ms"), r.get("min_ms")) - 1, "rel_error": r.get("rel_error", NAN),
            "of_ffma": useful / ffma, "of_datasheet": useful / FP32_DATASHEET_TFLOPS,
            "peer": peer["useful_tflops"] if peer else NAN, "loop": loop["useful_tflops"] if loop else NAN,
            "loop_ms": loop["median_ms"] if loop else NAN,
            "vs_peer": _ratio(useful, peer["useful_tflops"] if peer else None),
            "predicted": predicted, "vs_predicted": useful / predicted,
            "b_bytes": 2 * w.experts * w.K * w.N, "b_ms": 2 * w.experts * w.K * w.N / (copy_tbps * 1e12) * 1e3,
            "compulsory_ms": compulsory_ms, "roofline_tflops": flop / (roofline_ms * 1e-3) / 1e12,
            "memory_bound": compulsory_ms > roofline_ms * 0.999,
            "peer_of_roofline": _ratio(peer["useful_tflops"] if peer else None, flop / (roofline_ms * 1e-3) / 1e12),
        }
    bal, skw, small, longk = (work[n] for n in ("balanced", "skewed", "small", "long_k"))

    # Per clock: FLOP per SM per cycle at the maximum clock, and the issue rates that implies.
    flop_per_sm_cycle = bal["scheduled"] * 1e12 / (sms * clock * 1e9)
    ffma_issue = flop_per_sm_cycle / FLOP_PER_SM_CYCLE  # share of scheduler cycles that issue an FFMA
    ffma_share = PREDICTION["ffma_share"]
    seed_flop_per_sm_cycle = SEED_B300_K0["tflops"][(16384, 0.0, 1024)] * 1e12 / (
        SEED_B300_SMS * SEED_B300_CLOCK_GHZ * 1e9)
    sass = data.get("k0_sass") or {}
    lds_per_ffma = _ratio(sass.get("LDS.128"), sass.get("FFMA"))
    wavefronts_per_cycle = (flop_per_sm_cycle / FLOP_PER_WARP_FFMA) * lds_per_ffma * SHARED_WAVEFRONTS_PER_LDS128

    # Waves: blocks resident at once, and what a lock-step wave model charges for the last one.
    occupancy = data.get("k0_occupancy") or {}
    slots = sms * occupancy.get("blocks_per_sm", NAN)

    def lockstep(tiles: float) -> tuple[float, float]:
        waves = tiles / slots
        return waves, waves / np.ceil(waves) if np.isfinite(waves) and waves > 0 else NAN

    bal_waves, bal_fill = lockstep(bal["tiles"])
    small_waves, small_fill = lockstep(small["tiles"])
    small_rate = small["scheduled"] / bal["scheduled"]

    checks = data.get("k0_checks") or []
    passed = [c for c in checks if str(c.get("result", "")).startswith("ok")]
    estimate = bal["useful"] * skw["eta"]
    return {
        "gpu": prov.get("gpu", "?"), "sms": sms, "clock_ghz": clock, "sampled_clock_ghz": _mhz(prov, "clocks.sm"),
        "peak_tflops": peak, "ffma": ffma, "ffma_source": ffma_source, "datasheet": FP32_DATASHEET_TFLOPS,
        "spec_ffma": FP32_FFMA_SPEC_TFLOPS, "target": TARGET_TFLOPS, "target_met": bal["useful"] >= TARGET_TFLOPS,
        "work": work,
        "checks": len(checks), "checks_passed": len(passed),
        "exact_checks": sum(1 for c in passed if c.get("check") == "exact"),
        "max_check_error": max((r.get("rel_error", 0.0) for r in records if r["variant"] == "k0"), default=NAN),
        "occupancy": occupancy, "sass": sass,
        "flop_per_sm_cycle": flop_per_sm_cycle, "ffma_issue": ffma_issue, "ffma_share": ffma_share,
        "issue": ffma_issue / ffma_share,
        "seed_flop_per_sm_cycle": seed_flop_per_sm_cycle,
        "vs_seed_per_clock": flop_per_sm_cycle / seed_flop_per_sm_cycle,
        "lds_per_ffma": lds_per_ffma, "wavefronts_per_cycle": wavefronts_per_cycle,
        "predicted_tflops": PREDICTION["issue_fraction"] * ffma_share * PREDICTION["ceiling"],
        "ceiling_factor": peak / PREDICTION["ceiling"],
        "issue_factor": ffma_issue / ffma_share / PREDICTION["issue_fraction"],
        "skew_ratio": skw["useful"] / bal["useful"], "skew_estimate": estimate,
        "skew_vs_estimate": skw["useful"] / estimate,
        "skew_scheduled_ratio": skw["scheduled"] / bal["scheduled"],
        "seed_skew_ratio": SEED_B300_K0["tflops"][(16384, 1.2, 1024)] / SEED_B300_K0["tflops"][(16384, 0.0, 1024)],
        "slots": slots, "balanced_waves": bal_waves, "balanced_fill": bal_fill,
        "small_waves": small_waves, "small_fill": small_fill, "small_rate": small_rate,
        "small_model_rate": small_fill / bal_fill, "small_ratio": small["useful"] / bal["useful"],
        "small_tail_blocks": small["tiles"] - slots * np.floor(small_waves) if np.isfinite(small_waves) else NAN,
        # If the whole shortfall of the scheduled rate is the tail: what the last partial wave cost,
        # in block times at full residency (the lock-step model charges one whole block time).
        "small_tail_cost": small_waves / small_rate - small_waves,
        "long_k_ratio": longk["useful"] / bal["useful"], "long_k_time_ratio": longk["median_ms"] / bal["median_ms"],
        "peer_ratios": {n: w["vs_peer"] for n, w in work.items()},
        "dense_bf16": _ceiling(data, "dense_bf16"), "mma_sync": _ceiling(data, "mma_sync"), "copy_tbps": copy_tbps,
        "dense_vs_datasheet": _ceiling(data, "dense_bf16") / FP32_DATASHEET_TFLOPS,
        "peer_vs_anchor": bal["peer"] / SPEC_PEER_ANCHOR_TFLOPS,
        "ffma_vs_spec": ffma / FP32_FFMA_SPEC_TFLOPS, "ffma_vs_datasheet": ffma / FP32_DATASHEET_TFLOPS,
        "ceiling_sass_tflops": peak * CEILING_LOOP_FFMA / CEILING_LOOP_INSTRUCTIONS,
        # The SM clock at which the ceiling kernel's SASS, issuing on every cycle, gives what was measured.
        "ceiling_implied_clock_ghz": ffma * 1e12 / (sms * FLOP_PER_SM_CYCLE * CEILING_LOOP_FFMA
                                                    / CEILING_LOOP_INSTRUCTIONS) / 1e9,
        # What k0's share of the measured ceiling would demand of its schedulers if that ceiling were the peak.
        "issue_if_ceiling_true": bal["of_ffma"] / ffma_share,
    }


def _f(value: float, spec: str = ".1f") -> str:
    """A number for the page; '-' where the run did not record what it needs."""
    try:
        return "-" if value is None or not np.isfinite(value) else format(value, spec)
    except TypeError:
        return "-"


def _pct(value: float) -> str:
    return "-" if not np.isfinite(value) else f"{100 * value:.0f}%"


def _sections(parts: dict[str, str]) -> str:
    """One markdown file of named snippet sections; the marker lines vanish when included."""
    out = []
    for name in FINDING_SECTIONS:
        out += [f"<!-- --8<-- [start:{name}] -->", parts[name].rstrip("\n"), f"<!-- --8<-- [end:{name}] -->", ""]
    return "\n".join(out)


def findings_markdown(data: dict[str, Any]) -> str:
    """The measured half of the page's interpretation, as bullets in named sections (FINDING_SECTIONS)."""
    f = findings(data)
    w = f["work"]
    bal, skw, small, longk = w["balanced"], w["skewed"], w["small"], w["long_k"]
    occ = f["occupancy"]
    parts: dict[str, str] = {}

    parts["checks"] = "- This results file records no correctness checks of k0.\n" if not f["checks"] else (
        f"- Before any timing, k0 passed {f['checks_passed']} of {f['checks']} checks against the numpy "
        f"reference in this run: {f['exact_checks']} edge cases exactly (integer-valued inputs, bit for bit) "
        f"and {f['checks_passed'] - f['exact_checks']} random problems within the relative-error bound of "
        f"1e-2. Each timed workload below was checked once more on its own inputs before it was timed; the "
        f"largest relative error among them was {_f(f['max_check_error'], '.2e')}.\n")

    parts["headline"] = (
        f"- {bal['label']}: **{_f(bal['useful'])} TFLOP/s** useful. SPEC's target for k0 is "
        f"{f['target']:g}: **{'met' if f['target_met'] else 'missed'}**. The spread of the timed launches "
        f"was {_pct(bal['spread'])} (max / min - 1).\n"
        f"- That is {_pct(bal['of_datasheet'])} of the {f['datasheet']:g} TFLOP/s datasheet figure and "
        f"{_pct(bal['of_ffma'])} of the FFMA ceiling ({f['ffma_source']}: {_f(f['ffma'])} TFLOP/s).\n"
        f"- At the maximum SM clock, {_f(1e3 * f['clock_ghz'], '.0f')} MHz (the clock during the timed "
        f"launches was not recorded; nvidia-smi read {_f(1e3 * f['sampled_clock_ghz'], '.0f')} MHz once when "
        f"the results were written, after the timed launches), the scheduled rate is {_f(f['flop_per_sm_cycle'], '.0f')} FLOP per SM per cycle of "
        f"the {FLOP_PER_SM_CYCLE} the FP32 lanes can do: an FFMA on {_pct(f['ffma_issue'])} of scheduler "
        f"cycles. With FFMAs {f['ffma_share']:.2f} of what k0's loop issues, the schedulers issued something "
        f"on about {_pct(f['issue'])} of cycles.\n"
        f"- The seed's CUDA C++ k0 on B300 did {_f(f['seed_flop_per_sm_cycle'], '.0f')} FLOP per SM per cycle; "
        f"k0 does {_f(f['vs_seed_per_clock'], '.2f')} times as much per SM and clock.\n"
        f"- The SASS has {f['sass'].get('LDS.128', '-')} LDS.128 for {f['sass'].get('FFMA', '-')} FFMA: one "
        f"16-byte shared load per {_f(1 / f['lds_per_ffma'], '.0f')} FFMAs. At the rate above the fragment "
        f"reads take {_f(f['wavefronts_per_cycle'], '.2f')} shared-memory wavefronts per SM per cycle, of the "
        f"one per cycle shared memory serves.\n"
        f"- Resources: {occ.get('registers', '-')} registers, {occ.get('blocks_per_sm', '-')} blocks per SM, "
        f"limited by {occ.get('limiter', '-')}; {occ.get('local_bytes', '-')} bytes of local memory.\n")

    rows = [["registers, blocks/SM (limiter)",
             f"{PREDICTION['registers']}, {PREDICTION['blocks_per_sm']} ({PREDICTION['limiter']})",
             f"{occ.get('registers', '-')}, {occ.get('blocks_per_sm', '-')} ({occ.get('limiter', '-')})",
             "same" if (occ.get("registers"), occ.get("blocks_per_sm"), occ.get("limiter")) == (
                 PREDICTION["registers"], PREDICTION["blocks_per_sm"], PREDICTION["limiter"]) else "different"]]
    for entry in (bal, skw, small, longk):
        rows.append([f"{entry['label']}, TFLOP/s", _f(entry["predicted"], "g"), _f(entry["useful"]),
                     _f(entry["vs_predicted"], ".2f")])
    rows.append([f"k0 / torch._grouped_mm, {bal['label']}", f"{PREDICTION['peer_ratio']:g}", _f(bal["vs_peer"], ".3f"),
                 _f(bal["vs_peer"] / PREDICTION["peer_ratio"], ".2f")])
    parts["prediction"] = (
        markdown_table(["", "predicted", "measured", "measured / predicted"], rows)
        + f"\n- The prediction at {bal['label']} was (issue fraction) x (FFMA share) x (FFMA ceiling) = "
        f"{PREDICTION['issue_fraction']:g} x {PREDICTION['ffma_share']:g} x {PREDICTION['ceiling']:g} = "
        f"{_f(f['predicted_tflops'])} TFLOP/s, rounded to 24. The FP32 peak at the maximum clock is "
        f"{_f(f['peak_tflops'])} TFLOP/s, {_f(f['ceiling_factor'], '.2f')} times the ceiling the prediction used; "
        f"the issue fraction k0 reached, if it ran at that clock, is {_f(f['issue_factor'], '.2f')} times the "
        f"guessed one. The two factors together: {_f(f['ceiling_factor'] * f['issue_factor'], '.2f')}.\n"
        f"- The predicted peer ratio took torch._grouped_mm from SPEC's anchor, {SPEC_PEER_ANCHOR_TFLOPS:g} "
        f"TFLOP/s; in this run it ran at {_f(bal['peer'])} ({_f(f['peer_vs_anchor'], '.2f')} times the anchor).\n")

    parts["skew"] = (
        f"- {skw['label']}: {_f(skw['useful'])} TFLOP/s useful, {_f(f['skew_ratio'], '.3f')} of the balanced "
        f"run. With BM = 64 the tile list grows from {bal['tiles']:,} to {skw['tiles']:,} tiles: "
        f"eta = {_f(skw['eta'], '.3f')}.\n"
        f"- The eta-only estimate is {_f(bal['useful'])} x {_f(skw['eta'], '.3f')} = {_f(f['skew_estimate'])} "
        f"TFLOP/s; measured / estimate = **{_f(f['skew_vs_estimate'], '.3f')}** (the seed's B300 k0: "
        f"{_f(f['seed_skew_ratio'], '.3f')} of its balanced run).\n"
        f"- Scheduled TFLOP/s, padding rows counted: {_f(skw['scheduled'])} at s = 1.2 against "
        f"{_f(bal['scheduled'])} at s = 0 (ratio {_f(f['skew_scheduled_ratio'], '.3f')}).\n")

    parts["small"] = (
        f"- {small['label']}: {_f(small['useful'])} TFLOP/s useful, {_f(f['small_ratio'], '.3f')} of the "
        f"16,384-row rate. eta = {_f(small['eta'], '.3f')}, so {_f(small['scheduled'])} TFLOP/s scheduled: "
        f"{_f(f['small_rate'], '.3f')} of the 16,384-row scheduled rate.\n"
        f"- {small['tiles']:,} tiles for {_f(f['slots'], ',.0f')} resident blocks ({_f(f['sms'], '.0f')} SMs x "
        f"{occ.get('blocks_per_sm', '-')}): {_f(f['small_waves'], '.2f')} waves, the last one "
        f"{_f(f['small_tail_blocks'], '.0f')} blocks. Lock-step waves charge it a whole wave: "
        f"{_f(f['small_waves'], '.2f')} / {_f(np.ceil(f['small_waves']), '.0f')} = {_f(f['small_fill'], '.3f')} "
        f"of the full-wave rate, against {_f(f['balanced_fill'], '.3f')} for the {bal['tiles']:,} tiles "
        f"({_f(f['balanced_waves'], '.2f')} waves) at 16,384 rows; their ratio, {_f(f['small_model_rate'], '.3f')}, "
        f"is what the model predicts for the scheduled rate above. If the whole measured shortfall is the tail, "
        f"the last partial wave cost {_f(f['small_tail_cost'], '.2f')} of a block time at full residency.\n"
        f"- Compulsory traffic (A, B and C once, bf16; B alone is {_f(small['b_bytes'] / 1e6, ',.0f')} MB) takes "
        f"{_f(small['compulsory_ms'], '.3f')} ms at this run's copy rate ({_f(f['copy_tbps'], '.2f')} TB/s): "
        f"{_pct(small['compulsory_ms'] / small['median_ms'])} of the {_f(small['median_ms'], '.3f')} ms k0 ran.\n"
        f"- Beside the peers: k0 is {_f(small['vs_peer'], '.3f')} of torch._grouped_mm ({_f(small['peer'])} TFLOP/s, "
        f"{_pct(small['peer_of_roofline'])} of this run's roofline of {_f(small['roofline_tflops'], '.0f')}, which "
        f"is {'memory' if small['memory_bound'] else 'compute'}-bound here) and "
        f"{_f(small['useful'] / small['loop'], '.1f')} "
        f"times the per-expert torch loop ({_f(small['loop'])}).\n")

    parts["long_k"] = (
        f"- {longk['label']}: {_f(longk['useful'])} TFLOP/s, {_f(f['long_k_ratio'], '.3f')} of the K = 1024 rate, "
        f"on the same {longk['tiles']:,} tiles: {_f(longk['median_ms'], '.2f')} ms against "
        f"{_f(bal['median_ms'], '.2f')} ms, {_f(f['long_k_time_ratio'], '.2f')} times the time for 8 times the "
        f"FLOP.\n"
        f"- torch._grouped_mm went from {_f(bal['peer'])} to {_f(longk['peer'])} TFLOP/s, so the ratio fell from "
        f"{_f(bal['vs_peer'], '.3f')} to {_f(longk['vs_peer'], '.3f')}.\n")

    ratios = ", ".join(f"{_f(w[n]['vs_peer'], '.3f')} ({w[n]['label']})" for n in FINDING_WORKLOADS)
    parts["peer"] = (
        f"- k0 / torch._grouped_mm: {ratios}.\n"
        f"- This run's tensor-core ceilings: cuBLAS dense bf16 {_f(f['dense_bf16'])} TFLOP/s, register-only "
        f"mma.sync {_f(f['mma_sync'])}; the dense figure is {_f(f['dense_vs_datasheet'], '.1f')} times the FP32 "
        f"datasheet peak.\n"
        f"- The per-expert torch loop (one cuBLAS call per expert, issued from Python), TFLOP/s against k0's "
        f"and its median time: "
        + ", ".join(f"{_f(w[n]['loop'])} vs {_f(w[n]['useful'])} in {_f(w[n]['loop_ms'], '.2f')} ms ({w[n]['label']})"
                    for n in FINDING_WORKLOADS)
        + ".\n")

    parts["ceiling"] = (
        f"- FFMA ceiling: {_f(f['ffma'])} TFLOP/s ({f['ffma_source']}), "
        f"{_f(f['ffma_vs_spec'], '.2f')} of SPEC's {f['spec_ffma']:g} and {_f(f['ffma_vs_datasheet'], '.2f')} of "
        f"the datasheet's {f['datasheet']:g}.\n"
        f"- Its SASS issuing on every cycle ({CEILING_LOOP_FFMA} FFMA in every {CEILING_LOOP_INSTRUCTIONS} "
        f"instructions) would give {_f(f['ceiling_sass_tflops'])} TFLOP/s at the maximum clock; the measured "
        f"rate corresponds to an SM clock of {_f(1e3 * f['ceiling_implied_clock_ghz'], '.0f')} MHz.\n"
        f"- Taken as the true peak, it would have k0 ({_pct(bal['of_ffma'])} of it, FFMAs "
        f"{f['ffma_share']:.2f} of its instructions) issuing on {_pct(f['issue_if_ceiling_true'])} of "
        f"scheduler cycles.\n")
    return _sections(parts)


def _write(root: Path, name: str, text: str) -> Path:
    path = root / CHAPTER / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_outputs(root: Path = FIGURE_ROOT, results: Path | None = None) -> list[Path]:
    static = [save_figure(layout_figure(), CHAPTER, "layout", root)]  # from the kernel's map: no results needed
    path = results or results_path(CHAPTER, GPU)
    if not path.is_file():
        print(f"{path} does not exist: no measured figure drawn, the tables say so")
        return [*static, _write(root, "results_table.md", NOT_MEASURED.format(what="table")),
                _write(root, "resources_table.md", NOT_MEASURED.format(what="table")),
                _write(root, "throughput_figure.md", NOT_MEASURED.format(what="figure")),
                _write(root, "findings.md",
                       _sections({name: NOT_MEASURED.format(what="reading") for name in FINDING_SECTIONS}))]
    data = load_results(path)
    figure = save_figure(throughput_figure(data), CHAPTER, "throughput", root)
    gpu = data["provenance"]["gpu"]
    return [*static, figure,
            _write(root, "throughput_figure.md",
                   f"![k0 on {gpu} against the FP32 ceiling, the seed's B300 k0 and the torch peers]"
                   f"(figures/{CHAPTER}/{figure.name})\n"),
            _write(root, "results_table.md", results_markdown(data)),
            _write(root, "resources_table.md", resources_markdown(data)),
            _write(root, "findings.md", findings_markdown(data))]


def main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = chapter_parser(__doc__)
    parser.add_argument("--out", type=Path, default=FIGURE_ROOT,
                        help=f"figure root; files go to OUT/{CHAPTER}/ (default {FIGURE_ROOT})")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"results file to draw from (default chapters/{CHAPTER}/results/{GPU}.json)")
    args = parser.parse_args(argv)
    for path in write_outputs(args.out, args.results):
        print(path)
    return 0


if __name__ == "__main__":
    run_main(main)
