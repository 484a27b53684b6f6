"""One variant, one workload, a known number of launches: the program Nsight Compute profiles.

    python -m moe_gemm.measure.profile_target k1/bm64 16384 0.0 [--warmup 10]
    python -m moe_gemm.measure.profile_target k8/blockwise-bm128 65536 0.0 --format e4m3-blockwise
    python -m moe_gemm.measure.profile_target k6/dswiglu-bn128 65536 0 --experts 8 -K 4096 -N 14336

Launch order, which :func:`moe_gemm.measure.profile.profile_variant` relies on to pick the launch to
profile with ``--launch-skip``: one checked launch (a wrong answer exits 1 before anything
else runs), ``--warmup`` warm-up launches, then exactly one more launch: the profiled one.
The fused SwiGLU backward's configurations (moe_gemm.variants.k6.config.FUSED_BACKWARD: chapter 09) run on
torch's tensors, dy [M_tot, K], W_down [E, N, K] and the saved pre-activation [M_tot, 2N], checked against the
unfused path; profile them in the profiler range (their inputs are made by kernels of torch's).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from moe_gemm.core.checks import MAX_DIMENSION, MAX_EXPERTS, MAX_REPEATS, MAX_ROWS, MAX_SKEW
from moe_gemm.core.cli import chapter_parser, nonnegative_float, nonnegative_int, positive_int, run_main
from moe_gemm.model.problem import BF16_OPERANDS, FORMATS, format_named
from moe_gemm.model.workloads import SEED_EXPERTS, SEED_K, SEED_N, Workload
from moe_gemm.variants.k6.config import FUSED_BACKWARD

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

    workload = Workload(args.tokens, args.skew, args.experts, args.K, args.N, args.ragged).in_format(
        format_named(args.format))
    sync = synchronize
    if args.variant in FUSED_BACKWARD:  # torch's tensors and the op's launch, on torch's stream
        import torch

        from moe_gemm.measure.training import fused_backward_call

        launch, checked = fused_backward_call(args.variant, workload), "checked against the unfused path"
        sync = torch.cuda.synchronize
    else:
        variant = get(args.variant)
        dev = DeviceProblem(workload.problem(0))
        check = verify(variant, dev)  # launch 1: checked
        if not check.passed:
            print(f"{variant.name}: wrong answer ({check.describe()}); not profiling", file=sys.stderr)
            return 1
        # The prepared launch is kept, not only its launch(): it owns the output and the buffers the launch reads
        # (Prepared.output, keep_alive), which would be freed with it, and the launches would write freed memory.
        prepared = variant.prepare(dev)
        launch, checked = prepared.launch, check.describe()
    for _ in range(args.warmup):
        launch()
    from cuda.bindings import driver

    sync()
    driver.cuProfilerStart()  # the range ncu --profile-from-start off profiles
    launch()  # the profiled launch
    sync()
    driver.cuProfilerStop()
    print(f"{args.variant} on {workload.label}: {checked}, {args.warmup} warm-up launches, 1 profiled")
    return 0


if __name__ == "__main__":
    run_main(main)
