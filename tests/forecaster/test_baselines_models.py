"""Baselines (forecaster/baselines.py): stepping equals the offline path, masking holds, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from forecaster.baselines import (
    EWMA,
    Arima,
    CountBaseline,
    Holt,
    LastValue,
    SeasonalNaive,
    count_exceed_prob,
    count_quantile,
    make_baselines,
)
from forecaster.features import future_sums
from forecaster.scoring import coverage
from forecaster.types import CHANNELS, Forecaster

T = 360


def _models() -> list[CountBaseline]:
    return [
        LastValue(),
        EWMA(halflife_s=8.0),
        Holt(alpha=0.3, beta=0.1),
        SeasonalNaive(period_s=90),
        Arima(order=(1, 1), window_s=150, refit_every_s=150, min_fit_s=80, innov_s=40),
    ]


def _series(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rate = np.where((np.arange(T) // 45) % 3 == 0, 9.0, 2.0)
    x = rng.poisson(rate).astype(float)
    x[100:107] = np.nan  # an outage
    return x


def _step_all(model: CountBaseline, x: np.ndarray) -> dict[str, np.ndarray]:
    """Two nodes: node 0 sees ``x`` (tokens = 50 x, 3 x); node 1 is masked on its odd seconds."""
    model.reset(["a", "b"])
    out: dict[str, list[float]] = {k: [] for k in ("p50", "p90", "burst", "tok50", "b_p50")}
    for t in range(len(x)):
        v = np.full((2, len(CHANNELS)), np.nan)
        v[:, 0], v[:, 1], v[:, 2] = x[t], 50 * x[t], 3 * x[t]
        m = ~np.isnan(v)
        m[1] &= t % 2 == 0
        v[:, 3:] = 7.0  # channels baselines ignore
        fb = model.step(v, m)
        out["p50"].append(fb.arrivals_p50[0])
        out["p90"].append(fb.arrivals_p90[0])
        out["burst"].append(fb.burst_prob[0])
        out["tok50"].append(fb.prompt_tokens_p50[0])
        out["b_p50"].append(fb.arrivals_p50[1])
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.name)
def test_stepping_equals_predict_series(model: CountBaseline) -> None:
    x = _series(1)
    p50, p90, burst = model.predict_series(x)
    got = _step_all(model, x)
    np.testing.assert_array_equal(got["p50"], p50)
    np.testing.assert_array_equal(got["p90"], p90)
    np.testing.assert_allclose(got["burst"], burst, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(got["tok50"], model.predict_series(50 * x)[0])
    # node 1 saw only even seconds; a masked second holds the last forecast
    thinned = np.where(np.arange(T) % 2 == 0, x, np.nan)
    np.testing.assert_array_equal(got["b_p50"], model.predict_series(thinned)[0])
    assert np.isfinite(p50[-50:]).all()


def test_the_standard_set_is_in_report_order() -> None:
    names = [m.name for m in make_baselines()]
    assert names == ["last_value", "ewma", "holt", "seasonal_naive", "arima"]
    assert "arima" not in [m.name for m in make_baselines(with_arima=False)]


def test_baselines_satisfy_the_forecaster_protocol() -> None:
    for m in _models():
        f: Forecaster = m
        assert f.horizon_s == 5.0
    m = Holt()
    m.reset(["a"])
    fb = m.step(
        np.ones((1, len(CHANNELS))), np.ones((1, len(CHANNELS)), bool), now_s=1.7e9
    )  # as the controller calls it
    assert fb.node_ids == ("a",) and np.isnan(fb.arrivals_p50[0])  # warm-up: unknown, not zero


def test_warm_up_is_nan_until_the_trailing_window_is_full() -> None:
    p50, _, burst = EWMA().predict_series(np.ones(100))
    assert np.isnan(p50[:59]).all() and np.isnan(burst[:59]).all()
    assert np.isfinite(p50[59:]).all()


def test_unknown_is_held_not_read_as_zero() -> None:
    x = np.full(120, 10.0)
    x[80:] = np.nan
    p50, _p90, _ = EWMA().predict_series(x)
    assert p50[119] == p50[79] > 0
    m = LastValue()
    m.reset(["n"])
    for _ in range(80):
        fb = m.step(np.full((1, len(CHANNELS)), 10.0), np.ones((1, len(CHANNELS)), bool))
    before = fb.arrivals_p50[0]
    fb = m.step(np.zeros((1, len(CHANNELS))), np.zeros((1, len(CHANNELS)), bool))
    assert fb.arrivals_p50[0] == before == 50.0


def test_point_forecasts_follow_their_definitions() -> None:
    x = np.arange(200, dtype=float) % 7
    lv = LastValue().predict_mean_series(x)
    assert lv[150] == x[146:151].sum()
    sn = SeasonalNaive(period_s=60).predict_mean_series(x)
    assert sn[150] == x[91:96].sum()
    holt = Holt(alpha=0.5, beta=0.2).predict_mean_series(np.arange(100, dtype=float))
    assert holt[99] == pytest.approx(sum(100 + h for h in range(5)), rel=0.05)  # follows the trend


def test_p90_of_a_poisson_stream_covers_about_ninety_percent() -> None:
    rng = np.random.default_rng(7)
    x = rng.poisson(4.0, 4000).astype(float)
    _, p90, _ = EWMA(halflife_s=30).predict_series(x)
    cover = coverage(future_sums(x, 5.0), p90)
    assert 0.85 <= cover <= 0.97


def test_distribution_helpers() -> None:
    assert count_quantile(np.array([0.0]), np.array([3.0]), 0.9)[0] == 0
    assert np.isnan(count_quantile(np.array([np.nan]), np.array([1.0]), 0.9)[0])
    # over-dispersion widens the p90 at the same mean
    assert (
        count_quantile(np.array([20.0]), np.array([4.0]), 0.9)[0]
        > count_quantile(np.array([20.0]), np.array([1.0]), 0.9)[0]
    )
    assert count_exceed_prob(np.array([0.0]), np.array([0.0]), np.array([1.0]))[0] == 0.0
    assert count_exceed_prob(np.array([10.0]), np.array([20.0]), np.array([1.0]))[0] > 0.9


def test_step_rejects_a_wrong_shape() -> None:
    m = EWMA()
    m.reset(["a", "b"])
    with pytest.raises(ValueError, match=r"\[2, 10\]"):
        m.step(np.zeros((3, len(CHANNELS))), np.ones((3, len(CHANNELS)), bool))


def test_importing_baselines_loads_neither_torch_nor_statsmodels_nor_scipy() -> None:
    code = (
        "import sys, forecaster.baselines, forecaster.burst, forecaster.scoring\n"
        "bad = [m for m in ('torch', 'statsmodels', 'scipy') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_count_distribution_matches_scipy_stats() -> None:
    from scipy.stats import nbinom, poisson

    rng = np.random.default_rng(0)
    mu = rng.gamma(0.5, 40.0, 5000)
    d = np.where(rng.random(5000) < 0.3, 1.0, 1.0 + rng.gamma(1.0, 3.0, 5000))
    n, p = mu / np.maximum(d - 1.0, 1e-300), 1.0 / d
    pois = d <= 1.0
    for q in (0.5, 0.9):
        want = np.where(pois, poisson.ppf(q, mu), nbinom.ppf(q, n, p))
        np.testing.assert_array_equal(count_quantile(mu, d, q), want)
    lim = rng.integers(0, 100, 5000).astype(float)
    want = np.where(pois, poisson.sf(lim, mu), nbinom.sf(lim, n, p))
    np.testing.assert_allclose(count_exceed_prob(lim, mu, d), want, atol=1e-10)
