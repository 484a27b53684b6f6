"""The training step's kernel split (moe_gemm.measure.kernel_split): kernel names sorted into kinds, their times
summed, and chapter 08's table of it; on the CPU, with kernel names as CUPTI reports them."""

from __future__ import annotations

import pytest

from moe_gemm.chapter import chapter_module
from moe_gemm.measure import kernel_split, training
from moe_gemm.measure.kernel_split import KINDS, OTHER, kind_of, split_by_kind

RUN = chapter_module("08")

NAMES = {
    "void k6_persistent_dswiglu<128, 128, 6, false>(K6Params)": "dA + dSwiGLU (ours)",
    "k6_persistent_dswiglu_prefetch": "dA + dSwiGLU (ours)",
    "void k6_persistent_swiglu_cluster2<128, 192>(K6Params)": "GEMM 1 + SwiGLU (ours)",
    "void k6_persistent_cluster2<128, 192, 5, true>(K6Params)": "GEMM (ours)",
    "void k7_weight_grad<128, 128>(K7Params)": "dW (ours)",
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NNT": "GEMM (torch)",
    "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<GemmUniversal<...>>>(...)":
        "GEMM (torch)",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>>(...)":
        "gather, scatter, sort",
    "void at::native::_scatter_gather_elementwise_kernel<128, 8, ...>(...)": "gather, scatter, sort",
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>(...)": "gather, scatter, sort",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
    "cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>>(int, ...)": "copies",
    "Memset (Device)": "copies",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<...>>>(...)":
        "reductions",
    "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(...)::{lambda(c10::BFloat16)#1}>":
        "elementwise",
    "some_kernel_no_one_named": OTHER,
}


@pytest.mark.parametrize("name", list(NAMES))
def test_each_kernel_name_has_its_kind(name):
    assert kind_of(name) == NAMES[name]


def test_the_kinds_are_summed_in_their_order_and_empty_ones_left_out():
    ms = {name: 1.0 + i for i, name in enumerate(NAMES)}
    split = split_by_kind(ms)
    want = {}
    for name, kind in NAMES.items():
        want[kind] = want.get(kind, 0.0) + ms[name]
    assert split == pytest.approx(want)
    order = [kind for kind, _ in KINDS] + [OTHER]
    assert list(split) == [k for k in order if k in want]
    assert split_by_kind({"void k7_weight_grad<1>": 0.0}) == {}
    assert sum(split.values()) == pytest.approx(sum(ms.values()))


def test_kernel_ms_refuses_no_steps():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="steps must be at least 1"):
        kernel_split.kernel_ms(lambda: None, steps=0)


def test_a_step_without_the_profilers_kernels_keeps_its_timing(monkeypatch):
    """measure.training.kernel_split: None where the profiler fails or records nothing, the split otherwise."""
    def fails(step, release=None, steps=3):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(kernel_split, "kernel_ms", fails)
    assert training.kernel_split(lambda: None, []) is None
    monkeypatch.setattr(kernel_split, "kernel_ms", lambda step, release=None, steps=3: {})
    assert training.kernel_split(lambda: None, []) is None
    monkeypatch.setattr(kernel_split, "kernel_ms",
                        lambda step, release=None, steps=3: {"k7_weight_grad": 2.0, "nvjet_x": 1.0})
    assert training.kernel_split(lambda: None, []) == {"dW (ours)": 2.0, "GEMM (torch)": 1.0}


def test_the_split_table_shows_the_kinds_any_row_has():
    def row(way, split):
        return {"variant": way, "hidden": 4096, "intermediate": 14336, "experts": 8, "top_k": 2, "tokens": 4096,
                "median_ms": 10.0, "eager_ms": 12.5, "kernel_ms_by_kind": split}

    table = RUN.train_split_table([row("train/ours", {"GEMM (ours)": 6.0, "dW (ours)": 3.0}),
                                   row("train/torch_grouped_mm", {"GEMM (torch)": 8.5, "elementwise": 1.25}),
                                   {**row("train/transformers", None)}])
    assert table.headers == ("layer", "tokens", "way", "GEMM (ours)", "dW (ours)", "GEMM (torch)", "elementwise",
                             "sum", "eager ms")
    assert [r[2:] for r in table.rows] == [("ours", "6.00", "3.00", "-", "-", "9.00", "12.50"),
                                           ("torch", "-", "-", "8.50", "1.25", "9.75", "12.50")]
