"""The guard that kernels were checked on the GPU: kernels/validated.json against the sources.

CI has no GPU, so a kernel that computes wrong numbers passes every CPU test: swapping the two
values of k1's bf16 store compiles, has the same SASS counts and the same resources. What CI can
see is that the kernel's source changed after its GPU tests last passed. These tests fail until
`python -m moe_gemm.measure.validation run <family>` has passed on an sm_90a GPU and been
committed."""

from __future__ import annotations

import re
import shutil

import pytest

from moe_gemm.core.chapters import CHAPTERS
from moe_gemm.core.paths import KERNEL_DIR
from moe_gemm.measure import validation
from moe_gemm.variants import registry


def test_every_kernel_the_chapters_run_passed_its_gpu_tests_in_its_current_form():
    names = validation.stale()
    assert not names, validation.stale_message(names)


def test_the_record_names_only_kernels_that_exist():
    """Admitted ones, and kernels not yet run that a `run --admit` recorded before their names left NOT_YET_RUN."""
    record = validation.load_record()
    assert set(record["kernels"]) <= set(validation.kernel_configurations(pending=True))


def test_each_record_says_where_and_what_passed():
    for name, entry in validation.load_record()["kernels"].items():
        assert entry["gpu"] and entry["compute_capability"] == "9.0" and entry["date"][:2] == "20", name
        assert entry["gpu_tests_passed"] > 0, name
        if registry.family_of(name) in validation.SANITIZED:
            assert all(f"{tool}: " in entry["sanitizer"] for tool in validation.SANITIZER_TOOLS), name


def test_every_family_the_chapters_run_is_covered():
    """Every configuration of each chapter's family with GPU tests is in the record's scope, and none of
    a family without (k4: no Blackwell GPU, compiled only) or not yet passing on a GPU (k8)."""
    configurations = validation.kernel_configurations()
    for chapter in CHAPTERS:
        if chapter.family not in registry.families():
            continue
        if chapter.gpu_tests and chapter.passed_on_gpu:  # k6/auto chooses among the rungs and has no kernel
            named = {name for name in registry.names(chapter.family)
                     if not validation.not_yet_run(name) and validation.kernel_identity(name) is not None}
            assert named and named <= set(configurations), chapter.family
        else:
            assert not any(registry.family_of(name) == chapter.family for name in configurations), chapter.family
    assert {"ceiling/ffma", "ceiling/mma_sync", "ceiling/wgmma"} <= set(configurations)
    assert "torch/combine" in configurations


@pytest.fixture
def kernels_copy(tmp_path):
    folder = tmp_path / "kernels"
    shutil.copytree(KERNEL_DIR, folder)
    return folder


def test_swapping_the_two_values_of_k1s_bf16_store_makes_every_k1_kernel_stale(kernels_copy):
    source = kernels_copy / "k1_mma_sync.cu"
    text = source.read_text()
    store = "pack_bf16x2(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1])"
    assert text.count(store) == 1
    source.write_text(text.replace(store, "pack_bf16x2(acc[mi][ni][2 * half + 1], acc[mi][ni][2 * half])"))
    before, after = validation.current_hashes(), validation.current_hashes(kernels_copy)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == set(registry.names("k1"))


def test_an_edit_two_includes_down_makes_its_kernels_stale(kernels_copy):
    """k3 reaches ptx.cuh through tma_pipeline.cuh and epilogues.cuh as well as directly."""
    header = kernels_copy / "named_barriers.cuh"
    header.write_text(header.read_text().replace("STAGING_BARRIER = 1", "STAGING_BARRIER = 4"))
    before, after = validation.current_hashes(), validation.current_hashes(kernels_copy)
    changed = {name for name in before if before[name] != after[name]}
    assert set(registry.names("k3")) <= changed and set(registry.names("k5")) <= changed
    assert not changed & set(registry.names("k1"))


def test_comments_and_blank_lines_do_not_make_a_kernel_stale(kernels_copy):
    source = kernels_copy / "k2_tma_ws.cu"
    source.write_text("// a new comment\n\n" + source.read_text().replace("\n", "\n\n", 3) + "/* and another */\n")
    assert validation.current_hashes(kernels_copy) == validation.current_hashes()


def test_the_stale_message_names_the_kernel_and_the_command():
    message = validation.stale_message(["k1/bm64", "ceiling/wgmma"])
    assert "k1/bm64" in message and "python -m moe_gemm.measure.validation run ceiling k1" in message


