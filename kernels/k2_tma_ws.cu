// k2_tma_ws.cu: chapter 03's kernel. TMA fills a ring of shared-memory stages, one producer warp
// drives it, eight compute warps consume it with ldmatrix + mma.sync, and mbarriers connect them.
//
//   python chapters/03/run.py              # check, time and compare (needs an sm_90 GPU)
//   pytest tests/test_k2.py                # compiles every STAGES for sm_90a, no GPU needed
//
// One block computes one 128 x 128 tile of C, named by a descriptor (expert, row0, rows, col0) of
// the flat tile list (python/moe_gemm/model/tiles.py). Per K step of BK = 64 the producer asks TMA for
//   A     rows row0 .. row0+127, columns k .. k+63        one 2-D box, 128 x 128 B  = 16 KB
//   B[e]  rows k .. k+63, columns col0 .. col0+63         one 3-D box,  64 x 128 B  =  8 KB
//   B[e]  rows k .. k+63, columns col0+64 .. col0+127     one 3-D box,  64 x 128 B  =  8 KB
// (the last copy is skipped when col0+64 >= N) and the compute warps multiply them. The 128-byte
// swizzle caps a box's inner extent at 128 bytes (64 bf16), which is why BK is 64 and B comes in
// two 64-column panels.
//
// NVRTC compiles this file with no CUDA headers: bf16 values are unsigned short, the instructions
// are the inline-PTX wrappers of ptx.cuh, and CUtensorMap is declared there.
#include "ptx.cuh"

namespace k2 {

// --8<-- [start:config]
constexpr int BM = 128;                 // tile rows (one expert's rows, at most)
constexpr int BN = 128;                 // tile columns
constexpr int BK = 64;                  // K per stage: 64 bf16 = 128 B = one swizzle row
constexpr int PANEL_N = 64;             // B arrives as two panels of 64 columns (128 B rows)
constexpr int COMPUTE_WARPS = 8;        // 2 x 4 warps, each owning a 64 x 32 piece of the tile
constexpr int PRODUCER_WARP = COMPUTE_WARPS;
constexpr int THREADS = (COMPUTE_WARPS + 1) * 32;  // 288: the ninth warp only issues TMA

constexpr unsigned A_BYTES = BM * BK * 2;                  // 16,384
constexpr unsigned PANEL_BYTES = BK * PANEL_N * 2;         //  8,192
constexpr unsigned STAGE_BYTES = A_BYTES + 2 * PANEL_BYTES;  // 32,768, a stage's expect_tx
// The 128-byte swizzle pattern repeats every 8 rows x 128 B = 1 KB and is computed from the
// shared-memory address bits, so every box must start on a 1,024-byte boundary (PTX ISA
// #tensor-swizzling-modes: "swizzle base offset is 0" only at that boundary). Stage sizes are
// multiples of 1 KB; only the dynamic region's start needs aligning, which costs up to 1 KB.
constexpr unsigned SWIZZLE_ALIGN = 1024;

// Blocks per SM to build for, passed to ptxas as __launch_bounds__'s minimum. Registers cannot
// allow a third 9-warp block (that needs <= 72 registers; the 64 fp32 accumulators alone take 64), and
// shared memory allows 3 / 2 / 1 blocks of a 2 / 3 / 4-stage ring (65 / 97 / 129 KB of 228). So
// STAGES 2 and 3 ask for two blocks, which caps ptxas at 112 registers; STAGES 4 fits only one
// block anyway, and asking for one lets ptxas spend registers on loading fragments early.
template <int STAGES>
struct Residency {
    static constexpr int blocks = STAGES <= 3 ? 2 : 1;
};
// --8<-- [end:config]

// B's two panels make up the tile's columns. The host requests STAGES * STAGE_BYTES +
// SWIZZLE_ALIGN bytes of dynamic shared memory (python/moe_gemm/variants/k2/__init__.py).
static_assert(BN == 2 * PANEL_N, "two 64-column B panels per stage");
static_assert(STAGE_BYTES % SWIZZLE_ALIGN == 0, "every stage and panel starts on a 1 KB boundary");

// --8<-- [start:swizzle]
// Byte offset, inside a box written by TMA with CU_TENSOR_MAP_SWIZZLE_128B, of the 16-byte chunk
// `chunk` (0..7) of row `row`. Rows are 128 bytes; the chunk's physical slot is its logical index
// XOR the row's position in its 8-row group (PTX ISA #tensor-swizzling-modes, 128-byte mode).
// Eight lanes of an ldmatrix read the same logical chunk of eight consecutive rows: the XOR sends
// them to eight different slots, i.e. eight different groups of four banks, with no padding.
__device__ __forceinline__ unsigned swizzle_128b(int row, int chunk) {
    return static_cast<unsigned>(row * 128 + ((chunk ^ (row & 7)) << 4));
}
// --8<-- [end:swizzle]

}  // namespace k2

