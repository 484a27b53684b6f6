"""Scheduler counters from Nsight Compute, for the issue model of chapter 02 onward.

:func:`profile_variant` runs ``ncu`` on :mod:`moe_gemm.measure.profile_target` in a subprocess: one
variant on one workload, profiling a single launch after the checked one and the warm-ups, with
the GPU's clocks left alone (``--clock-control none``, as in the timed runs). The CSV report is
parsed into the quantities the model uses:

* ``warps_per_scheduler`` (W): ``smsp__warps_active.avg.per_cycle_active``
* ``cycles_per_issue`` (L, "warp cycles per issued instruction"):
  ``smsp__average_warp_latency_per_inst_issued.ratio``
* ``issue_active``: ``smsp__issue_active.avg.per_cycle_active``, the fraction of cycles a
  scheduler issued (``issue_active_pct`` is the same as a percentage of peak)
* ``ipc``: ``sm__inst_executed.avg.per_cycle_active``; ``instructions``: ``smsp__inst_executed.sum``
* ``achieved_occupancy_pct``: ``sm__warps_active.avg.pct_of_peak_sustained_active``

plus the per-reason stall breakdown (``stall_<reason>``, cycles per issued instruction; the
reasons add up to about L) and the tensor pipe's utilisation where the GPU reports it. The model
predicts ``issue_active ~= W / L`` per scheduler.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from moe_gemm.model.occupancy import issue_rate
from moe_gemm.model.workloads import SEED_EXPERTS, SEED_K, SEED_N, Workload

# The counters the issue model needs; a profile without them is no profile.
CORE_METRICS = {
    "warps_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
    "issue_active": "smsp__issue_active.avg.per_cycle_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "ipc": "sm__inst_executed.avg.per_cycle_active",
    "instructions": "smsp__inst_executed.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "duration_ns": "gpu__time_duration.sum",
}
ESSENTIAL = ("warps_per_scheduler", "cycles_per_issue", "issue_active")
STALL_REASONS = ("barrier", "short_scoreboard", "long_scoreboard", "wait", "math_pipe_throttle", "mio_throttle",
                 "lg_throttle", "not_selected", "selected", "dispatch_stall", "no_instruction", "branch_resolving",
                 "membar", "drain", "sleeping", "misc", "tex_throttle", "imc_miss", "gmma")
OCCUPANCY_METRICS = {
    "registers_per_thread": "launch__registers_per_thread",
    "occupancy_limit_registers": "launch__occupancy_limit_registers",
    "occupancy_limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "occupancy_limit_warps": "launch__occupancy_limit_warps",
    "occupancy_limit_blocks": "launch__occupancy_limit_blocks",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "achieved_warps_per_sm": "sm__warps_active.avg.per_cycle_active",
}
EXTRA_METRICS = {
    **OCCUPANCY_METRICS,
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    # wgmma (HGMMA) runs on the same tensor pipe; this counter names it explicitly on Hopper
    "gmma_pipe_pct": "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes_read": "dram__bytes_read.sum",
    "dram_bytes_write": "dram__bytes_write.sum",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l2_throughput_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_bytes": "lts__t_bytes.sum",
    **{f"stall_{reason}": f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
       for reason in STALL_REASONS},
}
NCU_TIMEOUT_S = 600


def find_ncu() -> str:
    """The ncu binary: $NCU, PATH, then the usual CUDA toolkit and Nsight Compute folders."""
    candidates = [os.environ.get("NCU"), shutil.which("ncu"),
                  *sorted(glob.glob("/usr/local/cuda*/bin/ncu"), reverse=True),
                  *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("ncu (Nsight Compute CLI) not found: put it on PATH or set NCU=/path/to/ncu")


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str, metrics: Mapping[str, str]) -> dict[str, float]:
    """Pick ``metrics`` (our name -> ncu metric name) out of ncu's ``--csv`` details output.

    ncu writes one row per (kernel launch, metric) with "Metric Name" and "Metric Value"
    columns; lines before the header (``==PROF==`` messages) are skipped. With several profiled
    launches the last one wins. Numbers may carry thousands separators.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError(f"no ncu CSV header in the output:\n{text[-2000:]}")
    by_metric = {ncu_name: ours for ours, ncu_name in metrics.items()}
    values: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        ours = by_metric.get(row.get("Metric Name", ""))
        if ours is not None and (value := _number(row.get("Metric Value", ""))) is not None:
            values[ours] = value
    return values


def _ncu_launch(what: list[str], kernel_regex: str | None, skip: int | None) -> list[str]:
    """ncu profiling ``what`` (its sections or metrics and outputs) of one launch, clocks left alone: the first one
    inside the target's cuProfilerStart/Stop range where ``skip`` is None, else the one after ``skip`` of the
    kernel's launches (only those matching ``kernel_regex``, where given)."""
    command = [find_ncu(), "--clock-control", "none", *what, "--launch-count", "1"]
    command += ["--profile-from-start", "off"] if skip is None else ["--launch-skip", str(skip)]
    return command + (["-k", f"regex:{kernel_regex}"] if kernel_regex else [])


