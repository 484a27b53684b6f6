"""moe_gemm.torch with torch but without a GPU (skipped where torch is not installed): the op's fallback
and its one warning, the fake implementation under torch.compile(fullgraph=True), autograd against
fp32 torch, and the MoE layer against transformers' own Mixtral and Qwen3-MoE blocks. The same
layer on the GPU is tests/test_torch_op_gpu.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moe_gemm.torch import ops  # noqa: E402
from moe_gemm.torch.layer import MoELayer, permute  # noqa: E402


def problem(counts, K=64, N=48, dtype=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.bfloat16
    a = torch.randn(int(sum(counts)), K, generator=generator).to(dtype)
    b = (torch.randn(len(counts), K, N, generator=generator) * K**-0.5).to(dtype)
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    return a, b, offs


def fp32_reference(a, b, offs):
    starts = [0, *offs.tolist()[:-1]]
    return torch.cat([a[s:e].float() @ b[i].float() for i, (s, e) in enumerate(zip(starts, offs.tolist()))])


def test_cpu_tensors_fall_back_with_one_warning_that_says_why():
    a, b, offs = problem([5, 0, 7])
    ops._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ops.grouped_mm(a, b, offs)
        ops.grouped_mm(a, b, offs)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "not a CUDA GPU" in messages[0]
    torch.testing.assert_close(out.float(), fp32_reference(a, b, offs), rtol=1e-2, atol=1e-2)


def test_malformed_inputs_raise_before_anything_runs():
    a, b, offs = problem([5, 7])
    with pytest.raises(ValueError, match="must equal b's K"):
        ops.grouped_mm(a[:, :32].contiguous(), b, offs)
    with pytest.raises(ValueError, match="offs must be int32"):
        ops.grouped_mm(a, b, offs.long())


def test_the_fake_implementation_gives_shape_and_dtype_under_compile():
    a, b, offs = problem([3, 9, 0, 4])

    def f(a, b, offs):
        return ops.grouped_mm(a, b, offs) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b, offs), f(a, b, offs))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = ops.grouped_mm(mode.from_tensor(a), mode.from_tensor(b), mode.from_tensor(offs))
    assert fake.shape == (16, 48) and fake.dtype == torch.bfloat16


def test_autograd_matches_fp32_torch():
    a, b, offs = problem([6, 0, 11, 3], dtype=torch.float32, seed=2)
    a, b = a.to(torch.bfloat16).requires_grad_(), b.to(torch.bfloat16).requires_grad_()
    grad = torch.randn(20, 48, generator=torch.Generator().manual_seed(5))
    ops.grouped_mm(a, b, offs).backward(grad.to(torch.bfloat16))
    a32, b32 = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    fp32_reference(a32, b32, offs).backward(grad)
    # bf16 gradients: a dB element sums up to 11 products and can cancel to near zero, where an
    # elementwise tolerance is the wrong measure; the relative (Frobenius) error is the right one, as
    # in the GPU test
    for ours, want in ((a.grad, a32.grad), (b.grad, b32.grad)):
        assert ((ours.float() - want).norm() / want.norm()).item() < 1e-2
    assert torch.count_nonzero(b.grad[1]) == 0  # the expert with no rows gets no gradient


def test_the_weight_gradient_falls_back_on_the_cpu_in_each_output_type_and_in_accumulate_mode():
    """torch's 2D x 2D form refuses an out_dtype other than a's: fp32 (and the accumulate mode) take fp32
    operands instead, so the fp32 gradient is the fp32 product, not a rounded bf16 one."""
    from moe_gemm.torch import weight_grad

    a, _, offs = problem([5, 0, 7])
    dc = torch.randn(12, 40, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    starts = [0, *offs.tolist()[:-1]]
    exact = torch.stack([a[s:e].double().t() @ dc[s:e].double() for s, e in zip(starts, offs.tolist())])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half, single = weight_grad(a, dc, offs), weight_grad(a, dc, offs, torch.float32)
        out = torch.full((3, 64, 40), 2.0)
        weight_grad(a, dc, offs, out=out, accumulate=True)
    assert half.dtype == torch.bfloat16 and single.dtype == torch.float32
    torch.testing.assert_close(single.double(), exact, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.double(), exact + 2, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(half.double(), exact, rtol=1e-2, atol=5e-2)
    assert (half[1] == 0).all() and (single[1] == 0).all()


def test_permutation_groups_rows_by_expert_and_counts_every_expert():
    experts = torch.tensor([[2, 0], [2, 1], [0, 2]])
    order, offs = permute(experts, 4)
    assert offs.tolist() == [2, 3, 6, 6]  # expert 3 gets no token
    assert experts.flatten()[order].tolist() == [0, 0, 1, 2, 2, 2]
    assert (order // 2).tolist() == [0, 2, 1, 0, 1, 2]  # stable: each expert's tokens in token order


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_the_layer_matches_the_transformers_block(family):
    pytest.importorskip("transformers")
    from moe_gemm.torch.layer import transformers_block, transformers_forward

    torch.manual_seed(0)
    intermediate, experts, top_k = {"mixtral": (96, 8, 2), "qwen3_moe": (32, 16, 4)}[family]
    block, normalize = transformers_block(family, 64, intermediate, experts, top_k)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    block = block.to(torch.bfloat16).eval()
    layer = MoELayer.from_transformers(block, top_k, normalize)
    x = torch.randn(40, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = transformers_forward(block, x)
        got = layer(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


def test_the_fused_path_equals_gemm_then_swiglu():
    from moe_gemm.torch.layer import swiglu

    a, _, offs = problem([9, 0, 4], K=64, N=256)
    w = (torch.randn(3, 64, 256, generator=torch.Generator().manual_seed(4)) * 0.2).to(torch.bfloat16)
    fused = ops.grouped_mm_swiglu(a, w, offs)  # w = [W_gate | W_up], as the layer stores it
    plain = swiglu(ops.grouped_mm(a, w, offs).float())
    assert fused.shape == (13, 128)
    torch.testing.assert_close(fused.float(), plain, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="multiple of 128"):
        ops.grouped_mm_swiglu(a, w[:, :, :192].contiguous(), offs)


def test_the_fused_layer_equals_the_unfused_one():
    torch.manual_seed(1)
    layer = MoELayer(64, 128, 8, 2)
    x = torch.randn(30, 64).to(torch.bfloat16)
    with torch.no_grad():
        fused = layer(x)
        layer.fused = False
        plain = layer(x)
    torch.testing.assert_close(fused.float(), plain.float(), rtol=3e-2, atol=3e-2)


def test_the_fused_layer_reads_the_weights_it_holds_now():
    """No copy of W_gate_up can go stale: after load_state_dict or an in-place edit the fused layer
    still equals the unfused one on the new weights."""
    torch.manual_seed(2)
    layer, other = MoELayer(64, 128, 8, 2), MoELayer(64, 128, 8, 2)
    x = torch.randn(30, 64).to(torch.bfloat16)
    layer.load_state_dict(other.state_dict())
    with torch.no_grad():
        layer.w_gate_up.mul_(-1.5)
        fused = layer(x)
        layer.fused = False
        plain = layer(x)
    torch.testing.assert_close(fused.float(), plain.float(), rtol=3e-2, atol=3e-2)
    assert not any(name.endswith("fused") for name, _ in layer.named_buffers())


def test_chapter_08s_transformers_block_holds_our_layers_weights():
    """The timed transformers block is built from our layer's weights (the reverse of from_transformers)."""
    pytest.importorskip("transformers")
    from moe_gemm.torch.peer_layers import transformers_forward_of

    torch.manual_seed(3)
    layer = MoELayer(64, 128, 8, 2)
    block = transformers_forward_of(layer)
    x = torch.randn(25, 64).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(block(x).float(), layer(x).float(), rtol=3e-2, atol=3e-2)


