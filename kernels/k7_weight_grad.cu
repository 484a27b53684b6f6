// k7_weight_grad.cu: chapter 09's kernel, the weight gradient of the expert GEMM.
//
//   python chapters/09/run.py      # check, time and compare with torch and quack (needs an sm_90a GPU)
//   pytest tests/test_k7.py        # compiles every rung for sm_90a, no GPU needed
//
// The forward C = A_e B[e] is ragged along M: each expert owns a run of rows of A and C. Its weight
// gradient dB[e] = A_e^T dC_e [K, N] is a plain GEMM per expert whose *reduction* runs over those
// rows: the ragged axis has moved into K of the GEMM. So the tiles are fixed (128 of K x BN of N for
// every expert, E x K/128 x N/BN of them, whatever the routing) and what varies is how long each
// one's main loop runs: ceil(m_e / 64) steps of 64 rows, from the expert's first row.
//
// Nothing aligns those rows: an expert starts and ends at any row. Every step loads 64 rows from the
// expert's first row onwards, so only the last one can run past it, into the next expert's rows (or
// past M_tot, where TMA writes zeros). Before its wgmmas read that stage, the consumer warpgroup
// overwrites those foreign rows with zeros in shared memory, in both operands: a zero row of A or of
// dC adds nothing to the sum (both, since 0 x NaN is NaN and the rows past the last expert are no
// one's). An expert with no rows runs no step and stores zeros.
//
// Both operands arrive as the forward stored them, row-major with the rows as the reduction: A's 64 x
// 64 panels hold 64 rows x 64 of K, read by wgmma as A^T (M-major, "transposed"); dC's hold 64 rows x
// 64 of N, read as the B operand N-major, exactly as k6 reads a row-major B [K, N]. bf16 and fp16
// wgmma take both transposes, so neither operand is copied or transposed in memory. One TMA copy brings
// all of a stage's panels of an operand (the producer below says why that matters).
//
// The rest is k6's ping-pong kernel (chapter 07): a producer warp issues TMA into a ring of STAGES,
// two consumer warpgroups each own a whole 128 x BN tile and take turns on the tensor cores, the
// epilogues take turns on one ring of STAGING_BOXES C staging boxes (RINGS = 1) or each store through
// a ring of its own, at once (RINGS = 2); persistent blocks walk the tiles in order, expert by expert,
// in raster groups of GROUP K tiles. ACCUMULATE adds into an fp32 dB instead (dB += A_e^T dC_e, as
// gradient accumulation across micro-batches does), each element by one reduction in L2. COOP makes it
// cooperative instead: both consumer warpgroups work on every tile, each on one 64-row half of its 128
// rows of K, up to 256 columns wide, and store their halves at once, each through its own ring.
#include "descriptor_steps.cuh"
#include "epilogues.cuh"
#include "named_barriers.cuh"
#include "ptx.cuh"
#include "tile_walk.cuh"
#include "tma_pipeline.cuh"
#include "wgmma_config.cuh"

