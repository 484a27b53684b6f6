"""The record of kernels checked on the GPU: ``kernels/validated.json``.

CI has no GPU, so it cannot see a kernel that computes wrong numbers: the CPU suite compiles every
kernel and reads its SASS, but only the GPU tests run it. This record closes that gap. For every
kernel configuration the chapters run, it holds a hash of the kernel's preprocessed source (every
file reached through ``#include``, comments and blank lines removed: cuda.sources.source_hash)
and the GPU run that last passed the configuration's GPU tests and compute-sanitizer. A CPU test
(tests/test_validated.py) fails when a kernel's current hash has no such record, naming the
kernel and the command that makes the record:

    python -m moe_gemm.measure.validation status          # any machine: which kernels are stale
    python -m moe_gemm.measure.validation run [FAMILY..]   # on the GPU: test, sanitize, record
    python -m moe_gemm.measure.validation run k6 --admit   # the same, then the kernels not yet run, alone
    python -m moe_gemm.measure.validation carry [--from REV]   # any machine: carry records over
                                                               # unchanged machine code

``run`` runs each family's GPU tests and, for the CUDA C++ families, compute-sanitizer's
memcheck, racecheck and synccheck (tests/test_sanitizer_gpu.py), in parallel subprocesses, and
records every configuration of each family whose runs all passed. A family that fails keeps its
old record, which no longer matches: the CPU test keeps failing until it passes on the GPU. A kernel the
torch op would launch that is built but has not yet run on a GPU (moe_gemm.torch.kernels.NOT_YET_RUN), and a
chapter 07 or chapter 10 rung in the same state (moe_gemm.variants.k6.config.NOT_YET_RUN, k8's likewise), is left
out of the record, and ``status`` names it: remove it there, then ``run`` its family.

``carry`` needs no GPU. A shared header edited for one kernel (a function added for k7 to ptx.cuh, say)
changes the hash of every kernel that includes it, though most of them compile to the same machine code.
For each stale configuration whose record was made for the source at git revision REV (default HEAD),
it compiles that source and the current one for sm_90a, the only target a record is made on, and where
the two SASS listings are identical it moves the record to the current hash, noting the carry-over and
its reason in the entry. A kernel whose code changed is left stale.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from moe_gemm.core.chapters import CHAPTERS
from moe_gemm.core.checks import MAX_JOBS
from moe_gemm.core.cli import chapter_parser, positive_int, run_main
from moe_gemm.core.paths import KERNEL_DIR, REPO_ROOT
from moe_gemm.cuda.sources import source_hash
from moe_gemm.measure.ceilings import CEILING_KERNELS
from moe_gemm.measure.provenance import git_commit
from moe_gemm.torch.kernels import (
    COMBINE,
    FP8_SWIGLU_RECORDS,
    FUSED_BACKWARD_RECORDS,
    NOT_YET_RUN,
    QUANTIZE,
    QUANTIZE_STEPS,
    QUANTIZE_WEIGHTS,
    QUANTIZE_WEIGHTS_STEPS,
    SWIGLU_BACKWARD,
    SWIGLU_BACKWARD_PENDING,
    SWIGLU_QUANTIZE,
    quantize_instance,
    weights_instance,
)
from moe_gemm.variants import registry
from moe_gemm.variants.k6.config import FUSED_BACKWARD
from moe_gemm.variants.k6.config import NOT_YET_RUN as K6_NOT_YET_RUN
from moe_gemm.variants.k6.config import SOURCE as K6_SOURCE
from moe_gemm.variants.k7.config import NOT_YET_RUN as K7_NOT_YET_RUN
from moe_gemm.variants.k8.config import NOT_YET_RUN as K8_NOT_YET_RUN
from moe_gemm.variants.k8.config import SOURCE as K8_SOURCE
from moe_gemm.variants.k8.config import SWIGLU as K8_SWIGLU

RECORD_PATH = KERNEL_DIR / "validated.json"
# The GPU tests of each chapter's family (a family with none, k4, needs a Blackwell GPU, and none is
# available to this project: chapter 05 compiles and inspects it only), then the ceilings'.
# A chapter whose kernels have not yet passed on a GPU (Chapter.passed_on_gpu) is left out until it is set.
GPU_TESTS = {**{c.family: c.gpu_tests for c in CHAPTERS if c.gpu_tests and c.passed_on_gpu},
             "ceiling": ("tests/test_ceilings.py",)}
# Kernels a chapter runs that are not variants, each in the family whose GPU tests run it (the part of its
# name before '/'): the torch layer's combine (chapter 08), SwiGLU's backward as one pass (chapter 09), in both
# 16-bit types, and chapter 10's FP8 quantizers (with the activation quantizer's and the weights' quantizer's
# earlier steps, which the chapter times), whose GPU tests include compute-sanitizer memcheck on them.
# The op's fused SwiGLU backward (chapter 09) is k6 with the "dswiglu" epilogue, in both 16-bit types, and its twin
# that prefetches h; the FP8 layer's GEMM 1 with the SwiGLU epilogue (chapter 10) is k8's, writing bf16 or e4m3;
# each is left out while moe_gemm.torch.kernels.NOT_YET_RUN names it (built and compiled, its GPU tests not yet
# passed).
OTHER_KERNELS = {"torch/combine": COMBINE, **{f"{SWIGLU_BACKWARD_PENDING}-{element}": kernel
                                              for element, kernel in SWIGLU_BACKWARD.items()},
                 "k8/quantize-1x128": QUANTIZE, "k8/quantize-128x128": QUANTIZE_WEIGHTS,
                 "k8/swiglu-quantize-1x128": SWIGLU_QUANTIZE,
                 **{name: (QUANTIZE[0], quantize_instance(*step)) for name, step in QUANTIZE_STEPS.items()},
                 **{name: (QUANTIZE[0], weights_instance(*step)) for name, step in QUANTIZE_WEIGHTS_STEPS.items()},
                 **{record: (K8_SOURCE, K8_SWIGLU[config].kernel_name)
                    for config, record in FP8_SWIGLU_RECORDS.items()},
                 **{f"{record}-{element}": (K6_SOURCE, FUSED_BACKWARD[config].replace(
                     element=element, out=element).kernel_name) for element in ("bf16", "fp16")
                    for config, record in FUSED_BACKWARD_RECORDS.items()}}


# The rungs of the chapters' ladders in that state (moe_gemm.variants.k6.config.NOT_YET_RUN, k7's and k8's likewise).
RUNGS_NOT_YET_RUN = K6_NOT_YET_RUN | K7_NOT_YET_RUN | K8_NOT_YET_RUN


def not_yet_run(name: str) -> bool:
    """A kernel of moe_gemm.torch.kernels.NOT_YET_RUN (``torch/dswiglu`` covers ``torch/dswiglu-bf16``) or a
    rung of a ladder's NOT_YET_RUN (k6's, k7's, k8's): built and compiled, not yet run on a GPU."""
    return name in RUNGS_NOT_YET_RUN or any(name == pending or name.startswith(f"{pending}-")
                                            for pending in NOT_YET_RUN)
# The CUDA C++ families; k0 is numba and the ceilings touch no memory.
SANITIZED = tuple(c.family for c in CHAPTERS if c.sanitized and c.passed_on_gpu)
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
NOT_SANITIZED = {"torch": "memcheck inside its GPU tests (test_the_combine_kernel_is_clean_under_memcheck, "
                          "test_the_fused_backward_is_clean_under_memcheck, test_the_pass_is_clean_under_memcheck)",
                 "": f"not run (compute-sanitizer is run on the CUDA C++ families {', '.join(SANITIZED)})"}
TEST_TIMEOUT_S = 1200
TEST_TIMEOUT_EACH_S = 240


def kernel_configurations(pending: bool = False) -> dict[str, tuple[str, str]]:
    """Every kernel configuration the chapters run on a GPU: name -> (source under kernels/, instance); with
    ``pending``, those built but not yet run on a GPU (not_yet_run) as well. A variant that only chooses among
    others (k6/auto: ``chooses_among``) has no kernel of its own."""
    found = {name: (kernel.source, kernel.name) for name, kernel in CEILING_KERNELS.items()}
    found.update((name, kernel) for name, kernel in OTHER_KERNELS.items()
                 if registry.family_of(name) in GPU_TESTS and (pending or not not_yet_run(name)))
    for family in GPU_TESTS:
        if family not in ("ceiling", "torch"):
            found.update((name, identity) for name in registry.names(family)
                         if (pending or not not_yet_run(name)) and (identity := kernel_identity(name)) is not None)
    return found


# The GPU tests read this: "1" runs the kernels not yet run beside the others instead of skipping them; "only"
# (``run --admit``'s second pass) runs those alone: the tests whose ids name them (keep_for_admission) and
# compute-sanitizer on the variants among them. Admitting what passed is then removing it from NOT_YET_RUN.
ADMIT_ENV = "MOE_GEMM_ADMIT"
ADMIT_ALL, ADMIT_ONLY = "1", "only"


def admitting() -> bool:
    """Whether this process runs the GPU tests of kernels not yet run (``run --admit``, or MOE_GEMM_ADMIT=1)."""
    return os.environ.get(ADMIT_ENV) in (ADMIT_ALL, ADMIT_ONLY)


def admitting_only() -> bool:
    """Whether this process runs the tests of the kernels not yet run and nothing else (``run --admit``)."""
    return os.environ.get(ADMIT_ENV) == ADMIT_ONLY


def sanitized(family: str) -> list[str]:
    """The variants compute-sanitizer runs for ``family`` (registry.sanitized) and, while admitting, its variants
    not yet run on a GPU too, whose new barriers are what racecheck and synccheck are for (admitting only: those
    alone)."""
    pending = [name for name in registry.names(family) if not_yet_run(name)]
    if admitting_only():
        return pending
    chosen = registry.sanitized(family)
    return chosen + [name for name in pending if name not in chosen] if admitting() else chosen


def pending_kernels(family: str | None = None) -> list[str]:
    """The kernels built but not yet run on a GPU (of ``family``, or all), as the record would name them."""
    names = {*OTHER_KERNELS, *RUNGS_NOT_YET_RUN}
    return sorted(n for n in names if not_yet_run(n) and (family is None or registry.family_of(n) == family))


# The GPU tests of the kernels the torch op launches directly run each configuration under its variant's name
# (tests/test_dswiglu_gpu.py), or have a module of their own (tests/test_k8_swiglu_gpu.py).
PENDING_TEST_MODULES = {"k8/gemm-swiglu": "test_k8_swiglu_gpu", SWIGLU_BACKWARD_PENDING: "test_swiglu_backward_gpu"}


def admission_markers(name: str) -> tuple[str, ...]:
    """What the ids of a pending kernel's GPU tests contain: a rung's name (the tests are parametrized by it), the
    fused backward's configuration (``torch/dswiglu-prefetch-bf16``: ``k6/dswiglu-prefetch-bn128``), or its test
    module."""
    if name in RUNGS_NOT_YET_RUN:
        return (name,)
    pending = next(p for p in NOT_YET_RUN if name == p or name.startswith(f"{p}-"))
    configs = tuple(config for config, record in FUSED_BACKWARD_RECORDS.items() if record == pending)
    return configs or (PENDING_TEST_MODULES[pending],)


@functools.cache
def pending_markers() -> frozenset[str]:
    """Every pending kernel's admission_markers (the NOT_YET_RUN sets are fixed for a process)."""
    return frozenset(m for name in pending_kernels() for m in admission_markers(name))


