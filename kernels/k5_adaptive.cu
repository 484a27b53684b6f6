// k5_adaptive.cu: chapter 06's kernel. One persistent launch over a *mixed* tile list: each
// expert's remainder rows go in a tile of the shape a policy picks for them, and the list is
// either built on the host (the policy chosen per routing by the cost model in
// python/moe_gemm/variants/k5/cost_model.py) or found by the kernel itself from the device-side expert
// offsets, so that a launch needs no host round trip.
//
//   python chapters/06/run.py              # check, calibrate, time the grid (needs an sm_90a GPU)
//   pytest tests/test_k5.py                # compiles both schedules for sm_90a, no GPU needed
//
// The three tile shapes (TileKind). Every expert's first m_e / 128 * 128 rows go in 128-row tiles;
// the r = m_e % 128 rows left over (its *remainder*) take one tile of the shape the policy gives r:
//   M128   128 rows x 192 columns: chapter 04's k3/tmastore-bn192 tile, each consumer warpgroup
//          one 64-row slice (wgmma m64n192), TMA-store epilogue.
//   M64     64 rows x 192 columns: the same wgmma, but the two warpgroups split K (even and odd
//          stages) and add their accumulators through shared memory at the end: half the rows
//          of math for no extra registers. On the H200 it costs more than an M128 tile
//          (chapter 06's calibration; the page discusses why, as a hypothesis).
//   SWAP   up to 64 rows x 128 columns, computed as C^T = B^T A^T ("swap AB"): the 128 weight
//          columns are the wgmma's M (64 per warpgroup, B [K, N] read MN-major), the tokens its N
//          (16, 32, 48 or 64), so a 5-row remainder pays for 16 rows, not 128.
// B is B [E, K, N] as given; the ring, producer and stage layout are k3's, sized for the widest
// stage (an M128 stage: A 128 x 64 and B 64 x 192, 40 KB).
//
// What k5 takes from k3 lives in the headers both include (namespace sm90): the block's shape
// (wgmma_config.cuh), the stage release (tma_pipeline.cuh) and both epilogues (epilogues.cuh).
#include "epilogues.cuh"
#include "named_barriers.cuh"
#include "ptx.cuh"
#include "tma_pipeline.cuh"
#include "wgmma_config.cuh"

namespace k5 {

// --8<-- [start:config]
enum TileKind : int { M128 = 0, M64 = 1, SWAP = 2 };
constexpr int KINDS = 3;
constexpr int BM = 128, BN = 192;             // the M128 tile; M64 tiles are 64 x BN
constexpr int SWAP_COLS = 128;                // weight columns per swap tile: one 64-column box per warpgroup
constexpr int SWAP_MAX_ROWS = 64;             // tokens per swap tile: the wgmma N, in steps of 16
constexpr int TOKEN_BOX_ROWS = 16;            // M64 and SWAP tiles: A in boxes of 16 rows (2 KB), as many as needed
constexpr unsigned TOKEN_BOX_BYTES = TOKEN_BOX_ROWS * sm90::BK * 2;
constexpr int MAX_EXPERTS = 256;              // the device schedule's prefix sums live in shared memory
constexpr int WARPGROUP = sm90::WARPGROUP;

// k3's configuration of its fastest BN = 192 rung supplies the stage layout and the epilogues.
template <int STAGES>
using K3 = sm90::Config<BM, BN, 2, STAGES, 1, false, true>;

// The remainder rule: r <= swap_max rows go in a SWAP tile, r <= m64_max in an M64 tile, larger
// ones in an M128 tile. swap_max = 0 turns swap tiles off; m64_max = swap_max turns M64 tiles off.
struct Policy {
    int swap_max;
    int m64_max;
};
// --8<-- [end:config]

// A tile descriptor: int4 (expert, row0, rows | kind << 16, col0), decoded once per tile.
struct Tile {
    int4 rows;   // (expert, row0, rows, col0): the form k3's epilogues take
    TileKind kind;
};

__device__ __forceinline__ Tile decode(int4 packed) {
    return {make_int4(packed.x, packed.y, packed.z & 0xFFFF, packed.w), static_cast<TileKind>(packed.z >> 16)};
}

__device__ __forceinline__ TileKind remainder_kind(int r, Policy policy) {
    return r <= policy.swap_max ? SWAP : r <= policy.m64_max ? M64 : M128;
}

// --8<-- [start:schedule]
// The device schedule: the tile list without a host round trip, in expert-major order (each
// expert's 128-row tiles, N column by N column, then its remainder tile's columns: the order
// the host list has by default, which keeps B[e] in L2 while its tiles run). starts[e] counts
// the tiles of experts 0 .. e-1. Each block builds it from the offsets at the start of the
// launch (one warp scans 32 experts at a time with shuffles), then decodes tile i with a binary
// search: no global tile list, no atomics, every block agreeing on the same order.
struct Schedule {
    int offsets[MAX_EXPERTS + 1];
    int starts[MAX_EXPERTS + 1];
    int experts;
    int columns[KINDS];  // column tiles per row tile of each kind
    Policy policy;

