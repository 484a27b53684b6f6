"""k5 on the GPU: every tile kind and the mixed lists on every edge case and on the extra routings
(one expert with every row, alternating empty experts, 1-row experts), exact on integer-valued
inputs; the device schedule bit-identical to the host schedule on random routings; and one CUDA
graph replayed with different routings, M_tot = 0 among them. Skipped where there is no sm_90a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.edge_cases import EDGE_CASES, EDGE_K, EDGE_N
from moe_gemm.model.problem import BF16, Problem, make_problem, problem_from_counts
from moe_gemm.variants.k5 import K5Adaptive
from moe_gemm.variants.k5.config import CHECKED, K5Config
from moe_gemm.variants.k5.layer import DeviceLayer

pytestmark = pytest.mark.gpu

# Routings beyond the shared edge cases, with every remainder kind present somewhere.
EXTRA_ROUTINGS = {
    "one expert holds every row (E = 8)": (0, 0, 0, 1000, 0, 0, 0, 0),
    "alternating empty experts": (0, 77, 0, 140, 0, 5, 0, 64, 0, 250),
    "1-row experts": (1,) * 12,
    "every remainder width": (16, 17, 32, 33, 48, 49, 64, 65, 127, 128, 129, 191),
}


@pytest.fixture(params=list(CHECKED))
def variant(request):
    return K5Adaptive(request.param)


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case, sm90a):
    from moe_gemm.measure.check import verify

    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize("name", list(EXTRA_ROUTINGS))
def test_extra_routings_exact(variant, name, sm90a):
    from moe_gemm.measure.check import verify

    problem = problem_from_counts(np.array(EXTRA_ROUTINGS[name]), 256, 328, values="integer", seed=5)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{name}': {check.describe()}"


def test_random_data_at_the_seed_shape_within_tolerance(variant, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, make_problem(64, 2048, 1024, 2688, 1.2, seed=11))
    assert check.passed, f"{variant.name}: {check.describe()}"


def test_persistent_grid_walks_many_tiles_per_block(sm90a):
    """More tiles than SM slots several times over, every kind in the list, exact."""
    from moe_gemm.measure.check import verify

    counts = np.tile([300, 40, 100, 7, 0, 128], 40)  # 240 experts: M128, SWAP and M64 remainders
    check = verify(K5Adaptive("k5/swap"), problem_from_counts(counts, 128, 392, values="integer", seed=2), exact=True)
    assert check.passed, check.describe()


@pytest.mark.parametrize("seed", range(6))
def test_device_schedule_matches_the_host_schedule_bit_for_bit(seed, sm90a):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once

    rng = np.random.default_rng(seed)
    experts = int(rng.integers(1, 80))
    counts = rng.integers(0, 300, experts) * (rng.random(experts) > 0.3)  # about a third empty
    problem = problem_from_counts(counts, 256, 264, seed=seed)
    device, host = K5Adaptive("k5/device"), K5Adaptive("k5/host")
    host.calibration = device.calibration
    host.config = K5Config("host", device.policy_for(counts, 256, 264, 132))  # the device's policy
    dev = DeviceProblem(problem)
    np.testing.assert_array_equal(run_once(device, dev).view(np.uint16), run_once(host, dev).view(np.uint16))


def test_one_graph_replayed_with_changing_routings(sm90a):
    """Capture once; replay with routings that change every time, M_tot = 0 and a full buffer
    included; every replay exact."""
    from moe_gemm.model.reference import check_output

    experts, capacity = 16, 900
    rng = np.random.default_rng(0)
    first = problem_from_counts(np.full(experts, 1), EDGE_K, EDGE_N, values="integer", seed=1)
    layer = DeviceLayer(first.b, capacity)
    routings = [np.zeros(experts, dtype=np.int64), np.array([capacity] + [0] * (experts - 1))]
    routings += [rng.multinomial(int(rng.integers(1, capacity)), rng.dirichlet(np.ones(experts) * 0.3))
                 for _ in range(6)]
    for counts in routings:
        problem = problem_from_counts(counts, EDGE_K, EDGE_N, values="integer", seed=int(counts.sum()))
        problem = Problem(a=problem.a, b=first.b, counts=problem.counts)
        out = layer(problem.a, counts)
        check = check_output(out.astype(BF16), problem, exact=True)
        assert check.passed, f"routing {counts.tolist()}: {check.describe()}"


def test_refusals_before_any_launch(sm90a):
    from moe_gemm.cuda.device import DeviceProblem

    with pytest.raises(ValueError, match="at most 256 experts"):
        K5Adaptive("k5/device").prepare(DeviceProblem(problem_from_counts(np.ones(257, dtype=int), 64, 64)))
    with pytest.raises(ValueError, match="multiple of BK = 64"):
        K5Adaptive("k5/host").prepare(DeviceProblem(problem_from_counts(np.array([5]), 96, 64)))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        DeviceLayer(np.zeros((2, 64, 64), dtype=BF16), 0)
