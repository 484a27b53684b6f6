"""Chapter 09: training. The weight gradient dB[e] = A_e^T dC_e as our own kernel (k7), and SwiGLU's backward
fused into the dA GEMM (k6's dswiglu epilogue).

    python chapters/09/run.py                   # checks, then the grid, the model projections, the fused backward
    python chapters/09/run.py --parts grid      # only some parts: grid, models, dswiglu, sonicmoe
    python chapters/09/run.py --quick           # fewer timed launches per round
    python chapters/09/run.py --tokens 4096 16384   # a part of the grid
    python chapters/09/run.py --parts models --models qwen3   # some of the model projections
    python chapters/09/run.py --parts dswiglu --layers deepseek   # the fused backward at some layer sizes
    python chapters/09/run.py --parts grid --tokens 2048 --profile   # also Nsight Compute, k7 beside quack
    python chapters/09/run.py --parts --profile k6/dswiglu-g8-bn128  # only that variant's profile, replaced
    python chapters/09/run.py --parts --profile --tokens 4096        # only the profiles at 4,096 rows, replaced

With an sm_90a GPU (the recorded numbers come from an H200) it checks every k7 rung
(kernels/k7_weight_grad.cu) on the weight gradient's edge cases (exact, integer-valued inputs) and on random
data, then checks and times, in interleaved rounds on the same inputs, k7's rungs, torch._grouped_mm's 2D x 2D
form (what autograd runs for the weight gradient of torch._grouped_mm) and quack's varlen-K GEMM (its autotuned
pick and its three fastest configurations):
  grid    M_tot 2,048 .. 65,536 rows x skew 0 .. 1.6 at the seed's E = 64, K = 1024, N = 2688;
  models  the up (gate and up together) and down projections of three real MoE models, 32,768 routed rows;
  dswiglu SwiGLU's backward fused into the dA GEMM (k6's dswiglu epilogue) against the dA GEMM alone and the
          separate pass, at chapter 08's three layer sizes, 4,096 and 32,768 tokens (needs torch; the fused
          result is checked against the unfused one before anything is timed);
  sonicmoe the layer's training step at SonicMoE's configurations (--configs), ours, on torch._grouped_mm and on
          quack's kernels, split into forward and backward as SonicMoE's benchmark splits it (needs torch).
It prints each table and the targets and writes chapters/09/results/<gpu>.json after each part, keeping the
records of the parts it did not run (so the parts can run as separate processes). quack is optional.

Without a GPU it compiles every rung for sm_90a, prints the compile report and the recorded H200 results,
and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moe_gemm.chapter import (
    LAYERS,
    SM90A,
    Table,
    Workload,
    add_grid_arguments,
    add_models_argument,
    add_profile_argument,
    add_rounds_argument,
    add_timing_arguments,
    best_of,
    best_ratio,
    chapter_main,
    chapter_parser,
    check_profile_argument,
    checks_passed,
    chosen_shapes,
    compile_only,
    keep_profile,
    named_rows,
    print_pending,
    run_checks,
    run_main,
    run_variants,
    show,
    show_profile,
    start_parts_run,
    targets_table,
)
from moe_gemm.model.workloads import MODEL_ROWS, MODEL_SKEW, SONICMOE
from moe_gemm.model.workloads import grid as seed_grid
from moe_gemm.variants.k7.config import LADDER, NOT_YET_RUN
from moe_gemm.variants.peer.quack import QUACK_WGRAD_PEERS
from moe_gemm.variants.peer.torch import PEER_GROUPED_MM_WGRAD

CHAPTER = "09"
REQUIRES = SM90A
ARCH = "sm_90a"
# our rungs: the fastest at each workload counts, as quack's best of three does; the first version's producer
# (a copy per box) is timed beside them for comparison, not counted; a rung not yet run on a GPU is neither
K7 = tuple(name for name, config in LADDER.items() if config.panels and name not in NOT_YET_RUN)
TORCH = PEER_GROUPED_MM_WGRAD
QUACK = QUACK_WGRAD_PEERS
PARTS = ("grid", "models", "dswiglu", "sonicmoe")
TIMED_PARTS = ("grid", "models")  # the parts that time k7 and the peers' weight gradients, workload by workload


def timed_parts(parts: Sequence[str]) -> list[str]:
    """Of the parts asked for, those timed workload by workload (TIMED_PARTS), in order; dswiglu and sonicmoe
    measure layers, each in its own loop."""
    return [part for part in parts if part in TIMED_PARTS]
FUSED_TOKENS = (4096, 32768)  # the dswiglu part's token counts, at each of chapter 08's layer sizes
FUSED_TARGET = 0.4  # the fused kernel's time over the dA GEMM alone, in separate passes, at most
GRID_ROWS = (2048, 4096, 16384, 65536)
# The weight gradients of the up and down projections of the three models chapter 08 runs, over chapter 07's
# 32,768 routed rows at s = 0.4: E from 8 to 256, K and N from 768 to 14,336. Qwen3's and DeepSeek-V3's up
# projection is gate and up as one GEMM, as the layer runs it; Mixtral's is its w1 (the gate) alone, which
# keeps the reference's dB [8, 4096, 14336] at 1.9 GB in fp32 (the fused pair's would be twice that).
MODELS = {
    layer.projection_label(name, workload): workload.weight_gradient()
    for layer, name, workload in (
        (LAYERS["mixtral"], "w1", LAYERS["mixtral"].gate(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["mixtral"], "w2", LAYERS["mixtral"].down(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["qwen3"], "gate_up", LAYERS["qwen3"].gate_up(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["qwen3"], "down", LAYERS["qwen3"].down(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["deepseek"], "gate_up", LAYERS["deepseek"].gate_up(MODEL_ROWS, MODEL_SKEW)),
        (LAYERS["deepseek"], "down", LAYERS["deepseek"].down(MODEL_ROWS, MODEL_SKEW)),
    )
}
TORCH_TARGET, TORCH_TARGET_ROWS = 1.20, 4096  # k7 over torch's 2D x 2D form at every grid cell this large
QUACK_TARGET = 1.0  # k7 over quack's varlen-K at every cell and model projection
OPCODES = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "STS.128", "SYNCS", "USETMAXREG")
COMPILE_LEGEND = ("regs: per thread at launch (setmaxnreg then gives the consumers 232, the producer 40); smem: "
                  "ring + C staging + barriers + the walk's 2 KB; the rest: static SASS counts (HGMMA = wgmma, "
                  "UTMALDG / UTMASTG = TMA load / store, STSM = stmatrix, STS.128 = the last stage's zeroed rows, "
                  "SYNCS = mbarrier)")
# What --profile puts under Nsight Compute: k7's wider rung, its first version's producer (a copy per box) and quack's
# pick, where the grid is store-bound (2,048 rows) and where it is compute-bound (65,536 rows); at 4,096 rows, where k7
# stays furthest behind quack (0.92 on the H100) and quack's pick is a cooperative tile, both k7 ping-pong tiles, both
# cooperative ones and the pick, with the instructions where their warps stand (where the tile's stores wait); and the
# dA GEMM of the Mixtral-like layer's GEMM 2 at 32,768 tokens (65,536 balanced rows, H -> I) on the fused backward's
# fixed tile (k6/pingpong-bn128, the dswiglu part's "dA tile", up to 1.8x the tuned GEMM's time there) beside k6/auto's
# tuned choice: why that tile is slow; and, at the same cell, the fused backward itself on that tile's row-major walk
# and on the raster walk (whose measured time did not fall as the tile's memory traffic predicted): what each reads from
# DRAM; then the two launches that test why: the tile's plain GEMM on the raster walk, and the fused kernel there with
# L2 hints.
DA_CELL = LAYERS["mixtral"].gate(65536, 0.0)
PROFILED = {Workload(2048, 0.0).weight_gradient(): ("k7/bn192", "k7/bn192-boxes", "peer/quack-wgrad"),
            Workload(4096, 0.0).weight_gradient(): ("k7/bn128", "k7/bn192", "k7/coop-bn192", "k7/coop-bn256",
                                                    "peer/quack-wgrad"),
            Workload(65536, 0.0).weight_gradient(): ("k7/bn192", "k7/bn192-boxes", "peer/quack-wgrad"),
            DA_CELL: ("k6/pingpong-bn128", "k6/auto", "k6/dswiglu-bn128", "k6/dswiglu-g8-bn128",
                      "k6/pingpong-bn128-g8", "k6/dswiglu-hints-g8-bn128", "k6/dswiglu-mcluster-bn128")}
# --profile's help, and what a profile run measured
PROFILED_TEXT = ("k7/bn192, k7/bn192-boxes and quack's pick at 2,048 and 65,536 balanced rows, k7/bn128, k7/bn192, "
                 "both cooperative rungs and quack's pick at 4,096, and on the fused backward's tile (k6/pingpong-"
                 "bn128) on both walks, k6/auto and the fused backward on both walks, with L2 hints and in an M pair"
                 " at the Mixtral-like dA GEMM (65,536 rows, K = 4,096, N = 14,336)")
SECTIONS = frozenset({"provenance", "records", "checks", "compile_report", "targets", "rounds", "parts", "part_runs",
                      "profile", "fused_backward", "sonicmoe"})
TARGETS_LEGEND = "ratios of useful TFLOP/s on the same inputs in the same run; ours and quack's each at their best"


def parse_args(argv: Sequence[str] | None):
    parser = chapter_parser(__doc__)
    add_timing_arguments(parser, peers="torch._grouped_mm and quack")
    add_rounds_argument(parser)
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS),
                        help="which measurements to make (default all; none, with --profile, to profile only): grid "
                             f"(the --tokens rows x 5 skews at the seed's shape), models (the {len(MODELS)} model "
                             "projections), dswiglu (the fused SwiGLU backward at three layer sizes), sonicmoe (the "
                             "layer's training step at SonicMoE's configurations)")
    parser.add_argument("--configs", nargs="+", choices=list(SONICMOE), default=list(SONICMOE),
                        help="the sonicmoe part's configurations (default all): "
                             + "; ".join(f"{key}: {c.label}" for key, c in SONICMOE.items()))
    parser.add_argument("--layers", nargs="+", choices=list(LAYERS), default=list(LAYERS),
                        help="the dswiglu part's layer sizes (default: all three)")
    add_grid_arguments(parser, GRID_ROWS)
    add_models_argument(parser, "qwen3 deepseek")
    profiled = {name for names in PROFILED.values() for name in names}
    add_profile_argument(parser, profiled, PROFILED_TEXT)
    args = parser.parse_args(argv)
    check_profile_argument(parser, args, profiled)
    try:
        chosen_shapes(MODELS, args.models)  # a name that matches no projection is refused before anything runs
    except ValueError as error:
        parser.error(str(error))
    return args


def grid(tokens: Sequence[int]) -> list[Workload]:
    """Chapter 06's grid at the seed's shape, in the weight gradient."""
    return [w.weight_gradient() for w in seed_grid(tokens)]


# --------------------------------------------------------------------------- ratios and targets


def workloads_of(records: Sequence[dict[str, Any]], part: str) -> list[Workload]:
    return list(dict.fromkeys(Workload.of(r) for r in records if r.get("part") == part))


def target_rows(records: Sequence[dict[str, Any]], fused: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    from moe_gemm.measure.training import fused_backward_extra

    rows = []

    def worst(part: str, theirs: Sequence[str], goal: float, least_rows: int = 0) -> None:
        cells = [(w, best_ratio(records, K7, theirs, w)) for w in workloads_of(records, part) if w.tokens >= least_rows]
        cells = [(w, value) for w, value in cells if value is not None]
        if cells:
            cell, value = min(cells, key=lambda c: c[1])
            where = "every grid cell" if part == "grid" else "every model projection"
            if least_rows:
                where += f" of >= {least_rows:,} rows"
            name = "torch._grouped_mm 2D x 2D" if theirs == (TORCH,) else "quack varlen-K"
            rows.append({"target": f"k7 / {name} at {where} (worst: {cell.label})", "value": value, "goal": goal,
                         "met": value >= goal})

    worst("grid", QUACK, QUACK_TARGET)
    worst("models", QUACK, QUACK_TARGET)
    worst("grid", (TORCH,), TORCH_TARGET, TORCH_TARGET_ROWS)
    if fused:
        row = max(fused, key=fused_backward_extra)
        rows.append({"target": f"the fused SwiGLU backward over the dA GEMM alone, in separate passes (worst: "
                               f"H={row['hidden']}, {row['tokens']:,} tokens)", "value": fused_backward_extra(row),
                     "goal": FUSED_TARGET, "met": fused_backward_extra(row) <= FUSED_TARGET, "at_most": True})
    return rows


# --------------------------------------------------------------------------- tables

def grid_table(records: Sequence[dict[str, Any]], theirs: Sequence[str], name: str) -> Table:
    cells = workloads_of(records, "grid")
    tokens = list(dict.fromkeys(c.tokens for c in cells))
    skews = list(dict.fromkeys(c.skew for c in cells))
    body = []
    for t in tokens:
        values = [best_ratio(records, K7, theirs, Workload(t, s).weight_gradient()) for s in skews]
        body.append((f"{t:,}", *("-" if v is None else f"{v:.2f}" for v in values)))
    return Table(("M_tot", *(f"s={s:g}" for s in skews)), tuple(body), title=f"k7 over {name}, the grid",
                 legend=f"useful TFLOP/s of the faster k7 rung over {name}'s on the same inputs in the same run "
                        f"(seed shape: E = 64, K = 1024, N = 2688; dB [E, K, N] in bf16)")


def models_table(records: Sequence[dict[str, Any]]) -> Table:
    body = []
    for label, workload in MODELS.items():
        def tflops(names: Sequence[str]) -> str:
            best = best_of(records, names, workload)
            return "-" if best is None else f"{best['useful_tflops']:.0f}"

        q, t = best_ratio(records, K7, QUACK, workload), best_ratio(records, K7, (TORCH,), workload)
        body.append((label, f"{workload.experts}", f"{workload.K:,} x {workload.N:,}", tflops(K7), tflops((TORCH,)),
                     tflops(QUACK), "-" if q is None else f"{q:.2f}", "-" if t is None else f"{t:.2f}"))
    return Table(("projection", "E", "dB per expert", "k7", "torch", "quack", "k7/quack", "k7/torch"), tuple(body),
                 title="The weight gradients of real models' projections",
                 legend="useful TFLOP/s (2 M_tot K N per time) of the faster k7 rung, torch._grouped_mm's 2D x 2D "
                        "form and quack's varlen-K (best of its pick and its three fastest configurations), same "
                        "inputs, same run; dB per expert: K x N")


def fused_backward_table(rows: Sequence[dict[str, Any]]) -> Table:
    from moe_gemm.measure.training import fused_backward_extra

    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.3f}" if key in row else "-"

    body = tuple((f"H={r['hidden']} I={r['intermediate']} E={r['experts']}", f"{r['tokens']:,}", ms(r, "dgemm_ms"),
                  ms(r, "dgemm_tile_ms"), ms(r, "dswiglu_ms"), ms(r, "dswiglu_kernel_ms"), ms(r, "fused_ms"),
                  ms(r, "fused_prefetch_ms"),
                  ms(r, "fused_g8_ms"), ms(r, "fused_hints_g8_ms"), ms(r, "fused_mcluster_ms"),
                  f"{fused_backward_extra(r):.2f}",
                  f"{r['fused_error_vs_unfused']:.1e}")
                 for r in rows)
    return Table(("layer", "tokens", "dA ms", "dA tile ms", "pass ms", "pass kernel ms", "fused ms", "prefetch ms",
                  "g8 ms", "g8 hints ms", "M pair ms", "extra", "vs unfused"), body,
                 title="SwiGLU's backward fused into the dA GEMM",
                 legend="dA: dY W_down^T on our op (its configuration tuned for the shape), writing dact [M, I]; "
                        "dA tile: the same GEMM on the fused kernel's tile, 128 x 128 ping-pong, 6 stages, no "
                        "cluster (k6/pingpong-bn128, W_down^T copied to [E, H, I]); pass: SwiGLU's backward as torch "
                        "operations "
                        "(dh [M, 2I] and the activation from dact and the saved pre-activation); pass kernel: the same "
                        "as one kernel (kernels/swiglu_backward.cu); fused: one k6 launch "
                        "writing dh and the activation; prefetch: the same with h fetched by TMA during the tile's "
                        "main loop; g8: the first with its tiles walked in raster groups of 8 M tiles; g8 hints: that "
                        "with W_down's loads evict-last and h's evict-first in L2; M pair: the first in a cluster of "
                        "two blocks along M sharing W_down by multicast; extra: (the "
                        "fastest fused - dA) / pass, the target's measure (goal <= "
                        f"{FUSED_TARGET}); vs unfused: relative difference of the outputs; graph replays, interleaved")


def sonicmoe_table(rows: Sequence[dict[str, Any]]) -> Table:
    body = tuple((r["config"], r["variant"].removeprefix("train/"), f"{r['forward_eager_ms']:.2f}",
                  f"{r['backward_ms']:.2f}", f"{r['forward_tflops']:.0f}", f"{r['backward_tflops']:.0f}",
                  f"{r['step_tflops']:.0f}", f"{r['peak_extra_bytes'] / 2**30:.1f}",
                  "-" if r["grad_rel_error_vs_ours"] is None else f"{r['grad_rel_error_vs_ours']:.1e}") for r in rows)
    return Table(("configuration", "way", "fwd ms", "bwd ms", "fwd TFLOP/s", "bwd TFLOP/s", "step TFLOP/s", "peak GiB",
                  "grads vs ours"), body, title="The layer's training step at SonicMoE's configurations",
                 legend="eager launches, as SonicMoE's benchmark times them: fwd, the forward with autograd recording; "
                        "bwd, the forward and backward step less fwd; TFLOP/s over the experts' GEMM FLOPs, 6 T n d K "
                        "forward and twice that backward; peak GiB: the step's allocations at their peak less the "
                        "gradients it leaves; grads vs ours: relative error of the router's and 8 experts' gradients")


def profile_rows(only: Sequence[str] = (), rows: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Nsight Compute's rows for PROFILED (only the variants named in ``only`` and the cells of ``rows`` routed rows,
    where they name any)."""
    from moe_gemm.measure.profile import profile_cells

    # waits: who waits for whom, the producer's limit (the page)
    return profile_cells(PROFILED, only, waits=True, routed_rows=rows)


