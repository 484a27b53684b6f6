"""Measuring a whole MoE layer (moe_gemm.torch.MoELayer) on torch tensors, for chapter 08: its forward
pass every way on the same tokens, eagerly and as CUDA-graph replays; our layer split into its steps, GEMM 1's
fused SwiGLU epilogue against its unfused parts, the op's host time per call, and torch.compile's graph of the
layer. The training step and the backward's fused kernel are moe_gemm.measure.training's.

Every measurement runs on the GPU and imports torch when called, so this module loads where torch
is not installed (chapter 08 then shows the recorded results).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from moe_gemm.measure.check import progress
from moe_gemm.model.workloads import LAYERS, SEED_EXPERTS, SEED_K, SEED_N, LayerShape

Row = dict[str, Any]
WAYS = ("layer/ours", "layer/torch_grouped_mm", "layer/quack", "layer/transformers", "layer/transformers-eager",
        "layer/transformers-batched_mm")  # the transformers rows: moe_gemm.torch.peer_layers.TRANSFORMERS_WAYS
STEPS = ("router", "permutation", "GEMM 1 + SwiGLU", "GEMM 2", "combine")
LAYER_KEY = ("hidden", "intermediate", "experts", "top_k", "tokens")  # what names one layer measurement


def layer_key(row: Row) -> tuple:
    """The layer size and token count a record, step split or fused row measured."""
    return tuple(row.get(k) for k in LAYER_KEY)


def seeded_layer(shape: LayerShape) -> Any:
    """The layer every measurement of ``shape`` runs: random bf16 weights from seed 0, on the GPU."""
    import torch

    from moe_gemm.torch import MoELayer

    torch.manual_seed(0)
    return MoELayer(shape.hidden, shape.intermediate, shape.experts, shape.top_k, device="cuda")


def ways(layer: Any, with_quack: bool, with_transformers: bool) -> tuple[dict[str, Callable], Row]:
    """Each way's forward pass over ``layer``, in WAYS' order (quack's where it is installed), and the
    fields quack's records carry: how its GEMM 1 ran."""
    from moe_gemm.torch.layer import torch_grouped_mm
    from moe_gemm.torch.peer_layers import TRANSFORMERS_WAYS, quack_forward, transformers_forward_of

    found: dict[str, Callable] = {"layer/ours": layer,
                                  "layer/torch_grouped_mm": lambda x: layer(x, gemm=torch_grouped_mm)}
    quack_fields: Row = {}
    quack = quack_forward(layer) if with_quack else None
    if quack is not None:
        found["layer/quack"], quack_fields = quack
        if "quack_gemm_act_error" in quack_fields:
            progress(f"[quack] gemm_act with SwiGLU failed ({quack_fields['quack_gemm_act_error']}); GEMM 1 runs "
                     "quack's gemm, SwiGLU its own pass")
    # built when first called: each block holds a copy of the weights (22.5 GB at DeepSeek-V3 size)
    if with_transformers:
        found.update({way: _built_on_first_call(transformers_forward_of, layer, how)
                      for way, how in TRANSFORMERS_WAYS.items()})
    return found, quack_fields


def _built_on_first_call(build: Callable[..., Callable], *args: Any) -> Callable:
    """A forward pass that builds itself (``build(*args)``) when first called, so that measure_layer, which
    runs the ways one after another and drops each when done, never holds two copies of the weights."""
    built: list[Callable] = []

    def forward(x: Any) -> Any:
        if not built:
            built.append(build(*args))
        return built[0](x)

    return forward


def eager_and_graph(call: Callable[[], Any], release: Callable[[], None] | None = None) -> Row:
    """``call`` timed eagerly, then captured in one CUDA graph and replayed where it captures (else the
    reason it does not: a transformers block that reads the routing back to the host, torch's fp16/fp32
    grouped GEMM, memory). median_ms, min_ms and max_ms are the graph replays' where there are some.
    ``release``, between the two: drops what the eager calls left (a training step's gradients), so
    that the capture's warm-up stream and graph pool, which cannot reuse its memory, do not sit beside it."""
    import torch

    from moe_gemm.torch.bench import time_call

    eager = time_call(call, graph=False)
    row: Row = {"eager_ms": eager.median_ms, "graph_ms": None, "graph_error": None}
    best = eager
    if release is not None:
        release()
        torch.cuda.empty_cache()
    try:
        best = time_call(call, graph=True)
        row["graph_ms"] = best.median_ms
    except Exception as error:  # noqa: BLE001 - whatever stops the capture is recorded; the eager time stands
        row["graph_error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return {"median_ms": best.median_ms, "min_ms": best.min_ms, "max_ms": best.max_ms, "cuda_graph": best.graph,
            **row}


def measure_layer(shape: LayerShape, tokens_list: Sequence[int], with_transformers: bool,
                  with_quack: bool) -> tuple[list[Row], list[Row]]:
    """Each way's forward pass over one seeded_layer at each token count, on the same tokens, with its
    error against ours, eagerly and as CUDA-graph replays (eager_and_graph). Then our layer's steps
    (step_times)."""
    import torch

    from moe_gemm.torch.ops import offsets_unchecked

    layer = seeded_layer(shape)
    forwards, quack_fields = ways(layer, with_quack, with_transformers)
    inputs = {tokens: torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16) for tokens in tokens_list}
    records, steps, references = [], [], {}
    for name in list(forwards):  # way by way, each dropped when done: no two copies of the weights at once
        forward = forwards.pop(name)
        for tokens, x in inputs.items():
            progress(f"[{shape.label}, {tokens:,} tokens] {name}")
            try:
                with torch.no_grad(), offsets_unchecked():
                    out = forward(x)
                    reference = references.setdefault(tokens, out)  # ours comes first
                    error = relative_error(out, reference)
                    timed = eager_and_graph(lambda forward=forward, x=x: forward(x))
            except torch.cuda.OutOfMemoryError:  # a way that cannot hold this size is left out; the others run
                progress(f"  {name} runs out of GPU memory at {tokens:,} tokens: not timed")
                out = None
                torch.cuda.empty_cache()
                continue
            if timed["graph_error"]:
                progress(f"  {name} is timed eagerly: it does not capture ({timed['graph_error']})")
            records.append({"variant": name, **shape.fields(tokens), **timed, "rel_error_vs_ours": error,
                            **(quack_fields if name == "layer/quack" else {})})
        del forward, out
        torch.cuda.empty_cache()
    for tokens, x in inputs.items():
        with torch.no_grad(), offsets_unchecked():
            steps.append({**shape.fields(tokens), **step_times(layer, x)})
    return records, steps


