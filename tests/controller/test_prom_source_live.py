"""PrometheusSource against a real Prometheus scraping a fake vLLM exporter (both name spellings)."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from controller.settings import LabelMap
from controller.sources.aggregate import LoadAggregator
from controller.sources.prometheus import PrometheusSource, SourceUnavailable
from serving.router.metrics import RouterMetrics
from serving.sim import samples as names
from tests.controller.test_prom_source_exporter import BOUNDS_S, ITL_S, FakeInstance, FakeVllmExporter
from tests.support.prometheus import DISCOVERY_DELAY_S, PrometheusServer, ScrapeJob, free_port

pytestmark = pytest.mark.prometheus

LABELS = LabelMap(instance="instance_id")
# Pool "a" (colon names, Prometheus-3 style): a prefill and a decode instance; the decode one exports no
# `waiting` gauge. Pool "b" (underscore names, OpenMetrics): one colocated instance named by model_name only,
# without a role label (so: mixed) and without the router counter.
PREFILL = FakeInstance(
    {"instance_id": "a-p0", "pool": "a", "role": "prefill"}, 2.0, 3.0, 0.0, 1000.0, 0.0, 4.0, 4.0
)
DECODE = FakeInstance(
    {"instance_id": "a-d0", "pool": "a", "role": "decode"}, 7.0, None, 0.4, 0.0, 300.0, 0.0, 0.0, itl_rps=50.0
)
MIXED = FakeInstance({"instance_id": "b-m0", "model_name": "b"}, 5.0, 1.0, 0.25, 500.0, 200.0, None, 2.0)
UNMAPPED = ({"pool": "a", "role": "decode"},)  # no instance_id: counted, never dropped silently
# pdscale's router for pool "a" (its real /metrics page, text format: colons): 4 + 2 requests queued for
# prefill (added to the pool's waiting), 9 for decode (not prefill demand); 10 dispatched to a-p0, 3 to a
# backend no vLLM series names (unmapped, never an instance of its own). Pool "b"'s router page is
# OpenMetrics (underscores): 2 queued for mixed.
ROUTER_A, ROUTER_B = RouterMetrics("a"), RouterMetrics("b")
ROUTER_A.queue_length.labels("prefill", "normal").set(4)
ROUTER_A.queue_length.labels("prefill", "vip").set(2)
ROUTER_A.queue_length.labels("decode", "normal").set(9)
ROUTER_A.dispatched.labels("a-p0", "prefill", "n0").inc(10)
ROUTER_A.dispatched.labels("gone", "prefill", "n1").inc(3)
ROUTER_B.queue_length.labels("mixed", "batch").set(2)
WAIT_S = DISCOVERY_DELAY_S + 15.0


@pytest.fixture(scope="module")
def prom(prometheus_bin: str) -> Iterator[PrometheusServer]:
    exporter = FakeVllmExporter((PREFILL, DECODE), (MIXED,), unmapped=UNMAPPED)
    exporter.registries["/router"] = ROUTER_A.page_registry
    exporter.registries["/router-b"] = ROUTER_B.page_registry
    with exporter:
        jobs = [
            ScrapeJob("colon", (exporter.target,), 1.0, metrics_path="/colon", honor_labels=True),
            ScrapeJob("underscore", (exporter.target,), 1.0, metrics_path="/underscore", honor_labels=True),
            ScrapeJob("router", (exporter.target,), 1.0, metrics_path="/router", honor_labels=True),
            ScrapeJob("router-b", (exporter.target,), 1.0, metrics_path="/router-b", honor_labels=True),
        ]
        with PrometheusServer(prometheus_bin, jobs) as server:
            server.wait_for_query(
                '{__name__=~"vllm[:_]time_to_first_token_seconds_bucket"}',
                timeout_s=WAIT_S,
                predicate=lambda r: len(r) == 12,
            )
            server.wait_for_query(
                '{__name__=~"pdscale[:_]router_queue_length"}',
                timeout_s=WAIT_S,
                predicate=lambda r: len(r) == 4,
            )
            yield server


def test_scrape_maps_instances_and_reads_both_spellings(prom: PrometheusServer) -> None:
    source = PrometheusSource(prom.url, labels=LABELS, timeout_s=10.0)  # a loaded CI box; deadlines: below
    s = source.scrape(time.time())
    assert s.instance_ids == ("a-d0", "a-p0", "b-m0")
    assert s.pools == ("a", "a", "b")
    assert s.roles == ("decode", "prefill", "mixed")
    assert s.states == ("active",) * 3
    np.testing.assert_array_equal(s.gauges[names.NUM_REQUESTS_RUNNING], [7.0, 2.0, 5.0])
    np.testing.assert_array_equal(s.gauges[names.KV_CACHE_USAGE_PERC], [0.4, 0.0, 0.25])
    waiting = s.gauges[names.NUM_REQUESTS_WAITING]
    assert math.isnan(waiting[0]), "a missing series is unknown (NaN), never 0"
    np.testing.assert_array_equal(waiting[1:], [3.0 + 6.0, 1.0 + 2.0])  # + the routers' entry queues
    routed = s.counters[names.ROUTER_REQUESTS_TOTAL]
    assert routed[1] > 0 and math.isnan(routed[2])
    dispatched = s.counters[names.ROUTER_DISPATCHED_TOTAL]
    assert dispatched[1] == 10.0 and math.isnan(dispatched[0]) and math.isnan(dispatched[2])
    assert (s.counters[names.PROMPT_TOKENS_TOTAL][[1, 2]] > 0).all()
    ttft = s.histograms[names.TIME_TO_FIRST_TOKEN_SECONDS]
    assert ttft.bounds_s == BOUNDS_S
    assert (ttft.counts[:, 0] == 0).all() and (ttft.counts[:, 1] == ttft.counts[:, -1]).all()
    itl = s.histograms[names.INTER_TOKEN_LATENCY_SECONDS]  # the decode instance's alone; its _sum read too
    assert itl.counts[0, -1] > 0 and (itl.counts[1:] == 0).all()
    assert itl.sums[0] == pytest.approx(ITL_S * itl.counts[0, -1]) and np.isnan(itl.sums[1:]).all()
    assert source.stats().unmapped == {names.NUM_REQUESTS_RUNNING: 1, names.ROUTER_DISPATCHED_TOTAL: 1}


def test_aggregator_rates_from_two_scrapes(prom: PrometheusServer) -> None:
    # a deadline for a loaded CI box (the 2-s default once ran out there); deadlines are tested below
    source = PrometheusSource(prom.url, labels=LABELS, timeout_s=10.0)
    agg = LoadAggregator()
    t0 = time.time()
    agg.update(source.scrape(t0), ["a", "b"])
    time.sleep(6.0)
    loads = agg.update(source.scrape(time.time()), ["a", "b"])
    a, b = loads["a"], loads["b"]
    # Samples lag the query time by up to one scrape interval (1 s) at each end: ±1/6 of the rate at most.
    assert a.prompt_tps == pytest.approx(PREFILL.prompt_tps, rel=0.3)
    assert a.gen_tps == pytest.approx(DECODE.gen_tps, rel=0.3)
    assert a.arrival_rps == pytest.approx(4.0, rel=0.3)
    assert b.prompt_tps == pytest.approx(MIXED.prompt_tps, rel=0.3)
    assert math.isnan(b.arrival_rps), "no router counter in pool b: arrivals unknown"
    # running: decode and mixed instances only (the prefill instance's 2 are prefilling, not decoding)
    assert a.running == 7.0 and b.running == 5.0
    # prefill and mixed only (the decode instance's missing gauge is not in the sum), + the router's 6 queued
    assert a.waiting == 9.0 and b.waiting == 3.0
    assert a.kv_usage == pytest.approx(0.4) and b.kv_usage == pytest.approx(0.25)
    # every TTFT in (0.1, 0.25]: Prometheus-style interpolation puts p50 half-way, p90 at 9/10
    assert a.ttft_p50_s == pytest.approx(0.175) and a.ttft_p90_s == pytest.approx(0.235)
    # the mean ITL from the histogram's _sum over its count (exact: every gap is 20 ms); none in pool b
    assert a.itl_mean_s == pytest.approx(ITL_S) and a.itl_gaps > 0
    assert math.isnan(b.itl_mean_s)


def test_stopped_prometheus_is_unavailable(prometheus_bin: str) -> None:
    with PrometheusServer(prometheus_bin) as server:
        source = PrometheusSource(server.url, labels=LABELS)
        empty = source.scrape(time.time())
        assert empty.instance_ids == ()
    with pytest.raises(SourceUnavailable) as info:
        source.scrape(time.time())
    assert server.url.split("//")[1] in str(info.value) or "127.0.0.1" in str(info.value)
    assert info.value.retry_after_s > 0
    assert source.stats().failures == 1


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join(timeout=2.0)
    for c in conns:
        c.close()
    sock.close()


def test_slow_prometheus_times_out_within_timeout(silent_server: str) -> None:
    source = PrometheusSource(silent_server, labels=LABELS, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match="did not answer"):
        source.scrape(time.time())
    assert time.monotonic() - t0 < 1.5


def test_nothing_listening_is_unavailable() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(SourceUnavailable, match="unreachable"):
        source.scrape(time.time())
