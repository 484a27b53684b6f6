// ptx.cuh: the inline-PTX wrappers the CUDA C++ kernels share (k1, k2, ...).
//
// NVRTC compiles these kernels with no system include path, so nothing here includes a CUDA
// header: bf16 values travel as 16-bit words (unsigned short) or packed pairs (unsigned), and
// every instruction the kernels care about is written out as PTX. Each wrapper names the PTX ISA
// section it wraps. Section numbers are those of PTX ISA 9.4 (the CUDA 13 documentation); they
// move between releases, the anchors after the '#' do not:
//   https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#<anchor>
//
// Sections below are headed by the kernel that introduced them; later kernels reuse earlier ones.
#pragma once

// ============================================================================================
// k1: cp.async, ldmatrix, mma.sync (sm_80 and newer)
// ============================================================================================

// A shared-memory address as the 32-bit offset the .shared state space uses (cvta.to.shared).
// PTX ISA "Data Movement and Conversion Instructions: cvta"
//   #data-movement-and-conversion-instructions-cvta
__device__ __forceinline__ unsigned smem_u32(const void* generic) {
    return static_cast<unsigned>(__cvta_generic_to_shared(generic));
}

// --8<-- [start:cp_async]
// One 16-byte global -> shared copy that bypasses the registers (SASS: LDGSTS). With src-size 0
// nothing is read and the 16 destination bytes are zero-filled, which is how a tile's rows past
// its expert and columns past N become zeros without a branch around the copy.
// PTX ISA 9.7.10.28.3.1 "Data Movement and Conversion Instructions: cp.async"
//   #data-movement-and-conversion-instructions-cp-async
// .cg caches in L2 only: each 16-byte chunk is used once per block, so L1 would gain nothing.
__device__ __forceinline__ void cp_async_16(unsigned smem_dst, const void* gmem_src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_dst), "l"(gmem_src), "r"(valid ? 16 : 0) : "memory");
}

// Close the group of cp.async issued so far by this thread.
// PTX ISA 9.7.10.28.3.2 "Data Movement and Conversion Instructions: cp.async.commit_group"
//   #data-movement-and-conversion-instructions-cp-async-commit-group
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most PENDING of this thread's committed groups are still in flight. It covers
// only the calling thread's copies: a __syncthreads() must follow before other threads read them.
// PTX ISA 9.7.10.28.3.3 "Data Movement and Conversion Instructions: cp.async.wait_group"
//   #data-movement-and-conversion-instructions-cp-async-wait-group
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}
// --8<-- [end:cp_async]

// --8<-- [start:ldmatrix]
// Four 8x8 matrices of 16-bit elements from shared memory, one per destination register
// (SASS: LDSM.16.M88.4). Lane l supplies the address of one 16-byte matrix row: lanes 0-7 the
// rows of matrix 0, lanes 8-15 of matrix 1, 16-23 of matrix 2, 24-31 of matrix 3. Each lane
// receives, in r[j], the two elements (row l/4, columns 2*(l%4) and 2*(l%4)+1) of matrix j.
// PTX ISA 9.7.16.5.15 "Warp-level matrix load instruction: ldmatrix"
//   #warp-level-matrix-instructions-ldmatrix
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row));
}

// The same load, transposed on the way (SASS: LDSM.16.MT88.4): lane l receives elements
// (rows 2*(l%4) and 2*(l%4)+1, column l/4) of each matrix as it lies in memory. A K x N
// row-major tile read this way arrives in the column-major ("col") B fragment of mma.sync.
// PTX ISA 9.7.16.5.15 "Warp-level matrix load instruction: ldmatrix" (.trans)
//   #warp-level-matrix-instructions-ldmatrix
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row));
}
// --8<-- [end:ldmatrix]

// --8<-- [start:mma]
// D = A * B + D for one 16x8x16 tile: A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32,
// each spread over the warp's 32 lanes (SASS: HMMA.16816.F32.BF16). With g = lane/4 and
// t = lane%4, a lane holds
//   a[0]: A[g][2t..2t+1]    a[1]: A[g+8][2t..2t+1]    a[2]: A[g][2t+8..2t+9]    a[3]: A[g+8][2t+8..2t+9]
//   b[0]: B[2t..2t+1][g]    b[1]: B[2t+8..2t+9][g]
//   d[0..1]: D[g][2t..2t+1] d[2..3]: D[g+8][2t..2t+1]
// PTX ISA 9.7.16.5.14 "Multiply-and-Accumulate Instruction: mma"
//   #warp-level-matrix-instructions-mma
// PTX ISA 9.7.16.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type"
//   #warp-level-matrix-fragment-mma-16816-float
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// --8<-- [end:mma]

