"""Results files: every number on the site comes from one of these, with where it came from.

``chapters/NN/results/<gpu>.json`` holds ``{"provenance": {...}, "records": [...]}``. A record
is one (variant, workload) measurement; its keys are :data:`RECORD_KEYS` (more may be added).
Files are written atomically (temporary file, then rename), so an interrupted run never
leaves half a file behind for the figure scripts to read.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from .gpu import GpuInfo, detect_gpu

REPO_ROOT = Path(__file__).resolve().parents[2]

PROVENANCE_KEYS = ("gpu", "compute_capability", "driver", "cuda", "packages", "git_commit", "date", "command")
RECORD_KEYS = (
    "variant", "experts", "K", "N", "tokens", "skew", "median_ms", "min_ms", "max_ms",
    "useful_tflops", "scheduled_tflops", "eta", "tiles", "registers", "smem_bytes",
    "spill_bytes", "blocks_per_sm", "rel_error",
)
PACKAGES = ("numpy", "ml_dtypes", "numba", "numba-cuda", "cuda-core", "cuda-bindings",
            "nvidia-cuda-nvrtc", "torch")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(root: Path = REPO_ROOT) -> str:
    """HEAD's hash, with '+dirty' when the work tree has changes.

    A copy of the tree without its .git (a remote GPU machine, say) cannot ask git: there the
    caller names the commit it copied in $MOE_GEMM_GIT_COMMIT. Otherwise 'unknown'.
    """
    if os.environ.get("MOE_GEMM_GIT_COMMIT"):
        return os.environ["MOE_GEMM_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def gpu_clocks() -> dict[str, str]:
    """SM and memory clocks from nvidia-smi, where it is installed (empty otherwise)."""
    query = "clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(query.split(","), values))


def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - provenance is best effort
        return "unknown"


def provenance(gpu: GpuInfo | None = None, command: list[str] | None = None) -> dict[str, Any]:
    gpu = gpu if gpu is not None else detect_gpu()
    return {
        "gpu": gpu.name if gpu else "none",
        "compute_capability": f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" if gpu else "none",
        "sm_count": gpu.sm_count if gpu else 0,
        "driver": gpu.driver_cuda if gpu else "none",
        "cuda": {"driver_api": gpu.driver_cuda if gpu else "none", "nvrtc": nvrtc_version()},
        "clocks": gpu_clocks() if gpu else {},
        "packages": package_versions(),
        "git_commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command if command is not None else [sys.executable, *sys.argv]),
        "host": platform.node(),
    }


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
    return REPO_ROOT / "chapters" / chapter / "results" / f"{gpu_slug}.json"


def recorded(chapter: str, gpu_slug: str = "h200") -> dict[str, Any] | None:
    """The chapter's recorded results file, or None where it has none yet (figures, no-GPU paths)."""
    path = results_path(chapter, gpu_slug)
    return load_results(path) if path.is_file() else None


def chapter_module(chapter: str, name: str = "run") -> ModuleType:
    """``chapters/<chapter>/<name>.py`` as a module, loaded afresh: chapter folders are numbered, not
    packages, so a chapter's figures.py (or a test) reaches its run.py this way."""
    spec = importlib.util.spec_from_file_location(f"chapter{chapter}_{name}",
                                                  REPO_ROOT / "chapters" / chapter / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_record(records: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The first record whose fields equal every keyword given."""
    for record in records:
        if all(record.get(key) == value for key, value in match.items()):
            return record
    return None
