"""Per-node training series from Prometheus: chunking, both vLLM spellings, counters, gauges, node labels."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forecaster.types import CHANNELS
from tests.support.prometheus import PrometheusServer, Series, backfill_openmetrics
from training.prometheus_history import (
    ChannelQuery,
    RawSeries,
    combine_per_node,
    connect,
    counter_increase,
    load_prometheus_history,
    parse_duration_s,
    query_range_chunked,
)

END_S = 1_700_000_000.0  # 2023-11-14: fixed, old timestamps (the server runs with 10y retention)


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800.0), ("90s", 90.0), ("1.5h", 5400.0), ("500ms", 0.5), ("30", 30.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "7 days", "-1h", "0s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_s(text)


def test_counter_increase_handles_resets_and_gaps() -> None:
    out = counter_increase(np.array([5.0, 7.0, 7.0, 2.0, np.nan, 10.0]))
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:4], [2.0, 0.0, 2.0])
    assert np.isnan(out[4]) and np.isnan(out[5])  # unknown stays unknown across a gap


class FakeProm:
    """Answers range queries from an in-memory series, recording each call's size."""

    def __init__(self, series: dict[tuple[tuple[str, str], ...], Callable[[np.ndarray], np.ndarray]]) -> None:
        self.series = series
        self.calls: list[int] = []

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        step_s = float(step)
        ts = np.arange(start_time.timestamp(), end_time.timestamp() + step_s / 2, step_s)
        self.calls.append(len(ts))
        if len(ts) > 11_000:
            raise RuntimeError("exceeded maximum resolution of 11,000 points per timeseries")
        return [
            {"metric": dict(labels), "values": [[t, str(v)] for t, v in zip(ts, fn(ts), strict=True)]}
            for labels, fn in self.series.items()
        ]


def test_chunked_query_stays_under_the_point_limit_and_stitches_exactly() -> None:
    labels = (("__name__", "vllm:prompt_tokens_total"), ("node", "a"))
    fake = FakeProm({labels: lambda ts: ts - END_S})
    out = query_range_chunked(fake, "q", start_s=END_S - 25_000, end_s=END_S, step_s=1.0, max_points=10_000)
    assert fake.calls == [10_000, 10_000, 5_001]
    assert len(out) == 1
    np.testing.assert_array_equal(out[0].values, np.arange(-25_000, 1, dtype=np.float64))


def test_one_spelling_per_node_wins_and_nodes_are_kept_apart() -> None:
    n = 10
    colon = RawSeries({"__name__": "vllm:num_requests_running", "node": "a"}, np.full(n, 3.0))
    under = RawSeries(
        {"__name__": "vllm_num_requests_running", "node": "a"}, np.r_[np.full(n - 1, np.nan), 9.0]
    )
    other = RawSeries({"__name__": "vllm_num_requests_running", "node": "b"}, np.full(n, 1.0))
    q = ChannelQuery("running", "x", "gauge_sum")
    out = combine_per_node([colon, under, other], q, "node", 1.0)
    np.testing.assert_array_equal(out["a"], np.full(n, 3.0))  # not 3 + 9: the sparser spelling is dropped
    np.testing.assert_array_equal(out["b"], np.full(n, 1.0))


def test_gauge_mean_ignores_unknown_members() -> None:
    s1 = RawSeries({"__name__": "vllm:kv_cache_usage_perc", "node": "a"}, np.array([0.2, np.nan, np.nan]))
    s2 = RawSeries({"__name__": "vllm:kv_cache_usage_perc", "node": "a"}, np.array([0.4, 0.6, np.nan]))
    out = combine_per_node([s1, s2], ChannelQuery("kv_usage", "x", "gauge_mean"), "node", 1.0)
    np.testing.assert_allclose(out["a"][:2], [0.3, 0.6])
    assert np.isnan(out["a"][2])


# -- against the real Prometheus -----------------------------------------------------------------


def _history(range_s: int) -> tuple[list[Series], dict[str, np.ndarray]]:
    """Two nodes: ``a`` scraped with colons (Prometheus 3 style), ``b`` with underscores (Prometheus 2)."""
    rng = np.random.default_rng(0)
    ts = END_S - range_s + 1 + np.arange(range_s, dtype=np.float64)
    arrivals = {node: rng.poisson(lam, range_s).astype(np.float64) for node, lam in (("a", 3.0), ("b", 7.0))}
    series: list[Series] = []
    for node, sep in (("a", ":"), ("b", "_")):
        counts = arrivals[node]
        lab = {"node": node, "instance": f"{node}:8000", "model_name": "tiny"}
        series += [
            Series(f"pdscale{sep}router_requests_total", lab, ts, np.cumsum(counts)),
            Series(f"vllm{sep}prompt_tokens_total", lab, ts, np.cumsum(counts * 100)),
            Series(f"vllm{sep}num_requests_running", lab, ts, counts),
            Series(f"vllm{sep}kv_cache_usage_perc", lab, ts, np.full(range_s, 0.25)),
        ]
    return series, arrivals


