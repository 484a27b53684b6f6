"""Chapter 08 without a GPU: the run exits 0 and says why; its tables and targets from records."""

from __future__ import annotations

from pathlib import Path

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


def layer_ms(layer, way, key):
    shape = RUN.LAYERS[key]
    return {r["tokens"]: r["median_ms"] for r in layer if r["variant"] == way and r["hidden"] == shape.hidden}


def test_the_pages_claims_hold():
    """What the page says in words. At the Qwen3-like size ours beats the torch layer at every token count
    by 1.19-1.24x and the quack layer up to 4,096 tokens, not at 32,768; router, permutation and combine
    are about 40% of it from 4,096 tokens on. At the Mixtral- and DeepSeek-V3-like sizes ours is behind
    the quack layer from 4,096 tokens on, and the torch layer from 4,096 (Mixtral) and at 32,768 (DeepSeek). quack ran its fused activation everywhere, within 1e-4 of ours. The fused
    epilogue costs at most 0.4 of a SwiGLU pass and is faster than GEMM 1 alone at the two large sizes.
    Graph replays at the small scoreboard cells and eager launches at the large ones; the compiled
    layer gives the same output."""
    data = recorded_or_skip()
    layer = [r for r in data["records"] if r.get("part") == "layer"]
    ours, torch_way, quack = (layer_ms(layer, way, "qwen3") for way in RUN.WAYS[:3])
    assert sorted(ours) == [512, 4096, 32768]
    assert all(1.19 <= torch_way[t] / ours[t] < 1.25 for t in ours)
    assert quack[512] > ours[512] and quack[4096] > ours[4096] and quack[32768] < ours[32768]
    for s in data["steps"]:
        if s["hidden"] == RUN.LAYERS["qwen3"].hidden and s["tokens"] >= 4096:
            shared = sum(s[f"{step}_ms"] for step in ("router", "permutation", "combine"))
            assert 0.35 <= shared / sum(s[f"{step}_ms"] for step in RUN.STEPS) <= 0.45
    for key, behind_torch in (("mixtral", (4096, 32768)), ("deepseek", (32768,))):
        ours, torch_way, quack = (layer_ms(layer, way, key) for way in RUN.WAYS[:3])
        assert all(quack[t] < ours[t] for t in (4096, 32768)), key
        assert [t for t in (4096, 32768) if torch_way[t] < ours[t]] == list(behind_torch), key
    mixtral_ours, mixtral_hf = (layer_ms(layer, way, "mixtral") for way in ("layer/ours", "layer/transformers"))
    assert mixtral_hf[32768] < mixtral_ours[32768]  # the page: even transformers' block is faster there
    quack_records = [r for r in layer if r["variant"] == "layer/quack"]
    assert len(quack_records) == 9 and {r["quack_gemm1"] for r in quack_records} == {"gemm_act with its fused SwiGLU"}
    assert max(r["rel_error_vs_ours"] for r in quack_records) <= 1.5e-4
    assert max(r["rel_error_vs_ours"] for r in layer if r["variant"] == "layer/transformers") < 1e-2
    extras = {(f["hidden"], f["tokens"]): (f["fused_ms"] - f["gemm1_ms"]) / f["swiglu_ms"] for f in data["fused_epilogue"]}
    assert len(extras) == 9 and max(extras.values()) <= RUN.TARGET_FUSED_SHARE
    assert all(v < 0 for (hidden, _), v in extras.items() if hidden in (4096, 7168))
    timed = {r["timed"] for r in data["scoreboard_rows"] if r["label"].startswith(("512 ", "2,048 "))}
    assert timed == {"graph replays"}
    assert {r["timed"] for r in data["scoreboard_rows"] if r["label"].startswith("65,536")} == {"eager"}
    assert data["compile"]["same_output"] and data["host_probe"]["host_ms_per_call"] > 0
    assert set(data["part_runs"]) == {"layer-qwen3", "layer-mixtral", "layer-deepseek", "scoreboard-small",
                                      "scoreboard-large"}


def test_the_combine_prediction_reads_what_the_page_says():
    """Before and after the gather + batched GEMM combine, at the Qwen3-like size: the layer 1.6x faster at
    4,096 tokens and 1.9x at 32,768 (the prediction, about 2x, held); the combine 4x faster but above the
    1 ms predicted at 32,768 tokens."""
    data = recorded_or_skip()
    layer = [r for r in data["records"] if r.get("part") == "layer"]
    now = layer_ms(layer, "layer/ours", "qwen3")
    before = {b["tokens"]: b for b in data["layer_before_gather_combine"]}
    assert round(before[4096]["ours_ms"] / now[4096], 1) == 1.6 and round(before[32768]["ours_ms"] / now[32768], 1) == 1.9
    combine = {s["tokens"]: s["combine_ms"] for s in data["steps"] if s["hidden"] == 2048}
    assert round(before[32768]["combine_ms"] / combine[32768]) == 4 and combine[32768] > 1.0


