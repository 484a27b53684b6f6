"""moe_gemm.model.accumulation, chapter 10's model of the FP8 tensor core's limited accumulation, and the claims
chapter 10's page makes from it."""

from __future__ import annotations

import numpy as np
import pytest

from moe_gemm.model.accumulation import limited_product, promotion_errors, random_e4m3, truncate

TARGET = 2e-3  # chapter 10's accuracy target (chapters/10/run.py, ACCURACY_TARGET)


def test_truncate_cuts_the_significand_toward_zero_and_keeps_what_fits():
    assert truncate(np.array(1 + 2.0**-20), 14) == 1.0
    assert truncate(np.array(-(1 + 2.0**-20)), 14) == -1.0  # toward zero, not down
    fits = np.array([0.0, 1.5, -3.25, 2.0**-30 * 1.75, 12345.0])  # at most 14 significant bits
    assert np.array_equal(truncate(fits, 14), fits)
    assert truncate(np.array(2.0**14 + 1), 14) == 2.0**14


def test_with_every_bit_kept_the_model_is_the_exact_product():
    rng = np.random.default_rng(1)
    a, b = random_e4m3(8, 256, rng, False), random_e4m3(256, 8, rng, False)
    assert np.array_equal(limited_product(a, b, bits=53), a @ b)
    assert np.allclose(limited_product(a, b, bits=53, promote_every=128), a @ b, rtol=1e-6)


def test_k_and_the_promotion_interval_must_be_whole_wgmmas():
    a = np.zeros((2, 48))
    with pytest.raises(ValueError, match="multiples of 32"):
        limited_product(a, a.T)
    with pytest.raises(ValueError, match="multiples of 32"):
        limited_product(np.zeros((2, 64)), np.zeros((64, 2)), promote_every=48)


@pytest.fixture(scope="module")
def errors():
    return promotion_errors((1024, 2048, 4096, 16384))


def error(rows, K, promoted, inputs="zero-mean", field="rel_error"):
    return next(r[field] for r in rows if r["K"] == K and r["promoted"] == promoted and r["inputs"] == inputs)


def test_the_page_unpromoted_the_error_grows_linearly_and_passes_the_target_from_4096(errors):
    for inputs in ("zero-mean", "non-negative"):
        growth = error(errors, 16384, False, inputs) / error(errors, 1024, False, inputs)
        assert 16 * 0.8 < growth < 16 * 1.2, (inputs, growth)
    assert error(errors, 2048, False) < TARGET < error(errors, 4096, False)


def test_the_page_promoted_the_error_stays_level_and_under_the_target(errors):
    for inputs in ("zero-mean", "non-negative"):
        promoted = [error(errors, K, True, inputs) for K in (1024, 2048, 4096, 16384)]
        assert max(promoted) < TARGET / 10 and max(promoted) / min(promoted) < 1.2, (inputs, promoted)


def test_the_page_the_model_is_kinder_than_the_reports_nearly_two_percent(errors):
    assert error(errors, 4096, False, "non-negative", "max_rel_error") < 0.02 / 2
