"""The controller's real I/O: PrometheusSource.scrape / history and KubernetesActuator.apply latencies.

Run: ``nice .venv/bin/python bench/bench_controller_io.py [--instances 10 200] [--json out.json]``

- scrape: a real Prometheus (Debian 2.42) scrapes the fake vLLM exporter of the tests (every instance on one
  ``/colon`` page) at 1 s; ``scrape()`` is timed ``--repeats`` times (9 instant queries for the whole fleet).
- history: backfilled TSDB blocks (1 pool, 2 instances, 6 h at 1 s, promtool), ``history()`` over the 6 h
  at 1 s (21,601 steps → 3 chunks of 10,000 per channel) and at 15 s (1 chunk).
- apply: the in-process Kubernetes API server of the tests, the official client; ``apply()`` of an unchanged
  plan (one LIST, no PATCH) and of a changed plan (one LIST + 2 PATCH /scale).
Prints a Markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.actuators.base import ReplicaBounds
from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, KubernetesActuator
from controller.policy.types import ScalingPlan
from controller.settings import LabelMap
from controller.sources.prometheus import PrometheusSource
from tests.controller.test_prom_source_exporter import FakeInstance, FakeVllmExporter
from tests.support.kube_apiserver import FakeKubeApiServer
from tests.support.prometheus import PrometheusServer, ScrapeJob, Series, backfill_openmetrics


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000.0)
    return {"median_ms": statistics.median(ms), "max_ms": max(ms), "n": repeats}


def bench_scrape(n: int, repeats: int) -> dict[str, Any]:
    insts = tuple(
        FakeInstance(
            {"instance_id": f"i{k}", "pool": f"p{k % 4}", "role": ("prefill", "decode")[k % 2]},
            3.0,
            1.0,
            0.5,
            100.0,
            50.0,
            1.0,
            1.0,
        )
        for k in range(n)
    )
    with (
        FakeVllmExporter(insts, ()) as exp,
        PrometheusServer(
            "prometheus", [ScrapeJob("vllm", (exp.target,), 1.0, metrics_path="/colon", honor_labels=True)]
        ) as prom,
    ):
        prom.wait_for_query(
            '{__name__=~"vllm[:_]time_to_first_token_seconds_bucket"}',
            timeout_s=30.0,
            predicate=lambda r: len(r) == 4 * n,
        )
        source = PrometheusSource(prom.url, labels=LabelMap(instance="instance_id"), timeout_s=10.0)
        got = source.scrape(time.time())
        assert len(got.instance_ids) == n, len(got.instance_ids)
        return {"instances": n, **timed(lambda: source.scrape(time.time()), repeats)}


def bench_history() -> list[dict[str, Any]]:
    t0, dur = 1_700_000_000.0, 6 * 3600
    t = t0 + np.arange(dur + 1, dtype=np.float64)
    series = []
    for role in ("prefill", "decode"):
        lab = {"pool": "a", "role": role, "instance": role}
        series += [
            Series("vllm:prompt_tokens_total", lab, t, 100.0 * (t - t0)),
            Series("vllm:generation_tokens_total", lab, t, 30.0 * (t - t0)),
            Series("vllm:num_requests_running", lab, t, np.full_like(t, 3.0)),
            Series("vllm:kv_cache_usage_perc", lab, t, np.full_like(t, 0.5)),
        ]
        for le in ("0.1", "0.25", "+Inf"):
            series.append(
                Series("vllm:time_to_first_token_seconds_bucket", {**lab, "le": le}, t, 2.0 * (t - t0))
            )
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        t_fill = time.perf_counter()
        backfill_openmetrics(series, tmp)
        fill_s = time.perf_counter() - t_fill
        with PrometheusServer("prometheus", data_dir=tmp, retention="10y") as prom:
            source = PrometheusSource(prom.url)
            for step in (1.0, 15.0):
                frame = source.history(t0, t0 + dur, step)
                r = timed(partial(source.history, t0, t0 + dur, step), 3)
                out.append({"step_s": step, "steps": frame.values.shape[2], "backfill_s": fill_s, **r})
    return out


def bench_apply(repeats: int) -> dict[str, Any]:
    from kubernetes import client as k8s

    with FakeKubeApiServer() as kube:
        for pool in ("a", "b"):
            for role in ("prefill", "decode"):
                kube.add_deployment(
                    "llm", f"{pool}-{role}", replicas=1, labels={LABEL_POOL: pool, LABEL_ROLE: role}
                )
        cfg = k8s.Configuration()
        cfg.host = kube.url
        cfg.retries = False
        act = KubernetesActuator("llm", k8s.ApiClient(cfg))
        bounds = ReplicaBounds(1, 64, 1, 64)
        act.apply(ScalingPlan("a", 2, 2, 0, 0), bounds)
        same = timed(lambda: act.apply(ScalingPlan("a", 2, 2, 0, 0), bounds), repeats)
        flip = iter(range(10**6))
        changed = timed(lambda: act.apply(ScalingPlan("a", 3 + next(flip) % 2, 3, 0, 0), bounds), repeats)
    return {"unchanged": same, "changed": changed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, nargs="*", default=[10, 200])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "scrape": [bench_scrape(n, args.repeats) for n in args.instances],
        "history": bench_history(),
        "apply": bench_apply(args.repeats),
    }
    print("| what | size | median ms | max ms |\n|---|---|---|---|")
    for r in result["scrape"]:
        print(f"| scrape() | {r['instances']} instances | {r['median_ms']:.1f} | {r['max_ms']:.1f} |")
    for r in result["history"]:
        print(
            f"| history() 6 h at {r['step_s']:g} s | {r['steps']} steps x 10 channels | {r['median_ms']:.0f} | {r['max_ms']:.0f} |"
        )
    for k, r in result["apply"].items():
        print(f"| apply() {k} | 2 Deployments | {r['median_ms']:.1f} | {r['max_ms']:.1f} |")
    print(f"(backfill of the 6-h history: {result['history'][0]['backfill_s']:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
