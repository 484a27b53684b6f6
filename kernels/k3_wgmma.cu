// k3_wgmma.cu: chapter 04's kernel. TMA fills a 128-byte-swizzled ring as in k2, but the
// consumers are warpgroups that multiply straight out of shared memory with wgmma.mma_async,
// reading A and B through matrix descriptors: no ldmatrix, no fragment registers.
//
//   python chapters/04/run.py              # check, time and compare (needs an sm_90a GPU)
//   pytest tests/test_k3.py                # compiles every variant for sm_90a, no GPU needed
//
// The ladder of chapter 04 is this one template, one step per parameter:
//   CONSUMERS = 1   (a) one consumer warpgroup (two m64 wgmmas per k16 step) and a producer warp
//   CONSUMERS = 2   (b) two consumer warpgroups, the producer a warpgroup of its own whose
//                       registers setmaxnreg hands to the consumers
//   grid < tiles    (c) persistent: the host launches one block per SM and each block walks the
//                       flat tile list with a stride, so the producer loads the next tile while
//                       the consumers store this one (a launch choice, not a parameter)
//   CLUSTER = 2     (d) two blocks of a cluster take two M tiles of one expert and N column, and
//                       each loads half of B for both (TMA multicast)
// BN (128, 192, 256) is chosen for N as BM is for m_e; B_K_MAJOR reads B^T [E, N, K] instead of
// B [E, K, N] (the descriptors differ, the math does not).
//
// Per K step of BK = 64 one stage holds
//   A     rows row0 .. row0+BM-1, 64 of K          one 2-D box,  BM x 128 B
//   B[e]  64 of K x BN columns                     BN/64 boxes of 64 x 64 bf16 (8 KB each)
// and the descriptors the consumers build from its address are checked, for every k16 step, by
// the numpy descriptor interpreter in python/moe_gemm/descriptors.py (tests/test_descriptors.py).
#include "ptx.cuh"