def keep_for_admission(nodeid: str) -> bool:
    """Whether ``run --admit``'s second pass runs the test ``nodeid``: it names a kernel not yet run, or it is
    compute-sanitizer's (which then checks those kernels alone)."""
    return "test_sanitizer_gpu" in nodeid or any(m in nodeid for m in pending_markers())


def kernel_identity(name: str) -> tuple[str, str] | None:
    """(source, instance) of a registered variant. A variant class that names both as class
    attributes (k0) is not constructed: k0 refuses to be made where numba-cuda cannot compile."""
    made = registry.factory(name)
    source, instance = getattr(made, "source", None), getattr(made, "kernel_name", None)
    if isinstance(source, str) and isinstance(instance, str):
        return source, instance
    variant = made()
    if getattr(variant, "chooses_among", None):
        return None
    return variant.source, variant.kernel_name


def current_hashes(kernel_dir: Path = KERNEL_DIR, pending: bool = False) -> dict[str, str]:
    return {name: source_hash(source, instance, kernel_dir)
            for name, (source, instance) in kernel_configurations(pending).items()}


def load_record(path: Path = RECORD_PATH) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {"kernels": {}}


def stale(hashes: dict[str, str] | None = None, record: dict[str, Any] | None = None) -> list[str]:
    """Kernel configurations whose current hash has no passing GPU run on record."""
    hashes = current_hashes() if hashes is None else hashes
    kernels = (load_record() if record is None else record)["kernels"]
    return [name for name, digest in hashes.items() if kernels.get(name, {}).get("hash") != digest]




