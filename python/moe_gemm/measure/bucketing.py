"""What the op's tuning in M_tot buckets costs (moe_gemm.variants.k6.auto.rows_bucket).

The op tunes once per bucket: whichever M_tot of a bucket arrives first decides for all of it. The
worst case is a choice tuned at one end of a bucket and run at the other. For each model projection
and each bucket measured, both ends are tuned exactly (as the op tunes: every candidate on the routing
at hand and on a skewed one, the most robust kept), and at each end the choice tuned at the other end
is timed against the one tuned there, the two as CUDA-graph replays in interleaved rounds. The
slowdown is the first's time over the second's; 1 where both ends chose alike.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moe_gemm.measure.check import progress
from moe_gemm.model.routing import expert_counts
from moe_gemm.model.workloads import Workload

# The buckets measured: each one above an edge, its rows edge + 1 .. edge + edge / 8 (the bucket's
# width is 1/8 of the power of two below it).
EDGES = (512, 4096, 32768)
TYPES = ("bf16", "bf16")  # the op's bf16 path, B [E, K, N]: what chapter 07's candidates are tuned for


def bucket_ends(edge: int) -> tuple[int, int]:
    """The first and last M_tot of the bucket above ``edge`` (a power of two): one key, one tuning."""
    return edge + 1, edge + edge // 8


def _weights(workload: Workload, rows: int, seed: int) -> tuple[Any, Any]:
    """a [rows, K] and b [E, K, N], bf16, drawn on the GPU (the DeepSeek-V3-like b holds 3.8 G elements:
    minutes of the CPU's random numbers); each M_tot takes a's first rows."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    E, K, N = workload.experts, workload.K, workload.N  # noqa: N806
    a = torch.randn(rows, K, generator=generator, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, K, N, generator=generator, device="cuda", dtype=torch.bfloat16) * K**-0.5
    return a, b


def _operands(workload: Workload, a: Any, b: Any, tokens: int) -> tuple[Any, Any, Any, Any]:
    """a's first ``tokens`` rows, b, offs of the workload's skew at ``tokens`` rows, the output."""
    import torch

    offs = torch.as_tensor(np.cumsum(expert_counts(workload.experts, tokens, workload.skew)), dtype=torch.int32,
                           device="cuda")
    return a[:tokens], b, offs, torch.empty(tokens, workload.N, dtype=torch.bfloat16, device="cuda")


def _tuned(label: str, tokens: int, operands: tuple, path: Path) -> str:
    """The configuration the op would keep had it tuned at exactly ``tokens`` rows (its own loop, a key
    of that M_tot alone, in a file of this measurement's own)."""
    import torch

    from moe_gemm.torch.ops import tune_here
    from moe_gemm.variants.k6.config import AUTO_CANDIDATES

    return tune_here(f"exact/{label}/M{tokens}", AUTO_CANDIDATES, *operands, "kn", TYPES,
                     torch.cuda.current_device(), path)["choice"]


def measure_bucketing(label: str, workload: Workload, edges: Sequence[int] = EDGES,
                      seed: int = 0) -> list[dict[str, Any]]:
    """One row per bucket end of projection ``label``: the choice tuned there, the one tuned at the
    bucket's other end, their times at this end and the slowdown (other / own)."""
    from moe_gemm.torch import ops
    from moe_gemm.torch.bench import time_interleaved
    from moe_gemm.variants.k6.auto import rows_bucket

    rows = []
    a_all, weights = _weights(workload, max(bucket_ends(edge)[1] for edge in edges), seed)
    with tempfile.TemporaryDirectory() as scratch, ops.offsets_unchecked():
        path = Path(scratch) / "exact.json"
        for edge in edges:
            ends = bucket_ends(edge)
            operands = {m: _operands(workload, a_all, weights, m) for m in ends}
            chosen = {m: _tuned(label, m, operands[m], path) for m in ends}
            progress(f"[bucketing] {label}, M_tot {ends[0]:,} .. {ends[1]:,}: tuned {chosen[ends[0]]} and "
                     f"{chosen[ends[1]]}")
            for here, there in (ends, ends[::-1]):
                own, other = chosen[here], chosen[there]
                row = {"projection": label, "experts": workload.experts, "K": workload.K, "N": workload.N,
                       "skew": workload.skew, "tokens": here, "bucket": rows_bucket(here), "own": own,
                       "other": other, "own_ms": None, "other_ms": None, "slowdown": 1.0}
                if own != other:
                    a, b, offs, out = operands[here]
                    timed = time_interleaved({name: ops._launcher(name, "kn", TYPES, a, b, offs, out)
                                              for name in (own, other)})
                    row.update(own_ms=timed[own].median_ms, other_ms=timed[other].median_ms,
                               slowdown=timed[other].median_ms / timed[own].median_ms)
                rows.append(row)
    return rows
