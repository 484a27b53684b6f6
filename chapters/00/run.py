"""Chapter 00: the problem, its routing, the flat tile list and row utilisation (eta).

    python chapters/00/run.py                        # the seed configuration, balanced routing
    python chapters/00/run.py --skew 1.2             # the seed's skewed routing
    python chapters/00/run.py --tokens 2048 --bm 32 64

No GPU is involved: every number below is arithmetic on the routing. The last table is the
eta-only estimate for the seed configuration (E=64, N=2688), scaled from the seed's B300 k2
(S=2, BM=128) balanced rate of 440.1 TFLOP/s at 16,384 rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from moe_gemm.cli import add_problem_arguments, chapter_parser, run_main, tile_size
from moe_gemm.routing import expert_counts
from moe_gemm.workload_tables import (SEED_B300_K2_LABEL, SEED_B300_K2_TFLOPS, SEED_SKEWS, estimate_table,
                                      eta_detail_table, routing_table, skew_label, tile_count_table)

SEED_TOKENS = (16384, 2048)


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_problem_arguments(parser)
    parser.add_argument("--bm", type=tile_size("--bm"), nargs="+", default=[32, 64, 128], metavar="BM",
                        help="M tile sizes for the eta table (powers of two >= 16; default 32 64 128)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workload = [(args.tokens, args.skew)]
    counts = expert_counts(args.experts, args.tokens, args.skew)
    print(f"problem: E = {args.experts} experts, M_tot = {args.tokens:,} rows, K = {args.K}, N = {args.N}, "
          f"skew s = {skew_label(args.skew)}\n")
    print(routing_table(args.experts, workload).text())
    print("m_e proportional to (e+1)^-s, floored, leftover rows to the heaviest experts\n")

    print(tile_count_table(args.experts, args.N, workload).text())
    print("tiles = sum_e ceil(m_e / BM) * ceil(N / BN): one block each, none crossing an expert boundary\n")

    print(eta_detail_table(counts, args.K, args.N, args.bm).text())
    print("eta = real rows / scheduled rows: a partial tile runs the full MMA loop, padding included\n")

    # The estimate needs a measured balanced rate for one BM; the only one we have without a
    # GPU is the seed's B300 k2 number, so the table is for the seed's shape whatever the flags say.
    seed_workloads = [(tokens, skew) for tokens in SEED_TOKENS for skew in SEED_SKEWS]
    table = estimate_table(64, seed_workloads, (32, 64, 128), SEED_B300_K2_TFLOPS, estimate_bm=128,
                           rate_label=SEED_B300_K2_LABEL)
    print(table.text())
    print("(padding only: per-block staging, tail blocks, occupancy and caching are not modelled)")
    return 0


if __name__ == "__main__":
    run_main(main)