// Two fp32 values rounded to nearest-even bf16 and packed into one 32-bit word, `lo` in the low
// half (the lower address once stored): cvt puts its first source in the upper half.
// PTX ISA "Data Movement and Conversion Instructions: cvt" (.bf16x2, sm_80 and newer)
//   #data-movement-and-conversion-instructions-cvt
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// The same for fp16 (.f16x2, sm_53 and newer): 10 stored mantissa bits against bf16's 7, 5
// exponent bits against 8, so values past 65,504 become infinities.
// PTX ISA "Data Movement and Conversion Instructions: cvt"   #data-movement-and-conversion-instructions-cvt
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// The reverse, exact: a packed pair of fp16 values (`lo` at the lower address) widened to fp32. (bf16 needs
// no instruction: it is the upper half of an fp32, epilogues.cuh's unpack_pair.)
// PTX ISA "Data Movement and Conversion Instructions: cvt"   #data-movement-and-conversion-instructions-cvt
__device__ __forceinline__ void unpack_f16x2(unsigned packed, float& lo, float& hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
        : "=f"(lo), "=f"(hi) : "r"(packed));
}

// Two fp32 values rounded to nearest-even e4m3 (chapter 10's FP8), `lo` in the low byte: cvt puts its
// first source in the upper 8 bits. .satfinite clamps a magnitude past 448, e4m3's largest finite value,
// to 448 instead of turning it into NaN (e4m3fn has no infinity). sm_89 and newer.
// PTX ISA "Data Movement and Conversion Instructions: cvt"   #data-movement-and-conversion-instructions-cvt
__device__ __forceinline__ unsigned short pack_e4m3x2(float lo, float hi) {
    unsigned short packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// 1 / x to about one ulp (SASS: MUFU.RCP), subnormals flushed to zero: the first step of fp32 division, which
// chapter 10's quantizers refine themselves (e4m3.cuh, Divisor) so as to do it once per group of 128 values.
// PTX ISA "Floating-Point Instructions: rcp.approx"   #floating-point-instructions-rcp
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// ============================================================================================
// k2: TMA and mbarrier wrappers go below this line.
// ============================================================================================

// --8<-- [start:mbarrier]
// An mbarrier is a 64-bit object in shared memory that counts two things for its current phase:
// pending arrivals (set by init, re-armed automatically when a phase completes) and a
// transaction count in bytes (raised by expect_tx, lowered by the async copies that name the
// barrier). The phase completes when both reach zero; waiters then see its parity flip.
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"
//   #parallel-synchronization-and-communication-instructions-mbarrier
// PTX ISA "Tracking asynchronous operations by the mbarrier object" (tx-count)
//   #parallel-synchronization-and-communication-instructions-mbarrier-tracking-async-operations

// Set the expected arrival count of phase 0 (and of every later phase). One thread, once.
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier.init"
//   #parallel-synchronization-and-communication-instructions-mbarrier-init
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}

// Make the initialised barriers visible before anyone else, the TMA unit included, touches them:
// fence.mbarrier_init orders the inits (release, cluster scope) and fence.proxy.async makes the
// generic-proxy writes visible to the async proxy that TMA's complete-tx goes through. A
// __syncthreads() must follow so the other warps see them too.
// PTX ISA "Parallel Synchronization and Communication Instructions: membar / fence"
//   #parallel-synchronization-and-communication-instructions-membar
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Arrive once and, in the same atomic step, raise the phase's transaction count by `bytes`:
// the phase cannot complete until that many bytes have landed (SASS: SYNCS.ARRIVE.TRANS64...).
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier.arrive" (.expect_tx)
//   #parallel-synchronization-and-communication-instructions-mbarrier-arrive
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}

// Arrive once (release semantics at CTA scope: this thread's earlier shared-memory reads are
// ordered before the arrival, so a producer that sees the phase complete may overwrite the data).
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier.arrive"
//   #parallel-synchronization-and-communication-instructions-mbarrier-arrive
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

// Block until the phase with parity `parity` has completed. try_wait may suspend the thread for
// a while in hardware before answering false, so the loop does not spin hot. Only the current
// phase and the one just before it can be named: parity 1 on a fresh barrier (phase 0 in
// progress) refers to the "preceding" phase and returns at once, which is what lets a producer
// start on an empty ring without a special case.
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier.test_wait /
// mbarrier.try_wait" (.parity, acquire semantics by default)
//   #parallel-synchronization-and-communication-instructions-mbarrier-test-wait-mbarrier-try-wait
__device__ __forceinline__ void mbarrier_wait_parity(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n"
                     "  .reg .pred complete;\n"
                     "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
                     "  selp.u32 %0, 1, 0, complete;\n"
                     "}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// --8<-- [end:mbarrier]

// --8<-- [start:tma]
// A CUtensorMap is the 128-byte descriptor cuTensorMapEncodeTiled writes on the host. NVRTC has
// no cuda.h, so the type is declared here with the same size and alignment; kernels take it by
// value as a `const __grid_constant__` parameter and pass its generic address to TMA.
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };

// Fetch a descriptor into the TMA unit's cache ahead of its first use.
// PTX ISA "Data Movement and Conversion Instructions: prefetch, prefetchu" (.tensormap)
//   #data-movement-and-conversion-instructions-prefetch-prefetchu
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}

