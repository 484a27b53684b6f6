"""The numpy reference and the output checks: they must catch what a broken kernel produces."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.problem import BF16, make_problem, problem_from_counts
from moe_gemm.model.reference import REL_TOLERANCES, check_output, reference_gemm, relative_error


def _float64_product(problem) -> np.ndarray:
    offsets = problem.offsets
    c = np.zeros((problem.tokens, problem.N))
    for e in range(problem.experts):
        lo, hi = offsets[e], offsets[e + 1]
        c[lo:hi] = problem.a[lo:hi].astype(np.float64) @ problem.b[e].astype(np.float64)
    return c


@pytest.fixture(scope="module")
def integer_problem():
    # Empty expert, experts smaller than and not a multiple of a tile, N not a multiple of 64.
    return problem_from_counts(np.array([70, 0, 5, 33]), K=96, N=80, values="integer", seed=1)


@pytest.fixture(scope="module")
def random_problem():
    return make_problem(experts=6, tokens=300, K=128, N=96, skew=1.2, seed=2)


def _kernel_like_output(problem) -> np.ndarray:
    """What a correct kernel writes: fp32 accumulation, one rounding to bf16."""
    return reference_gemm(problem).astype(BF16)


def test_reference_equals_float64_on_integers(integer_problem) -> None:
    c32 = reference_gemm(integer_problem)
    assert c32.dtype == np.float32
    np.testing.assert_array_equal(c32.astype(np.float64), _float64_product(integer_problem))
    np.testing.assert_array_equal(reference_gemm(integer_problem, np.float64), _float64_product(integer_problem))
    assert np.abs(c32).max() > 0


def test_correct_output_passes_both_checks(integer_problem, random_problem) -> None:
    exact = check_output(_kernel_like_output(integer_problem), integer_problem, exact=True)
    assert exact.passed and exact.mismatches == 0 and exact.nonfinite == 0
    realistic = check_output(_kernel_like_output(random_problem), random_problem)
    assert realistic.passed
    assert 0 < realistic.rel_error < 1e-2  # bf16 rounding of the output alone, about 2**-9
    assert "ok" in realistic.describe()


@pytest.mark.parametrize("exact", [True, False])
def test_one_nan_element_fails(integer_problem, exact: bool) -> None:
    c = _kernel_like_output(integer_problem)
    c[3, 7] = np.nan  # an element the kernel never wrote, still holding the NaN poison
    check = check_output(c, integer_problem, exact=exact)
    assert not check.passed
    assert check.nonfinite == 1
    assert "FAILED" in check.describe()


def test_unwritten_tile_fails(random_problem) -> None:
    c = _kernel_like_output(random_problem)
    c[64:128, 0:64] = np.nan
    check = check_output(c, random_problem)
    assert not check.passed
    assert check.nonfinite == 64 * 64
    assert check.rel_error == float("inf")


def test_single_wrong_element_fails_exact(integer_problem) -> None:
    c = _kernel_like_output(integer_problem)
    old = float(c[10, 11])
    c[10, 11] = BF16.type(old + max(1.0, abs(old) / 32))  # a step larger than bf16's spacing there
    assert float(c[10, 11]) != old
    check = check_output(c, integer_problem, exact=True)
    assert not check.passed
    assert check.mismatches == 1
    assert check.rel_error < REL_TOLERANCES[BF16]  # the realistic metric alone would have let it through


def test_perturbed_output_fails_realistic(random_problem) -> None:
    good = reference_gemm(random_problem)
    c = (good * np.float32(1.02)).astype(BF16)  # 2% relative error everywhere
    check = check_output(c, random_problem)
    assert not check.passed
    assert check.rel_error == pytest.approx(0.02, rel=0.15)


def test_wrong_expert_weights_fail(random_problem) -> None:
    # A kernel that multiplies every row by B[0] gets most experts wrong.
    c = (random_problem.a.astype(np.float32) @ random_problem.b[0].astype(np.float32)).astype(BF16)
    assert not check_output(c, random_problem).passed


def test_relative_error_values() -> None:
    ref = np.array([[3.0, 4.0]])
    assert relative_error(ref, ref) == 0.0
    assert relative_error(np.array([[3.0, 4.5]]), ref) == pytest.approx(0.1)
    assert relative_error(np.array([[np.inf, 4.0]]), ref) == float("inf")


def test_relative_error_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        relative_error(np.zeros((2, 3)), np.zeros((3, 2)))


def test_check_output_shape_mismatch_raises(random_problem) -> None:
    with pytest.raises(ValueError, match="shape"):
        check_output(np.zeros((random_problem.tokens, random_problem.N + 1), dtype=BF16), random_problem)


def test_check_output_dtype_mismatch_raises(random_problem) -> None:
    """A bf16 problem's output is bf16: an fp32 array is some other kernel's output, not one to round."""
    with pytest.raises(ValueError, match="dtype float32 differs from the problem's bfloat16"):
        check_output(reference_gemm(random_problem).copy(), random_problem)


def test_fp32_output_of_the_forward(integer_problem) -> None:
    """fp32 output: exact without the bf16 rounding, and the realistic check at fp32's tolerance."""
    from moe_gemm.model.problem import FP32, Problem

    problem = Problem(a=integer_problem.a, b=integer_problem.b, counts=integer_problem.counts, out_dtype=FP32)
    c = _float64_product(problem).astype(np.float32)
    assert check_output(c, problem, exact=True).passed
    check = check_output(c, problem)
    assert check.passed and check.tolerance == REL_TOLERANCES[FP32] < REL_TOLERANCES[BF16]
    c[1, 2] += 1.0
    assert check_output(c, problem, exact=True).mismatches == 1


