"""The fleet GPU budget with a PD-mixed-node pool: a node's prefill and decode instances share its GPUs, so
the budget counts ``max(prefill, decode)`` nodes, not both roles' instances (issue 8;
controller.policy.decide.allocate_budget / plan_gpus, controller.pipeline.fit_budget)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import controller.replay_policies  # noqa: F401  (registers the policies)
from controller.config import PolicyConfig
from controller.pipeline import BudgetInput, PoolCounts, ReserveSettings, fit_budget
from controller.policy import ScalingPlan, allocate_budget
from controller.policy.decide import plan_gpus
from controller.policy.mixed_node import node_plan
from controller.replay_policies import PredictivePolicy
from forecaster.baselines import Holt
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay
from serving.workload.trace import Trace
from tests.controller.policy_fixtures import CAP, obs


def plan(pool: str, prefill: int, decode: int) -> ScalingPlan:
    return ScalingPlan(pool, prefill=prefill, decode=decode, standby_prefill=0, standby_decode=0)


def held(out: list[ScalingPlan], gpus: dict[str, int], mixed: set[str]) -> int:
    """GPUs the plans hold once applied: a mixed pool's plan as whole nodes (``node_plan``)."""
    total = 0
    for p in out:
        if p.pool in mixed:
            nodes = node_plan(p)
            total += nodes.prefill * gpus[p.pool]  # one set of GPUs per node
        else:
            total += p.gpus(gpus[p.pool])
    return total


def test_plan_gpus_counts_a_mixed_node_once() -> None:
    p = ScalingPlan("m", prefill=5, decode=3, standby_prefill=1, standby_decode=2)
    assert plan_gpus(p, 2, mixed_node=True) == 10  # 5 nodes x 2 GPUs; node_plan drops the standby
    assert plan_gpus(p, 2) == p.gpus(2) == 22


def test_a_mixed_and_a_dedicated_pool_that_fit_the_budget_are_not_cut() -> None:
    # mixed: 4 nodes (4 prefill + 2 decode instances on them) = 4 GPUs; dedicated 2 + 2 = 4 GPUs: 8 in all.
    plans = [plan("mixed", 4, 2), plan("dedicated", 2, 2)]
    needs = {"mixed": (4.0, 2.0), "dedicated": (2.0, 2.0)}
    out = allocate_budget(plans, needs, {"mixed": 1, "dedicated": 1}, 8, mixed_node={"mixed"})
    assert out == plans  # counted as 6 + 4 = 10 the budget would bind and cut 2 instances


def test_when_the_budget_binds_the_allocation_matches_the_gpus_held() -> None:
    # mixed: 3 nodes of 2 GPUs wanted, its load needs 1 (risk 0.33); dedicated: 2 + 2 of 1 GPU, all needed
    # (risk 1.0). Budget 7 of the 10 wanted: the mixed pool gives up 2 nodes (risk 0.5, then 1.0 after the
    # cut, against 2.0 for a dedicated instance); the 1 GPU left cannot hold another node.
    gpus = {"mixed": 2, "dedicated": 1}
    plans = [plan("mixed", 3, 3), plan("dedicated", 2, 2)]
    needs = {"mixed": (1.0, 1.0), "dedicated": (2.0, 2.0)}
    out = {p.pool: p for p in allocate_budget(plans, needs, gpus, 7, mixed_node={"mixed"})}
    assert (out["dedicated"].prefill, out["dedicated"].decode) == (2, 2)
    assert (out["mixed"].prefill, out["mixed"].decode) == (1, 1)
    assert held(list(out.values()), gpus, {"mixed"}) == 2 + 4 <= 7
    cuts = [r for r in out["mixed"].reasons if "mixed node -1" in r]
    assert len(cuts) == 2 and "prefill 3 → 2, decode 3 → 2" in cuts[0], out["mixed"].reasons
    assert "on 1 mixed nodes (2 GPUs)" in out["mixed"].reasons[-1]
    assert "budget 7 GPUs binds (plans want 10)" in out["dedicated"].reasons[-1]


def test_a_node_cut_takes_only_the_binding_role_and_frees_its_gpus() -> None:
    # mixed wants 5 prefill, 2 decode: 5 nodes. One node less is prefill 5 -> 4; decode stays 2.
    gpus = {"mixed": 1, "dedicated": 1}
    plans = [plan("mixed", 5, 2), plan("dedicated", 3, 3)]
    needs = {"mixed": (2.0, 1.0), "dedicated": (3.0, 3.0)}
    out = {p.pool: p for p in allocate_budget(plans, needs, gpus, 10, mixed_node={"mixed"})}
    assert (out["mixed"].prefill, out["mixed"].decode) == (4, 2)
    assert (out["dedicated"].prefill, out["dedicated"].decode) == (3, 3)
    assert held(list(out.values()), gpus, {"mixed"}) == 10


