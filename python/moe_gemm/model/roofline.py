"""The roofline every chapter measures against: arithmetic at the dense-bf16 rate, bytes at copy bandwidth.

The compulsory traffic of one grouped GEMM reads A and every expert's B once and writes C
once. B does not depend on M_tot: at the seed shape it is 352 MB of the 474 MB total, which
is why small batches are memory-bound however well the tiles are filled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moe_gemm.model.problem import useful_flops

# Measured on this project's H200 before the chapters were written (cuBLAS bf16 8192^3 through
# torch, and a device-to-device copy). A results file whose run measured its own ceilings uses those
# instead (roofline_basis); these stand in for runs that did not.
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


@dataclass(frozen=True)
class RooflineBasis:
    """The two ceilings a roofline is drawn from, and whether the run being read measured them."""

    dense_tflops: float
    copy_tbps: float
    measured: bool

    @property
    def label(self) -> str:
        """'787 / 4.27': dense bf16 TFLOP/s / copy TB/s, for a column header."""
        return f"{self.dense_tflops:.0f} / {self.copy_tbps:.2f}"

    @property
    def source(self) -> str:
        return ("measured in the same run" if self.measured
                else "measured on this project's H200 before the chapters' runs")

    def tflops(self, experts: int, tokens: int, K: int, N: int) -> float:  # noqa: N803
        return roofline_tflops(experts, tokens, K, N, peak_tflops=self.dense_tflops, bandwidth_tbps=self.copy_tbps)


FIXED_BASIS = RooflineBasis(H200_DENSE_BF16_TFLOPS, H200_COPY_TBPS, measured=False)


def _measured(data: Mapping[str, Any], name: str, unit: str) -> float | None:
    """ceiling/<name> from the file's 'ceilings' section or, failing that, from its records."""
    for entry in [*(data.get("ceilings") or []), *(data.get("records") or [])]:
        if entry.get("variant") == f"ceiling/{name}" and entry.get(unit):
            return float(entry[unit])
    return None


def roofline_basis(data: Mapping[str, Any]) -> RooflineBasis:
    """The ceilings measured in the run a results file records, else :data:`FIXED_BASIS`.

    Both must have been measured: a roofline mixing this run's copy rate with an older dense rate
    would be neither run's.
    """
    dense, copy = _measured(data, "dense_bf16", "tflops"), _measured(data, "copy", "tbps")
    if dense is None or copy is None:
        return FIXED_BASIS
    return RooflineBasis(dense, copy, measured=True)
