"""Who waits for whom in a warp-specialized kernel: its mbarrier waits, read from Nsight Compute's source view.

A producer/consumer pipeline has two kinds of wait: the producer's for a free stage (the *empty* barrier) and the
consumers' for a full one. Where the time goes between them says which side is the limit. If the consumers wait
for data while the producer never waits for room, the producer cannot get ahead (its issue rate is the limit);
if the producer waits for room while the consumers wait too, the copies' latency or bandwidth is.

Nsight Compute's source counters (``--section SourceCounters``) sample, per SASS instruction, how many warps
stood there and how often it executed. An mbarrier wait compiles to a first try, a
``SYNCS.PHASECHK.TRANS64.TRYWAIT`` followed by a forward branch to a retry loop (another TRYWAIT and a branch back)
that runs only when the phase was not yet complete; a warp suspended in the try is sampled at the branch after
it. So each wait site gives three numbers: its first tries (the branch's executions), its retries (the retry
loop's TRYWAIT executions) and the share of all samples taken there. Its role follows from what comes next in
the fall-through: the producer's wait is followed by the arrive that announces the copies' bytes
(``SYNCS.ARRIVE.TRANS64`` without ``.A1T0``) before any wgmma, a consumer's by wgmma (``HGMMA`` or
``WARPGROUP.ARRIVE``), whichever comes first. A site neither describes is counted as "other".

:func:`parse_source_csv` reads ``ncu --import R --page source --csv --print-source sass``; :func:`wait_sites`
finds the sites; :func:`wait_summary` adds them up per role, the fields a profile record keeps. Where no wait
explains the idle time, :func:`hot_sites` names the instructions where the most samples fell: the next place to
look, kept in the record beside the waits.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TRY_WAIT = "SYNCS.PHASECHK.TRANS64.TRYWAIT"
HOT_SITES = 12  # instructions kept per profile by hot_sites: a kernel's main loop, waits and epilogue fit in it
LOOKAHEAD = 400  # instructions after a site searched for what it guards (a peeled last stage zeroes rows first)
ROLES = ("producer", "consumer", "other")


@dataclass(frozen=True)
class SassRow:
    """One SASS instruction of the source view: its address, text, stall samples and executions (warp level)."""

    address: int
    source: str
    samples: float
    executed: int


def _number(text: str) -> float:
    text = (text or "").strip().replace(",", "")
    return float(text) if text else 0.0


def parse_source_csv(text: str) -> list[SassRow]:
    """The instructions of ncu's source page (SASS, CSV), in address order; a ValueError without its header."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError(f"no source-page CSV header (\"Address\", ...) in ncu's output:\n{text[-1000:]}")
    rows = [SassRow(int(r["Address"], 16), r["Source"].strip(), _number(r["Warp Stall Sampling (All Samples)"]),
                    int(_number(r["Instructions Executed"])))
            for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))) if r.get("Address", "").startswith("0x")]
    return sorted(rows, key=lambda r: r.address)


def _branch_target(source: str) -> int | None:
    match = re.search(r"\bBRA (0x[0-9a-f]+)", source)
    return int(match.group(1), 16) if match else None


def _role(rows: Sequence[SassRow], after: int) -> str:
    for row in rows[after:after + LOOKAHEAD]:
        if row.source.startswith(("HGMMA", "WARPGROUP.ARRIVE")) or " HGMMA" in row.source:
            return "consumer"
        if "SYNCS.ARRIVE.TRANS64 " in row.source:  # the expect-tx arrive; a consumer's release is .A1T0
            return "producer"
    return "other"


def wait_sites(rows: Sequence[SassRow]) -> list[dict[str, Any]]:
    """Every mbarrier wait's first try in ``rows``: address, role, first tries, retries, share of all samples."""
    total = sum(r.samples for r in rows) or 1.0
    at = {r.address: i for i, r in enumerate(rows)}
    sites = []
    for i, row in enumerate(rows[:-1]):
        target = _branch_target(rows[i + 1].source)
        if TRY_WAIT not in row.source or target is None or target <= rows[i + 1].address:
            continue  # not a first try (a retry loop's branch goes back)
        samples, retries = row.samples + rows[i + 1].samples, 0
        j = at.get(target)
        while j is not None and j < len(rows):  # the retry loop, up to its branch back to itself
            samples += rows[j].samples
            if TRY_WAIT in rows[j].source:
                retries = rows[j].executed
            back = _branch_target(rows[j].source)
            if back is not None and back <= rows[j].address:
                break
            j += 1
        sites.append({"address": row.address, "role": _role(rows, i + 2), "first_tries": rows[i + 1].executed,
                      "retries": retries, "samples_pct": 100 * samples / total})
    return sites


def wait_summary(rows: Sequence[SassRow]) -> dict[str, float]:
    """Per role: the share of all samples spent waiting (``<role>_wait_pct``), the first tries (``<role>_waits``)
    and the retries (``<role>_wait_retries``); roles without a site are left out."""
    summary: dict[str, float] = {}
    for site in wait_sites(rows):
        role = site["role"]
        summary[f"{role}_wait_pct"] = summary.get(f"{role}_wait_pct", 0.0) + site["samples_pct"]
        summary[f"{role}_waits"] = summary.get(f"{role}_waits", 0) + site["first_tries"]
        summary[f"{role}_wait_retries"] = summary.get(f"{role}_wait_retries", 0) + site["retries"]
    return summary


def hot_sites(rows: Sequence[SassRow], shown: int = HOT_SITES) -> list[dict[str, Any]]:
    """The ``shown`` instructions where the most stall samples fell, most first: address, SASS text and share of all
    samples (a warp waiting in an mbarrier's first try is sampled at the branch after it, as wait_sites counts)."""
    total = sum(r.samples for r in rows) or 1.0
    return [{"address": r.address, "source": r.source, "samples_pct": 100 * r.samples / total}
            for r in sorted(rows, key=lambda r: -r.samples)[:shown] if r.samples]