def _run_ncu(target: list[str], metrics: Mapping[str, str], kernel_regex: str | None,
             skip: int | None) -> tuple[int, str, str]:
    """``skip`` None: profile the first launch inside the target's cuProfilerStart/Stop range."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        command = _ncu_launch(["--csv", "--print-units", "base", "--log-file", log, "--metrics",
                               ",".join(metrics.values())], kernel_regex, skip)
        proc = subprocess.run(command + target, capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
        report = open(log).read() if os.path.exists(log) else ""
    if '"ID"' not in report and '"ID"' in proc.stdout:  # an ncu that ignores --log-file for the CSV
        report = proc.stdout
    return proc.returncode, report, proc.stdout + proc.stderr


def _source_waits(target: list[str], kernel_regex: str | None, skip: int | None) -> dict[str, Any]:
    """The mbarrier waits of the same launch from ncu's source counters (moe_gemm.measure.wait_sites), per role, and
    the instructions where the most samples fell (``hot_sites``)."""
    from moe_gemm.measure.wait_sites import hot_sites, parse_source_csv, wait_summary

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "source")
        command = _ncu_launch(["--section", "SourceCounters", "-f", "-o", report], kernel_regex, skip)
        proc = subprocess.run(command + target, capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
        if proc.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
            raise RuntimeError(f"ncu's source counters failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        page = subprocess.run([find_ncu(), "--import", report + ".ncu-rep", "--page", "source", "--csv",
                               "--print-source", "sass"], capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    rows = parse_source_csv(page.stdout)
    return {**wait_summary(rows), "hot_sites": hot_sites(rows)}


def profile_variant(variant_name: str, tokens: int, skew: float, *, experts: int = SEED_EXPERTS,
                    K: int = SEED_K, N: int = SEED_N, warmup: int | None = None, kernel_regex: str | None = None,
                    profiler_range: bool = False, ragged: str = "M", fmt: str = "bf16",
                    waits: bool = False) -> dict[str, Any]:
    """Profile one launch of ``variant_name`` on one workload; the counters as a dict.

    ``kernel_regex`` defaults to the variant's ``kernel_function`` attribute (only its launches are counted and
    profiled), k6's dswiglu kernel for the fused SwiGLU backward's configurations (chapter 09; they run on torch's
    tensors). ``profiler_range`` profiles the first launch inside the target's cuProfilerStart/Stop range instead
    of counting launches: for variants whose preparation launches kernels of its own (an autotuner's trials,
    torch's random inputs). If ncu rejects metrics this GPU or ncu version lacks, the profile is retaken without
    them (the three the model needs, :data:`ESSENTIAL`, are never dropped). ``ragged="K"`` profiles the weight
    gradient (chapter 09) at the same sizes; ``fmt`` names the operands' format (moe_gemm.model.problem.FORMATS:
    chapter 10's e4m3 ones). ``waits``: a second ncu pass over the same launch samples its mbarrier waits by role
    (moe_gemm.measure.wait_sites: ``producer_wait_pct``, ``consumer_wait_retries``, ...), kept where it succeeds.
    """
    from moe_gemm.measure.profile_target import DEFAULT_WARMUP, launches_before_profiled
    from moe_gemm.variants.k6.config import FUSED_BACKWARD
    from moe_gemm.variants.registry import get

    warmup = DEFAULT_WARMUP if warmup is None else warmup
    if kernel_regex is None:  # the fused backward is no registry variant: its kernel function's name
        kernel_regex = ("k6_persistent_dswiglu" if variant_name in FUSED_BACKWARD else
                        getattr(get(variant_name), "kernel_function", None))
    target = [sys.executable, "-m", "moe_gemm.measure.profile_target", variant_name, str(tokens), str(skew),
              "--experts", str(experts), "-K", str(K), "-N", str(N), "--warmup", str(warmup), "--ragged", ragged,
              "--format", fmt]
    skip = None if profiler_range else launches_before_profiled(warmup)
    metrics = {**CORE_METRICS, **EXTRA_METRICS}
    values: dict[str, float] = {}
    code, report, output = 0, "", ""
    for _ in range(4):  # drop the metrics this GPU or ncu version does not know, then retry
        code, report, output = _run_ncu(target, metrics, kernel_regex, skip)
        values = _parse_or_empty(report, metrics) if code == 0 else {}
        if all(key in values for key in ESSENTIAL):
            break
        unknown = set(re.findall(r"[Ff]ailed to find metric:? *'?([\w.]+)", output + report))
        if unknown:
            metrics = {ours: name for ours, name in metrics.items() if name not in unknown or ours in ESSENTIAL}
        elif metrics != CORE_METRICS:
            metrics = dict(CORE_METRICS)
        else:
            break
    if not all(key in values for key in ESSENTIAL):
        raise RuntimeError(f"ncu gave no usable profile of {variant_name} (exit {code}):\n{output[-3000:]}\n"
                           f"{report[-2000:]}")
    if waits:
        try:
            values.update(_source_waits(target, kernel_regex, skip))
        except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as error:  # the counters stay
            from moe_gemm.measure.check import progress

            progress(f"[profile] {variant_name}: no wait sites ({str(error).splitlines()[0]})")
    kind = {**({} if ragged == "M" else {"ragged": ragged}), **({} if fmt == "bf16" else {"format": fmt})}
    return {"variant": variant_name, "experts": experts, "K": K, "N": N, "tokens": tokens, "skew": float(skew),
            **kind, **values, "issue_model": model_issue(values)}


PROFILE_ERROR_LINES = 25  # of a failed profile's output, printed under its name


def built_not_run(name: str) -> bool:
    """Whether ``name`` is built but has not passed its GPU tests: a rung of a ladder's NOT_YET_RUN, or a fused SwiGLU
    backward configuration whose record name is in moe_gemm.torch.kernels.NOT_YET_RUN."""
    from moe_gemm.measure.validation import not_yet_run
    from moe_gemm.torch.kernels import FUSED_BACKWARD_RECORDS

    return not_yet_run(FUSED_BACKWARD_RECORDS.get(name, name))


def profile_cells(cells: Mapping[Any, Sequence[str]], only: Sequence[str] = (), waits: bool = False,
                  routed_rows: Collection[int] = ()) -> list[dict[str, Any]]:
    """A chapter's ``--profile``: each variant of ``cells`` (a Workload -> the variant names to profile there; only
    those named in ``only``, where it names any; only the cells of ``routed_rows`` rows, where it names any) under
    ncu, the first launch of its profiler range, on the workload's shape, ragged axis and operand format
    (``waits``: with its mbarrier waits by role, profile_variant).
    A variant ncu gives no profile of is reported and left out. Every row carries ``profiled_at``, the call's start
    (UTC): one launch's duration moved by 2-6% between two runs of the same kernel on two H100s (chapter 07's M pair,
    same instruction counts), more than some differences a page reads between rows, so rows compared must share it."""
    from datetime import datetime, timezone

    from moe_gemm.measure.check import progress

    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []
    for cell, names in cells.items():
        if routed_rows and cell.tokens not in routed_rows:
            continue
        for name in (n for n in names if not only or n in only):
            if built_not_run(name):  # correct first: a kernel is profiled once it has passed its GPU tests
                progress(f"[profile] {name}: not profiled, built and not yet run on a GPU (its GPU tests first: "
                         f"python -m moe_gemm.measure.validation run --pending-only)")
                continue
            progress(f"[profile] {name} at {cell.label} under ncu")
            try:
                rows.append(profile_variant(name, cell.tokens, cell.skew, experts=cell.experts, K=cell.K, N=cell.N,
                                            profiler_range=True, ragged=cell.ragged, fmt=cell.fmt.name,
                                            waits=waits) | {"profiled_at": stamp})
            except (RuntimeError, ValueError) as error:  # the reason in full: ncu's and the target's last lines
                lines = [line for line in str(error).splitlines() if line.strip()]
                progress(f"[profile] {name}: no profile ({lines[0] if lines else type(error).__name__})")
                for line in lines[1:][-PROFILE_ERROR_LINES:]:
                    progress(f"[profile]     {line}")
    return rows


def mixed_runs(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The cells whose profile rows come from more than one run (``profiled_at``; a row without it counts as one
    earlier run), each as a line saying so: a --profile of some variants replaces only theirs, and one launch's
    duration moves by a few percent between runs, so rows of two runs cannot be compared."""
    runs: dict[str, set[str]] = {}
    for row in rows:
        runs.setdefault(Workload.of(row).label, set()).add(row.get("profiled_at", "an earlier run"))
    return [f"[profile] at {cell} the rows come from {len(stamps)} runs ({', '.join(sorted(stamps))}): compare only "
            f"rows of one run, or profile the cell's variants together" for cell, stamps in runs.items()
            if len(stamps) > 1]


def _parse_or_empty(report: str, metrics: Mapping[str, str]) -> dict[str, float]:
    try:
        return parse_ncu_csv(report, metrics)
    except ValueError:
        return {}


def occupancy(variant_name: str, tokens: int = 16384, skew: float = 0.0, **workload: Any) -> dict[str, Any]:
    """Nsight Compute's view of one variant's residency: the launch's occupancy limits (blocks per
    SM allowed by registers, shared memory, warps, blocks), theoretical and achieved occupancy,
    beside the scheduler counters of :func:`profile_variant` (it is the same single profile)."""
    return profile_variant(variant_name, tokens, skew, **workload)


def model_issue(counters: Mapping[str, float]) -> float | None:
    """W / L per scheduler from measured W and L (the model's prediction of issue_active)."""
    w, cycles = counters.get("warps_per_scheduler"), counters.get("cycles_per_issue")
    if w is None or not cycles:
        return None
    return issue_rate(w, cycles)