    __device__ int total() const { return starts[experts]; }
};

__device__ __forceinline__ int expert_tiles(int rows, Policy policy, const int (&columns)[KINDS]) {
    const int full = rows / BM, r = rows % BM;
    return full * columns[M128] + (r > 0 ? columns[remainder_kind(r, policy)] : 0);
}

__device__ void build_schedule(Schedule& s, const int* __restrict__ offsets, int experts, Policy policy, int N) {
    for (int e = threadIdx.x; e <= experts; e += blockDim.x) s.offsets[e] = offsets[e];
    if (threadIdx.x == 0) {
        s.experts = experts;
        s.policy = policy;
        s.columns[M128] = s.columns[M64] = (N + BN - 1) / BN;
        s.columns[SWAP] = (N + SWAP_COLS - 1) / SWAP_COLS;
        s.starts[0] = 0;
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // an inclusive scan of the per-expert tile counts, 32 experts at a time
        const int lane = threadIdx.x;
        int carry = 0;
        for (int base = 0; base < experts; base += 32) {
            const int e = base + lane;
            int v = e < experts ? expert_tiles(s.offsets[e + 1] - s.offsets[e], policy, s.columns) : 0;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int up = __shfl_up_sync(0xFFFFFFFFu, v, d);
                if (lane >= d) v += up;
            }
            if (e < experts) s.starts[e + 1] = carry + v;
            carry += __shfl_sync(0xFFFFFFFFu, v, 31);
        }
    }
    __syncthreads();
}

__device__ int4 scheduled_tile(const Schedule& s, int index) {
    int lo = 0, hi = s.experts;  // the last expert e with starts[e] <= index (its tiles hold it)
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (s.starts[mid] <= index) lo = mid; else hi = mid;
    }
    const int row0 = s.offsets[lo], rows = s.offsets[lo + 1] - row0, full = rows / BM;
    int local = index - s.starts[lo];
    if (local < full * s.columns[M128]) {  // one of the 128-row tiles
        const int m_tile = local / s.columns[M128];
        return make_int4(lo, row0 + m_tile * BM, BM | M128 << 16, (local % s.columns[M128]) * BN);
    }
    local -= full * s.columns[M128];  // the remainder tile's column `local`
    const int kind = remainder_kind(rows % BM, s.policy);
    return make_int4(lo, row0 + full * BM, rows % BM | kind << 16, local * (kind == SWAP ? SWAP_COLS : BN));
}
// --8<-- [end:schedule]

template <bool DEVICE_SCHEDULE>
__device__ __forceinline__ int4 tile_at(const int4* tiles, const Schedule& s, int index) {
    if constexpr (DEVICE_SCHEDULE) return scheduled_tile(s, index);
    else return tiles[index];
}

