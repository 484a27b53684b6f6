"""What a chapter's run.py does, in a few calls: pick workloads and variants, run, tabulate, save.

A chapter lists its variants (kernels, peers) and workloads; :func:`run_variants` checks each
variant against the reference and times it on the same uploaded inputs, the peers beside the
kernels, and returns results records. :func:`records_table` prints them with the ratio to
``torch._grouped_mm`` measured in the same run; :func:`save_results` writes them with
provenance; :func:`show_recorded` prints a chapter's recorded table on a machine with no GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .bench import Variant, input_sets, measure, progress, verify
from .edge_cases import EDGE_CASES
from .gpu import GpuInfo
from .problem import Problem, make_problem, problem_from_counts
from .report import Table, format_table
from .results import load_results, provenance, results_path, write_results
from .roofline import roofline_tflops

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
                 title="Checks (exact: integer-valued inputs, bit for bit; random: relative error <= 1e-2)")


def run_variants(variants: Sequence[Variant], workloads: Sequence[Workload], **timing: int) -> list[dict[str, Any]]:
    """Check and time every variant on every workload; a variant that cannot take a workload is skipped.

    Each workload's inputs are drawn fresh and uploaded once, and every variant (peers
    included) runs on those same buffers, so the ratios in the table compare like with like.
    """
    records = []
    for workload in workloads:
        progress(f"[{workload.label}] drawing and uploading inputs")
        sets = input_sets(workload.problem)
        for variant in variants:
            progress(f"[{workload.label}] {variant.name}: check, then time")
            try:
                records.append(measure(variant, sets, **timing))
            except ValueError as unsupported:  # raised before any launch: the variant cannot take this input
                progress(f"[{workload.label}] {variant.name}: skipped ({unsupported})")
        del sets
    return records


def peer_ratio(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """record's useful TFLOP/s over torch._grouped_mm's on the same workload in the same run."""
    for other in records:
        if other["variant"] == PEER and all(other[k] == record[k] for k in ("tokens", "skew", "experts", "K", "N")):
            return record["useful_tflops"] / other["useful_tflops"]
    return None


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def records_table(records: Sequence[dict[str, Any]], title: str | None = None) -> str:
    """The standard table: time, useful TFLOP/s, ratio to the peer, %roofline, eta, resources."""
    headers = ["variant", "workload", "median ms", "TFLOP/s", "vs peer", "% roofline", "eta", "tiles", "regs",
               "smem KB", "blocks/SM"]
    rows = []
    for r in records:
        ratio = peer_ratio(r, records)
        limit = roofline_tflops(r["experts"], r["tokens"], r["K"], r["N"])
        smem = r.get("smem_bytes")
        rows.append([
            r["variant"], Workload(r["tokens"], r["skew"], r["experts"], r["K"], r["N"]).label,
            f"{r['median_ms']:.3f}", f"{r['useful_tflops']:.1f}", _fmt(ratio, ".2f"),
            f"{100 * r['useful_tflops'] / limit:.1f}", _fmt(r.get("eta"), ".3f"), _fmt(r.get("tiles"), ","),
            _fmt(r.get("registers"), "d"), _fmt(None if smem is None else smem / 1024, ".1f"),
            _fmt(r.get("blocks_per_sm"), "d"),
        ])
    return format_table(headers, rows, title=title)


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
    print(records_table(data["records"], title=title or f"Recorded on {prov['gpu']} ({prov['date']}, "
                                                        f"commit {prov['git_commit'][:12]})"))
    return 0
