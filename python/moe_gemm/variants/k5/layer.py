"""k5 as an MoE layer runs it: one device-scheduled launch captured in a CUDA graph, replayed with
new routings written into fixed buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.variants.k5 import K5Adaptive
from moe_gemm.variants.k5.cost_model import Calibration


@dataclass
class DeviceLayer:
    """A device-scheduled k5 launch over fixed buffers of ``capacity`` rows, captured once in a CUDA
    graph, as an MoE layer would run it: each call writes a new routing's rows of A and its offsets
    into the buffers (the router's job on a real GPU), replays the graph and returns C's real rows.
    The graph never changes; only the offsets it reads do."""

    b: np.ndarray  # [E, K, N] bf16
    capacity: int
    calibration: Calibration | None = None
    _state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from moe_gemm.model.problem import BF16, Problem

        experts, K, N = self.b.shape
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1 row (a tensor map needs one), got {self.capacity}")
        counts = np.zeros(experts, dtype=np.int64)
        counts[0] = self.capacity  # the capture's routing; the graph never looks at it again
        dev = DeviceProblem(Problem(a=np.zeros((self.capacity, K), dtype=BF16), b=self.b, counts=counts))
        variant = K5Adaptive("k5/device-graph", self.calibration)
        self._state.update(dev=dev, prepared=variant.prepare(dev), experts=experts)

    def __call__(self, a: np.ndarray, counts: np.ndarray) -> np.ndarray:
        from moe_gemm.cuda.device import BF16_NAN_BITS, synchronize
        from moe_gemm.model.routing import expert_offsets

        tokens = int(np.sum(counts))
        if tokens > self.capacity or a.shape[0] != tokens:
            raise ValueError(f"the routing has {tokens} rows and A {a.shape[0]}; the layer holds {self.capacity}")
        state = self._state
        offsets = expert_offsets(np.asarray(counts, dtype=np.int64)).astype(np.int32)
        if offsets.size != state["experts"] + 1:
            raise ValueError(f"counts must have {state['experts']} entries, got {offsets.size - 1}")
        dev, prepared = state["dev"], state["prepared"]
        if tokens:
            dev.a.view(0, a.shape, a.dtype).upload(np.ascontiguousarray(a))
        dev.offsets.upload(offsets)
        prepared.output.fill_u16(BF16_NAN_BITS)
        prepared.launch()
        synchronize()
        return prepared.output.download()[:tokens]


    def replay(self) -> None:
        """Replay the graph on whatever routing the buffers hold (for timing)."""
        self._state["prepared"].launch()
