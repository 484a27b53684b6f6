// k4_tcgen05.cu: chapter 05's kernel, for Blackwell (sm_100a, and sm_103a for the B300). The TMA
// producer and the 128-byte-swizzled ring are chapter 04's; what changes is who multiplies and
// where the sum lives. One thread issues tcgen05.mma from shared-memory descriptors, and the
// 128 x BN fp32 accumulator lives in tensor memory (TMEM), not in registers. Four epilogue warps
// read it back with tcgen05.ld, round it to bf16 and store it behind the row guard.
//
//   python chapters/05/run.py              # checks and times it on compute capability 10.x;
//                                          # elsewhere compiles it and prints the compile report
//   pytest tests/test_k4.py                # compiles every configuration for sm_100a and sm_103a
//
// Warp roles of one 192-thread block:
//   warps 0-3  epilogue: warp w owns TMEM lanes 32w .. 32w+31, i.e. rows 32w .. 32w+31 of a tile
//              (a warp may only read the lane quarter w % 4; here w < 4, so the quarter is w)
//   warp 4     producer: lane 0 issues every TMA copy, exactly as k3's producer does
//   warp 5     MMA: lane 0 issues every tcgen05.mma and tcgen05.commit; the whole warp allocates
//              and frees the tensor memory
//
// Barriers (all mbarriers in shared memory):
//   full[s]        producer's arrive.expect_tx + TMA bytes   -> MMA thread may read stage s
//   empty[s]       tcgen05.commit after the stage's MMAs    -> producer may refill stage s
//   tmem_full[b]   tcgen05.commit after a tile's last MMA   -> epilogue may read accumulator b
//   tmem_empty[b]  one arrival per epilogue warp            -> MMA thread may overwrite b
//
// The block is persistent over the flat tile list (block b takes tiles b, b + gridDim.x, ...), and
// the accumulator is double-buffered in TMEM: tile i accumulates in buffer i % 2, so the MMAs of
// tile i+1 run while the epilogue drains tile i.
#include "ptx.cuh"

