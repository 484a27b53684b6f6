"""Blackwell tcgen05 descriptors: encode, decode, and check them against chapter 04's interpreter.

``tcgen05.mma`` (chapter 05's k4) takes three descriptors per instruction:

* a 64-bit **shared-memory descriptor** for each of A and B (PTX ISA "Shared Memory Descriptor",
  #tcgen05-shared-memory-descriptor). Its address, LBO and SBO fields are wgmma's, in the same
  bits and with the same meaning, so it decodes to the same :class:`~moe_gemm.cuda.descriptors.MatrixLayout`
  and the numpy interpreter of :mod:`moe_gemm.cuda.descriptors` reads operands through it unchanged.
  What differs: bits 46-48 must hold the constant 0b001, bit 52 selects how LBO is read (0:
  a relative offset, the only mode used here) and the swizzle is a 3-bit field in bits 61-63::

      bits  0-13  start address >> 4        bits 46-48  0b001 (fixed)
      bits 16-29  LBO >> 4                  bits 49-51  base offset
      bits 32-45  SBO >> 4                  bit  52     LBO mode (0 = relative)
                                            bits 61-63  swizzle: 0 none, 2 128 B, 4 64 B, 6 32 B

  (wgmma's 2-bit code at bits 62-63 puts 128 B, 64 B and 32 B in the same two bits, so a tcgen05
  descriptor of a swizzled operand is its wgmma descriptor with bit 46 set.)
* a 32-bit **instruction descriptor** (PTX ISA "Instruction descriptor",
  #tcgen05-instruction-descriptor; the table for .kind::tf32, .kind::f16, .kind::f8f6f4 and
  .kind::i8)::

      bits  0-1  sparsity selector (0)      bits 13, 14  negate A, B (0)
      bit   2    sparse (0: dense)          bit  15      transpose A: 0 K-major, 1 MN-major
      bit   3    saturate (0)               bit  16      transpose B: 0 K-major, 1 MN-major
      bits  4-5  D format: 0 f16, 1 f32     bits 17-22   N >> 3
      bits  7-9  A format: 0 f16, 1 bf16    bits 24-28   M >> 4
      bits 10-12 B format: 0 f16, 1 bf16    bits 30-31   max shift (.ws only; 0)
      (bits 6, 23 and 29 are reserved)

:func:`smem_plan` turns chapter 04's :func:`~moe_gemm.cuda.descriptors.operand_plan` into the tcgen05
plan k4 receives from the host, so the descriptors CI interprets are bit for bit the GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_gemm.cuda.descriptors import FIELD_MASK, Major, MatrixLayout, OperandPlan, _field, decode_wgmma, operand_plan

# --------------------------------------------------------------------------- shared-memory descriptor

SMEM_VERSION = 0b001  # bits 46-48: "fixed constant value of 0b001"
SMEM_VERSION_SHIFT = 46
BASE_OFFSET_SHIFT = 49
LBO_MODE_SHIFT = 52  # 0: LBO is a byte offset relative to the start (the only mode modelled)
SWIZZLE_SHIFT = 61
# bits 61-63. Code 1 (128 B swizzle with 32 B atoms) is for 32-bit MN-major operands: not modelled.
TCGEN05_SWIZZLE_CODE = {0: 0, 128: 2, 64: 4, 32: 6}
_SMEM_FIELDS = (FIELD_MASK | FIELD_MASK << 16 | FIELD_MASK << 32 | 7 << SMEM_VERSION_SHIFT
                | 7 << BASE_OFFSET_SHIFT | 1 << LBO_MODE_SHIFT | 7 << SWIZZLE_SHIFT)


# --8<-- [start:smem]
def encode_smem(layout: MatrixLayout) -> int:
    """The 64-bit tcgen05 shared-memory descriptor of ``layout`` (relative LBO mode)."""
    return (_field(layout.start) | _field(layout.lbo) << 16 | _field(layout.sbo) << 32
            | SMEM_VERSION << SMEM_VERSION_SHIFT | (layout.base_offset & 7) << BASE_OFFSET_SHIFT
            | TCGEN05_SWIZZLE_CODE[layout.span] << SWIZZLE_SHIFT)


def decode_smem(descriptor: int) -> MatrixLayout:
    """The inverse of :func:`encode_smem`; ValueError on what the format reserves or this project
    does not model (another version, the absolute LBO mode, swizzle codes 1, 3, 5, 7)."""
    reserved = descriptor & ~_SMEM_FIELDS & (2**64 - 1)
    if reserved or descriptor >> 64:
        raise ValueError(f"tcgen05 descriptor {descriptor:#018x} sets reserved bits {reserved:#018x}")
    version = descriptor >> SMEM_VERSION_SHIFT & 7
    if version != SMEM_VERSION:
        raise ValueError(f"tcgen05 descriptor bits 46-48 must be 0b001, got {version:#05b}")
    if descriptor >> LBO_MODE_SHIFT & 1:
        raise ValueError("tcgen05 descriptor uses the absolute LBO mode (bit 52), which is not modelled")
    code = descriptor >> SWIZZLE_SHIFT & 7
    spans = {c: span for span, c in TCGEN05_SWIZZLE_CODE.items()}
    if code not in spans:
        raise ValueError(f"tcgen05 swizzle code {code} is invalid or not modelled (0, 2, 4, 6 are)")
    return MatrixLayout(start=(descriptor & FIELD_MASK) << 4, lbo=(descriptor >> 16 & FIELD_MASK) << 4,
                        sbo=(descriptor >> 32 & FIELD_MASK) << 4, span=spans[code],
                        base_offset=descriptor >> BASE_OFFSET_SHIFT & 7)


def smem_from_wgmma(descriptor: int) -> int:
    """The tcgen05 descriptor that describes the same bytes as a wgmma descriptor."""
    return encode_smem(decode_wgmma(descriptor))
# --8<-- [end:smem]


class Tcgen05Plan(OperandPlan):
    """An :class:`~moe_gemm.cuda.descriptors.OperandPlan` whose ``bits`` are a tcgen05 descriptor's."""

    def layout(self, tile: int, block: int, k16: int) -> MatrixLayout:
        return decode_smem(self.descriptor(tile, block, k16))