// One box of a 2-D / 3-D tensor, global -> shared, completed on the mbarrier `bar` by a
// complete-tx of the box's bytes (SASS: UTMALDG.2D / UTMALDG.3D). Coordinates are element
// indices, innermost dimension first, and may lie partly or wholly outside the tensor: those
// elements are written to shared memory as zeros (zero-fill mode), so the destination always
// receives the full box. One thread issues it; the copy runs in the background.
// PTX ISA "Data Movement and Conversion Instructions: cp.async.bulk.tensor"
//   #data-movement-and-conversion-instructions-cp-async-bulk-tensor
// PTX ISA "Tensor: Tiled Mode: Out of Boundary Access"   #tensor-tiled-mode-oob-access
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

__device__ __forceinline__ void tma_load_3d(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// --8<-- [end:tma]

// ============================================================================================
// k3: wgmma, setmaxnreg and clusters (sm_90a)
// ============================================================================================

// --8<-- [start:wgmma_sync]
// wgmma.mma_async runs in the background: the warpgroup issues it and moves on. Three
// instructions order it against everything else.
//   fence:  orders this warpgroup's prior accesses to its registers before the wgmma that
//           follows reads or writes the same registers: the accumulators, and the A fragments
//           when A comes from registers. Needed before the first wgmma of a tile, and whenever
//           other code has touched the accumulator registers since the last one (SASS:
//           WARPGROUP.ARRIVE). It does not order shared memory: data the generic proxy (st.shared,
//           stmatrix) wrote needs fence.proxy.async before the async proxy (wgmma, TMA) reads it;
//           data TMA wrote is published to wgmma by the mbarrier the consumer waited on.
//   commit: close the group of wgmma issued since the last commit.
//   wait N: block until at most N committed groups are still running (SASS:
//           WARPGROUP.DEPBAR.LE); only then may their accumulators be read or their shared-
//           memory operands be overwritten.
// PTX ISA 9.7.15.7 "Asynchronous wgmma Proxy Operations" (wgmma.fence, .commit_group, .wait_group)
//   #asynchronous-warpgroup-level-matrix-instructions-wgmma-fence
//   #asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group
//   #asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}
// --8<-- [end:wgmma_sync]

// --8<-- [start:descriptor]
// How a kernel addresses one operand tile and builds its descriptors: the constant fields of the
// descriptor (LBO, SBO, swizzle; for tcgen05 also the fixed version bits) and the start-address
// steps between sub-tiles, built on the host (moe_gemm.cuda.descriptors.operand_plan for wgmma,
// moe_gemm.variants.k4.tcgen05 for tcgen05) so that the descriptors the GPU runs are the ones CI interprets.
// Sub-tile (64-row or 64-column block j, k16 step kk) of a tile at shared address `tile` has the
// descriptor matrix_descriptor(bits, tile + j * mn64_bytes + kk * k16_bytes).
struct OperandPlan {
    unsigned long long bits;
    unsigned k16_bytes;
    unsigned mn64_bytes;
};

// A shared-memory matrix descriptor: the fixed fields, ORed with the start-address field, bits 4..17 of the
// operand's shared-memory address (14 bits: addresses below 256 KB). The mask is a guard: the PTX
// ISA does not say whether a .shared::cta address can carry bits above 17 (CUTLASS's sm_100 TMA
// code assumes a block's rank at bit 24), and any such bit would spill into the LBO field at
// bit 16 (invisible for swizzled K-major operands, whose LBO is unused; wrong for MN-major ones).
// PTX ISA "Matrix Descriptor Format"   #asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor
__device__ __forceinline__ unsigned long long matrix_descriptor(unsigned long long fixed_fields, unsigned smem_addr) {
    return fixed_fields | ((smem_addr & 0x3FFFF) >> 4);
}
// --8<-- [end:descriptor]

// Inline asm spells every operand out: a wgmma of width N names N/2 accumulator registers per
// thread. These macros write the "+f"(d[i]) list and the matching "%0, %1, ..." text once.
#define PTX_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                  "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define PTX_F32(i) PTX_F8(i), PTX_F8(i + 8), PTX_F8(i + 16), PTX_F8(i + 24)
#define PTX_R10(t) "%" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t "8, %" #t "9, "
#define PTX_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define PTX_R16 PTX_R10() "%10, %11, %12, %13, %14, %15"
#define PTX_R24 PTX_R10() PTX_R10(1) "%20, %21, %22, %23"
#define PTX_R32 PTX_R10() PTX_R10(1) PTX_R10(2) "%30, %31"
#define PTX_R64 PTX_R10() PTX_R10(1) PTX_R10(2) PTX_R10(3) PTX_R10(4) PTX_R10(5) "%60, %61, %62, %63"
#define PTX_R96 PTX_R10() PTX_R10(1) PTX_R10(2) PTX_R10(3) PTX_R10(4) PTX_R10(5) PTX_R10(6) PTX_R10(7) \
                PTX_R10(8) "%90, %91, %92, %93, %94, %95"
#define PTX_R128 PTX_R10() PTX_R10(1) PTX_R10(2) PTX_R10(3) PTX_R10(4) PTX_R10(5) PTX_R10(6) PTX_R10(7) \
                 PTX_R10(8) PTX_R10(9) PTX_R10(10) PTX_R10(11) "%120, %121, %122, %123, %124, %125, %126, %127"
// The instruction text; T is the input type ("bf16" or "f16"); D, A, B, P, TA, TB are the operand
// numbers of the accumulator list, the two descriptors, the accumulate flag and the A- and
// B-transpose immediates.
#define PTX_WGMMA(N, T, D, A, B, P, TA, TB)                                                       \
    "{\n"                                                                                         \
    "  .reg .pred accumulate;\n"                                                                  \
    "  setp.ne.b32 accumulate, %" #P ", 0;\n"                                                     \
    "  wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" D "}, %" #A ", %" #B ",\n"  \
    "      accumulate, 1, 1, %" #TA ", %" #TB ";\n"                                               \
    "}\n"

// --8<-- [start:wgmma]
// D[64 x N] (+)= A[64 x 16] * B[16 x N], bf16 in (or fp16: F16, the same rate and layouts), fp32
// accumulators in registers, both operands read from shared memory through 64-bit matrix
// descriptors (SASS: HGMMA.64xNx16.F32.BF16, or .F32.F16).
// Issued by all 128 threads of a warpgroup; warp w of the warpgroup holds rows 16w .. 16w+15 of
// D and, with g = lane/4 and t = lane%4, thread element d[4j + 2h + c] is
//   D[16w + 8h + g][8j + 2t + c]      (j < N/8, h and c in {0, 1})
// the mma.sync m16n8 pattern repeated across N. `accumulate` false means D = A * B: the first
// k16 step of a tile needs no zeroed registers. TRANS_A says A is MN-major in shared memory (M
// contiguous; chapter 06's swap-AB tiles feed B [K, N] as A), TRANS_B that B is (B [K, N]
// row-major, N contiguous); bf16 and fp16 allow both, and K-major is the untransposed default.
// PTX ISA 9.7.15.5.2 "wgmma.mma_async"   #asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async
// PTX ISA "Register Fragments and Shared Memory Matrix Layouts"
//   #asynchronous-warpgroup-level-matrix-register-fragment-wgmma-64nnk16 (the accumulator layout)
//   #asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor (the descriptor)
template <int N, bool TRANS_A, bool TRANS_B, bool F16 = false>
__device__ __forceinline__ void wgmma_16bit(float (&d)[N / 2], unsigned long long desc_a,
                                            unsigned long long desc_b, bool accumulate) {
    static_assert(N % 16 == 0 && (N <= 64 || N % 64 == 0) && N <= 256,
                  "wgmma widths used here: 16, 32, 48, 64, 128, 192, 256");
    const int acc = accumulate;
    constexpr int TA = TRANS_A, TB = TRANS_B;
// One asm statement per element type: the instruction's type is part of its text, which must be a
// literal. The trailing arguments are the accumulator list (PTX_F8 / PTX_F32 pieces), the rest
// PTX_WGMMA's.
#define WGMMA_16BIT(N, REGS, A, B, P, TA_, TB_, ...)                                                \
    if constexpr (F16)                                                                             \
        asm volatile(PTX_WGMMA(N, "f16", REGS, A, B, P, TA_, TB_)                                   \
                     : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(TA), "n"(TB));         \
    else                                                                                           \
        asm volatile(PTX_WGMMA(N, "bf16", REGS, A, B, P, TA_, TB_)                                  \
                     : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(TA), "n"(TB))
    if constexpr (N == 16) { WGMMA_16BIT(16, PTX_R8, 8, 9, 10, 11, 12, PTX_F8(0)); }
    if constexpr (N == 32) { WGMMA_16BIT(32, PTX_R16, 16, 17, 18, 19, 20, PTX_F8(0), PTX_F8(8)); }
    if constexpr (N == 48) { WGMMA_16BIT(48, PTX_R24, 24, 25, 26, 27, 28, PTX_F8(0), PTX_F8(8), PTX_F8(16)); }
    if constexpr (N == 64) { WGMMA_16BIT(64, PTX_R32, 32, 33, 34, 35, 36, PTX_F32(0)); }
    if constexpr (N == 128) { WGMMA_16BIT(128, PTX_R64, 64, 65, 66, 67, 68, PTX_F32(0), PTX_F32(32)); }
    if constexpr (N == 192) { WGMMA_16BIT(192, PTX_R96, 96, 97, 98, 99, 100, PTX_F32(0), PTX_F32(32), PTX_F32(64)); }
    if constexpr (N == 256) {
        WGMMA_16BIT(256, PTX_R128, 128, 129, 130, 131, 132, PTX_F32(0), PTX_F32(32), PTX_F32(64), PTX_F32(96));
    }
#undef WGMMA_16BIT
}
// --8<-- [end:wgmma]

// --8<-- [start:wgmma_e4m3]
// D[64 x N] (+)= A[64 x 32] * B[32 x N] in fp8 e4m3 (chapter 10): twice the elements per instruction of the
// 16-bit form at the same shared-memory bytes, so a k32 step is the same 32 bytes along a 128-byte swizzled
// row as a bf16 k16 step, and the same descriptors address it (descriptor_steps.cuh). 8-bit types have no
// transposed layouts: both operands are K-major in shared memory (A [M, K] and B^T [E, N, K] row-major), and
// the instruction takes no transpose immediates, only the two scale immediates (1: no negation). The
// accumulators keep the layout of wgmma_16bit's (d[4j + 2h + c] is D[16w + 8h + g][8j + 2t + c]); their
// precision does not: Hopper's FP8 tensor cores add products into fewer bits than fp32 (about 14, per the
// DeepSeek-V3 technical report, section 3.3.2), which is why k8 promotes its sums every 128 of K
// (SASS: QGMMA.64xNx32.F32.E4M3.E4M3).
// PTX ISA 9.7.15.5.2 "wgmma.mma_async" (.atype/.btype .e4m3 with .m64nNk32)
//   #asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async
#define PTX_WGMMA_E4M3(N, D, A, B, P)                                                             \
    "{\n"                                                                                         \
    "  .reg .pred accumulate;\n"                                                                  \
    "  setp.ne.b32 accumulate, %" #P ", 0;\n"                                                     \
    "  wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" D "}, %" #A ", %" #B ",\n"    \
    "      accumulate, 1, 1;\n"                                                                   \
    "}\n"
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b,
                                           bool accumulate) {
    static_assert(N == 64 || N == 128 || N == 192 || N == 256, "e4m3 wgmma widths used here: 64, 128, 192, 256");
    const int acc = accumulate;
    if constexpr (N == 64)
        asm volatile(PTX_WGMMA_E4M3(64, PTX_R32, 32, 33, 34) : PTX_F32(0) : "l"(desc_a), "l"(desc_b), "r"(acc));
    if constexpr (N == 128)
        asm volatile(PTX_WGMMA_E4M3(128, PTX_R64, 64, 65, 66) : PTX_F32(0), PTX_F32(32)
                     : "l"(desc_a), "l"(desc_b), "r"(acc));
    if constexpr (N == 192)
        asm volatile(PTX_WGMMA_E4M3(192, PTX_R96, 96, 97, 98) : PTX_F32(0), PTX_F32(32), PTX_F32(64)
                     : "l"(desc_a), "l"(desc_b), "r"(acc));
    if constexpr (N == 256)
        asm volatile(PTX_WGMMA_E4M3(256, PTX_R128, 128, 129, 130) : PTX_F32(0), PTX_F32(32), PTX_F32(64), PTX_F32(96)
                     : "l"(desc_a), "l"(desc_b), "r"(acc));
}

