"""Chapter 03: k2, a TMA producer warp feeding eight mma.sync warps through an mbarrier ring.

    python chapters/03/run.py               # checks, then k0 -> k1 -> k2 beside torch._grouped_mm
    python chapters/03/run.py --quick       # fewer timed launches (5 warm-up, 20 timed)
    python chapters/03/run.py --no-peers    # without torch._grouped_mm and the torch loop
    python chapters/03/run.py --profile     # also Nsight Compute's occupancy counters for k2

With an sm_90 GPU (the recorded numbers come from an H200) it first checks every STAGES
configuration of k2 on the edge cases of moe_gemm.model.edge_cases (exact, integer-valued inputs) and on
random data, then times the best variant of each chapter so far, k0, k1 and k2 with STAGES = 2, 3
and 4, beside torch._grouped_mm (CUTLASS) at the seed configuration (E=64, K=1024, N=2688;
16,384 rows at s=0 and s=1.2, and 2,048 rows), prints the progression and the STAGES table with
the occupancy model's reading and the eta-only estimate for s=1.2, and writes
chapters/03/results/<gpu>.json.

Without a GPU it compiles the chapter's kernels for sm_90a, prints their compile report
(registers, shared memory, spills, blocks per SM from the occupancy model, and the SASS
instructions this chapter is about), then the recorded H200 results, and exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    PEER,
    SEED,
    SEED_WORKLOADS,
    Requirement,
    Table,
    Workload,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    checks_table,
    describe_gpu,
    find,
    print_not_run,
    progress,
    recorded,
    records_table,
    run_checks,
    run_main,
    run_variants,
    save_results,
    show,
    show_recorded,
    timing_options,
)
from moe_gemm.model.occupancy import residency
from moe_gemm.model.tiles import eta_estimate
from moe_gemm.site.compile_report import compile_rows, limiters

CHAPTER = "03"
REQUIRES = Requirement(lambda capability: capability >= (9, 0),
                       "k2 needs sm_90 or newer (TMA and mbarrier transaction counts)")
# The results file's top-level sections, as run_on_gpu's save_results writes them (profile: with --profile).
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report", "stages", "seed_b300_reference", "profile"})
ARCH = "sm_90a"
WORKLOADS = SEED_WORKLOADS
OPCODES = ("UTMALDG", "SYNCS", "HMMA.16816.F32.BF16", "LDSM", "LDGSTS", "BAR.SYNC")
OPCODE_LABELS = {"HMMA.16816.F32.BF16": "HMMA", "BAR.SYNC": "BAR"}
COMPILE_LEGEND = ("regs: per thread (ptxas); warps: per block; blocks/SM: the occupancy model's; UTMALDG (TMA), "
                  "SYNCS (mbarrier), HMMA, LDSM, LDGSTS (cp.async), BAR: static SASS counts.")
K1_DEFAULT = "k1/bm64"  # chapter 02's best at 16,384 rows unless its recorded results say otherwise
SEED_B300 = {  # the seed's B300 numbers, useful TFLOP/s, for reference only (never measured here)
    "k2/S2": {"16k s=0": 440.1, "16k s=1.2": 357.0, "2k s=0": 111.1},
    "k2/S3": {"16k s=0": 393.4},
}


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser)
    parser.add_argument("--profile", action="store_true",
                        help="also run Nsight Compute on each k2 STAGES (occupancy limits and achieved warps); "
                             "needs ncu on PATH")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- variants

def k2_variants():
    from moe_gemm.variants.k2 import all_stages

    return all_stages()


def best_k1_name() -> str:
    """Chapter 02's fastest k1 at 16,384 balanced rows, from its recorded results; BM=64 if none."""
    data = recorded("02")
    records = [r for r in (data["records"] if data else []) if r["variant"].startswith("k1/") and SEED.matches(r)]
    return max(records, key=lambda r: r["useful_tflops"])["variant"] if records else K1_DEFAULT


def k1_variant(name: str):
    """'k1/bm64', 'k1/bm64-s3', ... -> chapter 02's variant object, through the variant registry."""
    from moe_gemm.variants.registry import get

    return get(name)


