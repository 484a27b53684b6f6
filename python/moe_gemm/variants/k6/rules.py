"""What k6 takes, on plain shapes, strides and addresses (no GPU, no torch): the harness's variants
(:func:`check_inputs`) and the torch op (moe_gemm.torch.rules.route) both ask :func:`refusals`.

The rules are chapter 04's (the TMA maps of moe_gemm.variants.sm90.maps: K a multiple of the K step,
rows of 16 bytes, 16-byte-aligned operands that the maps can describe) and the device walk's (its
prefix sums over the experts live in shared memory, kernels/tile_walk.cuh).
"""

from __future__ import annotations

from collections.abc import Sequence

from moe_gemm.cuda.tensormap import GLOBAL_ALIGN
from moe_gemm.variants.k6.config import MAX_EXPERTS, K6Config, Schedule
from moe_gemm.variants.sm90.config import BK, BLayout


def b_layout(shape: Sequence[int], strides: Sequence[int]) -> BLayout | None:
    """'kn' for each B[e] row-major [K, N], 'nk' for each B[e] column-major (B^T [E, N, K] in memory,
    torch's other layout), None for anything else (strides in elements). The row and expert strides
    may exceed the dense ones (a slice b[:, :, :N] of a wider tensor, or b[::2]): the batched tensor
    map takes any strides that do not overlap (:func:`b_strides`)."""
    experts, K, N = shape
    if strides[2] == 1 and strides[1] >= N and (experts == 1 or strides[0] >= K * strides[1]):
        return "kn"
    if strides[1] == 1 and strides[2] >= K and (experts == 1 or strides[0] >= N * strides[2]):
        return "nk"
    return None


def b_strides_of(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """B's row stride and expert stride in elements as the tensor map walks them (rows of B [E, K, N]
    for 'kn', of B^T [E, N, K] for 'nk'); one expert's stride is the dense one, which no load reaches."""
    experts, K, N = shape
    row = strides[1] if strides[2] == 1 else strides[2]
    return row, (strides[0] if experts > 1 else row * (K if strides[2] == 1 else N))


def refusals(experts: int, K: int, N: int, a_strides: Sequence[int], b_strides: Sequence[int],
             a_address: int = 0, b_address: int = 0, schedule: Schedule = "device") -> list[str]:
    """Every rule of k6 that a [M_tot, K] and b [E, K, N] (strides in elements) break, one reason each;
    empty when k6 takes them."""
    reasons = []
    if K < 1 or N < 1:  # K = 0 passes every divisibility rule below but gives the ring no K step to load
        reasons.append(f"K = {K} and N = {N}: k6 needs at least one K step and one column")
    if K % BK:
        reasons.append(f"K = {K} is not a multiple of {BK} (k6's K step)")
    if N % 8:
        reasons.append(f"N = {N} is not a multiple of 8 (TMA's 16-byte rows)")
    if schedule == "device" and experts > MAX_EXPERTS:
        reasons.append(f"E = {experts} experts: the device walk holds at most {MAX_EXPERTS}")
    if tuple(a_strides) != (K, 1):
        reasons.append(f"a must be row-major [M_tot, K] (strides ({K}, 1)), got {tuple(a_strides)}")
    if b_layout((experts, K, N), b_strides) is None:
        reasons.append(f"b must be row- or column-major per expert, got strides {tuple(b_strides)}")
    elif not (N % 8 or K % BK) and any(stride * 2 % GLOBAL_ALIGN for stride in b_strides_of((experts, K, N),
                                                                                            b_strides)):
        # (a view's strides; dense ones break this only where N or K already gave a reason above)
        reasons.append(f"b's row and expert strides must be multiples of 16 bytes (TMA), got {tuple(b_strides)}")
    if a_address % GLOBAL_ALIGN or b_address % GLOBAL_ALIGN:
        reasons.append("a and b must start on 16-byte boundaries (TMA)")
    return reasons


def check_inputs(config: K6Config, experts: int, K: int, N: int, a_address: int = 0, b_address: int = 0,
                 name: str = "k6") -> None:
    """ValueError naming every rule of k6 that the harness's operands break: A [M_tot, K] and B in
    ``config.b_layout``, both dense."""
    b_strides = (K * N, N, 1) if config.b_layout == "kn" else (K * N, 1, K)
    reasons = refusals(experts, K, N, (K, 1), b_strides, a_address, b_address, config.schedule)
    if reasons:
        raise ValueError(f"{name} cannot take these inputs: {'; '.join(reasons)}")
