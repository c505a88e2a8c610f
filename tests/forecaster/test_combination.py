"""forecaster/combination.py: the online combination of the network with EWMA, Holt and last value."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.baselines import count_quantile, fast_count_quantiles
from forecaster.combination import (
    EXPERTS,
    CombinationConfig,
    CombinedForecaster,
    OnlineCombination,
    observed_values,
)
from forecaster.features import future_sums
from forecaster.types import CHANNELS, TARGETS, ForecastBatch

if TYPE_CHECKING:
    from forecaster.streaming import SequenceForecast

H = 5
Rule = Literal["exp", "best"]
ARR = CHANNELS.index("arrival_rps")
RATES = [CHANNELS.index(c) for c in ("arrival_rps", "prompt_tps", "gen_tps")]


@dataclass(frozen=True, eq=False)
class _Seq:
    """The parts of ``forecaster.streaming.SequenceForecast`` that ``combine_sequence`` reads."""

    node_ids: tuple[str, ...]
    horizon_s: float
    quantiles: tuple[float, ...]
    targets: tuple[str, ...]
    totals: np.ndarray
    burst_prob: np.ndarray
    model_version: str


class Scripted:
    """A stand-in network: its forecast after step ``t`` is ``table[:, t]`` (``[N, T, 3, 2]``), both when
    stepped and offline, so that the combination's two paths can be compared exactly."""

    name = "scripted"
    horizon_s = float(H)

    def __init__(self, table: np.ndarray, burst: np.ndarray | None = None) -> None:
        self.table = table
        self.burst = burst if burst is not None else np.full(table.shape[:2], 0.25)
        self.t = 0
        self.ids: tuple[str, ...] = ()

    def reset(self, node_ids: Sequence[str]) -> None:
        self.ids, self.t = tuple(node_ids), 0

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        f = self.table[:, self.t]
        b = self.burst[:, self.t]
        self.t += 1
        return ForecastBatch(
            self.ids,
            self.horizon_s,
            f[:, 0, 0],
            f[:, 0, 1],
            f[:, 1, 0],
            f[:, 1, 1],
            f[:, 2, 0],
            f[:, 2, 1],
            b,
            "s",
        )

    def predict_sequence(self, x: np.ndarray, mask: np.ndarray, times_s: np.ndarray) -> _Seq:
        n, t = x.shape[:2]
        return _Seq(
            tuple(map(str, range(n))), self.horizon_s, (0.5, 0.9), TARGETS, self.table[:, :t], self.burst, "s"
        )


def _inputs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``counts [N, T]`` of arrivals → raw inputs ``[N, T, C]`` with tokens at 100 / 10 per request."""
    x = np.full((*counts.shape, len(CHANNELS)), np.nan)
    x[..., RATES[0]], x[..., RATES[1]], x[..., RATES[2]] = counts, 100.0 * counts, 10.0 * counts
    return x, np.isfinite(x)


def _oracle(counts: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """A network that knows the future (``scale`` times the true next-H totals), p90 = p50 * 1.2."""
    fut = future_sums(counts, float(H))
    fut = np.where(np.isnan(fut), np.nanmean(fut), fut) * scale
    table = np.empty((*counts.shape, 3, 2))
    for k, per in enumerate((1.0, 100.0, 10.0)):
        table[..., k, 0] = fut * per
        table[..., k, 1] = fut * per * 1.2
    return table


def _run(fc: CombinedForecaster, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Step ``fc`` over ``x [N, T, C]`` → arrivals ``[N, T, 2]`` (p50, p90) and record the weights."""
    n, t = x.shape[:2]
    fc.reset([f"n{i}" for i in range(n)])
    out = np.empty((n, t, 2))
    for i in range(t):
        b = fc.step(x[:, i], mask[:, i], now_s=1.7e9 + i)
        out[:, i, 0], out[:, i, 1] = b.arrivals_p50, b.arrivals_p90
    return out


def _mae(pred: np.ndarray, counts: np.ndarray, lo: int) -> float:
    y = future_sums(counts, float(H))
    ok = ~np.isnan(y) & ~np.isnan(pred)
    ok[:lo] = False
    return float(np.mean(np.abs(pred[ok] - y[ok])))


