"""Chapter 07 without a GPU: the run prints the compile report and the recorded results and exits 0;
the recorded targets agree with the records they were computed from."""

from __future__ import annotations

import pytest

from moe_gemm.chapter import chapter_module, recorded

RUN = chapter_module("07")


def test_without_a_gpu_it_exits_zero_and_prints_the_compile_report(capsys, monkeypatch):
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: None)
    assert RUN.main([]) == 0
    out = capsys.readouterr().out
    assert "k6/pingpong-cluster-bn192" in out and "HGMMA" in out


def test_recorded_targets_match_the_records():
    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    again = RUN.target_rows(data["records"])
    assert [(r["target"], round(r["value"], 6), r["met"]) for r in again] == \
           [(r["target"], round(r["value"], 6), r["met"]) for r in data["targets"]]
    assert {r.get("part") for r in data["records"]} == {"ladder", "grid", "models"}


def test_k6_auto_is_checked_against_quack_and_torch_in_the_same_run():
    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    from moe_gemm.model.workloads import Workload

    cell = Workload(65536, 0.0)
    for names in ([RUN.AUTO], RUN.QUACK, RUN.TORCH):
        assert RUN.best_of(data["records"], names, cell) is not None
    assert 0.5 < RUN.ratio(data["records"], RUN.AUTO, RUN.QUACK, cell) < 1.5


def test_the_pages_summary_holds():
    """The page's status line: k6/auto ahead of quack at every model shape measured, behind it in every
    grid cell measured but three, furthest behind at 16,384 rows s = 1.2."""
    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    from moe_gemm.model.workloads import Workload

    records = data["records"]
    models = [v for w in RUN.MODEL_SHAPES.values() if (v := RUN.ratio(records, RUN.AUTO, RUN.QUACK, w)) is not None]
    assert len(models) == 3 and min(models) > 1.0
    grid = {w: v for w in RUN.grid() if (v := RUN.ratio(records, RUN.AUTO, RUN.QUACK, w)) is not None}
    assert sum(v >= 1.0 for v in grid.values()) == 3
    assert min(grid, key=grid.get) == Workload(16384, 1.2)


def test_the_shared_staging_comparison_reads_what_the_page_says():
    """The page's before/now table: at 65,536 rows the shared ring beats the old 5-stage rung (the
    prediction held), at 16,384 balanced rows the plain ping-pong rung lost ground (it failed); the
    quack drift gauge holds the best of quack's configurations of this run."""
    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    from moe_gemm.model.workloads import Workload

    before = {r["variant"]: r["useful_tflops"] for r in data["before_shared_staging"]}
    records = [r for r in data["records"] if r["part"] == "ladder"]

    def now(variant, w):
        return RUN.find(records, variant, w)["useful_tflops"]

    for label, w in (("64k s=0", Workload(65536, 0.0)), ("64k s=1.2", Workload(65536, 1.2))):
        assert now("k6/pingpong-bn192", w) > before[f"k6/pingpong-bn192-s5 @ {label}"]
    assert now("k6/pingpong-bn192", Workload(16384, 0.0)) < before["k6/pingpong-bn192 @ 16k s=0"]
    for gauge in data["quack_drift"]:
        w = next(c for c in RUN.SEED_FIVE if c.short_label == gauge["cell"])
        assert RUN.best_of(records, RUN.QUACK, w)["useful_tflops"] == gauge["now"]
    assert set(data["part_runs"]) == {"ladder", "grid", "models"}
