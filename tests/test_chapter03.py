"""Chapter 03's run.py and figures.py without a GPU: the compile report, the recorded-results path,
the tables built from results records, and the generated docs files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "03"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"chapter03_{name}", CHAPTER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_gpu(monkeypatch):
    import moe_gemm.gpu

    monkeypatch.setattr(moe_gemm.gpu, "detect_gpu", lambda ordinal=0: None)


def _record(variant: str, tokens: int, skew: float, tflops: float, **extra) -> dict:
    record = {"variant": variant, "experts": 64, "K": 1024, "N": 2688, "tokens": tokens, "skew": skew,
              "median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1, "useful_tflops": tflops, "rel_error": 1e-3}
    record.update(extra)
    return record


def synthetic_records() -> list[dict]:
    """Made-up numbers with the shape of a real run, for exercising the table code only."""
    from moe_gemm.routing import expert_counts
    from moe_gemm.tiles import eta

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
    assert _load("run").main([]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU" in out and "sm_90a" in out
    for text in ("k2/s2", "k2/s3", "k2/s4", "UTMALDG", "SYNCS", "HMMA", "blocks/SM"):
        assert text in out, text


def test_compile_report_rows() -> None:
    run = _load("run")
    rows = {r["variant"]: r for r in run.compile_report("sm_90a")}
    for stages in (2, 3, 4):
        row = rows[f"k2/s{stages}"]
        assert row["spill_bytes"] == 0 and row["warps_per_block"] == 9
        assert row["sass"]["UTMALDG"] > 0 and row["sass"]["HMMA.16816.F32.BF16"] > 0
        assert row["sass"]["LDGSTS"] == 0  # no per-thread cp.async left: TMA does the copies
    assert rows["k2/s4"]["blocks_per_sm"] == 1 and "shared memory" in rows["k2/s4"]["limiter"]


def test_tables_from_records() -> None:
    run = _load("run")
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


def test_figures_without_results_say_so(tmp_path, monkeypatch, capsys) -> None:
    figures = _load("figures")
    monkeypatch.setattr(figures, "load_results", lambda: None)
    assert figures.main(["--out", str(tmp_path)]) == 0
    folder = tmp_path / "03"
    assert (folder / "ring.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (folder / "progression.png").exists() and not (folder / "stages.png").exists()
    assert "Not measured yet" in (folder / "progression.md").read_text()
    assert "UTMALDG" in (folder / "compile_report.md").read_text()
    waste = (folder / "waste.md").read_text()
    assert "3,444" in waste and "0.780" in waste and "75.0%" in waste


def test_figures_from_results(tmp_path, monkeypatch) -> None:
    figures = _load("figures")
    data = {"provenance": {"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "13.0",
                           "date": "2026-11-29", "git_commit": "0123456789abcdef"},
            "records": synthetic_records(),
            "profile": [{"variant": "k2/s2", "achieved_warps_per_sm": 17.5, "occupancy_limit_registers": 2.0}]}
    monkeypatch.setattr(figures, "load_results", lambda: data)
    assert figures.main(["--out", str(tmp_path)]) == 0
    folder = tmp_path / "03"
    for name in ("progression", "stages"):
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"figures/03/{name}.png" in (folder / f"{name}_figure.md").read_text()
    assert "| k2/s3 |" in (folder / "stages.md").read_text()
    assert "17.50" in (folder / "profile.md").read_text()


def test_bad_flag_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, str(CHAPTER / "run.py"), "--stages", "5"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_import_has_no_side_effects(capsys) -> None:
    _load("run")
    _load("figures")
    assert capsys.readouterr().out == ""