// The compiler sees a wgmma's accumulators as written when the asm statement issues, not when
// wgmma.wait_group returns, so ordinary code that reads them after the wait could be scheduled before it.
// An empty volatile asm that "rewrites" each register, placed after the wait, pins every later read behind
// it (volatile asm statements keep their order). CUTLASS calls it warpgroup_fence_operand.
template <int COUNT>
__device__ __forceinline__ void fence_accumulators(float (&d)[COUNT]) {
#pragma unroll
    for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// --8<-- [end:wgmma_e4m3]

// --8<-- [start:setmaxnreg]
// Move registers between warpgroups at run time. The kernel starts every warp at the cap its
// __launch_bounds__(THREADS, 1) gives (65,536 / THREADS, rounded down to a multiple of 8); the
// producer warpgroup then gives most of its share back (dec) and the consumer warpgroups take it
// (inc), which blocks until the pool has enough. COUNT is a multiple of 8 in [24, 256]. Executed
// by all threads of a warpgroup (SASS: USETMAXREG.DEALLOC / USETMAXREG.TRY_ALLOC).
// PTX ISA "Miscellaneous Instructions: setmaxnreg"   #miscellaneous-instructions-setmaxnreg
template <int COUNT>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(COUNT % 8 == 0 && COUNT >= 24 && COUNT <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(COUNT));
}

