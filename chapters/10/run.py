"""Chapter 10: FP8 on Hopper. The grouped GEMM in e4m3 with fp32 scales (k8).

    python chapters/10/run.py                       # checks, then every part
    python chapters/10/run.py --parts grid          # some parts: quantize, accuracy, grid, models, swiglu, layer
    python chapters/10/run.py --quick               # fewer timed launches per round
    python chapters/10/run.py --tokens 4096 65536   # some of the grid's rows (--skews: some of its skews)
    python chapters/10/run.py --parts models --models mixtral   # some of the model projections
    python chapters/10/run.py --parts grid --tokens 65536 --skews 0 --profile   # also Nsight Compute on the rungs

With an sm_90a GPU (the recorded numbers come from an H200) it checks every k8 rung (kernels/k8_fp8.cu) on the
forward's edge cases and the cases of its scales (exact, integer-valued inputs with power-of-two scales) and on
random data, then measures, each part saved as it finishes:
  quantize  the three quantizers (kernels/k8_quantize.cu: activations, weights, SwiGLU's activation) against a
            device copy of the same bytes, the SwiGLU one also against torch's SwiGLU then the activation
            quantizer, and cuBLAS's dense FP8 and bf16 GEMMs at 8192^3 (the two tensor-core rates in practice);
  accuracy  each rung's error against the fp32 product of the dequantized inputs as K grows, promoted and not,
            beside torch._scaled_grouped_mm's two accumulation modes;
  grid      M_tot 512 .. 65,536 rows x skew 0 .. 1.6 at the seed's E = 64, K = 1024, N = 2688 (at 2,048
            rows and fewer every contender timed as CUDA-graph replays);
  models    the up and down projections of two real MoE models at 65,536 balanced rows;
  swiglu    the FP8 layer's GEMM 1 with SwiGLU and the quantization in its epilogue (its e4m3 bytes transposed
            within each quad, and the first version's two-byte stores beside it), against the GEMM writing
            [gate | up] in bf16 then the separate pass, and against the epilogue writing the activation in bf16
            (Mixtral-, Qwen3- and DeepSeek-V3-like layers, 4,096 and 32,768 tokens, the layer's own routing);
  layer     chapter 08's bf16 MoE layer against the FP8 layer built from its weights (Mixtral- and DeepSeek-V3-
            like sizes, 4,096 and 32,768 tokens), CUDA-graph replays, and the FP8 layer's error;
timing, in interleaved rounds on the same inputs: the blockwise rungs; the rowwise rungs beside
torch._scaled_grouped_mm with use_fast_accum False and True (rowwise scales, what torch offers on sm_90); and
our bf16 k6/auto on bf16 inputs of the same shape and routing. It prints each table and the targets and writes
chapters/10/results/<gpu>.json, keeping the records of the parts it did not run.

Without a GPU it compiles every rung for sm_90a, prints the compile report and the recorded H200 results, and
exits 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from moe_gemm.chapter import (
    GRID_SKEWS,
    LAYERS,
    SM90A,
    Table,
    Workload,
    add_grid_arguments,
    add_models_argument,
    add_rounds_argument,
    add_timing_arguments,
    best_of,
    chapter_main,
    chapter_parser,
    checks_passed,
    chosen_shapes,
    compile_only,
    profile_table,
    progress,
    run_checks,
    run_main,
    run_variants,
    show,
    show_profile,
    start_parts_run,
    targets_table,
)
from moe_gemm.model.problem import BF16_OPERANDS, FP8_BLOCKWISE, FP8_ROWWISE, OperandFormat
from moe_gemm.variants.k8.config import LADDER, NOT_YET_RUN
from moe_gemm.variants.peer.torch import PEER_SCALED_GROUPED_MM, PEER_SCALED_GROUPED_MM_FAST

CHAPTER = "10"
REQUIRES = SM90A
ARCH = "sm_90a"
RUNGS = {name: config for name, config in LADDER.items() if name not in NOT_YET_RUN}  # those that have run
BLOCKWISE = tuple(name for name, config in RUNGS.items() if config.scaling == "blockwise")
ROWWISE_PROMOTED = tuple(name for name, config in RUNGS.items() if config.scaling == "rowwise" and config.promote)
ROWWISE_FAST = tuple(name for name, config in RUNGS.items() if config.scaling == "rowwise" and not config.promote)
TORCH, TORCH_FAST = PEER_SCALED_GROUPED_MM, PEER_SCALED_GROUPED_MM_FAST
K6 = "k6/auto"  # our bf16 kernel, its configuration chosen for the shape
PARTS = ("quantize", "accuracy", "grid", "models", "swiglu", "layer")
FORMATS = (FP8_BLOCKWISE, FP8_ROWWISE, BF16_OPERANDS)  # each cell is measured in each, on inputs of its own
GRID_ROWS = (512, 2048, 4096, 16384, 65536)  # the first two decode-sized: launches the host's cost would decide
GRAPH_MAX_TOKENS = 2048  # cells this small are timed as CUDA-graph replays, every contender alike (chapter 07's rule)
MODEL_ROWS = 65536  # the blockwise target's rows: DeepGEMM's published numbers are for 4-8 groups of 4-8k rows
# The up and down projections of the two models whose weights are small enough to draw and quantize on the host
# at 65,536 rows: Mixtral's E = 8 experts of 4,096 x 14,336 (its w1 alone, as chapter 09 takes it) and Qwen3's
# 128 fine-grained experts of 2,048 x 768 (gate and up as one GEMM).
MODELS = {
    layer.projection_label(name, workload): workload
    for layer, name, workload in (
        (LAYERS["mixtral"], "w1", LAYERS["mixtral"].gate(MODEL_ROWS, 0.0)),
        (LAYERS["mixtral"], "w2", LAYERS["mixtral"].down(MODEL_ROWS, 0.0)),
        (LAYERS["qwen3"], "gate_up", LAYERS["qwen3"].gate_up(MODEL_ROWS, 0.0)),
        (LAYERS["qwen3"], "down", LAYERS["qwen3"].down(MODEL_ROWS, 0.0)),
    )
}
# layer: chapter 08's layer against the FP8 layer built from it, at two of its sizes
LAYER_SHAPES = ("mixtral", "deepseek")
LAYER_TOKENS = (4096, 32768)
LAYER_TARGET = 1.4  # the FP8 layer over the bf16 layer at 32,768 tokens
# swiglu: GEMM 1 of three layers' FP8 versions; the e4m3 epilogue's cost over the bf16 one, in quantize passes
SWIGLU_SHAPES = ("mixtral", "qwen3", "deepseek")
SWIGLU_TARGET = 0.5
# accuracy: E = 8 experts, 2,048 balanced rows, N = 512, K from one block to 16,384
ACCURACY_K = (128, 1024, 4096, 7168, 16384)
ACCURACY_SHAPE = (8, 2048, 512)
# quantize: the activations of GEMM 1 and 2 at 65,536 rows (K = 7,168 and 2,048: DeepSeek-V3's hidden and expert
# widths) and Mixtral's w1 as weights
QUANTIZE_ACTIVATIONS = ((65536, 7168), (65536, 2048))
QUANTIZE_WEIGHTS = ((8, 4096, 14336),)
QUANTIZE_SWIGLU = ((65536, 2048),)  # GEMM 1's output at 65,536 rows, DeepSeek-V3's intermediate width
BLOCKWISE_TARGET, BLOCKWISE_OVER_BF16 = 1150.0, 1.7  # useful TFLOP/s at 65,536 balanced rows, >= 2 projections
FAST_TARGET, PROMOTED_TARGET, TARGET_ROWS = 1.0, 1.3, 4096  # k8 rowwise promoted over torch's fast / promoted
ACCURACY_TARGET = 2e-3  # relative error of every promoted rung at every K
QUANTIZE_TARGET = 0.8  # of the same run's copy bandwidth
# What --profile puts under Nsight Compute: every blockwise rung that has run at 65,536 balanced rows of the seed
# shape (where the tensor pipe's busy share tells whether the two warpgroups promote in step)
PROFILED = {Workload(65536, 0.0).in_format(FP8_BLOCKWISE): BLOCKWISE}
OPCODES = ("QGMMA", "FFMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "USETMAXREG")
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives the consumers 232, the producer 40); smem: "
                  "ring + A's scales + C staging + barriers + the walk's 2 KB; the rest: static SASS counts (QGMMA = "
                  "FP8 wgmma, FFMA = fp32 multiply-adds, the promotion among them, UTMALDG / UTMASTG = TMA load / "
                  "store, STSM = stmatrix, SYNCS = mbarrier)")
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report", "targets", "rounds", "parts", "part_runs",
                      "quantize", "accuracy", "dense", "swiglu", "layer", "profile"})
TARGETS_LEGEND = "ratios of useful TFLOP/s on the same shape and routing in the same run, each kernel at its best"


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._scaled_grouped_mm")
    add_rounds_argument(parser)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which measurements to make (default all): quantize (the quantizers against a copy), "
                             "accuracy (error against K), grid (the --tokens rows x --skews at the seed's shape), "
                             f"models (the {len(MODELS)} model projections), swiglu (GEMM 1's SwiGLU and "
                             "quantization in its epilogue), layer (the FP8 MoE layer)")
    add_grid_arguments(parser, GRID_ROWS, GRID_SKEWS)
    add_models_argument(parser, "qwen3")
    parser.add_argument("--profile", action="store_true",
                        help="after the parts, Nsight Compute on each blockwise rung at 65,536 balanced rows of the "
                             "seed shape (ncu on PATH; a few minutes)")
    args = parser.parse_args(argv)
    try:
        chosen_shapes(MODELS, args.models)  # a name that matches no projection is refused before anything runs
    except ValueError as error:
        parser.error(str(error))
    return args


# --------------------------------------------------------------------------- ratios and targets

def cells_of(records: Sequence[dict[str, Any]], part: str) -> list[Workload]:
    """The shapes and routings a part measured, in bf16 terms (each was measured in every format): the grid's by
    rows then skew, whatever order its runs took them in; the model projections in the order they were run."""
    found = list(dict.fromkeys(Workload.of(r).in_format(BF16_OPERANDS) for r in records if r.get("part") == part))
    return sorted(found, key=lambda w: (w.tokens, w.skew)) if part == "grid" else found


def tflops(records: Sequence[dict[str, Any]], names: Sequence[str], fmt: OperandFormat, cell: Workload) -> float | None:
    """The fastest of ``names`` at ``cell`` with operands in ``fmt``: useful TFLOP/s, or None."""
    best = best_of(records, names, cell.in_format(fmt))
    return None if best is None else best["useful_tflops"]


def ratio(records: Sequence[dict[str, Any]], ours: tuple[Sequence[str], OperandFormat],
          theirs: tuple[Sequence[str], OperandFormat], cell: Workload) -> float | None:
    mine, other = tflops(records, *ours, cell), tflops(records, *theirs, cell)
    return None if mine is None or other is None else mine / other


def target_rows(records: Sequence[dict[str, Any]], accuracy: Sequence[dict[str, Any]] = (),
                quantize: Sequence[dict[str, Any]] = (), layer: Sequence[dict[str, Any]] = (),
                swiglu: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    from moe_gemm.measure.fp8 import swiglu_epilogue_extra

    rows = []
    models = cells_of(records, "models")
    fast = [(c, tflops(records, BLOCKWISE, FP8_BLOCKWISE, c)) for c in models]
    fast = sorted(((c, v) for c, v in fast if v is not None), key=lambda cv: -cv[1])
    if fast:
        second = fast[1] if len(fast) > 1 else fast[0]
        label = next((name for name, w in MODELS.items() if w == second[0]), second[0].label)
        rows.append({"target": f"blockwise k8 at 65,536 balanced rows, the second-best model projection ({label}), "
                               f"useful TFLOP/s", "value": second[1], "goal": BLOCKWISE_TARGET,
                     "met": len(fast) > 1 and second[1] >= BLOCKWISE_TARGET})
        over = [(c, ratio(records, (BLOCKWISE, FP8_BLOCKWISE), ((K6,), BF16_OPERANDS), c)) for c, _ in fast[:2]]
        over = [(c, v) for c, v in over if v is not None]
        if over:
            cell, value = min(over, key=lambda cv: cv[1])
            worst = next((name for name, w in MODELS.items() if w == cell), cell.label)
            rows.append({"target": f"blockwise k8 / bf16 k6/auto at the same two projections (worst: {worst})",
                         "value": value, "goal": BLOCKWISE_OVER_BF16, "met": value >= BLOCKWISE_OVER_BF16})
    cells = [c for part in ("grid", "models") for c in cells_of(records, part) if c.tokens >= TARGET_ROWS]
    for peer, goal, mode in ((TORCH_FAST, FAST_TARGET, "True"), (TORCH, PROMOTED_TARGET, "False")):
        values = [(c, ratio(records, (ROWWISE_PROMOTED, FP8_ROWWISE), ((peer,), FP8_ROWWISE), c)) for c in cells]
        values = [(c, v) for c, v in values if v is not None]
        if values:
            cell, value = min(values, key=lambda cv: cv[1])
            rows.append({"target": f"rowwise k8 (promoted) / torch._scaled_grouped_mm use_fast_accum={mode} at every "
                                   f"cell of >= {TARGET_ROWS:,} rows (worst: {cell.label})",
                         "value": value, "goal": goal, "met": value >= goal})
    promoted = [r for r in accuracy if r["variant"] in (*BLOCKWISE, *ROWWISE_PROMOTED)]
    if promoted:
        worst = max(promoted, key=lambda r: r["rel_error"])
        rows.append({"target": f"promoted k8 rungs' relative error, every K up to {max(ACCURACY_K):,} (worst: "
                               f"{worst['variant']} at K = {worst['K']:,})", "value": worst["rel_error"],
                     "goal": ACCURACY_TARGET, "met": worst["rel_error"] <= ACCURACY_TARGET, "at_most": True})
    for shape in {(r["hidden"], r["experts"]) for r in layer if r["tokens"] == max(LAYER_TOKENS)}:
        times = {r["variant"]: r["median_ms"] for r in layer if (r["hidden"], r["experts"]) == shape
                 and r["tokens"] == max(LAYER_TOKENS)}
        if {"layer/ours", "layer/fp8"} <= set(times):
            value = times["layer/ours"] / times["layer/fp8"]
            label = _layer_label({"hidden": shape[0], "experts": shape[1]})
            rows.append({"target": f"the FP8 layer over the bf16 layer, {label}, {max(LAYER_TOKENS):,} tokens",
                         "value": value, "goal": LAYER_TARGET, "met": value >= LAYER_TARGET})
    if swiglu:
        worst = max(swiglu, key=swiglu_epilogue_extra)
        value = swiglu_epilogue_extra(worst)
        rows.append({"target": f"the e4m3 SwiGLU epilogue's cost over the bf16 one, in separate quantize passes "
                               f"(worst: {_layer_label(worst)}, {worst['tokens']:,} tokens)", "value": value,
                     "goal": SWIGLU_TARGET, "met": value <= SWIGLU_TARGET, "at_most": True})
    if ops := [r for r in quantize if "step" not in r]:  # the quantizers the op runs, not their earlier steps
        worst = min(ops, key=lambda r: r["of_copy"])
        where = f"{worst['kernel']} {worst['shape']}"
        rows.append({"target": f"quantizers' bandwidth / the same run's copy (worst: {where})",
                     "value": worst["of_copy"], "goal": QUANTIZE_TARGET, "met": worst["of_copy"] >= QUANTIZE_TARGET})
    return rows


def _layer_label(row: dict[str, Any]) -> str:
    """The name of the chapter's layer a row measured."""
    return next(LAYERS[n].label for n in (*LAYER_SHAPES, *SWIGLU_SHAPES)
                if (LAYERS[n].hidden, LAYERS[n].experts) == (row["hidden"], row["experts"]))


