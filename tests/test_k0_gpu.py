"""k0 and the torch peers on the GPU: every edge case of moe_gemm.model.edge_cases exactly, random data within
tolerance, the bf16 conversions on the device, the compiled kernel's resources and SASS, the NaN
poison of an unwritten tile, launches ordered on the harness stream, and the inputs each variant
must refuse before any launch. Skipped cleanly where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.variants.k0 import K0Fp32, numba_cuda_problem

# numba-cuda 0.30.4 cannot compile under numpy >= 2.5 (tests/test_k0.py checks that k0 says so).
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(numba_cuda_problem() is not None,
                                                  reason=str(numba_cuda_problem()))]


@pytest.fixture(scope="module")
def k0():
    return K0Fp32()


# ---- k0 is right -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(k0, case):
    from moe_gemm.measure.check import verify

    problem = case.exact_problem(seed=3)
    check = verify(k0, problem, exact=True)
    assert check.passed, f"k0 on '{case.name}': {check.describe()}"


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_random_within_tolerance(k0, case):
    from moe_gemm.measure.check import verify

    problem = problem_from_counts(case.counts_array(), case.K, case.N, values="random", seed=4)
    check = verify(k0, problem)
    assert check.passed, f"k0 on '{case.name}': {check.describe()}"


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (64, 2048, 1024, 2688, 0.0),  # the seed's shape at its small batch
    (64, 2048, 1024, 2688, 1.2),  # skewed: many partial tiles
    (8, 1000, 256, 200, 0.8),    # N with a partial last tile
    (3, 300, 16, 40, 0.0),       # a single K slice, a single partial N tile
])
def test_random_data_within_tolerance(k0, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    problem = make_problem(experts, tokens, K, N, skew, seed=11)
    check = verify(k0, problem)
    assert check.passed, f"k0: {check.describe()}"


def test_bf16_conversions_on_the_device():
    from moe_gemm.variants.k0.simulator import conversion_probes, convert_round_trip, expected_bf16_bits

    probes = conversion_probes(4096, seed=1)
    bits, widened = convert_round_trip(probes)
    expected = expected_bf16_bits(probes)
    wrong = np.flatnonzero(bits != expected)
    assert wrong.size == 0, [(hex(probes.view(np.uint32)[i]), hex(bits[i]), hex(expected[i])) for i in wrong[:8]]
    assert np.array_equal(widened.view(np.uint32), bits.astype(np.uint32) << 16)


def test_an_unwritten_tile_stays_nan_and_fails_the_check(k0):
    """Launch over all tiles but the last: the harness's NaN poison must show in exactly that tile."""
    from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceProblem, synchronize
    from moe_gemm.model.reference import check_output
    from moe_gemm.model.tiles import tile_list

    problem = problem_from_counts(np.array([70, 0, 33]), 64, 136, values="integer", seed=2)
    dev = DeviceProblem(problem)
    tiles = tile_list(problem.counts, problem.N, k0.bm, k0.bn)
    expert, row0, rows, col0 = (int(v) for v in tiles[-1])
    prepared = k0.prepare_tiles(dev, tiles[:-1])
    prepared.output.fill_u16(BF16_NAN_BITS)
    prepared.launch()
    synchronize()
    out = prepared.output.download()
    missing = np.zeros(out.shape, dtype=bool)
    missing[row0:row0 + rows, col0:min(col0 + k0.bn, problem.N)] = True
    assert np.isnan(out.astype(np.float32)[missing]).all()
    assert np.isfinite(out.astype(np.float32)[~missing]).all()
    check = check_output(out, problem, exact=True)
    assert not check.passed and check.nonfinite == missing.sum()


# ---- what the compiler made of it -----------------------------------------------------------------

def test_resources_as_numba_reports_them(k0):
    resources = k0.resources()
    assert resources.spill_bytes == 0, "k0 uses local memory (spills or a local array left in memory)"
    assert resources.smem_bytes == (16 * 68 + 16 * 64) * 4  # a_s and b_s, fp32, nothing else
    assert resources.warps_per_block == 8
    assert 0 < resources.registers <= 64, f"{resources.registers} registers: fewer than 4 blocks per SM"
    assert resources.blocks_per_sm == 4


def test_sass_inner_loop_uses_vector_shared_loads_and_no_local_memory(k0):
    counts = k0.sass_counts()
    assert counts["LDL"] == 0 and counts["STL"] == 0, counts
    assert counts["LDS.128"] > 0 and counts["LDS"] == counts["LDS.128"], counts  # every shared load 16 bytes
    assert counts["FFMA"] >= 16 and counts["FFMA"] % 16 == 0, counts  # whole rank-1 updates
    assert counts["BAR.SYNC"] >= 2, counts  # one before and one after each slice's rank-1 updates


