// k8_fp8.cu: chapter 10's kernel, the grouped GEMM in fp8 e4m3 with fp32 scales.
//
//   python chapters/10/run.py      # check, time and compare with torch._scaled_grouped_mm (needs an sm_90a GPU)
//   pytest tests/test_k8.py        # compiles every rung for sm_90a, no GPU needed
//
// C [M_tot, N] = A_e B[e] as in k6, with both operands quantized to e4m3 and C = the product of their
// real values (q x scale), accumulated in fp32 and stored in bf16 (or fp32). Two scalings:
//
//   BLOCKWISE   the DeepSeek-V3 recipe: one scale per 1 x 128 group of A along K and one per 128 x 128 block
//               of B. The scales change every 128 of K, so they cannot wait for the epilogue: each stage of
//               the ring is one 128-deep block of K, the warpgroup multiplies it into a scratch accumulator,
//               then adds that into its main fp32 accumulators times scale_a[row] x scale_b (promotion).
//   ROWWISE     torch._scaled_grouped_mm's sm_90 form: one scale per row of A and one per expert and column
//               of B, both over all of K, so they apply once, in the epilogue. PROMOTE = true adds each
//               stage's product into fp32 as the blockwise kernel does (use_fast_accum=False's precision);
//               false lets the tensor core accumulate all of K (use_fast_accum=True).
//
// Why promote: Hopper's FP8 wgmma adds its products into fewer bits than fp32 (about 14 per the
// DeepSeek-V3 technical report, section 3.3.2), so a long K loses the small terms of a large sum. 128 of K
// per scratch sum keeps the loss bounded; DeepGEMM promotes the same way (its sm90_fp8_gemm_1d2d).
//
// FP8 wgmma reads both operands K-major, so B arrives transposed, B^T [E, N, K] (a weight is quantized once,
// and the quantizer writes it so: k8_quantize.cu). A 128-deep k-block of e4m3 is one 128-byte swizzle row,
// and a k32 step is 32 bytes along it: the operand boxes, their descriptors and their steps are exactly
// k6's K-major bf16 ones (descriptor_steps.cuh), with twice the elements in each byte.
//
// SWIGLU, the FP8 layer's GEMM 1 (blockwise only): B^T is [W_gate | W_up]^T [E, 2I, K] and a tile of 128
// output columns loads both 128-row boxes it needs, gate rows col0 .. col0 + 127 and up rows I further,
// multiplies each into accumulators of its own, and its epilogue writes act = silu(gate) x up: in bf16, or
// (OUT = E4M3) quantized in 1 x 128 groups for GEMM 2, e4m3 and one fp32 scale per row of the tile. A
// group of 128 activation columns is exactly one tile's, so its amax needs no other block, and the
// [M, 2I] product and the [M, I] activation are never written in bf16.
//
// The rest is k6's cooperative kernel on the device walk (chapter 07): a producer warp issues TMA into
// a ring of STAGES; two consumer warpgroups split each BM x 128 tile by rows (BM / 2 each: one or two m64
// slices) and both read every stage; persistent blocks walk the tiles expert by expert from the expert
// ends on the device (torch's offs), trusting none of them; each warpgroup stores its rows through a ring
// of STAGING_BOXES C staging boxes. A warpgroup issues only the m64 slices whose rows hold tokens.
#include "descriptor_steps.cuh"
#include "e4m3.cuh"
#include "epilogues.cuh"
#include "named_barriers.cuh"
#include "ptx.cuh"
#include "tile_walk.cuh"
#include "tma_pipeline.cuh"
#include "wgmma_config.cuh"

