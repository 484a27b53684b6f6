"""Chapter 07: the last mile: k6 against quack's autotuned varlen-M GEMM.

    python chapters/07/run.py                 # checks, the ladder, the grid, the model shapes
    python chapters/07/run.py --quick         # fewer timed launches per round
    python chapters/07/run.py --parts ladder  # only some parts: ladder, grid, models, chain
    python chapters/07/run.py --parts grid --tokens 512 2048   # some of the grid's rows
    python chapters/07/run.py --parts models --models gpt-oss dbrx   # some of the model shapes
    python chapters/07/run.py --parts walk    # the device walk's cost: the M pair on it, on the host list, cursored
    python chapters/07/run.py --profile       # also Nsight Compute on k6/auto, a rung per ladder step, k3 and quack
    python chapters/07/run.py --parts --profile --tokens 32768   # only the profiles at DBRX's 32,768 rows, replaced

With an sm_90a GPU (the recorded numbers come from an H200) it checks every rung of k6
(kernels/k6_persistent.cu) and k6/auto on the edge cases (exact, integer-valued inputs) and on
random data (with the ladder part), then checks and times, in interleaved rounds on the same inputs:
  ladder  every rung, k6/auto on the device walk and on the host list, chapter 04's and 06's
          fastest kernels, torch._grouped_mm (both B layouts) and quack (its autotuned pick and its
          three fastest configurations) at the seed five;
  grid    k6/auto and the peers on chapter 06's 25 cells (M_tot 512 .. 65,536 x s 0 .. 1.6), at
          2,048 rows and fewer also as CUDA-graph replays;
  models  k6/auto and the peers at eight MoE expert projections of five real models, 32,768 routed rows
          at s=0.4: chapter 08's four (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3) and the up and down
          projections of gpt-oss-20b and DBRX (E 8 .. 256, K 768 .. 10,752, N 1,536 .. 21,504);
  chain   two rungs, each with its programmatic-dependent-launch twin, k6/auto, quack's pick and
          torch._grouped_mm at 512, 2,048 and 16,384 balanced rows as CUDA-graph replays of one launch
          and of eight back to back, timed per launch: what a launch's set-up costs between launches;
  walk    the M pair (k6/auto's rung at 16,384 rows and more) on the device walk, the same kernel timed
          again (the spread), its twin on the host list, its twin with the walk's cursor and its twin that
          lists its units before the main loop, at the seed five: what finding the units on the device
          costs, and what each remedy leaves of it.
It prints each table, the targets, and writes chapters/07/results/<gpu>.json after each part, keeping
the records of the parts, grid rows and model shapes it did not measure from the file it finds (so the
parts, and pieces of a part, can run as separate processes; a ratio still compares one process's
records). quack is optional: without it (pip install quack-kernels; see the README) the chapter says so
and times the rest.

Without a GPU it compiles every rung for sm_90a, prints the compile report (with the main loop's SASS
instructions per k-step) and the recorded H200 results as the tables above (a shape the recorded run
did not measure reads "not measured"), and exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_SKEWS,
    GRID_TOKENS,
    MODEL_PROJECTIONS,
    MORE_MODEL_PROJECTIONS,
    PEERS,
    SEED_FIVE,
    SM90A,
    Table,
    Workload,
    add_grid_arguments,
    add_models_argument,
    add_profile_argument,
    add_rounds_argument,
    add_timing_arguments,
    best_of,
    best_ratio,
    chapter_main,
    chapter_parser,
    check_profile_argument,
    checks_passed,
    chosen_shapes,
    find,
    grid,
    grouped_mm_peers,
    keep_profile,
    named_rows,
    print_not_run,
    print_pending,
    progress,
    recorded,
    run_checks,
    run_main,
    run_variants,
    show,
    show_profile,
    start_parts_run,
    targets_table,
)
from moe_gemm.variants.peer.quack import QUACK_PEERS

CHAPTER = "07"
REQUIRES = SM90A
ARCH = "sm_90a"
AUTO, AUTO_HOST = "k6/auto", "k6/auto-host"
M_PAIR = "k6/pingpong-mcluster-bn192"  # quack's own pick at the seed shape: 128 x 192, ping-pong, a 2 x 1 cluster
EARLIER = ("k3/tmastore-bn192", "k5/host", "k5/device")  # chapters 04 and 06 at their best
TORCH = PEERS  # torch._grouped_mm in both B layouts: the faster one counts
QUACK = QUACK_PEERS  # quack's autotuned pick and its three fastest configurations: the fastest counts
GRAPH_MAX_TOKENS = 2048  # cells this small are also timed as CUDA-graph replays, and judged on them
PARTS = ("ladder", "grid", "models", "chain", "walk")
# The chain part: each contender replayed alone and CHAIN launches back to back in one CUDA graph, at these cells;
# the rungs with their PDL twins (rung h), so that the twin's saving is the difference in the same run.
CHAIN = 8
CHAIN_CELLS = (Workload(512, 0.0), Workload(2048, 0.0), Workload(16384, 0.0))
CHAINED = ("k6/pingpong-bn192", "k6/pingpong-bn192-pdl", "k6/pingpong-mcluster-bn192", "k6/pingpong-mcluster-bn192-pdl",
           "k6/auto", "peer/quack", "peer/torch_grouped_mm")
# The walk part: the M pair on the device walk, timed twice (two names for one kernel: the spread), on the host
# list, with the walk's cursor and with the block's units listed before the main loop, in the same rounds.
CURSOR, LISTED = "k6/pingpong-mcluster-bn192-cursor", "k6/pingpong-mcluster-bn192-listed"
WALKS = {"device": M_PAIR, "again": M_PAIR + "-again", "host": M_PAIR + "-host", "cursor": CURSOR, "listed": LISTED}
REMEDIES = ("cursor", "listed")  # the walks that shorten the producer's lookup, each timed against the host list
# The model shapes the models part times: chapter 08's four projections and two more models' up and down
# projections (moe_gemm.model.workloads says which and why), label -> workload.
MODELS = {**MODEL_PROJECTIONS, **MORE_MODEL_PROJECTIONS}
NOT_MEASURED = "not measured"
MAIN_LOOP = "loop/k"  # the compile report's column: SASS instructions per k-step of the main loop, per warp
MAIN_LOOP_WGMMAS = 8  # a k-step of 64 over 128 x BN per warpgroup: two m64 slices x four k16 wgmmas
MAIN_LOOP_LIMIT = 80  # the target for that loop (tests/test_k6.py holds every rung to it)
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "USETMAXREG", "UCGABAR")
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives the consumers 232, the producer 40); smem: "
                  "ring + C staging + barriers (+ the device walk's 2 KB); the rest: static SASS counts (HGMMA = "
                  "wgmma, UTMALDG / UTMASTG = TMA load / store, multicast loads included, STSM = stmatrix, SYNCS = "
                  "mbarrier, UCGABAR = cluster barrier); loop/k: SASS instructions per trip of the main loop (one "
                  "k-step of 64, 8 wgmmas) per warp")
# What --profile puts under Nsight Compute, cell by cell: at 65,536 balanced rows one rung per step of
# the ladder ((a) ping-pong, (b) the N pair, the M pair, (c) 256-row tiles, (d) the raster group, whose
# DRAM and L2 bytes set beside (b)'s are its before and after), chapter 04's k3 and quack; at 16,384
# rows, where quack's configuration is our M pair, k6/auto, that rung and quack.
# The M pair's producer-tail twin beside it at both cells: its barrier stalls without the idle producer warps
# (left out, as from every part, while it has not run on a GPU: ladder_names). k6/auto-host beside k6/auto at
# 65,536 rows: the same rung on the host list, where the device walk costs the most (8-18 us a launch).
# At 65,536 rows s=1.2 the M pair's three walks and k6/auto-host (its host-list twin there): the one cell where the
# walk part timed both remedies slower than the plain device walk.
# At DBRX's down projection (B[e] 132 MB, far past L2) quack's pick and our same tile and cluster on the row-major
# walk, in raster groups of 8 M tiles and in quack's order (groups of 8 columns): how much each reads again; and the
# raster-walked tile with its L2 misses promoted to 128 bytes, as quack's descriptors ask.
PROFILED = {
    MODELS["DBRX w2 (8k tokens, top-4)"]: ("k6/coop256-cluster-bn192", "k6/coop256-cluster-bn192-g8",
                                           "k6/coop256-cluster-bn192-n8", "k6/pingpong-mcluster-bn192-n8",
                                           "k6/coop256-cluster-bn192-g8-p128", "peer/quack"),
    Workload(65536, 0.0): ("k6/auto", "k6/auto-host", "k6/pingpong-bn192", "k6/pingpong-cluster-bn192",
                           "k6/pingpong-mcluster-bn192", "k6/pingpong-mcluster-bn192-cursor",
                           "k6/pingpong-mcluster-bn192-listed",
                           "k6/pingpong-mcluster-bn192-tail", "k6/coop256-cluster-bn128",
                           "k6/pingpong-cluster-bn192-g8", "k3/tmastore-bn192", "peer/quack"),
    Workload(16384, 0.0): ("k6/auto", "k6/pingpong-mcluster-bn192", "k6/pingpong-mcluster-bn192-tail",
                           "k6/pingpong-mcluster-bn192-cursor", "k6/pingpong-mcluster-bn192-listed", "peer/quack"),
    Workload(65536, 1.2): ("k6/auto-host", "k6/pingpong-mcluster-bn192", "k6/pingpong-mcluster-bn192-cursor",
                           "k6/pingpong-mcluster-bn192-listed"),
}
# --profile's help, and what a profile run measured
PROFILED_TEXT = ("k6/auto (on the device walk and on the host list), a rung per ladder step, k3 and quack at 65,536 "
                 "rows, s=0, on k6/auto, the M-paired rung and quack at 16,384 rows, and on quack's tile on three "
                 "walks and quack's pick at DBRX's down projection")
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report", "targets", "rounds", "parts", "part_runs",
                      "profile"})
TARGETS_LEGEND = ("ratios of useful TFLOP/s on the same inputs in the same run (graph replays at 2,048 rows and "
                  "fewer), except the device walk's relative extra time over the host list with the same "
                  "configuration, the profiler's percentage and the compile report's counts")


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._grouped_mm and quack")
    add_rounds_argument(parser)
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS),
                        help="which measurements to make (default: all five; none, with --profile, to profile "
                             "only): ladder (every rung and the peers "
                             "at the seed five), grid (k6/auto and the peers at the --tokens rows x 5 skews), "
                             f"models (k6/auto and the peers at the {len(MODELS)} model projections), chain (graph "
                             f"replays of one launch and of {CHAIN} back to back at three cells), walk (the M pair "
                             "on the device walk, twice, on the host list, with the walk's cursor and with a unit "
                             "list at the seed five)")
    add_grid_arguments(parser, GRID_TOKENS)
    add_models_argument(parser, "gpt-oss dbrx")
    profiled = {name for names in PROFILED.values() for name in names}
    add_profile_argument(parser, profiled, PROFILED_TEXT)
    args = parser.parse_args(argv)
    check_profile_argument(parser, args, profiled)
    chosen_models(args.models)  # a name that matches no shape is refused before anything runs
    return args


def chosen_models(names: Sequence[str]) -> dict[str, Workload]:
    """The model shapes ``--models`` names (every one when it names none)."""
    return chosen_shapes(MODELS, names)


def piece(part: str, args) -> tuple[str, str]:
    """The part_runs entry a run of ``part`` makes and what it says it measured: the part's own name for
    the whole part, ``part-...`` for some of its grid rows or model shapes (so that two runs of pieces
    both keep their entry, and a later run of the whole part replaces both)."""
    if part == "ladder":
        return part, "every rung and the peers at the seed five"
    if part == "walk":
        return part, "the M pair on the device walk (twice), on the host list and with each remedy at the seed five"
    if part == "chain":
        return part, f"graph replays of one launch and of {CHAIN} back to back at 512, 2,048 and 16,384 rows"
    if part == "grid":
        rows = ", ".join(f"{t:,}" for t in args.tokens)
        whole = sorted(args.tokens) == sorted(GRID_TOKENS)
        return (part if whole else f"grid-{'-'.join(map(str, args.tokens))}"), f"the grid's rows {rows}"
    shapes = chosen_models(args.models)
    what = f"the model projections: {', '.join(label.split(' (')[0] for label in shapes)}"
    return (part if len(shapes) == len(MODELS) else "models-" + "-".join(str(list(MODELS).index(label))
                                                                          for label in shapes)), what


def pieces(part: str, args: argparse.Namespace) -> list[argparse.Namespace]:
    """The part as the run measures and saves it: the grid a row at a time and the model shapes one at a time
    (a run stopped by a time limit keeps every row and shape it finished; quack's first tuning at a new shape
    takes up to 40 s), the ladder and the chain whole."""
    if part == "grid":
        return [argparse.Namespace(**{**vars(args), "tokens": [tokens]}) for tokens in args.tokens]
    if part == "models":
        return [argparse.Namespace(**{**vars(args), "models": [label]}) for label in chosen_models(args.models)]
    return [args]


def ladder_names() -> list[str]:
    """The rungs a run on the GPU checks and times: the ladder less those not yet run on a GPU (which the
    compile report shows all the same)."""
    from moe_gemm.variants.k6.config import LADDER, NOT_YET_RUN

    return [name for name in LADDER if name not in NOT_YET_RUN]


# --------------------------------------------------------------------------- lookups

def part_of(workload: Workload) -> str:
    """The part that measures ``workload`` for the grid's and the model shapes' tables and targets: a
    ratio compares records of one part only (one process: the same inputs, the same run, the same
    k6/auto rule), never one part's k6/auto with another part's quack. The seed five are grid cells
    too; the ladder's own tables pass ``part="ladder"``."""
    return "models" if workload in MODELS.values() else "grid"


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
    """Every model shape of :data:`MODELS`; one the records do not hold reads "not measured"."""
    rows = []
    records = of_part(records, "models")
    for label, w in MODELS.items():
        auto, quack, torch = (best_of(records, names, w) for names in ([AUTO], QUACK, TORCH))
        if auto is None:
            rows.append((label, f"E={w.experts} K={w.K} N={w.N}", NOT_MEASURED, *("-" * 5)))
            continue
        rows.append((label, f"E={w.experts} K={w.K} N={w.N}", f"{auto['useful_tflops']:.0f}",
                     "-" if quack is None else f"{quack['useful_tflops']:.0f}",
                     "-" if torch is None else f"{torch['useful_tflops']:.0f}",
                     _fmt(ratio(records, AUTO, QUACK, w)), _fmt(ratio(records, AUTO, TORCH, w)),
                     auto.get("choice", "")))
    return Table(("projection", "shape", "k6/auto", "quack", "torch", "/ quack", "/ torch", "k6/auto chose"),
                 tuple(rows), title="Model shapes: useful TFLOP/s (32,768 routed rows, s=0.4; the label: the "
                                     "tokens whose top-k choices they are)",
                 legend="quack: its best of the autotuned pick and three fastest configurations; torch: the faster "
                        "B layout of torch._grouped_mm")


