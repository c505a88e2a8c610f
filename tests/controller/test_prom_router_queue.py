"""The Prometheus source reads pdscale's router per pool: its queue (added to the pool's waiting requests, as
the direct source does) and its dispatch counter, in either spelling, one query per metric for the fleet.
The same against a real Prometheus scraping a real router page: tests/controller/test_prom_source_live.py."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.settings import LabelMap
from controller.sources.aggregate import LoadAggregator
from controller.sources.prometheus import PrometheusSource, add_router_queues
from serving.router.metrics import RouterMetrics
from serving.sim import samples as names
from serving.sim.samples import InstanceSamples
from tests.controller.test_prom_source_units import FakeQuerier, row

LABELS = LabelMap(instance="instance_id")
P0 = {"instance_id": "a-p0", "pool": "a", "role": "prefill"}
P1 = {"instance_id": "a-p1", "pool": "a", "role": "prefill"}
D0 = {"instance_id": "a-d0", "pool": "a", "role": "decode"}
M0 = {"instance_id": "b-m0", "pool": "b"}  # no role label: mixed


def fleet(queue: list[dict[str, object]], dispatched: list[dict[str, object]] | None = None) -> FakeQuerier:
    return FakeQuerier(
        {
            "num_requests_waiting": [
                row("vllm:num_requests_waiting", 1, **P0),
                row("vllm:num_requests_waiting", 2, **P1),
                row("vllm:num_requests_waiting", 5, **D0),
                row("vllm_num_requests_waiting", 1, **M0),
            ],
            "router_queue_length": queue,
            "router_dispatched": dispatched or [],
        }
    )


def waiting(s: InstanceSamples) -> dict[str, float]:
    return dict(zip(s.instance_ids, s.gauges[names.NUM_REQUESTS_WAITING].tolist(), strict=True))


def test_entry_queues_add_to_their_pools_waiting_in_either_spelling() -> None:
    q = fleet(
        [
            row("pdscale:router_queue_length", 4, pool="a", stage="prefill", priority_class="normal"),
            row("pdscale:router_queue_length", 2, pool="a", stage="prefill", priority_class="vip"),
            row("pdscale:router_queue_length", 9, pool="a", stage="decode", priority_class="normal"),
            row("pdscale_router_queue_length", 3, pool="b", stage="mixed", priority_class="batch"),
        ]
    )
    source = PrometheusSource("http://unused", labels=LABELS, querier=q)
    s = source.scrape(100.0)
    # a: 6 queued for prefill shared by a-p0 and a-p1; the decode stage's queue is not prefill demand
    assert waiting(s) == {"a-d0": 5.0, "a-p0": 4.0, "a-p1": 5.0, "b-m0": 4.0}
    assert sum('router_queue_length"}' in x for x in q.queries) == 1  # one query for the whole fleet
    loads = LoadAggregator().update(s, ["a", "b"])
    assert loads["a"].waiting == 9.0 and loads["b"].waiting == 4.0
    # the router's part is kept apart: it waits for any instance, the rest in an instance's own queue
    share = dict(zip(s.instance_ids, s.gauges[names.ROUTER_QUEUE_SHARE].tolist(), strict=True))
    assert share == {"a-d0": 0.0, "a-p0": 3.0, "a-p1": 3.0, "b-m0": 3.0}
    assert loads["a"].router_waiting == 6.0 and loads["b"].router_waiting == 3.0


def test_a_series_under_both_spellings_counts_once_and_a_router_without_pool_is_unmapped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = fleet(
        [
            row("pdscale_router_queue_length", 4, pool="a", stage="prefill", priority_class="normal"),
            row("pdscale:router_queue_length", 4, pool="a", stage="prefill", priority_class="normal"),
            row("pdscale:router_queue_length", 7, stage="prefill", priority_class="normal"),
        ]
    )
    source = PrometheusSource("http://unused", labels=LABELS, querier=q)
    with caplog.at_level(logging.WARNING, logger="controller.sources.prometheus"):
        s = source.scrape(100.0)
    assert waiting(s)["a-p0"] == 3.0 and waiting(s)["a-p1"] == 4.0
    assert source.stats().spelling_conflicts == 1
    assert source.stats().unmapped == {names.ROUTER_QUEUE_LENGTH: 1}
    assert "no 'pool' label (name the router's pool)" in caplog.text


def test_no_router_leaves_waiting_as_the_servers() -> None:
    s = PrometheusSource("http://unused", labels=LABELS, querier=fleet([])).scrape(100.0)
    assert waiting(s) == {"a-d0": 5.0, "a-p0": 1.0, "a-p1": 2.0, "b-m0": 1.0}
    assert LoadAggregator().update(s, ["a"])["a"].router_waiting == 0.0  # every waiting request pinned
    assert names.ROUTER_DISPATCHED_TOTAL not in s.counters  # no router: left out, not zeros


def test_dispatch_counter_per_instance_and_never_a_phantom_instance() -> None:
    """The router's per-backend series join the instance vLLM's series name; the router's own target (its
    ``instance_id`` naming no vLLM instance) is counted as unmapped, not read as one more instance."""
    q = fleet(
        [],
        [
            row("pdscale:router_dispatched_total", 10, **P0),
            row("pdscale_router_dispatched", 4, **M0),
            row("pdscale:router_dispatched_total", 3, instance_id="gone", pool="a", role="prefill"),
        ],
    )
    source = PrometheusSource("http://unused", labels=LABELS, querier=q)
    s = source.scrape(100.0)
    assert s.instance_ids == ("a-d0", "a-p0", "a-p1", "b-m0")
    got = dict(zip(s.instance_ids, s.counters[names.ROUTER_DISPATCHED_TOTAL].tolist(), strict=True))
    assert got["a-p0"] == 10.0 and got["b-m0"] == 4.0
    assert math.isnan(got["a-p1"]) and math.isnan(got["a-d0"])
    assert source.stats().unmapped == {names.ROUTER_DISPATCHED_TOTAL: 1}


def test_the_routers_own_page_carries_its_pool() -> None:
    m = RouterMetrics("chat")
    m.queue_length.labels("prefill", "normal").set(3)
    m.dispatched.labels("p0", "prefill", "n0").inc()
    page = m.page().decode()
    assert 'pdscale:router_queue_length{pool="chat",priority_class="normal",stage="prefill"} 3.0' in page
    assert (
        'pdscale:router_dispatched_total{instance_id="p0",node="n0",pool="chat",role="prefill"} 1.0' in page
    )
    assert "pool=" not in RouterMetrics().page().decode()  # a router that names no pool exports no label


def _samples(roles: list[str], pools: list[str], waiting: list[float]) -> InstanceSamples:
    n = len(roles)
    return InstanceSamples(
        now_s=0.0,
        instance_ids=tuple(f"i{k}" for k in range(n)),
        pools=tuple(pools),
        roles=tuple(roles),
        nodes=tuple(f"i{k}" for k in range(n)),
        states=("active",) * n,
        gauges={names.NUM_REQUESTS_WAITING: np.array(waiting, dtype=np.float64)},
        counters={},
        histograms={},
    )


def test_a_pool_without_entry_instances_leaves_its_queue_unplaced() -> None:
    s = _samples(["decode", "prefill"], ["a", "b"], [0.0, 1.0])
    out, unplaced = add_router_queues(s, {"a": {"prefill": 3.0}, "b": {"prefill": 2.0}})
    assert out.gauges[names.NUM_REQUESTS_WAITING].tolist() == [0.0, 3.0]
    assert unplaced == {"a": 3.0}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["prefill", "decode", "mixed"]), st.sampled_from(["a", "b"])), max_size=6
    ),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e4), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b"]), st.floats(0, 1e4), max_size=2),
)
def test_every_queued_request_is_counted_once_or_unplaced(
    members: list[tuple[str, str]], prefill_q: dict[str, float], decode_q: dict[str, float]
) -> None:
    s = _samples([r for r, _ in members], [p for _, p in members], [1.0] * len(members))
    queues = {p: {"prefill": n} for p, n in prefill_q.items()}
    for p, n in decode_q.items():
        queues.setdefault(p, {})["decode"] = n
    out, unplaced = add_router_queues(s, queues)
    w = out.gauges[names.NUM_REQUESTS_WAITING]
    decode = np.array([r == "decode" for r, _ in members], dtype=bool)
    assert np.all(w[decode] == 1.0) if decode.any() else True  # a decode queue is never prefill demand
    added = float(w.sum()) - len(members)
    assert added + sum(unplaced.values()) == pytest.approx(sum(prefill_q.values()), abs=1e-6)


def test_router_config_names_its_pool_and_a_bad_one_is_refused() -> None:
    from serving.router.config import RouterConfigError, router_config_from_dict

    assert router_config_from_dict({}).pool == ""
    assert router_config_from_dict({"pool": "chat"}).pool == "chat"
    with pytest.raises(RouterConfigError, match="pool"):
        router_config_from_dict({"pool": "x" * 129}, "r.yaml")


def test_router_cli_pool_option_overrides_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    import serving.router.app
    from serving.router.cli import app
    from serving.router.config import RouterConfig

    got: list[RouterConfig] = []
    monkeypatch.setattr(serving.router.app, "run_router", got.append)
    cfg = Path(str(tmp_path)) / "router.yaml"
    cfg.write_text("pool: from-file\n")
    assert CliRunner().invoke(app, ["--config", str(cfg)]).exit_code == 0
    assert CliRunner().invoke(app, ["--config", str(cfg), "--pool", "chat"]).exit_code == 0
    assert [c.pool for c in got] == ["from-file", "chat"]
