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

from moe_gemm.cuda.device import DeviceProblem, poison, synchronize
from moe_gemm.cuda.timing import Timing, rotation_sets, time_launches
from moe_gemm.cuda.variant import Variant
from moe_gemm.model.problem import BF16, BF16_OPERANDS, Problem, dtype_name
from moe_gemm.model.reference import Check, check_output
from moe_gemm.model.tiles import eta, scheduled_flops, tile_count


def run_once(variant: Variant, dev: DeviceProblem) -> np.ndarray:
    """Poison the output with NaN of its dtype, launch once, return the output on the host as written.
    An empty output (ragged M with M_tot = 0) launches nothing; ragged K with M_tot = 0 still launches,
    since dB [E, K, N] must come back all zeros."""
    prepared = variant.prepare(dev)
    poison(prepared.output)
    if np.prod(dev.problem.out_shape):
        prepared.launch()
    synchronize()
    return prepared.output.download()


def verify(variant: Variant, problem: Problem | DeviceProblem, *, exact: bool = False) -> Check:
    """Run once and compare with the numpy reference (``exact`` for integer-valued inputs). A variant
    with an ``epilogue`` attribute (k6's fused SwiGLU) is compared with that epilogue's reference."""
    dev = problem if isinstance(problem, DeviceProblem) else DeviceProblem(problem)
    return check_output(run_once(variant, dev), dev.problem, exact=exact,
                        epilogue=getattr(variant, "epilogue", "none"))


def workload_fields(problem: Problem) -> dict[str, Any]:
    """The record's workload fields; the kind of GEMM only where it is not the forward's ragged-M bf16 ->
    bf16, so that every record before the kind existed reads the same."""
    workload = {"experts": problem.experts, "K": problem.K, "N": problem.N, "tokens": problem.tokens,
                "skew": float(problem.skew)}
    if problem.ragged != "M":
        workload["ragged"] = problem.ragged
    if problem.fmt != BF16_OPERANDS:
        workload["format"] = problem.fmt.name
    if problem.out_dtype != BF16:
        workload["out_dtype"] = dtype_name(problem.out_dtype)
    return workload


def measure(variant: Variant, sets: list[DeviceProblem], *, check: Check | None = None,
            **timing: int) -> dict[str, Any]:
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
    runs = first.runs  # a launch() of several runs back to back (a chain of launches in one graph): per run
    record = {"variant": variant.name, **workload_fields(problem), "median_ms": result.median_ms / runs,
              "min_ms": result.min_ms / runs, "max_ms": result.max_ms / runs,
              "useful_tflops": result.tflops(problem.useful_flops * runs), "rel_error": check.rel_error,
              "input_sets": len(sets)}
    if runs > 1:
        record["runs_per_launch"] = runs
    if first.bm is not None and first.bn is not None and problem.ragged == "M":  # eta and tiles count M tiles
        record.update({
            "bm": first.bm, "bn": first.bn, "eta": eta(problem.counts, first.bm),
            "tiles": tile_count(problem.counts, problem.N, first.bm, first.bn),
            "scheduled_tflops": result.tflops(
                scheduled_flops(problem.counts, problem.K, problem.N, first.bm, first.bn)),
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
    scales = sum(s.nbytes for s in (first.scale_a, first.scale_b) if s is not None)
    output = int(np.prod(first.out_shape)) * first.out_dtype.itemsize
    nbytes = first.a.nbytes + first.b.nbytes + scales + output
    problems = [first] + [make(seed) for seed in range(1, rotation_sets(max(nbytes, 1)))]
    return [DeviceProblem(p) for p in problems]


def progress(message: str) -> None:
    """One line of progress on stderr, so long sweeps show where they are."""
    print(message, file=sys.stderr, flush=True)
