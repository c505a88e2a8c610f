"""The router over HTTP against fake backends: P/D flow, streaming, retries, drain, QoS, admin API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from serving.router.app import Router
from serving.router.backends import BackendSpec
from serving.router.config import RouterConfig, router_config_from_dict
from tests.router.router_fakes import FakeBackend, backend_doc, serve_backends, serve_router

pytestmark = pytest.mark.timeout(60)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def config(*fakes: FakeBackend, **extra: Any) -> RouterConfig:
    doc = {"backends": [backend_doc(f) for f in fakes], "poll_interval_s": 0, **extra}
    return router_config_from_dict(doc)


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str
) -> tuple[int, bytes, str]:
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.read(), resp.headers.get("x-pdscale-backend", "")


def sse_texts(raw: bytes) -> list[str]:
    out = []
    for line in raw.decode().split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            doc = json.loads(line[6:])
            out.append(doc["choices"][0]["text"] if "choices" in doc else "ERROR:" + doc["error"]["message"])
    return out


def test_pd_flow_prefills_one_token_then_decodes_with_returned_params() -> None:
    async def body() -> None:
        async with (
            serve_backends(FakeBackend("p0", "prefill"), FakeBackend("d0", "decode")) as (p, d),
            serve_router(config(p, d)) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            request = {"model": "tiny", "prompt": "hello", "max_tokens": 9, "stream": False,
                       "stream_options": {"include_usage": True}}  # fmt: skip
            status, raw, backend = await post(s, url, request)
        assert status == 200, raw
        assert backend == "d0"
        assert json.loads(raw)["choices"][0]["text"] == "d0:hello:9"
        [pre] = p.bodies
        assert pre["max_tokens"] == 1 and pre["stream"] is False and "stream_options" not in pre
        assert pre["kv_transfer_params"]["do_remote_decode"] is True
        assert pre["kv_transfer_params"]["do_remote_prefill"] is False
        [dec] = d.bodies
        assert dec["max_tokens"] == 9
        assert dec["kv_transfer_params"] == {"remote_engine_id": "p0", "remote_block_ids": [7, 8]}

    run(body())


def test_mixed_backend_serves_directly_and_streams_through() -> None:
    async def body() -> None:
        async with (
            serve_backends(FakeBackend("m0", chunks=4)) as (m,),
            serve_router(config(m)) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            status, raw, _ = await post(s, url, {"prompt": "x", "max_tokens": 4, "stream": True})
        assert status == 200
        assert sse_texts(raw) == ["m0-0;", "m0-1;", "m0-2;", "m0-3;"]
        assert raw.endswith(b"data: [DONE]\n\n")
        assert "kv_transfer_params" not in m.bodies[0]

    run(body())


def test_retry_on_another_backend_when_nothing_was_streamed() -> None:
    unhealthy: list[str] = []

    async def body() -> None:
        bad, good = FakeBackend("a-bad", mode="http500"), FakeBackend("b-good")
        async with serve_backends(bad, good):
            router = Router(config(bad, good), on_unhealthy=lambda spec, why: unhealthy.append(spec.id))
            async with serve_router(router.config, router) as (_, url), aiohttp.ClientSession() as s:
                status, raw, backend = await post(s, url, {"prompt": "x", "stream": True})
                page = router.metrics.page().decode()
        assert status == 200 and backend == "b-good"
        assert sse_texts(raw) == ["b-good-0;", "b-good-1;", "b-good-2;"]
        assert len(bad.bodies) == 1  # a-bad sorts first: least-loaded tie goes to it
        assert unhealthy == ["a-bad"]
        assert 'pdscale:router_retries_total{route="mixed"} 1.0' in page
        assert 'pdscale:router_backend_errors_total{instance_id="a-bad",kind="http_500"} 1.0' in page

    run(body())


def test_connection_refused_retries_and_all_failing_is_a_502() -> None:
    async def body() -> None:
        dead = [BackendSpec(id=f"dead{i}", url=f"http://127.0.0.1:{port}") for i, port in enumerate((9, 1))]
        cfg = router_config_from_dict(
            {"backends": [vars(s) for s in dead], "poll_interval_s": 0, "max_attempts": 2}
        )
        async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
            status, raw, _ = await post(s, url, {"prompt": "x"})
            assert not any(v.healthy for v in router.registry.views())
        assert status == 502
        assert "all 2 attempts failed" in json.loads(raw)["error"]["message"]

    run(body())


def test_failure_after_first_byte_sends_an_sse_error_event_and_no_retry() -> None:
    async def body() -> None:
        dying, spare = FakeBackend("a-dying", mode="die_mid_stream"), FakeBackend("b-spare")
        async with (
            serve_backends(dying, spare),
            serve_router(config(dying, spare)) as (router, url),
            aiohttp.ClientSession() as s,
        ):
            status, raw, _ = await post(s, url, {"prompt": "x", "stream": True})
            assert not router.registry.view("a-dying").healthy
        texts = sse_texts(raw)
        assert status == 200
        assert texts[0] == "a-dying-0;"
        assert texts[-1].startswith("ERROR:backend a-dying failed mid-stream")
        assert spare.bodies == []

    run(body())


def test_client_errors_pass_through_without_marking_the_backend() -> None:
    async def body() -> None:
        async with (
            serve_backends(FakeBackend("m0")) as (m,),
            serve_router(config(m)) as (router, url),
            aiohttp.ClientSession() as s,
        ):
            status, raw, _ = await post(s, url, {"prompt": "bad"})
            bad_qos, raw_qos, _ = await post(s, url, {"prompt": "x"}, **{"x-pdscale-priority": "gold"})
            assert router.registry.view("m0").healthy
        assert status == 400 and json.loads(raw)["error"]["message"] == "bad prompt"
        assert bad_qos == 400 and b"x-pdscale-priority" in raw_qos

    run(body())


async def _admin(s: aiohttp.ClientSession, method: str, url: str, doc: Any = None) -> tuple[int, Any]:
    async with s.request(method, url, json=doc) as resp:
        return resp.status, await resp.json()


def test_removal_drains_in_flight_requests_and_takes_no_new_ones() -> None:
    async def body() -> None:
        old, new = FakeBackend("old", mode="hold"), FakeBackend("new")
        async with (
            serve_backends(old, new),
            serve_router(config(old)) as (router, url),
            aiohttp.ClientSession() as s,
        ):
            first = asyncio.create_task(post(s, url, {"prompt": "in-flight"}))
            while old.running == 0:
                await asyncio.sleep(0.005)
            assert (await _admin(s, "POST", url + "/admin/backends", backend_doc(new)))[0] == 201
            code, doc = await _admin(s, "DELETE", url + "/admin/backends/old")
            assert (code, doc) == (202, {"draining": "old", "in_flight": 1})
            status, _, backend = await post(s, url, {"prompt": "later"})
            assert (status, backend) == (200, "new")
            waiter = asyncio.create_task(_admin(s, "DELETE", url + "/admin/backends/old?wait=1"))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            old.release.set()
            assert (await first)[0] == 200
            assert (await waiter)[0] == 200
            assert [v.id for v in router.registry.views()] == ["new"]
            code, _ = await _admin(s, "DELETE", url + "/admin/backends/old")
            assert code == 404
        assert [b["prompt"] for b in old.bodies] == ["in-flight"]

    run(body())


def test_vip_goes_first_when_backends_are_saturated() -> None:
    async def body() -> None:
        m = FakeBackend("m0", mode="hold")
        async with serve_backends(m):
            cfg = router_config_from_dict(
                {"backends": [backend_doc(m, max_in_flight=1)], "poll_interval_s": 0}
            )
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                blocker = asyncio.create_task(post(s, url, {"prompt": "blocker"}))
                while m.running == 0:
                    await asyncio.sleep(0.005)
                tasks = []
                for tag in ("batch", "normal", "vip", "batch", "vip"):
                    hdr = {"x-pdscale-priority": tag}
                    tasks.append(asyncio.create_task(post(s, url, {"prompt": tag}, **hdr)))
                    await asyncio.sleep(0.02)  # arrive in this order
                assert router.queues.waiting("mixed") == 5
                async with s.get(url + "/metrics") as resp:
                    page = await resp.read()
                assert b'pdscale:router_queue_length{priority_class="vip",stage="mixed"} 2.0' in page
                m.mode = "ok"
                m.release.set()
                statuses = [r[0] for r in await asyncio.gather(blocker, *tasks)]
        assert statuses == [200] * 6
        assert [b["prompt"] for b in m.bodies] == ["blocker", "vip", "vip", "normal", "batch", "batch"]

    run(body())


def test_queue_timeout_is_a_503() -> None:
    async def body() -> None:
        m = FakeBackend("m0", mode="hold")
        async with serve_backends(m):
            cfg = router_config_from_dict(
                {"backends": [backend_doc(m, max_in_flight=1)], "poll_interval_s": 0, "queue_timeout_s": 0.1}
            )
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                blocker = asyncio.create_task(post(s, url, {"prompt": "x"}))
                while m.running == 0:
                    await asyncio.sleep(0.005)
                status, raw, _ = await post(s, url, {"prompt": "y"})
                assert router.queues.waiting("mixed") == 0
                m.release.set()
                assert (await blocker)[0] == 200
        assert status == 503 and b"queue_timeout_s" in raw

    run(body())


def test_health_models_metrics_and_admin_validation() -> None:
    async def body() -> None:
        async with serve_backends(FakeBackend("p0", "prefill"), FakeBackend("d0", "decode")) as (p, d):
            cfg = config(p, poll_interval_s=0.05, admin_token="s3cret")
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as resp:
                    assert resp.status == 503  # prefill alone cannot serve
                auth = {"Authorization": "Bearer s3cret"}
                async with s.post(url + "/admin/backends", json=backend_doc(d)) as resp:
                    assert resp.status == 401
                async with s.post(
                    url + "/admin/backends", json={"id": "x", "url": "ftp://h"}, headers=auth
                ) as resp:
                    assert resp.status == 400 and "url" in (await resp.json())["error"]
                async with s.post(url + "/admin/backends", json=backend_doc(d), headers=auth) as resp:
                    assert resp.status == 201
                async with s.post(url + "/admin/backends", json=backend_doc(d), headers=auth) as resp:
                    assert resp.status == 409
                async with s.get(url + "/health") as resp:
                    assert resp.status == 200
                async with s.get(url + "/v1/models") as resp:
                    assert (await resp.json())["data"][0]["id"] == "tiny"
                async with s.put(
                    url + "/admin/node-scores", json={"scores": {"n0": 1.5}}, headers=auth
                ) as resp:
                    assert resp.status == 400
                async with s.put(
                    url + "/admin/node-scores", json={"scores": {"n0": 0.9}}, headers=auth
                ) as resp:
                    assert (await resp.json()) == {"scores": {"n0": 0.9}}
                status, _, _ = await post(s, url, {"prompt": "x", "max_tokens": 3})
                assert status == 200
                await asyncio.sleep(0.15)  # a few metric polls
                assert router.registry.view("p0").running == 0.0
                async with s.get(url + "/metrics") as resp:
                    page = (await resp.read()).decode()
        assert 'pdscale:router_requests_total{instance_id="p0",node="",role="prefill"} 1.0' in page
        assert "pdscale:router_proxy_overhead_seconds_bucket" in page
        needle = 'pdscale:router_client_requests_total{endpoint="completions",priority_class="normal",route="pd",status="200"} 1.0'
        assert needle in page

    run(body())


def test_node_above_80_percent_gets_no_new_requests_until_its_score_ages_out() -> None:
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731

    async def body() -> None:
        a, b = FakeBackend("a"), FakeBackend("b")
        async with serve_backends(a, b):
            docs = [backend_doc(a, node="n-a"), backend_doc(b, node="n-b")]
            cfg = router_config_from_dict({"backends": docs, "poll_interval_s": 0, "node_score_ttl_s": 10})
            router = Router(cfg, clock=clock)
            async with serve_router(cfg, router) as (_, url), aiohttp.ClientSession() as s:
                router.set_node_scores({"n-a": 0.95, "n-b": 0.3})
                served = [(await post(s, url, {"prompt": "x"}))[2] for _ in range(3)]
                now[0] = 11.0
                aged = (await post(s, url, {"prompt": "x"}))[2]
        assert served == ["b", "b", "b"]
        assert aged == "a"  # score unknown again: least-loaded tie goes to the lower id

    run(body())


def test_pd_streaming_chat_retries_a_failed_prefill_on_another_instance() -> None:
    async def body() -> None:
        async with (
            serve_backends(
                FakeBackend("p0", "prefill", mode="http500"),
                FakeBackend("p1", "prefill"),
                FakeBackend("d0", "decode"),
            ) as (p0, p1, d),
            serve_router(config(p0, p1, d)) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            chat = {
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 5,
                "stream": True,
            }
            async with s.post(url + "/v1/chat/completions", json=chat) as resp:
                status, raw = resp.status, await resp.read()
        assert status == 200
        assert sse_texts(raw) == ["d0-0;", "d0-1;", "d0-2;"]
        assert p0.bodies[0]["max_completion_tokens"] == 1 and p1.bodies[0]["max_completion_tokens"] == 1
        assert d.bodies[0]["max_completion_tokens"] == 5
        assert d.bodies[0]["kv_transfer_params"]["remote_engine_id"] == "p1"

    run(body())


def test_client_mean_output_predicts_when_max_tokens_is_absent() -> None:
    async def body() -> None:
        async with serve_backends(FakeBackend("m0")) as (m,):
            router = Router(config(m))
            async with serve_router(router.config, router) as (_, url), aiohttp.ClientSession() as s:
                for n in (100, 300):
                    await post(s, url, {"prompt": "x", "max_tokens": n}, **{"x-pdscale-client": "team-a"})
                assert router.predicted_output({}, "team-a") == 200.0
                assert router.predicted_output({"max_tokens": 7}, "team-a") == 7.0
                assert str(router.predicted_output({}, "team-b")) == "nan"

    run(body())


def test_a_request_queued_behind_a_full_node_goes_once_the_controller_lowers_its_score() -> None:
    async def body() -> None:
        async with serve_backends(FakeBackend("a")) as (a,):
            cfg = router_config_from_dict(
                {"backends": [backend_doc(a, node="n-a")], "poll_interval_s": 0, "queue_timeout_s": 5}
            )
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                router.set_node_scores({"n-a": 0.95})
                task = asyncio.create_task(post(s, url, {"prompt": "x"}))
                while router.queues.waiting("mixed") == 0:
                    await asyncio.sleep(0.005)
                assert a.bodies == []
                async with s.put(url + "/admin/node-scores", json={"scores": {"n-a": 0.2}}) as resp:
                    assert resp.status == 200
                status, _, backend = await asyncio.wait_for(task, 2.0)
        assert (status, backend) == (200, "a")

    run(body())


def test_when_the_only_prefill_instance_fails_a_mixed_instance_takes_the_retry() -> None:
    async def body() -> None:
        async with (
            serve_backends(
                FakeBackend("p0", "prefill", mode="http500"), FakeBackend("d0", "decode"), FakeBackend("m0")
            ) as (p, d, m),
            serve_router(config(p, d, m)) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            status, raw, backend = await post(s, url, {"prompt": "x", "max_tokens": 2})
        assert (status, backend) == (200, "m0"), raw
        assert len(p.bodies) == 1 and d.bodies == []

    run(body())


def test_context_aware_router_teaches_its_output_length_predictor_from_completions() -> None:
    """The live router feeds each answer's usage.completion_tokens (with the request's prompt, model and client)
    to the context-aware policy's predictor, which then predicts from what it learned."""
    from serving.router.policies import ContextAware, RouteContext

    async def body() -> None:
        async with (
            serve_backends(FakeBackend("m0")) as (m,),
            serve_router(config(m, policy="context-aware")) as (router, url),
            aiohttp.ClientSession() as s,
        ):
            policy = router.policy
            assert isinstance(policy, ContextAware) and policy.predictor is not None
            probe = RouteContext(stage="mixed", prompt_tokens=3, model="tiny", client="c1")
            assert (
                policy.predicted_output(probe)[0] != policy.predicted_output(probe)[0]
            )  # NaN: nothing learned
            for _ in range(4):
                status, raw, _ = await post(
                    s,
                    url,
                    {"model": "tiny", "prompt": "hello", "max_tokens": 40},
                    **{"x-pdscale-client": "c1"},
                )
                assert status == 200, raw
            predicted, _threshold = policy.predicted_output(probe)
            assert predicted == pytest.approx(40.0, rel=0.3)
            assert policy.predictor.mean_output_tokens == pytest.approx(40.0)

    run(body())
