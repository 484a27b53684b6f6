"""moe_gemm.chapter, the toolbox every chapter's run.py and figures.py import: what the kernels need of
the GPU and the one "not run" banner, the dispatch between a chapter's GPU and no-GPU paths, the record
lookups against the faster peer. No GPU needed."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from moe_gemm.chapter import (
    ANY_GPU,
    NO_GPU,
    SM90A,
    Workload,
    best_peer,
    chapter_main,
    chapter_parser,
    find,
    not_run_banner,
    print_not_run,
    ratio_to_peer,
)

REPO = Path(__file__).resolve().parents[1]
H200 = SimpleNamespace(name="NVIDIA H200", compute_capability=(9, 0))
B200 = SimpleNamespace(name="NVIDIA B200", compute_capability=(10, 0))


def _record(variant: str, workload: Workload, tflops: float) -> dict:
    return {"variant": variant, "tokens": workload.tokens, "skew": workload.skew, "experts": workload.experts,
            "K": workload.K, "N": workload.N, "useful_tflops": tflops}


# ---- what the kernels need, and the banner -------------------------------------------------------

def test_sm90a_names_the_reason_or_none():
    assert SM90A.why_not(None) == "there is no NVIDIA GPU on this machine"
    assert SM90A.why_not(B200) == "NVIDIA B200 is sm_100 and wgmma runs only on sm_90a"
    assert SM90A.why_not(H200) is None


def test_any_gpu_and_no_gpu():
    assert ANY_GPU.why_not(None) == "there is no NVIDIA GPU on this machine"
    assert ANY_GPU.why_not(SimpleNamespace(name="Tesla V100", compute_capability=(7, 0))) is None
    assert NO_GPU.why_not(H200) == NO_GPU.needs  # a chapter of arithmetic never runs on the GPU


def test_one_banner_and_the_flags_given(capsys):
    assert not_run_banner("k3", SM90A.why_not(None), "compiling every rung for sm_90a instead") == (
        "k3 is not run here because there is no NVIDIA GPU on this machine; compiling every rung for sm_90a instead.")
    parser = chapter_parser(None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    print_not_run(parser.parse_args(["--quick"]), "k5", "no GPU", "compiling", ("--quick", "--rounds"), "why")
    assert capsys.readouterr().out == "k5 is not run here because no GPU; compiling.\n--quick was ignored: why.\n\n"
    print_not_run(parser.parse_args([]), "k5", "no GPU", "compiling", ("--quick", "--rounds"), "why")
    assert capsys.readouterr().out == "k5 is not run here because no GPU; compiling.\n\n"


def test_every_no_gpu_banner_comes_from_the_harness():
    """No chapter words its own "not run" line: each run.py that has a no-GPU banner calls print_not_run."""
    for path in sorted(REPO.glob("chapters/*/run.py")):
        text = path.read_text()
        assert "is not run here because" not in text and "was not run here" not in text, path


# ---- the dispatch --------------------------------------------------------------------------------

@pytest.fixture
def calls():
    seen = []
    on_gpu = lambda args, gpu: seen.append(("gpu", gpu)) or 0  # noqa: E731
    without = lambda args, reason: seen.append(("no gpu", reason)) or 0  # noqa: E731
    return seen, on_gpu, without


@pytest.mark.parametrize(("found", "requires", "expected"), [
    (None, SM90A, ("no gpu", "there is no NVIDIA GPU on this machine")),
    (B200, SM90A, ("no gpu", "NVIDIA B200 is sm_100 and wgmma runs only on sm_90a")),
    (H200, SM90A, ("gpu", H200)),
    (B200, ANY_GPU, ("gpu", B200)),
])
def test_chapter_main_runs_the_path_the_gpu_allows(monkeypatch, calls, found, requires, expected):
    import moe_gemm.cuda.gpu

    seen, on_gpu, without = calls
    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: found)
    assert chapter_main(None, requires, on_gpu, without) == 0
    assert seen == [expected]


def test_chapter_main_does_not_look_where_it_need_not(monkeypatch, calls):
    import moe_gemm.cuda.gpu

    seen, on_gpu, without = calls
    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: pytest.fail("looked for a GPU"))
    chapter_main(None, NO_GPU, None, without)
    chapter_main(None, ANY_GPU, on_gpu, without, skip_gpu="--simulate asks for the simulator")
    assert seen == [("no gpu", NO_GPU.needs), ("no gpu", "--simulate asks for the simulator")]


# ---- looking records up --------------------------------------------------------------------------

def test_find_best_peer_and_ratio():
    seed, small = Workload(16384, 0.0), Workload(2048, 0.0)
    records = [_record("k3/a", seed, 600.0), _record("peer/torch_grouped_mm", seed, 500.0),
               _record("peer/torch_grouped_mm-kmajor", seed, 550.0), _record("k3/a", small, 200.0),
               _record("peer/torch_grouped_mm", small, 160.0), _record("k3/a", Workload(16384, 0.0, K=8192), 1.0)]
    assert find(records, "k3/a", seed)["useful_tflops"] == 600.0
    assert find(records, "k3/a", "2k s=0")["useful_tflops"] == 200.0  # a short label finds it too
    assert best_peer(records, seed)["variant"] == "peer/torch_grouped_mm-kmajor"  # the faster layout
    assert best_peer(records, small)["variant"] == "peer/torch_grouped_mm"  # the only one measured
    assert ratio_to_peer(records, "k3/a", seed) == pytest.approx(600 / 550)
    assert ratio_to_peer(records, "k3/a", small) == pytest.approx(200 / 160)
    assert ratio_to_peer(records, "k3/b", seed) is None and best_peer(records, Workload(512, 0.0)) is None
    assert ratio_to_peer(records, "k3/a", Workload(512, 0.0)) is None


# ---- the chapters' shape -------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", sorted(p.parent.name for p in REPO.glob("chapters/*/run.py")))
def test_every_chapter_has_the_same_shape(chapter):
    """run.py: parse_args, run_without_gpu, main through chapter_main, run_main; figures.py: write_outputs
    and main through figures_main. Nothing names the recorded GPU's file or the seed's shape itself."""
    folder = REPO / "chapters" / chapter
    run = folder / "run.py"
    functions = {node.name for node in ast.parse(run.read_text()).body if isinstance(node, ast.FunctionDef)}
    assert {"parse_args", "run_without_gpu", "main"} <= functions, run
    assert "run_on_gpu" in functions or chapter == "00", run  # chapter 00 is arithmetic: NO_GPU, no GPU path
    assert "chapter_main(" in run.read_text() and "run_main(main)" in run.read_text()
    figures = folder / "figures.py"
    functions = {node.name for node in ast.parse(figures.read_text()).body if isinstance(node, ast.FunctionDef)}
    assert {"write_outputs", "main"} <= functions and "figures_main(__doc__, write_outputs" in figures.read_text()
    for path in (run, figures):
        code = ast.unparse(ast.parse(path.read_text()))  # without comments and docstrings' layout
        assert "'h200'" not in code and "64, 1024, 2688" not in code, path


def test_failed_variants_names_each_failing_variant_once_in_order():
    from moe_gemm.chapter import failed_variants

    checks = [{"variant": "k6/b", "passed": False}, {"variant": "k6/a", "passed": True},
              {"variant": "k6/b", "passed": False}, {"variant": "k3/x", "passed": False}]
    assert failed_variants(checks) == ["k3/x", "k6/b"]
    assert failed_variants(checks[1:2]) == []


def test_checks_passed_shows_the_failures_and_stops_the_timing(capsys):
    from moe_gemm.chapter import checks_passed

    ok = {"variant": "k7/bn192", "case": "a", "result": "all equal", "passed": True}
    bad = {"variant": "k7/bn128", "case": "b", "result": "3 mismatches", "passed": False}
    assert checks_passed([ok, ok]) is True
    assert "all 2 checks passed" in capsys.readouterr().out
    assert checks_passed([ok, bad]) is False
    captured = capsys.readouterr()
    assert "3 mismatches" in captured.out and "all equal" not in captured.out  # only the failure is shown
    assert "checks FAILED for k7/bn128: nothing is timed." in captured.err


def test_a_run_on_a_gpu_names_the_rungs_it_leaves_out_until_they_have_run(capsys):
    from moe_gemm.chapter import print_pending

    print_pending(frozenset(), "moe_gemm.variants.k7.config.NOT_YET_RUN")
    assert capsys.readouterr().out == ""
    print_pending(frozenset({"k7/coop-bn256", "k7/coop-bn192"}), "moe_gemm.variants.k7.config.NOT_YET_RUN")
    out = capsys.readouterr().out
    assert "nor timed here: k7/coop-bn192, k7/coop-bn256 (moe_gemm.variants.k7.config.NOT_YET_RUN)" in out