# ---- launches go to the harness stream ----------------------------------------------------------

def _timed_ms(variant, problem) -> float:
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.cuda.timing import time_launches

    prepared = variant.prepare(DeviceProblem(problem))
    return time_launches(lambda _: prepared.launch(), warmup=2, iterations=5).median_ms


def test_k0_launches_are_timed_on_the_harness_stream(k0):
    # About 11 GFLOP: over a millisecond for an FP32 kernel. Launched on another stream, the events
    # on the harness stream would bracket nothing and read a few microseconds.
    assert _timed_ms(k0, make_problem(64, 2048, 1024, 2688, 0.0, seed=0)) > 0.2


# ---- the peers -----------------------------------------------------------------------------------

def _peers():
    from moe_gemm.variants.peer.torch import available_peers

    return available_peers()


@pytest.fixture(params=["peer/torch_grouped_mm", "peer/torch_loop"])
def peer(request):
    found = [p for p in _peers() if p.name == request.param]
    if not found:
        pytest.skip(f"{request.param} is not available here (torch missing, or the GPU too old)")
    return found[0]


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (64, 2048, 1024, 2688, 0.0),
    (8, 1000, 256, 200, 1.2),
])
def test_peers_match_the_reference(peer, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    check = verify(peer, make_problem(experts, tokens, K, N, skew, seed=5))
    assert check.passed, f"{peer.name}: {check.describe()}"


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_peers_on_the_edge_cases(peer, case):
    from moe_gemm.measure.check import verify

    problem = problem_from_counts(case.counts_array(), case.K, case.N, values="random", seed=6)
    check = verify(peer, problem)
    assert check.passed, f"{peer.name} on '{case.name}': {check.describe()}"


def test_peer_output_is_what_the_peer_wrote(peer):
    """The output object must hold the peer's result, not a stale or poisoned buffer."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once
    from moe_gemm.model.reference import reference_gemm

    # K = 16: every sum of products of integers in [-3, 3] is at most 144, exact in bf16, so the
    # comparison involves no rounding at all.
    problem = problem_from_counts(np.array([40, 0, 88]), 16, 96, values="integer", seed=8)
    out = run_once(peer, DeviceProblem(problem))
    assert out.dtype == BF16 and out.shape == (problem.tokens, problem.N)
    expected = reference_gemm(problem, np.float64).astype(np.float32).astype(BF16)
    assert np.array_equal(out.astype(np.float32), expected.astype(np.float32))


def test_peers_are_timed_on_the_harness_stream(peer):
    # 11 GFLOP that must stream all of B (352 MB): over 0.08 ms at any bandwidth an H200 has. On
    # another stream, the harness's events would read a few microseconds.
    assert _timed_ms(peer, make_problem(64, 2048, 1024, 2688, 0.0, seed=0)) > 0.03


# ---- inputs refused before any launch -----------------------------------------------------------

def test_k0_refuses_k_not_a_multiple_of_16(k0):
    from moe_gemm.cuda.device import DeviceProblem

    dev = DeviceProblem(problem_from_counts(np.array([10, 20]), 40, 64, values="integer", seed=0))
    with pytest.raises(ValueError, match="multiple of BK = 16"):
        k0.prepare(dev)


@pytest.mark.parametrize("which", ["a", "b"])
def test_k0_refuses_wrong_dtype_or_shape_on_the_device(k0, which):
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem

    problem = problem_from_counts(np.array([10, 20]), 32, 64, values="integer", seed=0)
    dev = DeviceProblem(problem)
    host = getattr(problem, which)
    setattr(dev, which, DeviceArray(host.shape, np.float32))
    with pytest.raises(ValueError, match=f"k0 needs {which.upper()} as bf16"):
        k0.prepare(dev)
    setattr(dev, which, DeviceArray((host.shape[0] + 1, *host.shape[1:]), BF16))
    with pytest.raises(ValueError, match=f"k0 needs {which.upper()} as bf16"):
        k0.prepare(dev)


@pytest.mark.parametrize(("experts", "K", "N", "match"), [
    (2, 36, 64, "multiples of 8"),
    (2, 64, 60, "multiples of 8"),
    (1024, 8, 8, "fewer than 1024 groups"),
])
def test_grouped_mm_refuses_what_it_cannot_take(experts, K, N, match):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.variants.peer.torch import PEER_GROUPED_MM

    peers = [p for p in _peers() if p.name == PEER_GROUPED_MM]
    if not peers:
        pytest.skip("torch._grouped_mm is not available here")
    counts = np.zeros(experts, dtype=np.int64)
    counts[:2] = (3, 5)
    dev = DeviceProblem(problem_from_counts(counts, K, N, values="integer", seed=0))
    with pytest.raises(ValueError, match=match):
        peers[0].prepare(dev)
