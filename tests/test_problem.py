"""Problem construction and the input checks every kernel relies on."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.core.chapters import CHAPTERS
from moe_gemm.model.problem import (
    BF16,
    BF16_OPERANDS,
    INTEGER_RANGE,
    Problem,
    make_problem,
    problem_from_counts,
    useful_flops,
    validate_inputs,
)
from moe_gemm.variants import registry


def _inputs(tokens: int = 12, experts: int = 3, K: int = 16, N: int = 8):
    a = np.ones((tokens, K), dtype=BF16)
    b = np.ones((experts, K, N), dtype=BF16)
    counts = np.array([5, 0, tokens - 5], dtype=np.int64)
    return a, b, counts


def test_valid_inputs_pass() -> None:
    validate_inputs(*_inputs())


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda a, b, c: (a.astype(np.float32), b, c), "A must be bfloat16"),
        (lambda a, b, c: (a, b.astype(np.float16), c), "B must be bfloat16"),
        (lambda a, b, c: (a.reshape(-1), b, c), "A must be 2-D"),
        (lambda a, b, c: (a, b[0], c), "B must be 3-D"),
        (lambda a, b, c: (np.ones((16, 12), dtype=BF16).T, b, c), "A must be C-contiguous"),
        (lambda a, b, c: (a, np.ones((3, 8, 16), dtype=BF16).transpose(0, 2, 1), c), "B must be C-contiguous"),
        (lambda a, b, c: (a.tolist(), b, c), "A must be a numpy array"),
        (lambda a, b, c: (a, b, np.array([5, 0, 6])), "M_tot = 12"),
        (lambda a, b, c: (a, b, np.array([5, 0, 8])), "M_tot"),
        (lambda a, b, c: (a, b, np.array([5, 7])), "one row count per expert"),
        (lambda a, b, c: (a, b, np.array([5.0, 0.0, 7.0])), "non-negative integers"),
        (lambda a, b, c: (a, b, np.array([13, 0, -1])), "non-negative integers"),
        (lambda a, b, c: (a, np.ones((3, 15, 8), dtype=BF16), c), "K"),
        (lambda a, b, c: (np.ones((12, 0), dtype=BF16), np.ones((3, 0, 8), dtype=BF16), c), "K and N must be >= 1"),
    ],
)
def test_bad_inputs_raise(mutate, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        validate_inputs(*mutate(*_inputs()))


def test_k_mismatch_names_both_sides() -> None:
    a, _, counts = _inputs(K=16)
    with pytest.raises(ValueError, match="A has K = 16 but B has K = 24"):
        validate_inputs(a, np.ones((3, 24, 8), dtype=BF16), counts)


def test_problem_rejects_bad_inputs_at_construction() -> None:
    a, b, _ = _inputs()
    with pytest.raises(ValueError, match="M_tot"):
        Problem(a=a, b=b, counts=np.array([1, 1, 1]))


def test_make_problem_shapes_and_properties() -> None:
    p = make_problem(experts=8, tokens=500, K=64, N=48, skew=1.2, seed=0)
    assert p.a.shape == (500, 64) and p.a.dtype == BF16 and p.a.flags.c_contiguous
    assert p.b.shape == (8, 64, 48) and p.b.dtype == BF16 and p.b.flags.c_contiguous
    assert (p.tokens, p.experts, p.K, p.N, p.skew) == (500, 8, 64, 48, 1.2)
    assert int(p.counts.sum()) == 500
    assert p.offsets.tolist()[-1] == 500
    assert p.useful_flops == useful_flops(500, 64, 48) == 2 * 500 * 64 * 48


def test_a_problem_is_the_forward_in_bf16_by_default() -> None:
    p = make_problem(experts=4, tokens=100, K=32, N=16, seed=1)
    assert (p.ragged, p.fmt, p.out_dtype, p.scale_a, p.scale_b) == ("M", BF16_OPERANDS, BF16, None, None)
    assert p.out_shape == (100, 16)
    explicit = make_problem(experts=4, tokens=100, K=32, N=16, seed=1, ragged="M", fmt=BF16_OPERANDS, out_dtype=BF16)
    assert p.a.tobytes() == explicit.a.tobytes() and p.b.tobytes() == explicit.b.tobytes()


@pytest.mark.parametrize(("values", "digest"), [("random", "30a53953a69cfdab"), ("integer", "9f351d8c2d0b16f5")])
def test_the_draws_are_the_values_every_result_was_measured_on(values: str, digest: str) -> None:
    """The seeded inputs behind every results file: a change to how problems are drawn must not move them."""
    import hashlib

    p = make_problem(6, 300, 64, 40, 1.2, values=values, seed=7)  # type: ignore[arg-type]
    assert hashlib.sha256(p.a.tobytes() + p.b.tobytes() + p.counts.tobytes()).hexdigest()[:16] == digest


def test_random_inputs_are_never_zeros() -> None:
    p = make_problem(experts=4, tokens=256, K=64, N=32, seed=3)
    for array in (p.a, p.b):
        values = array.astype(np.float32)
        assert np.count_nonzero(values) == values.size  # no exact zeros at all
        assert np.isfinite(values).all()
    for e in range(p.experts):
        assert np.count_nonzero(p.b[e].astype(np.float32)) > 0


def test_random_inputs_are_fresh_and_seeded() -> None:
    one = make_problem(experts=2, tokens=32, K=16, N=16, seed=5)
    two = make_problem(experts=2, tokens=32, K=16, N=16, seed=5)
    other = make_problem(experts=2, tokens=32, K=16, N=16, seed=6)
    np.testing.assert_array_equal(one.a.astype(np.float32), two.a.astype(np.float32))
    assert not np.array_equal(one.a.astype(np.float32), other.a.astype(np.float32))


def test_random_b_is_scaled_for_unit_variance_outputs() -> None:
    p = make_problem(experts=1, tokens=512, K=1024, N=64, seed=4)
    assert float(p.b.astype(np.float32).std()) == pytest.approx(1024**-0.5, rel=0.05)


def test_large_random_arrays_are_drawn_in_threads_deterministically(monkeypatch) -> None:
    import moe_gemm.model.problem as problem

    monkeypatch.setattr(problem, "THREADED_ELEMENTS", 1000)  # 8 x 64 x 32 = 16,384 elements: threaded
    one = problem.random_values(np.random.default_rng(3), (8, 64, 32), "random", 0.5).astype(np.float32)
    two = problem.random_values(np.random.default_rng(3), (8, 64, 32), "random", 0.5).astype(np.float32)
    np.testing.assert_array_equal(one, two)
    assert np.count_nonzero(one) == one.size
    assert float(one.std()) == pytest.approx(0.5, rel=0.05)
    assert not np.array_equal(one[0], one[1])  # each slab its own stream, not one slab repeated


def test_integer_inputs_are_small_integers() -> None:
    p = problem_from_counts(np.array([40, 0, 24]), K=32, N=16, values="integer", seed=9)
    for array in (p.a, p.b):
        values = array.astype(np.float32)
        assert (values == np.round(values)).all()
        assert values.min() >= -INTEGER_RANGE and values.max() <= INTEGER_RANGE
        assert np.count_nonzero(values) > 0
        assert len(np.unique(values)) == 2 * INTEGER_RANGE + 1  # the whole range shows up


def test_bad_problem_arguments() -> None:
    with pytest.raises(ValueError, match="values"):
        problem_from_counts(np.array([4]), K=8, N=8, values="zeros")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="K must be >= 1"):
        problem_from_counts(np.array([4]), K=0, N=8)
    with pytest.raises(ValueError, match="N must be an integer"):
        problem_from_counts(np.array([4]), K=8, N=8.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        problem_from_counts(np.array([4, -1]), K=8, N=8)


def test_empty_and_single_expert_problems() -> None:
    empty = make_problem(experts=4, tokens=0, K=16, N=8, seed=0)
    assert empty.a.shape == (0, 16) and empty.useful_flops == 0
    single = make_problem(experts=1, tokens=33, K=16, N=8, seed=0)
    assert single.counts.tolist() == [33]


# ---- K = 0: refused before any launch, by the problem and by every kernel's own check ------------

# BK, the K step of each kernel family: k0 stages 16 of K, k1 32, every TMA-fed family one 128-byte
# swizzle row of bf16, 64; k8's e4m3 rows need only TMA's 16 bytes (its stages are 128 deep, the tail zero-filled).
K_STEP = {"k0": 16, "k1": 32, "k2": 64, "k3": 64, "k4": 64, "k5": 64, "k6": 64, "k7": 64, "k8": 16}


def _check_inputs(family: str):
    """The family's check_inputs(K, N); k6's also takes a configuration and the expert count, k7's is a rung's
    check_shape (E, K, N)."""
    import functools
    import importlib

    module = importlib.import_module(f"moe_gemm.variants.{family}")
    if family == "k7":
        return functools.partial(module.K7WeightGrad("k7/bn192").check_shape, 64)
    if family == "k8":
        return functools.partial(module.K8Fp8("k8/blockwise-bm128").check_shape, 64)
    if family == "k6":
        return functools.partial(module.check_inputs, module.LADDER["k6/pingpong-bn192"], 64)
    return module.check_inputs


@pytest.mark.parametrize("family", [c.family for c in CHAPTERS if c.family in registry.families()])
def test_every_kernel_family_refuses_k_zero(family: str) -> None:
    """K = 0 passes every 'multiple of' rule, but no kernel here has a K step to run: k3 would store
    the previous tile's accumulators and k5 would wait forever on its ring. A ValueError before any
    launch names the rule instead."""
    check, bk = _check_inputs(family), K_STEP[family]
    # k6 words its refusals as the torch op does (moe_gemm.variants.k6.rules), k7 likewise (one reason per rule
    # broken), the others as k1 first did
    no_k = {"k6": "k6 cannot take these inputs: K = 0 .*at least one K step",
            "k7": "k7/bn192 cannot take these inputs: K = 0 .*at least one row",
            "k8": "k8/blockwise-bm128 cannot take these inputs: K = 0 .*at least one of each"}.get(
        family, rf"^{family} needs K to be a positive multiple of BK = {bk}\b.*got K = 0")
    no_n = {"k6": "k6 cannot take these inputs: .*N = 0.*one column",
            "k7": "k7/bn192 cannot take these inputs: .*N = 0.*one column",
            "k8": "k8/blockwise-bm128 cannot take these inputs: .*N = 0.*at least one of each"}.get(
        family, rf"^{family} needs N >= 1")
    with pytest.raises(ValueError, match=no_k):
        check(0, 2688)
    check(bk, 2688)  # one K step is enough
    with pytest.raises(ValueError, match=no_n):
        check(bk, 0)


def test_a_problem_with_k_zero_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="K must be >= 1"):
        make_problem(experts=2, tokens=8, K=0, N=8)


def test_every_edge_case_has_an_exact_problem_of_integer_values():
    """What every kernel's exact check runs on: the case's routing and shape, integer-valued bf16 inputs
    (every product and sum exact in fp32), the same for the same seed."""
    from moe_gemm.model.edge_cases import EDGE_CASES

    for case in EDGE_CASES:
        problem = case.exact_problem(seed=3)
        assert list(problem.counts) == list(case.counts) and (problem.K, problem.N) == (case.K, case.N)
        a = problem.a.astype(np.float32)
        assert np.array_equal(a, np.round(a))
        assert np.array_equal(case.exact_problem(seed=3).b.astype(np.float32), problem.b.astype(np.float32))
