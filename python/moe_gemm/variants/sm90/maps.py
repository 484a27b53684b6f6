"""What a Hopper step hands its kernel besides pointers: the TMA tensor maps and the rules they put on
the inputs, B^T for the K-major rungs, the target check, and the descriptor plans. Chapter 04's k3
introduced them; k4 (chapter 05), k5 (chapter 06) and k6 (chapter 07) load through the same maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_gemm.cuda.descriptors import OperandPlan, operand_plan
from moe_gemm.cuda.device import DeviceArray, DeviceProblem, to_device
from moe_gemm.cuda.gpu import detect_gpu
from moe_gemm.cuda.tensormap import TiledMap, batched_matrix_map, check_tma_gemm, matrix_map
from moe_gemm.variants.sm90.config import BK, BOX, PLAN_DTYPE, REQUIRED_CAPABILITY, BLayout


def check_inputs(kernel: str, K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of TMA or of ``kernel`` that these inputs break: K a positive
    multiple of 64, N of 8, both operands 16-byte aligned."""
    check_tma_gemm(kernel, K, N, BK, a_address, b_address)


def other_target(capability: tuple[int, int] | None) -> str | None:
    """None for a GPU that runs sm_90a code (compute capability 9.0 exactly), else what there is
    instead: 'no GPU' or its target, e.g. 'sm_100'."""
    if capability == REQUIRED_CAPABILITY:
        return None
    return "no GPU" if capability is None else f"sm_{capability[0]}{capability[1]}"


def require_sm90a(variant: str) -> Any:
    """The GPU, if it runs sm_90a code; ValueError otherwise."""
    gpu = detect_gpu()
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    have = other_target(gpu.compute_capability)
    if have is not None:
        raise ValueError(f"{variant} needs an sm_90a GPU (compute capability 9.0: wgmma and setmaxnreg exist only "
                         f"in that target); {gpu.name} is {have}")
    return gpu


def transposed_b(dev: DeviceProblem) -> DeviceArray:
    """B^T [E, N, K] on the device, made once per uploaded problem (the offline layout step)."""
    cached = getattr(dev, "_b_transposed", None)
    if cached is None:
        cached = to_device(np.ascontiguousarray(dev.problem.b.transpose(0, 2, 1)))
        dev._b_transposed = cached
    return cached


# --8<-- [start:tensor_maps]
def operand_maps(bm: int, b_layout: BLayout, a_address: int, b_address: int, tokens: int, experts: int,
                 K: int, N: int) -> tuple[TiledMap, TiledMap]:
    """A [M_tot, K] in boxes of ``bm`` rows x 64 of K; B in 64 x 64 boxes of one expert, either
    B [E, K, N] (64 of K x 64 columns) or B^T [E, N, K] (64 columns x 64 of K). Chapter 05's k4
    loads its operands through the same maps."""
    a_map = matrix_map("A", a_address, rows=tokens, cols=K, box_rows=bm, box_cols=BK)
    return a_map, weight_map(b_layout, b_address, experts, K, N)


def weight_map(b_layout: BLayout, b_address: int, experts: int, K: int, N: int, element: str = "bf16") -> TiledMap:
    """B in 64 x 64 boxes of one expert: B [E, K, N] ("kn": 64 of K x 64 columns) or B^T [E, N, K]
    ("nk": 64 columns x 64 of K), of bf16 or fp16 (``element``). Chapter 07's k6 loads its weights
    through the same map."""
    if b_layout == "kn":
        return batched_matrix_map("B", b_address, batch=experts, rows=K, cols=N, box_rows=BK, box_cols=BOX,
                                  element=element)
    return batched_matrix_map("B^T", b_address, batch=experts, rows=N, cols=K, box_rows=BOX, box_cols=BK,
                              element=element)


def output_map(c_address: int, tokens: int, N: int, element: str = "bf16") -> TiledMap:
    """C [M_tot, N] in 64 x 64 boxes, for the TMA-store epilogue; an fp32 C in 64 x 32 boxes (a box row
    may span at most the swizzle's 128 bytes), which k6 encodes but does not store through (its fp32
    epilogue writes from registers)."""
    return matrix_map("C", c_address, rows=tokens, cols=N, box_rows=64, box_cols=BOX if element != "fp32" else 32,
                      element=element)
# --8<-- [end:tensor_maps]


def plans(b_layout: BLayout) -> tuple[OperandPlan, OperandPlan]:
    """The descriptor plans the kernel gets for A (always K-major) and for B in ``b_layout``."""
    return operand_plan("K"), operand_plan("MN" if b_layout == "kn" else "K")


def plan_argument(plan: OperandPlan) -> np.void:
    """An OperandPlan as the 16-byte struct the kernel takes by value."""
    return np.array([(plan.bits, plan.k16_bytes, plan.mn64_bytes)], dtype=PLAN_DTYPE)[0]