def test_the_record_can_be_read_where_numpy_breaks_numba_cuda(monkeypatch):
    """k0 refuses to be made under numpy 2.5 (numba-cuda 0.30 calls np.row_stack); its identity
    must still be known, so that `validation status` and `run` work on such a GPU machine."""
    import numpy as np

    monkeypatch.delattr(np, "row_stack", raising=False)
    assert validation.kernel_configurations()["k0"] == ("k0_fp32.py", "k0_fp32")
    assert validation.stale() == []


def test_run_with_no_family_named_takes_them_all(monkeypatch):
    taken = []
    monkeypatch.setattr(validation, "run", lambda families, jobs, admit, pending_only: taken.append(
        (families, jobs, admit, pending_only)) or 0)
    assert validation.main(["run"]) == 0 and validation.main(["run", "k3", "--jobs", "2"]) == 0
    assert validation.main(["run", "k6", "--admit"]) == 0 and validation.main(["run", "k6", "--pending-only"]) == 0
    assert taken == [(list(validation.GPU_TESTS), 8, False, False), (["k3"], 2, False, False), (["k6"], 8, True, False),
                     (["k6"], 8, False, True)]


def test_an_unknown_family_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        validation.main(["run", "k9"])
    assert f"unknown family k9; choose from {', '.join(validation.GPU_TESTS)}" in capsys.readouterr().err


