"""``DirectSource``: pages of a local pool's servers and router, mapped to ``InstanceSamples`` by the
Prometheus source's own tables (an in-memory querier), with NaN for members whose page fails."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.sources.direct import DirectSource, PageQuerier, members_of
from controller.sources.prometheus import SourceError
from serving.sim import samples as names


class FakePool:
    """A ``PoolView``: a state document and a router URL."""

    def __init__(self, instances: list[dict[str, Any]], url: str = "http://router") -> None:
        self.name = "chat"
        self.url = url
        self.instances = instances

    def state(self) -> dict[str, Any]:
        return {"instances": self.instances}


def inst(iid: str, role: str, tier: str = "active", node: str | None = None) -> dict[str, Any]:
    return {"id": iid, "role": role, "tier": tier, "url": f"http://{iid}", "node": node}


def vllm_page(running: float, gen: float, colon: bool = True, ttft: int = 0) -> str:
    sep = ":" if colon else "_"
    lab = '{model_name="m",engine="0"}'
    return "\n".join(
        [
            f"# TYPE vllm{sep}num_requests_running gauge",
            f"vllm{sep}num_requests_running{lab} {running}",
            f"# TYPE vllm{sep}generation_tokens counter",
            f"vllm{sep}generation_tokens_total{lab} {gen}",
            f"vllm{sep}generation_tokens_created{lab} 1.7e9",
            f"# TYPE vllm{sep}time_to_first_token_seconds histogram",
            f'vllm{sep}time_to_first_token_seconds_bucket{{model_name="m",le="0.5"}} {ttft}',
            f'vllm{sep}time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {ttft}',
            f"vllm{sep}time_to_first_token_seconds_count{lab} {ttft}",
            f"vllm{sep}time_to_first_token_seconds_sum{lab} {0.2 * ttft}",
            "",
        ]
    )


ROUTER_PAGE = "\n".join(
    [
        "# TYPE pdscale:router_requests counter",
        'pdscale:router_requests_total{instance_id="p0",role="prefill",node=""} 7.0',
        'pdscale:router_requests_total{instance_id="d0",role="decode",node=""} 7.0',
        'pdscale:router_requests_total{instance_id="gone",role="decode",node=""} 3.0',
        "# TYPE pdscale:router_client_requests counter",
        'pdscale:router_client_requests_total{priority_class="a",route="pd",endpoint="x",status="200"} 7.0',
        "",
    ]
)


def source(pool: FakePool, pages: dict[str, str | Exception]) -> DirectSource:
    def fetch(url: str, timeout_s: float) -> str:
        page = pages[url.removeprefix("http://").removesuffix("/metrics")]
        if isinstance(page, Exception):
            raise page
        return page

    return DirectSource(pool, fetch=fetch, clock=lambda: 0.0)


def test_pages_map_to_samples_with_the_members_identity() -> None:
    pool = FakePool([inst("p0", "prefill"), inst("d0", "decode", node="n0"), inst("d1", "decode", "standby")])
    pages: dict[str, str | Exception] = {
        "p0": vllm_page(0.0, 0.0, ttft=4),
        "d0": vllm_page(3.0, 120.0, colon=False),  # Prometheus 2's spelling: still read
        "router": ROUTER_PAGE,
    }
    s = source(pool, pages).scrape(100.0)
    assert s.instance_ids == ("d0", "p0")  # the standby member is not scraped
    assert (s.pools, s.roles, s.nodes, s.states) == (
        ("chat", "chat"),
        ("decode", "prefill"),
        ("n0", "p0"),
        ("active", "active"),
    )
    assert s.gauges[names.NUM_REQUESTS_RUNNING].tolist() == [3.0, 0.0]
    assert s.counters[names.GENERATION_TOKENS_TOTAL].tolist() == [120.0, 0.0]  # _created is not the counter
    assert s.counters[names.ROUTER_REQUESTS_TOTAL].tolist() == [7.0, 7.0]  # by instance_id; "gone" dropped
    assert np.isnan(s.gauges[names.KV_CACHE_USAGE_PERC]).all()  # not exported: unknown, not zero
    h = s.histograms[names.TIME_TO_FIRST_TOKEN_SECONDS]
    assert h.bounds_s == (0.5,) and h.counts.tolist() == [[0, 0], [4, 4]]


def test_a_failed_member_is_nan_and_counted_and_the_rest_is_read() -> None:
    pool = FakePool([inst("p0", "prefill"), inst("d0", "decode"), inst("d1", "decode")])
    pages: dict[str, str | Exception] = {
        "p0": vllm_page(0.0, 0.0, ttft=2),
        "d0": ConnectionRefusedError("refused"),
        "d1": "vllm:num_requests_running{ 3\n",  # malformed
        "router": OSError("router down"),
    }
    src = source(pool, pages)
    s = src.scrape(5.0)
    assert s.instance_ids == ("d0", "d1", "p0")
    assert np.isnan(s.gauges[names.NUM_REQUESTS_RUNNING][:2]).all()
    assert np.isnan(s.counters[names.GENERATION_TOKENS_TOTAL][:2]).all()
    assert s.gauges[names.NUM_REQUESTS_RUNNING][2] == 0.0
    assert names.ROUTER_REQUESTS_TOTAL not in s.counters  # the router failed: arrivals unknown
    assert s.histograms == {}  # a member is unknown: no latency this tick (no burst on its return)
    assert src.stats().failed == {"d0": 1, "d1": 1, "router": 1} and src.stats().scrapes == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=6))
def test_every_active_member_is_listed_and_nan_exactly_where_its_page_failed(fails: list[bool]) -> None:
    members = [inst(f"d{i}", "decode") for i in range(len(fails))]
    pages: dict[str, str | Exception] = {
        f"d{i}": OSError("down") if bad else vllm_page(float(i + 1), 10.0 * i) for i, bad in enumerate(fails)
    }
    pages["router"] = ""
    s = source(FakePool(members), pages).scrape(1.0)
    assert s.instance_ids == tuple(sorted(m["id"] for m in members))
    running = dict(zip(s.instance_ids, s.gauges[names.NUM_REQUESTS_RUNNING].tolist(), strict=True))
    for i, bad in enumerate(fails):
        assert math.isnan(running[f"d{i}"]) == bad
        if not bad:
            assert running[f"d{i}"] == i + 1


def test_no_router_url_and_no_members_is_an_empty_scrape() -> None:
    s = source(FakePool([], url=""), {}).scrape(1.0)
    assert s.instance_ids == () and s.gauges[names.NUM_REQUESTS_RUNNING].shape == (0,)


def test_the_querier_answers_only_name_selectors() -> None:
    q = PageQuerier()
    q.load([{"metric": {"__name__": "vllm:a_total"}, "value": [0, "1"]}])
    assert len(q.custom_query('{__name__=~"vllm[:_]a(_total)?"}')) == 1
    assert q.custom_query('{__name__=~"vllm[:_]a"}') == []  # anchored, as in Prometheus
    with pytest.raises(SourceError, match="cannot answer"):
        q.custom_query("sum(rate(x[1m]))")


def test_a_state_document_without_ids_is_a_clear_error() -> None:
    with pytest.raises(SourceError, match=r"instances\[0\] lacks 'id'"):
        members_of(FakePool([{"role": "decode", "url": "http://x"}]))