namespace k3 {

// --8<-- [start:config]
constexpr int BK = 64;                  // K per stage: 64 bf16 = 128 B = one swizzle row
constexpr int BOX = 64;                 // B arrives in boxes of 64 x 64 (one 128-byte row wide)
constexpr unsigned BOX_BYTES = BOX * BK * 2;   // 8,192
constexpr unsigned SWIZZLE_ALIGN = 1024;       // the 128-byte swizzle repeats every 8 x 128 B
constexpr int WARPGROUP = 128;

// The descriptors' constant fields come from the host as an OperandPlan (ptx.cuh): LBO, SBO and
// the swizzle of A and of B, and the address steps between their 64-blocks and k16 steps.

template <int BM, int BN, int CONSUMERS, int STAGES, int CLUSTER, bool B_K_MAJOR, bool TMA_STORE>
struct Config {
    static_assert(BM == 64 || BM == 128, "BM is 64 or 128 rows");
    static_assert(BN % BOX == 0 && BN <= 256, "BN is 64, 128, 192 or 256 columns");
    static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two blocks");
    // Consumer warpgroups split the tile by rows while each gets a 64-row slice, else by columns.
    static constexpr int WG_M = BM / 64 >= CONSUMERS ? CONSUMERS : 1;
    static constexpr int WG_N = CONSUMERS / WG_M;
    static constexpr int WG_ROWS = BM / WG_M;
    static constexpr int WG_COLS = BN / WG_N;   // the wgmma's N
    static constexpr int M_ITERS = WG_ROWS / 64;  // m64 wgmmas per k16 step per warpgroup
    static_assert(WG_COLS % BOX == 0, "a warpgroup's columns start on a 64-column box");
    // A lone consumer warpgroup leaves room for no second warpgroup of registers: its producer is
    // one warp. Two consumers get a producer warpgroup, so setmaxnreg can move its registers.
    static constexpr bool PRODUCER_WARPGROUP = CONSUMERS == 2;
    static constexpr int THREADS = CONSUMERS * WARPGROUP + (PRODUCER_WARPGROUP ? WARPGROUP : 32);
    // 384 threads start at 65,536 / 384 = 168 registers each. The producer keeps 40 (one thread
    // issues TMA; the rest idle) and the consumers take 232: 2 x 128 x 232 + 128 x 40 = 64,512.
    static constexpr int PRODUCER_REGS = 40;
    static constexpr int CONSUMER_REGS = 232;
    // Two 160-thread blocks fit an SM by registers (M_ITERS x WG_COLS / 2 = 128 accumulators per
    // thread); a 384-thread block takes all of them.
    static constexpr int MIN_BLOCKS = PRODUCER_WARPGROUP ? 1 : 2;
    static constexpr unsigned A_BYTES = BM * BK * 2;
    static constexpr unsigned B_BYTES = BN * BK * 2;
    static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int B_BOXES = BN / BOX;
    // The TMA-store epilogue stages each warpgroup's WG_ROWS x WG_COLS slice of C in shared
    // memory after the ring, as 64 x 64 boxes with the 128-byte swizzle (8 KB each).
    static constexpr unsigned WG_STAGING_BYTES = WG_ROWS * WG_COLS * 2;
    static constexpr unsigned STAGING_BYTES = TMA_STORE ? CONSUMERS * WG_STAGING_BYTES : 0;
    // empty[s] completes when every consumer warpgroup of every block of the cluster has
    // released stage s: with multicast, either block's producer writes into both blocks' rings.
    static constexpr int EMPTY_ARRIVALS = CONSUMERS * CLUSTER;
    static_assert(STAGE_BYTES % SWIZZLE_ALIGN == 0, "every stage and box starts on a 1 KB boundary");
};
// --8<-- [end:config]

// --8<-- [start:producer]
// One thread of the producer issues every copy. For each tile it walks the K steps; per step it
// waits for the stage to be released, announces the bytes the stage will receive, and asks TMA
// for A's box and B's boxes.
template <class Cfg, int STAGES, int CLUSTER, bool B_K_MAJOR>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, const int4* tiles,
                                        int units, int first, int stride, unsigned rank, int k_steps, int N,
                                        unsigned ring, unsigned long long* full, unsigned long long* empty) {
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_b);
    int stage = 0;
    unsigned phase = 0;
    for (int unit = first; unit < units; unit += stride) {
        const int4 tile = tiles[unit * CLUSTER + rank];  // .x expert, .y row0, .z rows, .w col0
        // Two blocks on the same expert and N column share B: each loads half of its boxes for
        // both. A pair of lone M tiles from different experts or columns loads its own.
        bool multicast = false;
        if constexpr (CLUSTER == 2) {
            const int4 peer = tiles[unit * CLUSTER + (rank ^ 1)];
            multicast = peer.x == tile.x && peer.w == tile.w;
        }
        // Boxes that start at or past column N are skipped: their stale shared memory feeds only
        // accumulators of columns >= N, which the epilogue never stores. Every other box counts
        // in full, its out-of-bounds part included (TMA writes zeros there).
        const int boxes = min(Cfg::B_BOXES, (N - tile.w + BOX - 1) / BOX);
        const unsigned stage_tx = Cfg::A_BYTES + boxes * BOX_BYTES;
        for (int ks = 0; ks < k_steps; ++ks) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, stage_tx);
            const unsigned a_dst = ring + stage * Cfg::STAGE_BYTES;
            const int k = ks * BK;
            // A's box may run past this expert into the next one (rows >= tile.z) or past M_tot
            // (zeros): the epilogue's row guard drops those rows.
            tma_load_2d(a_dst, tmap_a, k, tile.y, bar);
            for (int box = 0; box < boxes; ++box) {
                const unsigned b_dst = a_dst + Cfg::A_BYTES + box * BOX_BYTES;
                const int n = tile.w + box * BOX;
                // B [E, K, N]: coordinates (n, k, e); B^T [E, N, K]: (k, n, e).
                const int c0 = B_K_MAJOR ? k : n, c1 = B_K_MAJOR ? n : k;
                if (multicast) {
                    if (box % CLUSTER == static_cast<int>(rank))
                        tma_load_3d_multicast(b_dst, tmap_b, c0, c1, tile.x, bar, (1u << CLUSTER) - 1);
                } else {
                    tma_load_3d(b_dst, tmap_b, c0, c1, tile.x, bar);
                }
            }
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}
// --8<-- [end:producer]

// --8<-- [start:release]
// A consumer warpgroup hands stage s back: one thread arrives on empty[s] of every block in the
// cluster (its own included), since either block's producer may refill s in both.
template <int CLUSTER>
__device__ __forceinline__ void release(unsigned long long* empty, int stage) {
    if (threadIdx.x % WARPGROUP != 0) return;
    if constexpr (CLUSTER == 1) {
        mbarrier_arrive(smem_u32(&empty[stage]));
    } else {
#pragma unroll
        for (unsigned peer = 0; peer < CLUSTER; ++peer)
            mbarrier_arrive_cluster(map_to_rank(smem_u32(&empty[stage]), peer));
    }
}
// --8<-- [end:release]

