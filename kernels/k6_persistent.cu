// k6_persistent.cu: chapter 07's kernel, the last mile. k3's TMA ring and wgmma consumers, with what
// the strongest Hopper GEMMs (CUTLASS's and quack's) add on top, one template parameter per rung:
//
//   python chapters/07/run.py              # check, time and compare with quack (needs an sm_90a GPU)
//   pytest tests/test_k6.py                # compiles every rung for sm_90a, no GPU needed
//
//   MODE = PINGPONG     (a) the two consumer warpgroups each own a whole 128 x BN tile and take
//                           turns: while one drains and stores its tile, the other multiplies the
//                           next. A pair of named barriers hands the tensor cores over in order.
//   CLUSTER_N = 2       (b) two blocks of a cluster take the same rows of one expert and
//                           neighbouring N tiles; each loads half of A's box and multicasts it to
//                           both. N is never ragged, so every unit pairs; an odd last N tile runs
//                           with a partner whose columns start past N, which loads its half of A
//                           for its peer and multiplies nothing.
//   CLUSTER_M = 2           chapter 04's pairing, for comparison: two M tiles of one expert share
//                           B's boxes (an expert's odd last M tile pairs with an empty partner).
//   MODE = COOPERATIVE  (c) one 256 x BN tile, 128 rows per warpgroup: each B box comes from L2
//                           once per 256 rows instead of per 128.
//   group (run time)    (d) the persistent walk in raster groups (tile_walk.cuh).
//   DEVICE_SCHEDULE     (f) the walk is found from the expert ends on the device: no host list.
//   PDL                 (h) programmatic dependent launch: a launch starts while the one before it on the
//                           stream finishes, its barriers set up before it waits for that one's results.
//   PRIVATE_RINGS           a staging ring per ping-pong warpgroup instead of one they take turns on.
//   PRODUCER_TAIL           a cluster's blocks end on the producer's wait for its ring to drain, not on a
//                           cluster barrier that every warp (the idle producer warps too) waits in.
//   CURSOR                  the device walk's producer finds each unit from the last one's place (a
//                           block's units advance by a fixed stride) instead of searching the experts.
//   LIST_UNITS              the block's first units are looked up by all its threads at once before the
//                           main loop, so the producer reads them from shared memory.
//   IN, OUT                 the element types: bf16 or fp16 operands (wgmma's .bf16 or .f16, one
//                           rate), a bf16, fp16 or fp32 C (an fp32 C is stored from registers).
//   EPILOGUE                C as it is, or an MoE layer's SwiGLU fused in: its forward after GEMM 1
//                           (chapter 08), its backward after the dA GEMM of GEMM 2 (chapter 09).
//   L2_HINTS                the backward's loads carry L2 eviction priorities: W_down's boxes
//                           evict-last, the saved pre-activation evict-first.
//   RASTER_N                the raster groups run along N (groups of columns, the expert's M tiles
//                           walked inside, every other group upward): quack's varlen order.
//
// Every consumer warpgroup owns 128 rows (two m64 wgmmas per k16 step, BN/2 x 2 accumulators per
// thread) and issues only the m64 wgmmas whose rows hold tokens: a tile with 40 rows pays for one
// m64 slice, not two. The epilogue stages C through a small ring of STAGING_BOXES 64 x 64 boxes so
// that the shared memory goes to the operand ring instead: one ring per warpgroup in cooperative
// mode, where both store at once, and one ring for the block in ping-pong, where the epilogues take
// turns as the main loops do (as CUTLASS's and quack's ping-pong kernels do).
#include "descriptor_steps.cuh"
#include "epilogues.cuh"
#include "named_barriers.cuh"
#include "ptx.cuh"
#include "tile_walk.cuh"
#include "tma_pipeline.cuh"
#include "wgmma_config.cuh"