def test_node_cuts_respect_both_roles_floors() -> None:
    gpus = {"mixed": 1, "dedicated": 1}
    plans = [plan("mixed", 4, 4), plan("dedicated", 4, 4)]
    needs = {"mixed": (0.5, 0.5), "dedicated": (4.0, 4.0)}
    floors = {"mixed": (1, 3), "dedicated": (0, 0)}
    out = {p.pool: p for p in allocate_budget(plans, needs, gpus, 9, floors=floors, mixed_node={"mixed"})}
    assert (out["mixed"].prefill, out["mixed"].decode) == (3, 3)  # decode's floor of 3 stops the nodes at 3
    assert out["dedicated"].gpus(1) == 6


def test_fit_budget_holds_a_planless_mixed_pool_at_its_nodes() -> None:
    counts = PoolCounts(
        replicas={"prefill": 3, "decode": 3},
        active={"prefill": 3, "decode": 3},
        standby={"prefill": 0, "decode": 0},
        provisioning={"prefill": 0, "decode": 0},
    )
    o = obs(waiting_requests=0.0)
    mixed = BudgetInput(None, o, CAP, 1000.0, counts, mixed_node=True)
    dedicated = BudgetInput(plan("dedicated", 4, 4), o, CAP, 1000.0, counts)
    out = fit_budget(11, {"mixed": mixed, "dedicated": dedicated})
    assert out["mixed"] is None and out["dedicated"] is dedicated.plan  # 3 nodes + 8 = 11: it fits
    # a role counted at its own (smaller) target still holds the nodes that serve: 3, not 1
    behind = replace(mixed, counts=replace(counts, replicas={"prefill": 1, "decode": 3}))
    assert behind.held_gpus() == 3
    assert fit_budget(11, {"mixed": behind, "dedicated": dedicated})["dedicated"] is dedicated.plan


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 8),
            st.integers(0, 8),
            st.integers(1, 4),
            st.booleans(),
            st.floats(0.0, 8.0),
            st.floats(0.0, 8.0),
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 60),
)
def test_the_budget_is_used_but_never_exceeded_with_mixed_pools(
    pools: list[tuple[int, int, int, bool, float, float]], budget: int
) -> None:
    plans = [plan(f"p{i}", p, d) for i, (p, d, *_) in enumerate(pools)]
    gpus = {f"p{i}": g for i, (_, _, g, *_) in enumerate(pools)}
    mixed = {f"p{i}" for i, (_, _, _, m, *_) in enumerate(pools) if m}
    needs = {f"p{i}": (np_, nd) for i, (*_, np_, nd) in enumerate(pools)}
    wanted = held(plans, gpus, mixed)
    out = allocate_budget(plans, needs, gpus, budget, mixed_node=mixed)
    used = held(out, gpus, mixed)
    assert used <= max(budget, 0) or wanted <= budget
    if wanted > budget:  # every cut pool's instance or node would not fit in what is left
        assert budget - used < max(gpus.values())
    else:
        assert out == plans
    for before, after in zip(plans, out, strict=True):
        assert after.prefill <= before.prefill and after.decode <= before.decode


def _steady(rate_rps: float, prompt: int, output: int, duration_s: float) -> Trace:
    n = int(rate_rps * duration_s)
    arrival = np.arange(n, dtype=np.float64) / rate_rps
    return Trace.from_arrays(arrival, np.full(n, prompt), np.full(n, output))


@pytest.mark.parametrize("name", ["reactive", "predictive", "predictive+reserve"])
def test_a_replay_under_a_binding_budget_gives_the_mixed_pool_the_gpus_left(name: str) -> None:
    # The mixed pool wants far more nodes than the budget has; the dedicated pool needs its 1 + 1. With
    # 5 GPUs the mixed pool holds 3 nodes (counted as 3 + 3 instances it was cut to 2, one GPU left idle).
    base = single_pool(max_per_role=32).pools[0]
    pools = (replace(base, name="mixed", placement="mixed-node"), replace(base, name="dedicated"))
    fleet = FleetSpec(pools=pools, gpu_budget=5)
    traces = {"mixed": _steady(8.0, 4000, 8, 40.0), "dedicated": _steady(1.0, 200, 10, 40.0)}
    chosen: ReplayPolicy
    if name.startswith("predictive"):
        reserve = ReserveSettings() if name.endswith("reserve") else None  # the fleet reserve step too
        chosen = PredictivePolicy(PolicyConfig(), forecaster=Holt, reserve=reserve)
    else:
        chosen = make_policy(name, PolicyOptions())
    report = replay(fleet, traces, chosen)
    assert report.unfinished == 0
    decisions: list[tuple[float, ScalingPlan]] = getattr(chosen, "decisions", [])
    by_tick: dict[float, dict[str, ScalingPlan]] = {}
    for t, p in decisions:
        by_tick.setdefault(t, {})[p.pool] = p
    gpus = {"mixed": 1, "dedicated": 1}
    held_by_tick = [held(list(plans.values()), gpus, {"mixed"}) for plans in by_tick.values()]
    assert max(held_by_tick) == 5, held_by_tick  # the budget is used ...
    assert all(h <= 5 for h in held_by_tick)  # ... and never exceeded
    assert max(p.prefill for _, p in decisions if p.pool == "mixed") == 3
