"""Kubernetes manifests, Prometheus alert rules and a Grafana dashboard for a pdscale deployment.

``render(ManifestSpec(...))`` builds every object as a plain dict (pure); ``write_rendering`` writes the
YAML/JSON files; ``pdscale manifests`` (``serving.manifests.cli.manifests_cmd``) does both from the CLI.
"""

from serving.manifests.control import RBAC_RULES, controller_config, controller_config_yaml
from serving.manifests.monitoring import alert_rules, grafana_dashboard, scrape_config
from serving.manifests.render import Rendering, dump_yaml, render, write_rendering
from serving.manifests.spec import (
    LABEL_PLACEMENT,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TIER,
    ManifestSpec,
    ManifestSpecError,
)

__all__ = [
    "LABEL_PLACEMENT",
    "LABEL_POOL",
    "LABEL_ROLE",
    "LABEL_TIER",
    "RBAC_RULES",
    "ManifestSpec",
    "ManifestSpecError",
    "Rendering",
    "alert_rules",
    "controller_config",
    "controller_config_yaml",
    "dump_yaml",
    "grafana_dashboard",
    "render",
    "scrape_config",
    "write_rendering",
]
