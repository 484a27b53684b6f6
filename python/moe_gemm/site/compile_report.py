"""The compile report a chapter prints where it cannot run its kernels: what ptxas and the SASS say.

For each variant: registers, shared memory (static + dynamic), spills, warps per block, the
blocks per SM the occupancy model allows from those numbers (and every limit that binds), and
static counts of the SASS instructions the chapter is about. It needs NVRTC and the cuobjdump
wheel, not a GPU.

The table is as narrow as it can be and still show every number: the limits that bind are
abbreviated (:data:`LIMIT_ABBREVIATIONS`, spelled out in the legend), a spills column that is all
zero gives way to a note in the legend, and on a docs page it is two tables (resources and
occupancy, then the SASS counts), each of which fits the page's column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from moe_gemm.core.tables import Table
from moe_gemm.cuda.sass import opcode_counts
from moe_gemm.model.occupancy import Residency, residency


def limiters(fit: Residency) -> str:
    """Every limit that binds ('registers = shared memory' on a tie), not just the first one."""
    limits = {"registers": fit.by_registers, "shared memory": fit.by_smem, "warps": fit.by_warps,
              "blocks": fit.by_blocks}
    return " = ".join(name for name, blocks in limits.items() if blocks == fit.blocks)


# The limits' names as the table shows them; the legend spells them out.
LIMIT_ABBREVIATIONS = {"registers": "regs", "shared memory": "smem"}


def short_limit(limit: str) -> str:
    """'registers = shared memory' -> 'regs = smem': the "limit" cell of a compile report."""
    return " = ".join(LIMIT_ABBREVIATIONS.get(name, name) for name in limit.split(" = "))


def compile_rows(variants: Sequence[Any], arch: str, opcodes: Sequence[str]) -> list[dict[str, Any]]:
    """One row per variant (anything with ``compile(arch)`` and ``resources(arch)``)."""
    rows = []
    for variant in variants:
        compiled = variant.compile(arch)
        resources = variant.resources(arch)
        fit = residency(resources.registers, resources.warps_per_block, resources.smem_bytes)
        rows.append({"variant": variant.name, "arch": arch, "registers": resources.registers,
                     "smem_bytes": resources.smem_bytes, "spill_bytes": resources.spill_bytes,
                     "warps_per_block": resources.warps_per_block, "blocks_per_sm": fit.blocks,
                     "limiter": limiters(fit), "by_registers": fit.by_registers, "by_smem": fit.by_smem,
                     "sass": opcode_counts(compiled.sass(), opcodes)})
    return rows


def compile_table(rows: Sequence[dict[str, Any]], opcodes: Sequence[str], labels: Mapping[str, str] | None = None,
                  legend: str = "regs: per thread (ptxas); smem: static + dynamic per block; blocks/SM: the occupancy "
                                "model's; the rest: static SASS instruction counts") -> Table:
    """The compile report as a table; ``legend`` says what the columns mean, and the table adds what
    its own abbreviations mean (the limits, and the spills when it leaves that column out)."""
    labels = labels or {}
    spills = any(r["spill_bytes"] for r in rows)
    headers = ("kernel", "regs", "smem KB", *(("spills",) if spills else ()), "warps", "blocks/SM", "limit",
               *(labels.get(op, op) for op in opcodes))
    body = tuple((r["variant"], r["registers"], f"{r['smem_bytes'] / 1024:.1f}",
                  *((r["spill_bytes"],) if spills else ()), r["warps_per_block"], r["blocks_per_sm"],
                  short_limit(r["limiter"]), *(r["sass"][op] for op in opcodes))
                 for r in rows)
    arch = rows[0]["arch"] if rows else "?"
    notes = ["limit: what caps blocks/SM (regs: registers, smem: shared memory; 'regs = smem' when both give "
             "the same count)"]
    if not spills:
        notes.append("spills: none (0 bytes) in every kernel")
    # On a page: what ptxas gives and the occupancy it allows, then the SASS counts, as two tables.
    return Table(headers, body, title=f"Compile report ({arch}, NVRTC)", legend=f"{legend}; {'; '.join(notes)}",
                 page_split=len(headers) - len(opcodes))


def write_compile_report(run: ModuleType, chapter: str, root: Path) -> Path:
    """``<root>/<chapter>/compile_report.md``: the compile report the chapter's run.py prints (its
    ``compile_report_table`` of ``compile_report(ARCH)``), for its page; written when the site is built
    so that it always describes the current kernels."""
    path = root / chapter / "compile_report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run.compile_report_table(run.compile_report(run.ARCH)).markdown())
    return path
