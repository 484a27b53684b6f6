"""Chapter 08: the kernel in a model: a drop-in grouped_mm for torch, a whole MoE layer with a fused
SwiGLU epilogue, and the scoreboard.

    python chapters/08/run.py                  # the layer at three sizes x five token counts, four ways,
                                               # the fused epilogue's test, then the scoreboard
    python chapters/08/run.py --parts scoreboard   # only the scoreboard (each part merges into the results)
    python chapters/08/run.py --tokens 4096    # some token counts only
    python chapters/08/run.py --layers qwen3   # some layer sizes only (mixtral, qwen3, deepseek)

With an sm_90a GPU and torch (the recorded numbers come from an H200) it builds one MoE layer per
size (Mixtral-8x7B-like H=4096, I=14336, E=8, top-2; Qwen3-30B-A3B-like H=2048, I=768, E=128, top-8;
DeepSeek-V3-like H=7168, I=2048, E=256, top-8; random weights) and times its forward pass four ways
on the same tokens, in one run:
  layer/ours               moe_gemm.torch.MoELayer on our op (GEMM 1 with the fused SwiGLU epilogue)
  layer/torch_grouped_mm   the same layer code on torch._grouped_mm, SwiGLU as its own pass
  layer/quack              the same layer code on quack's varlen-M GEMMs (GEMM 1 with quack's own
                           fused gated activation), where quack is installed
  layer/transformers       transformers' MixtralSparseMoeBlock holding the same weights, as it is
The first three are captured whole in one CUDA graph each; the transformers block reads the routing
back to the host (a loop over the experts hit) and is timed eagerly. It then splits our layer's
time into router, permutation, GEMM 1 + SwiGLU, GEMM 2 and combine. The fused part times GEMM 1 with
the SwiGLU epilogue against GEMM 1 alone and the SwiGLU pass alone, in interleaved rounds. The scoreboard then times our op as a model calls it
(op/grouped_mm: moe_gemm.torch.grouped_mm on torch tensors) beside torch._grouped_mm and quack over
chapter 06's grid (M_tot 512 .. 65,536 x s 0 .. 1.6) and chapter 07's model projections, eagerly and
as CUDA-graph replays. Results go to chapters/08/results/<gpu>.json.

Without a GPU or torch it says what it would run, shows the recorded results, and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_TOKENS,
    SM90A,
    Table,
    Workload,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    describe_gpu,
    print_not_run,
    progress,
    run_main,
    save_results,
    show,
    targets_table,
    timing_options,
)
from moe_gemm.core.checks import MAX_LAYER_TOKENS, MAX_ROWS
from moe_gemm.core.cli import positive_int
from moe_gemm.model.layers import LAYERS, LayerShape
from moe_gemm.torch.variant import OP_NAME

CHAPTER = "08"
REQUIRES = SM90A


TOKENS = (512, 2048, 4096, 8192, 32768)
WAYS = ("layer/ours", "layer/torch_grouped_mm", "layer/quack", "layer/transformers")
STEPS = ("router", "permutation", "GEMM 1 + SwiGLU", "GEMM 2", "combine")
# Targets, same run: at every layer size with 4,096 tokens or more.
TARGET_VS_TORCH, TARGET_VS_QUACK = 1.25, 1.0
TARGET_FUSED_SHARE = 0.40  # GEMM 1 fused <= GEMM 1 alone + 40% of a separate SwiGLU pass
TARGETS_LEGEND = ("layer: the other way's forward time over ours, at every layer size measured with 4,096 tokens or "
                  "more (the worst named); fused: the fused launch's extra time over GEMM 1 alone, in SwiGLU passes")
PARTS = ("layer", "fused", "scoreboard")
LAYER_KEY = ("hidden", "intermediate", "experts", "top_k", "tokens")  # what names one layer measurement
OP = OP_NAME  # the scoreboard's name for our op as a model calls it
MODELS_GROUP = "the model projections"  # the scoreboard's last group, after the grid's rows
COMPUTED_SECTIONS = {"provenance", "records", "steps", "fused_epilogue", "compile", "targets", "scoreboard_rows",
                     "host_probe", "part_runs"}  # what a run writes; any other section of the file is kept
SECTIONS = COMPUTED_SECTIONS


def layer_key(row: dict[str, Any]) -> tuple:
    """The layer size and token count a record, step split or fused row measured."""
    return tuple(row.get(k) for k in LAYER_KEY)


def fused_extra(row: dict[str, Any]) -> float:
    """The fused launch's time over GEMM 1 alone, in SwiGLU passes: the fused target's measure."""
    return (row["fused_ms"] - row["gemm1_ms"]) / row["swiglu_ms"]


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="quack (torch._grouped_mm and transformers stay: they are the comparison)",
                         quick_note=" (the scoreboard's kernels; a layer is always timed over 30 graph replays)")
    parser.add_argument("--tokens", type=positive_int("--tokens", MAX_LAYER_TOKENS), nargs="+", default=list(TOKENS),
                        metavar="T",
                        help=f"token counts (default {' '.join(map(str, TOKENS))})")
    parser.add_argument("--layers", nargs="+", choices=list(LAYERS), default=list(LAYERS),
                        help="layer sizes (default: all three)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure (default: all three): layer (four ways and the step split), fused (the "
                             "fused epilogue's test), scoreboard; a part's rows replace only its own in the file")
    parser.add_argument("--rows", type=positive_int("--rows", MAX_ROWS), nargs="*", default=list(GRID_TOKENS),
                        metavar="M",
                        help=f"the scoreboard grid's M_tot values (default {' '.join(map(str, GRID_TOKENS))}; "
                             "--rows alone: none, only the model projections); the model projections are always on it")
    parser.add_argument("--no-transformers", action="store_true",
                        help="leave out the transformers block (minutes at 32,768 tokens)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the four ways

def seeded_layer(shape: LayerShape) -> Any:
    """The layer every measurement of ``shape`` runs: random bf16 weights from seed 0, on the GPU."""
    import torch

    from moe_gemm.torch import MoELayer

    torch.manual_seed(0)
    return MoELayer(shape.hidden, shape.intermediate, shape.experts, shape.top_k, device="cuda")


def build(shape: LayerShape, with_quack: bool) -> dict[str, Any]:
    """One layer (seeded_layer) and each way's forward pass over it."""
    from moe_gemm.torch.layer import moe_forward, torch_grouped_mm

    layer = seeded_layer(shape)
    ways: dict[str, Any] = {"layer/ours": layer, "layer/torch_grouped_mm": lambda x: layer(x, gemm=torch_grouped_mm)}
    quack = quack_forward(layer) if with_quack else None
    if quack is not None:
        ways["layer/quack"], ways["_quack_gemm1"] = quack
    ways["layer/transformers"] = transformers_block(layer, shape)
    ways["_layer"], ways["_forward"] = layer, moe_forward
    return ways


