"""The in-process Kubernetes API server, driven only through the official ``kubernetes`` client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, ApiException, Configuration

from tests.support.kube_apiserver import (
    CT_JSON_PATCH,
    CT_MERGE,
    CT_STRATEGIC,
    AccessRule,
    FakeKubeApiServer,
    parse_label_selector,
)

NS = "llm"
FIXED_NOW_S = 1_800_000_000.0
SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/decode/scale"


def connect(server: FakeKubeApiServer, token: str | None = None, retries: bool | None = None) -> ApiClient:
    cfg = Configuration()
    cfg.host = server.url
    if retries is not None:
        cfg.retries = retries
    if token is not None:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return ApiClient(cfg)


@pytest.fixture
def server() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(clock=lambda: FIXED_NOW_S) as srv:
        srv.add_deployment(NS, "prefill", replicas=2, labels={"app": "vllm", "role": "prefill", "pool": "a"})
        srv.add_deployment(NS, "decode", replicas=3, labels={"app": "vllm", "role": "decode", "pool": "a"})
        srv.add_deployment(NS, "router", replicas=1, labels={"app": "router"})
        srv.add_deployment("other", "decode", replicas=1, labels={"app": "vllm", "role": "decode"})
        yield srv


@pytest.fixture
def apps(server: FakeKubeApiServer) -> Iterator[Any]:
    with connect(server) as api_client:
        yield client.AppsV1Api(api_client)


def error_body(err: ApiException) -> dict[str, Any]:
    assert err.body is not None, f"HTTP {err.status} came without a body"
    body = json.loads(err.body)
    assert isinstance(body, dict)
    return body


def test_read_deployment_and_scale(apps: Any) -> None:
    dep = apps.read_namespaced_deployment("decode", NS)
    assert dep.spec.replicas == 3
    assert dep.status.ready_replicas == 3
    assert dep.metadata.creation_timestamp == datetime.fromtimestamp(FIXED_NOW_S, tz=UTC)
    scale = apps.read_namespaced_deployment_scale("decode", NS)
    assert (scale.kind, scale.api_version) == ("Scale", "autoscaling/v1")
    assert (scale.spec.replicas, scale.status.replicas) == (3, 3)
    assert scale.status.selector == "app=decode"
    assert scale.metadata.resource_version == dep.metadata.resource_version


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=vllm", ["decode", "prefill"]),
        ("app==vllm,role=decode", ["decode"]),
        ("app=vllm,role!=decode", ["prefill"]),
        ("role in (prefill, decode),pool=a", ["decode", "prefill"]),
        ("role notin (prefill)", ["decode", "router"]),
        ("!role", ["router"]),
        ("pool", ["decode", "prefill"]),
        ("", ["decode", "prefill", "router"]),
    ],
    ids=["eq", "double-eq-and", "neq", "in", "notin-matches-missing-key", "not-exists", "exists", "all"],
)
def test_list_with_label_selectors(apps: Any, selector: str, names: list[str]) -> None:
    listed = apps.list_namespaced_deployment(NS, label_selector=selector)
    assert sorted(d.metadata.name for d in listed.items) == names


def test_list_across_namespaces_and_bad_selector(apps: Any) -> None:
    listed = apps.list_deployment_for_all_namespaces(label_selector="role=decode")
    assert sorted((d.metadata.namespace, d.metadata.name) for d in listed.items) == [
        ("llm", "decode"),
        ("other", "decode"),
    ]
    with pytest.raises(ApiException) as err:
        apps.list_namespaced_deployment(NS, label_selector="role in prefill")
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ({"spec": {"replicas": 5}}, None),
        ({"spec": {"replicas": 5}}, CT_MERGE),
        ([{"op": "replace", "path": "/spec/replicas", "value": 5}], None),
    ],
    ids=["strategic-merge", "merge-patch", "json-patch"],
)
def test_patch_scale_each_content_type(
    server: FakeKubeApiServer, apps: Any, body: object, content_type: str | None
) -> None:
    before = apps.read_namespaced_deployment("decode", NS)
    kwargs = {"_content_type": content_type} if content_type else {}
    scale = apps.patch_namespaced_deployment_scale("decode", NS, body, **kwargs)
    assert scale.spec.replicas == 5
    assert int(scale.metadata.resource_version) > int(before.metadata.resource_version)
    dep = apps.read_namespaced_deployment("decode", NS)
    assert (dep.spec.replicas, dep.metadata.generation) == (5, before.metadata.generation + 1)
    sent = [r for r in server.requests if r.method == "PATCH"]
    want = content_type or (CT_JSON_PATCH if isinstance(body, list) else CT_STRATEGIC)
    assert [(r.path, r.content_type, r.body) for r in sent] == [(SCALE_PATH, want, body)]


def test_same_scale_twice_does_not_move_resource_version(apps: Any) -> None:
    first = apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 4}})
    again = apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 4}})
    assert again.metadata.resource_version == first.metadata.resource_version


def test_replace_scale_and_stale_resource_version_conflict(apps: Any) -> None:
    scale = apps.read_namespaced_deployment_scale("decode", NS)
    stale_rv = scale.metadata.resource_version
    scale.spec.replicas = 6
    replaced = apps.replace_namespaced_deployment_scale("decode", NS, scale)
    assert replaced.spec.replicas == 6
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale(
            "decode", NS, {"metadata": {"resourceVersion": stale_rv}, "spec": {"replicas": 7}}
        )
    assert err.value.status == 409
    body = error_body(err.value)
    assert (body["kind"], body["apiVersion"], body["reason"], body["code"]) == (
        "Status",
        "v1",
        "Conflict",
        409,
    )
    assert body["details"] == {"name": "decode", "group": "apps", "kind": "deployments"}
    assert "the object has been modified" in str(body["message"])
    scale.spec.replicas = 8  # still carries the stale resourceVersion
    with pytest.raises(ApiException) as err:
        apps.replace_namespaced_deployment_scale("decode", NS, scale)
    assert err.value.status == 409
    assert apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 6


def test_missing_deployment_is_404_status(apps: Any) -> None:
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment_scale("nope", NS)
    assert err.value.status == 404
    body = error_body(err.value)
    assert (body["reason"], body["message"]) == ("NotFound", 'deployments.apps "nope" not found')
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("nope", NS, {"spec": {"replicas": 1}})
    assert err.value.status == 404


def test_negative_replicas_is_422_invalid_with_causes(apps: Any) -> None:
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": -1}})
    assert err.value.status == 422
    body = error_body(err.value)
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'Scale.autoscaling "decode" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0'
    )
    details = body["details"]
    assert isinstance(details, dict)
    assert details["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: -1: must be greater than or equal to 0",
            "field": "spec.replicas",
        }
    ]


def test_failed_json_patch_test_op_is_422_and_changes_nothing(apps: Any) -> None:
    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 99},
        {"op": "replace", "path": "/spec/replicas", "value": 1},
    ]
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("decode", NS, ops)
    assert err.value.status == 422
    assert apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 3


def test_patch_deployment_annotations_with_merge_patch(apps: Any) -> None:
    body = {"metadata": {"annotations": {"pdscale.io/reason": "burst"}}}
    dep = apps.patch_namespaced_deployment("decode", NS, body, _content_type=CT_MERGE)
    assert dep.metadata.annotations == {"pdscale.io/reason": "burst"}
    assert dep.metadata.generation == 1, "metadata-only changes do not bump the generation"


def test_dry_run_patch_does_not_persist(apps: Any) -> None:
    preview = apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 9}}, dry_run="All")
    assert preview.spec.replicas == 9
    assert apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 3


def test_slow_rollout_status_lags_spec() -> None:
    with FakeKubeApiServer(status_follows_spec=False) as server, connect(server) as api_client:
        server.add_deployment(NS, "decode", replicas=2)
        apps: Any = client.AppsV1Api(api_client)
        apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 4}})
        dep = apps.read_namespaced_deployment("decode", NS)
        assert (dep.spec.replicas, dep.status.ready_replicas) == (4, None)
        server.set_ready_replicas(NS, "decode", 4)
        assert apps.read_namespaced_deployment_scale("decode", NS).status.replicas == 4


def lease_body(holder: str, rv: str | None = None) -> Any:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name="pdscale-leader", namespace=NS, resource_version=rv),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=15,
            acquire_time=datetime(2027, 1, 1, tzinfo=UTC),
            renew_time=datetime(2027, 1, 1, tzinfo=UTC),
            lease_transitions=0,
        ),
    )


def test_lease_create_update_conflict_and_delete(server: FakeKubeApiServer) -> None:
    with connect(server) as api_client:
        coord: Any = client.CoordinationV1Api(api_client)
        with pytest.raises(ApiException) as err:
            coord.read_namespaced_lease("pdscale-leader", NS)
        assert err.value.status == 404
        assert error_body(err.value)["message"] == 'leases.coordination.k8s.io "pdscale-leader" not found'

        created = coord.create_namespaced_lease(NS, lease_body("ctrl-a"))
        assert created.spec.holder_identity == "ctrl-a"
        with pytest.raises(ApiException) as err:
            coord.create_namespaced_lease(NS, lease_body("ctrl-b"))
        assert (err.value.status, error_body(err.value)["reason"]) == (409, "AlreadyExists")

        renewed = lease_body("ctrl-a", rv=created.metadata.resource_version)
        renewed.spec.renew_time = datetime(2027, 1, 1, 0, 0, 10, tzinfo=UTC)
        updated = coord.replace_namespaced_lease("pdscale-leader", NS, renewed)
        assert updated.spec.renew_time == datetime(2027, 1, 1, 0, 0, 10, tzinfo=UTC)
        assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)

        takeover = lease_body("ctrl-b", rv=created.metadata.resource_version)  # lost the race: stale RV
        with pytest.raises(ApiException) as err:
            coord.replace_namespaced_lease("pdscale-leader", NS, takeover)
        assert (err.value.status, error_body(err.value)["reason"]) == (409, "Conflict")
        assert coord.read_namespaced_lease("pdscale-leader", NS).spec.holder_identity == "ctrl-a"

        with pytest.raises(ApiException) as err:
            coord.replace_namespaced_lease("pdscale-leader", NS, lease_body("ctrl-b"))
        assert err.value.status == 422, "an update without resourceVersion is refused for leases"

        status = coord.delete_namespaced_lease("pdscale-leader", NS)  # this client version gives a dict
        assert (status["kind"], status["status"]) == ("Status", "Success")
        with pytest.raises(ApiException) as err:
            coord.read_namespaced_lease("pdscale-leader", NS)
        assert err.value.status == 404
        assert [r.method for r in server.requests][-2:] == ["DELETE", "GET"]


def ssar(namespace: str, verb: str, resource: str, subresource: str = "") -> client.V1SelfSubjectAccessReview:
    return client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group="apps", resource=resource, subresource=subresource
            )
        )
    )


def test_ssar_answers_from_the_allow_list_and_rbac_is_enforced() -> None:
    rules = [
        AccessRule("patch", "apps", "deployments", "scale", namespace=NS),
        AccessRule("get", "apps", "deployments", "scale", namespace=NS),
    ]
    with FakeKubeApiServer(access_rules=rules, enforce_rbac=True) as server, connect(server) as api_client:
        server.add_deployment(NS, "decode", replicas=1)
        auth: Any = client.AuthorizationV1Api(api_client)
        allowed = auth.create_self_subject_access_review(ssar(NS, "patch", "deployments", "scale"))
        assert allowed.status.allowed is True
        other_ns = auth.create_self_subject_access_review(
            ssar("kube-system", "patch", "deployments", "scale")
        )
        assert other_ns.status.allowed is False
        whole = auth.create_self_subject_access_review(ssar(NS, "patch", "deployments"))
        assert whole.status.allowed is False

        apps: Any = client.AppsV1Api(api_client)
        assert (
            apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 2}}).spec.replicas == 2
        )
        with pytest.raises(ApiException) as err:
            apps.read_namespaced_deployment("decode", NS)
        assert err.value.status == 403
        assert error_body(err.value)["message"] == (
            'deployments.apps "decode" is forbidden: User "system:serviceaccount:pdscale:pdscale-controller" '
            'cannot get resource "deployments" in API group "apps" in the namespace "llm"'
        )


def test_bearer_token_required_when_configured() -> None:
    with FakeKubeApiServer(token="s3cret") as server:
        server.add_deployment(NS, "decode")
        with connect(server) as anon, pytest.raises(ApiException) as err:
            client.AppsV1Api(anon).read_namespaced_deployment_scale("decode", NS)
        assert (err.value.status, error_body(err.value)["reason"]) == (401, "Unauthorized")
        with connect(server, token="s3cret") as authed:
            authed_apps: Any = client.AppsV1Api(authed)
            assert authed_apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 1
        assert server.requests[-1].headers["authorization"] == "Bearer s3cret"


def test_kubeconfig_with_token_loads_into_the_official_client(tmp_path: Path) -> None:
    with FakeKubeApiServer(token="t0k") as server:
        server.add_deployment(NS, "decode", replicas=2)
        path = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        cfg = Configuration()
        load: Callable[..., None] = kube_config.load_kube_config  # untyped upstream
        load(config_file=str(path), client_configuration=cfg)
        with ApiClient(cfg) as api_client:
            apps: Any = client.AppsV1Api(api_client)
            assert apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 2
        assert server.requests[-1].headers["authorization"] == "Bearer t0k"


def test_injected_500_then_recovers(server: FakeKubeApiServer, apps: Any) -> None:
    server.inject_status(SCALE_PATH, 500, count=2, method="PATCH")
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 4}})
        assert (err.value.status, error_body(err.value)["reason"]) == (500, "InternalError")
    assert apps.read_namespaced_deployment_scale("decode", NS).spec.replicas == 3, "faults change nothing"
    assert apps.patch_namespaced_deployment_scale("decode", NS, {"spec": {"replicas": 4}}).spec.replicas == 4


def test_injected_409_and_hang_for_client_timeouts(server: FakeKubeApiServer, apps: Any) -> None:
    server.inject_status("*/deployments/decode/scale", 409)
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment_scale("decode", NS)
    assert error_body(err.value)["details"] == {"name": "decode", "group": "apps", "kind": "deployments"}

    # The client's urllib3 pool retries a read timeout by default: one hang is invisible to the caller.
    server.clear_requests()
    server.inject_hang(SCALE_PATH, 2.0)
    assert apps.read_namespaced_deployment_scale("decode", NS, _request_timeout=0.3).spec.replicas == 3
    assert [r.path for r in server.requests] == [SCALE_PATH, SCALE_PATH]

    server.inject_hang(SCALE_PATH, 2.0)
    with connect(server, retries=False) as no_retry, pytest.raises(urllib3.exceptions.ReadTimeoutError):
        client.AppsV1Api(no_retry).read_namespaced_deployment_scale("decode", NS, _request_timeout=0.3)


keys = st.sampled_from(["app", "role", "pool", "tier"])
vals = st.sampled_from(["a", "b", "vllm", "decode"])
requirement = st.one_of(
    st.tuples(keys, st.sampled_from(["=", "==", "!="]), vals),
    st.tuples(keys, st.sampled_from(["in", "notin"]), st.lists(vals, min_size=1, max_size=3)),
    st.tuples(keys, st.sampled_from(["exists", "!exists"]), st.none()),
)


def requirement_text(req: tuple[str, str, Any]) -> str:
    key, op, value = req
    if op in ("in", "notin"):
        return f"{key} {op} ({', '.join(value)})"
    if op == "exists":
        return key
    if op == "!exists":
        return f"!{key}"
    return f"{key}{op}{value}"


def requirement_holds(req: tuple[str, str, Any], labels: dict[str, str]) -> bool:
    key, op, value = req
    if op in ("=", "=="):
        return bool(labels.get(key) == value)
    if op == "!=":
        return bool(labels.get(key) != value)
    if op == "in":
        return bool(labels.get(key) in value)
    if op == "notin":
        return bool(labels.get(key) not in value)
    return (key in labels) == (op == "exists")


@settings(max_examples=200, deadline=None)
@given(labels=st.dictionaries(keys, vals), reqs=st.lists(requirement, max_size=4))
def test_label_selector_is_the_conjunction_of_its_requirements(
    labels: dict[str, str], reqs: list[tuple[str, str, Any]]
) -> None:
    selector = ",".join(requirement_text(r) for r in reqs)
    assert parse_label_selector(selector)(labels) == all(requirement_holds(r, labels) for r in reqs)
