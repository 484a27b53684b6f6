"""Measuring an MoE layer's training on torch tensors: the training step (forward and backward of a fixed output
gradient, no optimizer) of our layer and of its peers with its peak memory, for chapter 08; the same at
SonicMoE's configurations split into its forward and its backward, and SwiGLU's backward fused into the dA GEMM
against its unfused parts, for chapter 09.

Every measurement runs on the GPU and imports torch when called, so this module loads where torch is not
installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from moe_gemm.measure.check import progress
from moe_gemm.measure.layer import Row, at_each_token_count, eager_and_graph, relative_error, seeded_layer
from moe_gemm.model.workloads import LayerShape, TrainingConfig, Workload

# The training step (forward, then backward of a fixed output gradient; no optimizer): our layer, the same
# code on torch._grouped_mm (torch's autograd), transformers' block on its default grouped_mm experts, and
# the experts on quack's kernels (moe_gemm.torch.peer_layers.quack_training) where quack is installed.
TRAIN_WAYS = ("train/ours", "train/torch_grouped_mm", "train/transformers", "train/quack")
TRAIN_TOKENS = (4096, 32768)
# The gradients compared with ours: the router's whole, the first 8 experts' weights. Keeping a copy of
# all of ours would be DeepSeek-V3-like's 22.5 GB of bf16 weights again, beside transformers' copy of
# the weights, its gradients, and the capture's warm-up and graph pool each holding a set of gradients.
CHECKED_EXPERTS = 8


class Trainable(NamedTuple):
    """One way of running the layer's training step: its forward pass, the tensors that get gradients,
    and those gradients in our layer's layout (gate [E, H], w_gate_up [E, H, 2I], w_down [E, I, H])."""

    forward: Callable[[Any], Any]
    parameters: list[Any]
    gradients: Callable[[], list[Any]]


def trainable(layer: Any, way: str) -> Trainable:
    """``way`` (one of TRAIN_WAYS) over ``layer``'s weights: our layer and the torch layer share them;
    transformers' block and quack's interleaved W_gate_up are copies, built here, so their weights and
    gradients exist only for their turn. A ValueError for quack where it is not installed."""
    from moe_gemm.torch.layer import torch_grouped_mm, transformers_forward
    from moe_gemm.torch.peer_layers import quack_training, transformers_block_of

    ours = list(layer.parameters())
    if way == "train/ours":
        return Trainable(layer, ours, lambda: [p.grad for p in ours])
    if way == "train/torch_grouped_mm":
        return Trainable(lambda x: layer(x, gemm=torch_grouped_mm), ours, lambda: [p.grad for p in ours])
    if way == "train/transformers":
        block = transformers_block_of(layer, "grouped_mm")
        experts = block.experts
        return Trainable(lambda x: transformers_forward(block, x), list(block.parameters()),
                         lambda: [block.gate.weight.grad, experts.gate_up_proj.grad.transpose(1, 2),
                                  experts.down_proj.grad.transpose(1, 2)])
    if way == "train/quack":
        found = quack_training(layer)
        if found is None:
            raise ValueError("train/quack needs quack (the peers extra) on an sm_90a GPU")
        return Trainable(*found)
    raise ValueError(f"way must be one of {TRAIN_WAYS}, got {way!r}")


def drop_gradients(tensors: Sequence[Any]) -> None:
    """Set each tensor's gradient to None (freed, not zeroed: the next backward allocates it anew)."""
    for tensor in tensors:
        tensor.grad = None


def training_step(way: Trainable, x: Any, dy: Any) -> Callable[[], None]:
    """One step without the optimizer: the gradients dropped (set to None, so that a captured step
    allocates its own, as torch's whole-network capture example does), the forward pass, and the
    backward of a fixed output gradient ``dy`` into the parameters and the input ``x``."""

    def step() -> None:
        drop_gradients([*way.parameters, x])
        way.forward(x).backward(dy)

    return step