# Four rungs that each change one template parameter of a rung above: PDL, a staging ring per warpgroup (four
# stages instead of five), and the M pair ending on the producer's tail instead of a cluster barrier.
TWINS = {"k6/pingpong-bn192-pdl": "k6/pingpong-bn192",
         "k6/pingpong-mcluster-bn192-pdl": "k6/pingpong-mcluster-bn192",
         "k6/pingpong-bn192-rings": "k6/pingpong-bn192",
         "k6/pingpong-mcluster-bn192-tail": "k6/pingpong-mcluster-bn192"}


def twins_table(records: Sequence[dict[str, Any]]) -> Table:
    """Each TWINS rung's useful TFLOP/s over its twin's at the seed five (the ladder's records), and k6/auto's
    over the rung it chose: one kernel timed twice in the same rounds, the spread to read the others against."""
    records = of_part(records, "ladder")
    cells = [w for w in SEED_FIVE if any(find(records, n, w) for n in TWINS)]

    def over(name: str | None, other: str | None, cell: Workload) -> str:
        a = find(records, name, cell) if name else None
        b = find(records, other, cell) if other else None
        return "-" if a is None or b is None else f"{a['useful_tflops'] / b['useful_tflops']:.3f}"

    rows = [(rung, twin, *(over(rung, twin, c) for c in cells)) for rung, twin in TWINS.items()]
    chosen = [(find(records, AUTO, c) or {}).get("choice") for c in cells]
    rows.append((AUTO, "the rung it chose", *(over(AUTO, name, c) for name, c in zip(chosen, cells))))
    return Table(("rung", "over", *(c.short_label for c in cells)), tuple(rows),
                 title="Four rungs over the rung each changes: useful TFLOP/s ratio",
                 legend="eager launches in the ladder's interleaved rounds, same inputs, same run; the last row: "
                        "k6/auto over the ladder rung it launches, the same kernel timed twice")


