"""The weight gradient (ragged K) and the FP8 GEMM (rowwise and blockwise scales) before any kernel exists:
their problems, references (against float64 loops written here), checks, edge cases, device-buffer
choices and records, and the refusal of every existing variant, all on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.edge_cases import EDGE_CASES, FP8_EDGE_CASES, LARGE_VALUE, RAGGED_K_EDGE_CASES
from moe_gemm.model.problem import (
    BF16,
    BF16_OPERANDS,
    FP8_BLOCKWISE,
    FP8_ROWWISE,
    FP16,
    FP16_OPERANDS,
    FP32,
    OperandFormat,
    Problem,
    make_problem,
    problem_from_counts,
    validate_inputs,
)
from moe_gemm.model.quantize import BLOCK, E4M3, E4M3_MAX
from moe_gemm.model.reference import REL_TOLERANCES, check_output, reference_gemm

# ---- independent float64 references: per-expert, per-row and per-group loops -------------------------


def _real_a(problem: Problem) -> np.ndarray:
    """A's real values, scale by scale, with plain loops over rows and K blocks."""
    a = problem.a.astype(np.float64)
    if problem.fmt == FP8_ROWWISE:
        for m in range(problem.tokens):
            a[m] *= problem.scale_a[m]
    elif problem.fmt == FP8_BLOCKWISE:
        for m in range(problem.tokens):
            for kb in range(problem.scale_a.shape[1]):
                a[m, kb * BLOCK:(kb + 1) * BLOCK] *= problem.scale_a[m, kb]
    return a


def _real_b(problem: Problem) -> np.ndarray:
    """B's real values: scale_b[e, n] per column (rowwise), scale_b[e, kb, nb] per 128 x 128 block."""
    b = problem.b.astype(np.float64)
    if problem.fmt == FP8_ROWWISE:
        for e in range(problem.experts):
            for n in range(problem.N):
                b[e, :, n] *= problem.scale_b[e, n]
    elif problem.fmt == FP8_BLOCKWISE:
        for e in range(problem.experts):
            for kb in range(problem.scale_b.shape[1]):
                for nb in range(problem.scale_b.shape[2]):
                    b[e, kb * BLOCK:(kb + 1) * BLOCK, nb * BLOCK:(nb + 1) * BLOCK] *= problem.scale_b[e, kb, nb]
    return b


def float64_product(problem: Problem) -> np.ndarray:
    a, b = _real_a(problem), _real_b(problem)
    start = 0
    if problem.ragged == "M":
        c = np.zeros((problem.tokens, problem.N))
        for e, rows in enumerate(problem.counts):
            c[start:start + rows] = a[start:start + rows] @ b[e]
            start += rows
        return c
    db = np.zeros((problem.experts, problem.K, problem.N))
    for e, rows in enumerate(problem.counts):
        for m in range(start, start + rows):  # dB[e] is a sum of outer products, one per row of expert e
            db[e] += np.outer(a[m], b[m])
        start += rows
    return db


def rounded(values: np.ndarray, problem: Problem) -> np.ndarray:
    """What a correct kernel writes: its fp32 sum rounded once to the output dtype."""
    return values.astype(np.float32).astype(problem.out_dtype)


# ---- ragged K: the weight gradient ------------------------------------------------------------------

@pytest.fixture(scope="module")
def wgrad_integer() -> Problem:
    return problem_from_counts(np.array([70, 0, 5, 33, 0]), K=48, N=40, values="integer", seed=1, ragged="K")


@pytest.fixture(scope="module")
def wgrad_random() -> Problem:
    return problem_from_counts(np.array([90, 0, 120, 60]), K=64, N=48, seed=2, ragged="K")


def test_a_ragged_k_problem_keeps_the_forwards_names(wgrad_integer) -> None:
    p = wgrad_integer
    assert p.a.shape == (108, 48) and p.b.shape == (108, 40)  # A [M_tot, K], dC [M_tot, N], row-major
    assert (p.tokens, p.experts, p.K, p.N) == (108, 5, 48, 40)
    assert p.out_shape == (5, 48, 40) and p.out_dtype == BF16
    assert p.useful_flops == 2 * 108 * 48 * 40  # the forward's formula


