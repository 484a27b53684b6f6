"""Chapter 01's reading of its own results, without a GPU.

site_docs/01-fp32-baseline.md interprets the recorded H200 run in prose that quotes no numbers;
the numbers come from chapters/01/figures.py (findings.md). The tests below pin each qualitative
claim that prose makes to the recorded results file, so that a rerun which flips a claim (the
skewed run no longer on its eta-only estimate, K = 8192 no longer at the K = 1024 rate, ...) fails
here instead of leaving the page wrong. They also check that findings.md is generated from a
results file, section by section, and that the prediction figures.py prints is the page's.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "chapters" / "01" / "results" / "h200.json"
PAGE = REPO / "site_docs" / "01-fp32-baseline.md"

pytestmark = pytest.mark.skipif(not RESULTS.is_file(), reason="no recorded H200 results for chapter 01")


def _load_figures():
    spec = importlib.util.spec_from_file_location("chapter01_figures_findings", REPO / "chapters/01/figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures():
    return _load_figures()


@pytest.fixture(scope="module")
def data():
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def f(figures, data):
    return figures.findings(data)


# ---- "Where k0 lands" ----------------------------------------------------------------------

def test_every_recorded_check_passed(f):
    assert f["checks"] >= 10 and f["checks_passed"] == f["checks"]
    assert f["exact_checks"] >= 8  # every SPEC edge case, exactly
    assert f["max_check_error"] <= 1e-2


def test_target_met_comfortably(f):
    assert f["target_met"] and f["work"]["balanced"]["useful"] >= 1.25 * 20.0


def test_about_half_of_the_fp32_peak(f):
    """'runs at about half of what the H200's FP32 lanes can do'."""
    assert 0.4 <= f["work"]["balanced"]["of_datasheet"] <= 0.6
    assert 0.4 <= f["ffma_issue"] <= 0.6


def test_issue_share_is_plausible_below_one(f):
    """The schedulers idle on a real share of cycles: the reason for the three bullets."""
    assert 0.5 <= f["issue"] <= 0.85


def test_shared_memory_is_not_the_limit(f):
    """'one LDS.128 per eight FFMAs ... about a quarter of shared memory's one wavefront per cycle'."""
    assert f["lds_per_ffma"] == pytest.approx(1 / 8)
    assert 0.15 <= f["wavefronts_per_cycle"] <= 0.35
    assert f["sass"]["LDL"] == 0 and f["sass"]["STL"] == 0 and f["occupancy"]["local_bytes"] == 0


def test_four_blocks_by_registers_with_headroom_to_64(f):
    """'at 64 per thread ... four blocks still fit': the register headroom the page points at."""
    from moe_gemm.occupancy import residency

    occ = f["occupancy"]
    assert (occ["blocks_per_sm"], occ["limiter"]) == (4, "registers")
    assert occ["registers"] < 64
    assert residency(64, occ["warps_per_block"], occ["smem_bytes"]).blocks == 4


def test_k0_does_more_per_clock_than_the_seed(f):
    assert f["vs_seed_per_clock"] > 1.3


# ---- "The prediction against the measurement" ------------------------------------------------

def test_resources_as_predicted(figures, f):
    occ = f["occupancy"]
    p = figures.PREDICTION
    assert (occ["registers"], occ["blocks_per_sm"], occ["limiter"]) == (p["registers"], p["blocks_per_sm"],
                                                                         p["limiter"])


def test_prediction_low_everywhere_by_about_one_factor_at_16k(f):
    work = f["work"]
    assert all(w["vs_predicted"] > 1.0 for w in work.values())
    at_16k = [work[n]["vs_predicted"] for n in ("balanced", "skewed", "long_k")]
    assert max(at_16k) / min(at_16k) < 1.05  # 'by about the same factor at the three 16,384-row workloads'
    assert work["small"]["vs_predicted"] == max(w["vs_predicted"] for w in work.values())  # 'off the most'