namespace k7 {

// --8<-- [start:config]
template <int BN, int STAGES, int STAGING_BOXES, int RINGS, bool COOP = false>
struct Config {
    static_assert(RINGS == 1 || RINGS == 2, "one staging ring taken in turns, or one per warpgroup");
    static_assert(!COOP || RINGS == 2, "a cooperative tile's two halves store at once, each through its own ring");
    static_assert(BN % sm90::BOX == 0 && BN <= (COOP ? 256 : 192),
                  "a warpgroup holds 128 x BN fp32 (BN up to 192), or 64 x BN cooperatively (up to 256)");
    static constexpr int TILE_ROWS = 128;              // dB rows (of K) per tile
    static constexpr int WG_ROWS = COOP ? 64 : 128, M_ITERS = WG_ROWS / 64;  // m64 slices per warpgroup
    static constexpr int TILE_N = BN;
    static constexpr int ROWS = sm90::BK;              // rows of the reduction per stage: 64
    static constexpr int A_BOXES = TILE_ROWS / sm90::BOX, B_BOXES = BN / sm90::BOX;
    static constexpr unsigned A_BYTES = A_BOXES * sm90::BOX_BYTES;
    static constexpr unsigned STAGE_BYTES = (A_BOXES + B_BOXES) * sm90::BOX_BYTES;
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // as k6: 192 accumulators at BN = 192
    static constexpr unsigned STAGING_BYTES = RINGS * STAGING_BOXES * sm90::BOX_BYTES;
    // The host sizes the launch the same way (moe_gemm.variants.k7.config): ring, staging and the
    // 1 KB the ring's alignment may cost, within what a block may have less the static part.
    static_assert(STAGES * STAGE_BYTES + STAGING_BYTES + sm90::SWIZZLE_ALIGN <= 232448 - 2304,
                  "the ring and the C staging fit the shared memory of one block");
};

// The walk: tile `index` is (expert, first K row, first N column), E x K_TILES x N_TILES tiles,
// expert by expert (both operands of an expert stay in L2 while its tiles run), and within an
// expert in raster groups of `group` K tiles walked column by column, so that the blocks running at
// once share dC's columns across the group and A's columns across the N tiles they span.
//
// A block visits tiles first, first + stride, ... and every consumer warp visits them all (the other
// warpgroup's too, to keep its place in the ring), so the expert is carried from one tile to the next
// (a subtraction or two) instead of divided out: the profile at 2,048 rows found the four 32-bit
// divisions of a whole-tile index, done for every tile by every warp, in an eighth of the samples.
struct Cursor {
    int expert, local;  // tile index = expert x per_expert + local, 0 <= local < per_expert
    __device__ __forceinline__ Cursor(int index, int per_expert) : expert(index / per_expert),
                                                                 local(index - expert * per_expert) {}
    __device__ __forceinline__ void advance(int stride, int per_expert) {
        for (local += stride; local >= per_expert; local -= per_expert) ++expert;
    }
};

// The tile's (first K row, first N column) within its expert: two unsigned divisions, for own tiles only.
__device__ __forceinline__ int2 tile_in_expert(int local, int k_tiles, int n_tiles, int group, int bn) {
    const unsigned span = group * n_tiles, g = unsigned(local) / span, within = unsigned(local) - g * span;
    const unsigned in_group = min(group, k_tiles - int(g) * group);  // the last group may be short
    const unsigned n = within / in_group;
    return make_int2(int(g * group + within - n * in_group) * 128, int(n) * bn);
}
// --8<-- [end:config]

// --8<-- [start:producer]
// One thread issues every copy: per tile, one stage per 64 rows of the expert. PANELS: each stage is
// one copy of A (64 rows x 128 of K, as two 64-column panels) and one of dC (64 rows x BN, as BN / 64
// panels). The panels are a third dimension of each tensor map (moe_gemm.variants.k7.tensor_maps), so
// one TMA instruction fills a whole operand of the stage; panels past K or N arrive as zeros and are
// never read. The profile at 65,536 rows found this thread the limit when it issued a copy per
// 64-column box (five per stage, about 110 instructions, the first version, kept as PANELS = false):
// it never once waited for a free stage while the consumers waited for full ones. Where N is not a
// multiple of 64 the last panel would reach past the row, so dC's map stays two-dimensional and the
// stage takes a copy per box that starts before column N.
template <class Cfg, int STAGES, bool PANELS>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_dc, const int* offsets,
                                        int tiles, int first, int stride, int k_tiles, int n_tiles, int group,
                                        int K, int N, unsigned ring, unsigned long long* full,
                                        unsigned long long* empty) {
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_dc);
    const bool dc_panels = PANELS && N % sm90::BOX == 0;
    const int per_expert = k_tiles * n_tiles;
    int stage = 0;
    unsigned phase = 0;
    Cursor at(first, per_expert);
    for (int index = first; index < tiles; index += stride, at.advance(stride, per_expert)) {
        const int2 tile = tile_in_expert(at.local, k_tiles, n_tiles, group, Cfg::TILE_N);
        const int row0 = offsets[at.expert], steps = (offsets[at.expert + 1] - row0 + Cfg::ROWS - 1) / Cfg::ROWS;
        const int b_boxes = dc_panels ? Cfg::B_BOXES : min(Cfg::B_BOXES, (N - tile.y + sm90::BOX - 1) / sm90::BOX);
        const int a_boxes = PANELS ? Cfg::A_BOXES : min(Cfg::A_BOXES, (K - tile.x) / sm90::BOX);  // K % 64 == 0
        const unsigned stage_tx = (a_boxes + b_boxes) * sm90::BOX_BYTES;
        for (int s = 0; s < steps; ++s) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, stage_tx);
            const unsigned dst = ring + stage * Cfg::STAGE_BYTES;
            const int row = row0 + s * Cfg::ROWS;
            if constexpr (PANELS) {
                tma_load_3d(dst, tmap_a, 0, row, tile.x / sm90::BOX, bar);  // A: (k in panel, row, K panel)
            } else {
                for (int box = 0; box < a_boxes; ++box)  // A [M_tot, K]: (k, row)
                    tma_load_2d(dst + box * sm90::BOX_BYTES, tmap_a, tile.x + box * sm90::BOX, row, bar);
            }
            if (dc_panels) {
                tma_load_3d(dst + Cfg::A_BYTES, tmap_dc, 0, row, tile.y / sm90::BOX, bar);  // dC: (n, row, N panel)
            } else {
                for (int box = 0; box < b_boxes; ++box)  // dC [M_tot, N]: (n, row)
                    tma_load_2d(dst + Cfg::A_BYTES + box * sm90::BOX_BYTES, tmap_dc, tile.y + box * sm90::BOX, row,
                                bar);
            }
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}
// --8<-- [end:producer]