def stale_message(names: Sequence[str]) -> str:
    families = sorted({registry.family_of(name) for name in names})
    return (f"{len(names)} kernel configuration(s) changed since their GPU tests last passed, or never passed: "
            f"{', '.join(names)}. On an sm_90a GPU, run: python -m moe_gemm.measure.validation run "
            f"{' '.join(families)}  (it runs their GPU tests and compute-sanitizer and updates {RECORD_PATH.name})")


# --------------------------------------------------------------------------- on the GPU

def _pytest(args: list[str], name: str, scratch: Path, admit: str | None = None) -> dict[str, Any]:
    """One pytest run in a subprocess (``admit``: MOE_GEMM_ADMIT's value for it); its counts and each test's
    outcome from the JUnit XML report. Each test gets TEST_TIMEOUT_EACH_S where pytest-timeout is installed, so
    that a kernel that hangs costs one test's time, not the run's."""
    import importlib.util

    report = scratch / f"{name.replace('/', '_')}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--junitxml={report}",
               *args]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command.append(f"--timeout={TEST_TIMEOUT_EACH_S}")
    env = {**os.environ, ADMIT_ENV: admit} if admit else None
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TEST_TIMEOUT_S,
                          check=False, env=env)
    counts, cases = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}, []
    if report.is_file():
        counts, cases = junit_outcomes(report.read_text())
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"name": name, "returncode": proc.returncode, "passed": passed, **counts, "cases": cases,
            "tail": (proc.stdout + proc.stderr)[-3000:]}