def test_the_ceiling_is_the_larger_part_of_the_miss(f):
    assert f["ceiling_factor"] > f["issue_factor"] > 1.0
    assert f["ceiling_factor"] * f["issue_factor"] == pytest.approx(f["work"]["balanced"]["useful"]
                                                                    / f["predicted_tflops"], rel=1e-6)


def test_peer_ratio_close_only_because_both_sides_were_faster(f):
    assert f["peer_vs_anchor"] > 1.0 and f["work"]["balanced"]["vs_predicted"] > 1.0
    assert 0.8 <= f["work"]["balanced"]["vs_peer"] / 0.05 <= 1.25


def test_prediction_constants_are_the_pages(figures):
    """figures.PREDICTION prints the page's prediction beside the measurement: it must be the page's."""
    text = PAGE.read_text()
    prediction = text[text.index("## Prediction, before measuring"):text.index("## Measured")]
    for tflops in figures.PREDICTION["tflops"].values():
        assert re.search(rf"about {tflops:g}\b", prediction), tflops
    assert f"{figures.PREDICTION['registers']} registers" in prediction
    assert f"{figures.PREDICTION['blocks_per_sm']} blocks per SM" in prediction
    assert f"${figures.PREDICTION['ffma_share']:g} \\times {figures.PREDICTION['ceiling']:g}" in prediction
    assert f"${figures.PREDICTION['issue_fraction']:g} \\times" in prediction


# ---- skew, 2,048 rows, K = 8192 -------------------------------------------------------------

def test_skew_costs_exactly_the_padding(f):
    work = f["work"]
    assert work["skewed"]["useful"] < work["balanced"]["useful"]
    assert work["skewed"]["eta"] == pytest.approx(0.898, abs=1e-3)
    assert abs(f["skew_vs_estimate"] - 1.0) < 0.02  # 'lands on the estimate'
    assert abs(f["skew_scheduled_ratio"] - 1.0) < 0.02  # 'the scheduled rate is the same at both skews'
    assert f["seed_skew_ratio"] > work["skewed"]["eta"]  # the seed beat its eta; k0 does not (above)


def test_small_case_is_padding_bound_not_memory_bound(f):
    work = f["work"]
    small = work["small"]
    assert small["useful"] < work["balanced"]["useful"]
    assert small["eta"] == pytest.approx(0.5)
    assert small["scheduled"] == pytest.approx(small["useful"] / small["eta"], rel=1e-9)
    assert f["small_rate"] >= 0.9  # 'within a few percent of the 16,384-row rate'
    assert f["small_rate"] > f["small_model_rate"] + 0.03  # 'well above the model's'
    # '... where the prediction lost most of its remaining accuracy': the wave factor explains most
    # of how much further off the 2,048-row prediction was than the 16,384-row one.
    extra = f["work"]["small"]["vs_predicted"] / f["work"]["balanced"]["vs_predicted"]
    assert extra > 1 and np.log(f["small_rate"] / f["small_fill"]) > 0.5 * np.log(extra)
    assert small["compulsory_ms"] / small["median_ms"] < 0.2  # 'a small part of the run'


def test_small_case_beside_the_peers(f):
    work = f["work"]
    assert work["small"]["memory_bound"] and not work["balanced"]["memory_bound"]
    assert max(work, key=lambda n: work[n]["vs_peer"]) == "small"  # 'compares best'
    assert work["small"]["useful"] > work["small"]["loop"]  # 'k0 also beats the per-expert torch loop here'


def test_long_k_runs_at_the_k1024_rate(f):
    assert abs(f["long_k_ratio"] - 1.0) < 0.03
    assert f["work"]["long_k"]["tiles"] == f["work"]["balanced"]["tiles"]
    assert f["work"]["long_k"]["peer"] > f["work"]["balanced"]["peer"]  # 'the peer gains from the longer K'
    work = f["work"]
    assert min(work, key=lambda n: work[n]["vs_peer"]) == "long_k"  # 'at its worst here'


# ---- the peers, and the FFMA ceiling ---------------------------------------------------------

def test_tensor_cores_more_than_ten_times_the_fp32_peak(f):
    assert f["dense_vs_datasheet"] > 10
    assert all(r < 0.2 for r in f["peer_ratios"].values())


