"""Chapter 08: the kernel in a model: a drop-in grouped_mm for torch, a whole MoE layer with a fused
SwiGLU epilogue, and the scoreboard.

    python chapters/08/run.py                  # the layer at three sizes x five token counts, every way,
                                               # the fused epilogue's test, the training step, the scoreboard
    python chapters/08/run.py --parts scoreboard   # only the scoreboard (each part merges into the results)
    python chapters/08/run.py --tokens 4096    # some token counts only
    python chapters/08/run.py --layers qwen3   # some layer sizes only (mixtral, qwen3, deepseek)
    python chapters/08/run.py --parts bucketing    # what tuning M_tot in buckets costs the op

With an sm_90a GPU and torch (the recorded numbers come from an H200) it builds one MoE layer per
size (Mixtral-8x7B-like H=4096, I=14336, E=8, top-2; Qwen3-30B-A3B-like H=2048, I=768, E=128, top-8;
DeepSeek-V3-like H=7168, I=2048, E=256, top-8; random weights) and times its forward pass six ways
on the same tokens, in one run:
  layer/ours               moe_gemm.torch.MoELayer on our op (GEMM 1 with the fused SwiGLU epilogue)
  layer/torch_grouped_mm   the same layer code on torch._grouped_mm, SwiGLU as its own pass
  layer/quack              the same layer code on quack's varlen-M GEMMs (GEMM 1 with quack's own
                           fused gated activation), where quack is installed
  layer/transformers       transformers' MixtralSparseMoeBlock holding the same weights, its experts on
                           torch._grouped_mm (experts_implementation="grouped_mm", transformers 5's default)
  layer/transformers-eager       the same block, its experts in a Python loop over the experts hit
  layer/transformers-batched_mm  the same block, each token's experts' weights gathered into batched matmuls
Each is timed eagerly and as replays of one CUDA graph where it captures (the eager loop reads the
routing back to the host, so it does not: the record says why). It then splits our layer's time into
router, permutation, GEMM 1 + SwiGLU, GEMM 2 and combine (moe_gemm.measure.layer). The fused part times
GEMM 1 with the SwiGLU epilogue against GEMM 1 alone and the SwiGLU pass alone, in interleaved rounds.
The train part times a training step without the optimizer (forward, then the backward of a fixed output
gradient into the weights and the input) of our layer, the same code on torch._grouped_mm,
transformers' grouped_mm block and, where quack is installed, the experts on quack's kernels (its fused
SwiGLU forward and backward, its varlen-K weight gradients), at --train-tokens (4,096 and 32,768), eagerly
and as graph replays, with its peak memory over the weights, inputs and gradients and one eager step's GPU
time split by kind of kernel (moe_gemm.measure.kernel_split). The scoreboard then times our op as a model
calls it (op/grouped_mm: moe_gemm.torch.grouped_mm on torch tensors) beside torch._grouped_mm and quack
over chapter 06's grid (M_tot 512 .. 65,536 x s 0 .. 1.6) and the model projections chapter 07 times,
eagerly and as CUDA-graph replays. The bucketing part tunes the op exactly at both ends of three M_tot
buckets of each model projection and times, at each end, the other end's choice against its own
(moe_gemm.measure.bucketing). Results go to chapters/08/results/<gpu>.json, written after each
layer size, fused test, training step (each size at each token count) and scoreboard group; what the run
does not measure stays from the file it finds.

Without a GPU or torch it says what it would run, shows the recorded results, and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_TOKENS,
    LAYERS,
    SM90A,
    Table,
    Workload,
    add_timing_arguments,
    chapter_main,
    chapter_parser,
    describe_gpu,
    grouped_mm_peers,
    print_not_run,
    recorded,
    run_main,
    run_variants,
    show,
    targets_table,
    timing_options,
)
from moe_gemm.core.checks import MAX_LAYER_TOKENS, MAX_ROWS
from moe_gemm.core.cli import positive_int
from moe_gemm.measure.bucketing import EDGES, bucket_ends
from moe_gemm.measure.layer import STEPS, WAYS, compile_check, host_probe, layer_key, measure_fused, measure_layer
from moe_gemm.measure.scoreboard import MODELS_GROUP, scoreboard_groups, scoreboard_rows
from moe_gemm.measure.training import TRAIN_TOKENS, TRAIN_WAYS, measure_train

CHAPTER = "08"
REQUIRES = SM90A
TOKENS = (512, 2048, 4096, 8192, 32768)
# Targets, same run: at every layer size with 4,096 tokens or more.
TARGET_VS_TORCH, TARGET_VS_QUACK = 1.25, 1.0
TARGET_FUSED_SHARE = 0.40  # GEMM 1 fused <= GEMM 1 alone + 40% of a separate SwiGLU pass
TARGET_TRAIN_VS_TORCH = 1.0  # the training step at least as fast as the same layer on torch._grouped_mm
TARGETS_LEGEND = ("layer: the other way's forward time over ours, at every layer size measured with 4,096 tokens or "
                  "more (the worst named); fused: the fused launch's extra time over GEMM 1 alone, in SwiGLU passes; "
                  "train: the torch layer's training step over ours, likewise")
PARTS = ("layer", "fused", "train", "scoreboard", "bucketing")
SECTIONS = frozenset({"provenance", "records", "steps", "fused_epilogue", "train", "compile", "targets",
                      "scoreboard_rows", "host_probe", "bucketing", "part_runs"})
SHORT = {"layer/ours": "ours", "layer/torch_grouped_mm": "torch", "layer/quack": "quack",
         "layer/transformers": "hf", "layer/transformers-eager": "hf eager",
         "layer/transformers-batched_mm": "hf batched", "train/ours": "ours",
         "train/torch_grouped_mm": "torch", "train/transformers": "hf", "train/quack": "quack"}  # table headers


def fused_extra(row: dict[str, Any]) -> float:
    """The fused launch's time over GEMM 1 alone, in SwiGLU passes: the fused target's measure."""
    return (row["fused_ms"] - row["gemm1_ms"]) / row["swiglu_ms"]


def piece(record: dict[str, Any]) -> tuple:
    """What a record was measured in, for merging runs: a layer size at a token count, or a scoreboard
    cell (a piece measured again replaces every way's or contender's record of it)."""
    return record["part"], layer_key(record) if record["part"] == "layer" else Workload.of(record)


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="quack (torch._grouped_mm and transformers stay: they are the comparison)",
                         quick_note=" (the scoreboard's kernels; a layer is always timed over 30 graph replays)")
    parser.add_argument("--tokens", type=positive_int("--tokens", MAX_LAYER_TOKENS), nargs="+", default=list(TOKENS),
                        metavar="T",
                        help=f"token counts (default {' '.join(map(str, TOKENS))})")
    parser.add_argument("--layers", nargs="+", choices=list(LAYERS), default=list(LAYERS),
                        help="layer sizes (default: all three)")
    parser.add_argument("--train-tokens", type=positive_int("--train-tokens", MAX_LAYER_TOKENS), nargs="+",
                        default=list(TRAIN_TOKENS), metavar="T",
                        help=f"the training step's token counts (default {' '.join(map(str, TRAIN_TOKENS))})")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure (default: all five): layer (every way and the step split), fused (the "
                             "fused epilogue's test), train (the training step), scoreboard, bucketing (what tuning "
                             "M_tot in buckets costs); a part's rows replace only its own in the file")
    parser.add_argument("--rows", type=positive_int("--rows", MAX_ROWS), nargs="*", default=list(GRID_TOKENS),
                        metavar="M",
                        help=f"the scoreboard grid's M_tot values (default {' '.join(map(str, GRID_TOKENS))}; "
                             "--rows alone: none, only the model projections); the model projections are always on it")
    parser.add_argument("--no-transformers", action="store_true",
                        help="leave out transformers' block (its eager loop takes minutes at 32,768 tokens)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the scoreboard

def scoreboard(cells: Sequence[Workload], timing: dict[str, int], with_quack: bool) -> list[dict[str, Any]]:
    """op/grouped_mm (both layouts of b), torch._grouped_mm (both layouts) and quack on ``cells``, through
    the harness's check and timing path, eagerly and as CUDA-graph replays at every cell: a model runs the op captured,
    and an eager launch also pays the op's host time (the per-launch events hold it when the host is
    slower than the kernel)."""
    from moe_gemm.measure.graph_replay import GraphReplay
    from moe_gemm.torch.variant import TorchOp
    from moe_gemm.variants.peer.quack import quack_peers

    contenders = [TorchOp(), TorchOp(k_major=True), *grouped_mm_peers(), *(quack_peers() if with_quack else [])]
    return run_variants(contenders + [GraphReplay(v) for v in contenders], cells, **timing)


def scoreboard_table(records: Sequence[dict[str, Any]]) -> Table:
    body = tuple((r["label"], *("-" if r.get(k) is None else f"{r[k]:.2f}" for k in ("torch", "quack", "kmajor")),
                  r["timed"]) for r in scoreboard_rows(records))
    return Table(("workload", "/ torch", "/ quack", "K-major / torch", "timed as"), body,
                 title="The scoreboard: our op against the peers",
                 legend="useful TFLOP/s of op/grouped_mm (moe_gemm.torch.grouped_mm as a model calls it) over the "
                        "faster torch._grouped_mm layout and over quack's best configuration; K-major: the op given "
                        "each B[e] column-major over torch._grouped_mm given the same; same inputs, same run")


# --------------------------------------------------------------------------- tables and targets

def ways_table(records: Sequence[dict[str, Any]], ways: Sequence[str], title: str, legend: str,
               extra: Sequence[tuple[str, Any]] = ()) -> Table:
    """One row per layer size and token count: each way's median ms, then each other way's time over
    ours (``ways[0]``), then ``extra`` columns (a header and a function of the row's records)."""
    rows = []
    for h, i, e, k, t in dict.fromkeys(layer_key(r) for r in records):
        found = {r["variant"]: r for r in records if layer_key(r) == (h, i, e, k, t)}
        ours = found.get(ways[0])
        cells = [f"{found[w]['median_ms']:.3f}" if w in found else "-" for w in ways]
        ratios = [f"{found[w]['median_ms'] / ours['median_ms']:.2f}" if w in found and ours else "-" for w in ways[1:]]
        rows.append((f"H={h} I={i} E={e} k={k}", f"{t:,}", *cells, *ratios, *(cell(found) for _, cell in extra)))
    header = ("layer", "tokens", *(f"{SHORT[w]} ms" for w in ways), *(f"/ {SHORT[w]}" for w in ways[1:]),
              *(name for name, _ in extra))
    return Table(header, tuple(rows), title=title, legend=legend)


def not_captured(found: dict[str, Any]) -> str:
    """The ways timed eagerly because they do not capture in a CUDA graph."""
    return ", ".join(SHORT[w] for w, r in found.items() if r.get("graph_error")) or "-"


def layer_table(records: Sequence[dict[str, Any]]) -> Table:
    return ways_table(records, WAYS, "The MoE layer's forward pass, every way",
                      "median ms (CUDA-graph replays where the way captures, else eager: the last column); / torch "
                      "etc.: that way's time over ours (above 1: ours faster); hf: transformers' block on its "
                      "default grouped_mm experts, hf eager: its per-expert loop, hf batched: its batched_mm",
                      (("eager only", not_captured),))


def eager_table(records: Sequence[dict[str, Any]]) -> Table:
    rows = tuple((r["variant"], f"H={r['hidden']} E={r['experts']}", f"{r['tokens']:,}", f"{r['eager_ms']:.3f}",
                  "-" if r.get("graph_ms") is None else f"{r['graph_ms']:.3f}",
                  "-" if r.get("graph_ms") is None else f"{r['eager_ms'] / r['graph_ms']:.2f}")
                 for r in records if "eager_ms" in r)
    return Table(("way", "layer", "tokens", "eager ms", "graph ms", "eager / graph"), rows,
                 title="Eager calls against CUDA-graph replays",
                 legend="median ms of eager calls (the host's launch cost included) and of graph replays; - where the "
                        "way does not capture (the record holds why)")


def train_table(train: Sequence[dict[str, Any]]) -> Table:
    def memory(found: dict[str, Any]) -> str:
        return " / ".join(f"{found[w]['peak_extra_bytes'] / 2**30:.1f}" if w in found else "-" for w in TRAIN_WAYS)

    return ways_table(train, TRAIN_WAYS, "A training step (forward + backward, no optimizer)",
                      "median ms of forward and the backward of a fixed output gradient into the weights and the input "
                      "(graph replays where the step captures, else eager); peak GiB: the step's peak allocation over "
                      "the weights, inputs and the gradients it leaves, ours / torch / hf / quack",
                      (("peak GiB", memory), ("eager only", not_captured)))


def train_split_table(train: Sequence[dict[str, Any]]) -> Table:
    """Per layer size, token count and way, one eager step's GPU milliseconds by kind of kernel (the kinds any
    row has, in moe_gemm.measure.kernel_split's order), their sum, and the step's own time."""
    from moe_gemm.measure.kernel_split import KINDS, OTHER

    split = [r for r in train if r.get("kernel_ms_by_kind")]
    kinds = [k for k in (*(kind for kind, _ in KINDS), OTHER) if any(k in r["kernel_ms_by_kind"] for r in split)]
    rows = tuple((f"H={r['hidden']} E={r['experts']}", f"{r['tokens']:,}", SHORT[r["variant"]],
                  *(f"{r['kernel_ms_by_kind'][k]:.2f}" if k in r["kernel_ms_by_kind"] else "-" for k in kinds),
                  f"{sum(r['kernel_ms_by_kind'].values()):.2f}", f"{r['eager_ms']:.2f}") for r in split)
    return Table(("layer", "tokens", "way", *kinds, "sum", "eager ms"), rows,
                 title="Where a training step's GPU time goes: ms by kind of kernel",
                 legend="one eager step under torch's profiler (the mean of three), each kernel's time summed by "
                        "what it does (moe_gemm.measure.kernel_split.KINDS, by kernel name); sum: every kernel; "
                        "eager ms: the step's median time, the host's gaps between kernels included")


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


def bucketing_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((r["projection"], f"{r['tokens']:,}", f"{r['bucket']:,}", r["own"].removeprefix("k6/"),
                  r["other"].removeprefix("k6/"), "-" if r["own_ms"] is None else f"{r['own_ms']:.4f}",
                  "-" if r["other_ms"] is None else f"{r['other_ms']:.4f}", f"{r['slowdown']:.3f}") for r in rows)
    return Table(("projection", "M_tot", "bucket", "tuned here", "tuned at the other end", "here ms", "other ms",
                  "slowdown"), body,
                 title="What tuning M_tot in buckets costs",
                 legend="both ends of a bucket tuned exactly (the op's own loop); at each end the other end's choice "
                        "timed against this end's (CUDA-graph replays, interleaved rounds); slowdown: other / here, 1 "
                        "where both chose alike")


def target_rows(records: Sequence[dict[str, Any]], fused: Sequence[dict[str, Any]],
                train: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    rows = []
    for way, goal, ours in (("layer/torch_grouped_mm", TARGET_VS_TORCH, "layer/ours"),
                            ("layer/quack", TARGET_VS_QUACK, "layer/ours"),
                            ("train/torch_grouped_mm", TARGET_TRAIN_VS_TORCH, "train/ours")):
        found = records if way.startswith("layer/") else train
        pairs = [(r, o) for r in found if r["variant"] == way and r["tokens"] >= 4096
                 for o in found if o["variant"] == ours and layer_key(o) == layer_key(r)]
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


def report(data: dict[str, Any]) -> None:
    """Every table of the chapter from a results file's sections (a run's, or the recorded one)."""
    records = data["records"]
    show(layer_table([r for r in records if r.get("part") == "layer"]))
    if data.get("steps"):
        show(steps_table(data["steps"]))
    if data.get("fused_epilogue"):
        show(fused_table(data["fused_epilogue"]))
    if data.get("train"):
        show(train_table(data["train"]))
        if any(r.get("kernel_ms_by_kind") for r in data["train"]):
            show(train_split_table(data["train"]))
    eager = eager_table([*(r for r in records if r.get("part") == "layer"), *data.get("train", [])])
    if eager.rows:
        show(eager)
    show(scoreboard_table(records))
    if data.get("bucketing"):
        show(bucketing_table(data["bucketing"]))
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
    print_not_run(args, "the MoE layer", reason, "showing the recorded results instead",
                  ("--tokens", "--train-tokens", "--layers", "--rows", "--parts", "--no-transformers", "--quick",
                   "--no-peers"),
                  "nothing is timed without an sm_90a GPU and torch")
    data = recorded(CHAPTER)
    if data is None:
        print(f"(no recorded results for chapter {CHAPTER} yet)")
    else:
        report(data)
    return 0


def release_memory() -> None:
    """Hand what torch's allocator caches back to the driver between layer sizes."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.parts import PartsFile
    from moe_gemm.variants.peer.torch import torch_available

    if not torch_available():
        return run_without_gpu(args, "torch is not installed")
    print(describe_gpu(gpu) + "\n")
    results = PartsFile(CHAPTER, gpu, SECTIONS)  # the parts, sizes and rows this run does not measure stay
    tokens = ", ".join(f"{t:,}" for t in args.tokens)

    def save() -> str:  # after each layer size, fused test and scoreboard group: a stopped run keeps what it finished
        records = results.rows("records")
        targets = target_rows([r for r in records if r["part"] == "layer"], results.rows("fused_epilogue"),
                              results.rows("train"))
        return results.save(targets=targets, scoreboard_rows=scoreboard_rows(records))

    if "layer" in args.parts:
        results.put(compile=compile_check())
        for key in args.layers:
            records, steps = measure_layer(LAYERS[key], args.tokens, not args.no_transformers, not args.no_peers)
            results.replace("records", [{**r, "part": "layer"} for r in records], piece)
            results.replace("steps", steps, layer_key)
            results.ran(f"layer-{key}", f"the {LAYERS[key].label} layer at {tokens} tokens, every way, and its steps")
            save()
            release_memory()  # the next size starts from an empty cache (DeepSeek-V3-like weights are 22.5 GB)
    if "fused" in args.parts:
        for key in args.layers:
            results.replace("fused_epilogue", measure_fused(LAYERS[key], args.tokens), layer_key)
            results.ran(f"fused-{key}", f"GEMM 1 fused, GEMM 1 alone and the SwiGLU pass at the {LAYERS[key].label} "
                                        f"layer's shapes, {tokens} tokens, in interleaved rounds")
            save()
    if "train" in args.parts:
        for key in args.layers:
            measured = []
            for tokens in args.train_tokens:  # saved after each token count: a run stopped later keeps it
                results.replace("train", measure_train(LAYERS[key], [tokens], not args.no_transformers,
                                                       with_quack=not args.no_peers), layer_key)
                release_memory()
                measured.append(f"{tokens:,}")  # what the record says this run measured: the counts done so far
                results.ran(f"train-{key}", f"a training step of the {LAYERS[key].label} layer at "
                                            f"{', '.join(measured)} tokens, ours, the torch layer and transformers' "
                                            "grouped_mm block")
                save()
    if "scoreboard" in args.parts:
        results.put(host_probe=host_probe())
        grid_rows = []
        for label, cells in scoreboard_groups(args.rows):
            new = scoreboard(cells, timing_options(args), not args.no_peers)
            results.replace("records", [{**r, "part": "scoreboard"} for r in new], piece)
            if label == MODELS_GROUP:
                results.ran("scoreboard-models", "the model projections: the op and the peers")
            else:
                grid_rows.append(label)
                results.ran("scoreboard-grid", f"the grid's cells, rows {', '.join(grid_rows)}: the op and the peers")
            save()
    if "bucketing" in args.parts:
        from moe_gemm.measure.bucketing import measure_bucketing
        from moe_gemm.model.workloads import MODEL_PROJECTIONS

        buckets = ", ".join(f"{lo:,} .. {hi:,}" for lo, hi in map(bucket_ends, EDGES))
        for label, workload in MODEL_PROJECTIONS.items():
            results.replace("bucketing", measure_bucketing(label, workload), lambda row: row["projection"])
            results.ran("bucketing", f"the model projections tuned exactly at both ends of the buckets {buckets}")
            save()
            release_memory()
    path = save()
    report(recorded(CHAPTER, gpu.slug))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
