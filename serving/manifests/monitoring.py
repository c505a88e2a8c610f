"""Prometheus alert rules, a scrape configuration and a Grafana dashboard for a pdscale deployment.

vLLM's metric names are matched in both spellings (``{__name__=~"vllm[:_]..."}``): Prometheus 3 keeps
``vllm:x``, Prometheus 2 scraping OpenMetrics from ``prometheus_client`` >= 0.23 stores ``vllm_x``.

Alerts follow the seed's monitoring table:

=====================  ==========================================================  ==========
what                   expression (metric)                                          threshold
=====================  ==========================================================  ==========
GPU utilisation        ``DCGM_FI_DEV_GPU_UTIL`` (dcgm-exporter, percent)            > 90 for 5m
KV cache usage         ``vllm:kv_cache_usage_perc`` (fraction, 1 = full)            > 0.85 for 5m
network (KV transfer)  p99 of ``vllm:nixl_xfer_time_seconds`` (NIXL, per transfer)  > 50 ms for 5m
TTFT                   p99 of ``vllm:time_to_first_token_seconds``                  > 500 ms for 5m
=====================  ==========================================================  ==========

"Memory usage" is read as KV-cache usage: vLLM pre-allocates ``--gpu-memory-utilization`` of each GPU
at start, so the GPU's framebuffer use (``DCGM_FI_DEV_FB_USED``) sits near 90 % whatever the load.
"""

from __future__ import annotations

from typing import Any

from serving.manifests.spec import ManifestSpec
from serving.manifests.workloads import Obj

LEADER = "and on (instance) (pdscale_controller_is_leader == 1)"  # followers decide too: show the leader's


def vllm(name: str) -> str:
    """A selector for a vLLM metric in either spelling."""
    return f'{{__name__=~"vllm[:_]{name}"}}'


def p99_by_pool(histogram: str, window: str = "5m") -> str:
    return f"histogram_quantile(0.99, sum by (le, pool) (rate({vllm(histogram + '_bucket')}[{window}])))"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> Obj:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, "team": "pdscale"},
        "annotations": {"summary": summary, "description": description},
    }


def alert_rules() -> Obj:
    """A Prometheus rule file (``promtool check rules`` accepts it)."""
    serving = [
        _alert(
            "PdscaleGPUUtilisationHigh",
            "DCGM_FI_DEV_GPU_UTIL > 90",
            "5m",
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} above 90 % for 5 minutes",
            "DCGM_FI_DEV_GPU_UTIL is {{ $value }} %: the pool is compute-bound; check the controller scales up.",
        ),
        _alert(
            "PdscaleKVCacheHigh",
            f"max by (pool, role, instance) ({vllm('kv_cache_usage_perc')}) > 0.85",
            "5m",
            "warning",
            "vLLM KV cache of {{ $labels.instance }} ({{ $labels.pool }}/{{ $labels.role }}) above 85 %",
            "KV cache usage is {{ $value | humanizePercentage }}; requests will queue or be preempted.",
        ),
        _alert(
            "PdscaleKVTransferP99High",
            f"{p99_by_pool('nixl_xfer_time_seconds')} > 0.05",
            "5m",
            "warning",
            "P99 NIXL KV transfer time of pool {{ $labels.pool }} above 50 ms",
            "p99 of vllm:nixl_xfer_time_seconds is {{ $value | humanizeDuration }}: the prefill-to-decode "
            "network is slow or saturated.",
        ),
        _alert(
            "PdscaleTTFTP99High",
            f"{p99_by_pool('time_to_first_token_seconds')} > 0.5",
            "5m",
            "critical",
            "P99 time to first token of pool {{ $labels.pool }} above 500 ms",
            "p99 TTFT is {{ $value | humanizeDuration }}: the prefill pool is short of capacity.",
        ),
    ]
    controller = [
        _alert(
            "PdscaleControllerNoLeader",
            "sum(pdscale_controller_is_leader) < 1 or absent(pdscale_controller_is_leader)",
            "2m",
            "critical",
            "No pdscale controller replica holds the leader Lease",
            "Nothing is scaling the pools: check the controller pods and their RBAC on leases.",
        ),
        _alert(
            "PdscaleControllerDegraded",
            "max by (pool) (pdscale_controller_degraded) == 1",
            "5m",
            "warning",
            "Demand of pool {{ $labels.pool }} exceeds its maximum replicas",
            "The controller is at max replicas and degrading; raise max_prefill/max_decode or the GPU budget.",
        ),
        _alert(
            "PdscaleTrafficStoppedDead",
            "max by (pool) (pdscale_controller_silence_hold) == 1",
            "30s",
            "warning",
            "Requests to pool {{ $labels.pool }} stopped dead after a steady stream",
            "Nothing reaches the pool: check the gateway, router and clients upstream. The controller holds the"
            " pool's capacity for the retries (policy.silence_hold_s) and releases it if the traffic stays away.",
        ),
        _alert(
            "PdscaleEnginesSlowerThanProfile",
            "max by (pool) (pdscale_controller_latency_estimate) > 1.15",
            "10m",
            "warning",
            "Decode steps of pool {{ $labels.pool }} take {{ $value | humanize }}x its hardware profile's",
            "The engines are slower than the profile the controller sizes with. With policy.latency_correction"
            " on (the default) it sizes at the measured speed; fix the cause or set the pool's profile to the"
            " real hardware (attention backend, GPU clocks, a noisy neighbour, another vLLM release).",
        ),
    ]
    return {
        "groups": [
            {"name": "pdscale-serving", "rules": serving},
            {"name": "pdscale-controller", "rules": controller},
        ]
    }


