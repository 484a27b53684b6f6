"""Timing launches with CUDA events: warm up, time each launch on its own, report the median.

Every launch is bracketed by its own pair of events on the harness stream, so the result is a
distribution of single-launch times (median, min, max) rather than one averaged loop. Callers
pass ``launch(i)``; rotating ``i`` over several input sets keeps small problems from being
served out of the 60 MB L2 (:func:`rotation_sets` says how many sets that needs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from moe_gemm.cuda.device import check_driver, stream_handle, synchronize

WARMUP = 10
ITERATIONS = 50
L2_BYTES = 60 * 1024 * 1024  # H200; B at the seed shape (352 MB) is already far larger


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    samples: tuple[float, ...]

    def tflops(self, flops: float) -> float:
        """Throughput at the median time, in TFLOP/s."""
        return flops / (self.median_ms * 1e-3) / 1e12


def rotation_sets(bytes_per_set: int, l2_bytes: int = L2_BYTES, most: int = 8) -> int:
    """Input sets needed so that the sets together exceed twice the L2 (1 when one set does)."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be > 0, got {bytes_per_set}")
    return max(1, min(most, math.ceil(2 * l2_bytes / bytes_per_set)))


def _elapsed_ms(start, end) -> float:
    from cuda.bindings import driver

    # CUDA 12.8 added cuEventElapsedTime_v2 and CUDA 13 bindings may carry only that name.
    elapsed = getattr(driver, "cuEventElapsedTime_v2", None) or driver.cuEventElapsedTime
    return float(check_driver(elapsed(start, end)))


def time_launches(launch: Callable[[int], None], *, warmup: int = WARMUP, iterations: int = ITERATIONS) -> Timing:
    """Time ``launch(i)`` (which must enqueue its work on the harness stream) ``iterations`` times.

    Events come from the driver API: cuda.core's EventOptions changed its fields between the
    1.2 releases this project meets, the driver's cuEventCreate did not.
    """
    from cuda.bindings import driver

    if iterations < 1 or warmup < 0:
        raise ValueError("need iterations >= 1 and warmup >= 0")
    stream = driver.CUstream(stream_handle())
    for i in range(warmup):
        launch(i)
    flags = driver.CUevent_flags.CU_EVENT_DEFAULT
    starts = [check_driver(driver.cuEventCreate(flags)) for _ in range(iterations)]
    ends = [check_driver(driver.cuEventCreate(flags)) for _ in range(iterations)]
    try:
        for i in range(iterations):
            check_driver(driver.cuEventRecord(starts[i], stream))
            launch(warmup + i)
            check_driver(driver.cuEventRecord(ends[i], stream))
        synchronize()
        samples = tuple(_elapsed_ms(start, end) for start, end in zip(starts, ends))
    finally:
        for event in starts + ends:
            driver.cuEventDestroy(event)
    return Timing(statistics.median(samples), min(samples), max(samples), samples)
