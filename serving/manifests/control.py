"""The controller's objects: ServiceAccount, least-privilege Role + RoleBinding, ConfigMap, Deployment.

The ConfigMap holds a controller configuration (the YAML ``pdscale controller --config`` reads; the
controller validates it as ``controller.config.ControllerConfig``). Serving may not import controller, so
it is built here as a plain dict; ``tests/manifests`` validates it with the real model.

RBAC is exactly what the controller calls (``controller/actuators/kubernetes.py`` and
``controller/leader.py``): list/get/watch Deployments, get/patch ``deployments/scale``, get/create/update
Leases; with ``ManifestSpec.router_drain`` also list/patch pods (``controller/actuators/router_admin.py``'s
``PodDeletionCostMarker``). No wildcard, no Secrets, nothing cluster-wide.
"""

from __future__ import annotations

from typing import Any

import yaml

from serving.manifests.spec import (
    CONTROLLER_CONFIG_DIR,
    CONTROLLER_CONFIG_FILE,
    CONTROLLER_METRICS_PORT,
    ManifestSpec,
)
from serving.manifests.workloads import Obj, metadata, part_of

CONTROLLER_NAME = "pdscale-controller"

RBAC_RULES: tuple[Obj, ...] = (
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
)
# With the router drain: list the pool's pods (by the pool/role labels) and patch the drained ones'
# controller.kubernetes.io/pod-deletion-cost annotation.
ROUTER_DRAIN_RBAC_RULES: tuple[Obj, ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
)
ROUTER_DRAIN_TIMEOUT_S = 120.0  # one cold start (llama3-8b/a100): a request longer than that is retried


def rbac_rules(spec: ManifestSpec) -> tuple[Obj, ...]:
    """The controller Role's rules: ``RBAC_RULES``, plus ``ROUTER_DRAIN_RBAC_RULES`` with ``router_drain``."""
    return RBAC_RULES + (ROUTER_DRAIN_RBAC_RULES if spec.router_drain else ())


def router_admin_config(spec: ManifestSpec) -> dict[str, Any]:
    """``actuator.router_admin`` for the pool's router Service (port 80 -> the router's admin API)."""
    url = f"http://{spec.name('router')}.{spec.namespace}.svc"
    return {"pools": {spec.pool: {"url": url}}, "drain_timeout_s": ROUTER_DRAIN_TIMEOUT_S, "mark_pods": True}


def controller_config(spec: ManifestSpec) -> dict[str, Any]:
    """The controller configuration for this pool: Prometheus in, Kubernetes out, metrics on 9100.

    A mixed-node pool is configured as such (``placement: mixed-node``, the prefill container's share of the
    two containers' memory as ``prefill_mem_frac``): the controller scales whole nodes, i.e. the
    ``pd-mixed`` Deployment, and keeps no standby (the ``pd-mixed-standby`` Deployment goes to 0)."""
    mixed = spec.placement == "mixed-node"
    placement: dict[str, Any] = {}
    if mixed:
        share = spec.prefill_mem_frac / (spec.prefill_mem_frac + spec.decode_share)
        placement = {"placement": "mixed-node", "prefill_mem_frac": round(share, 4)}
    return {
        "tick_s": 1.0,
        "pools": [
            {
                "name": spec.pool,
                "profile": spec.profile,
                "slo_ttft_ms": spec.slo_ttft_ms,
                "slo_itl_ms": spec.slo_itl_ms,
                **placement,
                "policy": {
                    "standby_decode": 0 if mixed else spec.standby_decode,
                    "standby_prefill": 0,
                    "min_prefill": min(1, spec.prefill),
                    "max_prefill": spec.max_prefill,
                    "min_decode": min(1, spec.decode),
                    "max_decode": spec.max_decode,
                },
            }
        ],
        "source": {
            "kind": "prometheus",
            "url": spec.prometheus_url,
            "instance_label": "instance",
            "pool_label": "pool",  # set from the pod label by the scrape config (monitoring.scrape_config)
            "role_label": "role",
        },
        "actuator": {
            "kind": "kubernetes",
            "namespace": spec.namespace,
            **({"router_admin": router_admin_config(spec)} if spec.router_drain else {}),
        },
        "metrics_port": CONTROLLER_METRICS_PORT,
    }


def controller_config_yaml(spec: ManifestSpec) -> str:
    return yaml.safe_dump(controller_config(spec), sort_keys=False)


def controller_objects(spec: ManifestSpec) -> list[Obj]:
    """ServiceAccount, Role, RoleBinding, ConfigMap and Deployment of the controller, in apply order."""
    labels = part_of("controller") | {"app.kubernetes.io/name": CONTROLLER_NAME}
    service_account: Obj = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(spec, CONTROLLER_NAME, dict(labels)),
    }
    role: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(spec, CONTROLLER_NAME, dict(labels)),
        "rules": [{k: list(v) for k, v in rule.items()} for rule in rbac_rules(spec)],
    }
    binding: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(spec, CONTROLLER_NAME, dict(labels)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": spec.namespace}],
    }
    config_map: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(spec, CONTROLLER_NAME, dict(labels)),
        "data": {CONTROLLER_CONFIG_FILE: controller_config_yaml(spec)},
    }
    return [service_account, role, binding, config_map, _controller_deployment(spec, labels)]


def _controller_deployment(spec: ManifestSpec, labels: dict[str, str]) -> Obj:
    port = CONTROLLER_METRICS_PORT
    container: Obj = {
        "name": "controller",
        "image": spec.pdscale_image,
        "command": ["pdscale", "controller"],
        "args": [
            "--config",
            f"{CONTROLLER_CONFIG_DIR}/{CONTROLLER_CONFIG_FILE}",
            "--leader-elect",
            "--in-cluster",  # the pod's service account, not a kubeconfig
            "--log-format",
            "json",
        ],
        "env": [{"name": "HOME", "value": "/tmp"}],  # the root filesystem is read-only
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "initialDelaySeconds": 30,  # the forecaster checkpoint loads before the first tick
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONTROLLER_CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, CONTROLLER_NAME, dict(labels)),
        "spec": {
            "replicas": spec.controller_replicas,  # one leads (Lease), the others stay warm
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": CONTROLLER_NAME,
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": CONTROLLER_NAME}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
