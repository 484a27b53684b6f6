"""Checking and timing any variant the same way: kernels, peers and ceilings alike.

A variant (:class:`~moe_gemm.cuda.variant.Variant`) turns a problem on the device into a
:class:`~moe_gemm.cuda.variant.Prepared` launch. Everything else (poisoning the output,
comparing with the reference, rotating input sets, timing, the results record) is done here
once, so every chapter measures its kernels exactly as it measures the peers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceProblem, synchronize
from moe_gemm.cuda.timing import Timing, rotation_sets, time_launches
from moe_gemm.cuda.variant import Variant
from moe_gemm.model.problem import BF16, Problem
from moe_gemm.model.reference import Check, check_output
from moe_gemm.model.tiles import eta, scheduled_flops, tile_count


def run_once(variant: Variant, dev: DeviceProblem) -> np.ndarray:
    """Poison C, launch once, return C on the host. M_tot = 0 launches nothing."""
    prepared = variant.prepare(dev)
    prepared.output.fill_u16(BF16_NAN_BITS)
    if dev.problem.tokens:
        prepared.launch()
    synchronize()
    out = prepared.output.download()
    return out if out.dtype == BF16 else out.astype(BF16)


def verify(variant: Variant, problem: Problem | DeviceProblem, *, exact: bool = False) -> Check:
    """Run once and compare with the numpy reference (``exact`` for integer-valued inputs). A variant
    with an ``epilogue`` attribute (k6's fused SwiGLU) is compared with that epilogue's reference."""
    dev = problem if isinstance(problem, DeviceProblem) else DeviceProblem(problem)
    return check_output(run_once(variant, dev), dev.problem, exact=exact,
                        epilogue=getattr(variant, "epilogue", "none"))


def _workload(problem: Problem) -> dict[str, Any]:
    return {"experts": problem.experts, "K": problem.K, "N": problem.N, "tokens": problem.tokens,
            "skew": float(problem.skew)}


def measure(variant: Variant, sets: list[DeviceProblem], *, check: Check | None = None, **timing: int) -> dict[str, Any]:
    """Time ``variant`` rotating over input ``sets`` (same shape and routing), as a results record.

    ``sets[0]`` is checked against the reference first unless ``check`` is given; a wrong
    answer raises instead of producing a number.
    """
    problem = sets[0].problem
    check = check or verify(variant, sets[0])
    if not check.passed:
        raise RuntimeError(f"{variant.name}: output is wrong ({check.describe()}); not timing it")
    prepared = [variant.prepare(dev) for dev in sets]
    result: Timing = time_launches(lambda i: prepared[i % len(prepared)].launch(), **timing)
    first = prepared[0]
    record = {"variant": variant.name, **_workload(problem), "median_ms": result.median_ms,
              "min_ms": result.min_ms, "max_ms": result.max_ms,
              "useful_tflops": result.tflops(problem.useful_flops), "rel_error": check.rel_error,
              "input_sets": len(sets)}
    if first.bm is not None and first.bn is not None:
        record.update({
            "bm": first.bm, "bn": first.bn, "eta": eta(problem.counts, first.bm),
            "tiles": tile_count(problem.counts, problem.N, first.bm, first.bn),
            "scheduled_tflops": result.tflops(scheduled_flops(problem.counts, problem.K, problem.N, first.bm, first.bn)),
        })
    record.update(first.launch_info)
    if first.resources is not None:
        r = first.resources
        record.update({"registers": r.registers, "smem_bytes": r.smem_bytes, "spill_bytes": r.spill_bytes,
                       "warps_per_block": r.warps_per_block, "blocks_per_sm": r.blocks_per_sm})
    return record


def input_sets(make: Callable[[int], Problem]) -> list[DeviceProblem]:
    """Enough independent input sets (``make(seed)``), uploaded, that rotating them defeats the L2."""
    first = make(0)
    nbytes = first.a.nbytes + first.b.nbytes + first.tokens * first.N * 2
    problems = [first] + [make(seed) for seed in range(1, rotation_sets(max(nbytes, 1)))]
    return [DeviceProblem(p) for p in problems]


def progress(message: str) -> None:
    """One line of progress on stderr, so long sweeps show where they are."""
    print(message, file=sys.stderr, flush=True)
