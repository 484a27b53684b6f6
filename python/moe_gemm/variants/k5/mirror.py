"""A numpy mirror of a SWAP tile's ring stage and descriptors, for the descriptor interpreter.
"""

from __future__ import annotations

import numpy as np

from moe_gemm.cuda.descriptors import tma_write_box
from moe_gemm.variants.k5.config import B_LAYOUT, TOKEN_BOX_ROWS
from moe_gemm.variants.k5.mixed_tiles import BM, BN
from moe_gemm.variants.sm90.config import BK, SWIZZLE_ALIGN
from moe_gemm.variants.sm90.maps import plans


# --8<-- [start:mirror]
def swap_stage_image(tokens: np.ndarray, weights: np.ndarray, stage: int) -> tuple[np.ndarray, int]:
    """Shared memory after a SWAP tile's TMA boxes for one K step landed in ring stage ``stage``:
    ``tokens`` [TN, 64] (TN a multiple of 16) in 16-row boxes from the stage's start, ``weights`` the
    logical B tile [64, 128] (K x N) in two 64 x 64 boxes after the stage's A part. Mirrors
    kernels/k5_adaptive.cu, produce(). Returns the bytes and the stage's address."""
    stage_bytes = (BM + BN) * BK * 2
    smem = np.zeros(SWIZZLE_ALIGN + (stage + 1) * stage_bytes, dtype=np.uint8)
    base = SWIZZLE_ALIGN + stage * stage_bytes
    for box in range(tokens.shape[0] // TOKEN_BOX_ROWS):
        rows = tokens[box * TOKEN_BOX_ROWS:(box + 1) * TOKEN_BOX_ROWS]
        tma_write_box(smem, base + box * TOKEN_BOX_ROWS * BK * 2, rows, 128)
    for box in range(weights.shape[1] // 64):
        tma_write_box(smem, base + BM * BK * 2 + box * 64 * BK * 2, weights[:, box * 64:(box + 1) * 64], 128)
    return smem, base


def swap_descriptors(base: int):
    """(warpgroup, k16 step, weight-operand descriptor, token-operand descriptor) of a SWAP stage at
    ``base``. Mirrors swap_tile(): the weights, read MN-major as the wgmma's A, start at warpgroup
    w's 64-column box; the tokens, read K-major as its B, start at the stage."""
    plan_k, plan_mn = plans(B_LAYOUT)
    for warpgroup in range(2):
        weights = base + BM * BK * 2 + warpgroup * 64 * BK * 2
        for kk in range(BK // 16):
            yield warpgroup, kk, plan_mn.descriptor(weights, 0, kk), plan_k.descriptor(base, 0, kk)
# --8<-- [end:mirror]