namespace k6 {

// --8<-- [start:config]
enum Mode : int { PINGPONG = 0, COOPERATIVE = 1 };
// STORE_C: C = A B. ACT_SWIGLU: B = [W_gate | W_up], C = silu(gate) * up. DACT_SWIGLU: C = dh, the gradient of
// the SwiGLU's pre-activation, from the accumulators (dact) and the saved pre-activation.
enum Epilogue : int { STORE_C = 0, ACT_SWIGLU = 1, DACT_SWIGLU = 2 };

template <int MODE, int BN, int STAGES, int CLUSTER_M, int CLUSTER_N, bool B_K_MAJOR, int STAGING_BOXES,
          bool PRIVATE_RINGS = false>
struct Config {
    static_assert(MODE == PINGPONG || MODE == COOPERATIVE, "ping-pong or cooperative consumers");
    static_assert(BN % sm90::BOX == 0 && BN <= 256, "BN is 64, 128, 192 or 256 columns");
    static_assert(CLUSTER_M * CLUSTER_N <= 2, "clusters of one or two blocks, along M or along N");
    static constexpr int CLUSTER = CLUSTER_M * CLUSTER_N, ALONG_M = CLUSTER_M, ALONG_N = CLUSTER_N;
    static constexpr int WG_ROWS = 128, M_ITERS = 2;             // two m64 slices per warpgroup
    static constexpr int BM = MODE == PINGPONG ? WG_ROWS : 2 * WG_ROWS;
    static constexpr int TILE_N = BN;
    static constexpr unsigned A_BYTES = BM * sm90::BK * 2;
    static constexpr unsigned B_BYTES = BN * sm90::BK * 2;
    static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int B_BOXES = BN / sm90::BOX;
    // Along N each block loads A_SHARE_ROWS of A's box and multicasts them to both; along M each
    // loads B_SHARE_ROWS of every B box (its rows: K for B, N for B^T) for both, an equal share at any
    // BN (whole boxes in turn gave one block two of BN = 192's three). Half a box starts 4 KB in: a
    // multiple of the 1 KB the 128-byte swizzle repeats over, so both halves land as one box would.
    static constexpr int A_SHARE_ROWS = BM / CLUSTER_N;
    static constexpr unsigned A_SHARE_BYTES = A_BYTES / CLUSTER_N;
    static constexpr int B_SHARE_ROWS = sm90::BOX / CLUSTER_M;
    static constexpr unsigned B_SHARE_BYTES = sm90::BOX_BYTES / CLUSTER_M;
    // A unit of work: UNIT_ROWS x UNIT_COLS, one tile per block of the cluster.
    static constexpr int UNIT_ROWS = BM * CLUSTER_M, UNIT_COLS = BN * CLUSTER_N;
    // Consumer warpgroups that read each stage: one in ping-pong (the stage belongs to one tile),
    // both in cooperative; empty[s] also waits for the peer block's readers (either producer writes
    // into both rings).
    static constexpr int READERS = MODE == PINGPONG ? 1 : 2;
    static constexpr int EMPTY_ARRIVALS = READERS * CLUSTER;
    // setmaxnreg: a 128 x 192 warpgroup tile holds 192 fp32 accumulators per thread, so the
    // consumers take 232 registers and the producer keeps 40: 2 x 128 x 232 + 128 x 40 = 64,512.
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
    // One staging ring that the ping-pong epilogues take turns on, or (PRIVATE_RINGS, and cooperative tiles,
    // whose two epilogues store at once) a ring per consumer warpgroup.
    static constexpr bool SHARED_RING = MODE == PINGPONG && !PRIVATE_RINGS;
    static constexpr int STAGING_RINGS = SHARED_RING ? 1 : 2;
    static constexpr unsigned STAGING_BYTES = STAGING_RINGS * STAGING_BOXES * sm90::BOX_BYTES;  // per block
    // The host sizes the launch the same way (moe_gemm.variants.k6.config): ring, staging and the 1 KB
    // the ring's alignment may cost, within the 227 KB a block may have less the static part (barriers,
    // the device walk's 2 KB, the slots).
    static_assert(STAGES * STAGE_BYTES + STAGING_BYTES + sm90::SWIZZLE_ALIGN <= 232448 - 2304,
                  "the ring and the C staging fit the shared memory of one block");
    static_assert(STAGE_BYTES % sm90::SWIZZLE_ALIGN == 0 && A_SHARE_BYTES % sm90::SWIZZLE_ALIGN == 0 &&
                      B_SHARE_BYTES % sm90::SWIZZLE_ALIGN == 0,
                  "every stage, box and share of one starts on a 1 KB boundary (the 128-byte swizzle's period)");
};

// --8<-- [end:config]

// --8<-- [start:producer]
// One thread issues every copy. Unit j's tile for this block is (expert, row0, rows, col0 + rank
// x BN) along N, (expert, row0 + rank x BM, rows - rank x BM, col0) along M; its stages carry all
// of A's box and the B boxes that start before column N (none for a partner past N: it multiplies
// nothing), each shared box loaded half by each block of the cluster. SWIGLU: B is [W_gate | W_up]
// [E, K, N] as a transformers checkpoint stores it, and the tile at columns col0 .. col0 + 127 of
// the fused walk loads gate columns col0 / 2 .. + 63 and the up columns N / 2 further: the pair
// the epilogue multiplies, with no interleaved copy of the weights.
template <class Cfg, int STAGES, int CLUSTER, bool B_K_MAJOR, bool SWIGLU, bool TAIL, bool B_EVICT_LAST, class UnitAt,
          class AfterUnit>
__device__ __forceinline__ void produce(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, UnitAt&& unit_at,
                                        int units, int first, int stride, unsigned rank, int k_steps, int N,
                                        unsigned ring, sm90::Slots<STAGES>& slots, unsigned long long* full,
                                        unsigned long long* empty, AfterUnit&& after_unit) {
    tma_prefetch_descriptor(tmap_a);
    tma_prefetch_descriptor(tmap_b);
    int stage = 0;
    unsigned phase = 0;
    for (int unit = first, ordinal = 0; unit < units; unit += stride, ++ordinal) {
        int4 tile = unit_at(unit);
        if constexpr (Cfg::ALONG_N == 2) tile.w += rank * Cfg::TILE_N;
        if constexpr (Cfg::ALONG_M == 2) tile.y += rank * Cfg::BM, tile.z -= rank * Cfg::BM;  // z <= 0: no rows
        const int boxes = tile.w < N ? min(Cfg::B_BOXES, (N - tile.w + sm90::BOX - 1) / sm90::BOX) : 0;
        const unsigned stage_tx = Cfg::A_BYTES + boxes * sm90::BOX_BYTES;
        for (int ks = 0; ks < k_steps; ++ks) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            if (ks == 0) slots.tile[ordinal % sm90::Slots<STAGES>::COUNT] = tile;  // released by the arrive below
            const unsigned bar = smem_u32(&full[stage]);
            mbarrier_arrive_expect_tx(bar, stage_tx);
            const unsigned a_dst = ring + stage * Cfg::STAGE_BYTES;
            const int k = ks * sm90::BK;
            // Rows past the expert (or past M_tot: zeros) are loaded and never stored.
            if constexpr (Cfg::ALONG_N == 2)
                tma_load_2d_multicast(a_dst + rank * Cfg::A_SHARE_BYTES, tmap_a, k, tile.y + rank * Cfg::A_SHARE_ROWS,
                                      bar, 0b11);
            else
                tma_load_2d(a_dst, tmap_a, k, tile.y, bar);
            for (int box = 0; box < boxes; ++box) {
                const int n = SWIGLU ? box * (N / 2) + tile.w / 2 : tile.w + box * sm90::BOX;
                const int c0 = B_K_MAJOR ? k : n, c1 = B_K_MAJOR ? n : k;  // B: (n, k, e); B^T: (k, n, e)
                const unsigned b_dst = a_dst + Cfg::A_BYTES + box * sm90::BOX_BYTES;
                if constexpr (Cfg::ALONG_M == 2) {  // rank r: rows 32r .. 32r + 31 of every box, for both blocks
                    tma_load_3d_multicast(b_dst + rank * Cfg::B_SHARE_BYTES, tmap_b, c0,
                                          c1 + static_cast<int>(rank) * Cfg::B_SHARE_ROWS, tile.x, bar, 0b11);
                } else if constexpr (B_EVICT_LAST) {  // L2_HINTS: the raster group's other M tiles read it next
                    tma_load_3d_hinted(b_dst, tmap_b, c0, c1, tile.x, bar, l2_evict_last_policy());
                } else {
                    tma_load_3d(b_dst, tmap_b, c0, c1, tile.x, bar);
                }
            }
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        after_unit(tile);  // the SwiGLU backward's h for this tile (prefetch_h), once its k-steps are issued
    }
    if constexpr (TAIL) {
        // The producer tail (PRODUCER_TAIL, as CUTLASS's): wait until every stage's last fill has been released
        // by the readers of both blocks. After that no consumer of either block arrives on this block's
        // barriers, and every multicast into its ring has been read, so the block may leave without the
        // closing cluster barrier, and the warps with nothing to do leave at once.
        for (int i = 0; i < STAGES; ++i) {
            mbarrier_wait_parity(smem_u32(&empty[stage]), phase ^ 1);
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
    }
}
// --8<-- [end:producer]

// --8<-- [start:prefetch_h]
// The SwiGLU backward's saved pre-activation by TMA (PREFETCH_H), one tile at a time into one buffer of
// BOXES boxes of 128 rows x 64 columns (128-byte swizzle, 16 KB each): the tile's BN gate columns, then its
// BN up columns N further. The producer loads tile k's once it has issued tile k's k-steps, after the epilogue
// of tile k - 1 (the other warpgroup's, which ran beside tile k's main loop) has read the buffer: `empty`
// counts that warpgroup's 128 threads, `full` the bytes, and both complete once per tile, so a tile's
// ordinal in this block gives the parity to wait for. The epilogue then finds h in shared memory instead of
// waiting on its global loads. Rows past M_tot and columns past 2N arrive as zeros and are never used.
template <int BN>
struct PrefetchH {
    static constexpr int BOXES = 2 * BN / sm90::BOX;
    static constexpr unsigned BOX_BYTES = 128 * 128;  // 128 rows (a ping-pong warpgroup's tile) of 128 bytes
    static constexpr unsigned BYTES = BOXES * BOX_BYTES;
    unsigned buffer, full, empty;  // shared-memory addresses: the buffer, 1 KB-aligned, then its two barriers

    __device__ void load(const CUtensorMap* tmap_h, int4 tile, int N, unsigned& phase) const {
        mbarrier_wait_parity(empty, phase ^ 1);
        mbarrier_arrive_expect_tx(full, BYTES);
#pragma unroll
        for (int box = 0; box < BOXES; ++box) {
            const int col = (box < BOXES / 2 ? 0 : N) + tile.w + (box % (BOXES / 2)) * sm90::BOX;
            tma_load_2d(buffer + box * BOX_BYTES, tmap_h, col, tile.y, full);
        }
        phase ^= 1;
    }

    // The packed pair (col, col + 1) of row r of the tile, col = 8j + 2t < BN: gate (up = false) or up.
    __device__ unsigned pair(int r, int j, int t, bool up) const {
        const int box = j / 8 + (up ? BOXES / 2 : 0);
        return load_shared_u32(sm90::swizzled_128b(buffer + box * BOX_BYTES, r, j % 8) + 4 * t);
    }
};
// --8<-- [end:prefetch_h]

// --8<-- [start:consumer]
// A warpgroup's 128 x BN share of a tile, SLICES m64 slices of it (1 or 2: only those with rows; 0
// waits for the stages and hands them back), A from row `a_slice` x 128 of the stage. In ping-pong
// the hand-over to the other warpgroup (`hand_over`) comes once every wgmma is issued, before
// waiting for the last ones to finish. SLICES is a template parameter, not a test inside the loop:
// a wgmma under a run-time branch makes ptxas serialize every wgmma of the kernel (its warning
// C7520, "wgmma.mma_async instructions are serialized").
template <class Cfg, int SLICES, int STAGES, int CLUSTER, bool B_K_MAJOR, bool F16, class HandOver>
__device__ __forceinline__ void multiply(float (&acc)[Cfg::M_ITERS][Cfg::TILE_N / 2], int a_slice, int k_steps,
                                         unsigned ring, unsigned long long* full, unsigned long long* empty,
                                         int& stage, unsigned& phase, HandOver&& hand_over) {
    constexpr OperandPlan PLAN_A = sm90::K_MAJOR_PLAN, PLAN_B = B_K_MAJOR ? sm90::K_MAJOR_PLAN : sm90::MN_MAJOR_PLAN;
    int previous = -1;
    for (int ks = 0; ks < k_steps; ++ks) {
        mbarrier_wait_parity(smem_u32(&full[stage]), phase);
        if constexpr (SLICES > 0) {
            // Two descriptors per stage; every wgmma's is one of them plus a compile-time step.
            const unsigned stage_base = ring + stage * Cfg::STAGE_BYTES;
            const unsigned long long desc_a =
                sm90::warp_uniform(matrix_descriptor(PLAN_A.bits, stage_base + a_slice * Cfg::M_ITERS * PLAN_A.mn64_bytes));
            const unsigned long long desc_b = sm90::warp_uniform(matrix_descriptor(PLAN_B.bits, stage_base + Cfg::A_BYTES));
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < sm90::BK / 16; ++kk) {
#pragma unroll
                for (int i = 0; i < SLICES; ++i)
                    wgmma_16bit<Cfg::TILE_N, false, !B_K_MAJOR, F16>(
                        acc[i], desc_a + sm90::descriptor_step(i * PLAN_A.mn64_bytes + kk * PLAN_A.k16_bytes),
                        desc_b + sm90::descriptor_step(kk * PLAN_B.k16_bytes), ks > 0 || kk > 0);
            }
            wgmma_commit();
            wgmma_wait<1>();  // the previous stage's wgmmas are done: hand it back (k3's loop)
        }
        if (previous >= 0) sm90::release<CLUSTER>(empty, previous);
        previous = stage;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    hand_over();
    if constexpr (SLICES > 0) wgmma_wait<0>();
    if (previous >= 0) sm90::release<CLUSTER>(empty, previous);
}
// --8<-- [end:consumer]

// --8<-- [start:swiglu]
// The fused SwiGLU epilogue of an MoE layer's first GEMM: each 128-column tile holds a 64-column
// gate block and its up block (the producer loads them from the two halves of [W_gate | W_up]), so
// with BN = 128 a thread holds gate column c in acc[4j + 2h + c'] and the matching up column in the
// element 32 further (j + 8): act = silu(gate) * up is computed in fp32 from the accumulators, and
// the tile's 64 output columns go to C [M_tot, N / 2] by the same store. The [M_tot, N] intermediate is never
// written: 2 bytes per element of it read and written by a separate pass, saved.
template <class Cfg>
__device__ __forceinline__ void swiglu(const float (&acc)[Cfg::M_ITERS][Cfg::TILE_N / 2],
                                       float (&act)[Cfg::M_ITERS][Cfg::TILE_N / 4], int slices) {
    static_assert(Cfg::TILE_N == 2 * sm90::BOX, "the SwiGLU epilogue pairs one 64-column gate block with one up block");
#pragma unroll
    for (int i = 0; i < Cfg::M_ITERS; ++i) {
        if (i >= slices) break;
#pragma unroll
        for (int v = 0; v < Cfg::TILE_N / 4; ++v) {
            const float gate = acc[i][v], up = acc[i][v + Cfg::TILE_N / 4];
            act[i][v] = gate / (1.0f + __expf(-gate)) * up;
        }
    }
}
// --8<-- [end:swiglu]

// --8<-- [start:dswiglu]
// The SwiGLU's backward fused into the epilogue of the dA GEMM that follows it in the backward pass: the
// accumulators hold dact = dY W_down^T for the warpgroup's rows row0 .. row0 + rows - 1 and columns col0 ..
// col0 + BN - 1 of I (the GEMM's N); the forward saved h = [gate | up] [M_tot, 2N]. In fp32, per element
// (epilogues.cuh, dswiglu_pair):
//   s = sigmoid(gate), act = gate s up, dgate = dact up s (1 + gate (1 - s)), dup = dact gate s,
// and the epilogue writes dh = [dgate | dup] [M_tot, 2N] and act [M_tot, N] (what dW_down = act^T dY reads),
// so dact [M_tot, N] is never written nor read back. From registers, as k1's epilogue: the thread's
// accumulator pair D[r][c .. c + 1] (ptx.cuh, wgmma_16bit) meets gate and up as one 4-byte load each and
// leaves as three 4-byte stores; rows past the expert's end and columns past N are skipped.
// Each row's loads are all issued before its first store: the compiler cannot move a load above a store it
// cannot prove independent, so with loads and stores interleaved pair by pair (a first version) every pair
// waited out a whole load latency, and the kernel was neither compute- nor memory-bound.
// LoadPairs(r, j, t, h_row, col, gate, up): the packed gate and up pairs of the thread's column pair j (column
// col = col0 + 8j + 2t) in row r of the tile, from global memory (preact) or from shared memory (PREFETCH_H).
template <class Cfg, int IN, int OUT, class LoadPairs>
__device__ __forceinline__ void dswiglu(const float (&acc)[Cfg::M_ITERS][Cfg::TILE_N / 2], int row0, int rows,
                                        int col0, int N, LoadPairs&& load_pairs, void* __restrict__ dh,
                                        void* __restrict__ act) {
    static_assert(IN == OUT, "h, dh and the activation share the operands' 16-bit type");
    constexpr int PAIRS = Cfg::TILE_N / 8;  // accumulator pairs per thread per row
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % sm90::WARPGROUP) / 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < Cfg::M_ITERS; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = 64 * i + 16 * warp + 8 * half + g;
            if (r >= rows) continue;
            const long long h_row = static_cast<long long>(row0 + r) * 2 * N, act_row = h_row / 2;
            unsigned gates[PAIRS], ups[PAIRS];
#pragma unroll
            for (int j = 0; j < PAIRS; ++j)  // col is even and N % 8 == 0: a pair is in or out whole
                load_pairs(r, j, t, h_row, col0 + 8 * j + 2 * t, gates[j], ups[j]);
#pragma unroll
            for (int j = 0; j < PAIRS; ++j) {
                const int col = col0 + 8 * j + 2 * t;
                if (col >= N) continue;
                float gate[2], up[2], d[2] = {acc[i][4 * j + 2 * half], acc[i][4 * j + 2 * half + 1]};
                float dgate[2], dup[2], a[2];
                sm90::unpack_pair<IN>(gates[j], gate[0], gate[1]);
                sm90::unpack_pair<IN>(ups[j], up[0], up[1]);
                sm90::dswiglu_pair(d, gate, up, dgate, dup, a);
                sm90::store_pair<OUT>(dh, h_row + col, dgate[0], dgate[1]);
                sm90::store_pair<OUT>(dh, h_row + N + col, dup[0], dup[1]);
                sm90::store_pair<OUT>(act, act_row + col, a[0], a[1]);
            }
        }
    }
}
// --8<-- [end:dswiglu]

