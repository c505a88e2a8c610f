"""The serving objects: vLLM prefill/decode Deployments (or mixed-node pods), their Services, the router.

Every object is a plain dict in the Kubernetes API's own JSON shape (camelCase), so it can be written as
YAML, loaded into the official client's models, and validated against the API's JSON schema.

Selectors include the tier, so the active and the standby Deployment of a role never claim each other's
pods. Services route to ``tier=active`` pods only: a warm standby is loaded and ready but takes no traffic
until the controller scales it (the actuator writes only ``/scale``; see docs/DEPLOY.md). The prefill and
decode Services are headless, so the router resolves every instance's pod IP (a P/D pair talks to one
prefill and one decode instance, not to a load-balanced virtual IP).
"""

from __future__ import annotations

import json
from typing import Any

from serving.manifests.spec import (
    ANNOTATION_PLACEHOLDER,
    LABEL_PLACEMENT,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TIER,
    NIXL_SIDE_CHANNEL_PORT,
    ROUTER_PORT,
    VLLM_HTTP_PORT,
    ManifestSpec,
)

Obj = dict[str, Any]

KV_TRANSFER_CONFIG = json.dumps(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":")
)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_CLAIM = "gpus"  # the pod-level ResourceClaim both mixed-node containers reference (--gpu-sharing dra)
# Model download plus weight loading: up to 60 x 10 s = 10 min before the liveness probe takes over.
STARTUP_FAILURES = 60


def part_of(component: str) -> dict[str, str]:
    """The recommended ``app.kubernetes.io`` labels of a pdscale component."""
    return {"app.kubernetes.io/part-of": "pdscale", "app.kubernetes.io/component": component}


def pool_labels(spec: ManifestSpec, role: str, tier: str) -> dict[str, str]:
    """The labels the controller's actuator selects a role's Deployment by."""
    return {LABEL_POOL: spec.pool, LABEL_ROLE: role, LABEL_TIER: tier}


def metadata(spec: ManifestSpec, name: str, labels: dict[str, str], **annotations: str) -> Obj:
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": labels}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _probe(path: str, port: int | str, period_s: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _vllm_env(side_channel_port: int) -> list[Obj]:
    return [
        # NIXL's side channel must advertise an address the peer pod can reach: the pod's own IP.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(side_channel_port)},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {
            "name": "HF_TOKEN",  # gated models (Llama) need it; optional, so public models start without it
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
        },
    ]


def vllm_container(
    spec: ManifestSpec,
    role: str,
    *,
    http_port: int = VLLM_HTTP_PORT,
    side_channel_port: int = NIXL_SIDE_CHANNEL_PORT,
    gpu_memory_utilization: float | None = None,
    gpus: int | None = None,
) -> Obj:
    """One vLLM OpenAI server of ``role`` with the NIXL KV connector. ``gpus=0`` requests no GPU (the
    mixed-node decode container, which shares the prefill container's devices)."""
    args = [
        spec.model,
        "--served-model-name",
        spec.model_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(http_port),
        "--tensor-parallel-size",
        str(spec.gpus_per_instance),
        "--kv-transfer-config",
        KV_TRANSFER_CONFIG,
    ]
    if gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    n_gpus = spec.gpus_per_instance if gpus is None else gpus
    resources: Obj = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "64Gi"}}
    if n_gpus > 0:
        resources["requests"][GPU_RESOURCE] = str(n_gpus)
        resources["limits"][GPU_RESOURCE] = str(n_gpus)
    return {
        "name": f"vllm-{role}",
        "image": spec.image,
        "command": ["vllm", "serve"],
        "args": args,
        "env": _vllm_env(side_channel_port),
        "ports": [
            {"name": f"http-{role[:3]}", "containerPort": http_port, "protocol": "TCP"},
            {"name": f"nixl-{role[:3]}", "containerPort": side_channel_port, "protocol": "TCP"},
        ],
        "resources": resources,
        "startupProbe": _probe("/health", http_port, 10, STARTUP_FAILURES),
        "readinessProbe": _probe("/health", http_port, 5, 3),
        "livenessProbe": _probe("/health", http_port, 10, 6),
        "volumeMounts": [
            {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }


def _pod_spec(containers: list[Obj]) -> Obj:
    return {
        "containers": containers,
        "terminationGracePeriodSeconds": 60,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [
            {"name": "hf-cache", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},  # NCCL / torch IPC
        ],
    }


def _scrape_annotations(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def _deployment(
    spec: ManifestSpec, name: str, replicas: int, labels: dict[str, str], pod: Obj, port: int
) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, name, {**part_of("vllm"), **labels}),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": {**part_of("vllm"), **labels},
                    "annotations": _scrape_annotations(port),
                },
                "spec": pod,
            },
        },
    }


def role_deployment(spec: ManifestSpec, role: str, tier: str, replicas: int) -> Obj:
    """The Deployment of one (role, tier) of a disaggregated pool."""
    name = spec.name(role if tier == "active" else f"{role}-{tier}")
    labels = pool_labels(spec, role, tier)
    pod = _pod_spec([vllm_container(spec, role)])
    return _deployment(spec, name, replicas, labels, pod, VLLM_HTTP_PORT)


