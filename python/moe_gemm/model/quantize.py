"""FP8 e4m3 quantization with fp32 scales, in numpy: the reference for chapter 10's quantization kernels.

A tensor is cut into groups; each group shares one fp32 scale, chosen so that the group's largest
magnitude (its amax) lands on e4m3's largest finite value, 448::

    scale = amax / 448          q = e4m3(x / scale)          x ~ q * scale

Two granularities, for the ragged-M GEMM's A [M_tot, K] and one expert's B[e] [K, N]:

* blockwise, the DeepSeek-V3 recipe (DeepSeek-V3 technical report, section 3.3.2): A in 1 x 128
  groups along K (one scale per row and K block), B in 128 x 128 blocks;
* rowwise, the form torch._scaled_grouped_mm takes on sm_90: one scale per row of A (over all of K)
  and one per column of B[e] (over all of K).

K or N need not be multiples of 128: the last group along an axis holds the remainder, and its scale
is that partial group's amax (a kernel's TMA loads zero-fill past the end, and zeros change no amax
and add nothing to a product).

An all-zero group gets scale 1 rather than 0 / 448: its values quantize to zeros whatever the scale,
and a kernel that multiplies by ``448 / amax`` must not meet 0 / 0.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3_MAX = float(ml_dtypes.finfo(E4M3).max)  # 448: e4m3fn spends its all-ones code on NaN, not on inf
BLOCK = 128  # the blockwise group edge, along K (and along N for B)

Scaling = Literal["rowwise", "blockwise"]
SCALINGS: tuple[Scaling, ...] = ("rowwise", "blockwise")


def groups(scaling: Scaling, K: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The group shapes of A [M_tot, K] and of one expert's B[e] [K, N] under ``scaling``."""
    if scaling == "blockwise":
        return (1, BLOCK), (BLOCK, BLOCK)
    if scaling == "rowwise":
        return (1, K), (K, 1)
    raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")


def scale_grid(shape: tuple[int, ...], group: tuple[int, ...]) -> tuple[int, ...]:
    """How many groups tile ``shape`` along each axis (a partial last group counts)."""
    return tuple(-(-size // edge) for size, edge in zip(shape, group, strict=True))


def group_amax(x: np.ndarray, group: tuple[int, ...]) -> np.ndarray:
    """The largest |x| of each group, shape :func:`scale_grid`; a partial group is padded with zeros."""
    grid = scale_grid(x.shape, group)
    padded = np.pad(np.abs(x), [(0, n * edge - size) for n, edge, size in zip(grid, group, x.shape, strict=True)])
    split = [d for n, edge in zip(grid, group, strict=True) for d in (n, edge)]  # (n0, g0, n1, g1, ...)
    return padded.reshape(split).max(axis=tuple(range(1, 2 * len(group), 2)), initial=0.0)


def expand(scale: np.ndarray, group: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Each group's scale repeated over the group's elements, cropped to ``shape``. ``scale`` may come
    without the axes of size one that rowwise scales drop ([M_tot] rather than [M_tot, 1])."""
    full = np.asarray(scale).reshape(scale_grid(shape, group))
    for axis, edge in enumerate(group):
        full = np.repeat(full, edge, axis=axis)
    return full[tuple(slice(0, size) for size in shape)]


def quantize(x: np.ndarray, group: tuple[int, ...], *, power_of_two: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 values and fp32 scales (shape :func:`scale_grid`) of a real array, one scale per group.

    ``power_of_two`` rounds each scale up to a power of two (as MXFP8's and DeepSeek-V3.1's UE8M0 scales
    are): dividing by it is exact, so integer-valued inputs of a few significant bits come back exactly
    (what the exact checks of the FP8 edge cases need). Otherwise the scale is amax / 448, rounded to fp32.
    """
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("quantize needs finite values (an inf or NaN has no scale)")
    amax = group_amax(x, group)
    # Floored at fp32's smallest normal number: amax / 448 of a group of subnormals would round to 0.
    scale = np.maximum(amax / np.float32(E4M3_MAX), np.finfo(np.float32).tiny).astype(np.float32)
    if power_of_two:
        mantissa, exponent = np.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
        scale = np.ldexp(np.float32(1.0), exponent - (mantissa == 0.5)).astype(np.float32)
    scale[amax == 0] = 1.0
    # amax / 448 rounded to fp32 can leave x / scale a hair above 448, which e4m3fn would turn into NaN.
    scaled = np.clip(x / expand(scale, group, x.shape), -E4M3_MAX, E4M3_MAX)
    return scaled.astype(E4M3), scale


def padded_rows(tokens: int) -> int:
    """The rows of the MN-major layout of A's 1 x 128 scales, [ceil(K / 128), M_pad], that the FP8 GEMM reads:
    M_tot rounded up to 4, so that each k-block's row of scales starts on 16 bytes (DeepGEMM's layout)."""
    return -(-tokens // 4) * 4


def dequantize(q: np.ndarray, scale: np.ndarray, group: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
    """q * scale, per group, in ``dtype``: the real values an FP8 GEMM multiplies."""
    return q.astype(dtype) * expand(scale, group, q.shape).astype(dtype)