// --8<-- [start:body]
// IN: the operands' element type (BF16 or F16), OUT: C's (BF16, F16 or F32). DACT_SWIGLU reads the saved
// pre-activation at preact and writes the activation at act besides C (dh). PDL: launched with programmatic
// stream serialization (rung h), the block initialises its barriers while the kernel before it may still run,
// then waits for that kernel (griddepcontrol.wait) before its first read of the expert ends, A or B and its
// first write of C; once its consumers have taken their last unit it lets the next kernel's blocks be
// scheduled (they start as this kernel's blocks leave their SMs). L2_HINTS (DACT_SWIGLU, h loaded by the
// epilogue): B's boxes are loaded evict-last and h evict-first (ptx.cuh, l2_hints).
template <int MODE, int BN, int STAGES, int CLUSTER_M, int CLUSTER_N, bool B_K_MAJOR, int STAGING_BOXES,
          bool DEVICE_SCHEDULE, int EPILOGUE, int IN, int OUT, bool PDL = false, bool PREFETCH_H = false,
          bool PRIVATE_RINGS = false, bool PRODUCER_TAIL = false, bool CURSOR = false, bool LIST_UNITS = false,
          bool L2_HINTS = false, bool RASTER_N = false>
__device__ __forceinline__ void k6_body(const CUtensorMap* tmap_a, const CUtensorMap* tmap_b,
                                        const CUtensorMap* tmap_c, void* C, const int4* units_list,
                                        int num_units, const int* ends, int tokens, int experts, int group, int K,
                                        int N, const void* preact = nullptr, void* act = nullptr,
                                        const CUtensorMap* tmap_h = nullptr) {
    static_assert((IN == sm90::BF16 || IN == sm90::F16) && OUT >= sm90::BF16 && OUT <= sm90::F32,
                  "bf16 or fp16 operands; a bf16, fp16 or fp32 output");
    using Cfg = Config<MODE, BN, STAGES, CLUSTER_M, CLUSTER_N, B_K_MAJOR, STAGING_BOXES, PRIVATE_RINGS>;
    constexpr int CLUSTER = Cfg::CLUSTER;
    constexpr bool F16 = IN == sm90::F16;
    __shared__ alignas(8) unsigned long long full[STAGES];
    __shared__ alignas(8) unsigned long long empty[STAGES];
    __shared__ walk::Walk<Cfg::UNIT_ROWS, Cfg::UNIT_COLS, RASTER_N> order;  // DEVICE_SCHEDULE only (2 KB)
    static_assert(!RASTER_N || (DEVICE_SCHEDULE && !CURSOR && !LIST_UNITS && EPILOGUE == STORE_C),
                  "the walk along N is the plain GEMM's device walk, its units looked up one by one");
    __shared__ sm90::Slots<STAGES> slots;
    extern __shared__ unsigned char dynamic_smem[];
    const unsigned ring = (smem_u32(dynamic_smem) + sm90::SWIZZLE_ALIGN - 1) & ~(sm90::SWIZZLE_ALIGN - 1);
    const unsigned staging = ring + STAGES * Cfg::STAGE_BYTES;
    const int warpgroup = threadIdx.x / sm90::WARPGROUP;
    const int k_steps = K / sm90::BK;  // the host checked K % 64 == 0 and K > 0
    // PREFETCH_H: h's buffer after the staging ring (1 KB-aligned: the ring's stages and boxes are multiples)
    using H = PrefetchH<BN>;
    const unsigned h_buffer = staging + Cfg::STAGING_BYTES;
    const H h{h_buffer, h_buffer + H::BYTES, h_buffer + H::BYTES + 8};
    static_assert(!PREFETCH_H || (EPILOGUE == DACT_SWIGLU && MODE == PINGPONG && CLUSTER_M * CLUSTER_N == 1),
                  "h is prefetched for the SwiGLU backward's ping-pong tiles (one warpgroup's 128 rows at a time)");
    static_assert(!L2_HINTS || (EPILOGUE == DACT_SWIGLU && !PREFETCH_H && CLUSTER_M * CLUSTER_N == 1),
                  "the L2 hints are the SwiGLU backward's whose epilogue loads h, without a cluster");
    static_assert(!PREFETCH_H ||
                      STAGES * Cfg::STAGE_BYTES + Cfg::STAGING_BYTES + H::BYTES + 16 + sm90::SWIZZLE_ALIGN <= 232448 - 2304,
                  "the ring, the C staging and h's buffer fit the shared memory of one block");

    if constexpr (DEVICE_SCHEDULE && !PDL) {
        order.build(ends, experts, tokens, N, group);
        num_units = order.total();
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(smem_u32(&full[s]), 1);
            mbarrier_init(smem_u32(&empty[s]), Cfg::EMPTY_ARRIVALS);
        }
        if constexpr (PREFETCH_H) {
            mbarrier_init(h.full, 1);
            mbarrier_init(h.empty, sm90::WARPGROUP);  // every thread of the epilogue's warpgroup, once it has read
        }
        fence_barrier_init();
    }
    if constexpr (PDL) {
        // Everything above touched shared memory only; every thread waits here before it reads or
        // writes global memory (the expert ends and the host list included: the kernel before may write them).
        griddepcontrol_wait();
        if constexpr (DEVICE_SCHEDULE) {
            order.build(ends, experts, tokens, N, group);
            num_units = order.total();
        }
    }
    // LIST_UNITS: the block's first walk::LISTED units, looked up by all its threads at once, in the dynamic shared
    // memory after the staging ring; the barrier below publishes them to the producer.
    static_assert(!LIST_UNITS || (DEVICE_SCHEDULE && !PREFETCH_H), "the unit list is the device walk's");
    int4* const listed = reinterpret_cast<int4*>(dynamic_smem + (staging + Cfg::STAGING_BYTES - smem_u32(dynamic_smem)));
    if constexpr (LIST_UNITS) order.list(listed, blockIdx.x / CLUSTER, gridDim.x / CLUSTER, walk::LISTED);
    if constexpr (CLUSTER == 2) cluster_sync(); else __syncthreads();

    // Both blocks of a cluster walk the same units (first, first + stride, ...), rank r taking the
    // unit's columns r x BN onwards (along N) or its rows r x BM onwards (along M).
    const unsigned rank = CLUSTER == 2 ? cluster_ctarank() : 0;
    const int first = blockIdx.x / CLUSTER, stride = gridDim.x / CLUSTER;
    if (warpgroup == 2) {
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x % sm90::WARPGROUP == 0) {
            typename decltype(order)::Cursor cursor;
            int listed_next = 0;  // LIST_UNITS: the block's units are looked up in order, one call each
            auto unit_at = [&](int unit) {
                if constexpr (LIST_UNITS) {
                    if (listed_next < walk::LISTED) return listed[listed_next++];
                }
                if constexpr (DEVICE_SCHEDULE && CURSOR) return order.unit(unit, cursor);
                else if constexpr (DEVICE_SCHEDULE) return order.unit(unit);
                else return units_list[unit];
            };
            unsigned h_phase = 0;
            auto after_unit = [&](int4 tile) {
                if constexpr (PREFETCH_H) h.load(tmap_h, tile, N, h_phase);
            };
            produce<Cfg, STAGES, CLUSTER, B_K_MAJOR, EPILOGUE == ACT_SWIGLU, PRODUCER_TAIL, L2_HINTS>(
                tmap_a, tmap_b, unit_at, num_units, first, stride, rank, k_steps, N, ring, slots, full, empty, after_unit);
        }
    } else {
        setmaxnreg_inc<Cfg::CONSUMER_REGS>();
        float acc[Cfg::M_ITERS][BN / 2];
        const unsigned my_staging = staging + (Cfg::SHARED_RING ? 0 : warpgroup) * STAGING_BOXES * sm90::BOX_BYTES;
        const int mine = first < num_units ? (num_units - first + stride - 1) / stride : 0;  // this block's units
        int stage = 0, stored = 0;
        unsigned phase = 0;
        for (int ordinal = 0; ordinal < mine; ++ordinal) {
            if (MODE == PINGPONG && ordinal % 2 != warpgroup) {  // the other warpgroup's tile
                sm90::skip_stages<STAGES>(stage, phase, k_steps);
                continue;
            }
            // Ping-pong: wait until the other warpgroup has issued its whole main loop (and tell it
            // when this one has, if it has a next tile). Besides handing the tensor cores over in
            // order, this keeps the parity waits sound: having skipped k_steps stages, a warpgroup
            // that waited on full[s] before the other had consumed them could see the completion of
            // a phase two fills old (same parity) and read a stage that holds the wrong tile.
            if (MODE == PINGPONG && ordinal > 0) named_barrier_sync(ORDER_BARRIER + warpgroup, 2 * sm90::WARPGROUP);
            mbarrier_wait_parity(smem_u32(&full[stage]), phase);  // the unit's first stage, and its slot
            const int4 tile = slots.tile[ordinal % sm90::Slots<STAGES>::COUNT];
            const int row_offset = MODE == PINGPONG ? 0 : warpgroup * Cfg::WG_ROWS;
            // None past N; none past M_tot either (the device walk's units end there already; the
            // host list is taken on trust), since the register stores of a partial slice write C directly.
            const int rows =
                tile.w < N ? min(min(tile.z - row_offset, Cfg::WG_ROWS), tokens - tile.y - row_offset) : 0;
            const int slices = rows <= 0 ? 0 : rows <= 64 ? 1 : 2;
            auto hand_over = [&] {
                if (MODE == PINGPONG && ordinal + 1 < mine)
                    named_barrier_arrive(ORDER_BARRIER + (warpgroup ^ 1), 2 * sm90::WARPGROUP);
            };
            const int a_slice = MODE == PINGPONG ? 0 : warpgroup;
            if (slices == 2)
                multiply<Cfg, 2, STAGES, CLUSTER, B_K_MAJOR, F16>(acc, a_slice, k_steps, ring, full, empty,
                                                             stage, phase, hand_over);
            else if (slices == 1)
                multiply<Cfg, 1, STAGES, CLUSTER, B_K_MAJOR, F16>(acc, a_slice, k_steps, ring, full, empty,
                                                             stage, phase, hand_over);
            else
                multiply<Cfg, 0, STAGES, CLUSTER, B_K_MAJOR, F16>(acc, a_slice, k_steps, ring, full, empty,
                                                             stage, phase, hand_over);
            // Ping-pong with one staging ring: the epilogues take turns on it. Each starts at its first
            // box and, before handing over, waits until TMA has read every box it filled (bulk
            // groups are tracked per thread: the other warpgroup's issuer cannot wait for them).
            if (Cfg::SHARED_RING && ordinal > 0)
                named_barrier_sync(EPILOGUE_ORDER_BARRIER + warpgroup, 2 * sm90::WARPGROUP);
            if (Cfg::SHARED_RING) stored = 0;
            if constexpr (EPILOGUE == ACT_SWIGLU) {
                if (slices > 0) {
                    float act[Cfg::M_ITERS][BN / 4];
                    swiglu<Cfg>(acc, act, slices);
                    sm90::store_slices<Cfg, STAGING_BOXES, BN / 2, OUT>(act, tile.y + row_offset, rows, tile.w / 2, warpgroup,
                                                      my_staging, stored, tmap_c, C, N / 2);
                }
            } else if constexpr (EPILOGUE == DACT_SWIGLU && PREFETCH_H) {
                // every tile's h arrives and is handed back, with rows or without: the phases count tiles
                mbarrier_wait_parity(h.full, ordinal & 1);
                if (slices > 0)
                    dswiglu<Cfg, IN, OUT>(acc, tile.y + row_offset, rows, tile.w, N,
                                          [&](int r, int j, int t, long long, int, unsigned& gate, unsigned& up) {
                                              gate = h.pair(r, j, t, false);
                                              up = h.pair(r, j, t, true);
                                          }, C, act);
                mbarrier_arrive(h.empty);
            } else if constexpr (EPILOGUE == DACT_SWIGLU) {
                if (slices > 0) {
                    const unsigned* __restrict__ h_words = static_cast<const unsigned*>(preact);
                    auto load = [&](long long index) {
                        if constexpr (L2_HINTS) return load_global_nc_streaming_u32(h_words + index / 2);
                        else return __ldg(h_words + index / 2);
                    };
                    dswiglu<Cfg, IN, OUT>(acc, tile.y + row_offset, rows, tile.w, N,
                                          [&](int, int, int, long long h_row, int col, unsigned& gate, unsigned& up) {
                                              gate = col < N ? load(h_row + col) : 0u;
                                              up = col < N ? load(h_row + N + col) : 0u;
                                          }, C, act);
                }
            } else if (slices > 0) {
                sm90::store_slices<Cfg, STAGING_BOXES, BN, OUT>(acc, tile.y + row_offset, rows, tile.w, warpgroup, my_staging, stored,
                                              tmap_c, C, N);
            }
            if (Cfg::SHARED_RING) {
                if (threadIdx.x % sm90::WARPGROUP == 0) bulk_wait_read<0>();
                if (ordinal + 1 < mine)
                    named_barrier_arrive(EPILOGUE_ORDER_BARRIER + (warpgroup ^ 1), 2 * sm90::WARPGROUP);
            }
        }
        if constexpr (PDL) griddepcontrol_launch_dependents();  // this block takes no more units
        if (threadIdx.x % sm90::WARPGROUP == 0) bulk_wait<0>();  // the staged boxes are read before exit
    }
    // No block may leave while its peer can still multicast into its ring or arrive on its barriers: a cluster
    // barrier at the end, or the producer tail above.
    static_assert(!PRODUCER_TAIL || CLUSTER == 2, "the producer tail replaces the closing cluster barrier");
    if constexpr (CLUSTER == 2 && !PRODUCER_TAIL) cluster_sync();
}
// --8<-- [end:body]

}  // namespace k6

