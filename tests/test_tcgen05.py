"""k4's tcgen05 descriptors, proven three ways without a Blackwell GPU:

(a) field by field against the PTX ISA's tables: "Shared Memory Descriptor"
    (#tcgen05-shared-memory-descriptor, table "Shared memory descriptor layout") and "Instruction
    descriptor" (#tcgen05-instruction-descriptor, the table for .kind::tf32, .kind::f16,
    .kind::f8f6f4 and .kind::i8), with the shapes of "Matrix shape" (#tcgen05-matrix-shape);
(b) against the constants of public implementations, read at the paths cited per test;
(c) through chapter 04's descriptor interpreter: every descriptor k4 builds must decode to the
    MatrixLayout of the wgmma descriptor k3 builds for the same bytes (the one k3 runs on the H200),
    and read, from a shared-memory image written as TMA writes it, the matrix it must describe.
"""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.cuda.descriptors import MatrixLayout, operand_plan, read_operand, tma_write_box
from moe_gemm.model.problem import BF16
from moe_gemm.variants import k4
from moe_gemm.variants.k4.tcgen05 import (
    InstrDescriptor,
    Tcgen05Plan,
    decode_instr,
    decode_smem,
    encode_instr,
    encode_smem,
    smem_from_wgmma,
    smem_plan,
    tmem_address,
    tmem_allocation,
    valid_shape,
)

SHARED_MEMORY_BYTES = 228 * 1024


def bits(value: int, lo: int, width: int) -> int:
    return value >> lo & ((1 << width) - 1)


# --------------------------------------------------------------------------- (a) the PTX ISA's tables

# PTX ISA "Shared Memory Descriptor", table "Shared memory descriptor layout": (field, first bit, width).
SMEM_TABLE = (("start address >> 4", 0, 14), ("reserved", 14, 2), ("leading dimension byte offset >> 4", 16, 14),
              ("reserved", 30, 2), ("stride dimension byte offset >> 4", 32, 14), ("fixed 0b001", 46, 3),
              ("matrix base offset", 49, 3), ("leading dimension stride mode", 52, 1), ("fixed 0", 53, 8),
              ("swizzling mode", 61, 3))
# The same table's swizzling-mode values: 0 none, 2 128-byte, 4 64-byte, 6 32-byte (1: 128-byte with
# 32-byte atoms; 3, 5, 7 invalid).
SMEM_SWIZZLE_VALUES = {0: 0, 128: 2, 64: 4, 32: 6}
# PTX ISA "Instruction descriptor", the table for .kind::f16: (field, first bit, width, k4's value).
INSTR_TABLE = (("sparsity selector", 0, 2, 0), ("sparsity (dense = 0)", 2, 1, 0), ("saturate", 3, 1, 0),
               ("dtype (F32 = 1)", 4, 2, 1), ("reserved", 6, 1, 0), ("atype (BF16 = 1)", 7, 3, 1),
               ("btype (BF16 = 1)", 10, 3, 1), ("negate A", 13, 1, 0), ("negate B", 14, 1, 0),
               ("transpose A (K-major = 0)", 15, 1, 0), ("transpose B", 16, 1, None), ("N >> 3", 17, 6, None),
               ("reserved", 23, 1, 0), ("M >> 4", 24, 5, 128 >> 4), ("reserved", 29, 1, 0), ("max shift", 30, 2, 0))


def test_the_tables_cover_their_words_exactly_once():
    for table, width in ((SMEM_TABLE, 64), (INSTR_TABLE, 32)):
        covered = sorted(bit for _, lo, size, *_ in table for bit in range(lo, lo + size))
        assert covered == list(range(width))


