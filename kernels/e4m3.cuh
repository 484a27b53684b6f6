// e4m3.cuh: the scale rule of chapter 10's 1 x 128 quantization, shared by the activation quantizers
// (k8_quantize.cu) and the FP8 GEMM's SwiGLU epilogue (k8_fp8.cu), which must quantize alike: GEMM 2 reads
// either's output; and the quantizers' division by the scale. The numpy reference is
// moe_gemm.model.quantize.quantize.
#pragma once

#include "ptx.cuh"  // rcp_approx

namespace e4m3 {
constexpr int GROUP = 128;                          // values per scale along K (the DeepSeek-V3 recipe)
constexpr float MAX = 448.0f;                       // e4m3's largest finite magnitude
constexpr float FLT_MIN_NORMAL = 1.17549435e-38f;   // the smallest normal fp32

// A group's scale from its amax: amax / 448 rounded to nearest, at least the smallest normal fp32 (so that
// x / scale stays finite), and 1 for an all-zero group (any scale gives zeros; 1 is the reference's).
__device__ __forceinline__ float scale_of(float amax) {
    return amax == 0.0f ? 1.0f : fmaxf(__fdiv_rn(amax, MAX), FLT_MIN_NORMAL);
}

// --8<-- [start:divide]
// Every value of a group divided by its scale, rounded to nearest as fp32 division rounds (the reference's
// x / scale), in three instructions a value. __fdiv_rn(x, s) runs about nine: a reciprocal (MUFU.RCP), one Newton
// step on it (two FFMA), the quotient's first guess (a multiply) and one correction (two FFMA), behind a range
// check (FCHK) with a slow path for operands where a step could overflow or underflow (quantize_1x128's SASS
// before this helper). Within a group s is one value, so the reciprocal and its Newton step are done once
// (divisor_of) and each value costs the last three (divide), the same operations on the same operands.
// The range check becomes one on s alone: for s in [2^-90, 2^120] no step overflows, and none underflows on a
// quotient of magnitude 2^-11 or more, which therefore comes out as __fdiv_rn's; a smaller one may land an ulp
// away, but anything below 2^-10 (half of e4m3's smallest subnormal, 2^-9) rounds to e4m3's zero either way, so
// the e4m3 byte is the same. The sign is copied from x (the correction turns -0 into +0). Every scale of a
// group whose amax lies in [448 * 2^-90, 448 * 2^120], about [4e-25, 6e38], is in range; others take __fdiv_rn.
struct Divisor {
    float s, r;  // the scale and its reciprocal after one Newton step
    bool fast;   // s in [2^-90, 2^120]: divide's three instructions give __fdiv_rn's e4m3 byte, else __fdiv_rn
};

__device__ __forceinline__ Divisor divisor_of(float s) {
    const float r0 = rcp_approx(s);
    return {s, __fmaf_rn(r0, __fmaf_rn(-s, r0, 1.0f), r0), s >= 0x1p-90f && s <= 0x1p120f};
}

// q = x / s for the N values of x, one branch for all of them (s is one value: the branch never diverges within
// a group).
template <int N>
__device__ __forceinline__ void divide(const float (&x)[N], const Divisor& d, float (&q)[N]) {
    if (d.fast) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float guess = __fmul_rn(x[i], d.r);
            q[i] = copysignf(__fmaf_rn(__fmaf_rn(-guess, d.s, x[i]), d.r, guess), x[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) q[i] = __fdiv_rn(x[i], d.s);
    }
}
// --8<-- [end:divide]
}  // namespace e4m3
