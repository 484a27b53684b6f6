"""Chapter 07: the last mile: k6 against quack's autotuned varlen-M GEMM.

    python chapters/07/run.py                 # checks, the ladder, the grid, the model shapes
    python chapters/07/run.py --quick         # fewer timed launches per round
    python chapters/07/run.py --parts ladder  # only some parts: ladder, grid, models
    python chapters/07/run.py --profile       # also Nsight Compute on k6/auto, a rung per ladder step, k3 and quack

With an sm_90a GPU (the recorded numbers come from an H200) it checks every rung of k6
(kernels/k6_persistent.cu) and k6/auto on the edge cases (exact, integer-valued inputs) and on
random data (with the ladder part), then checks and times, in interleaved rounds on the same inputs:
  ladder  every rung, k6/auto on the device walk and on the host list, chapter 04's and 06's
          fastest kernels, torch._grouped_mm (both B layouts) and quack (its autotuned pick and its
          three fastest configurations) at the seed five;
  grid    k6/auto and the peers on chapter 06's 25 cells (M_tot 512 .. 65,536 x s 0 .. 1.6), at
          2,048 rows and fewer also as CUDA-graph replays;
  models  k6/auto and the peers at four MoE projections of real models (E 8 .. 256).
It prints each table, the targets, and writes chapters/07/results/<gpu>.json after each part, keeping
the records of the parts it did not run from the file it finds (so the parts can run as separate
processes). quack is optional: without it (pip install quack-kernels; see the README) the chapter says
so and times the rest.

Without a GPU it compiles every rung for sm_90a, prints the compile report and the recorded H200
results, and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_SKEWS,
    GRID_TOKENS,
    MODEL_PROJECTIONS,
    PEERS,
    SEED_FIVE,
    SM90A,
    Table,
    Workload,
    add_timing_arguments,
    best_of,
    best_ratio,
    chapter_main,
    chapter_parser,
    checks_table,
    describe_gpu,
    failed_variants,
    find,
    grid,
    grouped_mm_peers,
    print_not_run,
    progress,
    run_checks,
    run_main,
    run_variants,
    show,
    show_recorded,
    targets_table,
    timing_options,
)
from moe_gemm.core.checks import MAX_REPEATS, MAX_ROWS
from moe_gemm.core.cli import positive_int
from moe_gemm.variants.peer.quack import QUACK_PEERS

CHAPTER = "07"
REQUIRES = SM90A
ARCH = "sm_90a"
AUTO, AUTO_HOST = "k6/auto", "k6/auto-host"
EARLIER = ("k3/tmastore-bn192", "k5/host", "k5/device")  # chapters 04 and 06 at their best
TORCH = PEERS  # torch._grouped_mm in both B layouts: the faster one counts
QUACK = QUACK_PEERS  # quack's autotuned pick and its three fastest configurations: the fastest counts
GRAPH_MAX_TOKENS = 2048  # cells this small are also timed as CUDA-graph replays, and judged on them
PARTS = ("ladder", "grid", "models")
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "USETMAXREG", "UCGABAR")
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives the consumers 232, the producer 40); smem: "
                  "ring + C staging + barriers (+ the device walk's 2 KB); the rest: static SASS counts (HGMMA = "
                  "wgmma, UTMALDG / UTMASTG = TMA load / store, multicast loads included, STSM = stmatrix, SYNCS = "
                  "mbarrier, UCGABAR = cluster barrier)")
# What --profile puts under Nsight Compute, cell by cell: at 65,536 balanced rows one rung per step of
# the ladder ((a) ping-pong, (b) the N pair, the M pair, (c) 256-row tiles, (d) the raster group, whose
# DRAM and L2 bytes set beside (b)'s are its before and after), chapter 04's k3 and quack; at 16,384
# rows, where quack's configuration is our M pair, k6/auto, that rung and quack.
PROFILED = {
    Workload(65536, 0.0): ("k6/auto", "k6/pingpong-bn192", "k6/pingpong-cluster-bn192", "k6/pingpong-mcluster-bn192",
                           "k6/coop256-cluster-bn128", "k6/pingpong-cluster-bn192-g8", "k3/tmastore-bn192",
                           "peer/quack"),
    Workload(16384, 0.0): ("k6/auto", "k6/pingpong-mcluster-bn192", "peer/quack"),
}
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report", "targets", "rounds", "parts", "part_runs",
                      "profile"})
TARGETS_LEGEND = ("ratios of useful TFLOP/s (graph replays at 2,048 rows and fewer), except the device walk's "
                  "relative extra time over the host list with the same configuration")


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._grouped_mm and quack")
    parser.add_argument("--rounds", type=positive_int("--rounds", MAX_REPEATS), default=3,
                        help="interleaved timing rounds per workload; each variant's median over rounds is kept "
                             "(default 3)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which measurements to make (default: all three)")
    parser.add_argument("--tokens", type=positive_int("--tokens", MAX_ROWS), nargs="+", default=list(GRID_TOKENS),
                        metavar="M",
                        help=f"the grid's M_tot values (default {' '.join(map(str, GRID_TOKENS))})")
    parser.add_argument("--profile", action="store_true",
                        help="also Nsight Compute on k6/auto, a rung per ladder step, k3 and quack at 65,536 rows, "
                             "s=0, and on k6/auto, the M-paired rung and quack at 16,384 rows")
    return parser.parse_args(argv)


def ladder_names() -> list[str]:
    from moe_gemm.variants.k6.config import LADDER

    return list(LADDER)


# --------------------------------------------------------------------------- lookups

def part_of(workload: Workload) -> str:
    """The part that measures ``workload`` for the grid's and the model shapes' tables and targets: a
    ratio compares records of one part only (one process: the same inputs, the same run, the same
    k6/auto rule), never one part's k6/auto with another part's quack. The seed five are grid cells
    too; the ladder's own tables pass ``part="ladder"``."""
    return "models" if workload in MODEL_PROJECTIONS.values() else "grid"


