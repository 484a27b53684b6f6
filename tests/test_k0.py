"""k0 without a GPU: the kernel in numba's CUDA simulator, checked exactly on a tiny ragged problem
(an empty expert, a one-row expert, partial tiles in M and N), its bf16 conversions against
ml_dtypes, the wrapper's input checks, the peers' input rules, and chapter 01's scripts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe_gemm.core.chapters import chapter_module
from moe_gemm.model.problem import problem_from_counts
from moe_gemm.model.tiles import tile_list
from moe_gemm.variants import k0 as k0_module
from moe_gemm.variants.k0 import BK, K0Fp32, check_inputs, micro_tile_origin
from moe_gemm.variants.k0 import simulator as k0_simulator
from moe_gemm.variants.k0.simulator import (
    SIMULATOR_COUNTS,
    SIMULATOR_K,
    SIMULATOR_N,
    SimulatorResult,
    conversion_probes,
    expected_bf16_bits,
    simulate,
    simulator_check,
)

# ---- the simulator ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def simulated() -> SimulatorResult:
    return simulator_check()


def test_simulator_problem_is_ragged_in_every_way():
    counts = np.array(SIMULATOR_COUNTS)
    assert (counts == 0).any() and (counts == 1).any()  # an empty expert, a one-row expert
    assert any(0 < c % 64 for c in counts)  # a partial M tile
    assert SIMULATOR_N % 64 and SIMULATOR_N > 64  # a full and a partial N tile
    assert SIMULATOR_K // BK >= 2  # accumulation across K slices
    tiles = tile_list(counts, SIMULATOR_N, 64, 64)
    assert tiles.shape[0] == 8


def test_simulator_runs_k0_exactly(simulated):
    assert simulated.check.exact
    assert simulated.check.passed, simulated.describe()
    assert simulated.check.mismatches == 0 and simulated.check.nonfinite == 0
    assert simulated.tiles == 8


def test_simulator_conversions_match_ml_dtypes(simulated):
    assert simulated.conversions_ok, simulated.describe()


def test_simulate_refuses_outside_the_simulator():
    problem = problem_from_counts(np.array([3, 0, 5]), 16, 8, values="integer", seed=0)
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM=1"):
        simulate(problem)


# ---- the conversions' expected values ---------------------------------------------------------

def test_expected_bf16_bits_round_to_nearest_even():
    values = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7FC00000, 0xFF800000],
                      dtype=np.uint32).view(np.float32)
    assert expected_bf16_bits(values).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0, 0xFF80]


def test_conversion_probes_cover_the_awkward_cases():
    bits = conversion_probes(0).view(np.uint32)
    assert np.isnan(conversion_probes(0)).any() and np.isinf(conversion_probes(0)).any()
    assert (bits & 0xFFFF == 0x8000).sum() >= 6  # exact ties
    assert ((bits & 0x7F800000) == 0).sum() >= 4  # zeros and subnormals


# ---- the wrapper -----------------------------------------------------------------------------

@pytest.mark.parametrize("K", [8, 24, 100, 1030])
def test_k_must_be_a_multiple_of_bk(K):
    with pytest.raises(ValueError, match="multiple of BK = 16"):
        check_inputs(K, 64)


def test_any_n_and_k_multiple_of_16_accepted():
    for K, N in ((16, 1), (32, 72), (1024, 2688), (8192, 200)):
        check_inputs(K, N)


def test_micro_tile_map_covers_the_tile_once():
    origins = [micro_tile_origin(t) for t in range(256)]
    assert len(set(origins)) == 256
    assert {r for r, _ in origins} == set(range(0, 64, 4)) and {c for _, c in origins} == set(range(0, 64, 4))
    for warp in range(8):  # each warp: a 16 x 32 patch, 4 distinct A fragments and 8 distinct B fragments
        lanes = origins[32 * warp: 32 * warp + 32]
        rows, cols = {r for r, _ in lanes}, {c for _, c in lanes}
        assert len(rows) == 4 and len(cols) == 8
        assert max(rows) - min(rows) == 12 and max(cols) - min(cols) == 28


def test_wrapper_agrees_with_the_kernel_source():
    module = k0_module.kernel_module()  # imports numba.cuda (no GPU needed) and checks BM, BN, BK, THREADS
    assert module.A_STRIDE % 4 == 0  # 16-byte rows in a_s: every fragment read can be an LDS.128
    assert not module.SIMULATOR


def test_variant_is_registered():
    from moe_gemm.variants import registry

    assert isinstance(registry.get("k0"), K0Fp32)
    assert registry.get("k0").name == "k0"


# ---- a numpy that numba-cuda cannot compile with (numpy 2.5 removed np.row_stack) ----------------

@pytest.fixture
def numpy_2_5(monkeypatch):
    """numpy as 2.5 has it (no np.row_stack) beside numba-cuda 0.30.4, which still calls it."""
    from moe_gemm.variants.k0 import numba_loader

    monkeypatch.delattr(np, "row_stack", raising=False)
    monkeypatch.setattr(numba_loader, "numba_cuda_version", lambda: "0.30.4")


def test_the_numpy_check_names_the_problem_and_the_fix(numpy_2_5, monkeypatch):
    from moe_gemm.variants.k0 import numba_loader

    problem = numba_loader.numba_cuda_problem()
    assert problem is not None and "\n" not in problem
    assert "numba-cuda 0.30.4" in problem and "np.row_stack" in problem
    assert problem.endswith('python -m pip install "numpy<2.5"')
    monkeypatch.setattr(numba_loader, "numba_cuda_version", lambda: "0.31.0")  # a release with the guard
    assert numba_loader.numba_cuda_problem() is None
    monkeypatch.setattr(numba_loader, "numba_cuda_version", lambda: None)  # no numba-cuda: not this problem
    assert numba_loader.numba_cuda_problem() is None


def test_the_numpy_check_passes_where_numpy_has_row_stack(monkeypatch):
    from moe_gemm.variants.k0 import numba_loader

    monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)
    assert numba_loader.numba_cuda_problem() is None
    assert numba_loader._version_tuple("0.30.4") == (0, 30, 4)
    assert numba_loader._version_tuple("0.31.0rc1") == (0, 31, 0)


def test_k0_is_refused_before_any_compile_with_the_fix(numpy_2_5, monkeypatch):
    """A ValueError naming the fix, not numba's AttributeError from deep inside its first compile."""
    def no_compile(*args):
        raise AssertionError("k0 was compiled")

    monkeypatch.setattr(k0_module, "kernel_module", no_compile)
    with pytest.raises(ValueError, match=r'row_stack.*python -m pip install "numpy<2\.5"'):
        K0Fp32()
    made = object.__new__(K0Fp32)  # made before numpy changed under it: prepare checks again
    with pytest.raises(ValueError, match=r'pip install "numpy<2\.5"'):
        made.prepare(None)
    from moe_gemm.variants import registry

    with pytest.raises(ValueError, match="numpy<2.5"):
        registry.get("k0")
    assert k0_module.runnable_k0() == []