def test_the_untuned_default_is_slower_where_the_page_says():
    """The page's reason for the large layers: at chapter 07's Mixtral-sized projection k6/auto's own
    tuning timed the op's default configuration well behind its choice."""
    from moe_gemm.chapter import recorded
    from moe_gemm.model.workloads import Workload

    ch07 = chapter_module("07")
    data = recorded("07")
    if data is None:
        pytest.skip("no recorded results")
    auto = ch07.find(ch07.of_part(data["records"], "models"), ch07.AUTO, Workload(32768, 0.4, 8, 4096, 14336))
    default = "k6/pingpong-bn192"  # the op's DEFAULT_CONFIG (read from its source: the op module needs torch)
    assert f'DEFAULT_CONFIG = "{default}"' in (Path(__file__).resolve().parents[1] / "python/moe_gemm/torch/ops.py").read_text()
    assert auto["candidate_ms"][default] / auto["candidate_ms"][auto["choice"]] > 1.3


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
    # scoreboard records stay until their group is measured again (run_on_gpu replaces them group by group)
    assert [r["tokens"] for r in records if r["part"] == "scoreboard"] == [512, 65536]
    assert len([r for r in records if r["part"] == "layer"]) == 3


def test_the_runs_section_names_each_part_once():
    from moe_gemm.measure.results import part_runs

    earlier = {"layer-qwen3": {"commit": "a"}, "scoreboard-small": {"commit": "b"}, "scoreboard-large": {"commit": "c"}}
    now = {"git_commit": "d", "date": "2026-12-02T00:00:00+00:00", "command": "run.py"}
    args = RUN.parse_args(["--parts", "scoreboard", "--rows", "512"])
    runs = part_runs(earlier, RUN.measured_parts(args, [], ["512"]), now)
    assert set(runs) == {"layer-qwen3", "scoreboard"} and runs["scoreboard"]["commit"] == "d"
    assert "rows 512" in runs["scoreboard"]["measured"] and runs["layer-qwen3"]["commit"] == "a"
    args = RUN.parse_args(["--parts", "layer", "--layers", "qwen3", "mixtral"])
    runs = part_runs(runs, RUN.measured_parts(args, ["qwen3", "mixtral"], []), now)
    assert set(runs) == {"layer-qwen3", "layer-mixtral", "scoreboard"} and runs["layer-qwen3"]["commit"] == "d"


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
    assert data["part_runs"]["layer-qwen3"]["measured"] == "the Qwen3-30B-A3B-like layer at 4,096 tokens, four ways"
    assert set(data["part_runs"]) == {"layer-qwen3", "layer-mixtral"}


def test_the_scoreboard_saves_after_each_group_and_a_stopped_run_keeps_the_rest(tmp_path, monkeypatch):
    """run_on_gpu's scoreboard with the GPU work replaced: a run stopped in its second group leaves the
    first group's new records, the older records of the groups it did not reach, and a part_runs entry
    naming only the finished group."""
    import moe_gemm.measure.results as results
    import moe_gemm.variants.peer.torch as peer_torch
    from moe_gemm.cuda.gpu import GpuInfo

    monkeypatch.setattr(results, "CHAPTERS_DIR", tmp_path)
    monkeypatch.setattr(peer_torch, "torch_available", lambda: True)
    monkeypatch.setattr(RUN, "host_probe", lambda: {"tokens": 4096, "host_ms_per_call": 0.1, "eager_ms": 0.1,
                                                    "graph_ms": 0.1})
    run_number = [0]

    def scoreboard(cells, timing, with_quack):
        if run_number[0] == 1 and cells[0].tokens == 2048:
            raise KeyboardInterrupt  # the time limit, in the second run's second group
        return [{"variant": RUN.OP, "tokens": c.tokens, "skew": c.skew, "experts": c.experts, "K": c.K, "N": c.N,
                 "median_ms": 1.0, "useful_tflops": 100.0 + run_number[0]} for c in cells]

    monkeypatch.setattr(RUN, "scoreboard", scoreboard)
    gpu = GpuInfo(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, driver_version=13000)
    args = RUN.parse_args(["--parts", "scoreboard", "--rows", "512", "2048"])
    assert RUN.run_on_gpu(args, gpu) == 0
    run_number[0] = 1
    with pytest.raises(KeyboardInterrupt):
        RUN.run_on_gpu(args, gpu)
    data = results.recorded("08", gpu.slug)
    by_rows = {}
    for r in data["records"]:
        by_rows.setdefault(r["tokens"] if r["experts"] == 64 else "models", set()).add(r["useful_tflops"])
    assert by_rows == {512: {101.0}, 2048: {100.0}, "models": {100.0}}
    assert data["part_runs"]["scoreboard"]["measured"] == "scoreboard rows 512"
