"""PrometheusSource pieces without a server: label mapping, spellings, histograms, errors, chunking."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_api_client.exceptions import PrometheusApiClientException
from pydantic import ValidationError

from controller.settings import LabelMap, PrometheusSettings
from controller.sources.prometheus import (
    PrometheusSource,
    SourceError,
    SourceUnavailable,
    _histogram,
    identify,
    query_range_chunked,
)
from serving.sim import samples as names


@pytest.mark.parametrize(
    ("labels", "expect"),
    [
        pytest.param({"instance": "i", "pool": "a", "role": "decode"}, ("i", "a", "decode", "i"), id="full"),
        pytest.param({"instance": "i", "model_name": "m"}, ("i", "m", "mixed", "i"), id="fallback-mixed"),
        pytest.param(
            {"instance": "i", "pool": "a", "model_name": "m"}, ("i", "a", "mixed", "i"), id="pool-wins"
        ),
        pytest.param({"pool": "a"}, "no 'instance' label", id="no-instance"),
        pytest.param({"instance": "i"}, "no 'pool' or 'model_name' label", id="no-pool"),
        pytest.param({"instance": "i", "pool": "a", "role": "router"}, "is not one of", id="bad-role"),
    ],
)
def test_identify(labels: dict[str, str], expect: tuple[str, ...] | str) -> None:
    got = identify(labels, LabelMap())
    if isinstance(expect, str):
        assert isinstance(got, str) and expect in got
    else:
        assert not isinstance(got, str)
        assert (got.instance, got.pool, got.role, got.node) == expect


def test_identify_with_node_label() -> None:
    got = identify({"instance": "i", "pool": "a", "host": "n1"}, LabelMap(node="host"))
    assert not isinstance(got, str) and got.node == "n1"


def test_label_map_rejects_bad_label_names() -> None:
    with pytest.raises(ValidationError, match="instance"):
        LabelMap(instance="instance-id")
    with pytest.raises(ValidationError, match="http"):
        PrometheusSettings(url="prometheus:9090")


def test_histogram_union_of_bounds_never_invents_observations() -> None:
    per = {"x": {0.1: 1.0, 0.5: 4.0, math.inf: 5.0}, "y": {0.25: 2.0, math.inf: 3.0}}
    h = _histogram(per, ("x", "y", "z"))
    assert h.bounds_s == (0.1, 0.25, 0.5)
    # x lacks 0.25: its count there is the lower bound's (1); y lacks 0.1 (0 below its first) and 0.5 (2)
    np.testing.assert_array_equal(h.counts, [[1, 1, 4, 5], [0, 2, 2, 3], [0, 0, 0, 0]])
    assert np.isnan(h.sums).all()
    # with the _sum series read: each instance's own, NaN where it has none (unknown, never zero)
    h = _histogram(per, ("x", "y", "z"), {"x": 0.9, "z": 0.0})
    assert h.sums[0] == 0.9 and math.isnan(h.sums[1]) and h.sums[2] == 0.0


class FakeQuerier:
    """Answers instant queries from a table keyed by a substring of the query."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]], fail: Exception | None = None) -> None:
        self.answers = answers
        self.fail = fail
        self.queries: list[str] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None, timeout: Any = None) -> Any:
        self.queries.append(query)
        if self.fail is not None:
            raise self.fail
        return next((v for k, v in self.answers.items() if k in query), [])

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
        timeout: Any = None,
    ) -> Any:
        raise AssertionError("not used")


def row(name: str, value: float, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, **labels}, "value": [0.0, str(value)]}


def test_one_query_per_metric_and_the_canonical_spelling_wins() -> None:
    lab = {"instance": "i", "pool": "a", "role": "decode"}
    q = FakeQuerier(
        {
            "num_requests_running": [
                row("vllm:num_requests_running", 3, **lab),
                row("vllm_num_requests_running", 3, **lab),
            ],
            "vllm[:_]prompt_tokens": [
                row("vllm_prompt_tokens_total", 10, **lab),
                row("vllm:prompt_tokens_total", 12, **lab),
            ],
            "kv_cache": [
                row("vllm:kv_cache_usage_perc", 0.2, engine="0", **lab),
                row("vllm:kv_cache_usage_perc", 0.4, engine="1", **lab),
            ],
            "num_requests_waiting": [row("vllm:num_requests_waiting", float("nan"), **lab)],
            "vllm[:_]request_success": [
                row("vllm:request_success_total", 5, finished_reason="stop", **lab),
                row("vllm:request_success_total", 2, finished_reason="length", **lab),
            ],
        }
    )
    source = PrometheusSource("http://unused", querier=q)
    s = source.scrape(100.0)
    # gauges, counters, histograms, the ITL histogram's _sum, the router queue: one query each for the fleet
    assert len(q.queries) == 3 + 7 + 2 + 1 + 1
    # vLLM splits finished requests by finished_reason: one instance's series are added up
    assert s.counters[names.REQUEST_SUCCESS_TOTAL][0] == 7.0
    assert s.gauges[names.NUM_REQUESTS_RUNNING][0] == 3.0  # not 6: spellings are never added up
    assert s.counters[names.PROMPT_TOKENS_TOTAL][0] == 12.0  # the canonical name, wherever it comes
    assert s.gauges[names.KV_CACHE_USAGE_PERC][0] == pytest.approx(0.3)  # engines averaged
    assert math.isnan(s.gauges[names.NUM_REQUESTS_WAITING][0])  # a NaN sample stays unknown
    assert names.ROUTER_REQUESTS_TOTAL not in s.counters  # absent everywhere: left out, rates NaN
    assert names.ROUTER_PROMPT_TOKENS_TOTAL not in s.counters
    assert math.isnan(s.counters[names.NUM_PREEMPTIONS_TOTAL][0])
    assert source.stats().spelling_conflicts == 2


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        pytest.param(requests.exceptions.ReadTimeout("slow"), SourceUnavailable, id="timeout"),
        pytest.param(requests.exceptions.ConnectionError("refused"), SourceUnavailable, id="refused"),
        pytest.param(PrometheusApiClientException("HTTP Status Code 503 (b'')"), SourceUnavailable, id="503"),
        pytest.param(PrometheusApiClientException("HTTP Status Code 400 (b'bad')"), SourceError, id="400"),
    ],
)
def test_errors_are_typed(error: Exception, kind: type[SourceError]) -> None:
    source = PrometheusSource("http://unused", querier=FakeQuerier({}, fail=error))
    with pytest.raises(SourceError) as info:
        source.scrape(0.0)
    assert type(info.value) is kind
    assert source.stats().failures == 1