def test_per_expert_loop_time_barely_moves(f):
    work = f["work"]
    times = [w["loop_ms"] for w in work.values()]
    assert max(times) / min(times) < 2.0
    assert work["balanced"]["loop"] > work["balanced"]["useful"]
    assert work["long_k"]["loop"] > work["long_k"]["useful"]


def test_ffma_ceiling_caveat(f):
    """'below SPEC's figure and below what its own instruction stream allows'; at face value it would
    have k0 issuing on most cycles."""
    assert f["ffma_source"] == "measured in this run"
    assert f["ffma"] < f["spec_ffma"] < f["datasheet"]
    assert f["ffma"] < f["ceiling_sass_tflops"]
    assert f["issue_if_ceiling_true"] > 0.8
    # 'The mma.sync ceiling uses the same launch ... and came out at the level SPEC reports' (632).
    assert f["mma_sync"] == pytest.approx(632.0, rel=0.05)
    assert f["work"]["balanced"]["of_ffma"] > f["work"]["balanced"]["of_datasheet"]


def test_ceiling_kernel_matches_the_loop_the_page_describes():
    """The page reads ceiling_ffma.cu's SASS as 4 x 8 FFMAs per trip: the source must still say so."""
    source = (REPO / "kernels" / "ceiling_ffma.cu").read_text()
    assert "constexpr int CEILING_FFMA_CHAINS = 8;" in source
    assert "#pragma unroll 4" in source
    assert "__launch_bounds__(256)" in source


# ---- findings.md --------------------------------------------------------------------------

def _section_names(text: str) -> list[str]:
    return re.findall(r"--8<-- \[start:([a-z_]+)\]", text)


def test_findings_generated_from_the_results_file(figures, data, tmp_path):
    written = figures.write_outputs(tmp_path, RESULTS)
    assert tmp_path / "01" / "findings.md" in written
    text = (tmp_path / "01" / "findings.md").read_text()
    assert _section_names(text) == list(figures.FINDING_SECTIONS)
    assert "nan" not in text.lower() and " - " not in text.replace(" - 1)", "")  # every value was recorded
    k0 = {(r["tokens"], r["skew"], r["K"]): r for r in data["records"] if r["variant"] == "k0"}
    assert f"**{k0[(16384, 0.0, 1024)]['useful_tflops']:.1f} TFLOP/s**" in text
    assert f"{k0[(2048, 0.0, 1024)]['useful_tflops']:.1f} TFLOP/s useful" in text
    assert "**met**" in text
    ceiling = next(c["tflops"] for c in data["ceilings"] if c["variant"] == "ceiling/ffma")
    assert f"{ceiling:.1f} TFLOP/s" in text


def test_findings_follow_the_results_not_the_prose(figures, data):
    """A rerun with other numbers changes the generated sentences (here: the target flips)."""
    slow = json.loads(json.dumps(data))
    for record in slow["records"]:
        if record["variant"] == "k0":
            record["useful_tflops"] /= 2
            record["scheduled_tflops"] /= 2
    text = figures.findings_markdown(slow)
    assert "**missed**" in text and "**met**" not in text


def test_findings_without_results_keep_every_section(figures, tmp_path):
    figures.write_outputs(tmp_path, tmp_path / "absent.json")
    text = (tmp_path / "01" / "findings.md").read_text()
    assert _section_names(text) == list(figures.FINDING_SECTIONS)
    assert "No H200 measurement is recorded yet" in text


def test_page_includes_every_findings_section_and_no_placeholder(figures):
    text = PAGE.read_text()
    included = re.findall(r'--8<-- "site_docs/figures/01/findings\.md:([a-z_]+)"', text)
    assert sorted(included) == sorted(figures.FINDING_SECTIONS)
    assert "<!-- MEASURED" not in text


def test_nan_free_formatting_helper(figures):
    assert figures._f(float("nan")) == "-" and figures._f(None) == "-" and figures._f(1.234, ".2f") == "1.23"
    assert np.isnan(figures._ratio(1.0, None))
