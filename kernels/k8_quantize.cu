// k8_quantize.cu: chapter 10's activation quantizer. A [M, K] in bf16 becomes e4m3 in 1 x 128 groups along
// K, each with one fp32 scale (the DeepSeek-V3 recipe, its technical report's section 3.3.2):
//
//   scale = max(amax / 448, FLT_MIN), or 1 for an all-zero group      q = e4m3(x / scale)
//
// exactly as the numpy reference computes it (moe_gemm.model.quantize.quantize): fp32 division rounded to
// nearest, e4m3 rounded to nearest-even, clamped at +-448. K need not be a multiple of 128: the last
// group holds the remainder (its amax is the partial group's).
//
// The scales are stored MN-major, scale[kb * m_pad + m] for k-block kb of row m, with m_pad = M rounded
// up to 4 (DeepGEMM's layout, each k-block's row of scales 16-byte aligned): the FP8 GEMM loads, for each
// k-block of its main loop, the scales of its tile's rows, and in this layout they are consecutive floats
// (coalesced loads), where a row-major [M, K / 128] would put them K / 128 floats apart.
//
// Memory-bound: 2 bytes read and 1 + 4 / 128 written per element. Each group is 16 threads with 8
// elements each (one 16-byte load, one 8-byte store), its amax reduced over the 16 lanes with shuffles.
// Two template parameters are the steps chapter 10 times, from the first version (1, false) to the op's (4, true):
//   PIECES       pieces a thread holds, of groups 16 apart, all loaded before the first is quantized: 4 give 64
//                bytes in flight per thread where one load gave 16 (an H200 needs about 3.4 MB in flight across
//                its 132 SMs to cover ~700 ns of latency at 4.8 TB/s); a 256-thread block quantizes 16 x PIECES
//                groups;
//   DIVIDE_ONCE  each value divided by its group's scale in three instructions from the group's reciprocal
//                (e4m3.cuh, Divisor), where __fdiv_rn spends about nine on each; the same bits.
// The host checks K % 8 == 0 (whole 16-byte loads).

#include "e4m3.cuh"  // the scale rule, shared with the GEMM's SwiGLU epilogue
#include "ptx.cuh"   // pack_e4m3x2

namespace k8 {
constexpr int GROUP = e4m3::GROUP, PER_THREAD = 8, LANES = GROUP / PER_THREAD;  // 16 threads per group
constexpr int THREADS = 256, GROUPS_PER_PASS = THREADS / LANES;  // a block's 16 groups side by side
constexpr int PIECES = 4;  // the op's pieces per thread (the SwiGLU quantizer's too): 4 x 16 bytes in flight
}  // namespace k8

// --8<-- [start:activations]
namespace k8 {
// Which piece of which 1 x 128 group a thread holds as its j-th, for M rows of `width` columns: 16 lanes per
// group, a whole group in one half-warp, so every shuffle stays among its lanes; a block's j-th pass covers 16
// consecutive groups (4 KB of a bf16 input, coalesced). A group past the end still takes part (with zeros) so
// that no lane of a live group waits for an exited one.
struct Piece {
    int lane, m, kb, k0;  // the lane in its group; the group's row and k-block; the piece's first column
    bool in_row;          // the piece lies inside the matrix: it is loaded and stored
};

template <int PIECES>
__device__ __forceinline__ Piece piece_of(int M, int width, int j) {
    const int k_blocks = (width + GROUP - 1) / GROUP;
    const unsigned group = (blockIdx.x * PIECES + j) * GROUPS_PER_PASS + threadIdx.x / LANES;
    const bool live = group < static_cast<unsigned>(M) * k_blocks;  // the host checks M * k_blocks < 2^31
    Piece p;
    p.lane = threadIdx.x % LANES;
    p.m = live ? static_cast<int>(group / k_blocks) : 0;
    p.kb = live ? static_cast<int>(group % k_blocks) : 0;
    p.k0 = p.kb * GROUP + p.lane * PER_THREAD;
    p.in_row = live && p.k0 < width;
    return p;
}

// The part of piece p of a 1 x 128 group, 8 values in fp32, in an output of `width` columns: the group's amax
// over its 16 lanes, its scale, the lane's 8 bytes of e4m3 at q[p.m][p.k0] and (lane 0) the scale at
// scale[p.kb][p.m], MN-major. Every lane of a group takes part in the shuffles, live or not; only a lane whose
// values are inside the row stores.
template <bool DIVIDE_ONCE>
__device__ __forceinline__ void quantize_piece(const float (&values)[PER_THREAD], const Piece& p, int width,
                                               int m_pad, uint2* __restrict__ q, float* __restrict__ scale) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) amax = fmaxf(amax, fabsf(values[i]));
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const float s = e4m3::scale_of(amax);
    if (!p.in_row) return;
    float quotients[PER_THREAD];
    if constexpr (DIVIDE_ONCE) {
        e4m3::divide(values, e4m3::divisor_of(s), quotients);
    } else {
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) quotients[i] = __fdiv_rn(values[i], s);
    }
    unsigned short pairs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pairs[i] = pack_e4m3x2(quotients[2 * i], quotients[2 * i + 1]);
    q[(static_cast<long long>(p.m) * width + p.k0) / PER_THREAD] =  // width % 8 == 0: whole pieces
        make_uint2(pairs[0] | (static_cast<unsigned>(pairs[1]) << 16),
                   pairs[2] | (static_cast<unsigned>(pairs[3]) << 16));
    if (p.lane == 0) scale[static_cast<long long>(p.kb) * m_pad + p.m] = s;
}