// --8<-- [start:kernel]
template <int STAGES>
__global__ void __launch_bounds__(k2::THREADS, k2::Residency<STAGES>::blocks)
k2_tma_ws(const __grid_constant__ CUtensorMap tmap_a,  // A [M_tot, K]: dims {K, M_tot}, box {64, 128}
          const __grid_constant__ CUtensorMap tmap_b,  // B [E, K, N]: dims {N, K, E}, box {64, 64, 1}
          unsigned short* __restrict__ C,              // [M_tot, N] bf16
          const int4* __restrict__ tiles,              // one (expert, row0, rows, col0) per block
          int K, int N) {
    using namespace k2;
    static_assert(STAGES >= 2 && STAGES <= 4, "STAGES must be 2, 3 or 4");

    // full[s]: the producer's arrive.expect_tx plus TMA's bytes complete it (1 arrival + 32 KB).
    // empty[s]: one arrival per compute warp once it has read stage s (8 arrivals).
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + SWIZZLE_ALIGN - 1) & ~(SWIZZLE_ALIGN - 1);

    const int4 tile = tiles[blockIdx.x];  // .x expert, .y row0, .z rows, .w col0
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int k_steps = K / BK;           // the host checked K % 64 == 0

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), COMPUTE_WARPS);
        }
        fence_barrier_init();
    }
    __syncthreads();  // the last block-wide barrier: from here on, warps meet only at mbarriers
