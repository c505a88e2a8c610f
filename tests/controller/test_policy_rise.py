"""The Poisson log-linear rise test (``controller.policy.rise``) and its place in ``decide``
(``PolicyConfig.trend_test='poisson'``): seeded Poisson arrival counts, one per second, as the policy's rate
history holds them. Constant traffic rarely reads a rise; a linear and a convex rise are read within a bound,
the convex one before the line detector reads it; steps and bursts are not rises; the factor is in [1, cap]
for any history; the fit recovers a known growth; the config field is validated by name."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import rise, stages
from controller.policy.decide import PolicyContext, decide
from controller.policy.types import PoolState

LEAD_S = 120.0
History = tuple[tuple[float, float], ...]


Detector = Callable[[History, float, float], tuple[float, str | None]]


def _fires(counts: np.ndarray, detector: Detector = rise.rise_factor) -> list[int]:
    """The seconds at which ``detector`` reads a rise, feeding ``counts`` one per second."""
    history: History = ()
    out = []
    for t, c in enumerate(counts):
        history = stages.update_rate_history(history, float(t), float(c))
        factor, why = detector(history, float(t), LEAD_S)
        if why is not None:
            assert factor > 1.0
            out.append(t)
    return out


@settings(max_examples=10, deadline=None)
@given(rate=st.floats(0.2, 40.0), seed=st.integers(0, 2**31 - 1))
def test_constant_poisson_traffic_rarely_reads_a_rise(rate: float, seed: int) -> None:
    # measured: 33 of 150,000 seconds over 250 streams of 600 s (rates 0.2-40 req/s), at most 5 in one
    counts = np.random.default_rng(seed).poisson(rate, 600)
    assert len(_fires(counts)) <= 12  # 2 % of the seconds


@pytest.mark.parametrize("rate", [1.0, 4.0, 24.0])
def test_false_alarms_on_constant_traffic_are_bounded_over_many_streams(rate: float) -> None:
    fired = sum(len(_fires(np.random.default_rng(seed).poisson(rate, 600))) for seed in range(5))
    assert fired <= 15  # 0.5 % of 3,000 seconds


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("label", "rate", "within_s"),
    [
        # 2 → 24 req/s over 600 s (2.2 req/s per min) after 150 s flat
        ("linear rise", lambda t: 2.0 + 22.0 / 600.0 * np.clip(t - 150.0, 0.0, None), 120),
        # the 1 <-> 24 req/s sinusoid of period 600 s leaving its trough at 150 s (convex: flat, then up)
        (
            "convex rise",
            lambda t: 12.5 - 11.5 * np.cos(2 * np.pi * np.clip(t - 150.0, 0.0, None) / 600.0),
            120,
        ),
    ],
)
def test_a_rise_is_read_within_a_bound(
    label: str, rate: Callable[[np.ndarray], np.ndarray], within_s: int, seed: int
) -> None:
    counts = np.random.default_rng(seed).poisson(rate(np.arange(450.0)))
    seen = [t for t in _fires(counts) if t >= 140]
    assert seen, label
    assert 150 < seen[0] <= 150 + within_s, f"{label}: read at {seen[0]} s, rise from 150 s"


def test_a_convex_rise_is_read_before_the_line_detector_reads_it() -> None:
    # noise-free counts (the Poisson floor sets the evidence): the line's step test calls the flat-then-up
    # start of a convex rise a step; the exponential follows it
    rates = 1.0 + 6.3e-4 * np.arange(200.0) ** 2
    by_rise = _fires(rates)
    by_line = _fires(rates, stages.trend_factor)
    assert by_rise, "never read"
    assert not by_line or by_rise[0] < by_line[0]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("label", "low", "high", "lasts_s"),
    [
        ("step 4 → 24 req/s", 4.0, 24.0, 10_000),
        ("step 4 → 8 req/s", 4.0, 8.0, 10_000),
        ("20-s burst ×6", 4.0, 24.0, 20),
        ("45-s burst ×4", 3.0, 12.0, 45),
    ],
)
def test_a_step_or_a_burst_is_not_a_rise(
    label: str, low: float, high: float, lasts_s: int, seed: int
) -> None:
    at = 200
    t = np.arange(at + 240)
    counts = np.random.default_rng(seed).poisson(np.where((t >= at) & (t < at + lasts_s), high, low))
    # while the change is inside the longest window (later seconds are constant traffic, bounded above)
    near = max(rise.RISE_WINDOWS_S) + max(rise.RISE_CONFIRM_S)
    assert not [s for s in _fires(counts[: int(at + near)]) if s >= at - 30], label


def test_rise_fit_recovers_a_known_growth() -> None:
    history = tuple((float(t), 5.0 * math.exp(0.02 * (t - 100))) for t in range(41, 101))
    fit = rise.rise_fit(history, 100.0, 60.0)
    assert fit is not None
    assert fit.growth == pytest.approx(0.02, rel=1e-6) and fit.level == pytest.approx(5.0, rel=1e-6)
    assert fit.dispersion == 1.0 and not fit.step_fits_better and fit.z > rise.RISE_MIN_Z
    assert fit.factor(50.0) == pytest.approx(math.exp(1.0))
    assert fit.factor(LEAD_S) == rise.MAX_RISE_FACTOR  # exp(2.4) > 4: capped
    step = tuple((float(t), 4.0 if t < 80 else 24.0) for t in range(41, 101))
    fit = rise.rise_fit(step, 100.0, 60.0)
    assert fit is not None and fit.step_fits_better


@pytest.mark.parametrize(
    ("label", "history"),
    [
        ("too few samples", tuple((float(t), float(t)) for t in range(95, 101))),
        ("a gap", tuple((float(t), float(t)) for t in range(80, 101))),
        ("falling", tuple((float(t), 200.0 - t) for t in range(40, 101))),
        ("all zero", tuple((float(t), 0.0) for t in range(40, 101))),
    ],
)
def test_rise_fit_reads_no_rise(label: str, history: History) -> None:
    assert rise.rise_fit(history, 100.0, 60.0) is None, label


_rate = st.one_of(st.floats(0.0, 1e4), st.sampled_from([math.nan, math.inf, -1.0]))


@settings(max_examples=150, deadline=None)
@given(
    samples=st.lists(st.tuples(st.floats(0.0, 200.0), _rate), min_size=0, max_size=150),
    lead_s=st.floats(0.0, 3600.0),
)
def test_rise_factor_is_in_bounds_for_any_history(samples: list[tuple[float, float]], lead_s: float) -> None:
    factor, why = rise.rise_factor(tuple(samples), 200.0, lead_s)
    assert 1.0 <= factor <= rise.MAX_RISE_FACTOR
    assert (why is None) == (factor == 1.0)


def test_trend_test_is_validated_by_name() -> None:
    with pytest.raises(ValidationError, match="trend_test"):
        PolicyConfig(trend_test="quadratic")
    assert PolicyConfig().trend_test == "line"


def _run(cfg: PolicyConfig, rates: np.ndarray) -> list[tuple[str, ...]]:
    """Reasons of ``decide`` fed the arrival rate ``rates`` (one tick per second, ISL 2000, OSL 200)."""
    state = PoolState()
    out = []
    for t, r in enumerate(rates):
        o = obs(now_s=float(t), arrival_rps=float(r), prompt_tps=float(r) * 2000.0, gen_tps=float(r) * 200.0)
        plan, state = decide(PolicyContext(o, CAP, cfg, 1000.0, 50.0), state)
        assert plan is not None
        out.append(plan.reasons)
    return out


def test_decide_reads_the_convex_rise_only_when_asked() -> None:
    rates = 1.0 + 6.3e-4 * np.arange(120.0) ** 2
    line = _run(PolicyConfig(), rates)
    poisson = _run(PolicyConfig(trend_test="poisson"), rates)
    first = next(t for t, why in enumerate(poisson) if any(r.startswith("rise:") for r in why))
    assert not any(r.startswith("rise:") for why in line for r in why)
    assert all(p == q for p, q in zip(line[:first], poisson[:first], strict=True))  # the same until then