// The 8 bf16 values of a 16-byte load, in fp32 (bf16 is fp32's upper half).
__device__ __forceinline__ void unpack_bf16x8(uint4 v, float (&values)[PER_THREAD]) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        values[2 * i] = __uint_as_float(words[i] << 16);
        values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}
}  // namespace k8

// A [M, K] bf16 -> q [M, K] e4m3 and scale [ceil(K / 128), m_pad]: 16 lanes per group, 8 elements each,
// PIECES groups per half-warp, every load issued before the first group's amax.
template <int PIECES, bool DIVIDE_ONCE>
__global__ void __launch_bounds__(k8::THREADS) quantize_1x128(const uint4* __restrict__ x, uint2* __restrict__ q,
                                                              float* __restrict__ scale, int M, int K, int m_pad) {
    using namespace k8;
    Piece p[PIECES];
    uint4 loaded[PIECES];
#pragma unroll
    for (int j = 0; j < PIECES; ++j) {
        p[j] = piece_of<PIECES>(M, K, j);
        loaded[j] = p[j].in_row ? x[(static_cast<long long>(p[j].m) * K + p[j].k0) / PER_THREAD] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < PIECES; ++j) {
        float values[PER_THREAD];
        unpack_bf16x8(loaded[j], values);
        quantize_piece<DIVIDE_ONCE>(values, p[j], K, m_pad, q, scale);
    }
}
// --8<-- [end:activations]

// --8<-- [start:swiglu]
// The FP8 layer's step between its GEMMs: GEMM 1's output h = [gate | up] [M, 2I] bf16 becomes the activation
// silu(gate) x up, quantized as GEMM 2's A, q [M, I] e4m3 and scale [ceil(I / 128), m_pad], in one pass that
// reads h once and never writes the [M, I] activation in bf16. A lane loads the 8 gate values of its piece and
// the 8 up values I columns further (two 16-byte loads: the host checks I % 8 == 0), computes the activation in
// fp32, silu(g) = g / (1 + e^-g), and quantizes it as quantize_1x128 does (its fp32 values are not rounded to
// bf16 first: the e4m3 rounding is the only one).
extern "C" __global__ void __launch_bounds__(k8::THREADS) swiglu_quantize_1x128(const uint4* __restrict__ h,
                                                                               uint2* __restrict__ q,
                                                                               float* __restrict__ scale,
                                                                               int M, int I, int m_pad) {
    using namespace k8;
    Piece p[PIECES];
    uint4 gate_loaded[PIECES], up_loaded[PIECES];
#pragma unroll
    for (int j = 0; j < PIECES; ++j) {
        p[j] = piece_of<PIECES>(M, I, j);
        const long long gate_piece = (static_cast<long long>(p[j].m) * 2 * I + p[j].k0) / PER_THREAD;
        gate_loaded[j] = p[j].in_row ? h[gate_piece] : make_uint4(0, 0, 0, 0);
        up_loaded[j] = p[j].in_row ? h[gate_piece + I / PER_THREAD] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < PIECES; ++j) {
        float gate[PER_THREAD], up[PER_THREAD], values[PER_THREAD];
        unpack_bf16x8(gate_loaded[j], gate);
        unpack_bf16x8(up_loaded[j], up);
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) values[i] = __fdiv_rn(gate[i], 1.0f + expf(-gate[i])) * up[i];
        quantize_piece<true>(values, p[j], I, m_pad, q, scale);
    }
}
// --8<-- [end:swiglu]

