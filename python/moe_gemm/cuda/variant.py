"""What a variant is: something that turns a problem on the device into a ready launch.

Kernels, peers and ceilings all take this shape, so the measuring layer checks and times each
of them the same way. A variant's ``prepare`` validates the problem (a ValueError before any
launch) and returns a :class:`Prepared`: a callable that enqueues one run on the harness stream,
the output it writes, and what the compiler reported for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from moe_gemm.cuda.device import DeviceArray, DeviceProblem
from moe_gemm.model.occupancy import residency


@dataclass(frozen=True)
class Resources:
    """What the compiler reports for one kernel, and the block shape it launches with."""

    registers: int
    smem_bytes: int  # static + dynamic shared memory per block
    spill_bytes: int
    warps_per_block: int

    @property
    def blocks_per_sm(self) -> int:
        return residency(self.registers, self.warps_per_block, self.smem_bytes).blocks


@dataclass
class Prepared:
    """One launch, ready to go: ``launch()`` enqueues it on the harness stream, writing ``output``."""

    launch: Callable[[], None]
    output: DeviceArray
    bm: int | None = None  # the M tile; None for variants with no fixed tile (peers)
    bn: int | None = None
    resources: Resources | None = None
    keep_alive: list[Any] = field(default_factory=list)  # device buffers the launch reads
    launch_info: dict[str, Any] = field(default_factory=dict)  # e.g. the grid a persistent kernel chose; recorded
    runs: int = 1  # the kernel's runs one launch() enqueues, back to back (measure reports the time per run)


class Variant(Protocol):
    name: str

    def prepare(self, dev: DeviceProblem) -> Prepared:
        """Validate the problem for this variant (ValueError before any launch) and build the launch."""
        ...
