"""k8 on the GPU: every rung on the forward's edge cases in its e4m3 format and on the cases of its scales
(an all-zero group, one large value, a partial last K block), exact on integer-valued inputs with power-of-two
scales; longer K and wider N; fp32 out; random data within the tolerance, the promoted rungs' fp32 output
close to the fp32 product of the dequantized inputs at DeepSeek-V3's K = 7,168; expert ends a model could pass
by mistake; one CUDA graph replayed with changing routings; and the refusals. Skipped where there is no sm_90a
GPU."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.measure.validation import admitting
from moe_gemm.model.edge_cases import ADVERSARIAL_ENDS
from moe_gemm.model.problem import BF16, FP8_BLOCKWISE, FP8_ROWWISE, FP32, make_problem, problem_from_counts
from moe_gemm.variants.k8 import K8Fp8
from moe_gemm.variants.k8.config import LADDER, NOT_YET_RUN

pytestmark = pytest.mark.gpu


@pytest.fixture(params=list(LADDER))
def variant(request):
    """Each rung; one not yet run on a GPU skips until `validation run k8 --admit` runs it."""
    if request.param in NOT_YET_RUN and not admitting():
        pytest.skip(f"{request.param} is built, not yet run on a GPU (moe_gemm.variants.k8.config.NOT_YET_RUN)")
    return K8Fp8(request.param)


def fmt_of(variant: K8Fp8):
    return variant.formats[0]


def test_edge_cases_exact(variant, sm90a):
    from moe_gemm.measure.check import verify

    for case in variant.edge_cases:
        check = verify(variant, case.exact_problem(seed=3), exact=True)
        assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


# (counts, K, N) beyond the shared edge cases
EXTRA_CASES = {
    "K = 4096: 32 promoted blocks": ((260, 33, 0, 129), 4096, 264),
    "K = 208: the last block 80 deep": ((65, 0, 190), 208, 136),
    "N = 2000: a partial last N tile": ((300, 1, 129), 256, 2000),
    "rows on every side of 64, 128 and 256": ((63, 64, 65, 127, 128, 129, 255, 256, 257, 1, 0), 128, 256),
    "1-row experts": ((1,) * 40, 128, 128),
    "256 experts": ((3,) * 256, 128, 128),
}


@pytest.mark.parametrize("name", list(EXTRA_CASES))
def test_extra_cases_exact(variant, name, sm90a):
    from moe_gemm.measure.check import verify

    counts, K, N = EXTRA_CASES[name]
    problem = problem_from_counts(np.array(counts), K, N, values="integer", seed=5, fmt=fmt_of(variant))
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{name}': {check.describe()}"


def test_fp32_out_exact(variant, sm90a):
    from moe_gemm.measure.check import verify

    for counts, K, N in [((0, 70, 1, 129), 128, 200), ((300, 0, 77), 384, 136)]:
        problem = problem_from_counts(np.array(counts), K, N, values="integer", seed=7, fmt=fmt_of(variant),
                                      out_dtype=FP32)
        check = verify(variant, problem, exact=True)
        assert check.passed, f"{variant.name} fp32 {counts}: {check.describe()}"


def test_random_data_at_the_seed_shape_within_tolerance(variant, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, make_problem(64, 4096, 1024, 2688, 1.2, seed=11, fmt=fmt_of(variant)))
    assert check.passed, f"{variant.name}: {check.describe()}"


def test_promoted_sums_keep_fp32_precision_at_k_7168(variant, sm90a):
    """The product of the dequantized inputs in fp32, at DeepSeek-V3's K = 7,168: a promoted kernel adds nothing
    beyond fp32 accumulation in 128-deep blocks (relative error far below bf16's 2**-9)."""
    from moe_gemm.measure.check import verify

    if not variant.config.promote:
        pytest.skip("the fast-accumulation rung does not promote: chapter 10's accuracy part measures its error")
    name = variant.name
    problem = make_problem(8, 1024, 7168, 512, 0.4, seed=13, fmt=fmt_of(variant), out_dtype=FP32)
    check = verify(variant, problem)
    assert check.passed and check.rel_error < 5e-4, f"{name}: {check.describe()}"


@pytest.mark.parametrize("ends", list(ADVERSARIAL_ENDS))
def test_any_expert_ends_stay_inside_the_tensors(variant, ends, sm90a):
    """Whatever the expert ends hold, the kernel reads and writes only inside its tensors, computes exactly the
    rows the clamped ends give each expert, and leaves the others unwritten (NaN, as the harness poisons)."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once
    from moe_gemm.model.quantize import dequantize, groups
    from moe_gemm.variants.k6.walk import walked_offsets

    tokens, K, N = 640, 256, 256
    problem = problem_from_counts(np.array([160, 160, 160, 160]), K, N, values="integer", seed=11,
                                  fmt=fmt_of(variant))
    dev = DeviceProblem(problem)
    given = np.array(ADVERSARIAL_ENDS[ends], dtype=np.int64).clip(-(2**31), 2**31 - 1)
    dev.offsets.upload(np.r_[0, given].astype(np.int32))  # the walk reads offsets[1:], torch's offs
    out = run_once(variant, dev).astype(np.float32)
    offsets = walked_offsets(given, tokens)
    group_a, group_b = groups(problem.fmt.scaling, K)
    a = dequantize(problem.a, problem.scale_a, group_a)
    want = np.full((tokens, N), np.nan, dtype=np.float64)
    for e in range(4):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        want[lo:hi] = a[lo:hi] @ dequantize(problem.b[e], problem.scale_b[e], group_b)
    np.testing.assert_array_equal(out, want.astype(np.float32).astype(BF16).astype(np.float32))


def test_one_graph_replayed_with_changing_routings(sm90a):
    """Capture once; replay with routings that change every time (one expert holding every row among them):
    every replay exact."""
    from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceProblem, synchronize
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.model.reference import check_output
    from moe_gemm.model.routing import expert_offsets

    experts, tokens, K, N = 12, 700, 256, 328
    rng = np.random.default_rng(0)
    first = problem_from_counts(np.r_[tokens, np.zeros(experts - 1, dtype=int)], K, N, values="integer", seed=1,
                                fmt=FP8_BLOCKWISE)
    dev = DeviceProblem(first)
    prepared = GraphReplay(K8Fp8("k8/blockwise-bm128")).prepare(dev)
    routings = [np.r_[np.zeros(experts - 1, dtype=np.int64), tokens]]
    routings += [rng.multinomial(tokens, rng.dirichlet(np.ones(experts) * 0.3)) for _ in range(4)]
    for counts in routings:
        problem = dataclass_replace(first, counts=counts)
        dev.offsets.upload(expert_offsets(counts).astype(np.int32))
        prepared.output.fill_u16(BF16_NAN_BITS)
        prepared.launch()
        synchronize()
        check = check_output(prepared.output.download(), problem, exact=True)
        assert check.passed, f"routing {counts.tolist()}: {check.describe()}"


def dataclass_replace(problem, **changes):
    import dataclasses

    return dataclasses.replace(problem, **changes)


def test_refusals_before_any_launch(sm90a):
    from moe_gemm.cuda.device import DeviceProblem

    with pytest.raises(ValueError, match="E = 257 experts"):
        K8Fp8("k8/blockwise-bm128").prepare(DeviceProblem(problem_from_counts(np.ones(257, dtype=int), 128, 64,
                                                                              fmt=FP8_BLOCKWISE)))
    with pytest.raises(ValueError, match="e4m3-blockwise"):  # a rowwise problem to a blockwise rung
        K8Fp8("k8/blockwise-bm128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 128, 64,
                                                                              fmt=FP8_ROWWISE)))
    with pytest.raises(ValueError, match="bf16"):  # bf16 operands
        K8Fp8("k8/rowwise-bm128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 128, 64)))


def test_two_runs_are_bit_identical(variant, sm90a):
    """No atomics: each output element is one thread's sum, in order."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once

    dev = DeviceProblem(make_problem(64, 4096, 1024, 2688, 1.2, seed=5, fmt=fmt_of(variant), out_dtype=FP32))
    assert run_once(variant, dev).tobytes() == run_once(variant, dev).tobytes()