def test_an_unknown_transformers_family_is_refused():
    pytest.importorskip("transformers")
    from moe_gemm.torch.layer import transformers_block

    with pytest.raises(ValueError, match="'mixtral' or 'qwen3_moe'"):
        transformers_block("deepseek_v3", 64, 32, 8, 2)


def test_combine_weights_and_sums_each_tokens_rows():
    from moe_gemm.torch.layer import combine

    torch.manual_seed(1)
    tokens, top_k, hidden = 5, 3, 16
    order = torch.randperm(tokens * top_k)  # row i of y is choice order[i] (token order[i] // top_k)
    y = torch.randn(tokens * top_k, hidden).to(torch.bfloat16)
    weights = torch.rand(tokens, top_k)
    want = torch.zeros(tokens, hidden)
    for i, choice in enumerate(order.tolist()):
        want[choice // top_k] += weights.flatten()[choice] * y[i].float()
    torch.testing.assert_close(combine(y, order, weights, top_k).float(), want, rtol=2e-2, atol=2e-2)


def test_the_combine_op_traces_under_compile_and_keeps_its_shape():
    """The combine is a custom op too (its kernel needs a GPU; on the CPU it is the same sum in torch):
    torch.compile(fullgraph=True) traces it through its fake implementation."""
    from moe_gemm.torch.combine import combine_reference

    torch.manual_seed(2)
    y = torch.randn(6 * 4, 32).to(torch.bfloat16)
    row_of, weights = torch.randperm(24), torch.rand(6, 4)

    def f(y, row_of, weights):
        return torch.ops.moe_gemm.combine(y, row_of, weights, 4)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(y, row_of, weights)
    assert out.shape == (6, 32) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, combine_reference(y, row_of, weights, 4))


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """The op's configuration choice with the launches replaced: a cache in tmp_path, a made-up time per
    candidate (the routing at hand, then the skewed one), and the list of what was timed."""
    monkeypatch.setenv("MOE_GEMM_CACHE", str(tmp_path))
    monkeypatch.delenv("MOE_GEMM_OP_TUNE", raising=False)
    monkeypatch.setattr(ops, "_gpu", lambda index: ("Test GPU", 132))
    monkeypatch.setattr(ops, "_chosen", {})
    timed: list[tuple[str, int]] = []
    made_up = {"k6/pingpong-bn192": (1.0, 3.0), "k6/coop256-cluster-bn192": (1.1, 1.2),
               "k6/swiglu-bn128": (2.0, 2.0), "k6/swiglu-coop256-cluster": (1.5, 1.6),
               "k6/pingpong-bn192-kmajor": (1.0, 1.0)}

    def launcher(name, layout, types, a, b, offs, out):
        routing = int(offs[0])  # the routing at hand starts with its own first end; the skewed one differs
        return lambda: timed.append((name, routing))

    def median_ms(run, iterations, index):
        run()
        name, routing = timed[-1]
        return made_up.get(name, (9.0, 9.0))[0 if routing == first_end[0] else 1]

    first_end = [0]
    monkeypatch.setattr(ops, "_launcher", launcher)
    monkeypatch.setattr(ops, "_median_ms", median_ms)
    return timed, first_end


