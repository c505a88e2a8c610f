"""The arrival forecast's online recalibration (``PolicyConfig.arrival_calibration``, controller.policy.calibration):
coverage tracking on hand-built streams, its safety rules, and invariants over any input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, ctx, forecast, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolForecast, PoolObservation, PoolState, ScalingPlan, decide
from controller.policy.calibration import CalibrationParams, calibrated_forecast, update_calibration
from controller.policy.types import ArrivalCalibration

H = 5.0  # the fixtures' forecast horizon


def arrivals_forecast(p50_rps: float, p90_rps: float) -> PoolForecast:
    return PoolForecast(
        horizon_s=H,
        arrivals_p50=p50_rps * H,
        arrivals_p90=p90_rps * H,
        prompt_tokens_p90=1e4 * H,
        gen_tokens_p90=2e3 * H,
        burst_prob=0.0,
    )


def run_stream(
    counts: np.ndarray, fc: PoolForecast, params: CalibrationParams, tick_s: float = 1.0
) -> tuple[ArrivalCalibration, list[tuple[float, float, float]]]:
    """Feed per-tick arrival counts with a fixed forecast; returns the final state and, per tick, (time, issued
    p50 rate, issued p90 rate) as the calibration would have issued them (before any floor)."""
    cal = ArrivalCalibration()
    issued = []
    for i, n in enumerate(counts):
        now = (i + 1) * tick_s
        cal = update_calibration(cal, now, float(n) / tick_s, fc, params)
        s50, s90 = cal.scales()
        issued.append((now, fc.rate(fc.arrivals_p50) * s50, fc.rate(fc.arrivals_p90) * s90))
    return cal, issued


def coverage_of(
    counts: np.ndarray, issued: list[tuple[float, float, float]], start: int
) -> tuple[float, float]:
    """Fraction of 5-tick windows (1-s ticks) whose counted arrivals stay at or under the issued quantiles."""
    covered50 = covered90 = total = 0
    for i in range(start, len(counts) - int(H)):
        actual = counts[i + 1 : i + 1 + int(H)].sum() / H
        covered50 += actual <= issued[i][1]
        covered90 += actual <= issued[i][2]
        total += 1
    return covered50 / total, covered90 / total


@pytest.mark.parametrize(
    ("label", "bias"),
    [("over-forecast 2.5 ×", 2.5), ("over-forecast 1.6 ×", 1.6), ("a calibrated p90", 1.0)],
)
def test_converges_to_the_target_coverage_on_a_stationary_poisson_stream(label: str, bias: float) -> None:
    rng = np.random.default_rng(7)
    rate = 20.0
    counts = rng.poisson(rate, size=4000)
    true_p90 = float(np.quantile(rng.poisson(rate * H, size=200_000), 0.9)) / H
    fc = arrivals_forecast(rate * bias, true_p90 * bias)
    _, issued = run_stream(counts, fc, CalibrationParams(max_scale=2.0))
    cov50, cov90 = coverage_of(counts, issued, start=1000)
    assert cov90 == pytest.approx(0.9, abs=0.04), label
    assert cov50 == pytest.approx(0.5, abs=0.08), label
    # the issued p90 wanders around the true one (each miss steps it up, each covered window down)
    assert float(np.median([p90 for _, _, p90 in issued[1000:]])) == pytest.approx(true_p90, rel=0.05), label


def test_a_5s_tick_adapts_as_fast_as_a_1s_tick() -> None:
    """The step is per second of comparisons: the same stream seen at 1-s and 5-s ticks compares as many
    seconds and settles at the same issued p90 (the median over the last five minutes, within 10 %)."""
    rng = np.random.default_rng(3)
    counts = rng.poisson(20.0, size=1200)
    fc = arrivals_forecast(50.0, 60.0)
    fast, fast_issued = run_stream(counts, fc, CalibrationParams())
    slow, slow_issued = run_stream(counts.reshape(-1, 5).sum(axis=1), fc, CalibrationParams(), tick_s=5.0)
    assert slow.compared_s == pytest.approx(fast.compared_s, rel=0.02)
    settled_fast = float(np.median([p90 for t, _, p90 in fast_issued if t > 900]))
    settled_slow = float(np.median([p90 for t, _, p90 in slow_issued if t > 900]))
    assert settled_slow == pytest.approx(settled_fast, rel=0.1)
    assert settled_fast < 0.5 * fc.rate(fc.arrivals_p90)  # it did move


def test_nothing_applies_before_the_warmup() -> None:
    fc = arrivals_forecast(50.0, 60.0)
    params = CalibrationParams(warmup_s=60.0)
    cal, _ = run_stream(np.full(40, 20), fc, params)
    assert cal.compared_s < 60.0 and cal.scales()[1] < 1.0  # it learns, but does not apply yet
    assert calibrated_forecast(fc, cal, 20.0, params) == (fc, None)
    cal, _ = run_stream(np.full(120, 20), fc, params)
    scaled, why = calibrated_forecast(fc, cal, 20.0, params)
    assert scaled is not None and why is not None and "recalibrated" in why
    assert scaled.arrivals_p90 < fc.arrivals_p90


def test_no_downward_correction_while_decode_is_saturated() -> None:
    fc = arrivals_forecast(50.0, 60.0)
    params = CalibrationParams()
    cal, _ = run_stream(np.full(300, 20), fc, params)
    assert cal.scales()[1] < 1.0
    assert calibrated_forecast(fc, cal, 20.0, params, saturated=True) == (fc, None)
    cut, _ = calibrated_forecast(fc, cal, 20.0, params, saturated=False)
    assert cut is not None and cut.arrivals_p90 < fc.arrivals_p90


def test_an_under_forecast_is_raised_only_up_to_max_scale() -> None:
    fc = arrivals_forecast(5.0, 6.0)  # the stream runs at 20 req/s
    for most in (1.0, 1.5, 3.0):
        cal, _ = run_stream(np.full(600, 20), fc, CalibrationParams(max_scale=most))
        assert cal.scales()[1] == pytest.approx(most)
        scaled, _ = calibrated_forecast(fc, cal, math.nan, CalibrationParams(max_scale=most))
        assert scaled is not None and scaled.arrivals_p90 == pytest.approx(fc.arrivals_p90 * most)


def test_an_unknown_rate_drops_the_pending_forecasts_and_keeps_the_multipliers() -> None:
    fc = arrivals_forecast(50.0, 60.0)
    cal, _ = run_stream(np.full(100, 20), fc, CalibrationParams())
    broken = update_calibration(cal, 101.0, math.nan, fc, CalibrationParams())
    assert broken.pending == () and broken.log_scale == cal.log_scale and broken.last_s == 101.0
    again = update_calibration(broken, 101.0, 20.0, fc, CalibrationParams())
    assert again == broken  # a tick at the same time changes nothing


ODD = st.sampled_from([math.nan, math.inf, -1.0])


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.one_of(st.floats(0.0, 1e4), ODD), min_size=1, max_size=80),
    p50=st.floats(0.0, 1e4),
    spread=st.floats(1.0, 5.0),
    measured=st.one_of(st.floats(0.0, 1e4), ODD),
    saturated=st.booleans(),
    lo=st.floats(0.05, 1.0),
    hi=st.floats(1.0, 5.0),
    warmup=st.floats(0.0, 30.0),
)
def test_the_correction_is_bounded_and_never_below_the_measured_load(
    counts: list[float],
    p50: float,
    spread: float,
    measured: float,
    saturated: bool,
    lo: float,
    hi: float,
    warmup: float,
) -> None:
    fc = arrivals_forecast(p50, p50 * spread)
    raw50, raw90 = fc.rate(fc.arrivals_p50), fc.rate(fc.arrivals_p90)
    params = CalibrationParams(min_scale=lo, max_scale=hi, warmup_s=warmup)
    floor = measured if math.isfinite(measured) and measured >= 0 else 0.0
    tol = 1 + 1e-9
    cal = ArrivalCalibration()
    for i, n in enumerate(counts):
        cal = update_calibration(cal, float(i + 1), n, fc, params)
        assert all(lo / tol <= s <= hi * tol for s in cal.scales())
        scaled, why = calibrated_forecast(fc, cal, measured, params, saturated=saturated)
        assert scaled is not None
        p50_now, p90_now = scaled.rate(scaled.arrivals_p50), scaled.rate(scaled.arrivals_p90)
        assert p90_now * tol >= p50_now
        assert (scaled.prompt_tokens_p90, scaled.gen_tokens_p90) == (fc.prompt_tokens_p90, fc.gen_tokens_p90)
        if why is not None:  # a correction applied: bounded, over the measured load, not cut while saturated
            assert p50_now * tol >= floor
            assert raw90 * lo / tol <= p90_now <= max(raw90 * hi, floor, p50_now) * tol
            if saturated:
                assert p50_now * tol >= raw50 and p90_now * tol >= raw90
        else:
            assert scaled == fc


def test_params_reject_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min_scale"):
        CalibrationParams(min_scale=1.5)
    with pytest.raises(ValueError, match="gain_per_s"):
        CalibrationParams(gain_per_s=0.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("arrival_calibration", "sometimes"),
        ("arrival_calibration_gain_per_s", 0.0),
        ("arrival_calibration_min_scale", 1.2),
        ("arrival_calibration_max_scale", 0.5),
        ("arrival_calibration_warmup_s", -1.0),
    ],
)
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        PolicyConfig.model_validate({field: value})


def test_on_by_default_and_decide_unchanged_when_off() -> None:
    assert PolicyConfig().arrival_calibration == "coverage"
    o = obs(forecast=forecast(rps=30.0))
    plan, state = decide(ctx(o, PolicyConfig(arrival_calibration="off")), PoolState())
    assert state.arrival_calibration == ArrivalCalibration()
    assert plan is not None and not any("recalibrated" in r for r in plan.reasons)


def little_of(plan: ScalingPlan) -> float:
    """Decode's Little's-law concurrency, read back from the plan's stage-1 reason."""
    need = next(r for r in plan.reasons if r.startswith("need:"))
    return float(need.split("Little ")[1].rstrip(")"))


