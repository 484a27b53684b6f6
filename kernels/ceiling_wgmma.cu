// The wgmma ceiling, bf16 (kernels/ceiling_wgmma.cuh says what it measures and how).
#include "ceiling_wgmma.cuh"

extern "C" __global__ void __launch_bounds__(128 * CEILING_WGMMA_WARPGROUPS, 1)
ceiling_wgmma(float* __restrict__ out, int iterations, unsigned long long k_major_bits) {
    ceiling_loop<false>(out, iterations, k_major_bits);
}

