// tile_walk.cuh: k6's order of work, found on the device from the expert offsets alone.
//
// A *unit* is what one block (or one cluster of CLUSTER blocks) computes at a time: BM rows of one
// expert by UNIT_COLS = CLUSTER x BN columns. Units run expert by expert (experts in order, so B[e]
// stays in L2 while its units run), and within an expert in a *grouped* order: the expert's M tiles
// are taken GROUP at a time, and the group is walked column by column,
//
//     (m0, n0) (m1, n0) .. (m7, n0) (m0, n1) (m1, n1) ..    for GROUP = 8,
//
// so that the blocks running at the same moment (consecutive units: a persistent grid takes units
// first, first + stride, ...) share B's columns across GROUP M tiles and A's rows across the
// columns they span. GROUP = 1 is the plain row-major walk. CUTLASS and quack call this swizzle
// "rasterization"; python/moe_gemm/variants/k6/walk.py is its mirror (the host-built unit list).
//
// ALONG_N turns the group the other way, as quack's varlen-M scheduler does by default: GROUP columns of
// units at a time, the expert's M tiles walked inside the group (its columns fastest), and every other group
// walked upward, so that the M tiles read last are the first read again:
//
//     (m0, n0) .. (m0, n7) (m1, n0) .. (m1, n7) .. (mL, n7)  (mL, n8) .. (mL, n15) (mL-1, n8) ..    for GROUP = 8.
//
// The launch reads only the expert ends (int32, the cumulative row counts torch._grouped_mm takes as
// `offs`), so a CUDA graph captured once replays correctly for any routing of the same M_tot. Nothing
// checks those ends on the host (reading them back would cost a synchronisation per launch), so the
// walk trusts none of them: each is clamped to [0, M_tot] and the ends are made non-decreasing (a
// running maximum) before any unit is counted. Whatever `offs` holds, every unit then lies inside A
// and C; rows past the last end, which no expert owns, are neither read nor written (as
// torch._grouped_mm leaves them).
#pragma once

namespace walk {

enum : int { MAX_EXPERTS = 256 };  // the prefix sums live in shared memory (2 KB)
enum : int { LISTED = 128 };       // units a block may list before its main loop (Walk::list: 2 KB of int4)

// --8<-- [start:walk]
template <int BM, int UNIT_COLS, bool ALONG_N = false>
struct Walk {
    int offsets[MAX_EXPERTS + 1];  // first row of expert e; offsets[experts] = M_tot
    int starts[MAX_EXPERTS + 1];   // units of experts 0 .. e-1
    int experts;
    int n_units;  // units across N: ceil(N / UNIT_COLS)
    int group;    // M tiles per raster group (ALONG_N: columns of units per group)

    __device__ int total() const { return starts[experts]; }

