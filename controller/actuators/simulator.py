"""The actuator for replays: sets targets on ``serving.sim.engine.Simulator`` (virtual clock)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.actuators.base import (
    TIERS,
    ApplyResult,
    Change,
    PoolReplicas,
    ReplicaBounds,
    RoleReplicas,
    clamp_targets,
)
from controller.policy.types import ROLES, ScalingPlan

if TYPE_CHECKING:
    from serving.sim.engine import Simulator

# Instances heading for service count as a Deployment's spec.replicas would (as controller.replay_policies).
_HEADING_ACTIVE = ("active", "activating", "provisioning")


class SimulatorActuator:
    """Wraps ``Simulator.set_target``; calls it only when the clamped target differs from the last one set."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self._set: dict[tuple[str, str], tuple[int, int]] = {}  # (pool, role) -> (active, standby) last set

    def current(self, pool: str) -> PoolReplicas:
        """``replicas``/``standby``: the target last set through this actuator (what a Deployment's spec
        would say; the simulator's counts cannot tell a standby still provisioning from an active one), or,
        before the first set, the instances heading for each state. ``ready``: active instances now."""
        counts = self.sim.counts(pool)
        roles = {}
        for role in ROLES:
            c = counts.get(role, {})
            heading = sum(c.get(s, 0) for s in _HEADING_ACTIVE)
            active, standby = self._set.get((pool, role), (heading, c.get("standby", 0)))
            roles[role] = RoleReplicas(active, c.get("active", 0), standby, c.get("standby", 0))
        return PoolReplicas(pool, roles)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        targets, notes = clamp_targets(plan, bounds)
        now = self.current(plan.pool)
        changes = []
        for role in ROLES:
            key = (plan.pool, role)
            r = now.role(role)
            before = self._set.get(key, (r.replicas, r.standby))
            if before == targets[role]:
                continue
            got = self.sim.set_target(plan.pool, role, *targets[role])
            if got != targets[role]:
                notes.append(
                    f"{plan.pool}/{role}: simulator clamped {targets[role]} to {got} (its fleet bounds)"
                )
                targets[role] = got
            self._set[key] = got
            for tier, old, new in zip(TIERS, before, got, strict=True):
                if old != new:
                    changes.append(Change(plan.pool, role, tier, "simulator", old, new))
        return ApplyResult(plan.pool, targets, tuple(changes), dry_run=False, notes=tuple(notes))