def junit_outcomes(xml: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A JUnit XML report's counts and each test case as (``classname::name``, "passed", "failed" or
    "skipped"): the id names the test's parameters, a rung's name among them."""
    root = ET.fromstring(xml)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    cases = []
    for case in suite.iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        cases.append((f"{case.get('classname')}::{case.get('name')}", outcome))
    return counts, cases


def sanitizer_runs(family: str, prefix: str) -> list[tuple[list[str], str]]:
    """One pytest run of compute-sanitizer's test per tool on ``family``, named ``prefix-tool``."""
    return [(["tests/test_sanitizer_gpu.py", "-k", f"{family} and {tool}"], f"{prefix}-{tool}")
            for tool in SANITIZER_TOOLS]


def family_runs(family: str) -> list[tuple[list[str], str]]:
    """The pytest runs that validate a family: its GPU tests and, for CUDA C++, each sanitizer tool."""
    return [([*GPU_TESTS[family]], f"{family}-tests"), *(sanitizer_runs(family, family) if family in SANITIZED
                                                         else [])]


def admission_runs(family: str) -> list[tuple[list[str], str]]:
    """``run --admit``'s second pass for a family with kernels not yet run: its GPU tests (only those that name
    them run) and, where some of them are sanitized variants, each sanitizer tool on those alone."""
    sanitize = family in SANITIZED and set(pending_kernels(family)) & set(registry.names(family))
    return [([*GPU_TESTS[family]], f"{family}-admit"), *(sanitizer_runs(family, f"{family}-admit") if sanitize
                                                         else [])]


