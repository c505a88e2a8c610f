"""Clamping, the dry-run actuator and the simulator actuator (no network)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.actuators.base import ReplicaBounds, RoleReplicas, clamp_targets
from controller.actuators.dryrun import DryRunActuator
from controller.actuators.simulator import SimulatorActuator
from controller.policy.types import ScalingPlan
from serving.sim.analytic import analytic_models
from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts

counts = st.integers(-(10**6), 10**6)


@given(p=counts, d=counts, sp=counts, sd=counts, lo=st.integers(0, 8), span=st.integers(0, 8))
def test_clamped_targets_are_within_bounds(p: int, d: int, sp: int, sd: int, lo: int, span: int) -> None:
    bounds = ReplicaBounds(lo, lo + span, lo, lo + span)
    targets, notes = clamp_targets(ScalingPlan("a", p, d, sp, sd), bounds)
    for role, (want, want_standby) in {"prefill": (p, sp), "decode": (d, sd)}.items():
        active, standby = targets[role]
        assert lo <= active <= lo + span
        assert 0 <= standby <= lo + span - active
        assert (active == want and standby == want_standby) or any(role in n for n in notes)


def test_bounds_validate() -> None:
    with pytest.raises(ValueError, match="min_decode"):
        ReplicaBounds(min_decode=3, max_decode=2)


def test_dry_run_actuator_is_idempotent_and_exports_the_last_plan() -> None:
    act = DryRunActuator({"a": {"prefill": RoleReplicas(1, 1), "decode": RoleReplicas(2, 2)}})
    plan = ScalingPlan("a", 3, 2, 0, 1, reasons=("load up",))
    first = act.apply(plan, ReplicaBounds())
    assert {(c.role, c.tier, c.before, c.after) for c in first.changes} == {
        ("prefill", "active", 1, 3),
        ("decode", "standby", 0, 1),
    }
    assert act.apply(plan, ReplicaBounds()).changes == ()
    assert act.current("a").role("prefill").replicas == 3
    doc = act.export()
    assert doc["a"]["targets"]["decode"] == {"active": 2, "standby": 1}
    assert doc["a"]["reasons"] == ["load up"]


def test_simulator_actuator_sets_targets_once() -> None:
    pool = PoolSpec(prefill=RoleCounts(initial=1, min=1, max=4), decode=RoleCounts(initial=1, min=1, max=4))
    sim = Simulator(FleetSpec(pools=(pool,)), {}, models=analytic_models())
    act = SimulatorActuator(sim)
    assert act.current("default").role("decode").replicas == 1
    result = act.apply(ScalingPlan("default", 1, 3, 0, 1), ReplicaBounds(1, 4, 1, 4))
    assert [(c.role, c.tier, c.before, c.after) for c in result.changes] == [
        ("decode", "active", 1, 3),
        ("decode", "standby", 0, 1),
    ]
    events = len(sim.scale_events)
    again = act.apply(ScalingPlan("default", 1, 3, 0, 1), ReplicaBounds(1, 4, 1, 4))
    assert again.changes == () and len(sim.scale_events) == events
    assert act.current("default").role("decode") == RoleReplicas(3, 1, 1, 0)  # new ones still cold-starting
    sim.run_until(3600.0)
    assert act.current("default").role("decode") == RoleReplicas(3, 3, 1, 1)
    # bounds wider than the fleet's: the simulator's own clamp is reported, not hidden
    wide = act.apply(ScalingPlan("default", 9, 3, 0, 1), ReplicaBounds(1, 10, 1, 10))
    assert wide.targets["prefill"] == (4, 0) and any("simulator clamped" in n for n in wide.notes)
