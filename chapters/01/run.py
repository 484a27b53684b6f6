"""Chapter 01: k0, the FP32 baseline, in numba-cuda, beside torch._grouped_mm.

    python chapters/01/run.py               # checks, then the seed configuration, timed
    python chapters/01/run.py --quick       # fewer timed launches (5 warm-up, 20 timed); nothing saved
    python chapters/01/run.py --no-peers    # k0 alone, without torch._grouped_mm and the torch loop
    python chapters/01/run.py --simulate    # the no-GPU path: k0 in numba's CUDA simulator

With a GPU it first checks k0 against the numpy reference on every edge case of
moe_gemm.model.edge_cases (exact, on integer-valued inputs) and on random data, then times it at the seed configuration
(E=64, N=2688: 16,384 rows at s=0 and s=1.2, 2,048 rows at s=0, and 16,384 rows with K=8192)
beside torch._grouped_mm and a per-expert torch loop from the same run, prints the table
(useful TFLOP/s, ratio to torch._grouped_mm, eta, registers and shared memory as numba reports
them, blocks per SM from the occupancy model) and writes chapters/01/results/<gpu>.json.

Without a GPU it runs k0 in numba's CUDA simulator on a small ragged problem (an empty expert, a
one-row expert, partial tiles in M and N), checks it exactly against the reference, prints the
recorded H200 results, and exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    ANY_GPU,
    PEER,
    SEED,
    SEED_WORKLOADS,
    Table,
    Workload,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    describe_gpu,
    find,
    ignored_flags,
    progress,
    records_table,
    run_main,
    run_variants,
    save_results,
    show,
    show_recorded,
    timing_options,
)
from moe_gemm.model.occupancy import residency

CHAPTER = "01"
REQUIRES = ANY_GPU  # numba-cuda compiles k0 for whatever GPU is here
# The results file's top-level sections, every one written by run_on_gpu's save_results.
SECTIONS = frozenset({"provenance", "records", "ceilings", "k0_occupancy", "k0_sass", "k0_checks", "fp32_reference"})
WORKLOADS = (*SEED_WORKLOADS, Workload(SEED.tokens, 0.0, K=8192))  # the seed's three, and a long K
# The H200's FP32 ceilings: the datasheet figure (132 SMs x 128 FP32 lanes x 2 FLOP x 1.98 GHz),
# and the register-only FFMA microbenchmark (moe_gemm.measure.ceilings), measured again in every run; the
# same microbenchmark's result on this project's H200 before this chapter's run stands in only if
# that fails.
FP32_DATASHEET_TFLOPS = 67.0
FP32_FFMA_EARLIER_TFLOPS = 55.6
TARGET_TFLOPS = 20.0  # the project's target for k0: useful TFLOP/s at 16,384 rows, s=0
RANDOM_CHECKS = (  # realistic inputs, relative error <= 1e-2
    Workload(2048, 1.2),
    Workload(1000, 0.8, experts=8, K=256, N=200),
)


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, quick_note="; the results file is not written")
    parser.add_argument("--simulate", action="store_true",
                        help="run the no-GPU path (numba's CUDA simulator) even where there is a GPU")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- no GPU

def run_without_gpu(args, reason: str) -> int:
    """k0 in numba's CUDA simulator, checked exactly, then the recorded results. No GPU in use is
    the only ``reason`` there can be (none found, or --simulate); the sentence below says it."""
    from moe_gemm.variants.k0.simulator import SIMULATOR_COUNTS, SIMULATOR_K, SIMULATOR_N, simulator_check

    note = ignored_flags(args, ("--quick", "--no-peers"), "the simulator path times nothing")
    if note:
        print(note)
    print(f"No GPU in use: running k0 in numba's CUDA simulator (blocks run as Python threads) on "
          f"{len(SIMULATOR_COUNTS)} experts with {', '.join(map(str, SIMULATOR_COUNTS))} rows, "
          f"K = {SIMULATOR_K}, N = {SIMULATOR_N}, integer-valued inputs checked exactly ...", flush=True)
    result = simulator_check()
    print(result.describe())
    if not result.passed:
        return 1
    print()
    show_recorded(CHAPTER)  # prints the recorded H200 table, or says there is none yet
    return 0


# --------------------------------------------------------------------------- with a GPU

def check_k0(k0) -> tuple[Table, bool]:
    """Every edge case exactly, then random data to a relative error of 1e-2; (table, all passed)."""
    from moe_gemm.measure.check import verify
    from moe_gemm.model.edge_cases import EDGE_CASES
    from moe_gemm.model.tiles import tile_count

    rows, passed = [], True
    for case in EDGE_CASES:
        problem = case.exact_problem(seed=1)
        check = verify(k0, problem, exact=True)
        passed &= check.passed
        rows.append((case.name, problem.tokens, problem.experts, case.K, case.N,
                     tile_count(problem.counts, case.N, k0.bm, k0.bn), "exact", check.describe()))
    for w in RANDOM_CHECKS:
        problem = w.problem(seed=7)
        check = verify(k0, problem)
        passed &= check.passed
        rows.append((f"random, s={w.skew:g}", w.tokens, w.experts, w.K, w.N,
                     tile_count(problem.counts, w.N, k0.bm, k0.bn), "rel. error <= 1e-2", check.describe()))
    table = Table(("case", "rows", "E", "K", "N", "tiles", "check", "result"), tuple(rows),
                  title="k0 against the numpy reference",
                  legend="exact: integer-valued inputs, compared bit for bit; rel. error: relative Frobenius "
                         "error on random inputs; tiles: 64 x 64 blocks launched.")
    return table, passed


def sass_table(k0) -> tuple[Table | None, dict[str, int] | None]:
    """Static SASS instruction counts of the compiled k0: the shape of its inner loop."""
    try:
        counts = k0.sass_counts()
    except Exception as error:  # noqa: BLE001 - nvdisasm missing or failing costs this table only
        print(f"(no SASS report: {type(error).__name__}: {error})", file=sys.stderr)
        return None, None
    table = Table(tuple(counts), (tuple(counts.values()),),
                  title="k0's SASS, static instruction counts",
                  legend="counts by opcode prefix over the whole kernel; one fully unrolled K slice is 256 FFMA "
                         "and 32 LDS.128; LDL / STL: local memory.")
    return table, counts


def occupancy_table(k0) -> tuple[Table, dict[str, Any]]:
    """Registers and shared memory as numba reports them, and the blocks per SM they allow."""
    res = k0.resources()
    limits = residency(res.registers, res.warps_per_block, res.smem_bytes)
    table = Table(("registers/thread", "smem/block", "local mem/thread", "warps/block", "blocks by registers",
                   "by smem", "by warps", "blocks/SM", "limited by"),
                  ((res.registers, f"{res.smem_bytes:,} B", f"{res.spill_bytes} B", res.warps_per_block,
                    limits.by_registers, limits.by_smem, limits.by_warps, limits.blocks, limits.limiter),),
                  title="k0 resources (numba's report) and the occupancy model",
                  legend="blocks/SM: the smallest of the register, shared-memory and warp limits (chapter 00's "
                         "model); local memory is spilled registers.")
    summary = {"registers": res.registers, "smem_bytes": res.smem_bytes, "local_bytes": res.spill_bytes,
               "warps_per_block": res.warps_per_block, "blocks_per_sm": limits.blocks, "limiter": limits.limiter,
               "blocks_by_registers": limits.by_registers, "blocks_by_smem": limits.by_smem,
               "blocks_by_warps": limits.by_warps}
    return table, summary


def measure_fp32_ceilings() -> list[dict[str, Any]]:
    """The ceilings of this run: FFMA (k0's instruction), plus copy and dense bf16 for the roofline."""
    from moe_gemm.measure.ceilings import measure_ceilings

    progress("measuring the ceilings (FFMA, copy, dense bf16, mma.sync) ...")
    try:
        return measure_ceilings()
    except Exception as error:  # noqa: BLE001 - a ceiling that fails must not cost k0's numbers
        print(f"the ceilings could not be measured ({type(error).__name__}: {error}); the FFMA ceiling "
              f"measured on this project's H200 earlier ({FP32_FFMA_EARLIER_TFLOPS} TFLOP/s) stands in",
              file=sys.stderr)
        return []


def ffma_ceiling(ceilings: list[dict[str, Any]]) -> tuple[float, bool]:
    """The FFMA ceiling of these ceiling records, and whether it was measured in their run: where it
    was not, the one measured on this project's H200 earlier stands in."""
    from moe_gemm.measure.ceilings import ceiling_value

    measured = ceiling_value(ceilings, "ffma")
    return (measured, True) if measured else (FP32_FFMA_EARLIER_TFLOPS, False)


def ceiling_table(records: list[dict[str, Any]], ceilings: list[dict[str, Any]]) -> Table:
    """k0 against its own instruction's ceiling: the H200's FP32 rate."""
    from moe_gemm.site.records import peer_ratio

    ffma, measured = ffma_ceiling(ceilings)
    source = "measured" if measured else "earlier run"
    rows = []
    for r in records:
        if r["variant"] != "k0":
            continue
        ratio = peer_ratio(r, records)
        rows.append((Workload.of(r).label,
                     f"{r['useful_tflops']:.1f}", f"{r['scheduled_tflops']:.1f}", f"{r['eta']:.3f}",
                     f"{100 * r['useful_tflops'] / FP32_DATASHEET_TFLOPS:.1f}%",
                     f"{100 * r['useful_tflops'] / ffma:.1f}%",
                     "-" if ratio is None else f"{ratio:.3f}"))
    return Table(("workload", "useful TFLOP/s", "scheduled TFLOP/s", "eta",
                  f"% of FP32 datasheet ({FP32_DATASHEET_TFLOPS:g})",
                  f"% of FFMA ceiling ({ffma:.1f}, {source})", "k0 / torch._grouped_mm"),
                 tuple(rows), title="k0 against the FP32 ceiling",
                 legend="scheduled: padding rows counted as work; FFMA ceiling: register-only FFMA chains on "
                        "every SM; k0 / torch._grouped_mm: same inputs, same run.")


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.ceilings import basis_for
    from moe_gemm.variants.k0 import K0Fp32, numba_cuda_problem
    from moe_gemm.variants.peer.torch import available_peers

    print(describe_gpu(gpu) + "\n")
    if (problem := numba_cuda_problem()) is not None:  # numba-cuda cannot compile with this numpy
        print(problem + "\n")
        show_recorded(CHAPTER)
        return 0
    k0 = K0Fp32()
    progress("checking k0 (compiles it first) ...")
    checks, passed = check_k0(k0)
    show(checks)
    if not passed:
        print("k0 gives wrong answers: not timing it", file=sys.stderr)
        return 1
    resources, occupancy = occupancy_table(k0)
    show(resources)
    sass, sass_counts = sass_table(k0)
    if sass is not None:
        show(sass)

    peers = [] if args.no_peers else available_peers()
    if not args.no_peers and not any(p.name == PEER for p in peers):
        print("torch._grouped_mm is not available here (needs torch >= 2.8 and an sm_90+ GPU): "
              "k0 is timed without the peer ratio\n")
    timing = timing_options(args)
    records = run_variants([k0, *peers], WORKLOADS, **timing)
    ceilings = measure_fp32_ceilings()
    for c in ceilings:
        print(f"  {c['variant']}: " + (f"{c['tflops']:.1f} TFLOP/s" if "tflops" in c else f"{c['tbps']:.2f} TB/s"))
    print()
    show(records_table(records, title=f"k0 beside the peers on {gpu.name}", basis=basis_for(gpu)))
    print(ceiling_table(records, ceilings).text())
    seed_point = find(records, "k0", SEED)
    if seed_point is not None:
        verdict = "met" if seed_point["useful_tflops"] >= TARGET_TFLOPS else "NOT met"
        print(f"\ntarget: k0 >= {TARGET_TFLOPS:g} useful TFLOP/s at 16,384 rows, s=0: "
              f"{seed_point['useful_tflops']:.1f}, {verdict}")

    if args.quick:
        print("\n--quick: fewer timed launches than the recorded results use (10 warm-up, 50 timed), so no "
              "results file was written")
        return 0
    path = save_results(CHAPTER, records, gpu, ceilings=ceilings, k0_occupancy=occupancy, k0_sass=sass_counts,
                        k0_checks=[dict(zip(checks.headers, row)) for row in checks.rows],
                        fp32_reference={"datasheet_tflops": FP32_DATASHEET_TFLOPS,
                                        "ffma_earlier_tflops": FP32_FFMA_EARLIER_TFLOPS})
    print(f"\nwrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return chapter_main(args, REQUIRES, run_on_gpu, run_without_gpu,
                        skip_gpu="--simulate asks for the simulator" if args.simulate else None)


if __name__ == "__main__":
    run_main(main)
