"""SLO risk from the forecast queueing delay and the fleet reserve step of a shared GPU budget
(controller.policy.decide.queue_risk / prefill_floor, controller.pipeline.FleetBudget / RateTracker)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.pipeline import BudgetInput, FleetBudget, PoolCounts, RateTracker, ReserveSettings
from controller.policy import PoolCapacity, ScalingPlan
from controller.policy.decide import erlang_c, prefill_floor, queue_risk, queue_ttft_s, slo_risk
from controller.replay_policies import fleet_reserve
from serving.sim.replay import PolicyOptions
from tests.controller.policy_fixtures import CAP, obs

# A 70B model on 4 GPUs: 3,000 prompt tok/s per prefill instance; 8k-token prompts take 2.67 s each.
DOC_CAP = PoolCapacity(prefill_tps=3000.0, decode_seqs=57.0, decode_tps=650.0, gpus_per_instance=4)
DOC_S = 8000.0 / 3000.0


@pytest.mark.parametrize(
    ("servers", "offered", "waits"),
    [
        pytest.param(1, 0.5, 0.5, id="M/M/1: the utilisation"),
        pytest.param(2, 1.0, 1.0 / 3.0, id="M/M/2 at a=1: 1/3"),
        pytest.param(3, 3.0, 1.0, id="saturated: every arrival waits"),
        pytest.param(4, 0.0, 0.0, id="no load"),
    ],
)
def test_erlang_c_matches_its_closed_forms(servers: int, offered: float, waits: float) -> None:
    assert erlang_c(servers, offered) == pytest.approx(waits)


def test_a_low_rate_long_prompt_pool_is_judged_by_its_queue_not_its_mean_load() -> None:
    # 0.3 req/s of 8k-token prompts is 0.8 of one instance's throughput: need / count calls one instance
    # safe; its queue says the 99th percentile of TTFT is ~60 s against an 8-s SLO, ~9.6 s with two.
    assert slo_risk(1, 0.3 * DOC_S) < 1.0
    assert queue_risk(1, 0.3, DOC_S, 8.0) > 5.0
    assert queue_risk(2, 0.3, DOC_S, 8.0) > 1.0
    assert queue_risk(2, 0.3, DOC_S, 8.0, service_scv=0.5) <= 1.0  # less variable prompts: two do
    assert prefill_floor(0.3, DOC_S, 8.0) == 3
    assert queue_ttft_s(2, 0.3, DOC_S, quantile=0.5) == pytest.approx(DOC_S)  # the median does not wait


@pytest.mark.parametrize(
    ("count", "rate", "service_s", "expect"),
    [
        pytest.param(1, 2.0, 1.0, math.inf, id="cannot keep up"),
        pytest.param(0, 0.1, 1.0, math.inf, id="no instance"),
        pytest.param(2, float("nan"), 1.0, math.nan, id="unknown rate"),
        pytest.param(2, 0.0, 0.5, 0.5, id="idle: one prefill"),
    ],
)
def test_queue_ttft_edges(count: int, rate: float, service_s: float, expect: float) -> None:
    got = queue_ttft_s(count, rate, service_s)
    assert (math.isnan(got) and math.isnan(expect)) or got == expect


def test_unknown_load_is_no_evidence_of_risk() -> None:
    assert queue_risk(1, float("nan"), 1.0, 1.0) == 0.0
    assert prefill_floor(float("nan"), 1.0, 1.0) == 0


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.0, 50.0),
    service_s=st.floats(0.01, 5.0),
    slo_s=st.floats(0.5, 30.0),
    count=st.integers(1, 40),
)
def test_more_instances_never_raise_the_risk_and_the_floor_is_the_fewest_that_meet_it(
    rate: float, service_s: float, slo_s: float, count: int
) -> None:
    assert queue_risk(count + 1, rate, service_s, slo_s) <= queue_risk(count, rate, service_s, slo_s)
    floor = prefill_floor(rate, service_s, slo_s, max_count=200)
    if rate > 0 and service_s < slo_s and floor < 200:
        assert queue_risk(floor, rate, service_s, slo_s) <= 1.0
        assert floor == 1 or queue_risk(floor - 1, rate, service_s, slo_s) > 1.0


def test_the_rate_tracker_is_unknown_until_a_half_life_then_counts_idle_seconds() -> None:
    tracker = RateTracker(halflife_s=10.0)
    for _ in range(5):
        tracker.update(3.0, 1.0)
    assert math.isnan(tracker.rps)  # 5 s of a 10-s half-life: not yet a rate
    for _ in range(5):
        tracker.update(3.0, 1.0)
    assert tracker.rps == pytest.approx(3.0)  # bias-corrected: the mean of what was seen
    tracker.update(float("nan"), 1.0)  # unknown seconds change nothing
    assert tracker.rps == pytest.approx(3.0)
    for _ in range(200):
        tracker.update(0.0, 1.0)  # idle seconds are a rate of 0, not skipped
    assert tracker.rps < 0.01


def _counts(prefill: int, decode: int) -> PoolCounts:
    n = {"prefill": prefill, "decode": decode}
    return PoolCounts(replicas=n, active=n, standby={}, provisioning={})


def _plan(pool: str, prefill: int, decode: int, standby: int = 0) -> ScalingPlan:
    return ScalingPlan(pool, prefill=prefill, decode=decode, standby_prefill=standby, standby_decode=0)


def _docs(plan: ScalingPlan, rate: float = 0.3) -> BudgetInput:
    o = replace(
        obs(pool="docs"),
        arrival_rps=rate,
        prompt_tps=rate * 8000.0,
        gen_tps=rate * 300.0,
        running_seqs=5.0,
        mean_prompt_tokens=8000.0,
        mean_output_tokens=300.0,
    )
    return BudgetInput(plan, o, DOC_CAP, 8000.0, _counts(2, 1), (1, 1), smoothed_rps=rate, burst_rps=rate)


def _chat(plan: ScalingPlan, burst_rps: float, replicas: tuple[int, int] = (1, 1)) -> BudgetInput:
    o = replace(obs(pool="chat"), arrival_rps=2.0, prompt_tps=2000.0, gen_tps=400.0, running_seqs=10.0)
    counts = _counts(*replicas)
    return BudgetInput(plan, o, CAP, 1000.0, counts, (1, 1), smoothed_rps=2.0, burst_rps=burst_rps)


def test_a_steady_pool_planned_above_its_slo_floor_is_trimmed_to_it_plus_the_pooled_reserve() -> None:
    # docs plans 6 instances (24 GPUs) for a load whose SLO floor is 3 prefill + 1 decode (16 GPUs); the
    # budget (40) does not bind. The fleet reserve keeps one 4-GPU instance beyond the floors.
    budget = FleetBudget(40, reserve=ReserveSettings())
    out = budget.fit(0.0, {"docs": _docs(_plan("docs", 5, 1)), "chat": _chat(_plan("chat", 1, 1), 2.0)})
    docs, chat = out["docs"], out["chat"]
    assert docs is not None and chat is not None
    assert docs.gpus(4) == 20 and (docs.prefill, docs.decode) == (4, 1)
    assert (chat.prefill, chat.decode) == (1, 1)
    assert any(r.startswith("fleet reserve") for r in docs.reasons)
    without = FleetBudget(40).fit(
        0.0, {"docs": _docs(_plan("docs", 5, 1)), "chat": _chat(_plan("chat", 1, 1), 2.0)}
    )
    assert without["docs"] is not None and without["docs"].gpus(4) == 24  # no reserve step: the plan stands


def test_a_pool_keeps_its_last_burst_floor_for_hold_s_then_follows_its_plan() -> None:
    budget = FleetBudget(64, reserve=ReserveSettings(hold_s=60.0, reserve_gpus=8))
    burst = budget.fit(0.0, {"chat": _chat(_plan("chat", 6, 1), 30.0)})["chat"]
    assert burst is not None and burst.prefill == 6
    floor = budget.floors["chat"][-1][1]
    assert 3 <= floor <= 6  # 30 req/s of 0.1-s prefills: a = 3 instances' worth
    lull = budget.fit(30.0, {"chat": _chat(_plan("chat", 1, 1), 2.0)})["chat"]
    assert lull is not None and lull.prefill == floor  # the policy asks for 1; the floor is held
    assert any("held at the SLO floor" in r for r in lull.reasons)
    later = budget.fit(61.0, {"chat": _chat(_plan("chat", 1, 1), 2.0)})["chat"]
    assert later is not None and later.prefill == 1


def test_a_controller_starting_on_a_running_pool_holds_what_runs() -> None:
    budget = FleetBudget(64, reserve=ReserveSettings(hold_s=60.0))
    first = budget.fit(0.0, {"chat": _chat(_plan("chat", 1, 1), float("nan"), replicas=(3, 2))})["chat"]
    assert first is not None and (first.prefill, first.decode) == (3, 2)


def test_the_hard_budget_cuts_above_the_held_floors_before_a_held_pool() -> None:
    # a burst a moment ago (held floor 4 prefill) and is calm now; b is busier now (higher risk by its
    # smoothed rate) but its burst rate needs 1. Risk alone would cut a's idle-looking instances; its held
    # floor is capacity a cold start could not bring back in time, so b's instances above its floor go first.
    budget = FleetBudget(9, reserve=ReserveSettings(hold_s=60.0, reserve_gpus=10))
    budget.fit(0.0, {"a": replace(_chat(_plan("a", 3, 1), 30.0), observation=obs(pool="a"))})
    _, held_a, held_a_decode = budget.floors["a"][-1]
    assert held_a + held_a_decode <= 6  # so that b's floor (1 + 1) fits beside it in 9 GPUs
    a = replace(_chat(_plan("a", 1, 1), 2.0), observation=obs(pool="a"))
    b = replace(_chat(_plan("b", 4, 1), 2.0), observation=obs(pool="b"), smoothed_rps=8.0)
    out = budget.fit(10.0, {"a": a, "b": b})
    got_a, got_b = out["a"], out["b"]
    assert got_a is not None and got_b is not None
    assert (got_a.prefill, got_a.decode) == (held_a, held_a_decode)
    assert got_a.gpus(1) + got_b.gpus(1) <= 9 and got_b.prefill < 4


@settings(max_examples=60, deadline=None)
@given(
    budget_gpus=st.integers(2, 40),
    plans=st.lists(
        st.tuples(st.integers(1, 8), st.integers(1, 4), st.integers(0, 2)), min_size=2, max_size=3
    ),
    bursts=st.lists(st.floats(0.0, 60.0), min_size=3, max_size=3),
)
def test_the_reserve_step_never_exceeds_the_budget_unless_the_minimums_do(
    budget_gpus: int, plans: list[tuple[int, int, int]], bursts: list[float]
) -> None:
    budget = FleetBudget(budget_gpus, reserve=ReserveSettings(hold_s=30.0))
    for t, rate in enumerate(bursts):
        inputs = {
            f"p{i}": replace(_chat(_plan(f"p{i}", p, d, s), rate), observation=obs(pool=f"p{i}"))
            for i, (p, d, s) in enumerate(plans)
        }
        out = budget.fit(float(t), inputs)
        used = sum(plan.gpus(1) for plan in out.values() if plan is not None)
        assert used <= max(budget_gpus, 2 * len(plans))  # the minimums are 1 prefill + 1 decode per pool
        for name, plan in out.items():
            assert plan is not None and plan.prefill >= 1 and plan.decode >= 1, name


def test_the_fleet_reserve_parameter_is_validated_with_the_field_named() -> None:
    assert fleet_reserve(PolicyOptions(params={})) is None
    assert fleet_reserve(PolicyOptions(params={"fleet_reserve": True})) == ReserveSettings()
    got = fleet_reserve(PolicyOptions(params={"fleet_reserve": {"hold_s": 200.0}}))
    assert got is not None and got.hold_s == 200.0
    with pytest.raises(ValueError, match="hold_s"):
        fleet_reserve(PolicyOptions(params={"fleet_reserve": {"hold_s": -1.0}}))
    with pytest.raises(ValueError, match="unknown fields \\['hold'\\]"):
        fleet_reserve(PolicyOptions(params={"fleet_reserve": {"hold": 1.0}}))


def test_a_real_backlog_keeps_this_ticks_plan_but_is_not_held_after_it() -> None:
    # 10 prompts of 8k tokens wait for 2 prefill instances: 13 s of work against an 8-s SLO. The model may
    # misjudge heavy-tailed prompts, so the plan stands this tick; once the queue is gone the trim resumes.
    budget = FleetBudget(40, reserve=ReserveSettings())
    chat = _chat(_plan("chat", 1, 1), 2.0)
    calm = _docs(_plan("docs", 5, 1))
    queued = replace(calm, observation=replace(calm.observation, waiting_requests=10.0))
    kept = budget.fit(0.0, {"docs": queued, "chat": chat})["docs"]
    assert kept is not None and (kept.prefill, kept.decode) == (5, 1)
    trimmed = budget.fit(1.0, {"docs": calm, "chat": chat})["docs"]
    assert trimmed is not None and trimmed.gpus(4) == 20