# --------------------------------------------------------------------------- tables

def cell_table(records: Sequence[dict[str, Any]], part: str) -> Table:
    body = []
    for cell in cells_of(records, part):
        def value(names: Sequence[str], fmt: OperandFormat) -> str:
            v = tflops(records, names, fmt, cell)
            return "-" if v is None else f"{v:.0f}"

        def over(ours, theirs) -> str:
            v = ratio(records, ours, theirs, cell)
            return "-" if v is None else f"{v:.2f}"

        label = next((name for name, w in MODELS.items() if w == cell), cell.short_label) if part == "models" \
            else cell.short_label
        body.append((label, value(BLOCKWISE, FP8_BLOCKWISE), value(ROWWISE_PROMOTED, FP8_ROWWISE),
                     value(ROWWISE_FAST, FP8_ROWWISE), value((TORCH,), FP8_ROWWISE), value((TORCH_FAST,), FP8_ROWWISE),
                     value((K6,), BF16_OPERANDS),
                     over((BLOCKWISE, FP8_BLOCKWISE), ((K6,), BF16_OPERANDS)),
                     over((ROWWISE_PROMOTED, FP8_ROWWISE), ((TORCH,), FP8_ROWWISE)),
                     over((ROWWISE_PROMOTED, FP8_ROWWISE), ((TORCH_FAST,), FP8_ROWWISE))))
    title = "The grid (seed shape: E = 64, K = 1024, N = 2688)" if part == "grid" else "Model projections"
    return Table(("cell", "k8 block", "k8 row", "k8 row fast", "torch", "torch fast", "k6 bf16", "block/k6",
                  "row/torch", "row/torch fast"), tuple(body), title=title,
                 legend="useful TFLOP/s (2 M_tot K N per time), same shape and routing, same run: k8 blockwise (faster "
                        "rung), k8 rowwise promoted and with fast accumulation, torch._scaled_grouped_mm with "
                        "use_fast_accum False and True, our bf16 k6/auto on bf16 inputs; then the ratios")


