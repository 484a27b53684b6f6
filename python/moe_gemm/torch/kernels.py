"""The CUDA kernels of the torch layer that are not grouped GEMMs, as (source under kernels/, kernel
name). Kept apart from the modules that launch them because this one imports no torch: the GPU
validation record (moe_gemm.measure.validation) reads it where torch is not installed."""

from __future__ import annotations

COMBINE = ("moe_combine.cu", "moe_combine")  # the MoE layer's combine (moe_gemm.torch.combine)


def quantize_instance(pieces: int, divide_once: bool) -> str:
    """The activation quantizer's instance: 16-byte pieces a thread loads at once; whether a group's values are
    divided from its reciprocal (kernels/k8_quantize.cu, quantize_1x128<PIECES, DIVIDE_ONCE>)."""
    return f"quantize_1x128<{pieces}, {str(divide_once).lower()}>"


PIECES = 4  # the activation quantizers' 16-byte pieces per thread (k8::PIECES; the SwiGLU quantizer's too)
QUANTIZE = ("k8_quantize.cu", quantize_instance(PIECES, True))  # chapter 10's activation quantizer (torch.quantize)
def weights_instance(loads_first: bool, whole_sectors: bool) -> str:
    """The weights' quantizer's instance: a thread's loads all written before the first is staged; each store
    instruction writing whole 32-byte sectors (kernels/k8_quantize.cu, quantize_128x128_t<LOADS_FIRST,
    WHOLE_SECTORS>)."""
    return f"quantize_128x128_t<{str(loads_first).lower()}, {str(whole_sectors).lower()}>"


QUANTIZE_WEIGHTS = ("k8_quantize.cu", weights_instance(True, True))  # and its weights' quantizer
SWIGLU_QUANTIZE = ("k8_quantize.cu", "swiglu_quantize_1x128")  # the FP8 layer's SwiGLU and quantization in one pass
# The activation quantizer's steps before it, which chapter 10's quantize part times beside it: its first version
# (one 16-byte piece a thread, __fdiv_rn on every value) and each of the two changes alone (kernels/k8_quantize.cu,
# quantize_1x128<PIECES, DIVIDE_ONCE>), as (PIECES, DIVIDE_ONCE).
QUANTIZE_STEPS = {"k8/quantize-1x128-first": (1, False), "k8/quantize-1x128-pieces": (4, False),
                  "k8/quantize-1x128-divide-once": (1, True)}
# The weights' quantizer's steps likewise: its first version (two loads in flight a thread, stores covering half
# sectors) and each change alone, as (LOADS_FIRST, WHOLE_SECTORS).
QUANTIZE_WEIGHTS_STEPS = {"k8/quantize-128x128-first": (False, False), "k8/quantize-128x128-loads-first": (True, False),
                          "k8/quantize-128x128-whole-sectors": (False, True)}

# The SwiGLU's backward fused into the dA GEMM (k6's "dswiglu" epilogue): each configuration of
# moe_gemm.variants.k6.config.FUSED_BACKWARD and the name its kernels have in the validation record (with "-bf16"
# or "-fp16" after it) and in NOT_YET_RUN below.
FUSED_BACKWARD_RECORDS = {"k6/dswiglu-bn128": "torch/dswiglu", "k6/dswiglu-prefetch-bn128": "torch/dswiglu-prefetch",
                          "k6/dswiglu-g8-bn128": "torch/dswiglu-g8",
                          "k6/dswiglu-hints-g8-bn128": "torch/dswiglu-hints-g8",
                          "k6/dswiglu-mcluster-bn128": "torch/dswiglu-mcluster"}

# SwiGLU's backward as one pass (kernels/swiglu_backward.cu, moe_gemm.torch.swiglu.dswiglu_pass) for each 16-bit
# type; its name in the validation record is SWIGLU_BACKWARD_PENDING with "-bf16" or "-fp16" after it.
SWIGLU_BACKWARD = {"bf16": ("swiglu_backward.cu", "swiglu_backward<0>"),
                   "fp16": ("swiglu_backward.cu", "swiglu_backward<1>")}
SWIGLU_BACKWARD_PENDING = "torch/dswiglu-pass"

# The FP8 layer's GEMM 1 with the SwiGLU epilogue (k8_fp8_swiglu): each configuration of
# moe_gemm.variants.k8.config.SWIGLU and its name in the validation record; "k8/gemm-swiglu" in NOT_YET_RUN
# covers them all.
FP8_SWIGLU_RECORDS = {"k8/swiglu-bm128": "k8/gemm-swiglu-bf16", "k8/swiglu-e4m3-bm128": "k8/gemm-swiglu-e4m3",
                      "k8/swiglu-e4m3-pairs-bm128": "k8/gemm-swiglu-e4m3-pairs"}
FP8_SWIGLU_PENDING = "k8/gemm-swiglu"

# Kernels the op would launch that are built, compiled and inspected on every machine but have not yet passed
# their GPU tests: the op runs the same computation as torch operations instead, and the GPU validation record
# leaves them out. To admit one: `python -m moe_gemm.measure.validation run torch --admit` on an sm_90a GPU
# (its GPU tests run and, where they pass, it is recorded), then remove it here. The prefetching fused
# backward and the FP8 layer's GEMM 1 with the SwiGLU epilogue (its e4m3 output held to one e4m3 step plus the
# FP8 sums' own error) passed on an H100 (2026-12-06), and so did the raster-walked fused backward (the first
# one's kernel with another launch argument); the raster-walked one with L2 eviction priorities and SwiGLU's
# backward as one pass passed theirs on an H100 (2026-12-07), and so did the fused backward in a cluster of two
# along M (W_down multicast to an M pair) the same day. Empty.
NOT_YET_RUN: frozenset[str] = frozenset()