template <int COUNT>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(COUNT % 8 == 0 && COUNT >= 24 && COUNT <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(COUNT));
}
// --8<-- [end:setmaxnreg]

// --8<-- [start:griddepcontrol]
// Programmatic dependent launch (a launch made with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION):
// the next kernel on the stream may start while this one is still running. wait blocks the thread until
// every prerequisite grid has completed and its memory operations are visible; a thread must execute it
// before it reads what the previous kernel wrote or writes what that kernel may still read. In a launch
// without the attribute there is no prerequisite grid, and it returns at once. launch_dependents lets the
// dependent grid be scheduled once every block of this one has issued it or exited (one thread per block
// suffices; repeats have no further effect); it promises nothing about memory, which wait covers.
// PTX ISA "Parallel Synchronization and Communication Instructions: griddepcontrol"
//   #parallel-synchronization-and-communication-instructions-griddepcontrol
__device__ __forceinline__ void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

__device__ __forceinline__ void griddepcontrol_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// --8<-- [end:griddepcontrol]

// --8<-- [start:cluster]
// Thread block clusters: the blocks of a cluster run at the same time on one GPC and can reach
// each other's shared memory (the shared::cluster window).

// This block's rank in its cluster.
// PTX ISA "Special Registers: %cluster_ctarank"   #special-registers-cluster-ctarank
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster arrives, then waits for all of them: a
// __syncthreads() across the cluster, with release/acquire ordering of shared memory.
// PTX ISA "Parallel Synchronization and Communication Instructions: barrier.cluster"
//   #parallel-synchronization-and-communication-instructions-barrier-cluster
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of the variable at `addr` (a shared::cta address) in block `rank`.
// PTX ISA "Data Movement and Conversion Instructions: mapa"
//   #data-movement-and-conversion-instructions-mapa
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}