namespace k8 {

// --8<-- [start:config]
enum Scaling : int { BLOCKWISE = 0, ROWWISE = 1 };
enum Epilogue : int { STORE_C = 0, SWIGLU = 1 };  // C = A B; act = silu(gate) x up (module comment)
// OUT of the SwiGLU epilogue besides sm90::BF16: e4m3 with 1 x 128 scales, GEMM 2's A (moe_gemm.torch.quantize)
constexpr int E4M3 = 3;

template <int SCALING, bool PROMOTE, int BM, int STAGES, int STAGING_BOXES, int EPILOGUE = STORE_C,
          bool OVERLAP = false, bool PREFETCH = false>
struct Config {
    static_assert(SCALING == ROWWISE || PROMOTE, "blockwise scales change every 128 of K: they apply by promotion");
    static_assert(BM == 128 || BM == 256, "BM is 128 or 256 rows: one or two m64 slices per consumer warpgroup");
    // Two 128-column blocks of products cost a thread 128 accumulators, as two m64 slices do: one slice each.
    static_assert(EPILOGUE == STORE_C || (SCALING == BLOCKWISE && BM == 128),
                  "the SwiGLU epilogue is GEMM 1's in the blockwise layer, on 128-row tiles");
    // OVERLAP: a second scratch accumulator, so that a k-block's wgmmas run while the one before is promoted
    // (multiply_overlapped); 64 more registers a thread, which a 128-row tile of one block of B has to spare.
    static_assert(!OVERLAP || (PROMOTE && BM == 128 && EPILOGUE == STORE_C),
                  "the overlapped promotion holds two scratch sets beside one 64-float accumulator");
    // PREFETCH: each k-block's scales are loaded a k-block ahead, during the one before (multiply), so that the
    // k-block's wgmmas do not wait for an L2 round trip before they are issued; a few registers more.
    static_assert(!PREFETCH || (SCALING == BLOCKWISE && PROMOTE && !OVERLAP && EPILOGUE == STORE_C),
                  "the scales are prefetched by the blockwise promoted loop of one block of B");
    static constexpr bool PROMOTES = PROMOTE, OVERLAPS = OVERLAP, PREFETCHES = PREFETCH;
    static constexpr int BK = 128;   // e4m3 of K per stage: one 128-byte swizzle row, one scale block
    static constexpr int BN = 128;   // one block of B's scales wide, so one scale_b per stage and block
    static constexpr int B_BLOCKS = EPILOGUE == SWIGLU ? 2 : 1;  // B^T boxes per stage: gate and up, or one
    static constexpr int K_STEPS = BK / 32;                   // wgmma k32 steps per stage
    static constexpr int TILE_M = BM, WG_ROWS = BM / 2, M_ITERS = WG_ROWS / 64;
    static constexpr int PRODUCTS = M_ITERS * B_BLOCKS;       // accumulator sets of BN / 2 floats per thread
    static constexpr unsigned A_BYTES = BM * BK, B_BYTES = BN * BK;  // one byte per element; B_BYTES per box
    static constexpr unsigned STAGE_BYTES = A_BYTES + B_BLOCKS * B_BYTES;
    static constexpr bool BLOCKWISE_SCALES = SCALING == BLOCKWISE;
    static constexpr int EMPTY_ARRIVALS = 2;  // both consumer warpgroups read every stage
    // setmaxnreg as k6: a thread holds M_ITERS x 64 fp32 main accumulators and, promoting, 64 scratch ones.
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
    static constexpr unsigned STAGING_BYTES = 2 * STAGING_BOXES * sm90::BOX_BYTES;  // a ring per warpgroup
    // The host sizes the launch the same way (moe_gemm.variants.k8.config).
    static_assert(STAGES * STAGE_BYTES + STAGING_BYTES + sm90::SWIZZLE_ALIGN <= 232448 - 2304,
                  "the ring and the C staging fit the shared memory of one block");
    static_assert(STAGE_BYTES % sm90::SWIZZLE_ALIGN == 0, "every operand box starts on a 1 KB boundary");
};
// --8<-- [end:config]

// --8<-- [start:producer]
// One thread issues every copy: per unit (expert, row0, rows, col0) of the walk and per 128-deep k-block,
// A's box of BM rows and B^T's box of 128 columns of the expert (SWIGLU: two, rows col0 and N / 2 + col0
// of [W_gate | W_up]^T, the gate block and its up block). Rows past the expert (or past M_tot:
// zeros) are loaded and never stored; K past its end reads zeros, which add nothing.
//
// A's scales do not come this way. A TMA box must start on 16 bytes of global memory (PTX ISA 5.5.3.1,
// "Bounding Box"), and a box of the tile's BM row scales in the MN-major layout starts at row0 x 4 bytes:
// aligned only when the expert's first row is a multiple of 4, which torch's offs do not promise (the
// first run of a TMA-fed version stopped at an illegal instruction on exactly that). DeepGEMM loads them
// by TMA because its grouped layout pads every expert to the tile's rows; the consumers here read their
// own rows' scales with plain loads instead (multiply, below).
template <class Cfg, int STAGES, class Walk>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, const Walk& order,
                                        int units, int first, int stride, int k_steps, int N, unsigned ring,
                                        sm90::Slots<STAGES>& slots, unsigned long long* full,
                                        unsigned long long* empty) {
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_b);
    int stage = 0;
    unsigned phase = 0;
    for (int unit = first, ordinal = 0; unit < units; unit += stride, ++ordinal) {
        const int4 tile = order.unit(unit);
        for (int ks = 0; ks < k_steps; ++ks) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            if (ks == 0) slots.tile[ordinal % sm90::Slots<STAGES>::COUNT] = tile;  // released by the arrive below
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, Cfg::STAGE_BYTES);
            const unsigned a_dst = ring + stage * Cfg::STAGE_BYTES;
            const int k = ks * Cfg::BK;
            tma_load_2d(a_dst, tmap_a, k, tile.y, bar);
#pragma unroll
            for (int b = 0; b < Cfg::B_BLOCKS; ++b)  // B^T [E, N, K]: (k, n, e)
                tma_load_3d(a_dst + Cfg::A_BYTES + b * Cfg::B_BYTES, tmap_b, k, tile.w + b * (N / 2), tile.x, bar);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}
// --8<-- [end:producer]

// --8<-- [start:block_product]
// The two pieces both promoted loops share. A stage's descriptors for this warpgroup's rows of A and for B^T
// (both 128-byte K-major rows: a k32 step is 32 bytes along them, as a bf16 k16 step is in k6):
template <class Cfg>
__device__ __forceinline__ void stage_descriptors(unsigned ring, int stage, int warpgroup, unsigned long long& desc_a,
                                                  unsigned long long& desc_b) {
    constexpr OperandPlan PLAN = sm90::K_MAJOR_PLAN;
    const unsigned stage_base = ring + stage * Cfg::STAGE_BYTES;
    desc_a = sm90::warp_uniform(matrix_descriptor(PLAN.bits, stage_base + warpgroup * Cfg::M_ITERS * PLAN.mn64_bytes));
    desc_b = sm90::warp_uniform(matrix_descriptor(PLAN.bits, stage_base + Cfg::A_BYTES));
}