@pytest.mark.parametrize("name", list(k4.CONFIGS))
@pytest.mark.parametrize("operand", ["A", "B"])
def test_shared_memory_descriptor_fields(name, operand):
    plan = dict(zip("AB", k4.plans(k4.CONFIGS[name])))[operand]
    tile, step = 0x1400, 3  # a 1 KB-aligned tile and the last k16 step of a stage
    descriptor = plan.descriptor(tile, 0, step)
    expected_lbo, expected_sbo = (8192, 1024) if plan.major == "MN" else (16, 1024)
    expected = {"start address >> 4": (tile + step * plan.k16_bytes) >> 4, "reserved": 0,
                "leading dimension byte offset >> 4": expected_lbo >> 4,
                "stride dimension byte offset >> 4": expected_sbo >> 4, "fixed 0b001": 0b001,
                "matrix base offset": 0,  # every tile starts on the 1,024-byte boundary of the 128 B pattern
                "leading dimension stride mode": 0, "fixed 0": 0, "swizzling mode": SMEM_SWIZZLE_VALUES[128]}
    for field, lo, width in SMEM_TABLE:
        assert bits(descriptor, lo, width) == expected[field], field


@pytest.mark.parametrize(("span", "code"), SMEM_SWIZZLE_VALUES.items())
def test_swizzling_mode_values(span, code):
    descriptor = encode_smem(MatrixLayout(start=0x400, lbo=16, sbo=128 if span == 0 else 8 * span, span=span))
    assert bits(descriptor, 61, 3) == code
    assert decode_smem(descriptor).span == span


@pytest.mark.parametrize(("descriptor", "rule"), [
    (encode_smem(MatrixLayout(0x400, 16, 1024, 128)) & ~(1 << 46), "bits 46-48 must be 0b001"),
    (encode_smem(MatrixLayout(0x400, 16, 1024, 128)) | 1 << 14, "reserved"),
    (encode_smem(MatrixLayout(0x400, 16, 1024, 128)) | 1 << 55, "reserved"),
    (encode_smem(MatrixLayout(0x400, 16, 1024, 128)) | 1 << 52, "absolute LBO mode"),
    (encode_smem(MatrixLayout(0x400, 16, 1024, 0)) | 3 << 61, "swizzle code 3"),
    (encode_smem(MatrixLayout(0x400, 16, 1024, 0)) | 1 << 61, "swizzle code 1"),
])
def test_decode_refuses_what_the_table_reserves(descriptor, rule):
    with pytest.raises(ValueError, match=rule):
        decode_smem(descriptor)


@pytest.mark.parametrize("name", list(k4.CONFIGS))
def test_instruction_descriptor_fields(name):
    config = k4.CONFIGS[name]
    value = k4.instr_descriptor(config)
    for field, lo, width, expected in INSTR_TABLE:
        if field == "transpose B":
            expected = 1 if config.b_layout == "kn" else 0  # B [E, K, N] is N-contiguous: MN-major
        if field == "N >> 3":
            expected = config.bn >> 3
        assert bits(value, lo, width) == expected, field
    assert decode_instr(value) == InstrDescriptor(m=128, n=config.bn, a_major="K", b_major=config.b_major)


@pytest.mark.parametrize("m", [64, 128])
def test_instruction_descriptor_round_trips_every_shape(m):
    for n in range(8, 257, 8):
        if not valid_shape(m, n):
            continue
        for a_major in ("K", "MN"):
            for b_major in ("K", "MN"):
                d = InstrDescriptor(m=m, n=n, a_major=a_major, b_major=b_major)
                assert decode_instr(encode_instr(d)) == d


def test_matrix_shapes_for_one_cta():
    # "Matrix shape", .kind::f16 with .cta_group::1: M = 64, N = 8..256 step 8; M = 128, N = 16..256 step 16.
    assert [n for n in range(0, 300, 8) if valid_shape(128, n)] == list(range(16, 257, 16))
    assert [n for n in range(0, 300, 8) if valid_shape(64, n)] == list(range(8, 257, 8))
    assert not valid_shape(256, 128)  # M = 256 needs two CTAs (.cta_group::2)
    with pytest.raises(ValueError, match="no 128 x 200 shape"):
        InstrDescriptor(m=128, n=200)


@pytest.mark.parametrize(("value", "rule"), [(0x08310490 | 1 << 2, "leaves 0"), (0x08310490 | 1 << 23, "leaves 0"),
                                             (0x08310490 | 1 << 30, "leaves 0"),
                                             (0x08310490 | 2 << 7, "A format code 3")])
def test_instruction_decode_refuses_bits_a_dense_bf16_mma_does_not_use(value, rule):
    with pytest.raises(ValueError, match=rule):
        decode_instr(value)


