// descriptor_steps.cuh: the wgmma descriptors of the 128-byte-swizzled boxes TMA writes, built once per
// stage and stepped by compile-time constants (k6, chapter 07; k7, chapter 09).
#pragma once

#include "ptx.cuh"

namespace sm90 {

// --8<-- [start:descriptors]
// The descriptors' fixed fields for the 128-byte-swizzled boxes TMA writes, as compile-time constants:
// A (and a K-major B) K-major, a k16 step 32 bytes along the row, 64 rows 8 KB; a row-major B
// MN-major, 64-column panels 8 KB apart (LBO), a k16 step 16 rows, 2 KB. The host's
// moe_gemm.cuda.descriptors.operand_plan derives the same numbers from the ISA's layout rules
// (tests/test_k6.py holds the two equal); k3 and k5 take them as a run-time argument.
constexpr OperandPlan K_MAJOR_PLAN{0x4000004000010000ull, 32, 8192};
constexpr OperandPlan MN_MAJOR_PLAN{0x4000004002000000ull, 2048, 8192};

// A descriptor `bytes` further into shared memory: the start-address field (bits 0-13) counts 16-byte
// units, and the ring ends below 256 KB, so the sum never carries out of the field. Adding a constant
// to a descriptor held in uniform registers is one uniform add per wgmma, where rebuilding it from
// the address costs a mask, a shift, an OR and two register-to-uniform moves (CUTLASS's descriptor
// iterator does the same).
__device__ __forceinline__ constexpr unsigned long long descriptor_step(unsigned bytes) {
    return bytes >> 4;
}

// Every lane of the warp holds the same value; a shuffle from lane 0 lets the compiler know it, so
// that the descriptor lives in uniform registers, as HGMMA reads it.
__device__ __forceinline__ unsigned long long warp_uniform(unsigned long long value) {
    const unsigned lo = __shfl_sync(0xffffffffu, static_cast<unsigned>(value), 0);
    const unsigned hi = __shfl_sync(0xffffffffu, static_cast<unsigned>(value >> 32), 0);
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}
// --8<-- [end:descriptors]

}  // namespace sm90
