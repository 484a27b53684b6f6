"""Chapter 08 without a GPU: the run exits 0 and says why; its tables and targets from records."""

from __future__ import annotations

import pytest

from moe_gemm.chapter import chapter_module

RUN = chapter_module("08")


def record(way, ms, tokens=4096):
    return {"variant": way, **RUN.LAYERS["qwen3"].fields(tokens), "median_ms": ms}


def test_without_a_gpu_it_exits_zero(capsys, monkeypatch):
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: None)
    assert RUN.main([]) == 0
    assert "not run here" in capsys.readouterr().out


def test_targets_compare_each_way_with_ours_at_4096_tokens_and_more():
    records = [record("layer/ours", 1.0), record("layer/torch_grouped_mm", 1.3), record("layer/quack", 0.9),
               record("layer/ours", 1.0, 512), record("layer/quack", 0.1, 512)]
    fused = [{**RUN.LAYERS["qwen3"].fields(4096), "fused_ms": 1.1, "gemm1_ms": 1.0, "swiglu_ms": 0.5}]
    rows = {r["target"].split(",")[0]: r for r in RUN.target_rows(records, fused)}
    assert rows["ours over layer/torch_grouped_mm"]["met"] and rows["ours over layer/torch_grouped_mm"]["value"] == 1.3
    assert not rows["ours over layer/quack"]["met"]  # 0.9: the 512-token record is not a target cell
    fused_row = next(r for r in rows.values() if r["target"].startswith("fused"))
    assert abs(fused_row["value"] - 0.2) < 1e-9 and fused_row["met"]


def test_the_layer_table_shows_ratios_to_ours():
    text = RUN.layer_table([record("layer/ours", 2.0), record("layer/torch_grouped_mm", 3.0)]).text()
    assert "1.50" in text and "H=2048 I=768 E=128 k=8" in text


def recorded_or_skip():
    from moe_gemm.chapter import recorded

    data = recorded("08")
    if data is None:
        pytest.skip("no recorded results")
    return data


def test_recorded_targets_and_scoreboard_rows_match_the_records():
    data = recorded_or_skip()
    layer = [r for r in data["records"] if r.get("part") == "layer"]
    again = RUN.target_rows(layer, data["fused_epilogue"])
    assert [(t["target"], round(t["value"], 6), t["met"]) for t in again] == \
           [(t["target"], round(t["value"], 6), t["met"]) for t in data["targets"]]
    assert RUN.scoreboard_rows(data["records"]) == data["scoreboard_rows"]


def test_the_pages_claims_hold():
    """What the page says in words: the combine is more than half of the layer from 4,096 tokens on; our
    layer is faster than the torch layer at every token count; the fused epilogue costs at most 0.4 of
    a SwiGLU pass; the quack layer records how its GEMM 1 ran; graph replays at the small cells and
    eager launches at the large ones; the compiled layer gives the same output."""
    data = recorded_or_skip()
    for s in data["steps"]:
        total = sum(s[f"{step}_ms"] for step in RUN.STEPS)
        assert (s["combine_ms"] / total > 0.5) == (s["tokens"] >= 4096)
    layer = [r for r in data["records"] if r.get("part") == "layer"]
    ours = {r["tokens"]: r["median_ms"] for r in layer if r["variant"] == "layer/ours"}
    torch_way = {r["tokens"]: r["median_ms"] for r in layer if r["variant"] == "layer/torch_grouped_mm"}
    assert ours and all(torch_way[t] > ours[t] for t in ours)
    extras = [(f["fused_ms"] - f["gemm1_ms"]) / f["swiglu_ms"] for f in data["fused_epilogue"]]
    assert extras and max(extras) <= RUN.TARGET_FUSED_SHARE
    assert all(r.get("quack_gemm1") for r in layer if r["variant"] == "layer/quack")
    timed = {r["timed"] for r in data["scoreboard_rows"] if r["label"].startswith(("512 ", "2,048 "))}
    assert timed == {"graph replays"}
    assert {r["timed"] for r in data["scoreboard_rows"] if r["label"].startswith("65,536")} == {"eager"}
    assert data["compile"]["same_output"] and data["host_probe"]["host_ms_per_call"] > 0
    assert set(data["part_runs"]) == {"layer", "scoreboard-small", "scoreboard-large"}