// --8<-- [start:consumer]
// A consumer warpgroup's share of one tile: WG_ROWS x WG_COLS, M_ITERS m64 slices.
template <class Cfg, int STAGES, int CLUSTER, bool B_K_MAJOR>
__device__ __forceinline__ void multiply_tile(float (&acc)[Cfg::M_ITERS][Cfg::WG_COLS / 2], int k_steps,
                                              int wg_m, int wg_n, unsigned ring, const OperandPlan& plan_a,
                                              const OperandPlan& plan_b, unsigned long long* full,
                                              unsigned long long* empty, int& stage, unsigned& phase) {
    int previous = -1;
    for (int ks = 0; ks < k_steps; ++ks) {
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // every byte of the stage has landed
        const unsigned a_tile = ring + stage * Cfg::STAGE_BYTES + wg_m * Cfg::M_ITERS * plan_a.mn64_bytes;
        const unsigned b_tile = ring + stage * Cfg::STAGE_BYTES + Cfg::A_BYTES
                              + wg_n * (Cfg::WG_COLS / BOX) * plan_b.mn64_bytes;
        wgmma_fence();  // the epilogue (or the zero-init) touched the accumulators since the last wgmma
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const unsigned long long desc_b = matrix_descriptor(plan_b.bits, b_tile + kk * plan_b.k16_bytes);
#pragma unroll
            for (int i = 0; i < Cfg::M_ITERS; ++i) {
                const unsigned long long desc_a =
                    matrix_descriptor(plan_a.bits, a_tile + i * plan_a.mn64_bytes + kk * plan_a.k16_bytes);
                wgmma_bf16<Cfg::WG_COLS, false, !B_K_MAJOR>(acc[i], desc_a, desc_b, ks > 0 || kk > 0);
            }
        }
        wgmma_commit();
        // Keep this step's group running and wait for the previous one: once it is done, nothing
        // reads the previous stage any more, so it goes back to the producer while the tensor
        // cores work on this one.
        wgmma_wait<1>();
        if (previous >= 0) release<CLUSTER>(empty, previous);
        previous = stage;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    if (previous >= 0) release<CLUSTER>(empty, previous);
}
// --8<-- [end:consumer]

// --8<-- [start:epilogue]
// Register-direct epilogue, as in k1 and k2: the wgmma accumulator layout (ptx.cuh, wgmma_bf16)
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
    constexpr int BOXES = Cfg::WG_COLS / BOX;
    const bool issuer = threadIdx.x % WARPGROUP == 0;
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x % WARPGROUP) / 32;
    if (issuer) bulk_wait_read<0>();  // the previous tile's stores have finished reading the boxes
    named_barrier_sync(1 + warpgroup, WARPGROUP);
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
            stmatrix_x4(box + row * 128 + ((chunk ^ (row % 8)) << 4), fragment);
        }
    }
    fence_proxy_async_shared();  // the generic-proxy writes above, before TMA (async proxy) reads them
    named_barrier_sync(1 + warpgroup, WARPGROUP);
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