// m64 slice i of the stage times its box b of B^T, one 128-deep k-block, into `scratch` as one wgmma group.
template <class Cfg>
__device__ __forceinline__ void block_product(float (&scratch)[Cfg::BN / 2], unsigned long long desc_a,
                                              unsigned long long desc_b, int i, int b) {
    constexpr OperandPlan PLAN = sm90::K_MAJOR_PLAN;
    wgmma_fence();  // a promotion read `scratch`: order it before these wgmmas write it
#pragma unroll
    for (int kk = 0; kk < Cfg::K_STEPS; ++kk)
        wgmma_e4m3<Cfg::BN>(scratch, desc_a + sm90::descriptor_step(i * PLAN.mn64_bytes + kk * PLAN.k16_bytes),
                            desc_b + sm90::descriptor_step(b * Cfg::B_BYTES + kk * PLAN.k16_bytes), kk > 0);
    wgmma_commit();
}

// The promotion: the finished scratch sums into the fp32 accumulators, times the rows' scale_a x scale_b
// (blockwise; rowwise scales wait for the epilogue). A thread's element v lies in row half (v / 2) % 2.
template <class Cfg>
__device__ __forceinline__ void promote(float (&acc)[Cfg::BN / 2], const float (&scratch)[Cfg::BN / 2],
                                        const float (&scale)[2]) {
#pragma unroll
    for (int v = 0; v < Cfg::BN / 2; ++v) acc[v] += Cfg::BLOCKWISE_SCALES ? scratch[v] * scale[(v / 2) % 2] : scratch[v];
}
// --8<-- [end:block_product]