// --8<-- [start:kernels]
// Two entry points over one body, as in k3: __cluster_dims__ cannot depend on a template parameter.
#define K6_PARAMS                                                                                              \
    const __grid_constant__ CUtensorMap tmap_a,  /* A [M_tot, K]: box {64, BM / CLUSTER_N}                 */ \
    const __grid_constant__ CUtensorMap tmap_b,  /* B [E, K, N]: {N, K, E}; B^T [E, N, K]: {K, N, E}; 64 x 64 */ \
    const __grid_constant__ CUtensorMap tmap_c,  /* C [M_tot, N]: box {64, 64}                              */ \
    void* __restrict__ C,                        /* [M_tot, N] in OUT: bf16, fp16 or fp32                   */ \
    const int4* __restrict__ units_list,         /* host walk: (expert, row0, rows, col0) per unit          */ \
    int num_units,                               /* host walk: the list's length                            */ \
    const int* __restrict__ ends,                /* device walk: [E] cumulative row ends (torch's offs)     */ \
    int tokens,                                  /* M_tot: the rows of A and C; every end is clamped to it  */ \
    int experts, int group, int K, int N

// PDL (rung h), PRIVATE_RINGS (a staging ring per ping-pong warpgroup), CURSOR (the device walk's units
// looked up from the last one's place: Walk::unit with a Cursor), LIST_UNITS (the block's first units listed
// by all its threads before the main loop: Walk::list) and RASTER_N (the raster groups along N), trailing
// parameters with defaults: the other rungs' instances keep their names and code.
template <int MODE, int BN, int STAGES, bool B_K_MAJOR, int STAGING_BOXES, bool DEVICE_SCHEDULE, int IN, int OUT,
          bool PDL = false, bool PRIVATE_RINGS = false, bool CURSOR = false, bool LIST_UNITS = false,
          bool RASTER_N = false>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent(K6_PARAMS) {
    k6::k6_body<MODE, BN, STAGES, 1, 1, B_K_MAJOR, STAGING_BOXES, DEVICE_SCHEDULE, k6::STORE_C, IN, OUT, PDL, false,
                PRIVATE_RINGS, false, CURSOR, LIST_UNITS, false, RASTER_N>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N);
}

