// The MoE layer's combine in one pass: each token's top-k expert output rows, weighted and summed.
//
//   out[t, :] = sum over j < top_k of weight[t, j] * y[row_of[t * top_k + j], :]
//
// y holds the expert outputs in expert order (GEMM 2's C, [M, H] bf16, M = tokens x top_k);
// row_of is the inverse of the sort that put the (token, choice) pairs in that order. Every token
// has exactly top_k rows, so no two blocks write the same output and no atomics are needed; the
// sum runs in fp32 in registers and out is written once in bf16. The bytes: y read once, out written
// once (chapter 08's torch combine read and wrote y's permuted copy in between, and its first
// version added fp32 rows with atomics).
//
// One block per token; each thread owns 8 consecutive columns, one 16-byte load per row (H a
// multiple of 8, checked by the host), looping when a row has more 16-byte pieces than the block
// has threads.

#include "ptx.cuh"  // pack_bf16x2

// bf16 -> fp32 is exact and needs no instruction of its own: a bf16 is the upper half of an fp32.
__device__ __forceinline__ float bf16_lo(unsigned pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(unsigned pair) { return __uint_as_float(pair & 0xffff0000u); }

extern "C" __global__ void __launch_bounds__(256) moe_combine(const uint4* __restrict__ y,
                                                             const long long* __restrict__ row_of,
                                                             const float* __restrict__ weight,
                                                             uint4* __restrict__ out, int top_k, int pieces) {
    const long long token = blockIdx.x;
    for (int piece = threadIdx.x; piece < pieces; piece += blockDim.x) {
        float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < top_k; ++j) {
            const long long row = row_of[token * top_k + j];
            const float w = weight[token * top_k + j];
            const uint4 v = y[row * pieces + piece];
            const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                sum[2 * i] += w * bf16_lo(words[i]);
                sum[2 * i + 1] += w * bf16_hi(words[i]);
            }
        }
        out[token * pieces + piece] = make_uint4(pack_bf16x2(sum[0], sum[1]), pack_bf16x2(sum[2], sum[3]),
                                                 pack_bf16x2(sum[4], sum[5]), pack_bf16x2(sum[6], sum[7]));
    }
}
