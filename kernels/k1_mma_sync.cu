// k1: the grouped GEMM on tensor cores through mma.sync, fed by cp.async and ldmatrix.
//
//   python chapters/02/run.py            # check, time and tabulate every configuration
//
// One block computes one BM x 128 tile of C from the flat tile list (moe_gemm.model.tiles.tile_list):
// descriptor (expert, row0, rows, col0) says which rows of A, which expert's B and which columns.
// The block walks K in slices of BK = 32 through a ring of STAGES (2 or 3) shared-memory buffers
// that cp.async fills ahead of the slice being multiplied. Eight warps split the tile 2 (M) x 4 (N),
// so each warp owns a (BM/2) x 32 piece of C:
//
//                       128 columns (BN)
//               +--------+--------+--------+--------+
//      BM/2     | warp 0 | warp 1 | warp 2 | warp 3 |     each warp: (BM/2 / 16) x 4 tiles of
//   rows        +--------+--------+--------+--------+     16 x 8, one mma.sync m16n8k16 per tile
//      BM/2     | warp 4 | warp 5 | warp 6 | warp 7 |     and per 16-wide step of K
//               +--------+--------+--------+--------+
//
// Template parameters: BM in {32, 64, 128}; STAGES, the depth of the cp.async ring (2 or 3);
// FRAG_DB loads the fragments of the next 16-wide K step before issuing the MMAs of the current
// one (two register sets; two stages only).
// Host-side requirements (checked by moe_gemm.variants.k1 before any launch): K % 32 == 0,
// N % 8 == 0 (16-byte copies never straddle N), compute capability 8.0 or newer.
#include "ptx.cuh"

namespace k1 {
// --8<-- [start:constants]
constexpr int BN = 128;              // columns of C per block
constexpr int BK = 32;               // K per pipeline stage: two m16n8k16 steps
constexpr int THREADS = 256;         // eight warps
constexpr int WARPS_N = 4;           // warps across the 128 columns; 2 down the BM rows
constexpr int WN = BN / WARPS_N;     // 32 columns per warp
constexpr int NI = WN / 8;           // four n8 MMA tiles per warp
constexpr int PAD = 8;               // bf16 of padding per shared-memory row (16 bytes)
constexpr int A_LD = BK + PAD;       // A stage row: 40 bf16 = 80 bytes
constexpr int B_LD = BN + PAD;       // B stage row: 136 bf16 = 272 bytes
constexpr int CHUNK = 8;             // bf16 per 16-byte cp.async
constexpr int K_STEPS = BK / 16;     // m16n8k16 steps per slice
static_assert(K_STEPS % 2 == 0, "FRAG_DB alternates two fragment sets across slices");
// --8<-- [end:constants]

// --8<-- [start:min_blocks]
// Resident blocks per SM we ask ptxas to allow (__launch_bounds__' second argument). It caps the
// registers per thread at 65,536 / (blocks * 256), rounded down to the allocation step:
//   BM = 128: 2 blocks -> 128 registers (64 of them accumulators)
//   BM =  64: 4 blocks ->  64 registers (32 accumulators)
//   BM =  32: 4 blocks ->  64 registers (16 accumulators). Six blocks (40 registers) or five
//             (48) would fit more warps, but NVRTC 13.0's ptxas spills 8 or 16 bytes there.
// FRAG_DB keeps two fragment sets live (A: 2 x 4 x BM/32, B: 2 x 8 registers), which does not fit
// those caps without spilling, so it asks for fewer blocks: 1, 3 and 4 at BM = 128, 64 and 32.
template <int BM, bool FRAG_DB>
constexpr int MIN_BLOCKS = FRAG_DB ? (BM == 128 ? 1 : BM == 64 ? 3 : 4)
                                   : (BM == 128 ? 2 : 4);
// --8<-- [end:min_blocks]
}  // namespace k1