    // Every thread of the block takes part: the ends go to shared memory, clamped to [0, tokens];
    // one warp makes them non-decreasing (a running maximum, 32 experts at a time with shuffles),
    // then scans the per-expert unit counts the same way, and everyone waits for the result.
    __device__ void build(const int* __restrict__ ends, int num_experts, int tokens, int N, int raster_group) {
        for (int e = threadIdx.x; e < num_experts; e += blockDim.x) offsets[e + 1] = min(max(ends[e], 0), tokens);
        if (threadIdx.x == 0) {
            offsets[0] = 0;
            starts[0] = 0;
            experts = num_experts;
            n_units = (N + UNIT_COLS - 1) / UNIT_COLS;
            group = raster_group;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            int high = 0;  // the largest end so far
            for (int base = 0; base < num_experts; base += 32) {
                const int e = base + lane;
                int end = e < num_experts ? max(offsets[e + 1], high) : high;
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const int up = __shfl_up_sync(0xFFFFFFFFu, end, d);
                    if (lane >= d) end = max(end, up);
                }
                if (e < num_experts) offsets[e + 1] = end;
                high = __shfl_sync(0xFFFFFFFFu, end, 31);
            }
            __syncwarp();
            int carry = 0;
            for (int base = 0; base < num_experts; base += 32) {
                const int e = base + lane;
                int v = e < num_experts ? (offsets[e + 1] - offsets[e] + BM - 1) / BM * n_units : 0;
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const int up = __shfl_up_sync(0xFFFFFFFFu, v, d);
                    if (lane >= d) v += up;
                }
                if (e < num_experts) starts[e + 1] = carry + v;
                carry += __shfl_sync(0xFFFFFFFFu, v, 31);
            }
        }
        __syncthreads();
    }

    // --8<-- [start:unit]
    // Unit `index` as (expert, row0, rows, col0): the last expert whose units start at or before
    // it (a binary search over starts), then the grouped position inside that expert (ALONG_N: in
    // groups of columns, every other one walked from the expert's last M tile up).
    __device__ int4 unit(int index) const {
        int lo = 0, hi = experts;
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (starts[mid] <= index) lo = mid; else hi = mid;
        }
        const int row0 = offsets[lo], rows = offsets[lo + 1] - row0;
        const int m_tiles = (rows + BM - 1) / BM;
        const int local = index - starts[lo];
        if constexpr (ALONG_N) {
            const int span = group * m_tiles;  // units of one full group of columns
            const int g = local / span, within = local - g * span;
            const int in_group = min(group, n_units - g * group);  // the last group may be narrow
            const int down = within / in_group;
            const int m = g % 2 ? m_tiles - 1 - down : down, n = g * group + within % in_group;
            return make_int4(lo, row0 + m * BM, min(BM, rows - m * BM), n * UNIT_COLS);
        }
        const int span = group * n_units;  // units of one full group
        const int g = local / span, within = local - g * span;
        const int in_group = min(group, m_tiles - g * group);  // the last group may be short
        const int m = g * group + within % in_group, n = within / in_group;
        return make_int4(lo, row0 + m * BM, min(BM, rows - m * BM), n * UNIT_COLS);
    }
    // --8<-- [end:unit]

    // --8<-- [start:cursor]
    // The same unit for a caller whose indices only grow by a fixed step (a persistent block's: first,
    // first + stride, ...), found from the last one instead of from scratch: the expert by stepping
    // forward (at most E steps over the whole launch, none for most units), the place inside it by
    // adding the step, split once into whole raster groups and a remainder, to the last place. Within
    // one expert that is a few shared-memory loads (the walk's fields), compares and adds; unit() costs
    // a binary search over the experts and three integer divisions. Divisions are left only where the
    // expert changes and, in raster groups of more than one M tile, for the place within the group.
    struct Cursor {
        int expert = -1;  // the last unit's expert (-1: none yet, so the first unit steps forward from expert 0)
        int index = 0;    // the last unit's index
        int g = 0;        // its raster group within the expert
        int within = 0;   // and its place within that group (< group * n_units)
        int step = 0;     // the step between units, as whole groups and a remainder
        int step_groups = 0;
        int step_within = 0;
    };
    __device__ int4 unit(int index, Cursor& c) const {
        const unsigned span = group * n_units;  // units of one full group
        if (starts[c.expert + 1] <= index) {    // a later expert: step to it, then place the unit once
            do ++c.expert; while (starts[c.expert + 1] <= index);
            const unsigned local = index - starts[c.expert];
            c.g = local / span;
            c.within = local - c.g * span;
        } else {  // the same expert, one step on
            if (index - c.index != c.step) {
                c.step = index - c.index;
                c.step_groups = static_cast<unsigned>(c.step) / span;
                c.step_within = c.step - c.step_groups * span;
            }
            c.g += c.step_groups;
            c.within += c.step_within;
            if (c.within >= static_cast<int>(span)) c.within -= span, ++c.g;
        }
        c.index = index;
        const int row0 = offsets[c.expert], rows = offsets[c.expert + 1] - row0;
        int m = c.g, n = c.within;  // groups of one M tile: a group is one M tile's row of units
        if (group > 1) {
            const int in_group = min(group, (rows + BM - 1) / BM - c.g * group);  // the last group may be short
            m = c.g * group + c.within % in_group;
            n = c.within / in_group;
        }
        return make_int4(c.expert, row0 + m * BM, min(BM, rows - m * BM), n * UNIT_COLS);
    }
    // --8<-- [end:cursor]

    // --8<-- [start:list]
    // The block's first `count` units (first, first + stride, ...) written to `out` by every thread of the
    // block at once, one lookup each, before the main loop: the producer then reads each unit from shared
    // memory, as it reads the host list from global memory, and looks up only the units past `count`.
    __device__ void list(int4* out, int first, int stride, int count) const {
        for (int i = threadIdx.x; i < count; i += blockDim.x) {
            const int index = first + i * stride;
            if (index < total()) out[i] = unit(index);
        }
    }
    // --8<-- [end:list]
};
// --8<-- [end:walk]

}  // namespace walk
