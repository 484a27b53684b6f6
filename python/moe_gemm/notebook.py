"""What a chapter's run.py does, in a few calls: pick workloads and variants, run, tabulate, save.

A chapter lists its variants (kernels, peers) and workloads; :func:`run_variants` checks each
variant against the reference and times it on the same uploaded inputs, the peers beside the
kernels, and returns results records. :func:`records_table` prints them with the ratio to
``torch._grouped_mm`` measured in the same run; :func:`save_results` writes them with
provenance; :func:`show_recorded` prints a chapter's recorded table on a machine with no GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .bench import Variant, input_sets, measure, progress, verify
from .edge_cases import EDGE_CASES
from .gpu import GpuInfo
from .problem import Problem, make_problem, problem_from_counts
from .report import Table
from .results import load_results, provenance, results_path, write_results
from .roofline import FIXED_BASIS, RooflineBasis, roofline_basis

PEER = "peer/torch_grouped_mm"
RECORDED_GPU = "h200"  # the results shipped with the repository were measured on an H200


@dataclass(frozen=True)
class Workload:
    """One problem shape and routing; the seed configuration is E=64, K=1024, N=2688."""

    tokens: int
    skew: float
    experts: int = 64
    K: int = 1024  # noqa: N815
    N: int = 2688  # noqa: N815

    @property
    def label(self) -> str:
        extra = "" if (self.K, self.N, self.experts) == (1024, 2688, 64) else f", E={self.experts} K={self.K} N={self.N}"
        return f"{self.tokens:,} rows, s={self.skew:g}{extra}"

    def problem(self, seed: int) -> Problem:
        return make_problem(self.experts, self.tokens, self.K, self.N, self.skew, seed=seed)

    def matches(self, record: dict[str, Any]) -> bool:
        return (record["tokens"], record["skew"], record["experts"], record["K"], record["N"]) == (
            self.tokens, self.skew, self.experts, self.K, self.N)


SEED_WORKLOADS = (Workload(16384, 0.0), Workload(16384, 1.2), Workload(2048, 0.0))


def short_label(record: dict[str, Any]) -> str:
    """A record's workload as a table column: '16k s=0', '2k s=1.2', '1,000 s=0'."""
    rows = f"{record['tokens'] // 1024}k" if record["tokens"] % 1024 == 0 else f"{record['tokens']:,}"
    return f"{rows} s={record['skew']:g}"


def find_measurement(records: Sequence[dict[str, Any]], variant: str,
                     workload: Workload | str) -> dict[str, Any] | None:
    """The record of ``variant`` on ``workload`` (a Workload, or a :func:`short_label` such as '16k s=0')."""
    def same(record: dict[str, Any]) -> bool:
        return workload.matches(record) if isinstance(workload, Workload) else short_label(record) == workload
    return next((r for r in records if r["variant"] == variant and same(r)), None)


# --------------------------------------------------------------------------- correctness before timing

def check_cases(seed: int) -> list[tuple[str, Problem, bool]]:
    """(name, problem, exact): every edge case on integer-valued inputs, then two random problems."""
    cases = [(case.name, problem_from_counts(case.counts_array(), case.K, case.N, values="integer", seed=seed), True)
             for case in EDGE_CASES]
    cases += [("random, 1,000 rows s=1.2, E=8, K=1024, N=384", make_problem(8, 1000, 1024, 384, 1.2, seed=seed), False),
              ("random, 2,048 rows s=0, seed shape", make_problem(64, 2048, 1024, 2688, 0.0, seed=seed), False)]
    return cases


def run_checks(variants: Sequence[Variant], seed: int = 0) -> list[dict[str, Any]]:
    """Every variant on every :func:`check_cases` problem: exact bit for bit, or within the tolerance.

    Each case is uploaded once and every variant runs on the same device buffers (the seed-shape
    case alone is 352 MB of B); the results come back grouped by variant."""
    from .device import DeviceProblem

    results = []
    for name, problem, exact in check_cases(seed):
        progress(f"[checks] {name}")
        dev = DeviceProblem(problem)
        for variant in variants:
            check = verify(variant, dev, exact=exact)
            results.append({"variant": variant.name, "case": name, "exact": exact, "passed": check.passed,
                            "rel_error": check.rel_error, "mismatches": check.mismatches,
                            "nonfinite": check.nonfinite, "result": check.describe()})
        del dev
    order = {variant.name: i for i, variant in enumerate(variants)}
    return sorted(results, key=lambda r: order[r["variant"]])  # stable: cases keep their order


def checks_table(checks: Sequence[dict[str, Any]]) -> Table:
    return Table(("variant", "case", "result"), tuple((c["variant"], c["case"], c["result"]) for c in checks),
                 title="Checks against the numpy reference",
                 legend="exact: integer-valued inputs, compared bit for bit; random: relative Frobenius error "
                        "<= 1e-2; C is filled with NaN before every launch.")


