"""k6/auto: one configuration per shape, chosen by timing the candidates once and kept on disk.

A device-walked launch cannot see the routing, so the choice may depend only on what the host knows
without reading the device: M_tot, E, K, N and B's layout (quack's autotuner keys on its shapes in
the same way). The first launch at a shape times every candidate of
:data:`~moe_gemm.variants.k6.config.AUTO_CANDIDATES` on the routing at hand and on a skewed one of
the same shape (:data:`ROBUST_SKEW`: the router decides the routing after the choice is made), a few
launches each, median, and keeps the candidate whose worse slowdown against the fastest of either
routing is smallest (:func:`robust_choice`), with the timings, in ``<cache>/k6_auto.json``; every later
launch at that shape, in this process or the next, reads it back. The tuning's time is reported
(``tune_s``) and never timed as the kernel's.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from moe_gemm.cuda.device import DeviceProblem, synchronize
from moe_gemm.cuda.nvrtc import cache_dir
from moe_gemm.cuda.timing import time_launches
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.problem import dtype_name
from moe_gemm.model.routing import expert_counts
from moe_gemm.variants.k6 import K6Persistent
from moe_gemm.variants.k6.config import AUTO_CANDIDATES, KERNEL_FUNCTION, LADDER, Schedule
from moe_gemm.variants.sm90.maps import require_sm90a

TUNE_LAUNCHES = 10
# The second routing the candidates are timed on. Chapter 07 measured why one is needed: tuned on
# balanced rows alone, k6/auto took the M-paired rung at 16,384 rows, the fastest there and 16% behind
# the best at s = 1.2, where the N-paired rung is within 2% of the best at both.
ROBUST_SKEW = 1.2


def robust_choice(timings: list[dict[str, float]]) -> str:
    """The candidate whose largest slowdown over the fastest candidate of each routing is smallest;
    ``timings`` holds one {candidate: ms} per routing, and only candidates timed on every routing count."""
    common = set.intersection(*(set(t) for t in timings))
    if not common:
        raise ValueError("no candidate was timed on every routing")
    best = [min(t[name] for name in common) for t in timings]
    return min(sorted(common), key=lambda name: max(t[name] / b for t, b in zip(timings, best)))


def rows_bucket(tokens: int) -> int:
    """M_tot rounded up to a multiple of 1/8 of the power of two at or below it (40,000 -> 40,960;
    4,096 stays): a batch whose size varies from call to call tunes a handful of times, at most
    eight buckets per octave, and a bucket's rows differ by at most 12.5%. What a choice tuned at one end
    of a bucket costs at the other, against a tuning at that exact M_tot, is chapter 08's bucketing part
    (moe_gemm.measure.bucketing)."""
    step = max(1, (1 << (max(tokens, 1).bit_length() - 1)) // 8)
    return -(-tokens // step) * step


def shape_key(tokens: int, experts: int, K: int, N: int, b_layout: str, gpu: str,
              epilogue: str = "none", types: tuple[str, str] = ("bf16", "bf16")) -> str:
    """The cache key: the GPU, M_tot's bucket (:func:`rows_bucket`), E, K, N, B's layout, the epilogue
    (the fused SwiGLU GEMM has its own candidates), the operand and output types other than bf16's (an
    fp32 C is stored from registers: another epilogue), and the rule (a choice made by another rule is
    not reused)."""
    fused = "" if epilogue == "none" else f"/{epilogue}"
    typed = "" if types == ("bf16", "bf16") else f"/{types[0]}-to-{types[1]}"
    return (f"{gpu}/M-to-{rows_bucket(tokens)}/E{experts}/K{K}/N{N}/{b_layout}{fused}{typed}"
            f"/robust-s{ROBUST_SKEW:g}")


def cache_file() -> Path:
    """``<cache>/k6_auto.json``: k6/auto's choices and the torch op's, one file (MOE_GEMM_CACHE moves it)."""
    return cache_dir().parent / "k6_auto.json"


def recall(key: str, path: Path | None = None) -> dict[str, Any] | None:
    """The entry tuned for ``key``, or None."""
    path = path or cache_file()
    return json.loads(path.read_text()).get(key) if path.is_file() else None


def remember(key: str, entry: dict[str, Any], path: Path | None = None) -> None:
    """Add ``entry`` under ``key``. Processes tuning at once (two ranks, two test workers) each hold an
    exclusive lock on ``<file>.lock`` while they read, merge and write, so no entry is lost; the table
    is written to a temporary file and renamed over the old one, so a reader (which takes no lock)
    sees the old table or the new one, never a partial write."""
    path = path or cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        table = json.loads(path.read_text()) if path.is_file() else {}  # another process may have written
        table[key] = entry
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp",
                                         delete=False) as temporary:
            temporary.write(json.dumps(table, indent=1, sort_keys=True))
        os.replace(temporary.name, path)


Operands = TypeVar("Operands")  # what a caller launches on: a DeviceProblem, torch's offs, ...


def tune(key: str, candidates: Sequence[str], experts: int, tokens: int, *,
         routed: Callable[[np.ndarray | None], Operands], launcher: Callable[[Operands, str], Callable[[], None]],
         median_ms: Callable[[Callable[[], None]], float], tune_skew: float | None = None,
         path: Path | None = None) -> dict[str, Any]:
    """Time every candidate on the routing at hand and, with more than one expert, on a skewed one of the
    same shape; choose by :func:`robust_choice` and remember the choice under ``key``: the cache entry,
    with the tuning's own time (never timed as the kernel's).

    The caller says how: ``routed(counts)`` is the operands under a routing (None: the one at hand),
    ``launcher(operands, name)`` candidate ``name``'s launch on them (a ValueError leaves out a
    candidate that does not take this shape), ``median_ms(launch)`` its time over a few launches."""
    start = time.perf_counter()
    timings = []
    for counts in [None, *([expert_counts(experts, tokens, ROBUST_SKEW)] if experts > 1 else [])]:
        operands = routed(counts)
        timed: dict[str, float] = {}
        for name in candidates:
            try:
                run = launcher(operands, name)
            except ValueError:  # e.g. more experts than the device walk holds: not a candidate here
                continue
            timed[name] = median_ms(run)
        timings.append(timed)
    if not timings[0]:
        raise ValueError("no candidate configuration takes this problem")

    def ranked(t: dict[str, float]) -> dict[str, float]:
        return {name: round(ms, 5) for name, ms in sorted(t.items(), key=lambda kv: kv[1])}

    entry = {"choice": robust_choice(timings), "tune_s": round(time.perf_counter() - start, 3),
             "tune_skew": tune_skew, "timings_ms": ranked(timings[0]),
             "robust_skew": ROBUST_SKEW if len(timings) > 1 else None, "robust_timings_ms": ranked(timings[-1])}
    remember(key, entry, path)
    return entry


def median_ms(run: Callable[[], None]) -> float:
    """A candidate's median time on the harness stream: one launch (loading the kernel), two warm-up
    launches, then TUNE_LAUNCHES timed ones."""
    run()
    synchronize()
    return time_launches(lambda _i: run(), warmup=2, iterations=TUNE_LAUNCHES).median_ms


class K6Auto:
    """``k6/auto`` (device walk) or ``k6/auto-host`` (the same choice on a host-built walk)."""

    family = "k6"
    kernel_function = KERNEL_FUNCTION  # for the profiler's filter: tuning launches run before it profiles

    def __init__(self, schedule: Schedule = "device", candidates: tuple[str, ...] = AUTO_CANDIDATES,
                 cache_file: Path | None = None, b_layout: str = "kn") -> None:
        self.name = "k6/auto" if schedule == "device" else "k6/auto-host"
        self.schedule, self.candidates, self.b_layout = schedule, candidates, b_layout
        self.chooses_among = candidates  # its kernels are theirs (the validation record covers them)
        self.cache_file = cache_file

    def __repr__(self) -> str:
        return f"K6Auto({self.schedule!r})"

    def choose(self, dev: DeviceProblem) -> dict[str, Any]:
        """The cached choice for this shape, or a fresh tuning (kept on disk)."""
        problem = dev.problem
        gpu = require_sm90a(self.name)
        key = shape_key(problem.tokens, problem.experts, problem.K, problem.N, self.b_layout, gpu.name,
                        types=(problem.fmt.element, dtype_name(problem.out_dtype)))
        entry = recall(key, self.cache_file)
        if entry is not None:
            return {**entry, "tuning": "cached"}
        try:
            entry = tune(key, self.candidates, problem.experts, problem.tokens,
                         routed=lambda counts: dev if counts is None else dev.rerouted(counts),
                         launcher=self._candidate, median_ms=median_ms, tune_skew=float(problem.skew),
                         path=self.cache_file)
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None
        return {**entry, "tuning": "tuned"}

    def _candidate(self, dev: DeviceProblem, name: str) -> Callable[[], None]:
        """Candidate ``name``'s launch on ``dev``, B in this chooser's layout; ValueError if it does not take it."""
        prepared = K6Persistent(name, LADDER[name].replace(b_layout=self.b_layout)).prepare(dev)
        return lambda: prepared.launch()  # holds the Prepared, and with it what the launch reads, alive

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        if problem.tokens == 0:  # nothing to tune on: any rung handles M_tot = 0 without a launch
            return K6Persistent(self.name, LADDER[self.candidates[0]].replace(schedule=self.schedule)).prepare(dev)
        chosen = self.choose(dev)
        config = LADDER[chosen["choice"]].replace(schedule=self.schedule, b_layout=self.b_layout)
        prepared = K6Persistent(self.name, config).prepare(dev)
        prepared.launch_info.update(choice=chosen["choice"], tuning=chosen["tuning"], tune_s=chosen["tune_s"],
                                    tune_skew=chosen["tune_skew"], candidate_ms=chosen["timings_ms"])
        return prepared
