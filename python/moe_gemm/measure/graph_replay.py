"""Any variant's launch, captured once in a CUDA graph and timed as graph replays.

Where a launch takes under about 100 us (512 and 2,048 routed rows at the seed shape) the host's
work per launch (Python, torch's dispatcher, quack's argument packing, our ``cuLaunchKernel``) can
decide a ratio. A model that cares about those sizes captures its layer in a graph; so chapter 07
times every contender both ways. ``GraphReplay(variant)`` is named ``<variant>+graph``, prepares the
inner variant, runs it once (compiling, tuning), captures one launch and replays it;
``GraphReplay(variant, chain=8)``, ``<variant>+graphx8``, captures eight launches back to back.

Our kernels launch through the driver on the harness stream and are captured with the driver's
stream capture (cuda.graph.Graph). Variants that allocate through torch (``uses_torch``: the
torch._grouped_mm and quack peers, our own torch op) are captured with ``torch.cuda.graph`` on the
same stream.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moe_gemm.cuda.device import DeviceProblem, synchronize
from moe_gemm.cuda.graph import Graph
from moe_gemm.cuda.variant import Prepared, Variant

SUFFIX = "+graph"


def graph_name(name: str, chain: int = 1) -> str:
    """'k6/auto+graph'; a chain of 8 launches: 'k6/auto+graphx8'."""
    return name + SUFFIX + (f"x{chain}" if chain > 1 else "")


class GraphReplay:
    """``variant`` timed as the replay of one captured CUDA graph. ``chain`` > 1: the graph holds ``chain``
    launches back to back, as a model's layers follow one another, and the times are per launch: each
    launch's set-up then meets the end of the one before it, which a launch replayed on its own never shows
    (where nothing overlaps the two, they add up; a programmatic dependent launch overlaps them)."""

    def __init__(self, variant: Variant, chain: int = 1) -> None:
        if chain < 1:
            raise ValueError(f"chain must be at least 1 launch, got {chain}")
        self.inner, self.chain = variant, chain
        self.name = graph_name(variant.name, chain)

    def __repr__(self) -> str:
        return f"GraphReplay({self.inner!r}, chain={self.chain})"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        prepared = self.inner.prepare(dev)
        if dev.problem.tokens == 0:
            return prepared
        prepared.launch()  # compiles, tunes, allocates: nothing of that may happen during capture
        synchronize()

        def launches() -> None:
            for _ in range(self.chain):
                prepared.launch()

        if getattr(self.inner, "uses_torch", False):
            replay, graph = _torch_graph(launches)
        else:
            graph = Graph(launches)
            replay = graph.launch
        timing = "cuda graph replay" + (f", {self.chain} launches back to back" if self.chain > 1 else "")
        return dataclasses.replace(prepared, launch=replay, keep_alive=[*prepared.keep_alive, graph],
                                   launch_info={**prepared.launch_info, "timing": timing}, runs=self.chain)


def _torch_graph(launch) -> tuple[Any, Any]:
    import torch

    from moe_gemm.variants.peer.torch import torch_stream

    stream = torch_stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        launch()

    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()

    return replay, graph
