"""Chapter 02's figures and generated docs tables.

    python chapters/02/figures.py          # writes site_docs/figures/02/*.png and *.md

Two kinds of output, both included into site_docs/02-mma-sync.md by pymdownx.snippets:

* from the compiler alone (no GPU, no results file): the compile report of every k1
  configuration for sm_90a, the register arithmetic behind each one's blocks per SM, and the
  ldmatrix / mma.sync fragment layouts;
* from chapters/02/results/h200.json only: the BM sweep, tile fill at 2,048 rows, the issue
  model against Nsight Compute's counters, the measured ceilings and every measurement. When the
  file is absent, each of these says so and no figure is drawn: no number is ever made up.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm import fragments
from moe_gemm.cli import chapter_parser, run_main
from moe_gemm.notebook import PEER, Workload
from moe_gemm.occupancy import HOPPER, registers_per_warp, residency
from moe_gemm.report import markdown_table
from moe_gemm.results import load_results, results_path
from moe_gemm.roofline import H200_COPY_TBPS, H200_DENSE_BF16_TFLOPS, roofline_tflops
from moe_gemm.routing import expert_counts
from moe_gemm.style import BM_COLORS, COLORS, FIGURE_ROOT, new_figure, save_figure
from moe_gemm.tiles import eta, eta_estimate

CHAPTER = "02"
GPU = "h200"
ARCH = "sm_90a"
SWEEP = ("k1/bm32", "k1/bm64", "k1/bm128", "k1/bm64-fragdb")
VARIANT_COLORS = {"k1/bm32": BM_COLORS[32], "k1/bm64": BM_COLORS[64], "k1/bm128": BM_COLORS[128],
                  "k1/bm64-fragdb": "#98df8a", PEER: COLORS["peer"]}
WORKLOADS = (Workload(16384, 0.0), Workload(16384, 1.2), Workload(2048, 0.0))
NOT_MEASURED = ("*Not measured yet: this table is generated from `chapters/02/results/h200.json`, which "
                "`python chapters/02/run.py` writes on a GPU.*\n")


# --------------------------------------------------------------------------- no GPU needed

def compile_report_markdown(rows: list[dict[str, Any]]) -> str:
    headers = ["kernel", "registers", "regs/block", "smem KB", "spill bytes", "blocks/SM", "limited by",
               "HMMA", "LDSM", "LDSM.T", "LDGSTS", "BAR"]
    body = [[r["variant"], r["registers"], r["registers_per_block"], f"{r['smem_bytes'] / 1024:.1f}",
             r["spill_bytes"], r["blocks_per_sm"], r["limiter"],
             *(r["sass"][op] for op in ("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS",
                                        "BAR.SYNC"))] for r in rows]
    return markdown_table(headers, body)


def register_arithmetic_markdown(rows: list[dict[str, Any]]) -> str:
    """R -> registers per warp (rounded to 256) -> per block -> blocks by registers, beside the other limits."""
    headers = ["kernel", "R", "32 R", "regs/warp", "regs/block (8 warps)", "65,536 / block", "by smem",
               "by warps", "blocks/SM", "warps/scheduler"]
    body = []
    for r in rows:
        per_warp = registers_per_warp(r["registers"])
        fit = residency(r["registers"], r["warps_per_block"], r["smem_bytes"])
        body.append([r["variant"], r["registers"], 32 * r["registers"], per_warp, per_warp * r["warps_per_block"],
                     f"{HOPPER.registers / (per_warp * r['warps_per_block']):.2f}", fit.by_smem, fit.by_warps,
                     fit.blocks, f"{fit.blocks * r['warps_per_block'] / HOPPER.schedulers:g}"])
    return markdown_table(headers, body)


def eta_markdown() -> str:
    """eta for each BM on the chapter's three workloads: the padding-only prediction, before any run."""
    headers = ["workload", *(f"eta, BM = {bm}" for bm in (32, 64, 128))]
    body = [[w.label, *(f"{eta(expert_counts(w.experts, w.tokens, w.skew), bm):.3f}" for bm in (32, 64, 128))]
            for w in WORKLOADS]
    return markdown_table(headers, body)


def static_outputs(root: Path) -> list[Path]:
    from moe_gemm.variants.k1 import compile_report

    rows = compile_report(ARCH)
    outputs = {
        "compile_report": compile_report_markdown(rows),
        "register_arithmetic": register_arithmetic_markdown(rows),
        "eta_prediction": eta_markdown(),
        "layout_a": fragments.a_layout_markdown(),
        "layout_b": fragments.b_layout_markdown(),
        "layout_c": fragments.c_layout_markdown(),
        "ldmatrix_addresses": fragments.ldmatrix_addresses_markdown(),
    }
    return [_write(root, name, text) for name, text in outputs.items()]


