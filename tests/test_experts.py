"""The experts' training function (moe_gemm.torch.experts), on the CPU: its gradients against autograd over
torch operations, SwiGLU's backward bit for bit, what it saves for the backward, and what it skips; and the
op its backward calls for the SwiGLU's backward (moe_gemm.torch.fused_backward): its fallback, its refusals,
its trace. (On the CPU every GEMM is the op's fallback to torch; tests/test_layer_gpu.py runs the layer on k6
and k7, tests/test_dswiglu_gpu.py the fused kernel.)"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from moe_gemm.model.workloads import LayerShape  # noqa: E402
from moe_gemm.torch.experts import experts  # noqa: E402
from moe_gemm.torch.layer import MoELayer, torch_grouped_mm  # noqa: E402
from moe_gemm.torch.swiglu import dswiglu, swiglu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:moe_gemm.torch")  # the op's one warning per fallback reason


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dswiglu_is_autograds_backward_of_swiglu_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(1)
    h = (4 * torch.randn(53, 2 * 40, generator=generator)).to(dtype).requires_grad_()
    dact = torch.randn(53, 40, generator=generator).to(dtype)
    act = swiglu(h)
    act.backward(dact)
    dh, again = dswiglu(dact, h.detach())
    assert dh.dtype == again.dtype == dtype
    assert torch.equal(dh, h.grad) and torch.equal(again, act.detach())


def by_torch(x, order, offs, w_gate_up, w_down, top_k):
    """The same steps as torch operations, expert by expert, for autograd to differentiate."""
    rows, out, start = x[order // top_k], [], 0
    for e, end in enumerate(offs.tolist()):
        out.append(swiglu(rows[start:end] @ w_gate_up[e]) @ w_down[e])
        start = end
    return torch.cat(out)


ROUTINGS = {"ragged, an empty expert": (5, 0, 17, 1, 9), "one expert holds every row": (0, 0, 32, 0, 0),
            "E = 1": (32,), "no rows": (0, 0, 0)}


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_gradients_are_autograds_over_torch_operations(routing):
    """fp32, where the two differ only in the order of their sums: x, W_gate_up and W_down, including an
    expert with no rows (exact zeros), one holding every row, a single expert and no rows at all."""
    counts, top_k, hidden, inter = ROUTINGS[routing], 2, 16, 24
    rows = sum(counts)
    generator = torch.Generator().manual_seed(len(counts) + rows)
    x = torch.randn(rows // top_k, hidden, generator=generator, requires_grad=True)
    order = torch.randperm(rows, generator=generator)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    w_gate_up = torch.randn(len(counts), hidden, 2 * inter, generator=generator, requires_grad=True)
    w_down = torch.randn(len(counts), inter, hidden, generator=generator, requires_grad=True)
    dy = torch.randn(rows, hidden, generator=generator)
    ours = experts(x, order, offs, w_gate_up, w_down, top_k)
    grads = torch.autograd.grad(ours, (x, w_gate_up, w_down), dy)
    want = by_torch(x, order, offs, w_gate_up, w_down, top_k)
    wants = torch.autograd.grad(want, (x, w_gate_up, w_down), dy, allow_unused=True)
    assert ours.shape == want.shape and relative(ours, want) < 1e-6 if rows else ours.shape == (0, hidden)
    for got, expected in zip(grads, wants):
        expected = torch.zeros_like(got) if expected is None else expected
        assert got.shape == expected.shape
        assert relative(got, expected) < 1e-5 if expected.any() else not got.any()
    for e, count in enumerate(counts):
        if count == 0:  # an expert with no rows gets exact zeros
            assert not grads[1][e].any() and not grads[2][e].any()


@pytest.mark.parametrize("needs", ["x", "weights", "w_down"])
def test_only_the_gradients_asked_for_are_computed(needs):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(20, 16, generator=generator, requires_grad=needs == "x")
    order, offs = torch.randperm(40, generator=generator), torch.tensor([10, 30, 40], dtype=torch.int32)
    w_gate_up = torch.randn(3, 16, 48, generator=generator, requires_grad=needs == "weights")
    w_down = torch.randn(3, 24, 16, generator=generator, requires_grad=needs in ("weights", "w_down"))
    experts(x, order, offs, w_gate_up, w_down, 2).sum().backward()
    assert (x.grad is not None) == (needs == "x")
    assert (w_gate_up.grad is not None) == (needs == "weights")
    assert (w_down.grad is not None) == (needs != "x")


def saved(layer: MoELayer, x: torch.Tensor, **forward) -> list[torch.Tensor]:
    """What one forward keeps for the backward (saved_tensors_hooks), one tensor per storage, without the
    caller's own: the input and the parameters."""
    owned = {t.untyped_storage().data_ptr() for t in (x, *layer.parameters())}
    kept: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in owned:
            kept[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(x, **forward)
    return list(kept.values())


def test_the_layer_keeps_half_the_activations_of_the_torch_layer():
    """Counted, not assumed: the [rows, ...] tensors of the layer's dtype that a training forward keeps are
    H + 2I elements per routed row on our experts and 2H + 4I on the torch layer (the layer's model,
    LayerShape.saved_elements_per_row),
    and everything it keeps, indices and routing weights included, is under 0.55 of the torch layer's."""
    hidden, inter, experts_, top_k, tokens = 64, 128, 8, 2, 48
    torch.manual_seed(0)
    layer = MoELayer(hidden, inter, experts_, top_k, fused=True)
    x = torch.randn(tokens, hidden).to(torch.bfloat16).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = saved(layer, x), saved(layer, x, gemm=torch_grouped_mm)

    def activations(kept: list[torch.Tensor]) -> int:
        return sum(t.untyped_storage().nbytes() // 2 for t in kept
                   if t.dtype == torch.bfloat16 and t.shape[0] == tokens * top_k)

    def everything(kept: list[torch.Tensor]) -> int:
        return sum(t.untyped_storage().nbytes() for t in kept)

    shape = LayerShape("test", hidden, inter, experts_, top_k)
    assert activations(ours) == tokens * top_k * shape.saved_elements_per_row("ours")
    assert activations(theirs) == tokens * top_k * shape.saved_elements_per_row("torch")
    assert 2 * shape.saved_elements_per_row("ours") == shape.saved_elements_per_row("torch")
    assert everything(ours) < 0.55 * everything(theirs)


def test_the_backward_frees_the_saved_pre_activation_once_used():
    """h [M, 2I], saved for the backward (and seen by the saved-tensor hooks), is emptied by the backward once
    SwiGLU's backward has read it; a second backward through the same forward is refused, naming why."""
    torch.manual_seed(5)
    layer = MoELayer(64, 128, 8, 2)
    x = torch.randn(24, 64).to(torch.bfloat16).requires_grad_()
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = layer(x)
    (h,) = [t for t in kept if t.shape == (24 * 2, 2 * 128)]
    assert h.untyped_storage().nbytes() == h.numel() * 2
    y.sum().backward(retain_graph=True)
    assert h.untyped_storage().nbytes() == 0
    with pytest.raises(RuntimeError, match="a second backward through one forward"):
        y.sum().backward()


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by the storages created under it that are still alive, each at its current
    size (a storage emptied in place counts as freed): a training step's memory traced op by op on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()  # one Python object per storage while it lives
                known = self.storages.get(id(storage))
                if known is not None and known() is storage or id(storage) in inputs:
                    continue  # counted already, or a view of (or a write into) a tensor made before the step
                self.storages[id(storage)] = weakref.ref(storage)
        alive = [s for s in (r() for r in self.storages.values()) if s is not None]
        self.peak = max(self.peak, sum(s.nbytes() for s in alive))
        return out


def step_peak(layer: MoELayer, x: torch.Tensor, dy: torch.Tensor, **forward) -> int:
    """A training step's peak bytes over the weights and the input, less the gradients it leaves (chapter 08's
    measure, traced at the dispatcher instead of the CUDA allocator)."""
    tensors = [*layer.parameters(), x]
    for t in tensors:
        t.grad = None
    gc.collect()
    gc.disable()  # what a reference cycle holds counts as live, as long as it is: not freed by chance mid-step
    try:
        with LiveBytes() as live:
            layer(x, **forward).backward(dy)
    finally:
        gc.enable()
    return live.peak - sum(t.grad.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("hidden, inter, experts_, top_k", [(256, 896, 8, 2), (256, 96, 16, 8)])
def test_freeing_h_brings_the_steps_peak_under_0_7_of_the_torch_layers(monkeypatch, hidden, inter, experts_, top_k):
    """Mixtral-like and Qwen3-like proportions (I / H and E, top_k as chapter 08's layers), 1,024 tokens, on the
    CPU: with h freed once used, our step's peak is under 0.7 of the torch layer's (chapter 09's target); held to
    the end of the backward (release a no-op), 0.1 or more higher."""
    import moe_gemm.torch.experts as module

    torch.manual_seed(6)
    layer = MoELayer(hidden, inter, experts_, top_k)
    x = torch.randn(1024, hidden).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(1024, hidden).to(torch.bfloat16)
    theirs = step_peak(layer, x, dy, gemm=torch_grouped_mm)
    freed = step_peak(layer, x, dy) / theirs
    monkeypatch.setattr(module, "release", lambda saved: None)
    held = step_peak(layer, x, dy) / theirs
    assert freed < 0.7 and held - freed > 0.1


def test_inference_keeps_the_fused_forward():
    """Without gradients the experts' training function is not used: the fused GEMM 1 runs (on the CPU its
    fallback), and the output is the training forward's within bf16 rounding of one intermediate."""
    torch.manual_seed(4)
    layer = MoELayer(64, 128, 8, 2, fused=True)
    x = torch.randn(24, 64).to(torch.bfloat16)
    with torch.no_grad():
        inference = layer(x)
    training = layer(x)
    assert inference.grad_fn is None and training.grad_fn is not None
    assert relative(inference, training.detach()) < 1e-2


def test_the_training_step_compiles_whole_to_the_eager_gradients():
    """torch.compile(fullgraph=True) traces the experts' function, forward and backward (through the ops'
    fake implementations), to the eager gradients bit for bit."""
    torch.manual_seed(5)
    layer = MoELayer(64, 128, 8, 2, fused=True)
    x = torch.randn(24, 64).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(24, 64).to(torch.bfloat16)
    layer(x).backward(dy)
    eager = [t.grad.clone() for t in (*layer.parameters(), x)]
    for t in (*layer.parameters(), x):
        t.grad = None
    torch.compile(layer, fullgraph=True, backend="aot_eager")(x).backward(dy)
    assert all(torch.equal(t.grad, want) for t, want in zip((*layer.parameters(), x), eager))


# ---------------------------------------------------------------------------- the fused backward's op


def inputs(counts: tuple[int, ...], hidden: int = 64, inter: int = 48, dtype=torch.bfloat16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    dy = torch.randn(rows, hidden, generator=generator).to(dtype)
    w_down = torch.randn(len(counts), inter, hidden, generator=generator).to(dtype)
    preact = (3 * torch.randn(rows, 2 * inter, generator=generator)).to(dtype)
    return dy, w_down, torch.tensor(counts).cumsum(0).to(torch.int32), preact


@pytest.mark.parametrize("counts", [(5, 0, 17, 9), (31,), (0, 0)])
def test_the_op_is_the_gemm_then_dswiglu_where_the_kernel_does_not_run(counts):
    from moe_gemm.torch.fused_backward import grouped_mm_dswiglu
    from moe_gemm.torch.ops import grouped_mm

    dy, w_down, offs, preact = inputs(counts)
    dh, act = grouped_mm_dswiglu(dy, w_down, offs, preact)
    want_dh, want_act = dswiglu(grouped_mm(dy, w_down.transpose(1, 2), offs, dy.dtype), preact)
    assert dh.shape == preact.shape and act.shape == (sum(counts), w_down.shape[1])
    assert torch.equal(dh, want_dh) and torch.equal(act, want_act)


def test_a_kernel_not_yet_run_is_not_launched(monkeypatch):
    """While the fused kernel is in NOT_YET_RUN the op never launches it, even for inputs it could take."""
    from moe_gemm.torch import fused_backward

    monkeypatch.setattr(fused_backward, "NOT_YET_RUN", frozenset({"torch/dswiglu"}))
    monkeypatch.setattr(fused_backward, "refusal", lambda *inputs: None)  # as if on an sm_90a GPU
    monkeypatch.setattr(fused_backward, "fused", lambda *inputs: pytest.fail("launched a kernel not yet run"))
    dh, act = fused_backward.grouped_mm_dswiglu(*inputs((5, 7)))
    assert dh.shape == (12, 96) and act.shape == (12, 48)


@pytest.mark.parametrize("launch", [False, True])
def test_the_op_launches_the_fused_kernel_only_when_told(monkeypatch, launch):
    """Admitted (NOT_YET_RUN empty) and given inputs it takes, the op launches the fused kernel only with
    LAUNCH_FUSED set (chapter 09 measured it slower than the unfused path)."""
    from moe_gemm.torch import fused_backward

    sentinel = (torch.zeros(12, 96, dtype=torch.bfloat16), torch.zeros(12, 48, dtype=torch.bfloat16))
    monkeypatch.setattr(fused_backward, "NOT_YET_RUN", frozenset())
    monkeypatch.setattr(fused_backward, "LAUNCH_FUSED", launch)
    monkeypatch.setattr(fused_backward, "refusal", lambda *inputs: None)
    monkeypatch.setattr(fused_backward, "fused", lambda *inputs: sentinel)
    dh, _ = fused_backward.grouped_mm_dswiglu(*inputs((5, 7)))
    assert (dh is sentinel[0]) == launch


@pytest.mark.parametrize(("change", "match"), [
    (lambda dy, w, offs, h: (dy, w, offs, h[:, :-2]), r"preact must be \[M_tot, 2I\]"),
    (lambda dy, w, offs, h: (dy, w, offs, h.float()), "dtype and device"),
    (lambda dy, w, offs, h: (dy, w[0], offs, h), "3-D"),
    (lambda dy, w, offs, h: (dy[:, :32], w, offs, h), "K"),
])
def test_malformed_inputs_are_refused_before_any_work(change, match):
    from moe_gemm.torch.fused_backward import grouped_mm_dswiglu

    with pytest.raises(ValueError, match=match):
        grouped_mm_dswiglu(*change(*inputs((5, 7))))


def test_the_op_traces_under_compile_with_its_shapes():
    from moe_gemm.torch.fused_backward import grouped_mm_dswiglu

    dy, w_down, offs, preact = inputs((5, 0, 11))
    dh, act = torch.compile(grouped_mm_dswiglu, fullgraph=True, backend="aot_eager")(dy, w_down, offs, preact)
    assert dh.shape == preact.shape and act.shape == (16, 48) and dh.dtype == act.dtype == torch.bfloat16