def tuned_problem(first_end: list[int]) -> tuple[torch.Tensor, ...]:
    """The routing the tuning tests' made-up timings are for (256 rows over 4 experts, N = 256), with its
    first expert end noted for the stand-in timer, and an output to tune on."""
    a, b, offs = problem([100, 28, 0, 128], K=64, N=256)
    first_end[0] = int(offs[0])
    return a, b, offs, torch.empty(a.shape[0], 256, dtype=torch.bfloat16)


def test_the_op_tunes_an_unseen_shape_once_and_keeps_the_robust_choice(tuning):
    from moe_gemm.variants.k6 import auto

    timed, first_end = tuning
    a, b, offs, out = tuned_problem(first_end)
    # the fastest on this routing (pingpong-bn192) is 2.5x the best on the skewed one: the robust rule
    # keeps coop256-cluster-bn192 (10% and 0% off)
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 0) == "k6/coop256-cluster-bn192"
    key = auto.shape_key(256, 4, 64, 256, "kn", "Test GPU")
    entry = auto.recall(key)
    assert entry["choice"] == "k6/coop256-cluster-bn192" and entry["robust_skew"] == auto.ROBUST_SKEW
    assert {name for name, _ in timed} == set(auto.AUTO_CANDIDATES)
    count = len(timed)
    ops._chosen.clear()  # a new process: the file answers, nothing is timed
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 0) == "k6/coop256-cluster-bn192"
    assert len(timed) == count
    # the fused GEMM has its own key and candidates
    assert ops._choice(a, b, offs, out[:, :128], "kn", "swiglu", ("bf16", "bf16"), 0) == "k6/swiglu-coop256-cluster"
    assert auto.recall(auto.shape_key(256, 4, 64, 256, "kn", "Test GPU", "swiglu"))["choice"] == \
        "k6/swiglu-coop256-cluster"


def test_without_tuning_the_op_chooses_nothing_and_runs_its_defaults(tuning, monkeypatch):
    timed, _ = tuning
    a, b, offs = problem([10, 20], K=64, N=128)
    out = torch.empty(30, 128, dtype=torch.bfloat16)
    monkeypatch.setenv("MOE_GEMM_OP_TUNE", "0")
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 0) is None
    assert ops._choice(a, b, offs, out, "kn", "swiglu", ("bf16", "bf16"), 0) is None
    assert [ops._default(*case) for case in (("kn", "none"), ("kn", "swiglu"), ("nk", "none"))] == \
        [ops.DEFAULT_CONFIG, ops.FUSED_CONFIG, ops.K_MAJOR_CONFIG]
    monkeypatch.delenv("MOE_GEMM_OP_TUNE")
    monkeypatch.setattr(ops, "_capturing_or_compiling", lambda: True)  # inside a graph capture: nothing timed
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 0) is None
    assert timed == [] and ops._chosen == {}


