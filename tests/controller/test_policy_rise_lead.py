"""The realised-arrivals lead for the start of a rise (``controller.policy.rise_lead``,
``PolicyConfig.rise_lead='realised'``): seeded Poisson counts one per second, as the policy's rate history holds
them. A rise from 1 req/s is read within seconds and projected above the rate; constant (and over-dispersed)
traffic rarely reads one; the factor is 1 where a forecast already covers the projection; in ``decide`` the
need rises before the trend stage reads the ramp, and nothing changes with the option off or on flat traffic."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, forecast, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import calibration, rise_lead
from controller.policy.decide import PolicyContext, decide
from controller.policy.types import ArrivalCalibration, PoolState

KW = {"window_s": 60.0, "ahead_s": 120.0, "z_min": 3.0, "max_factor": 2.0}


def _reads(counts: np.ndarray) -> list[int]:
    """Seconds at which the lead reads a rise, the counts arriving one per second."""
    times = np.arange(counts.size, dtype=np.float64)
    rates = counts.astype(np.float64)
    return [
        t
        for t in range(counts.size)
        if rise_lead.realised_rise(times[: t + 1], rates[: t + 1], float(t), **KW) is not None
    ]


@pytest.mark.parametrize("seed", range(5))
def test_a_rise_from_a_low_rate_is_read_within_seconds(seed: int) -> None:
    # the 600-s sinusoid's first rise: 1 -> 24 req/s, (1 - cos) shaped, from its trough at t = 100
    t = np.arange(400.0)
    lam = np.where(t < 100, 1.0, 1.0 + 11.5 * (1 - np.cos(2 * np.pi * (t - 100) / 600.0)))
    counts = np.random.default_rng(seed).poisson(lam)
    read = [s for s in _reads(counts) if s >= 100]
    assert read and read[0] <= 100 + 75  # the line detector reads it at ~75 s, the Poisson test at ~59 s
    times, rates = np.arange(400.0), counts.astype(float)
    found = rise_lead.realised_rise(times[: read[0] + 1], rates[: read[0] + 1], float(read[0]), **KW)
    assert found is not None and found.projected_rps > found.recent_rps > found.earlier_rps


@settings(max_examples=10, deadline=None)
@given(rate=st.floats(0.5, 40.0), seed=st.integers(0, 2**31 - 1))
def test_constant_poisson_traffic_rarely_reads_a_rise(rate: float, seed: int) -> None:
    counts = np.random.default_rng(seed).poisson(rate, 600)
    reads = _reads(counts)
    # Reads come in runs: the windows of consecutive seconds overlap, so one noisy stretch reads for several
    # seconds in a row (seed 2346 at 17 req/s: one run of 15 s). Count the stretches, and bound the seconds
    # loosely (z >= 3: 0.13 % of the windows expected).
    runs = sum(1 for i, t in enumerate(reads) if i == 0 or t != reads[i - 1] + 1)
    assert runs <= 3 and len(reads) <= 30, reads


def test_noise_at_one_level_and_a_fall_are_not_rises() -> None:
    rng = np.random.default_rng(3)
    flat = rng.poisson(10.0, 600)
    falling = rng.poisson(np.linspace(20.0, 2.0, 600))
    assert len(_reads(flat)) <= 3
    assert _reads(falling) == []


def test_a_step_up_is_read_and_the_projection_is_capped() -> None:
    counts = np.concatenate([np.full(60, 2.0), np.full(60, 40.0)])
    times = np.arange(counts.size, dtype=np.float64)
    found = rise_lead.realised_rise(times[:70], counts[:70], 69.0, **KW)
    assert found is not None
    assert found.projected_rps == pytest.approx(4.0 * found.recent_rps)  # max_factor 2, twice
    # an earlier half with nothing: unbounded growth, the cap still decides
    zeros = np.concatenate([np.zeros(30), np.full(30, 5.0)])
    found = rise_lead.realised_rise(np.arange(60.0), zeros, 59.0, **KW)
    assert found is not None and found.projected_rps == pytest.approx(20.0)


def test_too_little_history_reads_nothing() -> None:
    counts = np.array([1.0, 50.0, 80.0])
    assert rise_lead.realised_rise(np.arange(3.0), counts, 2.0, **KW) is None
    # a gap: the earlier half covered less than MIN_COVERAGE
    times = np.concatenate([[0.0, 1.0], np.arange(30.0, 60.0)])
    assert rise_lead.realised_rise(times, np.linspace(1, 50, times.size), 59.0, **KW) is None


@pytest.mark.parametrize(
    ("p90", "expected"),
    [(5.0, 4.0), (20.0, 1.0), (40.0, 1.0), (math.nan, 2.0), (0.0, 2.0)],
    ids=["p90 short of it", "p90 at it", "p90 above it (a biased forecast)", "unknown", "zero"],
)
def test_lead_factor_only_fills_what_the_forecast_misses(p90: float, expected: float) -> None:
    found = rise_lead.RealisedRise(earlier_rps=5.0, recent_rps=10.0, z=4.0, projected_rps=20.0)
    assert rise_lead.lead_factor(found, p90) == pytest.approx(expected)
    assert rise_lead.lead_factor(None, p90) == 1.0


_rate = st.floats(allow_nan=True, allow_infinity=True, width=64) | st.floats(0.0, 100.0)


@settings(max_examples=150, deadline=None)
@given(
    rates=st.lists(st.floats(0.0, 200.0), min_size=0, max_size=80),
    p90=_rate,
    cap=st.floats(1.0, 10.0),
)
def test_the_factor_is_in_bounds_for_any_history(rates: list[float], p90: float, cap: float) -> None:
    arr = np.array(rates, dtype=np.float64)
    times = np.arange(arr.size, dtype=np.float64)
    kw = {**KW, "max_factor": cap}
    found = rise_lead.realised_rise(times, arr, float(arr.size - 1), **kw)
    if found is not None:
        assert found.recent_rps <= found.projected_rps <= cap**2 * found.recent_rps * (1 + 1e-9)
    factor = rise_lead.lead_factor(found, p90)
    assert factor >= 1.0 and math.isfinite(factor)


def test_config_fields_are_validated_by_name() -> None:
    assert PolicyConfig().rise_lead == "off"
    for field, bad in (
        ("rise_lead", "forecast"),
        ("rise_lead_window_s", 0.0),
        ("rise_lead_z", -1.0),
        ("rise_lead_max_factor", 0.5),
    ):
        with pytest.raises(ValidationError, match=field):
            PolicyConfig(**{field: bad})


def _decide(
    cfg: PolicyConfig, rates: np.ndarray, p90_ratio: float = 1.0
) -> list[tuple[int, tuple[str, ...]]]:
    """(prefill + decode target, reasons) of ``decide`` fed ``rates`` (one tick per second) with an arrival
    p90 at ``p90_ratio`` x the rate (1: a calibrated forecast), ISL 2000, OSL 200."""
    state = PoolState()
    out = []
    for t, r in enumerate(rates):
        o = obs(
            now_s=float(t),
            arrival_rps=float(r),
            prompt_tps=float(r) * 2000.0,
            gen_tps=float(r) * 200.0,
            forecast=forecast(
                prompt_tps=float(r) * 2000.0, gen_tps=float(r) * 200.0, rps=p90_ratio * float(r)
            ),
        )
        plan, state = decide(PolicyContext(o, CAP, cfg, 1000.0, 50.0), state)
        assert plan is not None
        out.append((plan.prefill + plan.decode, plan.reasons))
    return out


def test_decide_leads_a_rise_the_trend_stage_has_not_read() -> None:
    # a convex rise from 1 req/s (a wave leaving its trough): the lead reads it before the trend's line does
    rates = np.concatenate([np.full(60, 1.0), 1.0 + 5e-3 * np.arange(120.0) ** 2])
    off = _decide(PolicyConfig(), rates)
    on = _decide(PolicyConfig(rise_lead="realised"), rates)
    led = [t for t, (_, why) in enumerate(on) if any(r.startswith("rise lead:") for r in why)]
    trend = [t for t, (_, why) in enumerate(off) if any(r.startswith("trend:") for r in why)]
    assert led and trend and 60 < led[0] < trend[0]
    assert all(a == b for a, b in zip(off[: led[0]], on[: led[0]], strict=True))  # the same until it leads
    assert all(n >= m for (n, _), (m, _) in zip(on, off, strict=True))  # never fewer instances


def test_decide_on_flat_noisy_traffic_is_unchanged() -> None:
    rates = np.random.default_rng(7).poisson(10.0, 300).astype(float)
    off = _decide(PolicyConfig(), rates)
    on = _decide(PolicyConfig(rise_lead="realised"), rates)
    differing = sum(a != b for a, b in zip(off, on, strict=True))
    assert differing <= 3


def test_calibrated_forecast_applies_no_multiplier_above_the_bound() -> None:
    cal = calibration.update_calibration(
        ArrivalCalibration(), 0.0, 10.0, forecast(rps=10.0), calibration.CalibrationParams()
    )
    lifted = replace(cal, log_scale=(math.log(1.5), math.log(1.8)), compared_s=100.0)
    params = calibration.CalibrationParams(max_scale=2.0)
    f = forecast(rps=10.0)
    free, _ = calibration.calibrated_forecast(f, lifted, 10.0, params)
    held, why = calibration.calibrated_forecast(f, lifted, 10.0, params, max_applied=1.0)
    assert free is not None and free.rate(free.arrivals_p90) == pytest.approx(18.0)
    assert held is f and why is None  # both multipliers clamped to 1: unchanged


def test_calibrated_lead_lifts_an_under_covering_p90_only_on_a_rise() -> None:
    rng = np.random.default_rng(5)
    flat = rng.poisson(8.0, 200).astype(float)
    off = _decide(PolicyConfig(), flat, 0.6)
    on = _decide(PolicyConfig(rise_lead="calibrated"), flat, 0.6)
    # no rise read: the default's bound (the reasons' coverage figures may differ, the counts may not)
    assert [d for d, _ in off] == [d for d, _ in on]
    rising = np.concatenate([flat, rng.poisson(8.0 + 0.3 * np.arange(120.0)).astype(float)])
    off = _decide(PolicyConfig(), rising, 0.6)
    on = _decide(PolicyConfig(rise_lead="calibrated"), rising, 0.6)
    lifted = [t for t, (_, why) in enumerate(on) if any("the bound lifted" in r for r in why)]
    assert lifted and lifted[0] >= 200
    assert max(d for d, _ in on[200:]) > max(d for d, _ in off[200:])


def test_calibrated_lead_needs_the_calibration() -> None:
    with pytest.raises(ValidationError, match="rise_lead"):
        PolicyConfig(rise_lead="calibrated", arrival_calibration="off")
    with pytest.raises(ValidationError, match="rise_lead_max_scale"):
        PolicyConfig(rise_lead_max_scale=0.9)