def quack_forward(layer) -> tuple[Any, dict[str, str]] | None:
    """The same layer on quack, and how GEMM 1 ran (fields for its records): quack's gemm_act with its
    fused SwiGLU (gate and up columns interleaved one by one, quack's layout) where that works, else
    quack's gemm and SwiGLU as its own pass (as the torch way runs it); GEMM 2 through its gemm. None
    without quack."""
    from moe_gemm.variants.peer.quack import quack_available

    if quack_available() is not None:
        return None
    import torch
    from quack.gemm_interface import gemm, gemm_act

    from moe_gemm.torch.layer import combine, dispatch

    def cu_seqlens(offs):  # quack's offsets: [E + 1] from 0, where torch's offs are the E row ends
        return torch.cat([offs.new_zeros(1), offs])

    def quack_grouped_mm(a, b, offs):
        return gemm(a, b, cu_seqlens_m=cu_seqlens(offs), tuned=True)

    gate, up = layer.w_gate_up.detach().chunk(2, dim=2)
    w_interleaved = torch.stack([gate, up], dim=3).flatten(2).contiguous()  # g0, u0, g1, u1, ...

    def fused(x):
        weights, order, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)
        _, act = gemm_act(rows, w_interleaved, activation="swiglu", cu_seqlens_m=cu_seqlens(offs), store_preact=False,
                          tuned=True)
        y = quack_grouped_mm(act, layer.w_down, offs)
        return combine(y, order, weights, layer.top_k).to(x.dtype)

    try:
        with torch.no_grad():
            fused(torch.randn(64, layer.gate.shape[1], device=layer.gate.device, dtype=layer.gate.dtype))
    except Exception as error:  # noqa: BLE001 - any failure inside quack's epilogue compiler: say it, go on unfused
        reason = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        progress(f"[quack] gemm_act with SwiGLU failed ({reason}); GEMM 1 runs quack's gemm, SwiGLU its own pass")
        return (lambda x: layer(x, gemm=quack_grouped_mm)), {"quack_gemm1": "gemm, then SwiGLU as its own pass",
                                                             "quack_gemm_act_error": reason}
    return fused, {"quack_gemm1": "gemm_act with its fused SwiGLU"}


