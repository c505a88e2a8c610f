"""The ramp detector (``stages.ramp_fit``, ``stages.trend_factor``): seeded Poisson arrival rates, one
sample per second, as the policy's rate history holds them. A ramp is seen within a bounded time of its
start; constant traffic, a step and a burst are not ramps; the projection is monotone in the lead and capped."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, obs

from controller.policy import stages
from controller.policy.stages import Need

LEAD_S = 120.0


def _first_detection(rates: np.ndarray, seed: int, start_s: int = 0) -> int | None:
    """Feed Poisson counts of ``rates`` (one per second) through the rate history; the first second at or
    after ``start_s`` whose trend factor is above 1, or None."""
    counts = np.random.default_rng(seed).poisson(rates)
    history: tuple[tuple[float, float], ...] = ()
    for t, c in enumerate(counts):
        history = stages.update_rate_history(history, float(t), float(c))
        if t >= start_s:
            factor, why = stages.trend_factor(history, float(t), LEAD_S)
            if why is not None:
                assert factor > 1.0
                return t
    return None


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    ("label", "base", "slope", "within_s"),
    [
        # the 600-s sinusoid's mid-rise slope (11.5 × 2π / 600 ≈ 0.12 req/s per s) from 4 req/s
        ("steep ramp", 4.0, 0.12, 60),
        # 2 → 24 req/s over 600 s (2.2 req/s per min)
        ("moderate ramp", 2.0, 22.0 / 600.0, 120),
    ],
)
def test_a_ramp_is_seen_within_a_bound(
    label: str, base: float, slope: float, within_s: int, seed: int
) -> None:
    flat_s = 150
    t = np.arange(flat_s + 300, dtype=np.float64)
    rates = base + slope * np.clip(t - flat_s, 0.0, None)
    seen = _first_detection(rates, seed)
    assert seen is not None, label
    assert flat_s < seen <= flat_s + within_s, f"{label}: seen at {seen} s, ramp from {flat_s} s"


@pytest.mark.parametrize("rate", [1.0, 5.0, 30.0])
def test_constant_poisson_traffic_is_not_a_ramp(rate: float) -> None:
    assert _first_detection(np.full(1200, rate), seed=int(rate)) is None


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
def test_a_step_or_a_burst_is_not_a_ramp(
    label: str, low: float, high: float, lasts_s: int, seed: int
) -> None:
    at = 200
    t = np.arange(at + 240)
    rates = np.where((t >= at) & (t < at + lasts_s), high, low)
    assert _first_detection(rates, seed, start_s=at - 30) is None, label


def test_ramp_fit_recovers_a_line_and_tells_a_step() -> None:
    line = tuple((float(t), 20.0 + 0.2 * (t - 100)) for t in range(40, 101))
    fit = stages.ramp_fit(line, 100.0, 60.0)  # the window (40, 100]: 60 samples
    assert fit is not None
    assert fit.slope == pytest.approx(0.2) and fit.level == pytest.approx(20.0)
    assert not fit.step_fits_better
    # noise-free: the Poisson floor (mean rate / 1-s spacing) is the standard error's variance
    mean = 20.0 - 0.2 * 29.5
    assert fit.se == pytest.approx(math.sqrt(mean / sum((t - 70.5) ** 2 for t in range(41, 101))))
    step = tuple((float(t), 4.0 if t < 80 else 24.0) for t in range(40, 101))
    fit = stages.ramp_fit(step, 100.0, 60.0)
    assert fit is not None and fit.slope > 0 and fit.step_fits_better


@pytest.mark.parametrize(
    ("label", "history"),
    [
        ("too few samples", tuple((float(t), float(t)) for t in range(95, 101))),
        ("a gap: samples span too little of the window", tuple((float(t), float(t)) for t in range(80, 101))),
    ],
)
def test_ramp_fit_needs_a_covered_window(label: str, history: tuple[tuple[float, float], ...]) -> None:
    assert stages.ramp_fit(history, 100.0, 60.0) is None, label


def test_with_trend_adds_the_queue_to_decode_on_a_ramp_only() -> None:
    need = Need(prefill=2.0, decode=3.0, running_seqs=10.0, reasons=())
    queued = stages.queued_decode(obs(waiting_requests=128.0), CAP)
    assert queued == pytest.approx(128.0 / CAP.decode_seqs)
    ramp = stages.with_trend(need, 2.0, queued)
    assert ramp.prefill == 4.0 and ramp.decode == pytest.approx(6.0 + queued)
    assert stages.with_trend(need, 1.0, queued) == need  # no ramp: the queue is capacity_target's business
    assert stages.queued_decode(obs(waiting_requests=math.nan), CAP) == 0.0


@settings(max_examples=100, deadline=None)
@given(
    slope=st.floats(-1.0, 5.0),
    base=st.floats(0.0, 500.0),
    wiggle=st.floats(0.0, 50.0),
    leads=st.tuples(st.floats(0.0, 3600.0), st.floats(0.0, 3600.0)),
)
def test_trend_factor_is_monotone_in_the_lead_and_capped(
    slope: float, base: float, wiggle: float, leads: tuple[float, float]
) -> None:
    history = tuple(
        (float(t), max(base + slope * (t - 200) + wiggle * math.sin(t / 3.0), 0.0)) for t in range(60, 201)
    )
    short, long = sorted(leads)
    f_short, _ = stages.trend_factor(history, 200.0, short)
    f_long, why = stages.trend_factor(history, 200.0, long)
    assert 1.0 <= f_short <= f_long <= stages.MAX_TREND_FACTOR
    assert (why is None) == (f_long == 1.0)
