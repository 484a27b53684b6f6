"""The MoE layer trains on an sm_90a GPU: its gradients (fused and unfused GEMM 1) against the same layer
on torch._grouped_mm and against that layer in fp32; the fp32 layer through torch's grouped GEMM;
chapter 08's training step captured in a CUDA graph and replayed, with its peak memory. Skipped
without torch or the GPU. The same checks on the CPU: tests/test_layer.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from moe_gemm.torch.layer import MoELayer, torch_grouped_mm  # noqa: E402


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def gradients(layer: MoELayer, x: torch.Tensor, dy: torch.Tensor, **forward) -> list[torch.Tensor]:
    """The gradients of layer's parameters and of x after one backward of dy."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    layer(x, **forward).backward(dy)
    return [p.grad.clone() for p in layer.parameters()] + [x.grad]


@pytest.mark.parametrize("fused", [False, True])
def test_the_layers_gradients_match_the_torch_layer_and_fp32(cuda, fused):
    """Qwen3-like proportions at a small size: our layer (our kernels, the fused GEMM 1 or not) against
    the same code on torch._grouped_mm, and both against the layer's fp32 copy, 1e-2 relative."""
    torch.manual_seed(0)
    layer = MoELayer(512, 256, 16, 4, device=cuda, fused=fused)
    assert layer.fused == fused
    x = torch.randn(1000, 512, device=cuda).to(torch.bfloat16)
    dy = torch.randn(1000, 512, device=cuda).to(torch.bfloat16)
    ours = gradients(layer, x, dy)
    theirs = gradients(layer, x, dy, gemm=torch_grouped_mm)
    fp32 = MoELayer(512, 256, 16, 4, dtype=torch.float32, device=cuda)
    fp32.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    want = gradients(fp32, x.float(), dy.float())  # fp32 runs torch._grouped_mm (the op warns once)
    for name, got, torch_got, reference in zip(["gate", "w_gate_up", "w_down", "x"], ours, theirs, want):
        assert relative(got, torch_got) < 1e-2, name  # ours matches the torch layer
        # Against fp32 the router's bf16 arithmetic, the same code in both layers, sets a floor (the router's
        # gradient read 0.018 on the H200 here): ours may be at most a quarter worse than the torch layer's.
        assert relative(got, reference) <= max(1e-2, 1.25 * relative(torch_got, reference)), name


def test_the_training_step_captures_and_replays_to_the_eager_gradients(cuda):
    """Chapter 08's training step of our layer: captured in one CUDA graph, a replay gives the eager
    step's gradients (the same routing, the same kernels, up to the order of atomic sums); its peak
    memory is positive and below the activations' upper bound at this size."""
    from moe_gemm.measure.training import peak_memory, trainable, training_step
    from moe_gemm.torch.bench import capture

    torch.manual_seed(1)
    layer = MoELayer(512, 256, 16, 4, device=cuda)
    x = torch.randn(2048, 512, device=cuda).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(2048, 512, device=cuda).to(torch.bfloat16)
    way = trainable(layer, "train/ours")
    step = training_step(way, x, dy)
    memory = peak_memory(step, [*way.parameters, x])
    eager = [g.clone() for g in way.gradients()]
    rows = 2048 * 4  # tokens x top_k: every activation of the step is at most [rows, 2 x 256] or [rows, 512]
    assert 0 < memory < 64 * rows * 512 * 2
    graph, _ = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(way.gradients(), eager):
        assert relative(got, want) < 1e-3


def test_the_fp16_layer_trains_on_our_kernels_fused(cuda):
    """fp16 parameters (a layer built fused: in training GEMM 1 runs unfused, since the backward needs its
    product): the GEMMs and dA on k6 and dW on k7 built for fp16 (no fallback warning), forward and backward
    as the fp32 layer gives them, within fp16's rounding."""
    import warnings

    torch.manual_seed(4)
    layer = MoELayer(256, 128, 8, 2, dtype=torch.float16, device=cuda)
    assert layer.fused
    x = torch.randn(3, 40, 256, device=cuda).to(torch.float16).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = layer(x)
        out.float().sum().backward()
    full = MoELayer(256, 128, 8, 2, dtype=torch.float32, device=cuda)
    full.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    x32 = x.detach().float().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp32: the op's fallback, warned
        want = full(x32)
        want.sum().backward()
    assert relative(out, want) < 5e-3
    assert relative(layer.w_down.grad, full.w_down.grad) < 1e-2 and relative(x.grad, x32.grad) < 1e-2


def test_the_fp32_layer_runs_on_the_gpu_through_torchs_grouped_gemm(cuda):
    torch.manual_seed(2)
    layer = MoELayer(256, 128, 8, 2, dtype=torch.float32, device=cuda)
    x = torch.randn(3, 40, 256, device=cuda)
    out = layer(x)
    out.sum().backward()
    bf16 = MoELayer(256, 128, 8, 2, device=cuda, fused=False)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in layer.state_dict().items()})
    with torch.no_grad():
        assert relative(bf16(x.to(torch.bfloat16)), out) < 2e-2
    assert out.shape == x.shape and layer.w_down.grad.dtype == torch.float32


def test_the_quack_training_way_gives_our_gradients(cuda):
    """Chapter 08's training step on quack's kernels (moe_gemm.torch.peer_layers.quack_training: gemm_act,
    gemm_dact, the varlen-K gemm), its gradients mapped back to our layout, against our layer's: 2e-2, as the
    CPU test holds the torch layer and transformers' block. Skipped where quack is not installed."""
    from moe_gemm.measure.training import trainable, training_step
    from moe_gemm.variants.peer.quack import quack_available

    if quack_available() is not None:
        pytest.skip(quack_available())
    torch.manual_seed(5)
    layer = MoELayer(512, 256, 16, 4, device=cuda)
    x = torch.randn(1000, 512, device=cuda).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(1000, 512, device=cuda).to(torch.bfloat16)
    found = {}
    for name in ("train/ours", "train/quack"):
        way = trainable(layer, name)
        training_step(way, x, dy)()
        found[name] = ([g.clone() for g in way.gradients()], x.grad.clone())
    (ours, ours_dx), (theirs, theirs_dx) = found["train/ours"], found["train/quack"]
    for name, got, want in zip(["gate", "w_gate_up", "w_down"], theirs, ours):
        assert got.shape == want.shape and relative(got, want) < 2e-2, name
    assert relative(theirs_dx, ours_dx) < 2e-2


def test_a_sonicmoe_style_measurement_splits_each_ways_step(cuda):
    """Chapter 09's sonicmoe part at a small size: each way's step, its forward alone, their difference as the
    backward, the throughputs positive and the gradients of the torch way within bf16 rounding of ours."""
    from moe_gemm.measure.training import measure_training_config
    from moe_gemm.model.workloads import LayerShape, TrainingConfig

    config = TrainingConfig("tiny", LayerShape("tiny", 512, 256, 16, 4), 1024, "a test")
    rows = {r["variant"]: r for r in measure_training_config(config)}
    assert {"train/ours", "train/torch_grouped_mm"} <= set(rows)
    for name, row in rows.items():
        assert 0 < row["forward_eager_ms"] < row["eager_ms"], name
        assert row["backward_ms"] == pytest.approx(row["eager_ms"] - row["forward_eager_ms"]), name
        assert row["forward_tflops"] > 0 and row["step_tflops"] > 0 and row["config"] == "tiny", name
        assert row["grad_rel_error_vs_ours"] < 1e-2, name