def checked(gradients: Sequence[Any]) -> list[Any]:
    """The gradients compared with ours: the router's, and the first CHECKED_EXPERTS experts' weights'."""
    router, *experts = gradients
    return [router, *(g[:CHECKED_EXPERTS] for g in experts)]


def peak_memory(step: Callable[[], None], tensors: Sequence[Any]) -> int:
    """Bytes one eager ``step`` allocates at its peak over what was allocated before it (the weights,
    the inputs), less the gradients it leaves on ``tensors``: its activations and workspace."""
    import torch

    drop_gradients(tensors)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    gradients = sum(t.grad.numel() * t.grad.element_size() for t in tensors if t.grad is not None)
    return torch.cuda.max_memory_allocated() - before - gradients


def train_ways(with_transformers: bool, with_quack: bool = True) -> tuple[str, ...]:
    """The ways measure_train times: TRAIN_WAYS, less transformers' unless asked, less quack's unless asked or
    where it is not installed."""
    from moe_gemm.variants.peer.quack import quack_available

    return tuple(w for w in TRAIN_WAYS if (w != "train/transformers" or with_transformers)
                 and (w != "train/quack" or (with_quack and quack_available() is None)))


def measure_train(shape: LayerShape, tokens_list: Sequence[int], with_transformers: bool,
                  forward_too: bool = False, with_quack: bool = True) -> list[Row]:
    """Each of TRAIN_WAYS' training steps over one seeded_layer at each token count, on the same tokens
    and output gradient: its peak memory, its time eagerly and as CUDA-graph replays (eager_and_graph),
    its GPU time by kind of kernel (kernel_split), and its gradients' error against ours (the worst of gate,
    w_gate_up, w_down; checked()). ``forward_too``: also the forward pass alone with autograd recording
    (``forward_eager_ms``), eagerly, as SonicMoE times it to split a step into its forward and its backward.
    ``with_quack``: False leaves quack's way out where it is installed."""
    import torch

    layer = seeded_layer(shape)
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16).requires_grad_()
        dy = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        reference = None
        for name in train_ways(with_transformers, with_quack):
            progress(f"[{shape.label}, {tokens:,} tokens] {name}: forward + backward")
            row = time_way(layer, name, x, dy, reference, forward_too)
            if row is None:
                continue
            reference = row.pop("gradients") if name == "train/ours" else reference
            rows.append({"variant": name, **shape.fields(tokens), **row})
    return rows


def time_way(layer: Any, name: str, x: Any, dy: Any, reference: list[Any] | None,
             forward_too: bool = False) -> Row | None:
    """One way's training step on ``x`` and ``dy``: its peak memory, eager and graph times, its gradients'
    error against ``reference`` (ours' checked gradients; None where ours was not timed) and, for ours, a copy
    of its checked gradients under "gradients", the others' reference. None, after saying why, where the way
    cannot hold this size (out of memory, building its copy of the weights included) or where quack's kernels
    fail (a peer's failure, reported); any other failure is ours or torch's, and is raised."""
    import torch

    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.ops import offsets_unchecked

    started = time.perf_counter()

    def done(what: str) -> None:  # a step can take minutes (an autotuner's first calls at a new shape)
        progress(f"  {name}: {what} after {time.perf_counter() - started:.0f} s")

    way = step = None
    tensors: list[Any] = []
    try:
        way = trainable(layer, name)  # transformers' and quack's ways copy the weights: that can run out too
        step, tensors = training_step(way, x, dy), [*way.parameters, x]
        with offsets_unchecked():
            memory = peak_memory(step, tensors)
            gradients = checked(way.gradients())
            done("first step run and its gradients checked")
            kept = [g.clone() for g in gradients] if name == "train/ours" else None
            error = (0.0 if kept is not None else None if reference is None
                     else max(relative_error(g, r) for g, r in zip(gradients, reference)))
            del gradients
            timed = eager_and_graph(step, release=lambda: drop_gradients(tensors))
            done("timed eagerly and as graph replays")
            timed["kernel_ms_by_kind"] = kernel_split(step, tensors)
            done("its GPU time split by kind of kernel")
            if forward_too:
                timed["forward_eager_ms"] = time_call(lambda: way.forward(x), graph=False).median_ms
    except (torch.cuda.OutOfMemoryError, RuntimeError, ValueError) as failure:
        if not isinstance(failure, torch.cuda.OutOfMemoryError) and name != "train/quack":
            raise
        progress(f"  {name} is not timed at {x.shape[0]:,} tokens: {type(failure).__name__}: "
                 f"{(str(failure).splitlines() or [''])[0]}")
        return None
    finally:
        drop_gradients(tensors)
        way = step = None  # transformers' copy of the weights and the graphs' pools go before the next way
        torch.cuda.empty_cache()
    if timed["graph_error"]:
        progress(f"  {name} is timed eagerly: it does not capture ({timed['graph_error']})")
    return {**timed, "peak_extra_bytes": memory, "grad_rel_error_vs_ours": error, "gradients": kept}


