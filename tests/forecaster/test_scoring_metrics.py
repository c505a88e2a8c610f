"""Scores (forecaster/scoring.py): hand-computed values, NaN handling, the Poisson noise floor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import poisson

from forecaster.burst import trailing_mean_sigma
from forecaster.features import future_sums
from forecaster.scoring import (
    coverage,
    mae,
    pinball,
    poisson_abs_dev_from_median,
    poisson_noise_floor,
    rmse,
    score_forecasts,
    smoothed_rate,
)


def test_hand_computed_scores() -> None:
    y = np.array([1.0, 2.0, 3.0, 10.0])
    p = np.array([2.0, 2.0, 1.0, 10.0])
    assert mae(y, p) == pytest.approx(0.75)
    assert rmse(y, p) == pytest.approx(np.sqrt(5 / 4))
    # errors y - p: -1, 0, 2, 0 -> losses 0.1, 0, 1.8, 0
    assert pinball(y, p, 0.9) == pytest.approx(1.9 / 4)
    assert coverage(y, p) == pytest.approx(0.75)


def test_nan_positions_are_skipped_and_counted() -> None:
    y = np.array([1.0, np.nan, 3.0, 4.0])
    p = np.array([1.0, 5.0, np.nan, 2.0])
    s = score_forecasts(y, p, p)
    assert s.points == 2
    assert s.mae == pytest.approx(1.0)
    assert np.isnan(mae(np.array([np.nan]), np.array([1.0])))


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same length"):
        mae(np.zeros(3), np.zeros(4))


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 200.0))
def test_abs_dev_from_median_matches_direct_summation(lam: float) -> None:
    k = np.arange(0, int(lam + 20 * np.sqrt(lam) + 30))
    med = poisson.ppf(0.5, lam) if lam > 0 else 0.0
    direct = float(np.sum(np.abs(k - med) * poisson.pmf(k, lam)))
    assert poisson_abs_dev_from_median(np.array([lam]))[0] == pytest.approx(direct, abs=1e-9)


def test_noise_floor_of_a_poisson_stream_is_what_an_oracle_median_scores() -> None:
    rng = np.random.default_rng(11)
    rate = 3.0 + 2.0 * np.sin(np.arange(6000) / 300.0)
    x = rng.poisson(rate).astype(float)
    floor = poisson_noise_floor(x, 5)
    lam_true = future_sums(rate, 5.0)
    oracle = mae(future_sums(x, 5.0), poisson.ppf(0.5, lam_true))
    assert floor == pytest.approx(oracle, rel=0.05)
    # and an honest (causal) forecaster does not beat it: the median at the trailing 60 s mean
    trailing = trailing_mean_sigma(x, 60)[0]
    causal = mae(future_sums(x, 5.0), np.where(np.isnan(trailing), np.nan, poisson.ppf(0.5, 5 * trailing)))
    assert causal >= floor * 0.99


def test_smoothed_rate_is_centred_and_shrinks_at_the_edges() -> None:
    x = np.array([0.0, 0.0, 9.0, 0.0, 0.0])
    r = smoothed_rate(x, 3)
    np.testing.assert_allclose(r, [0.0, 3.0, 3.0, 3.0, 0.0])
    with pytest.raises(ValueError, match="odd"):
        smoothed_rate(x, 4)
