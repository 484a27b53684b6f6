// named_barriers.cuh: every hardware barrier id a kernel passes to bar.sync (named_barrier_sync,
// ptx.cuh), allocated here and nowhere else.
//
// A CTA has 16 of these barriers, ids 0 .. 15, and id 0 is the one __syncthreads() uses for the
// whole block. A bar.sync on id b for n threads completes once n threads (whole warps) have
// arrived at b, whichever warps they are: if both consumer warpgroups met on one id at once, 128
// arrivals from the two together would release each before all of its own threads got there,
// and a warpgroup would read staging boxes its other warps are still writing. So each set of
// threads that meets without the rest of the block owns its ids for the whole kernel, one per
// warpgroup a template can instantiate, and no kernel passes an id as a literal.
// PTX ISA "Parallel Synchronization and Communication Instructions: bar.sync"
//   #parallel-synchronization-and-communication-instructions-bar
#pragma once

// The wgmma kernels run at most two consumer warpgroups (sm90::Config), and each needs an id of
// its own. An enumerator rather than a constexpr int: NVRTC gives a namespace-scope variable 4
// bytes of global memory in every module that includes this header.
enum : int { MAX_CONSUMER_WARPGROUPS = 2 };

enum NamedBarrier : int {
    // bar.sync 0 is __syncthreads(): never named for part of the block.
    SYNCTHREADS_BARRIER = 0,
    // STAGING_BARRIER + w: consumer warpgroup w alone (128 threads), around its C staging boxes in
    // the TMA-store epilogue (epilogues.cuh, store_tile_tma). Ids 1 and 2.
    STAGING_BARRIER = 1,
    // Both consumer warpgroups (256 threads), while the producer warpgroup runs on: k5's split-K
    // M64 tile adds one warpgroup's partial sums to the other's (k5_adaptive.cu, reduce_halves);
    // k7's cooperative tile zeroes another expert's rows in a stage both read (k7_weight_grad.cu).
    PAIR_BARRIER = STAGING_BARRIER + MAX_CONSUMER_WARPGROUPS,
    // ORDER_BARRIER + w: k6's ping-pong hand-over (k6_persistent.cu). Warpgroup w waits on its id
    // (bar.sync, 256) before its main loop; the other warpgroup arrives there (bar.arrive) once it
    // has issued its own. Ids 4 and 5.
    ORDER_BARRIER = PAIR_BARRIER + 1,
    // EPILOGUE_ORDER_BARRIER + w: the same hand-over for k6's ping-pong epilogues, which share one
    // ring of C staging boxes and so must take turns. Ids 6 and 7.
    EPILOGUE_ORDER_BARRIER = ORDER_BARRIER + MAX_CONSUMER_WARPGROUPS,
    // TAIL_BARRIER + w: k7's warpgroup w alone (128 threads), once it has zeroed the rows of another
    // expert in the last stage of a tile, before its wgmmas read them (k7_weight_grad.cu). Ids 8 and 9.
    TAIL_BARRIER = EPILOGUE_ORDER_BARRIER + MAX_CONSUMER_WARPGROUPS,
    NAMED_BARRIERS_USED = TAIL_BARRIER + MAX_CONSUMER_WARPGROUPS,
};
static_assert(NAMED_BARRIERS_USED <= 16, "a CTA has 16 hardware barriers");
