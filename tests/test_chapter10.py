"""Chapter 10 without a GPU: the run falls back to its compile report, its tables and targets follow from the
records, and the page's sentences hold on the recorded H200 run (each of these can fail when a new run changes
what the page says)."""

from __future__ import annotations

import pytest

from moe_gemm.chapter import Workload, chapter_module, recorded
from moe_gemm.model.problem import BF16_OPERANDS, FP8_BLOCKWISE, FP8_ROWWISE

RUN = chapter_module("10")
DATA = recorded("10")
recorded_only = pytest.mark.skipif(DATA is None, reason="no recorded chapter 10 results")


def test_without_a_gpu_it_prints_the_compile_report_and_exits_0(capsys):
    assert RUN.run_without_gpu(RUN.parse_args([]), "there is no NVIDIA GPU on this machine") == 0
    out = capsys.readouterr().out
    assert "k8 is not run here" in out and "k8/blockwise-bm128" in out and "QGMMA" in out


def synthetic_records() -> list[dict]:
    """Every variant at a grid cell and a model projection, in its format, with made-up throughputs."""
    from moe_gemm.measure.check import workload_fields
    from moe_gemm.model.problem import make_problem

    records = []
    speeds = {FP8_BLOCKWISE: {n: 900.0 for n in RUN.BLOCKWISE},
              FP8_ROWWISE: {**{n: 800.0 for n in RUN.ROWWISE_PROMOTED + RUN.ROWWISE_FAST}, RUN.TORCH: 500.0,
                            RUN.TORCH_FAST: 700.0},
              BF16_OPERANDS: {RUN.K6: 600.0}}
    for part, cell in (("grid", Workload(4096, 0.0)), ("models", next(iter(RUN.MODELS.values())))):
        for fmt, names in speeds.items():
            fields = workload_fields(make_problem(cell.experts, 8, 16, 8, fmt=fmt))
            fields.update(tokens=cell.tokens, skew=cell.skew, K=cell.K, N=cell.N, experts=cell.experts)
            records += [{"variant": name, **fields, "useful_tflops": value, "part": part}
                        for name, value in names.items()]
    return records


def test_the_ratios_set_each_kernel_against_the_same_cell_in_its_own_format():
    records = synthetic_records()
    cell = Workload(4096, 0.0)
    assert RUN.cells_of(records, "grid") == [cell]
    assert RUN.ratio(records, (RUN.BLOCKWISE, FP8_BLOCKWISE), ((RUN.K6,), BF16_OPERANDS), cell) == 1.5
    assert RUN.ratio(records, (RUN.ROWWISE_PROMOTED, FP8_ROWWISE), ((RUN.TORCH,), FP8_ROWWISE), cell) == 1.6
    fast = next(t for t in RUN.target_rows(records) if "use_fast_accum=True" in t["target"])
    assert fast["value"] == pytest.approx(800 / 700) and fast["met"]
    text = RUN.cell_table(records, "grid").text()
    assert "1.50" in text and "1.60" in text


def test_the_targets_name_the_layer_accuracy_and_quantizers_when_measured():
    accuracy = [{"variant": "k8/blockwise-bm128", "K": 7168, "rel_error": 1e-4},
                {"variant": "k8/rowwise-fast-bm128", "K": 7168, "rel_error": 1e-2}]
    quantize = [{"kernel": "quantize_1x128", "shape": "[1, 2]", "of_copy": 0.7}]
    layer = [{"variant": "layer/ours", "hidden": 4096, "experts": 8, "tokens": 32768, "median_ms": 3.0},
             {"variant": "layer/fp8", "hidden": 4096, "experts": 8, "tokens": 32768, "median_ms": 2.0}]
    rows = RUN.target_rows([], accuracy, quantize, layer)
    worst_error = next(r for r in rows if "relative error" in r["target"])
    assert worst_error["value"] == 1e-4 and worst_error["met"]  # the fast-accumulation rung is not held to it
    assert not next(r for r in rows if "quantizers" in r["target"])["met"]
    assert next(r for r in rows if "FP8 layer" in r["target"])["value"] == 1.5