def transformers_block(layer, shape: LayerShape) -> Any:
    """transformers' MixtralSparseMoeBlock (renormalised top-k, as ours) with our layer's weights."""
    import torch

    from moe_gemm.torch.layer import transformers_block as build_block
    from moe_gemm.torch.layer import transformers_forward

    block, _ = build_block("mixtral", shape.hidden, shape.intermediate, shape.experts, shape.top_k, device="meta")
    block = block.to_empty(device=layer.gate.device).to(torch.bfloat16).eval()
    with torch.no_grad():
        block.gate.weight.copy_(layer.gate)
        block.experts.gate_up_proj.copy_(layer.w_gate_up.transpose(1, 2))
        block.experts.down_proj.copy_(layer.w_down.transpose(1, 2))
    return lambda x: transformers_forward(block, x)


# --------------------------------------------------------------------------- measuring

def measure_layer(shape: LayerShape, tokens_list: Sequence[int], with_transformers: bool,
                  with_quack: bool) -> tuple[list, list]:
    import torch

    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.ops import offsets_unchecked

    ways = build(shape, with_quack)
    layer = ways["_layer"]
    records, steps = [], []
    for tokens in tokens_list:
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        reference = None
        for name in WAYS:
            if name not in ways or (name == "layer/transformers" and not with_transformers):
                continue
            progress(f"[{shape.label}, {tokens:,} tokens] {name}")
            forward = ways[name]
            with torch.no_grad(), offsets_unchecked():
                out = forward(x)
                reference = out if reference is None else reference
                error = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                timed = time_call(lambda forward=forward, x=x: forward(x), graph=name != "layer/transformers")
            records.append({"variant": name, **shape.fields(tokens), "median_ms": timed.median_ms,
                            "min_ms": timed.min_ms, "max_ms": timed.max_ms, "cuda_graph": timed.graph,
                            "rel_error_vs_ours": error,
                            **(ways["_quack_gemm1"] if name == "layer/quack" else {})})
        with torch.no_grad(), offsets_unchecked():
            steps.append({**shape.fields(tokens), **step_times(layer, x)})
    return records, steps


