"""k0 in numba's CUDA simulator: no GPU, no harness stream; numpy arrays in, numpy arrays out.

The simulator must be switched on before numba is first imported, so :func:`simulator_check`
runs the kernel in a child process (``python -m moe_gemm.variants.k0.simulator``) with
NUMBA_ENABLE_CUDASIM=1, and this process keeps numba's real CUDA target. :func:`simulate` is
what that child (or any process started with the switch on) calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_gemm.core.checks import MAX_DIMENSION, MAX_EXPERTS, MAX_ROWS, MAX_SEED, require_int
from moe_gemm.core.cli import chapter_parser, nonnegative_int, positive_int, run_main
from moe_gemm.cuda.device import BF16_NAN_BITS
from moe_gemm.model.problem import BF16, Problem, problem_from_counts
from moe_gemm.model.reference import Check, check_output
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants.k0 import BM, BN, THREADS, check_inputs, kernel_module
from moe_gemm.variants.k0.numba_loader import simulator_enabled

# An empty expert, a one-row expert, a partial tile (37 rows) and a full tile plus a partial one
# (70 rows); K = 32 is two K slices; N = 72 is a full N tile and a partial one (the column guard).
SIMULATOR_COUNTS = (0, 1, 37, 70)
SIMULATOR_K = 32
SIMULATOR_N = 72
SIMULATOR_TIMEOUT_S = 600


def _require_simulator() -> None:
    if not simulator_enabled():
        raise RuntimeError("numba's CUDA simulator is off in this process: start it with NUMBA_ENABLE_CUDASIM=1 "
                           "(or use simulator_check(), which does)")


def simulate(problem: Problem) -> np.ndarray:
    """Run k0 on ``problem`` in numba's CUDA simulator; C [M_tot, N] as bf16.

    Blocks run one after another as 256 Python threads each: keep problems to a few tiles.
    """
    _require_simulator()
    check_inputs(problem.K, problem.N)
    tiles = tile_list(problem.counts, problem.N, BM, BN)
    c = np.full((problem.tokens, problem.N), BF16_NAN_BITS, dtype=np.uint16)  # poisoned, as on the GPU
    if tiles.shape[0]:
        kernel = kernel_module().k0_fp32
        kernel[int(tiles.shape[0]), THREADS](problem.a.view(np.uint16), problem.b.view(np.uint16), tiles, c)
    return c.view(BF16)


def convert_round_trip(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's own conversions applied to fp32 ``values`` (on the GPU, or in the simulator).

    Returns (bf16 bits as uint16, those bits widened back to fp32). Host arrays go through
    numba's default stream: this is a test helper, not a timed launch.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    bits = np.zeros(x.shape, dtype=np.uint16)
    widened = np.zeros(x.shape, dtype=np.float32)
    if x.size:
        threads = 128
        kernel_module().bf16_round_trip[(x.size + threads - 1) // threads, threads](x, bits, widened)
    return bits, widened


def conversion_probes(random_count: int = 512, seed: int = 0) -> np.ndarray:
    """fp32 values that exercise every branch of the bf16 rounding: ties to even (both ways),
    carries into the exponent, overflow to inf, infinities, NaN, zeros and subnormals, plus
    random bit patterns."""
    special = np.array([
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,  # 0, inf, NaN
        0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000,  # exact ties: to even down, to even up
        0x3F808001, 0x3F807FFF,  # just above and just below a tie
        0x3FFF8000, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF,  # carry into the exponent; overflow to +-inf
        0x00008000, 0x00018000, 0x0000FFFF, 0x80000001,  # subnormals, with ties
        0x3F800000, 0x43808000, 0x43818000,  # 1.0; 257 and 259 (ties between bf16 integers)
    ], dtype=np.uint32)
    rng = np.random.default_rng(seed)
    random = rng.integers(0, 2**32, size=random_count, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([special, random]).view(np.float32)


def expected_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even bf16 bits of fp32 ``values`` per ml_dtypes; NaN as 0x7FC0."""
    bits = np.asarray(values, dtype=np.float32).astype(BF16).view(np.uint16).copy()
    bits[np.isnan(values)] = BF16_NAN_BITS
    return bits


