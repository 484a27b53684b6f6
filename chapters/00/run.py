"""Chapter 00: the problem, its routing, the flat tile list and row utilisation (eta).

"The seed" is the B300 worklog this project grew from; its workload, E = 64 experts, K = 1024,
N = 2688 and 16,384 routed rows, is the default here, shown at the seed's two routings.

    python chapters/00/run.py                        # the seed's two routings: s = 0 and s = 1.2
    python chapters/00/run.py --skew 1.2             # one routing only
    python chapters/00/run.py --tokens 2048 --bm 32 64

No GPU is involved: every number below is arithmetic on the routing. The last table is the
eta-only estimate for the rows asked for, scaled from the seed's B300 k2 (S=2, BM=128) balanced
rate of 440.1 TFLOP/s at 16,384 rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from moe_gemm.chapter import NO_GPU, SEED, chapter_main, chapter_parser, run_main, show
from moe_gemm.core.checks import MAX_TILE_ROWS
from moe_gemm.core.cli import add_problem_arguments, tile_size
from moe_gemm.model.routing import expert_counts
from moe_gemm.site.workload_tables import (
    SEED_B300_K2_LABEL,
    SEED_B300_K2_TFLOPS,
    estimate_table,
    eta_detail_table,
    routing_table,
    skew_label,
    tile_count_table,
)

CHAPTER = "00"
REQUIRES = NO_GPU
# No results file: every number here is arithmetic on the routing.
SECTIONS = frozenset()
SEED_SKEWS_SHOWN = (0.0, 1.2)  # the seed's balanced and skewed routings
BMS = (32, 64, 128)  # the M tile sizes of the eta tables unless --bm says otherwise


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_problem_arguments(parser, SEED, show_skews="the seed's two, 0 and 1.2")
    parser.add_argument("--bm", type=tile_size("--bm"), nargs="+", default=list(BMS), metavar="BM",
                        help=f"M tile sizes for the eta table (powers of two from 16 to {MAX_TILE_ROWS.value}; "
                             f"default {' '.join(map(str, BMS))})")
    return parser.parse_args(argv)


def estimate_title_note(experts: int, K: int, N: int) -> str:
    """The estimate scales a rate measured at the seed's shape; say so when the flags ask for another."""
    if (experts, K, N) == (SEED.experts, SEED.K, SEED.N):
        return SEED_B300_K2_LABEL
    return (f"{SEED_B300_K2_LABEL}, measured at E = {SEED.experts}, K = {SEED.K:,}, N = {SEED.N:,}: only "
            "indicative at this shape")


def run_without_gpu(args, reason: str) -> int:
    """Every table of the chapter, for the rows, skews and tile sizes the flags ask for (``reason``:
    NO_GPU's, that no GPU is involved)."""
    skews = SEED_SKEWS_SHOWN if args.skew is None else (args.skew,)
    workloads = [(args.tokens, skew) for skew in skews]
    print(f"problem: E = {args.experts:,} experts, M_tot = {args.tokens:,} rows, K = {args.K:,}, N = {args.N:,}, "
          f"skew s = {' and '.join(skew_label(s) for s in skews)}\n")
    show(routing_table(args.experts, workloads))
    show(tile_count_table(args.experts, args.N, workloads))
    for tokens, skew in workloads:
        table = eta_detail_table(expert_counts(args.experts, tokens, skew), args.K, args.N, args.bm,
                                 title=f"Row utilisation eta for {tokens:,} rows, s = {skew_label(skew)}")
        show(table)
    print(estimate_table(args.experts, workloads, args.bm, SEED_B300_K2_TFLOPS, estimate_bm=128,
                         rate_label=estimate_title_note(args.experts, args.K, args.N)).text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # REQUIRES is NO_GPU: chapter_main looks for no GPU, and there is no run_on_gpu.
    return chapter_main(parse_args(argv), REQUIRES, None, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
