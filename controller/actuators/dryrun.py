"""Advisory mode without a cluster: remember and log what would be applied, and export it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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

log = logging.getLogger(__name__)


class DryRunActuator:
    """Keeps an in-memory replica count per pool and role (as if every write succeeded and every pod were
    ready at once), the last plan and result per pool, and logs every change it would make.

    ``initial``: ``pool -> role -> RoleReplicas`` to start from; an unknown pool starts at zero replicas.
    """

    def __init__(self, initial: Mapping[str, Mapping[str, RoleReplicas]] | None = None) -> None:
        self._state: dict[str, dict[str, tuple[int, int]]] = {
            pool: {role: (r.replicas, r.standby) for role, r in roles.items()}
            for pool, roles in (initial or {}).items()
        }
        self.last_plan: dict[str, ScalingPlan] = {}
        self.last_result: dict[str, ApplyResult] = {}

    def current(self, pool: str) -> PoolReplicas:
        state = self._state.get(pool, {})
        roles = {}
        for role in ROLES:
            active, standby = state.get(role, (0, 0))
            roles[role] = RoleReplicas(active, active, standby, standby)
        return PoolReplicas(pool, roles)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        targets, notes = clamp_targets(plan, bounds)
        state = self._state.setdefault(plan.pool, {})
        changes = []
        for role in ROLES:
            before = state.get(role, (0, 0))
            for tier, old, new in zip(TIERS, before, targets[role], strict=True):
                if old != new:
                    changes.append(Change(plan.pool, role, tier, "dry-run", old, new))
                    log.info("dry-run: %s/%s %s %d -> %d", plan.pool, role, tier, old, new)
            state[role] = targets[role]
        result = ApplyResult(plan.pool, dict(targets), tuple(changes), dry_run=False, notes=tuple(notes))
        self.last_plan[plan.pool] = plan
        self.last_result[plan.pool] = result
        return result

    def export(self) -> dict[str, Any]:
        """The last plan of every pool as JSON-ready data (for a status endpoint or a file)."""
        out: dict[str, Any] = {}
        for pool, plan in sorted(self.last_plan.items()):
            result = self.last_result[pool]
            out[pool] = {
                "plan": {
                    "prefill": plan.prefill,
                    "decode": plan.decode,
                    "standby_prefill": plan.standby_prefill,
                    "standby_decode": plan.standby_decode,
                    "buffer_seqs": plan.buffer_seqs,
                    "degrade": plan.degrade,
                },
                "targets": {role: {"active": a, "standby": s} for role, (a, s) in result.targets.items()},
                "reasons": list(plan.reasons),
                "notes": list(result.notes),
            }
        return out
