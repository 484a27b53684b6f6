"""Chapter 08 without a GPU: the run exits 0 and says why; its tables and targets from records."""

from __future__ import annotations

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
