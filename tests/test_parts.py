"""Results files measured in parts (moe_gemm.measure.parts): what a run keeps of the file it finds, what
it replaces, and which run each part is said to come from."""

from __future__ import annotations

import json

import pytest

from moe_gemm.cuda.gpu import GpuInfo
from moe_gemm.measure import results
from moe_gemm.measure.parts import PartsFile, part_runs, profile_piece

GPU = GpuInfo(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, driver_version=13000)
SECTIONS = frozenset({"provenance", "records", "checks", "targets", "part_runs"})
NOW = {"git_commit": "d", "date": "2026-12-02T00:00:00+00:00", "command": "run.py"}


def test_the_runs_section_names_each_part_once():
    """A part measured again takes this run's commit; the parts it did not measure keep theirs; a part
    measured whole replaces the entries of its pieces (``layer-qwen3`` goes with ``layer``)."""
    earlier = {"layer-qwen3": {"commit": "a"}, "scoreboard-grid": {"commit": "b"}, "scoreboard-models": {"commit": "c"}}
    runs = part_runs(earlier, {"scoreboard-grid": "the grid's cells, rows 512"}, NOW)
    assert set(runs) == {"layer-qwen3", "scoreboard-grid", "scoreboard-models"}
    assert runs["scoreboard-grid"] == {"commit": "d", "date": NOW["date"], "command": "run.py",
                                       "measured": "the grid's cells, rows 512"}
    assert runs["scoreboard-models"]["commit"] == "c" and runs["layer-qwen3"]["commit"] == "a"
    runs = part_runs(runs, {"layer": "every layer"}, NOW)
    assert set(runs) == {"layer", "scoreboard-grid", "scoreboard-models"} and runs["layer"]["commit"] == "d"


def test_a_profile_of_some_variants_keeps_the_entries_of_the_others():
    """Two runs profiling different variants each keep their own entry (each replaced only its variants' rows);
    the same variants profiled again replace theirs; the whole profile replaces them all."""
    runs = part_runs({}, dict([profile_piece(["k6/a-g8", "peer/quack"], "all")]), {**NOW, "git_commit": "a"})
    runs = part_runs(runs, dict([profile_piece(["k6/a-n8"], "all")]), NOW)
    assert runs == {"profile-k6/a-g8,peer/quack": {"commit": "a", "date": NOW["date"], "command": "run.py",
                                                  "measured": "Nsight Compute on k6/a-g8, peer/quack"},
                    "profile-k6/a-n8": {"commit": "d", "date": NOW["date"], "command": "run.py",
                                        "measured": "Nsight Compute on k6/a-n8"}}
    assert part_runs(runs, dict([profile_piece(["k6/a-n8"], "all")]), NOW).keys() == runs.keys()
    assert part_runs(runs, dict([profile_piece([], "every rung")]), NOW) == {
        "profile": {"commit": "d", "date": NOW["date"], "command": "run.py", "measured": "every rung"}}


@pytest.fixture
def chapter_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "CHAPTERS_DIR", tmp_path)
    return tmp_path


def write_earlier(data: dict) -> None:
    path = results.results_path("99", GPU.slug)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"provenance": {"git_commit": "old"}, **data}))


def test_a_run_keeps_the_chapters_sections_only(chapter_dir):
    record = {"variant": "k9", "tokens": 512, "skew": 0.0, "part": "a"}
    write_earlier({"records": [record], "checks": [1], "an_earlier_runs_numbers": [2]})
    file = PartsFile("99", GPU, SECTIONS)
    assert file.rows("records") == [record] and file.rows("checks") == [1]
    file.save(targets=[])
    written = results.recorded("99", GPU.slug)
    assert set(written) == {"provenance", "records", "checks", "targets"}
    assert written["provenance"]["git_commit"] != "old"


def test_rows_measured_again_replace_every_earlier_row_of_their_piece(chapter_dir):
    """Two variants at a cell: measuring the cell again with one of them drops the other's row too, so
    that a ratio at the cell never sets one run's number beside another's."""
    write_earlier({"records": [{"variant": "k9", "cell": 1, "ms": 1.0}, {"variant": "peer", "cell": 1, "ms": 1.0},
                               {"variant": "k9", "cell": 2, "ms": 1.0}]})
    file = PartsFile("99", GPU, SECTIONS)
    file.replace("records", [{"variant": "k9", "cell": 1, "ms": 2.0}], key=lambda r: r["cell"])
    assert file.rows("records") == [{"variant": "k9", "cell": 2, "ms": 1.0}, {"variant": "k9", "cell": 1, "ms": 2.0}]
    file.replace("steps", [{"cell": 3}], key=lambda r: r["cell"])  # a section the file did not have
    assert file.rows("steps") == [{"cell": 3}]


def test_a_run_says_which_run_measured_its_parts(chapter_dir):
    write_earlier({"records": [], "part_runs": {"a": {"commit": "old"}, "b": {"commit": "old"}}})
    file = PartsFile("99", GPU, SECTIONS)
    file.ran("b", "part b again")
    file.put(checks=[3])
    file.save()
    written = results.recorded("99", GPU.slug)
    assert written["part_runs"]["a"] == {"commit": "old"} and written["part_runs"]["b"]["measured"] == "part b again"
    assert written["part_runs"]["b"]["commit"] == written["provenance"]["git_commit"] and written["checks"] == [3]


def test_a_section_outside_the_chapters_is_refused(chapter_dir):
    file = PartsFile("99", GPU, SECTIONS)  # no earlier file: a first run
    with pytest.raises(ValueError, match="chapter 99 writes no section profile"):
        file.save(profile=[])
    assert results.recorded("99", GPU.slug) is None
