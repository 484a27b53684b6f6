"""k6 on the GPU: every rung and k6/auto on the shared edge cases and chapter 07's extra ones (N = 2000
and 136, K = 192 and 8192, 1-row experts, an odd last N tile for the clusters), exact on
integer-valued inputs; random data within the tolerance; persistent grids with fewer, as many and
more units than SM slots; the device walk bit-identical to the host walk; one CUDA graph replayed
with changing routings; and the refusals. Skipped where there is no sm_90a GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moe_gemm.measure.validation import admitting
from moe_gemm.model.edge_cases import ADVERSARIAL_ENDS, EDGE_CASES, EdgeCase
from moe_gemm.model.problem import BF16_OPERANDS, FP16, FP16_OPERANDS, FP32, Problem, make_problem, problem_from_counts
from moe_gemm.variants.k6 import K6Persistent
from moe_gemm.variants.k6.config import FUSED, LADDER, NOT_YET_RUN

pytestmark = pytest.mark.gpu

# Shapes beyond the shared edge cases: (counts, K, N).
EXTRA_CASES = {
    "N = 2000: an odd last N tile at BN = 192 (11 tiles) and 128 (16)": ((300, 0, 129, 7), 128, 2000),
    "N = 136: one partial N tile": ((70, 200, 1), 128, 136),
    "K = 192: three K steps": ((130, 64, 3), 192, 392),
    "K = 8192: 128 K steps": ((260, 33), 8192, 264),
    "1-row experts": ((1,) * 12, 128, 200),
    "rows on every side of 64, 128 and 256": ((63, 64, 65, 127, 128, 129, 255, 256, 257, 511), 64, 328),
}


@pytest.fixture(params=list(LADDER) + ["k6/auto"])
def variant(request, tmp_path):
    if request.param in NOT_YET_RUN and not admitting():  # run by `validation run k6 --admit`
        pytest.skip(f"{request.param} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    if request.param == "k6/auto":
        from moe_gemm.variants.k6.auto import K6Auto

        return K6Auto(cache_file=tmp_path / "auto.json")
    return K6Persistent(request.param)


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_cases_exact(variant, case, sm90a):
    from moe_gemm.measure.check import verify

    problem = case.exact_problem(seed=3)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize("name", list(EXTRA_CASES))
def test_extra_cases_exact(variant, name, sm90a):
    from moe_gemm.measure.check import verify

    counts, K, N = EXTRA_CASES[name]
    problem = problem_from_counts(np.array(counts), K, N, values="integer", seed=5)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{variant.name} on '{name}': {check.describe()}"


def test_random_data_at_the_seed_shape_within_tolerance(variant, sm90a):
    from moe_gemm.measure.check import verify

    check = verify(variant, make_problem(64, 2048, 1024, 2688, 1.2, seed=11))
    assert check.passed, f"{variant.name}: {check.describe()}"


@pytest.mark.parametrize("units_per_slot", [0.5, 1.0, 3.7])
@pytest.mark.parametrize("name", ["k6/pingpong-bn128", "k6/pingpong-cluster-bn192", "k6/coop256-cluster-bn128",
                                  "k6/pingpong-mcluster-bn192-tail", "k6/pingpong-bn192-rings",
                                  "k6/pingpong-mcluster-bn192-pdl", "k6/pingpong-mcluster-bn192-cursor",
                                  "k6/pingpong-mcluster-bn192-listed"])
def test_persistent_grids_below_at_and_above_the_slots(name, units_per_slot, sm90a):
    """Units = 0.5x, 1x and 3.7x the blocks (clusters) the launch runs, exact: blocks with no unit (the producer
    tail's and PDL's paths with nothing to do), with one, and with several (the private rings' wrap)."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import verify

    if name in NOT_YET_RUN and not admitting():
        pytest.skip(f"{name} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    variant = K6Persistent(name)
    probe = variant.prepare(DeviceProblem(problem_from_counts(np.array([1]), 64, 64)))
    slots = probe.launch_info["grid"] // variant.config.cluster
    n_units = -(-392 // variant.config.unit_cols)
    experts = max(1, round(slots * units_per_slot / n_units))
    counts = np.full(experts, variant.config.bm - 3)  # one unit row per expert, a short one
    problem = problem_from_counts(counts, 128, 392, values="integer", seed=2)
    check = verify(variant, problem, exact=True)
    assert check.passed, f"{name}, {experts * n_units} units on {slots} slots: {check.describe()}"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name, group", [("k6/pingpong-cluster-bn192-g8", 8),
                                         *((f"k6/pingpong-mcluster-bn192-{walk}", g) for walk in ("cursor", "listed")
                                           for g in (1, 3)),
                                         *((f"k6/{tile}-n8", g) for tile in ("coop256-cluster-bn192",
                                                                             "pingpong-mcluster-bn192")
                                           for g in (1, 3, 8))])
def test_device_walk_matches_the_host_walk_bit_for_bit(name, group, seed, sm90a):
    """The device walk (and its cursor, in groups of one M tile and of several; and the walk along N, in groups of
    one column and of several) against the host list, with many experts, about a third of them empty, so that a
    block's units cross experts and raster groups."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once

    if name in NOT_YET_RUN and not admitting():
        pytest.skip(f"{name} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    rng = np.random.default_rng(seed)
    experts = int(rng.integers(1, 200))
    counts = rng.integers(0, 600, experts) * (rng.random(experts) > 0.3)  # about a third empty
    problem = problem_from_counts(counts, 256, 520, seed=seed)
    dev = DeviceProblem(problem)
    config = LADDER[name].replace(group=group)
    device = K6Persistent("device", config)
    host = K6Persistent("host", config.replace(schedule="host", cursor=False, listed=False, raster="m"))
    np.testing.assert_array_equal(run_once(device, dev).view(np.uint16), run_once(host, dev).view(np.uint16))


@pytest.mark.parametrize("name", ["k6/pingpong-mcluster-bn192-listed"])
def test_a_block_with_more_units_than_it_lists_matches_the_host_walk(name, sm90a):
    """Every block takes a few units more than walk::LISTED, so that its producer reads the list and then looks the
    rest up itself: bit for bit against the host list, eight experts whose ends fall inside tiles (K = 64, N one
    unit wide, about 2 M rows: a large launch of short tiles)."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once
    from moe_gemm.variants.k6.config import LISTED

    if name in NOT_YET_RUN and not admitting():
        pytest.skip(f"{name} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    config = LADDER[name]
    device = K6Persistent("device", config)
    slots = device.prepare(DeviceProblem(problem_from_counts(np.array([1]), 64, 64))).launch_info["grid"] // 2
    rows = slots * (LISTED + 5) * config.unit_rows  # LISTED + 5 units per block, give or take the partial tiles
    counts = np.full(8, rows // 8 - 37)  # each expert's last tile partial
    problem = problem_from_counts(counts, 64, config.unit_cols, values="integer", seed=7)
    dev = DeviceProblem(problem)
    host = K6Persistent("host", config.replace(schedule="host", cursor=False, listed=False))
    np.testing.assert_array_equal(run_once(device, dev).view(np.uint16), run_once(host, dev).view(np.uint16))


def test_one_graph_replayed_with_changing_routings(sm90a):
    """Capture once at a capacity of rows; replay with routings that change every time (M_tot = 0 and
    one expert holding every row among them): every replay exact."""
    from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceProblem, synchronize
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.model.problem import BF16
    from moe_gemm.model.reference import check_output
    from moe_gemm.model.routing import expert_offsets

    experts, capacity, K, N = 16, 900, 128, 328
    rng = np.random.default_rng(0)
    first = problem_from_counts(np.r_[capacity, np.zeros(experts - 1, dtype=int)], K, N, values="integer", seed=1)
    dev = DeviceProblem(first)
    prepared = GraphReplay(K6Persistent("k6/pingpong-cluster-bn192")).prepare(dev)
    routings = [np.zeros(experts, dtype=np.int64), np.r_[capacity, np.zeros(experts - 1, dtype=np.int64)]]
    routings += [rng.multinomial(int(rng.integers(1, capacity)), rng.dirichlet(np.ones(experts) * 0.3))
                 for _ in range(5)]
    for counts in routings:
        problem = problem_from_counts(counts, K, N, values="integer", seed=int(counts.sum()))
        problem = Problem(a=problem.a, b=first.b, counts=problem.counts)
        if problem.tokens:
            dev.a.view(0, problem.a.shape, problem.a.dtype).upload(np.ascontiguousarray(problem.a))
        dev.offsets.upload(expert_offsets(problem.counts).astype(np.int32))
        prepared.output.fill_u16(BF16_NAN_BITS)
        prepared.launch()
        synchronize()
        out = prepared.output.download()[:problem.tokens]
        check = check_output(out.astype(BF16), problem, exact=True)
        assert check.passed, f"routing {counts.tolist()}: {check.describe()}"


def test_refusals_before_any_launch(sm90a):
    from moe_gemm.cuda.device import DeviceProblem

    with pytest.raises(ValueError, match="the device walk holds at most 256"):
        K6Persistent("k6/pingpong-bn128").prepare(DeviceProblem(problem_from_counts(np.ones(257, dtype=int), 64, 64)))
    with pytest.raises(ValueError, match="K = 96 is not a multiple of 64"):
        K6Persistent("k6/pingpong-bn128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 96, 64)))


# Expert ends a model could pass by mistake (model.edge_cases.ADVERSARIAL_ENDS): each rung's device walk
# must keep inside A and C, compute exactly the rows its clamped offsets give each expert, and leave
# the rows past the last clamped end unwritten (NaN-poisoned), as torch._grouped_mm leaves them.


@pytest.mark.parametrize("ends", list(ADVERSARIAL_ENDS))
@pytest.mark.parametrize("name", ["k6/pingpong-bn128", "k6/pingpong-cluster-bn192-g8", "k6/coop256-bn128",
                                  "k6/swiglu-coop256-cluster", "k6/pingpong-mcluster-bn192-cursor",
                                  "k6/pingpong-mcluster-bn192-listed", "k6/coop256-cluster-bn192-n8"])
def test_any_expert_ends_stay_inside_the_tensors(name, ends, sm90a):
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.measure.check import run_once
    from moe_gemm.variants.k6.walk import walked_offsets

    if name in NOT_YET_RUN and not admitting():
        pytest.skip(f"{name} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    tokens, K, N = 640, 128, 256
    problem = problem_from_counts(np.array([160, 160, 160, 160]), K, N, values="integer", seed=11)
    dev = DeviceProblem(problem)
    given = np.array(ADVERSARIAL_ENDS[ends], dtype=np.int64).clip(-(2**31), 2**31 - 1)
    dev.offsets.upload(np.r_[0, given].astype(np.int32))  # the walk reads offsets[1:], torch's offs
    variant = K6Persistent(name)
    out = run_once(variant, dev).astype(np.float32)
    offsets = walked_offsets(given, tokens)
    want = np.full((tokens, N), np.nan, dtype=np.float64)
    for e in range(4):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        want[lo:hi] = problem.a[lo:hi].astype(np.float64) @ problem.b[e].astype(np.float64)
    if variant.config.epilogue == "swiglu":
        gate, up = want[:, : N // 2], want[:, N // 2:]
        want = gate / (1 + np.exp(-gate)) * up
        np.testing.assert_allclose(out, want, rtol=1e-2, atol=1e-2, equal_nan=True)
    else:
        np.testing.assert_array_equal(out, want.astype(np.float32).astype(problem.a.dtype).astype(np.float32))


# The fused SwiGLU epilogue (C = silu(gate) * up, [M_tot, N / 2]): compared with the fp32 product's
# SwiGLU within the tolerance (silu of integer-valued inputs is no integer).
SWIGLU_CASES = {
    "ragged, an empty expert": ((300, 0, 129, 7, 64), 256, 512),
    "1-row experts": ((1,) * 12, 128, 256),
    "one expert holds every row": ((0, 0, 700), 64, 384),
    "K = 8192": ((260, 33), 8192, 256),
    "no rows at all (M_tot = 0)": ((0, 0), 64, 128),
}


@pytest.mark.parametrize("case", list(SWIGLU_CASES))
@pytest.mark.parametrize("name", list(FUSED))
def test_the_swiglu_epilogue_within_tolerance(name, case, sm90a):
    from moe_gemm.measure.check import verify

    counts, K, N = SWIGLU_CASES[case]
    check = verify(K6Persistent(name), problem_from_counts(np.array(counts), K, N, seed=7))
    assert check.passed, f"{name} on '{case}': {check.describe()}"


# fp16 operands and fp16 or fp32 outputs, bf16 operands and an fp32 output: each rung compiled for the
# problem's types (K6Persistent.typed). Rungs of both modes, clusters along N and M, the raster walk, the
# host walk and B^T; the edge cases plus an odd last N tile and a long K, exact on integer values (fp16
# holds every integer up to 2,048 exactly and the sums here stay far below its 65,504).
TYPED_RUNGS = ("k6/pingpong-bn128", "k6/pingpong-cluster-bn192-g8", "k6/coop256-cluster-bn192",
               "k6/pingpong-mcluster-bn192", "k6/pingpong-cluster-bn192-kmajor", "k6/pingpong-cluster-bn192-host")
TYPES = {"fp16 -> fp16": (FP16_OPERANDS, FP16), "bf16 -> fp32": (BF16_OPERANDS, FP32),
         "fp16 -> fp32": (FP16_OPERANDS, FP32)}
TYPED_CASES = (*EDGE_CASES, EdgeCase("N = 2000, an odd last N tile", (300, 0, 129, 7), K=128, N=2000),
               EdgeCase("K = 4096", (260, 33), K=4096, N=264))


@pytest.mark.parametrize("types", list(TYPES))
@pytest.mark.parametrize("name", TYPED_RUNGS)
def test_other_types_exact_on_the_edge_cases(name, types, sm90a):
    from moe_gemm.measure.check import verify

    fmt, out_dtype = TYPES[types]
    variant = K6Persistent(name)
    for case in TYPED_CASES:
        problem = dataclasses.replace(case, fmt=fmt, out_dtype=out_dtype).exact_problem(seed=3)
        check = verify(variant, problem, exact=True)
        assert check.passed, f"{name} {types} on '{case.name}': {check.describe()}"


@pytest.mark.parametrize("types", list(TYPES))
def test_other_types_on_random_data_within_their_tolerance(types, sm90a):
    """fp16's tolerance is five times tighter than bf16's (2e-3: 11 significant bits against 8), fp32's 1e-3."""
    from moe_gemm.measure.check import verify

    fmt, out_dtype = TYPES[types]
    problem = make_problem(64, 2048, 1024, 2688, 1.2, seed=11, fmt=fmt, out_dtype=out_dtype)
    for name in ("k6/pingpong-bn192", "k6/coop256-cluster-bn128-g8", "k6/pingpong-bn192-kmajor"):
        check = verify(K6Persistent(name), problem)
        assert check.passed, f"{name} {types}: {check.describe()}"


@pytest.mark.parametrize("types", list(TYPES))
@pytest.mark.parametrize("name", list(FUSED))
def test_the_swiglu_epilogue_in_other_types(name, types, sm90a):
    from moe_gemm.measure.check import verify

    fmt, out_dtype = TYPES[types]
    for case in ("ragged, an empty expert", "K = 8192"):
        counts, K, N = SWIGLU_CASES[case]
        problem = problem_from_counts(np.array(counts), K, N, seed=7, fmt=fmt, out_dtype=out_dtype)
        check = verify(K6Persistent(name), problem)
        assert check.passed, f"{name} {types} on '{case}': {check.describe()}"


def test_the_swiglu_epilogue_refuses_n_not_a_multiple_of_128(sm90a):
    from moe_gemm.cuda.device import DeviceProblem

    with pytest.raises(ValueError, match="multiple of 128"):
        K6Persistent("k6/swiglu-bn128").prepare(DeviceProblem(problem_from_counts(np.array([5]), 64, 192)))


def test_a_rerouted_problem_shares_the_inputs_and_has_its_own_offsets(sm90a):
    """What k6/auto's robust tuning times its second routing on: the same A and B, new offsets."""
    from moe_gemm.cuda.device import DeviceProblem
    from moe_gemm.model.routing import expert_counts, expert_offsets

    dev = DeviceProblem(make_problem(8, 1000, 128, 256, 0.0, seed=1))
    counts = expert_counts(8, 1000, 1.2)
    other = dev.rerouted(counts)
    assert other.a is dev.a and other.b is dev.b
    np.testing.assert_array_equal(other.offsets.download(), expert_offsets(counts))
    assert other.problem.skew != other.problem.skew  # NaN: the routing is given, not drawn with a skew


@pytest.mark.parametrize("name", [n for n, c in LADDER.items() if c.pdl])
def test_a_pdl_rung_chained_back_to_back_in_one_graph_is_exact(name, sm90a):
    """Eight programmatic dependent launches captured in one CUDA graph, each writing the same C after the one
    before it: every launch waits for the one before it before it reads or writes, so C is exact, as alone."""
    from moe_gemm.measure.check import verify
    from moe_gemm.measure.graph_replay import GraphReplay

    if name in NOT_YET_RUN and not admitting():
        pytest.skip(f"{name} is built, not yet run on a GPU (moe_gemm.variants.k6.config.NOT_YET_RUN)")
    problem = problem_from_counts(np.array((300, 0, 129, 7, 1000)), 1024, 2000, values="integer", seed=7)
    check = verify(GraphReplay(K6Persistent(name), chain=8), problem, exact=True)
    assert check.passed, f"{name} chained: {check.describe()}"
