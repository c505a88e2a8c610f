"""PrometheusSource.history over backfilled TSDB blocks (real Prometheus), chunked range queries."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.settings import LabelMap
from controller.sources.prometheus import PrometheusSource, _connect
from forecaster.types import CHANNELS
from tests.support.prometheus import PrometheusServer, Series, backfill_openmetrics

pytestmark = pytest.mark.prometheus

T0_S = 1_700_000_000.0  # fixed old timestamps: the server runs with retention=10y
DURATION_S = 1200
STEP_S = 1.0
MAX_POINTS = 250  # forces ceil(1201 / 250) = 5 chunks per channel


def _pool_series(pool_labels: dict[str, str], sep: str, scale: float) -> list[Series]:
    """One prefill and one decode instance; counters linear in time, TTFTs all in (0.1, 0.25]."""
    t = T0_S + np.arange(DURATION_S + 1, dtype=np.float64)
    el = t - T0_S
    out: list[Series] = []

    def add(name: str, labels: dict[str, str], values: np.ndarray) -> None:
        out.append(Series(name.replace(":", sep), {**pool_labels, **labels}, t, values))

    for role, inst in (("prefill", "p0"), ("decode", "d0")):
        lab = {"instance": inst + sep, "role": role}
        add("vllm:prompt_tokens_total", lab, 100.0 * scale * el)
        add("vllm:generation_tokens_total", lab, (30.0 * scale * el) if role == "decode" else 0 * el)
        add("pdscale:router_requests_total", lab, (2.0 * scale * el) if role == "prefill" else 0 * el)
        add("vllm:num_requests_running", lab, np.full_like(el, 3.0 * scale))
        add("vllm:num_requests_waiting", lab, np.full_like(el, 1.0))
        add("vllm:kv_cache_usage_perc", lab, np.full_like(el, 0.5 if role == "decode" else 0.9))
        for le, per_s in (("0.1", 0.0), ("0.25", 2.0), ("+Inf", 2.0)):
            add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": le}, per_s * el)
    return out


QUEUE_FROM_S = 600  # pool a's prefill queue appears here: before it, its waiting is its servers' alone


def _router_series() -> list[Series]:
    """Router queues: pool a (colon spelling) 4 + 2 requests for prefill in two priority classes from
    ``QUEUE_FROM_S`` on and 9 for decode (not prefill demand); pool b (underscore spelling, its servers
    labelled by model_name only) 3 for mixed; pool c has a router but no server series."""
    t = T0_S + np.arange(DURATION_S + 1, dtype=np.float64)
    late = t >= T0_S + QUEUE_FROM_S

    def queue(sep: str, value: float, when: np.ndarray, **labels: str) -> Series:
        return Series(f"pdscale{sep}router_queue_length", labels, t[when], np.full(int(when.sum()), value))

    always = np.ones_like(late)
    return [
        queue(":", 4.0, late, pool="a", stage="prefill", priority_class="normal"),
        queue(":", 2.0, late, pool="a", stage="prefill", priority_class="vip"),
        queue(":", 9.0, always, pool="a", stage="decode", priority_class="normal"),
        queue("_", 3.0, always, pool="b", stage="mixed", priority_class="batch"),
        queue(":", 5.0, always, pool="c", stage="prefill", priority_class="normal"),
    ]


class CountingQuerier:
    """A real client that counts range calls and the steps each asked for."""

    def __init__(self, url: str) -> None:
        self.inner = _connect(url, None, None, False)
        self.calls: list[tuple[float, float]] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None, timeout: Any = None) -> Any:
        return self.inner.custom_query(query, params=params, timeout=timeout)

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
        timeout: Any = None,
    ) -> Any:
        assert params is not None
        self.calls.append((float(params["start"]), float(params["end"])))
        return self.inner.custom_query_range(
            query, start_time, end_time, step, params=params, timeout=timeout
        )


@pytest.fixture(scope="module")
def prom(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    data = Path(tmp_path_factory.mktemp("tsdb"))
    # pool "a" under colon names with a pool label; pool "b" under underscore names, model_name only
    series = (
        _pool_series({"pool": "a"}, ":", 1.0) + _pool_series({"model_name": "b"}, "_", 2.0) + _router_series()
    )
    backfill_openmetrics(series, data)
    with PrometheusServer(prometheus_bin, data_dir=data, retention="10y") as server:
        yield server


def test_history_per_pool_channels_in_chunks(prom: PrometheusServer) -> None:
    querier = CountingQuerier(prom.url)
    source = PrometheusSource(prom.url, labels=LabelMap(), max_points=MAX_POINTS, querier=querier)
    frame = source.history(T0_S, T0_S + DURATION_S, STEP_S, rate_window_s=10.0)
    assert frame.node_ids == ("a", "b")
    assert frame.metrics == CHANNELS
    np.testing.assert_array_equal(frame.times_s, T0_S + np.arange(DURATION_S + 1))
    # 10 channels and the fleet's router queue, x 5 chunks; the chunks tile the range without overlap
    assert len(querier.calls) == 11 * math.ceil((DURATION_S + 1) / MAX_POINTS)
    starts = sorted({c[0] for c in querier.calls})
    assert starts == [T0_S + k * MAX_POINTS for k in range(5)]
    inner = slice(20, DURATION_S - 5)  # past the first rate window, before the end
    expect = {
        "arrival_rps": (2.0, 4.0),
        "prompt_tps": (100.0, 200.0),  # prefill only: decode instances' prompt counters are excluded
        "gen_tps": (30.0, 60.0),
        "running": (
            3.0,
            6.0,
        ),  # decode instances only (as PoolLoad.running): prefill's running are prefilling
        "kv_usage": (0.5, 0.5),  # decode instances only
        "ttft_p50_s": (0.175, 0.175),
        "ttft_p90_s": (0.235, 0.235),
    }
    for channel, (a_value, b_value) in expect.items():
        got = frame.series(channel)[:, inner]
        np.testing.assert_allclose(got[0], a_value, rtol=1e-6, err_msg=f"pool a {channel}")
        np.testing.assert_allclose(got[1], b_value, rtol=1e-6, err_msg=f"pool b {channel}")
    # no ITL histogram was written: unknown everywhere, never zero
    assert np.isnan(frame.series("itl_p50_s")).all()
    # before the first sample there is nothing: NaN
    early = PrometheusSource(prom.url, max_points=MAX_POINTS).history(T0_S - 100, T0_S - 50, STEP_S)
    assert early.node_ids == () and early.values.shape == (0, len(CHANNELS), 51)


def test_history_waiting_adds_the_router_queue_for_the_entry_stages(prom: PrometheusServer) -> None:
    """As the live scrape (``add_router_queues``): the pool's prefill/mixed servers' waiting plus what its
    router queues for those stages, in either spelling, from one range query for the fleet; a decode
    instance's waiting and the decode stage's queue are not prefill demand; a router without servers adds
    no pool."""
    frame = PrometheusSource(prom.url, labels=LabelMap(), max_points=MAX_POINTS).history(
        T0_S, T0_S + DURATION_S, STEP_S, rate_window_s=10.0
    )
    assert frame.node_ids == ("a", "b")
    waiting = frame.series("waiting")
    before, after = slice(20, QUEUE_FROM_S - 10), slice(QUEUE_FROM_S + 10, DURATION_S - 5)
    np.testing.assert_array_equal(waiting[0, before], 1.0)  # a-p0's own 1; no router series yet
    np.testing.assert_array_equal(waiting[0, after], 1.0 + 4.0 + 2.0)
    np.testing.assert_array_equal(waiting[1, 20 : DURATION_S - 5], 1.0 + 3.0)