// --8<-- [start:consumer]
// A warpgroup's rows of one tile: SLICES m64 slices (0, 1 or 2: only those with rows; 0 waits for the
// stages and hands them back), each multiplied by the stage's B_BLOCKS boxes of B^T. SLICES is a template
// parameter because a wgmma under a run-time branch makes ptxas serialize every wgmma of the kernel
// (warning C7520).
//
// PROMOTE: per stage, slice i and block b, four k32 wgmmas into `scratch`, wait for them, then
//     acc[B_BLOCKS i + b] += scratch x scale_a[row] x scale_b[b]        (rowwise: += scratch)
// The stage goes back to the producer once the last product's wgmmas are done. Blockwise, the k-block's
// scales come from global memory, issued before the stage's wait: B's one float per block for the tile (the
// up block's row of scales `b_scale_stride` floats after the gate's), and A's for the thread's two rows of each
// slice, scale_a[ks][row], from the MN-major layout [K / 128, M_pad] (a warp's loads are 8 consecutive floats,
// the rows g: one or two 32-byte sectors). Their products, taken at the load, are scheduled by ptxas ahead of
// the k-block's first wgmma, which then waits for the loads when the stage was already full; PREFETCH loads
// them a k-block ahead and multiplies them a k-block later.
// The tensor core is idle while a warpgroup promotes, unless the other warpgroup's wgmmas are running:
// with two warpgroups on every stage, one's promotion overlaps the other's products.
// Not promoting: k6's loop, the tensor core accumulating all of K, each stage released once the next
// one's wgmmas are issued.
template <class Cfg, int SLICES, int STAGES>
__device__ __forceinline__ void multiply(float (&acc)[Cfg::PRODUCTS][Cfg::BN / 2], int warpgroup, int k_steps,
                                         unsigned ring, const float* __restrict__ scale_a_rows, int m_pad,
                                         int rows_in_range, const float* __restrict__ scale_b_row,
                                         int b_scale_stride, unsigned long long* full, unsigned long long* empty,
                                         int& stage, unsigned& phase) {
    static_assert(Cfg::PROMOTES || Cfg::B_BLOCKS == 1, "two blocks of B per stage are promoted one after the other");
    constexpr OperandPlan PLAN = sm90::K_MAJOR_PLAN;  // A and B^T: 128-byte rows, a k32 step 32 bytes along
    constexpr int PRODUCTS = SLICES * Cfg::B_BLOCKS;  // of this call: the slices with rows, times the blocks
    const int warp = (threadIdx.x % sm90::WARPGROUP) / 32, g = threadIdx.x % 32 / 4;
    int previous = -1;
    if constexpr (Cfg::PROMOTES) {
#pragma unroll
        for (int p = 0; p < PRODUCTS; ++p)
#pragma unroll
            for (int v = 0; v < Cfg::BN / 2; ++v) acc[p][v] = 0.0f;
    }
    // Blockwise: the thread's rows of A's scales are D rows 16 warp + 8h + g of each slice i, at
    // scale_a_rows[ks * M_pad + row]; rows past M_tot read none (their sums are never stored).
    const float* my_scales = scale_a_rows + 16 * warp + g;
    bool row_in[SLICES > 0 ? SLICES : 1][2];
#pragma unroll
    for (int i = 0; i < SLICES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_in[i][h] = 64 * i + 16 * warp + 8 * h + g < rows_in_range;
    // k-block ks's scales as loaded, A's for the thread's rows and B's for each block (my_scales moves on to the
    // next k-block's rows), and their products, the factor each accumulator set is promoted with.
    constexpr int SETS = PRODUCTS > 0 ? PRODUCTS : 1;
    auto fetch = [&](float (&row)[SLICES > 0 ? SLICES : 1][2], float (&block)[Cfg::B_BLOCKS], int ks) {
#pragma unroll
        for (int b = 0; b < Cfg::B_BLOCKS; ++b) block[b] = __ldg(scale_b_row + b * b_scale_stride + ks);
#pragma unroll
        for (int i = 0; i < SLICES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) row[i][h] = row_in[i][h] ? __ldg(my_scales + 64 * i + 8 * h) : 0.0f;
        my_scales += m_pad;
    };
    auto products = [&](const float (&row)[SLICES > 0 ? SLICES : 1][2], const float (&block)[Cfg::B_BLOCKS],
                        float (&row_scale)[SETS][2]) {
#pragma unroll
        for (int i = 0; i < SLICES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int b = 0; b < Cfg::B_BLOCKS; ++b) row_scale[Cfg::B_BLOCKS * i + b][h] = row[i][h] * block[b];
    };
    // PREFETCH: k-block ks's scales as loaded during ks - 1, multiplied only when ks begins. A product taken at
    // the load would wait for it before this k-block's wgmmas are issued, and the prefetch would buy nothing.
    float next_row[SLICES > 0 ? SLICES : 1][2], next_block[Cfg::B_BLOCKS];
    if constexpr (Cfg::PREFETCHES && SLICES > 0) fetch(next_row, next_block, 0);
    for (int ks = 0; ks < k_steps; ++ks) {
        // This k-block's scales, loaded before the wait (PREFETCH: during the k-block before, this one loading
        // the next's).
        float row_scale[SETS][2];
        if constexpr (Cfg::BLOCKWISE_SCALES && SLICES > 0) {
            if constexpr (Cfg::PREFETCHES) {
                products(next_row, next_block, row_scale);
                if (ks + 1 < k_steps) fetch(next_row, next_block, ks + 1);
            } else {
                float row[SLICES][2], block[Cfg::B_BLOCKS];
                fetch(row, block, ks);
                products(row, block, row_scale);
            }
        }
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);
        if constexpr (SLICES > 0) {
            unsigned long long desc_a, desc_b;
            stage_descriptors<Cfg>(ring, stage, warpgroup, desc_a, desc_b);
            if constexpr (Cfg::PROMOTES) {
                float scratch[Cfg::BN / 2];
#pragma unroll
                for (int p = 0; p < PRODUCTS; ++p) {
                    block_product<Cfg>(scratch, desc_a, desc_b, p / Cfg::B_BLOCKS, p % Cfg::B_BLOCKS);
                    wgmma_wait<0>();
                    fence_accumulators(scratch);
                    if (p == PRODUCTS - 1) sm90::release<1>(empty, stage);
                    promote<Cfg>(acc[p], scratch, row_scale[p]);
                }
            } else {
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < Cfg::K_STEPS; ++kk)
#pragma unroll
                    for (int i = 0; i < SLICES; ++i)
                        wgmma_e4m3<Cfg::BN>(acc[i], desc_a + sm90::descriptor_step(i * PLAN.mn64_bytes + kk * PLAN.k16_bytes),
                                            desc_b + sm90::descriptor_step(kk * PLAN.k16_bytes), ks > 0 || kk > 0);
                wgmma_commit();
                wgmma_wait<1>();  // the previous stage's wgmmas are done: hand it back (k3's loop)
                if (previous >= 0) sm90::release<1>(empty, previous);
                previous = stage;
            }
        } else {
            sm90::release<1>(empty, stage);
        }
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    if constexpr (!Cfg::PROMOTES && SLICES > 0) {
        wgmma_wait<0>();
        if (previous >= 0) sm90::release<1>(empty, previous);
    }
}
// --8<-- [end:consumer]

