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

from .device import cuda_device, harness_stream

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


def time_launches(launch: Callable[[int], None], *, warmup: int = WARMUP, iterations: int = ITERATIONS) -> Timing:
    """Time ``launch(i)`` (which must enqueue its work on the harness stream) ``iterations`` times."""
    from cuda.core import EventOptions

    if iterations < 1 or warmup < 0:
        raise ValueError("need iterations >= 1 and warmup >= 0")
    stream, device = harness_stream(), cuda_device()
    for i in range(warmup):
        launch(i)
    options = EventOptions(enable_timing=True)
    starts = [device.create_event(options) for _ in range(iterations)]
    ends = [device.create_event(options) for _ in range(iterations)]
    for i in range(iterations):
        stream.record(starts[i])
        launch(warmup + i)
        stream.record(ends[i])
    stream.sync()
    samples = tuple(float(end - start) for start, end in zip(starts, ends))
    return Timing(statistics.median(samples), min(samples), max(samples), samples)