// --8<-- [start:tail]
// The last stage of a tile may hold rows of the next expert from row `own` on (own < 64): the
// warpgroup writes zeros over them, in every box of the stage, then makes the writes visible to
// wgmma, which reads shared memory through the async proxy. A 128-byte row of a box is one row of
// the operand whatever the swizzle (it permutes 16-byte chunks within a row), so whole rows are
// zeroed without unswizzling anything.
// COOP: both warpgroups read the stage, so each zeroes every other box and both wait for the pair's writes.
template <class Cfg, bool COOP>
__device__ __forceinline__ void zero_foreign_rows(unsigned stage_base, int own, int warpgroup) {
    constexpr int BOXES = Cfg::A_BOXES + Cfg::B_BOXES, CHUNKS = 128 / 16, ROWS_PER_PASS = sm90::WARPGROUP / CHUNKS;
    constexpr int BOX_STEP = COOP ? 2 : 1;
    const int chunk = threadIdx.x % CHUNKS;  // thread t: 16-byte chunk t % 8 of rows own + t / 8, + 16, ...
    for (int row = own + threadIdx.x % sm90::WARPGROUP / CHUNKS; row < Cfg::ROWS; row += ROWS_PER_PASS)
#pragma unroll
        for (int box = COOP ? warpgroup : 0; box < BOXES; box += BOX_STEP)
            store_shared_zero_16(stage_base + box * sm90::BOX_BYTES + row * 128 + chunk * 16);
    fence_proxy_async_shared();
    if constexpr (COOP)
        named_barrier_sync(PAIR_BARRIER, 2 * sm90::WARPGROUP);
    else
        named_barrier_sync(TAIL_BARRIER + warpgroup, sm90::WARPGROUP);
}
// --8<-- [end:tail]