def accuracy_table(rows: Sequence[dict[str, Any]]) -> Table:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    ks = sorted({r["K"] for r in rows})
    body = []
    for name in names:
        errors = {r["K"]: r["rel_error"] for r in rows if r["variant"] == name}
        out = next(r["out"] for r in rows if r["variant"] == name)
        body.append((name, out, *("-" if k not in errors else f"{errors[k]:.1e}" for k in ks)))
    return Table(("variant", "out", *(f"K={k:,}" for k in ks)), tuple(body), title="Error against K",
                 legend="||C - C_ref|| / ||C_ref||, C_ref the fp32 product of the dequantized e4m3 inputs; "
                        f"E = {ACCURACY_SHAPE[0]}, {ACCURACY_SHAPE[1]:,} balanced rows, N = {ACCURACY_SHAPE[2]}; "
                        "bf16 out is bounded below by its own rounding (about 2e-3)")


def quantize_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((f"{r['kernel']}, step {r['step'].split('x128-', 1)[1]}" if "step" in r else r["kernel"],
                  r["shape"], f"{r['median_us']:.1f}", f"{r['tbps']:.2f}", f"{r['copy_tbps']:.2f}",
                  f"{r['of_copy']:.2f}", f"{r['unfused_us'] / r['median_us']:.2f}" if "unfused_us" in r else "-")
                 for r in rows)
    return Table(("kernel", "shape", "us", "TB/s", "copy TB/s", "of copy", "unfused / it"), body,
                 title="The quantizers",
                 legend="TB/s: bytes read (bf16) plus written (e4m3 and fp32 scales) per time; copy: a device copy of "
                        "the same input bytes, same run; step: a quantizer's earlier versions, the same bits (the "
                        "activations': first: one 16-byte piece a thread and __fdiv_rn on every value; pieces: four "
                        "pieces a thread; divide-once: each group's values divided from its reciprocal; the weights': "
                        "first: two loads in flight a thread, stores covering half sectors; loads-first: every load "
                        "written before the first is staged; whole-sectors: each store writing whole sectors); "
                        "unfused / it: "
                        "the SwiGLU quantizer's time against torch's SwiGLU followed by quantize_1x128")