# --------------------------------------------------------------------------- from the results file

def _find(records: Sequence[dict[str, Any]], variant: str, workload: Workload) -> dict[str, Any] | None:
    return next((r for r in records if r["variant"] == variant and workload.matches(r)), None)


def _ceilings(data: dict[str, Any]) -> tuple[float, float]:
    """Dense bf16 TFLOP/s and copy TB/s measured in the run, or the SPEC's H200 values if absent."""
    from moe_gemm.ceilings import ceiling_value

    ceilings = data.get("ceilings", [])
    return (ceiling_value(ceilings, "dense_bf16") or H200_DENSE_BF16_TFLOPS,
            ceiling_value(ceilings, "copy") or H200_COPY_TBPS)


def bm_sweep_figure(data: dict[str, Any]):
    records = data["records"]
    dense, copy = _ceilings(data)
    variants = [v for v in (*SWEEP, PEER) if any(r["variant"] == v for r in records)]
    fig, ax = new_figure(8.0, 4.6)
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        values = [(_find(records, variant, w) or {}).get("useful_tflops", np.nan) for w in WORKLOADS]
        x = np.arange(len(WORKLOADS)) + (i - (len(variants) - 1) / 2) * width
        bars = ax.bar(x, values, width, color=VARIANT_COLORS.get(variant, "#8c564b"), label=variant)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    limits = [roofline_tflops(w.experts, w.tokens, w.K, w.N, peak_tflops=dense, bandwidth_tbps=copy)
              for w in WORKLOADS]
    for j, limit in enumerate(limits):
        ax.hlines(limit, j - 0.45, j + 0.45, colors=COLORS["ceiling"], linestyles="--", linewidth=1)
        ax.text(j, limit, f"roofline {limit:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max(limits) * 1.1)
    ax.set_xticks(range(len(WORKLOADS)), [w.label for w in WORKLOADS])
    ax.set_ylabel("useful TFLOP/s")
    ax.set_title(f"k1's BM sweep and FRAG_DB beside torch._grouped_mm ({data['provenance']['gpu']})")
    ax.legend(fontsize=8, ncol=len(variants), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    return fig


def tile_fill_figure(data: dict[str, Any]):
    """At 2,048 balanced rows each expert has 32 rows: eta = 1, 0.5, 0.25 for BM = 32, 64, 128."""
    records = data["records"]
    small, balanced = Workload(2048, 0.0), Workload(16384, 0.0)
    fig, ax = new_figure(7.0, 3.8)
    bms = (32, 64, 128)
    measured, estimated, etas = [], [], []
    for bm in bms:
        rec, base = _find(records, f"k1/bm{bm}", small), _find(records, f"k1/bm{bm}", balanced)
        measured.append(rec["useful_tflops"] if rec else np.nan)
        etas.append(eta(expert_counts(64, 2048, 0.0), bm))
        estimated.append(eta_estimate(base["useful_tflops"], etas[-1], base["eta"]) if base else np.nan)
    x = np.arange(len(bms))
    ax.bar(x - 0.2, measured, 0.4, color=[BM_COLORS[bm] for bm in bms], label="measured, 2,048 rows")
    ax.bar(x + 0.2, estimated, 0.4, color="white", edgecolor=[BM_COLORS[bm] for bm in bms], hatch="//",
           label="eta-only estimate from 16,384 rows")
    for xi, m, e in zip(x, measured, etas):
        if np.isfinite(m):
            ax.text(xi - 0.2, m, f"{m:.0f}", ha="center", va="bottom", fontsize=8)
        ax.text(xi, 0, f"eta = {e:.2f}", ha="center", va="bottom", fontsize=8, color="white",
                bbox={"facecolor": "#444444", "edgecolor": "none", "pad": 1.5})
    peer = _find(records, PEER, small)
    if peer:
        ax.axhline(peer["useful_tflops"], color=COLORS["peer"], linestyle=":", linewidth=1.2,
                   label=f"torch._grouped_mm {peer['useful_tflops']:.0f}")
    dense, copy = _ceilings(data)
    limit = roofline_tflops(64, 2048, 1024, 2688, peak_tflops=dense, bandwidth_tbps=copy)
    ax.axhline(limit, color=COLORS["ceiling"], linestyle="--", linewidth=1, label=f"roofline {limit:.0f}")
    ax.set_xticks(x, [f"BM = {bm}" for bm in bms])
    ax.set_ylabel("useful TFLOP/s")
    ax.set_title("Tile fill at 2,048 balanced rows (32 rows per expert)")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def issue_model_figure(data: dict[str, Any]):
    profiles = [p for p in data.get("profile", []) if p.get("issue_model") is not None]
    fig, (left, right) = new_figure(9.0, 3.8, ncols=2)
    predicted_w = {r["variant"]: r["blocks_per_sm"] * r["warps_per_block"] / 4 for r in data.get("compile_report", [])}
    names = [p["variant"] for p in profiles]
    x = np.arange(len(names))
    left.bar(x - 0.2, [predicted_w.get(n, np.nan) for n in names], 0.4, color="#bbbbbb", label="occupancy model")
    left.bar(x + 0.2, [p["warps_per_scheduler"] for p in profiles], 0.4,
             color=[VARIANT_COLORS.get(n, "#8c564b") for n in names], label="ncu (achieved)")
    left.set_xticks(x, [n.removeprefix("k1/") for n in names], fontsize=8)
    left.set_ylabel("W, warps per scheduler")
    left.set_title("Resident warps: model vs achieved")
    left.legend(fontsize=8)
    top = max([p["issue_model"] for p in profiles] + [p["issue_active"] for p in profiles] + [0.1]) * 1.15
    right.plot([0, top], [0, top], color="#888888", linestyle="--", linewidth=1, label="model = measurement")
    for p in profiles:
        right.scatter(p["issue_model"], p["issue_active"], s=40, color=VARIANT_COLORS.get(p["variant"], "#8c564b"),
                      zorder=3)
        right.annotate(f"{p['variant'].removeprefix('k1/')}\nW={p['warps_per_scheduler']:.2f}, "
                       f"L={p['cycles_per_issue']:.2f}", (p["issue_model"], p["issue_active"]),
                       textcoords="offset points", xytext=(5, -12), fontsize=7)
    right.set_xlim(0, top)
    right.set_ylim(0, top)
    right.set_xlabel("W / L (model, from measured W and L)")
    right.set_ylabel("issue-active (ncu)")
    right.set_title("Issue rate per scheduler")
    right.legend(fontsize=8, loc="upper left")
    return fig


def measurements_markdown(data: dict[str, Any]) -> str:
    dense, copy = _ceilings(data)
    records = [r for r in data["records"] if r["variant"] in (*SWEEP, PEER)]
    headers = ["variant", "workload", "median ms", "useful TFLOP/s", "vs peer", "% roofline", "eta", "tiles",
               "regs", "smem KB", "blocks/SM"]
    body = []
    for r in records:
        w = Workload(r["tokens"], r["skew"], r["experts"], r["K"], r["N"])
        peer = _find(data["records"], PEER, w)
        limit = roofline_tflops(r["experts"], r["tokens"], r["K"], r["N"], peak_tflops=dense, bandwidth_tbps=copy)
        body.append([r["variant"], w.label, f"{r['median_ms']:.3f}", f"{r['useful_tflops']:.1f}",
                     f"{r['useful_tflops'] / peer['useful_tflops']:.2f}" if peer else "-",
                     f"{100 * r['useful_tflops'] / limit:.1f}", f"{r['eta']:.3f}" if "eta" in r else "-",
                     r.get("tiles", "-"), r.get("registers", "-"),
                     f"{r['smem_bytes'] / 1024:.1f}" if "smem_bytes" in r else "-", r.get("blocks_per_sm", "-")])
    return markdown_table(headers, body)


def model_markdown(data: dict[str, Any]) -> str:
    """The eta-only estimate from each variant's balanced 16k rate against the skewed and small runs."""
    records = data["records"]
    headers = ["variant", "16k s=0", "eta 16k s=1.2", "estimate", "measured 16k s=1.2", "measured / estimate",
               "eta 2k", "estimate 2k", "measured 2k"]
    body = []
    for variant in SWEEP:
        base = _find(records, variant, Workload(16384, 0.0))
        if base is None:
            continue
        row: list[Any] = [variant, f"{base['useful_tflops']:.1f}"]
        for w in (Workload(16384, 1.2), Workload(2048, 0.0)):
            rec = _find(records, variant, w)
            e = eta(expert_counts(w.experts, w.tokens, w.skew), base["bm"])
            estimate = eta_estimate(base["useful_tflops"], e, base["eta"])
            row += [f"{e:.3f}", f"{estimate:.1f}", f"{rec['useful_tflops']:.1f}" if rec else "-"]
            if w.skew:
                row.append(f"{rec['useful_tflops'] / estimate:.3f}" if rec else "-")
        body.append(row)
    return markdown_table(headers, body)


def ceilings_markdown(data: dict[str, Any]) -> str:
    ceilings = data.get("ceilings", [])
    if not ceilings:
        return "*No ceilings were measured in this run.*\n"
    body = [[c["variant"], f"{c['tbps']:.2f} TB/s" if "tbps" in c else f"{c['tflops']:.1f} TFLOP/s"]
            for c in ceilings]
    return markdown_table(["ceiling", f"measured on {data['provenance']['gpu']}"], body)


def profile_markdown(data: dict[str, Any]) -> str:
    profiles = data.get("profile", [])
    if not profiles:
        return "*Not profiled yet: `python chapters/02/run.py --profile` records these counters with ncu.*\n"
    predicted_w = {r["variant"]: r["blocks_per_sm"] * r["warps_per_block"] / 4 for r in data.get("compile_report", [])}
    headers = ["variant", "W (model)", "W (ncu)", "L (ncu)", "W / L", "issue-active (ncu)", "4 W / L",
               "IPC (ncu)", "instructions (M)"]
    body = []
    for p in profiles:
        model = p.get("issue_model")
        body.append([p["variant"], f"{predicted_w.get(p['variant'], float('nan')):g}",
                     f"{p['warps_per_scheduler']:.2f}", f"{p['cycles_per_issue']:.2f}",
                     "-" if model is None else f"{model:.3f}", f"{p['issue_active']:.3f}",
                     "-" if model is None else f"{4 * model:.2f}", f"{p['ipc']:.2f}" if "ipc" in p else "-",
                     f"{p['instructions'] / 1e6:.1f}" if "instructions" in p else "-"])
    return markdown_table(headers, body)


def provenance_markdown(data: dict[str, Any]) -> str:
    prov = data["provenance"]
    packages = prov.get("packages", {})
    body = [["GPU", f"{prov['gpu']} (compute capability {prov['compute_capability']})"],
            ["driver (CUDA)", str(prov.get("driver"))], ["NVRTC", str(prov.get("cuda", {}).get("nvrtc", "-"))],
            ["torch", packages.get("torch", "-")], ["cuda-core", packages.get("cuda-core", "-")],
            ["git commit", prov["git_commit"]], ["date", prov["date"]], ["command", f"`{prov['command']}`"]]
    return markdown_table(["", "recorded with"], body)


def _image(name: str, alt: str) -> str:
    return f"![{alt}](figures/{CHAPTER}/{name}.png)\n"


def measured_outputs(root: Path, data: dict[str, Any] | None) -> list[Path]:
    written = []
    figures = {"bm_sweep": ("k1's BM sweep beside torch._grouped_mm", bm_sweep_figure),
               "tile_fill": ("tile fill at 2,048 rows", tile_fill_figure),
               "issue_model": ("the issue model against Nsight Compute", issue_model_figure)}
    for name, (alt, draw) in figures.items():
        has_data = data is not None and (name != "issue_model" or any(
            p.get("issue_model") is not None for p in data.get("profile", [])))
        if has_data:
            written.append(save_figure(draw(data), CHAPTER, name, root))
            written.append(_write(root, f"{name}_figure", _image(name, alt)))
        else:
            (root / CHAPTER / f"{name}.png").unlink(missing_ok=True)  # never leave a stale figure behind
            written.append(_write(root, f"{name}_figure", NOT_MEASURED if data is None else profile_markdown(data)))
    tables = {"measurements": measurements_markdown, "model": model_markdown, "ceilings": ceilings_markdown,
              "profile": profile_markdown, "provenance": provenance_markdown}
    for name, make in tables.items():
        written.append(_write(root, name, NOT_MEASURED if data is None else make(data)))
    return written


def _write(root: Path, name: str, text: str) -> Path:
    path = root / CHAPTER / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = chapter_parser(__doc__)
    parser.add_argument("--out", type=Path, default=FIGURE_ROOT,
                        help=f"figure root; files go to OUT/{CHAPTER}/ (default {FIGURE_ROOT})")
    args = parser.parse_args(argv)
    path = results_path(CHAPTER, GPU)
    data = load_results(path) if path.is_file() else None
    if data is None:
        print(f"no results at {path}: the measured figures and tables say 'not measured yet'")
    for written in static_outputs(args.out) + measured_outputs(args.out, data):
        print(written)
    return 0


if __name__ == "__main__":
    run_main(main)