// Arrive on an mbarrier in any block of the cluster (a mapa address). The default semantics,
// release at CTA scope, are what CUTLASS's ClusterBarrier::arrive uses for the same hand-over: the
// arriving consumer's reads of the stage were made by wgmma and are complete (wgmma.wait_group
// returned) before the arrive is issued, so no later write, the peer's multicast included, can
// overtake them. Asking for .release.cluster instead costs a MEMBAR per arrival in SASS.
// PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier.arrive"
//   #parallel-synchronization-and-communication-instructions-mbarrier-arrive
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned cluster_bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(cluster_bar) : "memory");
}

// tma_load_3d, delivered to the same shared-memory offset in every block of `cta_mask` (bit i:
// cluster rank i), each destination's mbarrier at the same offset receiving the complete-tx of
// the bytes it got. One L2 read feeds several blocks (SASS: UTMALDG.3D.MULTICAST).
// PTX ISA "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.multicast::cluster)
//   #data-movement-and-conversion-instructions-cp-async-bulk-tensor
__device__ __forceinline__ void tma_load_3d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                      unsigned bar, unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask) : "memory");
}
// tma_load_2d, multicast: chapter 07's k6 splits A's box between the two blocks of a cluster
// that share its rows, each loading half for both (SASS: UTMALDG.2D.MULTICAST).
// PTX ISA "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.multicast::cluster)
//   #data-movement-and-conversion-instructions-cp-async-bulk-tensor
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const CUtensorMap* map, int c0, int c1,
                                                      unsigned bar, unsigned short cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask) : "memory");
}
// --8<-- [end:cluster]

// --8<-- [start:tma_store]
// The store path of an epilogue through shared memory: registers -> shared (stmatrix) -> global
// (TMA), so the consumer warps hand the tile to the copy engine and go back to multiplying.

// Four 8x8 matrices of 16-bit elements to shared memory, the mirror of ldmatrix_x4: lane l gives
// the address of row l%8 of matrix l/8 and holds, in r[j], elements (row l/4, columns 2(l%4) and
// 2(l%4)+1) of matrix j: exactly an mma/wgmma accumulator fragment once packed to bf16x2
// (SASS: STSM.16.M88.4).
// PTX ISA "Warp-level matrix store instruction: stmatrix"   #warp-level-matrix-instructions-stmatrix
__device__ __forceinline__ void stmatrix_x4(unsigned smem_row, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(smem_row), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// C[i], C[i + 1] += lo, hi in global memory (8-byte aligned), as one reduction that L2 performs: the
// thread issues it and moves on, with no load to wait for (SASS: REDG.E.ADD.F32x2...). k7's accumulate
// mode adds a weight gradient into an fp32 buffer this way; each element receives one add per launch,
// so the sum is the same whatever order the blocks run in. Vector red needs sm_90 and .global.
// PTX ISA "Parallel Synchronization and Communication Instructions: red"
//   #parallel-synchronization-and-communication-instructions-red
__device__ __forceinline__ void red_add_f32x2(float* address, float lo, float hi) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(address), "f"(lo), "f"(hi) : "memory");
}

// Sixteen zero bytes to shared memory at `addr` (16-byte aligned): k7 overwrites another expert's
// rows in a stage with zeros before its wgmmas read it (SASS: STS.128).
// PTX ISA "Data Movement and Conversion Instructions: st"   #data-movement-and-conversion-instructions-st
__device__ __forceinline__ void store_shared_zero_16(unsigned addr) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" :: "r"(addr), "r"(0) : "memory");
}

// Four bytes from shared memory at `addr` (4-byte aligned): k6's SwiGLU backward reads the saved
// pre-activation where TMA left it (SASS: LDS).
// PTX ISA "Data Movement and Conversion Instructions: ld"   #data-movement-and-conversion-instructions-ld
__device__ __forceinline__ unsigned load_shared_u32(unsigned addr) {
    unsigned value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr) : "memory");
    return value;
}

// --8<-- [start:l2_hints]
// L2 eviction priorities. When a set of L2 needs room, evict_first lines go before evict_normal ones and
// evict_last lines after them. k6's SwiGLU backward marks the weights it reads again (W_down's column tiles,
// shared by a raster group's M tiles) evict_last and the saved pre-activation it reads once evict_first, so
// that its streams do not push the weights out before their next reader. (Its stores stay evict_normal:
// st.global.cs there took the epilogue past its 232 registers, 32 bytes of spills.)
//
// A TMA copy takes a priority as a cache policy: an opaque 64-bit value that createpolicy makes and
// .L2::cache_hint applies. Fraction 1.0: every access under the policy gets the priority. Not volatile: a
// policy is a value, made once where the compiler likes.
// PTX ISA "Data Movement and Conversion Instructions: createpolicy"
//   #data-movement-and-conversion-instructions-createpolicy
__device__ __forceinline__ unsigned long long l2_evict_last_policy() {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

// tma_load_3d under an L2 cache policy.
// PTX ISA "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.L2::cache_hint)
//   #data-movement-and-conversion-instructions-cp-async-bulk-tensor
__device__ __forceinline__ void tma_load_3d_hinted(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                   unsigned bar, unsigned long long policy) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy) : "memory");
}

