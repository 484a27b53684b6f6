// wgmma_config.cuh: the compile-time shape of a Hopper wgmma block: the K step and box sizes the
// TMA ring is cut into, how the consumer warpgroups split a BM x BN tile, what setmaxnreg gives
// each role, and the bytes of a ring stage and of the C staging. The producer (tma_pipeline.cuh),
// the epilogues (epilogues.cuh) and every kernel built on them (k3, and k5 at k3's BN = 192 rung)
// address shared memory through these numbers, so they come from this one template.
#pragma once

namespace sm90 {

// --8<-- [start:config]
constexpr int BK = 64;                  // K per stage: 64 bf16 = 128 B = one swizzle row
constexpr int BOX = 64;                 // B arrives in boxes of 64 x 64 (one 128-byte row wide)
constexpr unsigned BOX_BYTES = BOX * BK * 2;   // 8,192
constexpr unsigned SWIZZLE_ALIGN = 1024;       // the 128-byte swizzle repeats every 8 x 128 B
constexpr int WARPGROUP = 128;

// The shared-memory address of 16-byte chunk `chunk` (0..7) of row `row` of a box 128 bytes wide that TMA
// wrote (or reads) under the 128-byte swizzle, the box 1 KB-aligned: the chunk moves to slot chunk XOR
// (row mod 8) (python/moe_gemm/cuda/descriptors.py, swizzle, is the same map; tests/test_k6.py holds them equal).
__device__ __forceinline__ unsigned swizzled_128b(unsigned box, int row, unsigned chunk) {
    return box + row * 128 + ((chunk ^ (row % 8)) << 4);
}

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

}  // namespace sm90