@pytest.fixture(scope="module")
def poisson() -> np.ndarray:
    rng = np.random.default_rng(3)
    t = np.arange(1500)
    rate = 8.0 + 6.0 * np.sin(2 * np.pi * t / 400.0)
    counts: np.ndarray = rng.poisson(rate).astype(np.float64)[None]
    return counts


@pytest.mark.parametrize("rule", ["exp", "best"])
def test_a_clearly_bad_network_loses_its_weight_to_the_baselines(poisson: np.ndarray, rule: Rule) -> None:
    x, mask = _inputs(poisson)
    bad = _oracle(poisson, scale=3.0)  # always three times too high
    fc = CombinedForecaster(Scripted(bad), CombinationConfig(rule=rule))
    out = _run(fc, x, mask)
    w = fc.weights[0]
    assert w[0].max() < 0.01, w[:, 0]  # the network's weight, every channel and output
    raw = _mae(bad[0, :, 0, 0], poisson[0], 300)
    comb = _mae(out[0, :, 0], poisson[0], 300)
    assert comb < 0.4 * raw, (comb, raw)


@pytest.mark.parametrize("rule", ["exp", "best"])
def test_a_clearly_better_network_keeps_its_weight(poisson: np.ndarray, rule: Rule) -> None:
    x, mask = _inputs(poisson)
    good = _oracle(poisson)  # knows the future exactly
    fc = CombinedForecaster(Scripted(good), CombinationConfig(rule=rule))
    out = _run(fc, x, mask)
    assert fc.weights[0, 0, :, 0].min() > 0.99  # p50: all on the network, every channel
    assert _mae(out[0, :, 0], poisson[0], 300) < 0.05 * _mae(good[0, :, 0, 0] * 3, poisson[0], 300)


def test_targets_not_combined_keep_the_networks_forecast(poisson: np.ndarray) -> None:
    x, mask = _inputs(poisson)
    bad = _oracle(poisson, scale=3.0)
    fc = CombinedForecaster(Scripted(bad), CombinationConfig(targets=("arrivals",)))
    fc.reset(["a"])
    for i in range(poisson.shape[1]):
        b = fc.step(x[:, i], mask[:, i])
        np.testing.assert_array_equal(b.prompt_tokens_p90, bad[:, i, 1, 1])
        np.testing.assert_array_equal(b.gen_tokens_p50, bad[:, i, 2, 0])
    assert fc.weights[0, 0, 0].max() < 0.01  # arrivals: the baselines took over


def test_the_network_alone_until_the_baselines_have_scored(poisson: np.ndarray) -> None:
    x, mask = _inputs(poisson[:, :60])
    table = _oracle(poisson[:, :60], scale=2.0)
    cfg = CombinationConfig(warmup_s=30, min_scored=30)
    out = _run(CombinedForecaster(Scripted(table), cfg), x, mask)
    # a baseline forecasts from its 30th observation and has 30 realised targets 35 steps later at the earliest
    np.testing.assert_array_equal(out[0, :, 0], table[0, :, 0, 0])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rule=st.sampled_from(("exp", "best")),
    eta=st.floats(0.5, 50.0),
    nan_frac=st.floats(0.0, 0.5),
)
def test_weights_are_a_convex_combination(seed: int, rule: Rule, eta: float, nan_frac: float) -> None:
    rng = np.random.default_rng(seed)
    n, t = 4, 120
    counts = rng.poisson(rng.uniform(0.0, 30.0, (n, 1)), (n, t)).astype(np.float64)
    counts[rng.random((n, t)) < nan_frac] = np.nan
    net = rng.gamma(2.0, 10.0, (n, t, 3, 2))
    net[rng.random((n, t)) < 0.05] = np.nan
    state = OnlineCombination(n, H, CombinationConfig(rule=rule, eta=eta, warmup_s=5, min_scored=3))
    vals = observed_values(*_inputs(counts))
    for i in range(t):
        out = state.update(vals[:, i], net[:, i])
        w = state.weights
        assert np.all(w >= 0) and np.all(np.isfinite(w))
        np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=1e-12)  # expert-major [E, N, C, Q]
        experts = state.pending[i % H]  # what was combined this step
        f = np.where(w > 0, experts, np.nan)
        known = np.isfinite(out)
        assert np.array_equal(known, np.isfinite(net[:, i]))  # a forecast exactly where the network has one
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: no forecast, checked above
            lo, hi = np.nanmin(f, axis=0), np.nanmax(f, axis=0)
        assert np.all(out[..., 0][known[..., 0]] >= lo[..., 0][known[..., 0]] - 1e-9)
        assert np.all(out[..., 0][known[..., 0]] <= hi[..., 0][known[..., 0]] + 1e-9)


