"""End to end, in real time: simulated vLLM instances (``run_realtime`` + ``SimMetricsExporter``) scraped by a
real Prometheus → the daemon (Prometheus source, wall clock) → the fake Kubernetes API server receives the
right merge-patch on ``/scale``. Bounded: the loop stops at the first patch or after 30 ticks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, MERGE_PATCH, KubernetesActuator
from controller.audit import AuditLog, read_audit
from controller.capacity import pool_capacity
from controller.clock import WallClock
from controller.config import PolicyConfig
from controller.daemon import Daemon
from controller.pipeline import PoolSetup
from controller.settings import LabelMap
from controller.sources.prometheus import PrometheusSource
from controller.telemetry import Telemetry
from forecaster.baselines import Holt
from serving.sim.engine import Simulator
from serving.sim.exporter import SimMetricsExporter, run_realtime
from serving.sim.fleet import single_pool
from serving.workload.trace import Trace
from tests.support.kube_apiserver import FakeKubeApiServer
from tests.support.prometheus import DISCOVERY_DELAY_S, PrometheusServer, ScrapeJob

pytestmark = pytest.mark.prometheus

NS = "llm"
RATE_RPS = 40.0
PROMPT_TOKENS = 1500  # 60k prompt tokens/s: several prefill instances of llama3-8b/a100 at a 1-s TTFT


def _trace(duration_s: float = 120.0, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    n = rng.poisson(RATE_RPS * duration_s)
    arrivals = np.sort(rng.uniform(0.0, duration_s, n))
    return Trace.from_arrays(arrivals - arrivals[0], np.full(n, PROMPT_TOKENS), rng.integers(50, 150, n))


def test_simulated_fleet_through_prometheus_to_a_scale_patch(prometheus_bin: str, tmp_path: Path) -> None:
    from kubernetes import client as k8s

    fleet = single_pool(prefill=1, decode=1)
    sim = Simulator(fleet, {"default": _trace()})
    stop = threading.Event()
    with (
        SimMetricsExporter() as exporter,
        PrometheusServer(
            prometheus_bin,
            [ScrapeJob("sim", (exporter.url.removeprefix("http://"),), 1.0, honor_labels=True)],
        ) as prom,  # fmt: skip
        FakeKubeApiServer() as kube,
    ):
        driver = threading.Thread(
            target=run_realtime, args=(sim, exporter), kwargs={"until_s": 110.0, "stop": stop}, daemon=True
        )
        driver.start()
        try:
            for role in ("prefill", "decode"):
                kube.add_deployment(
                    NS, f"default-{role}", replicas=1, labels={LABEL_POOL: "default", LABEL_ROLE: role}
                )
            cfg = k8s.Configuration()
            cfg.host = kube.url
            cfg.retries = False
            actuator = KubernetesActuator(NS, k8s.ApiClient(cfg), request_timeout_s=2.0)
            source = PrometheusSource(prom.url, labels=LabelMap(instance="instance_id"), timeout_s=2.0)
            prom.wait_for_query("vllm:prompt_tokens_total", timeout_s=DISCOVERY_DELAY_S + 15.0)
            clock = WallClock()
            policy = PolicyConfig(standby_decode=0, max_prefill=16, max_decode=16)
            with AuditLog(tmp_path / "audit.jsonl") as audit:
                daemon = Daemon(
                    [PoolSetup(fleet.pools[0], policy)], source, actuator, Holt(), clock=clock, tick_s=1.0,
                    telemetry=Telemetry(clock), audit=audit,
                )  # fmt: skip
                patched = []
                for _ in range(30):
                    started = time.monotonic()
                    report = daemon.tick()
                    patched = [r for r in kube.requests if r.method == "PATCH"]
                    if patched:
                        break
                    assert report.ok or report.kind == "source_unavailable", report.message
                    time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        finally:
            stop.set()
            driver.join(timeout=10.0)
    assert patched, "the daemon never patched a /scale"
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/default-prefill/scale"
    (patch,) = [r for r in patched if r.path == scale]
    assert patch.content_type == MERGE_PATCH
    wanted = patch.body["spec"]["replicas"]
    entry = read_audit(tmp_path / "audit.jsonl")[-1]
    assert entry["applied"]["targets"]["prefill"]["active"] == entry["plan"]["prefill"] == wanted
    assert kube.deployment(NS, "default-prefill")["spec"]["replicas"] == wanted
    # One prefill instance cannot keep up with 60k prompt tokens/s: it runs at its capacity and the rest
    # queues, so the plan asks for more (the measured rate is what was prefilled, not what arrived).
    cap = pool_capacity(fleet.pools[0], PROMPT_TOKENS, 100.0)
    assert entry["load"]["prompt_tps"] > 0.5 * cap.prefill_tps
    assert 2 <= wanted <= policy.max_prefill
