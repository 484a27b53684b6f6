// ceiling_wgmma.cuh: the wgmma ceilings' loop (ceiling_wgmma.cu, ceiling_wgmma_e4m3.cu: one kernel per file,
// so that each module holds only its own). bf16 wgmma.mma_async m64n256k16 back to back on operands already
// in shared memory, fp32 accumulators in registers.
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
#pragma once

#include "ptx.cuh"

constexpr int CEILING_WGMMA_N = 256;
constexpr int CEILING_WGMMA_K16 = 4;            // k16 steps per commit group: one BK = 64 stage
constexpr int CEILING_WGMMA_WARPGROUPS = 2;
constexpr int CEILING_WGMMA_A_BYTES = 64 * 64 * 2;
constexpr int CEILING_WGMMA_B_BYTES = CEILING_WGMMA_N * 64 * 2;

// The FP8 form (chapter 10): the same tiles and loop with e4m3 wgmma m64n256k32, twice the elements per
// instruction in the same shared-memory bytes (a k32 step is 32 bytes along the same 128-byte rows), so the
// same descriptors address it. Its rate is the FP8 tensor pipe's: the compute side of chapter 10's roofline.
// FLOP per launch = 2 * 64 * 256 * 32 * CEILING_WGMMA_K16 * iterations * warpgroups.
template <bool E4M3>
__device__ __forceinline__ void ceiling_loop(float* __restrict__ out, int iterations, unsigned long long k_major_bits) {
    // 128-byte swizzled tiles start on 1 KB boundaries (the swizzle pattern repeats every 1 KB).
    __shared__ alignas(1024) unsigned char tiles[CEILING_WGMMA_A_BYTES + CEILING_WGMMA_B_BYTES];
    // Small values that differ by thread, so the data is not all zeros (zeros run faster than real data on
    // this tensor pipe) and the sums stay far from fp32's range: bf16 about 1/64; read as e4m3, the same
    // bytes are 1/64 to 1/16 and 1/128 to 1/32.
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
        for (int kk = 0; kk < CEILING_WGMMA_K16; ++kk) {  // 32 bytes of K per step in a 128-byte row
            const unsigned long long desc_a = matrix_descriptor(k_major_bits, a + 32 * kk);
            const unsigned long long desc_b = matrix_descriptor(k_major_bits, b + 32 * kk);
            if constexpr (E4M3)
                wgmma_e4m3<CEILING_WGMMA_N>(acc, desc_a, desc_b, true);
            else
                wgmma_16bit<CEILING_WGMMA_N, false, false>(acc, desc_a, desc_b, true);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    float sum = 0.0f;
    #pragma unroll
    for (int i = 0; i < CEILING_WGMMA_N / 2; ++i) sum += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

