"""Results files: round trip, atomic writes, provenance keys."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from moe_gemm.measure import provenance as provenance_module
from moe_gemm.measure.provenance import COMMIT_DIGITS, PROVENANCE_KEYS, commit_label, provenance
from moe_gemm.measure.results import RECORD_KEYS, find_record, load_results, results_path, write_results

SCHEMA_PROVENANCE_KEYS = {"gpu", "compute_capability", "driver", "cuda", "packages", "git_commit", "date", "command"}
SCHEMA_RECORD_KEYS = {"variant", "experts", "K", "N", "tokens", "skew", "median_ms", "min_ms", "max_ms",
                    "useful_tflops", "scheduled_tflops", "eta", "tiles", "registers", "smem_bytes",
                    "spill_bytes", "blocks_per_sm", "rel_error"}


def _prov() -> dict:
    return {key: f"test-{key}" for key in PROVENANCE_KEYS} | {"packages": {"numpy": "2.4"}}


def _record(variant: str = "k1/bm64", skew: float = 1.2) -> dict:
    record = {key: 1 for key in RECORD_KEYS}
    record.update(variant=variant, tokens=16384, skew=skew, eta=0.898, median_ms=0.25, rel_error=3.1e-3)
    return record


def test_schema_keys_match_the_spec() -> None:
    assert set(PROVENANCE_KEYS) == SCHEMA_PROVENANCE_KEYS
    assert SCHEMA_RECORD_KEYS <= set(RECORD_KEYS)


def test_round_trip(tmp_path) -> None:
    records = [_record("k1/bm64"), _record("k2/s2", skew=0.0)]
    path = write_results(tmp_path / "results" / "h200.json", records, _prov())
    assert path.exists()
    data = load_results(path)
    assert data["provenance"] == _prov()
    assert data["records"] == records
    assert find_record(data["records"], variant="k2/s2")["skew"] == 0.0
    assert find_record(data["records"], variant="k3") is None


def test_nan_values_survive_the_round_trip(tmp_path) -> None:
    record = _record() | {"rel_error": float("nan")}
    data = load_results(write_results(tmp_path / "r.json", [record], _prov()))
    assert math.isnan(data["records"][0]["rel_error"])


def test_atomic_write_leaves_no_temp_files(tmp_path) -> None:
    path = tmp_path / "h200.json"
    write_results(path, [_record()], _prov())
    write_results(path, [_record("k2/s2")], _prov())  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.json"]
    assert load_results(path)["records"][0]["variant"] == "k2/s2"


def test_failed_write_keeps_the_old_file(tmp_path) -> None:
    path = tmp_path / "h200.json"
    write_results(path, [_record()], _prov())
    before = path.read_text()
    with pytest.raises(TypeError):
        write_results(path, [_record() | {"registers": object()}], _prov())  # not JSON-serialisable
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.json"]


@pytest.mark.parametrize("missing", ["gpu", "git_commit", "command", "cuda"])
def test_missing_provenance_key_raises(tmp_path, missing: str) -> None:
    prov = _prov()
    del prov[missing]
    with pytest.raises(ValueError, match=missing):
        write_results(tmp_path / "r.json", [_record()], prov)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("missing", ["variant", "tokens", "skew"])
def test_record_without_identity_raises(tmp_path, missing: str) -> None:
    record = _record()
    del record[missing]
    with pytest.raises(ValueError, match=missing):
        write_results(tmp_path / "r.json", [record], _prov())


def test_load_rejects_other_json(tmp_path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="provenance"):
        load_results(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a results file"):
        load_results(path)


def test_provenance_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(provenance_module, "detect_gpu", lambda: None)
    prov = provenance(command=["python", "chapters/00/run.py", "--skew", "1.2"])
    assert SCHEMA_PROVENANCE_KEYS <= set(prov)
    assert prov["gpu"] == "none"
    assert prov["command"] == "python chapters/00/run.py --skew 1.2"
    assert "numpy" in prov["packages"] and "python" in prov["packages"]
    assert prov["date"][:2] == "20" and "T" in prov["date"]
    assert prov["git_commit"]
    json.dumps(prov)  # must be serialisable as is


def test_results_path_layout() -> None:
    path = results_path("03", "h200")
    assert path.parts[-4:] == ("chapters", "03", "results", "h200.json")


def test_commit_label_is_twelve_digits():
    """Every run prints a recorded commit the same width (show_recorded's title)."""
    full = "2f07a95cdc0ffa8af7b0746105e59eeecf8654c4"
    assert COMMIT_DIGITS == 12
    assert commit_label(full) == full[:12]
    assert commit_label(full + "+dirty") == full[:12] + "+dirty"
    assert commit_label("unknown") == "unknown"


def test_a_short_recorded_commit_is_lengthened_from_git():
    """A results file made from a copy of the tree may carry a short hash ($MOE_GEMM_GIT_COMMIT)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout here")
    assert commit_label(head[:7]) == head[:12]
    assert commit_label("0000000") == "0000000"  # unknown to git: shown as recorded
