"""Timing torch callables the way chapter 08 compares whole layers: CUDA events around eager calls, or
around replays of one CUDA graph captured after a warm-up (compiles, autotuning and allocations all
happen before the capture, none inside the timed loop)."""

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
    samples = _events(run, iterations)
    return Timed(statistics.median(samples), min(samples), max(samples), graph)
