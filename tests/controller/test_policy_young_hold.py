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
from controller.policy.decide import _young_hold
from controller.policy.types import RoleHistory

START = 500.0
HIGH_TPS = 30_000.0  # the first ticks: 3 prefill instances' worth at 10,000 tok/s each (4 with headroom)
QUIET_TPS = 1_000.0  # then 0.1 of one
HIGH_GEN_TPS = 6_000.0  # 3 decode instances' worth at 2,000 tok/s each


def _run(
    cfg: PolicyConfig, ticks: int, unknown: int = 0, high: int = 1, high_from: int = 0, gen_high: bool = False
) -> list[tuple[float, ScalingPlan | None]]:
    """One tick a second from START: ``unknown`` ticks with no load measured, ``high`` ticks (one: the first tick, as on s11u's burst train and code x 0.3) of a high prompt
    load (from the ``high_from``-th known tick; with ``gen_high`` a high generation load too), then a quiet one; the
    plan's counts are applied at once (the next tick's replicas)."""
    state = PoolState()
    counts = {"prefill": 1, "decode": 1}
    out: list[tuple[float, ScalingPlan | None]] = []
    for k in range(unknown + ticks):
        t = START + k
        is_high = unknown + high_from <= k < unknown + high_from + high
        tps = HIGH_TPS if is_high else QUIET_TPS
        gen = HIGH_GEN_TPS if is_high and gen_high else 200.0
        rate = NAN if k < unknown else 2.0
        o = obs(
            now_s=t, replicas=dict(counts), active=dict(counts), standby={"prefill": 0, "decode": 0},
            arrival_rps=rate, prompt_tps=NAN if k < unknown else tps, gen_tps=NAN if k < unknown else gen,
            running_seqs=NAN if k < unknown else 2.0,
            forecast=None if k < unknown else forecast(prompt_tps=tps, gen_tps=gen, rps=2.0),
        )  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        if plan is not None:
            counts = {"prefill": plan.prefill, "decode": plan.decode}
        out.append((t, plan))
    return out


def _decode(plans: list[tuple[float, ScalingPlan | None]], since_s: float, until_s: float) -> list[int]:
    return [p.decode for t, p in plans if p is not None and since_s <= t - START < until_s]


def _prefill(plans: list[tuple[float, ScalingPlan | None]], since_s: float, until_s: float) -> list[int]:
    return [p.prefill for t, p in plans if p is not None and since_s <= t - START < until_s]


def test_off_releases_the_first_ticks_capacity_after_the_window() -> None:
    plans = _run(PolicyConfig(young_hold_s=0.0), 200)
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
    base = _run(PolicyConfig(young_hold_s=0.0), 400)
    held = _run(PolicyConfig(young_hold_s=240.0), 400)
    for (t, a), (_, b) in zip(base, held, strict=True):
        assert a is not None and b is not None
        assert b.prefill >= a.prefill and b.decode >= a.decode
        if t - START >= 240 + 2 * 60:
            assert (b.prefill, b.decode) == (a.prefill, a.decode)


def test_a_negative_window_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="young_hold_s"):
        PolicyConfig(young_hold_s=-1.0)


@pytest.mark.parametrize("scope", ["first", "unwatched", "all"])
def test_what_the_scope_keeps_of_a_target_wanted_after_the_first_need_block(scope: str) -> None:
    """A high target at 40 s (after the first need block, before one cold start of history: the cold-start wait
    does not filter it) is kept to the end of the window by 'unwatched' and 'all'; 'first' keeps only the first
    need block's targets, so it goes after the usual 60-s window, as with the hold off."""
    cfg = PolicyConfig(young_hold_s=240.0, young_hold_scope=scope)  # type: ignore[arg-type]
    plans = _run(cfg, 400, high_from=40)
    assert _prefill(plans, 0, 40) == [1] * 40  # the first need block was quiet
    raised = _prefill(plans, 40, 41)[0]
    assert raised >= 3
    late = _prefill(plans, 40 + 2 * cfg.scale_down_delay_s, 240)
    if scope == "first":
        assert max(late) < raised
        assert late == _prefill(
            _run(PolicyConfig(young_hold_s=0.0), 400, high_from=40), 40 + 2 * 60, 240
        )  # as the default
    else:
        assert min(late) == raised
    assert _prefill(plans, 240 + 2 * cfg.scale_down_delay_s, math.inf)[-1] < raised  # released after it


@pytest.mark.parametrize(
    ("scope", "floor"), [("first", 2), ("unwatched", 3), ("all", None)], ids=["first", "unwatched", "all"]
)
def test_which_targets_each_scope_keeps(scope: str, floor: int | None) -> None:
    """At 150 s, first known at 0 s, need blocks from 0 s, a 120-s lead: prefill asked 2 at 0 s (the first need
    block), 3 at 50 s (before one cold start of history), 5 at 130 s (after). 'first' keeps 2, 'unwatched' 3
    (not the 5 the cold-start wait could filter), 'all' lengthens the window back to the first tick instead."""
    cfg = PolicyConfig(young_hold_s=240.0, young_hold_scope=scope, young_hold_roles="both")  # type: ignore[arg-type]
    history = RoleHistory(recent_targets=((0.0, 2), (50.0, 3), (130.0, 5)))
    state = PoolState(first_known_s=0.0, roles={"prefill": history, "decode": RoleHistory()})
    young = _young_hold(60.0, 150.0, state, 0.0, {"prefill": 1, "decode": 1}, cfg)
    assert young.reasons and "young pool" in young.reasons[0]
    if floor is None:
        assert young.floor == {} and young.hold_s == {"prefill": 155.0, "decode": 155.0}
    else:
        assert young.hold_s == {} and young.floor == {"prefill": floor}  # decode: nothing asked while young
    assert _young_hold(60.0, 240.0, state, 0.0, {"prefill": 1, "decode": 1}, cfg).reasons == ()  # window over


@pytest.mark.parametrize("roles", ["prefill", "both"])
def test_the_roles_it_applies_to(roles: str) -> None:
    """The first tick asks for decode too: 'both' keeps it to the end of the window, 'prefill' (the default)
    releases it after the usual window and keeps prefill."""
    cfg = PolicyConfig(young_hold_s=240.0, young_hold_roles=roles)  # type: ignore[arg-type]
    plans = _run(cfg, 400, gen_high=True)
    first_p, first_d = _prefill(plans, 0, 1)[0], _decode(plans, 0, 1)[0]
    assert first_p >= 3 and first_d >= 3
    assert min(_prefill(plans, 0, 240)) == first_p
    late_d = _decode(plans, 2 * cfg.scale_down_delay_s, 240)
    if roles == "both":
        assert min(late_d) == first_d
    else:
        assert max(late_d) < first_d
        assert late_d == _decode(_run(PolicyConfig(young_hold_s=0.0), 400, gen_high=True), 2 * 60, 240)


def test_unknown_scope_or_roles_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="young_hold_scope"):
        PolicyConfig(young_hold_scope="everything")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="young_hold_roles"):
        PolicyConfig(young_hold_roles="decode")  # type: ignore[arg-type]
