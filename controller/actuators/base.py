"""The actuator seam: read a pool's replicas, apply a ``ScalingPlan``. Idempotent, defensively clamped.

Every actuator re-clamps the plan to the ``ReplicaBounds`` it is given (the policy clamps too; an actuator
never trusts a caller to have done it), writes only what differs from the current state (applying the same
plan twice makes no second write) and returns what changed. Errors are split as the daemon's single error
boundary needs them: ``ActuatorUnavailable`` is temporary (retry after ``retry_after_s``),
``ActuatorError`` otherwise is permanent (configuration or cluster state a human must fix).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.config import PolicyConfig
from controller.policy.types import ROLES, ScalingPlan

TIERS: tuple[str, ...] = ("active", "standby")


class ActuatorError(RuntimeError):
    """Permanent: retrying will not help (a missing Deployment, a rejected value, bad credentials)."""


class ActuatorUnavailable(ActuatorError):
    """Temporary: the backend is down, overloaded, slow or raced us; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RoleReplicas:
    """One role of a pool: ``replicas`` = the active tier's spec, ``ready`` of those serving; standby likewise."""

    replicas: int
    ready: int
    standby: int = 0
    standby_ready: int = 0


@dataclass(frozen=True)
class PoolReplicas:
    """A pool's replicas per role (``prefill``, ``decode``)."""

    pool: str
    roles: Mapping[str, RoleReplicas]

    def role(self, role: str) -> RoleReplicas:
        return self.roles.get(role, RoleReplicas(0, 0))


@dataclass(frozen=True)
class ReplicaBounds:
    """Min/max active replicas per role; standby is clamped to ``[0, max - active]`` as the simulator does."""

    min_prefill: int = 0
    max_prefill: int = 64
    min_decode: int = 0
    max_decode: int = 64

    def __post_init__(self) -> None:
        for role in ROLES:
            lo, hi = self.of(role)
            if not 0 <= lo <= hi:
                raise ValueError(f"ReplicaBounds: need 0 <= min_{role} ({lo}) <= max_{role} ({hi})")

    @classmethod
    def from_policy(cls, cfg: PolicyConfig) -> ReplicaBounds:
        return cls(cfg.min_prefill, cfg.max_prefill, cfg.min_decode, cfg.max_decode)

    def of(self, role: str) -> tuple[int, int]:
        if role == "prefill":
            return self.min_prefill, self.max_prefill
        if role == "decode":
            return self.min_decode, self.max_decode
        raise ValueError(f"ReplicaBounds: unknown role {role!r}; roles are {ROLES}")


@dataclass(frozen=True)
class Change:
    """One write (or, in dry-run, one write that would have been made)."""

    pool: str
    role: str
    tier: str  # "active" | "standby"
    target: str  # what was written: a Deployment name, or "simulator"/"dry-run"
    before: int
    after: int


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did: the clamped targets, the changes, and why targets differ from the plan."""

    pool: str
    targets: Mapping[str, tuple[int, int]]  # role -> (active, standby) after clamping
    changes: tuple[Change, ...] = ()
    dry_run: bool = False
    notes: tuple[str, ...] = field(default=())  # clamping and other adjustments, in words

    @property
    def changed(self) -> bool:
        return bool(self.changes) and not self.dry_run


def clamp_targets(plan: ScalingPlan, bounds: ReplicaBounds) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """``role -> (active, standby)`` within ``bounds``, and a note for every value that was changed."""
    targets: dict[str, tuple[int, int]] = {}
    notes: list[str] = []
    for role in ROLES:
        lo, hi = bounds.of(role)
        want, want_standby = plan.count(role), plan.standby(role)
        active = min(max(want, lo), hi)
        standby = min(max(want_standby, 0), hi - active)
        if active != want:
            notes.append(f"{plan.pool}/{role}: active {want} clamped to {active} (bounds [{lo}, {hi}])")
        if standby != want_standby:
            notes.append(
                f"{plan.pool}/{role}: standby {want_standby} clamped to {standby} (max {hi} - active)"
            )
        targets[role] = (active, standby)
    return targets, notes


class Actuator(Protocol):
    """Reads and sets a pool's replicas. Implementations: Kubernetes, dry-run, simulator."""

    def current(self, pool: str) -> PoolReplicas:
        """The pool's replicas as the backend has them now (never a cached guess)."""
        ...

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        """Set the pool to ``plan`` clamped to ``bounds``; write nothing that is already so."""
        ...
