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
// the numpy descriptor interpreter in python/moe_gemm/cuda/descriptors.py (tests/test_descriptors.py).
//
// The block's shape (wgmma_config.cuh), the ring's producer (tma_pipeline.cuh) and the two
// epilogues (epilogues.cuh) are chapter 06's k5 too, so they live in headers in namespace sm90;
// this file keeps what is k3's alone: the consumer's K loop, the body and the two entry points.
#include "epilogues.cuh"
#include "ptx.cuh"
#include "tma_pipeline.cuh"
#include "wgmma_config.cuh"

namespace k3 {

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
                              + wg_n * (Cfg::WG_COLS / sm90::BOX) * plan_b.mn64_bytes;
        wgmma_fence();  // the epilogue (or the zero-init) touched the accumulators since the last wgmma
#pragma unroll
        for (int kk = 0; kk < sm90::BK / 16; ++kk) {
            const unsigned long long desc_b = matrix_descriptor(plan_b.bits, b_tile + kk * plan_b.k16_bytes);
#pragma unroll
            for (int i = 0; i < Cfg::M_ITERS; ++i) {
                const unsigned long long desc_a =
                    matrix_descriptor(plan_a.bits, a_tile + i * plan_a.mn64_bytes + kk * plan_a.k16_bytes);
                wgmma_16bit<Cfg::WG_COLS, false, !B_K_MAJOR>(acc[i], desc_a, desc_b, ks > 0 || kk > 0);
            }
        }
        wgmma_commit();
        // Keep this step's group running and wait for the previous one: once it is done, nothing
        // reads the previous stage any more, so it goes back to the producer while the tensor
        // cores work on this one.
        wgmma_wait<1>();
        if (previous >= 0) sm90::release<CLUSTER>(empty, previous);
        previous = stage;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    if (previous >= 0) sm90::release<CLUSTER>(empty, previous);
}
// --8<-- [end:consumer]

// --8<-- [start:body]
template <int BM, int BN, int CONSUMERS, int STAGES, int CLUSTER, bool B_K_MAJOR, bool TMA_STORE>
__device__ __forceinline__ void k3_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b,
                                        const CUtensorMap* tmap_c, unsigned short* C, const int4* tiles,
                                        int num_tiles, int K, int N, const OperandPlan& plan_a,
                                        const OperandPlan& plan_b) {
    using Cfg = sm90::Config<BM, BN, CONSUMERS, STAGES, CLUSTER, B_K_MAJOR, TMA_STORE>;
    // full[s]: the producer's arrive.expect_tx plus TMA's bytes complete it (1 arrival).
    // empty[s]: one arrival per consumer warpgroup of each block in the cluster.
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + sm90::SWIZZLE_ALIGN - 1) & ~(sm90::SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;  // C boxes (TMA_STORE only)

    const int warpgroup = threadIdx.x / sm90::WARPGROUP;
    const int k_steps = K / sm90::BK;  // the host checked K % 64 == 0
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
        if (threadIdx.x % sm90::WARPGROUP == 0)
            sm90::produce<Cfg, STAGES, CLUSTER, B_K_MAJOR>(tmap_a, tmap_b, tiles, units, first, stride, rank,
                                                           k_steps, N, ring, full, empty);
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
                sm90::store_tile_tma<Cfg>(acc, tile, warpgroup, wg_m, wg_n,
                                          staging + warpgroup * Cfg::WG_STAGING_BYTES, tmap_c, N);
            else
                sm90::store_tile<Cfg>(acc, tile, wg_m, wg_n, C, N);
        }
        if (TMA_STORE && threadIdx.x % sm90::WARPGROUP == 0) bulk_wait<0>();  // the boxes are read before exit
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
__global__ void __launch_bounds__(sm90::Config<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>::THREADS,
                                  sm90::Config<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>::MIN_BLOCKS)
k3_wgmma(K3_PARAMS) {
    k3::k3_body<BM, BN, CONSUMERS, STAGES, 1, B_K_MAJOR, TMA_STORE>(&tmap_a, &tmap_b, &tmap_c, C, tiles, num_tiles, K,
                                                                    N, plan_a, plan_b);
}

template <int BM, int BN, int CONSUMERS, int STAGES, bool B_K_MAJOR, bool TMA_STORE>
__global__ void __cluster_dims__(2, 1, 1)
__launch_bounds__(sm90::Config<BM, BN, CONSUMERS, STAGES, 2, B_K_MAJOR, TMA_STORE>::THREADS, 1)
k3_wgmma_cluster2(K3_PARAMS) {
    k3::k3_body<BM, BN, CONSUMERS, STAGES, 2, B_K_MAJOR, TMA_STORE>(&tmap_a, &tmap_b, &tmap_c, C, tiles, num_tiles, K,
                                                                    N, plan_a, plan_b);
}
// --8<-- [end:kernels]
