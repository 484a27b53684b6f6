// epilogues.cuh: how a consumer warpgroup of the wgmma kernels writes its slice of C. There are two
// ways because a TMA store writes whole 64-row boxes: a slice whose rows all belong to the tile's
// expert goes through shared memory and TMA, and one that runs into the next expert (or past M_tot)
// is stored from registers with a row guard. k3 and k5 stage a whole tile at once (store_tile_tma,
// store_tile); k6 and k7 stream it through a small ring of staging boxes (store_slices).
#pragma once

#include "named_barriers.cuh"
#include "ptx.cuh"
#include "wgmma_config.cuh"

namespace sm90 {

// --8<-- [start:elements]
// The element types of the 16-bit wgmma kernels (k6's IN and OUT template parameters): wgmma takes
// bf16 or fp16 operands at one rate into fp32 accumulators, which the epilogue rounds to bf16 or
// fp16, or stores as they are (fp32: a weight gradient kept in full, torch's out_dtype=float32).
enum Element : int { BF16 = 0, F16 = 1, F32 = 2 };

// Two accumulators rounded to a 16-bit OUT and packed, `lo` at the lower address.
template <int OUT>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
    static_assert(OUT == BF16 || OUT == F16, "a packed pair of 16-bit outputs");
    return OUT == BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}

// The reverse of pack_pair: a packed pair of 16-bit IN values widened to fp32 (exact).
template <int IN>
__device__ __forceinline__ void unpack_pair(unsigned packed, float& lo, float& hi) {
    static_assert(IN == BF16 || IN == F16, "a packed pair of 16-bit values");
    if constexpr (IN == BF16) {
        lo = __uint_as_float(packed << 16);
        hi = __uint_as_float(packed & 0xffff0000u);
    } else {
        unpack_f16x2(packed, lo, hi);
    }
}

// --8<-- [start:dswiglu_pair]
// SwiGLU's backward for a pair of elements (a thread's accumulator pair, or a packed pair of 16-bit values),
// in fp32, from the gradient of the output (dact) and the saved gate and up:
//   s = sigmoid(gate), act = gate s up, dgate = dact up s (1 + gate (1 - s)), dup = dact gate s.
// k6's fused epilogue (chapter 09) and the separate pass (kernels/swiglu_backward.cu) both compute it here.
__device__ __forceinline__ void dswiglu_pair(const float (&dact)[2], const float (&gate)[2], const float (&up)[2],
                                             float (&dgate)[2], float (&dup)[2], float (&act)[2]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const float s = 1.0f / (1.0f + __expf(-gate[c]));
        act[c] = gate[c] * s * up[c];
        dgate[c] = dact[c] * up[c] * s * (1.0f + gate[c] * (1.0f - s));
        dup[c] = dact[c] * gate[c] * s;
    }
}
// --8<-- [end:dswiglu_pair]

// C[index], C[index + 1] = lo, hi in OUT: one 4-byte store for 16-bit outputs, one 8-byte store for
// fp32 (index is even: a thread's pair of accumulator columns, 8j + 2t and the next). ACCUMULATE
// (fp32 only): C[index], C[index + 1] += lo, hi, one 8-byte reduction in L2 (ptx.cuh, red_add_f32x2).
template <int OUT, bool ACCUMULATE = false>
__device__ __forceinline__ void store_pair(void* C, long long index, float lo, float hi) {
    static_assert(!ACCUMULATE || OUT == F32, "gradients accumulate into an fp32 buffer only");
    if constexpr (ACCUMULATE)
        red_add_f32x2(static_cast<float*>(C) + index, lo, hi);
    else if constexpr (OUT == F32)
        *reinterpret_cast<float2*>(static_cast<float*>(C) + index) = make_float2(lo, hi);
    else
        *reinterpret_cast<unsigned*>(static_cast<unsigned short*>(C) + index) = pack_pair<OUT>(lo, hi);
}
// --8<-- [end:elements]

