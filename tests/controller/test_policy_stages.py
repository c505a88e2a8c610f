"""Each policy stage alone, as labelled tables, plus the composed decision on hand-stepped time."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from policy_fixtures import CAP, NAN, ctx, forecast, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, allocate_budget, decide, stages
from controller.policy.types import ArrivalCalibration, RoleHistory, ScalingPlan, evolve


@pytest.mark.parametrize(
    ("label", "kw", "prefill", "decode"),
    [
        ("measured load only", {}, 1.0, 1.5625),
        ("forecast above measured wins", {"forecast": forecast(prompt_tps=30_000, gen_tps=8_000)}, 3.0, 4.0),
        (
            "forecast below measured: measured is a floor",
            {"forecast": forecast(prompt_tps=1, gen_tps=1)},
            1.0,
            1.5625,
        ),
        ("queue adds prefill demand", {"waiting_requests": 5.0, "oldest_wait_s": 0.0}, 1.5, 1.5625),
        ("old queue must clear faster", {"waiting_requests": 5.0, "oldest_wait_s": 0.5}, 2.0, 1.5625),
        ("concurrency bound for decode", {"running_seqs": 640.0}, 1.0, 10.0),
    ],
)
def test_capacity_target(label: str, kw: dict[str, object], prefill: float, decode: float) -> None:
    need = stages.capacity_target(obs(**kw), CAP, slo_ttft_s=1.0)
    assert need is not None, label
    assert need.prefill == pytest.approx(prefill), label
    assert need.decode == pytest.approx(decode), label


@pytest.mark.parametrize(
    ("label", "kw"),
    [
        ("prompt rate unknown, no forecast", {"prompt_tps": NAN}),
        ("generation rate unknown, no forecast", {"gen_tps": NAN}),
        ("infinite rate is not a measurement", {"prompt_tps": math.inf}),
        ("negative rate (counter reset) is unknown", {"gen_tps": -5.0}),
    ],
)
def test_unknown_load_gives_no_opinion(label: str, kw: dict[str, object]) -> None:
    assert stages.capacity_target(obs(**kw), CAP, 1.0) is None, label
    plan, state = decide(ctx(obs(**kw)), PoolState())
    # only the memories that fold unknown ticks themselves moved (decide's docstring)
    assert (
        plan is None
        and evolve(state, load_recent=(), arrival_calibration=ArrivalCalibration()) == PoolState()
    ), label


def test_unknown_measurement_falls_back_to_forecast() -> None:
    need = stages.capacity_target(obs(prompt_tps=NAN, forecast=forecast(prompt_tps=20_000)), CAP, 1.0)
    assert need is not None and need.prefill == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("need_p", "need_d", "headroom", "expected"),
    [
        (1.0, 1.0, 0.3, (2, 2)),
        (0.7, 3.0, 0.3, (1, 4)),
        (2.0, 0.0, 0.0, (2, 0)),
        (0.0, 0.0, 0.3, (0, 0)),
    ],
    ids=["both-up", "separate-ceil", "exact", "idle"],
)
def test_headroom_rounds_each_pool_up(
    need_p: float, need_d: float, headroom: float, expected: tuple[int, int]
) -> None:
    p, d, _ = stages.with_headroom(stages.Need(need_p, need_d, 0.0, ()), headroom)
    assert (p, d) == expected


def test_separate_ceil_never_starves_a_pool() -> None:
    # One ceil over the sum (the seed's formula) gives ceil(0.3 + 0.3) = 1 instance for two pools.
    p, d, _ = stages.with_headroom(stages.Need(0.3, 0.3, 0.0, ()), 0.0)
    assert p == 1 and d == 1


@pytest.mark.parametrize(
    ("running", "decode", "mult", "expected_decode", "expected_buffer"),
    [(100.0, 1, 2.0, 4, 200), (10.0, 3, 2.0, 3, 20), (NAN, 2, 2.0, 2, 0), (0.0, 1, 2.0, 1, 0)],
    ids=["buffer-raises", "fits", "unknown", "idle"],
)
def test_buffer(running: float, decode: int, mult: float, expected_decode: int, expected_buffer: int) -> None:
    d, buf, _ = stages.buffer_target(running, decode, mult, CAP)
    assert (d, buf) == (expected_decode, expected_buffer)


def test_standby_promoted_on_burst_probability_and_held() -> None:
    cfg = PolicyConfig(standby_decode=2, standby_prefill=1, burst_threshold=0.6, alert_hold_s=30)
    p, d, state, reasons = stages.standby_stage(2, 4, obs(forecast=forecast(burst=0.7)), cfg, PoolState())
    assert (p, d) == (3, 6) and any("burst probability" in r for r in reasons)
    # 20 s later, calm forecast: still held.
    later = obs(now_s=1020.0, forecast=forecast(burst=0.0))
    p, d, state, _ = stages.standby_stage(2, 4, later, cfg, state)
    assert (p, d) == (3, 6)
    # 31 s after the alert: released.
    p, d, _, _ = stages.standby_stage(2, 4, obs(now_s=1031.0, forecast=forecast(burst=0.0)), cfg, state)
    assert (p, d) == (2, 4)


def test_standby_promoted_on_qps_change_rate() -> None:
    cfg = PolicyConfig(qps_change_alert_per_min=0.15)
    state = PoolState()
    for t, rps in [(0.0, 100.0), (20.0, 102.0), (40.0, 105.0)]:
        _, _, state, reasons = stages.standby_stage(1, 1, obs(now_s=t, arrival_rps=rps), cfg, state)
        assert not reasons  # at most 5 % over 40 s = 7.5 %/min: no alert
    _, d, state, reasons = stages.standby_stage(1, 1, obs(now_s=45.0, arrival_rps=120.0), cfg, state)
    assert d == 3 and any("arrival rate" in r for r in reasons)


def test_qps_change_ignores_poisson_noise_at_low_rates() -> None:
    # +25 %/min at 1 req/s is ~4 requests more in 15 s: well within Poisson noise, no alert.
    history = ((0.0, 1.0), (40.0, 1.25), (45.0, 1.25))
    assert stages.qps_change_per_min(history) == 0.0
    big = tuple((t, r * 100) for t, r in history)
    assert stages.qps_change_per_min(big) == pytest.approx(0.25 * 60 / 30)


@pytest.mark.parametrize(
    ("p", "d", "lo", "hi", "expected"),
    [(1, 8, 0.25, 0.5, (2, 8)), (6, 8, 0.25, 0.5, (6, 12)), (2, 8, 0.25, 0.5, (2, 8)), (1, 8, 0, 0, (1, 8))],
    ids=["raise-prefill", "raise-decode", "within", "unbounded"],
)
def test_pd_ratio(p: int, d: int, lo: float, hi: float, expected: tuple[int, int]) -> None:
    np_, nd, _ = stages.pd_ratio_stage(p, d, lo, hi)
    assert (np_, nd) == expected


def _hyst(
    wanted: int, current: int, now: float, hist: RoleHistory, cfg: PolicyConfig, complete: bool = True
) -> tuple[int, RoleHistory]:
    target, h, _ = stages.hysteresis_stage("decode", wanted, current, now, cfg, hist, complete, fast_up=0)
    return target, h


def test_scale_down_waits_for_the_delay_and_is_rate_limited() -> None:
    cfg = PolicyConfig(
        scale_down_delay_s=60, max_scale_down_per_min=2, max_scale_down_fraction_per_min=0.0, ramp_up_s=0
    )
    t, h = _hyst(10, 4, 0.0, RoleHistory(), cfg)
    assert t == 10  # scale-up is immediate with ramp_up_s=0
    for now in (1.0, 30.0, 59.0):
        t, h = _hyst(2, 10, now, h, cfg)
        assert t == 10, now  # within the delay after a scale-up
    t, h = _hyst(2, 10, 61.0, h, cfg)
    assert t == 8  # delay over, lower target held for 60 s; 2 per minute → floor(2 × 61 / 60) = 2 removed
    t, h = _hyst(2, 8, 91.0, h, cfg)
    assert t == 7  # 30 s since the last change → 1 more


def test_no_scale_down_on_incomplete_data() -> None:
    cfg = PolicyConfig(scale_down_delay_s=0)
    t, _ = _hyst(1, 5, 100.0, RoleHistory(), cfg, complete=False)
    assert t == 5


def test_ramp_up_limit_but_warm_standby_is_fast() -> None:
    cfg = PolicyConfig(ramp_up_s=120, min_decode=0, max_decode=12)
    hist = RoleHistory(last_change_s=0.0)
    target, _, _ = stages.hysteresis_stage("decode", 20, 2, 10.0, cfg, hist, True, fast_up=2)
    assert target == 2 + 2 + 1  # 12 replicas per 120 s → 1 in 10 s, plus the 2 warm ones


def test_degrade_and_recover_with_hysteresis() -> None:
    cfg = PolicyConfig(max_decode=4, degrade_recover_s=30)
    on, st, _ = stages.degrade_stage(1, 10, cfg, 0.0, PoolState())
    assert on
    on, st, _ = stages.degrade_stage(1, 3, cfg, 10.0, st)
    assert on  # calm for 0 s
    on, st, _ = stages.degrade_stage(1, 3, cfg, 39.0, st)
    assert on  # calm for 29 s
    on, st, why = stages.degrade_stage(1, 3, cfg, 41.0, st)
    assert not on and why == "degrade lifted"


def test_budget_cuts_standby_first_then_lowest_risk() -> None:
    a = ScalingPlan("chat", prefill=2, decode=6, standby_prefill=0, standby_decode=2)
    b = ScalingPlan("docs", prefill=3, decode=3, standby_prefill=0, standby_decode=1)
    needs = {"chat": (1.9, 5.9), "docs": (1.0, 1.0)}
    out = allocate_budget([a, b], needs, {"chat": 1, "docs": 1}, budget_gpus=12)
    assert sum(p.gpus(1) for p in out) <= 12
    chat, docs = out
    assert chat.standby_decode == 0 and docs.standby_decode == 0
    assert (chat.prefill, chat.decode) == (2, 6)  # the pool at risk keeps its GPUs
    assert docs.prefill + docs.decode == 4
    assert any("lowest SLO risk" in r for r in docs.reasons)


def test_decide_composes_the_stages_and_explains() -> None:
    o = obs(forecast=forecast(prompt_tps=30_000, gen_tps=8_000, burst=0.9))
    # The seed's flat standby: 2 decode standby whatever the need (the uncertainty sizing has its own test).
    plan, state = decide(ctx(o, PolicyConfig(ramp_up_s=0, standby_sizing="flat")), PoolState())
    assert plan is not None
    # need 3.0 / 4.0 → headroom 30 % → 4 / 6 (buffer 200 seqs → 4) → standby promoted +2 decode → 8
    assert (plan.prefill, plan.decode, plan.standby_decode) == (4, 8, 2)
    assert plan.reasons and any("standby promoted" in r for r in plan.reasons)
    assert state.roles["decode"].last_scale_up_s == o.now_s


def test_decide_unknown_never_scales_down() -> None:
    state = PoolState()
    o = obs(prompt_tps=NAN, gen_tps=NAN)
    plan, new_state = decide(ctx(o), state)
    assert plan is None and new_state.roles == state.roles and new_state.need_blocks == state.need_blocks


def test_an_unknown_tick_breaks_the_calibration_count() -> None:
    """A tick of unknown load (no opinion) between two known ones: the calibration's count is broken there
    (its pending forecasts dropped: no comparison across the gap), as ``update_calibration`` rules, instead of
    the next tick counting the gap's arrivals at its own rate."""
    cfg = PolicyConfig(arrival_calibration="coverage")
    plan, state = decide(ctx(obs(now_s=1000.0, forecast=forecast()), cfg), PoolState())
    assert plan is not None and state.arrival_calibration.pending
    unknown = obs(now_s=1001.0, arrival_rps=NAN, prompt_tps=NAN, gen_tps=NAN, forecast=None)
    plan, state = decide(ctx(unknown, cfg), state)
    assert plan is None
    assert state.arrival_calibration.pending == () and state.arrival_calibration.last_s == 1001.0


def test_replace_keeps_frozen_inputs() -> None:
    o = obs()
    decide(ctx(o), PoolState())
    assert o == obs()
    assert replace(o) == o
