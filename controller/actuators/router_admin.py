"""Drain a pool's router backends before the orchestrator removes them (Kubernetes scale-down).

Kubernetes' actuator writes only ``/scale``: the ReplicaSet then deletes pods while the pdscale router may
still be streaming from them. ``DrainingActuator`` wraps any actuator: before a role scales down by ``k``,
it picks ``k`` of that role's router backends (those already draining first, then the least busy), tells the
router's admin API to drain them (``DELETE /admin/backends/{id}``: no new requests, in-flight ones finish),
waits until they hold no request (``drain_timeout_s`` at most), lets a ``DeletionMarker`` tell the
orchestrator which instances to remove (on Kubernetes: ``PodDeletionCostMarker`` sets the pods'
``controller.kubernetes.io/pod-deletion-cost``, so the ReplicaSet deletes exactly the drained pods), and
only then applies the plan. If the inner ``apply`` fails, the drained backends are put back
(``POST /admin/backends`` with the same spec: the router cancels a drain when a draining backend is
re-added; one that finished draining is registered again).

The router's admin API is ``serving/router/app.py``'s: ``GET /admin/backends``, ``POST /admin/backends``,
``DELETE /admin/backends/{id}`` (optionally ``Authorization: Bearer TOKEN``). Errors: connection failures,
timeouts and 5xx raise ``ActuatorUnavailable`` (retry later); other 4xx raise ``ActuatorError``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.actuators.base import (
    Actuator,
    ActuatorError,
    ActuatorUnavailable,
    ApplyResult,
    PoolReplicas,
    ReplicaBounds,
    clamp_targets,
)
from controller.policy.types import ROLES, ScalingPlan

log = logging.getLogger(__name__)

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DRAINED_DELETION_COST = -1000  # below every pod's default 0: the ReplicaSet removes these first


@dataclass(frozen=True)
class RouterBackend:
    """One backend as the router's admin API lists it (``spec`` is the registration body, for re-adding)."""

    id: str
    url: str
    role: str
    in_flight: int
    healthy: bool
    draining: bool
    spec: Mapping[str, Any]

    @property
    def host(self) -> str:
        """The backend's host (on Kubernetes the pod IP)."""
        return urllib.parse.urlsplit(self.url).hostname or ""


_SPEC_FIELDS = ("id", "url", "role", "node", "long_context", "high_memory", "max_in_flight")


