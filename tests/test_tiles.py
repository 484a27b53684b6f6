"""The flat tile list, eta, scheduled FLOP and the eta-only estimate."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.problem import useful_flops
from moe_gemm.model.routing import expert_counts, expert_offsets
from moe_gemm.model.tiles import (
    TILE_FIELDS,
    eta,
    eta_estimate,
    m_tiles_per_expert,
    scheduled_flops,
    tile_count,
    tile_list,
)

E, K, N = 64, 1024, 2688


@pytest.mark.parametrize(
    ("tokens", "skew", "bm", "bn", "expected"),
    [
        (16384, 0.0, 64, 64, 10_752),
        (16384, 1.2, 64, 64, 11_970),
        (16384, 0.0, 128, 128, 2_688),
        (16384, 1.2, 128, 128, 3_444),
        (16384, 0.0, 32, 128, 10_752),  # the seed's k1/BM=32 at balanced 16k
        (2048, 0.0, 128, 128, 1_344),  # k1/k2 at 2k: BN = 128
        (2048, 0.0, 64, 64, 2_688),  # k0 at 2k: BN = 64
    ],
)
def test_seed_tile_counts(tokens: int, skew: float, bm: int, bn: int, expected: int) -> None:
    counts = expert_counts(E, tokens, skew)
    assert tile_count(counts, N, bm, bn) == expected
    assert tile_list(counts, N, bm, bn).shape == (expected, 4)


@pytest.mark.parametrize(("bm", "expected"), [(64, 0.898), (128, 0.780)])
def test_seed_eta_at_skew_1_2(bm: int, expected: float) -> None:
    assert round(eta(expert_counts(E, 16384, 1.2), bm), 3) == expected


def test_seed_wasted_shares() -> None:
    counts = expert_counts(E, 16384, 1.2)
    assert round(100 * (1 - eta(counts, 64)), 1) == 10.2
    assert round(100 * (1 - eta(counts, 128)), 1) == 22.0


def test_balanced_eta() -> None:
    assert eta(expert_counts(E, 16384, 0.0), 128) == 1.0
    # 2,048 balanced rows: 32 per expert fill a 32-row tile, half a 64-row one, a quarter of 128.
    counts = expert_counts(E, 2048, 0.0)
    assert [eta(counts, bm) for bm in (32, 64, 128)] == [1.0, 0.5, 0.25]


def test_seed_eta_only_estimate() -> None:
    eta_skew = eta(expert_counts(E, 16384, 1.2), 128)
    # The seed multiplied by eta rounded to 0.780: 440.1 * 0.780 = 343.3.
    assert eta_estimate(440.1, round(eta_skew, 3)) == pytest.approx(343.3, abs=0.05)
    # Unrounded, eta = 0.7805 and the estimate is 343.5, still well under the seed's measured 357.0.
    assert eta_estimate(440.1, eta_skew) == pytest.approx(343.5, abs=0.05)
    # The 2k balanced row of the seed: 440.1 * 0.25 = 110.0.
    assert eta_estimate(440.1, eta(expert_counts(E, 2048, 0.0), 128), 1.0) == pytest.approx(110.0, abs=0.05)


def test_eta_estimate_scales_by_the_ratio() -> None:
    assert eta_estimate(100.0, 0.5, 0.25) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="eta_balanced"):
        eta_estimate(100.0, 0.5, 0.0)


def test_hand_checked_tile_list() -> None:
    counts = np.array([150, 64, 0, 1])
    tiles = tile_list(counts, N=100, bm=64, bn=64)
    assert TILE_FIELDS == ("expert", "row0", "rows", "col0")
    assert tiles.dtype == np.int32
    assert tiles.tolist() == [
        [0, 0, 64, 0], [0, 0, 64, 64],
        [0, 64, 64, 0], [0, 64, 64, 64],
        [0, 128, 22, 0], [0, 128, 22, 64],
        [1, 150, 64, 0], [1, 150, 64, 64],
        [3, 214, 1, 0], [3, 214, 1, 64],
    ]


def test_no_rows_no_tiles() -> None:
    counts = np.zeros(4, dtype=np.int64)
    assert tile_list(counts, N, 64, 64).shape == (0, 4)
    assert tile_count(counts, N, 64, 64) == 0
    assert eta(counts, 64) == 1.0
    assert scheduled_flops(counts, K, N, 64, 64) == 0


def _random_counts(rng: np.random.Generator) -> np.ndarray:
    experts = int(rng.integers(1, 40))
    if rng.random() < 0.5:
        return expert_counts(experts, int(rng.integers(0, 5000)), float(rng.uniform(0.0, 2.5)))
    counts = rng.integers(0, 400, size=experts)
    counts[rng.random(experts) < 0.3] = 0  # plenty of empty experts
    return counts


def _check_tile_list(counts: np.ndarray, n: int, bm: int, bn: int) -> None:
    tiles = tile_list(counts, n, bm, bn).astype(np.int64)
    expert, row0, rows, col0 = tiles.T
    offsets = expert_offsets(counts)
    n_tiles = -(-n // bn)

    assert len(tiles) == tile_count(counts, n, bm, bn) == int((-(-counts // bm)).sum()) * n_tiles
    assert ((rows >= 1) & (rows <= bm)).all()
    assert (col0 % bn == 0).all() and ((col0 >= 0) & (col0 < n)).all()
    # No tile crosses an expert boundary.
    assert (row0 >= offsets[expert]).all()
    assert (row0 + rows <= offsets[expert + 1]).all()
    # Expert-major order.
    assert (np.diff(expert) >= 0).all()
    # Every row is covered exactly once for each N tile.
    for c in range(0, n, bn):
        coverage = np.zeros(int(counts.sum()), dtype=np.int64)
        for r0, r in zip(row0[col0 == c], rows[col0 == c]):
            coverage[r0:r0 + r] += 1
        assert (coverage == 1).all()

    value = eta(counts, bm)
    assert 0.0 < value <= 1.0
    assert scheduled_flops(counts, K, n, bm, bn) >= useful_flops(int(counts.sum()), K, n)
    if counts.sum():
        assert value == pytest.approx(counts.sum() / (bm * m_tiles_per_expert(counts, bm).sum()))


def test_tile_list_properties_on_random_routings() -> None:
    rng = np.random.default_rng(7)
    for _ in range(150):
        counts = _random_counts(rng)
        n = int(rng.integers(1, 600))
        bm, bn = (int(x) for x in rng.choice([16, 32, 64, 128, 256], size=2))
        _check_tile_list(counts, n, bm, bn)


def test_scheduled_flops_counts_padding_in_m_and_n() -> None:
    counts = np.array([100, 30])
    # M: ceil(100/64) + ceil(30/64) = 3 tiles of 64 rows; N: 100 -> 2 tiles of 64 columns.
    assert scheduled_flops(counts, 8, 100, 64, 64) == 2 * (3 * 64) * 8 * (2 * 64)
    assert useful_flops(130, 8, 100) == 2 * 130 * 8 * 100


def test_seed_scheduled_over_useful() -> None:
    counts = expert_counts(E, 16384, 1.2)
    ratio = scheduled_flops(counts, K, N, 128, 128) / useful_flops(16384, K, N)
    assert ratio == pytest.approx(1 / eta(counts, 128))


@pytest.mark.parametrize("bad", [0, 8, 15, 48, 96, -64, 64.0, True])
def test_bad_bm_names_bm(bad: object) -> None:
    counts = np.array([10, 20])
    with pytest.raises(ValueError, match="BM"):
        tile_list(counts, 64, bad, 64)
    with pytest.raises(ValueError, match="BM"):
        eta(counts, bad)


@pytest.mark.parametrize("bad", [0, 8, 24, 100, 64.0])
def test_bad_bn_names_bn(bad: object) -> None:
    counts = np.array([10, 20])
    with pytest.raises(ValueError, match="BN"):
        tile_list(counts, 64, 64, bad)
    with pytest.raises(ValueError, match="BN"):
        tile_count(counts, 64, 64, bad)


def test_bad_n_names_n() -> None:
    with pytest.raises(ValueError, match="N must be >= 1"):
        tile_list(np.array([10]), 0, 64, 64)


@pytest.mark.parametrize(("counts", "pattern"), [([5, -3, 10], ">= 0"), ([2.5, 3.0], "integers"), ([], "non-empty")])
def test_bad_counts_raise_before_tiling(counts: list, pattern: str) -> None:
    # A negative m_e used to be tiled silently, shifting every later expert's row0.
    with pytest.raises(ValueError, match=pattern):
        tile_list(np.array(counts), 64, 64, 64)
    with pytest.raises(ValueError, match=pattern):
        tile_count(np.array(counts), 64, 64, 64)
    with pytest.raises(ValueError, match=pattern):
        eta(np.array(counts), 64)
