"""The fleet's GPU budget: allocation by SLO risk (controller.policy.decide.allocate_budget) and the
pipeline-side step that holds plan-less pools (controller.pipeline.fit_budget)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.pipeline import BudgetInput, PoolCounts, fit_budget
from controller.policy import ScalingPlan, allocate_budget
from controller.policy.decide import slo_risk
from tests.controller.policy_fixtures import CAP, obs


@pytest.mark.parametrize(
    ("count", "need", "risk"),
    [
        pytest.param(4, 2.0, 0.5, id="half-used"),
        pytest.param(2, 3.0, 1.5, id="over: misses its SLO"),
        pytest.param(0, 1.0, float("inf"), id="needed, none left"),
        pytest.param(0, 0.0, 0.0, id="nothing needed"),
        pytest.param(3, float("nan"), 0.0, id="unknown need is no evidence"),
    ],
)
def test_slo_risk_is_need_over_instances(count: int, need: float, risk: float) -> None:
    assert slo_risk(count, need) == risk


def test_when_the_budget_binds_the_pool_at_risk_keeps_its_gpus_and_reasons_say_so() -> None:
    chat = ScalingPlan("chat", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    docs = ScalingPlan("docs", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    # chat needs all 8 (risk 1.0); docs needs 2 + 2 (risk 0.5): 4 GPUs must go, all from docs.
    needs = {"chat": (4.0, 4.0), "docs": (2.0, 2.0)}
    out = allocate_budget([chat, docs], needs, {"chat": 1, "docs": 1}, 12)
    got = {p.pool: p for p in out}
    assert (got["chat"].prefill, got["chat"].decode) == (4, 4)
    assert (got["docs"].prefill, got["docs"].decode) == (2, 2)
    for plan in out:
        assert any("budget 12 GPUs binds" in r for r in plan.reasons), plan.reasons
    assert any("lowest SLO risk" in r for r in got["docs"].reasons)
    assert not any("lowest SLO risk" in r for r in got["chat"].reasons)


def test_past_equal_risk_the_cuts_spread_to_keep_the_highest_risk_lowest() -> None:
    chat = ScalingPlan("chat", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    docs = ScalingPlan("docs", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    needs = {"chat": (4.0, 4.0), "docs": (2.0, 2.0)}
    out = {p.pool: p for p in allocate_budget([chat, docs], needs, {"chat": 1, "docs": 1}, 10)}
    # docs to 1 would be risk 2.0; chat to 3 is 1.33: the fleet's worst risk stays lowest this way.
    assert out["chat"].prefill + out["chat"].decode == 6
    assert (out["docs"].prefill, out["docs"].decode) == (2, 2)


def test_risk_compares_pools_on_different_gpus_per_instance() -> None:
    # A 4-GPU pool over-provisioned (risk 0.5) gives GPUs to a 1-GPU pool that is short (risk 1.25).
    big = ScalingPlan("big", prefill=2, decode=2, standby_prefill=0, standby_decode=0)
    small = ScalingPlan("small", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    needs = {"big": (1.0, 1.0), "small": (5.0, 5.0)}
    out = {p.pool: p for p in allocate_budget([big, small], needs, {"big": 4, "small": 1}, 20)}
    assert (out["small"].prefill, out["small"].decode) == (4, 4)
    assert out["big"].gpus(4) + out["small"].gpus(1) <= 20


def test_a_plan_within_the_budget_is_returned_untouched() -> None:
    plan = ScalingPlan("a", prefill=2, decode=2, standby_prefill=0, standby_decode=1)
    assert allocate_budget([plan], {"a": (2.0, 2.0)}, {"a": 1}, 5) == [plan]


def test_floors_hold_and_the_reasons_say_when_minimums_exceed_the_budget() -> None:
    a = ScalingPlan("a", prefill=3, decode=3, standby_prefill=0, standby_decode=0)
    b = ScalingPlan("b", prefill=3, decode=3, standby_prefill=0, standby_decode=0)
    out = allocate_budget([a, b], {}, {"a": 1, "b": 1}, 4, floors={"a": (1, 2), "b": (1, 2)})
    assert [(p.prefill, p.decode) for p in out] == [(1, 2), (1, 2)]
    assert all(any("minimums alone exceed the budget" in r for r in p.reasons) for p in out)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 3), st.integers(0, 3)),
        min_size=1,
        max_size=4,
    ),
    needs=st.lists(st.tuples(st.floats(0, 20), st.floats(0, 20)), min_size=4, max_size=4),
    gpus=st.lists(st.integers(1, 8), min_size=4, max_size=4),
    budget=st.integers(0, 150),
)
def test_budget_cuts_respect_floors_and_fit_unless_the_floors_forbid(
    counts: list[tuple[int, int, int, int]],
    needs: list[tuple[float, float]],
    gpus: list[int],
    budget: int,
) -> None:
    plans = [ScalingPlan(f"p{i}", p, d, 0, s) for i, (p, d, s, _) in enumerate(counts)]
    floors = {f"p{i}": (min(f, p), min(f, d)) for i, (p, d, _, f) in enumerate(counts)}
    per = {f"p{i}": gpus[i] for i in range(len(counts))}
    need = {f"p{i}": needs[i] for i in range(len(counts))}
    out = allocate_budget(plans, need, per, budget, floors=floors)
    used = sum(p.gpus(per[p.pool]) for p in out)
    floor_gpus = sum((floors[p.pool][0] + floors[p.pool][1]) * per[p.pool] for p in plans)
    assert used <= max(budget, floor_gpus)
    for before, after in zip(plans, out, strict=True):
        assert floors[after.pool][0] <= after.prefill <= before.prefill
        assert floors[after.pool][1] <= after.decode <= before.decode


def _counts(prefill: int, decode: int, standby: int = 0) -> PoolCounts:
    n = {"prefill": prefill, "decode": decode}
    return PoolCounts(replicas=n, active=n, standby={"prefill": 0, "decode": standby}, provisioning={})


def test_fit_budget_holds_pools_without_a_plan_and_cuts_the_planned_ones() -> None:
    # "idle" has no opinion this tick: its 6 replicas + 2 standby stay, leaving 4 of 12 GPUs for "busy".
    busy_obs = replace(obs(pool="busy"), prompt_tps=40_000.0, gen_tps=8_000.0)
    busy = BudgetInput(
        plan=ScalingPlan("busy", prefill=4, decode=4, standby_prefill=0, standby_decode=0),
        observation=busy_obs,
        capacity=CAP,
        slo_ttft_ms=1000.0,
        counts=_counts(2, 2),
        floor=(1, 1),
    )
    idle = BudgetInput(None, obs(pool="idle"), CAP, 1000.0, _counts(3, 3, standby=2), (1, 1))
    out = fit_budget(12, {"busy": busy, "idle": idle})
    assert out["idle"] is None
    plan = out["busy"]
    assert plan is not None and plan.gpus(1) == 4
    assert any("budget 4 GPUs binds" in r for r in plan.reasons)


def test_fit_budget_returns_the_same_plans_when_they_fit() -> None:
    plan = ScalingPlan("a", prefill=1, decode=1, standby_prefill=0, standby_decode=0)
    b = BudgetInput(plan, obs(pool="a"), CAP, 1000.0, _counts(1, 1))
    assert fit_budget(8, {"a": b})["a"] is plan


def test_the_risk_reads_the_smoothed_rate_not_a_one_second_spike() -> None:
    # One 8k-token prompt landed this second: the reading says 16,000 tok/s, the minute says 0.3 req/s.
    spike = replace(
        obs(pool="docs"),
        arrival_rps=2.0,
        prompt_tps=16_000.0,
        mean_prompt_tokens=8000.0,
        mean_output_tokens=300.0,
    )
    b = BudgetInput(None, spike, CAP, 1000.0, _counts(1, 1), smoothed_rps=0.3)
    risk_obs = b.risk_observation()
    assert risk_obs.prompt_tps == pytest.approx(2400.0) and risk_obs.forecast is None
    assert risk_obs.waiting_requests == spike.waiting_requests
    unknown = replace(b, smoothed_rps=float("nan"))
    assert unknown.risk_observation() is spike


def test_a_pool_with_a_real_queue_beats_a_noisy_reading_for_the_budget() -> None:
    noisy_obs = replace(
        obs(pool="docs"),
        arrival_rps=2.0,
        prompt_tps=60_000.0,
        mean_prompt_tokens=8000.0,
        waiting_requests=0.0,
    )
    queued_obs = replace(obs(pool="chat"), prompt_tps=30_000.0, arrival_rps=30.0, waiting_requests=40.0)
    plans = {
        "docs": ScalingPlan("docs", prefill=6, decode=1, standby_prefill=0, standby_decode=0),
        "chat": ScalingPlan("chat", prefill=6, decode=2, standby_prefill=0, standby_decode=0),
    }
    inputs = {
        "docs": BudgetInput(plans["docs"], noisy_obs, CAP, 1000.0, _counts(6, 1), (1, 1), smoothed_rps=0.3),
        "chat": BudgetInput(plans["chat"], queued_obs, CAP, 1000.0, _counts(3, 2), (1, 1), smoothed_rps=30.0),
    }
    out = fit_budget(10, inputs)
    chat, docs = out["chat"], out["docs"]
    assert chat is not None and docs is not None
    assert (chat.prefill, chat.decode) == (6, 2)
    assert docs.prefill == 1


def test_a_cut_instance_that_fits_the_slack_a_larger_cut_left_is_given_back() -> None:
    # 2 GPUs over: the 1-GPU pool's prefill goes first (risk 0.5 after), then a 4-GPU prefill (0.75); that
    # frees 3 more than needed, so the 1-GPU prefill comes back.
    big = ScalingPlan("big", prefill=3, decode=1, standby_prefill=0, standby_decode=0)
    small = ScalingPlan("small", prefill=2, decode=4, standby_prefill=0, standby_decode=0)
    needs = {"big": (1.5, 0.5), "small": (0.5, 3.0)}
    out = {p.pool: p for p in allocate_budget([big, small], needs, {"big": 4, "small": 1}, 20)}
    assert out["big"].prefill == 2
    assert (out["small"].prefill, out["small"].decode) == (2, 4)
    assert any("+1 back" in r for r in out["small"].reasons)
    assert out["big"].gpus(4) + out["small"].gpus(1) <= 20


def test_a_guaranteed_share_is_borrowed_only_while_its_pool_does_not_plan_to_use_it() -> None:
    # docs is guaranteed 8 GPUs and plans 8; chat (guaranteed 4) plans 8 at a higher risk. Without the
    # guarantee risk alone takes GPUs from docs; with it, chat's borrowing is what goes.
    chat = ScalingPlan("chat", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    docs = ScalingPlan("docs", prefill=4, decode=4, standby_prefill=0, standby_decode=0)
    needs = {"chat": (4.0, 4.0), "docs": (2.0, 2.0)}
    per = {"chat": 1, "docs": 1}
    risk_only = {p.pool: p for p in allocate_budget([chat, docs], needs, per, 12)}
    assert risk_only["docs"].gpus(1) == 4
    shares = {"chat": 4, "docs": 8}
    guaranteed = {p.pool: p for p in allocate_budget([chat, docs], needs, per, 12, guarantees=shares)}
    assert guaranteed["docs"].gpus(1) == 8 and guaranteed["chat"].gpus(1) == 4
    # When docs plans less than its share, chat borrows the rest.
    small_docs = ScalingPlan("docs", prefill=2, decode=2, standby_prefill=0, standby_decode=0)
    borrowed = {p.pool: p for p in allocate_budget([chat, small_docs], needs, per, 12, guarantees=shares)}
    assert borrowed["chat"].gpus(1) == 8 and borrowed["docs"].gpus(1) == 4


def test_standby_goes_first_from_the_pool_that_borrows_most() -> None:
    a = ScalingPlan("a", prefill=2, decode=2, standby_prefill=0, standby_decode=1)  # 5 GPUs, guaranteed 5
    b = ScalingPlan("b", prefill=2, decode=2, standby_prefill=0, standby_decode=1)  # 5 GPUs, guaranteed 3
    needs = {"a": (2.0, 2.0), "b": (2.0, 2.0)}
    out = {
        p.pool: p for p in allocate_budget([a, b], needs, {"a": 1, "b": 1}, 9, guarantees={"a": 5, "b": 3})
    }
    assert (out["a"].standby_decode, out["b"].standby_decode) == (1, 0)
