"""The CUDA kernels of the torch layer that are not grouped GEMMs, as (source under kernels/, kernel
name). Kept apart from the modules that launch them because this one imports no torch: the GPU
validation record (moe_gemm.measure.validation) reads it where torch is not installed."""

from __future__ import annotations

COMBINE = ("moe_combine.cu", "moe_combine")  # the MoE layer's combine (moe_gemm.torch.combine)
QUANTIZE = ("k8_quantize.cu", "quantize_1x128")  # chapter 10's activation quantizer (moe_gemm.torch.quantize)
QUANTIZE_WEIGHTS = ("k8_quantize.cu", "quantize_128x128_t")  # and its weights' quantizer
SWIGLU_QUANTIZE = ("k8_quantize.cu", "swiglu_quantize_1x128")  # the FP8 layer's SwiGLU and quantization in one pass