// --8<-- [start:consumer]
// One stage of a warpgroup's main loop: wait for it, (TAIL: zero the rows of another expert from row
// `own` on), issue SLICES x 4 wgmmas on the m64 slices from `slice0` on (COOP: the warpgroup's half of
// the tile; none where K ends half-way into it), and hand the previous stage back once its wgmmas are done.
template <class Cfg, int SLICES, int STAGES, bool F16, bool TAIL, bool COOP>
__device__ __forceinline__ void multiply_stage(float (&acc)[Cfg::M_ITERS][Cfg::TILE_N / 2], bool first, int own,
                                               int slice0, int warpgroup, unsigned ring, unsigned long long* full,
                                               unsigned long long* empty, int& stage, unsigned& phase,
                                               int& previous) {
    // A^T and dC are both MN-major: 64-element panels 8 KB apart, a k16 step 16 rows (2 KB) down.
    constexpr OperandPlan PLAN = sm90::MN_MAJOR_PLAN;
    mbarrier_wait_parity(smem_u32(&full[stage]), phase);
    const unsigned stage_base = ring + stage * Cfg::STAGE_BYTES;
    if constexpr (TAIL) {
        if (own < Cfg::ROWS) zero_foreign_rows<Cfg, COOP>(stage_base, own, warpgroup);
    }
    if constexpr (SLICES == 0) {
        sm90::release<1>(empty, stage);  // nothing to multiply here: the stage is the partner's alone
    } else {
        const unsigned long long desc_a =
            sm90::warp_uniform(matrix_descriptor(PLAN.bits, stage_base + slice0 * PLAN.mn64_bytes));
        const unsigned long long desc_b =
            sm90::warp_uniform(matrix_descriptor(PLAN.bits, stage_base + Cfg::A_BYTES));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Cfg::ROWS / 16; ++kk) {
#pragma unroll
            for (int i = 0; i < SLICES; ++i)
                wgmma_16bit<Cfg::TILE_N, true, true, F16>(
                    acc[i], desc_a + sm90::descriptor_step(i * PLAN.mn64_bytes + kk * PLAN.k16_bytes),
                    desc_b + sm90::descriptor_step(kk * PLAN.k16_bytes), !first || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's wgmmas are done: hand it back
        if (previous >= 0) sm90::release<1>(empty, previous);
        previous = stage;
    }
    if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
    }
}

// A warpgroup's 128 x BN tile over `steps` stages, SLICES m64 slices of its K rows (1 where K ends
// 64 rows into the tile). Only the last stage can hold another expert's rows (from `own_last` on), so
// it is peeled off the loop: the loop itself tests nothing. As in k6, the hand-over to the other
// warpgroup comes once every wgmma is issued.
template <class Cfg, int SLICES, int STAGES, bool F16, bool COOP, class HandOver>
__device__ __forceinline__ void multiply(float (&acc)[Cfg::M_ITERS][Cfg::TILE_N / 2], int steps, int own_last,
                                         int slice0, int warpgroup, unsigned ring, unsigned long long* full,
                                         unsigned long long* empty, int& stage, unsigned& phase,
                                         HandOver&& hand_over) {
    int previous = -1;
    for (int s = 0; s + 1 < steps; ++s)
        multiply_stage<Cfg, SLICES, STAGES, F16, false, COOP>(acc, s == 0, Cfg::ROWS, slice0, warpgroup, ring, full,
                                                               empty, stage, phase, previous);
    if (steps > 0)
        multiply_stage<Cfg, SLICES, STAGES, F16, true, COOP>(acc, steps == 1, own_last, slice0, warpgroup, ring, full,
                                                              empty, stage, phase, previous);
    hand_over();
    wgmma_wait<0>();
    if (previous >= 0) sm90::release<1>(empty, previous);
}
// --8<-- [end:consumer]

