// tma_pipeline.cuh: the producer's side of the wgmma kernels' TMA ring. STAGES stages of shared
// memory, each with two mbarriers: full[s] completes when TMA has written every byte the producer
// announced for stage s, empty[s] when every consumer warpgroup that reads s (in either block of
// a cluster) has handed it back. k3 runs produce() as it is; k5 fills its stages differently (by
// tile kind) but hands them back with the same release().
#pragma once

#include "ptx.cuh"
#include "wgmma_config.cuh"

namespace sm90 {

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

// The producer writes each unit's tile into a slot before it announces the unit's first stage;
// the consumer warpgroups read it after that stage's full barrier (k6, k8). STAGES + 1 slots suffice,
// as in k5: the producer reaches unit j + STAGES + 1 only once every stage of unit j has been released,
// and a warpgroup reads the slot before it releases any stage of its unit.
template <int STAGES>
struct Slots {
    static constexpr int COUNT = STAGES + 1;
    int4 tile[COUNT];
};

// A ping-pong consumer warpgroup's position in the ring (stage and parity) after `steps` stages it
// skips, the other warpgroup's tile (k6, k7).
template <int STAGES>
__device__ __forceinline__ void skip_stages(int& stage, unsigned& phase, int steps) {
    const int moved = stage + steps;
    stage = moved % STAGES;
    phase ^= (moved / STAGES) & 1;
}

}  // namespace sm90