// --8<-- [start:slots]
// Only the producer looks tiles up (a global load of the host list, or the schedule's search:
// hundreds of cycles either way). It writes each descriptor into a shared-memory slot before it
// announces the tile's first stage, and the consumers read it once that stage's full barrier has
// completed (the arrive releases the write, the wait acquires it), so between two tiles the
// tensor cores wait for one shared-memory load instead of a lookup. STAGES + 1 slots suffice:
// the producer reaches tile j + STAGES + 1 only after both warpgroups released a stage of tile
// j + 1 or later, so they have read slot j.
template <int STAGES>
struct TileSlots {
    static constexpr int COUNT = STAGES + 1;
    int4 slot[COUNT];
};
// --8<-- [end:slots]

// --8<-- [start:producer]
// k3's producer loop (tma_pipeline.cuh), with the stage's contents set by the tile's kind: A as
// k3 loads it (one 128-row box) for M128 tiles, else in 16-row boxes (four for M64, one per 16
// tokens for SWAP), and up to three (BN = 192) or two (SWAP_COLS = 128) B boxes, fewer at the N
// edge. A swap tile's bytes are mostly weights: 16 tokens cost 2 KB a stage against its 16 KB of B.
template <int STAGES, bool DEVICE_SCHEDULE>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_tokens,
                                        const CUtensorMap* tmap_b, const int4* tiles, const Schedule& sched,
                                        int num_tiles, int k_steps, int N, unsigned ring, TileSlots<STAGES>& slots,
                                        unsigned long long* full, unsigned long long* empty) {
    using Cfg = K3<STAGES>;
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_tokens);
    tma_prefetch_descriptor(tmap_b);
    int stage = 0;
    unsigned phase = 0;
    for (int index = blockIdx.x, ordinal = 0; index < num_tiles; index += gridDim.x, ++ordinal) {
        const int4 packed = tile_at<DEVICE_SCHEDULE>(tiles, sched, index);
        const Tile tile = decode(packed);
        const bool whole = tile.kind == M128, swap = tile.kind == SWAP;
        const int token_rows = swap ? (tile.rows.z + TOKEN_BOX_ROWS - 1) / TOKEN_BOX_ROWS * TOKEN_BOX_ROWS : 64;
        const int a_boxes = whole ? 1 : token_rows / TOKEN_BOX_ROWS;
        const unsigned a_box_bytes = whole ? Cfg::A_BYTES : TOKEN_BOX_BYTES;
        const CUtensorMap* a_map = whole ? tmap_a : tmap_tokens;
        const int width = swap ? SWAP_COLS : BN;
        const int b_boxes = min(width / sm90::BOX, (N - tile.rows.w + sm90::BOX - 1) / sm90::BOX);
        const unsigned stage_tx = a_boxes * a_box_bytes + b_boxes * sm90::BOX_BYTES;
        for (int ks = 0; ks < k_steps; ++ks) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            if (ks == 0) slots.slot[ordinal % TileSlots<STAGES>::COUNT] = packed;  // released by the arrive below
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, stage_tx);
            const unsigned a_dst = ring + stage * Cfg::STAGE_BYTES;
            const int k = ks * sm90::BK;
            for (int box = 0; box < a_boxes; ++box)
                tma_load_2d(a_dst + box * a_box_bytes, a_map, k, tile.rows.y + box * TOKEN_BOX_ROWS, bar);
            for (int box = 0; box < b_boxes; ++box)
                tma_load_3d(a_dst + Cfg::A_BYTES + box * sm90::BOX_BYTES, tmap_b, tile.rows.w + box * sm90::BOX, k,
                            tile.rows.x, bar);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}
// --8<-- [end:producer]

// --8<-- [start:k_loop]
// A consumer warpgroup's walk over one tile's K steps. It waits for every stage (so that it can
// hand each back in order) but multiplies only those with ks % split == part: all of them for
// M128 and SWAP tiles, every other one for the two halves of an M64 tile. `issue(stage, first)`
// issues the four k16 wgmmas of one stage.
template <int STAGES, class Issue>
__device__ __forceinline__ void k_loop(int k_steps, int split, int part, unsigned ring, unsigned long long* full,
                                       unsigned long long* empty, int& stage, unsigned& phase, Issue&& issue) {
    using Cfg = K3<STAGES>;
    int previous = -1;
    bool first = true;
    for (int ks = 0; ks < k_steps; ++ks) {
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);
        if (ks % split == part) {
            wgmma_fence();
            issue(ring + stage * Cfg::STAGE_BYTES, first);
            wgmma_commit();
            wgmma_wait<1>();  // as in k3: the previous stage is free once its group is done
            if (previous >= 0) sm90::release<1>(empty, previous);
            previous = stage;
            first = false;
        } else {
            sm90::release<1>(empty, stage);  // the other warpgroup's stage: nothing of it is read here
        }
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    if (previous >= 0) sm90::release<1>(empty, previous);
}
// --8<-- [end:k_loop]

