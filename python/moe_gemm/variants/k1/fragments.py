"""Who holds what: the lane maps of ldmatrix and mma.sync m16n8k16, from the PTX ISA.

mma.sync is a warp-wide instruction: the 16x16 A tile, the 16x8 B tile and the 16x8 fp32
accumulator are spread over the 32 lanes in a fixed pattern (PTX ISA 9.7.16.5.8, "Matrix
Fragments for mma.m16n8k16 with floating point type"). With ``g = lane // 4`` (the group) and
``t = lane % 4`` (the thread in the group), a lane holds

* A: registers a0..a3, two bf16 each: rows g and g+8, columns 2t, 2t+1 and 2t+8, 2t+9;
* B: registers b0, b1, two bf16 each: column g, rows (k) 2t, 2t+1 and 2t+8, 2t+9;
* C: four fp32: rows g and g+8, columns 2t and 2t+1.

ldmatrix (PTX ISA 9.7.16.5.15) loads 8x8 matrices of 16-bit elements: each lane gives the
address of one 16-byte matrix row, and lane l receives, for every matrix j, the two elements
at row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 into register j; ``.trans`` delivers the
transposed matrix. The functions below state both contracts and the addresses k1 hands to
ldmatrix, so a test can check that the two meet (every A and B element lands in the register
mma.sync expects) and the docs can draw them.
"""

from __future__ import annotations

from collections.abc import Callable

from moe_gemm.core.tables import markdown_table

Coord = tuple[int, int]


# --8<-- [start:mma_maps]
def mma_a(lane: int, reg: int, half: int) -> Coord:
    """(row, k) of A[16 x 16] in register a<reg>, low (half=0) or high (half=1) 16 bits."""
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)


def mma_b(lane: int, reg: int, half: int) -> Coord:
    """(k, col) of B[16 x 8] in register b<reg>."""
    g, t = lane // 4, lane % 4
    return 2 * t + half + 8 * reg, g


def mma_c(lane: int, i: int) -> Coord:
    """(row, col) of the fp32 accumulator C[16 x 8] in c<i>, i = 0..3."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2
# --8<-- [end:mma_maps]


def ldmatrix_element(lane: int, half: int, trans: bool) -> Coord:
    """(row, col) of an 8x8 matrix, as it lies in memory, that ``lane`` receives in each register."""
    row, col = lane // 4, 2 * (lane % 4) + half
    return (col, row) if trans else (row, col)


def ldmatrix_x4_rows(address_of: Callable[[int], Coord]) -> dict[int, list[Coord]]:
    """For ldmatrix.x4: matrix j -> the (row, col) start of each of its 8 rows, from lane addresses.

    Lanes 8j .. 8j+7 supply matrix j's rows 0..7 (PTX ISA: "threads 0-7 ... matrix 0", and so on).
    """
    return {j: [address_of(8 * j + r) for r in range(8)] for j in range(4)}


def ldmatrix_x4_delivers(address_of: Callable[[int], Coord], trans: bool) -> dict[tuple[int, int, int], Coord]:
    """(lane, register, half) -> (row, col) of the 16x16 block that ldmatrix.x4 puts there.

    ``address_of(lane)`` is the (row, col) of the block whose 16 bytes (8 elements along col)
    the lane points at, as the kernel computes it.
    """
    rows = ldmatrix_x4_rows(address_of)
    delivered = {}
    for lane in range(32):
        for j in range(4):
            for half in range(2):
                r, c = ldmatrix_element(lane, half, trans)
                row0, col0 = rows[j][r]
                delivered[(lane, j, half)] = (row0, col0 + c)
    return delivered


# --8<-- [start:k1_addresses]
def k1_address(lane: int) -> Coord:
    """The row and column k1 gives ldmatrix for ``lane`` in a 16x16 block (A: rows x k; B: k x n)."""
    return lane % 16, 8 * (lane // 16)
# --8<-- [end:k1_addresses]


# ---------------------------------------------------------------------------- pictures for the docs

def _grid_markdown(rows: int, cols: int, cell: Callable[[int, int], str], row_label: str, col_label: str) -> str:
    headers = [f"{row_label} \\ {col_label}", *(str(c) for c in range(cols))]
    body = [[str(r), *(cell(r, c) for c in range(cols))] for r in range(rows)]
    return markdown_table(headers, body)


def c_layout_markdown() -> str:
    """The 16x8 accumulator: each cell names the lane holding it and which of its four values."""
    owner = {mma_c(lane, i): f"L{lane}.c{i}" for lane in range(32) for i in range(4)}
    return _grid_markdown(16, 8, lambda r, c: owner[(r, c)], "row", "col")


def a_layout_markdown() -> str:
    """The 16x16 A tile: lane and register (a0..a3) of each pair of elements along k.

    A register holds two bf16 neighbours in k, so the table has one column per pair (k, k+1):
    eight columns, not sixteen, which fits the page's column.
    """
    owner = {mma_a(lane, reg, half): f"L{lane}.a{reg}" for lane in range(32) for reg in range(4) for half in range(2)}
    assert all(owner[(r, 2 * p)] == owner[(r, 2 * p + 1)] for r in range(16) for p in range(8))
    headers = ["row \\ k", *(f"{2 * p}, {2 * p + 1}" for p in range(8))]
    return markdown_table(headers, [[str(r), *(owner[(r, 2 * p)] for p in range(8))] for r in range(16)])


def b_layout_markdown() -> str:
    """The 16x8 B tile: lane and register (b0, b1) of each element."""
    owner = {mma_b(lane, reg, half): f"L{lane}.b{reg}" for lane in range(32) for reg in range(2) for half in range(2)}
    return _grid_markdown(16, 8, lambda r, c: owner[(r, c)], "k", "col")


def ldmatrix_addresses_markdown() -> str:
    """Which lane supplies the address of each 16-byte row of the four 8x8 matrices (k1's formula)."""
    body = []
    for j, starts in ldmatrix_x4_rows(k1_address).items():
        for r, (row, col) in enumerate(starts):
            lane = 8 * j + r
            body.append([str(lane), str(j), str(r), f"row {row}, cols {col}..{col + 7}"])
    return markdown_table(["lane", "matrix j", "row of j", "16 bytes it points at (16x16 block)"], body)
