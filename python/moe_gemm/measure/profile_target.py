"""One variant, one workload, a known number of launches: the program Nsight Compute profiles.

    python -m moe_gemm.measure.profile_target k1/bm64 16384 0.0 [--warmup 10]
    python -m moe_gemm.measure.profile_target k8/blockwise-bm128 65536 0.0 --format e4m3-blockwise

Launch order, which :func:`moe_gemm.measure.profile.profile_variant` relies on to pick the launch to
profile with ``--launch-skip``: one checked launch (a wrong answer exits 1 before anything
else runs), ``--warmup`` warm-up launches, then exactly one more launch: the profiled one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from moe_gemm.core.checks import MAX_DIMENSION, MAX_EXPERTS, MAX_REPEATS, MAX_ROWS, MAX_SKEW
from moe_gemm.core.cli import chapter_parser, nonnegative_float, nonnegative_int, positive_int, run_main
from moe_gemm.model.problem import BF16_OPERANDS, FORMATS, format_named
from moe_gemm.model.workloads import SEED_EXPERTS, SEED_K, SEED_N, Workload

CHECK_LAUNCHES = 1
DEFAULT_WARMUP = 10


def launches_before_profiled(warmup: int = DEFAULT_WARMUP) -> int:
    """How many launches of the kernel precede the one to profile."""
    return CHECK_LAUNCHES + warmup


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser(__doc__)
    parser.add_argument("variant", help="a variant name, e.g. k1/bm64")
    parser.add_argument("tokens", type=nonnegative_int("tokens", MAX_ROWS), help="routed rows M_tot")
    parser.add_argument("skew", type=nonnegative_float("skew", MAX_SKEW), help="routing skew s")
    parser.add_argument("--experts", type=positive_int("--experts", MAX_EXPERTS), default=SEED_EXPERTS)
    parser.add_argument("-K", type=positive_int("-K", MAX_DIMENSION), default=SEED_K)
    parser.add_argument("-N", type=positive_int("-N", MAX_DIMENSION), default=SEED_N)
    parser.add_argument("--warmup", type=nonnegative_int("--warmup", MAX_REPEATS), default=DEFAULT_WARMUP)
    parser.add_argument("--ragged", choices=("M", "K"), default="M",
                        help="M: the forward (default); K: the weight gradient dB = A_e^T dC_e (chapter 09)")
    parser.add_argument("--format", choices=list(FORMATS), default=BF16_OPERANDS.name,
                        help="the operands: 16-bit (default bf16), or e4m3 with rowwise or blockwise scales "
                             "(chapter 10)")
    args = parser.parse_args(argv)

    from moe_gemm.cuda.device import DeviceProblem, synchronize
    from moe_gemm.measure.check import verify
    from moe_gemm.variants.registry import get

    variant = get(args.variant)
    workload = Workload(args.tokens, args.skew, args.experts, args.K, args.N, args.ragged).in_format(
        format_named(args.format))
    dev = DeviceProblem(workload.problem(0))
    check = verify(variant, dev)  # launch 1: checked
    if not check.passed:
        print(f"{variant.name}: wrong answer ({check.describe()}); not profiling", file=sys.stderr)
        return 1
    prepared = variant.prepare(dev)
    for _ in range(args.warmup):
        prepared.launch()
    from cuda.bindings import driver

    synchronize()
    driver.cuProfilerStart()  # the range ncu --profile-from-start off profiles
    prepared.launch()  # the profiled launch
    synchronize()
    driver.cuProfilerStop()
    print(f"{variant.name} on {workload.label}: {check.describe()}, {args.warmup} warm-up launches, 1 profiled")
    return 0


if __name__ == "__main__":
    run_main(main)