def run_variants(variants: Sequence[Variant], workloads: Sequence[Workload], rounds: int = 1,
                 **timing: int) -> list[dict[str, Any]]:
    """Check and time every variant on every workload; a variant that cannot take a workload is skipped.

    Each workload's inputs are drawn fresh and uploaded once, and every variant (peers
    included) runs on those same buffers, so the ratios in the table compare like with like.

    With ``rounds`` > 1 the timing is repeated in interleaved rounds (A B C, A B C, ...), each
    variant prepared afresh every round (new output and list allocations), and a record keeps the
    median of its rounds' medians and every round's median (``round_medians_ms``): a slow spell of
    the GPU, or an unlucky allocation, then shows as spread instead of as a ratio.
    """
    records = []
    for workload in workloads:
        progress(f"[{workload.label}] drawing and uploading inputs")
        sets = input_sets(workload.problem)
        checks: dict[str, Any] = {}
        rounds_of: dict[str, list[dict[str, Any]]] = {}
        for round_ in range(rounds):
            for variant in variants:
                if round_ == 0:
                    progress(f"[{workload.label}] {variant.name}: check, then time")
                    try:
                        checks[variant.name] = verify(variant, sets[0])
                    except ValueError as unsupported:  # raised before any launch: the variant cannot take this input
                        progress(f"[{workload.label}] {variant.name}: skipped ({unsupported})")
                        continue
                if variant.name in checks:
                    rounds_of.setdefault(variant.name, []).append(
                        measure(variant, sets, check=checks[variant.name], **timing))
        records += [measured[0] if rounds == 1 else _merge_rounds(measured) for measured in rounds_of.values()]
        del sets
    return records


def _merge_rounds(measured: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from a variant's records of several rounds: the median of their medians."""
    import statistics

    medians = [r["median_ms"] for r in measured]
    record = dict(measured[0])
    record.update(median_ms=statistics.median(medians), min_ms=min(r["min_ms"] for r in measured),
                  max_ms=max(r["max_ms"] for r in measured), round_medians_ms=medians, rounds=len(medians))
    scale = measured[0]["median_ms"] / record["median_ms"]
    record["useful_tflops"] = measured[0]["useful_tflops"] * scale
    if "scheduled_tflops" in record:
        record["scheduled_tflops"] = measured[0]["scheduled_tflops"] * scale
    return record


def peer_ratio(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """record's useful TFLOP/s over torch._grouped_mm's on the same workload in the same run."""
    for other in records:
        if other["variant"] == PEER and all(other[k] == record[k] for k in ("tokens", "skew", "experts", "K", "N")):
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


def _roofline_cell(r: dict[str, Any], _: Sequence[dict[str, Any]], basis: RooflineBasis) -> str:
    return f"{100 * r['useful_tflops'] / basis.tflops(r['experts'], r['tokens'], r['K'], r['N']):.1f}"


# The columns a results table can show, by name; run.py and the docs pages (moe_gemm.pages) draw
# from the same definitions, so a number on the site and the same number in a terminal agree.
COLUMNS: dict[str, Column] = {
    "variant": Column("variant", "", lambda r, rs, b: r["variant"]),
    "workload": Column("workload", "", lambda r, rs, b: Workload(r["tokens"], r["skew"], r["experts"], r["K"],
                                                                  r["N"]).label),
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
    "roofline": Column("% roofline", "% roofline: of max(FLOP / dense bf16, bytes / copy) at the ceilings "
                                     "in the header (TFLOP/s / TB/s)", _roofline_cell),
    "eta": Column("eta", "eta: real rows / scheduled rows", lambda r, rs, b: _fmt(r.get("eta"), ".3f")),
    "tiles": Column("tiles", "tiles: blocks launched", lambda r, rs, b: _fmt(r.get("tiles"), ",")),
    "registers": Column("regs", "regs: per thread", lambda r, rs, b: _fmt(r.get("registers"), "d")),
    "smem": Column("smem KB", "smem: per block",
                   lambda r, rs, b: _fmt(None if r.get("smem_bytes") is None else r["smem_bytes"] / 1024, ".1f")),
    "blocks": Column("blocks/SM", "blocks/SM: the occupancy model's, from registers and shared memory",
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
                  basis: RooflineBasis = FIXED_BASIS, columns: Sequence[str] = DEFAULT_COLUMNS,
                  peers_from: Sequence[dict[str, Any]] | None = None) -> Table:
    """The standard table: time, useful TFLOP/s, ratio to the peer, %roofline, eta, resources.

    ``peers_from`` holds the records the "vs peer" column looks the peer up in (default: ``records``),
    for a table that shows some of a run's records but compares them with its peer.
    """
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; known: {', '.join(COLUMNS)}")
    lookup = records if peers_from is None else peers_from
    rows = tuple(tuple(COLUMNS[c].cell(r, lookup, basis) for c in columns) for r in records)
    return Table(tuple(column_header(c, basis) for c in columns), rows, title=title,
                 legend=records_legend(columns, basis, any(r["variant"] == HOST_BOUND for r in records)))


def save_results(chapter: str, records: list[dict[str, Any]], gpu: GpuInfo, **extra: Any) -> str:
    """Write chapters/<chapter>/results/<gpu>.json with provenance; ``extra`` sections (profiler
    counters, measured ceilings) go in as top-level keys beside the records."""
    path = write_results(results_path(chapter, gpu.slug), records, provenance(gpu), extra=extra)
    return str(path)


def show_recorded(chapter: str, gpu_slug: str = RECORDED_GPU, title: str | None = None) -> int:
    """Print a chapter's recorded results (for machines with no GPU); 0 if found, 1 if not."""
    path = results_path(chapter, gpu_slug)
    if not path.is_file():
        print(f"no recorded results at {path}", file=sys.stderr)
        return 1
    data = load_results(path)
    prov = data["provenance"]
    print(records_table(data["records"], basis=roofline_basis(data),
                        title=title or f"Recorded on {prov['gpu']} ({prov['date']}, commit "
                                       f"{prov['git_commit'][:12]})").text())
    return 0
