"""The numbers every Hopper step's host side and kernels/wgmma_config.cuh agree on: properties of the
sm_90a target and of the 128-byte-swizzled TMA ring, not of any one step.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

BK = 64  # one 128-byte swizzle row of bf16 per stage
BOX = 64  # B arrives in 64 x 64 boxes
SWIZZLE_ALIGN = 1024  # the kernels align their ring to 1 KB by hand, which may cost up to 1 KB
WARPGROUP = 128  # threads of one warpgroup: wgmma's unit of issue
# 227 KB: the most dynamic + static shared memory one block may have on compute capability 9.0 (the
# CUDA C++ Programming Guide's table of technical specifications).
SMEM_LIMIT = 232_448
REQUIRED_CAPABILITY = (9, 0)  # wgmma and setmaxnreg exist only in sm_90a, whose code runs on 9.0 alone
BLayout = Literal["kn", "nk"]  # B [E, K, N] as given (MN-major for the MMA), or B^T [E, N, K]

# The accumulator-free part of the kernels' OperandPlan struct, as a launch passes it by value.
PLAN_DTYPE = np.dtype([("bits", "<u8"), ("k16_bytes", "<u4"), ("mn64_bytes", "<u4")], align=True)