// --8<-- [start:fragments]
// ldmatrix.x4 addresses: lane l points at row (l % 16) and column 8 * (l / 16) of a 16 x 16
// block, so matrices 0..3 are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15): exactly a[0..3] of the mma A fragment. For B (K x N, row-major in shared
// memory) the same addresses with .trans give (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
// (k 8-15, n 8-15): the b[0..1] fragments of two neighbouring n8 tiles.
template <int MI>
__device__ __forceinline__ void load_fragments(unsigned (&a)[MI][4], unsigned (&b)[k1::NI][2],
                                               unsigned a_addr, unsigned b_addr) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        ldmatrix_x4(a[mi], a_addr + mi * 16 * k1::A_LD * 2);  // next 16 rows of the warp's A
    #pragma unroll
    for (int pair = 0; pair < k1::NI / 2; ++pair) {
        unsigned r[4];
        ldmatrix_x4_trans(r, b_addr + pair * 16 * 2);           // next 16 columns of the warp's B
        b[2 * pair][0] = r[0];
        b[2 * pair][1] = r[1];
        b[2 * pair + 1][0] = r[2];
        b[2 * pair + 1][1] = r[3];
    }
}

template <int MI>
__device__ __forceinline__ void mma_all(float (&acc)[MI][k1::NI][4], const unsigned (&a)[MI][4],
                                        const unsigned (&b)[k1::NI][2]) {
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < k1::NI; ++ni)
            mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
}
// --8<-- [end:fragments]