def scrape_config(spec: ManifestSpec) -> Obj:
    """Prometheus ``scrape_configs`` for the namespace (merge into the server's configuration).

    ``pdscale-vllm`` scrapes every vLLM container port named ``http-*`` (so both containers of a mixed
    node), with ``pool`` from the pod label and ``role`` from the container name, the labels the
    controller's Prometheus source groups by. ``pdscale-components`` scrapes the controller and the
    router through their ``prometheus.io/*`` annotations.
    """
    namespaces = {"names": [spec.namespace]}
    where: list[Obj] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    vllm_job: Obj = {
        "job_name": "pdscale-vllm",
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": namespaces}],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                "regex": "vllm",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": "http-.*",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "regex": "vllm-(prefill|decode)",
                "target_label": "role",
                "replacement": "$1",
            },
            {"source_labels": ["__meta_kubernetes_pod_label_pdscale_io_pool"], "target_label": "pool"},
            {"source_labels": ["__meta_kubernetes_pod_label_pdscale_io_tier"], "target_label": "tier"},
            *where,
        ],
    }
    components_job: Obj = {
        "job_name": "pdscale-components",
        "honor_labels": True,  # the controller's and router's own pool/role labels are kept as they are
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": namespaces}],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                "regex": "controller|router",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                "regex": "true",
                "action": "keep",
            },
            {
                "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                "regex": "([^:]+)(?::\\d+)?;(\\d+)",
                "replacement": "$1:$2",
                "target_label": "__address__",
            },
            *where,
        ],
    }
    return {"scrape_configs": [vllm_job, components_job]}


# -- Grafana -------------------------------------------------------------------------------------


def _panel(panel_id: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> Obj:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _quantiles(histogram: str) -> list[tuple[str, str]]:
    sel = f'{{__name__=~"vllm[:_]{histogram}_bucket", pool=~"$pool"}}'
    return [
        (f"histogram_quantile({q}, sum by (le, pool) (rate({sel}[5m])))", f"{{{{pool}}}} p{int(q * 100)}")
        for q in (0.5, 0.99)
    ]


def grafana_dashboard(spec: ManifestSpec) -> dict[str, Any]:
    """A Grafana dashboard (JSON model, schemaVersion 39) with ``datasource`` and ``pool`` variables."""
    pool = 'pool=~"$pool"'
    panels = [
        _panel(
            1,
            "Requests per second (finished, by role)",
            "reqps",
            [
                (
                    f'sum by (pool, role) (rate({{__name__=~"vllm[:_]request_success(_total)?", {pool}}}[1m]))',
                    "{{pool}} {{role}}",
                ),
                (
                    f'sum by (pool) (rate({{__name__=~"pdscale[:_]router_requests(_total)?", {pool}}}[1m]))',
                    "{{pool}} arrivals (router)",
                ),
            ],
            0,
            0,
        ),
        _panel(2, "Time to first token p50 / p99", "s", _quantiles("time_to_first_token_seconds"), 12, 0),
        _panel(3, "Inter-token latency p50 / p99", "s", _quantiles("inter_token_latency_seconds"), 0, 8),
        _panel(
            4,
            "KV cache usage",
            "percentunit",
            [
                (
                    f'max by (pool, role, pod) ({{__name__=~"vllm[:_]kv_cache_usage_perc", {pool}}})',
                    "{{pod}} {{role}}",
                )
            ],
            12,
            8,
        ),
        _panel(
            5,
            "Replicas by role and tier (controller)",
            "short",
            [
                (
                    f"max by (pool, role, tier) (pdscale_controller_target_replicas{{{pool}}} {LEADER})",
                    "{{pool}} {{role}} {{tier}} target",
                ),
                (
                    f"max by (pool, role) (pdscale_controller_current_replicas{{{pool}}} {LEADER})",
                    "{{pool}} {{role}} current",
                ),
            ],
            0,
            16,
        ),
        _panel(
            6,
            "Forecast vs actual arrivals",
            "reqps",
            [
                (
                    f"max by (pool) (pdscale_controller_forecast_arrivals_p90_rps{{{pool}}} {LEADER})",
                    "{{pool}} forecast p90",
                ),
                (
                    f'sum by (pool) (rate({{__name__=~"pdscale[:_]router_requests(_total)?", {pool}}}[1m]))',
                    "{{pool}} actual",
                ),
            ],
            12,
            16,
        ),
    ]
    return {
        "uid": f"pdscale-{spec.pool}"[:40],
        "title": f"pdscale — pool {spec.pool}",
        "tags": ["pdscale", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "pool",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(pdscale_controller_current_replicas, pool)",
                    "definition": "label_values(pdscale_controller_current_replicas, pool)",
                    "current": {"text": spec.pool, "value": spec.pool},
                    "includeAll": True,
                    "multi": True,
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }
