"""How many blocks fit on an SM, and how often its schedulers can issue.

Registers are handed to warps in chunks of 256, so a thread's register count is rounded up
before it costs anything: 95 registers x 32 lanes = 3,040 becomes 3,072 per warp. A block
lands on an SM whole or not at all, and the SM keeps as many blocks as the tightest of four
limits allows: registers, shared memory, warps and blocks.

Once resident, each of the SM's four schedulers picks one eligible warp per cycle. If a
scheduler owns ``W`` warps and each warp needs ``L`` cycles between its instructions on
average, the scheduler issues ``W / L`` instructions per cycle (at most one), and the SM
``4 * W / L``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moe_gemm.core.checks import require_int, require_nonnegative_float


@dataclass(frozen=True)
class SMLimits:
    """Per-SM resources of a GPU generation (sm_90 and sm_100 share these numbers)."""

    registers: int = 65536
    register_unit: int = 256  # registers are allocated per warp in chunks of this size
    max_registers_per_thread: int = 255
    smem_bytes: int = 228 * 1024
    smem_reserved_per_block: int = 1024  # the runtime keeps 1 KB of every block's shared memory
    max_smem_per_block: int = 227 * 1024
    warps: int = 64
    blocks: int = 32
    schedulers: int = 4


HOPPER = SMLimits()


@dataclass(frozen=True)
class Residency:
    """Blocks per SM under each limit; ``blocks`` is the smallest, ``limiter`` names it."""

    by_registers: int
    by_smem: int
    by_warps: int
    by_blocks: int

    @property
    def blocks(self) -> int:
        return min(self.by_registers, self.by_smem, self.by_warps, self.by_blocks)

    @property
    def limiter(self) -> str:
        limits = {"registers": self.by_registers, "shared memory": self.by_smem,
                  "warps": self.by_warps, "blocks": self.by_blocks}
        return min(limits, key=limits.get)


# --8<-- [start:registers]
def registers_per_warp(registers_per_thread: int, limits: SMLimits = HOPPER) -> int:
    """ceil(32 * R / 256) * 256."""
    require_int("registers_per_thread", registers_per_thread, minimum=1)
    if registers_per_thread > limits.max_registers_per_thread:
        raise ValueError(f"registers_per_thread must be <= {limits.max_registers_per_thread}, "
                         f"got {registers_per_thread}")
    return math.ceil(32 * registers_per_thread / limits.register_unit) * limits.register_unit


def residency(
    registers_per_thread: int, warps_per_block: int, smem_per_block: int = 0, limits: SMLimits = HOPPER
) -> Residency:
    """Resident blocks per SM under each of the four limits."""
    require_int("warps_per_block", warps_per_block, minimum=1)
    require_int("smem_per_block", smem_per_block, minimum=0)
    if smem_per_block > limits.max_smem_per_block:
        raise ValueError(f"smem_per_block must be <= {limits.max_smem_per_block} bytes, got {smem_per_block}")
    block_registers = registers_per_warp(registers_per_thread, limits) * warps_per_block
    return Residency(
        by_registers=limits.registers // block_registers,
        by_smem=limits.smem_bytes // (smem_per_block + limits.smem_reserved_per_block),
        by_warps=limits.warps // warps_per_block,
        by_blocks=limits.blocks,
    )
# --8<-- [end:registers]


def blocks_per_sm(registers_per_thread: int, warps_per_block: int, smem_per_block: int = 0,
                  limits: SMLimits = HOPPER) -> int:
    return residency(registers_per_thread, warps_per_block, smem_per_block, limits).blocks


def max_registers_for(blocks: int, warps_per_block: int, limits: SMLimits = HOPPER) -> int:
    """The most registers per thread that still let ``blocks`` blocks share an SM's registers."""
    require_int("blocks", blocks, minimum=1)
    require_int("warps_per_block", warps_per_block, minimum=1)
    per_warp = limits.registers // (blocks * warps_per_block)
    per_warp -= per_warp % limits.register_unit
    return min(per_warp // 32, limits.max_registers_per_thread)


# --8<-- [start:issue]
def issue_rate(warps_per_scheduler: float, cycles_per_issue: float) -> float:
    """Instructions one scheduler issues per cycle: W / L, capped at 1."""
    # Checked as finite numbers: a NaN would slip past `< 0` and min(1.0, nan) returns 1.0.
    warps = require_nonnegative_float("warps_per_scheduler", warps_per_scheduler)
    if require_nonnegative_float("cycles_per_issue", cycles_per_issue) == 0:
        raise ValueError("cycles_per_issue must be > 0, got 0")
    return min(1.0, warps / cycles_per_issue)


def sm_ipc(warps_per_scheduler: float, cycles_per_issue: float, limits: SMLimits = HOPPER) -> float:
    """Instructions the SM issues per cycle: schedulers * W / L."""
    return limits.schedulers * issue_rate(warps_per_scheduler, cycles_per_issue)
# --8<-- [end:issue]
