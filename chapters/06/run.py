"""Chapter 06: adaptive tile shapes and device-side scheduling under skew (k5).

    python chapters/06/run.py               # checks, calibration, then the 25-cell grid
    python chapters/06/run.py --quick       # fewer timed launches (5 warm-up, 20 timed) per round
    python chapters/06/run.py --rounds 5    # five interleaved timing rounds per cell (default 3)
    python chapters/06/run.py --tokens 16384 --skews 0 1.2   # a part of the grid

With an sm_90a GPU (the recorded numbers come from an H200) it checks every k5 variant
(kernels/k5_adaptive.cu) on the edge cases (exact, integer-valued inputs) and on random data,
measures the per-tile cost of each tile shape (the cost model's calibration), then times the
adaptive kernel (host- and device-scheduled, the latter also replayed from a CUDA graph),
chapter 04's fixed-shape k3/tmastore-bn192 and torch._grouped_mm (both B layouts) on the grid
M_tot in {512, 2048, 4096, 16384, 65536} x s in {0, 0.4, 0.8, 1.2, 1.6} at the seed's E=64,
K=1024, N=2688, in interleaved rounds. It prints the grid, the cost model's predictions beside
the measurements, eta under each policy and the targets, replays one captured graph with three
routings, and writes chapters/06/results/<gpu>.json.

Without one it compiles both schedules for sm_90a, prints the compile report, the cost model's
choices for the grid under the recorded calibration, and the recorded H200 results, and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_SKEWS,
    GRID_TOKENS,
    SEED,
    SM90A,
    Table,
    Workload,
    add_grid_arguments,
    add_rounds_argument,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    checks_table,
    describe_gpu,
    failed_variants,
    find,
    grouped_mm_peers,
    print_not_run,
    progress,
    ratio_to_peer,
    recorded,
    records_table,
    run_checks,
    run_main,
    run_variants,
    save_results,
    show,
    show_recorded,
    targets_table,
    timing_options,
)

CHAPTER = "06"
REQUIRES = SM90A
# The results file's top-level sections, every one written by run_on_gpu's save_results.
SECTIONS = frozenset({"provenance", "records", "ceilings", "checks", "compile_report", "calibration", "model",
                      "targets", "graph_replays", "rounds"})
ARCH = "sm_90a"
ADAPTIVE = "k5/host"  # the cost model's tiles, scheduled on the host
DEVICE = ("k5/device", "k5/device-graph")
ORDERING = "k5/host-lpt"  # the same tiles, longest kind first
FIXED = "k3/tmastore-bn192"  # chapter 04's fastest tiling with B as given
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "SHFL", "USETMAXREG")
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives consumers 232, the producer 40); smem: ring + "
                  "C staging + barriers (+ the device schedule's 4 KB); the rest: static SASS counts (HGMMA = "
                  "wgmma of every width, UTMALDG / UTMASTG = TMA load / store, STSM = stmatrix, SYNCS = mbarrier, "
                  "SHFL = the schedule's warp scan)")
# Ratios to the faster torch._grouped_mm layout, same run, that chapter 06 set out to reach.
TARGETS = {Workload(16384, 1.2): 1.30, Workload(2048, 0.0): 1.30, Workload(65536, 1.2): 1.15}
EVERY_CELL_TARGET = 1.0
MEMORY_ROOFLINE_TARGET = 0.90  # at 2,048 rows, s = 0
MEMORY_BOUND = Workload(2048, 0.0)
DEVICE_TOLERANCE = 0.03  # the device-scheduled launch within 3 % of the host-scheduled one at 16,384 rows
GRAPH_SKEWS = (0.0, 0.8, 1.6)  # routings one captured graph is replayed with, at the seed's 16,384 rows

TARGETS_LEGEND = ("ratios of useful TFLOP/s to the faster torch._grouped_mm layout, except the roofline fraction "
                  "and the device schedule's relative extra time")


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._grouped_mm")
    add_rounds_argument(parser)
    add_grid_arguments(parser, GRID_TOKENS, GRID_SKEWS)
    return parser.parse_args(argv)


def grid(args) -> list[Workload]:
    return [Workload(tokens, float(skew)) for tokens in args.tokens for skew in args.skews]


def cells_of(records: Sequence[dict[str, Any]]) -> list[Workload]:
    return list(dict.fromkeys(Workload(r["tokens"], r["skew"]) for r in records if r["variant"] == ADAPTIVE))


# --------------------------------------------------------------------------- the model

def variant(name: str, calibration=None):
    from moe_gemm.variants.registry import get

    made = get(name)
    if calibration is not None:
        made.calibration = calibration
    return made


def model_rows(cells: Sequence[Workload], calibration, records: Sequence[dict[str, Any]] | None = None,
               slots: int = 132) -> list[dict[str, Any]]:
    """Per cell: eta under each policy, the policies chosen, and the predicted time of the
    host-scheduled (cost model) and device-scheduled (greedy) launches beside the measured ones."""
    from moe_gemm.model.routing import expert_counts
    from moe_gemm.variants.k5.cost_model import predict
    from moe_gemm.variants.k5.mixed_tiles import FIXED_128, mixed_eta, mixed_tile_list

    rows = []
    for cell in cells:
        counts = expert_counts(cell.experts, cell.tokens, cell.skew)  # the routing alone: no inputs drawn
        row: dict[str, Any] = {"tokens": cell.tokens, "skew": cell.skew,
                               "eta_fixed": mixed_eta(counts, FIXED_128)}
        for key, name in (("host", ADAPTIVE), ("device", DEVICE[0])):
            policy, prediction = variant(name, calibration).prediction(counts, cell.K, cell.N, slots)
            row[f"{key}_policy"] = policy.label
            row[f"eta_{key}"] = mixed_eta(counts, policy)
            row[f"{key}_predicted_us"] = prediction.total_us
            row[f"{key}_bound"] = prediction.bound
            measured = find(records or [], name, cell)
            row[f"{key}_measured_us"] = None if measured is None else measured["median_ms"] * 1e3
        fixed = predict(mixed_tile_list(counts, cell.N, FIXED_128), counts, calibration, slots, cell.K, cell.N)
        row["fixed_predicted_us"] = fixed.total_us
        measured = find(records or [], FIXED, cell)
        row["fixed_measured_us"] = None if measured is None else measured["median_ms"] * 1e3
        rows.append(row)
    return rows


def model_table(rows: Sequence[dict[str, Any]]) -> Table:
    def us(value):
        return "-" if value is None else f"{value:.1f}"

    body = tuple((f"{r['tokens']:,} s={r['skew']:g}", f"{r['eta_fixed']:.3f}", r["host_policy"], f"{r['eta_host']:.3f}",
                  us(r["host_predicted_us"]), us(r["host_measured_us"]), r["device_policy"],
                  us(r["device_predicted_us"]), us(r["device_measured_us"]), us(r["fixed_predicted_us"]),
                  us(r["fixed_measured_us"])) for r in rows)
    return Table(("cell", "eta 128", "host policy", "eta", "pred us", "meas us", "device policy", "pred us",
                  "meas us", "fixed pred", "fixed meas"), body,
                 title="The cost model: policies, eta and predicted against measured time",
                 legend="eta 128: real rows / scheduled rows with 128-row tiles only (k3); host policy: the cost "
                        "model's choice for this routing (k5/host), eta under it; device policy: the routing-"
                        "independent greedy rule k5/device uses; pred: max(overhead + the busiest block's "
                        "calibrated tile costs, compulsory bytes / copy bandwidth); meas: median time in this run; "
                        "fixed: 128-row tiles (k3/tmastore-bn192 measured)")


# --------------------------------------------------------------------------- tables

def grid_table(records: Sequence[dict[str, Any]], name: str) -> Table:
    cells = cells_of(records)
    tokens = list(dict.fromkeys(c.tokens for c in cells))
    skews = list(dict.fromkeys(c.skew for c in cells))
    rows = []
    for t in tokens:
        cells_row = []
        for s in skews:
            value = ratio_to_peer(records, name, Workload(t, s))
            cells_row.append("-" if value is None else f"{value:.2f}")
        rows.append((f"{t:,}", *cells_row))
    return Table(("M_tot", *(f"s={s:g}" for s in skews)), tuple(rows), title=f"{name}: ratio to the faster peer",
                 legend="useful TFLOP/s over the faster torch._grouped_mm layout on the same inputs in the same run")


def target_rows(records: Sequence[dict[str, Any]], basis) -> list[dict[str, Any]]:
    """Every target: the named cells, every cell of the grid, the memory roofline at 2,048 rows
    and the device schedule against the host schedule at 16,384 rows."""
    rows = []
    for cell, target in TARGETS.items():
        value = ratio_to_peer(records, ADAPTIVE, cell)
        if value is not None:
            rows.append({"target": f"{ADAPTIVE} / peer at {cell.tokens:,} rows, s={cell.skew:g}", "value": value,
                         "goal": target, "met": value >= target})
    cells = cells_of(records)
    if cells:
        worst = min(cells, key=lambda c: ratio_to_peer(records, ADAPTIVE, c) or float("inf"))
        value = ratio_to_peer(records, ADAPTIVE, worst)
        rows.append({"target": f"{ADAPTIVE} / peer in every cell (worst: {worst.label})", "value": value,
                     "goal": EVERY_CELL_TARGET, "met": value >= EVERY_CELL_TARGET})
    small = find(records, ADAPTIVE, MEMORY_BOUND)
    if small is not None:
        value = small["useful_tflops"] / basis.tflops(MEMORY_BOUND)
        rows.append({"target": f"{ADAPTIVE} at 2,048 rows, s=0: fraction of the memory roofline", "value": value,
                     "goal": MEMORY_ROOFLINE_TARGET, "met": value >= MEMORY_ROOFLINE_TARGET})
    for name in DEVICE:
        gaps = [(c, find(records, name, c)["median_ms"] / find(records, ADAPTIVE, c)["median_ms"] - 1)
                for c in cells if c.tokens == SEED.tokens and find(records, name, c) and find(records, ADAPTIVE, c)]
        if gaps:
            cell, gap = max(gaps, key=lambda g: g[1])
            rows.append({"target": f"{name} time over {ADAPTIVE}'s at 16,384 rows (worst: s={cell.skew:g})",
                         "value": gap, "goal": DEVICE_TOLERANCE, "met": gap <= DEVICE_TOLERANCE, "at_most": True})
    return rows


def calibration_table(calibration) -> Table:
    from moe_gemm.variants.k5.cost_model import COST_KEYS
    from moe_gemm.variants.k5.mixed_tiles import TileKind, columns

    rows = []
    for key in COST_KEYS:
        kind = TileKind.SWAP if key.startswith("SWAP") else TileKind[key]
        rows.append((key, f"{calibration.tile_us[key]:.2f}", columns(kind, calibration.N),
                     f"{calibration.tile_us[key] * columns(kind, calibration.N):.1f}"))
    return Table(("tile", "us per tile", "column tiles", "us per row of tiles"), tuple(rows),
                 title=f"Calibration ({calibration.source}; overhead {calibration.overhead_us:.1f} us, copy "
                       f"{calibration.copy_tbps:.2f} TB/s)",
                 legend="us per tile: M128 from lists of 2 and 4 full tiles per expert (slope), every other shape as "
                        "the cost that makes the model's makespan of its list (2 full tiles and one remainder per "
                        "expert) equal the measured time; a row of tiles covers all N columns of one remainder: what "
                        "the policy compares")


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    from moe_gemm.site.compile_report import compile_rows
    from moe_gemm.variants.k5 import K5Adaptive

    return compile_rows([K5Adaptive("k5/host"), K5Adaptive("k5/device")], arch, OPCODES)


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    """The compile report as this chapter prints it and as its page shows it (figures.py)."""
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, {}, legend=COMPILE_LEGEND)


def recorded_calibration():
    """The calibration in the recorded results, or the nominal one when there is none."""
    from moe_gemm.variants.k5.cost_model import Calibration, nominal_calibration

    data = recorded(CHAPTER)
    return Calibration.from_record(data["calibration"]) if data and "calibration" in data else nominal_calibration()


def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "k5", reason, f"compiling both schedules for {ARCH} instead",
                  ("--quick", "--no-peers", "--rounds"), "nothing is timed without an sm_90a GPU")
    show(compile_report_table(compile_report(ARCH)))
    calibration = recorded_calibration()
    show(calibration_table(calibration))
    data = recorded(CHAPTER)  # the measured columns: the recorded H200 run's times, where it has them
    show(model_table(model_rows(grid(args), calibration, data["records"] if data else None)))
    if show_recorded(CHAPTER) != 0:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    return 0


# --------------------------------------------------------------------------- with a GPU

def graph_replays(calibration) -> list[dict[str, Any]]:
    """One CUDA graph of the device-scheduled launch, captured once at the seed shape with room for
    16,384 rows, replayed with routings of three skews: each replay checked and timed."""
    import numpy as np

    from moe_gemm.cuda.timing import time_launches
    from moe_gemm.model.problem import Problem
    from moe_gemm.model.reference import check_output
    from moe_gemm.variants.k5.layer import DeviceLayer

    rows = []
    base = SEED.problem(0)
    layer = DeviceLayer(base.b, capacity=SEED.tokens, calibration=calibration)
    for skew in GRAPH_SKEWS:
        progress(f"[graph] replay with the s={skew:g} routing")
        problem = Workload(SEED.tokens, skew).problem(0)
        problem = Problem(a=problem.a, b=base.b, counts=problem.counts, skew=skew)
        check = check_output(layer(problem.a, problem.counts), problem)
        timing = time_launches(lambda _: layer.replay(), warmup=5, iterations=30)
        rows.append({"skew": skew, "rows": int(np.sum(problem.counts)), "passed": check.passed,
                     "rel_error": check.rel_error, "median_ms": timing.median_ms})
    return rows


def graph_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((f"s={r['skew']:g}", f"{r['rows']:,}", "ok" if r["passed"] else "FAILED", f"{r['rel_error']:.2e}",
                  f"{r['median_ms']:.3f}") for r in rows)
    return Table(("routing", "rows", "check", "rel. error", "replay ms"), body,
                 title="One captured CUDA graph, replayed with changing routings",
                 legend="captured once at 16,384 rows of capacity; before each replay only A's rows and the "
                        "device offsets change; the graph is never re-captured or updated")


def run_on_gpu(args, gpu) -> int:
    import sys

    from moe_gemm.measure.ceilings import basis_for, roofline_ceilings
    from moe_gemm.variants.k5 import K5Adaptive, slots
    from moe_gemm.variants.k5.calibration import calibrate
    from moe_gemm.variants.k5.config import CHECKED

    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch)
    show(compile_report_table(report))

    checks = run_checks([K5Adaptive(name) for name in CHECKED])
    show(checks_table(checks))
    failed = failed_variants(checks)
    if failed:
        print(f"checks FAILED for {', '.join(failed)}: nothing is timed.", file=sys.stderr)
        return 1

    progress("[ceilings] device copy and cuBLAS bf16")
    ceilings = roofline_ceilings()
    basis = basis_for(gpu)
    progress("[calibration] per-tile cost of every tile shape")
    calibration = calibrate(basis.copy_tbps)
    show(calibration_table(calibration))

    timed = [variant(name, calibration) for name in (ADAPTIVE, *DEVICE, ORDERING)] + [variant(FIXED)]
    if not args.no_peers:
        timed += grouped_mm_peers()
    records = run_variants(timed, grid(args), rounds=args.rounds, **timing)
    show(records_table(records, title="Every measurement", basis=basis,
                       columns=("variant", "workload", "ms", "tflops", "vs_peer", "roofline", "eta", "tiles")))
    for name in (ADAPTIVE, DEVICE[0], FIXED):
        show(grid_table(records, name))
    model = model_rows(cells_of(records), calibration, records, slots(K5Adaptive(ADAPTIVE)))
    show(model_table(model))
    targets = target_rows(records, basis)
    show(targets_table(targets, TARGETS_LEGEND))
    replays = graph_replays(calibration)
    show(graph_table(replays))
    path = save_results(CHAPTER, records, gpu, ceilings=ceilings, checks=checks, compile_report=report,
                        calibration=calibration.as_record(), model=model, targets=targets, graph_replays=replays,
                        rounds=args.rounds)
    print(f"results written to {path}")
    return 0 if all(r["passed"] for r in replays) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
