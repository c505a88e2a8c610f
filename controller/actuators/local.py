"""The actuator for a local vLLM pool: sets ``serving.pools.manager.PoolManager`` replica counts.

``apply`` clamps the plan (``clamp_targets``), then scales each role whose server count differs; scale-up
returns once the new servers serve (registered with the router), scale-down once the removed ones drained
and stopped. A local pool has no warm-standby tier: standby targets are clamped to 0 with a note.
Errors: a server that fails to start is ``ActuatorUnavailable`` (retry; the servers that did start serve),
a missing model directory or an unknown pool is ``ActuatorError`` (a human must fix it).

Example::

    with PoolManager(PoolSettings(model_dir=Path("out/tiny"), work_dir=Path("out/pool"))) as pool:
        pool.up(prefill=1, decode=1)
        LocalPoolActuator(pool).apply(plan, ReplicaBounds(min_decode=1, max_decode=4))
"""

from __future__ import annotations

from typing import Protocol

from controller.actuators.base import (
    ActuatorError,
    ActuatorUnavailable,
    ApplyResult,
    Change,
    PoolReplicas,
    ReplicaBounds,
    RoleReplicas,
    clamp_targets,
)
from controller.policy.types import ROLES, ScalingPlan
from serving.pools.local import InstanceStartError


class ScalablePool(Protocol):
    """What the actuator needs of a pool manager (``PoolManager`` has it; tests pass a fake)."""

    name: str

    def count(self, role: str) -> int:
        """Servers of ``role`` the pool is set to (serving or starting)."""
        ...

    def ready(self, role: str) -> int:
        """Servers of ``role`` serving now (registered and healthy in the router)."""
        ...

    def scale(self, role: str, n: int) -> object:
        """Set ``role`` to ``n`` servers; return when done."""
        ...


class LocalPoolActuator:
    """The ``Actuator`` protocol over one local pool (``pool.name``, ``local`` by default)."""

    def __init__(self, pool: ScalablePool, *, retry_after_s: float = 10.0) -> None:
        self.pool = pool
        self.retry_after_s = retry_after_s

    def _check(self, pool: str) -> None:
        if pool != self.pool.name:
            raise ActuatorError(
                f"LocalPoolActuator: manages pool {self.pool.name!r} only, asked for {pool!r} "
                "(name the plan's pool like the PoolManager)"
            )

    def current(self, pool: str) -> PoolReplicas:
        """``replicas``: servers the pool has (serving, starting or being healed); ``ready``: serving."""
        self._check(pool)
        roles = {role: RoleReplicas(self.pool.count(role), self.pool.ready(role)) for role in ROLES}
        return PoolReplicas(pool, roles)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        self._check(plan.pool)
        targets, notes = clamp_targets(plan, bounds)
        changes: list[Change] = []
        for role in ROLES:
            active, standby = targets[role]
            if standby:
                notes.append(f"{plan.pool}/{role}: standby {standby} set to 0 (a local pool has no standby)")
                targets[role] = (active, 0)
            before = self.pool.count(role)
            if before == active:
                continue
            counts = {r: self.pool.count(r) for r in ROLES}
            try:
                self.pool.scale(role, active)
            except InstanceStartError as err:
                raise ActuatorUnavailable(
                    f"LocalPoolActuator: {plan.pool}/{role} {before} -> {active}: {err}", self.retry_after_s
                ) from err
            except (FileNotFoundError, ValueError) as err:
                raise ActuatorError(
                    f"LocalPoolActuator: {plan.pool}/{role} {before} -> {active}: {err}"
                ) from err
            # every role whose count moved: on mixed-node pools a prefill change adds or removes whole nodes,
            # so decode moves with it
            for r in ROLES:
                after = self.pool.count(r)
                if after != counts[r]:
                    changes.append(Change(plan.pool, r, "active", "local", counts[r], after))
        return ApplyResult(plan.pool, targets, tuple(changes), dry_run=False, notes=tuple(notes))