# --8<-- [start:plan]
def smem_plan(major: Major, bk: int = 64, span: int = 128) -> Tcgen05Plan:
    """k4's plan for a ``bk``-deep, ``span``-swizzled bf16 tile as TMA writes it: chapter 04's
    wgmma plan for the same bytes, re-encoded. The address steps do not change."""
    wgmma = operand_plan(major, bk, span)
    return Tcgen05Plan(wgmma.major, smem_from_wgmma(wgmma.bits), wgmma.k16_bytes, wgmma.mn64_bytes)
# --8<-- [end:plan]


# --------------------------------------------------------------------------- instruction descriptor

D_FORMATS = {"f16": 0, "f32": 1}  # bits 4-5
AB_FORMATS = {"f16": 0, "bf16": 1}  # bits 7-9 and 10-12 (kind::f16; 2 = tf32 belongs to kind::tf32)
MAJOR_BITS = {"K": 0, "MN": 1}  # bits 15 and 16, "transpose A / B"
_INSTR_FIELDS = (3 << 4 | 7 << 7 | 7 << 10 | 1 << 13 | 1 << 14 | 1 << 15 | 1 << 16 | 0x3F << 17 | 0x1F << 24)


def valid_shape(m: int, n: int) -> bool:
    """tcgen05.mma.cta_group::1.kind::f16 shapes (PTX ISA "Matrix shape", #tcgen05-matrix-shape):
    M = 64 with N a multiple of 8 in [8, 256], or M = 128 with N a multiple of 16 in [16, 256]."""
    step = {64: 8, 128: 16}.get(m)
    return step is not None and step <= n <= 256 and n % step == 0


