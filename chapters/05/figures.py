"""Chapter 05's figures and generated docs tables.

    python chapters/05/figures.py          # writes site_docs/figures/05/*.png and *.md

Chapter 05 has no measurements: k4 needs compute capability 10.x and none was available. Every
output here is built when the site is built, from the compiler and the model, never typed by hand:

* compile_report_sm100a.md, compile_report_sm103a.md: NVRTC's resource report and SASS counts;
* descriptors.png and descriptors.md: the bit layouts of the tcgen05 shared-memory and instruction
  descriptors, filled in with the values k4 receives, from moe_gemm.variants.k4.tcgen05's encoders;
* residency.md: the accumulator registers tensor memory takes off the register file, and the
  occupancy model's reading of k4's compiled registers and shared memory;
* estimate.md: a model estimate of k4 on a B300, labelled as one, beside the seed's measured B300
  k2 numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.patches import Rectangle

from moe_gemm.chapter import Table, chapter_module, figures_main, run_main
from moe_gemm.core.tables import markdown_table
from moe_gemm.model.occupancy import HOPPER, registers_per_warp
from moe_gemm.model.problem import useful_flops
from moe_gemm.model.roofline import compulsory_bytes
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.tiles import eta
from moe_gemm.site.style import new_figure, save_figure
from moe_gemm.variants.k4.tcgen05 import decode_instr, decode_smem

CHAPTER = "05"
RUN = chapter_module(CHAPTER)
WORKLOADS = RUN.WORKLOADS
ESTIMATE_VARIANT = "k4/bn192"  # N = 2688 is exactly 14 tiles of 192 columns: no column padding
# The model's inputs. None is a measurement of ours.
B300_PEAK_TFLOPS = 2250.0   # the seed's nominal B300 dense BF16 tensor-core peak, 2.25 PFLOP/s
B300_HBM_TBPS = 8.0         # NVIDIA's published B300 HBM3e bandwidth (an assumption here)
# gau-nernst/learn-cuda 02e_matmul_sm100/README.md: "v4 (warp specialization)", a 1-SM tcgen05
# kernel with a TMA warp, an MMA warp and epilogue warps, 1053.61 TFLOP/s on a B200 at 4096^3.
REFERENCE_TFLOPS = 1053.61
SEED_B300_K2 = {"16k s=0": 440.1, "16k s=1.2": 357.0, "2k s=0": 111.1}  # the seed's k2/S2, measured
FIELD_COLORS = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9", "#fee391", "#a1d99b")


def _k4():
    from moe_gemm.variants import k4

    return k4


# --------------------------------------------------------------------------- compile report

def compile_markdown(report: list[dict]) -> str:
    table: Table = RUN.compile_table(report)
    return markdown_table(table.headers, table.rows) + f"\n*{RUN.COMPILE_LEGEND}.*\n"


# --------------------------------------------------------------------------- descriptors

SMEM_FIELDS = (("start >> 4", 0, 14), ("0", 14, 2), ("LBO >> 4", 16, 14), ("0", 30, 2), ("SBO >> 4", 32, 14),
               ("0b001", 46, 3), ("base", 49, 3), ("mode", 52, 1), ("0", 53, 8), ("swizzle", 61, 3))
INSTR_FIELDS = (("sparse", 0, 3), ("sat", 3, 1), ("D fmt", 4, 2), ("-", 6, 1), ("A fmt", 7, 3), ("B fmt", 10, 3),
                ("neg A", 13, 1), ("neg B", 14, 1), ("A MN", 15, 1), ("B MN", 16, 1), ("N >> 3", 17, 6),
                ("-", 23, 1), ("M >> 4", 24, 5), ("-", 29, 1), ("shift", 30, 2))


ROW_BITS = 16  # bits per drawn row: a 1-bit field is then wide enough for a readable label


def _draw_fields(ax, y: float, values: Sequence[int], fields, first_bit: int, title: str) -> None:
    """Bits first_bit .. first_bit + 15 (high bit left), a box per field (or part of one) with its name
    and, on the part that holds the field's low bit, its value in each of ``values``."""
    for i, (name, lo, width) in enumerate(fields):
        seg_lo, seg_hi = max(lo, first_bit), min(lo + width, first_bit + ROW_BITS) - 1
        if seg_lo > seg_hi:
            continue
        left, seg_width = first_bit + ROW_BITS - 1 - seg_hi, seg_hi - seg_lo + 1
        ax.add_patch(Rectangle((left, y), seg_width, 1, facecolor=FIELD_COLORS[i % len(FIELD_COLORS)],
                               edgecolor="#333333", linewidth=0.8))
        ax.text(left + seg_width / 2, y + 0.72, name, ha="center", va="center", fontsize=9)
        if seg_lo == lo:
            field_values = [v >> lo & ((1 << width) - 1) for v in values]
            text = " / ".join(str(v) if width < 6 else f"{v:#x}" for v in field_values)
            ax.text(left + seg_width / 2, y + 0.3, text, ha="center", va="center", fontsize=9, family="monospace")
        ax.text(left + seg_width - 0.5, y - 0.2, str(seg_lo), ha="center", va="center", fontsize=9, color="#555555")
    ax.text(-0.4, y + 0.5, title, ha="right", va="center", fontsize=10)


