"""Chapter 04: k3, Hopper wgmma: warpgroups multiplying straight out of a TMA ring.

    python chapters/04/run.py               # checks, then the ladder beside k2 and torch._grouped_mm
    python chapters/04/run.py --quick       # fewer timed launches (5 warm-up, 20 timed)
    python chapters/04/run.py --profile     # also Nsight Compute on the two fastest rungs and two others
    python chapters/04/run.py --repeats 2   # time the fastest rungs and the peer again in 2 fresh processes
    python chapters/04/run.py --only k3/tmastore-bn192 k3/1wg-bn128   # a part of the ladder

With an sm_90a GPU (the recorded numbers come from an H200) it checks every rung of the k3 ladder
(kernels/k3_wgmma.cu) on the edge cases (exact, integer-valued inputs) and on random data, then
times the rungs that pass beside chapter 03's k2/s3 and torch._grouped_mm, the latter given B in
both layouts it accepts, at five workloads of the seed configuration (E=64, K=1024, N=2688):
16,384 and 65,536 rows at s=0 and s=1.2, and 2,048 rows. It prints the ladder, the targets against
the faster peer of the same run, and writes chapters/04/results/<gpu>.json.

Without one it compiles every rung for sm_90a, prints the compile report (registers, shared
memory, spills, blocks per SM, and the SASS instructions this chapter is about), then the
recorded H200 results, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    SEED,
    SEED_FIVE,
    SM90A,
    Table,
    Workload,
    add_timing_arguments,
    best_peer,
    chapter_main,
    chapter_parser,
    checks_table,
    compile_only,
    describe_gpu,
    failed_variants,
    find,
    grouped_mm_peers,
    progress,
    records_table,
    run_checks,
    run_main,
    run_variants,
    save_results,
    show,
    timing_options,
)
from moe_gemm.core.checks import MAX_REPEATS
from moe_gemm.core.cli import nonnegative_int

CHAPTER = "04"
REQUIRES = SM90A
# The results file's top-level sections, as run_on_gpu's save_results writes them (offline_transpose: where
# torch is installed; profile: with --profile; repeats and spread: with --repeats).
SECTIONS = frozenset({"provenance", "records", "ceilings", "checks", "compile_report", "targets", "ladder",
                      "offline_transpose", "profile", "repeats", "spread"})
ARCH = "sm_90a"
WORKLOADS = SEED_FIVE
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "USETMAXREG", "UCGABAR")
OPCODE_LABELS = {"UCGABAR": "CLUSTER BAR"}
K2_BEST = "k2/s3"  # chapter 03's fastest
# Nsight Compute looks at the fastest two rungs and at these two, which differ from the fastest
# BN = 192 rung by one step each: the register-direct epilogue, and B multicast.
PROFILE_ALSO = ("k3/persistent-bn192", "k3/multicast-tmastore-bn192")
REPEAT_WORKLOADS = (SEED, Workload(65536, 0.0))
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives consumers 232, the producer 40); smem: ring + "
                  "C staging + barriers; blocks/SM: the occupancy model's; the rest: static SASS counts (HGMMA = "
                  "wgmma, UTMALDG / UTMASTG = TMA load / store, STSM = stmatrix, SYNCS = mbarrier, CLUSTER BAR = "
                  "barrier.cluster)")
# useful-TFLOP/s ratio to the faster torch._grouped_mm layout, same run, that the best k3 must reach
TARGETS = {SEED: 1.05, Workload(16384, 1.2): 1.0, Workload(2048, 0.0): 1.1, Workload(65536, 0.0): 1.05,
           Workload(65536, 1.2): 1.0}


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._grouped_mm")
    parser.add_argument("--profile", action="store_true",
                        help="also run Nsight Compute on the two fastest rungs at 16,384 rows (tensor pipe, "
                             "DRAM throughput, L2 hit rate); needs ncu on PATH")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="time only these k3 variants (default: all)")
    parser.add_argument("--repeats", type=nonnegative_int("--repeats", MAX_REPEATS), default=0, metavar="N",
                        help="after the run, time the three fastest rungs and both peer layouts at 16,384 and "
                             "65,536 rows (s=0) again in N fresh processes: the run-to-run spread (default 0)")
    parser.add_argument("--repeat-child", metavar="NAMES", help=argparse.SUPPRESS)  # one repeat, JSON out
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- variants and workloads

def ladder(only: Sequence[str] | None = None) -> list:
    from moe_gemm.variants.k3 import K3Wgmma
    from moe_gemm.variants.k3.config import LADDER

    names = list(only) if only else list(LADDER)
    return [K3Wgmma(name) for name in names]


# --------------------------------------------------------------------------- tables

def ladder_table(records: Sequence[dict[str, Any]]) -> Table:
    peers_by_workload = {w: best_peer(records, w) for w in WORKLOADS}
    rows = []
    for name in dict.fromkeys(r["variant"] for r in records):
        cells = []
        for w in WORKLOADS:
            record, peer = find(records, name, w), peers_by_workload[w]
            if record is None:
                cells.append("-")
            elif peer is None:
                cells.append(f"{record['useful_tflops']:.1f}")
            else:
                cells.append(f"{record['useful_tflops']:.1f} ({record['useful_tflops'] / peer['useful_tflops']:.2f})")
        rows.append((name, *cells))
    headers = ("variant", *(w.short_label for w in WORKLOADS))
    return Table(headers, tuple(rows), title="The ladder: useful TFLOP/s (ratio to the faster torch._grouped_mm)",
                 legend="each cell: useful TFLOP/s (2 M_tot K N / median time) and, in brackets, its ratio to the "
                        "faster of the two torch._grouped_mm layouts on the same inputs")


def target_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload: the fastest k3, the faster peer, their ratio, and the target it must reach."""
    rows = []
    for w, target in TARGETS.items():
        k3 = [r for r in records if r["variant"].startswith("k3/") and w.matches(r)]
        peer = best_peer(records, w)
        if not k3 or peer is None:
            continue
        best = max(k3, key=lambda r: r["useful_tflops"])
        ratio = best["useful_tflops"] / peer["useful_tflops"]
        rows.append({"tokens": w.tokens, "skew": w.skew, "variant": best["variant"], "tflops": best["useful_tflops"],
                     "peer": peer["variant"], "peer_tflops": peer["useful_tflops"], "ratio": ratio,
                     "target": target, "met": ratio >= target})
    return rows