template <int BM, int STAGES, bool FRAG_DB>
__global__ void __launch_bounds__(k1::THREADS, k1::MIN_BLOCKS<BM, FRAG_DB>)
k1_mma_sync(const unsigned short* __restrict__ A,   // [M_tot, K] bf16, rows grouped by expert
            const unsigned short* __restrict__ B,   // [E, K, N] bf16
            unsigned short* __restrict__ C,         // [M_tot, N] bf16
            const int4* __restrict__ tiles,         // [tiles] (expert, row0, rows, col0)
            int K, int N) {
    using namespace k1;
    static_assert(BM == 32 || BM == 64 || BM == 128, "BM must be 32, 64 or 128");
    static_assert(STAGES == 2 || STAGES == 3, "STAGES must be 2 or 3");
    static_assert(!FRAG_DB || STAGES == 2, "FRAG_DB hands fragments over between exactly two stages");
    constexpr int WM = BM / 2;                   // rows per warp
    constexpr int MI = WM / 16;                  // m16 MMA tiles per warp: 1, 2 or 4
    constexpr int A_CHUNKS = BM * BK / CHUNK;    // 16-byte copies per A stage: 128, 256, 512
    constexpr int B_CHUNKS = BK * BN / CHUNK;    // 512 per B stage, whatever BM is
    constexpr int A_PER_THREAD = (A_CHUNKS + THREADS - 1) / THREADS;
    constexpr int B_PER_THREAD = B_CHUNKS / THREADS;
    constexpr unsigned A_STAGE = BM * A_LD * 2;  // bytes
    constexpr unsigned B_STAGE = BK * B_LD * 2;

    // --8<-- [start:smem]
    // STAGES buffers of A (BM x 32) and B (32 x 128), each row padded by 16 bytes. The padding makes
    // consecutive rows start 80 (A) or 272 (B) bytes apart, i.e. 5 or 17 units of 16 bytes: the
    // eight rows one ldmatrix phase reads then fall on eight different 16-byte bank groups.
    // Dynamic shared memory (the host passes STAGES * (A_STAGE + B_STAGE) bytes): three stages at
    // BM = 128 take 56 KB, past the 48 KB a static __shared__ array may hold.
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned smem_a = smem_u32(smem);                    // STAGES x [BM][A_LD]
    const unsigned smem_b = smem_a + STAGES * A_STAGE;         // STAGES x [BK][B_LD]
    // --8<-- [end:smem]

    const int4 tile = tiles[blockIdx.x];
    const int expert = tile.x, row0 = tile.y, rows = tile.z, col0 = tile.w;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

    // --8<-- [start:copy_setup]
    // Each thread owns the same few 16-byte chunks of every stage: A chunk j is row
    // tid/4 + 64j, columns 8*(tid%4)..+7 of the slice; B chunk j is row tid/16 + 16j, columns
    // 8*(tid%16)..+7. Their element offsets from the block's corner of A and B are fixed 32-bit
    // numbers; only the block-wide corners move from slice to slice. Rows past the tile's `rows`
    // (the next expert's, or past M_tot) and columns past N are zero-filled (src-size 0), with
    // the source clamped to the tile's first row / column so the address stays inside the buffer.
    const unsigned short* a_corner = A + (size_t)row0 * K;                       // A[row0][0]
    const unsigned short* b_corner = B + (size_t)expert * K * N + col0;         // B[expert][0][col0]
    int a_offset[A_PER_THREAD];
    bool a_valid[A_PER_THREAD];
    #pragma unroll
    for (int j = 0; j < A_PER_THREAD; ++j) {
        const int r = tid / (BK / CHUNK) + j * (THREADS / (BK / CHUNK));
        a_valid[j] = r < rows;
        a_offset[j] = (a_valid[j] ? r : 0) * K + (tid % (BK / CHUNK)) * CHUNK;
    }
    const int b_col = (tid % (BN / CHUNK)) * CHUNK;
    const bool b_valid = col0 + b_col < N;       // N % 8 == 0: a chunk is wholly in or out
    int b_offset[B_PER_THREAD];
    #pragma unroll
    for (int j = 0; j < B_PER_THREAD; ++j)
        b_offset[j] = (tid / (BN / CHUNK) + j * (THREADS / (BN / CHUNK))) * N + (b_valid ? b_col : 0);
    // Shared-memory byte addresses as plain integers: at BM = 32 the upper half of the threads
    // would point past the A stages, harmlessly, since they never copy A.
    const unsigned a_dst = smem_a + ((tid / (BK / CHUNK)) * A_LD + (tid % (BK / CHUNK)) * CHUNK) * 2;
    const unsigned b_dst = smem_b + ((tid / (BN / CHUNK)) * B_LD + b_col) * 2;

    auto load_stage = [&](int stage, int kt) {
        const unsigned short* a_slice = a_corner + kt * BK;                    // A[row0][kt*BK]
        const unsigned short* b_slice = b_corner + (size_t)kt * BK * N;         // B[expert][kt*BK][col0]
        #pragma unroll
        for (int j = 0; j < A_PER_THREAD; ++j)
            if (A_CHUNKS >= THREADS || tid < A_CHUNKS)   // BM = 32: half the threads copy A
                cp_async_16(a_dst + stage * A_STAGE + j * (THREADS / (BK / CHUNK)) * A_LD * 2,
                            a_slice + a_offset[j], a_valid[j]);
        #pragma unroll
        for (int j = 0; j < B_PER_THREAD; ++j)
            cp_async_16(b_dst + stage * B_STAGE + j * (THREADS / (BN / CHUNK)) * B_LD * 2,
                        b_slice + b_offset[j], b_valid);
    };
    // --8<-- [end:copy_setup]

    // Per-lane ldmatrix addresses into stage 0 at K step 0 (see load_fragments).
    const unsigned a_frag = smem_a + ((warp_m * WM + lane % 16) * A_LD + (lane / 16) * 8) * 2;
    const unsigned b_frag = smem_b + ((lane % 16) * B_LD + warp_n * WN + (lane / 16) * 8) * 2;

    float acc[MI][NI][4];
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int i = 0; i < 4; ++i) acc[mi][ni][i] = 0.0f;

    // --8<-- [start:mainloop]
    // A ring of STAGES buffers, one barrier per K slice. Before the loop, slices 0 .. STAGES-2 are
    // in flight, one cp.async group each. At the top of iteration kt, wait_group<STAGES-2> leaves
    // only the newer groups pending, so this thread's copies of slice kt have landed; after the
    // barrier everyone's have, and every warp has finished multiplying slice kt-1, whose buffer
    // is refilled with slice kt+STAGES-1 while slice kt is multiplied. Every iteration commits a
    // group, empty or not, so the group count stays in step with kt.
    const int k_tiles = K / BK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();
    }
    if constexpr (!FRAG_DB) {
        int stage = 0;                               // the buffer multiplied in this iteration
        for (int kt = 0; kt < k_tiles; ++kt) {
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            const int refill = stage == 0 ? STAGES - 1 : stage - 1;  // slice kt-1's buffer, now free
            if (kt + STAGES - 1 < k_tiles) load_stage(refill, kt + STAGES - 1);
            cp_async_commit();
            #pragma unroll
            for (int ks = 0; ks < K_STEPS; ++ks) {   // load step ks, multiply it, next step
                unsigned a[MI][4], b[NI][2];
                load_fragments<MI>(a, b, a_frag + stage * A_STAGE + ks * 16 * 2,
                                   b_frag + stage * B_STAGE + ks * 16 * B_LD * 2);
                mma_all<MI>(acc, a, b);
            }
            stage = stage + 1 == STAGES ? 0 : stage + 1;
        }
    }
    // --8<-- [end:mainloop]
    // --8<-- [start:frag_db]
    // FRAG_DB: two fragment sets, so the ldmatrix of step ks+1 is issued before the MMAs of step
    // ks. For the last step of a slice the next fragments come from the next slice: the wait and
    // the barrier move to the middle of the iteration, between the loads of that slice's first
    // step and the MMAs of this slice's last. The barrier then also proves that every warp holds
    // slice kt in registers, so slice kt's stage is refilled with slice kt+2.
    if constexpr (FRAG_DB) {
        unsigned a[2][MI][4], b[2][NI][2];
        cp_async_wait<0>();
        __syncthreads();
        if (k_tiles > 1) load_stage(1, 1);
        cp_async_commit();
        load_fragments<MI>(a[0], b[0], a_frag, b_frag);
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int stage = kt & 1;
            #pragma unroll
            for (int ks = 0; ks < K_STEPS; ++ks) {
                const int next = (ks + 1) & 1;         // K_STEPS is even: sets alternate across slices
                if (ks + 1 < K_STEPS) {
                    load_fragments<MI>(a[next], b[next], a_frag + stage * A_STAGE + (ks + 1) * 16 * 2,
                                       b_frag + stage * B_STAGE + (ks + 1) * 16 * B_LD * 2);
                } else if (kt + 1 < k_tiles) {
                    cp_async_wait<0>();
                    __syncthreads();
                    if (kt + 2 < k_tiles) load_stage(stage, kt + 2);
                    cp_async_commit();
                    load_fragments<MI>(a[next], b[next], a_frag + (stage ^ 1) * A_STAGE,
                                       b_frag + (stage ^ 1) * B_STAGE);
                }
                mma_all<MI>(acc, a[ks & 1], b[ks & 1]);
            }
        }
    }
    // --8<-- [end:frag_db]

    // --8<-- [start:epilogue]
    // Register-direct epilogue: lane (g = lane/4, t = lane%4) holds D[g][2t..2t+1] and
    // D[g+8][2t..2t+1] of every 16 x 8 tile, so each pair becomes one 4-byte bf16x2 store.
    // Rows past the tile's `rows` belong to the next expert (or to nobody) and are not written;
    // with N % 8 == 0, a pair starting below N ends below N.
    const int g = lane / 4, t = lane % 4;
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = warp_m * WM + mi * 16 + half * 8 + g;
            if (r >= rows) continue;
            unsigned short* c_row = C + (size_t)(row0 + r) * N;
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int col = col0 + warp_n * WN + ni * 8 + 2 * t;
                if (col < N)
                    *reinterpret_cast<unsigned*>(c_row + col) =
                        pack_bf16x2(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
            }
        }
    }
    // --8<-- [end:epilogue]
}