// A load says evict-first with no policy register: the .cs ("cache streaming") operator allocates the lines
// evict-first in L1 and L2. Four read-only bytes: __ldg's load (ld.global.nc) with .cs (SASS: LDG.E.EF.CONSTANT).
// Volatile, as the other wrappers, so the epilogue's loads stay where it issues them: all of a row's before
// its first store.
// PTX ISA "Data Movement and Conversion Instructions: ld.global.nc"
//   #data-movement-and-conversion-instructions-ld-global-nc
// PTX ISA "Cache Operators"   #cache-operators
__device__ __forceinline__ unsigned load_global_nc_streaming_u32(const unsigned* address) {
    unsigned value;
    asm volatile("ld.global.cs.nc.b32 %0, [%1];\n" : "=r"(value) : "l"(address));
    return value;
}
// --8<-- [end:l2_hints]

// Shared memory written by ordinary stores (stmatrix included) is read next by TMA, which is the
// async proxy: each writing thread fences before the barrier that lets the copy be issued.
// PTX ISA "Parallel Synchronization and Communication Instructions: membar / fence" (.proxy.async)
//   #parallel-synchronization-and-communication-instructions-membar
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A barrier for `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads): one warpgroup meets without stopping the rest of the block. The kernels take
// their ids from named_barriers.cuh, so that no two groups of threads share one.
// PTX ISA "Parallel Synchronization and Communication Instructions: bar.sync"
//   #parallel-synchronization-and-communication-instructions-bar
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// Arrive on barrier `id` without waiting: the other `threads` - 32k threads wait there with
// bar.sync. Chapter 07's ping-pong consumers hand the tensor cores over this way: the warpgroup
// that has issued its main loop arrives, the one about to start waits.
// PTX ISA "Parallel Synchronization and Communication Instructions: bar.arrive"
//   #parallel-synchronization-and-communication-instructions-bar
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// One box of a 2-D tensor, shared -> global (SASS: UTMASTG.2D). Elements outside the tensor are
// not written, so a box may hang over its edges. Completion is tracked by bulk async-groups of the
// issuing thread: commit closes a group, wait_group.read N returns once at most N groups still
// read shared memory (the buffer may then be reused), wait_group N once at most N are unfinished.
// PTX ISA "cp.async.bulk.tensor" (.global.shared::cta), "cp.async.bulk.commit_group",
// "cp.async.bulk.wait_group"
//   #data-movement-and-conversion-instructions-cp-async-bulk-tensor
//   #data-movement-and-conversion-instructions-cp-async-bulk-wait-group
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, unsigned src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n"
                 :: "l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
}

__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(PENDING) : "memory");
}

template <int PENDING>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(PENDING) : "memory");
}
// --8<-- [end:tma_store]

// ============================================================================================
// k4: tcgen05 and tensor memory (sm_100a / sm_103a) go below this line.
// ============================================================================================
//
// Blackwell's fifth-generation tensor core. One thread issues an MMA that reads A and B from
// shared memory through 64-bit descriptors and accumulates into *tensor memory* (TMEM), a
// per-SM array of 128 lanes x 512 columns of 32-bit cells (256 KB) beside the register file.
// A TMEM address is (lane << 16) | column. The MMA runs asynchronously: tcgen05.commit reports
// its completion on an mbarrier, and warps read the result back with tcgen05.ld.
// PTX ISA "TensorCore 5th Generation Family Instructions"   #tcgen05-instructions
// PTX ISA "Tensor Memory" (the 128 x 512 array, addresses)  #tcgen05-memory-layout

// --8<-- [start:tmem_alloc]
// Reserve COLUMNS columns (all 128 lanes) of this SM's tensor memory and write their base
// address to shared memory at `smem_dst`; the warp blocks until that many columns are free.
// COLUMNS is a power of two in [32, 512]. The instruction is warp-wide (.sync.aligned): one
// warp allocates, and the same warp deallocates before the block exits (SASS: UTCATOMSWS).
// relinquish_alloc_permit declares that this block will allocate no more; CUTLASS's sm100 kernels
// issue it right after their one allocation (release_allocation_lock in
// include/cute/arch/tmem_allocator_sm100.hpp, called from e.g.
// include/cutlass/gemm/kernel/sm100_gemm_array_tma_warpspecialized.hpp).
// PTX ISA "tcgen05.alloc, tcgen05.dealloc, tcgen05.relinquish_alloc_permit"
//   #tcgen05-instructions-tcgen05-alloc-dealloc-relinquish-alloc-permit
template <int COLUMNS>
__device__ __forceinline__ void tmem_alloc(unsigned smem_dst) {
    static_assert(COLUMNS >= 32 && COLUMNS <= 512 && (COLUMNS & (COLUMNS - 1)) == 0,
                  "tcgen05.alloc: a power of two number of columns in [32, 512]");
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                 :: "r"(smem_dst), "n"(COLUMNS) : "memory");
}

__device__ __forceinline__ void tmem_relinquish_alloc_permit() {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}

template <int COLUMNS>
__device__ __forceinline__ void tmem_dealloc(unsigned tmem_base) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" :: "r"(tmem_base), "n"(COLUMNS) : "memory");
}
// --8<-- [end:tmem_alloc]

// --8<-- [start:tcgen05_fence]
// tcgen05 operations are asynchronous, so an ordinary thread synchronisation (bar.sync, an
// mbarrier wait) does not by itself order them. These fences pin them to one: before_thread_sync
// keeps this thread's earlier tcgen05 operations before the synchronisation that follows, and
// after_thread_sync keeps its later tcgen05 operations after the synchronisation that precedes.
// PTX ISA "tcgen05.fence"   #tcgen05-special-sync-operations-fence
// PTX ISA "Memory Consistency Model for 5th generation of TensorCore operations"
//   #tcgen05-memory-consistency-model
__device__ __forceinline__ void tcgen05_fence_before_thread_sync() {
    asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
}

__device__ __forceinline__ void tcgen05_fence_after_thread_sync() {
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
}
// --8<-- [end:tcgen05_fence]

// --8<-- [start:tcgen05_mma]
// D[M x N] (+)= A[M x 16] * B[16 x N] with D in tensor memory at `d_tmem`, bf16 A and B read
// from shared memory through the descriptors `desc_a` and `desc_b`, and M, N, the formats and
// both operands' major-ness in the 32-bit instruction descriptor `idesc` (SASS: UTCHMMA).
// Issued by ONE thread, not a warp; it returns at once. `accumulate` false means D = A * B.
// PTX ISA "tcgen05.mma"   #tcgen05-mma-instructions-mma
// PTX ISA "Instruction descriptor"   #tcgen05-instruction-descriptor
// PTX ISA "Shared Memory Descriptor"   #tcgen05-shared-memory-descriptor
__device__ __forceinline__ void tcgen05_mma_bf16(unsigned d_tmem, unsigned long long desc_a,
                                                 unsigned long long desc_b, unsigned idesc, bool accumulate) {
    asm volatile("{\n"
                 "  .reg .pred accumulate;\n"
                 "  setp.ne.b32 accumulate, %4, 0;\n"
                 "  tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, accumulate;\n"
                 "}\n"
                 :: "r"(d_tmem), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(int(accumulate)) : "memory");
}

// Arrive once on the mbarrier `bar` when every tcgen05.mma this thread has issued so far has
// completed, i.e. has finished reading its shared-memory operands and writing tensor memory
// (SASS: UTCBAR). The commit itself returns at once. It carries the effect of
// tcgen05.fence::before_thread_sync, so a waiter that then fences after_thread_sync may reuse
// the shared memory or read the accumulator.
// PTX ISA "tcgen05.commit"   #tcgen-async-sync-operations-commit
__device__ __forceinline__ void tcgen05_commit(unsigned bar) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
                 :: "r"(bar) : "memory");
}
// --8<-- [end:tcgen05_mma]

// --8<-- [start:tmem_load]
// Thirty-two consecutive 32-bit columns of 32 TMEM lanes into registers, one lane per thread:
// thread t of the warp receives lane (lane of `taddr`) + t, columns (column of `taddr`) + 0..31,
// in r[0..31] (shape .32x32b, .x32; SASS: LDTM.x32). A warp may only touch the 32 lanes of its
// own quarter, 32 * (warp id % 4) and up. tcgen05.ld is asynchronous; tcgen05.wait::ld blocks
// until its registers are written. Both sit in one asm statement because the compiler takes an
// asm's outputs to be ready when the statement ends: with the wait outside, it could schedule a
// use of r[] between the two.
// PTX ISA "tcgen05.ld"   #tcgen05-instructions-tcgen05-ld
// PTX ISA "Matrix fragments for shape .32x32b"   #tcgen05-matrix-fragments-shape-3232b
// PTX ISA "tcgen05.wait"   #tcgen05-instructions-tcgen05-wait
#define PTX_TMEM_F8(i) "=f"(r[i]), "=f"(r[i + 1]), "=f"(r[i + 2]), "=f"(r[i + 3]), \
                       "=f"(r[i + 4]), "=f"(r[i + 5]), "=f"(r[i + 6]), "=f"(r[i + 7])
__device__ __forceinline__ void tmem_load_32x32b_x32(float (&r)[32], unsigned taddr) {
    asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 {" PTX_R32 "}, [%32];\n"
                 "tcgen05.wait::ld.sync.aligned;\n"
                 : PTX_TMEM_F8(0), PTX_TMEM_F8(8), PTX_TMEM_F8(16), PTX_TMEM_F8(24)
                 : "r"(taddr) : "memory");
}
// --8<-- [end:tmem_load]