def test_ragged_k_reference_equals_float64_loops(wgrad_integer, wgrad_random) -> None:
    for problem in (wgrad_integer, wgrad_random):
        expected = float64_product(problem)
        np.testing.assert_allclose(reference_gemm(problem, np.float64), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(reference_gemm(problem), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(reference_gemm(wgrad_integer, np.float64), float64_product(wgrad_integer))
    assert (reference_gemm(wgrad_integer)[[1, 4]] == 0).all()  # experts with no rows: exact zeros


def test_a_correct_weight_gradient_passes_both_checks(wgrad_integer, wgrad_random) -> None:
    exact = check_output(rounded(float64_product(wgrad_integer), wgrad_integer), wgrad_integer, exact=True)
    assert exact.passed and exact.mismatches == 0, exact.describe()
    realistic = check_output(rounded(float64_product(wgrad_random), wgrad_random), wgrad_random)
    assert realistic.passed and 0 < realistic.rel_error < REL_TOLERANCES[BF16], realistic.describe()


def _moved_boundary(problem: Problem, boundary: int) -> np.ndarray:
    """dB from a kernel that puts the first row of expert ``boundary`` into the expert before it."""
    counts = problem.counts.copy()
    counts[boundary - 1] += 1
    counts[boundary] -= 1
    shifted = Problem(a=problem.a, b=problem.b, counts=counts, ragged="K")
    return rounded(float64_product(shifted), problem)


def test_an_off_by_one_expert_boundary_fails(wgrad_integer, wgrad_random) -> None:
    assert not check_output(_moved_boundary(wgrad_integer, 3), wgrad_integer, exact=True).passed
    check = check_output(_moved_boundary(wgrad_random, 3), wgrad_random)
    assert not check.passed and check.rel_error > REL_TOLERANCES[BF16]


@pytest.mark.parametrize("exact", [True, False])
def test_a_nonzero_empty_expert_fails(wgrad_integer, wgrad_random, exact: bool) -> None:
    """An expert with no rows must read exactly zero: a kernel that skipped it leaves stale memory, which
    a relative error over all of dB can hide, so those elements count as mismatches in both checks."""
    problem = wgrad_integer if exact else wgrad_random
    db = rounded(float64_product(problem), problem)
    empty = int(np.flatnonzero(problem.counts == 0)[0])
    db[empty, 3, 4] = 1e-3
    check = check_output(db, problem, exact=exact)
    assert not check.passed and check.mismatches == 1 and check.nonfinite == 0
    assert "1 mismatches" in check.describe()
    if not exact:
        assert check.rel_error < REL_TOLERANCES[BF16]  # the relative error alone would have let it through


@pytest.mark.parametrize("exact", [True, False])
def test_a_nan_in_the_weight_gradient_fails(wgrad_integer, exact: bool) -> None:
    db = rounded(float64_product(wgrad_integer), wgrad_integer)
    db[2, 0, 0] = np.nan  # an element never written, still holding the poison
    check = check_output(db, wgrad_integer, exact=exact)
    assert not check.passed and check.nonfinite == 1


def test_ragged_k_with_no_rows_wants_all_zeros() -> None:
    problem = problem_from_counts(np.zeros(3, dtype=np.int64), K=16, N=8, seed=0, ragged="K")
    zeros = np.zeros((3, 16, 8), dtype=BF16)
    assert reference_gemm(problem).shape == (3, 16, 8) and not reference_gemm(problem).any()
    assert check_output(zeros, problem, exact=True).passed and check_output(zeros, problem).passed
    poisoned = np.full((3, 16, 8), np.nan, dtype=BF16)
    assert not check_output(poisoned, problem).passed


def test_fp32_output_is_compared_without_bf16_rounding() -> None:
    """dB sums of 300 integer products reach past 256, where bf16 loses integers: an fp32 output must hold
    them exactly, and one rounded through bf16 on the way fails."""
    problem = problem_from_counts(np.array([300, 0, 200]), K=32, N=24, values="integer", seed=3, ragged="K",
                                  out_dtype=FP32)
    exact = float64_product(problem)
    assert np.abs(exact).max() > 256 and (exact != exact.astype(BF16).astype(np.float64)).any()
    assert check_output(exact.astype(np.float32), problem, exact=True).passed
    through_bf16 = exact.astype(np.float32).astype(BF16).astype(np.float32)
    assert not check_output(through_bf16, problem, exact=True).passed
    realistic = check_output(exact.astype(np.float32), problem)
    assert realistic.passed and realistic.tolerance == REL_TOLERANCES[FP32]


def test_the_output_must_have_the_problems_dtype_and_shape(wgrad_integer) -> None:
    db = rounded(float64_product(wgrad_integer), wgrad_integer)
    with pytest.raises(ValueError, match="dtype float32 differs from the problem's bfloat16"):
        check_output(db.astype(np.float32), wgrad_integer)
    with pytest.raises(ValueError, match="shape"):
        check_output(db[:, :, :-1], wgrad_integer)
    with pytest.raises(ValueError, match="shape"):
        check_output(np.zeros((wgrad_integer.tokens, wgrad_integer.N), dtype=BF16), wgrad_integer)


def test_the_swiglu_reference_is_the_forwards_only(wgrad_random) -> None:
    from moe_gemm.model.reference import swiglu_reference

    with pytest.raises(ValueError, match="ragged-M"):
        swiglu_reference(wgrad_random)


# ---- FP8: rowwise and blockwise -----------------------------------------------------------------------

@pytest.fixture(scope="module", params=[FP8_BLOCKWISE, FP8_ROWWISE], ids=str)
def fp8_random(request) -> Problem:
    # K = 320 and N = 200: partial last blocks along both, for the blockwise scales
    return make_problem(experts=5, tokens=400, K=320, N=200, skew=1.0, seed=4, fmt=request.param)


def test_fp8_problems_hold_e4m3_operands_and_fp32_scales(fp8_random) -> None:
    p = fp8_random
    assert p.a.dtype == E4M3 and p.b.dtype == E4M3 and p.b.shape == (5, 320, 200)  # B stays the logical [E, K, N]
    assert p.scale_a.dtype == np.float32 and p.scale_b.dtype == np.float32
    if p.fmt == FP8_BLOCKWISE:
        assert p.scale_a.shape == (400, 3) and p.scale_b.shape == (5, 3, 2)  # ceil(320 / 128), ceil(200 / 128)
    else:
        assert p.scale_a.shape == (400,) and p.scale_b.shape == (5, 200)
    assert p.out_shape == (400, 200) and p.useful_flops == 2 * 400 * 320 * 200
    assert np.abs(p.a.astype(np.float32)).max() == E4M3_MAX  # amax scaling: each group reaches 448


def test_fp8_operands_are_quantized_to_the_same_bits_by_one_thread_or_several(fp8_random, monkeypatch) -> None:
    """problem_from_values quantizes A in row slabs and B expert by expert in a thread pool: the pieces land
    where they belong, so the bits are the serial quantization's (moe_gemm.model.quantize.quantize)."""
    from moe_gemm.model import problem
    from moe_gemm.model.quantize import groups, quantize

    p = fp8_random
    a, b = p.a.astype(np.float32) * 0.7 + 0.01, p.b.astype(np.float32) * 1.3  # not e4m3-exact any more
    monkeypatch.setattr(problem, "QUANTIZE_WORKERS", 1)
    serial = problem.problem_from_values(a, b, p.counts, fmt=p.fmt)
    monkeypatch.setattr(problem, "QUANTIZE_WORKERS", 4)
    threaded = problem.problem_from_values(a, b, p.counts, fmt=p.fmt)
    group_a, _ = groups(p.fmt.scaling, a.shape[1])
    q_a, scale_a = quantize(a, group_a)
    for got in (serial, threaded):
        assert np.array_equal(got.a.view(np.uint8), q_a.view(np.uint8))
        assert np.array_equal(got.scale_a, scale_a.reshape(got.scale_a.shape))
    assert np.array_equal(serial.b.view(np.uint8), threaded.b.view(np.uint8))
    assert np.array_equal(serial.scale_b, threaded.scale_b)


def test_fp8_reference_is_the_product_of_dequantized_operands(fp8_random) -> None:
    expected = float64_product(fp8_random)
    np.testing.assert_allclose(reference_gemm(fp8_random, np.float64), expected, rtol=1e-12, atol=1e-12)
    check = check_output(rounded(expected, fp8_random), fp8_random)
    assert check.passed and check.rel_error < REL_TOLERANCES[BF16], check.describe()


def test_fp8_scales_matter_to_the_check(fp8_random) -> None:
    """Outputs from kernels that misapply the scales fail: one that ignores B's scales, and one that uses
    A's first K-block (or row) scale everywhere."""
    p = fp8_random
    unscaled_b = Problem(a=p.a, b=p.b, counts=p.counts, fmt=p.fmt, scale_a=p.scale_a,
                         scale_b=np.ones_like(p.scale_b))
    assert not check_output(rounded(float64_product(unscaled_b), p), p).passed
    one_scale = p.scale_a.copy()
    one_scale[...] = p.scale_a.reshape(-1)[0]
    first_scale_only = Problem(a=p.a, b=p.b, counts=p.counts, fmt=p.fmt, scale_a=one_scale, scale_b=p.scale_b)
    assert not check_output(rounded(float64_product(first_scale_only), p), p).passed


@pytest.mark.parametrize("fmt", [FP8_BLOCKWISE, FP8_ROWWISE], ids=str)
def test_integer_fp8_problems_are_exact(fmt: OperandFormat) -> None:
    """Integer draws quantized with power-of-two scales stay integers: the exact check applies."""
    problem = problem_from_counts(np.array([40, 0, 90]), K=256, N=136, values="integer", seed=5, fmt=fmt)
    real_a = _real_a(problem)
    assert np.array_equal(real_a, np.round(real_a)) and np.abs(real_a).max() == 3
    c = rounded(float64_product(problem), problem)
    assert check_output(c, problem, exact=True).passed
    c[7, 9] = BF16.type(float(c[7, 9]) + 1.0)
    assert check_output(c, problem, exact=True).mismatches == 1


def test_fp16_operands() -> None:
    problem = make_problem(experts=3, tokens=50, K=32, N=16, seed=6, fmt=FP16_OPERANDS, out_dtype=FP32)
    assert problem.a.dtype == FP16 and problem.b.dtype == FP16
    assert len(np.unique(problem.a.astype(np.float32))) > 256  # drawn as fp16, not bf16 values widened
    expected = float64_product(problem)
    assert check_output(expected.astype(np.float32), problem).passed


# ---- the edge cases ----------------------------------------------------------------------------------

def test_the_forward_edge_cases_are_unchanged() -> None:
    """GPU tests and the sanitizer run every kernel on these: the same routings and shapes as ever."""
    assert [(c.name, c.counts, c.K, c.N, c.ragged, c.fmt, c.out_dtype) for c in EDGE_CASES] == [
        ("empty experts", (0, 70, 0, 0, 130, 0), 128, 200, "M", BF16_OPERANDS, BF16),
        ("m_e smaller than BM", (1, 5, 17, 31), 128, 200, "M", BF16_OPERANDS, BF16),
        ("m_e not a multiple of BM", (33, 65, 129, 200), 128, 200, "M", BF16_OPERANDS, BF16),
        ("one expert holds every row", (0, 0, 300, 0), 128, 200, "M", BF16_OPERANDS, BF16),
        ("a single expert (E = 1)", (257,), 128, 200, "M", BF16_OPERANDS, BF16),
        ("N not a multiple of BN", (64, 64), 128, 72, "M", BF16_OPERANDS, BF16),
        ("K of one BK step", (40, 90), 64, 200, "M", BF16_OPERANDS, BF16),
        ("no rows at all (M_tot = 0)", (0, 0, 0), 128, 200, "M", BF16_OPERANDS, BF16),
    ]


@pytest.mark.parametrize("case", RAGGED_K_EDGE_CASES + FP8_EDGE_CASES, ids=lambda c: c.name)
def test_every_new_edge_case_builds_and_references(case) -> None:
    problem = case.exact_problem(seed=3)
    assert (problem.ragged, problem.fmt, problem.out_dtype) == (case.ragged, case.fmt, case.out_dtype)
    assert tuple(problem.counts) == case.counts and (problem.K, problem.N) == (case.K, case.N)
    expected = float64_product(problem)
    np.testing.assert_array_equal(reference_gemm(problem, np.float64), expected)
    assert np.array_equal(expected, np.round(expected))  # integer-valued: the exact check applies
    c = rounded(expected, problem)
    assert check_output(c, problem, exact=True).passed
    if c.size:
        c.reshape(-1)[c.size // 2] = np.nan
        assert not check_output(c, problem, exact=True).passed
    np.testing.assert_array_equal(case.exact_problem(seed=3).a.view(np.uint8), problem.a.view(np.uint8))


def test_ragged_k_edge_cases_cover_what_the_weight_gradient_must_pass() -> None:
    by_name = {c.name: c for c in RAGGED_K_EDGE_CASES}
    assert all(c.ragged == "K" for c in RAGGED_K_EDGE_CASES)
    assert any(0 in c.counts and sum(c.counts) for c in RAGGED_K_EDGE_CASES)  # experts with no rows
    assert any(sorted(c.counts)[-2] == 0 and sum(c.counts) for c in RAGGED_K_EDGE_CASES if len(c.counts) > 1)
    assert any(len(c.counts) == 1 for c in RAGGED_K_EDGE_CASES)
    assert any(c.out_dtype == FP32 for c in RAGGED_K_EDGE_CASES)
    every_offset = by_name["dB: expert boundaries at every row offset mod 64"]
    starts = np.cumsum((0,) + every_offset.counts)[:-1]
    assert set(starts % 64) == set(range(64))
    empty = next(c for c in RAGGED_K_EDGE_CASES if sum(c.counts) == 0).exact_problem(seed=0)
    assert empty.out_shape == (3, 128, 200) and not reference_gemm(empty).any()


def test_fp8_edge_cases_plant_what_they_say() -> None:
    for case in FP8_EDGE_CASES:
        problem = case.exact_problem(seed=3)
        if "all-zero" in case.name:
            first_a = problem.a[0, :BLOCK] if case.fmt == FP8_BLOCKWISE else problem.a[0]
            assert (first_a.astype(np.float32) == 0).all()
            assert problem.scale_a.reshape(problem.tokens, -1)[0, 0] == 1.0
            assert problem.scale_b.reshape(problem.experts, -1)[0, 0] == 1.0
        elif "large value" in case.name:
            assert float(problem.a[0, 0]) == E4M3_MAX and float(problem.b[-1, 0, 0]) == E4M3_MAX
            assert problem.scale_a.reshape(problem.tokens, -1)[0, 0] == LARGE_VALUE / E4M3_MAX
            assert float64_product(problem)[0, 0] != 0
        else:
            assert case.K % BLOCK and problem.scale_a.shape == (problem.tokens, 2)
    assert {c.fmt for c in FP8_EDGE_CASES} == {FP8_BLOCKWISE, FP8_ROWWISE}


# ---- bad inputs ---------------------------------------------------------------------------------------

def _wgrad_inputs():
    a = np.ones((12, 16), dtype=BF16)
    dc = np.ones((12, 8), dtype=BF16)
    return a, dc, np.array([5, 0, 7])


def _fp8_inputs():
    p = problem_from_counts(np.array([5, 0, 7]), 16, 8, seed=0, fmt=FP8_BLOCKWISE)
    return {"a": p.a, "b": p.b, "counts": p.counts, "fmt": FP8_BLOCKWISE, "scale_a": p.scale_a, "scale_b": p.scale_b}


@pytest.mark.parametrize(("change", "pattern"), [
    (lambda a, dc, c: {"b": np.ones((3, 16, 8), dtype=BF16)}, "dC must be 2-D"),
    (lambda a, dc, c: {"b": dc.astype(np.float32)}, "dC must be bfloat16"),
    (lambda a, dc, c: {"b": np.ones((11, 8), dtype=BF16)}, "A has M_tot = 12 rows but dC has 11"),
    (lambda a, dc, c: {"counts": np.array([5, 0, 6])}, "counts sum to 11 but A has M_tot = 12"),
    (lambda a, dc, c: {"counts": np.array([[5, 7]])}, "one row count per expert"),
    (lambda a, dc, c: {"b": np.ones((12, 0), dtype=BF16)}, "K and N must be >= 1"),
    (lambda a, dc, c: {"fmt": FP8_ROWWISE}, "defined for ragged-M problems only"),
    (lambda a, dc, c: {"out_dtype": np.float64}, "output must be bf16, fp16 or fp32"),
    (lambda a, dc, c: {"ragged": "N"}, "ragged axis must be one of"),
])
def test_bad_ragged_k_inputs_raise(change, pattern: str) -> None:
    a, dc, counts = _wgrad_inputs()
    kwargs = {"a": a, "b": dc, "counts": counts, "ragged": "K", **change(a, dc, counts)}
    with pytest.raises(ValueError, match=pattern):
        validate_inputs(**kwargs)


@pytest.mark.parametrize(("change", "pattern"), [
    (lambda p: {"a": p["a"].astype(np.float32).astype(BF16)}, "A must be float8_e4m3fn"),
    (lambda p: {"scale_a": None}, "scale_a must be a numpy array"),
    (lambda p: {"scale_a": np.ones((12, 2), dtype=np.float32)}, r"scale_a of e4m3-blockwise .* must be \[12, 1\]"),
    (lambda p: {"scale_b": p["scale_b"].astype(np.float64)}, "scale_b must be float32"),
    (lambda p: {"scale_b": np.ones((3, 8), dtype=np.float32)}, r"scale_b of e4m3-blockwise .* must be \[3, 1, 1\]"),
    (lambda p: {"scale_b": np.zeros_like(p["scale_b"])}, "scale_b must be finite and > 0"),
    (lambda p: {"scale_a": np.full_like(p["scale_a"], np.inf)}, "scale_a must be finite and > 0"),
    (lambda p: {"fmt": FP8_ROWWISE}, r"scale_a of e4m3-rowwise operands must be \[12\]"),
    (lambda p: {"fmt": BF16_OPERANDS}, "A must be bfloat16"),
])
def test_bad_fp8_inputs_raise(change, pattern: str) -> None:
    inputs = _fp8_inputs()
    validate_inputs(**inputs)
    with pytest.raises(ValueError, match=pattern):
        validate_inputs(**{**inputs, **change(inputs)})


def test_sixteen_bit_operands_take_no_scales() -> None:
    a, b = np.ones((4, 8), dtype=BF16), np.ones((1, 8, 8), dtype=BF16)
    with pytest.raises(ValueError, match="bf16 operands take no scales"):
        validate_inputs(a, b, np.array([4]), scale_a=np.ones(4, dtype=np.float32))


@pytest.mark.parametrize(("args", "pattern"), [
    (("e4m3",), "e4m3 operands need a scale granularity"),
    (("e4m3", "per-tensor"), "e4m3 operands need a scale granularity"),
    (("bf16", "rowwise"), "bf16 operands take no scales"),
    (("fp4",), "operands must be one of bf16, fp16, e4m3"),
])
def test_bad_operand_formats_raise(args, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        OperandFormat(*args)


def test_constructors_refuse_undefined_kinds_before_drawing() -> None:
    with pytest.raises(ValueError, match="ragged-M problems only"):
        make_problem(4, 100, 128, 128, ragged="K", fmt=FP8_BLOCKWISE)
    with pytest.raises(ValueError, match="output must be bf16, fp16 or fp32"):
        problem_from_counts(np.array([3]), 8, 8, out_dtype=np.float64)


# ---- device buffers and records, without a GPU -----------------------------------------------------

def test_the_output_is_allocated_as_the_problem_says(wgrad_integer, fp8_random) -> None:
    from moe_gemm.cuda.device import output_spec

    assert output_spec(make_problem(4, 100, 64, 48, seed=0)) == ((100, 48), BF16)
    assert output_spec(make_problem(4, 100, 64, 256, seed=0), columns=128) == ((100, 128), BF16)  # SwiGLU's C
    assert output_spec(wgrad_integer) == ((5, 48, 40), BF16)
    fp32 = problem_from_counts(np.array([3, 0]), 16, 8, seed=0, ragged="K", out_dtype=FP32)
    assert output_spec(fp32) == ((2, 16, 8), FP32)
    assert output_spec(fp8_random) == ((400, 200), BF16)
    with pytest.raises(ValueError, match="columns"):
        output_spec(wgrad_integer, columns=20)


def test_the_poison_is_the_nan_of_the_outputs_dtype() -> None:
    from moe_gemm.cuda.device import BF16_NAN_BITS, FP32_NAN_BITS, poison

    assert np.isnan(np.array(BF16_NAN_BITS, dtype=np.uint16).view(BF16))
    assert np.isnan(np.array(FP32_NAN_BITS, dtype=np.uint32).view(np.float32))

    class Output:
        def __init__(self, dtype) -> None:
            self.dtype, self.fills = np.dtype(dtype), []

        def fill_u16(self, bits: int) -> None:
            self.fills.append(("u16", bits))

        def fill_u32(self, bits: int) -> None:
            self.fills.append(("u32", bits))

    for dtype, fill in ((BF16, ("u16", BF16_NAN_BITS)), (FP32, ("u32", FP32_NAN_BITS))):
        output = Output(dtype)
        poison(output)
        assert output.fills == [fill]
    with pytest.raises(ValueError, match="no NaN poison"):
        poison(Output(np.int32))


def test_fp8_and_bf16_reach_numba_and_torch_as_raw_words() -> None:
    from moe_gemm.cuda.device import interface_typestr

    assert interface_typestr(E4M3) == "|u1" and interface_typestr(BF16) == "<u2"
    assert interface_typestr(np.float32) == "<f4" and interface_typestr(np.int32) == "<i4"


def test_b_is_uploaded_logical_or_k_major(fp8_random, wgrad_integer) -> None:
    from moe_gemm.cuda.device import host_b

    assert host_b(fp8_random, "kn") is fp8_random.b
    nk = host_b(fp8_random, "nk")
    assert nk.shape == (5, 200, 320) and nk.flags.c_contiguous and nk.dtype == E4M3
    assert nk[3, 17, 300].view(np.uint8) == fp8_random.b[3, 300, 17].view(np.uint8)
    with pytest.raises(ValueError, match="dC is"):
        host_b(wgrad_integer, "nk")
    with pytest.raises(ValueError, match="layout"):
        host_b(fp8_random, "mk")  # type: ignore[arg-type]


def test_records_name_the_kind_only_when_it_is_not_the_forwards(wgrad_integer) -> None:
    """Every record before chapter 09 carries exactly these fields, so the results files compare equal."""
    from moe_gemm.measure.check import workload_fields

    forward = workload_fields(make_problem(8, 500, 64, 48, 1.2, seed=0))
    assert forward == {"experts": 8, "K": 64, "N": 48, "tokens": 500, "skew": 1.2}
    wgrad = workload_fields(wgrad_integer)
    assert list(wgrad) == ["experts", "K", "N", "tokens", "skew", "ragged"] and wgrad["ragged"] == "K"
    fp8 = workload_fields(make_problem(4, 100, 128, 128, seed=0, fmt=FP8_BLOCKWISE, out_dtype=FP32))
    assert fp8["format"] == "e4m3-blockwise" and fp8["out_dtype"] == "fp32" and "ragged" not in fp8


class _Output:
    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype, self.fills = shape, np.dtype(dtype), []

    def fill_u16(self, bits: int) -> None:
        self.fills.append(bits)

    def fill_u32(self, bits: int) -> None:
        self.fills.append(bits)

    def download(self) -> np.ndarray:
        return np.zeros(self.shape, dtype=self.dtype)


@pytest.mark.parametrize(("ragged", "out_dtype", "launches"), [("M", BF16, 0), ("K", FP32, 1)])
def test_run_once_poisons_and_launches_by_the_output(monkeypatch, ragged, out_dtype, launches) -> None:
    """With M_tot = 0 the forward has nothing to write, but the weight gradient must still write zeros: it
    launches. The output comes back in its own dtype, fp32 included."""
    from moe_gemm.cuda.device import NAN_BITS, output_spec
    from moe_gemm.cuda.variant import Prepared
    from moe_gemm.measure import check

    monkeypatch.setattr(check, "synchronize", lambda: None)
    problem = problem_from_counts(np.zeros(3, dtype=np.int64), 16, 8, seed=0, ragged=ragged, out_dtype=out_dtype)
    output, launched = _Output(*output_spec(problem)), []

    class Variant:
        name = "fake"

        def prepare(self, dev):
            return Prepared(launch=lambda: launched.append(1), output=output)

    class Dev:
        pass

    dev = Dev()
    dev.problem = problem
    out = check.run_once(Variant(), dev)
    assert output.fills == [NAN_BITS[np.dtype(out_dtype)]] and len(launched) == launches
    assert out.dtype == out_dtype and out.shape == problem.out_shape


# ---- the variants refuse what they do not take -------------------------------------------------------

class _FakeArray:
    def __init__(self, host: np.ndarray) -> None:
        self.shape, self.dtype, self.ptr = host.shape, host.dtype, 0x10000


class _FakeDeviceProblem:
    """What prepare() reads before it looks for a GPU: nothing here touches one."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.a, self.b, self.offsets = _FakeArray(problem.a), _FakeArray(problem.b), _FakeArray(problem.counts)
        self.scale_a = None if problem.scale_a is None else _FakeArray(problem.scale_a)
        self.scale_b = None if problem.scale_b is None else _FakeArray(problem.scale_b)

    def new_output(self, columns=None):
        raise AssertionError("prepare() allocated an output before refusing the problem")


def _one_variant_per_family():
    from moe_gemm.variants import registry

    return [registry.factory(registry.names(family)[0])() for family in registry.families()]


def _peers():
    from moe_gemm.variants.peer.quack import QuackVarlenM
    from moe_gemm.variants.peer.torch import TorchGroupedMM, TorchLoop

    return [TorchGroupedMM(), TorchGroupedMM(k_major=True), TorchLoop(), QuackVarlenM()]


def _unsupported_problems():
    return [
        (problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1, ragged="K"),
         "this one is ragged along K"),
        (problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1, fmt=FP8_BLOCKWISE),
         "this one has e4m3-blockwise operands"),
        (problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1, fmt=FP8_ROWWISE),
         "this one has e4m3-rowwise operands"),
        (problem_from_counts(np.array([40, 90]), 128, 200, values="integer", seed=1, out_dtype=FP32),
         "this one wants fp32 output"),
    ]


def test_the_protocol_check_needs_only_the_problem() -> None:
    from moe_gemm.variants.compiled import require_takes

    require_takes("k2/tma-ws", problem_from_counts(np.array([40, 90]), 128, 200, seed=1))
    for problem, says in _unsupported_problems():
        with pytest.raises(ValueError, match=rf"^k2/tma-ws takes ragged-M bf16 problems with bf16 "
                                             rf"output; {says}$"):
            require_takes("k2/tma-ws", problem)


def test_every_compiled_variant_refuses_other_kinds_in_prepare(monkeypatch) -> None:
    """Through the variant's own prepare(), before any GPU, compile or allocation."""
    from moe_gemm.variants.compiled import CompiledVariant

    compiled = [v for v in _one_variant_per_family() if isinstance(v, CompiledVariant)]
    assert {v.name.split("/")[0] for v in compiled} == {"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"}
    fp8 = next(v for v in compiled if v.name.startswith("k8/"))
    compiled.remove(fp8)
    assert (fp8.ragged_axes, fp8.formats, fp8.out_dtypes) == (("M",), (FP8_BLOCKWISE,), (BF16, FP32))
    for problem, says in _unsupported_problems():
        if problem.fmt == FP8_BLOCKWISE or problem.out_dtype == FP32:
            continue
        with pytest.raises(ValueError, match=rf"^{fp8.name} takes ragged-M e4m3-blockwise .*; {says}$"):
            fp8.prepare(_FakeDeviceProblem(problem))
    weight_gradient = next(v for v in compiled if v.name.startswith("k7/"))
    assert (weight_gradient.ragged_axes, weight_gradient.formats, weight_gradient.out_dtypes) == \
        (("K",), (BF16_OPERANDS, FP16_OPERANDS), (BF16, FP16, FP32))
    with pytest.raises(ValueError, match=rf"^{weight_gradient.name} takes ragged-K .*; this one is ragged along M$"):
        weight_gradient.prepare(_FakeDeviceProblem(problem_from_counts(np.array([40, 90]), 128, 200, seed=1)))
    for variant in (v for v in compiled if v is not weight_gradient):
        k6 = variant.name.startswith("k6/")  # bf16 or fp16 operands, a bf16, fp16 or fp32 output
        assert (variant.ragged_axes, variant.formats, variant.out_dtypes) == \
            (("M",), (BF16_OPERANDS, FP16_OPERANDS), (BF16, FP16, FP32)) if k6 else \
            (("M",), (BF16_OPERANDS,), (BF16,))
        for problem, says in _unsupported_problems():
            if k6 and problem.out_dtype == FP32:
                continue
            with pytest.raises(ValueError, match=rf"^{variant.name} takes ragged-M bf16 .*; {says}$"):
                variant.prepare(_FakeDeviceProblem(problem))


@pytest.mark.parametrize("which", ["k0", "peers"])
def test_k0_and_the_peers_refuse_other_kinds(which) -> None:
    if which == "k0":
        pytest.importorskip("numba.cuda")  # k0's prepare asks for numba-cuda first
        variants = [v for v in _one_variant_per_family() if v.name == "k0"]
    else:
        variants = _peers()
    for variant in variants:
        for problem, says in _unsupported_problems():
            with pytest.raises(ValueError, match=rf"^{variant.name} takes ragged-M bf16 .*; {says}$"):
                variant.prepare(_FakeDeviceProblem(problem))


def test_a_variant_declares_what_it_takes() -> None:
    """A future weight-gradient or FP8 kernel overrides the class attributes; require_inputs then also
    checks that the scales sit on the device as the problem holds them."""
    from moe_gemm.variants.compiled import CompiledVariant

    class Fp8Rowwise(CompiledVariant):
        name = "k8/test"
        formats = (FP8_ROWWISE,)
        out_dtypes = (BF16, FP32)

    class WeightGradient(CompiledVariant):
        name = "k7/test"
        ragged_axes = ("K",)

    fp8 = problem_from_counts(np.array([40, 90]), 128, 200, seed=1, fmt=FP8_ROWWISE, out_dtype=FP32)
    dev = _FakeDeviceProblem(fp8)
    Fp8Rowwise().require_inputs(dev)
    dev.scale_b = _FakeArray(fp8.scale_b.astype(np.float16))
    with pytest.raises(ValueError, match=r"k8/test needs scale_b as fp32 \(2, 200\) on the device, got float16"):
        Fp8Rowwise().require_inputs(dev)
    with pytest.raises(ValueError, match="takes ragged-M e4m3-rowwise problems with bf16 or fp32 output; this one "
                                         "has e4m3-blockwise"):
        Fp8Rowwise().require_inputs(_FakeDeviceProblem(problem_from_counts(np.array([4]), 128, 128, seed=0,
                                                                             fmt=FP8_BLOCKWISE)))
    wgrad = problem_from_counts(np.array([40, 0, 90]), 128, 200, seed=1, ragged="K")
    WeightGradient().require_inputs(_FakeDeviceProblem(wgrad))
    dev = _FakeDeviceProblem(wgrad)
    dev.b = _FakeArray(wgrad.b[:-1])
    with pytest.raises(ValueError, match=r"needs dC as bf16 \(130, 200\)"):
        WeightGradient().require_inputs(dev)
    with pytest.raises(ValueError, match="this one is ragged along M"):
        WeightGradient().require_inputs(_FakeDeviceProblem(make_problem(2, 10, 16, 16, seed=0)))
