"""The direct source's cost per tick: parse every member's ``/metrics`` page and map it to ``InstanceSamples``.

``DirectSource.scrape`` fetches the pages in parallel and then, in the daemon's thread, parses each with
``prometheus_client``'s text parser and maps them through ``PrometheusSource`` (an in-memory querier). This
measures that CPU part with the HTTP fetch replaced by returning a page from memory. The page is vLLM-sized:
by default a synthetic one with vLLM 0.32's metric families (the gauges, counters and the 13 histograms a
v1 engine exports, with vLLM's bucket bounds, plus the process/GC series of ``prometheus_client``); ``--page
FILE`` uses a page saved from a real server instead (``curl -s http://127.0.0.1:PORT/metrics > page.txt``).
A router page with one backend series per member is added. Prints one JSON document.

    .venv/bin/python bench/bench_direct_source.py
    .venv/bin/python bench/bench_direct_source.py --members 2 8 32 --repeats 20 --page page.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controller.sources.direct import DirectSource
from serving.sim import samples as names

LABELS = ["model_name", "engine"]
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


def synthetic_page() -> str:
    """A page with vLLM 0.32's families and bucket bounds (values arbitrary but non-zero)."""
    r = CollectorRegistry()
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "num_requests_swapped",
    ):
        Gauge(f"vllm:{name}", name, LABELS, registry=r).labels("tiny", "0").set(3)
    for name in (
        "prompt_tokens",
        "generation_tokens",
        "num_preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
    ):
        Counter(f"vllm:{name}", name, LABELS, registry=r).labels("tiny", "0").inc(1234)
    ok = Counter("vllm:request_success", "finished", [*LABELS, "finished_reason"], registry=r)
    for reason in ("stop", "length", "abort"):
        ok.labels("tiny", "0", reason).inc(10)
    hists: dict[str, tuple[float, ...]] = {
        "time_to_first_token_seconds": names.TTFT_BUCKETS_S,
        "inter_token_latency_seconds": names.ITL_BUCKETS_S,
        "e2e_request_latency_seconds": names.E2E_BUCKETS_S,
        "request_queue_time_seconds": TIME_BUCKETS,
        "request_inference_time_seconds": TIME_BUCKETS,
        "request_prefill_time_seconds": TIME_BUCKETS,
        "request_decode_time_seconds": TIME_BUCKETS,
        "request_prompt_tokens": SIZE_BUCKETS,
        "request_generation_tokens": SIZE_BUCKETS,
        "iteration_tokens_total": SIZE_BUCKETS,
        "request_max_num_generation_tokens": SIZE_BUCKETS,
        "request_params_n": (1, 2, 5, 10, 20),
        "request_params_max_tokens": SIZE_BUCKETS,
    }
    for name, bounds in hists.items():
        h = Histogram(f"vllm:{name}", name, LABELS, buckets=bounds, registry=r).labels("tiny", "0")
        for v in (bounds[0], bounds[len(bounds) // 2], bounds[-1]):
            h.observe(v)
    gc = Counter(
        "python_gc_objects_collected", "gc", ["generation"], registry=r
    )  # a real server's own series
    for gen in range(3):
        gc.labels(str(gen)).inc(5)
    for name in ("process_virtual_memory_bytes", "process_resident_memory_bytes", "process_start_time_seconds",
                 "process_cpu_seconds", "process_open_fds", "process_max_fds"):  # fmt: skip
        Gauge(name, name, registry=r).set(1.0)
    return generate_latest(r).decode()


def router_page(ids: list[str]) -> str:
    r = CollectorRegistry()
    c = Counter("pdscale:router_requests", "requests", ["instance_id", "role", "node"], registry=r)
    for i in ids:
        c.labels(i, "decode", "").inc(7)
    return generate_latest(r).decode()


class Pool:
    def __init__(self, n: int) -> None:
        self.name = "bench"
        self.url = "http://router"
        self.ids = [f"d{i}" for i in range(n)]

    def state(self) -> dict[str, Any]:
        return {"instances": [{"id": i, "role": "decode", "tier": "active", "url": f"http://{i}", "node": None}
                              for i in self.ids]}  # fmt: skip


def measure(page: str, n: int, repeats: int) -> dict[str, float]:
    pool = Pool(n)
    rpage = router_page(pool.ids)
    src = DirectSource(pool, fetch=lambda url, _t: rpage if url.startswith("http://router") else page)
    src.scrape(0.0)  # warm-up
    times = []
    for k in range(repeats):
        t0 = time.perf_counter()
        s = src.scrape(float(k + 1))
        times.append(time.perf_counter() - t0)
    assert len(s.instance_ids) == n and not src.stats().failed
    return {"members": n, "median_ms": 1000 * statistics.median(times), "max_ms": 1000 * max(times),
            "per_member_ms": 1000 * statistics.median(times) / n}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--page", type=Path, default=None, help="a saved /metrics page of a real vLLM server")
    args = ap.parse_args()
    page = args.page.read_text() if args.page else synthetic_page()
    lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    doc = {"page": str(args.page or "synthetic vLLM 0.32-like"), "page_bytes": len(page), "page_samples": lines,
           "results": [measure(page, n, args.repeats) for n in args.members]}  # fmt: skip
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