class RouterAdmin:
    """A small synchronous client of the router's admin API. ``base_url`` like ``http://router:8080``."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 5.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"RouterAdmin.base_url: {base_url!r} must start with http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        what = f"router admin {method} {self.base_url}{path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if err.code >= 500 or err.code == 429:
                raise ActuatorUnavailable(f"{what}: HTTP {err.code}: {detail}", retry_after_s=2.0) from err
            if err.code == 404:
                return 404, None
            raise ActuatorError(f"{what}: HTTP {err.code}: {detail}") from err
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            raise ActuatorUnavailable(f"{what}: {err}", retry_after_s=2.0) from err

    def backends(self) -> list[RouterBackend]:
        """Every registered backend, draining ones included."""
        _, doc = self._call("GET", "/admin/backends")
        out = []
        for b in doc["backends"]:
            spec = {k: b[k] for k in _SPEC_FIELDS if k in b}
            out.append(
                RouterBackend(
                    b["id"],
                    b["url"],
                    b["role"],
                    int(b["in_flight"]),
                    bool(b["healthy"]),
                    bool(b["draining"]),
                    spec,
                )
            )
        return out

    def drain(self, backend_id: str) -> bool:
        """Start draining ``backend_id`` (no new requests); False when the router does not know it."""
        status, _ = self._call("DELETE", f"/admin/backends/{urllib.parse.quote(backend_id, safe='')}")
        return status != 404

    def restore(self, backend: RouterBackend) -> None:
        """Register ``backend`` again with its spec (cancels a drain in progress)."""
        status, _ = self._call("POST", "/admin/backends", backend.spec)
        if status == 404:
            raise ActuatorError(f"router admin POST {self.base_url}/admin/backends: 404 (no admin API?)")


class DeletionMarker(Protocol):
    """Tells the orchestrator which instances a scale-down should remove (the drained ones)."""

    def mark(self, pool: str, role: str, backends: Sequence[RouterBackend]) -> list[str]:
        """Mark ``backends`` for removal; return notes (what could not be marked, in words)."""
        ...


class PodLister(Protocol):
    """The two ``CoreV1Api`` calls ``PodDeletionCostMarker`` needs (RBAC: pods list, patch)."""

    def list_namespaced_pod(self, namespace: str, *, label_selector: str = ...) -> Any: ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any: ...


class PodDeletionCostMarker:
    """Kubernetes: the pods whose IP is a drained backend's host get ``pod-deletion-cost: -1000``, so the
    ReplicaSet removes them first on scale-down. Pods are listed by the pool/role labels the manifests set."""

    def __init__(self, core: PodLister, namespace: str) -> None:
        self.core = core
        self.namespace = namespace

    def mark(self, pool: str, role: str, backends: Sequence[RouterBackend]) -> list[str]:
        selector = f"pdscale.io/pool={pool},pdscale.io/role={role}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        by_ip = {p.status.pod_ip: p.metadata.name for p in pods if p.status is not None and p.status.pod_ip}
        notes = []
        body = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(DRAINED_DELETION_COST)}}}
        for b in backends:
            name = by_ip.get(b.host)
            if name is None:
                notes.append(f"{pool}/{role}: no pod with IP {b.host} for drained backend {b.id}: not marked")
                continue
            self.core.patch_namespaced_pod(name, self.namespace, body)
        return notes


@dataclass(frozen=True)
class DrainSettings:
    """``drain_timeout_s``: longest wait for drained backends to finish their requests (then the scale-down
    goes ahead and the router retries what had not streamed yet); ``poll_s``: how often to look."""

    drain_timeout_s: float = 120.0
    poll_s: float = 0.5


class DrainingActuator:
    """An ``Actuator`` that drains router backends before the wrapped actuator scales a role down.

    One router per pool (``routers`` maps the pool name to its admin client), as the manifests render it.
    Scale-ups and pools without a router pass straight through. Example::

        inner = KubernetesActuator(namespace="llm", client=api_client())
        actuator = DrainingActuator(inner, {"chat": RouterAdmin("http://chat-router.llm.svc")},
                                    marker=PodDeletionCostMarker(CoreV1Api(api_client()), "llm"))
    """

    def __init__(
        self,
        inner: Actuator,
        routers: Mapping[str, RouterAdmin],
        *,
        marker: DeletionMarker | None = None,
        settings: DrainSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inner = inner
        self.routers = dict(routers)
        self.marker = marker
        self.settings = settings or DrainSettings()
        self.clock = clock
        self.sleep = sleep

    def current(self, pool: str) -> PoolReplicas:
        return self.inner.current(pool)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        router = self.routers.get(plan.pool)
        if router is None or getattr(self.inner, "dry_run", False):
            return self.inner.apply(plan, bounds)
        targets, _ = clamp_targets(plan, bounds)
        now = self.inner.current(plan.pool)
        cuts = {
            r: now.role(r).replicas - targets[r][0] for r in ROLES if now.role(r).replicas > targets[r][0]
        }
        if not cuts:
            return self.inner.apply(plan, bounds)
        notes: list[str] = []
        victims = self._pick(router, plan.pool, cuts, notes)
        drained: list[RouterBackend] = []
        try:
            for backends in victims.values():
                for b in backends:
                    if not b.draining and router.drain(b.id):
                        drained.append(b)
            notes += self._wait_drained(router, [b for bs in victims.values() for b in bs])
            if self.marker is not None:
                for role, backends in victims.items():
                    notes += self.marker.mark(plan.pool, role, backends)
            result = self.inner.apply(plan, bounds)
        except BaseException:
            self._restore(router, drained)
            raise
        return dataclasses.replace(result, notes=(*result.notes, *notes))

    def _pick(
        self, router: RouterAdmin, pool: str, cuts: Mapping[str, int], notes: list[str]
    ) -> dict[str, list[RouterBackend]]:
        """Per role, the backends to drain: already draining first, then the fewest requests in flight."""
        listed = router.backends()
        out: dict[str, list[RouterBackend]] = {}
        for role, k in cuts.items():
            mine = sorted(
                (b for b in listed if b.role == role), key=lambda b: (not b.draining, b.in_flight, b.id)
            )
            out[role] = mine[:k]
            if len(mine) < k:
                notes.append(
                    f"{pool}/{role}: scaling down by {k} but the router knows {len(mine)} {role} backends: "
                    "the others are removed undrained"
                )
        return out

    def _wait_drained(self, router: RouterAdmin, victims: Sequence[RouterBackend]) -> list[str]:
        ids = {b.id for b in victims}
        start = self.clock()
        while True:
            busy = {b.id: b.in_flight for b in router.backends() if b.id in ids and b.in_flight > 0}
            if not busy:
                waited = self.clock() - start
                return [f"drained {sorted(ids)} in {waited:.1f} s before scale-down"] if ids else []
            if self.clock() - start >= self.settings.drain_timeout_s:
                log.warning("drain timed out; scaling down with requests in flight: %s", busy)
                return [
                    f"drain of {sorted(busy)} timed out after {self.settings.drain_timeout_s:g} s with "
                    f"{sum(busy.values())} requests in flight: scaled down anyway"
                ]
            self.sleep(self.settings.poll_s)

    def _restore(self, router: RouterAdmin, drained: Sequence[RouterBackend]) -> None:
        for b in drained:
            try:
                router.restore(b)
            except ActuatorError as err:  # the original failure matters more; say what is left drained
                log.error("could not restore drained backend %s after a failed apply: %s", b.id, err)