def kernel_split(step: Callable[[], None], tensors: Sequence[Any]) -> dict[str, float] | None:
    """One eager ``step``'s GPU milliseconds by kind of kernel (moe_gemm.measure.kernel_split), its gradients
    dropped after each profiled step; None, after saying why, where torch's profiler gives no kernels (CUPTI
    unavailable): the timing stands without it."""
    from moe_gemm.measure.kernel_split import kernel_ms, split_by_kind

    try:
        split = split_by_kind(kernel_ms(step, release=lambda: drop_gradients(tensors)))
    except RuntimeError as failure:
        progress(f"  no kernel split: {type(failure).__name__}: {(str(failure).splitlines() or [''])[0]}")
        return None
    if not split:
        progress("  no kernel split: the profiler recorded no kernels")
    return split or None


def measure_training_config(config: TrainingConfig) -> list[Row]:
    """A training step of each way but transformers' (its block holds a second copy of the weights) at one of
    SonicMoE's configurations, its forward timed alone too; each row carries the configuration's name and
    training_split's throughputs."""
    rows = measure_train(config.layer, [config.tokens], with_transformers=False, forward_too=True)
    return [{**row, "config": config.name, **training_split(row, config)} for row in rows]


def training_split(row: Row, config: TrainingConfig) -> dict[str, float]:
    """SonicMoE's accounting of one eager training step (its benchmarks/moe-cute.py): the forward with autograd
    recording, the backward as the step's time less the forward's, each over its GEMM FLOPs
    (TrainingConfig.flops), in TFLOP/s; backward_ms as well."""
    flops = config.flops()
    backward_ms = row["eager_ms"] - row["forward_eager_ms"]
    return {"backward_ms": backward_ms,
            "forward_tflops": flops["forward"] / (row["forward_eager_ms"] * 1e9),
            "backward_tflops": flops["backward"] / (backward_ms * 1e9) if backward_ms > 0 else float("nan"),
            "step_tflops": flops["step"] / (row["eager_ms"] * 1e9)}


FUSED_BACKWARD_CHECK = 2e-2  # the fused kernel against the unfused path (both bf16; the fused one rounds once)


def measure_fused_backward(shape: LayerShape, tokens_list: Sequence[int]) -> list[Row]:
    """Chapter 09's test of SwiGLU's backward fused into the dA GEMM (:func:`fused_backward`) at one layer size."""
    return at_each_token_count(shape, tokens_list, "dA with SwiGLU's backward fused, dA alone, SwiGLU's backward",
                               fused_backward)