def test_jobs_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit):
        validation.main(["run", "--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_a_header_edit_that_leaves_the_machine_code_alone_carries_the_record_over(tmp_path):
    """An unused function added to ptx.cuh makes ceiling/mma_sync stale, but its SASS is what it was: carried.
    A change to the loop it times changes the SASS: left stale."""
    name = "ceiling/mma_sync"
    source, instance = validation.kernel_configurations()[name]
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(KERNEL_DIR, old)
    shutil.copytree(KERNEL_DIR, new)
    record = {"kernels": {name: {"hash": validation.source_hash(source, instance, old), "gpu": "H200"}}}
    ptx = new / "ptx.cuh"
    ptx.write_text(ptx.read_text() + "\n__device__ __forceinline__ int unused_helper(int x) { return x + 1; }\n")
    assert validation.source_hash(source, instance, new) != record["kernels"][name]["hash"]
    assert validation.carry_over(record, [name], old, "HEAD", kernel_dir=new) == {name: "carried"}
    entry = record["kernels"][name]
    assert entry["hash"] == validation.source_hash(source, instance, new) and "identical" in entry["carried"]

    kernel = new / source
    text = kernel.read_text()
    loop = re.search(r"for \(int [a-z]+ = 0; [a-z]+ < (\d+);", text)
    kernel.write_text(text.replace(loop.group(0), loop.group(0).replace(loop.group(1), str(int(loop.group(1)) + 7))))
    record = {"kernels": {name: {"hash": validation.source_hash(source, instance, old)}}}
    assert validation.carry_over(record, [name], old, "HEAD", kernel_dir=new) == {name: "code changed"}
    assert record["kernels"][name]["hash"] == validation.source_hash(source, instance, old)


def test_machine_code_is_the_listing_without_its_function_headers():
    listing = ("\n\tcode for sm_90a\n\t\tFunction : _Z3fooILi1EEvv\n\t.headerflags @\"EF_CUDA_SM90\"\n"
               "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n")
    renamed = listing.replace("_Z3fooILi1EEvv", "_Z3fooILi1ELi1EEvv")
    assert validation.machine_code(listing) == validation.machine_code(renamed)
    assert validation.machine_code(listing) != validation.machine_code(listing.replace("R1", "R2"))


@pytest.fixture
def pending(monkeypatch):
    """The NOT_YET_RUN sets as they stood before an H100 admitted these kernels (2026-12-06): two k6 rungs, the
    prefetching fused backward and k8's SwiGLU epilogue. The sets are empty now; the mechanism is tested on these."""
    rungs = frozenset({"k6/pingpong-bn192-pdl", "k6/pingpong-bn192-rings"})
    monkeypatch.setattr(validation, "RUNGS_NOT_YET_RUN", rungs)
    monkeypatch.setattr(validation, "NOT_YET_RUN", frozenset({"torch/dswiglu-prefetch", "k8/gemm-swiglu"}))
    validation.pending_markers.cache_clear()
    yield
    validation.pending_markers.cache_clear()


def test_admitting_records_the_kernels_not_yet_run_and_their_tests_stop_skipping(monkeypatch, pending):
    """`run --admit`: its hashes cover the kernels of NOT_YET_RUN (the PDL rungs, the prefetching fused backward),
    and its pytest runs carry the variable the GPU tests read to run them instead of skipping."""
    pending = set(validation.kernel_configurations(pending=True)) - set(validation.kernel_configurations())
    assert pending and all(validation.not_yet_run(name) for name in pending)
    assert {"k6/pingpong-bn192-pdl", "torch/dswiglu-prefetch-bf16"} <= pending
    assert set(validation.current_hashes(pending=True)) - set(validation.current_hashes()) == pending
    monkeypatch.delenv(validation.ADMIT_ENV, raising=False)
    assert not validation.admitting() and not set(validation.sanitized("k6")) & pending
    monkeypatch.setenv(validation.ADMIT_ENV, "1")
    assert validation.admitting() and not validation.admitting_only()
    assert {n for n in pending if n.startswith("k6/")} <= set(validation.sanitized("k6"))  # compute-sanitizer too
    assert set(validation.registry.sanitized("k6")) <= set(validation.sanitized("k6"))
    monkeypatch.setenv(validation.ADMIT_ENV, validation.ADMIT_ONLY)  # the second pass: the pending ones alone
    assert validation.admitting() and set(validation.sanitized("k6")) == {n for n in pending if n.startswith("k6/")}
    with pytest.raises(SystemExit):  # the flag is parsed with the rest: --jobs 0 is still refused
        validation.main(["run", "k6", "--admit", "--jobs", "0"])


def junit(*cases: tuple[str, str, str]) -> str:
    """A JUnit XML report of (classname, name, outcome) cases."""
    body = "".join(f'<testcase classname="{c}" name="{n}">'
                   + {"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped/>"}[o] + "</testcase>"
                   for c, n, o in cases)
    failures, skipped = sum(o == "failed" for *_, o in cases), sum(o == "skipped" for *_, o in cases)
    return (f'<testsuites><testsuite name="pytest" errors="0" failures="{failures}" skipped="{skipped}" '
            f'tests="{len(cases)}">{body}</testsuite></testsuites>')


def run_of(xml: str, name: str = "k6-admit", returncode: int = 0) -> dict:
    counts, cases = validation.junit_outcomes(xml)
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"name": name, "returncode": returncode, "passed": passed, **counts, "cases": cases, "tail": ""}


def test_the_admission_pass_admits_each_kernel_whose_tests_all_passed(monkeypatch):
    """`run --admit`'s second pass: a kernel is admitted when some test naming it passed and none failed (and
    compute-sanitizer passed, for a sanitized variant); one failing rung keeps only itself out; a failure that
    names no pending kernel admits none; the ids are read from the JUnit report."""
    monkeypatch.setattr(validation, "pending_kernels", lambda family=None: ["k6/pingpong-bn192-pdl",
                                                                            "k6/pingpong-bn192-rings"])
    monkeypatch.setattr(validation, "admission_markers", lambda name: (name,))
    clean = [run_of(junit(("t", "x", "passed")), f"k6-admit-{tool}") for tool in validation.SANITIZER_TOOLS]
    tests = junit(("tests.test_k6_gpu", "test_edge_cases_exact[k6/pingpong-bn192-pdl-one row]", "passed"),
                  ("tests.test_k6_gpu", "test_edge_cases_exact[k6/pingpong-bn192-rings-one row]", "failed"),
                  ("tests.test_k6_gpu", "test_random_data[k6/pingpong-bn192-rings]", "passed"))
    assert validation.admitted("k6", [run_of(tests), *clean]) == ["k6/pingpong-bn192-pdl"]
    dirty = [*clean[:2], run_of(junit(("t", "x", "failed")), "k6-admit-synccheck", returncode=1)]
    assert validation.admitted("k6", [run_of(tests), *dirty]) == []  # sanitized variants need a clean sanitizer
    stray = junit(("tests.test_k6_gpu", "test_edge_cases_exact[k6/pingpong-bn192-pdl-one row]", "passed"),
                  ("tests.test_k6_gpu", "test_module_setup", "failed"))
    assert validation.admitted("k6", [run_of(stray), *clean]) == []
    only_skips = junit(("tests.test_k6_gpu", "test_edge_cases_exact[k6/pingpong-bn192-pdl-one row]", "skipped"))
    assert validation.admitted("k6", [run_of(only_skips), *clean]) == []  # nothing ran: nothing admitted


def test_the_admission_pass_collects_the_tests_that_name_a_pending_kernel(pending):
    """Every pending kernel has markers its tests' ids contain, no marker is part of the name of a kernel that has
    run (so a test of one is never taken for the other's), and compute-sanitizer's tests are always kept."""
    pending = validation.pending_kernels()
    assert "k8/gemm-swiglu-e4m3" in pending and "k6/pingpong-bn192-pdl" in pending
    assert validation.admission_markers("torch/dswiglu-prefetch-fp16") == ("k6/dswiglu-prefetch-bn128",)
    assert validation.admission_markers("k8/gemm-swiglu-bf16") == ("test_k8_swiglu_gpu",)
    markers = {m for name in pending for m in validation.admission_markers(name)}
    others = [n for family in validation.registry.families() for n in validation.registry.names(family)
              if not validation.not_yet_run(n)]
    assert not [(m, n) for m in markers for n in others if m in n]
    keep = validation.keep_for_admission
    assert keep("tests/test_k6_gpu.py::test_edge_cases_exact[k6/pingpong-bn192-pdl-one row]")
    assert keep("tests/test_k8_swiglu_gpu.py::test_one_graph_replayed_with_changing_routings")
    assert keep("tests/test_sanitizer_gpu.py::test_compute_sanitizer_is_clean[memcheck-k6]")
    assert not keep("tests/test_k6_gpu.py::test_edge_cases_exact[k6/pingpong-bn128-one row]")


def test_the_pending_only_run_admits_beside_current_records_and_refuses_stale_ones(monkeypatch, tmp_path, capsys):
    """`run --pending-only`: the second pass of `--admit` alone (no run of the family's own tests), for families
    whose records are all current: what passes is recorded under its current hash with that pass's counts, the
    family's other records untouched. A family with a stale record is refused before anything runs."""
    from types import SimpleNamespace

    monkeypatch.setattr("moe_gemm.cuda.gpu.detect_gpu",
                        lambda: SimpleNamespace(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0)))
    record = validation.load_record()
    written, planned = [], []
    monkeypatch.setattr(validation, "load_record", lambda: record)
    monkeypatch.setattr(validation, "write_record", written.append)
    pending = validation.RUNGS_NOT_YET_RUN | {"k6/pingpong-bn192-pdl"}  # one that has run, made pending again
    monkeypatch.setattr(validation, "RUNGS_NOT_YET_RUN", pending)
    validation.pending_markers.cache_clear()
    k6_pending = validation.pending_kernels("k6")
    tests = junit(*(("tests.test_k6_gpu", f"test_edge_cases_exact[{name}-one row]", "passed") for name in k6_pending))

    def fake_pytest(args, name, scratch, admit=None):
        planned.append((name, admit))
        return run_of(tests if name == "k6-admit" else junit(("t", "x", "passed")), name)

    monkeypatch.setattr(validation, "_pytest", fake_pytest)
    before = dict(record["kernels"])
    assert validation.main(["run", "k6", "--pending-only"]) == 0
    validation.pending_markers.cache_clear()
    assert planned and all(admit == validation.ADMIT_ONLY for _, admit in planned)  # the second pass alone
    assert {name for name, _ in planned} == {"k6-admit", *(f"k6-admit-{t}" for t in validation.SANITIZER_TOOLS)}
    hashes = validation.current_hashes(pending=True)
    for name in k6_pending:
        entry = record["kernels"][name]
        assert entry["hash"] == hashes[name] and entry["gpu"] == "NVIDIA H100 80GB HBM3"
        assert entry["gpu_tests_passed"] == len(k6_pending)
    assert {n: e for n, e in record["kernels"].items() if n not in k6_pending} == {
        n: e for n, e in before.items() if n not in k6_pending}
    assert f"passed here: {', '.join(sorted(k6_pending))};" in capsys.readouterr().out
    record["kernels"] = {n: e for n, e in before.items() if not n.startswith("k6/")}  # every k6 record stale
    planned.clear()
    assert validation.main(["run", "k6", "--pending-only"]) == 2 and not planned
    assert "stale" in capsys.readouterr().err
