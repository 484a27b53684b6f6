"""k0: the FP32 baseline of the ragged-M grouped GEMM, in numba-cuda (chapter 01).

One launch covers every expert. The grid is the flat tile list: block ``b`` reads descriptor
``tiles[b] = (expert, row0, rows, col0)`` and computes the 64 x 64 tile of C whose rows
``row0 .. row0 + rows`` all belong to ``expert``::

        C [M_tot, N]                    one 64 x 64 tile, 256 threads
      +----+----+----+-+             +---------+---------+
      | t0 | t1 | t2 |.|  expert 0   | warp 0  | warp 1  |  each warp: 16 rows x 32 columns,
      +----+----+----+-+             +---------+---------+  each thread: a 4 x 4 micro-tile
      | t3 | t4 | t5 |.|  (partial)  | warp 2  | warp 3  |
      +----+----+----+-+ ----------  +---------+---------+
      | t6 | t7 | t8 |.|  expert 2   | warp 4  | warp 5  |
      +----+----+----+-+             +---------+---------+
                     ^ column guard  | warp 6  | warp 7  |
                       at N          +---------+---------+

K is walked in slices of BK = 16. Per slice the block copies a 64 x 16 piece of A and a 16 x 64
piece of B[expert] from global memory (bf16) into shared memory (widened to fp32), then every
thread does 16 rank-1 updates of its 4 x 4 accumulator: 256 FFMAs per slice for 32 shared
loads of 16 bytes. The accumulators stay fp32 to the end and are rounded to bf16 once.

bf16 has no numba type: A, B and C arrive as their raw 16-bit words (uint16). The same source
also runs in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which has neither libdevice nor
aligned shared arrays; the few lines that differ are in the "platform" section.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, float32, int32, int64, uint16, uint32, uint64

# --8<-- [start:config]
BM, BN, BK = 64, 64, 16  # the block's tile of C, and the K slice per step
TM, TN = 4, 4  # each thread's register micro-tile
THREADS = (BM // TM) * (BN // TN)  # 256: one thread per micro-tile
WARPS = THREADS // 32
# A is staged k-major (a_s[k, m]): a thread's four rows are adjacent and
# load as one 16-byte read. 4 floats of padding per row keep the rows
# 16-byte aligned and halve the bank conflicts of the transposing store.
A_STRIDE = BM + 4
# --8<-- [end:config]

SIMULATOR = bool(config.ENABLE_CUDASIM)

# --8<-- [start:platform]
if SIMULATOR:
    # The simulator runs the kernel as Python on numpy scalars.
    def float_bits(x):
        return np.float32(x).view(np.int32)

    def bits_float(bits):
        return np.int32(bits).view(np.float32)

    @cuda.jit(device=True)
    def shared_slices():
        # One array per line: the simulator tells them apart by line.
        a_s = cuda.shared.array((BK, A_STRIDE), float32)
        b_s = cuda.shared.array((BK, BN), float32)
        return a_s, b_s
else:
    from numba.cuda import libdevice

    # Register reinterpretations: no instruction at all.
    float_bits = libdevice.float_as_int
    bits_float = libdevice.int_as_float

    @cuda.jit(device=True)
    def shared_slices():
        # 16-byte alignment lets the compiler read a thread's four adjacent
        # floats with one LDS.128 (the default, 4 bytes, gives four LDS).
        a_s = cuda.shared.array((BK, A_STRIDE), float32, alignment=16)
        b_s = cuda.shared.array((BK, BN), float32, alignment=16)
        return a_s, b_s
# --8<-- [end:platform]


# --8<-- [start:convert]
@cuda.jit(device=True)
def bf16_to_f32(bits):
    """bf16 is the top half of an fp32: shift up, reinterpret (exact)."""
    return bits_float(int32(int32(bits) << 16))


@cuda.jit(device=True)
def f32_to_bf16(x):
    """Round to the nearest bf16, ties to even, on the bit pattern."""
    if x != x:
        return uint16(0x7FC0)  # NaN: a quiet NaN
    u = int64(float_bits(x)) & 0xFFFFFFFF
    # + 0x7FFF rounds a tie down; + the lowest kept bit makes it round to
    # even. A carry out of the mantissa bumps the exponent (up to inf).
    return uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
# --8<-- [end:convert]


@cuda.jit
def k0_fp32(a, b, tiles, c):
    """C[rows of e] = A[rows of e] @ B[e] for the tile ``tiles[blockIdx.x]``.

    a [M_tot, K], b [E, K, N], c [M_tot, N]: bf16 as uint16; tiles [T, 4]
    int32. K must be a multiple of BK (the wrapper checks it).
    """
    # --8<-- [start:tile]
    tile = cuda.blockIdx.x
    expert = tiles[tile, 0]
    row0 = tiles[tile, 1]
    rows = tiles[tile, 2]  # 1 .. BM: an expert's last tile may be partial
    col0 = tiles[tile, 3]
    K = a.shape[1]
    N = c.shape[1]
    a_s, b_s = shared_slices()

    # Unsigned: the index arithmetic below is known to be non-negative.
    t = uint32(cuda.threadIdx.x)
    warp, lane = t // 32, t % 32
    # Warps tile the block 4 (rows) x 2 (columns); a warp's lanes tile its
    # 16 x 32 patch 4 x 8. Per k, a warp reads 4 distinct A fragments
    # (64 bytes) and 8 distinct B fragments (128 bytes): one shared-memory
    # wavefront each.
    m_frag = (warp // 2 * 4 + lane // 8) * TM  # this thread's first row
    n_frag = (warp % 2 * 8 + lane % 8) * TN  # and first column
    # --8<-- [end:tile]

    # --8<-- [start:staging_map]
    # A warp reads 16 consecutive k of 2 rows of A (two 32-byte sectors)
    # and 32 consecutive columns of one row of B (two sectors).
    a_k = t % BK
    a_m = t // BK  # and a_m + 16, + 32, + 48
    b_n = t % BN
    b_k = t // BN  # and b_k + 4, + 8, + 12
    # The load-side guards: rows past the expert's end re-read its last
    # row, columns past N re-read column N - 1. Never stored.
    b_col = min(col0 + b_n, N - 1)
    # --8<-- [end:staging_map]

    acc = cuda.local.array((TM, TN), float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = float32(0.0)

    # --8<-- [start:mainloop]
    for k0 in range(0, K, BK):
        # Global indices are unsigned: numba wraps negative signed indices
        # as Python does, six integer instructions per load.
        for q in range(BM * BK // THREADS):  # 4 elements of A per thread
            m = a_m + q * (THREADS // BK)
            row = row0 + min(m, rows - 1)
            a_s[a_k, m] = bf16_to_f32(a[uint64(row), uint64(k0 + a_k)])
        for q in range(BK * BN // THREADS):  # 4 elements of B per thread
            k = b_k + q * (THREADS // BN)
            b_s[k, b_n] = bf16_to_f32(
                b[uint64(expert), uint64(k0 + k), uint64(b_col)])
        cuda.syncthreads()

        # 16 rank-1 updates. A while loop on an unsigned counter: numba
        # lowers range() to a loop the compiler does not unroll, and this
        # one it unrolls, so every shared-memory offset is a constant.
        kk = uint32(0)
        while kk < BK:
            a_frag = cuda.local.array(TM, float32)
            b_frag = cuda.local.array(TN, float32)
            for i in range(TM):
                a_frag[i] = a_s[kk, m_frag + i]
            for j in range(TN):
                b_frag[j] = b_s[kk, n_frag + j]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a_frag[i] * b_frag[j]
            kk += uint32(1)
        cuda.syncthreads()  # all reads done before the next slice lands
    # --8<-- [end:mainloop]

    # --8<-- [start:epilogue]
    for i in range(TM):
        m = m_frag + i
        if m < rows:  # the row guard, at the expert's last row
            for j in range(TN):
                n = col0 + n_frag + j
                if n < N:  # the column guard, at N
                    c[uint64(row0 + m), uint64(n)] = f32_to_bf16(acc[i, j])
    # --8<-- [end:epilogue]


@cuda.jit
def bf16_round_trip(x, bits, widened):
    """Test kernel: fp32 -> bf16 bits -> fp32, one thread per value."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        bits[i] = f32_to_bf16(x[i])
        widened[i] = bf16_to_f32(bits[i])
