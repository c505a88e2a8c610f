"""``--router-drain``: the controller's Role gains exactly pods list/patch (what ``PodDeletionCostMarker`` calls)
and its config the pool's router, only when asked; the objects still pass the strict schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s
from typer.testing import CliRunner

from controller.actuators.router_admin import PodLister
from controller.config import ControllerConfig
from serving.manifests import ManifestSpec, ManifestSpecError, Rendering, render
from serving.manifests.control import RBAC_RULES, ROUTER_DRAIN_RBAC_RULES
from serving.manifests.spec import CONTROLLER_CONFIG_FILE
from tests.support.kube_apiserver import AccessRule, FakeKubeApiServer

NS = "llm"
PLAIN = render(ManifestSpec(pool="chat", namespace=NS))
DRAIN = render(ManifestSpec(pool="chat", namespace=NS, router_drain=True))
SCHEMA_VERSIONS = ("1.29", kubernetes_validate.latest_version())


def granted(rendering: Rendering) -> set[tuple[str, str, str]]:
    role = rendering.find("Role", "pdscale-controller")
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def controller_config(rendering: Rendering) -> ControllerConfig:
    text = rendering.find("ConfigMap", "pdscale-controller")["data"][CONTROLLER_CONFIG_FILE]
    return ControllerConfig.model_validate(yaml.safe_load(text))


def test_the_drain_adds_exactly_pods_list_and_patch() -> None:
    assert granted(DRAIN) - granted(PLAIN) == {("", "pods", "list"), ("", "pods", "patch")}
    assert granted(PLAIN) <= granted(DRAIN)
    assert not any("*" in item for triple in granted(DRAIN) for item in triple)
    assert not any(o["kind"].startswith("Cluster") for o in DRAIN.objects())


def test_without_the_flag_the_role_and_config_are_as_before() -> None:
    assert PLAIN.find("Role", "pdscale-controller")["rules"] == [dict(r) for r in RBAC_RULES]
    assert controller_config(PLAIN).actuator.router_admin is None


def test_the_granted_verbs_are_the_calls_the_marker_makes() -> None:
    """PodLister (the marker's whole view of the API) has one method per granted verb."""
    calls = {name for name in vars(PodLister) if name.endswith("_namespaced_pod")}
    assert {c.split("_")[0] for c in calls} == {v for r in ROUTER_DRAIN_RBAC_RULES for v in r["verbs"]}


def test_the_config_map_points_the_drain_at_the_pools_router_service() -> None:
    ra = controller_config(DRAIN).actuator.router_admin
    assert ra is not None and ra.mark_pods
    service = DRAIN.find("Service", "chat-router")
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80  # the URL carries no port
    assert list(ra.pools) == ["chat"] and ra.pools["chat"].url == f"http://chat-router.{NS}.svc"


def _allowed(rendering: Rendering, verb: str) -> bool:
    rules = []
    for rule in rendering.find("Role", "pdscale-controller")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                rules += [AccessRule(v, group, base, sub, NS) for v in rule["verbs"]]
    with FakeKubeApiServer(access_rules=rules) as server:
        cfg = k8s.Configuration()
        cfg.host = server.url
        review = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    namespace=NS, verb=verb, group="", resource="pods"
                )
            )
        )
        answer = k8s.AuthorizationV1Api(k8s.ApiClient(cfg)).create_self_subject_access_review(review)
        assert answer.status is not None
        return bool(answer.status.allowed)


@pytest.mark.parametrize("verb", ["list", "patch"])
def test_an_access_review_under_the_rendered_role_allows_the_marker_only_with_the_flag(verb: str) -> None:
    assert _allowed(DRAIN, verb) and not _allowed(PLAIN, verb)


@pytest.mark.parametrize("verb", ["delete", "get", "update"])
def test_nothing_else_on_pods_is_allowed(verb: str) -> None:
    assert not _allowed(DRAIN, verb)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_the_drain_objects_pass_the_strict_schema(version: str) -> None:
    for kind in ("Role", "ConfigMap"):
        obj: Any = DRAIN.find(kind, "pdscale-controller")
        kubernetes_validate.validate(obj, version, strict=True)


def test_mixed_node_refuses_the_flag_naming_it() -> None:
    with pytest.raises(ManifestSpecError, match="--router-drain"):
        ManifestSpec(placement="mixed-node", router_drain=True)


def test_cli_flag_renders_the_drain(tmp_path: Path) -> None:
    from training.pdscale_cli import app

    result = CliRunner().invoke(
        app, ["manifests", "--out", str(tmp_path), "--pool", "chat", "--router-drain"]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all((tmp_path / "20-controller.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]} in role["rules"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert "router_admin" in cm["data"][CONTROLLER_CONFIG_FILE]