def of_part(records: Sequence[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("part") == part]


def judged(names: Sequence[str], workload: Workload) -> list[str]:
    """The names a target compares at ``workload``: their graph replays at the small cells."""
    from moe_gemm.measure.graph_replay import graph_name

    return [graph_name(n) for n in names] if workload.tokens <= GRAPH_MAX_TOKENS else list(names)


def ratio(records: Sequence[dict[str, Any]], name: str, peers: Sequence[str], workload: Workload,
          part: str | None = None) -> float | None:
    """``name``'s useful TFLOP/s over the best of ``peers`` at ``workload``, both judged the same way and
    both from one part's records (``part``, else :func:`part_of` the workload)."""
    return best_ratio(of_part(records, part or part_of(workload)), judged([name], workload), judged(peers, workload),
                      workload)


# --------------------------------------------------------------------------- tables

def ladder_table(records: Sequence[dict[str, Any]], names: Sequence[str], basis) -> Table:
    records = of_part(records, "ladder")
    cells = [w for w in SEED_FIVE if any(find(records, n, w) for n in names)]
    rows = []
    for name in names:
        row = [name]
        for cell in cells:
            record = find(records, name, cell)
            row.append("-" if record is None else f"{record['useful_tflops']:.0f}")
        big = find(records, name, SEED_FIVE[3])
        row.append("-" if big is None else f"{100 * big['useful_tflops'] / basis.tflops(SEED_FIVE[3]):.0f}%")
        rows.append(tuple(row))
    for label, peers in (("/ quack", QUACK), ("/ torch", TORCH)):
        rows.append((f"{AUTO} {label}", *(_fmt(ratio(records, AUTO, peers, c, "ladder")) for c in cells), ""))
    return Table(("variant", *(c.short_label for c in cells), "roof 64k"), tuple(rows),
                 title="The ladder at the seed five: useful TFLOP/s",
                 legend="eager launches, median of the rounds' medians; roof 64k: share of the roofline at 65,536 "
                        "rows, s=0; the last rows: k6/auto over the best quack configuration and the faster "
                        "torch._grouped_mm layout (graph replays at 2,048 rows)")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def grid_table(records: Sequence[dict[str, Any]], peers: Sequence[str], label: str) -> Table:
    tokens = list(dict.fromkeys(c.tokens for c in grid()))
    rows = [(f"{t:,}", *(_fmt(ratio(records, AUTO, peers, Workload(t, s))) for s in GRID_SKEWS)) for t in tokens]
    return Table(("M_tot", *(f"s={s:g}" for s in GRID_SKEWS)), tuple(rows), title=f"k6/auto over {label}",
                 legend=f"useful TFLOP/s over the best of {label} on the same inputs in the same run; at "
                        f"{GRAPH_MAX_TOKENS:,} rows and fewer, both timed as CUDA-graph replays")


def models_table(records: Sequence[dict[str, Any]]) -> Table:
    rows = []
    records = of_part(records, "models")
    for label, w in MODEL_PROJECTIONS.items():
        auto, quack, torch = (best_of(records, names, w) for names in ([AUTO], QUACK, TORCH))
        if auto is None:
            continue
        rows.append((label, f"E={w.experts} K={w.K} N={w.N}", f"{auto['useful_tflops']:.0f}",
                     "-" if quack is None else f"{quack['useful_tflops']:.0f}",
                     "-" if torch is None else f"{torch['useful_tflops']:.0f}",
                     _fmt(ratio(records, AUTO, QUACK, w)), _fmt(ratio(records, AUTO, TORCH, w)),
                     auto.get("choice", "")))
    return Table(("projection", "shape", "k6/auto", "quack", "torch", "/ quack", "/ torch", "k6/auto chose"),
                 tuple(rows), title="Model shapes: useful TFLOP/s (32,768 routed rows, s=0.4)",
                 legend="quack: its best of the autotuned pick and three fastest configurations; torch: the faster "
                        "B layout of torch._grouped_mm")


# --------------------------------------------------------------------------- targets

def target_rows(records: Sequence[dict[str, Any]], profile: Sequence[dict[str, Any]] = (),
                compiled: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The issue's targets from the timed records, and, where the run has them, the profiler's (the
    wgmma pipe of k6/auto at 65,536 balanced rows) and the compile report's (no spills)."""
    rows = []

    def add(name: str, value: float | None, goal: float, at_most: bool = False) -> None:
        if value is not None:
            rows.append({"target": name, "value": value, "goal": goal, "at_most": at_most,
                         "met": value <= goal if at_most else value >= goal})

    def measured(peers: Sequence[str], cells: Sequence[Workload]) -> dict[Workload, float]:
        return {w: v for w in dict.fromkeys(cells) if (v := ratio(records, AUTO, peers, w)) is not None}

    everywhere = measured(QUACK, (*grid(), *MODEL_PROJECTIONS.values()))
    if everywhere:
        worst = min(everywhere, key=everywhere.get)
        add(f"k6/auto / quack, every cell and model shape (worst: {worst.label})", everywhere[worst], 1.0)
    for w in (Workload(16384, 1.2), Workload(65536, 1.2), *(Workload(512, s) for s in GRID_SKEWS)):
        add(f"k6/auto / quack at {w.label}", ratio(records, AUTO, QUACK, w), 1.10)
    large = measured(TORCH, [w for w in (*grid(), *MODEL_PROJECTIONS.values()) if w.tokens >= 4096])
    if large:
        worst = min(large, key=large.get)
        add(f"k6/auto / torch, 4,096 rows or more (worst: {worst.label})", large[worst], 1.25)
    ladder = of_part(records, "ladder")  # k6/auto-host is timed only there
    for w in SEED_FIVE:
        device, host = find(ladder, AUTO, w), find(ladder, AUTO_HOST, w)
        if device and host:
            add(f"k6/auto time over k6/auto-host at {w.label}", device["median_ms"] / host["median_ms"] - 1, 0.02,
                at_most=True)
    pipe = next((p["gmma_pipe_pct"] for p in profile if p["variant"] == AUTO and Workload(65536, 0.0).matches(p)), None)
    add("k6/auto's wgmma pipe active at 65,536 rows, s=0 (Nsight Compute), %", pipe, 95.0)
    if compiled:
        add("spilled bytes, every rung (compile report)", max(r["spill_bytes"] for r in compiled), 0, at_most=True)
    return rows


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    from moe_gemm.site.compile_report import compile_rows
    from moe_gemm.variants.k6 import ladder

    return compile_rows(ladder(), arch, OPCODES)


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, {}, legend=COMPILE_LEGEND)


def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "k6", reason, f"compiling every rung for {ARCH} instead",
                  ("--quick", "--no-peers", "--rounds", "--parts", "--profile"),
                  "nothing is timed without an sm_90a GPU")
    show(compile_report_table(compile_report(ARCH)))
    if show_recorded(CHAPTER) != 0:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    return 0