@dataclass(frozen=True)
class SimulatorResult:
    """What a simulator run in a child process reports."""

    check: Check
    conversions_ok: bool
    conversion_mismatches: int
    tiles: int
    seconds: float

    @property
    def passed(self) -> bool:
        return self.check.passed and self.conversions_ok

    def describe(self) -> str:
        conversions = ("ok" if self.conversions_ok else f"FAILED ({self.conversion_mismatches} mismatches)")
        return (f"k0 in the CUDA simulator, {self.tiles} tiles: {self.check.describe()}; bf16 conversions on "
                f"{len(conversion_probes())} probes: {conversions}; {self.seconds:.1f} s")


def simulator_check(counts: Sequence[int] = SIMULATOR_COUNTS, K: int = SIMULATOR_K, N: int = SIMULATOR_N,
                    seed: int = 0, timeout_s: float = SIMULATOR_TIMEOUT_S) -> SimulatorResult:
    """Run k0 in numba's CUDA simulator in a child process, on integer-valued inputs, checked exactly.

    The child has NUMBA_ENABLE_CUDASIM=1 in its environment, so this process (and a test session
    around it) keeps numba's real CUDA target.
    """
    check_inputs(K, N)
    command = [sys.executable, "-m", __name__, "--counts", *(str(int(c)) for c in counts),
               "-K", str(K), "-N", str(N), "--seed", str(seed)]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the simulator run failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    report: dict[str, Any] = json.loads(lines[-1])
    check = Check(rel_error=report["rel_error"], nonfinite=report["nonfinite"], mismatches=report["mismatches"],
                  exact=True)
    return SimulatorResult(check=check, conversions_ok=report["conversion_mismatches"] == 0,
                           conversion_mismatches=report["conversion_mismatches"], tiles=report["tiles"],
                           seconds=report["seconds"])


def _simulator_main(argv: Sequence[str] | None = None) -> int:
    """The child of :func:`simulator_check`: one JSON line on stdout."""
    parser = chapter_parser("Run k0 in numba's CUDA simulator (needs NUMBA_ENABLE_CUDASIM=1).")
    parser.add_argument("--counts", type=nonnegative_int("--counts", MAX_ROWS), nargs="+",
                        default=list(SIMULATOR_COUNTS), metavar="M", help="rows per expert")
    parser.add_argument("-K", type=positive_int("-K", MAX_DIMENSION), default=SIMULATOR_K)
    parser.add_argument("-N", type=positive_int("-N", MAX_DIMENSION), default=SIMULATOR_N)
    parser.add_argument("--seed", type=nonnegative_int("--seed", MAX_SEED), default=0)
    args = parser.parse_args(argv)
    try:  # the bounds of a routing (model.routing.expert_counts) on the experts and their rows' sum
        require_int("--counts: the experts", len(args.counts), limit=MAX_EXPERTS)
        require_int("--counts: the rows' sum M_tot", sum(args.counts), limit=MAX_ROWS)
    except ValueError as error:
        parser.error(str(error))
    _require_simulator()
    counts = np.array(args.counts, dtype=np.int64)
    start = time.perf_counter()
    problem = problem_from_counts(counts, args.K, args.N, values="integer", seed=args.seed)
    check = check_output(simulate(problem), problem, exact=True)
    probes = conversion_probes()
    bits, widened = convert_round_trip(probes)
    expected = expected_bf16_bits(probes)
    mismatches = int((bits != expected).sum())
    mismatches += int((widened.view(np.uint32) != (bits.astype(np.uint32) << 16)).sum())
    print(json.dumps({"rel_error": check.rel_error, "nonfinite": check.nonfinite, "mismatches": check.mismatches,
                      "conversion_mismatches": mismatches, "tiles": int(tile_list(counts, args.N, BM, BN).shape[0]),
                      "seconds": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    run_main(_simulator_main)
