"""Where a measurement came from: GPU, driver, clocks, package versions, git commit, date, command.

Every results file carries this beside its records, so a number on the site can be traced to the
machine and the code that produced it.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from moe_gemm.core.paths import REPO_ROOT
from moe_gemm.cuda.gpu import GpuInfo, detect_gpu
from moe_gemm.cuda.nvrtc import nvrtc_version

PROVENANCE_KEYS = ("gpu", "compute_capability", "driver", "cuda", "packages", "git_commit", "date", "command")
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


COMMIT_DIGITS = 12  # how many hex digits of a recorded commit a run prints


def commit_label(commit: str, root: Path = REPO_ROOT) -> str:
    """A recorded commit as :data:`COMMIT_DIGITS` hex digits, '+dirty' kept, for a table's title.

    A commit recorded shorter than that (a short hash given in $MOE_GEMM_GIT_COMMIT) is looked up in
    this checkout's git and lengthened; where git does not know it, it is shown as recorded.
    """
    head, dirty, _ = commit.partition("+")
    if re.fullmatch(rf"[0-9a-f]{{4,{COMMIT_DIGITS - 1}}}", head):
        try:
            head = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{head}^{{commit}}"], cwd=root,
                                  capture_output=True, text=True, check=True).stdout.strip() or head
        except (OSError, subprocess.CalledProcessError):
            pass
    return head[:COMMIT_DIGITS] + ("+dirty" if dirty else "")


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
