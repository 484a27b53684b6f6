"""k0: the FP32 baseline (kernels/k0_fp32.py, numba-cuda), chapter 01.

One 256-thread block per 64 x 64 tile of the flat tile list, K in slices of 16, bf16 inputs
widened to fp32 in shared memory, fp32 accumulation, one bf16 rounding at the store.

What the kernel cannot take is refused here, before any launch, with a ValueError naming the
rule: K must be a multiple of BK = 16 (there is no K tail), the inputs must be bf16 of the
problem's shapes, and the GPU must be one that CUDA 13 (numba-cuda's compiler here) targets.
N and the row counts are free: the kernel guards rows at each expert's end and columns at N.

The same kernel also runs in numba's CUDA simulator, which must be switched on before numba is
first imported; :func:`simulator_check` therefore runs it in a child process, and
:func:`simulate` is what that child (or any process started with NUMBA_ENABLE_CUDASIM=1) calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bench import Prepared, Resources
from ..device import BF16_NAN_BITS, DeviceProblem, to_device
from ..gpu import detect_gpu, require_capability
from ..numba_kernels import as_numba_array, kernel_resources, load_kernel_module, numba_stream, simulator_enabled
from ..problem import BF16, Problem, problem_from_counts
from ..reference import Check, check_output
from ..tiles import tile_list

KERNEL_STEM = "k0_fp32"  # kernels/k0_fp32.py
KERNEL_FUNCTION = "k0_fp32"
# The kernel's configuration, repeated here so that importing this module does not import numba
# (which would fix the simulator switch for the whole process); _kernel_module() checks they agree.
BM, BN, BK = 64, 64, 16
THREADS = 256
WARPS_PER_BLOCK = THREADS // 32
# bf16 travels as its 16-bit words: A [M_tot, K], B [E, K, N], tiles [T, 4] int32, C [M_tot, N].
SIGNATURE = "void(uint16[:, ::1], uint16[:, :, ::1], int32[:, ::1], uint16[:, ::1])"
MIN_CAPABILITY = (7, 5)  # CUDA 13, whose NVVM numba-cuda compiles with here, targets sm_75 and newer
# SASS instructions the chapter talks about (static counts): the FFMAs of the unrolled inner loop,
# its 16-byte shared loads (every LDS should be an LDS.128), the bf16 loads and stores, the two
# barriers, and local memory (LDL/STL), which must not appear at all.
SASS_OPCODES = ("FFMA", "LDS.128", "LDS", "LDG.E.U16", "STS", "BAR.SYNC", "STG.E.U16", "LDL", "STL")


# --8<-- [start:checks]
def check_inputs(K: int, N: int) -> None:
    """ValueError naming the first rule of the kernel that these inputs break."""
    if K % BK:
        raise ValueError(f"k0 needs K to be a multiple of BK = {BK} (it stages whole "
                         f"K slices and has no K tail), got K = {K}")
    if N < 1:
        raise ValueError(f"k0 needs N >= 1, got N = {N}")
# --8<-- [end:checks]


def micro_tile_origin(thread: int) -> tuple[int, int]:
    """(row, column) in the 64 x 64 tile of the first element of ``thread``'s 4 x 4 micro-tile.

    The kernel's own map (kernels/k0_fp32.py, section "tile"), written out for the chapter's
    figure and tests: warps tile the block 4 x 2, a warp's 32 lanes tile its 16 x 32 patch 4 x 8.
    """
    warp, lane = divmod(thread, 32)
    return (warp // 2 * 4 + lane // 8) * 4, (warp % 2 * 8 + lane % 8) * 4


def _kernel_module():
    module = load_kernel_module(KERNEL_STEM)
    kernel_config = (module.BM, module.BN, module.BK, module.THREADS)
    if kernel_config != (BM, BN, BK, THREADS):
        raise RuntimeError(f"kernels/{KERNEL_STEM}.py has (BM, BN, BK, THREADS) = {kernel_config}, "
                           f"but its wrapper expects {(BM, BN, BK, THREADS)}")
    return module


class K0Fp32:
    """The variant ``k0``: the numba FP32 kernel over the 64 x 64 flat tile list."""

    name = "k0"
    bm, bn, bk = BM, BN, BK
    kernel_function = KERNEL_FUNCTION

    def __repr__(self) -> str:
        return "K0Fp32()"

    def compile(self):
        """The kernel compiled for the current GPU (numba's ``_Kernel``; compiled once per process)."""
        return _kernel_module().k0_fp32.compile(SIGNATURE)

    def resources(self) -> Resources:
        """Registers, shared memory and local memory as the driver reports them for the compiled kernel."""
        return kernel_resources(self.compile(), WARPS_PER_BLOCK)

    def sass_counts(self) -> dict[str, int]:
        """Static counts of :data:`SASS_OPCODES` in the compiled kernel (numba's inspect_sass; nvdisasm
        from the nvidia-cuda-nvdisasm wheel)."""
        from ..build import opcode_counts

        return opcode_counts(self.compile().inspect_sass(), SASS_OPCODES)

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        for name, array, shape in (("A", dev.a, problem.a.shape), ("B", dev.b, problem.b.shape)):
            if array.dtype != BF16 or tuple(array.shape) != tuple(shape):
                raise ValueError(f"k0 needs {name} as bf16 {shape} on the device, got {array.dtype} {array.shape}")
        check_inputs(problem.K, problem.N)
        require_capability(detect_gpu(), MIN_CAPABILITY, "k0 (numba-cuda, compiled by CUDA 13)")
        return self.prepare_tiles(dev, tile_list(problem.counts, problem.N, BM, BN))

    # --8<-- [start:launch]
    def prepare_tiles(self, dev: DeviceProblem, tiles_host: np.ndarray) -> Prepared:
        """A launch over the given tile descriptors: :meth:`prepare` passes the full
        list; a test can pass fewer to see the NaN poison of the tiles nobody wrote."""
        resources = self.resources()
        output = dev.new_output()  # NaN-poisoned (and again before every run)
        if tiles_host.shape[0] == 0:  # M_tot = 0: no tile, no launch, an empty C
            return Prepared(launch=lambda: None, output=output, bm=BM, bn=BN,
                            resources=resources)
        tiles = to_device(np.ascontiguousarray(tiles_host, dtype=np.int32))
        # One block per tile, on the harness stream: the timing events bracket it.
        grid = int(tiles_host.shape[0])
        configured = _kernel_module().k0_fp32[grid, THREADS, numba_stream()]
        args = tuple(as_numba_array(x) for x in (dev.a, dev.b, tiles, output))

        def run() -> None:
            configured(*args)

        return Prepared(launch=run, output=output, bm=BM, bn=BN, resources=resources,
                        keep_alive=[tiles, dev, args])
    # --8<-- [end:launch]


# Names the by-name entry points (sanitizer and profiler targets) resolve; see variants/registry.py.
VARIANTS = {"k0": K0Fp32}


# ---------------------------------------------------------------------------------------------
# The simulator path: no GPU, no harness stream; numpy arrays in, numpy arrays out.

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
        kernel = _kernel_module().k0_fp32
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
        _kernel_module().bf16_round_trip[(x.size + threads - 1) // threads, threads](x, bits, widened)
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


def simulator_check(counts: Sequence[int] = SIMULATOR_COUNTS, K: int = SIMULATOR_K, N: int = SIMULATOR_N,  # noqa: N803
                    seed: int = 0, timeout_s: float = SIMULATOR_TIMEOUT_S) -> SimulatorResult:
    """Run k0 in numba's CUDA simulator in a child process, on integer-valued inputs, checked exactly.

    The child has NUMBA_ENABLE_CUDASIM=1 in its environment, so this process (and a test session
    around it) keeps numba's real CUDA target.
    """
    check_inputs(K, N)
    command = [sys.executable, "-m", __name__, "--counts", ",".join(str(int(c)) for c in counts),
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
    parser = argparse.ArgumentParser(description="Run k0 in numba's CUDA simulator (needs NUMBA_ENABLE_CUDASIM=1).")
    parser.add_argument("--counts", default=",".join(map(str, SIMULATOR_COUNTS)))
    parser.add_argument("-K", type=int, default=SIMULATOR_K)
    parser.add_argument("-N", type=int, default=SIMULATOR_N)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _require_simulator()
    counts = np.array([int(c) for c in args.counts.split(",")], dtype=np.int64)
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
    sys.exit(_simulator_main())
