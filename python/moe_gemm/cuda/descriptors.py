"""Shared-memory matrix descriptors, and a numpy interpreter that reads a matrix through one.

Hopper's ``wgmma.mma_async`` (chapter 04) and Blackwell's ``tcgen05.mma`` (chapter 05) do not take
their shared-memory operands as registers: they take a 64-bit *matrix descriptor* per operand, and
the tensor core walks shared memory itself. A descriptor holds a start address, two byte strides
(the leading- and stride-dimension byte offsets, LBO and SBO) and a swizzle mode; what those
fields mean depends on whether the operand is K-major (K contiguous, as ``A`` is) or MN-major (M or
N contiguous, as ``B [E, K, N]`` is). Get one field wrong and the MMA silently multiplies the wrong
elements. This module therefore does three things, all on the CPU:

* :func:`swizzle` and :func:`tma_write_box` model what a TMA box copy writes into shared memory
  with a given swizzle: element (r, c) of a box lands at byte ``swizzle(dst + r * row_bytes + 2c)``
  (PTX ISA "Tensor Swizzling Modes", #tensor-swizzling-modes);
* :class:`MatrixLayout` and :func:`encode_wgmma` / :func:`decode_wgmma` build and take apart the
  wgmma descriptor (PTX ISA "Matrix Descriptor Format",
  #asynchronous-warpgroup-level-matrix-shared-memory-layout-matrix-descriptor);
* :func:`read_operand` is the *descriptor interpreter*: given the shared-memory bytes and a decoded
  descriptor it returns the matrix the MMA would read, element by element, from the canonical
  layouts of PTX ISA "Shared Memory Matrix Layout" (#asynchronous-warpgroup-level-matrix-shared-memory-layout).

The canonical layouts, for 16-bit elements (8 per 16-byte chunk) and a swizzle span of S bytes
(32, 64 or 128), written as byte offsets before the swizzle is applied::

    K-major,  swizzled:   (mn, k) -> (mn % 8) * S + (mn // 8) * SBO + 2 * k          (k < 16)
    K-major,  none:       (mn, k) -> (mn % 8) * 16 + (mn // 8) * SBO + (k % 8) * 2 + (k // 8) * LBO
    MN-major, swizzled:   (mn, k) -> 2 * (mn % (S/2)) + (mn // (S/2)) * LBO + (k % 8) * S + (k // 8) * SBO
    MN-major, none:       (mn, k) -> 2 * (mn % 8) + (mn // 8) * SBO + (k % 8) * 16 + (k // 8) * LBO

So with the 128-byte swizzle an 8-row x 128-byte *atom* (1 KB) is the unit, SBO steps over atoms
along the strided dimension, and for MN-major operands LBO steps between 64-element column blocks.
(LBO is ignored for swizzled K-major operands: one k16 slice lies inside one 128-byte row.) The
swizzle XORs address bits 4-6 with bits 7-9 (128 B), 4-5 with 7-8 (64 B) or 4 with 7 (32 B) of the
*final* address, which is why a kernel may step through K inside a swizzled row by adding bytes to
the start address (32 per k16 step for K-major bf16): the XOR is applied after the addition.

The kernels get their descriptors' constant fields from :func:`operand_plan` (via the host), so the
descriptors CI interprets here are bit for bit the ones the GPU runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from moe_gemm.model.problem import BF16

Major = Literal["K", "MN"]
ELEMENT_BYTES = 2  # bf16
CHUNK_BYTES = 16  # the swizzle permutes 16-byte chunks; a core matrix row is one chunk
CORE_ROWS = 8  # a core matrix is 8 rows x 16 bytes
SWIZZLE_SPANS = (0, 32, 64, 128)  # bytes; 0 = no swizzle ("interleave")
ADDRESS_BITS = 18  # shared-memory addresses fit 18 bits; descriptors keep bits 4..17 (14 bits)
FIELD_MASK = (1 << 14) - 1

# wgmma's 2-bit swizzle field, bits 62-63 (PTX ISA "Matrix Descriptor Format").
WGMMA_SWIZZLE_CODE = {0: 0, 128: 1, 64: 2, 32: 3}


# --------------------------------------------------------------------------- the swizzle


# --8<-- [start:swizzle]
def swizzle(address: int | np.ndarray, span: int) -> int | np.ndarray:
    """The physical byte address of logical ``address`` under a ``span``-byte swizzle.

    Swizzle<B, 4, 3> in CuTe's notation: bits [7, 7 + B) are XORed into bits [4, 4 + B), with
    B = log2(span / 16), so 16-byte chunk c of a row moves to slot c XOR (row mod span/16).
    """
    if span not in SWIZZLE_SPANS:
        raise ValueError(f"swizzle span must be one of {SWIZZLE_SPANS} bytes, got {span}")
    if span == 0:
        return address
    bits = (span // CHUNK_BYTES).bit_length() - 1  # 1, 2, 3
    mask = (1 << bits) - 1
    return address ^ (((address >> 7) & mask) << 4)
# --8<-- [end:swizzle]


def atom_bytes(span: int) -> int:
    """Bytes after which the swizzle pattern repeats: 8 rows of ``span`` bytes (1 KB at 128 B)."""
    return CORE_ROWS * span if span else CORE_ROWS * CHUNK_BYTES


def tma_write_box(smem: np.ndarray, dst: int, box: np.ndarray, span: int) -> None:
    """Write ``box`` ([rows, cols] bf16) into ``smem`` (uint8) as a TMA tiled copy would.

    The box lands row-major with a row pitch of ``cols * 2`` bytes, each byte address swizzled.
    A swizzled box row must be exactly ``span`` bytes (the kernels' boxes are) and start on an
    atom boundary: the swizzle is a function of the address bits, so an unaligned box would be
    permuted differently from what the MMA expects.
    """
    rows, cols = box.shape
    row_bytes = cols * ELEMENT_BYTES
    if span and row_bytes != span:
        raise ValueError(f"a {span}-byte-swizzled box row must be {span} bytes, got {row_bytes}")
    if dst % atom_bytes(span):
        raise ValueError(f"box destination {dst:#x} is not aligned to the {atom_bytes(span)}-byte swizzle atom")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    physical = swizzle(dst + r * row_bytes + c * ELEMENT_BYTES, span)
    words = np.ascontiguousarray(box, dtype=BF16).view(np.uint16)
    smem[physical] = (words & 0xFF).astype(np.uint8)
    smem[physical + 1] = (words >> 8).astype(np.uint8)


# --------------------------------------------------------------------------- descriptors


@dataclass(frozen=True)
class MatrixLayout:
    """The fields every shared-memory matrix descriptor carries, in bytes (decoded)."""

    start: int  # shared-memory byte address of the operand's first element
    lbo: int  # leading-dimension byte offset
    sbo: int  # stride-dimension byte offset
    span: int  # swizzle span in bytes: 0, 32, 64 or 128
    base_offset: int = 0  # 3 bits; 0 whenever the pattern starts on an atom boundary (always, here)

    def __post_init__(self) -> None:
        if self.span not in SWIZZLE_SPANS:
            raise ValueError(f"swizzle span must be one of {SWIZZLE_SPANS}, got {self.span}")
        for name in ("start", "lbo", "sbo"):
            value = getattr(self, name)
            if value % CHUNK_BYTES or not 0 <= value < (1 << ADDRESS_BITS):
                raise ValueError(f"{name} must be a multiple of 16 bytes in [0, 2^18), got {value}")
        if not 0 <= self.base_offset < 8:
            raise ValueError(f"base_offset is a 3-bit field, got {self.base_offset}")


def _field(value: int) -> int:
    return (value >> 4) & FIELD_MASK


def encode_wgmma(layout: MatrixLayout) -> int:
    """The 64-bit wgmma descriptor: start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45,
    base offset in 49-51, swizzle code in 62-63 (PTX ISA "Matrix Descriptor Format")."""
    return (_field(layout.start) | _field(layout.lbo) << 16 | _field(layout.sbo) << 32
            | (layout.base_offset & 7) << 49 | WGMMA_SWIZZLE_CODE[layout.span] << 62)


def decode_wgmma(descriptor: int) -> MatrixLayout:
    """The inverse of :func:`encode_wgmma`; ValueError on bits the format leaves reserved."""
    reserved = descriptor & ~(FIELD_MASK | FIELD_MASK << 16 | FIELD_MASK << 32 | 7 << 49 | 3 << 62)
    if reserved:
        raise ValueError(f"wgmma descriptor {descriptor:#018x} sets reserved bits {reserved:#018x}")
    span = {code: span for span, code in WGMMA_SWIZZLE_CODE.items()}[descriptor >> 62 & 3]
    return MatrixLayout(start=(descriptor & FIELD_MASK) << 4, lbo=(descriptor >> 16 & FIELD_MASK) << 4,
                        sbo=(descriptor >> 32 & FIELD_MASK) << 4, span=span, base_offset=descriptor >> 49 & 7)


# --------------------------------------------------------------------------- the interpreter


# --8<-- [start:interpreter]
def canonical_offset(mn: np.ndarray, k: np.ndarray, layout: MatrixLayout, major: Major) -> np.ndarray:
    """Byte offset from ``layout.start``, before swizzling, of element (mn, k): the module's table."""
    s = layout.span
    if major == "K":
        if s:
            if np.any(k * ELEMENT_BYTES >= s):
                raise ValueError(f"a K-major operand reads at most {s // ELEMENT_BYTES} K per {s}-byte row")
            return (mn % 8) * s + (mn // 8) * layout.sbo + k * ELEMENT_BYTES
        return (mn % 8) * CHUNK_BYTES + (mn // 8) * layout.sbo + (k % 8) * ELEMENT_BYTES + (k // 8) * layout.lbo
    if major == "MN":
        if s:
            per_row = s // ELEMENT_BYTES  # MN elements in one swizzled row
            return ((mn % per_row) * ELEMENT_BYTES + (mn // per_row) * layout.lbo
                    + (k % 8) * s + (k // 8) * layout.sbo)
        return (mn % 8) * ELEMENT_BYTES + (mn // 8) * layout.sbo + (k % 8) * CHUNK_BYTES + (k // 8) * layout.lbo
    raise ValueError(f"major must be 'K' or 'MN', got {major!r}")


def read_operand(smem: np.ndarray, layout: MatrixLayout, major: Major, mn_extent: int,
                 k_extent: int = 16) -> np.ndarray:
    """The [mn_extent, k_extent] bf16 matrix an MMA reads through ``layout`` from ``smem`` (uint8).

    Rows are the operand's M (for A) or N (for B) index, columns its K index, whatever the
    operand's major-ness in memory: the result for B is B transposed, [N, K].
    """
    if layout.base_offset:
        raise ValueError("base_offset != 0 is not modelled: operands here start on swizzle-atom boundaries")
    mn, k = np.meshgrid(np.arange(mn_extent), np.arange(k_extent), indexing="ij")
    physical = swizzle(layout.start + canonical_offset(mn, k, layout, major), layout.span)
    if physical.max() + 1 >= smem.size:
        raise ValueError(f"the descriptor reads past the end of the {smem.size}-byte shared memory image")
    words = smem[physical].astype(np.uint16) | (smem[physical + 1].astype(np.uint16) << 8)
    return words.view(BF16)
# --8<-- [end:interpreter]


# --------------------------------------------------------------------------- what the kernels use


@dataclass(frozen=True)
class OperandPlan:
    """How a kernel addresses one operand tile in a ring stage, and its descriptor's constant bits.

    The kernel computes the descriptor of the sub-tile at (64-row/column block ``j``, k16 step
    ``kk``) of the tile at shared address ``tile`` as::

        desc = bits | ((tile + j * mn64_bytes + kk * k16_bytes) >> 4)

    ``bits`` carries LBO, SBO and the swizzle; the start-address field is left zero for the OR.
    """

    major: Major
    bits: int
    k16_bytes: int  # start-address step per 16 of K
    mn64_bytes: int  # start-address step per 64 rows (K-major) or 64 columns (MN-major)

    def layout(self, tile: int, block: int, k16: int) -> MatrixLayout:
        """The decoded descriptor the kernel builds for sub-tile (block, k16) of the tile at ``tile``."""
        return decode_wgmma(self.descriptor(tile, block, k16))

    def descriptor(self, tile: int, block: int, k16: int) -> int:
        address = tile + block * self.mn64_bytes + k16 * self.k16_bytes
        return self.bits | _field(address)


# --8<-- [start:operand_plan]
def operand_plan(major: Major, bk: int = 64, span: int = 128) -> OperandPlan:
    """The plan for a 128-byte-swizzled bf16 tile as TMA writes it, ``bk`` of K deep.

    * K-major (A [rows, K], or a K-major B [N, K]): one box of ``rows x bk``, rows of 128 bytes;
      8-row atoms are 1 KB apart (SBO), a k16 step is 32 bytes along the row, 64 rows are 8 KB.
    * MN-major (B [K, N] row-major): boxes of ``bk`` K-rows x 64 columns (128 bytes), one per
      64-column *panel*, panels ``bk * 128`` bytes apart (LBO); 8 K-rows are 1 KB apart (SBO); a
      k16 step is 16 rows, 2 KB.
    """
    if span != 128 or bk * ELEMENT_BYTES != span:
        raise ValueError(f"the kernels use BK = 64 with a 128-byte swizzle (one 128-byte row per box row); "
                         f"got bk = {bk}, span = {span}")
    atom = atom_bytes(span)
    panel = bk * span  # one 64-wide block: bk rows of 128 bytes
    if major == "K":
        layout = MatrixLayout(start=0, lbo=CHUNK_BYTES, sbo=atom, span=span)  # LBO unused: 16 by convention
        return OperandPlan("K", encode_wgmma(layout), k16_bytes=16 * ELEMENT_BYTES, mn64_bytes=64 * span)
    if major == "MN":
        layout = MatrixLayout(start=0, lbo=panel, sbo=atom, span=span)
        return OperandPlan("MN", encode_wgmma(layout), k16_bytes=16 * span, mn64_bytes=panel)
    raise ValueError(f"major must be 'K' or 'MN', got {major!r}")
# --8<-- [end:operand_plan]
