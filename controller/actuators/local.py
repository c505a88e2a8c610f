"""The actuator for a local vLLM pool: sets ``serving.pools.manager.PoolManager`` replica counts.

``apply`` clamps the plan (``clamp_targets``), then scales each role whose active or standby count differs
(``pool.scale(role, active, standby=standby)``): active up promotes warm standby first (a router
registration), then cold-starts; active down drains, then demotes to standby or stops; standby is refilled
or trimmed. It returns once every new server serves (or waits warm, for standby). Changes are reported per
tier (``"active"``, ``"standby"``). A pool without a standby tier (``standby_supported`` False: mixed-node
placement) gets standby 0 with a note.
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
    TIERS,
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

    @property
    def standby_supported(self) -> bool:
        """Whether the pool has a warm-standby tier."""
        ...

    def count(self, role: str) -> int:
        """Active servers of ``role`` the pool is set to (serving or starting)."""
        ...

    def ready(self, role: str) -> int:
        """Servers of ``role`` serving now (registered and healthy in the router)."""
        ...

    def standby_count(self, role: str) -> int:
        """Standby servers of ``role`` (warm, outside the router)."""
        ...

    def standby_ready(self, role: str) -> int:
        """Standby servers of ``role`` that are up."""
        ...

    def scale(self, role: str, n: int, standby: int | None = None) -> object:
        """Set ``role`` to ``n`` active and ``standby`` standby servers (None: keep); return when done."""
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
        """``replicas``: active servers the pool has (serving, starting or being healed); ``ready``: serving;
        ``standby`` / ``standby_ready``: warm standby servers, and those up."""
        self._check(pool)
        p = self.pool
        roles = {
            role: RoleReplicas(p.count(role), p.ready(role), p.standby_count(role), p.standby_ready(role))
            for role in ROLES
        }
        return PoolReplicas(pool, roles)

    def _counts(self) -> dict[tuple[str, str], int]:
        return {
            (r, tier): (self.pool.count(r) if tier == "active" else self.pool.standby_count(r))
            for r in ROLES
            for tier in TIERS
        }

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        self._check(plan.pool)
        targets, notes = clamp_targets(plan, bounds)
        changes: list[Change] = []
        for role in ROLES:
            active, standby = targets[role]
            if standby and not self.pool.standby_supported:
                notes.append(
                    f"{plan.pool}/{role}: standby {standby} set to 0 (this local pool has no standby tier: "
                    "mixed-node placement)"
                )
                standby = 0
                targets[role] = (active, 0)
            counts = self._counts()
            if counts[role, "active"] == active and counts[role, "standby"] == standby:
                continue
            what = f"{plan.pool}/{role} {counts[role, 'active']} -> {active}"
            if counts[role, "standby"] != standby:
                what += f", standby {counts[role, 'standby']} -> {standby}"
            try:
                self.pool.scale(role, active, standby=standby)
            except InstanceStartError as err:
                raise ActuatorUnavailable(f"LocalPoolActuator: {what}: {err}", self.retry_after_s) from err
            except (FileNotFoundError, ValueError) as err:
                raise ActuatorError(f"LocalPoolActuator: {what}: {err}") from err
            # every role and tier whose count moved: on mixed-node pools a prefill change adds or removes
            # whole nodes, so decode moves with it; a promotion moves both tiers
            after = self._counts()
            for r in ROLES:
                for tier in TIERS:
                    if after[r, tier] != counts[r, tier]:
                        changes.append(Change(plan.pool, r, tier, "local", counts[r, tier], after[r, tier]))
        return ApplyResult(plan.pool, targets, tuple(changes), dry_run=False, notes=tuple(notes))