// --8<-- [start:overlapped]
// The promoted loop of one m64 slice with the promotion taken off the tensor core's path (OVERLAP). Above, a
// warpgroup waits for a k-block's wgmmas to finish before it promotes them, and the tensor core has nothing of
// its to run meanwhile; only the other warpgroup's wgmmas can fill the gap, if the two happen to be out of
// step. Here k-block ks + 1 is issued into a second scratch accumulator before ks is promoted: wait<1> returns
// once ks's group is done while ks + 1's runs, so the promotion's FFMAs overlap this warpgroup's own products.
// The two scratch sets alternate, the loop unrolled by two so that each is a fixed set of registers (an index
// chosen at run time would put them in local memory).
template <class Cfg, int STAGES>
__device__ __forceinline__ void multiply_overlapped(float (&acc)[1][Cfg::BN / 2], int warpgroup, int k_steps,
                                                    unsigned ring, const float* __restrict__ scale_a_rows, int m_pad,
                                                    int rows_in_range, const float* __restrict__ scale_b_row,
                                                    unsigned long long* full, unsigned long long* empty, int& stage,
                                                    unsigned& phase) {
    const int warp = (threadIdx.x % sm90::WARPGROUP) / 32, g = threadIdx.x % 32 / 4;
    const float* my_scales = scale_a_rows + 16 * warp + g;
    bool row_in[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) row_in[h] = 16 * warp + 8 * h + g < rows_in_range;
#pragma unroll
    for (int v = 0; v < Cfg::BN / 2; ++v) acc[0][v] = 0.0f;
    float even[Cfg::BN / 2], odd[Cfg::BN / 2];  // the scratch sets of even and odd k-blocks
    float even_scale[2], odd_scale[2];           // their rows' scale_a x scale_b (blockwise)
    int even_stage = 0, odd_stage = 0;
    // Issue k-block ks into `scratch`: its scales first (their loads overlap the wait), then the stage's wait,
    // then the four k32 wgmmas as one group. The stage goes back once the group is done.
    auto issue = [&](float (&scratch)[Cfg::BN / 2], float (&scale)[2], int& issued_stage, int ks) {
        if constexpr (Cfg::BLOCKWISE_SCALES) {
            const float scale_b = __ldg(scale_b_row + ks);
#pragma unroll
            for (int h = 0; h < 2; ++h)
                scale[h] = (row_in[h] ? __ldg(my_scales + static_cast<long long>(ks) * m_pad + 8 * h) : 0.0f) * scale_b;
        }
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);
        unsigned long long desc_a, desc_b;
        stage_descriptors<Cfg>(ring, stage, warpgroup, desc_a, desc_b);
        block_product<Cfg>(scratch, desc_a, desc_b, 0, 0);
        issued_stage = stage;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    };
    // The k-block `scratch` holds is done (`wait<1>`: the next one may still run): hand its stage back, promote it.
    auto finish = [&](float (&scratch)[Cfg::BN / 2], const float (&scale)[2], int done_stage) {
        fence_accumulators(scratch);
        sm90::release<1>(empty, done_stage);
        promote<Cfg>(acc[0], scratch, scale);
    };
    // The loop keeps one group in flight at its head (k-block ks, in `even`) and takes two k-blocks a turn; the
    // last one or two are the tail's. No wgmma is issued under a condition that leaves it in flight where the
    // paths meet: ptxas would serialize every wgmma of the kernel (its C7518).
    issue(even, even_scale, even_stage, 0);
    int ks = 0;
    for (; ks + 2 < k_steps; ks += 2) {
        issue(odd, odd_scale, odd_stage, ks + 1);
        wgmma_wait<1>();
        finish(even, even_scale, even_stage);
        issue(even, even_scale, even_stage, ks + 2);
        wgmma_wait<1>();
        finish(odd, odd_scale, odd_stage);
    }
    if (ks + 1 < k_steps) {
        issue(odd, odd_scale, odd_stage, ks + 1);
        wgmma_wait<1>();
        finish(even, even_scale, even_stage);
        wgmma_wait<0>();
        finish(odd, odd_scale, odd_stage);
    } else {
        wgmma_wait<0>();
        finish(even, even_scale, even_stage);
    }
}
// --8<-- [end:overlapped]

// --8<-- [start:rowwise]
// The rowwise scales, applied once in the epilogue: element (r, c) times scale_a[r] x scale_b[e][c]. Each m64
// slice is scaled into a copy that the store then takes: where the wgmmas write the accumulators (not
// promoted), rewriting them would make ptxas serialize those wgmmas (its C7515). On 256-row tiles a copy of a
// slice beside the 128 sums spills (and the whole tile's copy more so); there the sums are promoted, the
// kernel's own registers (the wgmmas write the scratch), so the tile is scaled in place, each column pair's
// scales loaded once for both slices, and stored whole. A thread holds rows 16 warp + 8h + g of a slice and
// the column pairs 8j + 2t, + 1; a pair's two scales are one 8-byte load (N % 8 == 0 and the column is
// even). Rows past M_tot read no scale.
struct OneSlice {  // what sm90::store_slices reads of a configuration: the slices it stores
    static constexpr int M_ITERS = 1;
};

template <int BN, int SLICES>
__device__ __forceinline__ void scale_rows(const float (&acc)[SLICES][BN / 2], float (&scaled)[SLICES][BN / 2],
                                           int row0, int col0, const float* __restrict__ scale_a,
                                           const float* __restrict__ expert_scales, int tokens, int N) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % sm90::WARPGROUP) / 32, g = lane / 4, t = lane % 4;
    float row_scale[SLICES][2];
#pragma unroll
    for (int i = 0; i < SLICES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 64 * i + 16 * warp + 8 * h + g;
            row_scale[i][h] = row < tokens ? __ldg(scale_a + row) : 0.0f;
        }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        const float2 column = col < N ? __ldg(reinterpret_cast<const float2*>(expert_scales + col)) : make_float2(0, 0);
#pragma unroll
        for (int i = 0; i < SLICES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                scaled[i][4 * j + 2 * h] = acc[i][4 * j + 2 * h] * (row_scale[i][h] * column.x);
                scaled[i][4 * j + 2 * h + 1] = acc[i][4 * j + 2 * h + 1] * (row_scale[i][h] * column.y);
            }
    }
}
// --8<-- [end:rowwise]

// --8<-- [start:swiglu]
// The SwiGLU epilogue. Gate and up of the same element sit at the same index of the thread's two products
// (acc[0] and acc[1]: the same rows times the gate block and the up block), so act = silu(gate) x up is one
// pass over the registers, in fp32. silu(g) = g / (1 + e^-g) with the fast division: its 2 ulp are 2^-22 of
// the value, where e4m3's step is 2^-3 (and bf16's 2^-8).
template <int BN>
__device__ __forceinline__ void swiglu(const float (&acc)[2][BN / 2], float (&act)[1][BN / 2]) {
#pragma unroll
    for (int v = 0; v < BN / 2; ++v) {
        const float gate = acc[0][v], up = acc[1][v];
        act[0][v] = __fdividef(gate, 1.0f + __expf(-gate)) * up;
    }
}