// --8<-- [start:wide]
// M128 and M64 tiles: A K-major (a 64-row slice), B MN-major (three 64-column boxes).
template <int STAGES>
__device__ __forceinline__ void multiply_wide(float (&acc)[1][BN / 2], int k_steps, int split, int part,
                                              int a_slice, unsigned ring, const OperandPlan& plan_k,
                                              const OperandPlan& plan_mn, unsigned long long* full,
                                              unsigned long long* empty, int& stage, unsigned& phase) {
    k_loop<STAGES>(k_steps, split, part, ring, full, empty, stage, phase, [&](unsigned base, bool first) {
        const unsigned a_tile = base + a_slice * plan_k.mn64_bytes, b_tile = base + K3<STAGES>::A_BYTES;
#pragma unroll
        for (int kk = 0; kk < sm90::BK / 16; ++kk)
            wgmma_16bit<BN, false, true>(acc[0], matrix_descriptor(plan_k.bits, a_tile + kk * plan_k.k16_bytes),
                                        matrix_descriptor(plan_mn.bits, b_tile + kk * plan_mn.k16_bytes),
                                        !first || kk > 0);
    });
}

// The two halves of an M64 tile meet in the C staging area (2 x 64 x 192 bf16 = 64 x 192 fp32,
// the same 48 KB): warpgroup 1 writes its partial sums, warpgroup 0 adds them and stores the tile.
template <int STAGES>
__device__ __forceinline__ void reduce_halves(float (&acc)[1][BN / 2], int warpgroup, float* partial) {
    static_assert(WARPGROUP * BN / 2 * 4 <= K3<STAGES>::STAGING_BYTES, "the fp32 tile fits the C staging");
    const int thread = threadIdx.x % WARPGROUP;
    if (thread == 0) bulk_wait_read<0>();  // both warpgroups' earlier TMA stores are done reading it
    // The consumers' own id (named_barriers.cuh): __syncthreads would also wait for the producer
    // thread, which stops at a full ring until these warpgroups move on.
    named_barrier_sync(PAIR_BARRIER, 2 * WARPGROUP);
#pragma unroll
    for (int j = 0; j < BN / 2; ++j)  // element j of every thread is adjacent: no bank conflicts
        if (warpgroup == 1) partial[j * WARPGROUP + thread] = acc[0][j];
    named_barrier_sync(PAIR_BARRIER, 2 * WARPGROUP);
    if (warpgroup == 0) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[0][j] += partial[j * WARPGROUP + thread];
    }
    named_barrier_sync(PAIR_BARRIER, 2 * WARPGROUP);  // read before warpgroup 1 writes its next staging
}
// --8<-- [end:wide]

