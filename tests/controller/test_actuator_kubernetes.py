"""KubernetesActuator through the official client against the in-process API server (real REST paths)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.actuators.base import ActuatorError, ActuatorUnavailable, ReplicaBounds
from controller.actuators.kubernetes import (
    LABEL_PLACEMENT,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TIER,
    MERGE_PATCH,
    KubernetesActuator,
    api_client,
)
from controller.policy.types import ScalingPlan
from controller.settings import KubernetesSettings
from tests.support.kube_apiserver import FakeKubeApiServer

NS = "llm"
TOKEN = "pdscale-test-token"
BOUNDS = ReplicaBounds(min_prefill=1, max_prefill=8, min_decode=1, max_decode=10)
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/{{}}/scale"


def pool_labels(role: str, tier: str | None = "active") -> dict[str, str]:
    labels = {LABEL_POOL: "a", LABEL_ROLE: role}
    if tier is not None:
        labels[LABEL_TIER] = tier
    return labels


@pytest.fixture
def server() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(token=TOKEN, clock=lambda: 1_800_000_000.0) as srv:
        srv.add_deployment(NS, "a-prefill", replicas=2, labels=pool_labels("prefill"))
        srv.add_deployment(NS, "a-decode", replicas=3, labels=pool_labels("decode", None))  # no tier: active
        srv.add_deployment(NS, "a-decode-standby", replicas=0, labels=pool_labels("decode", "standby"))
        srv.add_deployment(NS, "a-router", replicas=1, labels={LABEL_POOL: "a"})  # no role: ignored
        srv.add_deployment("other", "a-prefill", replicas=5, labels=pool_labels("prefill"))
        yield srv


@pytest.fixture
def kubeconfig(server: FakeKubeApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server.url}"}}}}]
users: [{{name: ctl, user: {{token: {TOKEN}}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: ctl, namespace: {NS}}}}}]
current-context: fake
"""
    )
    return path


def make(kubeconfig: Path, **kwargs: object) -> KubernetesActuator:
    settings = KubernetesSettings(namespace=NS, kubeconfig=kubeconfig, **kwargs)
    return KubernetesActuator.from_settings(settings)


def plan(prefill: int, decode: int, standby_decode: int = 0) -> ScalingPlan:
    return ScalingPlan("a", prefill, decode, 0, standby_decode)


def patches(server: FakeKubeApiServer) -> list[tuple[str, str | None, object]]:
    return [(r.path, r.content_type, r.body) for r in server.requests if r.method == "PATCH"]