# --------------------------------------------------------------------------- no GPU

def compile_report(arch: str = ARCH) -> list[dict[str, Any]]:
    from moe_gemm.site.compile_report import compile_rows
    from moe_gemm.variants.k7 import ladder

    return compile_rows(ladder(pending=True), arch, OPCODES)  # the rungs not yet run on a GPU too


def compile_report_table(rows: list[dict[str, Any]]) -> Table:
    from moe_gemm.site.compile_report import compile_table

    return compile_table(rows, OPCODES, {}, legend=COMPILE_LEGEND)


def run_without_gpu(args, reason: str) -> int:
    return compile_only(args, CHAPTER, "k7", reason,
                        ("--quick", "--no-peers", "--rounds", "--parts", "--tokens", "--configs"),
                        compile_report_table(compile_report(ARCH)))


# --------------------------------------------------------------------------- with a GPU

def peers(args) -> list[Any]:
    from moe_gemm.variants.peer.quack import quack_available, quack_peers
    from moe_gemm.variants.peer.torch import TorchWeightGrad, torch_available

    if args.no_peers:
        return []
    found = [TorchWeightGrad()] if torch_available() else []
    missing = quack_available()
    if missing is not None:
        print(f"quack is not timed: {missing}\n")
    return found + quack_peers("K")