def fused_backward(layer: Any, x: Any) -> dict[str, float]:
    """The dA GEMM of GEMM 2 with SwiGLU's backward fused (moe_gemm.torch.fused_backward.fused, launched directly:
    the op waits for the validation record), the dA GEMM alone (dact [M, I] written) and SwiGLU's backward as
    torch operations (moe_gemm.torch.swiglu.dswiglu_torch) and, once it has passed its GPU tests, as one kernel
    (dswiglu_pass), in interleaved rounds of graph replays after one eager call of each GEMM (the op tunes a new
    shape there), with the one-pass kernel a device copy of as many bytes as it moves (its ceiling). First the
    fused result is checked against the unfused one: a RuntimeError, and nothing timed, beyond
    FUSED_BACKWARD_CHECK. Also the bytes the separate pass moves at
    best (dact read, h read, dh and the activation written) and those the fused kernel adds to the GEMM (h read,
    dh and the activation written, dact not written)."""
    import torch

    from moe_gemm.torch.bench import time_interleaved
    from moe_gemm.torch.fused_backward import has_run, refusal
    from moe_gemm.torch.layer import dispatch
    from moe_gemm.torch.ops import grouped_mm
    from moe_gemm.torch.swiglu import dswiglu_pass, dswiglu_torch, runs_the_pass_kernel
    from moe_gemm.variants.k6.config import FUSED_BACKWARD

    _, _, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)
    h = grouped_mm(rows, layer.w_gate_up, offs)
    dy = torch.randn(rows.shape, device=rows.device).to(rows.dtype)
    del rows  # [M, H]: 3.8 GB at the DeepSeek-V3-like size, 32,768 tokens, where an 80 GB GPU runs short
    w_down_t = layer.w_down.transpose(1, 2)
    reason = refusal(dy, layer.w_down, offs, h)
    if reason is not None:
        raise ValueError(f"the fused SwiGLU backward cannot take this layer's shapes: {reason}")
    dact = grouped_mm(dy, w_down_t, offs)
    want = dswiglu_torch(dact, h)
    calls, errors = {}, {}
    if runs_the_pass_kernel(dact, h):  # the separate pass as one kernel, checked as the fused ones are
        calls["dswiglu_kernel"], errors["dswiglu_kernel_error_vs_unfused"] = checked_backward(
            "the one-pass SwiGLU backward", lambda: dswiglu_pass(dact, h), want)
        source = torch.empty((dact.shape[0], 3 * dact.shape[1]), dtype=dact.dtype, device=dact.device)
        target = torch.empty_like(source)  # its ceiling: a copy of as many bytes as it reads, into as many
        calls["copy"] = lambda: target.copy_(source)
    for config in (c for c in FUSED_BACKWARD if has_run(c)):  # the twin that prefetches h once it has passed
        key = FUSED_KEYS[config]
        calls[key], errors[f"{key}_error_vs_unfused"] = checked_fused(config, dy, layer.w_down, offs, h, want)
    tile, tile_error = fused_tile_gemm(dy, w_down_t, offs, dact)
    del want  # checked against; every captured call below keeps its own outputs
    timed = time_interleaved({**calls, "dgemm": lambda: grouped_mm(dy, w_down_t, offs), "dgemm_tile": tile,
                              "dswiglu": lambda: dswiglu_torch(dact, h)})
    m, inter = dact.shape
    return {**{f"{name}_ms": t.median_ms for name, t in timed.items()}, **errors, "dgemm_tile_error": tile_error,
            "dswiglu_pass_bytes": m * inter * 2 * 6, "fused_adds_bytes": m * inter * 2 * 4}


def checked_backward(name: str, call: Callable[[], Sequence[Any]],
                     want: Sequence[Any]) -> tuple[Callable[[], Sequence[Any]], float]:
    """``call`` (returning dh and the activation) as a call to repeat, and its result's relative error against
    ``want`` (torch's unfused dh and activation): a RuntimeError naming ``name``, and nothing to time, beyond
    FUSED_BACKWARD_CHECK."""
    error = max(relative_error(g, w) for g, w in zip(call(), want))
    if error > FUSED_BACKWARD_CHECK:
        raise RuntimeError(f"{name} is {error:.2e} from the unfused SwiGLU backward (allowed "
                           f"{FUSED_BACKWARD_CHECK}): not timed")
    return call, error


