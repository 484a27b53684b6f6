"""Results files: every number on the site comes from one of these, with where it came from.

``chapters/NN/results/<gpu>.json`` holds ``{"provenance": {...}, "records": [...]}``. A record
is one (variant, workload) measurement; its keys are :data:`RECORD_KEYS` (more may be added).
Files are written atomically (temporary file, then rename), so an interrupted run never
leaves half a file behind for the figure scripts to read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moe_gemm.core.paths import CHAPTERS_DIR
from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.measure.provenance import PROVENANCE_KEYS, provenance
from moe_gemm.model.workloads import Workload

RECORDED_GPU = "h200"  # the results shipped with the repository were measured on an NVIDIA H200
RECORD_KEYS = (
    "variant", "experts", "K", "N", "tokens", "skew", "median_ms", "min_ms", "max_ms",
    "useful_tflops", "scheduled_tflops", "eta", "tiles", "registers", "smem_bytes",
    "spill_bytes", "blocks_per_sm", "rel_error",
)


def write_results(path: Path | str, records: list[dict[str, Any]], prov: dict[str, Any],
                  extra: dict[str, Any] | None = None) -> Path:
    """Write atomically: a temporary file in the same folder, then os.replace.

    ``extra`` adds top-level sections beside the records (profiler counters, measured ceilings).
    """
    path = Path(path)
    missing = [key for key in PROVENANCE_KEYS if key not in prov]
    if missing:
        raise ValueError(f"provenance lacks {missing}")
    for record in records:
        absent = [key for key in ("variant", "tokens", "skew") if key not in record]
        if absent:
            raise ValueError(f"record {record.get('variant', '?')} lacks {absent}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"provenance": prov, "records": records, **(extra or {})}, handle, indent=1, allow_nan=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_results(path: Path | str) -> dict[str, Any]:
    """Read a results file and check it has the schema's two parts."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "provenance" not in data or "records" not in data:
        raise ValueError(f"{path} is not a results file (needs 'provenance' and 'records')")
    return data


def results_path(chapter: str, gpu_slug: str) -> Path:
    return CHAPTERS_DIR / chapter / "results" / f"{gpu_slug}.json"


def recorded(chapter: str, gpu_slug: str = RECORDED_GPU) -> dict[str, Any] | None:
    """The chapter's recorded results file, or None where it has none yet (figures, no-GPU paths)."""
    path = results_path(chapter, gpu_slug)
    return load_results(path) if path.is_file() else None


def recorded_gpus(chapter: str, first: str = RECORDED_GPU, chapters_dir: Path = CHAPTERS_DIR) -> list[str]:
    """The GPUs whose results files the chapter holds, in the order a reader looks: ``first``'s (the recorded GPU's)
    first, then the others by name (a part measured on one GPU only is read from the first file that holds it)."""
    folder = chapters_dir / chapter / "results"
    found = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    return sorted(found, key=lambda slug: slug != first)


def save_results(chapter: str, records: list[dict[str, Any]], gpu: GpuInfo, **extra: Any) -> str:
    """Write chapters/<chapter>/results/<gpu>.json with provenance; ``extra`` sections (profiler
    counters, measured ceilings) go in as top-level keys beside the records."""
    path = write_results(results_path(chapter, gpu.slug), records, provenance(gpu), extra=extra)
    return str(path)


def find_record(records: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The first record whose fields equal every keyword given."""
    for record in records:
        if all(record.get(key) == value for key, value in match.items()):
            return record
    return None


def find_measurement(records: Sequence[dict[str, Any]], variant: str,
                     workload: Workload | str) -> dict[str, Any] | None:
    """The record of ``variant`` on ``workload`` (a Workload, or its short label such as '16k s=0')."""
    def same(record: dict[str, Any]) -> bool:
        if isinstance(workload, Workload):
            return workload.matches(record)
        return Workload.of(record).short_label == workload
    return next((r for r in records if r["variant"] == variant and same(r)), None)


def best_of(records: Sequence[dict[str, Any]], names: Sequence[str], workload: Workload) -> dict[str, Any] | None:
    """The fastest of ``names`` at ``workload`` among these records (one run's), or None."""
    found = [r for name in names if (r := find_measurement(records, name, workload)) is not None]
    return max(found, key=lambda r: r["useful_tflops"]) if found else None


def best_ratio(records: Sequence[dict[str, Any]], ours: Sequence[str], theirs: Sequence[str],
               workload: Workload) -> float | None:
    """The fastest of ``ours`` over the fastest of ``theirs`` at ``workload``, in useful TFLOP/s, among
    these records (one run's); None if either was not measured."""
    mine, other = best_of(records, ours, workload), best_of(records, theirs, workload)
    return None if mine is None or other is None else mine["useful_tflops"] / other["useful_tflops"]