// --8<-- [start:epilogue]
// Register-direct epilogue, as in k1 and k2: the wgmma accumulator layout (ptx.cuh, wgmma_16bit)
// puts D[16w + 8h + g][8j + 2t .. +1] in d[4j + 2h .. +1], one bf16x2 word per store. Rows at or
// past tile.z belong to the next expert (or lie past M_tot) and are dropped, as are columns at
// or past N (N % 8 == 0 and the column is even, so a pair is wholly inside or outside).
template <class Cfg>
__device__ __forceinline__ void store_tile(const float (&acc)[Cfg::M_ITERS][Cfg::WG_COLS / 2], int4 tile, int wg_m,
                                           int wg_n, unsigned short* __restrict__ C, int N) {
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x % WARPGROUP) / 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < Cfg::M_ITERS; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = wg_m * Cfg::WG_ROWS + i * 64 + warp * 16 + h * 8 + g;
            if (row >= tile.z) continue;
            unsigned short* c_row = C + static_cast<long long>(tile.y + row) * N;
#pragma unroll
            for (int j = 0; j < Cfg::WG_COLS / 8; ++j) {
                const int col = tile.w + wg_n * Cfg::WG_COLS + j * 8 + 2 * t;
                if (col < N)
                    *reinterpret_cast<unsigned*>(c_row + col) = pack_bf16x2(acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
            }
        }
    }
}
// --8<-- [end:epilogue]

// --8<-- [start:tma_epilogue]
// The epilogue through shared memory: the warpgroup packs its accumulators to bf16 and writes
// them with stmatrix into its staging boxes (64 x 64, 128-byte swizzle, the layout TMA expects),
// then one thread hands the boxes to TMA and the warpgroup goes straight back to multiplying.
// Only for slices whose rows all belong to the tile's expert: a TMA store writes whole boxes
// (clipped only at M_tot and N), so a partial slice falls back to store_tile's row guard.
template <class Cfg>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[Cfg::M_ITERS][Cfg::WG_COLS / 2], int4 tile,
                                               int warpgroup, int wg_m, int wg_n, unsigned staging,
                                               const CUtensorMap* tmap_c, int N) {
    static_assert(Cfg::WG_M * Cfg::WG_N <= MAX_CONSUMER_WARPGROUPS, "a staging barrier id for every warpgroup");
    constexpr int BOXES = Cfg::WG_COLS / BOX;
    const bool issuer = threadIdx.x % WARPGROUP == 0;
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x % WARPGROUP) / 32;
    if (issuer) bulk_wait_read<0>();  // the previous tile's stores have finished reading the boxes
    // This warpgroup's own barrier id: the other consumer warpgroup may still be multiplying or
    // storing its own slice, and must neither wait here nor count towards this one's 128.
    named_barrier_sync(STAGING_BARRIER + warpgroup, WARPGROUP);
    // stmatrix.x4 stores a 16 x 16 piece: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) of
    // this warp's 16 rows; lane l addresses row l%8 of matrix l/8.
    const int m = lane / 8;
    const int row = warp * 16 + (m % 2) * 8 + lane % 8;  // within the m64 slice
#pragma unroll
    for (int i = 0; i < Cfg::M_ITERS; ++i) {
#pragma unroll
        for (int jj = 0; jj < Cfg::WG_COLS / 16; ++jj) {
            const int col = jj * 16 + (m / 2) * 8;  // within the warpgroup's columns
            const unsigned box = staging + (i * BOXES + col / BOX) * BOX_BYTES;
            const unsigned chunk = (col % BOX) / 8;
            const unsigned fragment[4] = {
                pack_bf16x2(acc[i][8 * jj + 0], acc[i][8 * jj + 1]), pack_bf16x2(acc[i][8 * jj + 2], acc[i][8 * jj + 3]),
                pack_bf16x2(acc[i][8 * jj + 4], acc[i][8 * jj + 5]), pack_bf16x2(acc[i][8 * jj + 6], acc[i][8 * jj + 7])};
            stmatrix_x4(swizzled_128b(box, row, chunk), fragment);
        }
    }
    fence_proxy_async_shared();  // the generic-proxy writes above, before TMA (async proxy) reads them
    named_barrier_sync(STAGING_BARRIER + warpgroup, WARPGROUP);
    if (issuer) {
        const int row0 = tile.y + wg_m * Cfg::WG_ROWS;
        const int col0 = tile.w + wg_n * Cfg::WG_COLS;
#pragma unroll
        for (int i = 0; i < Cfg::M_ITERS; ++i)
#pragma unroll
            for (int b = 0; b < BOXES; ++b)
                if (col0 + b * BOX < N)
                    tma_store_2d(tmap_c, col0 + b * BOX, row0 + i * 64, staging + (i * BOXES + b) * BOX_BYTES);
        bulk_commit();
    }
}
// --8<-- [end:tma_epilogue]

