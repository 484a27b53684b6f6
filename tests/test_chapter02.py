"""Chapter 02's driver and figure script without a GPU: the no-GPU path of run.py, its tables on
made-up records, the ncu CSV parser, the sanitizer entry point, figures.py with and without a
results file, and the claims site_docs/02-mma-sync.md makes about the recorded results."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.measure import profile
from moe_gemm.measure.results import load_results, write_results
from moe_gemm.model.workloads import Workload

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run02():
    return chapter_module("02")


@pytest.fixture(scope="module")
def figures02():
    return chapter_module("02", "figures")


def _record(variant, tokens, skew, tflops, bm=None, registers=64, smem=27648):
    record = {"variant": variant, "experts": 64, "K": 1024, "N": 2688, "tokens": tokens, "skew": skew,
              "median_ms": 2 * tokens * 1024 * 2688 / (tflops * 1e9), "min_ms": 0.1, "max_ms": 1.0,
              "useful_tflops": tflops, "rel_error": 1e-3}
    if bm is not None:
        from moe_gemm.model.routing import expert_counts
        from moe_gemm.model.tiles import eta, tile_count

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
    import moe_gemm.cuda.gpu

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda: None)
    assert run02.main(["--profile", "--no-peers"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k1 is not run here because there is no NVIDIA GPU on this machine; compiling every "
                          "configuration for sm_90a instead.\n")
    assert "--no-peers and --profile were ignored: nothing is timed or profiled without a GPU." in out
    assert "regs: per thread (ptxas); blocks/SM: the occupancy model's" in out  # the compile report's legend
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
    assert text.splitlines()[-1].startswith("warps/sched.: resident warps per scheduler by the model")


def test_old_gpu_sentence(run02, monkeypatch, capsys):
    from types import SimpleNamespace

    import moe_gemm.cuda.gpu

    gpu = SimpleNamespace(name="Tesla V100", compute_capability=(7, 0))
    assert run02.REQUIRES.why_not(gpu) == (
        "Tesla V100 is sm_70 and k1 needs sm_80 or newer (cp.async, ldmatrix, bf16 mma.sync)")
    assert run02.REQUIRES.why_not(SimpleNamespace(name="NVIDIA A100", compute_capability=(8, 0))) is None
    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda: gpu)
    assert run02.main([]) == 0
    assert capsys.readouterr().out.startswith(
        "k1 is not run here because Tesla V100 is sm_70 and k1 needs sm_80 or newer (cp.async, ldmatrix, bf16 "
        "mma.sync); compiling every configuration for sm_90a instead.\n")


def test_profile_table_puts_the_model_beside_ncu(run02):
    profiles = [{"variant": "k1/bm64", "warps_per_scheduler": 7.5, "cycles_per_issue": 15.0, "issue_active": 0.47,
                 "ipc": 1.9, "instructions": 2.5e8, "issue_model": 0.5}]
    report = [{"variant": "k1/bm64", "blocks_per_sm": 4, "warps_per_block": 8}]
    text = run02.profile_table(profiles, report).text()
    assert "k1/bm64" in text and "0.500" in text and "0.470" in text and "2.00" in text


# ---- ncu's CSV ------------------------------------------------------------------------------------

# ncu --csv --metrics ...: the header, then one row per metric whose first twelve columns repeat the launch
NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
NCU_LAUNCH = ('"0","4242","python3","127.0.0.1","void k1_mma_sync<64, false>(const unsigned short *, '
              'const unsigned short *, unsigned short *, const int4 *, int, int)","1","13","(256, 1, 1)",'
              '"(5376, 1, 1)","0","9.0","Command line profiler metrics"')
NCU_METRICS = [("smsp__warps_active.avg.per_cycle_active", "warp", "7.61"),
               ("smsp__average_warp_latency_per_inst_issued.ratio", "cycle", "15.9"),
               ("smsp__issue_active.avg.per_cycle_active", "", "0.46"),
               ("smsp__inst_executed.sum", "inst", "214,350,000"),
               ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", "n/a")]
NCU_CSV = "".join(f"{line}\n" for line in [
    "==PROF== Connected to process 4242 (/usr/bin/python3)",
    '==PROF== Profiling "k1_mma_sync": 0%....50%....100% - 12 passes',
    NCU_HEADER,
    *(f'{NCU_LAUNCH},"{name}","{unit}","{value}"' for name, unit, value in NCU_METRICS),
    "==PROF== Disconnected from process 4242",
])


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
    from moe_gemm.measure.profile_target import launches_before_profiled

    assert launches_before_profiled(10) == 11  # the checked launch, then ten warm-ups


def test_profile_target_keeps_the_prepared_launch_and_its_output_alive_while_it_launches(monkeypatch, capsys):
    """Every launch the profiler sees writes the output the prepared launch owns: the target keeps the Prepared
    (its output and keep_alive buffers), not only its launch(). Keeping only launch() freed the output before the
    warm-up launches, which then wrote freed memory (an illegal address on the H100, at every k6 rung)."""
    import gc
    import weakref

    import cuda.bindings.driver

    import moe_gemm.cuda.device
    import moe_gemm.measure.check
    import moe_gemm.variants.registry
    from moe_gemm.cuda.variant import Prepared
    from moe_gemm.measure import profile_target

    class Output:  # stands in for the device buffer the launch writes
        pass

    alive = []

    class Fake:
        name = "k1/fake"

        def prepare(self, dev):
            output = Output()
            ref = weakref.ref(output)

            def launch():
                gc.collect()
                alive.append(ref() is not None)

            return Prepared(launch=launch, output=output)

    class Passed:
        passed = True

        def describe(self):
            return "ok"

    monkeypatch.setattr(moe_gemm.variants.registry, "get", lambda name: Fake())
    monkeypatch.setattr(moe_gemm.cuda.device, "DeviceProblem", lambda problem: object())
    monkeypatch.setattr(moe_gemm.cuda.device, "synchronize", lambda: None)
    monkeypatch.setattr(moe_gemm.measure.check, "verify", lambda variant, dev: Passed())
    monkeypatch.setattr(cuda.bindings.driver, "cuProfilerStart", lambda: None)
    monkeypatch.setattr(cuda.bindings.driver, "cuProfilerStop", lambda: None)
    assert profile_target.main(["k1/fake", "256", "0", "--experts", "4", "-K", "64", "-N", "64", "--warmup", "3"]) == 0
    assert alive == [True] * 4  # three warm-ups and the profiled launch
    assert "3 warm-up launches, 1 profiled" in capsys.readouterr().out


def test_sanitize_target_without_a_gpu_exits_0(monkeypatch, capsys):
    import moe_gemm.cuda.gpu
    from moe_gemm.measure import sanitize_target

    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda: None)
    assert sanitize_target.main(["k1"]) == 0
    assert "nothing to sanitize" in capsys.readouterr().err


def test_sanitize_target_refuses_unknown_names():
    from moe_gemm.measure import sanitize_target

    with pytest.raises(ValueError, match="unknown variant"):
        sanitize_target.main(["k1/bm48"])


# ---- figures.py -------------------------------------------------------------------------------------

def test_figures_without_results_write_the_compilers_tables_only(figures02, tmp_path, monkeypatch):
    monkeypatch.setattr(figures02, "recorded", lambda chapter: None)
    assert figures02.main(["--out", str(tmp_path)]) == 0
    out = tmp_path / "02"
    assert not list(out.glob("*.png"))
    assert {p.stem for p in out.glob("*.md")} == {"compile_report", "register_arithmetic", "main_loop", "layout_a",
                                                  "layout_b", "layout_c", "ldmatrix_addresses"}
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
    monkeypatch.setattr(figures02, "recorded", lambda chapter: load_results(results))
    out_root = tmp_path / "figures"
    (out_root / "02").mkdir(parents=True)
    (out_root / "02" / "stalls.png").write_bytes(b"stale")
    assert figures02.main(["--out", str(out_root)]) == 0
    # No stall reasons in these synthetic profiles: no stall figure, and no stale one left behind.
    assert {p.name for p in (out_root / "02").glob("*.png")} == {"bm_sweep.png", "tile_fill.png", "issue_model.png"}


def test_figures_main_runs_as_the_docs_hook_calls_it(figures02, tmp_path, monkeypatch):
    """The hook calls main() with sys.argv = [argv0]: no arguments at all."""
    import moe_gemm.site.style

    monkeypatch.setattr(sys, "argv", ["figures"])
    monkeypatch.setattr(moe_gemm.site.style, "FIGURE_ROOT", tmp_path)
    monkeypatch.setattr(figures02, "recorded", lambda chapter: None)
    # FIGURE_ROOT is bound as the --out default when figures_main builds the parser
    assert figures02.main() == 0
    assert (tmp_path / "02" / "compile_report.md").is_file()


def test_sanitizer_command_runs_this_module_under_the_tool():
    from moe_gemm.measure.sanitize_target import sanitizer_command

    command = sanitizer_command("racecheck", ["k1/bm64", "k1"], sanitizer="/opt/cuda/bin/compute-sanitizer")
    assert command[:5] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "1"]
    assert command[-4:] == ["-m", "moe_gemm.measure.sanitize_target", "k1/bm64", "k1"]


# ---- the main-loop parser ----------------------------------------------------------------------------

SASS_LOOP = """
        /*0100*/                   IMAD R1, R2, R3, RZ ;
        /*0110*/                   DEPBAR.LE SB0, 0x0 ;
        /*0120*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0130*/                   LDSM.16.M88.4 R4, [R5] ;
        /*0140*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0150*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0160*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0170*/              @!P0 BRA 0x110 ;
        /*0180*/                   EXIT ;
