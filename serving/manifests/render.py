"""Render a ``ManifestSpec`` into Kubernetes objects and monitoring files, and write them to a folder.

Layout of the output folder (``kubectl apply -f DIR`` applies the numbered files in order and does not
descend into ``monitoring/``)::

    00-namespace.yaml      the Namespace
    10-serving.yaml        vLLM Deployments (active, standby), headless Services, the router
    20-controller.yaml     ServiceAccount, Role, RoleBinding, ConfigMap, Deployment (disaggregated only)
    30-monitoring.yaml     ConfigMaps carrying the alert rules and the Grafana dashboard
    monitoring/prometheus-rules.yaml    the same rules, for promtool and a Prometheus rule_files entry
    monitoring/prometheus-scrape.yaml   scrape_configs to merge into the Prometheus configuration
    monitoring/grafana-dashboard.json   the dashboard, for Grafana's import
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from serving.manifests.control import controller_objects
from serving.manifests.monitoring import alert_rules, grafana_dashboard, scrape_config
from serving.manifests.spec import ManifestSpec
from serving.manifests.workloads import Obj, metadata, part_of, serving_objects

RULES_FILE = "monitoring/prometheus-rules.yaml"
SCRAPE_FILE = "monitoring/prometheus-scrape.yaml"
DASHBOARD_FILE = "monitoring/grafana-dashboard.json"


@dataclass(frozen=True)
class Rendering:
    """What one spec renders to. ``manifests`` maps a file name to its Kubernetes objects (apply order);
    ``files`` maps the other files' names to their text; ``notes`` says what was left out and why."""

    spec: ManifestSpec
    manifests: Mapping[str, Sequence[Obj]]
    files: Mapping[str, str]
    notes: tuple[str, ...]

    def objects(self) -> list[Obj]:
        """Every Kubernetes object, in apply order."""
        return [obj for name in sorted(self.manifests) for obj in self.manifests[name]]

    def find(self, kind: str, name: str) -> Obj:
        """The object of ``kind`` named ``name``; KeyError naming what exists otherwise."""
        for obj in self.objects():
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return obj
        have = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects())
        raise KeyError(f"no {kind}/{name} in the rendering; it has {have}")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's files) as literal blocks, so they read as the files they are."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(objects: Sequence[Obj]) -> str:
    """Objects as a multi-document YAML stream (block style, keys in insertion order)."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def _monitoring_config_maps(spec: ManifestSpec, rules: str, dashboard: str) -> list[Obj]:
    labels = part_of("monitoring")
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(spec, "pdscale-prometheus-rules", dict(labels)),
            "data": {"pdscale-rules.yaml": rules},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            # grafana_dashboard=1: the label the Grafana Helm chart's dashboard sidecar loads by default
            "metadata": metadata(spec, "pdscale-grafana-dashboard", {**labels, "grafana_dashboard": "1"}),
            "data": {"pdscale-dashboard.json": dashboard},
        },
    ]


def render(spec: ManifestSpec) -> Rendering:
    """All objects and files for ``spec`` (pure: no I/O)."""
    rules = yaml.safe_dump(alert_rules(), sort_keys=False, width=120)
    dashboard = json.dumps(grafana_dashboard(spec), indent=2) + "\n"
    namespace: Obj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": spec.namespace, "labels": {"app.kubernetes.io/part-of": "pdscale"}},
    }
    manifests: dict[str, list[Obj]] = {
        "00-namespace.yaml": [namespace],
        "10-serving.yaml": serving_objects(spec),
        "30-monitoring.yaml": _monitoring_config_maps(spec, rules, dashboard),
    }
    notes: list[str] = []
    if spec.placement == "mixed-node" and spec.gpu_sharing == "runtime":
        notes.append(
            "placement mixed-node, --gpu-sharing runtime: the decode container sees every GPU of the node "
            "(NVIDIA_VISIBLE_DEVICES=all), so each pod must take the whole node (--gpus-per-instance = GPUs "
            "per node); with Kubernetes >= 1.34 and a DRA GPU driver, --gpu-sharing dra shares exactly the "
            "pod's devices"
        )
    if spec.placement == "mixed-node":
        notes.append(
            "placement mixed-node: the controller sizes mixed nodes (the pd-mixed Deployment: both roles at "
            "the larger need, on the partitioned capacities) and keeps no standby: it scales "
            "pd-mixed-standby to 0 (render with --standby-decode 0 not to start those pods at all)"
        )
    manifests["20-controller.yaml"] = controller_objects(spec)
    files = {
        RULES_FILE: rules,
        SCRAPE_FILE: yaml.safe_dump(scrape_config(spec), sort_keys=False, width=120),
        DASHBOARD_FILE: dashboard,
    }
    return Rendering(spec, manifests, files, tuple(notes))


def write_rendering(rendering: Rendering, out_dir: Path) -> list[Path]:
    """Write every file under ``out_dir`` (created if needed; files of the same names are replaced)."""
    written: list[Path] = []
    texts = {name: dump_yaml(objs) for name, objs in rendering.manifests.items()} | dict(rendering.files)
    for name, text in sorted(texts.items()):
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