def chain_table(records: Sequence[dict[str, Any]]) -> Table:
    """Microseconds per launch of each CHAINED contender, replayed alone and in a chain of CHAIN, per cell."""
    from moe_gemm.measure.graph_replay import graph_name

    records = of_part(records, "chain")
    cells = [c for c in CHAIN_CELLS if any(Workload.of(r) == c for r in records)]
    rows = []
    for name in CHAINED:
        timed = [(find(records, graph_name(name), c), find(records, graph_name(name, CHAIN), c)) for c in cells]
        if not any(alone or chained for alone, chained in timed):
            continue
        row = [name]
        for alone, chained in timed:
            row += ["-" if r is None else f"{1e3 * r['median_ms']:.1f}" for r in (alone, chained)]
            row.append("-" if alone is None or chained is None else f"{chained['median_ms'] / alone['median_ms']:.2f}")
        rows.append(tuple(row))
    headers = [h for c in cells for h in (f"{c.short_label} alone", f"in {CHAIN}", "ratio")]
    return Table(("variant", *headers), tuple(rows), title=f"One launch, and {CHAIN} back to back: us per launch",
                 legend=f"CUDA-graph replays of one launch (alone) and of {CHAIN} launches back to back (in {CHAIN}: "
                        "the replay's time over the launches), same inputs, same run; ratio: in a chain over alone "
                        "(below 1: launches overlap or lose their gaps); -pdl: programmatic dependent launch (rung h)")


