"""Routing: the seed's counts, exact sums, monotone counts and the input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moe_gemm.model.routing import counts_from_offsets, expert_counts, expert_offsets, routing_summary


@pytest.mark.parametrize(("skew", "largest", "smallest"), [(1.2, 4793, 32), (0.0, 256, 256)])
def test_seed_counts(skew: float, largest: int, smallest: int) -> None:
    counts = expert_counts(64, 16384, skew)
    assert counts.shape == (64,)
    assert counts.dtype == np.int64
    assert int(counts.max()) == largest
    assert int(counts.min()) == smallest
    assert int(counts[0]) == largest  # heaviest expert first
    assert int(counts.sum()) == 16384


def test_balanced_is_exactly_even() -> None:
    assert expert_counts(64, 16384, 0.0).tolist() == [256] * 64
    assert expert_counts(64, 2048, 0).tolist() == [32] * 64


def test_leftover_rows_go_to_the_heaviest_experts() -> None:
    # 10 rows over 4 balanced experts: 2 each, the 2 leftover rows to experts 0 and 1.
    assert expert_counts(4, 10, 0.0).tolist() == [3, 3, 2, 2]


def test_random_routings_sum_exactly_and_never_increase() -> None:
    rng = np.random.default_rng(20261129)
    for _ in range(500):
        experts = int(rng.integers(1, 257))
        tokens = int(rng.integers(0, 200_000))
        skew = float(rng.choice([0.0, rng.uniform(0.0, 3.0), rng.uniform(3.0, 40.0)]))
        counts = expert_counts(experts, tokens, skew)
        assert counts.shape == (experts,)
        assert int(counts.sum()) == tokens, (experts, tokens, skew)
        assert (counts >= 0).all()
        assert (np.diff(counts) <= 0).all(), (experts, tokens, skew)


def test_zero_tokens_gives_all_empty_experts() -> None:
    counts = expert_counts(8, 0, 1.2)
    assert counts.tolist() == [0] * 8
    summary = routing_summary(counts)
    assert summary["empty"] == 8
    assert summary["tokens"] == 0
    assert summary["imbalance"] == 0.0


def test_one_expert_takes_everything() -> None:
    assert expert_counts(1, 12345, 1.6).tolist() == [12345]


def test_heavy_skew_leaves_tail_experts_empty() -> None:
    counts = expert_counts(64, 2048, 2.0)
    assert int(counts.sum()) == 2048
    assert int((counts == 0).sum()) > 0
    assert routing_summary(counts)["empty"] == int((counts == 0).sum())


def test_routing_summary_values() -> None:
    summary = routing_summary(expert_counts(64, 16384, 1.2))
    assert summary == {"experts": 64, "tokens": 16384, "largest": 4793, "smallest": 32, "empty": 0,
                       "imbalance": pytest.approx(4793 / 256)}


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"experts": 0, "tokens": 16, "skew": 0.0}, "experts must be >= 1"),
        ({"experts": -3, "tokens": 16, "skew": 0.0}, "experts"),
        ({"experts": 2.5, "tokens": 16, "skew": 0.0}, "experts must be an integer"),
        ({"experts": True, "tokens": 16, "skew": 0.0}, "experts must be an integer"),
        ({"experts": 4, "tokens": -1, "skew": 0.0}, "tokens must be >= 0"),
        ({"experts": 4, "tokens": 16.0, "skew": 0.0}, "tokens must be an integer"),
        ({"experts": 4, "tokens": "16", "skew": 0.0}, "tokens must be an integer"),
        ({"experts": 4, "tokens": 16, "skew": -0.1}, "skew must be >= 0"),
        ({"experts": 4, "tokens": 16, "skew": math.nan}, "skew must be a finite number"),
        ({"experts": 4, "tokens": 16, "skew": math.inf}, "skew must be a finite number"),
        ({"experts": 4, "tokens": 16, "skew": "1.2"}, "skew must be a finite number"),
    ],
)
def test_bad_inputs_name_the_parameter(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        expert_counts(**kwargs)


def test_numpy_integer_inputs_are_accepted() -> None:
    counts = expert_counts(np.int64(64), np.int32(16384), np.float64(1.2))
    assert int(counts.max()) == 4793


def test_offsets_round_trip() -> None:
    counts = np.array([3, 0, 5, 1], dtype=np.int64)
    offsets = expert_offsets(counts)
    assert offsets.tolist() == [0, 3, 3, 8, 9]
    assert counts_from_offsets(offsets, 9).tolist() == counts.tolist()


@pytest.mark.parametrize(
    ("counts", "pattern"),
    [([], "non-empty"), ([[1, 2]], "1-D"), ([1.0, 2.0], "integers"), ([3, -1], ">= 0")],
)
def test_bad_counts_raise(counts: list, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        expert_offsets(np.array(counts))


@pytest.mark.parametrize(
    ("offsets", "tokens", "pattern"),
    [([1, 4], 4, "start at 0"), ([0, 3], 4, "M_tot = 4"), ([0, 3, 2], 2, "non-decreasing"), ([0], 0, "E \\+ 1")],
)
def test_bad_offsets_raise(offsets: list, tokens: int, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        counts_from_offsets(np.array(offsets), tokens)