// --8<-- [start:body]
template <int BN, int STAGES, int STAGING_BOXES, int IN, int OUT, int RINGS, bool ACCUMULATE, bool PANELS, bool COOP>
__device__ __forceinline__ void k7_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_dc,
                                        const CUtensorMap* tmap_db, void* dB, const int* ends, int tokens,
                                        int experts, int group, int K, int N) {
    static_assert((IN == sm90::BF16 || IN == sm90::F16) && OUT >= sm90::BF16 && OUT <= sm90::F32,
                  "bf16 or fp16 operands; a bf16, fp16 or fp32 dB");
    static_assert(!ACCUMULATE || OUT == sm90::F32, "dB += A^T dC accumulates into an fp32 dB only");
    using Cfg = Config<BN, STAGES, STAGING_BOXES, RINGS, COOP>;
    constexpr bool F16 = IN == sm90::F16;
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    // k6's device walk with 64-row units and one unit column: its offsets are the clamped expert ends, its
    // unit counts each expert's steps of 64 rows (2 KB).
    __shared__ walk::Walk<Cfg::ROWS, 1> order;
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + sm90::SWIZZLE_ALIGN - 1) & ~(sm90::SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;
    const int warpgroup = threadIdx.x / sm90::WARPGROUP;

    order.build(ends, experts, tokens, 1, 1);  // no end is trusted (tile_walk.cuh)
    const int* offsets = order.offsets;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), COOP ? 2 : 1);  // its readers: the warpgroup whose tile it is, or both
        }
        fence_barrier_init();
    }
    __syncthreads();

    const int k_tiles = (K + Cfg::TILE_ROWS - 1) / Cfg::TILE_ROWS, n_tiles = (N + BN - 1) / BN;
    const int tiles = experts * k_tiles * n_tiles;
    const int first = blockIdx.x, stride = gridDim.x;
    if (warpgroup == 2) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x % sm90::WARPGROUP == 0)
            produce<Cfg, STAGES, PANELS>(tmap_a, tmap_dc, offsets, tiles, first, stride, k_tiles, n_tiles, group, K, N,
                                         ring, full, empty);
    } else {
        setmaxnreg_inc<Cfg::CONSUMER_REGS>();
        float acc[Cfg::M_ITERS][BN / 2];
        const unsigned my_staging = staging + (RINGS == 2 ? warpgroup : 0) * STAGING_BOXES * sm90::BOX_BYTES;
        const int mine = first < tiles ? (tiles - first + stride - 1) / stride : 0;
        int stage = 0, stored = 0;
        unsigned phase = 0;
        const int per_expert = k_tiles * n_tiles;
        Cursor at(first, per_expert);
        for (int ordinal = 0; ordinal < mine; ++ordinal, at.advance(stride, per_expert)) {
            const int expert = at.expert, steps = order.starts[expert + 1] - order.starts[expert];
            if constexpr (!COOP) {
                if (ordinal % 2 != warpgroup) {  // the other warpgroup's tile
                    sm90::skip_stages<STAGES>(stage, phase, steps);
                    continue;
                }
                // The hand-overs of k6's ping-pong (k6_persistent.cu), for the same two reasons: the
                // tensor cores in order, and parity waits that cannot see a phase two fills old.
                if (ordinal > 0) named_barrier_sync(ORDER_BARRIER + warpgroup, 2 * sm90::WARPGROUP);
            }
            auto hand_over = [&] {
                if constexpr (!COOP) {
                    if (ordinal + 1 < mine) named_barrier_arrive(ORDER_BARRIER + (warpgroup ^ 1), 2 * sm90::WARPGROUP);
                }
            };
            const int2 tile = tile_in_expert(at.local, k_tiles, n_tiles, group, BN);  // (first K row, first column)
            // COOP: the warpgroup's 64-row half of the tile; its rows of dB, 0 or less where K ends half-way
            const int slice0 = COOP ? warpgroup : 0;
            const int rows = min(Cfg::WG_ROWS, K - tile.x - slice0 * 64);  // 64 where K ends half-way into the tile
            const int own_last = (offsets[expert + 1] - offsets[expert]) - (steps - 1) * Cfg::ROWS;
            if (steps == 0) {  // an expert with no rows: its gradient is exactly zero (accumulating: nothing to add)
#pragma unroll
                for (int i = 0; i < Cfg::M_ITERS; ++i)
#pragma unroll
                    for (int v = 0; v < BN / 2; ++v) acc[i][v] = 0.0f;
            }
            if (rows > 64 * (Cfg::M_ITERS - 1))
                multiply<Cfg, Cfg::M_ITERS, STAGES, F16, COOP>(acc, steps, own_last, slice0, warpgroup, ring, full,
                                                               empty, stage, phase, hand_over);
            else  // K ends half-way into the tile: a slice fewer (COOP: none, but the stages are the pair's to release)
                multiply<Cfg, Cfg::M_ITERS - 1, STAGES, F16, COOP>(acc, steps, own_last, slice0, warpgroup, ring, full,
                                                                   empty, stage, phase, hand_over);
            // One ring: the epilogues take turns on it, each waiting until TMA has read every box it filled
            // (as k6's ping-pong does). A ring each: the two store at once, each reusing its own boxes.
            if (RINGS == 1 && ordinal > 0) named_barrier_sync(EPILOGUE_ORDER_BARRIER + warpgroup, 2 * sm90::WARPGROUP);
            if (RINGS == 1) stored = 0;
            // dB [E, K, N] as a matrix of E x K rows: this tile's rows start at expert x K + its first K row.
            // Accumulating, an expert with no rows leaves its dB as it was.
            if ((!ACCUMULATE || steps > 0) && (!COOP || rows > 0))
                sm90::store_slices<Cfg, STAGING_BOXES, BN, OUT, ACCUMULATE>(acc, expert * K + tile.x + slice0 * 64,
                                                                            rows, tile.y, warpgroup, my_staging,
                                                                            stored, tmap_db, dB, N);
            if (RINGS == 1) {
                if (threadIdx.x % sm90::WARPGROUP == 0) bulk_wait_read<0>();
                if (ordinal + 1 < mine)
                    named_barrier_arrive(EPILOGUE_ORDER_BARRIER + (warpgroup ^ 1), 2 * sm90::WARPGROUP);
            }
        }
        if (threadIdx.x % sm90::WARPGROUP == 0) bulk_wait<0>();  // the staged boxes are read before exit
    }
}
// --8<-- [end:body]

}  // namespace k7