// --8<-- [start:quad]
// Two 32-bit words of 16-bit halves, from this lane's word and its partner's: (lo, lo) and (hi, hi), this lane's
// half first unless ``partner_first``. PRMT's selector picks the bytes (0-3 this word's, 4-7 the partner's).
__device__ __forceinline__ uint2 pair_halves(unsigned mine, unsigned partner, bool partner_first) {
    return {__byte_perm(mine, partner, partner_first ? 0x1054 : 0x5410),
            __byte_perm(mine, partner, partner_first ? 0x3276 : 0x7632)};
}

// A quad's 4 x 4 two-byte e4m3 pairs transposed: lane t holds the pairs of columns 8j + 2t (j = 0..3 of 32
// columns) and ends with the 8 consecutive bytes of columns 8t .. 8t + 7, the pairs of lanes 0..3 in order. Two
// exchanges of one word each: across lanes t ^ 2 the half of the j's this lane does not keep, then across t ^ 1.
__device__ __forceinline__ uint2 quad_transpose(unsigned short p0, unsigned short p1, unsigned short p2,
                                                unsigned short p3, int t) {
    const unsigned a = p0 | static_cast<unsigned>(p1) << 16, b = p2 | static_cast<unsigned>(p3) << 16;
    const bool upper = t & 2, odd = t & 1;
    // lanes 0, 1 keep j = 0, 1 and lanes 2, 3 keep j = 2, 3, each taking its partner's pairs of those j
    const unsigned kept = upper ? b : a, got = __shfl_xor_sync(0xffffffffu, upper ? a : b, 2);
    const uint2 by_j = pair_halves(kept, got, upper);  // this lane's two j, each from lanes t & 1 and (t & 1) + 2
    // lane t keeps its own j = t and hands the other to lane t ^ 1
    const unsigned mine = odd ? by_j.y : by_j.x, theirs = __shfl_xor_sync(0xffffffffu, odd ? by_j.x : by_j.y, 1);
    return pair_halves(mine, theirs, odd);  // lanes (0, 1) and (2, 3) of column block j = t
}
// --8<-- [end:quad]

// The activation's rows quantized in 1 x 128 groups, as quantize_1x128 quantizes (kernels/k8_quantize.cu,
// e4m3_scale), and stored: e4m3 to q [M_tot, width] and one scale per row to scale [width / 128, M_pad],
// MN-major, GEMM 2's layout. The tile's 128 columns are one group. A thread holds 32 of a row's 128 values
// (row 16 warp + 8h + g, columns 8j + 2t and the next), so the row's amax is the maximum over the quad's
// four lanes: two shuffles. The values are multiplied by the scale's reciprocal, where the separate pass
// divides: one multiply for ten instructions, and the product is within one fp32 ulp of the quotient, which
// moves an e4m3 rounding only at a tie. A thread's pairs are two bytes apart from its quad's (the quad holds
// 8 consecutive bytes of a row per j); stored as they are (QUAD false, the first version), that is 16 two-byte
// stores per row and thread, a warp's store touching 8 bytes of each of 8 sectors. Transposed within the quad
// first (QUAD: two shuffles, four byte permutations per 32 columns), each thread stores 8 consecutive bytes and
// the quad a whole 32-byte sector: 4 stores per row and thread. A tile writes 16 KB of q against the 384 x K
// bytes its main loop loads.
template <int BN, bool QUAD>
__device__ __forceinline__ void store_e4m3(const float (&act)[BN / 2], int row0, int rows, int col0,
                                           unsigned char* __restrict__ q, float* __restrict__ scale, int width,
                                           int m_pad) {
    static_assert(BN == e4m3::GROUP, "a tile's columns are one 1 x 128 group");
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % sm90::WARPGROUP) / 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            amax = fmaxf(amax, fmaxf(fabsf(act[4 * j + 2 * h]), fabsf(act[4 * j + 2 * h + 1])));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // every lane takes part: the quad's row
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float s = e4m3::scale_of(amax), inverse = __frcp_rn(s);
        unsigned short pairs[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            pairs[j] = pack_e4m3x2(act[4 * j + 2 * h] * inverse, act[4 * j + 2 * h + 1] * inverse);
        uint2 bytes[BN / 32];  // transposed by every lane (the shuffles need the quad), stored by the rows in range
        if constexpr (QUAD) {
#pragma unroll
            for (int m = 0; m < BN / 32; ++m)
                bytes[m] = quad_transpose(pairs[4 * m], pairs[4 * m + 1], pairs[4 * m + 2], pairs[4 * m + 3], t);
        }
        const int r = 16 * warp + 8 * h + g;
        if (r >= rows) continue;  // the next expert's row (or past M_tot): computed, never stored
        unsigned char* q_row = q + static_cast<long long>(row0 + r) * width + col0;
        if constexpr (QUAD) {
#pragma unroll
            for (int m = 0; m < BN / 32; ++m) *reinterpret_cast<uint2*>(q_row + 32 * m + 8 * t) = bytes[m];
        } else {
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) *reinterpret_cast<unsigned short*>(q_row + 8 * j + 2 * t) = pairs[j];
        }
        if (t == 0) scale[static_cast<long long>(col0 / BN) * m_pad + row0 + r] = s;
    }
}
// --8<-- [end:swiglu]