def test_decide_cuts_an_over_forecast_decode_little_term_after_the_warmup() -> None:
    """A pool whose forecaster reads 3 × the arrivals it counts: after the warm-up the recalibrated p90 sizes
    decode's Little's-law term lower than the raw one, never below the measured rate's, and the plan says why."""
    cfg = PolicyConfig(arrival_calibration="coverage", arrival_calibration_warmup_s=60.0)
    fc = forecast(prompt_tps=1_000.0, gen_tps=100.0, rps=30.0)

    def observed(t: float) -> PoolObservation:
        o: PoolObservation = obs(
            now_s=t, arrival_rps=10.0, forecast=fc, running_seqs=20.0, gen_tps=100.0, prompt_tps=1_000.0
        )
        return o

    state = PoolState()
    plans = []
    for t in range(1, 301):
        plan, state = decide(ctx(observed(float(t)), cfg), state)
        assert plan is not None
        plans.append(plan)
    raw_plan, _ = decide(ctx(observed(300.0)), PoolState())
    assert raw_plan is not None
    assert not any("recalibrated" in r for r in plans[30].reasons)
    assert any("recalibrated" in r for r in plans[-1].reasons)
    measured_little = 10.0 * 200.0 / (CAP.decode_tps / CAP.decode_seqs)  # 10 req/s × 200 tokens ÷ 31.25 tok/s
    assert measured_little - 1 <= little_of(plans[-1]) < 0.6 * little_of(raw_plan)