// ALONG_M: the cluster's two blocks take two M tiles of one N column (B shared), else two N tiles
// of one M tile (A shared). PRODUCER_TAIL: the producer's tail instead of the closing cluster barrier.
template <int MODE, int BN, int STAGES, bool B_K_MAJOR, int STAGING_BOXES, bool DEVICE_SCHEDULE, bool ALONG_M,
          int IN, int OUT, bool PDL = false, bool PRODUCER_TAIL = false, bool CURSOR = false, bool LIST_UNITS = false,
          bool RASTER_N = false>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_cluster2(K6_PARAMS) {
    k6::k6_body<MODE, BN, STAGES, ALONG_M ? 2 : 1, ALONG_M ? 1 : 2, B_K_MAJOR, STAGING_BOXES, DEVICE_SCHEDULE,
                k6::STORE_C, IN, OUT, PDL, false, false, PRODUCER_TAIL, CURSOR, LIST_UNITS, false, RASTER_N>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N);
}

// An MoE layer's first GEMM with the SwiGLU epilogue: B is [W_gate | W_up] and C = silu(A W_gate) *
// (A W_up) [M_tot, N / 2]; a 128-column tile holds one 64-column gate block and its up block;
// BN = 128, the device walk; alone, or in a cluster of two along N (A multicast: each block's tile is
// its own pair, and the partner of an odd last tile, past N, multiplies and stores nothing).
template <int MODE, int STAGES, int STAGING_BOXES, int IN, int OUT>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_swiglu(K6_PARAMS) {
    k6::k6_body<MODE, 128, STAGES, 1, 1, false, STAGING_BOXES, true, k6::ACT_SWIGLU, IN, OUT>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N);
}