// --8<-- [end:kernel]

    // --8<-- [start:producer]
    if (warp == PRODUCER_WARP) {
        if (lane == 0) {
            tma_prefetch_descriptor(&tmap_a);
            tma_prefetch_descriptor(&tmap_b);
            // A last N tile whose second panel would start at or past column N skips that copy: the
            // panel's stale shared memory then feeds only accumulators of columns >= N, which the
            // epilogue never stores (an mma column depends on its own B column alone).
            const bool second_panel = tile.w + PANEL_N < N;
            // The full box's bytes, always, even when part of a box lies outside the tensor (rows
            // past M_tot, columns past N): out-of-bound elements are written to shared memory as
            // zeros (PTX ISA #tensor-tiled-mode-oob-access), so TMA delivers, and its complete-tx
            // counts, every byte of every box. Expecting fewer bytes would let the phase complete
            // early; expecting more would hang the block.
            const unsigned stage_tx = second_panel ? STAGE_BYTES : STAGE_BYTES - PANEL_BYTES;
            int stage = 0;
            unsigned phase = 0;  // flips each time the ring wraps
            for (int ks = 0; ks < k_steps; ++ks) {
                // Wait until the compute warps have released this slot's previous contents. On the
                // first pass round the ring, parity phase^1 = 1 names the phase "before" phase 0 of
                // a fresh barrier, which counts as complete: no wait.
                mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
                const unsigned bar = smem_u32(&full[stage]);
                mbarrier_arrive_expect_tx(bar, stage_tx);
                const unsigned a_dst = ring + stage * STAGE_BYTES;
                const int k = ks * BK;
                // Coordinates innermost first. A's box may run past this expert's rows into the
                // next expert (rows < 128) and past M_tot (zero-filled): the epilogue's row guard
                // discards those rows, but their multiply-adds are done all the same.
                tma_load_2d(a_dst, &tmap_a, k, tile.y, bar);
                tma_load_3d(a_dst + A_BYTES, &tmap_b, tile.w, k, tile.x, bar);
                if (second_panel)
                    tma_load_3d(a_dst + A_BYTES + PANEL_BYTES, &tmap_b, tile.w + PANEL_N, k, tile.x, bar);
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;  // lanes 1-31 have nothing to do; no block-wide barrier follows
    }
    // --8<-- [end:producer]

    // --8<-- [start:consumer]
    // Compute warps: warp (wm, wn) owns rows wm*64 .. +63 and columns wn*32 .. +31 of the tile,
    // i.e. 4 x 4 mma tiles of 16 x 8, 64 fp32 accumulators per lane.
    const int wm = warp / 4;
    const int wn = warp % 4;
    float acc[4][4][4] = {};

    // ldmatrix.x4 addresses. Lane l points at row (l & 15) of a 16-row block and at 16-byte chunk
    // (l >> 4) of a 16-element column pair; each address is k2::swizzle_128b(row, chunk). Every
    // block starts on a multiple of 8 rows, so row & 7 == l & 7 for every row this lane touches:
    // the XOR term is one per-lane constant and the row term folds into immediate offsets.
    const int lane_row = lane & 15;
    const int lane_chunk = lane >> 4;
    const int lane_xor = lane & 7;
    // A (128 rows x 128 B): rows wm*64 + 16*i + lane_row, chunk 2*kk + lane_chunk.
    const unsigned a_row = (wm * 64 + lane_row) * 128;
    // B panel wn/2 (64 k-rows x 128 B) holds this warp's 32 columns in chunks (wn%2)*4 .. +3:
    // k-rows 16*kk + lane_row, chunk (wn%2)*4 + 2*p + lane_chunk for column pair p.
    const unsigned b_row = A_BYTES + (wn / 2) * PANEL_BYTES + lane_row * 128;
    const int b_chunk = (wn % 2) * 4 + lane_chunk;

    int stage = 0;
    unsigned phase = 0;
    for (int ks = 0; ks < k_steps; ++ks) {
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // every byte of the stage has landed
        const unsigned a_base = ring + stage * STAGE_BYTES;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[4][4], b[2][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)  // 16 rows x 16 k as stored: the row-major A fragment
                ldmatrix_x4(a[i], a_base + a_row + i * 16 * 128 + (((2 * kk + lane_chunk) ^ lane_xor) << 4));
#pragma unroll
            for (int p = 0; p < 2; ++p)  // 16 k x 16 n, transposed: the "col" B fragments of two n8 tiles
                ldmatrix_x4_trans(b[p], a_base + b_row + kk * 16 * 128 + (((b_chunk + 2 * p) ^ lane_xor) << 4));
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    // b[p] = {k0-7 of n8 tile 2p, k8-15 of 2p, k0-7 of 2p+1, k8-15 of 2p+1}
                    const unsigned frag_b[2] = {b[j / 2][(j % 2) * 2], b[j / 2][(j % 2) * 2 + 1]};
                    mma_bf16_16816(acc[i][j], a[i], frag_b);
                }
            }
        }
        // All 32 lanes have issued their last ldmatrix of this stage and consumed the results
        // (the mma above read them); __syncwarp orders every lane's reads before lane 0's release
        // arrive, and the producer's acquire-wait on empty[] orders them before TMA overwrites.
        __syncwarp();
        if (lane == 0) mbarrier_arrive(smem_u32(&empty[stage]));
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    // --8<-- [end:consumer]

    // --8<-- [start:epilogue]
    // Register-direct epilogue: lane (g = lane/4, t = lane%4) holds D[g][2t..2t+1] and
    // D[g+8][2t..2t+1] of each 16 x 8 tile; each pair is rounded to bf16x2 and stored as one
    // 32-bit word. Rows at or past tile.z belong to the next expert (or lie past M_tot) and are
    // dropped; columns at or past N likewise (N % 8 == 0 and the column is even, so a pair is
    // either wholly inside or wholly outside).
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = wm * 64 + i * 16 + half * 8 + g;
            if (row >= tile.z) continue;
            unsigned short* c_row = C + static_cast<long long>(tile.y + row) * N;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = tile.w + wn * 32 + j * 8 + 2 * t;
                if (col < N)
                    *reinterpret_cast<unsigned*>(c_row + col) =
                        pack_bf16x2(acc[i][j][2 * half], acc[i][j][2 * half + 1]);
            }
        }
    }
    // --8<-- [end:epilogue]
}
