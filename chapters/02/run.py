"""Chapter 02: k1, the grouped GEMM on tensor cores through mma.sync, cp.async and ldmatrix.

    python chapters/02/run.py               # checks, ceilings, BM sweep, stages and FRAG_DB beside torch._grouped_mm
    python chapters/02/run.py --quick       # fewer timed launches (5 warm-up, 20 timed)
    python chapters/02/run.py --no-peers    # without torch._grouped_mm (and the torch loop)
    python chapters/02/run.py --profile     # also Nsight Compute's scheduler counters for each k1 variant

With an NVIDIA GPU of sm_80 or newer (the recorded numbers come from an H200) it:

1. compiles every configuration (BM = 32, 64, 128 with a two-stage ring, with and without
   FRAG_DB, and with a three-stage ring) for the GPU
   and prints the compile report: registers, shared memory, spills, blocks per SM from the
   occupancy model and what limits them, and the SASS instructions the chapter is about;
2. checks every configuration on the edge cases of moe_gemm.model.edge_cases (exact, integer-valued
   inputs) and on random data; a wrong answer stops the run with exit status 1;
3. measures the ceilings this chapter is judged against: copy bandwidth, cuBLAS bf16, FP32 FFMA
   and bf16 mma.sync, each with a register-only or library kernel;
4. times the BM sweep (k1/bm32, k1/bm64, k1/bm128), the three-stage ring (k1/bm32-s3,
   k1/bm64-s3, k1/bm128-s3) and the fragment double-buffering experiment (k1/bm64-fragdb)
   beside torch._grouped_mm on the seed configuration (E=64,
   K=1024, N=2688) at 16,384 rows (s=0 and s=1.2) and 2,048 rows (s=0);
5. prints the measurements, the eta-only estimate against the skewed measurement, and (with
   --profile) the W / L issue model against Nsight Compute's counters;
6. writes chapters/02/results/<gpu>.json.

Without a GPU it compiles every configuration for sm_90a, prints the compile report and the
recorded H200 results, and exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    SEED,
    SEED_WORKLOADS,
    Requirement,
    Table,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    checks_table,
    describe_gpu,
    find,
    print_not_run,
    progress,
    records_table,
    run_checks,
    run_main,
    run_variants,
    save_results,
    show,
    show_recorded,
    timing_options,
)

CHAPTER = "02"
REQUIRES = Requirement(lambda capability: capability >= (8, 0),
                       "k1 needs sm_80 or newer (cp.async, ldmatrix, bf16 mma.sync)")
# The results file's top-level sections, as run_on_gpu's save_results writes them (profile: with --profile).
SECTIONS = frozenset({"provenance", "records", "ceilings", "checks", "compile_report", "seed_b300_reference",
                      "profile"})
ARCH = "sm_90a"  # what the no-GPU path compiles for: the recorded GPU's target
# The BM sweep, the fragment double-buffering experiment and the three-stage ring, by variant name.
SWEEP = ("k1/bm32", "k1/bm64", "k1/bm128", "k1/bm64-fragdb", "k1/bm32-s3", "k1/bm64-s3", "k1/bm128-s3")
WORKLOADS = SEED_WORKLOADS
PROFILE_WORKLOAD = SEED
OPCODE_LABELS = {"HMMA.16816.F32.BF16": "HMMA", "LDSM.16.M88.4": "LDSM", "LDSM.16.MT88.4": "LDSM.T",
                 "LDGSTS": "LDGSTS", "BAR.SYNC": "BAR"}
SEED_B300 = {  # the seed's B300 numbers (useful TFLOP/s), for reference only: never measured here
    "k1/bm128": {"16k s=0": 224.2, "2k s=0": 63.9},
    "k1/bm64": {"16k s=0": 245.0},
    "k1/bm32": {"16k s=0": 178.0, "2k s=0": 154.1},
    "k1/bm64-fragdb": {"16k s=0": 218.0},
}


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser)
    parser.add_argument("--profile", action="store_true",
                        help="also profile each k1 variant once with Nsight Compute at 16,384 rows, s=0 "
                             "(warps per scheduler, warp cycles per issued instruction, issue-active); needs ncu")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- variants

def sweep_variants() -> list:
    from moe_gemm.variants.registry import get

    return [get(name) for name in SWEEP]


# --------------------------------------------------------------------------- tables

def compile_table(rows: list[dict[str, Any]]) -> Table:
    opcodes = list(OPCODE_LABELS)
    headers = ("kernel", "regs", "regs/block", "smem KB", "spills", "blocks/SM", "limited by",
               *(OPCODE_LABELS[op] for op in opcodes))
    body = tuple((r["variant"], r["registers"], r["registers_per_block"], f"{r['smem_bytes'] / 1024:.1f}",
                  r["spill_bytes"], r["blocks_per_sm"], r["limiter"], *(r["sass"][op] for op in opcodes))
                 for r in rows)
    arch = rows[0]["arch"] if rows else ARCH
    return Table(headers, body, title=f"Compile report ({arch}, NVRTC)",
                 legend="regs: per thread (ptxas); blocks/SM: the occupancy model's; HMMA, LDSM (.T: transposed), "
                        "LDGSTS (cp.async), BAR: static SASS counts.")


def ceilings_table(ceilings: list[dict[str, Any]]) -> Table:
    rows = []
    for c in ceilings:
        value = f"{c['tbps']:.2f} TB/s" if "tbps" in c else f"{c['tflops']:.1f} TFLOP/s"
        rows.append((c["variant"], value))
    return Table(("ceiling", "measured"), tuple(rows), title="Ceilings measured in this run",
                 legend="copy: device-to-device, bytes read + written; dense_bf16: cuBLAS 8192^3; ffma and "
                        "mma_sync: register-only kernels on every SM.")


def model_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per k1 variant: resources and residency, and the eta-only estimate against each measurement."""
    from moe_gemm.model.occupancy import residency
    from moe_gemm.model.tiles import eta_estimate

    rows = []
    for name in SWEEP:
        balanced = find(records, name, "16k s=0")
        if balanced is None:
            continue
        fit = residency(balanced["registers"], balanced["warps_per_block"], balanced["smem_bytes"])
        row = {"variant": name, "registers": balanced["registers"], "smem_bytes": balanced["smem_bytes"],
               "blocks_per_sm": fit.blocks, "limiter": fit.limiter,
               "warps_per_scheduler": fit.blocks * balanced["warps_per_block"] / 4,
               "balanced_tflops": balanced["useful_tflops"], "balanced_eta": balanced["eta"]}
        for label, key in (("skewed", "16k s=1.2"), ("small", "2k s=0")):
            other = find(records, name, key)
            if other is not None:
                row[f"{label}_tflops"] = other["useful_tflops"]
                row[f"{label}_eta"] = other["eta"]
                row[f"{label}_estimate"] = eta_estimate(balanced["useful_tflops"], other["eta"], balanced["eta"])
        rows.append(row)
    return rows


