// The FP32 FFMA ceiling: how many FLOP/s the CUDA cores give when nothing else is in the way.
//
// Every thread runs CHAINS independent multiply-add chains entirely in registers: no memory
// traffic inside the loop, and enough independent chains per warp (8) and warps per scheduler
// (the host launches several 256-thread blocks per SM) that FFMA's ~4-cycle latency never stalls
// issue. The chains are summed and stored at the end, so the compiler cannot drop them.
// FLOP per launch = 2 * CHAINS * iterations * threads.
constexpr int CEILING_FFMA_CHAINS = 8;

extern "C" __global__ void __launch_bounds__(256)
ceiling_ffma(float* __restrict__ out, int iterations, float a, float b) {
    float x[CEILING_FFMA_CHAINS];
    #pragma unroll
    for (int c = 0; c < CEILING_FFMA_CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
    #pragma unroll 4
    for (int it = 0; it < iterations; ++it) {
        #pragma unroll
        for (int c = 0; c < CEILING_FFMA_CHAINS; ++c) x[c] = fmaf(x[c], a, b);  // a, b from the host: no folding
    }
    float sum = 0.0f;
    #pragma unroll
    for (int c = 0; c < CEILING_FFMA_CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