// --8<-- [start:weights]
// The weights' quantizer: one expert's B[e] [K, N] in bf16 (the layer's [E, K, N], as GEMM 1 and 2 take
// it) becomes e4m3 in 128 x 128 blocks with one fp32 scale each, written transposed, q [E, N, K]: FP8
// wgmma reads both operands K-major from shared memory (it has no transposed layouts for 8-bit types), so
// the GEMM's B is [E, N, K]. Scales scale[e][nb][kb], [E, ceil(N / 128), ceil(K / 128)], row-major: the
// GEMM reads one per (N tile, k-block). One 256-thread block per block of 128 x 128, staged in shared memory
// as bf16 (33 KB), its amax reduced over the block, then each thread converts 64 elements of one column of B
// (one row of q) and writes them as four 16-byte stores. The host checks K % 16 == 0 (whole 16-byte stores of
// q rows) and N % 8 == 0 (whole 16-byte loads of B rows); a partial last block along either is zero-padded.
// Two template parameters are the steps chapter 10 times, from the first version (false, false) to the op's
// (true, true):
//   LOADS_FIRST    a thread's eight 16-byte loads written before the first is staged: the first version's loop,
//                  as compiled, keeps two in flight (its SASS: pairs of loads between runs of shared-memory
//                  stores), so a block's 32 KB arrives in four round trips; with this ptxas issues five before the
//                  first is used and the other three as it arrives (about one and a half round trips), and stages
//                  each pair of values with one 32-bit store where the loop used two 16-bit ones;
//   WHOLE_SECTORS  the two threads of a q row store its 128 bytes in alternating 16-byte pieces, so that each
//                  store instruction writes whole 32-byte sectors (the first version gave each thread one 64-byte
//                  half: every store covered halves of two sectors), and the two read staged rows 16 apart,
//                  whose words fall in other banks (64 apart, a row of 65 words, they share banks: two-way
//                  conflicts on every column read).
template <bool LOADS_FIRST, bool WHOLE_SECTORS>
__global__ void __launch_bounds__(256) quantize_128x128_t(const uint4* __restrict__ b, uint4* __restrict__ q,
                                                          float* __restrict__ scale, int K, int N) {
    using namespace k8;
    constexpr int ROW = GROUP + 2;  // bf16 per staged row: 65 words, so a column read walks the banks
    constexpr int PASSES = GROUP / 16;  // loads: 16 threads per row of 128 columns, 16 rows per pass
    __shared__ unsigned short tile[GROUP][ROW];
    __shared__ float warp_amax[256 / 32];
    const int nb = blockIdx.x, kb = blockIdx.y, e = blockIdx.z;
    const int n0 = nb * GROUP, k0 = kb * GROUP;
    const unsigned short* expert = reinterpret_cast<const unsigned short*>(b) + static_cast<long long>(e) * K * N;
    const int c_load = (threadIdx.x % LANES) * PER_THREAD;
    auto load = [&](int pass) {
        const int k = k0 + pass * 16 + threadIdx.x / LANES, n = n0 + c_load;
        return k < K && n < N ? *reinterpret_cast<const uint4*>(expert + static_cast<long long>(k) * N + n)
                              : make_uint4(0, 0, 0, 0);
    };
    float amax = 0.0f;
    auto stage = [&](int pass, uint4 v) {
        const int r = pass * 16 + threadIdx.x / LANES;
        const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            tile[r][c_load + 2 * i] = static_cast<unsigned short>(words[i] & 0xffffu);
            tile[r][c_load + 2 * i + 1] = static_cast<unsigned short>(words[i] >> 16);
            amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(words[i] << 16)),
                                     fabsf(__uint_as_float(words[i] & 0xffff0000u))));
        }
    };
    if constexpr (LOADS_FIRST) {
        uint4 loaded[PASSES];
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass) loaded[pass] = load(pass);
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass) stage(pass, loaded[pass]);
    } else {
        for (int pass = 0; pass < PASSES; ++pass) stage(pass, load(pass));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();  // the tile and every warp's amax are in shared memory
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < 256 / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
    const e4m3::Divisor d = e4m3::divisor_of(e4m3::scale_of(amax));
    const int k_blocks = (K + GROUP - 1) / GROUP, n_blocks = (N + GROUP - 1) / GROUP;
    if (threadIdx.x == 0) scale[(static_cast<long long>(e) * n_blocks + nb) * k_blocks + kb] = d.s;
    // Stores: thread t writes 64 of the K elements of row n0 + t / 2 of q, from k0: pieces 16 * (2 chunk + t % 2)
    // (WHOLE_SECTORS) or 64 (t % 2) + 16 chunk.
    const int c = threadIdx.x / 2;
    if (n0 + c >= N) return;
    unsigned char* row = reinterpret_cast<unsigned char*>(q) + (static_cast<long long>(e) * N + n0 + c) * K + k0;
#pragma unroll
    for (int chunk = 0; chunk < 4; ++chunk) {  // 16 elements, 16 bytes
        const int r0 = WHOLE_SECTORS ? 16 * (2 * chunk + threadIdx.x % 2) : (threadIdx.x % 2) * 64 + 16 * chunk;
        if (k0 + r0 >= K) break;
        unsigned words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            float v[4], quotients[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(static_cast<unsigned>(tile[r0 + 4 * w + i][c]) << 16);
            e4m3::divide(v, d, quotients);
            words[w] = pack_e4m3x2(quotients[0], quotients[1]) | (static_cast<unsigned>(pack_e4m3x2(quotients[2], quotients[3])) << 16);
        }
        *reinterpret_cast<uint4*>(row + r0) = make_uint4(words[0], words[1], words[2], words[3]);
    }
}
// --8<-- [end:weights]