def walk_times(records: Sequence[dict[str, Any]]) -> dict[Workload, dict[str, float]]:
    """The walk part's median milliseconds per seed cell, by WALKS key, for the contenders its records hold there
    (cells with none left out): what its table, its targets and its figure compare."""
    walk = of_part(records, "walk")
    found = {cell: {k: r["median_ms"] for k, name in WALKS.items() if (r := find(walk, name, cell))}
             for cell in SEED_FIVE}
    return {cell: ms for cell, ms in found.items() if ms}


def walk_table(records: Sequence[dict[str, Any]]) -> Table:
    """The walk part: each contender's time per cell and the extra time over the host list of the device walk and
    of each remedy the records hold."""
    times = walk_times(records)
    remedies = [k for k in REMEDIES if any(k in ms for ms in times.values())]
    shown = ["device", "again", "host", *remedies]
    rows = []
    for cell, ms in times.items():
        def over_host(key: str) -> str:
            return "-" if key not in ms or "host" not in ms else f"{100 * (ms[key] / ms['host'] - 1):+.1f}%"

        spread = abs(ms["again"] / ms["device"] - 1) if "device" in ms and "again" in ms else None
        drift = round_range(records, cell)
        rows.append((cell.short_label, *("-" if k not in ms else f"{1e3 * ms[k]:.1f}" for k in shown),
                     *map(over_host, ("device", *remedies)), "-" if spread is None else f"{100 * spread:.1f}%",
                     "-" if drift is None else f"{100 * drift:.1f}%"))
    return Table(("cell", *(f"{k} us" for k in shown), "device", *remedies, "spread", "rounds"), tuple(rows),
                 title="The device walk's cost: the M pair on it, on the host list and with " + " and with ".join(
                     {"cursor": "the cursor", "listed": "a unit list"}[k] for k in remedies),
                 legend=f"us: median per launch over the rounds, same inputs, interleaved rounds; "
                        f"{', '.join(['device', *remedies])}: extra time over the host list; spread: the same kernel "
                        "timed twice (device against again); rounds: how far that kernel's slowest round median lies "
                        "above its fastest")


