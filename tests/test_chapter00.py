"""Chapter 00's run.py and figures.py: output, errors and generated files (no GPU)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_gemm.workload_tables import estimate_table, routing_table, tile_count_table

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "00"


def _load(name: str):
    # Chapter folders are numbered, not packages: load the script under a unique module name.
    spec = importlib.util.spec_from_file_location(f"chapter00_{name}", CHAPTER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_prints_the_seed_numbers(capsys) -> None:
    assert _load("run").main(["--skew", "1.2"]) == 0
    out = capsys.readouterr().out
    for text in ("4,793", "11,970", "3,444", "0.898", "0.780", "343.5", "110.0", "the seed's B300"):
        assert text in out, text


def test_run_bm_flag(capsys) -> None:
    assert _load("run").main(["--tokens", "2048", "--bm", "16", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^16 +\d", out, re.M) and re.search(r"^32 +\d", out, re.M)


@pytest.mark.parametrize(("argv", "flag"), [(["--skew", "-1"], "--skew"), (["--bm", "48"], "--bm"),
                                            (["--tokens", "many"], "--tokens")])
def test_run_bad_values_exit_2_with_one_line(argv: list[str], flag: str) -> None:
    proc = subprocess.run([sys.executable, str(CHAPTER / "run.py"), *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and flag in proc.stderr and "Traceback" not in proc.stderr


def test_import_has_no_side_effects(capsys) -> None:
    _load("run")
    _load("figures")
    assert capsys.readouterr().out == ""


def test_figures_write_pngs_and_tables(tmp_path, capsys) -> None:
    assert _load("figures").main(["--out", str(tmp_path)]) == 0
    folder = tmp_path / "00"
    for name in ("tokens_per_expert", "tile_quantisation", "eta_vs_skew"):
        png = folder / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    eta_md = (folder / "eta_table.md").read_text()
    assert "| 16,384 | 1.2 | 0.936 | 0.898 | 0.780 | 343.5 |" in eta_md
    assert "| 2,048 | 0 | 1.000 | 0.500 | 0.250 | 110.0 |" in eta_md
    tiles_md = (folder / "tile_counts.md").read_text()
    for count in ("10,752", "11,970", "2,688", "3,444", "1,344"):
        assert count in tiles_md
    occupancy_md = (folder / "occupancy_checks.md").read_text()
    assert "| k2/S3 | 123 | 9 | 4,096 | 36,864 | 1 |" in occupancy_md
    assert "| third 9-warp block | 72 | 9 | 2,304 | 20,736 | 3 |" in occupancy_md
    assert "| 3.90 | 8.49 | 0.459 | 1.84 |" in (folder / "issue_check.md").read_text()
    # SPEC section 7: the 2,048-row roofline is memory-bound at 129 TFLOP/s, 16,384 rows compute-bound.
    roofline_md = (folder / "roofline.md").read_text()
    assert "| 2,048 | 11.3 | 367.5 | 30.7 | 129 | memory |" in roofline_md
    assert "| 16,384 | 90.2 | 474.0 | 190.3 | 757 | compute |" in roofline_md


def test_workload_tables() -> None:
    routing = routing_table(64, [(16384, 1.2)])
    assert routing.rows == ((16384, "1.2", 4793, 32, 0, "18.72"),)
    tiles = tile_count_table(64, 2688, [(2048, 0.0)])
    assert [row[5] for row in tiles.rows] == [2688, 1344]
    estimate = estimate_table(64, [(16384, 1.2)], (64, 128), 440.1, rate_label="the seed's B300 k2/S2 number")
    assert estimate.rows[0][-1] == "343.5"
    assert "the seed's B300 k2/S2 number" in estimate.title