def test_a_row_stack_error_at_compile_time_becomes_the_same_line(monkeypatch):
    """For a numba-cuda newer than the check knows that still calls np.row_stack."""
    class Kernel:
        def compile(self, signature):
            raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    monkeypatch.setattr(k0_module, "kernel_module", lambda: type("M", (), {"k0_fp32": Kernel()})())
    with pytest.raises(ValueError, match=r'pip install "numpy<2\.5"'):
        K0Fp32().compile()


def test_chapter01_with_a_gpu_says_what_to_do_and_shows_the_record(numpy_2_5, monkeypatch, capsys):
    """``python chapters/01/run.py`` on a GPU whose numpy breaks numba-cuda: the line, the recorded
    results, exit 0; nothing compiled."""
    import moe_gemm.cuda.gpu
    from moe_gemm.cuda.gpu import GpuInfo

    gpu = GpuInfo(name="NVIDIA H200", compute_capability=(9, 0), sm_count=132, driver_version=13000)
    monkeypatch.setattr(moe_gemm.cuda.gpu, "detect_gpu", lambda ordinal=0: gpu)
    monkeypatch.setattr(k0_module, "kernel_module", lambda: pytest.fail("k0 was compiled"))
    assert chapter_module("01", "run").main([]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("NVIDIA H200 (sm_90a, 132 SMs")
    assert lines[2].startswith("k0 cannot be compiled here") and lines[2].endswith('pip install "numpy<2.5"')
    assert "Recorded on NVIDIA H200" in out and "k0" in out.split("Recorded on", 1)[1]


# ---- the peers' rules (no torch, no GPU needed) ---------------------------------------------

def test_peers_are_registered_and_absent_without_a_gpu():
    from moe_gemm.cuda.gpu import detect_gpu
    from moe_gemm.variants import registry
    from moe_gemm.variants.peer.torch import PEER_GROUPED_MM, PEER_LOOP, TorchGroupedMM, TorchLoop, available_peers

    assert isinstance(registry.get(PEER_GROUPED_MM), TorchGroupedMM)
    assert isinstance(registry.get(PEER_LOOP), TorchLoop)
    if detect_gpu() is None:
        assert available_peers() == []


@pytest.mark.parametrize(("experts", "K", "N", "a", "b", "match"), [
    (4, 36, 64, 0, 0, "multiples of 8"),
    (4, 64, 100, 0, 0, "multiples of 8"),
    (1024, 64, 64, 0, 0, "fewer than 1024 groups"),
    (4, 64, 64, 8, 0, "A to start on a 16-byte boundary"),
    (4, 64, 64, 0, 2, "B to start on a 16-byte boundary"),
])
def test_grouped_mm_rules(experts, K, N, a, b, match):
    from moe_gemm.variants.peer.torch import check_grouped_mm_inputs

    with pytest.raises(ValueError, match=match):
        check_grouped_mm_inputs(experts, K, N, a, b)
    check_grouped_mm_inputs(64, 1024, 2688, 256, 512)


# ---- chapter 01's scripts ----------------------------------------------------------------------

def test_run_without_a_gpu_checks_in_the_simulator_and_exits_0(monkeypatch, capsys):
    from moe_gemm.model.reference import Check

    canned = SimulatorResult(check=Check(0.0, 0, 0, exact=True), conversions_ok=True, conversion_mismatches=0,
                             tiles=8, seconds=1.0)
    monkeypatch.setattr(k0_simulator, "simulator_check", lambda: canned)  # the real one runs above
    assert chapter_module("01", "run").main(["--simulate"]) == 0
    out = capsys.readouterr().out
    assert "numba's CUDA simulator" in out and "ok (exact, 0 mismatches" in out


def test_run_without_a_gpu_fails_on_a_wrong_answer(monkeypatch):
    from moe_gemm.model.reference import Check

    wrong = SimulatorResult(check=Check(0.5, 0, 7, exact=True), conversions_ok=True, conversion_mismatches=0,
                            tiles=8, seconds=1.0)
    monkeypatch.setattr(k0_simulator, "simulator_check", lambda: wrong)
    assert chapter_module("01", "run").main(["--simulate"]) == 1


def test_run_help_describes_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        chapter_module("01", "run").main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--quick", "--no-peers", "--simulate"):
        assert flag in out


def test_figures_without_results_draw_only_the_layout(tmp_path, monkeypatch):
    figures = chapter_module("01", "figures")
    monkeypatch.setattr(figures, "recorded", lambda chapter: None)
    written = figures.write_outputs(tmp_path)
    assert [p.name for p in written] == ["layout.png"]
    assert not (tmp_path / "01" / "throughput.png").exists()


def _fake_results(path: Path) -> Path:
    """A results file in the real schema, with made-up numbers (this test only checks the plumbing)."""
    figures = chapter_module("01", "figures")
    records = []
    for i, w in enumerate(figures.WORKLOADS):
        base = {"experts": w.experts, "K": w.K, "N": w.N, "tokens": w.tokens, "skew": w.skew, "median_ms": 1.0 + i,
                "min_ms": 0.9, "max_ms": 1.2, "rel_error": 1e-3}
        records.append({**base, "variant": "k0", "useful_tflops": 10.0 + i, "scheduled_tflops": 11.0 + i,
                        "eta": 0.9, "tiles": 100, "registers": 56, "smem_bytes": 8448, "spill_bytes": 0,
                        "blocks_per_sm": 4})
        records.append({**base, "variant": "peer/torch_grouped_mm", "useful_tflops": 200.0 + i})
    data = {"provenance": {"gpu": "Test GPU", "compute_capability": "9.0", "driver": "13.0", "cuda": {},
                           "packages": {"numba-cuda": "0"}, "git_commit": "0" * 40, "date": "today", "command": "x"},
            "records": records, "ceilings": [{"variant": "ceiling/ffma", "tflops": 50.0}],
            "k0_occupancy": {"registers": 56, "smem_bytes": 8448, "local_bytes": 0, "warps_per_block": 8,
                             "blocks_per_sm": 4, "limiter": "registers", "blocks_by_registers": 4,
                             "blocks_by_smem": 24, "blocks_by_warps": 8},
            "k0_sass": {"FFMA": 256, "LDS.128": 32}}
    path.write_text(json.dumps(data))
    return path


def test_figures_from_a_results_file(tmp_path, monkeypatch):
    """A results file with no torch loop and only the FFMA ceiling still draws the throughput figure."""
    from moe_gemm.measure.results import load_results

    figures = chapter_module("01", "figures")
    results = _fake_results(tmp_path / "h200.json")
    monkeypatch.setattr(figures, "recorded", lambda chapter: load_results(results))
    written = figures.write_outputs(tmp_path)
    assert [p.name for p in written] == ["layout.png", "throughput.png"]
    assert (tmp_path / "01" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
