"""A tiny fake vLLM exporter for the Prometheus source tests (prometheus_client, a free port).

``/colon`` answers the classic text format 0.0.4 whatever the scraper asks, so names keep their colons
(``vllm:num_requests_running``); ``/underscore`` answers OpenMetrics, where ``prometheus_client`` writes
``vllm_num_requests_running`` and counters end in ``_total``. Counters and histogram counts grow linearly
with wall time from the exporter's start, so rates have known values.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

BOUNDS_S = (0.1, 0.25, 0.5)  # small histogram: every request lands in (0.1, 0.25]


ITL_S = 0.02  # every fake inter-token gap


@dataclass(frozen=True)
class FakeInstance:
    """One fake vLLM instance: fixed gauges, counters growing at fixed rates, all TTFTs in one bucket."""

    labels: Mapping[str, str]
    running: float
    waiting: float | None  # None: the series is not exported (missing metric)
    kv: float
    prompt_tps: float
    gen_tps: float
    requests_rps: float | None  # None: no router counter for this instance
    ttft_rps: float  # TTFT observations per second, each in (0.1, 0.25]
    itl_rps: float = 0.0  # inter-token gaps per second, each 20 ms (0: the ITL histogram is not exported)


@dataclass(eq=False)
class _Collector(Collector):
    instances: tuple[FakeInstance, ...]
    t0: float
    extra: tuple[Mapping[str, str], ...] = field(default_factory=tuple)  # unmapped series (gauge only)

    def collect(self) -> Iterator[Metric]:
        dt = time.time() - self.t0
        keys = sorted({k for i in self.instances for k in i.labels} | {k for e in self.extra for k in e})

        def values(labels: Mapping[str, str]) -> list[str]:
            return [labels.get(k, "") for k in keys]

        running = GaugeMetricFamily("vllm:num_requests_running", "running", labels=keys)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=keys)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "kv", labels=keys)
        prompt = CounterMetricFamily("vllm:prompt_tokens", "prompt", labels=keys)
        gen = CounterMetricFamily("vllm:generation_tokens", "gen", labels=keys)
        router = CounterMetricFamily("pdscale:router_requests", "routed", labels=keys)
        ttft = HistogramMetricFamily("vllm:time_to_first_token_seconds", "ttft", labels=keys)
        itl = HistogramMetricFamily("vllm:inter_token_latency_seconds", "itl", labels=keys)
        for inst in self.instances:
            v = values(inst.labels)
            running.add_metric(v, inst.running)
            if inst.waiting is not None:
                waiting.add_metric(v, inst.waiting)
            kv.add_metric(v, inst.kv)
            prompt.add_metric(v, inst.prompt_tps * dt)
            gen.add_metric(v, inst.gen_tps * dt)
            if inst.requests_rps is not None:
                router.add_metric(v, inst.requests_rps * dt)
            n = float(int(inst.ttft_rps * dt))
            ttft.add_metric(v, [("0.1", 0.0), ("0.25", n), ("0.5", n), ("+Inf", n)], sum_value=0.2 * n)
            if inst.itl_rps > 0:
                g = float(int(inst.itl_rps * dt))
                itl.add_metric(v, [("0.01", 0.0), ("0.025", g), ("+Inf", g)], sum_value=ITL_S * g)
        for labels in self.extra:
            running.add_metric(values(labels), 1.0)
        yield from (running, waiting, kv, prompt, gen, router, ttft)
        if any(i.itl_rps > 0 for i in self.instances):
            yield itl


class FakeVllmExporter:
    """Serves ``/colon`` and ``/underscore`` on 127.0.0.1:<free port>; a context manager."""

    def __init__(
        self,
        colon: tuple[FakeInstance, ...],
        underscore: tuple[FakeInstance, ...],
        *,
        unmapped: tuple[Mapping[str, str], ...] = (),
    ) -> None:
        t0 = time.time()
        self.registries = {}
        for path, insts, extra in (("/colon", colon, unmapped), ("/underscore", underscore, ())):
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Collector(insts, t0, extra))
            self.registries[path] = reg
        self._server: ThreadingHTTPServer | None = None

    @property
    def target(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeVllmExporter:
        registries = self.registries

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                reg = registries.get(self.path)
                if reg is None:
                    self.send_error(404)
                    return
                if self.path in ("/colon", "/router"):  # the router serves text 0.0.4, as vLLM's exporter may
                    body, ctype = generate_latest(reg), "text/plain; version=0.0.4; charset=utf-8"
                else:
                    body = generate_openmetrics(reg)  # type: ignore[no-untyped-call]
                    ctype = "application/openmetrics-text; version=1.0.0; charset=utf-8"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _page(exporter: FakeVllmExporter, path: str) -> str:
    import urllib.request

    req = urllib.request.Request(
        f"http://{exporter.target}{path}",
        headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"},
    )
    with urllib.request.urlopen(req, timeout=5.0) as resp:
        return str(resp.read().decode())


def test_exporter_pages_use_the_two_spellings() -> None:
    """The premise of the spelling tests: one page keeps colons, the other has underscores and ``_total``."""
    inst = FakeInstance({"instance_id": "x", "pool": "a"}, 1.0, 2.0, 0.5, 10.0, 5.0, 1.0, 1.0)
    with FakeVllmExporter((inst,), (inst,)) as exporter:
        colon = _page(exporter, "/colon")
        underscore = _page(exporter, "/underscore")
    assert 'vllm:num_requests_running{instance_id="x",pool="a"} 1.0' in colon
    assert "vllm:prompt_tokens_total{" in colon
    samples = [line for line in underscore.splitlines() if not line.startswith("#")]
    assert not [line for line in samples if line.startswith("vllm:")]
    assert 'vllm_num_requests_running{instance_id="x",pool="a"} 1.0' in underscore
    assert "vllm_prompt_tokens_total{" in underscore
    assert 'vllm_time_to_first_token_seconds_bucket{instance_id="x",le="0.25",pool="a"}' in underscore