def descriptor_figure():
    """The two descriptor formats, filled in with k4/bn192's values (B MN-major, first stage, k16 step 1)."""
    k4 = _k4()
    config = k4.CONFIGS[ESTIMATE_VARIANT]
    plan_a, plan_b = k4.plans(config)
    a_tile = 0x400  # an example ring address: the kernel's ring starts on a 1 KB boundary
    b_tile = a_tile + config.bm * k4.BK * 2
    desc_a, desc_b = plan_a.descriptor(a_tile, 0, 1), plan_b.descriptor(b_tile, 0, 1)
    idesc = k4.instr_descriptor(config)
    rows = [((desc_a, desc_b), SMEM_FIELDS, first, f"smem bits {first + 15}-{first}") for first in (48, 32, 16, 0)]
    rows += [((idesc,), INSTR_FIELDS, first, f"instr bits {first + 15}-{first}") for first in (16, 0)]
    fig, ax = new_figure(8.6, 6.6)
    ax.set_axis_off()
    ax.grid(False)
    for i, (values, fields, first, title) in enumerate(rows):
        _draw_fields(ax, (len(rows) - 1 - i) * 1.5 - (0.6 if i >= 4 else 0), values, fields, first, title)
    ax.set_xlim(-4.2, ROW_BITS + 0.2)
    ax.set_ylim(-1.3, len(rows) * 1.5)
    ax.set_title(f"{ESTIMATE_VARIANT}, k16 step 1 of a stage at {a_tile:#x}: shared-memory descriptor values "
                 f"A / B\n(A {desc_a:#018x}, B {desc_b:#018x}), instruction descriptor {idesc:#010x}", fontsize=10)
    return fig


def descriptor_markdown() -> str:
    """Per configuration: the host-built descriptor constants, decoded, and the instruction descriptor."""
    k4 = _k4()
    rows = []
    for name, config in k4.CONFIGS.items():
        plan_a, plan_b = k4.plans(config)
        instr = decode_instr(k4.instr_descriptor(config))
        for label, plan in (("A", plan_a), ("B", plan_b)):
            layout = decode_smem(plan.bits)
            rows.append((name, label, plan.major, f"`{plan.bits:#018x}`", layout.lbo, layout.sbo, layout.span,
                         plan.k16_bytes, f"`{k4.instr_descriptor(config):#010x}`" if label == "A" else "",
                         f"{instr.m} x {instr.n}" if label == "A" else ""))
    headers = ("kernel", "operand", "major", "descriptor bits", "LBO B", "SBO B", "swizzle B", "k16 step B",
               "instruction descriptor", "M x N")
    legend = ("*descriptor bits: the constant part the kernel ORs the start address into (shifted right by 4); "
              "LBO / SBO: leading / stride byte offsets; swizzle: span in bytes; k16 step: bytes the start address "
              "moves per 16 of K; instruction descriptor: bf16 x bf16 -> f32, dense, with M, N and the majors.*\n")
    return markdown_table(headers, rows) + "\n" + legend


# --------------------------------------------------------------------------- registers and residency

def residency_rows(report: list[dict]) -> list[dict]:
    """Per configuration: what its two accumulators would take of the register file, and the model's
    blocks per SM (from chapter 05's compile report) under registers, shared memory and tensor memory."""
    k4 = _k4()
    rows = []
    for r in report:
        config = k4.CONFIGS[r["variant"]]
        values = k4.ACCUMULATORS * k4.BM * config.bn
        rows.append({"variant": r["variant"], "accumulator_values": values, "register_share": values / HOPPER.registers,
                     "tmem_columns": r["tmem_columns"], "registers": r["registers"],
                     "block_registers": registers_per_warp(r["registers"]) * r["warps_per_block"],
                     "by_registers": r["by_registers"], "by_smem": r["by_smem"], "by_tmem": r["by_tmem"],
                     "blocks": r["blocks_per_sm"]})
    return rows