def mixed_node_deployment(spec: ManifestSpec, tier: str, replicas: int) -> Obj:
    """Pods holding one prefill and one decode container on the same GPUs (``--placement mixed-node``), at
    ``--gpu-memory-utilization`` ``prefill_mem_frac`` and ``decode_share``.

    ``gpu_sharing="runtime"``: Kubernetes' device plugin gives a GPU to exactly one container, so the prefill
    container requests the GPUs and the decode container sees the node's devices through
    ``NVIDIA_VISIBLE_DEVICES=all`` (needs the NVIDIA container runtime; right only when the pod takes the
    node's every GPU: ``--gpus-per-instance`` = GPUs per node). ``gpu_sharing="dra"``: the pod holds one
    ResourceClaim from :func:`gpu_claim_template` and both containers reference it, so both see exactly the
    allocated devices. The pods carry no role label: the actuator, which scales one Deployment per role,
    does not select them.
    """
    name = spec.name("pd-mixed" if tier == "active" else f"pd-mixed-{tier}")
    labels = {LABEL_POOL: spec.pool, LABEL_PLACEMENT: "mixed-node", LABEL_TIER: tier}
    dra = spec.gpu_sharing == "dra"
    prefill = vllm_container(
        spec, "prefill", gpu_memory_utilization=spec.prefill_mem_frac, gpus=0 if dra else None
    )
    decode = vllm_container(
        spec,
        "decode",
        http_port=VLLM_HTTP_PORT + 1,
        side_channel_port=NIXL_SIDE_CHANNEL_PORT + 1,
        gpu_memory_utilization=spec.decode_share,
        gpus=0,
    )
    pod = _pod_spec([prefill, decode])
    if dra:
        for container in (prefill, decode):
            container["resources"]["claims"] = [{"name": GPU_CLAIM}]
        pod["resourceClaims"] = [{"name": GPU_CLAIM, "resourceClaimTemplateName": spec.name("node-gpus")}]
    else:
        decode["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return _deployment(spec, name, replicas, labels, pod, VLLM_HTTP_PORT)


def gpu_claim_template(spec: ManifestSpec) -> Obj:
    """The ResourceClaimTemplate a mixed-node pod's claim is made from (``--gpu-sharing dra``): exactly
    ``gpus_per_instance`` devices of ``dra_device_class``; each pod gets its own claim, shared by its two
    containers."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata(spec, spec.name("node-gpus"), {**part_of("vllm"), LABEL_POOL: spec.pool}),
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": spec.dra_device_class,
                                "allocationMode": "ExactCount",
                                "count": spec.gpus_per_instance,
                            },
                        }
                    ]
                }
            }
        },
    }


def role_service(spec: ManifestSpec, role: str) -> Obj:
    """Headless Service over a role's active instances (the router resolves every pod IP)."""
    if spec.placement == "mixed-node":
        selector = {LABEL_POOL: spec.pool, LABEL_PLACEMENT: "mixed-node", LABEL_TIER: "active"}
    else:
        selector = pool_labels(spec, role, "active")
    port = role_port(spec, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name(role), {**part_of("vllm"), LABEL_POOL: spec.pool}),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def router_objects(spec: ManifestSpec) -> list[Obj]:
    """The router Deployment and Service. Image and command are placeholders (the router is being
    written as ``python -m serving.router``); both carry the ``pdscale.io/placeholder`` annotation."""
    labels = {LABEL_POOL: spec.pool, **part_of("router")}
    note = (
        "image and args are placeholders: the router (python -m serving.router) is not released yet; "
        "set the image you build and check its --help for the flags"
    )
    svc_domain = f"{spec.namespace}.svc"
    container: Obj = {
        "name": "router",
        "image": spec.pdscale_image,
        "command": ["python", "-m", "serving.router"],
        "args": [
            "--host",
            "0.0.0.0",
            "--port",
            str(ROUTER_PORT),
            "--model",
            spec.model_name,
            "--prefill-service",
            f"{spec.name('prefill')}.{svc_domain}:{role_port(spec, 'prefill')}",
            "--decode-service",
            f"{spec.name('decode')}.{svc_domain}:{role_port(spec, 'decode')}",
        ],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "readinessProbe": _probe("/health", ROUTER_PORT, 5, 3),
        "livenessProbe": _probe("/health", ROUTER_PORT, 10, 6),
    }
    deployment: Obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, spec.name("router"), labels, **{ANNOTATION_PLACEHOLDER: note}),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": _scrape_annotations(ROUTER_PORT)},
                "spec": {"containers": [container]},
            },
        },
    }
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name("router"), dict(labels)),
        "spec": {
            "selector": dict(labels),
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [deployment, service]


def role_port(spec: ManifestSpec, role: str) -> int:
    """The HTTP port of a role's vLLM server (the decode container is on the next port on a mixed node)."""
    return VLLM_HTTP_PORT + (1 if spec.placement == "mixed-node" and role == "decode" else 0)


def serving_objects(spec: ManifestSpec) -> list[Obj]:
    """Every serving object of the pool, in apply order (with ``--gpu-sharing dra`` the mixed-node pods'
    ResourceClaimTemplate first, then Deployments, Services, the router)."""
    if spec.placement == "mixed-node":
        claims = [gpu_claim_template(spec)] if spec.gpu_sharing == "dra" else []
        deployments = [
            *claims,
            mixed_node_deployment(spec, "active", spec.prefill),
            mixed_node_deployment(spec, "standby", spec.standby_decode),
        ]
    else:
        deployments = [
            role_deployment(spec, "prefill", "active", spec.prefill),
            role_deployment(spec, "decode", "active", spec.decode),
            role_deployment(spec, "decode", "standby", spec.standby_decode),
        ]
    services = [role_service(spec, "prefill"), role_service(spec, "decode")]
    return [*deployments, *services, *router_objects(spec)]
