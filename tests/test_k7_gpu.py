"""k7 on the GPU: every rung on the weight gradient's edge cases and chapter 09's extra ones (K ending half-way
into a tile, N with a partial tile, long reductions, many experts of every length around 64), exact on
integer-valued inputs, in every type pair; random data within the tolerance; expert ends a model could pass by
mistake; one CUDA graph replayed with changing routings; and the refusals. Skipped where there is no sm_90a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.measure.validation import admitting
from moe_gemm.model.edge_cases import ADVERSARIAL_ENDS, RAGGED_K_EDGE_CASES
from moe_gemm.model.problem import BF16, BF16_OPERANDS, FP16, FP16_OPERANDS, FP32, make_problem, problem_from_counts
from moe_gemm.variants.k7 import K7WeightGrad
from moe_gemm.variants.k7.config import LADDER, NOT_YET_RUN

pytestmark = pytest.mark.gpu

# (counts, K, N) beyond the shared edge cases
EXTRA_CASES = {
    "K = 192: the last K tile has one m64 slice": ((65, 0, 190), 192, 136),
    "N = 2000: a partial last N tile": ((300, 1, 129), 128, 2000),
    "N = 72: one partial N box": ((64, 64), 64, 72),
    "a long reduction: 3,000 rows of one expert": ((3000, 17), 64, 256),
    "rows on every side of 64 and 128": ((63, 64, 65, 127, 128, 129, 1, 0, 2), 128, 192),
    "1-row experts": ((1,) * 40, 64, 128),
}
TYPES = {"fp16 -> fp16": (FP16_OPERANDS, FP16), "bf16 -> fp32": (BF16_OPERANDS, FP32),
         "fp16 -> fp32": (FP16_OPERANDS, FP32)}


@pytest.fixture(params=list(LADDER))
def variant(request):
    """Each rung; one not yet run on a GPU skips until `validation run k7 --admit` runs it."""
    if request.param in NOT_YET_RUN and not admitting():
        pytest.skip(f"{request.param} is built, not yet run on a GPU (moe_gemm.variants.k7.config.NOT_YET_RUN)")
    return K7WeightGrad(request.param)


@pytest.mark.parametrize("case", RAGGED_K_EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, case.exact_problem(seed=3), exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize("name", list(EXTRA_CASES))
def test_extra_cases_exact(variant, name, sm90a):
    from moe_gemm.measure.check import verify

    counts, K, N = EXTRA_CASES[name]
    problem = problem_from_counts(np.array(counts), K, N, values="integer", seed=5, ragged="K")
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{name}': {check.describe()}"


@pytest.mark.parametrize("types", list(TYPES))
def test_other_types_exact(variant, types, sm90a):
    from moe_gemm.measure.check import verify

    fmt, out = TYPES[types]
    for counts, K, N in [((0, 70, 1, 129), 128, 192), ((65, 0, 190), 192, 136)]:
        problem = problem_from_counts(np.array(counts), K, N, values="integer", seed=7, ragged="K", fmt=fmt,
                                      out_dtype=out)
        check = verify(variant, problem, exact=True)
        assert check.passed, f"{variant.name} {types} {counts}: {check.describe()}"


@pytest.mark.parametrize("out", [BF16, FP32], ids=["bf16", "fp32"])
def test_random_data_at_the_seed_shape_within_tolerance(variant, out, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, make_problem(64, 4096, 1024, 2688, 1.2, seed=11, ragged="K", out_dtype=out))
    assert check.passed, f"{variant.name}: {check.describe()}"


# Expert ends a model could pass by mistake (model.edge_cases.ADVERSARIAL_ENDS): the kernel must read only
# inside A and dC, reduce exactly the rows its clamped offsets give each expert, and write zeros for the rest.
@pytest.mark.parametrize("ends", list(ADVERSARIAL_ENDS))
def test_any_expert_ends_stay_inside_the_tensors(variant, ends, sm90a):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once
    from moe_gemm.variants.k6.walk import walked_offsets

    tokens, K, N = 640, 128, 256
    problem = problem_from_counts(np.array([160, 160, 160, 160]), K, N, values="integer", seed=11, ragged="K")
    dev = DeviceProblem(problem)
    given = np.array(ADVERSARIAL_ENDS[ends], dtype=np.int64).clip(-(2**31), 2**31 - 1)
    dev.offsets.upload(np.r_[0, given].astype(np.int32))
    out = run_once(variant, dev).astype(np.float32)
    offsets = walked_offsets(given, tokens)
    want = np.zeros((4, K, N))
    for e in range(4):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        want[e] = problem.a[lo:hi].astype(np.float64).T @ problem.b[lo:hi].astype(np.float64)
    np.testing.assert_array_equal(out, want.astype(np.float32).astype(BF16).astype(np.float32))


def test_foreign_rows_holding_nan_add_nothing(variant, sm90a):
    """Rows past the last expert's end hold NaN in A and in dC: a tile whose last stage loads them must zero
    them before its wgmmas, in both operands (0 x NaN is NaN)."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once

    problem = problem_from_counts(np.array([70, 3, 100]), 128, 192, values="integer", seed=2, ragged="K")
    a, dc = problem.a.copy(), problem.b.copy()
    a[150:], dc[150:] = np.nan, np.nan  # expert 2 ends at row 150 (of 173)
    dev = DeviceProblem(problem)
    dev.a.upload(a)
    dev.b.upload(dc)
    dev.offsets.upload(np.array([0, 70, 73, 150], dtype=np.int32))
    out = run_once(variant, dev).astype(np.float32)
    for e, (lo, hi) in enumerate([(0, 70), (70, 73), (73, 150)]):
        want = a[lo:hi].astype(np.float64).T @ dc[lo:hi].astype(np.float64)
        np.testing.assert_array_equal(out[e], want.astype(np.float32).astype(BF16).astype(np.float32))