def residency_markdown(rows: list[dict]) -> str:
    headers = ("kernel", "accumulator fp32 values (2 buffers)", "as registers: share of the file", "TMEM cols",
               "k4 regs/thread", "k4 regs/block", "blocks by regs", "by smem", "by TMEM", "blocks/SM")
    body = [(r["variant"], r["accumulator_values"], f"{100 * r['register_share']:.0f}%", r["tmem_columns"],
             r["registers"], r["block_registers"], r["by_registers"], r["by_smem"], r["by_tmem"], r["blocks"])
            for r in rows]
    legend = ("*accumulator: 2 x 128 x BN fp32 values, what holding both buffers in registers would take of the "
              f"SM's {HOPPER.registers:,} 32-bit registers; k4 regs: ptxas's count for sm_100a, per thread and per "
              "192-thread block (allocated per warp in units of 256); blocks by regs / smem / TMEM: the occupancy "
              "model's limit under each resource; blocks/SM: the smallest.*\n")
    return markdown_table(headers, body) + "\n" + legend


# --------------------------------------------------------------------------- the B300 model estimate

def estimate_rows() -> list[dict]:
    """T = min(u * P * eta, useful FLOP / (compulsory bytes / bandwidth)) per seed workload, with
    u = REFERENCE_TFLOPS / P: the fraction of the nominal peak a published 1-SM tcgen05 kernel of the
    same structure reached on a dense square GEMM. An estimate from stated inputs, not a measurement."""
    share = REFERENCE_TFLOPS / B300_PEAK_TFLOPS
    rows = []
    for w in WORKLOADS:
        counts = expert_counts(w.experts, w.tokens, w.skew)
        row_eta = eta(counts, 128)
        compute = share * B300_PEAK_TFLOPS * row_eta
        seconds = compulsory_bytes(w.counts, w.K, w.N) / (B300_HBM_TBPS * 1e12)
        memory = useful_flops(w.tokens, w.K, w.N) / seconds / 1e12
        estimate = min(compute, memory)
        rows.append({"workload": w.short_label, "eta": row_eta, "compute": compute, "memory": memory,
                     "estimate": estimate, "bound": "tensor cores" if compute <= memory else "HBM",
                     "seed_k2": SEED_B300_K2[w.short_label]})
    return rows


def estimate_markdown(rows: list[dict]) -> str:
    headers = ("workload", "eta (BM = 128)", "compute term", "memory term", f"{ESTIMATE_VARIANT} (model estimate)",
               "bound by", "seed's k2/S2 (measured on its B300)", "estimate / seed k2")
    body = [(r["workload"], f"{r['eta']:.3f}", f"{r['compute']:.0f}", f"{r['memory']:.0f}", f"{r['estimate']:.0f}",
             r["bound"], f"{r['seed_k2']:.1f}", f"{r['estimate'] / r['seed_k2']:.1f}x") for r in rows]
    legend = (f"*All columns but the seed's are a model, in useful TFLOP/s, not measurements. compute term: u x P x "
              f"eta with P = {B300_PEAK_TFLOPS:,.0f} (the seed's nominal B300 dense BF16 peak) and u = "
              f"{REFERENCE_TFLOPS} / {B300_PEAK_TFLOPS:,.0f} = {REFERENCE_TFLOPS / B300_PEAK_TFLOPS:.3f} (learn-cuda's "
              f"warp-specialized 1-SM tcgen05 kernel on a B200, 4096^3); memory term: 2 M_tot K N over the compulsory "
              f"bytes at {B300_HBM_TBPS:g} TB/s (the published B300 HBM3e bandwidth, assumed); estimate: the smaller; "
              "seed's k2/S2: the seed's measured B300 numbers.*\n")
    return markdown_table(headers, body) + "\n" + legend


# --------------------------------------------------------------------------- main

def write_outputs(root: Path) -> list[Path]:
    folder = root / CHAPTER
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def write(name: str, text: str) -> None:
        path = folder / name
        path.write_text(text)
        written.append(path)

    reports = {arch: RUN.compile_report(arch) for arch in RUN.ARCHES}
    for arch, report in reports.items():
        write(f"compile_report_{arch.replace('_', '')}.md", compile_markdown(report))
    write("descriptors.md", descriptor_markdown())
    written.append(save_figure(descriptor_figure(), CHAPTER, "descriptors", root=root))
    write("residency.md", residency_markdown(residency_rows(reports["sm_100a"])))
    write("estimate.md", estimate_markdown(estimate_rows()))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    return figures_main(__doc__, write_outputs, CHAPTER, argv)


if __name__ == "__main__":
    run_main(main)
