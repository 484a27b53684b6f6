"""ptxas's ``-v`` resource report, parsed: registers, shared memory, spills, stack frame, barriers."""

from __future__ import annotations

import re
from dataclasses import dataclass


class ResourceError(RuntimeError):
    """A kernel spills registers or uses local memory, which this project does not accept."""


@dataclass(frozen=True)
class ResourceReport:
    """ptxas -v for one kernel."""

    registers: int
    static_smem_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


_REPORT_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "static_smem_bytes": r"(\d+) bytes smem",
    "stack_frame_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
    "barriers": r"used (\d+) barriers",
}


def parse_ptxas_report(log: str, function: str) -> ResourceReport:
    """Pick ``function``'s lines out of a ptxas -v log (absent fields mean 0)."""
    start = log.find(f"Function properties for {function}")
    if start < 0:
        start = log.find(f"Compiling entry function '{function}'")
    if start < 0:
        raise ValueError(f"ptxas report has no entry for {function!r}:\n{log}")
    following = log.find("Compiling entry function", start + 1)
    block = log[start: following if following > 0 else len(log)]
    values = {key: int(m.group(1)) if (m := re.search(pattern, block)) else 0
              for key, pattern in _REPORT_PATTERNS.items()}
    return ResourceReport(**values)
