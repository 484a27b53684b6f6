"""k3 on the GPU: every rung of the ladder on every edge case exactly, random data within tolerance,
persistent grids with fewer, as many and more units of work than SM slots (experts of exactly one
M tile among them), and the inputs the kernel cannot take refused before any launch. Skipped
cleanly where there is no GPU; on a GPU that is not sm_90a the variant must refuse."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.model.edge_cases import EDGE_CASES
from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.variants.k3 import K3Wgmma
from moe_gemm.variants.k3.config import LADDER

pytestmark = pytest.mark.gpu


@pytest.fixture(params=list(LADDER))
def variant(request):
    return K3Wgmma(request.param)


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case, sm90a):
    from moe_gemm.measure.check import verify

    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize(("experts", "tokens", "K", "N", "skew"), [
    (8, 1000, 1024, 384, 1.2),   # 16 K steps: the ring wraps many times
    (3, 300, 192, 136, 0.0),     # three K steps, N with a partial box
])
def test_random_data_within_tolerance(variant, experts, tokens, K, N, skew, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, make_problem(experts, tokens, K, N, skew, seed=11))
    assert check.passed, f"{variant.name}: {check.describe()}"


def _counts_for_units(variant: K3Wgmma, units: int, N: int) -> np.ndarray:
    """Expert sizes (one M tile, two, and a partial one, in turn) giving at least ``units`` units."""
    pattern = [variant.bm, 2 * variant.bm, variant.bm // 2 + 3]
    counts: list[int] = []
    while variant.tiles(np.array(counts or [0]), N).shape[0] // variant.config.cluster < units:
        counts.append(pattern[len(counts) % 3])
    return np.array(counts)


@pytest.mark.parametrize("where", ["below", "at", "above"])
def test_persistent_grids_below_at_and_above_the_sm_slots(variant, where, sm90a):
    from moe_gemm.measure.check import verify

    if not variant.config.persistent:
        pytest.skip("one block per tile: no persistent grid")
    slots = sm90a.sm_count // variant.config.cluster
    units = {"below": slots // 3, "at": slots, "above": 2 * slots + 5}[where]
    N = variant.bn + 8
    problem = problem_from_counts(_counts_for_units(variant, units, N), 128, N, values="integer", seed=7)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name}, {where} ({units} units): {check.describe()}"


def test_aligned_offset_views_work(sm90a):
    """A and B may live at any 16-byte-aligned address, not only at the start of an allocation."""
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem
    from moe_gemm.measure.check import verify

    problem = problem_from_counts(np.array([70, 130]), 128, 200, values="integer", seed=5)
    dev = DeviceProblem(problem)
    for name, host in (("a", problem.a), ("b", problem.b)):
        raw = DeviceArray((host.nbytes + 256,), np.uint8)
        setattr(dev, name, raw.view(16 * 3, host.shape, BF16).upload(host))
    for name in ("k3/tmastore-bn192", "k3/multicast-tmastore-bn192"):
        check = verify(K3Wgmma(name), dev, exact=True)
        assert check.passed, f"{name}: {check.describe()}"


@pytest.mark.parametrize("which", ["a", "b"])
def test_misaligned_pointers_refused_before_launch(which, sm90a):
    from moe_gemm.cuda.device import DeviceArray, DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    dev = DeviceProblem(problem)
    host = getattr(problem, which)
    raw = DeviceArray((host.nbytes + 64,), np.uint8)
    setattr(dev, which, raw.view(8, host.shape, BF16))
    with pytest.raises(ValueError, match=f"{which.upper()} to start on a 16-byte boundary"):
        K3Wgmma("k3/tmastore-bn192").prepare(dev)


@pytest.mark.parametrize(("K", "N", "rule"), [
    (100, 200, "multiple of 8"),
    (72, 200, "multiple of BK = 64"),
    (128, 204, "N to be a multiple of 8"),
])
def test_shapes_refused_before_launch(K, N, rule):
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), K, N, values="integer", seed=1)
    with pytest.raises(ValueError, match=rule):
        K3Wgmma("k3/persistent-bn192").prepare(DeviceProblem(problem))


def test_other_gpus_refused():
    gpu = detect_gpu()
    if gpu is None or gpu.compute_capability == (9, 0):
        pytest.skip("only meaningful on a GPU that is not sm_90a")
    from moe_gemm.cuda.device import DeviceProblem

    problem = problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1)
    with pytest.raises(ValueError, match="sm_90a"):
        K3Wgmma("k3/1wg-bn128").prepare(DeviceProblem(problem))