// --8<-- [start:body]
// N is B^T's rows: C's columns, or SWIGLU's 2I (C = act [M_tot, I], `width` = I, and scale_c its scales for
// OUT = E4M3).
template <int SCALING, bool PROMOTE, int BM, int STAGES, int STAGING_BOXES, int OUT, int EPILOGUE = STORE_C,
          bool OVERLAP = false, bool PREFETCH = false, bool QUAD_STORE = true>
__device__ __forceinline__ void k8_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b,
                                        const CUtensorMap* tmap_c, void* C,
                                        const float* scale_a, const float* scale_b, const int* ends, int tokens,
                                        int experts, int group, int K, int N, float* scale_c = nullptr) {
    static_assert(EPILOGUE == SWIGLU ? OUT == sm90::BF16 || OUT == E4M3 : OUT == sm90::BF16 || OUT == sm90::F32,
                  "C in bf16 or fp32; the activation in bf16 or e4m3");
    using Cfg = Config<SCALING, PROMOTE, BM, STAGES, STAGING_BOXES, EPILOGUE, OVERLAP, PREFETCH>;
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    __shared__ walk::Walk<BM, Cfg::BN> order;  // 2 KB
    __shared__ sm90::Slots<STAGES> slots;
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + sm90::SWIZZLE_ALIGN - 1) & ~(sm90::SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;
    const int m_pad = (tokens + 3) / 4 * 4;  // blockwise: scale_a is [K / 128, M_pad], its rows padded to 4
    const int warpgroup = threadIdx.x / sm90::WARPGROUP;
    const int k_steps = (K + Cfg::BK - 1) / Cfg::BK;  // the host checked K % 16 == 0 and K > 0
    const int k_blocks = k_steps, n_blocks = (N + Cfg::BN - 1) / Cfg::BN;
    const int width = EPILOGUE == SWIGLU ? N / 2 : N;  // the walk's and C's columns (the host checked I % 128 == 0)
    const int b_scale_stride = width / Cfg::BN * k_blocks;  // SWIGLU: from the gate block's scales to the up block's

    order.build(ends, experts, tokens, width, group);
    const int units = order.total();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), Cfg::EMPTY_ARRIVALS);
        }
        fence_barrier_init();
    }
    __syncthreads();

    const int first = blockIdx.x, stride = gridDim.x;
    if (warpgroup == 2) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x % sm90::WARPGROUP == 0)
            produce<Cfg, STAGES>(tmap_a, tmap_b, order, units, first, stride, k_steps, N, ring, slots, full, empty);
    } else {
        setmaxnreg_inc<Cfg::CONSUMER_REGS>();
        float acc[Cfg::PRODUCTS][Cfg::BN / 2];
        const unsigned my_staging = staging + warpgroup * STAGING_BOXES * sm90::BOX_BYTES;
        const int mine = first < units ? (units - first + stride - 1) / stride : 0;  // this block's units
        int stage = 0, stored = 0;
        unsigned phase = 0;
        for (int ordinal = 0; ordinal < mine; ++ordinal) {
            mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // the unit's first stage, and its slot
            const int4 tile = slots.tile[ordinal % sm90::Slots<STAGES>::COUNT];
            const int row0 = tile.y + warpgroup * Cfg::WG_ROWS;
            const int rows = min(min(tile.z - warpgroup * Cfg::WG_ROWS, Cfg::WG_ROWS), tokens - row0);
            const int slices = rows <= 0 ? 0 : (rows + 63) / 64;
            // blockwise: this warpgroup's rows of scale_a's first k-block, and the tile's row of B's scales
            const float* scale_a_rows = scale_a + row0;
            const float* scale_b_row =
                scale_b + (static_cast<long long>(tile.x) * n_blocks + tile.w / Cfg::BN) * k_blocks;
            if constexpr (Cfg::OVERLAPS) {  // one m64 slice a warpgroup (BM = 128): slices is 0 or 1
                if (slices > 0)
                    multiply_overlapped<Cfg, STAGES>(acc, warpgroup, k_steps, ring, scale_a_rows, m_pad,
                                                     tokens - row0, scale_b_row, full, empty, stage, phase);
                else
                    multiply<Cfg, 0, STAGES>(acc, warpgroup, k_steps, ring, scale_a_rows, m_pad, tokens - row0,
                                             scale_b_row, b_scale_stride, full, empty, stage, phase);
            } else if (slices >= 2)
                multiply<Cfg, Cfg::M_ITERS, STAGES>(acc, warpgroup, k_steps, ring, scale_a_rows, m_pad, tokens - row0,
                                                    scale_b_row, b_scale_stride, full, empty, stage, phase);
            else if (slices == 1)
                multiply<Cfg, 1, STAGES>(acc, warpgroup, k_steps, ring, scale_a_rows, m_pad, tokens - row0, scale_b_row,
                                         b_scale_stride, full, empty, stage, phase);
            else
                multiply<Cfg, 0, STAGES>(acc, warpgroup, k_steps, ring, scale_a_rows, m_pad, tokens - row0, scale_b_row,
                                         b_scale_stride, full, empty, stage, phase);
            if (slices > 0) {
                if constexpr (EPILOGUE == SWIGLU) {
                    float act[1][Cfg::BN / 2];
                    swiglu<Cfg::BN>(acc, act);
                    if constexpr (OUT == E4M3)
                        store_e4m3<Cfg::BN, QUAD_STORE>(act[0], row0, rows, tile.w, static_cast<unsigned char*>(C), scale_c,
                                            width, m_pad);
                    else
                        sm90::store_slices<OneSlice, STAGING_BOXES, Cfg::BN, OUT>(act, row0, rows, tile.w, warpgroup,
                                                                                  my_staging, stored, tmap_c, C, width);
                } else if constexpr (SCALING == ROWWISE && PROMOTE && Cfg::M_ITERS == 2) {
                    scale_rows<Cfg::BN, Cfg::M_ITERS>(acc, acc, row0, tile.w, scale_a,
                                                      scale_b + static_cast<long long>(tile.x) * N, tokens, N);
                    sm90::store_slices<Cfg, STAGING_BOXES, Cfg::BN, OUT>(acc, row0, rows, tile.w, warpgroup, my_staging,
                                                                         stored, tmap_c, C, N);
                } else if constexpr (SCALING == ROWWISE) {
#pragma unroll
                    for (int i = 0; i < Cfg::M_ITERS; ++i) {
                        if (i >= slices) break;
                        float scaled[1][Cfg::BN / 2];
                        scale_rows<Cfg::BN, 1>(reinterpret_cast<const float(&)[1][Cfg::BN / 2]>(acc[i]), scaled,
                                               row0 + 64 * i, tile.w, scale_a,
                                               scale_b + static_cast<long long>(tile.x) * N, tokens, N);
                        sm90::store_slices<OneSlice, STAGING_BOXES, Cfg::BN, OUT>(scaled, row0 + 64 * i, rows - 64 * i,
                                                                                  tile.w, warpgroup, my_staging, stored,
                                                                                  tmap_c, C, N);
                    }
                } else {
                    sm90::store_slices<Cfg, STAGING_BOXES, Cfg::BN, OUT>(acc, row0, rows, tile.w, warpgroup, my_staging,
                                                                         stored, tmap_c, C, N);
                }
            }
        }
        if (threadIdx.x % sm90::WARPGROUP == 0) bulk_wait<0>();  // the staged boxes are read before exit
    }
}
// --8<-- [end:body]

}  // namespace k8

