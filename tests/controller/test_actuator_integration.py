"""End to end: real Prometheus scraping a fake vLLM exporter → PrometheusSource → LoadAggregator →
``controller.policy.decide`` → KubernetesActuator → the fake API server receives the right PATCH."""

from __future__ import annotations

import time

import pytest

from controller.actuators.base import ReplicaBounds
from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, MERGE_PATCH, KubernetesActuator
from controller.config import PolicyConfig
from controller.policy import PolicyContext, PoolCapacity, PoolObservation, PoolState, decide
from controller.settings import LabelMap
from controller.sources.aggregate import LoadAggregator
from controller.sources.prometheus import PrometheusSource
from tests.controller.test_prom_source_exporter import FakeInstance, FakeVllmExporter
from tests.support.kube_apiserver import FakeKubeApiServer
from tests.support.prometheus import DISCOVERY_DELAY_S, PrometheusServer, ScrapeJob

pytestmark = pytest.mark.prometheus

NS = "llm"
PROMPT_TPS = 2000.0
GEN_TPS = 300.0
# One prefill instance sustains 500 prompt tokens/s at the SLO: 2000 tok/s needs at least 4 of them.
CAPACITY = PoolCapacity(prefill_tps=500.0, decode_seqs=16.0, decode_tps=400.0, gpus_per_instance=1)


def test_prometheus_to_policy_to_kubernetes_patch(prometheus_bin: str) -> None:
    from kubernetes import client as k8s

    prefill = FakeInstance(
        {"instance_id": "a-p0", "pool": "a", "role": "prefill"}, 1.0, 0.0, 0.0, PROMPT_TPS, 0.0, 8.0, 8.0
    )
    decode = FakeInstance(
        {"instance_id": "a-d0", "pool": "a", "role": "decode"}, 6.0, 0.0, 0.3, 0.0, GEN_TPS, 0.0, 0.0
    )
    with (
        FakeVllmExporter((prefill, decode), ()) as exporter,
        PrometheusServer(
            prometheus_bin,
            [ScrapeJob("vllm", (exporter.target,), 1.0, metrics_path="/colon", honor_labels=True)],
        ) as prom,
        FakeKubeApiServer() as kube,
    ):
        kube.add_deployment(NS, "a-prefill", replicas=1, labels={LABEL_POOL: "a", LABEL_ROLE: "prefill"})
        kube.add_deployment(NS, "a-decode", replicas=1, labels={LABEL_POOL: "a", LABEL_ROLE: "decode"})
        cfg = k8s.Configuration()
        cfg.host = kube.url
        cfg.retries = False
        actuator = KubernetesActuator(NS, k8s.ApiClient(cfg), request_timeout_s=2.0)
        source = PrometheusSource(prom.url, labels=LabelMap(instance="instance_id"))
        prom.wait_for_query("vllm:prompt_tokens_total", timeout_s=DISCOVERY_DELAY_S + 15.0)

        aggregator = LoadAggregator()
        aggregator.update(source.scrape(time.time()), ["a"])
        time.sleep(4.0)
        load = aggregator.update(source.scrape(time.time()), ["a"])["a"]
        assert load.prompt_tps == pytest.approx(PROMPT_TPS, rel=0.4)

        now = actuator.current("a")
        obs = PoolObservation(
            pool="a",
            now_s=load.now_s,
            replicas={r: now.role(r).replicas for r in ("prefill", "decode")},
            active={r: now.role(r).ready for r in ("prefill", "decode")},
            standby={r: now.role(r).standby for r in ("prefill", "decode")},
            provisioning={"prefill": 0, "decode": 0},
            arrival_rps=load.arrival_rps,
            prompt_tps=load.prompt_tps,
            gen_tps=load.gen_tps,
            running_seqs=load.running,
            waiting_requests=load.waiting,
            oldest_wait_s=float("nan"),
            kv_usage=load.kv_usage,
            mean_prompt_tokens=load.mean_prompt_tokens,
            mean_output_tokens=float("nan"),
            complete=load.complete,
        )
        policy = PolicyConfig(standby_decode=0, max_prefill=16, max_decode=16)
        plan, _ = decide(PolicyContext(obs, CAPACITY, policy, 500.0, 50.0), PoolState())
        assert plan is not None, "the load is known: the policy must have an opinion"
        assert plan.prefill >= 4, plan.reasons

        kube.clear_requests()
        actuator.apply(plan, ReplicaBounds.from_policy(policy))
        sent = {r.path: (r.content_type, r.body) for r in kube.requests if r.method == "PATCH"}
        scale = f"/apis/apps/v1/namespaces/{NS}/deployments/{{}}/scale"
        assert sent[scale.format("a-prefill")] == (MERGE_PATCH, {"spec": {"replicas": plan.prefill}})
        assert (scale.format("a-decode") in sent) == (plan.decode != 1)
        assert kube.deployment(NS, "a-prefill")["spec"]["replicas"] == plan.prefill
