"""The router counts arrivals when they arrive: a request waiting for a backend slot is in
``pdscale:router_requests_total`` (and the prompt-token counter) before it is dispatched, so the pool's
arrival rate is not capped at what a saturated fleet takes; ``pdscale:router_dispatched_total`` counts what
each backend was sent, and ``pdscale:router_queue_length`` the backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.router.app import Router
from serving.router.config import router_config_from_dict
from tests.router.router_fakes import FakeBackend, backend_doc, serve_backends, serve_router

pytestmark = pytest.mark.timeout(60)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> int:
    async with s.post(url + "/v1/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


def per_instance(page: str, name: str) -> dict[str, float]:
    """``name``'s samples on a metrics page, by ``instance_id``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name:
                out[s.labels["instance_id"]] = float(s.value)
    return out


def queued(page: str) -> dict[str, float]:
    """``pdscale:router_queue_length`` per stage, summed over priority classes."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == "pdscale:router_queue_length":
                out[s.labels["stage"]] = out.get(s.labels["stage"], 0.0) + float(s.value)
    return out


async def page_of(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url + "/metrics") as resp:
        return (await resp.read()).decode()


async def until(cond: Any) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met within 10 s")


def test_pd_requests_queued_behind_a_saturated_prefill_are_counted_before_dispatch() -> None:
    async def body() -> None:
        p0, d0 = FakeBackend("p0", "prefill", mode="hold"), FakeBackend("d0", "decode")
        async with serve_backends(p0, d0):
            cfg = router_config_from_dict(
                {
                    "backends": [backend_doc(p0, max_in_flight=1), backend_doc(d0)],
                    "poll_interval_s": 0,
                }
            )
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                prompt = "x" * 40  # 10 tokens by the router's estimate
                blocker = asyncio.create_task(post(s, url, {"prompt": prompt}))
                await until(lambda: p0.running == 1)
                waiting = [asyncio.create_task(post(s, url, {"prompt": prompt})) for _ in range(3)]
                await until(lambda: router.queues.waiting("prefill") == 3)
                during = await page_of(s, url)
                p0.mode = "ok"
                p0.release.set()
                statuses = await asyncio.gather(blocker, *waiting)
                after = await page_of(s, url)
        assert statuses == [200] * 4
        # saturated: four arrived, one dispatched, three queued; the arrivals are all counted already
        assert per_instance(during, "pdscale:router_requests_total") == {"p0": 4.0}
        assert per_instance(during, "pdscale:router_prompt_tokens_total") == {"p0": 40.0}
        assert per_instance(during, "pdscale:router_dispatched_total") == {"p0": 1.0}
        assert queued(during) == {"prefill": 3.0}
        # drained: no request counted twice; the decode stage counts its dispatches as before
        assert per_instance(after, "pdscale:router_requests_total") == {"p0": 4.0, "d0": 4.0}
        assert per_instance(after, "pdscale:router_prompt_tokens_total") == {"p0": 40.0}
        assert per_instance(after, "pdscale:router_dispatched_total") == {"p0": 4.0, "d0": 4.0}
        assert queued(after) == {}

    run(body())


def test_queued_arrivals_spread_over_the_stage_and_a_full_queue_still_counts() -> None:
    async def body() -> None:
        a, b = FakeBackend("a", mode="hold"), FakeBackend("b", mode="hold")
        async with serve_backends(a, b):
            cfg = router_config_from_dict(
                {
                    "backends": [backend_doc(a, max_in_flight=1), backend_doc(b, max_in_flight=1)],
                    "poll_interval_s": 0,
                    "max_queue": 4,
                }
            )
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                busy = [asyncio.create_task(post(s, url, {"prompt": "x"})) for _ in range(2)]
                await until(lambda: a.running == 1 and b.running == 1)
                waiting = [asyncio.create_task(post(s, url, {"prompt": "y"})) for _ in range(4)]
                await until(lambda: router.queues.waiting("mixed") == 4)
                refused = await post(s, url, {"prompt": "z"})  # the queue is full: 503 at once
                during = await page_of(s, url)
                for f in (a, b):
                    f.mode = "ok"
                    f.release.set()
                statuses = await asyncio.gather(*busy, *waiting)
                after = await page_of(s, url)
        assert refused == 503 and statuses == [200] * 6
        arrivals = per_instance(during, "pdscale:router_requests_total")
        assert sum(arrivals.values()) == 7.0  # the refused request arrived too: demand, not service
        assert min(arrivals.values()) >= 3.0  # spread over both backends, not piled on one
        assert sum(per_instance(during, "pdscale:router_dispatched_total").values()) == 2.0
        assert per_instance(after, "pdscale:router_requests_total") == arrivals
        assert sum(per_instance(after, "pdscale:router_dispatched_total").values()) == 6.0

    run(body())


def test_a_retry_is_dispatched_again_but_arrives_once() -> None:
    async def body() -> None:
        bad, good = FakeBackend("a-bad", mode="http500"), FakeBackend("b-good")
        async with serve_backends(bad, good):
            cfg = router_config_from_dict(
                {"backends": [backend_doc(bad), backend_doc(good)], "poll_interval_s": 0}
            )
            router = Router(cfg)
            async with serve_router(cfg, router) as (_, url), aiohttp.ClientSession() as s:
                assert await post(s, url, {"prompt": "x"}) == 200
                page = await page_of(s, url)
        assert len(bad.bodies) == 1  # a-bad sorts first: the first attempt went there
        assert sum(per_instance(page, "pdscale:router_requests_total").values()) == 1.0
        assert per_instance(page, "pdscale:router_dispatched_total") == {"a-bad": 1.0, "b-good": 1.0}

    run(body())