def checked_fused(config: str, dy: Any, w_down: Any, offs: Any, h: Any,
                  want: Sequence[Any]) -> tuple[Callable[[], Any], float]:
    """The fused SwiGLU backward ``config`` (one of FUSED_BACKWARD), :func:`checked_backward`."""
    from moe_gemm.torch.fused_backward import fused

    return checked_backward(config, lambda: fused(dy, w_down, offs, h, config), want)


def fused_backward_call(config: str, workload: Workload) -> Callable[[], Any]:
    """The fused SwiGLU backward ``config`` on random inputs of ``workload``'s shape (dy [M_tot, K], W_down
    [E, N, K], the saved pre-activation [M_tot, 2N], the routing's row counts), checked once against the unfused
    path: one launch to repeat, for Nsight Compute (moe_gemm.measure.profile_target)."""
    import torch

    from moe_gemm.torch.ops import grouped_mm
    from moe_gemm.torch.swiglu import dswiglu_torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, hidden, inter = workload.tokens, workload.K, workload.N

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    offs = torch.as_tensor(workload.counts, dtype=torch.int64).cumsum(0).to(device="cuda", dtype=torch.int32)
    dy, h = randn(rows, hidden), randn(rows, 2 * inter)
    w_down = randn(workload.experts, inter, hidden, scale=hidden ** -0.5)
    want = dswiglu_torch(grouped_mm(dy, w_down.transpose(1, 2), offs), h)
    return checked_fused(config, dy, w_down, offs, h, want)[0]


# The dswiglu part's names for the fused configurations' times: h loaded by the epilogue, prefetched by TMA, or
# loaded by the epilogue with the units walked in raster groups of 8 M tiles, without and with L2 eviction
# priorities.
FUSED_KEYS = {"k6/dswiglu-bn128": "fused", "k6/dswiglu-prefetch-bn128": "fused_prefetch",
              "k6/dswiglu-g8-bn128": "fused_g8", "k6/dswiglu-hints-g8-bn128": "fused_hints_g8",
              "k6/dswiglu-mcluster-bn128": "fused_mcluster"}


FUSED_TILE = "k6/pingpong-bn128"  # the fused kernel's tile, stages and walk (k6/dswiglu-bn128) as a plain GEMM


def fused_tile_gemm(dy: Any, w_down_t: Any, offs: Any, dact: Any) -> tuple[Callable[[], None], float]:
    """The dA GEMM on the fused kernel's own tile (128 x 128 ping-pong, six stages, no cluster: FUSED_TILE) instead
    of the configuration the op tuned for the shape, and its output's relative error against the op's ``dact``
    (a RuntimeError beyond FUSED_BACKWARD_CHECK): what the fused kernel's extra time owes to its tile. The rung
    validated on the GPU reads B as [E, K, N], so W_down^T is copied to that layout once (the wgmma reads either
    layout at one rate)."""
    import torch

    from moe_gemm.torch.ops import _launcher
    from moe_gemm.torch.rules import K6_ELEMENTS

    element = K6_ELEMENTS[str(dy.dtype).removeprefix("torch.")]
    out = torch.empty_like(dact)
    launch = _launcher(FUSED_TILE, "kn", (element, element), dy, w_down_t.contiguous(), offs, out)  # holds them
    launch()
    error = relative_error(out, dact)
    if error > FUSED_BACKWARD_CHECK:
        raise RuntimeError(f"{FUSED_TILE} on the dA GEMM is {error:.2e} from the op's (allowed {FUSED_BACKWARD_CHECK})")
    return launch, error


def fused_backward_extra(row: Row) -> float:
    """The fused launch's time over the dA GEMM alone, in separate SwiGLU-backward passes: chapter 09's target.
    The faster of the fused configurations the row timed counts (the one that prefetches h, where it ran)."""
    fused_ms = min(row[f"{key}_ms"] for key in FUSED_KEYS.values() if f"{key}_ms" in row)
    return (fused_ms - row["dgemm_ms"]) / row["dswiglu_ms"]
