"""The Prometheus fixture against the real binary: scrape, query, backfill round trip."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from prometheus_api_client import PrometheusConnect
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.openmetrics import parser as om_parser

from tests.support.prometheus import (
    DISCOVERY_DELAY_S,
    PrometheusError,
    PrometheusServer,
    ScrapeJob,
    Series,
    backfill_openmetrics,
    free_port,
    openmetrics_text,
    render_config,
)


@pytest.fixture
def tiny_exporter() -> Iterator[tuple[str, Gauge, Counter]]:
    """A prometheus_client HTTP exporter on a free loopback port with one gauge and one counter."""
    registry = CollectorRegistry()
    gauge = Gauge("pdscale_test_queue_depth", "queue depth", ["pool"], registry=registry)
    counter = Counter("pdscale_test_requests", "requests", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", gauge, counter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.prometheus
def test_scrapes_an_exporter_and_answers_prometheus_api_client(
    start_prometheus: Callable[..., PrometheusServer], tiny_exporter: tuple[str, Gauge, Counter]
) -> None:
    target, gauge, counter = tiny_exporter
    gauge.labels(pool="default").set(7)
    counter.inc(3)
    job = ScrapeJob(job="tiny", targets=(target,), scrape_interval_s=1.0, labels={"node": "n-1"})
    dead_target = f"127.0.0.1:{free_port()}"
    dead = ScrapeJob(job="dead", targets=(dead_target,), scrape_interval_s=0.5)
    prom = start_prometheus([job, dead])

    prom.wait_for_query("pdscale_test_queue_depth", timeout_s=DISCOVERY_DELAY_S + 5.0)
    client = PrometheusConnect(url=prom.url, disable_ssl=True)
    result = client.custom_query("pdscale_test_queue_depth")
    assert len(result) == 1
    labels = result[0]["metric"]
    assert labels["pool"] == "default"
    assert labels["node"] == "n-1"
    assert labels["job"] == "tiny"
    assert labels["instance"] == target
    assert float(result[0]["value"][1]) == 7.0

    gauge.labels(pool="default").set(11)
    prom.wait_for_query(
        "pdscale_test_queue_depth", timeout_s=4.0, predicate=lambda r: bool(r) and r[0]["value"][1] == "11"
    )

    # Waits that fail name the target and its scrape error.
    prom.wait_for_query('up{job="dead"}', timeout_s=2.0)  # scraped at least once: health is known
    with pytest.raises(PrometheusError, match="not all up") as err:
        prom.wait_for_targets_up(timeout_s=0.5)
    assert dead_target in str(err.value)
    assert "connection refused" in str(err.value)
    with pytest.raises(PrometheusError, match=r"did not satisfy.*connection refused"):
        prom.wait_for_query('up{job="dead"} == 1', timeout_s=0.5)


@pytest.mark.prometheus
def test_backfill_round_trip_via_range_query(prometheus_bin: str, tmp_path: Path) -> None:
    start_s = 1_700_000_000.0  # Nov 2023: far outside the default 15 d retention
    ts = start_s + np.arange(0.0, 600.0, 5.0)
    values_a = np.sin(np.arange(len(ts)) / 7.0) * 10.0 + 20.0
    values_b = np.arange(len(ts), dtype=np.float64) * 1.5
    series = [
        Series("vllm:num_requests_running", {"instance_id": "a", "pool": "default"}, ts, values_a),
        Series("vllm:prompt_tokens_total", {"instance_id": "a"}, ts, values_b),
        Series("vllm:num_requests_running", {"instance_id": "b", "pool": "default"}, ts, values_a + 1),
    ]
    data_dir = backfill_openmetrics(series, tmp_path / "tsdb")

    with PrometheusServer(prometheus_bin, data_dir=data_dir, retention="10y") as prom:
        client = PrometheusConnect(url=prom.url, disable_ssl=True)
        result = client.custom_query_range(
            'vllm:num_requests_running{instance_id="a"}',
            start_time=_dt(ts[0]),
            end_time=_dt(ts[-1]),
            step="5s",
        )
        assert len(result) == 1
        got = np.array([[float(t), float(v)] for t, v in result[0]["values"]])
        np.testing.assert_allclose(got[:, 0], ts)
        np.testing.assert_allclose(got[:, 1], values_a, rtol=1e-12)
        rate = prom.query(f"rate(vllm:prompt_tokens_total[1m] @ {ts[-1]:.0f})")
        assert float(rate[0]["value"][1]) == pytest.approx(1.5 / 5.0)
    assert data_dir.exists(), "a given data_dir is kept after stop()"


def _dt(unix_s: float) -> object:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix_s, tz=UTC)


def test_series_rejects_out_of_order_and_millisecond_timestamps() -> None:
    with pytest.raises(ValueError, match="strictly increasing; index 2"):
        Series("m", {}, np.array([1.0, 2.0, 2.0]), np.zeros(3))
    with pytest.raises(ValueError, match="milliseconds"):
        Series("m", {}, np.array([1_700_000_000_000.0]), np.zeros(1))


def test_openmetrics_text_groups_families_and_ends_with_eof() -> None:
    ts = np.array([10.0, 20.0])
    text = openmetrics_text(
        [
            Series("a", {"x": "1"}, ts, np.array([1.0, np.nan])),
            Series("b", {}, ts, np.array([np.inf, 2.5])),
            Series("a", {"x": "2"}, ts, np.array([3.0, 4.0])),
        ]
    )
    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    names = [line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")]
    assert names == ["a", "a", "a", "a", "b", "b"]
    assert 'a{x="1"} NaN 20.000' in lines
    assert "b +Inf 10.000" in lines


def test_render_config_sub_second_intervals_and_http_sd() -> None:
    job = ScrapeJob(job="sim", http_sd_url="http://127.0.0.1:1/targets.json", scrape_interval_s=0.5)
    text = render_config([job])
    assert "scrape_interval: 500ms" in text
    assert 'url: "http://127.0.0.1:1/targets.json"' in text
    with pytest.raises(ValueError, match="give targets or http_sd_url"):
        ScrapeJob(job="empty")


@pytest.mark.prometheus
def test_start_failure_reports_the_log_tail(prometheus_bin: str, tmp_path: Path) -> None:
    server = PrometheusServer(prometheus_bin, extra_args=["--no-such-flag"])
    with pytest.raises(PrometheusError, match="exited with status") as err, server:
        pass
    assert "no-such-flag" in str(err.value)
    start = time.monotonic()
    server.stop()  # idempotent
    assert time.monotonic() - start < 1.0


finite_or_special = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=50, deadline=None)
@given(
    steps=arrays(np.float64, st.integers(1, 20), elements=st.floats(0.001, 1e4)),
    values=st.data(),
    label=st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
)
def test_openmetrics_text_parses_back_exactly(steps: np.ndarray, values: st.DataObject, label: str) -> None:
    ts = np.round(1_600_000_000.0 + np.cumsum(steps), 3)
    if len(ts) > 1 and not np.all(np.diff(ts) > 0):
        return  # rounding to ms merged two timestamps: not a valid series
    vals = values.draw(arrays(np.float64, len(ts), elements=finite_or_special))
    text = openmetrics_text([Series("vllm:kv_cache_usage_perc", {"pool": label}, ts, vals)])
    parse: Callable[[str], Iterator[Any]] = om_parser.text_string_to_metric_families  # untyped upstream
    [family] = list(parse(text))
    got_ts = np.array([float(x.timestamp) for x in family.samples])
    got_vals = np.array([x.value for x in family.samples])
    assert all(x.labels == {"pool": label} for x in family.samples)
    np.testing.assert_allclose(got_ts, ts, rtol=0, atol=5e-4)
    np.testing.assert_array_equal(got_vals, vals)  # NaN == NaN here; %.17g round-trips every float64
