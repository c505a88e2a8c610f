"""The stages that size for when capacity is ready: queue vs cold start, trend projection, standby sizing,
overdispersion-aware alerts and proportional scale-down. Labelled tables on hand-built inputs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, ctx, forecast, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages
from controller.policy.types import PoolForecast, RoleHistory

# 200 waiting x 1000 prompt tokens = 200k tokens; one prefill instance does 10k tok/s (CAP).
QUEUE = {"waiting_requests": 200.0, "oldest_wait_s": 0.0, "prompt_tps": 10_000.0}


@pytest.mark.parametrize(
    ("label", "kw", "lead_s", "prefill"),
    [
        # lead 0: the queue is cleared within the 1-s SLO whatever it costs: (10k + 200k) / 10k.
        ("no lead: size for the SLO", {**QUEUE}, 0.0, 21.0),
        # 2 warm: the SLO need (21) is cut to the warm 2; cold capacity gets 10k + 200k / 100 s = 1.2.
        ("cold capacity only for what it can clear in time", {**QUEUE}, 100.0, 2.0),
        ("warm standby may be used at once", {**QUEUE, "standby": {"prefill": 8, "decode": 0}}, 100.0, 10.0),
        ("tiny queue within warm capacity is unchanged", {**QUEUE, "waiting_requests": 5.0}, 100.0, 1.5),
        # 1 warm instance: 10k + 200k/100 = 12k tok/s → 1.2 > the warm 1.
        ("spread over the lead beats warm", {**QUEUE, "active": {"prefill": 1, "decode": 4}}, 100.0, 1.2),
    ],
)
def test_queue_beyond_warm_is_spread_over_the_lead(
    label: str, kw: dict[str, object], lead_s: float, prefill: float
) -> None:
    need = stages.capacity_target(obs(**kw), CAP, slo_ttft_s=1.0, lead_s=lead_s)
    assert need is not None, label
    assert need.prefill == pytest.approx(prefill), label


def _ramp(
    slope_rps_per_s: float, base: float = 10.0, until: float = 1000.0, noise: float = 0.0
) -> tuple[tuple[float, float], ...]:
    """One sample per second over the last 2 minutes, alternating +-noise around a line."""
    return tuple(
        (t, base + slope_rps_per_s * (t - until) + (noise if int(t) % 2 else -noise))
        for t in (until - 119 + i for i in range(120))
    )


def test_trend_projects_a_steady_ramp_to_the_lead() -> None:
    history = _ramp(0.05)  # +3 req/s per minute, ending at 10 req/s
    factor, why = stages.trend_factor(history, 1000.0, lead_s=120.0)
    # the line's value now (10) extrapolated 120 s: the smallest of the projections now, 5 s and 10 s ago
    assert factor == pytest.approx((10.0 + 0.05 * 120.0) / 10.0, rel=1e-6)
    assert why is not None and "trend" in why


@pytest.mark.parametrize(
    ("label", "history", "lead_s"),
    [
        ("flat", _ramp(0.0), 120.0),
        ("falling", _ramp(-0.05), 120.0),
        ("rise buried in noise", _ramp(0.01, noise=5.0), 120.0),
        ("no lead", _ramp(0.05), 0.0),
        ("too little history", _ramp(0.05)[-20:], 120.0),
        # A step in the last 30 s: one level change explains it better than a line → not a ramp.
        ("one-block burst", tuple((t, 10.0 if t <= 970 else 40.0) for t, _ in _ramp(0.0)), 120.0),
    ],
)
def test_no_trend(label: str, history: tuple[tuple[float, float], ...], lead_s: float) -> None:
    factor, why = stages.trend_factor(history, 1000.0, lead_s)
    assert factor == 1.0 and why is None, label


def test_trend_factor_is_capped() -> None:
    factor, _ = stages.trend_factor(_ramp(1.0, base=130.0), 1000.0, lead_s=3600.0)
    assert factor == stages.MAX_TREND_FACTOR


def test_decide_sizes_a_ramp_for_the_lead() -> None:
    # The trend stage's lead, with the later cold-start wait (cold_start_persist_s) off: that wait also applies to
    # prefill on a projected ramp; test_decide_waits_for_a_ramps_prefill_target_to_last checks it.
    cfg = PolicyConfig(ramp_up_s=0, standby_decode=0, cold_start_persist_s=0.0)
    flat = cfg.model_copy(update={"provision_lead_s": 0.0})
    state_lead, state_flat = PoolState(), PoolState()
    plan_lead = plan_flat = None
    for t, rps in _ramp(0.05):
        o = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0, running_seqs=0.0)
        plan_lead, state_lead = decide(ctx(o, cfg), state_lead)
        plan_flat, state_flat = decide(ctx(o, flat), state_flat)
    assert plan_lead is not None and plan_flat is not None
    assert plan_lead.prefill > plan_flat.prefill  # ready for the load 2 minutes on
    assert any(r.startswith("trend") for r in plan_lead.reasons)


def _fc(p50: float, p90: float) -> PoolForecast:
    return PoolForecast(5.0, p50, p90, 50_000.0, 10_000.0, 0.0)


@pytest.mark.parametrize(
    ("label", "need", "target", "spread", "most", "expected"),
    [
        ("unknown spread is not zero: the maximum", 0.3, 1, NAN, 2, 2),
        ("rounding slack absorbs the burst", 0.3, 1, 0.3, 2, 0),
        ("spread within the headroom: no standby", 10.0, 13, 0.3, 4, 0),  # ceil(10 × max(1.3, 1.3)) = 13
        ("burst beyond the target", 10.0, 13, 0.6, 4, 3),  # ceil(10 × max(1.3, 1.6)) = 16 → 3
        ("capped at the configured count", 10.0, 13, 1.0, 2, 2),
        ("no uncertainty, no standby", 10.0, 13, 0.0, 2, 0),
    ],
)
def test_standby_size(label: str, need: float, target: int, spread: float, most: int, expected: int) -> None:
    size, _ = stages.standby_size(need, target, 0.3, spread, most)
    assert size == expected, label


@pytest.mark.parametrize(
    ("label", "fc", "expected"),
    [
        ("no forecast", None, NAN),
        ("p90 twice p50", _fc(50.0, 100.0), 0.5),
        ("no spread", _fc(50.0, 50.0), 0.0),
        ("no arrivals forecast: no spread", _fc(0.0, 0.0), 0.0),
    ],
)
def test_forecast_spread(label: str, fc: PoolForecast | None, expected: float) -> None:
    got = stages.forecast_spread(obs(forecast=fc))
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected), label


def test_decide_keeps_standby_only_for_the_uncertain_part() -> None:
    calm = obs(forecast=forecast(prompt_tps=30_000, gen_tps=8_000))  # p50 == p90: no spread
    plan, _ = decide(ctx(calm, PolicyConfig(ramp_up_s=0)), PoolState())
    assert plan is not None and plan.standby_decode == 0
    plan, _ = decide(ctx(calm, PolicyConfig(ramp_up_s=0, standby_sizing="flat")), PoolState())
    assert plan is not None and plan.standby_decode == 2


def test_qps_alert_ignores_overdispersed_noise() -> None:
    # Per-second rates alternating 0 and 40 (mean 20) and a later window at mean 26: +30 %, which Poisson
    # noise alone would call a rise (n 300 → 390, 3σ = 25), but the windows' own spread says it is noise.
    early = tuple((float(t), 0.0 if t % 2 else 40.0) for t in range(15))
    late = tuple((float(t), 6.0 if t % 2 else 46.0) for t in range(31, 46))
    assert stages.qps_change_per_min(early + late) == 0.0
    steady = tuple((t, 20.0) for t, _ in early) + tuple((t, 26.0) for t, _ in late)
    assert stages.qps_change_per_min(steady) == pytest.approx(0.3 * 60 / 30)


def test_rate_history_keeps_one_sample_per_tick() -> None:
    h = stages.update_rate_history((), 10.0, 5.0)
    assert stages.update_rate_history(h, 10.0, 5.0) == h
    assert len(stages.update_rate_history(h, 11.0, 5.0)) == 2


@pytest.mark.parametrize(
    ("label", "fraction", "expected"),
    [("flat floor wins on a small pool", 0.0, 38), ("half the pool per minute", 0.5, 20)],
)
def test_scale_down_rate_is_proportional(label: str, fraction: float, expected: int) -> None:
    cfg = PolicyConfig(
        scale_down_delay_s=0, max_scale_down_per_min=2, max_scale_down_fraction_per_min=fraction
    )
    hist = RoleHistory(last_change_s=0.0)
    target, _, _ = stages.hysteresis_stage("decode", 1, 40, 60.0, cfg, hist, True, fast_up=0)
    assert target == expected, label


def test_sized_standby_falls_only_after_the_delay() -> None:
    recent: tuple[tuple[float, int, int], ...] = ()
    recent, held = stages.hold_standby(recent, 0.0, (1, 2), 60.0)
    assert held == (1, 2)
    recent, held = stages.hold_standby(recent, 30.0, (0, 0), 60.0)
    assert held == (1, 2)  # lower for 30 s only: held
    recent, held = stages.hold_standby(recent, 61.0, (0, 1), 60.0)
    assert held == (0, 1)  # the 2 was wanted 61 s ago: forgotten
    recent, held = stages.hold_standby(recent, 62.0, (3, 0), 60.0)
    assert held == (3, 1)  # a rise is at once


def test_decide_holds_standby_through_a_calm_spell() -> None:
    cfg = PolicyConfig(ramp_up_s=0, scale_down_delay_s=60.0, provision_lead_s=120.0)
    # need decode 4.0 → active ceil(4 × 1.3) = 6; a burst at 80 % spread: ceil(4 × max(1.3, 1.8)) = 8 → standby 2
    spread = obs(forecast=PoolForecast(5.0, 10.0, 50.0, 150_000.0, 40_000.0, 0.0))
    calm = obs(now_s=1100.0, forecast=forecast(prompt_tps=30_000, gen_tps=8_000))  # no spread
    plan, state = decide(ctx(spread, cfg), PoolState())
    assert plan is not None and plan.standby_decode == 2
    first = plan.standby_decode
    plan, state = decide(ctx(calm, cfg), state)  # 100 s later: within max(delay, lead) = 120 s
    assert plan is not None and plan.standby_decode == first
    later = obs(now_s=1121.0, forecast=forecast(prompt_tps=30_000, gen_tps=8_000))
    plan, _ = decide(ctx(later, cfg), state)
    assert plan is not None and plan.standby_decode == 0


rates = st.floats(0, 1e5)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.tuples(st.floats(0, 200), rates), max_size=200),
    lead_s=st.floats(0, 3600),
)
def test_trend_factor_is_bounded(samples: list[tuple[float, float]], lead_s: float) -> None:
    history = tuple(sorted(samples))
    factor, why = stages.trend_factor(history, 200.0, lead_s)
    assert 1.0 <= factor <= stages.MAX_TREND_FACTOR
    assert (why is None) == (factor == 1.0)


@settings(max_examples=200, deadline=None)
@given(
    need=st.floats(0, 1e6),
    target=st.integers(0, 1000),
    spread=st.one_of(st.just(math.nan), st.floats(0, 1)),
    most=st.integers(0, 64),
)
def test_standby_size_within_zero_and_most(need: float, target: int, spread: float, most: int) -> None:
    size, _ = stages.standby_size(need, target, 0.3, spread, most)
    assert 0 <= size <= most


@settings(max_examples=200, deadline=None)
@given(
    waiting=st.floats(0, 1e5),
    warm=st.integers(0, 50),
    lead_a=st.floats(0, 600),
    lead_b=st.floats(0, 600),
)
def test_longer_lead_never_asks_for_more_and_never_below_the_load(
    waiting: float, warm: int, lead_a: float, lead_b: float
) -> None:
    o = obs(waiting_requests=waiting, active={"prefill": warm, "decode": 4})
    short, long_ = sorted((lead_a, lead_b))
    a = stages.capacity_target(o, CAP, 1.0, short)
    b = stages.capacity_target(o, CAP, 1.0, long_)
    assert a is not None and b is not None
    assert b.prefill <= a.prefill + 1e-9
    assert b.prefill >= o.prompt_tps / CAP.prefill_tps - 1e-9  # the arriving load is always sized


@pytest.mark.parametrize("counts_spare", [True, False])
def test_active_replicas_held_by_the_window_count_as_standby(counts_spare: bool) -> None:
    cfg = PolicyConfig(
        ramp_up_s=0,
        scale_down_delay_s=60.0,
        standby_sizing="flat",
        standby_decode=2,
        burst_hold="off",
        standby_counts_spare=counts_spare,
    )
    busy = obs(replicas={"prefill": 2, "decode": 12}, forecast=forecast(gen_tps=20_000, prompt_tps=20_000))
    plan, state = decide(ctx(busy, cfg), PoolState())
    assert plan is not None
    high = plan.decode
    calm = obs(
        now_s=1010.0,
        replicas={"prefill": plan.prefill, "decode": high},
        forecast=forecast(gen_tps=2_000, prompt_tps=10_000),
    )
    plan, _ = decide(ctx(calm, cfg), state)  # 10 s later: the window holds the decode replicas up
    assert plan is not None and plan.decode == high
    calm_plan, _ = decide(ctx(replace(calm, replicas={"prefill": 2, "decode": 1}), cfg), PoolState())
    assert calm_plan is not None
    spare = high - calm_plan.decode  # what the window holds above what the calm tick wants
    assert spare >= 2
    assert plan.standby_decode == (0 if counts_spare else 2)


def test_decide_waits_for_a_ramps_prefill_target_to_last() -> None:
    """With the default wait (cold_start_persist_s = 30 s) a projected ramp's prefill beyond the warm fleet, no
    request waiting, goes only as far as the lowest target of the last 30 s (a queue lifts the wait:
    test_policy_cost_cuts)."""
    cfg = PolicyConfig(ramp_up_s=0, standby_decode=0)
    no_wait = cfg.model_copy(update={"cold_start_persist_s": 0.0})
    plans = {}
    for name, c in (("wait", cfg), ("no wait", no_wait)):
        state, plan = PoolState(), None
        for t, rps in _ramp(0.05):
            o = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0, running_seqs=0.0)
            plan, state = decide(ctx(o, c), state)
        plans[name] = plan
    assert plans["wait"] is not None and plans["no wait"] is not None
    assert plans["wait"].prefill < plans["no wait"].prefill
    assert any("cold start only for a target wanted 30 s" in r for r in plans["wait"].reasons)
