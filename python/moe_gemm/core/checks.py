"""Argument checks shared by the harness: each raises ValueError naming the broken constraint.

Also the upper bounds of the problem's sizes and of the command lines' counts, defined once: the
model refuses a size past them, and every command line refuses it while parsing, before any work.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """The largest value an input may take, and why in a few words (the error message quotes them)."""

    value: int | float
    why: str


# M_tot, the routed rows: 16x the largest M_tot a chapter measures (65,536). The kernels would take
# more (row offsets and tile coordinates are int32, byte offsets 64-bit), but every run first checks
# its kernels against the numpy reference, whose fp32 C at the seed's N = 2,688 is already 11 GB at
# 2**20 rows, and whose relative error makes two float64 copies of it (45 GB more).
MAX_ROWS = Limit(2**20, "16x the largest M_tot measured; the numpy reference's C is 11 GB there")
# Tokens of a whole MoE layer (chapter 08): each token is routed to top_k experts, at most 8 in
# model.workloads.LAYERS, so the layer's routed rows stay within MAX_ROWS.
MAX_LAYER_TOKENS = Limit(MAX_ROWS.value // 8, "at top_k = 8 experts per token, the 2**20 routed rows M_tot takes")
# E: the largest layer here has 256 experts (DeepSeek-V3-like), as many as k6's device walk holds
# (walk::MAX_EXPERTS in kernels/tile_walk.cuh), and torch._grouped_mm takes fewer than 1,024 groups:
# 1,024 is the first E at which the peer every chapter measures against cannot run, so past it
# chapter 00's arithmetic would describe nothing a chapter could compare. A kernel refuses an E past
# its own limit with its own ValueError.
MAX_EXPERTS = Limit(1024, "torch._grouped_mm takes at most 1,023 groups, k6's device walk 256")
# Routing skew s: expert e gets rows in proportion to (e+1)^-s, so the heaviest expert's share is at
# least 1 / zeta(s); at s = 4 that is 92 % of the rows for any E (zeta(4) = pi^4 / 90 = 1.082). More
# skew only moves the last rows into expert 0; the grids stop at 1.6.
MAX_SKEW = Limit(4.0, "at s = 4 the heaviest expert already holds 92 % of the rows")
# K and N: above the widest projection of the layers here (Mixtral-like: gate and up fused, N = 2 x
# 14,336 = 28,672; its down projection K = 14,336). A kernel refuses a K or N it cannot tile (TMA's
# 16-byte strides, its tile width) with its own ValueError.
MAX_DIMENSION = Limit(32768, "above the widest projection here, Mixtral-like gate + up with N = 28,672")
# The M tile of chapter 00's eta tables: the tallest M tile of any kernel here is 256 rows
# (k6/coop256-*: two warpgroups of 128).
MAX_TILE_ROWS = Limit(256, "the tallest M tile of any kernel here, k6's cooperative 256 rows")
# Rounds, repeats, warm-up launches: each one more repeats a pass of timed launches, so a run's time
# grows with it; the recorded runs use 2 or 3 rounds, 2 repeats and 10 warm-up launches, a tenth of this.
MAX_REPEATS = Limit(100, "each repeats a pass of timed launches; the recorded runs use at most 10")
# Test processes at once (validation --jobs, default 8): all share one GPU, each holding its own CUDA
# context and compiling with NVRTC on the host; 64 is 8x the default.
MAX_JOBS = Limit(64, "pytest processes sharing one GPU, each with its own CUDA context")
# Seeds: numpy's legacy np.random.seed takes 0 .. 2**32 - 1; default_rng takes more, but keeping a
# seed to 32 bits keeps it usable with either.
MAX_SEED = Limit(2**32 - 1, "a 32-bit seed, what numpy's np.random.seed takes")


def _above(name: str, value: int | float, limit: Limit | None, spelled: str) -> None:
    if limit is not None and value > limit.value:
        raise ValueError(f"{name} must be <= {limit.value:{spelled}} ({limit.why}), got {value:{spelled}}")


def require_int(name: str, value: object, *, minimum: int | None = None, limit: Limit | None = None) -> int:
    """``value`` must be an integer (bools are not), at least ``minimum`` and at most ``limit``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    _above(name, int(value), limit, ",")
    return int(value)


def require_nonnegative_float(name: str, value: object, *, limit: Limit | None = None) -> float:
    """``value`` must be a finite real number >= 0, at most ``limit``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    _above(name, float(value), limit, "g")
    return float(value)


def require_tile_size(name: str, value: object) -> int:
    """Tile sizes are powers of two and at least 16 (the mma/wgmma fragment edge)."""
    value = require_int(name, value, minimum=16)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    return value


def require_tile_width(name: str, value: object) -> int:
    """Tile widths (BN) are multiples of 16, at least 16: wgmma's N runs in steps of 8 up to 256, and
    BN = 192 tiles N = 2688 with no padding where 256 would pad 4.5 %."""
    value = require_int(name, value, minimum=16)
    if value % 16:
        raise ValueError(f"{name} must be a multiple of 16, got {value}")
    return value