def measure_workload(part: str, workload: Workload, variants: Sequence[Any], args,
                     timing: dict[str, int]) -> list[dict[str, Any]]:
    """One workload's records, each tagged with its part (a later run of that workload replaces only these)."""
    return [{**r, "part": part} for r in run_variants(variants, [workload], rounds=args.rounds, **timing)]


def run_on_gpu(args, gpu) -> int:
    from moe_gemm.measure.parts import profile_piece, workload_piece
    from moe_gemm.variants.k7 import ladder
    from moe_gemm.variants.peer.torch import torch_available

    timing, report, results = start_parts_run(args, gpu, CHAPTER, SECTIONS, compile_report,
                                              compile_report_table)
    print_pending(NOT_YET_RUN, "moe_gemm.variants.k7.config.NOT_YET_RUN")
    checks = run_checks(ladder(), ragged="K")
    if not checks_passed(checks, shown=4):
        return 1
    results.put(checks=checks)
    variants = [*ladder(), *peers(args)]

    def save() -> str:
        parts = sorted({r["part"] for r in results.rows("records")}, key=PARTS.index)
        return results.save(compile_report=report, targets=target_rows(results.rows("records"),
                                                                         results.rows("fused_backward")),
                            parts=parts)

    path = save()  # the checks, whatever the parts measure after them

    for part in timed_parts(args.parts):
        # saved after every workload: a run stopped part-way (a time limit, a host out of memory at a model's
        # 7.5 G-element dB) keeps every workload it finished, and its provenance names only those
        workloads = grid(args.tokens) if part == "grid" else list(chosen_shapes(MODELS, args.models).values())
        whole = set(args.tokens) == set(GRID_ROWS) if part == "grid" else len(workloads) == len(MODELS)
        for done, workload in enumerate(workloads, 1):
            records = measure_workload(part, workload, variants, args, timing)
            results.replace("records", records, key=lambda r: (r["part"], Workload.of(r)))
            results.ran(*workload_piece(part, workload, workloads[:done], MODELS))
            if done == len(workloads) and whole:
                results.ran(part, "every model projection" if part == "models" else "every row of the grid")
            results.put(rounds=args.rounds)
            path = save()
    if "dswiglu" in args.parts and not torch_available():
        print("the dswiglu part is not measured: torch is not installed\n")
    elif "dswiglu" in args.parts:
        from moe_gemm.measure.layer import layer_key
        from moe_gemm.measure.training import measure_fused_backward

        for key, shape in ((key, LAYERS[key]) for key in args.layers):  # a stopped run keeps every size it finished
            results.replace("fused_backward", measure_fused_backward(shape, FUSED_TOKENS), layer_key)
            results.ran(f"dswiglu-{key}", f"the fused SwiGLU backward, the dA GEMM and the pass at the {shape.label} "
                                          f"layer's shapes, {', '.join(f'{t:,}' for t in FUSED_TOKENS)} tokens")
            path = save()
    if "sonicmoe" in args.parts and not torch_available():
        print("the sonicmoe part is not measured: torch is not installed\n")
    elif "sonicmoe" in args.parts:
        from moe_gemm.measure.training import measure_training_config

        for key in args.configs:  # a stopped run keeps every configuration it finished
            config = SONICMOE[key]
            results.replace("sonicmoe", measure_training_config(config), lambda r: r["config"])
            results.ran(f"sonicmoe-{key}", f"the layer's training step at {config.label}")
            path = save()
    if args.profile is not None:  # a profile of some variants replaces only theirs; a later run of parts keeps it
        rows = named_rows(args.tokens, GRID_ROWS)  # --tokens: only the cells of those rows
        keep_profile(results, profile_rows(args.profile, rows), key=lambda r: (r["variant"], Workload.of(r).label))
        results.ran(*profile_piece(args.profile, f"Nsight Compute on {PROFILED_TEXT}"))
        show_profile(results.rows("profile"))
        path = save()
    records = results.rows("records")
    show(grid_table(records, QUACK, "quack varlen-K"))
    show(grid_table(records, (TORCH,), "torch._grouped_mm 2D x 2D"))
    show(models_table(records))
    if results.rows("fused_backward"):
        show(fused_backward_table(results.rows("fused_backward")))
    if results.rows("sonicmoe"):
        show(sonicmoe_table(results.rows("sonicmoe")))
    show(targets_table(target_rows(records, results.rows("fused_backward")), TARGETS_LEGEND))
    print(f"results written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return chapter_main(parse_args(argv), REQUIRES, run_on_gpu, run_without_gpu)


if __name__ == "__main__":
    run_main(main)
