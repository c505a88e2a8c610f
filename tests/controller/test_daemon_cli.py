"""``pdscale controller --config live.yaml`` as a real process: JSON log lines, --once, SIGTERM, /metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.prometheus import free_port

PDSCALE = [sys.executable, "-c", "from training.pdscale_cli import main; main()"]


def _config(tmp_path: Path, **extra: Any) -> Path:
    # nothing listens on this port: every scrape fails with "unreachable" (temporary)
    doc = {
        "tick_s": 0.2,
        "source": {"kind": "prometheus", "url": f"http://127.0.0.1:{free_port()}", "timeout_s": 0.5},
        "actuator": {"kind": "dry-run"},
        "forecaster_checkpoint": str(tmp_path / "none.safetensors"),
        "pools": [{"name": "chat"}],
        **extra,
    }
    path = tmp_path / "live.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def _lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_once_reports_a_failed_tick_with_exit_1_and_json_logs(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    done = subprocess.run(
        [*PDSCALE, "controller", "--config", str(cfg), "--once"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    lines = _lines(done.stderr)
    errors = [e for e in lines if e.get("event") == "error"]
    assert errors and errors[0]["kind"] == "source_unavailable" and "unreachable" in errors[0]["msg"]
    assert any(e.get("event") == "forecaster_fallback" for e in lines)
    assert lines[-1]["event"] == "stopped"


def test_sigterm_finishes_the_tick_and_exits_0_while_serving_metrics(tmp_path: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, metrics_port=port, audit_log=str(tmp_path / "audit.jsonl"))
    proc = subprocess.Popen([*PDSCALE, "controller", "--config", str(cfg)], stderr=subprocess.PIPE, text=True)
    try:
        page = ""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as resp:
                    page = resp.read().decode()
                if 'pdscale_controller_errors_total{kind="source_unavailable"} 0.0' not in page:
                    break  # at least one failed scrape counted
            except OSError:
                pass
            time.sleep(0.2)
        assert "pdscale_controller_forecaster_fallback 1.0" in page
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    events = [e.get("event") for e in _lines(stderr)]
    assert "signal" in events and events[-1] == "stopped"


def test_kubernetes_actuator_and_leader_election_from_a_kubeconfig(tmp_path: Path) -> None:
    """The CLI's Kubernetes path: the kubeconfig is loaded, the pools' replicas are read from the cluster
    (restart recovery), and --leader-elect creates the Lease under the given identity."""
    from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE
    from tests.support.kube_apiserver import FakeKubeApiServer

    with FakeKubeApiServer(token="s3cret") as kube:
        for role, n in (("prefill", 3), ("decode", 5)):
            kube.add_deployment(
                "llm", f"chat-{role}", replicas=n, labels={LABEL_POOL: "chat", LABEL_ROLE: role}
            )
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", namespace="llm")
        cfg = _config(
            tmp_path, actuator={"kind": "kubernetes", "namespace": "llm", "kubeconfig": str(kubeconfig)}
        )
        done = subprocess.run(
            [
                *PDSCALE,
                "controller",
                "--config",
                str(cfg),
                "--max-ticks",
                "2",
                "--leader-elect",
                "--identity",
                "r1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lease = kube.lease("llm", "pdscale-controller")
        listed = [r for r in kube.requests if r.method == "GET" and r.path.endswith("/deployments")]
    assert done.returncode == 1, done.stderr  # every tick failed: Prometheus is unreachable
    lines = _lines(done.stderr)
    (recovered,) = [e for e in lines if e.get("event") == "recovered"]
    assert recovered["replicas"] == {"chat": {"prefill": 3, "decode": 5}}
    assert any(e.get("event") == "leader" and e["leader"] for e in lines)
    assert lease["spec"].get("holderIdentity") in (None, "")  # released on a graceful exit
    assert lease["spec"]["leaseDurationSeconds"] == 1
    assert len(listed) >= 2