template <int MODE, int STAGES, int STAGING_BOXES, int IN, int OUT>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_swiglu_cluster2(K6_PARAMS) {
    k6::k6_body<MODE, 128, STAGES, 1, 2, false, STAGING_BOXES, true, k6::ACT_SWIGLU, IN, OUT>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N);
}

// The backward of GEMM 1's SwiGLU, fused into the dA GEMM of GEMM 2 (chapter 09): A = dY [M_tot, H], B = W_down
// [E, I, H] read K-major (it is B^T [E, N, K] with N = I, K = H), C = dh [M_tot, 2N] (bf16 or fp16, as the
// operands); preact: the saved h = [gate | up] [M_tot, 2N]; act: silu(gate) * up [M_tot, N]. BN = 128, the
// device walk; the epilogue stores from registers, so the staging ring is one box (unused). L2_HINTS: W_down's
// boxes kept in L2 before the streams through it (k6_body), a trailing parameter: the others keep their names.
template <int MODE, int STAGES, int IN, bool L2_HINTS = false>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_dswiglu(K6_PARAMS,
                                                                                const void* __restrict__ preact,
                                                                                void* __restrict__ act) {
    k6::k6_body<MODE, 128, STAGES, 1, 1, true, 1, true, k6::DACT_SWIGLU, IN, IN, false, false, false, false, false,
                false, L2_HINTS>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N, preact, act);
}