def test_current_reads_the_cluster(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.set_ready_replicas(NS, "a-decode", 2)
    now = make(kubeconfig).current("a")
    assert (now.role("prefill").replicas, now.role("prefill").ready) == (2, 2)
    assert (now.role("decode").replicas, now.role("decode").ready, now.role("decode").standby) == (3, 2, 0)
    lists = [r for r in server.requests if r.method == "GET"]
    assert lists[0].query["labelSelector"] == (f"{LABEL_POOL}=a",)
    assert lists[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_apply_patches_scale_with_merge_patch_then_is_idempotent(
    server: FakeKubeApiServer, kubeconfig: Path
) -> None:
    act = make(kubeconfig)
    result = act.apply(plan(prefill=2, decode=5, standby_decode=2), BOUNDS)
    assert patches(server) == [
        (SCALE.format("a-decode"), MERGE_PATCH, {"spec": {"replicas": 5}}),
        (SCALE.format("a-decode-standby"), MERGE_PATCH, {"spec": {"replicas": 2}}),
    ]
    assert {(c.target, c.before, c.after) for c in result.changes} == {
        ("a-decode", 3, 5),
        ("a-decode-standby", 0, 2),
    }
    assert server.deployment(NS, "a-decode")["spec"]["replicas"] == 5
    assert server.deployment("other", "a-prefill")["spec"]["replicas"] == 5  # other namespace untouched
    server.clear_requests()
    again = act.apply(plan(prefill=2, decode=5, standby_decode=2), BOUNDS)
    assert patches(server) == [] and not again.changed


def test_apply_reclamps_to_bounds(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    result = make(kubeconfig).apply(plan(prefill=0, decode=50, standby_decode=4), BOUNDS)
    assert result.targets == {"prefill": (1, 0), "decode": (10, 0)}
    assert server.deployment(NS, "a-prefill")["spec"]["replicas"] == 1
    assert server.deployment(NS, "a-decode")["spec"]["replicas"] == 10
    assert server.deployment(NS, "a-decode-standby")["spec"]["replicas"] == 0
    assert any("clamped" in n for n in result.notes)


def test_conflict_is_retried_after_a_reread(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.inject_status(SCALE.format("a-decode"), 409, count=2, method="PATCH")
    make(kubeconfig, max_conflict_retries=3).apply(plan(2, 4), BOUNDS)
    assert server.deployment(NS, "a-decode")["spec"]["replicas"] == 4
    sent = [(r.method, r.path) for r in server.requests if r.path == SCALE.format("a-decode")]
    assert sent == [("PATCH", SCALE.format("a-decode")), ("GET", SCALE.format("a-decode"))] * 2 + [
        ("PATCH", SCALE.format("a-decode"))
    ]


def test_conflict_that_persists_is_temporary(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.inject_status(SCALE.format("a-decode"), 409, count=5, method="PATCH")
    with pytest.raises(ActuatorUnavailable, match="409"):
        make(kubeconfig, max_conflict_retries=1).apply(plan(2, 4), BOUNDS)
    assert len(patches(server)) == 2


def test_server_error_is_temporary(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.inject_status(SCALE.format("a-decode"), 500, method="PATCH")
    with pytest.raises(ActuatorUnavailable, match="HTTP 500") as info:
        make(kubeconfig).apply(plan(2, 4), BOUNDS)
    assert info.value.retry_after_s > 0
    assert server.deployment(NS, "a-decode")["spec"]["replicas"] == 3


def test_hung_api_server_is_temporary_within_the_request_timeout(
    server: FakeKubeApiServer, kubeconfig: Path
) -> None:
    server.inject_hang(SCALE.format("a-decode"), 5.0, method="PATCH")
    act = make(kubeconfig, request_timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ActuatorUnavailable, match="Timeout"):
        act.apply(plan(2, 4), BOUNDS)
    assert time.monotonic() - t0 < 2.0


def test_missing_deployment_is_permanent_and_named(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.inject_status(SCALE.format("a-decode"), 404, method="PATCH")
    with pytest.raises(ActuatorError, match=f"Deployment {NS}/a-decode not found") as info:
        make(kubeconfig).apply(plan(2, 4), BOUNDS)
    assert not isinstance(info.value, ActuatorUnavailable)
    with pytest.raises(ActuatorError, match=f"no Deployment labelled {LABEL_POOL}=b,{LABEL_ROLE}=prefill"):
        make(kubeconfig).apply(ScalingPlan("b", 1, 1, 0, 0), BOUNDS)


def test_missing_standby_deployment_is_a_note(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    result = make(kubeconfig).apply(ScalingPlan("a", 2, 3, 1, 0), BOUNDS)  # no prefill standby Deployment
    assert result.targets["prefill"] == (2, 0)
    assert patches(server) == []
    assert any("standby 1 not applied" in n for n in result.notes)


def test_dry_run_sends_no_patch(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    act = make(kubeconfig, dry_run=True)
    result = act.apply(plan(4, 6), BOUNDS)
    assert patches(server) == []
    assert result.dry_run and not result.changed
    assert [(c.target, c.before, c.after) for c in act.would_patch] == [
        ("a-prefill", 2, 4),
        ("a-decode", 3, 6),
    ]


def test_restarted_actuator_recovers_state_from_the_cluster(
    server: FakeKubeApiServer, kubeconfig: Path
) -> None:
    make(kubeconfig).apply(plan(3, 7), BOUNDS)
    server.clear_requests()
    fresh = make(kubeconfig)  # a new process: nothing remembered
    now = fresh.current("a")
    assert (now.role("prefill").replicas, now.role("decode").replicas) == (3, 7)
    fresh.apply(plan(3, 7), BOUNDS)
    assert patches(server) == []


def test_forbidden_is_permanent(server: FakeKubeApiServer, kubeconfig: Path) -> None:
    server.inject_status(f"/apis/apps/v1/namespaces/{NS}/deployments", 403, method="GET")
    with pytest.raises(ActuatorError, match="RBAC") as info:
        make(kubeconfig).current("a")
    assert not isinstance(info.value, ActuatorUnavailable)


def test_api_client_without_kubeconfig_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"kubeconfig|config"):
        api_client(kubeconfig=tmp_path / "absent")


def test_a_mixed_node_deployment_stands_for_both_roles_and_is_written_once(
    server: FakeKubeApiServer, kubeconfig: Path
) -> None:
    mixed = {LABEL_POOL: "m", LABEL_PLACEMENT: "mixed-node"}
    server.add_deployment(NS, "m-pd-mixed", replicas=2, labels={**mixed, LABEL_TIER: "active"})
    server.add_deployment(NS, "m-pd-mixed-standby", replicas=1, labels={**mixed, LABEL_TIER: "standby"})
    act = make(kubeconfig)
    now = act.current("m")
    assert now.role("prefill").replicas == now.role("decode").replicas == 2
    assert now.role("decode").standby == 1
    result = act.apply(ScalingPlan("m", 4, 4, 0, 0), BOUNDS)
    assert patches(server) == [
        (SCALE.format("m-pd-mixed"), MERGE_PATCH, {"spec": {"replicas": 4}}),
        (SCALE.format("m-pd-mixed-standby"), MERGE_PATCH, {"spec": {"replicas": 0}}),
    ]
    assert [(c.target, c.before, c.after) for c in result.changes] == [
        ("m-pd-mixed", 2, 4),
        ("m-pd-mixed-standby", 1, 0),
    ]
    server.clear_requests()
    act.apply(ScalingPlan("m", 3, 5, 0, 0), BOUNDS)  # not in whole nodes: the larger target wins
    assert patches(server) == [(SCALE.format("m-pd-mixed"), MERGE_PATCH, {"spec": {"replicas": 5}})]


def test_a_mixed_node_deployment_beside_a_role_deployment_is_an_error(
    server: FakeKubeApiServer, kubeconfig: Path
) -> None:
    server.add_deployment(
        NS, "a-pd-mixed", replicas=1, labels={LABEL_POOL: "a", LABEL_PLACEMENT: "mixed-node"}
    )
    with pytest.raises(ActuatorError, match=r"exactly one may"):
        make(kubeconfig).current("a")
