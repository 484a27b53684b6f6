"""k5's TMA tensor maps: chapter 04's (moe_gemm.variants.sm90.maps), plus A in 16-row boxes for the M64
and SWAP tiles.
"""

from __future__ import annotations

from moe_gemm.cuda.tensormap import TiledMap, matrix_map
from moe_gemm.variants.k5.config import B_LAYOUT, TOKEN_BOX_ROWS
from moe_gemm.variants.k5.mixed_tiles import BM
from moe_gemm.variants.sm90.config import BK
from moe_gemm.variants.sm90.maps import operand_maps, output_map


# --8<-- [start:tensor_maps]
def tensor_maps(a_address: int, b_address: int, c_address: int, tokens: int, experts: int, K: int,
                N: int) -> tuple[TiledMap, ...]:
    """A in 128-row boxes (M128 tiles), A again in 16-row boxes (M64 tiles take four; a SWAP tile
    only the tokens it has, rounded up to 16), B [E, K, N] and C as k3 maps them."""
    a_map, b_map = operand_maps(BM, B_LAYOUT, a_address, b_address, tokens, experts, K, N)
    tokens_map = matrix_map("A (tokens)", a_address, rows=tokens, cols=K, box_rows=TOKEN_BOX_ROWS, box_cols=BK)
    return a_map, tokens_map, b_map, output_map(c_address, tokens, N)
# --8<-- [end:tensor_maps]