def test_tensor_memory_allocation_and_addresses():
    assert [tmem_allocation(c) for c in (1, 32, 33, 256, 384, 512)] == [32, 32, 64, 256, 512, 512]
    with pytest.raises(ValueError, match="512 columns"):
        tmem_allocation(513)
    assert tmem_address(96, 192) == 96 << 16 | 192  # lane in bits 16-31, column in bits 0-15
    assert [k4.CONFIGS[n].tmem_columns for n in ("k4/bn128", "k4/bn192", "k4/bn256")] == [256, 512, 512]


# --------------------------------------------------------------------------- (b) public implementations

# NVIDIA/cutlass include/cute/arch/mma_sm100_desc.hpp, union UMMA::SmemDescriptor: (field, first bit,
# width) of start_address_, leading_byte_offset_, stride_byte_offset_, version_, base_offset_,
# lbo_mode_, layout_type_; and enum LayoutType: SWIZZLE_NONE = 0, SWIZZLE_128B = 2, SWIZZLE_64B = 4,
# SWIZZLE_32B = 6. make_umma_desc sets version_ = 1, lbo_mode_ = 0 and base_offset_ = 0.
CUTLASS_SMEM_FIELDS = {"start": (0, 14), "lbo": (16, 14), "sbo": (32, 14), "version": (46, 2),
                       "base_offset": (49, 3), "lbo_mode": (52, 1), "layout_type": (61, 3)}
CUTLASS_LAYOUT_TYPE = {0: 0, 128: 2, 64: 4, 32: 6}
# The same file, union UMMA::InstrDescriptor: c_format_ [4, 6), a_format_ [7, 10), b_format_ [10, 13),
# a_negate_ 13, b_negate_ 14, a_major_ 15, b_major_ 16, n_dim_ [17, 23) = N >> 3, m_dim_ [24, 29) = M >> 4;
# CFormat::F32 = 1, F16F32Format::BF16 = 1, Major::K = 0, Major::MN = 1.
CUTLASS_INSTR_FIELDS = {"c_format": (4, 2), "a_format": (7, 3), "b_format": (10, 3), "a_major": (15, 1),
                        "b_major": (16, 1), "n_dim": (17, 6), "m_dim": (24, 5)}


def test_cutlass_smem_descriptor_bitfields():
    layout = MatrixLayout(start=0x3FFF0, lbo=0x1230, sbo=0x4560, span=64, base_offset=5)
    descriptor = encode_smem(layout)
    expected = {"start": 0x3FFF, "lbo": 0x123, "sbo": 0x456, "version": 1, "base_offset": 5, "lbo_mode": 0,
                "layout_type": CUTLASS_LAYOUT_TYPE[64]}
    for field, (lo, width) in CUTLASS_SMEM_FIELDS.items():
        assert bits(descriptor, lo, width) == expected[field], field
    for span, code in CUTLASS_LAYOUT_TYPE.items():
        assert bits(encode_smem(MatrixLayout(0, 16, 1024, span)), 61, 3) == code


def test_cutlass_instruction_descriptor_bitfields():
    value = encode_instr(InstrDescriptor(m=128, n=192, a_major="K", b_major="MN"))
    expected = {"c_format": 1, "a_format": 1, "b_format": 1, "a_major": 0, "b_major": 1, "n_dim": 192 >> 3,
                "m_dim": 128 >> 4}
    for field, (lo, width) in CUTLASS_INSTR_FIELDS.items():
        assert bits(value, lo, width) == expected[field], field
    assert value & ~sum(((1 << w) - 1) << lo for lo, w in CUTLASS_INSTR_FIELDS.values()) == 0


