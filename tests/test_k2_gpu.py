"""k2 on the GPU: every edge case of moe_gemm.model.edge_cases exactly, random data within tolerance, and the
inputs TMA cannot take refused before any launch. Skipped cleanly where there is no GPU; on a GPU
older than sm_90 the variant must refuse with a ValueError, which is checked too."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.variants.k2 import STAGE_CHOICES, K2TmaWs

pytestmark = pytest.mark.gpu


def _needs_hopper():
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability < (9, 0):
        pytest.skip("k2 runs on sm_90 or newer")


@pytest.fixture(params=STAGE_CHOICES, ids=lambda s: f"stages{s}")
def variant(request):
    return K2TmaWs(request.param)


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case):
    from moe_gemm.measure.check import verify

    _needs_hopper()
    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (8, 1000, 1024, 384, 1.2),   # 16 K steps: the ring wraps many times
    (64, 2048, 1024, 2688, 0.0),  # the seed's shape at its small batch
    (3, 300, 192, 136, 0.0),     # K of three steps, N with a partial second panel
])
def test_random_data_within_tolerance(variant, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    _needs_hopper()
    problem = make_problem(experts, tokens, K, N, skew, seed=11)
    check = verify(variant, problem)
    assert check.passed, f"{variant.name}: {check.describe()}"


def test_aligned_offset_views_work():
    """A and B may live at any 16-byte-aligned address, not only at the start of an allocation."""
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem
    from moe_gemm.measure.check import verify

    _needs_hopper()
    problem = problem_from_counts(np.array([70, 130]), 128, 200, values="integer", seed=5)
    dev = DeviceProblem(problem)
    for name, host in (("a", problem.a), ("b", problem.b)):
        raw = DeviceArray((host.nbytes + 256,), np.uint8)
        view = raw.view(16 * 3, host.shape, BF16).upload(host)
        setattr(dev, name, view)
    check = verify(K2TmaWs(2), dev, exact=True)
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
        K2TmaWs(2).prepare(dev)


@pytest.mark.parametrize(("K", "N", "rule"), [
    (100, 200, "multiple of 8"),     # a TMA stride rule: K * 2 bytes is not a multiple of 16
    (72, 200, "multiple of BK = 64"),
    (128, 204, "N to be a multiple of 8"),
])
def test_shapes_refused_before_launch(K, N, rule):
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), K, N, values="integer", seed=1)
    with pytest.raises(ValueError, match=rule):
        K2TmaWs(3).prepare(DeviceProblem(problem))


def test_old_gpu_refused():
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability >= (9, 0):
        pytest.skip("only meaningful on a GPU older than sm_90")
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    with pytest.raises(ValueError, match="sm_90"):
        K2TmaWs(2).prepare(DeviceProblem(problem))