namespace k4 {

// --8<-- [start:config]
constexpr int BM = 128;         // the MMA's M: row r of the tile is TMEM lane r (PTX ISA "Data path
                                // layout organization", layout D, #tcgen05-data-path-layout-d)
constexpr int BK = 64;          // K per stage: 64 bf16 = 128 B = one swizzle row, as in k3
constexpr int UMMA_K = 16;      // K of one tcgen05.mma for 16-bit inputs (32 bytes of K)
constexpr int BOX = 64;         // B arrives in 64 x 64 boxes, as in k3
constexpr unsigned BOX_BYTES = BOX * BK * 2;  // 8,192
constexpr unsigned SWIZZLE_ALIGN = 1024;      // the 128-byte swizzle repeats every 8 x 128 B
constexpr int EPILOGUE_WARPS = 4;             // one per TMEM lane quarter: 4 x 32 = BM lanes
constexpr int PRODUCER_WARP = 4;
constexpr int MMA_WARP = 5;
constexpr int THREADS = 6 * 32;
constexpr int ACCUMULATORS = 2;               // TMEM buffers: the epilogue of tile i overlaps tile i+1
constexpr int CHUNK = 32;                     // columns per tcgen05.ld (.32x32b.x32: 32 registers)

// The descriptors' constant fields and k16 steps come from the host as an OperandPlan (ptx.cuh),
// built by moe_gemm.variants.k4.tcgen05.smem_plan so that the descriptors the GPU runs are the ones CI
// interprets; mn64_bytes is not read here, because one tcgen05.mma covers all 128 rows and all
// BN columns of the tile.

// Tensor memory is allocated in powers of two columns, at least 32.
__host__ __device__ constexpr int tmem_columns(int used) {
    int columns = 32;
    while (columns < used) columns *= 2;
    return columns;
}

template <int BN, int STAGES>
struct Config {
    // tcgen05.mma with M = 128 takes N in [16, 256] in steps of 16 (PTX ISA "Matrix shape",
    // #tcgen05-matrix-shape); B's 64-column boxes make BN a multiple of 64 on top of that.
    static_assert(BN % BOX == 0 && BN >= 64 && BN <= 256, "BN is 64, 128, 192 or 256 columns");
    static_assert(STAGES >= 2, "a ring of at least two stages");
    static constexpr int B_BOXES = BN / BOX;
    static constexpr unsigned A_BYTES = BM * BK * 2;
    static constexpr unsigned B_BYTES = BN * BK * 2;
    static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
    // BN fp32 columns per accumulator: 2 x 192 = 384 rounds up to 512, the whole of TMEM.
    static constexpr int TMEM_COLUMNS = tmem_columns(ACCUMULATORS * BN);
    static_assert(TMEM_COLUMNS <= 512, "two accumulators must fit the 512 TMEM columns");
    static_assert(STAGE_BYTES % SWIZZLE_ALIGN == 0, "every stage and box starts on a 1 KB boundary");
};
// --8<-- [end:config]

// --8<-- [start:producer]
// Lane 0 of the producer warp: k3's producer without the cluster. After its last tile it waits
// once more on every stage, for the tcgen05.commit that releases the stage's last use: a commit
// arrives asynchronously, when the MMAs finish, and must not land after the block has exited.
template <class Cfg, int STAGES, bool B_K_MAJOR>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, const int4* tiles,
                                        int num_tiles, int k_steps, int N, unsigned ring,
                                        unsigned long long* full, unsigned long long* empty) {
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_b);
    int stage = 0;
    unsigned phase = 0;
    auto advance = [&] {
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    };
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        const int4 tile = tiles[t];  // .x expert, .y row0, .z rows, .w col0
        // Boxes starting at or past column N are skipped: their stale bytes feed only
        // accumulator columns >= N, which the epilogue never stores.
        const int boxes = min(Cfg::B_BOXES, (N - tile.w + BOX - 1) / BOX);
        const unsigned stage_tx = Cfg::A_BYTES + boxes * BOX_BYTES;
        for (int ks = 0; ks < k_steps; ++ks, advance()) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, stage_tx);
            const unsigned a_dst = ring + stage * Cfg::STAGE_BYTES;
            const int k = ks * BK;
            tma_load_2d(a_dst, tmap_a, k, tile.y, bar);  // rows past the expert: dropped by the row guard
            for (int box = 0; box < boxes; ++box) {
                const int n = tile.w + box * BOX;
                // B [E, K, N]: coordinates (n, k, e); B^T [E, N, K]: (k, n, e).
                tma_load_3d(a_dst + Cfg::A_BYTES + box * BOX_BYTES, tmap_b, B_K_MAJOR ? k : n, B_K_MAJOR ? n : k,
                            tile.x, bar);
            }
        }
    }
    for (int s = 0; s < STAGES; ++s, advance())
        mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
}
// --8<-- [end:producer]