def swiglu_table(rows: Sequence[dict[str, Any]]) -> Table:
    from moe_gemm.measure.fp8 import swiglu_epilogue_extra

    def given(r: dict[str, Any], key: str, cell: Callable[[], str]) -> str:  # older rows lack the later columns
        return cell() if key in r else "-"

    body = tuple((_layer_label(r), f"{r['tokens']:,}", f"{r['gemm_ms']:.3f}", f"{r['pass_ms']:.3f}",
                  f"{r['swiglu_ms']:.3f}", f"{r['fused_ms']:.3f}", given(r, "pairs_ms", lambda: f"{r['pairs_ms']:.3f}"),
                  f"{r['quantize_ms']:.3f}", f"{(r['gemm_ms'] + r['pass_ms']) / r['fused_ms']:.2f}",
                  f"{swiglu_epilogue_extra(r):.2f}",
                  given(r, "pairs_ms", lambda: f"{swiglu_epilogue_extra(r, 'pairs'):.2f}"),
                  given(r, "pairs_round_spread",
                        lambda: f"{100 * r['fused_round_spread']:.0f}%, {100 * r['pairs_round_spread']:.0f}%"))
                 for r in rows)
    return Table(("layer", "tokens", "GEMM ms", "pass ms", "bf16 epi ms", "e4m3 epi ms", "pairs ms",
                  "quantize ms", "(GEMM+pass)/e4m3", "extra (passes)", "pairs extra", "rounds"), body,
                 title="GEMM 1 with SwiGLU and the quantization fused",
                 legend="CUDA-graph replays in interleaved rounds, the layer's own routing, same run: k8 blockwise "
                        "writing [gate | up] in bf16, then the separate SwiGLU-and-quantize pass; the SwiGLU epilogue "
                        "writing the activation in bf16, and in e4m3 with its scales (e4m3 epi: each quad of threads "
                        "transposes its bytes and stores 8 at a time; pairs: the first version, 2 bytes at a time); "
                        "quantize_1x128 over the bf16 activation; extra: (e4m3 epi - bf16 epi) / quantize, the "
                        "target's measure, and the same for pairs; rounds: how far the slowest round's median lies "
                        "above the fastest's, e4m3 epi and pairs")


