"""The numpy reference and the checks every kernel's output goes through.

Two checks, as CUTLASS's examples do them:

* exact, on integer-valued inputs: fp32 accumulation of small integers is exact, so the
  kernel's bf16 output must equal the float64 product rounded once to bf16, bit for bit;
* realistic, on random inputs: ``||C - C_ref||_F / ||C_ref||_F <= 1e-2`` for bf16 output,
  with every element finite (an unwritten, NaN-poisoned tile fails here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_gemm.model.problem import BF16, Problem

REL_TOLERANCE = 1e-2


# The last reference computed: a chapter checks many variants on one problem in a row, and at
# 65,536 rows one reference is 360 GFLOP of numpy.
_last_reference: tuple[Problem, np.dtype, np.ndarray] | None = None


def reference_gemm(problem: Problem, dtype: type = np.float32) -> np.ndarray:
    """C = A_e @ B[e] per expert, accumulated in ``dtype`` (fp32 or float64), shape [M_tot, N].

    The result is read-only and remembered for the next call on the same problem object."""
    global _last_reference
    if _last_reference is not None and _last_reference[0] is problem and _last_reference[1] == np.dtype(dtype):
        return _last_reference[2]
    c = _compute_reference(problem, dtype)
    c.flags.writeable = False
    _last_reference = (problem, np.dtype(dtype), c)
    return c


def _compute_reference(problem: Problem, dtype: type) -> np.ndarray:
    c = np.zeros((problem.tokens, problem.N), dtype=dtype)
    offsets = problem.offsets
    for e in range(problem.experts):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            c[lo:hi] = problem.a[lo:hi].astype(dtype) @ problem.b[e].astype(dtype)
    return c


def relative_error(c: np.ndarray, c_ref: np.ndarray) -> float:
    """||C - C_ref||_F / ||C_ref||_F in float64; inf if C has non-finite entries."""
    c64, ref64 = np.asarray(c, dtype=np.float64), np.asarray(c_ref, dtype=np.float64)
    if c64.shape != ref64.shape:
        raise ValueError(f"output shape {c64.shape} differs from the reference's {ref64.shape}")
    if not np.isfinite(c64).all():
        return float("inf")
    denominator = np.linalg.norm(ref64)
    return float(np.linalg.norm(c64 - ref64) / denominator) if denominator else float(np.linalg.norm(c64))


@dataclass(frozen=True)
class Check:
    """The outcome of comparing one kernel output with the reference."""

    rel_error: float
    nonfinite: int  # elements that are NaN or inf (an unwritten tile shows up here)
    mismatches: int  # elements differing from the exact answer (exact checks only)
    exact: bool

    @property
    def passed(self) -> bool:
        if self.exact:
            return self.mismatches == 0 and self.nonfinite == 0
        return self.nonfinite == 0 and self.rel_error <= REL_TOLERANCE

    def describe(self) -> str:
        kind = f"exact, {self.mismatches} mismatches" if self.exact else f"rel. error {self.rel_error:.2e}"
        return f"{'ok' if self.passed else 'FAILED'} ({kind}, {self.nonfinite} non-finite)"


SWIGLU_BLOCK = 64  # columns per gate or up block of an interleaved W_gate_up (moe_gemm.torch.layer)


def swiglu_reference(problem: Problem) -> np.ndarray:
    """silu(gate) * up from the fp32 product, for B's columns in interleaved 64-column gate / up
    blocks: [M_tot, N / 2], what k6's fused SwiGLU epilogue writes (kernels/k6_persistent.cu)."""
    if problem.N % (2 * SWIGLU_BLOCK):
        raise ValueError(f"the SwiGLU reference needs N a multiple of {2 * SWIGLU_BLOCK}, got {problem.N}")
    c = reference_gemm(problem).reshape(problem.tokens, problem.N // (2 * SWIGLU_BLOCK), 2, SWIGLU_BLOCK)
    gate, up = c[:, :, 0, :], c[:, :, 1, :]
    return (gate / (1.0 + np.exp(-gate)) * up).reshape(problem.tokens, problem.N // 2).astype(np.float32)


def check_output(c: np.ndarray, problem: Problem, *, exact: bool = False, epilogue: str = "none") -> Check:
    """Compare a kernel's bf16 output with the reference; ``exact`` for integer-valued inputs.
    ``epilogue="swiglu"`` compares with :func:`swiglu_reference`, always within the tolerance (silu
    of integers is no integer)."""
    c = np.asarray(c)
    if epilogue == "swiglu":
        c32 = c.astype(np.float32)
        expected = swiglu_reference(problem)
        if c.shape != expected.shape:
            raise ValueError(f"output shape {c.shape} differs from the expected {expected.shape}")
        return Check(relative_error(c32, expected), int((~np.isfinite(c32)).sum()), 0, exact=False)
    expected_shape = (problem.tokens, problem.N)
    if c.shape != expected_shape:
        raise ValueError(f"output shape {c.shape} differs from the expected {expected_shape}")
    c32 = c.astype(np.float32)
    nonfinite = int((~np.isfinite(c32)).sum())
    if exact:
        expected = reference_gemm(problem, np.float64).astype(np.float32).astype(BF16).astype(np.float32)
        mismatches = int((c32 != expected).sum())
        return Check(relative_error(c32, expected), nonfinite, mismatches, exact=True)
    return Check(relative_error(c32, reference_gemm(problem)), nonfinite, 0, exact=False)