def test_cutlass_canonical_strides_for_128_byte_swizzle():
    """NVIDIA/cutlass include/cute/arch/mma_sm100_desc.hpp, make_umma_desc, in 16-byte units:
    MN-major SW128 is ((8,n),(8,k)):((1,LBO),(8,SBO)): LBO steps between 64-element MN blocks, SBO
    between groups of 8 K rows; K-major SW128 is ((8,m),(T,2)):((8T,SBO),(1,T)): SBO steps between
    groups of 8 rows and LBO is the unit 1. include/cute/atom/mma_traits_sm90_gmma.hpp picks LBO and
    SBO for wgmma by the same rule, which is why one MatrixLayout serves both."""
    mn, k = decode_smem(smem_plan("MN").bits), decode_smem(smem_plan("K").bits)
    assert (mn.lbo, mn.sbo) == (64 * 64 * 2, 8 * 128)  # a 64 x 64 box per 64 columns; 8 rows of 128 B
    assert (k.lbo, k.sbo) == (16, 8 * 128)


def test_learn_cuda_constants():
    """gau-nernst/learn-cuda 02e_matmul_sm100/matmul_v6.cu: i_desc = (1 << 4) | (1 << 7) | (1 << 10)
    | (BLOCK_N >> 3 << 17) | (MMA_M >> 4 << 24) for K-major A and B, and make_desc(addr) =
    desc_encode(addr) | desc_encode(8 * 128) << 32 | 1 << 46 | 2 << 61 with desc_encode(x) =
    (x & 0x3FFFF) >> 4 (its LBO field left 0). Evaluated here for MMA_M = 128."""
    assert encode_instr(InstrDescriptor(m=128, n=256, a_major="K", b_major="K")) == 0x08400490
    assert encode_instr(InstrDescriptor(m=128, n=128, a_major="K", b_major="K")) == 0x08200490
    for addr in (0x0, 0x400, 0x8420, 0x37C00):
        assert encode_smem(MatrixLayout(start=addr, lbo=0, sbo=1024, span=128)) == \
            ((addr & 0x3FFFF) >> 4) | (1024 >> 4) << 32 | 1 << 46 | 2 << 61


def test_deepgemm_constants():
    """deepseek-ai/DeepGEMM deep_gemm/include/deep_gemm/mma/sm100.cuh, make_umma_desc and
    advance_umma_desc_lo, for bf16, BLOCK_K = 64 and a 128-byte swizzle (BLOCK_MN_ATOM = 64):
    K-major SBO = 8 * BLOCK_K * 2 = 1,024 and a k16 step of 16 * 2 = 32 bytes; MN-major
    SBO = 8 * 64 * 2 = 1,024, LBO = BLOCK_K * 64 * 2 = 8,192 and a k16 step of 16 * 64 * 2 = 2,048
    bytes. Its shape check (sm100_bf16_gemm.cuh) allows M = 128 with N % 16 == 0, 16 <= N <= 256."""
    k, mn = smem_plan("K"), smem_plan("MN")
    assert (decode_smem(k.bits).sbo, k.k16_bytes) == (8 * 64 * 2, 16 * 2)
    assert (decode_smem(mn.bits).sbo, decode_smem(mn.bits).lbo, mn.k16_bytes) == (8 * 64 * 2, 64 * 64 * 2, 16 * 64 * 2)
    assert all(valid_shape(128, n) == (n % 16 == 0 and 16 <= n <= 256) for n in range(0, 264, 8))


# --------------------------------------------------------------------------- (c) chapter 04's interpreter