"""


def test_main_loop_is_the_backward_branch_span_with_the_barriers(figures02):
    ops, slices = figures02.main_loop(SASS_LOOP)
    assert ops[0] == "DEPBAR.LE" and ops[-1] == "BRA" and slices == 2
    table = figures02.main_loop_markdown({"k1/toy": SASS_LOOP})
    assert "| k1/toy | 3.5 | 1 | 0.5 |" in table  # 7 instructions over 2 slices: 2 HMMA, 1 LDSM
    assert figures02.main_loop("/*0000*/ EXIT ;") is None


# ---- the claims the page makes, on the recorded results ----------------------------------------------
#
# site_docs/02-mma-sync.md reasons in prose about chapters/02/results/h200.json. Each test below
# pins one claim of that prose, so that a rerun which flips it fails here and the prose gets
# rewritten, rather than the page silently contradicting its own tables.

RESULTS = REPO / "chapters/02/results/h200.json"
PAGE = REPO / "site_docs/02-mma-sync.md"
PEER = "peer/torch_grouped_mm"
SWEEP = ("k1/bm32", "k1/bm32-s3", "k1/bm64", "k1/bm64-s3", "k1/bm64-fragdb", "k1/bm128", "k1/bm128-s3")
BALANCED, SKEWED, SMALL = Workload(16384, 0.0), Workload(16384, 1.2), Workload(2048, 0.0)
TARGET = 250.0


class Recorded:
    """Look-ups into chapter 02's results file and the issue model's terms, for the claims below."""

    def __init__(self, data):
        self.data = data
        self.profiles = {p["variant"]: p for p in data["profile"]}

    def record(self, variant, workload=BALANCED):
        from moe_gemm.measure.results import find_measurement

        found = find_measurement(self.data["records"], variant, workload)
        assert found is not None, (variant, workload)
        return found

    def tflops(self, variant, workload=BALANCED):
        return self.record(variant, workload)["useful_tflops"]

    def ceiling(self, name):
        from moe_gemm.measure.ceilings import ceiling_value

        return ceiling_value(self.data["ceilings"], name)

    def per_mma(self, variant):
        r = self.record(variant)
        return self.profiles[variant]["instructions"] / (r["tiles"] * r["bm"] * r["bn"] * r["K"] * 2 / 4096)

    def counter_time(self, variant):
        p = self.profiles[variant]
        return p["instructions"] * p["cycles_per_issue"] / p["warps_per_scheduler"]

    def model_w(self, variant):
        row = next(r for r in self.data["compile_report"] if r["variant"] == variant)
        return row["blocks_per_sm"] * row["warps_per_block"] / 4

    def issue_active(self, variant):
        return self.profiles[variant]["issue_active_pct"] / 100


def _wave_efficiency(tiles, slots):
    return (tiles / slots) / math.ceil(tiles / slots)


@pytest.fixture(scope="module")
def recorded():
    from moe_gemm.measure.results import load_results

    assert RESULTS.is_file(), "chapters/02/results/h200.json is committed with the chapter"
    return Recorded(load_results(RESULTS))


@pytest.fixture(scope="module")
def page():
    return PAGE.read_text()


def _gain(m, new, old):
    """Relative throughput change at 16,384 rows, s = 0."""
    return m.tflops(new) / m.tflops(old) - 1


def test_headline_target_met_by_one_variant_only(recorded, page):
    m = recorded
    assert [v for v in SWEEP if m.tflops(v) >= TARGET] == ["k1/bm128-s3"]
    assert "the target is met, by that variant only" in page
    assert 0.4 <= m.tflops("k1/bm128-s3") / m.tflops(PEER) <= 0.6  # "about half of CUTLASS"
    assert "k1 is still about half of CUTLASS" in page


def test_2048_rows_invert_the_order_and_bm32_s3_is_fastest(recorded, page):
    m = recorded
    assert m.tflops("k1/bm32", SMALL) > m.tflops("k1/bm128", SMALL)
    assert max(SWEEP, key=lambda v: m.tflops(v, SMALL)) == "k1/bm32-s3"
    assert m.tflops("k1/bm32-s3", SMALL) > m.tflops(PEER, SMALL)
    assert "The fastest k1 there is\n`k1/bm32-s3`" in page


def test_tensor_pipe_is_mostly_idle_and_tracks_the_mma_sync_ceiling(recorded):
    m = recorded
    mma = m.ceiling("mma_sync")
    for variant, p in m.profiles.items():
        assert p["tensor_pipe_pct"] < 50, variant  # "under half for all of them"
        assert abs(p["tensor_pipe_pct"] - 100 * m.tflops(variant) / mma) < 3, variant  # "a couple of points"


def test_bm128_beats_bm64_beats_bm32_at_16k_for_both_depths(recorded, page):
    m = recorded
    for suffix in ("", "-s3"):  # prediction 1 (BM = 64 fastest) did not hold
        assert m.tflops(f"k1/bm128{suffix}") > m.tflops(f"k1/bm64{suffix}") > m.tflops(f"k1/bm32{suffix}")
    assert "Prediction 1, $B_M = 64$ fastest, did not hold: $B_M = 128$ is fastest at either depth." in page


def test_bm128_halves_l_and_long_scoreboard_is_most_of_the_difference(recorded):
    p64, p128 = recorded.profiles["k1/bm64"], recorded.profiles["k1/bm128"]
    assert 0.45 <= p128["cycles_per_issue"] / p64["cycles_per_issue"] <= 0.65  # "about half the L"
    drop = p64["cycles_per_issue"] - p128["cycles_per_issue"]
    assert 0.55 <= (p64["stall_long_scoreboard"] - p128["stall_long_scoreboard"]) / drop <= 0.8  # "two thirds"
    assert recorded.per_mma("k1/bm128") < recorded.per_mma("k1/bm64")  # "BM = 128 wins on I"


def test_eta_estimate_is_pessimistic_and_more_so_with_more_padding(recorded, page):
    m = recorded
    ratio = {v: m.tflops(v, SKEWED) / (m.tflops(v) * m.record(v, SKEWED)["eta"] / m.record(v)["eta"]) for v in SWEEP}
    assert min(ratio.values()) >= 1.0  # "the measurement beats the estimate for every variant"
    assert min(ratio, key=ratio.get) == "k1/bm32-s3" and max(ratio, key=ratio.get) == "k1/bm128"
    assert "for `k1/bm32-s3` up to" in page
    assert ratio["k1/bm32"] < ratio["k1/bm64"] < ratio["k1/bm128"]
    for v in ("k1/bm64", "k1/bm128", "k1/bm64-s3", "k1/bm128-s3"):  # "the skewed grid even runs faster"
        assert m.record(v, SKEWED)["scheduled_tflops"] > m.record(v)["scheduled_tflops"], v


def test_the_tail_of_the_grid_does_not_explain_the_skew_gap(recorded):
    m = recorded
    tail = {}
    for v in ("k1/bm64", "k1/bm128"):
        slots = m.data["provenance"]["sm_count"] * m.record(v)["blocks_per_sm"]
        skewed, balanced = m.record(v, SKEWED)["tiles"], m.record(v)["tiles"]
        tail[v] = _wave_efficiency(skewed, slots) / _wave_efficiency(balanced, slots) - 1
    skewed = m.record("k1/bm128", SKEWED)
    excess = skewed["useful_tflops"] / (m.tflops("k1/bm128") * skewed["eta"]) - 1
    assert tail["k1/bm128"] < tail["k1/bm64"]  # "moves the wrong way across BM"
    assert tail["k1/bm128"] < excess / 10  # "an order of magnitude too small at BM = 128"
    small, base = m.record("k1/bm128", SMALL), m.record("k1/bm128")
    assert small["scheduled_tflops"] > base["scheduled_tflops"]  # partial tiles cost less than full ones


def test_tile_fill_at_2048_rows(recorded):
    m, w = recorded, SMALL
    assert m.tflops("k1/bm32", w) > m.tflops("k1/bm128", w)  # prediction 3
    assert m.tflops("k1/bm32-s3", w) > m.tflops("k1/bm128-s3", w)
    assert m.tflops("k1/bm64", w) >= 0.97 * m.tflops("k1/bm32", w)  # "BM = 64 ... runs no slower"
    ratio = {v: m.tflops(v, w) / (m.tflops(v) * m.record(v, w)["eta"] / m.record(v)["eta"])
             for v in ("k1/bm32", "k1/bm64", "k1/bm128")}
    assert ratio["k1/bm32"] < 1 and ratio["k1/bm64"] < 1  # the estimate overshoots
    assert 1.0 < ratio["k1/bm128"] < 1.15  # "lands close, slightly under"
    for bm in (32, 64, 128):  # "faster than the two-stage ring at every BM"
        assert m.tflops(f"k1/bm{bm}-s3", w) > m.tflops(f"k1/bm{bm}", w), bm


def test_issue_model_w_and_the_w_over_l_identity(recorded):
    m = recorded
    for v, p in m.profiles.items():
        assert 0.95 <= p["warps_per_scheduler"] / m.model_w(v) <= 1.0, v  # "all but a few percent"
        assert abs(p["issue_model"] - m.issue_active(v)) < 1e-3, v  # "within rounding"


def test_the_busiest_scheduler_is_not_the_fastest_kernel(recorded):
    m = recorded
    by_issue = sorted(m.profiles, key=m.issue_active)
    by_speed = sorted(SWEEP, key=lambda v: -m.tflops(v))
    assert by_issue[-1] == "k1/bm64-fragdb" and m.tflops("k1/bm64-fragdb") < m.tflops("k1/bm64")
    assert set(by_issue[:2]) == set(by_speed[:2]) == {"k1/bm128", "k1/bm128-s3"}
    i32, i128 = m.profiles["k1/bm32"]["instructions"], m.profiles["k1/bm128"]["instructions"]
    assert 1.8 <= i32 / i128 <= 2.3  # "about twice the instructions"
    assert max(m.profiles, key=lambda v: m.profiles[v]["instructions"]).startswith("k1/bm32")


def test_stages_bm64_long_scoreboard_fell_mio_rose_gain_a_few_percent(recorded):
    m = recorded
    p2, p3 = m.profiles["k1/bm64"], m.profiles["k1/bm64-s3"]
    stalls = {k: v for k, v in p2.items() if k.startswith("stall_") and k != "stall_selected"}
    top, second = sorted(stalls.values(), reverse=True)[:2]
    assert stalls["stall_long_scoreboard"] == top and top > 2 * second  # "the largest stall by far"
    assert p3["stall_long_scoreboard"] < 0.4 * p2["stall_long_scoreboard"]  # "fell to a third"
    assert p3["stall_mio_throttle"] > p2["stall_mio_throttle"]
    assert p3["stall_short_scoreboard"] > p2["stall_short_scoreboard"]
    gain = _gain(m, "k1/bm64-s3", "k1/bm64")
    assert 0 < gain < 0.06  # "a few percent"
    assert 1 - p3["cycles_per_issue"] / p2["cycles_per_issue"] > gain  # "L fell by more than the gain"
    assert p3["instructions"] / p2["instructions"] > 1.05  # "the instruction count rose"


def test_stages_bm128_beat_the_prediction_mostly_through_instructions(recorded, page):
    m = recorded
    p2, p3 = m.profiles["k1/bm128"], m.profiles["k1/bm128-s3"]
    gain = _gain(m, "k1/bm128-s3", "k1/bm128")
    assert "should run into the MIO limit later and gain more: $+4$ to $+8$ %" in page
    assert gain * 100 > 8 and "That is above the predicted $+4$ to $+8$ %" in page
    assert p2["stall_long_scoreboard"] / p2["cycles_per_issue"] < 0.35  # "already a small part of L"
    assert 0.4 <= p3["stall_long_scoreboard"] / p2["stall_long_scoreboard"] <= 0.6  # "removed about half"
    assert p3["stall_mio_throttle"] > p2["stall_mio_throttle"]
    l_gain = p2["cycles_per_issue"] / p3["cycles_per_issue"] - 1
    i_gain = p2["instructions"] / p3["instructions"] - 1
    assert 0 < l_gain < 0.05 and i_gain > 0.04 and i_gain > 1.5 * l_gain  # "two thirds ... one third"
    model = m.counter_time("k1/bm128") / m.counter_time("k1/bm128-s3") - 1
    profiled = p2["duration_ns"] / p3["duration_ns"] - 1
    assert abs(model - profiled) < 0.01  # "explain ... ncu's single profiled launch almost exactly"
    assert 0 < gain - model < 0.04  # "a couple of points of the timed median unexplained"


def test_stages_bm32_like_bm64(recorded):
    m = recorded
    p2, p3 = m.profiles["k1/bm32"], m.profiles["k1/bm32-s3"]
    assert p3["stall_long_scoreboard"] < 0.5 * p2["stall_long_scoreboard"]
    assert p3["instructions"] > p2["instructions"] and p3["stall_barrier"] > p2["stall_barrier"]
    assert 0 < _gain(m, "k1/bm32-s3", "k1/bm32") < 0.08


def test_fragdb_cleared_the_l_bar_and_lost_on_instructions(recorded):
    m = recorded
    p, f = m.profiles["k1/bm64"], m.profiles["k1/bm64-fragdb"]
    w_drop = 1 - f["warps_per_scheduler"] / p["warps_per_scheduler"]
    l_drop = 1 - f["cycles_per_issue"] / p["cycles_per_issue"]
    assert 5.5 <= f["warps_per_scheduler"] <= 6.0  # "about six warps per scheduler"
    assert l_drop > w_drop and f["issue_model"] > p["issue_model"]  # "more than needed"
    assert f["instructions"] / p["instructions"] - 1 > f["issue_model"] / p["issue_model"] - 1 > 0
    for reason in ("stall_short_scoreboard", "stall_barrier", "stall_long_scoreboard"):
        assert f[reason] < p[reason], reason
    assert m.tflops("k1/bm64-fragdb") < m.tflops("k1/bm64")
    assert m.tflops("k1/bm64-fragdb", SMALL) < m.tflops("k1/bm64", SMALL)


def test_the_recorded_results_draw_every_figure(figures02, recorded, tmp_path):
    written = figures02.measured_outputs(tmp_path, recorded.data)
    assert {p.name for p in written} == {"bm_sweep.png", "tile_fill.png", "issue_model.png", "stalls.png"}


def test_main_loop_sass_claims(figures02):
    """The compiler side of the page: integer and address work outnumbers HMMA in every plain main
    loop, and the third stage lengthens the loop at BM = 32 and 64 and shortens it at BM = 128."""
    from moe_gemm.variants.k1 import K1MmaSync

    per_slice = {}
    for bm in (32, 64, 128):
        for stages in (2, 3):
            kinds = figures02.main_loop_kinds(K1MmaSync(bm, False, stages).compile("sm_90a").sass())
            assert kinds["HMMA"] == bm // 32 * 4 * 2  # (BM/32) x 4 n8 tiles x 2 k16 steps per slice
            assert kinds["integer, address, other"] > kinds["HMMA"], (bm, stages)
            per_slice[bm, stages] = kinds["total"]
    assert per_slice[32, 3] > per_slice[32, 2] and per_slice[64, 3] > per_slice[64, 2]
    assert per_slice[128, 3] < per_slice[128, 2]