# --------------------------------------------------------------------------- with a GPU

def peers(args, graphs: bool) -> list[Any]:
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.variants.peer.quack import quack_available, quack_peers

    if args.no_peers:
        return []
    found = grouped_mm_peers() + quack_peers()
    missing = quack_available()
    if missing is not None:
        progress(f"[peers] quack is not here ({missing}): timing without it")
    return found + ([GraphReplay(p) for p in found] if graphs else [])


def measure_part(part: str, args, timing: dict[str, int]) -> list[dict[str, Any]]:
    """One part's records, each tagged with the part (a later run of one part replaces only its own)."""
    return [{**r, "part": part} for r in _measure(part, args, timing)]


def _measure(part: str, args, timing: dict[str, int]) -> list[dict[str, Any]]:
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.variants.registry import get

    auto = get(AUTO)
    if part == "ladder":
        from moe_gemm.variants.k6.config import LADDER

        ours = [get(n) for n in (*LADDER, AUTO, AUTO_HOST, *EARLIER)] + [GraphReplay(auto)]
        return run_variants(ours + peers(args, graphs=True), SEED_FIVE, rounds=args.rounds, **timing)
    if part == "grid":
        small = [w for w in grid(args.tokens) if w.tokens <= GRAPH_MAX_TOKENS]
        large = [w for w in grid(args.tokens) if w.tokens > GRAPH_MAX_TOKENS]
        return (run_variants([auto, GraphReplay(auto), *peers(args, graphs=True)], small, rounds=args.rounds, **timing)
                + run_variants([auto, *peers(args, graphs=False)], large, rounds=args.rounds, **timing))
    return run_variants([auto, *peers(args, graphs=False)], list(MODEL_PROJECTIONS.values()), rounds=args.rounds,
                        **timing)