// The same in a cluster of two blocks along M: the two take two M tiles of one N column and share each W_down box
// (B multicast), so W_down crosses from memory once per pair of M tiles; each block's epilogue is its own tile's.
template <int MODE, int STAGES, int IN>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_dswiglu_cluster2(K6_PARAMS,
                                                                                                        const void* __restrict__ preact,
                                                                                                        void* __restrict__ act) {
    k6::k6_body<MODE, 128, STAGES, 2, 1, true, 1, true, k6::DACT_SWIGLU, IN, IN>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N, preact, act);
}

// The same with h prefetched by TMA during the tile's main loop (k6::PrefetchH): tmap_h maps h [M_tot, 2N] in
// boxes of 128 rows x 64 columns; 64 KB of h's buffer leave room for four stages of the ring, not six.
template <int MODE, int STAGES, int IN>
__global__ void __launch_bounds__(3 * sm90::WARPGROUP, 1) k6_persistent_dswiglu_prefetch(K6_PARAMS,
                                                                                         const __grid_constant__ CUtensorMap tmap_h,
                                                                                         void* __restrict__ act) {
    k6::k6_body<MODE, 128, STAGES, 1, 1, true, 1, true, k6::DACT_SWIGLU, IN, IN, false, true>(
        &tmap_a, &tmap_b, &tmap_c, C, units_list, num_units, ends, tokens, experts, group, K, N, nullptr, act, &tmap_h);
}
// --8<-- [end:kernels]