// --8<-- [start:swap]
// A SWAP tile: warpgroup w computes D[64 weight columns][TN tokens] = B^T A^T, reading its 64-column
// B box MN-major as the wgmma's A and the tokens' A box K-major as its B, then writes D
// transposed: thread element d[4j + 2h + c] is C[row0 + 8j + 2t + c][col0 + 64w + 16 warp + 8h + g].
template <int STAGES, int TN>
__device__ __forceinline__ void swap_tile(int4 tile, int warpgroup, int k_steps, unsigned ring,
                                          const OperandPlan& plan_k, const OperandPlan& plan_mn,
                                          unsigned long long* full, unsigned long long* empty, int& stage,
                                          unsigned& phase, unsigned short* __restrict__ C, int N) {
    static_assert(TN % 16 == 0 && TN <= SWAP_MAX_ROWS, "a swap tile holds 16, 32, 48 or 64 tokens");
    float acc[TN / 2] = {};
    k_loop<STAGES>(k_steps, 1, 0, ring, full, empty, stage, phase, [&](unsigned base, bool first) {
        const unsigned weights = base + K3<STAGES>::A_BYTES + warpgroup * sm90::BOX_BYTES, tokens = base;
#pragma unroll
        for (int kk = 0; kk < sm90::BK / 16; ++kk)
            wgmma_16bit<TN, true, false>(acc, matrix_descriptor(plan_mn.bits, weights + kk * plan_mn.k16_bytes),
                                        matrix_descriptor(plan_k.bits, tokens + kk * plan_k.k16_bytes),
                                        !first || kk > 0);
    });
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % WARPGROUP) / 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int col = tile.w + warpgroup * sm90::BOX + warp * 16 + h * 8 + g;
        if (col >= N) continue;
#pragma unroll
        for (int j = 0; j < TN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int token = 8 * j + 2 * t + c;
                if (token < tile.z)
                    C[static_cast<long long>(tile.y + token) * N + col] =
                        static_cast<unsigned short>(pack_bf16x2(acc[4 * j + 2 * h + c], 0.0f));
            }
    }
}

template <int STAGES>
__device__ __forceinline__ void multiply_swap(int4 tile, int warpgroup, int k_steps, unsigned ring,
                                              const OperandPlan& plan_k, const OperandPlan& plan_mn,
                                              unsigned long long* full, unsigned long long* empty, int& stage,
                                              unsigned& phase, unsigned short* C, int N) {
    switch ((tile.z + 15) / 16) {  // the narrowest wgmma N that holds the tokens
        case 1: swap_tile<STAGES, 16>(tile, warpgroup, k_steps, ring, plan_k, plan_mn, full, empty, stage, phase, C, N); break;
        case 2: swap_tile<STAGES, 32>(tile, warpgroup, k_steps, ring, plan_k, plan_mn, full, empty, stage, phase, C, N); break;
        case 3: swap_tile<STAGES, 48>(tile, warpgroup, k_steps, ring, plan_k, plan_mn, full, empty, stage, phase, C, N); break;
        default: swap_tile<STAGES, 64>(tile, warpgroup, k_steps, ring, plan_k, plan_mn, full, empty, stage, phase, C, N);
    }
}
// --8<-- [end:swap]

// --8<-- [start:consumer]
// One consumer warpgroup's share of one tile, by kind.
template <int STAGES>
__device__ __forceinline__ void consume(Tile tile, int warpgroup, int k_steps, unsigned ring, unsigned staging,
                                        float* partial, const OperandPlan& plan_k, const OperandPlan& plan_mn,
                                        unsigned long long* full, unsigned long long* empty, int& stage,
                                        unsigned& phase, const CUtensorMap* tmap_c, unsigned short* C, int N) {
    using Cfg = K3<STAGES>;
    if (tile.kind == SWAP) {
        multiply_swap<STAGES>(tile.rows, warpgroup, k_steps, ring, plan_k, plan_mn, full, empty, stage, phase, C, N);
        return;
    }
    float acc[1][BN / 2] = {};
    const unsigned my_staging = staging + warpgroup * Cfg::WG_STAGING_BYTES;
    if (tile.kind == M128) {  // warpgroup w: rows 64w .. 64w + 63, every K step
        multiply_wide<STAGES>(acc, k_steps, 1, 0, warpgroup, ring, plan_k, plan_mn, full, empty, stage, phase);
        if (tile.rows.z >= (warpgroup + 1) * 64)
            sm90::store_tile_tma<Cfg>(acc, tile.rows, warpgroup, warpgroup, 0, my_staging, tmap_c, N);
        else
            sm90::store_tile<Cfg>(acc, tile.rows, warpgroup, 0, C, N);
        return;
    }
    // M64: both warpgroups on rows 0 .. 63, warpgroup w on the K steps ks % 2 == w
    multiply_wide<STAGES>(acc, k_steps, 2, warpgroup, 0, ring, plan_k, plan_mn, full, empty, stage, phase);
    reduce_halves<STAGES>(acc, warpgroup, partial);
    if (warpgroup == 1) return;
    if (tile.rows.z == 64)
        sm90::store_tile_tma<Cfg>(acc, tile.rows, 0, 0, 0, my_staging, tmap_c, N);
    else
        sm90::store_tile<Cfg>(acc, tile.rows, 0, 0, C, N);
}
// --8<-- [end:consumer]