@pytest.mark.prometheus
def test_history_from_a_real_prometheus(prometheus_bin: str, tmp_path: Path) -> None:
    range_s = 4 * 3600  # 14,400 steps at 1 s: one unchunked query would be refused (> 11,000 points)
    series, arrivals = _history(range_s)
    data = backfill_openmetrics(series, tmp_path / "tsdb")
    with PrometheusServer(prometheus_bin, data_dir=data, retention="10y") as prom:
        client = connect(prom.url, timeout_s=30.0)
        with pytest.raises(Exception, match=r"11,000|exceeded maximum resolution"):
            client.custom_query_range(
                "vllm:prompt_tokens_total",
                start_time=datetime.fromtimestamp(END_S - range_s + 1),
                end_time=datetime.fromtimestamp(END_S),
                step="1",
            )
        frame = load_prometheus_history(client, end_s=END_S, range_s=range_s, step_s=1.0, node_label="node")
    assert frame.node_ids == ("a", "b")
    assert frame.metrics == CHANNELS
    assert len(frame.times_s) == range_s
    arr, prompt, running, kv = (
        CHANNELS.index(c) for c in ("arrival_rps", "prompt_tps", "running", "kv_usage")
    )
    for n, node in enumerate(frame.node_ids):
        got = frame.values[n]
        # counter increase per second == the per-second arrivals that built the counter (first step unknown)
        np.testing.assert_array_equal(got[arr, 1:], arrivals[node][1:])
        np.testing.assert_array_equal(got[prompt, 1:], arrivals[node][1:] * 100)
        np.testing.assert_array_equal(got[running], arrivals[node])
        np.testing.assert_allclose(got[kv], 0.25)
        assert np.isnan(got[arr, 0])
        # nothing was exported for latencies: unknown, never zero
        assert np.isnan(got[CHANNELS.index("ttft_p90_s")]).all()


@pytest.mark.prometheus
def test_history_counts_each_role_as_the_controller_does(prometheus_bin: str, tmp_path: Path) -> None:
    """A P/D node: prompts counted once (not again on the decode server), the prefill queue without the decode
    server's waiting, running and KV usage from the decode server only; an unlabelled (mixed) node counts all."""
    range_s = 600
    ts = END_S - range_s + 1 + np.arange(range_s, dtype=np.float64)
    counts = np.random.default_rng(1).poisson(4.0, range_s).astype(np.float64)
    const = np.ones(range_s)
    pre = {"node": "pd", "instance": "pd:8000", "role": "prefill"}
    dec = {"node": "pd", "instance": "pd:8001", "role": "decode"}
    mixed = {"node": "m", "instance": "m:8000"}
    series = [
        Series("pdscale:router_requests_total", pre, ts, np.cumsum(counts)),
        Series("vllm:prompt_tokens_total", pre, ts, np.cumsum(counts * 100)),
        Series("vllm:prompt_tokens_total", dec, ts, np.cumsum(counts * 100)),  # the decode side counts it too
        Series("vllm:generation_tokens_total", dec, ts, np.cumsum(counts * 10)),
        Series("vllm:num_requests_running", pre, ts, 9 * const),  # prefilling, not decoding
        Series("vllm:num_requests_running", dec, ts, 5 * const),
        Series("vllm:num_requests_waiting", pre, ts, 3 * const),
        Series("vllm:num_requests_waiting", dec, ts, 4 * const),  # prefilled, waiting for a decode slot
        Series("vllm:kv_cache_usage_perc", pre, ts, 0.9 * const),
        Series("vllm:kv_cache_usage_perc", dec, ts, 0.5 * const),
        Series("vllm:num_requests_running", mixed, ts, 2 * const),
        Series("vllm:num_requests_waiting", mixed, ts, 7 * const),
    ]
    data = backfill_openmetrics(series, tmp_path / "tsdb")
    with PrometheusServer(prometheus_bin, data_dir=data, retention="10y") as prom:
        client = connect(prom.url, timeout_s=30.0)
        frame = load_prometheus_history(client, end_s=END_S, range_s=range_s, step_s=1.0, node_label="node")
    assert frame.node_ids == ("m", "pd")
    pd = dict(zip(CHANNELS, frame.values[frame.node_ids.index("pd")], strict=True))
    np.testing.assert_array_equal(pd["arrival_rps"][1:], counts[1:])
    np.testing.assert_array_equal(pd["prompt_tps"][1:], counts[1:] * 100)
    np.testing.assert_array_equal(pd["gen_tps"][1:], counts[1:] * 10)
    np.testing.assert_array_equal(pd["running"], 5 * const)
    np.testing.assert_array_equal(pd["waiting"], 3 * const)
    np.testing.assert_allclose(pd["kv_usage"], 0.5)
    m = dict(zip(CHANNELS, frame.values[frame.node_ids.index("m")], strict=True))
    np.testing.assert_array_equal(m["running"], 2 * const)
    np.testing.assert_array_equal(m["waiting"], 7 * const)