def model_table(rows: list[dict[str, Any]]) -> Table:
    def cell(row: dict[str, Any], key: str, spec: str = ".1f") -> str:
        return format(row[key], spec) if key in row else "-"

    body = []
    for r in rows:
        ratio = f"{r['skewed_tflops'] / r['skewed_estimate']:.3f}" if "skewed_estimate" in r else "-"
        body.append((r["variant"], r["registers"], f"{r['smem_bytes'] / 1024:.1f}",
                     f"{r['blocks_per_sm']} ({r['limiter']})", f"{r['warps_per_scheduler']:g}",
                     cell(r, "balanced_tflops"), cell(r, "skewed_eta", ".3f"), cell(r, "skewed_estimate"),
                     cell(r, "skewed_tflops"), ratio, cell(r, "small_eta", ".3f"), cell(r, "small_tflops")))
    headers = ("variant", "regs", "smem KB", "blocks/SM (limit)", "warps/sched.", "16k s=0", "eta 16k s=1.2",
               "eta-only est.", "16k s=1.2", "measured/est.", "eta 2k", "2k s=0")
    return Table(headers, tuple(body), title="The model beside the measurements (useful TFLOP/s)",
                 legend="warps/sched.: resident warps per scheduler by the model; eta-only est. = T(16k, s=0) x "
                        "eta(s=1.2) / eta(s=0); measured/est. above 1: the estimate is pessimistic.")


