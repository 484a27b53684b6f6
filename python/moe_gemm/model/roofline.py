"""The roofline every chapter measures against: arithmetic at the tensor pipe's peak, bytes at copy
bandwidth.

The compulsory traffic of one grouped GEMM reads A once, the weights B[e] of every expert that
has rows once, and writes C once. An expert with no rows needs none of its weights, so at decode
sizes (512 rows over 64 experts under heavy skew) fewer than all 64 matrices must move; at the
seed shape B is 352 MB of the 474 MB total, which is why small batches are memory-bound however
well the tiles are filled.

The two rates come from one record per GPU (``ceilings/<gpu>.json``, written by
``python -m moe_gemm.measure.ceilings``): the wgmma microbenchmark's peak, which no kernel that
issues wgmma can pass, and the device-to-device copy. Neither is a library's GEMM rate: a kernel
can beat cuBLAS, but it cannot beat the tensor pipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_gemm.model.problem import BF16_OPERANDS, OperandFormat, useful_flops
from moe_gemm.model.quantize import BLOCK
from moe_gemm.model.workloads import Workload

# HBM bandwidth as NVIDIA's datasheets give it, TB/s, for the GPUs whose copy ceiling has no record here (the
# H100 SXM5's; the H200's is measured, ceilings/h200.json): what the pages' H100 estimates divide bytes by.
DATASHEET_TBPS = {"h100": 3.35}


def compulsory_bytes(counts: np.ndarray, K: int, N: int, element_bytes: int = 2, ragged: str = "M",
                     fmt: OperandFormat = BF16_OPERANDS) -> int:
    """The forward (ragged M): A [M_tot, K] and the B[e] [K, N] of each expert with rows read once, C [M_tot, N]
    written once. The weight gradient (ragged K): A and dC [M_tot, N] read once, every dB[e] [K, N] written
    once (an expert with no rows gets zeros). e4m3 operands (``fmt``): A and B one byte each, their fp32 scales
    read once, C in bf16."""
    counts = np.asarray(counts)
    tokens = int(counts.sum())
    weights = int(np.count_nonzero(counts)) if ragged == "M" else int(counts.size)
    if not fmt.scaled:
        return element_bytes * (tokens * K + weights * K * N + tokens * N)
    blocks_k, blocks_n = -(-K // BLOCK), -(-N // BLOCK)
    scales = tokens + weights * N if fmt.scaling == "rowwise" else tokens * blocks_k + weights * blocks_k * blocks_n
    return tokens * K + weights * K * N + 4 * scales + 2 * tokens * N


def tile_request_bytes(counts: np.ndarray, K: int, N: int, unit_rows: int, unit_cols: int,
                       element_bytes: int = 2) -> int:
    """What a tiled forward launch must ask L2 for: each unit (a block's tile, or a cluster's, whose blocks share
    the common operand by multicast) reads its ``unit_rows`` rows of A and its ``unit_cols`` columns of B whole
    along K once, the rows of its expert's last unit past the expert's end included (the box is the unit's); C is
    written once. Above compulsory_bytes by the operands' re-reads across units, which L2 serves at best."""
    counts = np.asarray(counts, dtype=np.int64)
    units = int((-(-counts // unit_rows)).sum()) * -(-N // unit_cols)
    return element_bytes * (units * (unit_rows + unit_cols) * K + int(counts.sum()) * N)


@dataclass(frozen=True)
class RooflineBasis:
    """The two ceilings a roofline is drawn from, and where they were measured."""

    tensor_tflops: float  # the wgmma peak
    copy_tbps: float
    source: str
    fp8_tensor_tflops: float | None = None  # the e4m3 wgmma peak, for e4m3 workloads (chapter 10)

    def peak(self, workload: Workload) -> float:
        """The tensor pipe's peak for the workload's operands: bf16 and fp16 at one rate, e4m3 at its own."""
        if not workload.fmt.scaled:
            return self.tensor_tflops
        if self.fp8_tensor_tflops is None:
            raise ValueError(f"no e4m3 wgmma peak in this roofline ({self.source}) for {workload.label}")
        return self.fp8_tensor_tflops

    @property
    def label(self) -> str:
        """'912 / 4.27': tensor TFLOP/s / copy TB/s, for a column header."""
        return f"{self.tensor_tflops:.0f} / {self.copy_tbps:.2f}"

    @property
    def ridge(self) -> float:
        """FLOP per compulsory byte where the two limits meet."""
        return self.tensor_tflops / self.copy_tbps

    def ms(self, workload: Workload) -> float:
        """max(FLOP / peak, compulsory bytes / bandwidth): no kernel can finish sooner."""
        compute = useful_flops(workload.tokens, workload.K, workload.N) / (self.peak(workload) * 1e12)
        compulsory = compulsory_bytes(workload.counts, workload.K, workload.N, ragged=workload.ragged, fmt=workload.fmt)
        memory = compulsory / (self.copy_tbps * 1e12)
        return max(compute, memory) * 1e3

    def tflops(self, workload: Workload) -> float:
        """The roofline limit expressed as useful TFLOP/s."""
        return useful_flops(workload.tokens, workload.K, workload.N) / (self.ms(workload) * 1e-3) / 1e12

    def bound(self, workload: Workload) -> str:
        """'memory' or 'compute': the term that sets the limit."""
        flops = useful_flops(workload.tokens, workload.K, workload.N)
        compulsory = compulsory_bytes(workload.counts, workload.K, workload.N, ragged=workload.ragged, fmt=workload.fmt)
        return "memory" if flops / compulsory < self.peak(workload) / self.copy_tbps else "compute"
