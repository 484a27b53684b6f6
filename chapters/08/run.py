"""Chapter 08: the kernel in a model: a drop-in grouped_mm for torch, a whole MoE layer with a fused
SwiGLU epilogue, and the scoreboard.

    python chapters/08/run.py                  # the layer at three sizes x five token counts, four ways,
                                               # then the scoreboard
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
time into router, permutation, GEMM 1 + SwiGLU, GEMM 2 and combine, and times GEMM 1 fused against
GEMM 1 alone and the SwiGLU pass alone. The scoreboard then times our op as a model calls it
(op/grouped_mm: moe_gemm.torch.grouped_mm on torch tensors) beside torch._grouped_mm and quack over
chapter 06's grid (M_tot 512 .. 65,536 x s 0 .. 1.6) and chapter 07's model projections, eagerly and
(at 2,048 rows and fewer) as CUDA-graph replays. Results go to chapters/08/results/<gpu>.json.

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
    show_recorded,
    timing_options,
)
from moe_gemm.core.cli import positive_int
from moe_gemm.model.layers import LAYERS, LayerShape

CHAPTER = "08"
REQUIRES = SM90A


TOKENS = (512, 2048, 4096, 8192, 32768)
WAYS = ("layer/ours", "layer/torch_grouped_mm", "layer/quack", "layer/transformers")
STEPS = ("router", "permutation", "GEMM 1 + SwiGLU", "GEMM 2", "combine")
# Targets, same run: at every layer size with 4,096 tokens or more.
TARGET_VS_TORCH, TARGET_VS_QUACK = 1.25, 1.0
TARGET_FUSED_SHARE = 0.40  # GEMM 1 fused <= GEMM 1 alone + 40% of a separate SwiGLU pass
PARTS = ("layer", "scoreboard")
LAYER_KEY = ("hidden", "intermediate", "experts", "top_k", "tokens")  # what names one layer measurement


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="quack (torch._grouped_mm and transformers stay: they are the comparison)",
                         quick_note=" (the scoreboard's kernels; a layer is always timed over 30 graph replays)")
    parser.add_argument("--tokens", type=positive_int("--tokens"), nargs="+", default=list(TOKENS), metavar="T",
                        help=f"token counts (default {' '.join(map(str, TOKENS))})")
    parser.add_argument("--layers", nargs="+", choices=list(LAYERS), default=list(LAYERS),
                        help="layer sizes (default: all three)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure (default: both); a part's records replace only its own in the file")
    parser.add_argument("--rows", type=positive_int("--rows"), nargs="+", default=list(GRID_TOKENS), metavar="M",
                        help=f"the scoreboard grid's M_tot values (default {' '.join(map(str, GRID_TOKENS))}); the "
                             "model projections are always on it")
    parser.add_argument("--no-transformers", action="store_true",
                        help="leave out the transformers block (minutes at 32,768 tokens)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the four ways

def build(shape: LayerShape, with_quack: bool) -> dict[str, Any]:
    """One layer (random weights, bf16, on the GPU) and each way's forward pass over it."""
    import torch

    from moe_gemm.torch import MoELayer
    from moe_gemm.torch.layer import moe_forward, torch_grouped_mm

    torch.manual_seed(0)
    layer = MoELayer(shape.hidden, shape.intermediate, shape.experts, shape.top_k, device="cuda")
    ways: dict[str, Any] = {"layer/ours": layer, "layer/torch_grouped_mm": lambda x: layer(x, gemm=torch_grouped_mm)}
    quack = quack_forward(layer) if with_quack else None
    if quack is not None:
        ways["layer/quack"], ways["_quack_gemm1"] = quack
    ways["layer/transformers"] = transformers_block(layer, shape)
    ways["_layer"], ways["_forward"] = layer, moe_forward
    return ways


