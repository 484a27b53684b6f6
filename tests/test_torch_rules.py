"""moe_gemm.torch's rules without torch: which inputs are malformed (a ValueError naming the rule), which
our kernel takes, and why the others go to torch._grouped_mm."""

from __future__ import annotations

import pytest

from moe_gemm.torch.rules import Operands, check, check_offsets, route


def operands(M=1000, K=1024, N=2688, E=64, **changes):  # noqa: N803
    base = dict(a_shape=(M, K), a_strides=(K, 1), a_dtype="bfloat16", b_shape=(E, K, N), b_strides=(K * N, N, 1),
                b_dtype="bfloat16", offs_shape=(E,), offs_dtype="int32")
    base.update(changes)
    return Operands(**base)


def test_well_formed_bf16_inputs_go_to_k6_in_either_layout():
    assert route(operands()).kernel == "k6" and route(operands()).b_layout == "kn"
    column_major = operands(b_strides=(1024 * 2688, 1, 1024))
    assert route(column_major) == route(column_major).__class__("k6", "nk", None, "bf16", "bf16")
    every_other_expert = operands(b_strides=(2 * 1024 * 2688, 2688, 1))  # b[::2] of 128 experts
    wider = operands(b_strides=(1024 * 2752, 2752, 1))  # b[:, :, :2688] of a [64, 1024, 2752] tensor
    assert route(every_other_expert).kernel == route(wider).kernel == "k6"
    assert route(operands(a_device="cuda:1", b_device="cuda:1", offs_device="cuda:1")).kernel == "k6"


@pytest.mark.parametrize("a_dtype, out_dtype, types", [
    ("bfloat16", "bfloat16", ("bf16", "bf16")), ("bfloat16", "float32", ("bf16", "fp32")),
    ("float16", "float16", ("fp16", "fp16")), ("float16", "float32", ("fp16", "fp32"))])
def test_bf16_and_fp16_with_their_own_or_an_fp32_output_go_to_k6_built_for_them(a_dtype, out_dtype, types):
    chosen = route(operands(a_dtype=a_dtype, b_dtype=a_dtype, out_dtype=out_dtype))
    assert chosen.kernel == "k6" and (chosen.element, chosen.out) == types


@pytest.mark.parametrize("changes, rule", [
    (dict(a_shape=(10, 20, 30)), "a must be 2-D"),
    (dict(b_shape=(1024, 2688)), "b must be 3-D"),
    (dict(offs_shape=(64, 1)), "offs must be 1-D"),
    (dict(a_shape=(1000, 512)), r"a's K \(512\) must equal b's K \(1024\)"),
    (dict(offs_shape=(63,)), "one cumulative row end per expert"),
    (dict(offs_dtype="int64"), "offs must be int32"),
    (dict(b_dtype="float16"), "must share a dtype"),
    (dict(offs_device="cpu"), r"b and offs must be on a's device \(cuda:0\), got b on cuda:0 and offs on cpu"),
    (dict(b_device="cuda:1"), "b and offs must be on a's device"),
    (dict(a_shape=(1000, 0), a_strides=(0, 1), b_shape=(64, 0, 2688), b_strides=(0, 2688, 1)),
     "K and N must be >= 1, got K = 0, N = 2688"),
    (dict(b_shape=(64, 1024, 0), b_strides=(0, 0, 1)), "K and N must be >= 1, got K = 1024, N = 0"),
    (dict(a_dtype="float64", b_dtype="float64"), "a and b must be one of bfloat16, float16, float32 .* got float64"),
    (dict(a_dtype="int8", b_dtype="int8"), "a and b must be one of .* got int8"),
    (dict(out_dtype="float64"), "out_dtype must be one of bfloat16, float16, float32 .* got float64"),
])
def test_malformed_inputs_raise_naming_the_rule(changes, rule):
    with pytest.raises(ValueError, match=rule):
        route(operands(**changes))


@pytest.mark.parametrize("changes, reason", [
    (dict(a_dtype="float32", b_dtype="float32", out_dtype="float32"), "bf16 or fp16 in and the same or fp32 out"),
    (dict(out_dtype="float16"), "got bfloat16 in, float16 out"),
    (dict(a_dtype="float16", b_dtype="float16", out_dtype="bfloat16"), "got float16 in, bfloat16 out"),
    (dict(a_shape=(1000, 96), a_strides=(96, 1), b_shape=(64, 96, 2688), b_strides=(96 * 2688, 2688, 1)),
     "K = 96 is not a multiple of 64"),
    (dict(capability=(8, 0)), "sm_90a GPU"),
    (dict(capability=(10, 0)), "this is sm_100"),
    (dict(a_device="cpu", b_device="cpu", offs_device="cpu"), "not a CUDA GPU"),
    (dict(b_shape=(300, 1024, 2688), b_strides=(1024 * 2688, 2688, 1), offs_shape=(300,)), "at most 256"),
    (dict(b_strides=(1024 * 2688 // 2, 2688, 1)), "row- or column-major"),
    (dict(b_strides=(1024 * 2688 + 4, 2688, 1)), "multiples of 16 bytes"),
    (dict(a_strides=(2048, 1)), "a must be row-major"),
    (dict(a_address=8), "16-byte boundaries"),
])
def test_what_k6_cannot_take_goes_to_torch_with_the_reason(changes, reason):
    chosen = route(operands(**changes))
    assert chosen.kernel == "torch"
    assert reason in chosen.reason


def test_offsets_must_rise_and_end_at_or_below_m_tot():
    check_offsets([0, 5, 5, 12], 12)
    check_offsets([0, 5, 12], 13)  # row 12 belongs to no expert: legal, as in torch._grouped_mm
    with pytest.raises(ValueError, match=r"non-decreasing from 0; offs\[2\] = 4 after 5"):
        check_offsets([0, 5, 4, 12], 12)
    with pytest.raises(ValueError, match="must end at or below M_tot = 13"):
        check_offsets([0, 5, 14], 13)
    with pytest.raises(ValueError, match="non-decreasing"):
        check_offsets([-1, 5], 5)
    check(operands())  # well-formed: no error


def grad_operands(**changes):
    from moe_gemm.torch.rules import GradOperands

    base = dict(a_shape=(4096, 1024), a_strides=(1024, 1), a_dtype="bfloat16", dc_shape=(4096, 2688),
                dc_strides=(2688, 1), dc_dtype="bfloat16", offs_shape=(64,), offs_dtype="int32")
    base.update(changes)
    return GradOperands(**base)


@pytest.mark.parametrize("changes, rule", [
    (dict(a_shape=(4096,)), "a and dc must be 2-D"),
    (dict(dc_shape=(4000, 2688)), r"same rows \(M_tot\), got 4096 and 4000"),
    (dict(offs_dtype="int64"), "offs must be int32"),
    (dict(dc_dtype="float16"), "a and dc must share a dtype"),
    (dict(a_dtype="float64", dc_dtype="float64"), "a and dc must be one of bfloat16, float16, float32 .* got float64"),
    (dict(out_dtype="float64"), "the output must be one of .* got float64"),
    (dict(accumulate=True), "accumulate=True adds into an fp32 out"),
])
def test_malformed_weight_gradients_raise_naming_the_rule(changes, rule):
    from moe_gemm.torch.rules import check_weight_grad

    check_weight_grad(grad_operands())  # the well-formed base passes
    with pytest.raises(ValueError, match=rule):
        check_weight_grad(grad_operands(**changes))
