"""A young pool keeps what it asked for (``PolicyConfig.young_hold_s``): for the first seconds of known load the
scale-down window reaches back to the first known tick, so capacity the first ticks started (before one cold start
of history nothing waits for a target to last) is not cancelled by the 60-s window before it is warm."""

from __future__ import annotations

import math

import pytest
from policy_fixtures import NAN, ctx, forecast, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolState, ScalingPlan, decide

START = 500.0
HIGH_TPS = 30_000.0  # the first ticks: 3 prefill instances' worth at 10,000 tok/s each (4 with headroom)
QUIET_TPS = 1_000.0  # then 0.1 of one


def _run(
    cfg: PolicyConfig, ticks: int, unknown: int = 0, high: int = 1
) -> list[tuple[float, ScalingPlan | None]]:
    """One tick a second from START: ``unknown`` ticks with no load measured, ``high`` ticks (one: the first tick, as on s11u's burst train and code x 0.3) of a high prompt
    load, then a quiet one; the plan's counts are applied at once (the next tick's replicas)."""
    state = PoolState()
    counts = {"prefill": 1, "decode": 1}
    out: list[tuple[float, ScalingPlan | None]] = []
    for k in range(unknown + ticks):
        t = START + k
        tps = HIGH_TPS if unknown <= k < unknown + high else QUIET_TPS
        rate = NAN if k < unknown else 2.0
        o = obs(
            now_s=t, replicas=dict(counts), active=dict(counts), standby={"prefill": 0, "decode": 0},
            arrival_rps=rate, prompt_tps=NAN if k < unknown else tps, gen_tps=NAN if k < unknown else 200.0,
            running_seqs=NAN if k < unknown else 2.0,
            forecast=None if k < unknown else forecast(prompt_tps=tps, gen_tps=200.0, rps=2.0),
        )  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        if plan is not None:
            counts = {"prefill": plan.prefill, "decode": plan.decode}
        out.append((t, plan))
    return out


def _prefill(plans: list[tuple[float, ScalingPlan | None]], since_s: float, until_s: float) -> list[int]:
    return [p.prefill for t, p in plans if p is not None and since_s <= t - START < until_s]


def test_default_releases_the_first_ticks_capacity_after_the_window() -> None:
    plans = _run(PolicyConfig(), 200)
    first = _prefill(plans, 0, 1)[0]
    assert first >= 3
    assert min(_prefill(plans, 150, 200)) < first  # released well before 240 s
    assert not any("young pool" in r for _, p in plans if p is not None for r in p.reasons)


@pytest.mark.parametrize(
    "young_s", [120.0, 240.0, 400.0], ids=["one-lead", "two-leads", "beyond-the-burst-hold"]
)
def test_young_pool_keeps_the_first_target_for_the_window_then_releases(young_s: float) -> None:
    cfg = PolicyConfig(young_hold_s=young_s)
    plans = _run(cfg, int(young_s + 3 * cfg.scale_down_delay_s))
    first = _prefill(plans, 0, 1)[0]
    assert first >= 3
    assert min(_prefill(plans, 0, young_s)) == first  # nothing released inside the window
    for t, plan in plans:
        assert plan is not None
        young = any("young pool" in r for r in plan.reasons)
        assert young == (t - START < young_s)
    assert _prefill(plans, young_s + 2 * cfg.scale_down_delay_s, math.inf)[-1] < first  # released after it


def test_the_window_counts_from_the_first_known_load() -> None:
    cfg = PolicyConfig(young_hold_s=100.0)
    plans = _run(cfg, 110, unknown=30)
    assert all(p is None for _, p in plans[:30])  # no load known: no opinion, and no clock started
    known = [(t - START - 30, p) for t, p in plans[30:]]
    first = known[0][1]
    assert first is not None and first.prefill >= 3
    for s, plan in known:
        assert plan is not None
        if s < 100:
            assert plan.prefill == first.prefill
            assert any("young pool: load known for" in r for r in plan.reasons)


def test_it_only_ever_keeps_more() -> None:
    """The hold lengthens the scale-down window and nothing else: tick by tick (the same inputs, counts fed
    back), the held pool's targets are never below the default's, and equal once both have left the window."""
    base = _run(PolicyConfig(), 400)
    held = _run(PolicyConfig(young_hold_s=240.0), 400)
    for (t, a), (_, b) in zip(base, held, strict=True):
        assert a is not None and b is not None
        assert b.prefill >= a.prefill and b.decode >= a.decode
        if t - START >= 240 + 2 * 60:
            assert (b.prefill, b.decode) == (a.prefill, a.decode)


def test_a_negative_window_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="young_hold_s"):
        PolicyConfig(young_hold_s=-1.0)