def round_range(records: Sequence[dict[str, Any]], cell: Workload) -> float | None:
    """The walk part's identical kernel (the M pair under both its names) at ``cell``: its slowest round's median over
    its fastest's, less one. A slow spell of the GPU shows here and not in the spread, whose two names are timed
    next to each other in every round."""
    walk = of_part(records, "walk")
    rounds = [ms for k in ("device", "again") if (r := find(walk, WALKS[k], cell)) for ms in r["round_medians_ms"]]
    return max(rounds) / min(rounds) - 1 if len(rounds) > 2 else None


# --------------------------------------------------------------------------- targets

def target_rows(records: Sequence[dict[str, Any]], profile: Sequence[dict[str, Any]] = (),
                compiled: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The issue's targets from the timed records (the device walk's cost: k6/auto over k6/auto-host in the ladder,
    the cursor over the host list in the walk part), and, where the run has them, the profiler's (the wgmma pipe of
    the M-paired cluster rung, quack's own pick, and of its cursor twin, at 65,536 balanced rows) and the compile
    report's (the main loop's instructions per k-step, no spills). A target over a set of cells names
    how many of them the records hold: a model shape not measured yet is counted, not hidden."""
    rows = []
    labels = {w: label.split(" (")[0] for label, w in MODELS.items()}

    def add(name: str, value: float | None, goal: float, at_most: bool = False) -> None:
        if value is not None:
            rows.append({"target": name, "value": value, "goal": goal, "at_most": at_most,
                         "met": value <= goal if at_most else value >= goal})

    def worst(what: str, peers: Sequence[str], cells: Sequence[Workload]) -> None:
        found = {w: v for w in dict.fromkeys(cells) if (v := ratio(records, AUTO, peers, w)) is not None}
        if found:
            w = min(found, key=found.get)
            add(f"{what}, {len(found)} of {len(cells)} measured (worst: {labels.get(w, w.label)})", found[w], 1.0)

    for label, peers in (("quack", QUACK), ("torch", TORCH)):
        worst(f"k6/auto / {label}, the grid's cells", peers, grid())
        worst(f"k6/auto / {label}, the model shapes", peers, list(MODELS.values()))
    for w in (Workload(65536, 1.2), *(Workload(512, s) for s in GRID_SKEWS)):
        add(f"k6/auto / quack at {w.label}", ratio(records, AUTO, QUACK, w), 1.10)
    ladder = of_part(records, "ladder")  # k6/auto-host is timed only there
    for w in SEED_FIVE:
        device, host = find(ladder, AUTO, w), find(ladder, AUTO_HOST, w)
        if device and host:
            add(f"k6/auto time over k6/auto-host at {w.label}", device["median_ms"] / host["median_ms"] - 1, 0.02,
                at_most=True)
    walk = walk_times(records)  # the remedies against the host list, the M pair's twins in the same rounds
    for k in REMEDIES:
        for w, ms in walk.items():
            if k in ms and "host" in ms:
                add(f"{WALKS[k]} time over its host-list twin at {w.label} (walk part)", ms[k] / ms["host"] - 1, 0.02,
                    at_most=True)
    for rung in (M_PAIR, *(WALKS[k] for k in REMEDIES)):
        pipe = next((p["gmma_pipe_pct"] for p in profile if p["variant"] == rung and Workload(65536, 0.0).matches(p)),
                    None)
        add(f"{rung}'s wgmma pipe active at 65,536 rows, s=0 (Nsight Compute), %", pipe, 95.0)
    if compiled and all(MAIN_LOOP in r["sass"] for r in compiled):
        add(f"main loop, SASS instructions per k-step of {MAIN_LOOP_WGMMAS} wgmmas, most of any rung (compile report)",
            max(r["sass"][MAIN_LOOP] for r in compiled), MAIN_LOOP_LIMIT, at_most=True)
    if compiled:
        add("spilled bytes, every rung (compile report)", max(r["spill_bytes"] for r in compiled), 0, at_most=True)
    return rows


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    """The compile report's rows, each rung's SASS counts with its main loop's length (:data:`MAIN_LOOP`)."""
    from moe_gemm.cuda.sass import main_loop_instructions
    from moe_gemm.site.compile_report import compile_rows
    from moe_gemm.variants.k6 import ladder

    rungs = ladder()
    rows = compile_rows(rungs, arch, OPCODES)
    for row, rung in zip(rows, rungs):
        row["sass"][MAIN_LOOP] = main_loop_instructions(rung.compile(arch).sass(), MAIN_LOOP_WGMMAS)
    return rows


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    from moe_gemm.site.compile_report import compile_table

    counted = (*OPCODES, MAIN_LOOP) if all(MAIN_LOOP in r["sass"] for r in rows) else OPCODES
    return compile_table(rows, counted, {}, legend=COMPILE_LEGEND)


