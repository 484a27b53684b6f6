"""Chapter 05: k4, Blackwell tcgen05 with the accumulator in tensor memory.

    python chapters/05/run.py               # on compute capability 10.x: checks, then times k4
    python chapters/05/run.py --quick       # fewer timed launches (5 warm-up, 20 timed)
    python chapters/05/run.py --no-peers    # without torch._grouped_mm and the torch loop

k4 runs only on a GPU of compute capability 10.0 or 10.3 (B200-class or B300: the sm_100a and
sm_103a targets, the only ones with tcgen05 and tensor memory). There it prints the compile report,
checks every k4 configuration on the edge cases (exact, integer-valued inputs) and on random data,
times them beside chapter 03's k2 and torch._grouped_mm at the seed workloads (E=64, K=1024,
N=2688; 16,384 rows at s=0 and s=1.2, and 2,048 rows) and writes chapters/05/results/<gpu>.json.

Anywhere else (no GPU, or an H200) it compiles every k4 configuration for sm_100a and sm_103a,
prints the compile report (registers, shared memory, tensor-memory columns, spills, blocks per SM
from the occupancy model, and the SASS instructions that show the tcgen05 path), says plainly that
k4 was not run, and exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    SEED_WORKLOADS,
    Requirement,
    Table,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    checks_table,
    describe_gpu,
    print_not_run,
    records_table,
    run_checks,
    run_main,
    run_variants,
    save_results,
    show,
    timing_options,
)
from moe_gemm.variants.k4 import SUPPORTED_CAPABILITIES

CHAPTER = "05"
REQUIRES = Requirement(lambda capability: capability in SUPPORTED_CAPABILITIES,
                       "k4 needs compute capability 10.x (10.0 or 10.3: tcgen05 and tensor memory exist only in "
                       "the sm_100a and sm_103a targets)")
# The results file's top-level sections, every one written by run_on_gpu's save_results.
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report"})
ARCHES = ("sm_100a", "sm_103a")
WORKLOADS = SEED_WORKLOADS
OPCODES = ("UTCHMMA", "UTCBAR", "LDTM", "UTMALDG", "SYNCS")
K2_PEER = "k2/s3"  # chapter 03's fastest k2 on the H200, timed beside k4 as the mma.sync reference
COMPILE_LEGEND = ("regs: registers per thread; smem KB: static + dynamic shared memory per block; TMEM cols: "
                  "tensor-memory columns allocated (2 accumulators); spills: spill bytes (local memory is refused "
                  "at compile time); blocks/SM and limited by: resident blocks by the occupancy model and tensor "
                  "memory, and what binds; UTCHMMA ... SYNCS: static SASS counts (tcgen05.mma, tcgen05.commit, "
                  "tcgen05.ld, TMA loads, mbarrier operations)")


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser)
    return parser.parse_args(argv)


def k4_variants():
    from moe_gemm.variants.k4 import all_configs

    return all_configs()


# --------------------------------------------------------------------------- compile report

def compile_report(arch: str) -> list[dict[str, Any]]:
    """One row per k4 configuration compiled for ``arch``: moe_gemm.site.compile_report's rows, with
    tensor memory as one more limit on blocks per SM."""
    from moe_gemm.site.compile_report import compile_rows

    variants = k4_variants()
    return [with_tensor_memory(row, variant) for row, variant in zip(compile_rows(variants, arch, OPCODES), variants)]


def with_tensor_memory(row: dict[str, Any], variant) -> dict[str, Any]:
    """``row`` with the TMEM columns a block allocates, the blocks they allow, and the limit updated."""
    from moe_gemm.variants.k4 import tmem_blocks

    by_tmem = tmem_blocks(variant.config)
    blocks = min(row["blocks_per_sm"], by_tmem)
    limits = ([row["limiter"]] if row["blocks_per_sm"] == blocks else []) + (["tensor memory"] if by_tmem == blocks
                                                                            else [])
    return {**row, "tmem_columns": variant.config.tmem_columns, "by_tmem": by_tmem, "blocks_per_sm": blocks,
            "limiter": " = ".join(limits)}


def compile_table(rows: list[dict[str, Any]]) -> Table:
    headers = ("kernel", "regs", "smem KB", "TMEM cols", "spills", "blocks/SM", "limited by", *OPCODES)
    body = tuple((r["variant"], r["registers"], f"{r['smem_bytes'] / 1024:.1f}", r["tmem_columns"], r["spill_bytes"],
                  r["blocks_per_sm"], r["limiter"], *(r["sass"][op] for op in OPCODES)) for r in rows)
    return Table(headers, body, title=f"Compile report ({rows[0]['arch']}, NVRTC)", legend=COMPILE_LEGEND)


# --------------------------------------------------------------------------- no GPU

def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "k4", reason, f"compiling every configuration for {' and '.join(ARCHES)} instead",
                  ("--quick", "--no-peers"), "nothing is timed without a compute capability 10.x GPU")
    for arch in ARCHES:
        show(compile_table(compile_report(arch)))
    print("k4 is not run here: the tables above are the compiler's report; no number in them is a measurement of "
          "k4, and chapter 05 has no recorded results.")
    return 0


# --------------------------------------------------------------------------- with a GPU

def run_on_gpu(args, gpu) -> int:
    from moe_gemm.variants.peer.torch import available_peers
    from moe_gemm.variants.registry import get

    timing = timing_options(args)
    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch)
    show(compile_table(report))

    variants = k4_variants()
    checks = run_checks(variants)
    show(checks_table(checks))
    failed = [c for c in checks if not c["passed"]]
    if failed:
        print(f"{len(failed)} check(s) FAILED; not timing anything.", file=sys.stderr)
        return 1

    timed = [get(K2_PEER), *variants] + ([] if args.no_peers else list(available_peers()))
    records = run_variants(timed, WORKLOADS, **timing)
    show(records_table(records, title="Every measurement"))
    path = save_results(CHAPTER, records, gpu, checks=checks, compile_report=report)
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
