// SwiGLU's backward as one pass (chapter 09): what the MoE layer runs between the dA GEMM of GEMM 2 and the
// dA GEMM of GEMM 1 where k6 does not fuse it into the first one's epilogue.
//
//   dh = [dgate | dup] [M, 2I] and act [M, I] from dact [M, I] and the saved h = [gate | up] [M, 2I]
//
// per element as k6's fused epilogue computes it (epilogues.cuh, dswiglu_pair), in fp32, rounded once to
// the operands' 16-bit type. The bytes: dact read (2 per element of [M, I]), h read (4), dh and the activation
// written (4 and 2), each once: 12 bytes, where the torch operations it replaces make five passes with
// temporaries between them.
//
// A thread takes a piece of 8 consecutive columns of one row (one 16-byte load each of dact, gate and up, three
// 16-byte stores; the host checks I % 8 == 0) and the grid strides over the M x I / 8 pieces. The host also
// checks that they number under 2^31, so that a piece's row is a 32-bit division, not a 64-bit one (a
// subroutine of about a hundred instructions, for 48 bytes moved).

#include "epilogues.cuh"  // dswiglu_pair, pack_pair, unpack_pair

// --8<-- [start:pass]
template <int IN>
__global__ void __launch_bounds__(256) swiglu_backward(const uint4* __restrict__ dact, const uint4* __restrict__ h,
                                                      uint4* __restrict__ dh, uint4* __restrict__ act,
                                                      int pieces, int row_pieces) {
    static_assert(IN == sm90::BF16 || IN == sm90::F16, "bf16 or fp16 operands");
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < static_cast<unsigned>(pieces); p += stride) {
        const unsigned m = p / static_cast<unsigned>(row_pieces);
        const long long gate_at = p + static_cast<long long>(m) * row_pieces, up_at = gate_at + row_pieces;
        const uint4 d4 = dact[p], g4 = h[gate_at], u4 = h[up_at];
        const unsigned d[4] = {d4.x, d4.y, d4.z, d4.w}, g[4] = {g4.x, g4.y, g4.z, g4.w};
        const unsigned u[4] = {u4.x, u4.y, u4.z, u4.w};
        unsigned dgate[4], dup[4], a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // a packed pair of columns at a time
            float dv[2], gv[2], uv[2], dg[2], du[2], av[2];
            sm90::unpack_pair<IN>(d[i], dv[0], dv[1]);
            sm90::unpack_pair<IN>(g[i], gv[0], gv[1]);
            sm90::unpack_pair<IN>(u[i], uv[0], uv[1]);
            sm90::dswiglu_pair(dv, gv, uv, dg, du, av);
            dgate[i] = sm90::pack_pair<IN>(dg[0], dg[1]);
            dup[i] = sm90::pack_pair<IN>(du[0], du[1]);
            a[i] = sm90::pack_pair<IN>(av[0], av[1]);
        }
        dh[gate_at] = make_uint4(dgate[0], dgate[1], dgate[2], dgate[3]);
        dh[up_at] = make_uint4(dup[0], dup[1], dup[2], dup[3]);
        act[p] = make_uint4(a[0], a[1], a[2], a[3]);
    }
}
// --8<-- [end:pass]
