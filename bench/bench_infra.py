"""Test-infrastructure figures: Prometheus start and first scrape, promtool backfill, the simulator exporter's
page cost, and the in-process Kubernetes API server's round trip through the official client.

    .venv/bin/python bench/bench_infra.py [--json out/bench_infra.json]

Needs Debian's `prometheus` and `promtool` on PATH (the Prometheus figures are skipped, and say so, without them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.sim import samples as s
from serving.sim.exporter import SimMetricsExporter
from tests.support.kube_apiserver import FakeKubeApiServer
from tests.support.prometheus import PrometheusServer, ScrapeJob, Series, backfill_openmetrics


def fleet_samples(n: int) -> s.InstanceSamples:
    rng = np.random.default_rng(0)

    def hist(bounds: tuple[float, ...]) -> s.Histogram:
        counts = np.cumsum(rng.integers(0, 50, size=(n, len(bounds) + 1)), axis=1)
        return s.Histogram(bounds_s=bounds, counts=counts, sums=rng.random(n) * 100)

    return s.InstanceSamples(
        now_s=100.0,
        instance_ids=tuple(f"default-decode-{i}" for i in range(n)),
        pools=("default",) * n,
        roles=("decode",) * n,
        nodes=tuple(f"node-{i}" for i in range(n)),
        states=("active",) * n,
        gauges={
            name: rng.random(n)
            for name in (s.NUM_REQUESTS_RUNNING, s.NUM_REQUESTS_WAITING, s.KV_CACHE_USAGE_PERC)
        },
        counters={
            name: rng.random(n) * 1e6
            for name in (s.PROMPT_TOKENS_TOTAL, s.GENERATION_TOKENS_TOTAL, s.REQUEST_SUCCESS_TOTAL)
        },
        histograms={
            s.TIME_TO_FIRST_TOKEN_SECONDS: hist(s.TTFT_BUCKETS_S),
            s.INTER_TOKEN_LATENCY_SECONDS: hist(s.ITL_BUCKETS_S),
            s.E2E_REQUEST_LATENCY_SECONDS: hist(s.E2E_BUCKETS_S),
        },
    )


def best_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def bench_exporter() -> dict[str, Any]:
    out: dict[str, Any] = {}
    exporter = SimMetricsExporter()
    for n in (16, 128):
        samples = fleet_samples(n)

        def fresh(instance_id: str | None, samples: s.InstanceSamples = samples) -> bytes:
            exporter.update(samples)  # a new snapshot: pages are rendered again, not served from its cache
            return exporter.render(instance_id)

        page = fresh(None)
        out[f"fleet_page_{n}_instances"] = {
            "bytes": len(page),
            "render_ms_best": round(best_ms(lambda: fresh(None), 5), 2),
            "one_instance_page_ms_best": round(best_ms(lambda: fresh("default-decode-0"), 20), 3),
            "cached_page_ms_best": round(best_ms(exporter.render, 20), 4),
        }
    return out


def bench_kube() -> dict[str, Any]:
    from kubernetes import client

    with FakeKubeApiServer() as server:
        server.add_deployment("llm", "decode", replicas=1)
        cfg = client.Configuration()
        cfg.host = server.url
        with client.ApiClient(cfg) as api_client:
            apps: Any = client.AppsV1Api(api_client)
            lat = []
            for i in range(200):
                t0 = time.perf_counter()
                apps.patch_namespaced_deployment_scale("decode", "llm", {"spec": {"replicas": 1 + i % 5}})
                lat.append((time.perf_counter() - t0) * 1000)
    return {
        "patch_scale_round_trip_ms": {
            "median": round(statistics.median(lat), 2),
            "p90": round(float(np.percentile(lat, 90)), 2),
        }
    }


def bench_prometheus() -> dict[str, Any]:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        return {"skipped": "prometheus/promtool not on PATH"}
    out: dict[str, Any] = {}
    with SimMetricsExporter() as exporter:
        exporter.update(fleet_samples(4))
        job = ScrapeJob(job="sim", http_sd_url=exporter.targets_url, scrape_interval_s=1.0, honor_labels=True)
        t0 = time.monotonic()
        with PrometheusServer(jobs=[job]) as prom:
            t_ready = time.monotonic()
            prom.wait_for_query("vllm:num_requests_running", timeout_s=30.0, poll_s=0.05)
            t_first = time.monotonic()
    out["start_to_ready_s"] = round(t_ready - t0, 2)
    out["ready_to_first_sample_s"] = round(t_first - t_ready, 2)

    n_series, hours, step_s = 50, 6, 5.0
    ts = 1_700_000_000.0 + np.arange(0.0, hours * 3600.0, step_s)
    rng = np.random.default_rng(1)
    series = [
        Series("vllm:num_requests_running", {"instance_id": f"i-{k}"}, ts, rng.random(len(ts)))
        for k in range(n_series)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        backfill_openmetrics(series, Path(tmp) / "tsdb")
        out[f"backfill_{n_series}_series_{hours}h_at_{step_s:.0f}s_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        with PrometheusServer(data_dir=Path(tmp) / "tsdb", retention="10y"):
            out["start_to_ready_with_backfill_s"] = round(time.monotonic() - t0, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    result = {"exporter": bench_exporter(), "kube_apiserver": bench_kube(), "prometheus": bench_prometheus()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
