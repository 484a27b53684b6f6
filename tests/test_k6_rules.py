"""k6's input rules without a GPU or torch (moe_gemm.variants.k6.rules): each rule's reason, the ValueError
the harness's variants raise with it, and the torch op's fallback, which gives the same reasons."""

from __future__ import annotations

import dataclasses

import pytest

from moe_gemm.torch.rules import Operands, Route, route
from moe_gemm.variants.k6.config import LADDER, MAX_EXPERTS
from moe_gemm.variants.k6.rules import b_layout, b_strides_of, check_inputs, refusals

E, K, N = 64, 1024, 2688


def reasons(experts=E, K=K, N=N, a_strides=None, b_strides=None, a_address=0, b_address=0, schedule="device"):
    """refusals() on dense operands unless told otherwise: A [M_tot, K] and B [E, K, N] row-major."""
    return refusals(experts, K, N, a_strides or (K, 1), b_strides or (K * N, N, 1), a_address, b_address, schedule)


def test_k6_takes_dense_aligned_operands_in_either_layout():
    assert reasons() == []
    assert reasons(b_strides=(K * N, 1, K)) == []  # each B[e] column-major: B^T [E, N, K] in memory
    assert reasons(experts=MAX_EXPERTS, a_address=0x7F0000000010, b_address=0x7F1000000000) == []
    assert reasons(experts=MAX_EXPERTS + 1, schedule="host") == []  # the host walk keeps no sums in shared memory


@pytest.mark.parametrize("changes, reason", [
    (dict(K=0), "K = 0 and N = 2688: k6 needs at least one K step and one column"),
    (dict(N=0), "K = 1024 and N = 0: k6 needs at least one K step and one column"),
    (dict(K=96), "K = 96 is not a multiple of 64 (k6's K step)"),
    (dict(N=2690), "N = 2690 is not a multiple of 8 (TMA's 16-byte rows)"),
    (dict(experts=MAX_EXPERTS + 1), "E = 257 experts: the device walk holds at most 256"),
    (dict(a_strides=(2048, 1)), "a must be row-major [M_tot, K] (strides (1024, 1)), got (2048, 1)"),
    (dict(b_strides=(K * N // 2, N, 1)), "b must be row- or column-major per expert, got strides (1376256, 2688, 1)"),
    (dict(b_strides=(K * N + 4, N, 1)),
     "b's row and expert strides must be multiples of 16 bytes (TMA), got (2752516, 2688, 1)"),
    (dict(b_strides=(K * (N + 4), N + 4, 1)),
     "b's row and expert strides must be multiples of 16 bytes (TMA), got (2756608, 2692, 1)"),
    (dict(a_address=0x7F0000000008), "a and b must start on 16-byte boundaries (TMA)"),
    (dict(b_address=0x7F1000000004), "a and b must start on 16-byte boundaries (TMA)"),
])
def test_each_rule_gives_its_reason(changes, reason):
    assert reasons(**changes) == [reason]


@pytest.mark.parametrize("changes, reason", [
    (dict(K=0), "at least one K step"),
    (dict(K=96), "K = 96 is not a multiple of 64"),
    (dict(N=2690), "N = 2690 is not a multiple of 8"),
    (dict(experts=MAX_EXPERTS + 1), "the device walk holds at most 256"),
    (dict(a_address=8), "16-byte boundaries"),
    (dict(b_address=8), "16-byte boundaries"),
])
def test_the_harness_refuses_with_the_reason(changes, reason):
    inputs = dict(experts=E, K=K, N=N, a_address=0, b_address=0) | changes
    with pytest.raises(ValueError, match=rf"^k6/pingpong-bn128 cannot take these inputs: .*{reason}"):
        check_inputs(LADDER["k6/pingpong-bn128"], name="k6/pingpong-bn128", **inputs)


def test_the_harness_passes_dense_b_in_its_layout_and_names_every_broken_rule():
    check_inputs(LADDER["k6/pingpong-cluster-bn192-kmajor"], E, K, N)  # B^T, dense: the "nk" layout
    check_inputs(LADDER["k6/pingpong-cluster-bn192-host"], MAX_EXPERTS + 1, K, N)
    with pytest.raises(ValueError, match="K = 96 is not a multiple of 64 .*; N = 2690 is not a multiple of 8"):
        check_inputs(LADDER["k6/pingpong-bn192"], E, 96, 2690)


def test_the_torch_op_falls_back_with_k6s_reasons():
    """What k6 refuses reaches the op's fallback reason whole and in order, after the op's own reasons."""
    op = Operands(a_shape=(1000, 96), a_strides=(200, 1), a_dtype="bfloat16", b_shape=(300, 96, 2690),
                  b_strides=(96 * 2690, 2690, 1), b_dtype="bfloat16", offs_shape=(300,), offs_dtype="int32",
                  a_address=8)
    k6 = refusals(300, 96, 2690, (200, 1), (96 * 2690, 2690, 1), 8, 0)
    assert len(k6) == 5 and route(op) == Route("torch", reason="; ".join(k6))
    with_dtype = route(dataclasses.replace(op, out_dtype="float16")).reason
    assert with_dtype == "; ".join(["our kernels take bf16 or fp16 in and the same or fp32 out, got bfloat16 in, "
                                    "float16 out", *k6])


def test_b_layouts():
    assert b_layout((4, 64, 128), (64 * 128, 128, 1)) == "kn"
    assert b_layout((4, 64, 128), (64 * 128, 1, 64)) == "nk"
    assert b_layout((1, 64, 128), (0, 128, 1)) == "kn"  # one expert: its stride does not matter
    assert b_layout((4, 64, 128), (64 * 128, 256, 2)) is None
    assert b_layout((4, 64, 128), (0, 128, 1)) is None  # experts that overlap (an expand): no tensor map
    assert b_layout((4, 64, 128), (64 * 128, 64, 1)) is None  # rows that overlap


def test_k6_takes_views_whose_strides_a_tensor_map_can_step():
    """b[::2] (every other expert), b[:, :, :N] of a wider tensor, and the same K-major: the batched
    tensor map is given the view's row and expert strides (moe_gemm.variants.k6.launch)."""
    every_other, narrower, narrower_nk = (2 * K * N, N, 1), (K * (N + 64), N + 64, 1), (3 * K * N, 1, K + 64)
    for strides in (every_other, narrower, narrower_nk):
        assert reasons(b_strides=strides) == []
    assert b_strides_of((E, K, N), every_other) == (N, 2 * K * N)
    assert b_strides_of((E, K, N), narrower) == (N + 64, K * (N + 64))
    assert b_strides_of((E, K, N), narrower_nk) == (K + 64, 3 * K * N)
    assert b_strides_of((1, K, N), (0, N, 1)) == (N, K * N)  # one expert: the dense stride, never stepped


def test_a_view_of_b_gets_its_strides_in_the_tensor_map():
    from moe_gemm.cuda.tensormap import TiledMap
    from moe_gemm.variants.k6.launch import arguments

    args = arguments(LADDER["k6/pingpong-bn192"], 0, 0x7F00, 0, 0, 1000, E, K, N, b_strides=(N + 64, 2 * K * N))
    assert args[1] == TiledMap("B", 0x7F00, (N, K, E), ((N + 64) * 2, 2 * K * N * 2), (64, 64, 1))
    with pytest.raises(ValueError, match="stride 1 must cover"):  # an expert stride that overlaps: refused
        arguments(LADDER["k6/pingpong-bn192"], 0, 0x7F00, 0, 0, 1000, E, K, N, b_strides=(N, K * N - 8))