def progression_variants(with_peers: bool) -> list:
    from moe_gemm.variants.k0 import runnable_k0

    variants = [*runnable_k0(), k1_variant(best_k1_name()), *k2_variants()]  # k0: unless numba-cuda cannot
    if with_peers:
        from moe_gemm.variants.peer.torch import available_peers

        variants += list(available_peers())
    return variants


# --------------------------------------------------------------------------- compile report

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    """Registers, shared memory, spills, blocks per SM and SASS counts of the chapter's kernels: the k1
    that the progression times (chapter 02's fastest) and every STAGES of k2."""
    return compile_rows([k1_variant(best_k1_name()), *k2_variants()], arch, OPCODES)


def compile_table(rows: list[dict[str, Any]]) -> Table:
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, OPCODE_LABELS, legend=COMPILE_LEGEND)


# --------------------------------------------------------------------------- tables from records

def progression_table(records: list[dict[str, Any]]) -> Table:
    """Useful TFLOP/s per variant and workload, with the speed-up over k0 and the ratio to the peer."""
    keys = list(dict.fromkeys(Workload.of(r).short_label for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    first = keys[0] if keys else ""
    k0 = find(records, "k0", first)
    peer = find(records, PEER, first)
    rows = []
    for variant in variants:
        cells = []
        for key in keys:
            record = find(records, variant, key)
            cells.append("-" if record is None else f"{record['useful_tflops']:.1f}")
        this = find(records, variant, first)
        over_k0 = f"{this['useful_tflops'] / k0['useful_tflops']:.1f}x" if this and k0 else "-"
        vs_peer = f"{this['useful_tflops'] / peer['useful_tflops']:.2f}" if this and peer else "-"
        rows.append((variant, *cells, over_k0, vs_peer))
    headers = ("variant", *(f"{k} TFLOP/s" for k in keys), f"x k0 ({first})", f"vs peer ({first})")
    return Table(headers, tuple(rows), title="Progression: useful TFLOP/s (median of the timed launches)",
                 legend=f"x k0: speed-up over k0 at {first}; vs peer: over torch._grouped_mm on the same inputs "
                        "in the same run.")


def stages_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per k2 STAGES: resources, the model's blocks per SM, the measurements and the eta-only estimates."""
    rows = []
    for record in records:
        if not record["variant"].startswith("k2/") or Workload.of(record).short_label != "16k s=0":
            continue
        name = record["variant"]
        fit = residency(record["registers"], record["warps_per_block"], record["smem_bytes"])
        skewed, small = find(records, name, "16k s=1.2"), find(records, name, "2k s=0")
        row = {"variant": name, "registers": record["registers"], "smem_bytes": record["smem_bytes"],
               "blocks_per_sm": fit.blocks, "limiter": limiters(fit), "balanced_tflops": record["useful_tflops"],
               "balanced_eta": record["eta"]}
        for label, other in (("skewed", skewed), ("small", small)):
            if other is not None:
                row[f"{label}_tflops"] = other["useful_tflops"]
                row[f"{label}_eta"] = other["eta"]
                row[f"{label}_estimate"] = eta_estimate(record["useful_tflops"], other["eta"], record["eta"])
        rows.append(row)
    return rows


def stages_table(rows: list[dict[str, Any]]) -> Table:
    def cell(row, key, spec=".1f"):
        return format(row[key], spec) if key in row else "-"

    body = []
    for r in rows:
        ratio = f"{r['skewed_tflops'] / r['skewed_estimate']:.3f}" if "skewed_estimate" in r else "-"
        body.append((r["variant"], r["registers"], f"{r['smem_bytes'] / 1024:.1f}",
                     f"{r['blocks_per_sm']} ({r['limiter']})", cell(r, "balanced_tflops"),
                     cell(r, "skewed_tflops"), cell(r, "skewed_estimate"), ratio,
                     cell(r, "small_tflops"), cell(r, "small_estimate")))
    headers = ("variant", "regs", "smem KB", "blocks/SM (limit)", "16k s=0", "16k s=1.2", "eta-only est.",
               "measured/est.", "2k s=0", "eta-only est. 2k")
    return Table(headers, tuple(body), title="STAGES: resources, residency and useful TFLOP/s",
                 legend="blocks/SM: the occupancy model's, and what limits it; eta-only est. = T(16k, s=0) x eta / "
                        "eta(16k, s=0); measured/est. above 1: the estimate is pessimistic.")


# --------------------------------------------------------------------------- no GPU

def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "k2", reason, f"compiling the chapter's kernels for {ARCH} instead",
                  ("--quick", "--no-peers", "--profile"), "nothing is timed or profiled without an sm_90 GPU")
    show(compile_table(compile_report()))
    if show_recorded(CHAPTER) != 0:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    return 0


# --------------------------------------------------------------------------- with a GPU

def run_on_gpu(args, gpu) -> int:
    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")

    report = compile_report(gpu.arch)
    show(compile_table(report))

    checks = run_checks(k2_variants())
    show(checks_table(checks))
    failed = [c for c in checks if not c["passed"]]
    if failed:
        print(f"{len(failed)} check(s) FAILED; not timing anything.", file=sys.stderr)
        return 1

    variants = progression_variants(with_peers=not args.no_peers)
    records = run_variants(variants, WORKLOADS, **timing)
    show(records_table(records, title="Every measurement"))
    show(progression_table(records))
    stages = stages_rows(records)
    show(stages_table(stages))

    extra: dict[str, Any] = {"checks": checks, "compile_report": report, "stages": stages,
                             "seed_b300_reference": SEED_B300}
    if args.profile:
        extra["profile"] = profile_k2()
        show(occupancy_table(extra["profile"], report))
    path = save_results(CHAPTER, records, gpu, **extra)
    print(f"results written to {path}")
    return 0


def profile_k2() -> list[dict[str, Any]]:
    """Nsight Compute's occupancy limits, achieved warps and scheduler counters for each k2 STAGES
    at 16,384 balanced rows (one profiled launch each, in a subprocess under ncu)."""
    from moe_gemm.measure import profile

    rows = []
    for variant in k2_variants():
        progress(f"[profile] {variant.name} under ncu")
        rows.append(profile.occupancy(variant.name, SEED.tokens, SEED.skew))
    return rows


def occupancy_table(profile: list[dict[str, Any]], report: list[dict[str, Any]]) -> Table:
    """The occupancy model (from the compiler's registers and shared memory) against ncu."""
    model = {r["variant"]: r for r in report}

    def get(row, key, spec):
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    body = []
    for row in profile:
        m = model.get(row["variant"], {})
        blocks = m.get("blocks_per_sm")
        body.append((row["variant"], m.get("registers", "-"), get(row, "registers_per_thread", ".0f"),
                     m.get("by_registers", "-"), get(row, "occupancy_limit_registers", ".0f"),
                     m.get("by_smem", "-"), get(row, "occupancy_limit_shared_mem", ".0f"),
                     "-" if blocks is None else blocks * m["warps_per_block"],
                     get(row, "achieved_warps_per_sm", ".2f"), get(row, "warps_per_scheduler", ".2f"),
                     get(row, "cycles_per_issue", ".2f"), get(row, "issue_active", ".3f"),
                     get(row, "issue_model", ".3f"), get(row, "tensor_pipe_pct", ".1f")))
    headers = ("variant", "regs", "regs (ncu)", "blocks by regs", "(ncu)", "blocks by smem", "(ncu)",
               "warps/SM (model)", "achieved warps/SM (ncu)", "W", "L", "issue active", "W/L", "tensor pipe %")
    return Table(headers, tuple(body), title="Occupancy model against Nsight Compute, 16,384 rows, s=0",
                 legend="(ncu): Nsight Compute's value beside the model's; W: warps per scheduler; L: warp cycles "
                        "per issued instruction; W/L: the model's issue rate against ncu's issue active.")


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