@dataclass(frozen=True)
class InstrDescriptor:
    """The fields of a dense kind::f16 instruction descriptor, decoded."""

    m: int
    n: int
    a_major: Major = "K"
    b_major: Major = "K"
    d_format: str = "f32"
    a_format: str = "bf16"
    b_format: str = "bf16"
    negate_a: bool = False
    negate_b: bool = False

    def __post_init__(self) -> None:
        if not valid_shape(self.m, self.n):
            raise ValueError(f"tcgen05.mma.cta_group::1.kind::f16 has no {self.m} x {self.n} shape: M = 64 takes N "
                             f"in 8..256 (multiples of 8), M = 128 takes N in 16..256 (multiples of 16)")
        if self.a_major not in MAJOR_BITS or self.b_major not in MAJOR_BITS:
            raise ValueError(f"majors must be 'K' or 'MN', got {self.a_major!r}, {self.b_major!r}")
        if self.d_format not in D_FORMATS or self.a_format not in AB_FORMATS or self.b_format not in AB_FORMATS:
            raise ValueError(f"kind::f16 takes D in {sorted(D_FORMATS)} and A, B in {sorted(AB_FORMATS)}")


# --8<-- [start:instr]
def encode_instr(d: InstrDescriptor) -> int:
    """The 32-bit instruction descriptor (dense, no saturation, no .ws shift)."""
    return (D_FORMATS[d.d_format] << 4 | AB_FORMATS[d.a_format] << 7 | AB_FORMATS[d.b_format] << 10
            | int(d.negate_a) << 13 | int(d.negate_b) << 14 | MAJOR_BITS[d.a_major] << 15
            | MAJOR_BITS[d.b_major] << 16 | (d.n >> 3) << 17 | (d.m >> 4) << 24)
# --8<-- [end:instr]


def _name_of(table: dict[str, int], code: int, field: str, value: int) -> str:
    for name, known in table.items():
        if known == code:
            return name
    raise ValueError(f"instruction descriptor {value:#010x} names {field} code {code}, which kind::f16 does not have")


def decode_instr(value: int) -> InstrDescriptor:
    """The inverse of :func:`encode_instr`; ValueError on reserved bits, sparsity, saturation or a
    .ws shift, none of which a dense bf16 MMA uses."""
    if value & ~_INSTR_FIELDS or not 0 <= value < 2**32:
        raise ValueError(f"instruction descriptor {value:#010x} sets bits a dense kind::f16 MMA leaves 0: "
                         f"{value & ~_INSTR_FIELDS & (2**32 - 1):#010x}")
    return InstrDescriptor(m=(value >> 24 & 0x1F) << 4, n=(value >> 17 & 0x3F) << 3,
                           a_major=_name_of(MAJOR_BITS, value >> 15 & 1, "A major", value),
                           b_major=_name_of(MAJOR_BITS, value >> 16 & 1, "B major", value),
                           d_format=_name_of(D_FORMATS, value >> 4 & 3, "D format", value),
                           a_format=_name_of(AB_FORMATS, value >> 7 & 7, "A format", value),
                           b_format=_name_of(AB_FORMATS, value >> 10 & 7, "B format", value),
                           negate_a=bool(value >> 13 & 1), negate_b=bool(value >> 14 & 1))


# --------------------------------------------------------------------------- tensor memory

TMEM_LANES = 128
TMEM_COLUMNS = 512  # 32-bit cells per lane: 128 x 512 x 4 B = 256 KB per SM
TMEM_MIN_ALLOCATION = 32


def tmem_allocation(columns: int) -> int:
    """The columns tcgen05.alloc must ask for to hold ``columns``: a power of two, at least 32."""
    if not 0 < columns <= TMEM_COLUMNS:
        raise ValueError(f"tensor memory has {TMEM_COLUMNS} columns; {columns} cannot be allocated")
    return max(TMEM_MIN_ALLOCATION, 1 << (columns - 1).bit_length())


def tmem_address(lane: int, column: int) -> int:
    """A tensor-memory address: lane in bits 16-31, column in bits 0-15."""
    if not (0 <= lane < TMEM_LANES and 0 <= column < TMEM_COLUMNS):
        raise ValueError(f"TMEM is {TMEM_LANES} lanes x {TMEM_COLUMNS} columns, got ({lane}, {column})")
    return lane << 16 | column
