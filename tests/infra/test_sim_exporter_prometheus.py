"""A real Prometheus scrapes the simulator's exporter: gauges, counter rates, TTFT quantiles, target health."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_api_client import PrometheusConnect

from serving.sim.exporter import SimMetricsExporter
from tests.support.prometheus import DISCOVERY_DELAY_S, PrometheusServer, ScrapeJob
from tests.support.sim_samples import INSTANCE_IDS, TTFT_S, synthetic_samples

pytestmark = pytest.mark.prometheus

SCRAPE_S = 1.0
WINDOW_S = 5.0
# Discovery tick, then two scrapes and a full rate window, with slack for a loaded 2-core machine.
WAIT_S = DISCOVERY_DELAY_S + 2 * SCRAPE_S + WINDOW_S + 8.0
PROMPT_TPS = 1000.0


@pytest.fixture
def live_exporter() -> Iterator[SimMetricsExporter]:
    """An exporter whose counters advance with wall time (synthetic_samples at elapsed seconds)."""
    stop = threading.Event()
    with SimMetricsExporter(model_names={"default": "llama3-8b"}) as exporter:
        t0 = time.monotonic()
        exporter.update(synthetic_samples(0.0, prompt_tps=PROMPT_TPS))

        def drive() -> None:
            while not stop.wait(0.1):
                exporter.update(synthetic_samples(time.monotonic() - t0, prompt_tps=PROMPT_TPS))

        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        try:
            yield exporter
        finally:
            stop.set()
            thread.join(timeout=5.0)


def test_prometheus_scrapes_sim_instances_via_http_sd(
    start_prometheus: Callable[..., PrometheusServer], live_exporter: SimMetricsExporter
) -> None:
    job = ScrapeJob(
        job="pdscale-sim",
        http_sd_url=live_exporter.targets_url,
        scrape_interval_s=SCRAPE_S,
        honor_labels=True,
    )
    prom = start_prometheus([job])
    client = PrometheusConnect(url=prom.url, disable_ssl=True)

    running_q = '{__name__=~"vllm[:_]num_requests_running"}'
    prom.wait_for_query(running_q, timeout_s=WAIT_S, predicate=lambda r: len(r) == 2)
    running = {r["metric"]["instance_id"]: r for r in client.custom_query(running_q)}
    assert set(running) == set(INSTANCE_IDS[:2])
    decode = running[INSTANCE_IDS[1]]
    assert float(decode["value"][1]) == 5.0
    labels = decode["metric"]
    assert (labels["pool"], labels["role"], labels["node"]) == ("default", "decode", "node-1")
    assert (labels["model_name"], labels["engine"], labels["job"]) == ("llama3-8b", "0", "pdscale-sim")
    assert labels["instance"] == INSTANCE_IDS[1]

    # The provisioning instance is a target whose endpoint answers 503: Prometheus marks it down.
    # Each target's first scrape has its own offset within the interval, so wait for all three.
    want_up = {INSTANCE_IDS[0]: "1", INSTANCE_IDS[1]: "1", INSTANCE_IDS[2]: "0"}
    prom.wait_for_query(
        'up{job="pdscale-sim"}',
        timeout_s=WAIT_S,
        predicate=lambda r: {x["metric"]["instance"]: x["value"][1] for x in r} == want_up,
    )

    # Counter rate: instance 0 grows at PROMPT_TPS, instance 1 at twice that.
    rate_q = (
        f'rate({{__name__=~"vllm[:_]prompt_tokens_total",instance_id="{INSTANCE_IDS[0]}"}}[{WINDOW_S:.0f}s])'
    )
    result = prom.wait_for_query(
        rate_q,
        timeout_s=WAIT_S,
        predicate=lambda r: bool(r) and abs(float(r[0]["value"][1]) / PROMPT_TPS - 1.0) < 0.25,
    )
    assert float(result[0]["value"][1]) == pytest.approx(PROMPT_TPS, rel=0.25)

    quantile_q = (
        "histogram_quantile(0.5, sum by (le) "
        f'(rate({{__name__=~"vllm[:_]time_to_first_token_seconds_bucket"}}[{WINDOW_S:.0f}s])))'
    )
    [q] = prom.wait_for_query(quantile_q, timeout_s=WAIT_S)
    ttft_p50_s = float(q["value"][1])
    assert 0.1 < ttft_p50_s <= 0.25, f"all TTFTs are {TTFT_S} s, in the (0.1, 0.25] bucket"


def test_prometheus_scrapes_the_real_simulator_driven_in_real_time(
    start_prometheus: Callable[..., PrometheusServer],
) -> None:
    import numpy as np

    from serving.sim.engine import Simulator
    from serving.sim.exporter import run_realtime
    from serving.sim.fleet import single_pool
    from serving.workload.trace import Trace

    n = 3000  # 10 rps over 300 virtual seconds: more than the test ever runs
    trace = Trace.from_arrays(np.linspace(0.0, 300.0, n, endpoint=False), np.full(n, 256), np.full(n, 32))
    sim = Simulator(single_pool(prefill=2, decode=1), {"default": trace})
    stop = threading.Event()
    with SimMetricsExporter() as exporter:
        exporter.update(sim.observe())  # so /targets.json lists the instances before the driver starts
        driver = threading.Thread(
            target=run_realtime, args=(sim, exporter), kwargs={"until_s": 300.0, "speed": 2.0, "stop": stop}
        )
        driver.start()
        try:
            job = ScrapeJob(
                job="sim", http_sd_url=exporter.targets_url, scrape_interval_s=SCRAPE_S, honor_labels=True
            )
            prom = start_prometheus([job])
            # Each target's first scrape has its own offset within the interval: wait for all three.
            want = {"prefill": "2", "decode": "1"}
            prom.wait_for_query(
                'count by (role) ({__name__=~"vllm[:_]num_requests_running", job="sim"})',
                timeout_s=WAIT_S,
                predicate=lambda r: {x["metric"]["role"]: x["value"][1] for x in r} == want,
            )
            # 10 virtual rps x 256 prompt tokens at speed 2 = 5120 prompt tokens per wall second.
            [rate] = prom.wait_for_query(
                f'sum(rate({{__name__=~"vllm[:_]prompt_tokens_total", role="prefill"}}[{WINDOW_S:.0f}s]))',
                timeout_s=WAIT_S,
                predicate=lambda r: bool(r) and abs(float(r[0]["value"][1]) / 5120.0 - 1.0) < 0.3,
            )
            assert float(rate["value"][1]) == pytest.approx(5120.0, rel=0.3)
        finally:
            stop.set()
            driver.join(timeout=10.0)
    assert not driver.is_alive()
