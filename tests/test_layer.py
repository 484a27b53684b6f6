"""The MoE layer trains (CPU, skipped where torch is not installed): the combine's autograd against torch
autograd of its formula, the layer's gradients against an fp32 layer written in plain torch, inputs of
any leading shape, and the dtypes it runs. The same gradients on the GPU: tests/test_layer_gpu.py."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from moe_gemm.torch.layer import MoELayer, torch_grouped_mm  # noqa: E402


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error."""
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def combine_formula(y: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """out[t] = sum_j w[t, j] y[row_of[t k + j]], a loop torch differentiates."""
    return sum(weights[:, j, None] * y[row_of.view(-1, top_k)[:, j]] for j in range(top_k))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_combines_gradients_are_torch_autograds_of_its_formula(dtype):
    generator = torch.Generator().manual_seed(0)
    tokens, top_k, hidden = 7, 3, 24
    y = torch.randn(tokens * top_k, hidden, generator=generator).to(dtype).requires_grad_()
    weights = torch.rand(tokens, top_k, generator=generator).requires_grad_()
    row_of = torch.randperm(tokens * top_k, generator=generator)
    dout = torch.randn(tokens, hidden, generator=generator).to(dtype)
    torch.ops.moe_gemm.combine(y, row_of, weights, top_k).backward(dout)

    y32, w32 = y.detach().float().requires_grad_(), weights.detach().clone().requires_grad_()
    combine_formula(y32, row_of, w32, top_k).backward(dout.float())
    assert y.grad.dtype == dtype and weights.grad.dtype == torch.float32
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert relative(y.grad, y32.grad) < tolerance
    assert relative(weights.grad, w32.grad) < tolerance
    # every row of y gets its own gradient: the scatter has no collisions and leaves no row unwritten
    assert (y.grad.float().abs().sum(dim=1) > 0).all()


def fp32_layer(layer: MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The same layer in plain fp32 torch (softmax, top-k, a loop over the experts, the combine's
    formula), on fp32 leaf copies of the weights, for an fp32 ``x``: its output and its parameters."""
    params = {name: p.detach().float().requires_grad_() for name, p in layer.named_parameters()}
    probs = F.softmax(x @ params["gate"].t(), dim=-1)
    weights, experts = torch.topk(probs, layer.top_k, dim=-1)
    if layer.normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(params["gate"].shape[0]):
        token, slot = torch.nonzero(experts == e, as_tuple=True)
        gate, up = (x[token] @ params["w_gate_up"][e]).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ params["w_down"][e]
        out = out.index_add(0, token, weights[token, slot, None] * y)
    return out, params


def layer_and_input(dtype: torch.dtype, seed: int = 0, tokens: int = 48) -> tuple[MoELayer, torch.Tensor]:
    torch.manual_seed(seed)
    layer = MoELayer(64, 128, 8, 2, dtype=dtype, fused=False)
    return layer, torch.randn(tokens, 64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("gemm", ["ours", "torch"])
def test_the_layers_gradients_match_an_fp32_layer(dtype, gemm):
    """Gradients reach the router, both expert weights and the input, within 1e-2 of fp32 torch's
    (relative, Frobenius) in bf16 and far closer in fp32, on our op and on torch._grouped_mm."""
    layer, x = layer_and_input(dtype)
    x.requires_grad_()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    out = layer(x) if gemm == "ours" else layer(x, gemm=torch_grouped_mm)
    out.backward(dy)
    x32 = x.detach().float().requires_grad_()
    want, params = fp32_layer(layer, x32)
    want.backward(dy.float())
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert relative(out, want) < tolerance
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.dtype == dtype, name
        assert relative(p.grad, params[name].grad) < tolerance, name
    assert relative(x.grad, x32.grad) < tolerance


def test_inputs_of_any_leading_shape_are_the_flattened_tokens():
    layer, x = layer_and_input(torch.bfloat16, seed=1, tokens=24)
    with torch.no_grad():
        flat = layer(x)
        for shape in ((2, 12, 64), (2, 3, 4, 64), (24, 64)):
            out = layer(x.view(shape))
            assert out.shape == shape
            torch.testing.assert_close(out.reshape(24, 64), flat, rtol=0, atol=0)
    layer(x.view(4, 6, 64)).sum().backward()
    assert layer.w_down.grad is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_and_fp32_run_the_same_layer(dtype):
    """The dtype rule: bf16 and fp16 run our kernels (the fused GEMM 1 where it can), fp32 the op's
    fallback to torch._grouped_mm, unfused; forward and backward give what the bf16 layer gives (here on
    the CPU every GEMM is the fallback's)."""
    torch.manual_seed(3)
    layer = MoELayer(64, 128, 8, 2, dtype=dtype)
    assert layer.fused == (dtype == torch.float16) and MoELayer(64, 128, 8, 2).fused
    x = torch.randn(16, 64).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the op's one warning per fallback reason
        out = layer(x)
    out.float().sum().backward()
    assert out.dtype == dtype and layer.gate.grad.dtype == dtype
    bf16 = MoELayer(64, 128, 8, 2, fused=False)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in layer.state_dict().items()})
    with torch.no_grad():
        assert relative(bf16(x.to(torch.bfloat16)), out) < 2e-2


def test_other_dtypes_are_refused_at_construction_and_a_mismatched_input_in_forward():
    with pytest.raises(ValueError, match="bf16 or fp16 .* or fp32"):
        MoELayer(64, 128, 8, 2, dtype=torch.float64)
    layer = MoELayer(64, 128, 8, 2)
    with pytest.raises(ValueError, match="the parameters' dtype torch.bfloat16, got torch.float32"):
        layer(torch.randn(4, 64))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_an_input_of_another_width_or_device_or_no_tensor_is_refused_before_any_work(fp8):
    from moe_gemm.torch.fp8_layer import FP8MoELayer

    layer = MoELayer(128, 128, 8, 2)
    if fp8:
        layer = FP8MoELayer.from_layer(layer)
    name = type(layer).__name__
    with pytest.raises(ValueError, match=rf"^{name}: the input must be \[\.\.\., hidden = 128\], got \(4, 63\)"):
        layer(torch.randn(4, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"hidden = 128\], got \(\)"):
        layer(torch.tensor(1.0, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="the parameters' device cpu, got meta"):
        layer(torch.empty(4, 128, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match=rf"^{name}: x must be a torch.Tensor, got NoneType"):
        layer(None)
    assert layer(torch.randn(2, 3, 128, dtype=torch.bfloat16)).shape == (2, 3, 128)  # any leading shape


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3", "linear"])
def test_from_transformers_refuses_a_block_it_would_not_reproduce(family):
    """Qwen2-MoE's and DeepSeek-V3's blocks have `gate` and `experts` like Mixtral's, but also shared experts (and
    DeepSeek-V3 sigmoid routing with a correction bias): a copy of the routed experts alone would compute something
    else without a word."""
    pytest.importorskip("transformers")
    if family == "qwen2_moe":
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeConfig, Qwen2MoeSparseMoeBlock

        block = Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=4,
                                                      shared_expert_intermediate_size=32, num_experts_per_tok=2))
        why = r"Qwen2MoeSparseMoeBlock also runs shared experts \(shared_expert\)"
    elif family == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Config, DeepseekV3MoE

        block = DeepseekV3MoE(DeepseekV3Config(hidden_size=64, moe_intermediate_size=32, n_routed_experts=4,
                                               num_experts_per_tok=2, n_group=1, topk_group=1))
        why = "DeepseekV3MoE also runs shared experts"
        delattr(block, "shared_experts")  # the routing alone is refused too
        with pytest.raises(ValueError, match="sigmoid scores with a correction bias"):
            MoELayer.from_transformers(block, 2, True)
        block.shared_experts = torch.nn.Identity()
    else:
        block, why = torch.nn.Linear(4, 4), "takes a transformers sparse MoE block .*, got Linear$"
    with pytest.raises(ValueError, match=rf"^MoELayer.from_transformers: {why}"):
        MoELayer.from_transformers(block, 2, True)


def test_from_transformers_keeps_an_fp32_blocks_dtype():
    """transformers builds its blocks in fp32 by default: the copied layer runs (and trains) in fp32."""
    pytest.importorskip("transformers")
    from moe_gemm.torch.layer import transformers_block, transformers_forward

    torch.manual_seed(4)
    block, normalize = transformers_block("mixtral", 64, 96, 8, 2)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    layer = MoELayer.from_transformers(block.eval(), 2, normalize)
    assert layer.gate.dtype == torch.float32
    x = torch.randn(2, 10, 64)
    with torch.no_grad():
        want = transformers_forward(block, x.view(20, 64))
    got = layer(x)
    torch.testing.assert_close(got.view(20, 64), want, rtol=1e-4, atol=1e-5)
    got.sum().backward()
    assert layer.gate.grad is not None


@pytest.mark.parametrize("way", ["layer/transformers", "layer/transformers-eager", "layer/transformers-batched_mm"])
def test_each_transformers_experts_implementation_is_our_layer(way):
    """Chapter 08's transformers rows: the block holding our layer's weights gives our layer's output with
    each experts implementation it is timed with, and (grouped_mm, the default, trained in chapter 08's
    training step) its gradients."""
    pytest.importorskip("transformers")
    from moe_gemm.torch.layer import transformers_forward
    from moe_gemm.torch.peer_layers import TRANSFORMERS_WAYS, transformers_block_of

    layer, x = layer_and_input(torch.bfloat16, seed=5, tokens=40)
    block = transformers_block_of(layer, TRANSFORMERS_WAYS[way])
    assert block.experts.config._experts_implementation == TRANSFORMERS_WAYS[way]
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    ours = layer(x)
    theirs = transformers_forward(block, x)
    assert relative(theirs, ours) < 1e-2
    if way == "layer/transformers":
        ours.backward(dy)
        theirs.backward(dy)
        assert relative(block.gate.weight.grad, layer.gate.grad) < 2e-2
        assert relative(block.experts.gate_up_proj.grad.transpose(1, 2), layer.w_gate_up.grad) < 2e-2
        assert relative(block.experts.down_proj.grad.transpose(1, 2), layer.w_down.grad) < 2e-2


def test_a_way_that_does_not_capture_is_timed_eagerly_with_the_reason(monkeypatch):
    """Chapter 08's timing of every way: eager, then graph replays; a capture that raises leaves the
    eager time as the record's and says why."""
    from moe_gemm.measure.layer import eager_and_graph
    from moe_gemm.torch import bench

    def time_call(call, *, graph):
        call()
        events.append("graph" if graph else "eager")
        if graph and refuse[0]:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return bench.Timed(1.0 if graph else 3.0, 0.5, 4.0, graph)

    refuse, events = [False], []
    monkeypatch.setattr(bench, "time_call", time_call)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    captured = eager_and_graph(lambda: None, release=lambda: events.append("release"))
    assert captured == {"median_ms": 1.0, "min_ms": 0.5, "max_ms": 4.0, "cuda_graph": True, "eager_ms": 3.0,
                        "graph_ms": 1.0, "graph_error": None}
    assert events == ["eager", "release", "empty_cache", "graph"]  # the eager calls' leftovers go before the capture
    refuse[0] = True
    eager = eager_and_graph(lambda: None)
    assert eager["median_ms"] == 3.0 and not eager["cuda_graph"] and eager["graph_ms"] is None
    assert eager["graph_error"] == "RuntimeError: CUDA error: operation not permitted when stream is capturing"


def test_the_training_step_of_every_way_gives_our_gradients():
    """Chapter 08's training step (gradients dropped, forward, backward of a fixed dy) over each of its
    ways, on the CPU: the torch layer's and transformers' grouped_mm block's gradients, in our layout,
    are ours; the step leaves one set of gradients, not a sum over calls."""
    pytest.importorskip("transformers")
    from moe_gemm.measure.training import TRAIN_WAYS, trainable, training_step

    layer, x = layer_and_input(torch.bfloat16, seed=7, tokens=32)
    x.requires_grad_()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    found = {}
    for name in TRAIN_WAYS[:3]:  # quack's way needs quack on a GPU: tests/test_layer_gpu.py
        way = trainable(layer, name)
        step = training_step(way, x, dy)
        step()
        first = [g.clone() for g in way.gradients()]
        step()
        found[name] = (way.gradients(), x.grad.clone())
        assert all(torch.equal(a, b) for a, b in zip(first, found[name][0])), name
    ours, ours_dx = found["train/ours"]
    assert [g.shape for g in ours] == [p.shape for p in layer.parameters()]
    for name in TRAIN_WAYS[1:3]:
        gradients, dx = found[name]
        assert max(relative(g, o) for g, o in zip(gradients, ours)) < 2e-2, name
        assert relative(dx, ours_dx) < 2e-2, name
    with pytest.raises(ValueError, match="needs quack"):
        trainable(layer, "train/quack")  # quack is not installed with the CPU tests
    with pytest.raises(ValueError, match="train/ours"):
        trainable(layer, "train/jax")


def test_a_way_that_runs_out_of_memory_building_its_weights_is_left_out(monkeypatch, capsys):
    """Chapter 08's training part on an 80 GB GPU: transformers' block ran out of memory while copying the
    Mixtral-like weights at 32,768 tokens, and the whole run stopped. Building a way is inside the guard now:
    out of memory (or quack failing) leaves that way out with a line saying why; our own failure still raises."""
    from moe_gemm.measure import training

    def out_of_memory(layer, name):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 GiB")

    monkeypatch.setattr(training, "trainable", out_of_memory)
    x = torch.zeros(4, 8)
    assert training.time_way(None, "train/transformers", x, x, reference=None) is None
    assert "train/transformers is not timed at 4 tokens: OutOfMemoryError" in capsys.readouterr().err

    def broken(layer, name):
        raise RuntimeError("an illegal memory access")

    monkeypatch.setattr(training, "trainable", broken)
    assert training.time_way(None, "train/quack", x, x, reference=None) is None  # a peer's failure, reported
    with pytest.raises(RuntimeError, match="illegal"):
        training.time_way(None, "train/ours", x, x, reference=None)
