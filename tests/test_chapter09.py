"""Chapter 09 without a GPU: the run falls back to its compile report, the recorded targets follow from the
recorded records, and the page's sentences hold on the recorded H200 run (each of these can fail when a new
run changes what the page says)."""

from __future__ import annotations

import pytest

from moe_gemm.chapter import Workload, best_of, best_ratio, chapter_module, recorded

RUN = chapter_module("09")
DATA = recorded("09")
pytestmark = pytest.mark.skipif(DATA is None, reason="no recorded chapter 09 results")


def grid_cells() -> list[Workload]:
    return RUN.workloads_of(DATA["records"], "grid")


def test_the_grid_is_the_chapters_grid_in_the_weight_gradient():
    cells = grid_cells()
    assert {w.tokens for w in cells} == set(RUN.GRID_ROWS) and all(w.ragged == "K" for w in cells)
    assert len(cells) == len(RUN.GRID_ROWS) * 5


def test_the_recorded_targets_follow_from_the_recorded_records():
    assert RUN.target_rows(DATA["records"]) == DATA["targets"]


def test_k7_beats_torch_everywhere_and_trails_quack_everywhere_as_the_page_says():
    records = DATA["records"]
    for cell in grid_cells():
        assert best_ratio(records, RUN.K7, (RUN.TORCH,), cell) > 1.0, cell
        assert best_ratio(records, RUN.K7, RUN.QUACK, cell) < 1.0, cell


def test_quacks_pick_pairs_two_blocks_at_every_row_count_as_the_page_says():
    tiles = {}
    for r in DATA["records"]:
        if r["variant"] == "peer/quack-wgrad" and r.get("part") == "grid":
            c = r["config"]
            assert c["cluster_m"] * c["cluster_n"] == 2, r["tokens"]
            tiles.setdefault(r["tokens"], set()).add((c["tile_m"], c["tile_n"], c["pingpong"]))
    assert tiles[16384] == {(128, 192, True)} and tiles[65536] == {(192, 128, True)}
    assert tiles[2048] == tiles[4096] == {(128, 256, False)}


def test_the_grid_is_memory_bound_below_65536_rows_as_the_page_says():
    from moe_gemm.measure.ceilings import roofline_basis

    basis = roofline_basis()
    for cell in grid_cells():
        assert basis.bound(cell) == ("compute" if cell.tokens == 65536 else "memory"), cell
        assert best_of(DATA["records"], RUN.K7, cell)["useful_tflops"] <= basis.tflops(cell)


def test_without_a_gpu_it_prints_the_compile_report_and_exits_0(capsys):
    assert RUN.run_without_gpu(RUN.parse_args([]), "there is no NVIDIA GPU on this machine") == 0
    out = capsys.readouterr().out
    assert "k7 is not run here because there is no NVIDIA GPU" in out and "k7/bn192" in out


def test_a_model_projection_not_measured_reads_as_a_dash():
    table = RUN.models_table([r for r in DATA["records"] if r.get("part") == "grid"])
    assert all(row[3] == "-" for row in table.rows)
    assert len(table.rows) == len(RUN.MODELS) == 6


def _profile(variant: str, tokens: int) -> dict:
    return next(r for r in DATA["profile"] if r["variant"] == variant and r["tokens"] == tokens)


def test_the_profile_says_what_the_page_reads_from_it():
    """2,048 rows: the same bytes written, k7 at a lower HBM throughput; 65,536 rows: k7's tensor pipe idles
    more while the pair's L2 saving is under 10% (the page's revised prediction rests on both)."""
    k7, quack = _profile("k7/bn192", 2048), _profile("peer/quack-wgrad", 2048)
    assert abs(k7["dram_bytes_write"] / quack["dram_bytes_write"] - 1) < 0.02
    assert k7["dram_throughput_pct"] < quack["dram_throughput_pct"]
    k7, quack = _profile("k7/bn192", 65536), _profile("peer/quack-wgrad", 65536)
    assert quack["gmma_pipe_pct"] - k7["gmma_pipe_pct"] > 10
    assert 0 < 1 - quack["l2_bytes"] / k7["l2_bytes"] < 0.10