def show_tables(records: Sequence[dict[str, Any]], basis) -> None:
    """The ladder, the grid over each peer and the model shapes, each from its own part's records."""
    show(ladder_table(records, [*ladder_names(), AUTO, AUTO_HOST, *EARLIER, *TORCH, *QUACK], basis))
    if any(find(of_part(records, "ladder"), name, w) for name in TWINS for w in SEED_FIVE):
        show(twins_table(records))
    show(grid_table(records, QUACK, "quack"))
    show(grid_table(records, TORCH, "torch._grouped_mm"))
    show(models_table(records))
    if of_part(records, "chain"):
        show(chain_table(records))
    if of_part(records, "walk"):
        show(walk_table(records))


def run_without_gpu(args, reason: str) -> int:
    from moe_gemm.measure.ceilings import roofline_basis

    print_not_run(args, "k6", reason, f"compiling every rung for {ARCH} instead",
                  ("--quick", "--no-peers", "--rounds", "--parts", "--tokens", "--models", "--profile"),
                  "nothing is timed without an sm_90a GPU")
    show(compile_report_table(compile_report(ARCH)))
    data = recorded(CHAPTER)
    if data is None:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
        return 0
    prov = data["provenance"]
    print(f"Recorded on {prov['gpu']} ({prov['date'][:10]}), each table from one part of the run:\n")
    show_tables(data["records"], roofline_basis())
    if data.get("profile"):
        show_profile(data["profile"], profile_table)
    show(targets_table(data["targets"], TARGETS_LEGEND))
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
        ours = [get(n) for n in (*ladder_names(), AUTO, AUTO_HOST, *EARLIER)] + [GraphReplay(auto)]
        return run_variants(ours + peers(args, graphs=True), SEED_FIVE, rounds=args.rounds, **timing)
    if part == "grid":
        small = [w for w in grid(args.tokens) if w.tokens <= GRAPH_MAX_TOKENS]
        large = [w for w in grid(args.tokens) if w.tokens > GRAPH_MAX_TOKENS]
        return (run_variants([auto, GraphReplay(auto), *peers(args, graphs=True)], small, rounds=args.rounds, **timing)
                + run_variants([auto, *peers(args, graphs=False)], large, rounds=args.rounds, **timing))
    if part == "walk":
        return run_variants(walk_variants(), SEED_FIVE, rounds=args.rounds, **timing)
    if part == "chain":  # the rungs not yet run on a GPU stay out (ladder_names), and peers without quack
        ran = {*ladder_names(), AUTO}
        found = [get(n) for n in CHAINED if n in ran] + [p for p in peers(args, graphs=False) if p.name in CHAINED]
        return run_variants([GraphReplay(v, chain) for v in found for chain in (1, CHAIN)], list(CHAIN_CELLS),
                            rounds=args.rounds, **timing)
    return run_variants([auto, *peers(args, graphs=False)], list(chosen_models(args.models).values()),
                        rounds=args.rounds, **timing)


