"""The rendered controller objects agree with the controller: its config model, its actuator's labels, and
RBAC that is exactly enough for the actuator and the leader election (checked against the fake API server
with the Role's rules enforced)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from controller.actuators import kubernetes as actuator_module
from controller.actuators.base import ActuatorError, ReplicaBounds
from controller.actuators.kubernetes import KubernetesActuator
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.leader import LeaderElector, LeaderSettings
from controller.policy.types import ScalingPlan
from serving.manifests import LABEL_POOL, LABEL_ROLE, LABEL_TIER, RBAC_RULES, ManifestSpec, Rendering, render
from serving.manifests.spec import CONTROLLER_CONFIG_DIR, CONTROLLER_CONFIG_FILE, LEASE_NAME
from tests.support.kube_apiserver import AccessRule, FakeKubeApiServer

NS = "llm"
SPEC = ManifestSpec(pool="chat", namespace=NS, prefill=2, decode=3, standby_decode=2, max_decode=12)
RENDERED = render(SPEC)


def test_label_constants_agree_with_the_actuator() -> None:
    assert (LABEL_POOL, LABEL_ROLE, LABEL_TIER) == (
        actuator_module.LABEL_POOL,
        actuator_module.LABEL_ROLE,
        actuator_module.LABEL_TIER,
    )
    assert LeaderSettings(namespace=NS).lease_name == LEASE_NAME


def test_the_config_map_is_a_valid_controller_config() -> None:
    text = RENDERED.find("ConfigMap", "pdscale-controller")["data"][CONTROLLER_CONFIG_FILE]
    cfg = ControllerConfig.model_validate(yaml.safe_load(text))
    assert (cfg.source.kind, cfg.source.url) == ("prometheus", SPEC.prometheus_url)
    assert (cfg.actuator.kind, cfg.actuator.namespace) == ("kubernetes", NS)
    (pool,) = cfg.pools
    assert (pool.name, pool.policy.standby_decode, pool.policy.max_decode) == ("chat", 2, 12)
    assert (pool.slo_ttft_ms, pool.profile) == (SPEC.slo_ttft_ms, SPEC.profile)
    assert cfg.metrics_port is not None


def test_the_controller_deployment_mounts_the_config_and_probes_its_health() -> None:
    dep = RENDERED.find("Deployment", "pdscale-controller")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] + c["args"][:3] == [
        "pdscale",
        "controller",
        "--config",
        f"{CONTROLLER_CONFIG_DIR}/{CONTROLLER_CONFIG_FILE}",
        "--leader-elect",
    ]
    assert "--in-cluster" in c["args"] and pod["serviceAccountName"] == "pdscale-controller"
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == CONTROLLER_CONFIG_DIR)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "pdscale-controller"
    cfg = ControllerConfig.model_validate(
        yaml.safe_load(RENDERED.find("ConfigMap", "pdscale-controller")["data"][CONTROLLER_CONFIG_FILE])
    )
    assert c["ports"][0]["containerPort"] == cfg.metrics_port
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == (
        "/healthz",
        "/readyz",
    )


def test_rbac_has_no_wildcard_and_exactly_the_verbs_the_controller_uses() -> None:
    role = RENDERED.find("Role", "pdscale-controller")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("apps", "deployments", "get"),
        ("apps", "deployments", "list"),
        ("apps", "deployments", "watch"),
        ("apps", "deployments/scale", "get"),
        ("apps", "deployments/scale", "patch"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    assert not any("*" in item for triple in granted for item in triple)
    binding = RENDERED.find("RoleBinding", "pdscale-controller")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "pdscale-controller",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pdscale-controller", "namespace": NS}]
    assert not any(o["kind"].startswith("Cluster") for o in RENDERED.objects())


def _access_rules(rules: Any, namespace: str) -> list[AccessRule]:
    """The Role's rules as the fake API server's allow-list."""
    out = []
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                out += [AccessRule(verb, group, base, sub, namespace) for verb in rule["verbs"]]
    return out


def _seed(server: FakeKubeApiServer, rendering: Rendering) -> None:
    for dep in rendering.objects():
        if dep["kind"] != "Deployment":
            continue
        server.add_deployment(
            dep["metadata"]["namespace"],
            dep["metadata"]["name"],
            replicas=dep["spec"]["replicas"],
            labels=dep["metadata"]["labels"],
            match_labels=dep["spec"]["selector"]["matchLabels"],
            annotations=dep["metadata"].get("annotations"),
            image=dep["spec"]["template"]["spec"]["containers"][0]["image"],
        )


@pytest.fixture
def cluster() -> Iterator[tuple[FakeKubeApiServer, k8s.ApiClient]]:
    rules = _access_rules(RENDERED.find("Role", "pdscale-controller")["rules"], NS)
    with FakeKubeApiServer(access_rules=rules, enforce_rbac=True, clock=lambda: 1_800_000_000.0) as server:
        _seed(server, RENDERED)
        cfg = k8s.Configuration()
        cfg.host = server.url
        cfg.retries = False
        yield server, k8s.ApiClient(cfg)


def test_the_actuator_finds_and_scales_the_rendered_deployments_under_the_rendered_rbac(
    cluster: tuple[FakeKubeApiServer, k8s.ApiClient],
) -> None:
    server, api = cluster
    act = KubernetesActuator(NS, api)
    now = act.current("chat")
    assert (now.role("prefill").replicas, now.role("decode").replicas, now.role("decode").standby) == (
        2,
        3,
        2,
    )
    result = act.apply(ScalingPlan("chat", 4, 5, 0, 1), ReplicaBounds(1, 16, 1, 12))
    assert {(c.target, c.before, c.after) for c in result.changes} == {
        ("chat-prefill", 2, 4),
        ("chat-decode", 3, 5),
        ("chat-decode-standby", 2, 1),
    }
    assert server.deployment(NS, "chat-router")["spec"]["replicas"] == 2  # not a role: left alone
    assert server.deployment(NS, "pdscale-controller")["spec"]["replicas"] == SPEC.controller_replicas
    denied = [r for r in server.requests if r.path.endswith("/scale") and r.method not in ("GET", "PATCH")]
    assert denied == []


def test_the_leader_election_works_under_the_rendered_rbac(
    cluster: tuple[FakeKubeApiServer, k8s.ApiClient],
) -> None:
    server, api = cluster
    clock = VirtualClock()
    settings = LeaderSettings(namespace=NS, identity="ctl-0", request_timeout_s=2.0)
    elector = LeaderElector.from_client(api, settings, clock)
    assert elector.poll()  # creates the lease
    clock.advance(settings.retry_period_s)
    assert elector.poll() and elector.failures == 0  # renews it (get + update)
    assert server.lease(NS, LEASE_NAME)["spec"]["holderIdentity"] == "ctl-0"


def test_the_fake_server_enforces_the_rules_so_the_rbac_tests_can_fail() -> None:
    rules = [r for r in _access_rules(RBAC_RULES, NS) if r.subresource != "scale"]
    with FakeKubeApiServer(access_rules=rules, enforce_rbac=True) as server:
        _seed(server, RENDERED)
        cfg = k8s.Configuration()
        cfg.host = server.url
        act = KubernetesActuator(NS, k8s.ApiClient(cfg))
        with pytest.raises(ActuatorError, match="RBAC"):
            act.apply(ScalingPlan("chat", 4, 3, 0, 2), ReplicaBounds(1, 16, 1, 12))


def test_the_controller_command_line_parses_with_the_real_cli() -> None:
    import typer

    from controller.cli import controller_cmd

    app = typer.Typer()
    app.command()(controller_cmd)
    (c,) = RENDERED.find("Deployment", "pdscale-controller")["spec"]["template"]["spec"]["containers"]
    command = typer.main.get_command(app)
    ctx = command.make_context("pdscale controller", list(c["args"]))  # parses and checks; runs nothing
    assert ctx.params["leader_elect"] and ctx.params["in_cluster"]
    assert str(ctx.params["config"]) == f"{CONTROLLER_CONFIG_DIR}/{CONTROLLER_CONFIG_FILE}"
    with pytest.raises(Exception) as bad:  # click's class, vendored by typer or not: checked below
        command.make_context("pdscale controller", [*c["args"], "--no-such-flag"])
    assert type(bad.value).__name__ == "NoSuchOption"
