"""The numpy reference and the checks every kernel's output goes through.

The reference is the product of the operands' real values in fp32 (or float64): A_e @ B[e] per
expert for ragged M, A_e^T dC_e per expert for ragged K (zeros for an expert with no rows), and for
fp8 operands the product of the dequantized values (e4m3 times their scales), which is what an FP8
GEMM must reproduce up to its output rounding.

Two checks, as CUTLASS's examples do them:

* exact, on integer-valued inputs: fp32 accumulation of small integers is exact, so the
  kernel's output must equal the float64 product rounded once to the output dtype, bit for bit;
* realistic, on random inputs: ``||C - C_ref||_F / ||C_ref||_F`` within :data:`REL_TOLERANCES` for
  the output dtype, with every element finite (an unwritten, NaN-poisoned tile fails here).

For ragged K both also count every element of an expert with no rows that is not exactly zero: the
kernel must write those zeros, and a relative error over all of dB would hide a few stale ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from moe_gemm.model.problem import BF16, FP16, FP32, Problem
from moe_gemm.model.quantize import dequantize, groups

# The realistic check's bound on ||C - C_ref||_F / ||C_ref||_F, by output dtype. bf16: its rounding
# alone is about 2**-9 (2e-3). fp32: no output rounding to speak of; what remains is the accumulation
# order, and FP8 tensor cores keep about 14 bits within each 128-deep block before a kernel promotes
# the sum to fp32 (DeepSeek-V3 technical report, section 3.3.2), 6e-5; 1e-3 still fails a missing K
# block or a wrong expert, errors of order 0.1 to 1.
# bf16 keeps 8 significant bits (a rounding error up to 2^-9 = 0.2% of each element), fp16 11 (2^-12)
REL_TOLERANCES: dict[np.dtype, float] = {BF16: 1e-2, FP16: 2e-3, FP32: 1e-3}


# The last reference computed: a chapter checks many variants on one problem in a row, and at
# 65,536 rows one reference is 360 GFLOP of numpy.
_last_reference: tuple[Problem, np.dtype, np.ndarray] | None = None


def reference_gemm(problem: Problem, dtype: type = np.float32) -> np.ndarray:
    """The problem's product accumulated in ``dtype`` (fp32 or float64), shape ``problem.out_shape``:
    C = A_e @ B[e] per expert for ragged M, dB[e] = A_e^T dC_e for ragged K.

    The result is read-only and remembered for the next call on the same problem object."""
    global _last_reference
    if _last_reference is not None and _last_reference[0] is problem and _last_reference[1] == np.dtype(dtype):
        return _last_reference[2]
    c = _compute_reference(problem, dtype)
    c.flags.writeable = False
    _last_reference = (problem, np.dtype(dtype), c)
    return c


def _rows_of_a(problem: Problem, lo: int, hi: int, dtype: type) -> np.ndarray:
    """A's rows lo:hi as real values: dequantized for fp8 (A's scales run along its rows too)."""
    if not problem.fmt.scaled:
        return problem.a[lo:hi].astype(dtype)
    group_a, _ = groups(problem.fmt.scaling, problem.K)
    return dequantize(problem.a[lo:hi], problem.scale_a[lo:hi], group_a, dtype)


def _weights(problem: Problem, e: int, dtype: type) -> np.ndarray:
    """B[e] [K, N] as real values: dequantized for fp8."""
    if not problem.fmt.scaled:
        return problem.b[e].astype(dtype)
    _, group_b = groups(problem.fmt.scaling, problem.K)
    return dequantize(problem.b[e], problem.scale_b[e], group_b, dtype)


def _compute_reference(problem: Problem, dtype: type) -> np.ndarray:
    c = np.zeros(problem.out_shape, dtype=dtype)
    offsets = problem.offsets
    for e in range(problem.experts):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi == lo:
            continue  # ragged M: no rows of C; ragged K: dB[e] stays zero
        if problem.ragged == "M":
            c[lo:hi] = _rows_of_a(problem, lo, hi, dtype) @ _weights(problem, e, dtype)
        else:
            c[e] = _rows_of_a(problem, lo, hi, dtype).T @ problem.b[lo:hi].astype(dtype)
    return c


# Elements per slice of relative_error: each slice's sums are taken in fp32 (BLAS sdot, vectorized) and added
# in float64. A slice this short keeps the fp32 sums' rounding near 1e-6 of the error they report (measured 5e-7
# against float64 throughout, on 2**26 elements), far inside the 1e-3..1e-2 tolerances; a slice whose fp32 sums
# overflow is summed again in float64.
RELATIVE_ERROR_CHUNK = 1 << 20


def _sums(piece: np.ndarray, piece_ref: np.ndarray) -> tuple[float, float, float]:
    difference = piece - piece_ref
    return float(np.dot(difference, difference)), float(np.dot(piece_ref, piece_ref)), float(np.dot(piece, piece))


def _slice_sums(piece: np.ndarray, piece_ref: np.ndarray) -> tuple[float, float, float] | None:
    """(|C - C_ref|^2, |C_ref|^2, |C|^2) over one slice, or None if C holds a non-finite element there."""
    piece = piece.astype(np.float32, copy=False)
    if not np.isfinite(piece).all():
        return None
    piece_ref = piece_ref.astype(np.float32, copy=False)
    with np.errstate(over="ignore"):
        sums = _sums(piece, piece_ref)
    return sums if np.isfinite(sums).all() else _sums(piece.astype(np.float64), piece_ref.astype(np.float64))


def relative_error(c: np.ndarray, c_ref: np.ndarray) -> float:
    """||C - C_ref||_F / ||C_ref||_F; inf if C has non-finite entries.

    Summed over slices of the flattened arrays, in threads (numpy releases the GIL in its loops): a weight
    gradient's dB can hold billions of elements (256 x 7,168 x 4,096 at DeepSeek-V3's up projection), where
    float64 copies of it whole would not fit a host's memory and one thread took two minutes per output."""
    from concurrent.futures import ThreadPoolExecutor

    c, c_ref = np.asarray(c), np.asarray(c_ref)
    if c.shape != c_ref.shape:
        raise ValueError(f"output shape {c.shape} differs from the reference's {c_ref.shape}")
    flat, flat_ref = c.reshape(-1), c_ref.reshape(-1)
    starts = range(0, flat.size, RELATIVE_ERROR_CHUNK)
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        sums = list(pool.map(lambda start: _slice_sums(flat[start:start + RELATIVE_ERROR_CHUNK],
                                                       flat_ref[start:start + RELATIVE_ERROR_CHUNK]), starts))
    if any(s is None for s in sums):
        return float("inf")
    difference, reference, output = (sum(column) for column in zip(*sums)) if sums else (0.0, 0.0, 0.0)
    return float(np.sqrt(difference / reference)) if reference else float(np.sqrt(output))