def quack_forward(layer) -> tuple[Any, str] | None:
    """The same layer on quack, and how GEMM 1 ran: through quack's gemm_act with its fused SwiGLU
    (gate and up columns interleaved one by one, quack's layout) where that works, else quack's gemm
    and SwiGLU as its own pass (as the torch way runs it); GEMM 2 through its gemm. None without quack."""
    from moe_gemm.variants.peer.quack import quack_available

    if quack_available() is not None:
        return None
    import torch
    from quack.gemm_interface import gemm, gemm_act

    from moe_gemm.torch.layer import combine, permute, route

    def quack_grouped_mm(a, b, offs):
        return gemm(a, b, cu_seqlens_m=torch.cat([offs.new_zeros(1), offs]), tuned=True)

    gate, up = layer.w_gate_up.detach().chunk(2, dim=2)
    w_interleaved = torch.stack([gate, up], dim=3).flatten(2).contiguous()  # g0, u0, g1, u1, ...

    def fused(x):
        weights, experts = route(x, layer.gate, layer.top_k, layer.normalize)
        order, offs = permute(experts, layer.gate.shape[0])
        cu_seqlens = torch.cat([offs.new_zeros(1), offs])
        rows = x[order // layer.top_k]
        _, act = gemm_act(rows, w_interleaved, activation="swiglu", cu_seqlens_m=cu_seqlens, store_preact=False,
                          tuned=True)
        y = gemm(act, layer.w_down, cu_seqlens_m=cu_seqlens, tuned=True)
        return combine(y, order, weights, layer.top_k, x.shape[0]).to(x.dtype)

    try:
        with torch.no_grad():
            fused(torch.randn(64, layer.gate.shape[1], device=layer.gate.device, dtype=layer.gate.dtype))
    except Exception as error:  # noqa: BLE001 - any failure inside quack's epilogue compiler: say it, go on unfused
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        progress(f"[quack] gemm_act with SwiGLU failed ({reason}); GEMM 1 runs quack's gemm, SwiGLU its own pass")
        return (lambda x: layer(x, gemm=quack_grouped_mm)), f"gemm + separate SwiGLU (gemm_act failed: {reason})"
    return fused, "gemm_act (fused SwiGLU)"


def transformers_block(layer, shape: LayerShape) -> Any:
    """transformers' MixtralSparseMoeBlock (renormalised top-k, as ours) with our layer's weights."""
    import torch
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = transformers.MixtralConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                                        num_local_experts=shape.experts, num_experts_per_tok=shape.top_k)
    with torch.device("meta"):
        block = MixtralSparseMoeBlock(config)
    block = block.to_empty(device=layer.gate.device).to(torch.bfloat16).eval()
    with torch.no_grad():
        block.gate.weight.copy_(layer.gate)
        block.experts.gate_up_proj.copy_(layer.w_gate_up.transpose(1, 2))
        block.experts.down_proj.copy_(layer.w_down.transpose(1, 2))
    return lambda x: block(x.unsqueeze(0))[0]


# --------------------------------------------------------------------------- measuring

def measure_layer(shape: LayerShape, tokens_list: Sequence[int], with_transformers: bool,
                  with_quack: bool) -> tuple[list, list, list]:
    import torch

    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.ops import offsets_unchecked

    ways = build(shape, with_quack)
    layer = ways["_layer"]
    records, steps, fused = [], [], []
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
                timed = time_call(lambda forward=forward: forward(x), graph=name != "layer/transformers")
            records.append({"variant": name, **shape.fields(tokens), "median_ms": timed.median_ms,
                            "min_ms": timed.min_ms, "max_ms": timed.max_ms, "cuda_graph": timed.graph,
                            "rel_error_vs_ours": error,
                            **({"quack_gemm1": ways["_quack_gemm1"]} if name == "layer/quack" else {})})
        with torch.no_grad(), offsets_unchecked():
            steps.append({**shape.fields(tokens), **step_times(layer, x)})
            fused.append({**shape.fields(tokens), **fused_epilogue(layer, x)})
    return records, steps, fused


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
        "combine": lambda: combine(y, order, weights, layer.top_k, x.shape[0]),
    }
    return {f"{step}_ms": time_call(call, graph=True).median_ms for step, call in calls.items()}