def admitted(family: str, results: list[dict[str, Any]]) -> list[str]:
    """The kernels not yet run that passed ``run --admit``'s second pass (admission_runs' results, tests first):
    some test naming each passed and none failed, and compute-sanitizer passed where it ran. A failure that names
    none of them (the module's set-up, say) admits none."""
    tests, sanitizer = results[0], results[1:]
    pending = pending_kernels(family)
    marks = {name: admission_markers(name) for name in pending}
    failed = [case for case, outcome in tests["cases"] if outcome == "failed"]
    if tests["errors"] and not tests["cases"] or any(not any(m in case for ms in marks.values() for m in ms)
                                                      for case in failed):
        return []
    clean = all(r["returncode"] == 0 and r["passed"] > 0 and not r["failures"] and not r["errors"] for r in sanitizer)
    chosen = []
    for name in pending:
        mine = [outcome for case, outcome in tests["cases"] if any(m in case for m in marks[name])]
        if "passed" in mine and "failed" not in mine and (clean or name not in registry.names(family)):
            chosen.append(name)
    return chosen


def family_outcome(family: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Passed only if every run passed something and failed nothing. A skip is allowed (a test meant
    for an older GPU skips on this one) and recorded in the counts."""
    ok = all(r["returncode"] == 0 and r["passed"] > 0 and not r["failures"] and not r["errors"] for r in results)
    return {"family": family, "ok": ok, "tests_passed": results[0]["passed"],
            "sanitizer": [f"{r['name'].split('-', 1)[1]}: {r['passed']} passed" for r in results[1:]],
            "runs": results}


def record_family(record: dict[str, Any], outcome: dict[str, Any], gpu: Any, hashes: dict[str, str],
                  names: Sequence[str] | None = None) -> None:
    """Every kernel of ``hashes`` in the outcome's family (or those of ``names``) recorded as passed on ``gpu``."""
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    configurations = kernel_configurations(pending=True)
    for name, digest in hashes.items():
        if registry.family_of(name) != outcome["family"] or (names is not None and name not in names):
            continue
        source, instance = configurations[name]
        record["kernels"][name] = {
            "source": source, "instance": instance, "hash": digest, "gpu": gpu.name,
            "compute_capability": f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}", "date": date,
            "commit": git_commit(), "gpu_tests_passed": outcome["tests_passed"],
            "sanitizer": ", ".join(outcome["sanitizer"]) or NOT_SANITIZED.get(outcome["family"], NOT_SANITIZED[""]),
        }


# --------------------------------------------------------------------------- carry-over, no GPU

CARRY_ARCH = "sm_90a"  # the target every record is made on (validation runs on an sm_90a GPU only)


def machine_code(sass: str) -> str:
    """A SASS listing without its function headers: a template parameter added with a default leaves an
    instance's name as the chapters write it and its code as it was, but changes its mangled symbol."""
    return "\n".join(line for line in sass.splitlines() if not line.lstrip().startswith("Function :"))


def carry_over(record: dict[str, Any], names: Sequence[str], old_dir: Path, revision: str,
               kernel_dir: Path = KERNEL_DIR) -> dict[str, str]:
    """For each of ``names`` whose record holds the hash of its source in ``old_dir`` (the kernels at
    ``revision``): compile both copies for sm_90a and, where the SASS is identical, move the record to the
    source's hash in ``kernel_dir``. Returns what happened to each name, as a word ("carried", "code
    changed", ...); updates ``record`` in place."""
    from moe_gemm.cuda.nvrtc import compile_kernel

    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    configurations, outcome = kernel_configurations(), {}
    for name in names:
        source, instance = configurations[name]
        entry = record["kernels"].get(name)
        if not source.endswith(".cu"):
            outcome[name] = "not CUDA C++ (no SASS to compare)"
        elif entry is None or not (old_dir / source).is_file():
            outcome[name] = f"no record for its source at {revision}"
        elif source_hash(source, instance, old_dir) != entry["hash"]:
            outcome[name] = f"its record is not for its source at {revision}"
        else:
            old = machine_code(compile_kernel(source, instance, arch=CARRY_ARCH, kernel_dir=old_dir).sass())
            new = machine_code(compile_kernel(source, instance, arch=CARRY_ARCH, kernel_dir=kernel_dir).sass())
            if old != new:
                outcome[name] = "code changed"
                continue
            entry["carried"] = (f"{date}: SASS for {CARRY_ARCH} identical to that of the source validated, as at "
                                f"{revision}; the GPU run recorded here is that source's")
            entry["hash"] = source_hash(source, instance, kernel_dir)
            outcome[name] = "carried"
    return outcome


