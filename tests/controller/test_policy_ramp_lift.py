"""A projected ramp lifts the ramp-up limit (``ramp_up_on_trend``), and the output length read as a ratio of
equally smoothed generation and arrivals (``output_ratio='smoothed'``). Hand-built inputs and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import ctx, obs

from controller.config import PolicyConfig
from controller.pipeline import LengthTracker
from controller.policy import PoolState, decide, stages
from controller.policy.types import RoleHistory
from controller.sources.aggregate import PoolLoad

NOW = 1000.0
CHANGED_1S_AGO = RoleHistory(last_scale_up_s=NOW - 1.0, last_change_s=NOW - 1.0)


@pytest.mark.parametrize(
    ("label", "rate_limited", "expected"),
    [
        # (64 - 1) replicas per 120 s over the 1 s since the last change: floor(0.53) → at least one
        ("limited: one more replica", True, 5),
        ("lifted: the whole target at once", False, 30),
    ],
)
def test_ramp_up_limit_applies_only_when_rate_limited(label: str, rate_limited: bool, expected: int) -> None:
    target, history, why = stages.hysteresis_stage(
        "prefill", 30, 4, NOW, PolicyConfig(), CHANGED_1S_AGO, True, 0, rate_limited=rate_limited
    )
    assert target == expected, label
    assert (why is not None and "ramp-up limit" in why) == rate_limited, label
    assert history.last_scale_up_s == NOW


@settings(max_examples=200, deadline=None)
@given(
    wanted=st.integers(0, 64),
    current=st.integers(0, 64),
    since_change_s=st.floats(0.5, 600.0),
    since_up_s=st.floats(0.5, 600.0),
    can_scale_down=st.booleans(),
)
def test_lifting_the_limit_never_changes_a_scale_down_nor_goes_past_the_target(
    wanted: int, current: int, since_change_s: float, since_up_s: float, can_scale_down: bool
) -> None:
    history = RoleHistory(
        last_scale_up_s=NOW - since_up_s,
        last_change_s=NOW - since_change_s,
        recent_targets=((NOW - 30.0, wanted), (NOW - 10.0, current)),
    )
    cfg = PolicyConfig()
    limited = stages.hysteresis_stage("decode", wanted, current, NOW, cfg, history, can_scale_down, 0)
    lifted = stages.hysteresis_stage(
        "decode", wanted, current, NOW, cfg, history, can_scale_down, 0, rate_limited=False
    )
    if limited[0] <= current:  # not a scale-up: the limit had nothing to do
        assert lifted == limited
    else:  # a scale-up either way, never past what was wanted, and remembered as one
        assert limited[0] <= lifted[0] <= wanted
        assert lifted[1].last_scale_up_s == limited[1].last_scale_up_s == NOW


def _ramp_plans(cfg: PolicyConfig, slope: float) -> list[tuple[str, ...]]:
    """Two minutes of arrivals on a line ending at 10 req/s (10k-token prompts, 2 prefill replicas that never
    move): each tick's plan reasons."""
    state = PoolState()
    out = []
    for i in range(120):
        t = NOW - 119 + i
        rps = 10.0 + slope * (t - NOW)
        o = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 10_000.0, gen_tps=rps * 200.0, running_seqs=0.0)
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        out.append((str(plan.prefill), *plan.reasons))
    return out


def test_decide_lifts_the_ramp_up_limit_on_a_projected_ramp_only() -> None:
    limited = _ramp_plans(PolicyConfig(standby_decode=0, ramp_up_on_trend="limited"), 0.05)
    lifted = _ramp_plans(PolicyConfig(standby_decode=0), 0.05)
    trend_ticks = [k for k, reasons in enumerate(lifted) if any(r.startswith("trend") for r in reasons)]
    assert trend_ticks, "the ramp is read"
    last = trend_ticks[-1]
    assert any("prefill: ramp-up limit" in r for r in limited[last])
    assert not any("prefill: ramp-up limit" in r for r in lifted[last])
    assert int(lifted[last][0]) > int(limited[last][0])
    # before the ramp is read (and on flat traffic) the limit binds either way
    for k in range(1, trend_ticks[0]):
        assert limited[k] == lifted[k]
    flat_limited = _ramp_plans(PolicyConfig(standby_decode=0, ramp_up_on_trend="limited"), 0.0)
    flat_lifted = _ramp_plans(PolicyConfig(standby_decode=0), 0.0)
    assert flat_limited == flat_lifted


def _load(arrival_rps: float, gen_tps: float) -> PoolLoad:
    nan = math.nan
    return PoolLoad(
        pool="p", now_s=0.0, counts={}, arrival_rps=arrival_rps, prompt_tps=arrival_rps * 100.0,
        gen_tps=gen_tps, running=20.0, waiting=0.0, kv_usage=nan, ttft_p50_s=nan, ttft_p90_s=nan,
        itl_p50_s=nan, itl_p90_s=nan, mean_prompt_tokens=100.0, complete=True,
    )  # fmt: skip


def _track(rates: list[float], output: float, ratio: str) -> LengthTracker:
    """Feed generation = ``output`` × arrivals, no lag (so the true mean output is ``output`` throughout)."""
    t = LengthTracker()
    for r in rates:
        t.update(_load(r, output * r), 1.0, mode="off", ratio=ratio)
    return t


@settings(max_examples=100, deadline=None)
@given(
    rates=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=200),
    output=st.floats(1.0, 4000.0),
)
def test_smoothed_ratio_reads_a_proportional_load_exactly(rates: list[float], output: float) -> None:
    """Generation proportional to arrivals at any rates: the ratio of equally smoothed sums is the output."""
    assert _track(rates, output, "smoothed").output_ewma == pytest.approx(output, rel=1e-9)


def test_per_tick_ratio_overreads_a_rise_and_smoothed_does_not() -> None:
    """On a rise the per-tick ratio divides each tick's generation by an arrival EWMA a minute behind: the
    600-s sinusoid read ~1,650 tokens at its peak for a true 1,000."""
    rise = [1.0 + 0.2 * k for k in range(120)]  # 1 → 25 req/s in two minutes
    assert _track(rise, 1000.0, "per-tick").output_ewma > 1100.0
    assert _track(rise, 1000.0, "smoothed").output_ewma == pytest.approx(1000.0, rel=1e-9)


def test_both_ratios_agree_on_steady_traffic() -> None:
    steady = [5.0] * 300
    for ratio in ("per-tick", "smoothed"):
        assert _track(steady, 500.0, ratio).output_ewma == pytest.approx(500.0, rel=1e-9)


def test_defaults() -> None:
    cfg = PolicyConfig()
    assert (cfg.ramp_up_on_trend, cfg.output_ratio) == ("lifted", "smoothed")


@pytest.mark.parametrize(("field", "value"), [("ramp_up_on_trend", "always"), ("output_ratio", "lagged")])
def test_config_rejects_unknown_modes_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        PolicyConfig(**{field: value})
