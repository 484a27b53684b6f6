"""k4 on a GPU. On compute capability 10.0 or 10.3: every edge case exactly and random data within
tolerance, for every configuration. On any other GPU (the H200 this project runs on): every
configuration refuses before launch, naming the compute capability it needs. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import make_problem, problem_from_counts
from moe_gemm.variants.k4 import CONFIGS, SUPPORTED_CAPABILITIES, K4Tcgen05

pytestmark = pytest.mark.gpu


def _runs_k4() -> bool:
    gpu = detect_gpu()
    return gpu is not None and gpu.compute_capability in SUPPORTED_CAPABILITIES


def _needs_blackwell() -> None:
    if not _runs_k4():
        pytest.skip("k4 runs on compute capability 10.0 or 10.3 only")


@pytest.fixture(params=list(CONFIGS))
def variant(request):
    return K4Tcgen05(request.param)


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case):
    from moe_gemm.measure.check import verify

    _needs_blackwell()
    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (8, 1000, 1024, 384, 1.2),    # 16 K steps: the ring wraps, blocks take several tiles each
    (64, 2048, 1024, 2688, 0.0),  # the seed's shape at its small batch
    (3, 300, 192, 136, 0.0),      # three K steps, N ending inside a B box and inside a 32-column chunk
])
def test_random_data_within_tolerance(variant, experts, tokens, K, N, skew):
    from moe_gemm.measure.check import verify

    _needs_blackwell()
    check = verify(variant, make_problem(experts, tokens, K, N, skew, seed=11))
    assert check.passed, f"{variant.name}: {check.describe()}"


def test_other_gpus_refuse_before_launch(variant):
    from moe_gemm.cuda.device import DeviceProblem

    if detect_gpu() is None or _runs_k4():
        pytest.skip("only meaningful on a GPU that cannot run k4")
    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    with pytest.raises(ValueError, match="needs compute capability 10.x"):
        variant.prepare(DeviceProblem(problem))
