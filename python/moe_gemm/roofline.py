"""The roofline every chapter measures against: arithmetic at the dense-bf16 rate, bytes at copy bandwidth.

The compulsory traffic of one grouped GEMM reads A and every expert's B once and writes C
once. B does not depend on M_tot: at the seed shape it is 352 MB of the 474 MB total, which
is why small batches are memory-bound however well the tiles are filled.
"""

from __future__ import annotations

from .problem import useful_flops

# Measured on this project's H200 (SPEC section 2); chapters that measure them again in the same
# run pass their own values. cuBLAS bf16 8192^3 through torch, and a device-to-device copy.
H200_DENSE_BF16_TFLOPS = 757.0
H200_COPY_TBPS = 4.22


def compulsory_bytes(experts: int, tokens: int, K: int, N: int, element_bytes: int = 2) -> int:  # noqa: N803
    """A [M_tot, K] + B [E, K, N] read once, C [M_tot, N] written once."""
    return element_bytes * (tokens * K + experts * K * N + tokens * N)


def roofline_ms(experts: int, tokens: int, K: int, N: int, *,  # noqa: N803
                peak_tflops: float = H200_DENSE_BF16_TFLOPS, bandwidth_tbps: float = H200_COPY_TBPS) -> float:
    """max(FLOP / peak, bytes / bandwidth): no kernel can finish sooner."""
    compute = useful_flops(tokens, K, N) / (peak_tflops * 1e12)
    memory = compulsory_bytes(experts, tokens, K, N) / (bandwidth_tbps * 1e12)
    return max(compute, memory) * 1e3


def roofline_tflops(experts: int, tokens: int, K: int, N: int, **ceilings: float) -> float:  # noqa: N803
    """The roofline limit expressed as useful TFLOP/s."""
    return useful_flops(tokens, K, N) / (roofline_ms(experts, tokens, K, N, **ceilings) * 1e-3) / 1e12
