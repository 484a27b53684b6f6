// e4m3.cuh: the scale rule of chapter 10's 1 x 128 quantization, shared by the activation quantizers
// (k8_quantize.cu) and the FP8 GEMM's SwiGLU epilogue (k8_fp8.cu), which must quantize alike: GEMM 2 reads
// either's output. The numpy reference is moe_gemm.model.quantize.quantize.
#pragma once

namespace e4m3 {
constexpr int GROUP = 128;                          // values per scale along K (the DeepSeek-V3 recipe)
constexpr float MAX = 448.0f;                       // e4m3's largest finite magnitude
constexpr float FLT_MIN_NORMAL = 1.17549435e-38f;   // the smallest normal fp32

// A group's scale from its amax: amax / 448 rounded to nearest, at least the smallest normal fp32 (so that
// x / scale stays finite), and 1 for an all-zero group (any scale gives zeros; 1 is the reference's).
__device__ __forceinline__ float scale_of(float amax) {
    return amax == 0.0f ? 1.0f : fmaxf(__fdiv_rn(amax, MAX), FLT_MIN_NORMAL);
}
}  // namespace e4m3
