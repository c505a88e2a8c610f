"""Mixed-node pods sharing their GPUs through one DRA ResourceClaim (``--gpu-sharing dra``)."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from serving.manifests import ManifestSpec, ManifestSpecError, render

DRA = render(
    ManifestSpec(
        pool="chat", prefill=2, decode=2, placement="mixed-node", gpu_sharing="dra", gpus_per_instance=2
    )
)
MODELS = {
    "Namespace": "V1Namespace",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "ConfigMap": "V1ConfigMap",
    "ResourceClaimTemplate": "V1ResourceClaimTemplate",
    "ServiceAccount": "V1ServiceAccount",  # the controller's (rendered for mixed-node pools since W6)
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
}
# resource.k8s.io/v1 (DRA GA) exists from Kubernetes 1.34 on: older schemas do not know it
DRA_VERSIONS = ("1.34", kubernetes_validate.latest_version())


def _containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_both_containers_reference_one_claim_from_the_template() -> None:
    template = DRA.find("ResourceClaimTemplate", "chat-node-gpus")
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}
    for name in ("chat-pd-mixed", "chat-pd-mixed-standby"):
        dep = DRA.find("Deployment", name)
        pod = dep["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "chat-node-gpus"}]
        for c in _containers(dep).values():
            assert c["resources"]["claims"] == [{"name": "gpus"}]
            assert "nvidia.com/gpu" not in c["resources"]["requests"]  # no device-plugin grant besides
            assert all(e["name"] != "NVIDIA_VISIBLE_DEVICES" for e in c["env"])
    ids = [f"{o['kind']}/{o['metadata']['name']}" for o in DRA.objects()]
    assert ids.index("ResourceClaimTemplate/chat-node-gpus") < ids.index("Deployment/chat-pd-mixed")


def test_runtime_sharing_says_pods_must_take_whole_nodes() -> None:
    runtime = render(ManifestSpec(placement="mixed-node"))
    assert any("whole node" in note for note in runtime.notes)
    assert not any("whole node" in note for note in DRA.notes)
    assert all(o["kind"] != "ResourceClaimTemplate" for o in runtime.objects())


@pytest.mark.parametrize("version", DRA_VERSIONS)
def test_dra_objects_pass_the_strict_schema(version: str) -> None:
    for obj in DRA.objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']} (k8s {version}): {err.message} at {err.path}"
            )


def test_dra_objects_round_trip_through_the_client_models() -> None:
    api = k8s.ApiClient()
    for obj in DRA.objects():
        model = api.deserialize(json.dumps(obj), MODELS[obj["kind"]], "application/json")
        assert api.sanitize_for_serialization(model) == obj, obj["metadata"]["name"]  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("fields", "option"),
    [
        ({"gpu_sharing": "dra"}, "--gpu-sharing dra: only a mixed-node pod"),
        ({"placement": "mixed-node", "gpu_sharing": "mps"}, "--gpu-sharing: 'mps'"),
        ({"placement": "mixed-node", "gpu_sharing": "dra", "dra_device_class": "GPU!"}, "--dra-device-class"),
    ],
)
def test_bad_sharing_options_name_the_option(fields: dict[str, Any], option: str) -> None:
    with pytest.raises(ManifestSpecError, match=f"(?m)^  {re.escape(option)}"):
        ManifestSpec(**fields)