def test_streaming_equals_offline_exactly() -> None:
    rng = np.random.default_rng(11)
    n, t = 3, 400
    counts = rng.poisson([[2.0], [15.0], [0.3]], (n, t)).astype(np.float64)
    counts[1, 150:170] = np.nan  # an outage
    x, mask = _inputs(counts)
    table = rng.gamma(3.0, 5.0, (n, t, 3, 2))
    table[2, 200:230] = np.nan  # the network has nothing for a while
    for cfg in (CombinationConfig(), CombinationConfig(rule="best", halflife_s=20.0)):
        inner = Scripted(table)
        fc = CombinedForecaster(inner, cfg)
        stepped = _run(fc, x, mask)
        raw = cast("SequenceForecast", inner.predict_sequence(x, mask, np.arange(t)))
        seq, w = fc.combine_sequence(x, mask, raw, return_weights=True)
        np.testing.assert_array_equal(stepped[..., 0], seq.totals[..., 0, 0])
        np.testing.assert_array_equal(stepped[..., 1], seq.totals[..., 0, 1])
        np.testing.assert_array_equal(w[:, -1], fc.weights)


def test_unknown_inputs_are_not_zero() -> None:
    counts = np.full((1, 400), 10.0)
    counts[0, 200:260] = np.nan  # an outage of a minute
    x, mask = _inputs(counts)
    mask[0, 250:260, RATES[0]] = False  # and a masked (but finite) stretch: also unknown
    x[0, 250:260, RATES[0]] = 0.0
    table = _oracle(np.full((1, 400), 10.0), scale=1.5)  # the network: 75 for a true 50
    fc = CombinedForecaster(Scripted(table))
    fc.reset(["a"])
    scored_before = None
    for i in range(400):
        b = fc.step(x[:, i], mask[:, i])
        if i == 199:
            scored_before = fc.state.loss_count.copy()
        if 200 + H <= i < 260:
            # nothing realised in the outage: no expert is scored, and no baseline drifts towards zero
            np.testing.assert_array_equal(fc.state.loss_count, scored_before)
            assert b.arrivals_p50[0] >= 50.0 - 1e-9
    assert abs(b.arrivals_p50[0] - 50.0) < 1.0  # the baselines' 50 won, before and after the outage
    table[0, 300:] = np.nan  # the network goes stale: no forecast, whatever the baselines say
    fc = CombinedForecaster(Scripted(table))
    out = _run(fc, x, mask)
    assert np.isnan(out[0, 300:]).all() and np.isfinite(out[0, 100:300]).all()


def test_burst_prob_is_the_networks() -> None:
    counts = np.random.default_rng(1).poisson(4.0, (2, 120)).astype(np.float64)
    x, mask = _inputs(counts)
    burst = np.random.default_rng(2).random((2, 120))
    fc = CombinedForecaster(Scripted(_oracle(counts, 2.0), burst))
    fc.reset(["a", "b"])
    for i in range(120):
        b = fc.step(x[:, i], mask[:, i])
        np.testing.assert_array_equal(b.burst_prob, burst[:, i])
        assert fc.last_raw is not None and b.model_version == "s+combination"


