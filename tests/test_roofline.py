"""One roofline for every chapter and page: the wgmma peak and the device copy of ceilings/h200.json,
with compulsory bytes from one function. No recorded measurement exceeds it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moe_gemm.core.chapters import measured_chapters
from moe_gemm.core.paths import REPO_ROOT
from moe_gemm.measure.ceilings import ceiling_value, recorded_ceilings, roofline_basis
from moe_gemm.measure.results import recorded
from moe_gemm.model.problem import FP8_BLOCKWISE
from moe_gemm.model.roofline import RooflineBasis, compulsory_bytes, tile_request_bytes
from moe_gemm.model.workloads import SEED, Workload
from moe_gemm.site.pages import Pages


def measured_records():
    for chapter in measured_chapters():
        for record in recorded(chapter.number)["records"]:
            if "useful_tflops" in record and not record["variant"].startswith(("ceiling/", "offline/")):
                yield chapter.number, record


def test_no_recorded_measurement_exceeds_the_roofline():
    """e4m3 records against the e4m3 wgmma peak that chapter 10 measures in the same run as them."""
    fp8 = recorded("10")
    basis = dataclasses.replace(roofline_basis(), fp8_tensor_tflops=fp8["dense"]["wgmma_e4m3_tflops"] if fp8 else None)
    over = [(ch, r["variant"], Workload.of(r).label, r["useful_tflops"] / basis.tflops(Workload.of(r)))
            for ch, r in measured_records() if r["useful_tflops"] > basis.tflops(Workload.of(r))]
    assert not over, over


def test_the_basis_is_the_wgmma_peak_and_the_copy_of_the_one_record():
    ceilings = recorded_ceilings()
    basis = roofline_basis()
    assert basis.tensor_tflops == ceiling_value(ceilings, "wgmma")
    assert basis.copy_tbps == ceiling_value(ceilings, "copy")
    # the tensor pipe is above any library's GEMM measured beside it, and below the datasheet's
    # 989.4 TFLOP/s at the 1,830 MHz boost clock only by what the clock under load takes away
    assert ceiling_value(ceilings, "dense_bf16") < basis.tensor_tflops < 1070


def test_every_page_and_table_reads_the_same_basis():
    pages = Pages(REPO_ROOT)
    assert pages.basis() == roofline_basis()
    assert str(pages.roofline()) == f"{roofline_basis().tflops(SEED):.0f}"


def test_compulsory_bytes_count_only_the_weights_of_experts_with_rows():
    assert compulsory_bytes(np.array([0, 5]), 64, 32) == 2 * (5 * (64 + 32) + 64 * 32)
    assert compulsory_bytes(np.zeros(8, dtype=int), 64, 32) == 0
    seed = compulsory_bytes(SEED.counts, SEED.K, SEED.N)
    assert seed == 473_956_352  # A 32 MB + B 352 MB + C 88 MB at 16,384 rows


def test_at_decode_sizes_under_skew_fewer_weights_move():
    """512 rows over 64 experts at s = 1.6 leave experts empty: their B is not compulsory, which is
    why a roofline counting every expert's B read 151% there."""
    cell = Workload(512, 1.6)
    empty = int(np.sum(cell.counts == 0))
    assert empty > 0
    full = 2 * (512 * (cell.K + cell.N) + cell.experts * cell.K * cell.N)
    assert compulsory_bytes(cell.counts, cell.K, cell.N) == full - 2 * empty * cell.K * cell.N


def test_the_bound_switches_at_the_ridge():
    basis = RooflineBasis(900.0, 4.5, "test")
    assert basis.bound(Workload(2048, 0.0)) == "memory"
    assert basis.bound(Workload(1 << 20, 0.0)) == "compute"
    assert basis.tflops(Workload(1 << 20, 0.0)) == pytest.approx(900.0, rel=1e-9)


def test_the_e4m3_peak_comes_from_the_ceilings_record_where_it_was_measured(tmp_path):
    """A record with ceiling/wgmma_e4m3 gives e4m3 workloads their own peak; one without it refuses them (chapter
    10's tables then take the peak its own run measured)."""
    import json

    def basis(ceilings):
        (tmp_path / "ceilings").mkdir(exist_ok=True)
        (tmp_path / "ceilings" / "x.json").write_text(json.dumps({"provenance": {}, "records": [],
                                                                   "ceilings": ceilings}))
        return roofline_basis("x", tmp_path)

    bf16 = [{"variant": "ceiling/wgmma", "tflops": 900.0}, {"variant": "ceiling/copy", "tbps": 4.0}]
    fp8 = SEED.in_format(FP8_BLOCKWISE)
    assert basis([*bf16, {"variant": "ceiling/wgmma_e4m3", "tflops": 1800.0}]).peak(fp8) == 1800.0
    with pytest.raises(ValueError, match="no e4m3 wgmma peak"):
        basis(bf16).peak(fp8)


def test_a_tiled_launch_asks_for_each_units_operands_once():
    """Two experts of 300 and 0 rows, K = 64, N = 200, units of 256 x 128: 2 M units x 2 N units of the first
    expert, each reading 256 rows of A and 128 columns of B along K (the rows past 300 and the columns past 200
    included), C written once; more than the compulsory bytes, which read each operand once."""
    counts = np.array([300, 0])
    asked = tile_request_bytes(counts, 64, 200, 256, 128)
    assert asked == 2 * (2 * 2 * (256 + 128) * 64 + 300 * 200)
    assert asked > compulsory_bytes(counts, 64, 200)
    assert tile_request_bytes(counts, 64, 200, 512, 256) < asked  # larger units re-read less