def profile_rows() -> list[dict[str, Any]]:
    from moe_gemm.measure import profile

    rows = []
    for cell, names in PROFILED.items():
        for name in names:
            progress(f"[profile] {name} at {cell.label} under ncu")
            try:
                rows.append(profile.profile_variant(name, cell.tokens, cell.skew, profiler_range=True))
            except (RuntimeError, ValueError) as error:
                progress(f"[profile] {name}: no profile ({str(error).splitlines()[0]})")
    return rows


def profile_table(rows: Sequence[dict[str, Any]]) -> Table:
    def pct(row, key):
        value = row.get(key)
        return "-" if value is None else f"{value:.1f}"

    body = tuple((r["variant"], Workload.of(r).short_label, pct(r, "gmma_pipe_pct"), pct(r, "l2_throughput_pct"),
                  "-" if r.get("l2_bytes") is None else f"{r['l2_bytes'] / 1e9:.2f}",
                  "-" if r.get("dram_bytes_read") is None else f"{r['dram_bytes_read'] / 1e9:.2f}",
                  pct(r, "stall_barrier"), pct(r, "stall_long_scoreboard"),
                  "-" if r.get("duration_ns") is None else f"{r['duration_ns'] / 1e3:.1f}") for r in rows)
    return Table(("variant", "cell", "wgmma %", "L2 %", "L2 GB", "DRAM rd GB", "bar stall", "lsb stall", "us"), body,
                 title="Nsight Compute, one launch each",
                 legend="wgmma %: tensor pipe (HGMMA) active, % of peak; L2 %: lts throughput, % of peak; L2 GB: bytes "
                        "through L2; DRAM rd: bytes read from HBM; stalls: warp cycles per issued instruction waiting "
                        "at a barrier / on a long scoreboard; us: the profiled launch's duration")


def run_on_gpu(args, gpu) -> int:
    import sys

    from moe_gemm.measure.ceilings import basis_for
    from moe_gemm.measure.parts import PartsFile
    from moe_gemm.variants.k6 import ladder
    from moe_gemm.variants.registry import get

    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch)
    show(compile_report_table(report))
    # The parts can be run in separate processes (each is minutes): a run keeps the records of the
    # parts it does not measure from the file it finds, from the same GPU. The edge-case checks
    # run with the ladder (every timed measurement is also checked against the reference first).
    results = PartsFile(CHAPTER, gpu, SECTIONS)
    if "ladder" in args.parts:
        checks = run_checks([*ladder(), get(AUTO)])
        show(checks_table([c for c in checks if not c["passed"]] or checks[:3]))
        failed = failed_variants(checks)
        if failed:
            print(f"checks FAILED for {', '.join(failed)}: nothing is timed.", file=sys.stderr)
            return 1
        print(f"all {len(checks)} checks passed\n")
        results.put(checks=checks)
    measured = {"ladder": "every rung and the peers at the seed five", "models": "the model projections",
                "grid": f"the grid's rows {', '.join(f'{t:,}' for t in args.tokens)}"}

    def targets() -> list[dict[str, Any]]:
        return target_rows(results.rows("records"), results.rows("profile"), report)

    def save() -> str:  # after each part, and after the profiles (minutes more)
        parts = sorted({r["part"] for r in results.rows("records")}, key=PARTS.index)
        return results.save(compile_report=report, targets=targets(), rounds=args.rounds, parts=parts)

    for part in args.parts:
        results.replace("records", measure_part(part, args, timing), key=lambda r: r["part"])
        results.ran(part, measured[part])  # which commit and command measured it: parts come from several runs
        path = save()
    records = results.rows("records")
    show(ladder_table(records, [*ladder_names(), AUTO, AUTO_HOST, *EARLIER, *TORCH, *QUACK], basis_for(gpu)))
    show(grid_table(records, QUACK, "quack"))
    show(grid_table(records, TORCH, "torch._grouped_mm"))
    show(models_table(records))
    if args.profile:
        results.put(profile=profile_rows())
        show(profile_table(results.rows("profile")))
        path = save()
    show(targets_table(targets(), TARGETS_LEGEND))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