// --8<-- [start:body]
template <int BM, int BN, int CONSUMERS, int STAGES, int CLUSTER, bool B_K_MAJOR, bool TMA_STORE>
__device__ __forceinline__ void k3_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b,
                                        const CUtensorMap* tmap_c, unsigned short* C, const int4* tiles,
                                        int num_tiles, int K, int N, const OperandPlan& plan_a,
                                        const OperandPlan& plan_b) {
    using Cfg = Config<BM, BN, CONSUMERS, STAGES, CLUSTER, B_K_MAJOR, TMA_STORE>;
    // full[s]: the producer's arrive.expect_tx plus TMA's bytes complete it (1 arrival).
    // empty[s]: one arrival per consumer warpgroup of each block in the cluster.
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + SWIZZLE_ALIGN - 1) & ~(SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;  // C boxes (TMA_STORE only)

    const int warpgroup = threadIdx.x / WARPGROUP;
    const int k_steps = K / BK;  // the host checked K % 64 == 0
    // The tile list holds CLUSTER tiles per unit of work, one per block of a cluster; blocks (or
    // clusters) take units first, first + stride, ...: one unit each when the grid covers the
    // list, many when the grid is one block (or cluster) per SM slot.
    const unsigned rank = CLUSTER == 2 ? cluster_ctarank() : 0;
    const int units = num_tiles / CLUSTER;
    const int first = blockIdx.x / CLUSTER;
    const int stride = gridDim.x / CLUSTER;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), Cfg::EMPTY_ARRIVALS);
        }
        fence_barrier_init();
    }
    // The peer block's barriers must exist before this block's TMA or arrivals can reach them.
    if constexpr (CLUSTER == 2) cluster_sync(); else __syncthreads();

    // The branch is on the warpgroup index, so all four warps of a warpgroup execute the same
    // setmaxnreg, as its .sync.aligned form requires (PTX ISA, setmaxnreg).
    if (warpgroup == CONSUMERS) {
        if constexpr (Cfg::PRODUCER_WARPGROUP) setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x % WARPGROUP == 0)
            produce<Cfg, STAGES, CLUSTER, B_K_MAJOR>(tmap_a, tmap_b, tiles, units, first, stride, rank, k_steps, N,
                                                     ring, full, empty);
    } else {
        if constexpr (Cfg::PRODUCER_WARPGROUP) setmaxnreg_inc<Cfg::CONSUMER_REGS>();
        const int wg_m = warpgroup % Cfg::WG_M, wg_n = warpgroup / Cfg::WG_M;
        float acc[Cfg::M_ITERS][Cfg::WG_COLS / 2] = {};  // defined before the first wgmma reads them
        int stage = 0;
        unsigned phase = 0;
        for (int unit = first; unit < units; unit += stride) {
            const int4 tile = tiles[unit * CLUSTER + rank];
            multiply_tile<Cfg, STAGES, CLUSTER, B_K_MAJOR>(acc, k_steps, wg_m, wg_n, ring, plan_a, plan_b, full, empty,
                                                           stage, phase);
            if (TMA_STORE && tile.z >= (wg_m + 1) * Cfg::WG_ROWS)
                store_tile_tma<Cfg>(acc, tile, warpgroup, wg_m, wg_n, staging + warpgroup * Cfg::WG_STAGING_BYTES,
                                    tmap_c, N);
            else
                store_tile<Cfg>(acc, tile, wg_m, wg_n, C, N);
        }
        if (TMA_STORE && threadIdx.x % WARPGROUP == 0) bulk_wait<0>();  // the boxes are read before exit
    }
    // No block may leave while its peer can still multicast into its ring or arrive on its
    // barriers: the last releases go to both blocks.
    if constexpr (CLUSTER == 2) cluster_sync();
}
// --8<-- [end:body]

}  // namespace k3

// --8<-- [start:kernels]
// Two entry points over one body: __cluster_dims__ cannot be made conditional on a template
// parameter, and a cluster of one is still a cluster launch.
#define K3_PARAMS                                                                                          \
    const __grid_constant__ CUtensorMap tmap_a,  /* A [M_tot, K]: dims {K, M_tot}, box {64, BM}          */ \
    const __grid_constant__ CUtensorMap tmap_b,  /* B [E, K, N]: {N, K, E}; B^T [E, N, K]: {K, N, E}; box 64 x 64 */ \
    const __grid_constant__ CUtensorMap tmap_c,  /* C [M_tot, N]: dims {N, M_tot}, box {64, 64} (TMA store) */ \
    unsigned short* __restrict__ C,              /* [M_tot, N] bf16                                       */ \
    const int4* __restrict__ tiles,              /* (expert, row0, rows, col0), CLUSTER per unit of work  */ \
    int num_tiles, int K, int N, const OperandPlan plan_a, const OperandPlan plan_b

template <int BM, int BN, int CONSUMERS, int STAGES, bool B_K_MAJOR, bool TMA_STORE>
__global__ void __launch_bounds__(k3::Config<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>::THREADS,
                                  k3::Config<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>::MIN_BLOCKS)
k3_wgmma(K3_PARAMS) {
    k3::k3_body<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>(&tmap_a, &tmap_b, &tmap_c, C, tiles, num_tiles, K,
                                                                    N, plan_a, plan_b);
}

template <int BM, int BN, int CONSUMERS, int STAGES, bool B_K_MAJOR, bool TMA_STORE>
__global__ void __cluster_dims__(2, 1, 1)
__launch_bounds__(k3::Config<BM, BN, CONSUMERS, STAGES, 2, B_K_MAJOR, TMA_STORE>::THREADS, 1)
k3_wgmma_cluster2(K3_PARAMS) {
    k3::k3_body<BM, BN, CONSUMERS, STAGES, 2, B_K_MAJOR, TMA_STORE>(&tmap_a, &tmap_b, &tmap_c, C, tiles, num_tiles, K,
                                                                    N, plan_a, plan_b);
}
// --8<-- [end:kernels]
