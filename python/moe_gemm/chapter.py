"""A chapter's toolbox: the one module its run.py and figures.py import from the harness.

A chapter is a lab notebook: choose the variants and the workloads, run them (checked against the
numpy reference, then timed beside the peers in the same run), print the tables, save the results;
then plot the recorded results. Every chapter has this shape, so the next starts as a copy of the last::

    run.py      \"""Chapter NN: what it teaches, then the commands it takes.\"""
                CHAPTER = "NN"
                REQUIRES = SM90A             # what its kernels need of the GPU (a Requirement)
                WORKLOADS = SEED_FIVE        # from moe_gemm.model.workloads; the variants by registry name

                def parse_args(argv): ...                      # chapter_parser(__doc__) and its flags
                def run_on_gpu(args, gpu) -> int: ...          # check, time, show the tables, save_results
                def run_without_gpu(args, reason) -> int: ...  # print_not_run, compile report, show_recorded
                def main(argv=None) -> int:
                    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)

                if __name__ == "__main__":
                    run_main(main)

    figures.py  def write_outputs(root: Path) -> list[Path]: ...  # from recorded(CHAPTER), None if absent
                def main(argv=None) -> int:
                    return figures_main(__doc__, write_outputs, CHAPTER, argv)

A figures.py reaches its run.py's tables and constants through ``chapter_module(CHAPTER)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_gemm.core.chapters import chapter_module
from moe_gemm.core.cli import (
    add_grid_arguments,
    add_models_argument,
    add_profile_argument,
    add_rounds_argument,
    add_timing_arguments,
    chapter_parser,
    check_profile_argument,
    ignored_flags,
    named_rows,
    run_main,
    timing_options,
)
from moe_gemm.core.tables import Table
from moe_gemm.cuda import gpu as _gpu
from moe_gemm.measure.check import progress
from moe_gemm.measure.results import best_of, best_ratio, find_measurement, recorded, save_results
from moe_gemm.measure.runs import failed_variants, run_checks, run_variants
from moe_gemm.model.workloads import (
    GRID_SKEWS,
    GRID_TOKENS,
    LAYERS,
    MODEL_PROJECTIONS,
    MORE_MODEL_PROJECTIONS,
    SEED,
    SEED_FIVE,
    SEED_WORKLOADS,
    LayerShape,
    Workload,
    grid,
)
from moe_gemm.site.records import (
    PEER,
    checks_table,
    hot_sites_table,
    profile_table,
    records_table,
    show_recorded,
    targets_table,
)
from moe_gemm.variants.peer.torch import GROUPED_MM_PEERS, TorchGroupedMM, torch_available

__all__ = [
    "ANY_GPU", "GRID_SKEWS", "GRID_TOKENS", "LAYERS", "LayerShape", "MODEL_PROJECTIONS", "MORE_MODEL_PROJECTIONS",
    "NO_GPU", "PEER", "PEERS", "Requirement", "SEED", "SEED_FIVE", "SEED_WORKLOADS", "SM90A", "Table", "Workload",
    "add_grid_arguments", "add_models_argument", "add_profile_argument", "add_rounds_argument",
    "add_timing_arguments", "best_of", "best_peer", "best_ratio", "chapter_main", "chapter_module", "chapter_parser",
    "check_profile_argument", "checks_table", "chosen_shapes",
    "compile_only", "describe_gpu", "failed_variants", "figures_main", "find", "grid", "grouped_mm_peers",
    "ignored_flags", "keep_profile", "named_rows", "not_run_banner", "print_not_run", "print_pending",
    "profile_table", "progress", "ratio_to_peer", "recorded", "records_table", "run_checks", "run_main",
    "run_variants", "save_results", "show", "show_profile", "show_recorded", "start_parts_run", "targets_table",
    "timing_options",
]

# --------------------------------------------------------------------------- what the kernels need


@dataclass(frozen=True)
class Requirement:
    """What a chapter's kernels need of the GPU: ``accepts`` tests a compute capability, and ``needs``
    completes "<GPU> is sm_XY and ..." where it fails. ``accepts=None``: the chapter uses no GPU."""

    accepts: Callable[[tuple[int, int]], bool] | None
    needs: str

    def why_not(self, gpu: _gpu.GpuInfo | None) -> str | None:
        """Why the kernels are not run on ``gpu``, completing "... is not run here because"; None if
        they can be."""
        if self.accepts is None:
            return self.needs
        if gpu is None:
            return "there is no NVIDIA GPU on this machine"
        if self.accepts(gpu.compute_capability):
            return None
        major, minor = gpu.compute_capability
        return f"{gpu.name} is sm_{major}{minor} and {self.needs}"


NO_GPU = Requirement(None, "every number in this chapter is arithmetic on the routing")
ANY_GPU = Requirement(lambda capability: True, "")
SM90A = Requirement(lambda capability: capability == (9, 0), "wgmma runs only on sm_90a")


def chosen_shapes(shapes: Mapping[str, Workload], names: Sequence[str]) -> dict[str, Workload]:
    """The shapes (label -> workload) whose label contains one of ``names``, case-insensitive (every one when
    ``names`` is empty), in their order: what a chapter's ``--models`` picks. ValueError for a name that
    matches no label, so that a typo is refused before anything runs."""
    unknown = [n for n in names if not any(n.lower() in label.lower() for label in shapes)]
    if unknown:
        raise ValueError(f"--models {' '.join(unknown)}: no model shape's label contains it "
                         f"(they are: {'; '.join(shapes)})")
    return {label: w for label, w in shapes.items() if not names or any(n.lower() in label.lower() for n in names)}


def chapter_main(args: Any, requires: Requirement, run_on_gpu: Callable[[Any, _gpu.GpuInfo], int] | None,
                 run_without_gpu: Callable[[Any, str], int], *, skip_gpu: str | None = None) -> int:
    """Look for the GPU and run the chapter: ``run_on_gpu(args, gpu)`` where ``requires`` accepts it,
    else ``run_without_gpu(args, reason)``. ``skip_gpu``: a reason not to look (a flag asking for the
    no-GPU path), given as the reason."""
    gpu, reason = None, skip_gpu
    if reason is None:
        gpu = None if requires.accepts is None else _gpu.detect_gpu()
        reason = requires.why_not(gpu)
    return run_without_gpu(args, reason) if reason is not None else run_on_gpu(args, gpu)


def not_run_banner(kernel: str, reason: str, instead: str) -> str:
    """The first line of every no-GPU run: "k3 is not run here because <reason>; <instead>."."""
    return f"{kernel} is not run here because {reason}; {instead}."


def print_not_run(args: Any, kernel: str, reason: str, instead: str, flags: Sequence[str], why: str) -> None:
    """Start a no-GPU run: the banner, then which of ``flags`` the command line gave that cannot act
    here, and ``why``, then a blank line."""
    print(not_run_banner(kernel, reason, instead))
    note = ignored_flags(args, flags, why)
    if note:
        print(note)
    print()


def print_pending(names: frozenset[str], where: str) -> None:
    """On a GPU: say which rungs are built but left out until their GPU tests have run (``where``: the set's name)."""
    if names:
        print(f"built and compiled, not yet run on a GPU, so neither checked nor timed here: "
              f"{', '.join(sorted(names))} ({where})\n")


def compile_only(args: Any, chapter: str, kernel: str, reason: str, flags: Sequence[str], report: Table,
                 compiled: str = "every rung", why: str = "nothing is timed without an sm_90a GPU") -> int:
    """A chapter's run without the GPU its kernels need: the banner and the flags that cannot act (``why``),
    the compile ``report`` of what it compiled instead, then the recorded results; exit status 0."""
    print_not_run(args, kernel, reason, f"compiling {compiled} for sm_90a instead", flags, why)
    show(report)
    if show_recorded(chapter) != 0:
        print(f"(no recorded results for chapter {chapter} yet)")
    return 0


Report = list[dict[str, Any]]  # a chapter's compile report: one row per kernel (site.compile_report.compile_rows)


def start_parts_run(args: Any, gpu: _gpu.GpuInfo, chapter: str, sections: frozenset[str],
                    compile_report: Callable[[str], Report],
                    report_table: Callable[[Report], Table]) -> tuple[dict[str, int], Report, Any]:
    """The start of a timed chapter's run in parts (chapters 07, 09, 10): the GPU's line, the chapter's compile
    report for this GPU printed, and its results file as this GPU last left it (measure.parts.PartsFile, keeping
    ``sections``). Returns (the timing options, the report, the file)."""
    from moe_gemm.measure.parts import PartsFile

    print(describe_gpu(gpu) + "\n")
    report = compile_report(gpu.arch)
    show(report_table(report))
    return timing_options(args), report, PartsFile(chapter, gpu, sections)


def describe_gpu(gpu: _gpu.GpuInfo) -> str:
    """The first line of every GPU run: which GPU, its target, SMs and driver."""
    return f"{gpu.name} ({gpu.arch}, {gpu.sm_count} SMs, driver CUDA {gpu.driver_cuda})"


def show(table: Table) -> None:
    """Print a table, its legend, and a blank line."""
    print(table.text(), end="\n\n")


def keep_profile(results: Any, rows: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> None:
    """A --profile's rows into the run's results file (measure.parts.PartsFile), replacing only the rows with their
    ``key``; where a cell's rows now come from more than one run, say so (measure.profile.mixed_runs)."""
    from moe_gemm.measure.profile import mixed_runs

    results.replace("profile", rows, key=key)
    for line in mixed_runs(results.rows("profile")):
        progress(line)


def show_profile(rows: Sequence[dict[str, Any]], table: Callable[[Sequence[dict[str, Any]]], Table] = profile_table
                 ) -> None:
    """Print a chapter's profile table (``table``, the shared one by default) and, where launches were profiled with
    their waits, the instructions where their warps stood most (hot_sites_table)."""
    show(table(rows))
    if any(r.get("hot_sites") for r in rows):
        show(hot_sites_table(rows))


def checks_passed(checks: Sequence[dict[str, Any]], shown: int = 3) -> bool:
    """Show the failed checks (or the first ``shown`` when none failed) and say whether all passed; a
    chapter times nothing after a failure (each workload is checked again before it is timed)."""
    import sys

    show(checks_table([c for c in checks if not c["passed"]] or list(checks[:shown])))
    failed = failed_variants(checks)
    if failed:
        print(f"checks FAILED for {', '.join(failed)}: nothing is timed.", file=sys.stderr)
        return False
    print(f"all {len(checks)} checks passed\n")
    return True


# --------------------------------------------------------------------------- looking records up

PEERS = GROUPED_MM_PEERS  # torch._grouped_mm given B as [E, K, N] and as B^T [E, N, K]


def grouped_mm_peers() -> list[TorchGroupedMM]:
    """torch._grouped_mm in both layouts of B, the PEERS (none without torch or a GPU)."""
    return [TorchGroupedMM(), TorchGroupedMM(k_major=True)] if torch_available() else []


find = find_measurement  # find(records, variant, workload): the record, or None


def best_peer(records: Sequence[dict[str, Any]], workload: Workload) -> dict[str, Any] | None:
    """The faster torch._grouped_mm layout at ``workload`` among these records (one run's)."""
    return best_of(records, PEERS, workload)


def ratio_to_peer(records: Sequence[dict[str, Any]], variant: str, workload: Workload) -> float | None:
    """``variant``'s useful TFLOP/s over the faster peer's at ``workload``, in the same run; None if
    either was not measured."""
    record, peer = find(records, variant, workload), best_peer(records, workload)
    return None if record is None or peer is None else record["useful_tflops"] / peer["useful_tflops"]


# --------------------------------------------------------------------------- figures


def figures_main(description: str | None, write_outputs: Callable[[Path], list[Path]], chapter: str,
                 argv: Sequence[str] | None = None) -> int:
    """A figures.py's main(): --out, then every output written and listed (matplotlib loads here, so
    that run.py never pays for it)."""
    from moe_gemm.site import style

    return style.figures_main(description, write_outputs, chapter, argv)
