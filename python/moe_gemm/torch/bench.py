"""Timing torch callables the way chapter 08 compares whole layers: CUDA events around eager calls, or
around replays of one CUDA graph captured after a warm-up (compiles, autotuning and allocations all
happen before the capture, none inside the timed loop). Calls whose times are compared with each other
(a fused launch against its unfused parts) are timed in interleaved rounds (time_interleaved)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

WARMUP, ITERATIONS = 5, 30


@dataclass(frozen=True)
class Timed:
    median_ms: float
    min_ms: float
    max_ms: float
    graph: bool  # timed as CUDA-graph replays
    round_medians_ms: tuple[float, ...] = ()  # time_interleaved's: the median of each round's samples

    @classmethod
    def of(cls, samples: list[float], graph: bool, rounds: tuple[float, ...] = ()) -> Timed:
        """The median, min and max of ``samples`` (milliseconds), and ``rounds``' medians if given."""
        return cls(statistics.median(samples), min(samples), max(samples), graph, rounds)

    @property
    def round_spread(self) -> float:
        """How far the slowest round's median lies above the fastest's (0 with one round or none)."""
        return max(self.round_medians_ms) / min(self.round_medians_ms) - 1 if self.round_medians_ms else 0.0


def _events(run: Callable[[], Any], iterations: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def capture(fn: Callable[[], Any], warmup: int = WARMUP) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn`` warmed up on a side stream (as torch's graph docs ask), then captured once; the graph and
    the output tensor(s) its replays write."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_call(fn: Callable[[], Any], *, graph: bool, warmup: int = WARMUP, iterations: int = ITERATIONS) -> Timed:
    """Median, min and max milliseconds of ``fn()``, eagerly or as the replay of one captured graph."""
    if graph:
        captured, _ = capture(fn, warmup)
        run = captured.replay
    else:
        for _ in range(warmup):
            fn()
        run = fn
    return Timed.of(_events(run, iterations), graph)


def time_interleaved(calls: dict[str, Callable[[], Any]], rounds: int = 3, warmup: int = WARMUP,
                     iterations: int = ITERATIONS) -> dict[str, Timed]:
    """Each call captured once, then replayed ``iterations`` times per round, the calls in turn and
    the order reversed every other round; median, min and max over all of a call's samples. A change
    of clock or temperature during the measurement (after a tuning burst, say) then falls on every call
    alike, not on whichever was timed first."""
    graphs = {name: capture(fn, warmup)[0] for name, fn in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    medians: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds):
        for name in (list(graphs) if round_ % 2 == 0 else list(reversed(graphs))):
            times = _events(graphs[name].replay, iterations)
            samples[name] += times
            medians[name].append(statistics.median(times))
    return {name: Timed.of(s, graph=True, rounds=tuple(medians[name])) for name, s in samples.items()}
