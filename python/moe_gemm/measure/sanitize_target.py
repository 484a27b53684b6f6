"""A small, exact workload for compute-sanitizer: every edge case once, for each named variant.

    compute-sanitizer --tool memcheck  --error-exitcode 1 python -m moe_gemm.measure.sanitize_target k1
    compute-sanitizer --tool racecheck --error-exitcode 1 python -m moe_gemm.measure.sanitize_target k1
    compute-sanitizer --tool synccheck --error-exitcode 1 python -m moe_gemm.measure.sanitize_target k1/bm64

Arguments are variant names (``k1/bm64``) or whole families (``k1``), resolved through
:mod:`moe_gemm.variants.registry`. Each variant runs once on every case of
:data:`moe_gemm.model.edge_cases.EDGE_CASES` with integer-valued inputs, checked exactly against the
reference. A case the variant refuses (ValueError before launch) is reported as unsupported;
a wrong answer makes the exit status 1, so a run is clean only if the sanitizer reports nothing
*and* the exit status is 0.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Sequence

from moe_gemm.core.checks import MAX_SEED
from moe_gemm.core.cli import chapter_parser, nonnegative_int, run_main
from moe_gemm.model.edge_cases import EDGE_CASES


def find_compute_sanitizer() -> str | None:
    """compute-sanitizer: $COMPUTE_SANITIZER, PATH, a CUDA toolkit, or a pip-installed NVIDIA wheel."""
    candidates = [os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer"),
                  *sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"), reverse=True)]
    try:
        import nvidia

        for root in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "**", "compute-sanitizer"), recursive=True))
    except ImportError:
        pass
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def sanitizer_command(tool: str, selectors: Sequence[str], sanitizer: str | None = None) -> list[str]:
    """The command line that runs this module under compute-sanitizer's ``tool``."""
    sanitizer = sanitizer or find_compute_sanitizer()
    if sanitizer is None:
        raise FileNotFoundError("compute-sanitizer not found: put it on PATH or set COMPUTE_SANITIZER")
    return [sanitizer, "--tool", tool, "--error-exitcode", "1",
            sys.executable, "-m", "moe_gemm.measure.sanitize_target", *selectors]


def run_cases(variants: Sequence, *, seed: int = 0) -> int:
    """Check every variant on every edge case; returns the number of wrong answers."""
    from moe_gemm.measure.check import verify

    failures = 0
    for variant in variants:
        # A family may add cases of its own (k6: enough units that every block runs several tiles), and one
        # that takes another kind of problem names its own edge cases (k7: the weight gradient's).
        for case in (*getattr(variant, "edge_cases", EDGE_CASES), *getattr(variant, "sanitize_cases", ())):
            problem = case.exact_problem(seed=seed)
            try:
                check = verify(variant, problem, exact=True)
            except ValueError as unsupported:
                print(f"{variant.name:18s} {case.name:32s} unsupported: {unsupported}")
                continue
            failures += not check.passed
            print(f"{variant.name:18s} {case.name:32s} {check.describe()}")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser(__doc__)
    parser.add_argument("variants", nargs="+", metavar="NAME",
                        help="variant names (k1/bm64) or families (k1)")
    parser.add_argument("--seed", type=nonnegative_int("--seed", MAX_SEED), default=0,
                        help="seed of the integer-valued inputs (default 0)")
    args = parser.parse_args(argv)
    from moe_gemm.cuda.gpu import detect_gpu
    from moe_gemm.variants.registry import resolve

    variants = resolve(args.variants)
    if detect_gpu() is None:
        print("no NVIDIA GPU here: nothing to sanitize", file=sys.stderr)
        return 0
    failures = run_cases(variants, seed=args.seed)
    print(f"{failures} wrong answer(s)" if failures else "every case exact")
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