// --8<-- [start:mma]
// Lane 0 of the MMA warp. Per tile: wait until the epilogue has emptied accumulator b, then per
// K step wait for the stage, issue BK / 16 = 4 MMAs on it and commit them to empty[s], which
// frees the stage once the tensor core has read it. After the tile's last step, one more commit
// tells the epilogue that accumulator b is complete.
template <class Cfg, int STAGES, int BN>
__device__ __forceinline__ void issue_mmas(int num_tiles, int k_steps, unsigned ring, const OperandPlan& plan_a,
                                           const OperandPlan& plan_b, unsigned idesc, unsigned tmem_base,
                                           unsigned long long* full, unsigned long long* empty,
                                           unsigned long long* tmem_full, unsigned long long* tmem_empty) {
    int stage = 0;
    unsigned phase = 0;
    int local = 0;  // tiles this block has taken so far
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x, ++local) {
        const int b = local % ACCUMULATORS;
        mbarrier_wait_parity(smem_u32(&tmem_empty[b]), ((local / ACCUMULATORS) & 1) ^ 1);
        tcgen05_fence_after_thread_sync();  // the epilogue's tcgen05.ld of buffer b come first
        const unsigned d_tmem = tmem_base + b * BN;  // column offset; lane 0
        for (int ks = 0; ks < k_steps; ++ks) {
            mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // TMA's bytes have landed
            tcgen05_fence_after_thread_sync();
            const unsigned a_tile = ring + stage * Cfg::STAGE_BYTES;
            const unsigned b_tile = a_tile + Cfg::A_BYTES;
#pragma unroll
            for (int kk = 0; kk < BK / UMMA_K; ++kk) {
                const unsigned long long desc_a = matrix_descriptor(plan_a.bits, a_tile + kk * plan_a.k16_bytes);
                const unsigned long long desc_b = matrix_descriptor(plan_b.bits, b_tile + kk * plan_b.k16_bytes);
                tcgen05_mma_bf16(d_tmem, desc_a, desc_b, idesc, ks > 0 || kk > 0);
            }
            tcgen05_commit(smem_u32(&empty[stage]));
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        tcgen05_commit(smem_u32(&tmem_full[b]));
    }
}
// --8<-- [end:mma]

// --8<-- [start:epilogue]
// Epilogue warp w: thread t holds row 32w + t of every tile. Per tile it waits for accumulator b,
// reads it 32 columns at a time (32 registers, not BN), rounds pairs to bf16x2 and stores eight
// columns (16 bytes) per store. Rows at or past tile.z belong to the next expert (or lie past
// M_tot) and are dropped; so are columns at or past N (N % 8 == 0, so an 8-column group is wholly
// inside or outside). tcgen05.ld is warp-wide, so the loop bound on columns is warp-uniform and
// only the stores are guarded per thread.
template <int BN>
__device__ __forceinline__ void store_tiles(const int4* tiles, int num_tiles, unsigned short* __restrict__ C, int N,
                                            unsigned tmem_base, unsigned long long* tmem_full,
                                            unsigned long long* tmem_empty) {
    const int warp = threadIdx.x / 32;
    const int row = warp * 32 + threadIdx.x % 32;
    int local = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x, ++local) {
        const int4 tile = tiles[t];
        const int b = local % ACCUMULATORS;
        mbarrier_wait_parity(smem_u32(&tmem_full[b]), (local / ACCUMULATORS) & 1);
        tcgen05_fence_after_thread_sync();  // the MMAs' writes to buffer b come first
        const unsigned taddr = tmem_base + (static_cast<unsigned>(warp * 32) << 16) + b * BN;
        const int columns = min(BN, N - tile.w);
        unsigned short* c_row = C + static_cast<long long>(tile.y + row) * N + tile.w;
#pragma unroll
        for (int c = 0; c < BN; c += CHUNK) {
            if (c >= columns) break;
            __syncwarp();  // tcgen05.ld is .sync.aligned: the whole warp, converged
            float v[CHUNK];
            tmem_load_32x32b_x32(v, taddr + c);
            if (row >= tile.z) continue;
#pragma unroll
            for (int j = 0; j < CHUNK; j += 8) {
                if (c + j < columns)
                    *reinterpret_cast<uint4*>(c_row + c + j) =
                        uint4{pack_bf16x2(v[j], v[j + 1]), pack_bf16x2(v[j + 2], v[j + 3]),
                              pack_bf16x2(v[j + 4], v[j + 5]), pack_bf16x2(v[j + 6], v[j + 7])};
            }
        }
        // Every tcgen05.ld of buffer b has completed (the wait is in the load); hand b back.
        tcgen05_fence_before_thread_sync();
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbarrier_arrive(smem_u32(&tmem_empty[b]));
    }
}
// --8<-- [end:epilogue]

