"""``DirectSource``: the router's queue (``pdscale:router_queue_length``) is waiting demand of the pool: the
prefill and mixed stages' queues add to the waiting requests of that stage's members, so the aggregator's
pool ``waiting`` sees a gateway backlog; the decode queue is left out, as decode servers' own queues are."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.sources.aggregate import LoadAggregator
from controller.sources.direct import router_queue
from serving.sim import samples as names
from serving.sim.samples import InstanceSamples
from tests.controller.test_local_daemon_source import FakePool, inst, source

Pages = dict[str, str | Exception]


def server_page(waiting: float) -> str:
    return f'vllm:num_requests_running{{model_name="m"}} 1\nvllm:num_requests_waiting{{model_name="m"}} {waiting}\n'


def router_page(prefill: float = 0.0, mixed: float = 0.0, decode: float = 0.0) -> str:
    """A router page whose queues hold these requests (prefill split over two priority classes)."""
    lines = ["# TYPE pdscale:router_queue_length gauge"]
    if prefill:
        lines += [
            f'pdscale:router_queue_length{{stage="prefill",priority_class="vip"}} {prefill - 1}',
            'pdscale:router_queue_length{stage="prefill",priority_class="normal"} 1',
        ]
    if mixed:
        lines.append(f'pdscale:router_queue_length{{stage="mixed",priority_class="normal"}} {mixed}')
    if decode:
        lines.append(f'pdscale:router_queue_length{{stage="decode",priority_class="batch"}} {decode}')
    return "\n".join(lines) + "\n"


def waiting_of(s: InstanceSamples) -> dict[str, float]:
    return dict(zip(s.instance_ids, s.gauges[names.NUM_REQUESTS_WAITING].tolist(), strict=True))


def test_the_prefill_queue_adds_to_the_pools_waiting_requests_and_the_decode_queue_does_not() -> None:
    pool = FakePool([inst("p0", "prefill"), inst("p1", "prefill"), inst("d0", "decode")])
    pages = {"p0": server_page(1), "p1": server_page(2), "d0": server_page(5)}
    src = source(pool, {**pages, "router": router_page(prefill=6, decode=4)})
    s = src.scrape(1.0)
    assert waiting_of(s) == {"d0": 5.0, "p0": 4.0, "p1": 5.0}  # 6 queued, shared evenly over p0 and p1
    load = LoadAggregator().update(s, ["chat"])["chat"]
    assert load.waiting == 9.0  # the servers' 3 + the router's 6; decode's own and queued requests not


def test_without_a_backlog_or_without_the_router_page_waiting_is_the_servers() -> None:
    pool = FakePool([inst("m0", "mixed"), inst("m1", "mixed")])
    pages = {"m0": server_page(1), "m1": server_page(2)}
    assert waiting_of(source(pool, {**pages, "router": router_page()}).scrape(1.0)) == {"m0": 1.0, "m1": 2.0}
    down = source(pool, {**pages, "router": OSError("router down")}).scrape(1.0)
    assert waiting_of(down) == {"m0": 1.0, "m1": 2.0}  # backlog unknown: the servers' queues alone


def test_a_stage_without_members_goes_to_the_other_entry_members_or_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mixed_only = FakePool([inst("m0", "mixed"), inst("d0", "decode")])
    pages: Pages = {"m0": server_page(0), "d0": server_page(0), "router": router_page(prefill=3, mixed=2)}
    assert waiting_of(source(mixed_only, pages).scrape(1.0)) == {"d0": 0.0, "m0": 5.0}
    decode_only = FakePool([inst("d0", "decode")])
    with caplog.at_level(logging.WARNING, logger="controller.sources.direct"):
        s = source(decode_only, {"d0": server_page(0), "router": router_page(prefill=3)}).scrape(1.0)
    assert waiting_of(s) == {"d0": 0.0}
    assert "3 requests queued at the router not counted" in caplog.text


def test_a_member_with_unknown_waiting_stays_unknown() -> None:
    pool = FakePool([inst("p0", "prefill"), inst("p1", "prefill")])
    pages: Pages = {"p0": server_page(1), "p1": OSError("down"), "router": router_page(prefill=4)}
    w = waiting_of(source(pool, pages).scrape(1.0))
    assert w["p0"] == 3.0 and math.isnan(w["p1"])


def test_router_queue_sums_the_classes_per_stage_in_either_spelling() -> None:
    page = (
        router_page(prefill=6, mixed=2)
        + 'pdscale_router_queue_length{stage="decode",priority_class="vip"} 3\n'
    )
    assert router_queue(page) == {"prefill": 6.0, "mixed": 2.0, "decode": 3.0}
    assert router_queue('pdscale:router_requests_total{instance_id="p0"} 4\n') == {}


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=4),
    st.integers(0, 50),
    st.integers(0, 50),
)
def test_pool_waiting_is_the_servers_plus_the_entry_queues(
    server_waiting: list[int], prefill_queue: int, decode_queue: int
) -> None:
    members = [inst(f"p{i}", "prefill") for i in range(len(server_waiting))] + [inst("d0", "decode")]
    pages: Pages = {f"p{i}": server_page(w) for i, w in enumerate(server_waiting)}
    pages["d0"] = server_page(7)
    pages["router"] = router_page(prefill=prefill_queue, decode=decode_queue)
    s = source(FakePool(members), pages).scrape(1.0)
    load = LoadAggregator().update(s, ["chat"])["chat"]
    assert load.waiting == pytest.approx(sum(server_waiting) + prefill_queue)
    assert np.all(s.gauges[names.NUM_REQUESTS_WAITING] >= 0)