def targets_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((f"{r['tokens']:,} rows, s={r['skew']:g}", r["variant"], f"{r['tflops']:.1f}",
                  f"{r['peer_tflops']:.1f}", f"{r['ratio']:.3f}", f"{r['target']:.2f}", "yes" if r["met"] else "NO")
                 for r in rows)
    return Table(("workload", "fastest k3", "TFLOP/s", "peer TFLOP/s", "ratio", "target", "met"), body,
                 title="Targets: the fastest k3 against the faster torch._grouped_mm layout, same run",
                 legend="ratio: fastest k3 over the faster peer; target: the ratio chapter 04 set out to reach")


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    from moe_gemm.site.compile_report import compile_rows

    return compile_rows(ladder(only), arch, OPCODES)


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    """The compile report as this chapter prints it and as its page shows it (figures.py)."""
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, OPCODE_LABELS, legend=COMPILE_LEGEND)


def run_without_gpu(args, reason: str) -> int:
    return compile_only(args, CHAPTER, "k3", reason, ("--quick", "--no-peers", "--profile", "--repeats"),
                        compile_report_table(compile_report(ARCH, args.only)),
                        why="nothing is timed or profiled without an sm_90a GPU")


# --------------------------------------------------------------------------- with a GPU

def transpose_timing() -> dict[str, Any] | None:
    """The offline weight-layout step the -kmajor rungs assume: B [E, K, N] -> B^T [E, N, K] on the GPU."""
    try:
        import torch
    except ImportError:
        return None
    from moe_gemm.cuda.device import cuda_device, stream_handle
    from moe_gemm.cuda.timing import time_launches

    cuda_device()
    with torch.cuda.stream(torch.cuda.ExternalStream(stream_handle())):
        b = torch.randn(SEED.experts, SEED.K, SEED.N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(SEED.experts, SEED.N, SEED.K, device="cuda", dtype=torch.bfloat16)
        result = time_launches(lambda _: out.copy_(b.transpose(1, 2)), warmup=5, iterations=20)
    return {"variant": "offline/transpose_b", "experts": SEED.experts, "K": SEED.K, "N": SEED.N,
            "median_ms": result.median_ms,
            "min_ms": result.min_ms, "max_ms": result.max_ms, "bytes": 2 * b.numel() * 2}


def fastest_rungs(records: Sequence[dict[str, Any]], count: int) -> list[str]:
    k3 = sorted((r for r in records if r["variant"].startswith("k3/") and SEED.matches(r)),
                key=lambda r: -r["useful_tflops"])
    return [r["variant"] for r in k3[:count]]


def profile_rungs(names: Sequence[str]) -> list[dict[str, Any]]:
    from moe_gemm.measure import profile

    rows = []
    for name in dict.fromkeys(names):
        progress(f"[profile] {name} under ncu")
        rows.append(profile.profile_variant(name, SEED.tokens, SEED.skew))
    return rows


def repeat_child(names: str) -> int:
    """One repeat: the named variants and both peers at REPEAT_WORKLOADS, records as JSON on stdout."""
    from moe_gemm.variants.registry import get

    variants = [get(name) for name in names.split(",")] + grouped_mm_peers()
    records = run_variants(variants, REPEAT_WORKLOADS)
    print(json.dumps(records))
    return 0


def repeats(names: Sequence[str], count: int) -> list[dict[str, Any]]:
    """``count`` more timings of ``names`` and the peers, each in a fresh process (new allocations,
    new CUDA context): what one run's numbers would look like if it were made again."""
    runs = []
    for repeat in range(1, count + 1):
        progress(f"[repeat {repeat}/{count}] {', '.join(names)} and the peers, in a fresh process")
        proc = subprocess.run([sys.executable, __file__, "--repeat-child", ",".join(names)], capture_output=True,
                              text=True, check=True)
        runs.append({"repeat": repeat, "records": json.loads(proc.stdout.strip().splitlines()[-1])})
    return runs


def profile_table(rows: Sequence[dict[str, Any]]) -> Table:
    def get(row, key, spec):
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    body = tuple((r["variant"], get(r, "gmma_pipe_pct", ".1f"), get(r, "tensor_pipe_pct", ".1f"),
                  get(r, "dram_throughput_pct", ".1f"), get(r, "l2_hit_pct", ".1f"),
                  get(r, "achieved_warps_per_sm", ".1f"), get(r, "stall_gmma", ".2f"),
                  get(r, "stall_long_scoreboard", ".2f"), get(r, "stall_barrier", ".2f")) for r in rows)
    return Table(("variant", "HGMMA pipe %", "tensor pipe %", "DRAM %", "L2 hit %", "warps/SM", "stall gmma",
                  "stall long sb", "stall barrier"), body,
                 title="Nsight Compute, 16,384 rows, s=0 (one profiled launch each)",
                 legend="HGMMA pipe %: tensor pipe busy with wgmma, of peak; DRAM %: of peak bandwidth; stalls: "
                        "cycles per issued instruction")


def spread_rows(records: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and repeated variant: useful TFLOP/s and the ratio to the faster peer of the same
    process, min and max over the main run and the repeats."""
    every = [list(records)] + [run["records"] for run in runs]
    rows = []
    for w in REPEAT_WORKLOADS:
        for name in (r["variant"] for r in runs[0]["records"] if w.matches(r)):
            tflops, ratios = [], []
            for recs in every:
                record, peer = find(recs, name, w), best_peer(recs, w)
                if record is not None and peer is not None:
                    tflops.append(record["useful_tflops"])
                    ratios.append(record["useful_tflops"] / peer["useful_tflops"])
            rows.append({"tokens": w.tokens, "skew": w.skew, "variant": name, "runs": len(tflops),
                         "min_tflops": min(tflops), "max_tflops": max(tflops),
                         "min_ratio": min(ratios), "max_ratio": max(ratios)})
    return rows


def spread_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((f"{r['tokens']:,} rows, s={r['skew']:g}", r["variant"], r["runs"],
                  f"{r['min_tflops']:.1f}-{r['max_tflops']:.1f}", f"{r['min_ratio']:.3f}-{r['max_ratio']:.3f}")
                 for r in rows)
    return Table(("workload", "variant", "runs", "TFLOP/s", "ratio"), body,
                 title="Run-to-run spread: the same kernels timed in fresh processes",
                 legend="min-max over this run and the repeats; ratio: to the faster peer of the same process")


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.ceilings import basis_for, roofline_ceilings
    from moe_gemm.variants.registry import get

    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch, args.only)
    show(compile_report_table(report))

    variants = ladder(args.only)
    checks = run_checks(variants)
    show(checks_table(checks))
    failed = failed_variants(checks)
    if failed:
        print(f"checks FAILED for {', '.join(failed)}: those are not timed.", file=sys.stderr)
    passing = [v for v in variants if v.name not in failed]

    progress("[ceilings] device copy and cuBLAS bf16")
    ceilings = roofline_ceilings()
    timed = passing + [get(K2_BEST)] + ([] if args.no_peers else grouped_mm_peers())
    records = run_variants(timed, WORKLOADS, **timing)
    show(records_table(records, title="Every measurement", basis=basis_for(gpu)))
    show(ladder_table(records))
    targets = target_rows(records)
    show(targets_table(targets))

    extra: dict[str, Any] = {"checks": checks, "compile_report": report, "targets": targets,
                             "ladder": {v.name: vars(v.config) for v in variants}}
    transpose = transpose_timing()
    if transpose is not None:
        extra["offline_transpose"] = transpose
        print(f"offline layout step, B [E, K, N] -> B^T [E, N, K] at the seed shape: {transpose['median_ms']:.3f} ms "
              f"(median; a one-time cost per weight update, not per forward pass)\n")
    if args.profile:
        extra["profile"] = profile_rungs([*fastest_rungs(records, 2), *PROFILE_ALSO])
        show(profile_table(extra["profile"]))
    if args.repeats:
        extra["repeats"] = repeats(fastest_rungs(records, 3), args.repeats)
        extra["spread"] = spread_rows(records, extra["repeats"])
        show(spread_table(extra["spread"]))
    path = save_results(CHAPTER, records, gpu, ceilings=ceilings, **extra)
    print(f"results written to {path}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.repeat_child:  # one of run_on_gpu's --repeats, in this fresh process: records as JSON, nothing else
        return repeat_child(args.repeat_child)
    return chapter_main(args, REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