def profile_table(profiles: list[dict[str, Any]], compile_rows: list[dict[str, Any]]) -> Table:
    """W from the occupancy model and from ncu, L from ncu, and W / L against measured issue-active."""
    predicted = {r["variant"]: r["blocks_per_sm"] * r["warps_per_block"] / 4 for r in compile_rows}

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    body = []
    for p in profiles:
        w, cycles, issue = p.get("warps_per_scheduler"), p.get("cycles_per_issue"), p.get("issue_active")
        model = p.get("issue_model")
        body.append((p["variant"], fmt(predicted.get(p["variant"]), "g"), fmt(w, ".2f"), fmt(cycles, ".2f"),
                     fmt(model, ".3f"), fmt(issue, ".3f"), fmt(None if model is None else 4 * model, ".2f"),
                     fmt(p.get("ipc"), ".2f"), fmt(None if p.get("instructions") is None else p["instructions"] / 1e6,
                                                  ".1f")))
    headers = ("variant", "W model", "W ncu", "L ncu", "W/L", "issue-active ncu", "4W/L", "IPC ncu", "M instr.")
    return Table(headers, tuple(body), title="Issue model against Nsight Compute (16k rows, s=0)",
                 legend="W: warps per scheduler; L: warp cycles per issued instruction; W/L: the model's issue "
                        "rate against ncu's issue-active; 4W/L against IPC; M instr.: millions issued.")


# --------------------------------------------------------------------------- GPU work

def run_profiles(variants) -> list[dict[str, Any]]:
    from moe_gemm.measure import profile

    profiles = []
    for variant in variants:
        progress(f"[ncu] {variant.name}")
        try:
            profiles.append(profile.profile_variant(variant.name, PROFILE_WORKLOAD.tokens, PROFILE_WORKLOAD.skew))
        except (FileNotFoundError, RuntimeError, OSError) as error:
            print(f"ncu could not profile {variant.name}: {error}", file=sys.stderr)
    return profiles


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.ceilings import basis_for, measure_ceilings
    from moe_gemm.variants.k1 import all_configs, compile_report
    from moe_gemm.variants.peer.torch import available_peers

    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch)
    show(compile_table(report))

    checks = run_checks(all_configs())
    show(checks_table(checks))
    failed = [c for c in checks if not c["passed"]]
    if failed:
        print(f"{len(failed)} check(s) FAILED; not timing anything.", file=sys.stderr)
        return 1

    ceilings = measure_ceilings()
    show(ceilings_table(ceilings))

    sweep = sweep_variants()
    variants = sweep + ([] if args.no_peers else available_peers())
    records = run_variants(variants, WORKLOADS, **timing)
    show(records_table(records, title="Every measurement", basis=basis_for(gpu)))
    show(model_table(model_rows(records)))

    extra: dict[str, Any] = {"ceilings": ceilings, "checks": checks, "compile_report": report,
                             "seed_b300_reference": SEED_B300}
    if args.profile:
        profiles = run_profiles(sweep)
        if profiles:
            show(profile_table(profiles, report))
        extra["profile"] = profiles
    path = save_results(CHAPTER, records, gpu, **extra)
    print(f"results written to {path}")
    return 0


# --------------------------------------------------------------------------- no GPU

def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "k1", reason, f"compiling every configuration for {ARCH} instead",
                  ("--quick", "--no-peers", "--profile"), "nothing is timed or profiled without a GPU")
    from moe_gemm.variants.k1 import compile_report

    show(compile_table(compile_report(ARCH)))
    if show_recorded(CHAPTER) != 0:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
