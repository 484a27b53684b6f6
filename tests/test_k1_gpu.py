"""k1 on the GPU: every edge case of moe_gemm.model.edge_cases exactly for every configuration, random data
within tolerance, and the inputs the kernel cannot take refused before any launch. Skipped
cleanly where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.variants.k1 import K1MmaSync, all_configs

pytestmark = pytest.mark.gpu


def _needs_ampere():
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability < (8, 0):
        pytest.skip("k1 runs on sm_80 or newer")


@pytest.fixture(params=all_configs(), ids=lambda v: v.name)
def variant(request):
    return request.param


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case):
    from moe_gemm.measure.check import verify

    _needs_ampere()
    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


def test_partial_tiles_leave_the_next_experts_rows_alone(variant):
    """Experts of 1, 33 and 95 rows: every tile is partial, and each tile's padding rows are the next
    expert's real rows. A kernel writing past `rows` would overwrite them with wrong values."""
    from moe_gemm.measure.check import verify

    _needs_ampere()
    problem = problem_from_counts(np.array([1, 33, 95, 2]), 64, 136, values="integer", seed=4)
    check = verify(variant, problem, exact=True)
    assert check.passed, check.describe()


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (8, 1000, 1024, 384, 1.2),    # 32 K slices: both stages reused many times
    (64, 2048, 1024, 2688, 0.0),  # the seed's shape at its small batch
    (3, 300, 96, 136, 0.0),       # an odd number of K slices, N with a partial second tile
])
def test_random_data_within_tolerance(variant, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    _needs_ampere()
    problem = make_problem(experts, tokens, K, N, skew, seed=11)
    check = verify(variant, problem)
    assert check.passed, f"{variant.name}: {check.describe()}"


def test_aligned_offset_views_work():
    """A and B may live at any 16-byte-aligned address, not only at the start of an allocation."""
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem
    from moe_gemm.measure.check import verify

    _needs_ampere()
    problem = problem_from_counts(np.array([70, 130]), 128, 200, values="integer", seed=5)
    dev = DeviceProblem(problem)
    for name, host in (("a", problem.a), ("b", problem.b)):
        raw = DeviceArray((host.nbytes + 256,), np.uint8)
        setattr(dev, name, raw.view(16 * 3, host.shape, BF16).upload(host))
    check = verify(K1MmaSync(64), dev, exact=True)
    assert check.passed, check.describe()


@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("offset", [2, 8])
def test_misaligned_pointers_refused_before_launch(which, offset):
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    dev = DeviceProblem(problem)
    host = getattr(problem, which)
    raw = DeviceArray((host.nbytes + 64,), np.uint8)
    setattr(dev, which, raw.view(offset, host.shape, BF16))
    with pytest.raises(ValueError, match=f"{which.upper()} to start on a 16-byte boundary"):
        K1MmaSync(64).prepare(dev)


@pytest.mark.parametrize(("K", "N", "rule"), [
    (72, 200, "multiple of BK = 32"),
    (100, 200, "multiple of BK = 32"),
    (128, 204, "N to be a multiple of 8"),
])
def test_shapes_refused_before_launch(K, N, rule):
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), K, N, values="integer", seed=1)
    with pytest.raises(ValueError, match=rule):
        K1MmaSync(32).prepare(DeviceProblem(problem))


def test_old_gpu_refused():
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability >= (8, 0):
        pytest.skip("only meaningful on a GPU older than sm_80")
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    with pytest.raises(ValueError, match="sm_80"):
        K1MmaSync(64).prepare(DeviceProblem(problem))


def test_timed_launches_keep_giving_the_right_answer():
    """The timing loop reuses one prepared launch; its output must still be right afterwards."""
    from moe_gemm.cuda.device import DeviceProblem, synchronize
    from moe_gemm.measure.check import verify
    from moe_gemm.model.reference import check_output

    _needs_ampere()
    problem = make_problem(16, 3000, 256, 264, 0.8, seed=9)
    dev = DeviceProblem(problem)
    variant = K1MmaSync(128)
    assert verify(variant, dev).passed
    prepared = variant.prepare(dev)
    for _ in range(5):
        prepared.launch()
    synchronize()
    assert check_output(prepared.output.download(), problem).passed