def test_b_given_k_major_tunes_among_the_k_major_rungs(tuning):
    """autograd's dA reads b K-major: the op tunes among the -kmajor rungs, each on the validation
    record as a LADDER rung, under a key of its own."""
    from moe_gemm.variants.k6 import auto
    from moe_gemm.variants.k6.config import KMAJOR_CANDIDATES, LADDER

    timed, first_end = tuning
    a, b, offs = problem([10, 20], K=64, N=128)
    first_end[0] = int(offs[0])
    out = torch.empty(30, 128, dtype=torch.bfloat16)
    assert ops._choice(a, b, offs, out, "nk", "none", ("bf16", "bf16"), 0) == "k6/pingpong-bn192-kmajor"
    assert {name for name, _ in timed} == set(KMAJOR_CANDIDATES) and 3 <= len(KMAJOR_CANDIDATES) <= 4
    assert all(LADDER[name].b_layout == "nk" for name in KMAJOR_CANDIDATES)
    assert ops.K_MAJOR_CONFIG in KMAJOR_CANDIDATES
    assert auto.recall(auto.shape_key(30, 2, 64, 128, "nk", "Test GPU"))["choice"] == "k6/pingpong-bn192-kmajor"


def test_a_variable_batch_tunes_once_per_bucket(tuning):
    """M_tot in buckets of 1/8 of its power of two: 3,900, 4,000 and 4,096 rows share a choice (bucket 4,096),
    4,200 rows tune again (bucket 4,608)."""
    from moe_gemm.variants.k6 import auto

    timed, first_end = tuning
    tuned = []
    for rows in (4000, 3900, 4096, 4200):
        a, b, offs = problem([rows // 2, rows - rows // 2], K=64, N=128)
        first_end[0] = int(offs[0])
        before = len(timed)
        ops._choice(a, b, offs, torch.empty(rows, 128, dtype=torch.bfloat16), "kn", "none", ("bf16", "bf16"), 0)
        tuned.append(len(timed) > before)
    assert tuned == [True, False, False, True]
    assert auto.shape_key(4000, 2, 64, 128, "kn", "G") == auto.shape_key(3900, 2, 64, 128, "kn", "G")
    assert [auto.rows_bucket(m) for m in (0, 1, 7, 9, 40_000, 4096, 4097, 65_536)] == \
        [0, 1, 7, 9, 40_960, 4096, 4608, 65_536]


def test_interleaved_timing_spreads_a_clock_change_over_every_call(monkeypatch):
    """time_interleaved with the graphs and events replaced: a slowdown during the first calls'
    replays (a clock drop after a tuning burst) reaches every call, and each call's samples come from
    every round, the order reversed every other round."""
    from moe_gemm.torch import bench

    order, clock = [], iter([2.0] * 3 + [1.0] * 100)  # the first round's replays run at half speed

    class Graph:
        def __init__(self, name):
            self.name = name

        def replay(self):
            order.append(self.name)

    monkeypatch.setattr(bench, "capture", lambda fn, warmup: (Graph(fn()), None))
    monkeypatch.setattr(bench, "_events", lambda run, iterations: (run(), [next(clock) * 1.0] * iterations)[1])
    timed = bench.time_interleaved({"a": lambda: "a", "b": lambda: "b", "c": lambda: "c"}, rounds=3, iterations=2)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert {name: t.max_ms for name, t in timed.items()} == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert all(t.median_ms == 1.0 and t.graph for t in timed.values())


def test_the_choice_is_kept_per_gpu_index(tuning):
    """Two GPUs of one name share the file's entry (tuned once) and each has its own choice in the process."""
    from moe_gemm.variants.k6 import auto

    timed, first_end = tuning
    a, b, offs, out = tuned_problem(first_end)
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 0) == "k6/coop256-cluster-bn192"
    count = len(timed)
    assert ops._choice(a, b, offs, out, "kn", "none", ("bf16", "bf16"), 1) == "k6/coop256-cluster-bn192"
    key = auto.shape_key(256, 4, 64, 256, "kn", "Test GPU")
    assert len(timed) == count and set(ops._chosen) == {(key, 0), (key, 1)}
