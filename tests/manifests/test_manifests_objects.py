"""Rendered objects load into the official client's models and pass the API's JSON schema (offline)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from typer.testing import CliRunner

from serving.manifests import (
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TIER,
    ManifestSpec,
    ManifestSpecError,
    Rendering,
    dump_yaml,
    render,
)
from serving.manifests.spec import PLACEHOLDER_IMAGE

MODELS = {
    "Namespace": "V1Namespace",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "ConfigMap": "V1ConfigMap",
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
}
# The oldest Kubernetes the manifests are meant for (every field used is GA there) and the newest schema.
SCHEMA_VERSIONS = ("1.29", kubernetes_validate.latest_version())

DISAGG = render(ManifestSpec(pool="chat", namespace="llm", prefill=2, decode=3, standby_decode=2))
MIXED = render(ManifestSpec(pool="chat", namespace="llm", prefill=2, decode=2, placement="mixed-node"))


def _ids(rendering: Rendering) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in rendering.objects()]


def test_renders_the_objects_the_issue_lists() -> None:
    assert _ids(DISAGG) == [
        "Namespace/llm",
        "Deployment/chat-prefill",
        "Deployment/chat-decode",
        "Deployment/chat-decode-standby",
        "Service/chat-prefill",
        "Service/chat-decode",
        "Deployment/chat-router",
        "Service/chat-router",
        "ServiceAccount/pdscale-controller",
        "Role/pdscale-controller",
        "RoleBinding/pdscale-controller",
        "ConfigMap/pdscale-controller",
        "Deployment/pdscale-controller",
        "ConfigMap/pdscale-prometheus-rules",
        "ConfigMap/pdscale-grafana-dashboard",
    ]


@pytest.mark.parametrize("rendering", [DISAGG, MIXED], ids=["disaggregated", "mixed-node"])
def test_every_object_round_trips_through_the_client_models(rendering: Rendering) -> None:
    api = k8s.ApiClient()
    for obj in rendering.objects():
        # deserialize drops keys the model does not know: a misspelt or misplaced field fails here
        assert _round_trip(api, obj) == obj, obj["metadata"]["name"]


def _round_trip(api: k8s.ApiClient, obj: dict[str, Any]) -> Any:
    model = api.deserialize(json.dumps(obj), MODELS[obj["kind"]], "application/json")  # as from the API
    return api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]


def test_the_round_trip_catches_a_misspelt_field() -> None:
    broken = json.loads(json.dumps(DISAGG.find("Deployment", "chat-decode")))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    assert _round_trip(k8s.ApiClient(), broken) != broken


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("rendering", [DISAGG, MIXED], ids=["disaggregated", "mixed-node"])
def test_every_object_passes_the_strict_json_schema(rendering: Rendering, version: str) -> None:
    for obj in rendering.objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']} (k8s {version}): {err.message} at {err.path}"
            )


def test_schema_validation_catches_a_broken_object() -> None:
    broken = json.loads(json.dumps(DISAGG.find("Deployment", "chat-prefill")))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[-1], strict=True)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("rendering", [DISAGG, MIXED], ids=["disaggregated", "mixed-node"])
def test_selectors_own_their_pods_and_services_reach_only_active_pods(rendering: Rendering) -> None:
    deployments = [o for o in rendering.objects() if o["kind"] == "Deployment"]
    for dep in deployments:
        selector = dep["spec"]["selector"]["matchLabels"]
        owners = [
            d["metadata"]["name"]
            for d in deployments
            if _matches(selector, d["spec"]["template"]["metadata"]["labels"])
        ]
        assert owners == [dep["metadata"]["name"]]  # no two Deployments fight over pods
    for svc in (rendering.find("Service", "chat-prefill"), rendering.find("Service", "chat-decode")):
        assert svc["spec"]["clusterIP"] == "None"
        reached = [
            d["metadata"]["name"]
            for d in deployments
            if _matches(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        expected = "chat-pd-mixed" if rendering is MIXED else svc["metadata"]["name"]
        assert reached == [expected]


def _container(dep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _arg(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    return str(args[args.index(flag) + 1])


def test_vllm_pools_carry_gpus_kv_connector_env_probes_and_scrape_annotations() -> None:
    spec = ManifestSpec(pool="chat", model="org/m", gpus_per_instance=4, image="vllm/vllm-openai:v9")
    rendering = render(spec)
    for name, role in (
        ("chat-prefill", "prefill"),
        ("chat-decode", "decode"),
        ("chat-decode-standby", "decode"),
    ):
        dep = rendering.find("Deployment", name)
        c = _container(dep, f"vllm-{role}")
        assert c["image"] == "vllm/vllm-openai:v9" and c["args"][0] == "org/m"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" and _arg(c, "--tensor-parallel-size") == "4"
        assert json.loads(_arg(c, "--kv-transfer-config")) == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
        }
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert {p["containerPort"] for p in c["ports"]} == {
            8000,
            int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"]),
        }
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": 8000}
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "8000"
    assert rendering.find("Deployment", "chat-decode-standby")["metadata"]["labels"][LABEL_TIER] == "standby"


def test_mixed_node_puts_both_roles_in_one_pod_sharing_the_gpus() -> None:
    spec = ManifestSpec(pool="chat", prefill=3, decode=3, placement="mixed-node", prefill_mem_frac=0.3)
    dep = render(spec).find("Deployment", "chat-pd-mixed")
    assert dep["spec"]["replicas"] == 3
    prefill, decode = _container(dep, "vllm-prefill"), _container(dep, "vllm-decode")
    assert (_arg(prefill, "--gpu-memory-utilization"), _arg(decode, "--gpu-memory-utilization")) == (
        "0.3",
        "0.6",
    )
    both = render(
        ManifestSpec(
            placement="mixed-node", prefill_mem_frac=0.35, decode_mem_frac=0.6, decode_min_mem_frac=0.6
        )
    ).find("Deployment", "default-pd-mixed")
    assert [
        _arg(_container(both, f"vllm-{r}"), "--gpu-memory-utilization") for r in ("prefill", "decode")
    ] == [
        "0.35",
        "0.6",
    ]  # 0.95 in all is allowed, and a decode share exactly at its minimum
    assert prefill["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in decode["resources"]["limits"]  # one device-plugin grant per pod
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in decode["env"]
    ports = [p["containerPort"] for c in (prefill, decode) for p in c["ports"]]
    assert len(ports) == len(set(ports))
    assert LABEL_ROLE not in dep["metadata"]["labels"]  # not a per-role Deployment: the actuator skips it
    default = render(ManifestSpec(placement="mixed-node")).find("Deployment", "default-pd-mixed")
    assert [
        _arg(_container(default, f"vllm-{r}"), "--gpu-memory-utilization") for r in ("prefill", "decode")
    ] == [
        "0.4",
        "0.5",
    ]


def test_mixed_node_renders_a_controller_that_scales_whole_nodes() -> None:
    from controller.config import ControllerConfig
    from serving.manifests.control import controller_config

    assert "20-controller.yaml" in MIXED.manifests
    assert any("the controller sizes mixed nodes" in note for note in MIXED.notes)
    cfg = ControllerConfig.model_validate(
        controller_config(ManifestSpec(pool="chat", prefill=2, decode=2, placement="mixed-node"))
    )
    pool = cfg.pools[0]
    assert pool.placement == "mixed-node" and pool.prefill_mem_frac == pytest.approx(0.4 / 0.9, abs=1e-4)
    assert pool.policy.standby_decode == 0
    assert (
        ControllerConfig.model_validate(controller_config(ManifestSpec())).pools[0].placement == "dedicated"
    )


@pytest.mark.parametrize(
    ("fields", "option"),
    [
        ({"pool": "Chat_Pool"}, "--pool"),
        ({"namespace": "x" * 41}, "--namespace"),
        ({"prefill": -1}, "--prefill"),
        ({"gpus_per_instance": 0}, "--gpus-per-instance"),
        ({"prefill": 20, "max_prefill": 16}, "--prefill (20) exceeds --max-prefill (16)"),
        ({"decode": 10, "standby_decode": 8, "max_decode": 16}, "--decode + --standby-decode (18) exceeds"),
        ({"slo_ttft_ms": float("nan")}, "--slo-ttft-ms"),
        ({"prefill_mem_frac": 0.9}, "--prefill-mem-frac: 0.9 leaves the decode container"),
        ({"prefill_mem_frac": 0.65}, "--prefill-mem-frac: 0.65 leaves the decode container"),
        (
            {"prefill_mem_frac": 0.5, "decode_mem_frac": 0.5},
            "--prefill-mem-frac + --decode-mem-frac: 0.5 + 0.5",
        ),
        ({"prefill_mem_frac": 0.6, "decode_mem_frac": 0.25}, "--decode-mem-frac: 0.25 is below"),
        ({"decode_mem_frac": 0.45, "decode_min_mem_frac": 0.5}, "--decode-mem-frac: 0.45 is below"),
        ({"prefill_mem_frac": 0.0}, "--prefill-mem-frac: must lie in (0, 1)"),
        ({"decode_mem_frac": float("nan")}, "--decode-mem-frac: must lie in (0, 1)"),
        ({"placement": "mixed-node", "prefill": 1, "decode": 2}, "--placement mixed-node"),
        ({"placement": "everywhere"}, "--placement"),
        ({"model": " "}, "--model"),
    ],
    ids=lambda v: str(v),
)
def test_invalid_options_are_rejected_naming_the_option(fields: dict[str, Any], option: str) -> None:
    with pytest.raises(ManifestSpecError, match=f"(?m)^  {re.escape(option)}"):
        ManifestSpec(**fields)


@settings(max_examples=25, deadline=None)
@given(
    prefill=st.integers(0, 16),
    decode=st.integers(0, 8),
    standby=st.integers(0, 8),
    gpus=st.integers(1, 8),
    pool=st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True),
)
def test_any_valid_spec_renders_unique_names_and_the_counts_asked(
    prefill: int, decode: int, standby: int, gpus: int, pool: str
) -> None:
    rendering = render(
        ManifestSpec(
            pool=pool, prefill=prefill, decode=decode, standby_decode=standby, gpus_per_instance=gpus
        )
    )
    ids = _ids(rendering)
    assert len(ids) == len(set(ids))
    replicas = {
        (d["metadata"]["labels"][LABEL_ROLE], d["metadata"]["labels"][LABEL_TIER]): d["spec"]["replicas"]
        for d in rendering.objects()
        if d["kind"] == "Deployment" and LABEL_ROLE in d["metadata"]["labels"]
    }
    assert replicas == {
        ("prefill", "active"): prefill,
        ("decode", "active"): decode,
        ("decode", "standby"): standby,
    }
    assert all(
        d["metadata"]["labels"][LABEL_POOL] == pool
        for d in rendering.objects()
        if d["kind"] == "Deployment" and d["metadata"]["name"] != "pdscale-controller"
    )
    for name, objs in rendering.manifests.items():
        assert list(yaml.safe_load_all(dump_yaml(objs))) == list(objs), name


def test_cli_writes_the_files_and_rejects_bad_options(tmp_path: Path) -> None:
    import typer

    from serving.manifests.cli import manifests_cmd

    app = typer.Typer()
    app.command()(manifests_cmd)
    runner = CliRunner()
    out = tmp_path / "deploy"
    result = runner.invoke(app, ["--out", str(out), "--prefill", "2", "--decode", "4", "--namespace", "llm"])
    assert result.exit_code == 0, result.output
    assert PLACEHOLDER_IMAGE in result.output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == [
        "00-namespace.yaml",
        "10-serving.yaml",
        "20-controller.yaml",
        "30-monitoring.yaml",
        "monitoring/grafana-dashboard.json",
        "monitoring/prometheus-rules.yaml",
        "monitoring/prometheus-scrape.yaml",
    ]
    serving = list(yaml.safe_load_all((out / "10-serving.yaml").read_text()))
    decode = next(o for o in serving if o["metadata"]["name"] == "default-decode")
    assert decode["spec"]["replicas"] == 4 and decode["metadata"]["namespace"] == "llm"
    json.loads((out / "monitoring/grafana-dashboard.json").read_text())
    bad = runner.invoke(app, ["--out", str(tmp_path / "x"), "--placement", "mixed-node", "--decode", "2"])
    assert bad.exit_code == 2 and "--prefill (1) and --decode (2) must be equal" in bad.output
    assert not (tmp_path / "x").exists()


def test_cli_mixed_node_shares_and_the_refusals_name_the_option(tmp_path: Path) -> None:
    import typer

    from serving.manifests.cli import manifests_cmd

    app = typer.Typer()
    app.command()(manifests_cmd)
    runner = CliRunner()
    out = tmp_path / "mixed"
    base = ["--placement", "mixed-node", "--prefill", "2", "--decode", "2"]
    ok = runner.invoke(
        app, ["--out", str(out), *base, "--prefill-mem-frac", "0.35", "--decode-mem-frac", "0.6"]
    )
    assert ok.exit_code == 0, ok.output
    pod = next(
        o
        for o in yaml.safe_load_all((out / "10-serving.yaml").read_text())
        if o["metadata"]["name"] == "default-pd-mixed"
    )
    assert [_arg(c, "--gpu-memory-utilization") for c in pod["spec"]["template"]["spec"]["containers"]] == [
        "0.35",
        "0.6",
    ]
    too_much = runner.invoke(app, ["--out", str(tmp_path / "a"), *base, "--decode-mem-frac", "0.6"])
    assert (
        too_much.exit_code == 2 and "--prefill-mem-frac + --decode-mem-frac: 0.4 + 0.6 = 1" in too_much.output
    )
    starved = runner.invoke(app, ["--out", str(tmp_path / "b"), *base, "--decode-min-mem-frac", "0.55"])
    assert (
        starved.exit_code == 2 and "below its guaranteed minimum --decode-min-mem-frac=0.55" in starved.output
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