def test_a_run_keeps_what_it_does_not_re_measure():
    qwen, mixtral = RUN.LAYERS["qwen3"], RUN.LAYERS["mixtral"]
    cell = {"variant": "op/grouped_mm", "part": "scoreboard", "tokens": 512, "skew": 0.0, "experts": 64, "K": 1024,
            "N": 2688}
    big = {**cell, "tokens": 65536}
    earlier = {"records": [{"variant": "layer/ours", "part": "layer", **qwen.fields(4096)},
                           {"variant": "layer/ours", "part": "layer", **mixtral.fields(4096)},
                           {"variant": "layer/ours", "part": "layer", **qwen.fields(512)}, cell, big],
               "steps": [qwen.fields(4096), mixtral.fields(4096)], "fused_epilogue": [qwen.fields(512)]}
    records, steps, fused = RUN.kept_from(earlier, RUN.parse_args(["--parts", "layer", "--layers", "qwen3",
                                                                   "--tokens", "4096"]))
    assert [(r.get("hidden"), r["tokens"]) for r in records] == [(4096, 4096), (2048, 512), (None, 512),
                                                                  (None, 65536)]
    assert [s["hidden"] for s in steps] == [4096] and len(fused) == 1
    records, _, _ = RUN.kept_from(earlier, RUN.parse_args(["--parts", "scoreboard", "--rows", "65536"]))
    assert [r["tokens"] for r in records if r["part"] == "scoreboard"] == [512]
    assert len([r for r in records if r["part"] == "layer"]) == 3


def test_the_runs_section_names_each_part_once():
    from moe_gemm.measure.results import part_runs

    earlier = {"layer": {"commit": "a"}, "scoreboard-small": {"commit": "b"}, "scoreboard-large": {"commit": "c"}}
    now = {"git_commit": "d", "date": "2026-12-02T00:00:00+00:00", "command": "run.py"}
    runs = part_runs(earlier, RUN.measured_parts(RUN.parse_args(["--parts", "scoreboard", "--rows", "512"])), now)
    assert set(runs) == {"layer", "scoreboard"} and runs["scoreboard"]["commit"] == "d"
    assert "rows 512" in runs["scoreboard"]["measured"] and runs["layer"]["commit"] == "a"


def test_a_run_writes_after_each_layer_size_and_keeps_what_it_did_not_measure(tmp_path, monkeypatch):
    """run_on_gpu with the GPU work replaced: the file exists after the first size (a run stopped
    part-way keeps it), and a later run of one size keeps the other's records."""
    import moe_gemm.measure.results as results
    import moe_gemm.variants.peer.torch as peer_torch
    from moe_gemm.cuda.gpu import GpuInfo

    monkeypatch.setattr(results, "CHAPTERS_DIR", tmp_path)
    monkeypatch.setattr(peer_torch, "torch_available", lambda: True)
    monkeypatch.setattr(RUN, "compile_check", lambda: {"fullgraph": True, "rel_error": 0.0, "same_output": True})
    files_seen = []

    def measure_layer(shape, tokens, with_transformers, with_quack):
        files_seen.append(len(list(tmp_path.rglob("*.json"))))
        records = [{"variant": way, **shape.fields(t), "median_ms": ms} for t in tokens
                   for way, ms in (("layer/ours", 1.0), ("layer/torch_grouped_mm", 1.3))]
        steps = [{**shape.fields(t), **{f"{step}_ms": 0.2 for step in RUN.STEPS}} for t in tokens]
        fused = [{**shape.fields(t), "fused_ms": 1.05, "gemm1_ms": 1.0, "swiglu_ms": 0.5, "swiglu_pass_bytes": 3,
                  "fused_saves_bytes": 4} for t in tokens]
        return records, steps, fused

    monkeypatch.setattr(RUN, "measure_layer", measure_layer)
    gpu = GpuInfo(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, driver_version=13000)
    args = ["--parts", "layer", "--tokens", "4096", "--layers"]
    assert RUN.run_on_gpu(RUN.parse_args([*args, "qwen3", "mixtral"]), gpu) == 0
    assert files_seen == [0, 1]
    assert RUN.run_on_gpu(RUN.parse_args([*args, "qwen3"]), gpu) == 0
    data = results.recorded("08", gpu.slug)
    assert sorted(r["hidden"] for r in data["records"]) == [2048, 2048, 4096, 4096]
    assert len(data["steps"]) == 2 and data["targets"][0]["value"] == pytest.approx(1.3)
    assert "layer sizes qwen3 at 4,096 tokens" in data["part_runs"]["layer"]["measured"]