def step_times(layer, x) -> dict[str, float]:
    """Our layer's forward pass split into its steps, each captured and replayed on its own inputs."""
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.layer import combine, permute, route
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu

    weights, experts = route(x, layer.gate, layer.top_k, layer.normalize)
    order, offs = permute(experts, layer.gate.shape[0])
    rows = x[order // layer.top_k]
    act = grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs)
    y = grouped_mm(act, layer.w_down, offs)
    calls = {
        "router": lambda: route(x, layer.gate, layer.top_k, layer.normalize),
        "permutation": lambda: (permute(experts, layer.gate.shape[0]), x[order // layer.top_k]),
        "GEMM 1 + SwiGLU": lambda: grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs),
        "GEMM 2": lambda: grouped_mm(act, layer.w_down, offs),
        "combine": lambda: combine(y, order, weights, layer.top_k),
    }
    return {f"{step}_ms": time_call(call, graph=True).median_ms for step, call in calls.items()}


def measure_fused(shape: LayerShape, tokens_list: Sequence[int]) -> list[dict[str, Any]]:
    """The fused epilogue's test at one layer size (on its own seeded_layer)."""
    import torch

    from moe_gemm.torch.ops import offsets_unchecked

    layer = seeded_layer(shape)
    fused = []
    for tokens in tokens_list:
        progress(f"[{shape.label}, {tokens:,} tokens] GEMM 1 fused, GEMM 1 alone, SwiGLU pass")
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        with torch.no_grad(), offsets_unchecked():
            fused.append({**shape.fields(tokens), **fused_epilogue(layer, x)})
    return fused


def fused_epilogue(layer, x) -> dict[str, float]:
    """GEMM 1 with the fused epilogue, GEMM 1 alone (the same columns, C [M, 2I] written), and the
    SwiGLU pass alone, in interleaved rounds after one eager call of each GEMM (where the op tunes a
    new shape: a second or more of back-to-back launches that must not fall into any call's timing);
    the bytes the separate pass moves (C [M, 2I] read, [M, I] written) and the fused one saves (C [M, 2I]
    written and read back)."""
    from moe_gemm.torch.bench import time_interleaved
    from moe_gemm.torch.layer import dispatch, swiglu
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu

    _, _, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)
    grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs)
    h = grouped_mm(rows, layer.w_gate_up, offs)
    m, width = h.shape
    timed = time_interleaved({"fused": lambda: grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs),
                              "gemm1": lambda: grouped_mm(rows, layer.w_gate_up, offs),
                              "swiglu": lambda: swiglu(h)})
    return {**{f"{name}_ms": t.median_ms for name, t in timed.items()},
            "swiglu_pass_bytes": m * width * 2 + m * width // 2 * 2, "fused_saves_bytes": 2 * m * width * 2}


# --------------------------------------------------------------------------- the scoreboard

def scoreboard_groups(rows: Sequence[int]) -> list[tuple[str, list[Any]]]:
    """The scoreboard's cells in the groups a run measures and saves one after the other: chapter 06's
    grid row by row (M_tot in ``rows``, every skew), then chapter 07's model projections."""
    from moe_gemm.chapter import chapter_module

    ch07 = chapter_module("07")
    return [*((f"{t:,}", ch07.grid([t])) for t in rows), (MODELS_GROUP, list(ch07.MODEL_SHAPES.values()))]


def scoreboard(cells: Sequence[Any], timing: dict[str, int], with_quack: bool) -> list[dict[str, Any]]:
    """op/grouped_mm, torch._grouped_mm (both layouts) and quack on ``cells``, through the harness's check
    and timing path, eagerly and as CUDA-graph replays at every cell: a model runs the op captured,
    and an eager launch also pays the op's host time (the per-launch events hold it when the host is
    slower than the kernel)."""
    from moe_gemm.chapter import grouped_mm_peers, run_variants
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.torch.variant import TorchOp
    from moe_gemm.variants.peer.quack import quack_peers

    contenders = [TorchOp(), *grouped_mm_peers(), *(quack_peers() if with_quack else [])]
    return run_variants(contenders + [GraphReplay(v) for v in contenders], cells, **timing)


def _ratio(records: Sequence[dict[str, Any]], peers: Sequence[str], cell: Any, graph: bool) -> float | None:
    """Our op's useful TFLOP/s over the best of ``peers`` at ``cell``, both as graph replays or both eager."""
    from moe_gemm.chapter import best_of
    from moe_gemm.measure.graph_replay import graph_name

    def named(names: Sequence[str]) -> list[str]:
        return [graph_name(n) for n in names] if graph else list(names)

    ours, theirs = best_of(records, named([OP]), cell), best_of(records, named(peers), cell)
    return None if ours is None or theirs is None else ours["useful_tflops"] / theirs["useful_tflops"]


def scoreboard_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured cell: our op over the faster torch layout and over quack's best (None where
    a peer was not measured in the run that timed the op), as graph replays where the run has them,
    else eagerly."""
    from moe_gemm.chapter import chapter_module
    from moe_gemm.measure.graph_replay import graph_name

    ch07 = chapter_module("07")
    rows = []
    for w in (cell for _, cells in scoreboard_groups(GRID_TOKENS) for cell in cells):
        graph = ch07.find(records, graph_name(OP), w) is not None
        if not graph and ch07.find(records, OP, w) is None:
            continue
        rows.append({"label": w.label, "torch": _ratio(records, ch07.TORCH, w, graph),
                     "quack": _ratio(records, ch07.QUACK, w, graph), "timed": "graph replays" if graph else "eager"})
    return rows


def scoreboard_table(records: Sequence[dict[str, Any]]) -> Table:
    body = tuple((r["label"], *("-" if r[k] is None else f"{r[k]:.2f}" for k in ("torch", "quack")), r["timed"])
                 for r in scoreboard_rows(records))
    return Table(("workload", "/ torch", "/ quack", "timed as"), body, title="The scoreboard: our op against the peers",
                 legend="useful TFLOP/s of op/grouped_mm (moe_gemm.torch.grouped_mm as a model calls it) over the "
                        "faster torch._grouped_mm layout and over quack's best configuration, same inputs, same run")


def host_probe(tokens: int = 4096, calls: int = 200) -> dict[str, Any]:
    """The op's host time per call at the seed shape, balanced rows: ``calls`` eager calls without a
    sync (the host's cost, as long as the GPU keeps up), beside an eager call and a graph replay timed
    on the GPU."""
    import time

    import numpy as np
    import torch

    from moe_gemm.model.workloads import SEED_EXPERTS, SEED_K, SEED_N
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.ops import grouped_mm, offsets_unchecked

    a = torch.randn(tokens, SEED_K, device="cuda").to(torch.bfloat16)
    b = (torch.randn(SEED_EXPERTS, SEED_K, SEED_N, device="cuda") * SEED_K**-0.5).to(torch.bfloat16)
    offs = torch.tensor(np.cumsum(np.full(SEED_EXPERTS, tokens // SEED_EXPERTS)), dtype=torch.int32, device="cuda")
    with offsets_unchecked():
        eager = time_call(lambda: grouped_mm(a, b, offs), graph=False)
        graph = time_call(lambda: grouped_mm(a, b, offs), graph=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            grouped_mm(a, b, offs)
        host = (time.perf_counter() - start) / calls * 1e3
        torch.cuda.synchronize()
    return {"tokens": tokens, "host_ms_per_call": round(host, 4), "eager_ms": round(eager.median_ms, 4),
            "graph_ms": round(graph.median_ms, 4)}


# --------------------------------------------------------------------------- tables and targets

def layer_table(records: Sequence[dict[str, Any]]) -> Table:
    rows = []
    for h, i, e, k, t in dict.fromkeys(layer_key(r) for r in records):
        found = {r["variant"]: r for r in records if layer_key(r) == (h, i, e, k, t)}
        ours = found.get("layer/ours")
        cells = [f"{found[w]['median_ms']:.3f}" if w in found else "-" for w in WAYS]
        ratios = [f"{found[w]['median_ms'] / ours['median_ms']:.2f}" if w in found and ours else "-" for w in WAYS[1:]]
        rows.append((f"H={h} I={i} E={e} k={k}", f"{t:,}", *cells, *ratios))
    return Table(("layer", "tokens", "ours ms", "torch ms", "quack ms", "hf ms", "/ torch", "/ quack", "/ hf"),
                 tuple(rows), title="The MoE layer's forward pass, four ways",
                 legend="median ms (CUDA-graph replays; transformers eager); / torch etc.: that way's time over "
                        "ours (above 1: ours faster)")


def steps_table(steps: Sequence[dict[str, Any]]) -> Table:
    rows = tuple((f"H={s['hidden']} E={s['experts']}", f"{s['tokens']:,}",
                  *(f"{s[f'{step}_ms']:.3f}" for step in STEPS),
                  f"{sum(s[f'{step}_ms'] for step in STEPS):.3f}") for s in steps)
    return Table(("layer", "tokens", "router", "permute", "GEMM 1+SwiGLU", "GEMM 2", "combine", "sum"), rows,
                 title="Our layer, step by step: ms",
                 legend="each step captured and replayed on its own (median of 30 CUDA-graph replays); sum: of the "
                        "steps, to set beside the whole layer's time above")


def fused_table(fused: Sequence[dict[str, Any]]) -> Table:
    rows = tuple((f"H={f['hidden']} E={f['experts']}", f"{f['tokens']:,}", f"{f['gemm1_ms']:.3f}",
                  f"{f['swiglu_ms']:.3f}", f"{f['fused_ms']:.3f}", f"{fused_extra(f):.2f}",
                  f"{f['fused_saves_bytes'] / 1e6:,.0f}")
                 for f in fused)
    return Table(("layer", "tokens", "GEMM 1 ms", "SwiGLU ms", "fused ms", "extra", "saved MB"), rows,
                 title="GEMM 1 with the SwiGLU epilogue against GEMM 1 and a SwiGLU pass",
                 legend="GEMM 1: our op writing [M, 2I]; SwiGLU: torch's pass over it ([M, 2I] read, [M, I] written); "
                        "fused: one launch writing [M, I]; extra: (fused - GEMM 1) / SwiGLU, the target's measure "
                        f"(goal <= {TARGET_FUSED_SHARE}); saved MB: the [M, 2I] intermediate the fused launch neither "
                        "writes nor reads back")


def target_rows(records: Sequence[dict[str, Any]], fused: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for way, goal in (("layer/torch_grouped_mm", TARGET_VS_TORCH), ("layer/quack", TARGET_VS_QUACK)):
        pairs = [(r, o) for r in records if r["variant"] == way and r["tokens"] >= 4096
                 for o in records if o["variant"] == "layer/ours" and layer_key(o) == layer_key(r)]
        if pairs:
            worst = min(pairs, key=lambda p: p[0]["median_ms"] / p[1]["median_ms"])
            value = worst[0]["median_ms"] / worst[1]["median_ms"]
            rows.append({"target": f"ours over {way}, 4,096 tokens or more (worst: H={worst[0]['hidden']}, "
                                   f"{worst[0]['tokens']:,} tokens)", "value": value, "goal": goal,
                         "met": value >= goal, "at_most": False})
    if fused:
        worst = max(fused, key=fused_extra)
        value = fused_extra(worst)
        rows.append({"target": f"fused GEMM 1 over GEMM 1 alone, in SwiGLU passes (worst: H={worst['hidden']}, "
                               f"{worst['tokens']:,} tokens)", "value": value, "goal": TARGET_FUSED_SHARE,
                     "met": value <= TARGET_FUSED_SHARE, "at_most": True})
    return rows


def compile_check() -> dict[str, Any]:
    """torch.compile(fullgraph=True) of the layer: same output, no graph break."""
    import torch

    from moe_gemm.torch import MoELayer

    layer = MoELayer(2048, 768, 128, 8, device="cuda")
    x = torch.randn(1024, 2048, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True)(x)  # a graph break raises under fullgraph
    error = ((compiled.float() - eager.float()).norm() / eager.float().norm()).item()
    return {"fullgraph": True, "rel_error": error, "same_output": error < 1e-2}


# --------------------------------------------------------------------------- entry points

def report(data: dict[str, Any]) -> None:
    """Every table of the chapter from a results file's sections (a run's, or the recorded one)."""
    records = data["records"]
    show(layer_table([r for r in records if r.get("part") == "layer"]))
    if data.get("steps"):
        show(steps_table(data["steps"]))
    if data.get("fused_epilogue"):
        show(fused_table(data["fused_epilogue"]))
    show(scoreboard_table(records))
    probe = data.get("host_probe")
    if probe:
        print(f"the op's host time per eager call at {probe['tokens']:,} rows (seed shape, balanced): "
              f"{probe['host_ms_per_call']:.3f} ms; an eager call {probe['eager_ms']:.3f} ms, a graph replay "
              f"{probe['graph_ms']:.3f} ms on the GPU\n")
    show(targets_table(data.get("targets", []), TARGETS_LEGEND))
    compiled = data.get("compile")
    if compiled:
        print(f"torch.compile(fullgraph=True) of the layer: no graph break, relative error {compiled['rel_error']:.2e} "
              f"against the eager layer")


def run_without_gpu(args, reason: str) -> int:
    from moe_gemm.chapter import recorded

    print_not_run(args, "the MoE layer", reason, "showing the recorded results instead",
                  ("--tokens", "--layers", "--rows", "--parts", "--no-transformers", "--quick", "--no-peers"),
                  "nothing is timed without an sm_90a GPU and torch")
    data = recorded(CHAPTER)
    if data is None:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    else:
        report(data)
    return 0


def kept_from(earlier: dict[str, Any], args) -> tuple[list, list, list]:
    """The records, steps and fused rows of an earlier results file that this run does not re-measure:
    a layer measurement per (size, tokens); scoreboard records stay until their group is measured
    again, so parts, sizes and rows can be measured in separate processes and merged."""
    measured = {layer_key(LAYERS[key].fields(t)) for key in args.layers for t in args.tokens}

    def kept(row: dict[str, Any], part: str) -> bool:
        if row.get("part") == "scoreboard":
            return True  # replaced group by group as the run measures them (run_on_gpu)
        return part not in args.parts or layer_key(row) not in measured

    return ([r for r in earlier.get("records", []) if kept(r, "layer")],
            [s for s in earlier.get("steps", []) if kept(s, "layer")],
            [f for f in earlier.get("fused_epilogue", []) if kept(f, "fused")])


def measured_parts(args, layers: Sequence[str], fused: Sequence[str], rows: Sequence[str]) -> dict[str, str]:
    """What this run has measured so far, for the results file's ``part_runs``: one entry per layer size
    finished, one per fused test finished (each may come from its own process) and one for the
    scoreboard's groups finished."""
    tokens = ", ".join(f"{t:,}" for t in args.tokens)
    measured = {f"layer-{key}": f"the {LAYERS[key].label} layer at {tokens} tokens, four ways, and its steps"
                for key in layers}
    measured |= {f"fused-{key}": f"GEMM 1 fused, GEMM 1 alone and the SwiGLU pass at the {LAYERS[key].label} "
                                 f"layer's shapes, {tokens} tokens, in interleaved rounds" for key in fused}
    grid_rows = [row for row in rows if row != MODELS_GROUP]
    if grid_rows:
        measured["scoreboard-grid"] = f"the grid's cells, rows {', '.join(grid_rows)}: the op and the peers"
    if MODELS_GROUP in rows:
        measured["scoreboard-models"] = "the model projections: the op and the peers"
    return measured


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.variants.peer.torch import torch_available

    if not torch_available():
        return run_without_gpu(args, "torch is not installed")
    from moe_gemm.chapter import recorded
    from moe_gemm.measure.results import part_runs, provenance, uncomputed_sections

    print(describe_gpu(gpu) + "\n")
    earlier = recorded(CHAPTER, gpu.slug) or {"records": []}
    records, steps, fused = kept_from(earlier, args)
    compiled, probe = earlier.get("compile", {}), earlier.get("host_probe", {})
    now, layers_done, fused_done, rows_done = provenance(gpu), [], [], []

    kept_sections = uncomputed_sections(earlier, COMPUTED_SECTIONS)

    def save() -> str:  # after each layer size and each scoreboard group: a stopped run keeps what it finished
        runs = part_runs(earlier.get("part_runs", {}), measured_parts(args, layers_done, fused_done, rows_done), now)
        targets = target_rows([r for r in records if r.get("part") == "layer"], fused)
        return save_results(CHAPTER, records, gpu, steps=steps, fused_epilogue=fused, compile=compiled,
                            targets=targets, scoreboard_rows=scoreboard_rows(records), host_probe=probe, part_runs=runs,
                            **kept_sections)

    if "layer" in args.parts:
        compiled = compile_check()
        for key in args.layers:
            r, s = measure_layer(LAYERS[key], args.tokens, not args.no_transformers, not args.no_peers)
            records, steps = records + [{**x, "part": "layer"} for x in r], steps + s
            layers_done.append(key)
            save()
    if "fused" in args.parts:
        for key in args.layers:
            fused += measure_fused(LAYERS[key], args.tokens)
            fused_done.append(key)
            save()
    if "scoreboard" in args.parts:
        probe = host_probe()
        for label, cells in scoreboard_groups(args.rows):
            new = [{**r, "part": "scoreboard"} for r in scoreboard(cells, timing_options(args), not args.no_peers)]
            records = [r for r in records if r.get("part") != "scoreboard" or Workload.of(r) not in cells] + new
            rows_done.append(label)
            save()
    path = save()
    report(recorded(CHAPTER, gpu.slug))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