// --8<-- [start:kernel]
#define K7_PARAMS                                                                                              \
    const __grid_constant__ CUtensorMap tmap_a,   /* A [M_tot, K] as (64, M_tot, K / 64): box {64, 64, 2}   */ \
    const __grid_constant__ CUtensorMap tmap_dc,  /* dC likewise, box {64, 64, BN / 64}; N % 64: {64, 64}   */ \
    const __grid_constant__ CUtensorMap tmap_db,  /* dB [E x K, N]: box {64, 64}                            */ \
    void* __restrict__ dB,                        /* [E, K, N] in OUT: bf16, fp16 or fp32 (ACCUMULATE: += ) */ \
    const int* __restrict__ ends,                 /* [E] cumulative row ends (torch's offs)                 */ \
    int tokens,                                   /* M_tot: the rows of A and dC; every end is clamped to it */ \
    int experts, int group, int K, int N

// RINGS, ACCUMULATE, PANELS and COOP last, with their defaults: the instances named before them keep their names.
// ACCUMULATE: dB += A_e^T dC_e into an fp32 dB (gradient accumulation across micro-batches). PANELS = false:
// the first version's producer, a copy per 64-column box (its maps are two-dimensional).
template <int BN, int STAGES, int STAGING_BOXES, int IN, int OUT, int RINGS = 1, bool ACCUMULATE = false,
          bool PANELS = true, bool COOP = false>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k7_weight_grad(K7_PARAMS) {
    k7::k7_body<BN, STAGES, STAGING_BOXES, IN, OUT, RINGS, ACCUMULATE, PANELS, COOP>(
        &tmap_a, &tmap_dc, &tmap_db, dB, ends, tokens, experts, group, K, N);
}
// --8<-- [end:kernel]