def test_the_learned_network_streams_as_it_combines_offline() -> None:
    torch = pytest.importorskip("torch")
    from forecaster.features import DEFAULT_SCHEMA, Normalizer
    from forecaster.network import LstmAttentionNet
    from forecaster.streaming import LearnedForecaster

    torch.manual_seed(0)
    lf = LearnedForecaster(
        LstmAttentionNet(DEFAULT_SCHEMA.n_inputs),
        DEFAULT_SCHEMA,
        Normalizer.identity(DEFAULT_SCHEMA),
        5.0,
        "tiny",
    )
    rng = np.random.default_rng(4)
    counts = rng.poisson(3.0, (2, 200)).astype(np.float64)
    x, mask = _inputs(counts)
    full_x = np.where(np.isfinite(x), x, 0.0)
    times = 1.7e9 + np.arange(200.0)
    fc = CombinedForecaster(lf, CombinationConfig(warmup_s=10, min_scored=10))
    fc.reset(["a", "b"])
    stepped = np.array([fc.step(full_x[:, i], mask[:, i], times[i]).arrivals_p50 for i in range(200)]).T
    offline = fc.predict_sequence(full_x, mask, times).get("arrivals", 0.5)
    np.testing.assert_allclose(stepped, offline, rtol=1e-4, atol=1e-3)


def test_bad_settings_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match=r"halflife_s must be > 0.*rule must be"):
        CombinationConfig(halflife_s=0.0, rule="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="horizon_s"):
        OnlineCombination(1, 2.5)


def test_the_module_does_not_import_torch() -> None:
    code = "import sys, forecaster.combination\nassert 'torch' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_expert_names_match_the_weight_axis() -> None:
    assert EXPERTS[0] == "network" and OnlineCombination(2, H).weights.shape == (len(EXPERTS), 2, 3, 2)


# fast_count_quantiles: the baselines' spread, every tick


@pytest.mark.parametrize("dispersion", [1.0, 1.3, 2.0, 5.0, 20.0, 1e3])
def test_fast_quantiles_are_exact_for_small_counts(dispersion: float) -> None:
    from scipy import stats

    mu = np.linspace(0.0, 12.0, 481)
    fast = fast_count_quantiles(mu, np.full_like(mu, dispersion), (0.5, 0.9))
    for j, q in enumerate((0.5, 0.9)):
        exact = count_quantile(mu, np.full_like(mu, dispersion), q)
        d = dispersion
        cdf_below = (
            stats.poisson.cdf(exact - 1, mu) if d == 1.0 else stats.nbinom.cdf(exact - 1, mu / (d - 1), 1 / d)
        )
        clear = (exact < 8) & (np.abs(cdf_below - q) > 1e-9)  # an exact tie has two right answers
        np.testing.assert_array_equal(fast[clear, j], exact[clear])


def _expected_pinball(k: np.ndarray, pk: np.ndarray, p: float, q: float) -> float:
    e = k - p
    return float(np.sum(pk * np.maximum(q * e, (q - 1) * e)))


@pytest.mark.parametrize(
    ("dispersion", "tol"), [(1.0, 0.01), (2.0, 0.01), (20.0, 0.01), (1e3, 0.05), (1e4, 0.05)]
)
def test_fast_quantiles_lose_little_pinball_loss_for_large_counts(dispersion: float, tol: float) -> None:
    from scipy import stats

    d = dispersion
    for mu in np.geomspace(10.0, 3e5, 12):
        dist = stats.poisson(mu) if d == 1.0 else stats.nbinom(mu / (d - 1), 1 / d)
        k = np.unique(np.linspace(0, dist.ppf(1 - 1e-7), 20001).round())
        pk = np.diff(np.concatenate([[0.0], dist.cdf(k)]))
        for q in (0.5, 0.9):
            exact = count_quantile(np.array([mu]), np.array([d]), q)[0]
            fast = fast_count_quantiles(np.array([mu]), np.array([d]), (q,))[0, 0]
            loss_fast, loss_exact = (_expected_pinball(k, pk, p, q) for p in (fast, exact))
            assert loss_fast <= (1 + tol) * loss_exact + 1e-9, (mu, q, fast, exact)


def test_fast_quantiles_keep_unknown_unknown() -> None:
    out = fast_count_quantiles(np.array([np.nan, 1.0, 0.0, -3.0]), np.array([1.0, np.nan, 2.0, 1.0]))
    assert np.isnan(out[:2]).all()
    np.testing.assert_array_equal(out[2:], 0.0)