// --8<-- [start:body]
template <int STAGES, bool DEVICE_SCHEDULE>
__device__ __forceinline__ void k5_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_tokens,
                                        const CUtensorMap* tmap_b, const CUtensorMap* tmap_c,
                                        unsigned short* C, const int4* tiles, int num_tiles, const int* offsets,
                                        int experts, Policy policy, int K, int N, const OperandPlan& plan_k,
                                        const OperandPlan& plan_mn) {
    using Cfg = K3<STAGES>;
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    __shared__ Schedule sched;  // DEVICE_SCHEDULE only (3 KB)
    __shared__ TileSlots<STAGES> slots;
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + sm90::SWIZZLE_ALIGN - 1) & ~(sm90::SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;
    float* partial = reinterpret_cast<float*>(dynamic_smem + (staging - smem_u32(dynamic_smem)));  // M64 sums
    const int warpgroup = threadIdx.x / WARPGROUP;
    const int k_steps = K / sm90::BK;

    if constexpr (DEVICE_SCHEDULE) {
        build_schedule(sched, offsets, experts, policy, N);
        num_tiles = sched.total();
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), 2);  // one arrival per consumer warpgroup
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 2) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x % WARPGROUP == 0)
            produce<STAGES, DEVICE_SCHEDULE>(tmap_a, tmap_tokens, tmap_b, tiles, sched, num_tiles, k_steps, N, ring,
                                             slots, full, empty);
    } else {
        setmaxnreg_inc<Cfg::CONSUMER_REGS>();
        int stage = 0;
        unsigned phase = 0;
        for (int index = blockIdx.x, ordinal = 0; index < num_tiles; index += gridDim.x, ++ordinal) {
            mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // the tile's first stage, and its descriptor
            const Tile tile = decode(slots.slot[ordinal % TileSlots<STAGES>::COUNT]);
            consume<STAGES>(tile, warpgroup, k_steps, ring, staging, partial, plan_k, plan_mn, full, empty, stage,
                            phase, tmap_c, C, N);
        }
        if (threadIdx.x % WARPGROUP == 0) bulk_wait<0>();  // the staged boxes are read before exit
    }
}
// --8<-- [end:body]

}  // namespace k5

// --8<-- [start:kernel]
template <int STAGES, bool DEVICE_SCHEDULE>
__global__ void __launch_bounds__(k5::K3<STAGES>::THREADS, 1)
k5_adaptive(const __grid_constant__ CUtensorMap tmap_a,  // A [M_cap, K]: box {64, 128} (M128 tiles)
            const __grid_constant__ CUtensorMap tmap_tokens,  // A again, box {64, 16} (M64 and SWAP tiles)
            const __grid_constant__ CUtensorMap tmap_b,  // B [E, K, N]: box {64, 64, 1}
            const __grid_constant__ CUtensorMap tmap_c,  // C [M_cap, N]: box {64, 64}
            unsigned short* __restrict__ C,              // [M_cap, N] bf16
            const int4* __restrict__ tiles,              // host schedule: (expert, row0, rows | kind << 16, col0)
            int num_tiles,                               // host schedule: the list's length
            const int* __restrict__ offsets,             // device schedule: [E + 1] expert offsets
            int experts, k5::Policy policy,              // device schedule: E and the remainder rule
            int K, int N, const OperandPlan plan_k, const OperandPlan plan_mn) {
    k5::k5_body<STAGES, DEVICE_SCHEDULE>(&tmap_a, &tmap_tokens, &tmap_b, &tmap_c, C, tiles, num_tiles, offsets, experts, policy, K,
                                         N, plan_k, plan_mn);
}
// --8<-- [end:kernel]
