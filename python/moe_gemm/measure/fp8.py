"""Chapter 10's measurements besides the GEMM timings: the quantizers against a copy, the error of each FP8
kernel as K grows, the FP8 layer, and GEMM 1's SwiGLU epilogue against the separate pass.

* :func:`quantize_rows` times ``moe_gemm.torch.quantize``'s two kernels as a model calls them (their outputs
  allocated each call) beside a device-to-device copy of the same input bytes, in the same run: a quantizer
  reads 2 bytes and writes a little over 1 per element, so its bandwidth (bytes read plus written per time)
  is set against the copy's, the most any pass over the same bytes can reach.
* :func:`accuracy_rows` runs each FP8 variant once per K on the same random e4m3 inputs and compares its output
  with the fp32 product of the dequantized inputs: the promoted kernels add fp32 rounding only, the tensor
  core's own accumulation (fast accumulation) loses the small terms of a long sum.
* :func:`swiglu_epilogue_rows` times the FP8 layer's GEMM 1 with SwiGLU and the quantization in its epilogue
  against the GEMM writing [gate | up] in bf16 followed by the separate pass, and against the epilogue writing
  the activation in bf16 (what the quantization adds to it, in separate quantize passes: the chapter's target).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from moe_gemm.cuda.device import DeviceProblem
from moe_gemm.cuda.timing import time_launches
from moe_gemm.measure.ceilings import wgmma_e4m3_tflops, wgmma_tflops
from moe_gemm.measure.check import progress, run_once
from moe_gemm.model.problem import BF16, FP8_BLOCKWISE, FP8_ROWWISE, FP32, dtype_name, make_problem
from moe_gemm.model.quantize import BLOCK, padded_rows
from moe_gemm.model.reference import reference_gemm, relative_error


def _median_us(launch, **timing: int) -> float:
    """Median time of ``launch()`` issued on the harness stream (where time_launches records its events)."""
    import torch

    from moe_gemm.variants.peer.torch import torch_stream

    with torch.cuda.stream(torch_stream()):
        return time_launches(lambda i: launch(), **timing).median_ms * 1e3


def _row(kernel: str, shape: str, moved: int, copied: int, quantize_us: float, copy_us: float) -> dict[str, Any]:
    tbps, copy_tbps = moved / quantize_us / 1e6, copied / copy_us / 1e6
    return {"kernel": kernel, "shape": shape, "median_us": quantize_us, "bytes": moved, "tbps": tbps,
            "copy_us": copy_us, "copy_tbps": copy_tbps, "of_copy": tbps / copy_tbps}


def quantize_rows(activations: Sequence[tuple[int, int]], weights: Sequence[tuple[int, int, int]],
                  swiglu: Sequence[tuple[int, int]] = (), **timing: int) -> list[dict[str, Any]]:
    """One row per shape: the quantizer's time and bandwidth, the copy's, and their ratio. ``activations``: the op's
    activation quantizer and, in rows with a ``step`` (its name in moe_gemm.torch.kernels.QUANTIZE_STEPS), each of
    its earlier steps; ``weights``: the weights' quantizer, likewise (QUANTIZE_WEIGHTS_STEPS). ``swiglu``: (M, I) of
    GEMM 1's outputs [M, 2I] for the SwiGLU quantizer, whose rows also hold the unfused way's time (torch's SwiGLU,
    then quantize_1x128)."""
    import torch

    from moe_gemm.torch.kernels import QUANTIZE_STEPS, QUANTIZE_WEIGHTS_STEPS
    from moe_gemm.torch.layer import swiglu as torch_swiglu
    from moe_gemm.torch.quantize import (
        quantize_1x128,
        quantize_1x128_step,
        quantize_128x128_t,
        quantize_128x128_t_step,
        swiglu_quantize_1x128,
    )

    rows = []
    for M, K in activations:
        progress(f"[quantize] 1 x 128 groups of [{M:,}, {K:,}], the op's kernel and its {len(QUANTIZE_STEPS)} "
                 f"earlier steps")
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        moved = x.nbytes + M * K + 4 * -(-K // BLOCK) * padded_rows(M)  # bf16 in; e4m3 and the scales out
        rows += _stepped_rows("quantize_1x128", f"[{M:,}, {K:,}]", x, moved, quantize_1x128, quantize_1x128_step,
                              QUANTIZE_STEPS, timing)
    for M, width in swiglu:
        progress(f"[quantize] SwiGLU of [{M:,}, {2 * width:,}] in 1 x 128 groups, and the unfused way")
        h = torch.randn(M, 2 * width, device="cuda").to(torch.bfloat16)
        copy = torch.empty_like(h)
        moved = h.nbytes + M * width + 4 * -(-width // BLOCK) * padded_rows(M)
        row = _row("swiglu_quantize_1x128", f"[{M:,}, {2 * width:,}]", moved, 2 * h.nbytes,
                   _median_us(lambda h=h: swiglu_quantize_1x128(h), **timing),
                   _median_us(lambda h=h, copy=copy: copy.copy_(h), **timing))
        row["unfused_us"] = _median_us(lambda h=h: quantize_1x128(torch_swiglu(h).contiguous()), **timing)
        rows.append(row)
    for experts, K, N in weights:
        progress(f"[quantize] 128 x 128 blocks of [{experts}, {K:,}, {N:,}], written transposed, the op's kernel "
                 f"and its {len(QUANTIZE_WEIGHTS_STEPS)} earlier steps")
        b = torch.randn(experts, K, N, device="cuda").to(torch.bfloat16)
        moved = b.nbytes + experts * K * N + 4 * experts * -(-K // BLOCK) * -(-N // BLOCK)
        rows += _stepped_rows("quantize_128x128_t", f"[{experts}, {K:,}, {N:,}]", b, moved, quantize_128x128_t,
                              quantize_128x128_t_step, QUANTIZE_WEIGHTS_STEPS, timing)
    return rows


def _stepped_rows(kernel: str, shape: str, x: Any, moved: int, op: Callable[[Any], Any],
                  step_op: Callable[[Any, str], Any], steps: Iterable[str],
                  timing: dict[str, int]) -> list[dict[str, Any]]:
    """A quantizer's rows on input ``x``: each of its earlier ``steps`` (``step_op``), marked with the step, then the
    op's kernel (``op``), each against the same device copy of x's bytes."""
    import torch

    copy = torch.empty_like(x)
    copy_us = _median_us(lambda: copy.copy_(x), **timing)
    rows = [{**_row(kernel, shape, moved, 2 * x.nbytes, _median_us(lambda step=step: step_op(x, step), **timing),
                    copy_us), "step": step} for step in steps]
    return [*rows, _row(kernel, shape, moved, 2 * x.nbytes, _median_us(lambda: op(x), **timing), copy_us)]


def accuracy_rows(variants: Sequence[Any], shape: tuple[int, int, int], ks: Sequence[int],
                  seed: int = 17) -> list[dict[str, Any]]:
    """``||C - C_ref|| / ||C_ref||`` of every variant at every K, C_ref the fp32 product of the dequantized inputs;
    ``shape`` is (E, M_tot, N), balanced. Each variant writes fp32 where it can (k8), else bf16 (torch's FP8
    grouped GEMM writes bf16 only: ``out_dtypes``); a variant that refuses the inputs is left out."""
    experts, tokens, N = shape
    rows = []
    for K in ks:
        for fmt in (FP8_BLOCKWISE, FP8_ROWWISE):
            progress(f"[accuracy] K = {K:,}, {fmt}")
            problem = make_problem(experts, tokens, K, N, 0.0, seed=seed, fmt=fmt, out_dtype=FP32)
            in_bf16 = dataclasses.replace(problem, out_dtype=BF16)
            devices = {FP32: DeviceProblem(problem), BF16: None}
            for variant in (v for v in variants if fmt in v.formats):
                out_dtype = FP32 if FP32 in variant.out_dtypes else BF16
                if devices[out_dtype] is None:
                    devices[out_dtype] = DeviceProblem(in_bf16)
                dev = devices[out_dtype]
                try:
                    out = run_once(variant, dev)
                except ValueError as unsupported:
                    progress(f"[accuracy] {variant.name}: skipped ({unsupported})")
                    continue
                rows.append({"variant": variant.name, "format": fmt.name, "K": K, "experts": experts,
                             "tokens": tokens, "N": N, "out": dtype_name(out_dtype),
                             "rel_error": relative_error(out, reference_gemm(dev.problem))})
    return rows


def dense_fp8_ceiling(size: int = 8192, **timing: int) -> dict[str, Any]:
    """The two tensor-pipe rates in the same run: the wgmma microbenchmarks' peaks in e4m3 and in bf16
    (kernels/ceiling_wgmma*.cu: the compute side of the FP8 roofline, and its ratio to bf16's), and cuBLAS's dense
    GEMMs at size^3 on random data, FP8 through torch._scaled_mm (fast accumulation, bf16 out) and bf16: what a
    library reaches in practice."""
    import torch

    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()  # B column-major
    one = torch.ones((), device="cuda")
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    del a, b
    flops = 2 * size**3
    fp8_us = _median_us(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True),
                        **timing)
    bf16_us = _median_us(lambda: a16 @ b16, **timing)
    return {"size": size, "fp8_tflops": flops / fp8_us / 1e6, "bf16_tflops": flops / bf16_us / 1e6,
            "wgmma_e4m3_tflops": wgmma_e4m3_tflops(**timing), "wgmma_tflops": wgmma_tflops(**timing)}


# The FP8 layer's forward pass in the steps it takes (moe_gemm.torch.fp8_layer.FP8MoELayer.forward), beside the
# bf16 layer's (moe_gemm.measure.layer.STEPS): the routing, the permutation and the tokens' quantization are one
# step here (dispatch), and GEMM 1 hands GEMM 2 its operand already quantized.
FP8_STEPS = ("dispatch", "GEMM 1 + SwiGLU + quantize", "GEMM 2", "combine")


def fp8_step_times(layer: Any, x: Any) -> dict[str, float]:
    """The FP8 layer's forward pass split into FP8_STEPS, each captured and replayed on its own inputs."""
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.layer import combine
    from moe_gemm.torch.scaled import scaled_grouped_mm, swiglu_scaled_grouped_mm

    rows, row_scales, offs, order, weights = layer.dispatch(x)
    w_gate_up, w_down = layer.w_gate_up_t.transpose(1, 2), layer.w_down_t.transpose(1, 2)
    a2, s2 = swiglu_scaled_grouped_mm(rows, w_gate_up, row_scales, layer.scale_gate_up, offs)
    y = scaled_grouped_mm(a2, w_down, s2, layer.scale_down, offs)
    calls = {
        "dispatch": lambda: layer.dispatch(x),
        "GEMM 1 + SwiGLU + quantize": lambda: swiglu_scaled_grouped_mm(rows, w_gate_up, row_scales,
                                                                       layer.scale_gate_up, offs),
        "GEMM 2": lambda: scaled_grouped_mm(a2, w_down, s2, layer.scale_down, offs),
        "combine": lambda: combine(y, order, weights, layer.top_k),
    }
    return {f"{step}_ms": time_call(call, graph=True).median_ms for step, call in calls.items()}


def layer_rows(shape: Any, tokens_list: Sequence[int]) -> list[dict[str, Any]]:
    """Chapter 08's bf16 layer (ours, the fused SwiGLU) and the FP8 layer built from its weights
    (moe_gemm.torch.fp8_layer), each forward pass on the same tokens, eagerly and as CUDA-graph replays, then
    split into its steps (moe_gemm.measure.layer.step_times, fp8_step_times), and the FP8 layer's relative error
    against the bf16 layer's output."""
    import torch

    from moe_gemm.measure.layer import eager_and_graph, seeded_layer, step_times
    from moe_gemm.measure.layer import relative_error as layer_error
    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.ops import offsets_unchecked

    layer = seeded_layer(shape)
    fp8 = FP8MoELayer.from_layer(layer)
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        with torch.no_grad(), offsets_unchecked():
            reference = layer(x)
            for name, forward, steps in (("layer/ours", layer, step_times), ("layer/fp8", fp8, fp8_step_times)):
                progress(f"[layer] {shape.label}, {tokens:,} tokens: {name}")
                error = layer_error(forward(x), reference)
                rows.append({"variant": name, **shape.fields(tokens),
                             **eager_and_graph(lambda f=forward, x=x: f(x)), "rel_error_vs_bf16": error,
                             **steps(forward, x)})
    del layer, fp8
    torch.cuda.empty_cache()
    return rows


PAIRS_STORE = "k8/swiglu-e4m3-pairs-bm128"  # the e4m3 epilogue's first version, stored two bytes at a time
SWIGLU_EPILOGUE_CHECK = 0.03  # the fused activation against the separate pass's, both dequantized (see below)


def swiglu_epilogue_rows(shape: Any, tokens_list: Sequence[int]) -> list[dict[str, Any]]:
    """GEMM 1 of the FP8 layer built from chapter 08's seeded layer, on its own routing of random tokens, six
    ways, in interleaved rounds of graph replays: the blockwise GEMM writing h = [gate | up] in bf16 (``gemm``),
    the separate SwiGLU-and-quantize pass over that h (``pass``), the SwiGLU epilogue writing the activation in
    bf16 (``swiglu``) and in e4m3 with its scales (``fused``: the op's, each quad's bytes transposed then stored 8
    at a time; ``pairs``: the first version, stored 2 bytes at a time), and quantize_1x128 over the bf16
    activation (``quantize``: the pass the e4m3 epilogue replaces). First the fused outputs are checked:
    dequantized, the e4m3 activation against the separate pass's (the two differ where h's bf16 rounding moves a
    value across an e4m3 rounding boundary: about 1.5% of values by one step, a relative difference near 1.5%; a
    RuntimeError, and nothing timed, beyond SWIGLU_EPILOGUE_CHECK), the two e4m3 stores' bytes against each other
    (identical, or a RuntimeError), and the bf16 one against torch's SwiGLU of h."""
    import torch

    from moe_gemm.measure.layer import relative_error as layer_error
    from moe_gemm.measure.layer import seeded_layer
    from moe_gemm.torch.bench import time_interleaved
    from moe_gemm.torch.fp8_layer import FP8MoELayer
    from moe_gemm.torch.ops import offsets_unchecked
    from moe_gemm.torch.quantize import quantize_1x128, swiglu_quantize_1x128
    from moe_gemm.torch.scaled import dequantized_rows, fused_swiglu, scaled_grouped_mm, swiglu_refusal
    from moe_gemm.torch.swiglu import swiglu

    layer = seeded_layer(shape)
    fp8 = FP8MoELayer.from_layer(layer)
    del layer
    torch.cuda.empty_cache()
    b, sb = fp8.w_gate_up_t.transpose(1, 2), fp8.scale_gate_up
    rows = []
    for tokens in tokens_list:
        progress(f"[swiglu] {shape.label}, {tokens:,} tokens: GEMM 1 and the pass, the epilogue in bf16 and e4m3")
        x = torch.randn(tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        with torch.no_grad(), offsets_unchecked():
            a, sa, offs, _, _ = fp8.dispatch(x)
            reason = swiglu_refusal(a, b, sa, sb, offs)
            if reason is not None:
                raise ValueError(f"k8's SwiGLU epilogue cannot take the {shape.label} layer: {reason}")
            h = scaled_grouped_mm(a, b, sa, sb, offs)
            act = swiglu(h)
            (q, scale), (want_q, want_scale) = fused_swiglu(a, b, sa, sb, offs), swiglu_quantize_1x128(h)
            m = a.shape[0]
            error = layer_error(dequantized_rows(q, scale), dequantized_rows(want_q, want_scale))
            bf16_error = layer_error(fused_swiglu(a, b, sa, sb, offs, quantize=False), act.float())
            if max(error, bf16_error) > SWIGLU_EPILOGUE_CHECK:
                raise RuntimeError(f"k8's SwiGLU epilogue is {error:.2e} (e4m3) and {bf16_error:.2e} (bf16) from the "
                                   f"separate pass (allowed {SWIGLU_EPILOGUE_CHECK}): not timed")
            pairs_q, pairs_scale = fused_swiglu(a, b, sa, sb, offs, config=PAIRS_STORE)
            if not (torch.equal(q[:m].view(torch.uint8), pairs_q[:m].view(torch.uint8))
                    and torch.equal(scale, pairs_scale)):
                raise RuntimeError("k8's two e4m3 SwiGLU stores wrote different activations: not timed")
            timed = time_interleaved({
                "gemm": lambda: scaled_grouped_mm(a, b, sa, sb, offs),
                "pass": lambda: swiglu_quantize_1x128(h),
                "swiglu": lambda: fused_swiglu(a, b, sa, sb, offs, quantize=False),
                "fused": lambda: fused_swiglu(a, b, sa, sb, offs),
                "pairs": lambda: fused_swiglu(a, b, sa, sb, offs, config=PAIRS_STORE),
                "quantize": lambda: quantize_1x128(act)})
        rows.append({**shape.fields(tokens), "rows": m, **{f"{name}_ms": t.median_ms for name, t in timed.items()},
                     **{f"{name}_round_spread": t.round_spread for name, t in timed.items()},
                     "e4m3_error_vs_pass": error, "bf16_error_vs_torch": bf16_error})
    del fp8
    torch.cuda.empty_cache()
    return rows


def swiglu_epilogue_extra(row: dict[str, Any], store: str = "fused") -> float:
    """What the e4m3 epilogue costs over the bf16 one, in separate quantize passes: the chapter's target (the op's
    store; ``store="pairs"``: the first version's)."""
    return (row[f"{store}_ms"] - row["swiglu_ms"]) / row["quantize_ms"]
