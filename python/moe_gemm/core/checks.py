"""Argument checks shared by the harness: each raises ValueError naming the broken constraint."""

from __future__ import annotations

import math
import numbers


def require_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` must be an integer (bools are not) and at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def require_nonnegative_float(name: str, value: object) -> float:
    """``value`` must be a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
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