def stage_image(config: k4.K4Config, stage_address: int, rng: np.random.Generator):
    """A shared-memory image of one ring stage as k4's producer fills it: A's 128 x 64 box, then
    BN / 64 boxes of B (64 of K x 64 columns of B [K, N], or 64 columns x 64 of K of B^T [N, K])."""
    smem = np.zeros(SHARED_MEMORY_BYTES, dtype=np.uint8)
    a = rng.standard_normal((128, 64)).astype(BF16)
    b = rng.standard_normal((64, config.bn)).astype(BF16)  # logical B [K, N] of this stage
    tma_write_box(smem, stage_address, a, 128)
    b_tile = stage_address + 128 * 64 * 2
    for box in range(config.bn // 64):
        columns = b[:, 64 * box: 64 * box + 64]
        tma_write_box(smem, b_tile + box * 8192, columns if config.b_layout == "kn" else columns.T.copy(), 128)
    return smem, a, b, b_tile


def k3_plan(major: str):
    """The wgmma plan chapter 04's k3 gets for the same operand (moe_gemm.variants.k3.plans)."""
    return operand_plan(major)


# --8<-- [start:interpreter]
@pytest.mark.parametrize("name", list(k4.CONFIGS))
def test_every_descriptor_k4_builds_reads_the_tile(name):
    config = k4.CONFIGS[name]
    plan_a, plan_b = k4.plans(config)
    rng = np.random.default_rng(5)
    ring = 0x400  # the kernel's ring starts at the first 1 KB boundary of dynamic shared memory
    for stage in range(config.stages):
        stage_address = ring + stage * config.stage_bytes
        smem, a, b, b_tile = stage_image(config, stage_address, rng)
        for kk in range(64 // 16):
            # the kernel's expression: bits | ((tile + kk * k16_bytes) >> 4)
            desc_a = plan_a.bits | ((stage_address + kk * plan_a.k16_bytes) >> 4)
            desc_b = plan_b.bits | ((b_tile + kk * plan_b.k16_bytes) >> 4)
            assert (desc_a, desc_b) == (plan_a.descriptor(stage_address, 0, kk), plan_b.descriptor(b_tile, 0, kk))
            layout_a, layout_b = decode_smem(desc_a), decode_smem(desc_b)
            assert layout_a == k3_plan("K").layout(stage_address, 0, kk)  # same bytes, same layout as k3's
            assert layout_b == k3_plan(plan_b.major).layout(b_tile, 0, kk)
            got_a = read_operand(smem, layout_a, "K", 128)
            got_b = read_operand(smem, layout_b, plan_b.major, config.bn)
            np.testing.assert_array_equal(got_a.view(np.uint16), a[:, 16 * kk: 16 * kk + 16].view(np.uint16))
            np.testing.assert_array_equal(got_b.view(np.uint16), b[16 * kk: 16 * kk + 16].T.view(np.uint16))
            # k3 reads the same 128 rows as two m64 wgmma slices; the second is rows 64-127 here.
            second = read_operand(smem, k3_plan("K").layout(stage_address, 1, kk), "K", 64)
            np.testing.assert_array_equal(second.view(np.uint16), got_a[64:].view(np.uint16))
# --8<-- [end:interpreter]


@pytest.mark.parametrize("major", ["K", "MN"])
def test_the_tcgen05_plan_is_the_wgmma_plan_with_bit_46(major):
    tcgen05, wgmma = smem_plan(major), operand_plan(major)
    assert isinstance(tcgen05, Tcgen05Plan)
    assert tcgen05.bits == smem_from_wgmma(wgmma.bits) == wgmma.bits | 1 << 46
    assert (tcgen05.k16_bytes, tcgen05.mn64_bytes) == (wgmma.k16_bytes, wgmma.mn64_bytes)
    assert tcgen05.bits & 0x3FFF == 0  # the start-address field is left for the kernel's OR


def test_an_lbo_of_zero_reads_the_same_k_major_tile():
    """learn-cuda and DeepGEMM leave LBO 0 for swizzled K-major operands; k4 sets CUTLASS's 16. The
    canonical K-major swizzled layout never reads LBO, so both describe the same matrix."""
    rng = np.random.default_rng(2)
    smem = np.zeros(SHARED_MEMORY_BYTES, dtype=np.uint8)
    tma_write_box(smem, 0x800, rng.standard_normal((128, 64)).astype(BF16), 128)
    for kk in range(4):
        ours = read_operand(smem, decode_smem(smem_plan("K").descriptor(0x800, 0, kk)), "K", 128)
        theirs = read_operand(smem, MatrixLayout(0x800 + 32 * kk, 0, 1024, 128), "K", 128)
        np.testing.assert_array_equal(ours.view(np.uint16), theirs.view(np.uint16))


@pytest.mark.parametrize("name", list(k4.CONFIGS))
def test_the_ring_fits_the_descriptor_address_field(name):
    config = k4.CONFIGS[name]
    end = config.dynamic_smem_bytes + 1024  # static barriers sit below; the ring ends by here
    assert end <= 227 * 1024 < 1 << 18  # 14 bits of address >> 4 reach 256 KB
    assert config.stage_bytes % 1024 == 0  # every stage, hence every box, on the 1 KB swizzle boundary
