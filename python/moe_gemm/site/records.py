"""Results records as tables: the columns every chapter's run.py prints and every page shows.

A number on the site and the same number in a terminal come from one :class:`Column` definition,
so they agree. The "vs peer" column is the ratio to ``torch._grouped_mm`` measured in the same run,
on the same inputs; "% roofline" is against the ceilings of the record's own run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moe_gemm.core.tables import Table
from moe_gemm.measure.ceilings import roofline_basis
from moe_gemm.measure.provenance import commit_label
from moe_gemm.measure.results import RECORDED_GPU, load_results, results_path
from moe_gemm.model.roofline import RooflineBasis
from moe_gemm.model.workloads import Workload
from moe_gemm.variants.peer.torch import PEER_GROUPED_MM as PEER  # the 'vs peer' column's


def profile_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Nsight Compute's counters of one launch per row (moe_gemm.measure.profile.profile_variant): chapters 09 and
    10 print it after ``--profile``."""
    def number(row: dict[str, Any], key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
        value = row.get(key)
        return "-" if value is None else f"{value / scale:{fmt}}"

    body = tuple((r["variant"], Workload.of(r).cell_label, number(r, "duration_ns", 1e3), number(r, "gmma_pipe_pct"),
                  number(r, "dram_bytes_read", 1e9, ".2f"), number(r, "dram_bytes_write", 1e9, ".2f"),
                  number(r, "dram_throughput_pct"), number(r, "l2_bytes", 1e9, ".2f"), number(r, "stall_barrier"),
                  number(r, "stall_long_scoreboard"), number(r, "producer_wait_pct"),
                  number(r, "producer_wait_retries", 1, ",.0f"), number(r, "consumer_wait_pct")) for r in rows)
    return Table(("variant", "cell", "us", "wgmma %", "DRAM rd GB", "DRAM wr GB", "DRAM %", "L2 GB", "bar stall",
                  "lsb stall", "prod wait %", "prod retries", "cons wait %"), body,
                 title="Nsight Compute, one launch each",
                 legend="us: the profiled launch; wgmma %: tensor pipe (HGMMA and QGMMA) active, % of peak; DRAM rd / "
                        "wr: bytes read from and written to HBM; DRAM %: HBM throughput, % of peak; L2 GB: bytes "
                        "through L2; stalls: warp cycles per issued instruction waiting at a barrier / on a long "
                        "scoreboard; prod / cons wait %: share of the warps' stall samples at the producer's waits "
                        "for a free stage / the consumers' for a full one, prod retries: how often the producer's "
                        "wait found the stage still busy (source counters, where taken; moe_gemm.measure.wait_sites)")


def hot_sites_table(rows: Sequence[dict[str, Any]], shown: int = 6) -> Table:
    """The instructions where the most stall samples fell, ``shown`` per profiled launch that recorded them
    (profile_variant's waits pass, moe_gemm.measure.wait_sites.hot_sites): where to look when no wait explains the
    idle time."""
    body = tuple((r["variant"], Workload.of(r).cell_label, f"{site['samples_pct']:.1f}", f"{site['address']:#06x}",
                  site["source"][:60])
                 for r in rows for site in r.get("hot_sites", ())[:shown])
    return Table(("variant", "cell", "samples %", "address", "SASS"), body, title="Where the warps stood",
                 legend="samples %: share of all the launch's warp stall samples taken at that instruction (a warp "
                        "suspended in an mbarrier wait is sampled at the branch after it); the first instructions, "
                        "most first, of each launch profiled with its waits")


def checks_table(checks: Sequence[dict[str, Any]]) -> Table:
    return Table(("variant", "case", "result"), tuple((c["variant"], c["case"], c["result"]) for c in checks),
                 title="Checks against the numpy reference",
                 legend="exact: integer-valued inputs, compared bit for bit; random: relative Frobenius error "
                        "<= 1e-2; C is filled with NaN before every launch.")


def targets_table(rows: Sequence[dict[str, Any]], legend: str) -> Table:
    """A chapter's targets, one row each: {"target", "value", "goal", "met"}, and "at_most" for a
    target that is a ceiling (a relative extra time, an error) rather than a floor (a ratio). A goal below
    0.01 (an error bound) is written in scientific notation, its value too."""
    def number(value: float, goal: float, spec: str) -> str:
        return f"{value:.1e}" if 0 < goal < 0.01 else format(value, spec)

    body = tuple((r["target"], number(r["value"], r["goal"], "+.3f" if r.get("at_most") else ".3f"),
                  f"{'<=' if r.get('at_most') else '>='} {number(r['goal'], r['goal'], '.2f')}",
                  "yes" if r["met"] else "NO")
                 for r in rows)
    return Table(("target", "value", "goal", "met"), body, title="Targets, same run", legend=legend)


def peer_ratio(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """record's useful TFLOP/s over torch._grouped_mm's on the same workload in the same run: the same
    part of a chapter that runs in parts (chapter 07's ladder and grid both time the seed's cells, in two
    processes, and a ratio across them compares two runs)."""
    for other in records:
        if (other["variant"] == PEER and other.get("part") == record.get("part")
                and Workload.of(other) == Workload.of(record)):
            return record["useful_tflops"] / other["useful_tflops"]
    return None


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass(frozen=True)
class Column:
    """One column of a records table: its header, its part of the legend, and its cell."""

    header: str
    legend: str
    cell: Callable[[dict[str, Any], Sequence[dict[str, Any]], RooflineBasis], str]


def _workload_cell(w: Workload) -> str:
    """'16k s=1.2' (narrow, for a table of many columns); the full label off the seed's shape."""
    return w.short_label if w.seed_shape else w.label


def _roofline_cell(r: dict[str, Any], _: Sequence[dict[str, Any]], basis: RooflineBasis) -> str:
    return f"{100 * r['useful_tflops'] / basis.tflops(Workload.of(r)):.1f}"


# The columns a results table can show, by name; run.py and the docs pages (moe_gemm.site.pages) draw
# from the same definitions, so a number on the site and the same number in a terminal agree.
COLUMNS: dict[str, Column] = {
    "variant": Column("variant", "", lambda r, rs, b: r["variant"]),
    "workload": Column("workload", "workload: 16k = 16,384 rows, s = the routing's skew",
                       lambda r, rs, b: _workload_cell(Workload.of(r))),
    "ms": Column("median ms", "median ms: of the timed launches",
                 lambda r, rs, b: f"{r['median_ms']:.3f}"),
    "ms_range": Column("min-max ms", "min-max: fastest and slowest timed launch",
                       lambda r, rs, b: f"{r['min_ms']:.3f}-{r['max_ms']:.3f}"),
    "tflops": Column("TFLOP/s", "TFLOP/s: useful, 2 M_tot K N / median time",
                     lambda r, rs, b: f"{r['useful_tflops']:,.1f}"),
    "scheduled": Column("scheduled TFLOP/s", "scheduled: padding rows counted as work",
                        lambda r, rs, b: _fmt(r.get("scheduled_tflops"), ",.1f")),
    "vs_peer": Column("vs peer", "vs peer: over torch._grouped_mm on the same inputs in the same run",
                      lambda r, rs, b: _fmt(peer_ratio(r, rs), ".2f")),
    "roofline": Column("% roofline", "% roofline: of the time max(FLOP / wgmma peak, compulsory bytes / copy) "
                                     "allows, at the ceilings in the header (TFLOP/s / TB/s)", _roofline_cell),
    "eta": Column("eta", "eta: real rows / scheduled rows", lambda r, rs, b: _fmt(r.get("eta"), ".3f")),
    "tiles": Column("tiles", "tiles: blocks launched", lambda r, rs, b: _fmt(r.get("tiles"), ",")),
    "registers": Column("regs", "regs: per thread", lambda r, rs, b: _fmt(r.get("registers"), "d")),
    "smem": Column("smem KB", "smem: per block",
                   lambda r, rs, b: _fmt(None if r.get("smem_bytes") is None else r["smem_bytes"] / 1024, ".1f")),
    "blocks": Column("blocks per SM", "blocks per SM: the occupancy model's, from registers and shared memory",
                     lambda r, rs, b: _fmt(r.get("blocks_per_sm"), "d")),
}
DEFAULT_COLUMNS = ("variant", "workload", "ms", "ms_range", "tflops", "vs_peer", "roofline", "eta", "tiles",
                   "registers", "smem", "blocks")
HOST_BOUND = "peer/torch_loop"  # one call per expert from Python: its time is the launch loop's


def column_header(name: str, basis: RooflineBasis) -> str:
    header = COLUMNS[name].header
    return f"{header} ({basis.label})" if name == "roofline" else header


def records_legend(columns: Sequence[str], basis: RooflineBasis, host_bound: bool = False) -> str:
    """One line naming what each column means and where the roofline's ceilings come from."""
    parts = [COLUMNS[c].legend for c in columns if COLUMNS[c].legend]
    if "roofline" in columns:
        parts.append(f"ceilings {basis.source}")
    if host_bound:
        parts.append(f"{HOST_BOUND} is host-bound (one call per expert from Python) and noisy from run to run")
    return "; ".join(parts) + "."


def records_table(records: Sequence[dict[str, Any]], title: str | None = None,
                  basis: RooflineBasis | None = None, columns: Sequence[str] = DEFAULT_COLUMNS,
                  peers_from: Sequence[dict[str, Any]] | None = None) -> Table:
    """The standard table: time, useful TFLOP/s, ratio to the peer, %roofline, eta, resources.

    ``basis`` is the roofline's ceilings; by default the recorded GPU's (ceilings/h200.json).
    ``peers_from`` holds the records the "vs peer" column looks the peer up in (default: ``records``),
    for a table that shows some of a run's records but compares them with its peer.
    """
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; known: {', '.join(COLUMNS)}")
    lookup = records if peers_from is None else peers_from
    basis = basis or roofline_basis()
    rows = tuple(tuple(COLUMNS[c].cell(r, lookup, basis) for c in columns) for r in records)
    return Table(tuple(column_header(c, basis) for c in columns), rows, title=title,
                 legend=records_legend(columns, basis, any(r["variant"] == HOST_BOUND for r in records)))


def show_recorded(chapter: str, gpu_slug: str = RECORDED_GPU, title: str | None = None) -> int:
    """Print a chapter's recorded results (for machines with no GPU); 0 if found, 1 if not."""
    path = results_path(chapter, gpu_slug)
    if not path.is_file():
        print(f"no recorded results at {path}", file=sys.stderr)
        return 1
    data = load_results(path)
    prov = data["provenance"]
    basis = roofline_basis(gpu_slug)
    measured = data.get("dense", {}).get("wgmma_e4m3_tflops")  # chapter 10 measures the e4m3 peak in its own run
    if basis.fp8_tensor_tflops is None and measured is not None:
        basis = replace(basis, fp8_tensor_tflops=measured, source=f"{basis.source}; e4m3 wgmma peak from the same run")
    print(records_table(data["records"], basis=basis,
                        title=title or f"Recorded on {prov['gpu']} ({prov['date']}, commit "
                                       f"{commit_label(prov['git_commit'])})").text())
    return 0