def carry(revision: str) -> int:
    """``carry``: the stale configurations, the kernels at ``revision`` exported from git, the carry-over
    written; 1 while any configuration stays stale."""
    hashes, record = current_hashes(), load_record()
    names = stale(hashes, record)
    if not names:
        print("every kernel configuration has a passing GPU run on record")
        return 0
    with tempfile.TemporaryDirectory(prefix="moe-gemm-carry-") as folder:
        archive = subprocess.run(["git", "archive", revision, KERNEL_DIR.name], cwd=REPO_ROOT, capture_output=True,
                                 check=False)
        if archive.returncode:
            print(f"git archive {revision} failed: {archive.stderr.decode().strip()}", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        print(f"[validation] comparing the SASS of {len(names)} stale configuration(s) with their source at "
              f"{revision}", file=sys.stderr, flush=True)
        outcome = carry_over(record, names, Path(folder) / KERNEL_DIR.name, revision)
    for name, what in outcome.items():
        print(f"  {name:<40} {what}")
    write_record(record)
    left = stale(current_hashes(), record)
    print(f"recorded in {RECORD_PATH}; stale now: {', '.join(left) or 'none'}")
    return 1 if left else 0


def write_record(record: dict[str, Any], path: Path = RECORD_PATH) -> None:
    record["kernels"] = dict(sorted(record["kernels"].items()))
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)  # sorted: a re-run changes only what changed
        handle.write("\n")
    os.replace(tmp, path)


