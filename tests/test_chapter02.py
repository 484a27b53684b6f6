"""Chapter 02's driver and figure script without a GPU: the no-GPU path of run.py, its tables on
made-up records, the ncu CSV parser, the sanitizer entry point, and figures.py with and without a
results file. Every number below is synthetic test data, never written where the site reads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from moe_gemm import profile
from moe_gemm.results import write_results

REPO = Path(__file__).resolve().parents[1]


def _load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run02():
    return _load("chapters/02/run.py", "chapter02_run")


@pytest.fixture(scope="module")
def figures02():
    return _load("chapters/02/figures.py", "chapter02_figures")


def _record(variant, tokens, skew, tflops, bm=None, registers=64, smem=27648):
    record = {"variant": variant, "experts": 64, "K": 1024, "N": 2688, "tokens": tokens, "skew": skew,
              "median_ms": 2 * tokens * 1024 * 2688 / (tflops * 1e9), "min_ms": 0.1, "max_ms": 1.0,
              "useful_tflops": tflops, "rel_error": 1e-3}
    if bm is not None:
        from moe_gemm.routing import expert_counts
        from moe_gemm.tiles import eta, tile_count

        counts = expert_counts(64, tokens, skew)
        record.update({"bm": bm, "bn": 128, "eta": eta(counts, bm), "tiles": tile_count(counts, 2688, bm, 128),
                       "scheduled_tflops": tflops / eta(counts, bm), "registers": registers, "smem_bytes": smem,
                       "spill_bytes": 0, "warps_per_block": 8, "blocks_per_sm": 4})
    return record


SYNTHETIC = [
    _record(name, tokens, skew, value, bm=bm)
    for name, bm in (("k1/bm32", 32), ("k1/bm64", 64), ("k1/bm128", 128), ("k1/bm64-fragdb", 64))
    for tokens, skew, value in ((16384, 0.0, 100.0), (16384, 1.2, 90.0), (2048, 0.0, 50.0))
] + [_record("peer/torch_grouped_mm", tokens, skew, 200.0) for tokens, skew in ((16384, 0.0), (16384, 1.2),
                                                                                  (2048, 0.0))]
PROVENANCE = {"gpu": "synthetic test GPU", "compute_capability": "9.0", "driver": "13.0",
              "cuda": {"nvrtc": "13.0"}, "packages": {}, "git_commit": "0" * 40, "date": "2026-01-01",
              "command": "pytest"}


def test_no_gpu_path_prints_the_compile_report_and_exits_0(run02, monkeypatch, capsys):
    import moe_gemm.gpu

    monkeypatch.setattr(moe_gemm.gpu, "detect_gpu", lambda: None)
    assert run02.main([]) == 0
    out = capsys.readouterr().out
    assert "k1 is not run here: no NVIDIA GPU here" in out
    for name in ("k1/bm32", "k1/bm64", "k1/bm128", "k1/bm64-fragdb", "k1/bm128-fragdb"):
        assert name in out
    assert "HMMA" in out and "LDGSTS" in out and "blocks/SM" in out


def test_model_rows_compare_the_eta_estimate_with_the_measurement(run02):
    rows = {r["variant"]: r for r in run02.model_rows(SYNTHETIC)}
    assert set(rows) == {"k1/bm32", "k1/bm64", "k1/bm128", "k1/bm64-fragdb"}
    bm128 = rows["k1/bm128"]
    assert bm128["skewed_estimate"] == pytest.approx(100.0 * bm128["skewed_eta"])
    assert bm128["small_estimate"] == pytest.approx(25.0)  # eta = 0.25 at 2,048 balanced rows
    assert bm128["blocks_per_sm"] == 4 and bm128["warps_per_scheduler"] == 8
    text = run02.model_table(list(rows.values())).text()
    assert "eta-only est." in text and "k1/bm64-fragdb" in text


def test_profile_table_puts_the_model_beside_ncu(run02):
    profiles = [{"variant": "k1/bm64", "warps_per_scheduler": 7.5, "cycles_per_issue": 15.0, "issue_active": 0.47,
                 "ipc": 1.9, "instructions": 2.5e8, "issue_model": 0.5}]
    report = [{"variant": "k1/bm64", "blocks_per_sm": 4, "warps_per_block": 8}]
    text = run02.profile_table(profiles, report).text()
    assert "k1/bm64" in text and "0.500" in text and "0.470" in text and "2.00" in text


# ---- ncu's CSV ------------------------------------------------------------------------------------

NCU_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3)
==PROF== Profiling "k1_mma_sync": 0%....50%....100% - 12 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)","(5376, 1, 1)","0","9.0","Command line profiler metrics","smsp__warps_active.avg.per_cycle_active","warp","7.61"
"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)","(5376, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warp_latency_per_inst_issued.ratio","cycle","15.9"
"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)","(5376, 1, 1)","0","9.0","Command line profiler metrics","smsp__issue_active.avg.per_cycle_active","","0.46"
"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)","(5376, 1, 1)","0","9.0","Command line profiler metrics","smsp__inst_executed.sum","inst","214,350,000"
"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)","(5376, 1, 1)","0","9.0","Command line profiler metrics","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","%","n/a"
==PROF== Disconnected from process 4242
'''


def test_ncu_csv_is_parsed_into_the_models_quantities():
    values = profile.parse_ncu_csv(NCU_CSV, {**profile.CORE_METRICS, **profile.EXTRA_METRICS})
    assert values["warps_per_scheduler"] == pytest.approx(7.61)
    assert values["cycles_per_issue"] == pytest.approx(15.9)
    assert values["issue_active"] == pytest.approx(0.46)
    assert values["instructions"] == 214_350_000
    assert "tensor_pipe_pct" not in values  # n/a is no number
    assert profile.model_issue(values) == pytest.approx(7.61 / 15.9)


def test_ncu_output_without_a_report_is_an_error():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile.parse_ncu_csv("==PROF== nothing profiled\n", profile.CORE_METRICS)


def test_profile_target_counts_the_launches_before_the_profiled_one():
    from moe_gemm.profile_target import launches_before_profiled

    assert launches_before_profiled(10) == 11  # the checked launch, then ten warm-ups


def test_sanitize_target_without_a_gpu_exits_0(monkeypatch, capsys):
    import moe_gemm.gpu
    from moe_gemm import sanitize_target

    monkeypatch.setattr(moe_gemm.gpu, "detect_gpu", lambda: None)
    assert sanitize_target.main(["k1"]) == 0
    assert "nothing to sanitize" in capsys.readouterr().err


def test_sanitize_target_refuses_unknown_names():
    from moe_gemm import sanitize_target

    with pytest.raises(ValueError, match="unknown variant"):
        sanitize_target.main(["k1/bm48"])


# ---- figures.py -------------------------------------------------------------------------------------

def test_figures_without_results_draw_nothing_and_say_so(figures02, tmp_path, monkeypatch):
    monkeypatch.setattr(figures02, "results_path", lambda chapter, gpu: tmp_path / "absent.json")
    assert figures02.main(["--out", str(tmp_path)]) == 0
    out = tmp_path / "02"
    assert not list(out.glob("*.png"))
    for name in ("bm_sweep_figure", "tile_fill_figure", "issue_model_figure", "measurements", "model",
                 "ceilings", "profile", "provenance"):
        assert "Not measured yet" in (out / f"{name}.md").read_text(), name
    compile_report = (out / "compile_report.md").read_text()
    assert "k1/bm64" in compile_report and "| 0 |" in compile_report  # zero spill bytes
    assert "L0.c0" in (out / "layout_c.md").read_text()


def test_figures_from_a_results_file(figures02, tmp_path, monkeypatch):
    results = tmp_path / "synthetic.json"
    compile_report = [{"variant": v, "blocks_per_sm": 4, "warps_per_block": 8}
                      for v in ("k1/bm32", "k1/bm64", "k1/bm128", "k1/bm64-fragdb")]
    profiles = [{"variant": v, "warps_per_scheduler": 7.0, "cycles_per_issue": 14.0, "issue_active": 0.45,
                 "ipc": 1.8, "instructions": 2e8, "issue_model": 0.5} for v in ("k1/bm32", "k1/bm64")]
    ceilings = [{"variant": "ceiling/copy", "tbps": 4.0}, {"variant": "ceiling/dense_bf16", "tflops": 700.0},
                {"variant": "ceiling/mma_sync", "tflops": 600.0}]
    write_results(results, SYNTHETIC, PROVENANCE, extra={"ceilings": ceilings, "profile": profiles,
                                                        "compile_report": compile_report})
    monkeypatch.setattr(figures02, "results_path", lambda chapter, gpu: results)
    out_root = tmp_path / "figures"
    assert figures02.main(["--out", str(out_root)]) == 0
    out = out_root / "02"
    assert {p.name for p in out.glob("*.png")} == {"bm_sweep.png", "tile_fill.png", "issue_model.png"}
    assert "figures/02/bm_sweep.png" in (out / "bm_sweep_figure.md").read_text()
    measurements = (out / "measurements.md").read_text()
    assert "k1/bm64-fragdb" in measurements and "0.50" in measurements  # 100 / 200 against the peer
    assert "600.0 TFLOP/s" in (out / "ceilings.md").read_text()
    assert "synthetic test GPU" in (out / "provenance.md").read_text()
    assert "0.450" in (out / "profile.md").read_text()


def test_figures_main_runs_as_the_docs_hook_calls_it(figures02, tmp_path, monkeypatch):
    """The hook calls main() with sys.argv = [argv0]: no arguments at all."""
    monkeypatch.setattr(sys, "argv", ["figures"])
    monkeypatch.setattr(figures02, "FIGURE_ROOT", tmp_path)
    monkeypatch.setattr(figures02, "results_path", lambda chapter, gpu: tmp_path / "absent.json")
    # FIGURE_ROOT is bound as the --out default when the parser is built inside main()
    assert figures02.main() == 0


def test_sanitizer_command_runs_this_module_under_the_tool():
    from moe_gemm.sanitize_target import sanitizer_command

    command = sanitizer_command("racecheck", ["k1/bm64", "k1"], sanitizer="/opt/cuda/bin/compute-sanitizer")
    assert command[:5] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "1"]
    assert command[-4:] == ["-m", "moe_gemm.sanitize_target", "k1/bm64", "k1"]