// --8<-- [start:kernel]
#define K8_PARAMS                                                                                              \
    const __grid_constant__ CUtensorMap tmap_a,   /* A [M_tot, K] e4m3: box {128, BM}                      */ \
    const __grid_constant__ CUtensorMap tmap_b,   /* B^T [E, N, K] e4m3: {K, N, E}, box {128, 128, 1}      */ \
    const __grid_constant__ CUtensorMap tmap_c,   /* C [M_tot, N]: box {64, 64}                            */ \
    void* __restrict__ C,                         /* [M_tot, N] in OUT: bf16 or fp32                       */ \
    const float* __restrict__ scale_a,            /* [K/128, M_pad] MN-major; rowwise: [M_tot]          */ \
    const float* __restrict__ scale_b,            /* blockwise: [E, N/128, K/128]; rowwise: [E, N]         */ \
    const int* __restrict__ ends,                 /* [E] cumulative row ends (torch's offs), on the device */ \
    int tokens, int experts, int group, int K, int N

// OVERLAP and PREFETCH (trailing, default false: the other instances keep their names): multiply_overlapped's
// loop; the scales loaded a k-block ahead (Config).
template <int SCALING, bool PROMOTE, int BM, int STAGES, int STAGING_BOXES, int OUT, bool OVERLAP = false,
          bool PREFETCH = false>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k8_fp8(K8_PARAMS) {
    k8::k8_body<SCALING, PROMOTE, BM, STAGES, STAGING_BOXES, OUT, k8::STORE_C, OVERLAP, PREFETCH>(
        &tmap_a, &tmap_b, &tmap_c, C, scale_a, scale_b, ends, tokens, experts, group, K, N);
}

// The FP8 layer's GEMM 1 with the SwiGLU epilogue: blockwise, 128 x 128 tiles of the activation, B^T =
// [W_gate | W_up]^T [E, N = 2I, K]. OUT = BF16: C = act [M_tot, I] (tmap_c its map, STAGING_BOXES a
// warpgroup's boxes); OUT = E4M3: C = q [M_tot, I] and scale_c [I / 128, M_pad] (stored from registers:
// tmap_c unused, STAGING_BOXES 0), each quad's bytes transposed before the stores unless QUAD_STORE is false
// (the first version, kept to measure what the transpose saves: store_e4m3).
template <int STAGES, int STAGING_BOXES, int OUT, bool QUAD_STORE = true>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k8_fp8_swiglu(K8_PARAMS, float* __restrict__ scale_c) {
    k8::k8_body<k8::BLOCKWISE, true, 128, STAGES, STAGING_BOXES, OUT, k8::SWIGLU, false, false, QUAD_STORE>(
        &tmap_a, &tmap_b, &tmap_c, C, scale_a, scale_b, ends, tokens, experts, group, K, N, scale_c);
}
// --8<-- [end:kernel]