def run(families: Sequence[str], jobs: int, admit: bool = False, pending_only: bool = False) -> int:
    """Each family's GPU tests and compute-sanitizer; the families that pass are recorded. ``admit``: a second
    pass, beside the first, runs the tests of the kernels not yet run on a GPU alone (MOE_GEMM_ADMIT=only) and
    records each whose tests all passed, in a family that passed; the run names them, to be taken out of
    NOT_YET_RUN. One that fails costs neither its family's record nor the others'. ``pending_only``: the second
    pass alone, for families whose every record is current (refused otherwise: the first pass is what makes a
    stale record current), its counts recorded for what it admits."""
    from moe_gemm.cuda.gpu import detect_gpu

    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability != (9, 0):
        print("validation runs on an sm_90a GPU (compute capability 9.0), where every family can run; "
              f"this machine has {gpu.name if gpu else 'no NVIDIA GPU'}", file=sys.stderr)
        return 2
    pending_hashes, record = current_hashes(pending=True), load_record()
    hashes = {name: digest for name, digest in pending_hashes.items() if not not_yet_run(name)}
    behind = [name for name in stale(hashes, record) if registry.family_of(name) in families]
    if pending_only and behind:
        print(f"--pending-only runs the kernels not yet run beside families whose records are current; stale: "
              f"{', '.join(behind)} (run without it)", file=sys.stderr)
        return 2
    record.setdefault("about", "Kernel configurations whose GPU tests and compute-sanitizer last passed, keyed by "
                               "the hash of their preprocessed source: python -m moe_gemm.measure.validation")
    status = 0
    planned = [] if pending_only else [(family, args, name, None) for family in families
                                       for args, name in family_runs(family)]
    if admit or pending_only:
        planned += [(family, args, name, ADMIT_ONLY) for family in families if pending_kernels(family)
                    for args, name in admission_runs(family)]
    print(f"[validation] {len(planned)} pytest runs for {', '.join(families)}, {jobs} at a time", file=sys.stderr,
          flush=True)
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda run: _pytest(run[1], run[2], Path(scratch), run[3]), planned))
    passed_pending = []
    for family in families:
        first = [r for (f, _, _, a), r in zip(planned, results) if f == family and not a]
        second = [r for (f, _, _, a), r in zip(planned, results) if f == family and a]
        if pending_only and not second:
            continue
        # --pending-only: the family's records are current, so it stands as passed, and the second pass's counts
        # are the ones recorded for what it admits
        outcome = {**family_outcome(family, second), "ok": True} if pending_only else family_outcome(family, first)
        for r in [*first, *second]:
            print(f"  {r['name']:<18} rc={r['returncode']} passed={r['passed']} failed={r['failures']} "
                  f"errors={r['errors']} skipped={r['skipped']}")
        if not pending_only and outcome["ok"]:
            record_family(record, outcome, gpu, hashes)
        elif not pending_only:
            status = 1
            for r in first:
                if r["returncode"] != 0 or r["skipped"]:
                    print(r["tail"], file=sys.stderr)
        if second:
            chosen = admitted(family, second) if outcome["ok"] else []
            record_family(record, outcome, gpu, pending_hashes, names=chosen)
            passed_pending += chosen
            failed = [name for name in pending_kernels(family) if name not in chosen]
            if failed:
                status = 1
                print(f"  not admitted ({'its family failed' if not outcome['ok'] else 'a test failed'}): "
                      f"{', '.join(failed)}", file=sys.stderr)
                for r in second:
                    if r["returncode"] != 0:
                        print(r["tail"], file=sys.stderr)
    write_record(record)
    left = stale(hashes, record)
    print(f"recorded in {RECORD_PATH}; stale now: {', '.join(left) or 'none'}")
    if passed_pending:
        print(f"not yet run until now, passed here: {', '.join(sorted(passed_pending))}; admit them by taking their "
              "names out of moe_gemm.variants.k6.config.NOT_YET_RUN, moe_gemm.variants.k8.config.NOT_YET_RUN and "
              "moe_gemm.torch.kernels.NOT_YET_RUN")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser(__doc__, prog="python -m moe_gemm.measure.validation")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="list the kernel configurations with no passing GPU run on record")
    runner = sub.add_parser("run", help="on an sm_90a GPU: run GPU tests and compute-sanitizer, record what passes")
    runner.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"families to validate (default: all of {', '.join(GPU_TESTS)})")
    runner.add_argument("--admit", action="store_true",
                        help="also run the kernels built but not yet run on a GPU (NOT_YET_RUN), their tests alone in "
                             "a second pass, and record each whose tests all passed in a family that passed; the run "
                             "names them, to be taken out of NOT_YET_RUN")
    runner.add_argument("--pending-only", action="store_true",
                        help="run only the kernels not yet run (--admit's second pass), beside families whose records "
                             "are all current (refused otherwise), and record those that pass")
    runner.add_argument("--jobs", type=positive_int("--jobs", MAX_JOBS), default=8,
                        help=f"pytest processes at once, at most {MAX_JOBS.value} (default 8)")
    carrier = sub.add_parser("carry", help="no GPU: carry the records of stale configurations whose SASS for "
                                           "sm_90a is unchanged since REV over to their current source")
    carrier.add_argument("--from", dest="revision", default="HEAD", metavar="REV",
                         help="the git revision whose sources the records were made for (default HEAD)")
    args = parser.parse_args(argv)
    if args.command == "carry":
        return carry(args.revision)
    if args.command == "status":
        names = stale()
        print(stale_message(names) if names else "every kernel configuration has a passing GPU run on record")
        pending = sorted(name for name in (*OTHER_KERNELS, *RUNGS_NOT_YET_RUN) if not_yet_run(name))
        if pending:
            print(f"built and compiled, not yet run on a GPU (moe_gemm.torch.kernels.NOT_YET_RUN and the "
                  f"ladders' NOT_YET_RUN, k6's, k7's and k8's; left out of the record): {', '.join(pending)}")
        return 1 if names else 0
    unknown = [f for f in args.families if f not in GPU_TESTS]
    if unknown:
        parser.error(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                     f"choose from {', '.join(GPU_TESTS)}")
    return run(args.families or list(GPU_TESTS), args.jobs, args.admit, args.pending_only)


if __name__ == "__main__":
    run_main(main)