# The roofline at twice the compute (the page's table): the seed shape, balanced, from decode-sized batches up.
ROOFLINE_TOKENS = (512, 2048, 4096, 16384, 65536)


def roofline_table(dense: dict[str, Any]) -> Table:
    """The seed shape's roofline in bf16 and in e4m3 (blockwise scales, C in bf16) at ROOFLINE_TOKENS balanced
    rows: both wgmma peaks as the run measured them (``dense``, its quantize part) and the GPU's recorded copy."""
    import dataclasses

    from moe_gemm.measure.ceilings import roofline_basis

    basis = dataclasses.replace(roofline_basis(), tensor_tflops=dense["wgmma_tflops"],
                                fp8_tensor_tflops=dense["wgmma_e4m3_tflops"])
    body = []
    for tokens in ROOFLINE_TOKENS:
        bf16 = Workload(tokens, 0.0)
        fp8 = bf16.in_format(FP8_BLOCKWISE)
        body.append((f"{tokens:,}", f"{basis.tflops(bf16):.0f}", basis.bound(bf16), f"{basis.tflops(fp8):.0f}",
                     basis.bound(fp8), f"{basis.tflops(fp8) / basis.tflops(bf16):.2f}"))
    return Table(("rows", "bf16 limit", "bf16 bound", "e4m3 limit", "e4m3 bound", "e4m3/bf16"), tuple(body),
                 title="The roofline at the seed shape (E = 64, K = 1024, N = 2688), balanced",
                 legend=f"limit: useful TFLOP/s that max(FLOP / wgmma peak, compulsory bytes / copy) allows, at the "
                        f"run's wgmma peaks ({dense['wgmma_tflops']:.0f} bf16, {dense['wgmma_e4m3_tflops']:.0f} "
                        f"e4m3 TFLOP/s) and the copy ({basis.copy_tbps:.2f} TB/s); compulsory bytes: A and each "
                        "routed expert's B read once, C written once in bf16, the e4m3 operands one byte an element "
                        "and their fp32 scales; bound: the term that sets the limit")


