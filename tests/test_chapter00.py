"""Chapter 00's run.py and figures.py: output, errors and generated files (no GPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.site.workload_tables import estimate_table, routing_table, tile_count_table

CHAPTER = Path(__file__).resolve().parents[1] / "chapters" / "00"


def _table_rows(out: str, title: str) -> list[list[str]]:
    """The cells of the rows of the printed table whose title line starts with ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if lines[i].strip() and set(lines[i]) <= set("- "))
    rows = []
    for line in lines[rule + 1:]:
        if not line or not (line[0].isspace() or line[0].isdigit()):
            break  # the legend, or the blank line after the table
        rows.append(line.split())
    return rows


def test_default_run_tells_the_seeds_story_at_both_skews(capsys) -> None:
    assert chapter_module("00", "run").main([]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("problem: E = 64 experts, M_tot = 16,384 rows, K = 1,024, N = 2,688, "
                                   "skew s = 0 and 1.2")
    routing = _table_rows(out, "Routing over")
    assert routing == [["16,384", "0", "256", "256", "0", "1.00"], ["16,384", "1.2", "4,793", "32", "0", "18.72"]]
    tiles = {(row[1], row[2]): row[5] for row in _table_rows(out, "Flat tile list")}
    assert tiles == {("0", "64x64"): "10,752", ("0", "128x128"): "2,688", ("1.2", "64x64"): "11,970",
                     ("1.2", "128x128"): "3,444"}
    skewed = {row[0]: row[3] for row in _table_rows(out, "Row utilisation eta for 16,384 rows, s = 1.2")}
    assert skewed == {"32": "0.936", "64": "0.898", "128": "0.780"}
    assert [row[-1] for row in _table_rows(out, "eta-only estimate")] == ["440.1", "343.5"]
    assert "the seed's B300 k2/S2 number" in out


def test_skew_narrows_the_run_to_one_routing(capsys) -> None:
    assert chapter_module("00", "run").main(["--skew", "1.2"]) == 0
    out = capsys.readouterr().out
    assert "skew s = 1.2\n" in out and "4,793" in out and "343.5" in out
    assert "10,752" not in out and "s = 0\n" not in out


def test_tokens_flag_drives_every_table(capsys) -> None:
    assert chapter_module("00", "run").main(["--tokens", "2048", "--skew", "0"]) == 0
    out = capsys.readouterr().out
    assert "110.0" in out and "16,384 " not in out.split("eta-only estimate")[1].split("\n", 2)[2]


def test_no_rows_print_dashes_where_eta_is_undefined(capsys) -> None:
    assert chapter_module("00", "run").main(["--tokens", "0", "--skew", "1.2"]) == 0
    out = capsys.readouterr().out
    detail = _table_rows(out, "Row utilisation eta for 0 rows")
    assert [row[3:5] for row in detail] == [["-", "-"]] * 3
    assert _table_rows(out, "eta-only estimate") == [["0", "1.2", "-", "-", "-", "-"]]
    assert [row[-1] for row in _table_rows(out, "Flat tile list")] == ["-", "-"]


def test_large_numbers_get_thousands_separators(capsys) -> None:
    args = ["--experts", "1024", "--tokens", "1000000", "--skew", "0", "-K", "4096"]
    assert chapter_module("00", "run").main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("problem: E = 1,024 experts, M_tot = 1,000,000 rows, K = 4,096, N = 2,688")
    assert "22,020.1" in out  # useful GFLOP, 2 x 1e6 x 4096 x 2688


def test_every_table_has_a_legend_line(capsys) -> None:
    assert chapter_module("00", "run").main([]) == 0
    blocks = capsys.readouterr().out.strip().split("\n\n")[1:]
    assert len(blocks) == 5
    for block in blocks:
        legend = block.splitlines()[-1]
        assert ":" in legend and legend.endswith("."), legend


def test_run_bm_flag(capsys) -> None:
    assert chapter_module("00", "run").main(["--tokens", "2048", "--bm", "16", "32"]) == 0
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
    chapter_module("00", "run")
    chapter_module("00", "figures")
    assert capsys.readouterr().out == ""


def test_figures_write_pngs_and_tables(tmp_path, capsys) -> None:
    assert chapter_module("00", "figures").main(["--out", str(tmp_path)]) == 0
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
    # At the H200's recorded ceilings (the wgmma peak and the copy, ridge near 218 FLOP/byte): memory-bound
    # at 2,048 rows, and at 16,384 just under the ridge.
    from moe_gemm.measure.ceilings import roofline_basis
    from moe_gemm.model.workloads import SEED, Workload

    basis = roofline_basis()
    assert 200 < basis.ridge < 240
    roofline_md = (folder / "roofline.md").read_text()
    assert f"| 2,048 | 11.3 | 367.5 | 30.7 | {basis.tflops(Workload(2048, 0.0)):.0f} | memory |" in roofline_md
    assert f"| 16,384 | 90.2 | 474.0 | 190.3 | {basis.tflops(SEED):.0f} | memory |" in roofline_md


def test_workload_tables() -> None:
    routing = routing_table(64, [(16384, 1.2)])
    assert routing.rows == ((16384, "1.2", 4793, 32, 0, "18.72"),)
    tiles = tile_count_table(64, 2688, [(2048, 0.0)])
    assert [row[5] for row in tiles.rows] == [2688, 1344]
    estimate = estimate_table(64, [(16384, 1.2)], (64, 128), 440.1, rate_label="the seed's B300 k2/S2 number")
    assert estimate.rows[0][-1] == "343.5"
    assert "the seed's B300 k2/S2 number" in estimate.title


def test_help_defines_the_seed_before_using_it(capsys) -> None:
    with pytest.raises(SystemExit):
        chapter_module("00", "run").main(["--help"])
    text = capsys.readouterr().out
    definition = text.index('"The seed" is the B300 worklog this project grew from')
    assert definition < text.index("the seed's")
    assert "E = 64 experts, K = 1024" in text and "16,384 routed rows" in text


@pytest.mark.parametrize("experts", [1, 64, 256, 1024])
def test_the_eta_estimate_never_exceeds_the_measured_rate(experts):
    """The measured rate was taken where eta = 1 (the seed's E at 16,384 rows): padding can only take
    from it, whatever E the table is for (eta_ref taken at the table's E once read 880 TFLOP/s for
    E = 256)."""
    table = estimate_table(experts, [(16384, 0.0), (1 << 20, 0.0), (512, 1.2)], (128,), 440.1)
    assert max(float(row[-1]) for row in table.rows if row[-1] != "-") <= 440.1
