"""Chapter 03's run.py and figures.py without a GPU: the compile report, the recorded-results path,
the tables built from results records, and the generated docs files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.measure.results import find_measurement

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "03"


@pytest.fixture
def no_gpu(monkeypatch):
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: None)


def _record(variant: str, tokens: int, skew: float, tflops: float, **extra) -> dict:
    record = {"variant": variant, "experts": 64, "K": 1024, "N": 2688, "tokens": tokens, "skew": skew,
              "median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1, "useful_tflops": tflops, "rel_error": 1e-3}
    record.update(extra)
    return record


def synthetic_records() -> list[dict]:
    """Made-up numbers with the shape of a real run, for exercising the table code only."""
    from moe_gemm.model.routing import expert_counts
    from moe_gemm.model.tiles import eta

    records = []
    for tokens, skew in ((16384, 0.0), (16384, 1.2), (2048, 0.0)):
        counts = expert_counts(64, tokens, skew)
        records.append(_record("k0", tokens, skew, 20.0, eta=eta(counts, 64), registers=40, smem_bytes=8192,
                               warps_per_block=8))
        for stages, smem in ((2, 66592), (3, 99376), (4, 132160)):
            records.append(_record(f"k2/s{stages}", tokens, skew, 400.0 - 10 * stages, eta=eta(counts, 128),
                                   registers=94, smem_bytes=smem, warps_per_block=9))
        records.append(_record("peer/torch_grouped_mm", tokens, skew, 450.0))
    return records


def test_no_gpu_prints_the_compile_report_and_exits_0(no_gpu, capsys) -> None:
    assert chapter_module("03", "run").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k2 is not run here because there is no NVIDIA GPU on this machine; compiling the "
                          "chapter's kernels for sm_90a instead.\n")
    assert "--quick was ignored: nothing is timed or profiled without an sm_90 GPU." in out
    assert "UTMALDG (TMA), SYNCS (mbarrier)" in out  # the compile report's legend
    for text in ("k2/s2", "k2/s3", "k2/s4", "UTMALDG", "SYNCS", "HMMA", "blocks/SM"):
        assert text in out, text


def test_progression_leaves_k0_out_where_numba_cuda_cannot_compile(monkeypatch, capsys) -> None:
    """numpy 2.5 removed np.row_stack, which numba-cuda 0.30.4 calls: k1 and k2 run, k0 does not,
    and the run says why and what to do in one line (it used to crash at k0's first compile)."""
    import numpy as np

    from moe_gemm.variants.k0 import numba_loader

    run = chapter_module("03", "run")
    assert [v.name for v in run.progression_variants(with_peers=False)][0] == "k0"
    capsys.readouterr()
    monkeypatch.delattr(np, "row_stack", raising=False)
    monkeypatch.setattr(numba_loader, "numba_cuda_version", lambda: "0.30.4")
    names = [v.name for v in run.progression_variants(with_peers=False)]
    assert "k0" not in names and names[0].startswith("k1/") and {"k2/s2", "k2/s3", "k2/s4"} <= set(names)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and 'python -m pip install "numpy<2.5"' in out


def test_compile_report_rows() -> None:
    run = chapter_module("03", "run")
    rows = {r["variant"]: r for r in run.compile_report("sm_90a")}
    for stages in (2, 3, 4):
        row = rows[f"k2/s{stages}"]
        assert row["spill_bytes"] == 0 and row["warps_per_block"] == 9
        assert row["sass"]["UTMALDG"] > 0 and row["sass"]["HMMA.16816.F32.BF16"] > 0
        assert row["sass"]["LDGSTS"] == 0  # no per-thread cp.async left: TMA does the copies
    assert rows["k2/s4"]["blocks_per_sm"] == 1 and "shared memory" in rows["k2/s4"]["limiter"]


def test_tables_from_records() -> None:
    run = chapter_module("03", "run")
    records = synthetic_records()
    table = run.progression_table(records)
    assert table.headers[1] == "16k s=0 TFLOP/s" and table.headers[-1] == "vs peer (16k s=0)"
    by_variant = {row[0]: row for row in table.rows}
    assert by_variant["k2/s2"][-2] == "19.0x" and by_variant["k2/s2"][-1] == "0.84"
    stages = run.stages_rows(records)
    assert [r["variant"] for r in stages] == ["k2/s2", "k2/s3", "k2/s4"]
    s2 = stages[0]
    assert s2["skewed_estimate"] == pytest.approx(380.0 * 0.780, abs=0.2)  # eta(16k, s=1.2, BM=128) = 0.780
    assert s2["small_estimate"] == pytest.approx(380.0 * 0.25)
    assert s2["blocks_per_sm"] == 2 and stages[2]["blocks_per_sm"] == 1
    text = run.stages_table(stages).text()
    assert "eta-only" in text and "2 (registers)" in text


def test_figures_without_results_draw_no_measured_figure(tmp_path, monkeypatch, capsys) -> None:
    figures = chapter_module("03", "figures")
    monkeypatch.setattr(figures, "recorded", lambda chapter: None)
    assert figures.main(["--out", str(tmp_path)]) == 0
    folder = tmp_path / "03"
    assert (folder / "ring.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (folder / "progression.png").exists() and not (folder / "stages.png").exists()
    assert {p.name for p in folder.glob("*.md")} == {"compile_report.md", "waste.md"}
    assert "UTMALDG" in (folder / "compile_report.md").read_text()
    waste = (folder / "waste.md").read_text()
    assert "3,444" in waste and "0.780" in waste and "75.0%" in waste


def test_figures_from_results(tmp_path, monkeypatch) -> None:
    figures = chapter_module("03", "figures")
    data = {"provenance": {"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "13.0",
                           "date": "2026-11-29", "git_commit": "0123456789abcdef"},
            "records": synthetic_records(),
            "profile": [{"variant": "k2/s2", "achieved_warps_per_sm": 17.5, "occupancy_limit_registers": 2.0}]}
    monkeypatch.setattr(figures, "recorded", lambda chapter: data)
    assert figures.main(["--out", str(tmp_path)]) == 0
    folder = tmp_path / "03"
    for name in ("progression", "stages"):
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_flag_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, str(CHAPTER / "run.py"), "--stages", "5"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_import_has_no_side_effects(capsys) -> None:
    chapter_module("03", "run")
    chapter_module("03", "figures")
    assert capsys.readouterr().out == ""


# ---- the page's claims, checked on the recorded results ------------------------------------
#
# site_docs/03-tma-warp-specialization.md interprets chapters/03/results/h200.json (and chapter
# 02's file for the ceilings and k1's counters) in prose. Each test below is one sentence of that
# prose; a rerun that flips it fails here, and the page must then be rewritten.

REPO = CHAPTER.parents[1]
RESULTS03 = REPO / "chapters/03/results/h200.json"
RESULTS02 = REPO / "chapters/02/results/h200.json"
STAGES = ("k2/s2", "k2/s3", "k2/s4")
WORKLOADS = ("16k s=0", "16k s=1.2", "2k s=0")


@pytest.fixture(scope="module")
def recorded():
    import json

    if not RESULTS03.is_file():
        pytest.skip("no recorded chapter 03 results")
    ch02 = json.loads(RESULTS02.read_text()) if RESULTS02.is_file() else None
    return json.loads(RESULTS03.read_text()), ch02, chapter_module("03", "run")


def _tf(data, run, variant, key):
    record = find_measurement(data["records"], variant, key)
    assert record is not None, (variant, key)
    return record


def _prof(data, variant):
    return next(p for p in data["profile"] if p["variant"] == variant)


def test_claim_best_k2_meets_the_target_with_s3(recorded):
    data, _, run = recorded
    best = max((_tf(data, run, v, "16k s=0") for v in STAGES), key=lambda r: r["useful_tflops"])
    assert best["variant"] == "k2/s3"  # "k2 clears the chapter's target with S=3"
    assert best["useful_tflops"] >= 380.0


def test_claim_stage_order_is_s3_s2_s4_at_every_workload(recorded):
    data, _, run = recorded
    for key in WORKLOADS:
        s2, s3, s4 = (_tf(data, run, v, key)["useful_tflops"] for v in STAGES)
        assert s3 > s2 > s4, key
        assert 1.01 < s3 / s2 < 1.10, key  # "the third stage is worth a few percent at every workload"


def test_claim_k2_beats_k1_with_the_same_compute_warps(recorded):
    data, _, run = recorded
    k1_name = next(r["variant"] for r in data["records"] if r["variant"].startswith("k1/"))
    for key in WORKLOADS:
        k1 = _tf(data, run, k1_name, key)
        for v in STAGES:
            assert _tf(data, run, v, key)["useful_tflops"] > k1["useful_tflops"], (v, key)
    k1, k2 = _tf(data, run, k1_name, "16k s=0"), _tf(data, run, "k2/s3", "16k s=0")
    assert (k1["bm"], k1["bn"]) == (k2["bm"], k2["bn"]) == (128, 128)
    assert k1["blocks_per_sm"] * k1["warps_per_block"] == k2["blocks_per_sm"] * (k2["warps_per_block"] - 1) == 16


def test_claim_ncu_shows_the_copy_path_gone(recorded):
    data, ch02, run = recorded
    if ch02 is None:
        pytest.skip("no chapter 02 results")
    k1_name = next(r["variant"] for r in data["records"] if r["variant"].startswith("k1/"))
    p1 = next(p for p in ch02["profile"] if p["variant"] == k1_name)
    p2 = _prof(data, "k2/s3")
    assert 0.20 < 1 - p2["instructions"] / p1["instructions"] < 0.25  # "drops by almost a quarter"
    assert p1["stall_barrier"] > 1.0 and p2["stall_barrier"] < 0.1  # "the barrier stall disappears"
    assert p2["stall_mio_throttle"] < p1["stall_mio_throttle"] / 5  # "MIO throttle all but disappears"
    assert p2["stall_mio_throttle"] < 0.5  # "is small"
    rate1, rate2 = p1["instructions"] / p1["duration_ns"], p2["instructions"] / p2["duration_ns"]
    assert 1.0 < rate2 / rate1 < 1.2  # "issues a little faster than before"
    assert p2["tensor_pipe_pct"] > p1["tensor_pipe_pct"] + 15


def test_claim_peer_ahead_except_at_2048_rows(recorded):
    data, _, run = recorded
    for key in ("16k s=0", "16k s=1.2"):
        best = max(_tf(data, run, v, key)["useful_tflops"] for v in STAGES)
        assert best < _tf(data, run, run.PEER, key)["useful_tflops"], key
    for v in STAGES:  # "k2 still beats torch._grouped_mm at this size"
        assert _tf(data, run, v, "2k s=0")["useful_tflops"] > _tf(data, run, run.PEER, "2k s=0")["useful_tflops"]


def test_claim_not_memory_bound_at_16k_and_ceilings(recorded):
    from moe_gemm.measure.ceilings import roofline_basis
    from moe_gemm.model.roofline import compulsory_bytes
    from moe_gemm.model.workloads import SEED

    data, ch02, run = recorded
    best = _tf(data, run, "k2/s3", "16k s=0")
    tbps = compulsory_bytes(SEED.counts, SEED.K, SEED.N) / (best["median_ms"] * 1e-3) / 1e12
    assert tbps < 0.6 * roofline_basis().copy_tbps  # "the compulsory bytes need well under the copy ceiling"
    if ch02 is not None:
        from moe_gemm.measure.ceilings import ceiling_value

        assert ceiling_value(ch02["ceilings"], "mma_sync") < ceiling_value(ch02["ceilings"], "dense_bf16")


def test_claim_s2_to_s3_moves_long_scoreboard_most(recorded):
    data, _, run = recorded
    p2, p3, p4 = (_prof(data, v) for v in STAGES)
    deltas = {k: abs(p3[k] - p2[k]) for k in p2 if k.startswith("stall_") and k != "stall_selected"}
    assert max(deltas, key=deltas.get) == "stall_long_scoreboard"
    assert p2["stall_long_scoreboard"] > p3["stall_long_scoreboard"] > p4["stall_long_scoreboard"]
    assert 0.5 < p2["cycles_per_issue"] - p3["cycles_per_issue"] < 2.0  # "L falls by about a cycle"
    s2, s3 = _tf(data, run, "k2/s2", "16k s=0"), _tf(data, run, "k2/s3", "16k s=0")
    assert s2["registers"] == s3["registers"] and s2["blocks_per_sm"] == s3["blocks_per_sm"] == 2


def test_claim_s4_loses_warps_faster_than_latency(recorded):
    data, _, run = recorded
    p3, p4 = _prof(data, "k2/s3"), _prof(data, "k2/s4")
    s4 = _tf(data, run, "k2/s4", "16k s=0")
    assert s4["blocks_per_sm"] == 1 and p4["occupancy_limit_registers"] == p4["occupancy_limit_shared_mem"] == 1
    w_drop = 1 - p4["warps_per_scheduler"] / p3["warps_per_scheduler"]
    l_drop = 1 - p4["cycles_per_issue"] / p3["cycles_per_issue"]
    assert 0.4 < w_drop < 0.6 and l_drop < w_drop  # "halve the resident warps", "L by less than W"
    assert p4["stall_short_scoreboard"] < p3["stall_short_scoreboard"] / 3  # "all but vanishes"
    assert p4["issue_model"] < p3["issue_model"]


def test_claim_skewed_beats_the_eta_only_estimate_and_waves_do_not_explain_it(recorded):
    import math

    data, _, run = recorded
    seed = 357.0 / 343.3  # the seed's B300 k2/S2 at s = 1.2: measured, and its eta-only estimate
    rows = {r["variant"]: r for r in data["stages"]}
    ratios = [rows[v]["skewed_tflops"] / rows[v]["skewed_estimate"] for v in STAGES]
    assert min(ratios) > seed > 1  # "every depth beats its estimate ... and by a little more"
    assert ratios[0] > ratios[1] > ratios[2]  # "the ratio shrinking as the ring deepens"
    for v in STAGES:  # "the skewed grid runs its scheduled work faster"
        assert _tf(data, run, v, "16k s=1.2")["scheduled_tflops"] > _tf(data, run, v, "16k s=0")["scheduled_tflops"]
    best = _tf(data, run, "k2/s3", "16k s=1.2")
    slots = data["provenance"]["sm_count"] * best["blocks_per_sm"]
    waves = [t / slots for t in (_tf(data, run, "k2/s3", "16k s=0")["tiles"], best["tiles"])]
    assert all(w - math.floor(w) < 0.5 for w in waves)  # "a mostly empty last wave"
    fill = [w / math.ceil(w) for w in waves]
    gap = abs(fill[1] / fill[0] - 1)
    assert gap < 0.01 and min(ratios) - 1 > 3 * gap  # "under one percent, against a gap several times larger"


def test_claim_2048_rows_pay_for_their_padding(recorded):
    from moe_gemm.measure.ceilings import roofline_basis
    from moe_gemm.model.roofline import compulsory_bytes
    from moe_gemm.model.workloads import Workload

    data, _, run = recorded
    rows = {r["variant"]: r for r in data["stages"]}
    for v, bound in (("k2/s2", 0.015), ("k2/s3", 0.015), ("k2/s4", 0.03)):
        assert abs(rows[v]["small_tflops"] / rows[v]["small_estimate"] - 1) < bound, v
    small, balanced = _tf(data, run, "k2/s3", "2k s=0"), _tf(data, run, "k2/s3", "16k s=0")
    assert small["eta"] == 0.25
    basis, cell = roofline_basis(), Workload(2048, 0.0)
    floor_ms = compulsory_bytes(cell.counts, cell.K, cell.N) / (basis.copy_tbps * 1e12) * 1e3
    scheduled_flop = small["scheduled_tflops"] * 1e12 * small["median_ms"] * 1e-3
    at_balanced_ms = scheduled_flop / (balanced["useful_tflops"] * 1e12) * 1e3
    assert at_balanced_ms > floor_ms and small["median_ms"] > floor_ms  # "bound by its padded math"
    assert small["useful_tflops"] < basis.tflops(cell)


def test_claim_model_residency_is_ncus(recorded):
    from moe_gemm.model.occupancy import residency

    data, _, run = recorded
    for v in STAGES:
        record, p = _tf(data, run, v, "16k s=0"), _prof(data, v)
        fit = residency(record["registers"], record["warps_per_block"], record["smem_bytes"])
        assert p["registers_per_thread"] == record["registers"]
        assert p["occupancy_limit_registers"] == fit.by_registers and p["occupancy_limit_shared_mem"] == fit.by_smem
        model_warps = fit.blocks * record["warps_per_block"]
        assert 0.9 < p["achieved_warps_per_sm"] / model_warps < 1.0, v  # "fall short ... roughly one warp"
        assert abs(p["issue_model"] - p["issue_active"]) < 0.01  # "within a few thousandths"


def test_claim_the_limit_is_issue_not_the_tensor_pipe(recorded):
    data, _, _ = recorded
    for v in STAGES:
        p = _prof(data, v)
        assert p["tensor_pipe_pct"] < 66.7 and p["issue_active"] < 0.3, v
    best = _prof(data, "k2/s3")
    assert 60 < best["tensor_pipe_pct"] and 0.25 <= best["issue_active"]  # "idles about a third", "a quarter"
    for v in ("k2/s2", "k2/s3"):  # "the wait for ldmatrix data is the largest single item in L"
        p = _prof(data, v)
        stalls = {k: x for k, x in p.items() if k.startswith("stall_")}
        assert max(stalls, key=stalls.get) == "stall_short_scoreboard", v


def test_claim_skewed_run_is_closer_to_the_peer(recorded):
    """'Against the peer the skewed run does better than the balanced one'."""
    data, _, run = recorded
    ratio = {key: _tf(data, run, "k2/s3", key)["useful_tflops"] / _tf(data, run, run.PEER, key)["useful_tflops"]
             for key in ("16k s=0", "16k s=1.2")}
    assert ratio["16k s=1.2"] > ratio["16k s=0"]


def test_claim_s2_misses_the_target_it_was_written_for(recorded):
    data, _, run = recorded
    assert 0.95 * 380 < _tf(data, run, "k2/s2", "16k s=0")["useful_tflops"] < 380.0


def test_page_carries_its_prose_and_no_generated_snippets():
    page = (REPO / "site_docs/03-tma-warp-specialization.md").read_text()
    assert "findings_" not in page and "<!-- MEASURED" not in page
    assert "on either side of each hand-over" not in page  # k1 has one __syncthreads per K slice
    assert "The order is the same at every workload: `k2/s3` > `k2/s2` > `k2/s4`." in page


def test_the_readmes_main_command_is_chapter_04s_not_this_page():
    readme = (REPO / "README.md").read_text()
    main = readme.split("## Two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "chapters/04/run.py" in main and "chapters/03/run.py" not in main
    page = (REPO / "site_docs/03-tma-warp-specialization.md").read_text()
    assert "main command" not in page
