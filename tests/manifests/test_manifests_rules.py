"""Alert rules and dashboard queries checked with the real ``promtool``: syntax (``check rules``) and
behaviour (``test rules``: each alert fires on the input the seed's table describes, in both vLLM metric
spellings, and stays quiet below its threshold or before its ``for``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.manifests import ManifestSpec, alert_rules, grafana_dashboard, render
from serving.manifests.render import RULES_FILE

pytestmark = pytest.mark.prometheus


@pytest.fixture
def promtool(prometheus_bin: str) -> str:
    return str(Path(prometheus_bin).with_name("promtool"))


def _run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_the_shipped_rule_files_pass_promtool_check(promtool: str, tmp_path: Path) -> None:
    rendering = render(ManifestSpec())
    (tmp_path / "rules.yaml").write_text(rendering.files[RULES_FILE])
    cm = rendering.find("ConfigMap", "pdscale-prometheus-rules")
    (tmp_path / "cm-rules.yaml").write_text(cm["data"]["pdscale-rules.yaml"])
    done = _run(promtool, "check", "rules", "rules.yaml", "cm-rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


def test_promtool_check_rejects_a_broken_expression(promtool: str, tmp_path: Path) -> None:
    rules = alert_rules()
    rules["groups"][0]["rules"][0]["expr"] = "sum by (pool (DCGM_FI_DEV_GPU_UTIL)"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    assert _run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    dashboard = grafana_dashboard(ManifestSpec())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    as_rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e.replace("$pool", ".*")}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    (tmp_path / "dash.yaml").write_text(yaml.safe_dump(as_rules))
    done = _run(promtool, "check", "rules", "dash.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    json.dumps(dashboard)  # the dashboard is plain JSON


def _histogram(name: str, pool: str, per_min: dict[str, int]) -> list[dict[str, str]]:
    """Cumulative bucket series growing by ``per_min[le]`` per minute (``le`` ascending, +Inf last)."""
    return [
        {"series": f'{name}{{pool="{pool}", le="{le}"}}', "values": f"0+{n}x20"} for le, n in per_min.items()
    ]


SLOW = {"0.01": 0, "0.025": 0, "0.05": 0, "0.25": 0, "0.5": 0, "1": 60, "+Inf": 60}  # all in (0.5, 1] s
FAST = {"0.01": 60, "0.025": 60, "0.05": 60, "0.25": 60, "0.5": 60, "1": 60, "+Inf": 60}  # all <= 10 ms
TEAM = {"team": "pdscale"}


def _tests() -> list[dict[str, Any]]:
    ttft, nixl = "time_to_first_token_seconds_bucket", "nixl_xfer_time_seconds_bucket"
    return [
        {
            "interval": "1m",
            "input_series": [
                *_histogram(f"vllm:{ttft}", "a", SLOW),  # Prometheus 3 spelling
                *_histogram(f"vllm_{ttft}", "b", SLOW),  # Prometheus 2 + OpenMetrics spelling
                *_histogram(f"vllm:{ttft}", "c", FAST),
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "PdscaleTTFTP99High", "exp_alerts": []},  # pending (for: 5m)
                {
                    "eval_time": "10m",
                    "alertname": "PdscaleTTFTP99High",
                    "exp_alerts": [
                        {"exp_labels": {"severity": "critical", "pool": p, **TEAM}} for p in ("a", "b")
                    ],
                },
            ],
        },
        {
            "interval": "1m",
            "input_series": [*_histogram(f"vllm:{nixl}", "a", SLOW), *_histogram(f"vllm_{nixl}", "c", FAST)],
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": "PdscaleKVTransferP99High",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "a", **TEAM}}],
                }
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {
                    "series": 'vllm_kv_cache_usage_perc{pool="a", role="decode", instance="d0:8000"}',
                    "values": "0.9x15",
                },
                {
                    "series": 'vllm:kv_cache_usage_perc{pool="a", role="decode", instance="d1:8000"}',
                    "values": "0.9x15",
                },
                {
                    "series": 'vllm:kv_cache_usage_perc{pool="a", role="prefill", instance="p0:8000"}',
                    "values": "0.8x15",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": "PdscaleKVCacheHigh",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "pool": "a",
                                "role": "decode",
                                "instance": i,
                                **TEAM,
                            }
                        }
                        for i in ("d0:8000", "d1:8000")
                    ],
                }
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0", Hostname="n1"}', "values": "95x15"},
                {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="1", Hostname="n1"}', "values": "80x15"},
                {
                    "series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0", Hostname="n2"}',
                    "values": "95 95 95 50 95 95 95 95 95 95",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "8m",
                    "alertname": "PdscaleGPUUtilisationHigh",
                    "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "gpu": "0", "Hostname": "n1", **TEAM}}
                    ],
                }
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": 'pdscale_controller_is_leader{instance="c0"}', "values": "1 1 0 0 0 0 0 0"},
                {"series": 'pdscale_controller_is_leader{instance="c1"}', "values": "0x7"},
                {"series": 'pdscale_controller_degraded{pool="a", instance="c0"}', "values": "1x10"},
                {
                    "series": 'pdscale_controller_silence_hold{pool="a", instance="c0"}',
                    "values": "0 0 1 1 1 0 0",
                },
                {"series": 'pdscale_controller_silence_hold{pool="b", instance="c0"}', "values": "0x7"},
                {
                    "series": 'pdscale_controller_latency_estimate{pool="a", instance="c0"}',
                    "values": "1.6x20",
                },
                {
                    "series": 'pdscale_controller_latency_estimate{pool="b", instance="c0"}',
                    "values": "1.1x20",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "PdscaleControllerNoLeader", "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": "PdscaleControllerNoLeader",
                    "exp_alerts": [{"exp_labels": {"severity": "critical", **TEAM}}],
                },
                {
                    "eval_time": "6m",
                    "alertname": "PdscaleControllerDegraded",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "a", **TEAM}}],
                },
                {"eval_time": "1m", "alertname": "PdscaleTrafficStoppedDead", "exp_alerts": []},
                {
                    "eval_time": "3m",
                    "alertname": "PdscaleTrafficStoppedDead",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "a", **TEAM}}],
                },
                {"eval_time": "6m", "alertname": "PdscaleTrafficStoppedDead", "exp_alerts": []},
                {"eval_time": "9m", "alertname": "PdscaleEnginesSlowerThanProfile", "exp_alerts": []},
                {
                    "eval_time": "11m",
                    "alertname": "PdscaleEnginesSlowerThanProfile",
                    "exp_alerts": [{"exp_labels": {"severity": "warning", "pool": "a", **TEAM}}],
                },
            ],
        },
    ]


def _write_unit_tests(tmp_path: Path, rules: dict[str, Any]) -> None:
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # promtool compares annotations exactly; the expressions are under test
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": _tests()}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))


def test_each_alert_fires_on_its_condition_and_only_then(promtool: str, tmp_path: Path) -> None:
    _write_unit_tests(tmp_path, alert_rules())
    done = _run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alert_unit_tests_fail_when_a_threshold_is_wrong(promtool: str, tmp_path: Path) -> None:
    rules = alert_rules()
    ttft = next(r for r in rules["groups"][0]["rules"] if r["alert"] == "PdscaleTTFTP99High")
    ttft["expr"] = ttft["expr"].replace("> 0.5", "> 2")  # 2 s instead of 500 ms: pools a and b stay quiet
    _write_unit_tests(tmp_path, rules)
    done = _run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode != 0 and "PdscaleTTFTP99High" in done.stdout + done.stderr