def test_scrape_deadline_uses_the_injected_clock() -> None:
    ticks = iter([0.0, 0.0, 0.5, 1.0, 2.5])  # the fourth query finds the 2-s deadline passed
    source = PrometheusSource(
        "http://unused", querier=FakeQuerier({}), timeout_s=2.0, clock=lambda: next(ticks)
    )
    with pytest.raises(SourceUnavailable, match="no time left"):
        source.scrape(0.0)


def grid_call(n_series: int, calls: list[tuple[float, float]]) -> Any:
    """A range endpoint returning value = timestamp for every step in [start, end], per series."""

    def call(promql: str, params: dict[str, str], span: tuple[datetime, datetime]) -> Any:
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        calls.append((start, end))
        ts = np.arange(start, end + step / 2, step)
        return [
            {"metric": {"s": str(k)}, "values": [[t, str(t * (k + 1))] for t in ts]} for k in range(n_series)
        ]

    return call


@settings(max_examples=40, deadline=None)
@given(n_steps=st.integers(1, 200), max_points=st.integers(1, 60), step_s=st.sampled_from([0.5, 1.0, 15.0]))
def test_chunks_tile_the_range_exactly(n_steps: int, max_points: int, step_s: float) -> None:
    calls: list[tuple[float, float]] = []
    start = 1_700_000_000.0
    out = query_range_chunked(
        grid_call(2, calls),
        "q",
        start_s=start,
        end_s=start + (n_steps - 1) * step_s,
        step_s=step_s,
        max_points=max_points,
    )
    assert len(calls) == math.ceil(n_steps / max_points)
    steps = [round((e - s) / step_s) + 1 for s, e in calls]
    assert sum(steps) == n_steps and max(steps) <= max_points
    times = start + step_s * np.arange(n_steps)
    by_series = {s.labels["s"]: s.values for s in out}
    np.testing.assert_allclose(by_series["0"], times)
    np.testing.assert_allclose(by_series["1"], 2 * times)


def test_chunking_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_points"):
        query_range_chunked(grid_call(1, []), "q", start_s=0, end_s=10, step_s=1, max_points=20_000)
    with pytest.raises(ValueError, match="start_s <= end_s"):
        query_range_chunked(grid_call(1, []), "q", start_s=10, end_s=0, step_s=1)


def test_malformed_answer_is_a_source_error() -> None:
    bad = {"num_requests_running": [{"metric": {"instance": "i", "pool": "a"}, "value": [0.0]}]}
    source = PrometheusSource("http://unused", querier=FakeQuerier(bad))
    with pytest.raises(SourceError, match="malformed") as info:
        source.scrape(0.0)
    assert not isinstance(info.value, SourceUnavailable)


@settings(max_examples=60, deadline=None)
@given(
    present=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=6),
    values=st.lists(st.floats(0, 1e6), min_size=18, max_size=18),
)
def test_missing_series_are_nan_and_present_ones_exact(
    present: list[list[bool]], values: list[float]
) -> None:
    """Unknown is not zero: instance k lacks gauge g exactly where ``present[k][g]`` is False."""
    gauges = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
    answers: dict[str, list[dict[str, Any]]] = {g: [] for g in gauges}
    for k, has in enumerate(present):
        for g, name in enumerate(gauges):
            if has[g]:
                answers[name].append(row(f"vllm:{name}", values[3 * k + g], instance=f"i{k}", pool="a"))
    s = PrometheusSource("http://unused", querier=FakeQuerier(answers)).scrape(0.0)
    seen = [f"i{k}" for k, has in enumerate(present) if any(has)]
    assert s.instance_ids == tuple(sorted(seen))
    for g, name in enumerate(gauges):
        got = s.gauges[f"vllm:{name}"]
        for r, iid in enumerate(s.instance_ids):
            k = int(iid[1:])
            if present[k][g]:
                assert got[r] == values[3 * k + g]
            else:
                assert math.isnan(got[r])


def test_from_settings_sends_the_bearer_token(tmp_path: Any) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        cfg = PrometheusSettings(
            url=f"http://127.0.0.1:{server.server_address[1]}", bearer_token_file=token, timeout_s=3.0
        )
        source = PrometheusSource.from_settings(cfg)
        assert source.scrape(0.0).instance_ids == ()
    finally:
        server.shutdown()
        server.server_close()
    assert seen and set(seen) == {"Bearer s3cret"}
    assert source.timeout_s == 3.0