@dataclass(frozen=True)
class Check:
    """The outcome of comparing one kernel output with the reference."""

    rel_error: float
    nonfinite: int  # elements that are NaN or inf (an unwritten tile shows up here)
    # elements differing from the exact answer (exact checks), and for ragged K the elements of
    # experts with no rows that are not exactly zero (both checks)
    mismatches: int
    exact: bool
    tolerance: float = REL_TOLERANCES[BF16]  # the realistic check's bound, by output dtype

    @property
    def passed(self) -> bool:
        if self.exact:
            return self.mismatches == 0 and self.nonfinite == 0
        return self.nonfinite == 0 and self.mismatches == 0 and self.rel_error <= self.tolerance

    def describe(self) -> str:
        if self.exact:
            kind = f"exact, {self.mismatches} mismatches"
        else:
            kind = f"rel. error {self.rel_error:.2e}" + (f", {self.mismatches} mismatches" if self.mismatches else "")
        return f"{'ok' if self.passed else 'FAILED'} ({kind}, {self.nonfinite} non-finite)"


SWIGLU_BLOCK = 64  # columns of gate (and of up) that k6's fused SwiGLU epilogue pairs in one 128-wide tile


def swiglu_reference(problem: Problem) -> np.ndarray:
    """silu(gate) * up from the fp32 product, for B = [W_gate | W_up] (gate columns, then as many up
    columns, as a checkpoint stores them): [M_tot, N / 2], what k6's fused SwiGLU epilogue writes
    (kernels/k6_persistent.cu), whose 128-wide tiles pair 64 gate columns with their 64 up columns."""
    if problem.ragged != "M":
        raise ValueError("the SwiGLU reference is the forward's epilogue: it needs a ragged-M problem")
    if problem.N % (2 * SWIGLU_BLOCK):
        raise ValueError(f"the SwiGLU reference needs N a multiple of {2 * SWIGLU_BLOCK}, got {problem.N}")
    c = reference_gemm(problem)
    gate, up = c[:, : problem.N // 2], c[:, problem.N // 2:]
    return (gate / (1.0 + np.exp(-gate)) * up).astype(np.float32)


def check_output(c: np.ndarray, problem: Problem, *, exact: bool = False, epilogue: str = "none") -> Check:
    """Compare a kernel's output (the problem's ``out_shape`` and ``out_dtype``) with the reference;
    ``exact`` for integer-valued inputs. ``epilogue="swiglu"`` compares with :func:`swiglu_reference`,
    always within the tolerance (silu of integers is no integer)."""
    c = np.asarray(c)
    if epilogue == "swiglu":
        c32 = c.astype(np.float32)
        expected = swiglu_reference(problem)
        if c.shape != expected.shape:
            raise ValueError(f"output shape {c.shape} differs from the expected {expected.shape}")
        return Check(relative_error(c32, expected), int((~np.isfinite(c32)).sum()), 0, exact=False)
    if c.shape != problem.out_shape:
        raise ValueError(f"output shape {c.shape} differs from the expected {problem.out_shape}")
    if c.dtype != problem.out_dtype:
        raise ValueError(f"output dtype {c.dtype} differs from the problem's {problem.out_dtype}")
    c32 = c.astype(np.float32)
    nonfinite = int((~np.isfinite(c32)).sum())
    unwritten_zeros = _nonzero_empty_experts(c32, problem)
    tolerance = REL_TOLERANCES[problem.out_dtype]
    if exact:
        expected = reference_gemm(problem, np.float64).astype(np.float32).astype(problem.out_dtype).astype(np.float32)
        mismatches = int((c32 != expected).sum())
        return Check(relative_error(c32, expected), nonfinite, mismatches, exact=True, tolerance=tolerance)
    return Check(relative_error(c32, reference_gemm(problem)), nonfinite, unwritten_zeros, exact=False,
                 tolerance=tolerance)


def _nonzero_empty_experts(c: np.ndarray, problem: Problem) -> int:
    """Ragged K: the elements of dB[e] for experts with no rows that are not exactly 0 (NaN included)."""
    if problem.ragged != "K":
        return 0
    return int((c[np.asarray(problem.counts) == 0] != 0).sum())