def relative_error(got: Any, want: Any) -> float:
    """Relative Frobenius error of ``got`` against ``want``."""
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def step_times(layer: Any, x: Any) -> dict[str, float]:
    """Our layer's forward pass split into its STEPS, each captured and replayed on its own inputs."""
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.layer import combine, permute, route
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu

    weights, experts = route(x, layer.gate, layer.top_k, layer.normalize)
    order, offs = permute(experts, layer.gate.shape[0])
    rows = x[order // layer.top_k]
    act = grouped_mm_swiglu(rows, layer.w_gate_up, offs)
    y = grouped_mm(act, layer.w_down, offs)
    calls = {
        "router": lambda: route(x, layer.gate, layer.top_k, layer.normalize),
        "permutation": lambda: (permute(experts, layer.gate.shape[0]), x[order // layer.top_k]),
        "GEMM 1 + SwiGLU": lambda: grouped_mm_swiglu(rows, layer.w_gate_up, offs),
        "GEMM 2": lambda: grouped_mm(act, layer.w_down, offs),
        "combine": lambda: combine(y, order, weights, layer.top_k),
    }
    return {f"{step}_ms": time_call(call, graph=True).median_ms for step, call in calls.items()}


def at_each_token_count(shape: LayerShape, tokens_list: Sequence[int], what: str,
                        measure: Callable[[Any, Any], dict[str, float]]) -> list[Row]:
    """``measure(layer, x)`` at one layer size (on its own seeded_layer), at each token count, on random bf16
    tokens x, without autograd and without reading offs back; each row with the layer's fields."""
    import torch

    from moe_gemm.torch.ops import offsets_unchecked

    layer = seeded_layer(shape)
    rows = []
    for tokens in tokens_list:
        progress(f"[{shape.label}, {tokens:,} tokens] {what}")
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        with torch.no_grad(), offsets_unchecked():
            rows.append({**shape.fields(tokens), **measure(layer, x)})
    return rows


def measure_fused(shape: LayerShape, tokens_list: Sequence[int]) -> list[Row]:
    """Chapter 08's test of the fused SwiGLU epilogue (:func:`fused_epilogue`) at one layer size."""
    return at_each_token_count(shape, tokens_list, "GEMM 1 fused, GEMM 1 alone, SwiGLU pass", fused_epilogue)


def fused_epilogue(layer: Any, x: Any) -> dict[str, float]:
    """GEMM 1 with the fused epilogue, GEMM 1 alone (the same columns, C [M, 2I] written), and the
    SwiGLU pass alone, in interleaved rounds after one eager call of each GEMM (where the op tunes a
    new shape: a second or more of back-to-back launches that must not fall into any call's timing);
    the bytes the separate pass moves (C [M, 2I] read, [M, I] written) and the fused one saves (C [M, 2I]
    written and read back)."""
    from moe_gemm.torch.bench import time_interleaved
    from moe_gemm.torch.layer import dispatch, swiglu
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu

    _, _, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)
    grouped_mm_swiglu(rows, layer.w_gate_up, offs)
    h = grouped_mm(rows, layer.w_gate_up, offs)
    m, width = h.shape
    timed = time_interleaved({"fused": lambda: grouped_mm_swiglu(rows, layer.w_gate_up, offs),
                              "gemm1": lambda: grouped_mm(rows, layer.w_gate_up, offs),
                              "swiglu": lambda: swiglu(h)})
    return {**{f"{name}_ms": t.median_ms for name, t in timed.items()},
            "swiglu_pass_bytes": m * width * 2 + m * width // 2 * 2, "fused_saves_bytes": 2 * m * width * 2}


def host_probe(tokens: int = 4096, calls: int = 200, runs: int = 5) -> dict[str, Any]:
    """Host time per eager call at the seed shape, balanced rows, for our op and for torch._grouped_mm on
    the same tensors: ``runs`` runs of ``calls`` calls each without a sync (the host's cost, as long as
    the GPU keeps up), the two alternating run by run so a change of clock falls on both; the median
    run and the fastest and slowest. Beside it, an eager call and a graph replay of ours timed on the GPU."""
    import statistics
    import time

    import numpy as np
    import torch

    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.ops import grouped_mm, offsets_unchecked

    a = torch.randn(tokens, SEED_K, device="cuda").to(torch.bfloat16)
    b = (torch.randn(SEED_EXPERTS, SEED_K, SEED_N, device="cuda") * SEED_K**-0.5).to(torch.bfloat16)
    offs = torch.tensor(np.cumsum(np.full(SEED_EXPERTS, tokens // SEED_EXPERTS)), dtype=torch.int32, device="cuda")
    calls_of = {"ours": lambda: grouped_mm(a, b, offs), "torch": lambda: torch._grouped_mm(a, b, offs=offs)}
    per_call: dict[str, list[float]] = {name: [] for name in calls_of}
    with offsets_unchecked():
        eager = time_call(calls_of["ours"], graph=False)
        graph = time_call(calls_of["ours"], graph=True)
        for run in range(runs):
            for name in (calls_of if run % 2 == 0 else reversed(list(calls_of))):
                call = calls_of[name]
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                per_call[name].append((time.perf_counter() - start) / calls * 1e3)
                torch.cuda.synchronize()
    spread = {}
    for name, samples in per_call.items():
        prefix = "host_ms" if name == "ours" else "torch_host_ms"
        spread.update({f"{prefix}_per_call": round(statistics.median(samples), 4),
                       f"{prefix}_min": round(min(samples), 4), f"{prefix}_max": round(max(samples), 4)})
    return {"tokens": tokens, "runs": runs, "calls": calls, **spread, "eager_ms": round(eager.median_ms, 4),
            "graph_ms": round(graph.median_ms, 4)}


def compile_check(shape: LayerShape = LAYERS["qwen3"], tokens: int = 1024) -> dict[str, Any]:
    """torch.compile(fullgraph=True) of the layer: same output, no graph break."""
    import torch

    layer = seeded_layer(shape)
    x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True)(x)  # a graph break raises under fullgraph
    error = relative_error(compiled, eager)
    return {"fullgraph": True, "rel_error": error, "same_output": error < 1e-2}