// --8<-- [start:staged_epilogue]
// The warpgroup's rows row0 .. row0 + rows - 1 (rows > 0) of the tile, columns col0 .. col0 + BN - 1.
// Whole m64 slices go through shared memory: each 64 x 64 box is packed with stmatrix into the
// next of the warpgroup's STAGING_BOXES staging boxes (128-byte swizzle, as TMA reads it) and
// stored by TMA, the box's previous store having finished reading it. A slice with fewer than 64
// rows (the expert's last) is stored from registers with a row guard, since a TMA store writes
// whole boxes and the rows past it belong to the next expert.
// COLS is the tile's width in C: BN, or BN / 2 after the SwiGLU epilogue. An fp32 C (OUT = F32) is
// stored from registers throughout: stmatrix moves 16-bit elements only, and a 64-column fp32 box is
// 256 bytes wide, twice what the 128-byte swizzle lets one TMA box span. ACCUMULATE adds the tile into
// an fp32 C instead of overwriting it (k7's accumulate mode), on the same register path.
template <class Cfg, int STAGING_BOXES, int COLS, int OUT, bool ACCUMULATE = false>
__device__ __forceinline__ void store_slices(const float (&acc)[Cfg::M_ITERS][COLS / 2], int row0, int rows, int col0,
                                      int warpgroup, unsigned staging, int& stored, const CUtensorMap* tmap_c,
                                      void* __restrict__ C, int N) {
    constexpr int BN = COLS;
    const bool issuer = threadIdx.x % WARPGROUP == 0;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % WARPGROUP) / 32;
#pragma unroll
    for (int i = 0; i < Cfg::M_ITERS; ++i) {
        const int slice_rows = rows - 64 * i;
        if (slice_rows <= 0) break;
        const int slice_row0 = row0 + 64 * i;
        if (OUT == F32 || slice_rows < 64) {  // registers: D[16 warp + 8h + g][8j + 2t + c] is acc[i][4j + 2h + c]
            const int g = lane / 4, t = lane % 4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = warp * 16 + h * 8 + g;
                if (r >= slice_rows) continue;
                const long long c_row = static_cast<long long>(slice_row0 + r) * N;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    const int col = col0 + j * 8 + 2 * t;
                    if (col < N)
                        store_pair<OUT, ACCUMULATE>(C, c_row + col, acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
                }
            }
            continue;
        }
        if constexpr (OUT != F32) {  // (an fp32 C never gets here: no 16-bit pairs to stage)
            const int m = lane / 8, r = warp * 16 + (m % 2) * 8 + lane % 8;  // stmatrix: lane l, row l%8 of matrix l/8
#pragma unroll
            for (int b = 0; b < COLS / BOX; ++b) {
                if (col0 + b * BOX >= N) break;
                const unsigned box = staging + (stored % STAGING_BOXES) * BOX_BYTES;
                if (issuer) bulk_wait_read<STAGING_BOXES - 1>();  // the box's last store has read it
                named_barrier_sync(STAGING_BARRIER + warpgroup, WARPGROUP);
#pragma unroll
                for (int jj = 4 * b; jj < 4 * b + 4; ++jj) {  // 16 columns each
                    const unsigned chunk = ((jj % 4) * 16 + (m / 2) * 8) / 8;
                    const unsigned fragment[4] = {
                        pack_pair<OUT>(acc[i][8 * jj + 0], acc[i][8 * jj + 1]),
                        pack_pair<OUT>(acc[i][8 * jj + 2], acc[i][8 * jj + 3]),
                        pack_pair<OUT>(acc[i][8 * jj + 4], acc[i][8 * jj + 5]),
                        pack_pair<OUT>(acc[i][8 * jj + 6], acc[i][8 * jj + 7])};
                    stmatrix_x4(swizzled_128b(box, r, chunk), fragment);
                }
                fence_proxy_async_shared();  // stmatrix's writes, before TMA (the async proxy) reads them
                named_barrier_sync(STAGING_BARRIER + warpgroup, WARPGROUP);
                if (issuer) {
                    tma_store_2d(tmap_c, col0 + b * BOX, slice_row0, box);
                    bulk_commit();
                }
                ++stored;
            }
        }
    }
}
// --8<-- [end:staged_epilogue]

}  // namespace sm90
