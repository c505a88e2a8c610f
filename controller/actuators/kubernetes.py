"""Scale vLLM pools on Kubernetes: Deployments per (pool, role, tier), written only through ``/scale``.

A pool's Deployments are found by label in one namespace::

    pdscale.io/pool=<pool>   pdscale.io/role=<prefill|decode>   pdscale.io/tier=<active|standby>

(no tier label = ``active``; the warm standby of a role is its own Deployment). A PD-mixed-node pool's pods
hold both roles, so its Deployment carries ``pdscale.io/placement=mixed-node`` and no role label: it stands for
both roles of its tier and is written once, with the larger of the two targets (the controller plans mixed
pools in whole nodes, prefill = decode = nodes). Reading is one
``list_namespaced_deployment`` per call; writing is a merge patch ``{"spec": {"replicas": N}}`` on the
Deployment's scale subresource, skipped when ``spec.replicas`` is already N, so applying a plan twice makes
no second write. A 409 Conflict is retried (bounded) after re-reading the scale; 429, 5xx, timeouts and
connection failures raise ``ActuatorUnavailable`` (temporary); a missing Deployment, a 403 and other 4xx
raise ``ActuatorError`` naming the Deployment. ``dry_run=True`` (advisory mode) reads the cluster, logs and
records in ``would_patch`` what it would write, and writes nothing.

Tested with the official client against the in-process API server of ``tests/support/kube_apiserver.py``
(real paths, bodies and status codes), not against a live cluster.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

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
from controller.settings import KubernetesSettings

log = logging.getLogger(__name__)

LABEL_POOL = "pdscale.io/pool"
LABEL_ROLE = "pdscale.io/role"
LABEL_TIER = "pdscale.io/tier"
LABEL_PLACEMENT = "pdscale.io/placement"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class _Deployment:
    name: str
    role: str
    tier: str
    replicas: int
    ready: int


def api_client(
    *, kubeconfig: str | Path | None = None, context: str | None = None, in_cluster: bool = False
) -> k8s.ApiClient:
    """An ``ApiClient`` from a kubeconfig (default location when None) or the pod's service account.

    urllib3's own retries are off: a hung or failing API server costs one ``request_timeout_s``, and the
    daemon's next tick is the retry.
    """
    cfg = k8s.Configuration()
    if in_cluster:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            context=context,
            client_configuration=cfg,
            persist_config=False,
        )
    cfg.retries = False
    return k8s.ApiClient(cfg)


def _selector(pool: str, role: str | None = None, tier: str | None = None) -> str:
    parts = [f"{LABEL_POOL}={pool}"]
    if role is not None:
        parts.append(f"{LABEL_ROLE}={role}")
    if tier is not None:
        parts.append(f"{LABEL_TIER}={tier}")
    return ",".join(parts)


def _message(err: ApiException) -> str:
    """The API server's Status message, or the HTTP reason."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(err.reason)


def _retry_after_s(err: ApiException, default: float) -> float:
    headers = err.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(float(value), 0.0) if value is not None else default
    except ValueError:
        return default


def _shared_targets(
    deps: dict[tuple[str, str], _Deployment], targets: dict[str, tuple[int, int]]
) -> dict[str, int]:
    """Deployment name -> replicas for each Deployment standing for both roles (mixed-node): the larger of
    its roles' targets in its tier (equal when the plan is in whole nodes)."""
    roles_of: dict[str, list[tuple[str, int]]] = {}
    for (role, tier), dep in deps.items():
        roles_of.setdefault(dep.name, []).append((role, TIERS.index(tier)))
    return {
        name: max(targets[role][i] for role, i in uses) for name, uses in roles_of.items() if len(uses) > 1
    }