def swiglu_rows() -> list[dict]:
    """The swiglu part's rows at two sizes, made up: the e4m3 epilogue 0.1 and 0.6 of a quantize pass over the bf16
    one."""
    return [{"hidden": 2048, "experts": 128, "tokens": 32768, "gemm_ms": 1.6, "pass_ms": 0.3, "swiglu_ms": 1.5,
             "fused_ms": 1.52, "quantize_ms": 0.2},
            {"hidden": 7168, "experts": 256, "tokens": 4096, "gemm_ms": 2.0, "pass_ms": 0.2, "swiglu_ms": 2.0,
             "fused_ms": 2.06, "quantize_ms": 0.1}]


def test_the_swiglu_epilogue_is_held_to_half_a_quantize_pass_at_its_worst_size():
    rows = RUN.target_rows([], swiglu=swiglu_rows())
    (target,) = [r for r in rows if "SwiGLU epilogue" in r["target"]]
    assert target["value"] == pytest.approx(0.6) and not target["met"] and target["at_most"]
    assert "DeepSeek-V3" in target["target"] and "4,096 tokens" in target["target"]
    assert RUN.target_rows([], swiglu=swiglu_rows()[:1])[0]["met"]
    text = RUN.swiglu_table(swiglu_rows()).text()
    assert "Qwen3-30B-A3B" in text and "1.25" in text and "0.10" in text  # (1.6 + 0.3) / 1.52; 0.02 / 0.2


@recorded_only
def test_the_recorded_targets_follow_from_the_recorded_records():
    assert RUN.target_rows(DATA["records"], DATA.get("accuracy", []), DATA.get("quantize", []),
                           DATA.get("layer", []), DATA.get("swiglu", [])) == DATA["targets"]


@recorded_only
def test_every_cell_was_measured_in_every_format():
    for part in ("grid", "models"):
        for cell in RUN.cells_of(DATA["records"], part):
            for names, fmt in ((RUN.BLOCKWISE, FP8_BLOCKWISE), (RUN.ROWWISE_PROMOTED, FP8_ROWWISE),
                               ((RUN.K6,), BF16_OPERANDS)):
                assert RUN.tflops(DATA["records"], names, fmt, cell) is not None, (part, cell, fmt)


def test_the_profile_runs_each_blockwise_rung_that_has_run_on_e4m3_operands(monkeypatch):
    """--profile: ncu's target program is asked for the blockwise format at 65,536 balanced rows of the seed shape,
    and a record carries its format, so the table labels it as what it is."""
    from moe_gemm.measure import profile
    from moe_gemm.variants.k8.config import NOT_YET_RUN

    ((cell, names),) = RUN.PROFILED.items()
    assert cell.fmt == FP8_BLOCKWISE and (cell.tokens, cell.skew) == (65536, 0.0)
    assert names == RUN.BLOCKWISE and not set(names) & NOT_YET_RUN
    targets = []

    def ncu(target, metrics, kernel_regex, skip):
        targets.append(target)
        return 0, "report", ""

    monkeypatch.setattr(profile, "_run_ncu", ncu)
    monkeypatch.setattr(profile, "parse_ncu_csv", lambda report, metrics: {key: 1.5 for key in profile.ESSENTIAL})
    rows = RUN.profile_rows()
    assert [r["variant"] for r in rows] == list(names)
    assert all(t[t.index("--format") + 1] == "e4m3-blockwise" and "65536" in t for t in targets)
    assert all(r["format"] == "e4m3-blockwise" for r in rows)
    text = RUN.profile_table([{**rows[0], "gmma_pipe_pct": 71.5, "duration_ns": 2.5e6}]).text()
    assert rows[0]["variant"] in text and "71.5" in text and "2500.0" in text
