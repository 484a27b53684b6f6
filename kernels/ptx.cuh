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