class KubernetesActuator:
    """See the module docstring. ``client`` is an ``ApiClient``; build one with :func:`api_client`."""

    def __init__(
        self,
        namespace: str,
        client: k8s.ApiClient,
        *,
        request_timeout_s: float = 5.0,
        max_conflict_retries: int = 3,
        dry_run: bool = False,
        retry_after_s: float = 1.0,
    ) -> None:
        if not namespace:
            raise ValueError("KubernetesActuator.namespace must not be empty")
        if not request_timeout_s > 0:
            raise ValueError(f"KubernetesActuator.request_timeout_s must be > 0, got {request_timeout_s}")
        if max_conflict_retries < 0:
            raise ValueError(
                f"KubernetesActuator.max_conflict_retries must be >= 0, got {max_conflict_retries}"
            )
        self.namespace = namespace
        self.apps = k8s.AppsV1Api(client)
        self.request_timeout_s = float(request_timeout_s)
        self.max_conflict_retries = max_conflict_retries
        self.dry_run = dry_run
        self.retry_after_s = retry_after_s
        self.would_patch: list[Change] = []  # dry-run: every write it did not make, in order

    @classmethod
    def from_settings(
        cls, settings: KubernetesSettings, client: k8s.ApiClient | None = None
    ) -> KubernetesActuator:
        """Build from validated settings (the client from the kubeconfig or in-cluster unless given)."""
        if client is None:
            client = api_client(
                kubeconfig=settings.kubeconfig, context=settings.context, in_cluster=settings.in_cluster
            )
        return cls(
            settings.namespace,
            client,
            request_timeout_s=settings.request_timeout_s,
            max_conflict_retries=settings.max_conflict_retries,
            dry_run=settings.dry_run,
        )

    # -- reading ---------------------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call with the request timeout; transport failures become ``ActuatorUnavailable``."""
        try:
            return fn(*args, _request_timeout=self.request_timeout_s, **kwargs)
        except urllib3.exceptions.HTTPError as err:  # timeouts, refused connections, broken responses
            raise ActuatorUnavailable(
                f"Kubernetes API: {what} in namespace {self.namespace!r} failed: {type(err).__name__}: {err}",
                self.retry_after_s,
            ) from err

    def _error(self, err: ApiException, what: str, name: str | None = None) -> ActuatorError:
        status = err.status or 0
        text = f"Kubernetes API: {what} in namespace {self.namespace!r}: HTTP {status}: {_message(err)}"
        if status == 404 and name is not None:
            return ActuatorError(
                f"Deployment {self.namespace}/{name} not found (was it deleted or renamed?); {text}"
            )
        if status in (0, 409, 429) or status >= 500:
            return ActuatorUnavailable(text, _retry_after_s(err, self.retry_after_s))
        if status in (401, 403):
            return ActuatorError(
                f"{text} (check the controller's RBAC: it needs list deployments, get and patch deployments/scale)"
            )
        return ActuatorError(text)

    def _deployments(self, pool: str) -> dict[tuple[str, str], _Deployment]:
        what = f"list Deployments {_selector(pool)}"
        try:
            listing = self._call(
                what, self.apps.list_namespaced_deployment, self.namespace, label_selector=_selector(pool)
            )
        except ApiException as err:
            raise self._error(err, what) from err
        found: dict[tuple[str, str], _Deployment] = {}
        for item in listing.items:
            labels = item.metadata.labels or {}
            name = item.metadata.name
            role, tier = labels.get(LABEL_ROLE), labels.get(LABEL_TIER, "active")
            roles: tuple[str, ...] = (role,) if role is not None else ()
            if role is None and labels.get(LABEL_PLACEMENT) == "mixed-node":
                role, roles = "mixed-node", ROLES  # a node's pod holds both roles
            if role is None:
                log.debug(
                    "Deployment %s/%s has no %s label: not a pool role, ignored",
                    self.namespace,
                    name,
                    LABEL_ROLE,
                )
                continue
            if not set(roles) <= set(ROLES) or tier not in TIERS:
                raise ActuatorError(
                    f"Deployment {self.namespace}/{name}: labels {LABEL_ROLE}={role!r}, {LABEL_TIER}={tier!r}; "
                    f"expected a role in {ROLES} and a tier in {TIERS}"
                )
            ready = (item.status.ready_replicas if item.status is not None else None) or 0
            for r in roles:
                other = found.get((r, tier))
                if other is not None:
                    raise ActuatorError(
                        f"Deployments {self.namespace}/{other.name} and {self.namespace}/{name} both stand for "
                        f"{_selector(pool, r, tier)} (a role label, or {LABEL_PLACEMENT}=mixed-node for both "
                        "roles): exactly one may"
                    )
                found[(r, tier)] = _Deployment(name, r, tier, int(item.spec.replicas or 0), int(ready))
        return found

    def current(self, pool: str) -> PoolReplicas:
        """The pool's replicas as the cluster has them (spec and ready, active and standby tiers)."""
        deps = self._deployments(pool)
        roles = {}
        for role in ROLES:
            active, standby = deps.get((role, "active")), deps.get((role, "standby"))
            roles[role] = RoleReplicas(
                replicas=active.replicas if active else 0,
                ready=active.ready if active else 0,
                standby=standby.replicas if standby else 0,
                standby_ready=standby.ready if standby else 0,
            )
        return PoolReplicas(pool, roles)

    # -- writing ---------------------------------------------------------------------------------

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        """Scale the pool's Deployments to ``plan`` clamped to ``bounds``; patch only what differs."""
        targets, notes = clamp_targets(plan, bounds)
        deps = self._deployments(plan.pool)
        changes: list[Change] = []
        shared = _shared_targets(deps, targets)  # mixed-node Deployments: one write, the larger target
        written: set[str] = set()
        for role in ROLES:
            active, standby = targets[role]
            if (role, "active") not in deps:
                raise ActuatorError(
                    f"no Deployment labelled {_selector(plan.pool, role, 'active')} in namespace "
                    f"{self.namespace!r}: pool {plan.pool!r} cannot be scaled"
                )
            if standby > 0 and (role, "standby") not in deps:
                notes.append(
                    f"{plan.pool}/{role}: standby {standby} not applied: no Deployment labelled "
                    f"{_selector(plan.pool, role, 'standby')}"
                )
                targets[role] = (active, 0)
            for tier, want in zip(TIERS, targets[role], strict=True):
                dep = deps.get((role, tier))
                if dep is None or dep.name in written:
                    continue
                if dep.name in shared:
                    want = shared[dep.name]
                    written.add(dep.name)
                if dep.replicas == want:
                    continue
                change = Change(plan.pool, role, tier, dep.name, dep.replicas, want)
                if self.dry_run:
                    self.would_patch.append(change)
                    log.info(
                        "dry-run: would scale Deployment %s/%s %d -> %d",
                        self.namespace,
                        dep.name,
                        dep.replicas,
                        want,
                    )
                elif not self._patch_scale(dep.name, want):
                    continue  # someone else set it meanwhile (seen on a conflict re-read)
                else:
                    log.info("scaled Deployment %s/%s %d -> %d", self.namespace, dep.name, dep.replicas, want)
                changes.append(change)
        for note in notes:
            log.warning("%s", note)
        return ApplyResult(plan.pool, targets, tuple(changes), self.dry_run, tuple(notes))

    def _patch_scale(self, name: str, replicas: int) -> bool:
        """Merge-patch ``spec.replicas``; on 409 re-read and retry. False if the re-read already shows it."""
        what = f"patch Deployment {name}/scale to {replicas}"
        body = {"spec": {"replicas": replicas}}
        for attempt in range(self.max_conflict_retries + 1):
            try:
                self._call(
                    what,
                    self.apps.patch_namespaced_deployment_scale,
                    name,
                    self.namespace,
                    body,
                    _content_type=MERGE_PATCH,
                )
                return True
            except ApiException as err:
                if err.status != 409 or attempt == self.max_conflict_retries:
                    raise self._error(err, what, name) from err
                log.info(
                    "conflict on Deployment %s/%s scale (attempt %d): re-reading",
                    self.namespace,
                    name,
                    attempt + 1,
                )
            if self._read_replicas(name) == replicas:
                return False
        raise AssertionError("unreachable: the loop returns or raises")

    def _read_replicas(self, name: str) -> int:
        what = f"read Deployment {name}/scale"
        try:
            scale = self._call(what, self.apps.read_namespaced_deployment_scale, name, self.namespace)
        except ApiException as err:
            raise self._error(err, what, name) from err
        return int(scale.spec.replicas or 0)