def fused_epilogue(layer, x) -> dict[str, float]:
    """GEMM 1 with the fused epilogue, GEMM 1 alone (the same columns, C [M, 2I] written), and the
    SwiGLU pass alone; the bytes the separate pass moves (C [M, 2I] read, [M, I] written) and the
    fused one saves (C [M, 2I] written and read back)."""
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.layer import permute, route, swiglu
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu

    _, experts = route(x, layer.gate, layer.top_k, layer.normalize)
    order, offs = permute(experts, layer.gate.shape[0])
    rows = x[order // layer.top_k]
    h = grouped_mm(rows, layer.w_gate_up, offs)
    m, width = h.shape
    return {"fused_ms": time_call(lambda: grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs), graph=True).median_ms,
            "gemm1_ms": time_call(lambda: grouped_mm(rows, layer.w_gate_up, offs), graph=True).median_ms,
            "swiglu_ms": time_call(lambda: swiglu(h), graph=True).median_ms,
            "swiglu_pass_bytes": m * width * 2 + m * width // 2 * 2, "fused_saves_bytes": 2 * m * width * 2}


# --------------------------------------------------------------------------- the scoreboard

def scoreboard_cells(rows: Sequence[int]) -> list[Any]:
    """Chapter 06's grid at the M_tot values ``rows``, then chapter 07's model projections."""
    from moe_gemm.chapter import chapter_module

    ch07 = chapter_module("07")
    return [*ch07.grid(rows), *ch07.MODEL_SHAPES.values()]


def scoreboard(cells: Sequence[Any], timing: dict[str, int], with_quack: bool) -> list[dict[str, Any]]:
    """op/grouped_mm, torch._grouped_mm (both layouts) and quack on ``cells``, through the harness's check
    and timing path; graph replays beside the eager launches at the small cells."""
    from moe_gemm.chapter import chapter_module, grouped_mm_peers, run_variants
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.torch.variant import TorchOp
    from moe_gemm.variants.peer.quack import quack_peers

    ch07 = chapter_module("07")
    contenders = [TorchOp(), *grouped_mm_peers(), *(quack_peers() if with_quack else [])]
    small = [w for w in cells if w.tokens <= ch07.GRAPH_MAX_TOKENS]
    large = [w for w in cells if w.tokens > ch07.GRAPH_MAX_TOKENS]
    return (run_variants(contenders + [GraphReplay(v) for v in contenders], small, **timing)
            + run_variants(contenders, large, **timing))


def scoreboard_table(records: Sequence[dict[str, Any]]) -> Table:
    from moe_gemm.chapter import chapter_module

    ch07 = chapter_module("07")
    cells = [*ch07.grid(), *ch07.MODEL_SHAPES.values()]
    rows = [(w.label, *(f"{v:.2f}" if (v := ch07.ratio(records, OP, peers, w)) is not None else "-"
                        for peers in (ch07.TORCH, ch07.QUACK))) for w in cells if ch07.find(records, OP, w)]
    return Table(("workload", "/ torch", "/ quack"), tuple(rows), title="The scoreboard: our op against the peers",
                 legend="useful TFLOP/s of op/grouped_mm (moe_gemm.torch.grouped_mm as a model calls it) over the "
                        "faster torch._grouped_mm layout and over quack's best configuration, same inputs, same run; "
                        "CUDA-graph replays at 2,048 rows and fewer")


OP = "op/grouped_mm"


# --------------------------------------------------------------------------- tables and targets

def layer_table(records: Sequence[dict[str, Any]]) -> Table:
    keys = list(dict.fromkeys((r["hidden"], r["intermediate"], r["experts"], r["top_k"], r["tokens"]) for r in records))
    rows = []
    for h, i, e, k, t in keys:
        found = {r["variant"]: r for r in records if (r["hidden"], r["intermediate"], r["experts"], r["top_k"],
                                                      r["tokens"]) == (h, i, e, k, t)}
        ours = found.get("layer/ours")
        cells = [f"{found[w]['median_ms']:.3f}" if w in found else "-" for w in WAYS]
        ratios = [f"{found[w]['median_ms'] / ours['median_ms']:.2f}" if w in found and ours else "-" for w in WAYS[1:]]
        rows.append((f"H={h} I={i} E={e} k={k}", f"{t:,}", *cells, *ratios))
    return Table(("layer", "tokens", "ours ms", "torch ms", "quack ms", "hf ms", "/ torch", "/ quack", "/ hf"),
                 tuple(rows), title="The MoE layer's forward pass, four ways",
                 legend="median ms (CUDA-graph replays; transformers eager); / torch etc.: that way's time over "
                        "ours (above 1: ours faster)")


def target_rows(records: Sequence[dict[str, Any]], fused: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for way, goal in (("layer/torch_grouped_mm", TARGET_VS_TORCH), ("layer/quack", TARGET_VS_QUACK)):
        pairs = [(r, o) for r in records if r["variant"] == way and r["tokens"] >= 4096
                 for o in records if o["variant"] == "layer/ours"
                 and all(o[k] == r[k] for k in LAYER_KEY)]
        if pairs:
            worst = min(pairs, key=lambda p: p[0]["median_ms"] / p[1]["median_ms"])
            value = worst[0]["median_ms"] / worst[1]["median_ms"]
            rows.append({"target": f"ours over {way}, 4,096 tokens or more (worst: H={worst[0]['hidden']}, "
                                   f"{worst[0]['tokens']:,} tokens)", "value": value, "goal": goal, "met": value >= goal})
    if fused:
        worst = max(fused, key=lambda f: (f["fused_ms"] - f["gemm1_ms"]) / f["swiglu_ms"])
        value = (worst["fused_ms"] - worst["gemm1_ms"]) / worst["swiglu_ms"]
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

def run_without_gpu(args, reason: str) -> int:
    print_not_run(args, "the MoE layer", reason, "showing the recorded results instead",
                  ("--tokens", "--layers", "--rows", "--parts", "--no-transformers", "--quick", "--no-peers"),
                  "nothing is timed without an sm_90a GPU and torch")
    if show_recorded(CHAPTER) != 0:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    return 0


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.variants.peer.torch import torch_available

    if not torch_available():
        return run_without_gpu(args, "torch is not installed")
    from moe_gemm.chapter import recorded

    print(describe_gpu(gpu) + "\n")
    earlier = recorded(CHAPTER, gpu.slug) or {"records": []}
    # A run replaces what it measures and keeps the rest: the scoreboard whole, the layer per
    # (size, tokens) and the scoreboard per cell, so they can be measured in separate processes.
    remeasured = ({tuple(LAYERS[key].fields(t)[k] for k in LAYER_KEY) for key in args.layers for t in args.tokens}
                  if "layer" in args.parts else set())

    def kept(record: dict[str, Any]) -> bool:
        return tuple(record.get(k) for k in LAYER_KEY) not in remeasured

    cells = set(scoreboard_cells(args.rows)) if "scoreboard" in args.parts else set()
    records = [r for r in earlier["records"] if r.get("part") not in args.parts
               or (r.get("part") == "layer" and kept(r)) or (r.get("part") == "scoreboard" and Workload.of(r) not in cells)]
    steps = [s for s in earlier.get("steps", []) if kept(s)]
    fused = [f for f in earlier.get("fused_epilogue", []) if kept(f)]
    compiled = earlier.get("compile", {})
    if "layer" in args.parts:
        for key in args.layers:
            r, s, f = measure_layer(LAYERS[key], args.tokens, not args.no_transformers, not args.no_peers)
            records, steps, fused = records + [{**x, "part": "layer"} for x in r], steps + s, fused + f
        compiled = compile_check()
    if "scoreboard" in args.parts:
        records += [{**r, "part": "scoreboard"} for r in scoreboard(cells, timing_options(args), not args.no_peers)]
    show(layer_table([r for r in records if r.get("part") == "layer"]))
    show(scoreboard_table(records))
    targets = target_rows([r for r in records if r.get("part") == "layer"], fused)
    for t in targets:
        print(f"{t['target']}: {t['value']:.3f} (goal {'<=' if t.get('at_most') else '>='} {t['goal']}): "
              f"{'met' if t['met'] else 'MISSED'}")
    if compiled:
        print(f"torch.compile(fullgraph=True): relative error {compiled['rel_error']:.2e}")
    path = save_results(CHAPTER, records, gpu, steps=steps, fused_epilogue=fused, compile=compiled, targets=targets)
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
