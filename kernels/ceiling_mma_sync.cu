// The mma.sync ceiling: bf16 m16n8k16 MMAs back to back, operands already in registers.
//
// Each warp keeps CHAINS independent accumulator tiles, so consecutive MMAs never wait on each
// other's results; with several 256-thread blocks per SM every scheduler has warps to pick from.
// No shared or global memory is touched inside the loop: this is the tensor pipe's rate through
// the warp-level mma.sync path, the ceiling k1 and k2 are measured against. The accumulators are
// summed and stored at the end so that nothing is dead code.
// FLOP per launch = 2 * 16 * 8 * 16 * CHAINS * iterations * warps.
#include "ptx.cuh"

constexpr int CEILING_MMA_CHAINS = 8;

extern "C" __global__ void __launch_bounds__(256)
ceiling_mma_sync(float* __restrict__ out, int iterations, unsigned seed) {
    // bf16 pairs of small values (about 1/64) that depend on the thread, so nothing folds; the
    // sums stay far from fp32's range over any sensible number of iterations.
    const unsigned word = 0x3C803C80u ^ ((threadIdx.x ^ seed) & 0x00070007u);
    const unsigned a[4] = {word, word ^ 1u, word ^ 2u, word ^ 3u};
    const unsigned b[2] = {word ^ 4u, word ^ 5u};
    float acc[CEILING_MMA_CHAINS][4];
    #pragma unroll
    for (int c = 0; c < CEILING_MMA_CHAINS; ++c)
        #pragma unroll
        for (int i = 0; i < 4; ++i) acc[c][i] = 0.0f;
    for (int it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int c = 0; c < CEILING_MMA_CHAINS; ++c) mma_bf16_16816(acc[c], a, b);
    }
    float sum = 0.0f;
    #pragma unroll
    for (int c = 0; c < CEILING_MMA_CHAINS; ++c)
        #pragma unroll
        for (int i = 0; i < 4; ++i) sum += acc[c][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
