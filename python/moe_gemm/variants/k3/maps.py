"""What k3 hands the kernel besides pointers: input checks, TMA tensor maps and descriptor plans.

k4 (chapter 05) and k5 (chapter 06) load their operands through the same maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_gemm.cuda.descriptors import OperandPlan, operand_plan
from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.cuda.tensormap import TiledMap, batched_matrix_map, check_tma_gemm, matrix_map
from moe_gemm.variants.k3.config import BK, BOX, PLAN_DTYPE, REQUIRED_CAPABILITY, BLayout, K3Config


def check_inputs(K: int, N: int, a_address: int = 0, b_address: int = 0, kernel: str = "k3") -> None:  # noqa: N803
    """ValueError naming the first rule of TMA or of the kernel that these inputs break: K a
    positive multiple of 64, N of 8, both operands 16-byte aligned (k5 loads through the same maps)."""
    check_tma_gemm(kernel, K, N, BK, a_address, b_address)


def require_sm90a(variant: str) -> Any:
    """The GPU, if it runs sm_90a code (compute capability 9.0 exactly); ValueError otherwise."""
    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    if gpu.compute_capability != REQUIRED_CAPABILITY:
        have = f"sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
        raise ValueError(f"{variant} needs an sm_90a GPU (compute capability 9.0: wgmma and setmaxnreg exist only "
                         f"in that target); {gpu.name} is {have}")
    return gpu


# --8<-- [start:tensor_maps]
def operand_maps(config: K3Config, a_address: int, b_address: int, tokens: int, experts: int, K: int,  # noqa: N803
                 N: int) -> tuple[TiledMap, TiledMap]:  # noqa: N803
    """A [M_tot, K] in boxes of BM rows x 64 of K; B in 64 x 64 boxes of one expert, either
    B [E, K, N] (64 of K x 64 columns) or B^T [E, N, K] (64 columns x 64 of K). Chapter 05's k4
    loads its operands through the same maps."""
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=config.bm, box_cols=BK)
    return a_map, weight_map(config.b_layout, b_address, experts, K, N)


def weight_map(b_layout: BLayout, b_address: int, experts: int, K: int, N: int) -> TiledMap:  # noqa: N803
    """B in 64 x 64 boxes of one expert: B [E, K, N] ("kn": 64 of K x 64 columns) or B^T [E, N, K]
    ("nk": 64 columns x 64 of K). Chapter 07's k6 loads its weights through the same map."""
    if b_layout == "kn":
        return batched_matrix_map("B", b_address, batch=experts, rows=K, cols=N, box_rows=BK, box_cols=BOX)
    return batched_matrix_map("B^T", b_address, batch=experts, rows=N, cols=K, box_rows=BOX, box_cols=BK)


def output_map(c_address: int, tokens: int, N: int) -> TiledMap:  # noqa: N803
    """C [M_tot, N] in 64 x 64 boxes, for the TMA-store epilogue."""
    return matrix_map("C", c_address, rows=tokens, cols=N, box_rows=64, box_cols=BOX)
# --8<-- [end:tensor_maps]


def plans(config: K3Config) -> tuple[OperandPlan, OperandPlan]:
    """The descriptor plans the kernel gets for A (always K-major) and B; only ``config.b_layout`` is
    read, so k6's K6Config serves as well."""
    return operand_plan("K"), operand_plan("MN" if config.b_layout == "kn" else "K")


def plan_argument(plan: OperandPlan) -> np.void:
    """An OperandPlan as the 16-byte struct the kernel takes by value."""
    return np.array([(plan.bits, plan.k16_bytes, plan.mn64_bytes)], dtype=PLAN_DTYPE)[0]


