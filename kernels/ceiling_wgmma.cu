// The wgmma ceiling: bf16 wgmma.mma_async m64n256k16 back to back on operands already in shared
// memory, fp32 accumulators in registers.
//
// wgmma reads B (and here A) from shared memory through descriptors, so a register-only form
// does not exist; what this kernel leaves out is everything else a GEMM does. The two operand
// tiles (A 64 x 64, B 256 x 64, K-major, 128-byte swizzle: one BK = 64 stage of chapter 04's ring,
// 40 KB) are written once before the loop; inside it there is no global memory, no TMA and no
// barrier, only the k16 steps of that stage, over and over. Each of the two warpgroups owns a
// 64 x 256 accumulator (128 registers per thread), as the consumers of a 128 x 256 tile do, and
// keeps one commit group in flight behind the one it issues. The rate it reaches is the tensor
// pipe's through wgmma on this GPU at its clocks under this load: the ceiling of every Hopper
// kernel's %SOL and the compute side of the roofline.
// FLOP per launch = 2 * 64 * 256 * 16 * CEILING_WGMMA_K16 * iterations * warpgroups.
#include "ptx.cuh"

constexpr int CEILING_WGMMA_N = 256;
constexpr int CEILING_WGMMA_K16 = 4;            // k16 steps per commit group: one BK = 64 stage
constexpr int CEILING_WGMMA_WARPGROUPS = 2;
constexpr int CEILING_WGMMA_A_BYTES = 64 * 64 * 2;
constexpr int CEILING_WGMMA_B_BYTES = CEILING_WGMMA_N * 64 * 2;

extern "C" __global__ void __launch_bounds__(128 * CEILING_WGMMA_WARPGROUPS, 1)
ceiling_wgmma(float* __restrict__ out, int iterations, unsigned long long k_major_bits) {
    // 128-byte swizzled tiles start on 1 KB boundaries (the swizzle pattern repeats every 1 KB).
    __shared__ alignas(1024) unsigned char tiles[CEILING_WGMMA_A_BYTES + CEILING_WGMMA_B_BYTES];
    // Small bf16 values (about 1/64) that differ by thread, so the data is not all zeros (zeros
    // run faster than real data on this tensor pipe) and the sums stay far from fp32's range.
    unsigned* words = reinterpret_cast<unsigned*>(tiles);
    for (int i = threadIdx.x; i < (CEILING_WGMMA_A_BYTES + CEILING_WGMMA_B_BYTES) / 4; i += blockDim.x)
        words[i] = 0x3C803C80u ^ (i & 0x00070007u);
    // The generic proxy wrote the tiles; wgmma reads them through the async proxy.
    fence_proxy_async_shared();
    __syncthreads();

    const unsigned a = smem_u32(tiles), b = a + CEILING_WGMMA_A_BYTES;
    float acc[CEILING_WGMMA_N / 2];
    #pragma unroll
    for (int i = 0; i < CEILING_WGMMA_N / 2; ++i) acc[i] = 0.0f;
    for (int it = 0; it < iterations; ++it) {
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < CEILING_WGMMA_K16; ++kk)  // 32 bytes of K per k16 step in a 128-byte row
            wgmma_16bit<CEILING_WGMMA_N, false, false>(acc, matrix_descriptor(k_major_bits, a + 32 * kk),
                                                      matrix_descriptor(k_major_bits, b + 32 * kk), true);
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    float sum = 0.0f;
    #pragma unroll
    for (int i = 0; i < CEILING_WGMMA_N / 2; ++i) sum += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