# Each step of the FP8 layer (moe_gemm.measure.fp8.FP8_STEPS) beside the bf16 layer's steps that do the same work.
LAYER_STEPS = (("route", ("router", "permutation"), ("dispatch",)),
               ("GEMM 1", ("GEMM 1 + SwiGLU",), ("GEMM 1 + SwiGLU + quantize",)),
               ("GEMM 2", ("GEMM 2",), ("GEMM 2",)),
               ("combine", ("combine",), ("combine",)))


def layer_pairs(rows: Sequence[dict[str, Any]]):
    """(the layer's size, tokens, the bf16 layer's row, the FP8 layer's row) for each size and token count the
    layer part measured both at."""
    for name in LAYER_SHAPES:
        shape = LAYERS[name]
        for tokens in sorted({r["tokens"] for r in rows}):
            found = {r["variant"]: r for r in rows if (r["hidden"], r["experts"], r["tokens"]) ==
                     (shape.hidden, shape.experts, tokens)}
            if {"layer/ours", "layer/fp8"} <= set(found):
                yield shape, tokens, found["layer/ours"], found["layer/fp8"]


def layer_steps_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The two layers' forward passes step by step, where the run split them (rows with each step's time)."""
    body = []
    for shape, tokens, bf16, fp8 in layer_pairs(rows):
        if all(f"{s}_ms" in bf16 for _, steps, _ in LAYER_STEPS for s in steps):
            cells = [f"{sum(row[f'{s}_ms'] for s in steps):.3f}" for _, bf16_steps, fp8_steps in LAYER_STEPS
                     for row, steps in ((bf16, bf16_steps), (fp8, fp8_steps))]
            body.append((shape.label, f"{tokens:,}", *cells))
    headers = tuple(f"{step} {fmt}" for step, _, _ in LAYER_STEPS for fmt in ("bf16", "FP8"))
    return Table(("layer", "tokens", *headers), tuple(body), title="The two layers step by step",
                 legend="ms per step, each captured and replayed on its own inputs, same run: route = the router and "
                        "the permutation (FP8: and the tokens' quantization); GEMM 1 with SwiGLU (FP8: and the "
                        "quantization for GEMM 2, one kernel or GEMM 1 then one pass); GEMM 2; the combine")


def layer_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = [(shape.label, f"{tokens:,}", f"{bf16['median_ms']:.3f}", f"{fp8['median_ms']:.3f}",
             f"{bf16['median_ms'] / fp8['median_ms']:.2f}", f"{fp8['rel_error_vs_bf16']:.3f}")
            for shape, tokens, bf16, fp8 in layer_pairs(rows)]
    return Table(("layer", "tokens", "bf16 ms", "FP8 ms", "bf16/FP8", "FP8 error"), tuple(body),
                 title="The MoE layer in FP8",
                 legend="forward pass as CUDA-graph replays, same tokens, same run: chapter 08's layer (k6, fused "
                        "SwiGLU) and the FP8 layer built from its weights (k8 blockwise); error: relative to the bf16 "
                        "layer's output")


def profile_rows() -> list[dict[str, Any]]:
    from moe_gemm.measure.profile import profile_cells

    return profile_cells(PROFILED)


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    from moe_gemm.site.compile_report import compile_rows
    from moe_gemm.variants.k8 import ladder, swiglu_kernels

    return compile_rows([*ladder(pending=True), *swiglu_kernels()], arch, OPCODES)


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, {}, legend=COMPILE_LEGEND)


def run_without_gpu(args, reason: str) -> int:
    flags = ("--quick", "--no-peers", "--rounds", "--parts", "--tokens", "--skews", "--models", "--profile")
    return compile_only(args, CHAPTER, "k8", reason, flags, compile_report_table(compile_report(ARCH)))


# --------------------------------------------------------------------------- with a GPU

def variants_by_format(args) -> dict[OperandFormat, list[Any]]:
    from moe_gemm.variants.k6.auto import K6Auto
    from moe_gemm.variants.k8 import K8Fp8
    from moe_gemm.variants.peer.torch import TorchScaledGroupedMM, torch_available

    torch = [] if args.no_peers or not torch_available() else [TorchScaledGroupedMM(), TorchScaledGroupedMM(True)]
    return {FP8_BLOCKWISE: [K8Fp8(name) for name in BLOCKWISE],
            FP8_ROWWISE: [K8Fp8(name) for name in (*ROWWISE_PROMOTED, *ROWWISE_FAST)] + torch,
            BF16_OPERANDS: [K6Auto()]}


def measure_cell(part: str, cell: Workload, variants: dict[OperandFormat, list[Any]], args,
                 timing: dict[str, int]) -> list[dict[str, Any]]:
    """One shape and routing in every format, each on inputs of its own (a later run of the cell replaces all). At
    GRAPH_MAX_TOKENS rows and fewer every contender is timed as CUDA-graph replays and keeps its own name (its
    record's "timing" says how it was timed), so that the tables compare like with like at every cell."""
    from moe_gemm.measure.graph_replay import SUFFIX, GraphReplay

    graphs = cell.tokens <= GRAPH_MAX_TOKENS
    records = []
    for fmt in FORMATS:
        chosen = [GraphReplay(v) for v in variants[fmt]] if graphs else variants[fmt]
        records += run_variants(chosen, [cell.in_format(fmt)], rounds=args.rounds, **timing)
    return [{**r, "variant": r["variant"].removesuffix(SUFFIX), "part": part} for r in records]


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.fp8 import accuracy_rows, dense_fp8_ceiling, layer_rows, quantize_rows, swiglu_epilogue_rows
    from moe_gemm.measure.parts import workload_piece
    from moe_gemm.torch.rules import k8_passed_on_gpu
    from moe_gemm.torch.scaled import swiglu_has_run
    from moe_gemm.variants.k8 import ladder

    timing, report, results = start_parts_run(args, gpu, CHAPTER, SECTIONS, compile_report,
                                              compile_report_table)
    checks = [c for fmt in (FP8_BLOCKWISE, FP8_ROWWISE)
              for c in run_checks([v for v in ladder() if v.formats[0] == fmt], fmt=fmt)]
    if not checks_passed(checks, shown=4):
        return 1
    results.put(checks=checks)

    def save() -> str:
        records = results.rows("records")
        parts = [p for p in PARTS if any(r.get("part") == p for r in records) or results.data.get(p)]
        targets = target_rows(records, results.rows("accuracy"), results.rows("quantize"), results.rows("layer"),
                              results.rows("swiglu"))
        return results.save(compile_report=report, targets=targets,
                            rounds=args.rounds, parts=parts)

    path = None
    variants = variants_by_format(args)
    layer_parts = {"swiglu": (SWIGLU_SHAPES, swiglu_epilogue_rows, "GEMM 1 of the {} layer with its SwiGLU epilogue"),
                   "layer": (LAYER_SHAPES, layer_rows, "the {} layer, bf16 and FP8")}
    for part in args.parts:
        if part == "quantize":
            results.put(quantize=quantize_rows(QUANTIZE_ACTIVATIONS, QUANTIZE_WEIGHTS, QUANTIZE_SWIGLU, **timing),
                        dense=dense_fp8_ceiling(**timing))
            results.ran("quantize", "the quantizers against a copy; cuBLAS's dense FP8 and bf16 GEMMs at 8192^3")
        elif part == "accuracy":
            results.put(accuracy=accuracy_rows(variants[FP8_BLOCKWISE] + variants[FP8_ROWWISE], ACCURACY_SHAPE,
                                               ACCURACY_K))
            results.ran("accuracy", f"the error against K = {', '.join(map(str, ACCURACY_K))}")
        elif part in ("swiglu", "layer"):
            pending = not k8_passed_on_gpu() or (part == "swiglu" and not swiglu_has_run())
            if pending:  # the op would time its torch fallback (blockwise: a dequantized copy)
                progress(f"[{part}] not measured: {'k8 and its SwiGLU epilogue' if part == 'swiglu' else 'k8'} must "
                         "have passed the GPU tests first (Chapter.passed_on_gpu, moe_gemm.torch.kernels.NOT_YET_RUN)")
                continue
            shapes, measure, what = layer_parts[part]
            for name in shapes:
                results.replace(part, measure(LAYERS[name], LAYER_TOKENS),
                                key=lambda r: (r["hidden"], r["experts"], r["tokens"]))
                results.ran(f"{part}-{name}", what.format(LAYERS[name].label))
                path = save()
        else:  # saved after every cell: a run stopped part-way keeps what it finished
            cells = ([Workload(t, s) for t in args.tokens for s in args.skews] if part == "grid"
                     else list(chosen_shapes(MODELS, args.models).values()))
            for done, cell in enumerate(cells, 1):
                progress(f"[{part}] {cell.label} ({done} of {len(cells)})")
                records = measure_cell(part, cell, variants, args, timing)
                results.replace("records", records,
                                key=lambda r: (r["part"], Workload.of(r).in_format(BF16_OPERANDS)))
                results.ran(*workload_piece(part, cell, cells[:done], MODELS))
                path = save()
        path = save()
    if args.profile:  # after the timings: ncu's replays would heat the GPU between them
        results.put(profile=profile_rows())
        results.ran("profile", "Nsight Compute on each blockwise rung at 65,536 balanced rows of the seed shape")
        path = save()
    records = results.rows("records")
    for part, table in (("quantize", quantize_table), ("accuracy", accuracy_table)):
        if results.rows(part):
            show(table(results.rows(part)))
    if results.data.get("dense"):
        dense = results.data["dense"]
        print(f"cuBLAS at {dense['size']}^3: FP8 {dense['fp8_tflops']:.0f}, bf16 {dense['bf16_tflops']:.0f} TFLOP/s\n")
        show(roofline_table(dense))
    for part in ("grid", "models"):
        if cells_of(records, part):
            show(cell_table(records, part))
    if results.rows("profile"):
        show_profile(results.rows("profile"), profile_table)  # the page prints the same table
    if results.rows("swiglu"):
        show(swiglu_table(results.rows("swiglu")))
    if results.rows("layer"):
        show(layer_table(results.rows("layer")))
        steps = layer_steps_table(results.rows("layer"))
        if steps.rows:  # a run that split the layers into their steps
            show(steps)
    show(targets_table(target_rows(records, results.rows("accuracy"), results.rows("quantize"),
                                   results.rows("layer"), results.rows("swiglu")), TARGETS_LEGEND))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
