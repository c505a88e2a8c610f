"""From per-instance scrapes to per-pool load: rates, resets, quantiles, and unknown kept unknown."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.sources.aggregate import LoadAggregator
from serving.sim import samples as s
from serving.sim.samples import histogram_quantile


def _scrape(now_s: float, prompt: list[float], arrivals: list[float], states: tuple[str, ...] | None = None,
            ids: tuple[str, ...] = ("p0", "d0"), roles: tuple[str, ...] = ("prefill", "decode")) -> s.InstanceSamples:  # fmt: skip
    n = len(ids)
    return s.InstanceSamples(
        now_s=now_s,
        instance_ids=ids,
        pools=("default",) * n,
        roles=roles,
        nodes=ids,
        states=states or ("active",) * n,
        gauges={
            s.NUM_REQUESTS_RUNNING: np.full(n, 2.0),
            s.NUM_REQUESTS_WAITING: np.full(n, 1.0),
            s.KV_CACHE_USAGE_PERC: np.linspace(0.2, 0.4, n),
        },
        counters={
            s.PROMPT_TOKENS_TOTAL: np.asarray(prompt, dtype=np.float64),
            s.GENERATION_TOKENS_TOTAL: np.full(n, 10.0 * now_s),
            s.ROUTER_REQUESTS_TOTAL: np.asarray(arrivals, dtype=np.float64),
        },
    )


def test_first_scrape_has_unknown_rates_then_rates_from_deltas() -> None:
    agg = LoadAggregator()
    first = agg.update(_scrape(10.0, [1000.0, 0.0], [5.0, 0.0]), ["default"])["default"]
    assert math.isnan(first.prompt_tps) and math.isnan(first.arrival_rps) and not first.complete
    second = agg.update(_scrape(12.0, [3000.0, 0.0], [9.0, 0.0]), ["default"])["default"]
    assert second.prompt_tps == pytest.approx(1000.0)  # only prefill instances' prompt tokens count
    assert second.arrival_rps == pytest.approx(2.0)
    assert second.gen_tps == pytest.approx(20.0)  # 10 tok/s per instance × 2
    assert second.mean_prompt_tokens == pytest.approx(500.0)
    assert second.running == 2.0  # decode instances only: a prefilling request is not decoding
    assert second.waiting == 1.0  # prefill instances only: queued, not yet prefilled
    assert second.kv_usage == pytest.approx(0.4)  # decode instances only
    assert second.complete


def test_counter_reset_and_new_instances_count_from_zero() -> None:
    agg = LoadAggregator()
    agg.update(_scrape(10.0, [5000.0, 0.0], [50.0, 0.0]), ["default"])
    # p0 restarted (counter went down to 100), p1 is new with 300.
    cur = _scrape(
        11.0,
        [100.0, 0.0, 300.0],
        [1.0, 0.0, 2.0],
        ids=("p0", "d0", "p1"),
        roles=("prefill", "decode", "prefill"),
    )
    load = agg.update(cur, ["default"])["default"]
    assert load.prompt_tps == pytest.approx(400.0)
    assert load.arrival_rps == pytest.approx(3.0)


def test_missing_counter_is_unknown_not_zero() -> None:
    agg = LoadAggregator()
    a = _scrape(0.0, [0.0, 0.0], [0.0, 0.0])
    del a.counters[s.PROMPT_TOKENS_TOTAL]
    agg.update(a, ["default"])
    b = _scrape(1.0, [10.0, 0.0], [1.0, 0.0])
    del b.counters[s.PROMPT_TOKENS_TOTAL]
    load = agg.update(b, ["default"])["default"]
    assert math.isnan(load.prompt_tps)
    assert load.arrival_rps == pytest.approx(1.0)


def test_standby_and_provisioning_do_not_serve() -> None:
    agg = LoadAggregator()
    ids, roles = ("p0", "d0", "d1"), ("prefill", "decode", "decode")
    scrape = _scrape(0.0, [0] * 3, [0] * 3, states=("standby", "active", "standby"), ids=ids, roles=roles)
    load = agg.update(scrape, ["default"])["default"]
    assert load.running == 2.0  # the standby decode instance's gauge is not load
    assert load.waiting == 0.0  # nor the standby prefill instance's
    assert load.counts == {"prefill": {"standby": 1}, "decode": {"active": 1, "standby": 1}}


BOUNDS = (0.1, 0.25, 0.5, 1.0)


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        (0.5, [0, 10, 10, 10, 10], 0.175),  # all in (0.1, 0.25]: linear inside the bucket
        (0.9, [5, 5, 5, 5, 10], 1.0),  # in +Inf: the highest finite bound, as Prometheus answers
        (0.5, [10, 10, 10, 10, 10], 0.05),  # first bucket interpolates from 0
        (0.5, [0, 0, 0, 0, 0], math.nan),  # no observations
    ],
)
def test_histogram_quantile_matches_prometheus(q: float, counts: list[int], expected: float) -> None:
    got = histogram_quantile(q, BOUNDS, np.asarray(counts, dtype=np.int64))
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


@given(st.lists(st.integers(0, 50), min_size=5, max_size=5), st.floats(0.01, 0.99))
def test_histogram_quantile_is_monotone_in_q(incs: list[int], q: float) -> None:
    counts = np.cumsum(incs)
    a = histogram_quantile(q, BOUNDS, counts)
    b = histogram_quantile(min(q + 0.01, 1.0), BOUNDS, counts)
    if counts[-1] == 0:
        assert math.isnan(a)
    else:
        assert b >= a - 1e-12


def test_a_pd_request_routed_twice_counts_once() -> None:
    # The router counts a request on its prefill AND its decode instance; arrivals are where requests enter.
    agg = LoadAggregator()
    agg.update(_scrape(0.0, [0.0, 0.0], [0.0, 0.0]), ["default"])
    load = agg.update(_scrape(1.0, [1000.0, 0.0], [4.0, 4.0]), ["default"])["default"]
    assert load.arrival_rps == pytest.approx(4.0)
    assert load.mean_prompt_tokens == pytest.approx(250.0)


@pytest.mark.parametrize(
    ("roles", "running", "waiting"),
    [
        (("prefill", "decode", "decode"), 30.0 + 50.0, 1.0),
        (("prefill", "prefill", "decode"), 50.0, 1.0 + 3.0),
        (("mixed", "mixed", "mixed"), 7.0 + 30.0 + 50.0, 1.0 + 3.0 + 5.0),
    ],
    ids=["pd-two-decode", "pd-two-prefill", "colocated"],
)
def test_running_counts_decoders_and_waiting_counts_unprefilled(
    roles: tuple[str, ...], running: float, waiting: float
) -> None:
    """In P/D, a prefill instance's running requests are prefilling (not decoding) and a decode instance's
    waiting requests are prefilled (waiting for a decode slot, not for a prefill): each gauge is summed over
    the role that PoolObservation.running_seqs / waiting_requests describe."""
    ids = ("a", "b", "c")
    scrape = _scrape(1.0, [0.0] * 3, [0.0] * 3, ids=ids, roles=roles)
    scrape.gauges[s.NUM_REQUESTS_RUNNING] = np.array([7.0, 30.0, 50.0])
    scrape.gauges[s.NUM_REQUESTS_WAITING] = np.array([1.0, 3.0, 5.0])
    load = LoadAggregator().update(scrape, ["default"])["default"]
    assert load.running == running
    assert load.waiting == waiting


def test_an_unknown_gauge_on_a_counted_role_makes_the_pool_sum_unknown() -> None:
    scrape = _scrape(
        1.0, [0.0] * 3, [0.0] * 3, ids=("p0", "p1", "d0"), roles=("prefill", "prefill", "decode")
    )
    scrape.gauges[s.NUM_REQUESTS_WAITING] = np.array([1.0, np.nan, 5.0])
    scrape.gauges[s.NUM_REQUESTS_RUNNING] = np.array([np.nan, np.nan, 5.0])
    load = LoadAggregator().update(scrape, ["default"])["default"]
    assert math.isnan(load.waiting), "one prefill instance's waiting is unknown, so the pool's sum is"
    assert load.running == 5.0  # the prefill instances' unknown running is not part of the decode sum