def test_one_graph_replayed_with_changing_routings(sm90a):
    """Capture once; replay with routings that change every time (M_tot = 0 and one expert holding every row
    among them): every replay exact, empty experts zero."""
    from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceProblem, synchronize
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.model.problem import Problem
    from moe_gemm.model.reference import check_output
    from moe_gemm.model.routing import expert_offsets

    experts, capacity, K, N = 12, 700, 128, 328
    rng = np.random.default_rng(0)
    first = problem_from_counts(np.r_[capacity, np.zeros(experts - 1, dtype=int)], K, N, values="integer", seed=1,
                                ragged="K")
    dev = DeviceProblem(first)
    prepared = GraphReplay(K7WeightGrad("k7/bn192")).prepare(dev)
    routings = [np.zeros(experts, dtype=np.int64), np.r_[np.zeros(experts - 1, dtype=np.int64), capacity]]
    routings += [rng.multinomial(capacity, rng.dirichlet(np.ones(experts) * 0.3)) for _ in range(4)]
    for counts in routings:
        problem = Problem(a=first.a, b=first.b, counts=counts, ragged="K") if counts.sum() == capacity else None
        if problem is None:  # fewer rows: the first rows of the same inputs
            rows = int(counts.sum())
            problem = Problem(a=first.a[:rows], b=first.b[:rows], counts=counts, ragged="K")
        dev.offsets.upload(expert_offsets(problem.counts).astype(np.int32))
        prepared.output.fill_u16(BF16_NAN_BITS)
        prepared.launch()
        synchronize()
        check = check_output(prepared.output.download(), problem, exact=True)
        assert check.passed, f"routing {counts.tolist()}: {check.describe()}"


def test_refusals_before_any_launch(sm90a):
    from moe_gemm.cuda.device import DeviceProblem

    with pytest.raises(ValueError, match="E = 257 experts"):
        K7WeightGrad("k7/bn128").prepare(DeviceProblem(problem_from_counts(np.ones(257, dtype=int), 64, 64,
                                                                           ragged="K")))
    with pytest.raises(ValueError, match="K = 96 is not a multiple of 64"):
        K7WeightGrad("k7/bn128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 96, 64, ragged="K")))
    with pytest.raises(ValueError, match="ragged-K"):
        K7WeightGrad("k7/bn128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 64, 64)))


def test_two_runs_are_bit_identical(variant, sm90a):
    """No atomics: one block reduces all of a tile's rows, in order, so the same inputs give the same bits
    (a skewed routing at the seed shape, random data, fp32 out so that no rounding hides a difference)."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once

    dev = DeviceProblem(make_problem(64, 4096, 1024, 2688, 1.2, seed=5, ragged="K", out_dtype=FP32))
    first, second = run_once(variant, dev), run_once(variant, dev)
    assert first.tobytes() == second.tobytes()