def walk_variants() -> list[Any]:
    """The walk part's contenders (WALKS), each remedy's rung only once it has run on a GPU."""
    from moe_gemm.variants.k6 import K6Persistent
    from moe_gemm.variants.k6.config import LADDER

    pair = LADDER[M_PAIR]
    found = [K6Persistent(WALKS["device"], pair), K6Persistent(WALKS["again"], pair),
             K6Persistent(WALKS["host"], pair.replace(schedule="host"))]
    return found + [K6Persistent(WALKS[k], LADDER[WALKS[k]]) for k in REMEDIES if WALKS[k] in ladder_names()]


def profile_rows(only: Sequence[str] = (), rows: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Nsight Compute's rows for PROFILED (only the variants named in ``only`` and the cells of ``rows`` routed rows,
    where they name any); a rung not yet run on a GPU is left out by profile_cells, which says so."""
    from moe_gemm.measure.profile import profile_cells

    # waits: who waits for whom; is the producer the limit, as in k7?
    return profile_cells(PROFILED, only, waits=True, routed_rows=rows)


def profile_table(rows: Sequence[dict[str, Any]]) -> Table:
    def pct(row, key):
        value = row.get(key)
        return "-" if value is None else f"{value:.1f}"

    body = tuple((r["variant"], Workload.of(r).cell_label, pct(r, "gmma_pipe_pct"), pct(r, "l2_throughput_pct"),
                  "-" if r.get("l2_bytes") is None else f"{r['l2_bytes'] / 1e9:.2f}",
                  "-" if r.get("dram_bytes_read") is None else f"{r['dram_bytes_read'] / 1e9:.2f}",
                  pct(r, "stall_barrier"), pct(r, "stall_long_scoreboard"), pct(r, "producer_wait_pct"),
                  "-" if r.get("producer_wait_retries") is None else f"{r['producer_wait_retries']:,.0f}",
                  pct(r, "consumer_wait_pct"),
                  "-" if r.get("duration_ns") is None else f"{r['duration_ns'] / 1e3:.1f}") for r in rows)
    return Table(("variant", "cell", "wgmma %", "L2 %", "L2 GB", "DRAM rd GB", "bar stall", "lsb stall",
                  "prod wait %", "prod retries", "cons wait %", "us"), body,
                 title="Nsight Compute, one launch each",
                 legend="wgmma %: tensor pipe (HGMMA) active, % of peak; L2 %: lts throughput, % of peak; L2 GB: bytes "
                        "through L2; DRAM rd: bytes read from HBM; stalls: warp cycles per issued instruction waiting "
                        "at a barrier / on a long scoreboard; prod / cons wait %: share of the warps' stall samples at "
                        "the producer's waits for a free stage / the consumers' for a full one, prod retries: how "
                        "often the producer's wait found the stage still busy (source counters, where taken); us: the "
                        "profiled launch's duration")


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.ceilings import basis_for
    from moe_gemm.measure.parts import profile_piece
    from moe_gemm.variants.k6.config import NOT_YET_RUN
    from moe_gemm.variants.registry import get

    # The parts can be run in separate processes (each is minutes): a run keeps the records of the
    # parts it does not measure from the file it finds, from the same GPU. The edge-case checks
    # run with the ladder (every timed measurement is also checked against the reference first).
    timing, report, results = start_parts_run(args, gpu, CHAPTER, SECTIONS, compile_report,
                                              compile_report_table)
    print_pending(NOT_YET_RUN, "moe_gemm.variants.k6.config.NOT_YET_RUN")
    if "ladder" in args.parts:
        checks = run_checks([*map(get, ladder_names()), get(AUTO)])
        if not checks_passed(checks):
            return 1
        results.put(checks=checks)

    def targets() -> list[dict[str, Any]]:
        return target_rows(results.rows("records"), results.rows("profile"), report)

    def save() -> str:  # after each part, and after the profiles (minutes more)
        parts = sorted({r["part"] for r in results.rows("records")}, key=PARTS.index)
        return results.save(compile_report=report, targets=targets(), rounds=args.rounds, parts=parts)

    for part in args.parts:
        chunks = pieces(part, args)
        for chunk in chunks:
            # a cell or shape measured again replaces every variant's record of it, in its part only
            results.replace("records", measure_part(part, chunk, timing), key=lambda r: (r["part"], Workload.of(r)))
            results.ran(*piece(part, chunk))  # which commit and command measured it: parts come from several runs
            path = save()
        if len(chunks) > 1 and piece(part, args)[0] == part:  # the whole part: one entry replaces the pieces'
            results.ran(*piece(part, args))
            path = save()
    show_tables(results.rows("records"), basis_for(gpu))
    if args.profile is not None:  # a profile of some variants replaces only theirs, at the cells (shapes) it ran
        rows = named_rows(args.tokens, GRID_TOKENS)  # --tokens: only the cells of those rows
        keep_profile(results, profile_rows(args.profile, rows), key=lambda r: (r["variant"], Workload.of(r)))
        results.ran(*profile_piece(args.profile, f"Nsight Compute on {PROFILED_TEXT}"))
        show_profile(results.rows("profile"), profile_table)
        path = save()
    show(targets_table(targets(), TARGETS_LEGEND))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