def test_empty_problem_checks() -> None:
    problem = problem_from_counts(np.zeros(3, dtype=np.int64), K=16, N=8, seed=0)
    c = np.empty((0, 8), dtype=BF16)
    assert reference_gemm(problem).shape == (0, 8)
    assert check_output(c, problem).passed
    assert check_output(c, problem, exact=True).passed


def test_relative_error_in_slices_is_the_whole_arrays_norm(monkeypatch):
    """relative_error sums over slices (a dB can be billions of elements), in fp32 within a slice and in float64
    across them; the slices must add up to the Frobenius norms of the whole arrays (to the fp32 sums' rounding,
    far inside any tolerance), and a non-finite element in any slice gives inf."""
    import numpy as np

    from moe_gemm.model import reference

    rng = np.random.default_rng(3)
    c_ref = rng.standard_normal((5, 7, 11)).astype(np.float32)
    c = c_ref + 1e-3 * rng.standard_normal(c_ref.shape).astype(np.float32)
    whole = np.linalg.norm(c.astype(np.float64) - c_ref) / np.linalg.norm(c_ref.astype(np.float64))
    monkeypatch.setattr(reference, "RELATIVE_ERROR_CHUNK", 13)  # slices that cut across rows and experts
    assert abs(reference.relative_error(c, c_ref) / whole - 1) < 1e-6
    c[4, 6, 10] = np.nan
    assert reference.relative_error(c, c_ref) == float("inf")


def test_relative_error_sums_again_in_float64_where_fp32_overflows():
    """Elements near 1e30 square past fp32's range: the slice is summed again in float64, not reported as inf."""
    import numpy as np

    c_ref = np.array([[1e30, 1e30]], dtype=np.float32)
    assert relative_error(np.array([[1e30, 0.0]], dtype=np.float32), c_ref) == pytest.approx(np.sqrt(0.5))


def test_relative_error_of_a_large_bf16_output_matches_float64():
    """The path a model projection's dB takes: a bf16 output of millions of elements against the fp32
    reference, slice by slice in threads, within 1e-5 of the float64 norm."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(5)
    c_ref = rng.standard_normal(3 << 20).astype(np.float32)
    c = (c_ref * (1 + 1e-2 * rng.standard_normal(c_ref.shape))).astype(ml_dtypes.bfloat16)
    whole = np.linalg.norm(c.astype(np.float64) - c_ref) / np.linalg.norm(c_ref.astype(np.float64))
    assert relative_error(c, c_ref) == pytest.approx(whole, rel=1e-5)
