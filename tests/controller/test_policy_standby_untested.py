"""The forecast's spread is untested for a pool's first seconds of known load (``PolicyConfig.standby_untested_s``):
the sized standby is then the configured counts, as for no forecast, held like any sized standby."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import NAN, ctx, forecast, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolState, ScalingPlan, decide

# a quiet load on 1 + 1 whose forecast has no spread: the sized standby is 0 on both roles, and no active
# replica is held above the target (which standby_counts_spare would count as standby)
FLEET = {"prefill": 1, "decode": 1}
QUIET = {
    "arrival_rps": 2.0,
    "prompt_tps": 2_000.0,
    "gen_tps": 400.0,
    "running_seqs": 20.0,
    "replicas": FLEET,
    "active": FLEET,
    "standby": {"prefill": 0, "decode": 0},
}
START = 1000.0


def _run(cfg: PolicyConfig, ticks: int, unknown: int = 0) -> list[tuple[float, ScalingPlan | None]]:
    """One tick a second from START: ``unknown`` ticks with no load measured, then the quiet load."""
    state = PoolState()
    out: list[tuple[float, ScalingPlan | None]] = []
    for k in range(unknown + ticks):
        t = START + k
        if k < unknown:
            o = obs(
                now_s=t,
                **{**QUIET, "arrival_rps": NAN, "prompt_tps": NAN, "gen_tps": NAN, "running_seqs": NAN},
                forecast=None,
            )
        else:
            o = obs(now_s=t, **QUIET, forecast=forecast(prompt_tps=2_000.0, gen_tps=400.0, rps=2.0))
        plan, state = decide(ctx(o, cfg), state)
        out.append((t, plan))
    return out


def _standby(plan: ScalingPlan | None) -> tuple[int, int]:
    assert plan is not None
    return plan.standby_prefill, plan.standby_decode


def test_default_sizes_the_spread_from_the_first_tick() -> None:
    cfg = PolicyConfig(standby_prefill=1, standby_decode=2)
    assert all(_standby(p) == (0, 0) for _, p in _run(cfg, 30))


def test_untested_window_keeps_the_configured_counts_then_holds_them() -> None:
    cfg = PolicyConfig(standby_prefill=1, standby_decode=2, standby_untested_s=30.0)
    hold_s = max(cfg.scale_down_delay_s, cfg.provision_lead_s)
    plans = _run(cfg, int(30 + hold_s + 5))
    for t, plan in plans:
        known_s = t - START
        assert plan is not None
        if known_s < 30.0:
            assert _standby(plan) == (1, 2)
            assert any("spread untested" in r for r in plan.reasons)
        else:
            assert not any("spread untested" in r for r in plan.reasons)
        if known_s >= 30.0 + hold_s:  # the last untested tick has left the hold window
            assert _standby(plan) == (0, 0)


def test_the_window_counts_from_the_first_known_load() -> None:
    cfg = PolicyConfig(standby_decode=2, standby_untested_s=10.0)
    plans = _run(cfg, 12, unknown=20)
    assert all(p is None for _, p in plans[:20])  # no load known: no opinion, and no clock started
    known = [p for _, p in plans[20:]]
    assert all(_standby(p)[1] == 2 for p in known[:10])
    last = known[10]
    assert last is not None and not any("spread untested" in r for r in last.reasons)


def test_first_known_s_is_written_once() -> None:
    cfg = PolicyConfig()
    state = PoolState()
    assert math.isnan(state.first_known_s)
    for t in (START, START + 1.0, START + 2.0):
        o = obs(now_s=t, **QUIET, forecast=forecast(prompt_tps=2_000.0, gen_tps=400.0, rps=2.0))
        _, state = decide(ctx(o, cfg), state)
    assert state.first_known_s == START


@settings(max_examples=15, deadline=None)
@given(untested_s=st.floats(min_value=0.0, max_value=60.0), most=st.integers(min_value=0, max_value=4))
def test_untested_only_adds_standby_and_never_touches_active(untested_s: float, most: int) -> None:
    base = PolicyConfig(standby_decode=most)
    opt = PolicyConfig(standby_decode=most, standby_untested_s=untested_s)
    for (_, a), (_, b) in zip(_run(base, 70), _run(opt, 70), strict=True):
        assert a is not None and b is not None
        assert (b.prefill, b.decode) == (a.prefill, a.decode)
        assert a.standby_decode <= b.standby_decode <= max(most, a.standby_decode)


def test_negative_window_is_refused() -> None:
    with pytest.raises(ValidationError):
        PolicyConfig(standby_untested_s=-1.0)


def _held_above(cfg: PolicyConfig, ticks: int) -> list[ScalingPlan]:
    """The quiet load (wanted 1 + 1) on a fleet held at 3 + 3 by the minimum, so 2 spare active replicas per
    role."""
    cfg = cfg.model_copy(update={"min_prefill": 3, "min_decode": 3})
    held = {"prefill": 3, "decode": 3}
    state = PoolState()
    plans = []
    for k in range(ticks):
        o = obs(
            now_s=START + k,
            **{**QUIET, "replicas": held, "active": held},
            forecast=forecast(prompt_tps=2_000.0, gen_tps=400.0, rps=2.0),
        )
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        plans.append(plan)
    return plans


def test_untested_standby_on_top_of_the_spare_only_when_asked() -> None:
    counted = PolicyConfig(standby_prefill=2, standby_decode=2, standby_untested_s=30.0)
    on_top = PolicyConfig(
        standby_prefill=2, standby_decode=2, standby_untested_s=30.0, standby_untested_spare=False
    )
    for a, b in zip(_held_above(counted, 20), _held_above(on_top, 20), strict=True):
        assert (a.prefill, a.decode) == (b.prefill, b.decode) == (3, 3)
        assert (a.standby_prefill, a.standby_decode) == (0, 0)  # the 2 spare per role absorb the 2
        assert (b.standby_prefill, b.standby_decode) == (2, 2)
    # without the untested window the flag changes nothing
    plain = [(p.standby_prefill, p.standby_decode) for p in _held_above(PolicyConfig(standby_prefill=2), 5)]
    flag = [
        (p.standby_prefill, p.standby_decode)
        for p in _held_above(PolicyConfig(standby_prefill=2, standby_untested_spare=False), 5)
    ]
    assert plain == flag


def test_window_counts_replace_the_configured_ones_only_in_the_window() -> None:
    cfg = PolicyConfig(
        standby_prefill=0,
        standby_decode=2,
        standby_untested_s=10.0,
        standby_untested_prefill=1,
        standby_untested_decode=1,
    )
    plans = [p for _, p in _run(cfg, 12)]
    assert all(_standby(p) == (1, 1) for p in plans[:10])