// --8<-- [start:body]
template <int BN, int STAGES, bool B_K_MAJOR>
__device__ __forceinline__ void k4_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, unsigned short* C,
                                        const int4* tiles, int num_tiles, int K, int N, const OperandPlan& plan_a,
                                        const OperandPlan& plan_b, unsigned idesc) {
    using Cfg = Config<BN, STAGES>;
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    __shared__ alignas(8) unsigned long long tmem_full[ACCUMULATORS];
    __shared__ alignas(8) unsigned long long tmem_empty[ACCUMULATORS];
    __shared__ unsigned tmem_base_slot;  // tcgen05.alloc writes the TMEM address here
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + SWIZZLE_ALIGN - 1) & ~(SWIZZLE_ALIGN - 1);
    const int warp = threadIdx.x / 32;
    const int k_steps = K / BK;  // the host checked K % 64 == 0

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), 1);  // one tcgen05.commit per use
        }
        for (int b = 0; b < ACCUMULATORS; ++b) {
            mbarrier_init(smem_u32(&tmem_full[b]), 1);
            mbarrier_init(smem_u32(&tmem_empty[b]), EPILOGUE_WARPS);
        }
        fence_barrier_init();
    }
    if (warp == MMA_WARP) {
        tmem_alloc<Cfg::TMEM_COLUMNS>(smem_u32(&tmem_base_slot));
        tmem_relinquish_alloc_permit();
    }
    // The allocation's write of tmem_base_slot, and the barriers, reach every warp through this
    // barrier; the fences order the allocation itself around it.
    tcgen05_fence_before_thread_sync();
    __syncthreads();
    tcgen05_fence_after_thread_sync();
    const unsigned tmem_base = tmem_base_slot;

    if (warp == PRODUCER_WARP) {
        if (threadIdx.x % 32 == 0)
            produce<Cfg, STAGES, B_K_MAJOR>(tmap_a, tmap_b, tiles, num_tiles, k_steps, N, ring, full, empty);
    } else if (warp == MMA_WARP) {
        if (threadIdx.x % 32 == 0)
            issue_mmas<Cfg, STAGES, BN>(num_tiles, k_steps, ring, plan_a, plan_b, idesc, tmem_base, full, empty,
                                        tmem_full, tmem_empty);
    } else {
        store_tiles<BN>(tiles, num_tiles, C, N, tmem_base, tmem_full, tmem_empty);
    }

    // Every MMA has completed (the epilogue waited for the last commit) and every tcgen05.ld has
    // returned; the warp that allocated the columns frees them.
    tcgen05_fence_before_thread_sync();
    __syncthreads();
    if (warp == MMA_WARP) {
        __syncwarp();  // tcgen05.dealloc is .sync.aligned; lane 0 took the long branch above
        tcgen05_fence_after_thread_sync();
        tmem_dealloc<Cfg::TMEM_COLUMNS>(tmem_base);
    }
}
// --8<-- [end:body]

}  // namespace k4

// --8<-- [start:kernel]
// One block per SM: the ring takes most of shared memory, and __launch_bounds__(192, 1) leaves
// ptxas the full register budget (the epilogue needs 32 accumulator registers, not BN).
template <int BN, int STAGES, bool B_K_MAJOR>
__global__ void __launch_bounds__(k4::THREADS, 1)
k4_tcgen05(const __grid_constant__ CUtensorMap tmap_a,  // A [M_tot, K]: dims {K, M_tot}, box {64, 128}
           const __grid_constant__ CUtensorMap tmap_b,  // B [E, K, N]: {N, K, E}; B^T [E, N, K]: {K, N, E}
           unsigned short* __restrict__ C,              // [M_tot, N] bf16
           const int4* __restrict__ tiles,              // (expert, row0, rows, col0) per tile
           int num_tiles, int K, int N, const OperandPlan plan_a, const OperandPlan plan_b,
           unsigned idesc) {                            // tcgen05 instruction descriptor (host-built)
    k4::k4_body<BN, STAGES, B_K_MAJOR>(&tmap_a, &tmap_b, C, tiles, num_tiles, K, N, plan_a, plan_b, idesc);
}
// --8<-- [end:kernel]
