"""A model of the FP8 tensor core's limited accumulation, to predict what promotion buys before it is measured.

The DeepSeek-V3 technical report (section 3.3.2) found that FP8 GEMM accumulation in the H800's tensor cores
retains "around 14 bits", and that for two random matrices with K = 4,096 this gave "a maximum relative error
of nearly 2%". The hardware's adder is not documented. This model takes the simplest reading: the products
of e4m3 values are exact (two 4-bit significands), each wgmma k32 step's 32 products are summed exactly, and
that sum is added into a running accumulator whose significand is then cut to ``bits`` bits toward zero
(:func:`truncate`). Promotion every 128 of K (DeepGEMM's and k8's) restarts that accumulator at each
128-deep block and adds the block's sum into fp32.

It is a model, not a measurement: chapter 10's accuracy part measures the kernels on the GPU, and the page
sets the two side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moe_gemm.model.quantize import E4M3

STEP = 32  # K of one e4m3 wgmma (m64nNk32)
BITS = 14  # the report's "around 14 bits"


# --8<-- [start:model]
def truncate(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` with its significand cut to ``bits`` bits toward zero (float64 in, float64 out; 0 stays 0)."""
    significand, exponent = np.frexp(x)  # x = significand * 2**exponent, 0.5 <= |significand| < 1
    return np.ldexp(np.trunc(significand * 2.0**bits) / 2.0**bits, exponent)


def limited_product(a: np.ndarray, b: np.ndarray, bits: int = BITS, promote_every: int | None = None) -> np.ndarray:
    """a [M, K] @ b [K, N] (float64 holding e4m3 values) as the model's tensor core sums it: k32 step by step
    into an accumulator of ``bits`` significand bits; with ``promote_every`` (a multiple of 32), that
    accumulator restarts at every block of that many K and each block's sum is added into fp32."""
    if a.shape[1] % STEP or (promote_every is not None and promote_every % STEP):
        raise ValueError(f"K = {a.shape[1]} and promote_every = {promote_every} must be multiples of {STEP}")
    steps = [a[:, k:k + STEP] @ b[k:k + STEP] for k in range(0, a.shape[1], STEP)]  # exact in float64
    if promote_every is None:
        acc = np.zeros((a.shape[0], b.shape[1]))
        for step in steps:
            acc = truncate(acc + step, bits)
        return acc
    per_block = promote_every // STEP
    main = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for first in range(0, len(steps), per_block):
        block = np.zeros_like(main, dtype=np.float64)
        for step in steps[first:first + per_block]:
            block = truncate(block + step, bits)
        main = main + block.astype(np.float32)  # the promotion: an fp32 add per accumulator
    return main.astype(np.float64)
# --8<-- [end:model]


def random_e4m3(rows: int, cols: int, rng: np.random.Generator, nonnegative: bool) -> np.ndarray:
    """Random values that e4m3 holds exactly, as float64: uniform [0, 1) or standard normal, rounded to e4m3."""
    x = rng.random((rows, cols)) if nonnegative else rng.standard_normal((rows, cols))
    return x.astype(E4M3).astype(np.float64)


def promotion_errors(ks: Sequence[int], bits: int = BITS, size: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """The model's error against the exact product, without and with promotion every 128 of K, at each K (its
    inputs seeded by ``seed`` and K alone):
    ``||C - C_exact|| / ||C_exact||`` (chapter 10's accuracy measure) and the largest element's relative error,
    for non-negative inputs (every sum grows like K) and zero-mean ones (sums grow like sqrt(K), and an element
    near zero makes the largest relative error meaningless: it is left out)."""
    rows = []
    for nonnegative in (True, False):
        for K in ks:
            rng = np.random.default_rng((seed, K, nonnegative))  # each K's inputs whatever else is computed
            a, b = random_e4m3(size, K, rng, nonnegative), random_e4m3(K, size, rng, nonnegative)
            exact = a @ b
            for promote_every in (None, 128):
                got = limited_product(a, b, bits, promote_every)
                error = np.abs(got - exact)
                row = {"K": K, "inputs": "non-negative" if nonnegative else "zero-mean",
                       "promoted": promote_every is not None,
                       "rel_error": float(np.linalg.norm(got - exact) / np.linalg.norm(exact))}
                if nonnegative:  # every exact element is positive and grows with K
                    row["max_rel_error"] = float(np.max(error / exact))
                rows.append(row)
    return rows
