"""The numpy e4m3 quantizers, the reference for chapter 10's quantization kernels: amax scaling to 448 per
group, round trips within e4m3's precision, all-zero groups, partial groups, power-of-two scales."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.quantize import BLOCK, E4M3, E4M3_MAX, dequantize, group_amax, groups, quantize, scale_grid

# e4m3 keeps 3 mantissa bits: rounding to nearest is off by at most 2**-4 of the value, down to its
# smallest normal number 2**-6; below, its subnormals are spaced 2**-9 apart (an error of 2**-10).
E4M3_RELATIVE = 2.0**-4
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10


def _groups_of(x: np.ndarray, group: tuple[int, int]) -> list[np.ndarray]:
    """Every group of a 2-D array, cut with plain slices (not the quantizer's reshape)."""
    return [x[i:i + group[0], j:j + group[1]] for i in range(0, x.shape[0], group[0])
            for j in range(0, x.shape[1], group[1])]


@pytest.mark.parametrize("scaling", ["blockwise", "rowwise"])
@pytest.mark.parametrize("operand", ["A", "B"])
def test_round_trip_is_within_e4m3_precision(scaling: str, operand: str) -> None:
    rng = np.random.default_rng(1)
    shape = (37, 300) if operand == "A" else (300, 200)  # A [M, K], one expert's B [K, N]: partial blocks
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 100, size=(shape[0], 1))).astype(np.float32)
    group = groups(scaling, 300)[0 if operand == "A" else 1]
    q, scale = quantize(x, group)
    assert q.dtype == E4M3 and scale.dtype == np.float32 and scale.shape == scale_grid(shape, group)
    error = np.abs(dequantize(q, scale, group) - x)
    per_element_scale = np.repeat(np.repeat(scale, group[0], 0), group[1], 1)[:shape[0], :shape[1]]
    bound = np.maximum(E4M3_RELATIVE * np.abs(x), E4M3_SUBNORMAL_HALF_STEP * per_element_scale)
    assert (error <= bound * (1 + 1e-6)).all()


@pytest.mark.parametrize("group", [(1, BLOCK), (BLOCK, BLOCK), (1, 300), (300, 1)])
def test_each_group_amax_lands_on_448(group: tuple[int, int]) -> None:
    x = np.random.default_rng(2).standard_normal((300, 300)).astype(np.float32)
    q, scale = quantize(x, group)
    q32 = q.astype(np.float32)
    for values in _groups_of(q32, group):
        assert np.abs(values).max() == E4M3_MAX
        assert not np.isnan(values).any()
    expected = np.array([np.abs(g).max() for g in _groups_of(x, group)], dtype=np.float32) / np.float32(E4M3_MAX)
    np.testing.assert_allclose(scale.reshape(-1), expected, rtol=1e-7)


def test_an_all_zero_group_gets_scale_one_and_zeros() -> None:
    x = np.random.default_rng(3).standard_normal((4, 3 * BLOCK)).astype(np.float32)
    x[2, BLOCK:2 * BLOCK] = 0.0
    with np.errstate(all="raise"):  # no 0 / 0 anywhere on the way
        q, scale = quantize(x, (1, BLOCK))
    assert scale[2, 1] == 1.0
    assert (q[2, BLOCK:2 * BLOCK].astype(np.float32) == 0).all()
    assert np.isfinite(scale).all() and (scale > 0).all()
    assert (dequantize(q, scale, (1, BLOCK))[2, BLOCK:2 * BLOCK] == 0).all()


def test_an_all_zero_tensor_and_an_empty_one() -> None:
    q, scale = quantize(np.zeros((3, 5), dtype=np.float32), (1, 5))
    assert (scale == 1).all() and (q.astype(np.float32) == 0).all()
    q, scale = quantize(np.zeros((0, 300), dtype=np.float32), (1, BLOCK))
    assert q.shape == (0, 300) and scale.shape == (0, 3)


def test_one_large_value_sets_its_groups_scale() -> None:
    """The group's other values fall into e4m3's subnormals (or to zero): the cost of one outlier per
    group, which the 1 x 128 granularity confines to 128 values."""
    x = np.full((1, 2 * BLOCK), 0.01, dtype=np.float32)
    x[0, 5] = 1000.0
    q, scale = quantize(x, (1, BLOCK))
    assert scale[0, 0] == np.float32(1000.0) / np.float32(E4M3_MAX)
    assert scale[0, 1] == np.float32(0.01) / np.float32(E4M3_MAX)  # the next group keeps its precision
    back = dequantize(q, scale, (1, BLOCK))
    assert back[0, 5] == pytest.approx(1000.0, rel=1e-6)
    assert np.abs(back[0, :BLOCK] - x[0, :BLOCK]).max() <= E4M3_SUBNORMAL_HALF_STEP * scale[0, 0]
    np.testing.assert_allclose(back[0, BLOCK:], x[0, BLOCK:], rtol=E4M3_RELATIVE)


def test_a_partial_last_group_is_scaled_by_its_own_amax() -> None:
    x = np.ones((2, 200), dtype=np.float32)
    x[:, BLOCK:] = 5.0  # the tail group, 72 columns
    q, scale = quantize(x, (1, BLOCK))
    assert scale.shape == (2, 2)
    np.testing.assert_array_equal(scale[:, 1], np.float32(5.0) / np.float32(E4M3_MAX))
    assert (q.astype(np.float32)[:, BLOCK:] == E4M3_MAX).all()


def test_power_of_two_scales_keep_small_integers_exact() -> None:
    x = np.random.default_rng(4).integers(-3, 4, size=(64, 3 * BLOCK)).astype(np.float32)
    x[0, 0] = 2 * E4M3_MAX  # one large value: its group's scale is 2
    q, scale = quantize(x, (1, BLOCK), power_of_two=True)
    mantissa, _ = np.frexp(scale)
    assert (mantissa == 0.5).all()  # every scale a power of two
    assert scale[0, 0] == 2.0
    np.testing.assert_array_equal(dequantize(q, scale, (1, BLOCK)), x)
    top = np.abs(q.astype(np.float32)).reshape(64, 3, BLOCK).max(axis=2)
    assert ((top > E4M3_MAX / 2) | (top == 0)).all()  # rounding the scale up costs at most one bit of range


def test_amax_and_expansion_agree_with_plain_slicing() -> None:
    x = np.random.default_rng(5).standard_normal((130, 260)).astype(np.float32)
    amax = group_amax(x, (BLOCK, BLOCK))
    assert amax.shape == (2, 3)
    assert amax[1, 2] == np.abs(x[BLOCK:, 2 * BLOCK:]).max()  # a 2 x 4 corner block


def test_non_finite_values_are_refused() -> None:
    for bad in (np.inf, np.nan):
        x = np.ones((2, 4), dtype=np.float32)
        x[1, 2] = bad
        with pytest.raises(ValueError, match="finite"):
            quantize(x, (1, 4))


def test_unknown_scaling_is_refused() -> None:
    with pytest.raises(ValueError, match="scaling must be one of"):
        groups("columnwise", 128)  # type: ignore[arg-type]
