"""DrainingActuator against the real router app on loopback, with fake vLLM backends (aiohttp)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from controller.actuators.base import (
    ActuatorError,
    ActuatorUnavailable,
    ApplyResult,
    PoolReplicas,
    ReplicaBounds,
    RoleReplicas,
)
from controller.actuators.router_admin import (
    DELETION_COST_ANNOTATION,
    DrainingActuator,
    DrainSettings,
    PodDeletionCostMarker,
    RouterAdmin,
    RouterBackend,
)
from controller.policy.types import ScalingPlan
from serving.router.app import Router
from serving.router.config import RouterConfig

_T = TypeVar("_T")


class LoopThread:
    """An asyncio loop in a daemon thread, serving aiohttp apps on loopback."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[TestServer] = []

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        fut: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    def serve(self, app: web.Application) -> str:
        async def start() -> str:
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            self.servers.append(server)
            return f"http://127.0.0.1:{server.port}"

        return self.run(start())

    def close(self) -> None:
        async def stop() -> None:
            for server in reversed(self.servers):
                await server.close()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class FakeVllm:
    """Prefill answers at once with KV params; decode holds each request until ``release`` is set."""

    name: str
    release: threading.Event = field(default_factory=threading.Event)
    served: int = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("kv_transfer_params", {}).get("do_remote_decode"):
            return web.json_response(
                {"choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": self.name}}
            )
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        self.served += 1
        return web.json_response({"choices": [{"text": self.name}], "usage": {"completion_tokens": 4}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="")


@dataclass
class RecordingActuator:
    """The wrapped actuator: decode replicas as given; ``apply`` records what the router had at that moment."""

    admin: RouterAdmin
    decode: int = 2
    fail: BaseException | None = None
    seen: list[list[RouterBackend]] = field(default_factory=list)

    def current(self, pool: str) -> PoolReplicas:
        return PoolReplicas(
            pool, {"prefill": RoleReplicas(1, 1), "decode": RoleReplicas(self.decode, self.decode)}
        )

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        self.seen.append(self.admin.backends())
        if self.fail is not None:
            raise self.fail
        self.decode = plan.decode
        return ApplyResult(plan.pool, {"prefill": (plan.prefill, 0), "decode": (plan.decode, 0)})


@dataclass
class Rig:
    loop: LoopThread
    url: str
    admin: RouterAdmin
    backends: dict[str, FakeVllm]

    def post(self, prompt: str) -> Future[dict[str, Any]]:
        """A completion through the router, in a thread (it blocks while decode holds)."""
        fut: Future[dict[str, Any]] = Future()

        def go() -> None:
            req = urllib.request.Request(
                f"{self.url}/v1/completions",
                data=json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    fut.set_result({"status": resp.status, **json.loads(resp.read())})
            except Exception as exc:  # the test reads it from the future
                fut.set_exception(exc)

        threading.Thread(target=go, daemon=True).start()
        return fut

    def wait_in_flight(self, total: int) -> None:
        for _ in range(500):
            if sum(b.in_flight for b in self.admin.backends() if b.role == "decode") >= total:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"router never had {total} decode requests in flight")


@pytest.fixture
def rig() -> Iterator[Rig]:
    loop = LoopThread()
    fakes = {name: FakeVllm(name) for name in ("p0", "d0", "d1")}
    urls = {name: loop.serve(f.app()) for name, f in fakes.items()}
    backends = [
        {"id": name, "url": urls[name], "role": "prefill" if name.startswith("p") else "decode"}
        for name in fakes
    ]
    config = RouterConfig(port=0, poll_interval_s=0, backends=tuple(backends))
    router_url = loop.serve(Router(config).build_app())
    try:
        yield Rig(loop, router_url, RouterAdmin(router_url), fakes)
    finally:
        for f in fakes.values():
            f.release.set()
        loop.close()


def _plan(decode: int) -> ScalingPlan:
    return ScalingPlan(pool="chat", prefill=1, decode=decode, standby_prefill=0, standby_decode=0)


def test_scale_down_drains_the_victim_and_its_request_finishes(rig: Rig) -> None:
    first = rig.post("a")
    rig.wait_in_flight(1)
    second = rig.post("b")
    rig.wait_in_flight(2)  # least-loaded: one request on each decode backend

    def sleep(_: float) -> None:  # the first poll found the victim busy: let its request finish
        for f in rig.backends.values():
            f.release.set()
        threading.Event().wait(0.02)

    inner = RecordingActuator(rig.admin)
    actuator = DrainingActuator(inner, {"chat": rig.admin}, sleep=sleep)
    result = actuator.apply(_plan(1), ReplicaBounds())

    assert first.result(10)["status"] == 200 and second.result(10)["status"] == 200  # none failed
    at_apply = {b.id: b for b in inner.seen[0]}
    assert "d0" not in at_apply  # drained (tie on in-flight: lowest id) and gone before the scale-down
    assert not at_apply["d1"].draining
    assert inner.decode == 1
    assert any("drained ['d0']" in note for note in result.notes)
    assert rig.backends["d0"].served == 1  # its in-flight request completed on it


def test_a_failed_apply_puts_the_drained_backend_back(rig: Rig) -> None:
    inner = RecordingActuator(rig.admin, fail=ActuatorUnavailable("api server down", 3.0))
    actuator = DrainingActuator(inner, {"chat": rig.admin})
    with pytest.raises(ActuatorUnavailable, match="api server down"):
        actuator.apply(_plan(1), ReplicaBounds())
    assert "d0" not in {b.id for b in inner.seen[0]}  # it had been drained
    after = {b.id: b for b in rig.admin.backends()}
    assert set(after) == {"p0", "d0", "d1"} and not after["d0"].draining
    for f in rig.backends.values():
        f.release.set()
    assert [rig.post(p).result(10)["status"] for p in "cd"] == [200, 200]  # the router serves again


def test_drain_timeout_goes_ahead_and_says_so(rig: Rig) -> None:
    busy = [rig.post("a"), rig.post("b")]
    rig.wait_in_flight(2)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    inner = RecordingActuator(rig.admin)
    actuator = DrainingActuator(
        inner,
        {"chat": rig.admin},
        settings=DrainSettings(drain_timeout_s=5.0, poll_s=1.0),
        clock=lambda: now[0],
        sleep=sleep,
    )
    result = actuator.apply(_plan(1), ReplicaBounds())
    assert now[0] == 5.0 and inner.decode == 1
    assert any("timed out after 5 s with 1 requests in flight" in n for n in result.notes)
    assert {b.id: b.draining for b in inner.seen[0]}["d0"]
    for f in rig.backends.values():
        f.release.set()
    assert [f.result(10)["status"] for f in busy] == [200, 200]


def test_scale_up_and_unknown_pools_pass_straight_through() -> None:
    dead = RouterAdmin("http://127.0.0.1:9")  # nothing listens: any admin call would fail
    actuator = DrainingActuator(_NoList(RecordingActuator(dead)), {"chat": dead})
    assert actuator.apply(_plan(3), ReplicaBounds()).targets["decode"] == (3, 0)
    other = DrainingActuator(_NoList(RecordingActuator(dead)), {"elsewhere": dead})
    assert other.apply(_plan(1), ReplicaBounds()).targets["decode"] == (1, 0)


@dataclass
class _NoList:
    inner: RecordingActuator

    def current(self, pool: str) -> PoolReplicas:
        return self.inner.current(pool)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        self.inner.decode = plan.decode
        return ApplyResult(plan.pool, {"prefill": (plan.prefill, 0), "decode": (plan.decode, 0)})


def test_an_unreachable_router_on_scale_down_is_temporary() -> None:
    dead = RouterAdmin("http://127.0.0.1:9", timeout_s=1.0)
    inner = _NoList(RecordingActuator(dead))
    with pytest.raises(ActuatorUnavailable, match=r"router admin GET http://127\.0\.0\.1:9/admin/backends"):
        DrainingActuator(inner, {"chat": dead}).apply(_plan(1), ReplicaBounds())
    assert inner.inner.decode == 2  # nothing was scaled


def test_a_wrong_token_is_a_permanent_error() -> None:
    loop = LoopThread()
    try:
        url = loop.serve(Router(RouterConfig(port=0, poll_interval_s=0, admin_token="s3cret")).build_app())
        with pytest.raises(ActuatorError, match="HTTP 401") as err:
            RouterAdmin(url, token="wrong").backends()
        assert not isinstance(err.value, ActuatorUnavailable)
        assert RouterAdmin(url, token="s3cret").backends() == []
    finally:
        loop.close()


class FakeCore:
    """The two CoreV1Api calls the marker makes, over a list of (name, pod IP)."""

    def __init__(self, pods: list[tuple[str, str]]) -> None:
        self.pods = pods
        self.patched: list[tuple[str, str, Any]] = []
        self.selectors: list[str] = []

    def list_namespaced_pod(self, namespace: str, *, label_selector: str = "") -> Any:
        self.selectors.append(label_selector)
        items = [
            SimpleNamespace(metadata=SimpleNamespace(name=n), status=SimpleNamespace(pod_ip=ip))
            for n, ip in self.pods
        ]
        return SimpleNamespace(items=items)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any:
        self.patched.append((name, namespace, body))


def test_pod_deletion_cost_marks_the_drained_pods_by_ip() -> None:
    core = FakeCore([("chat-decode-abc", "10.0.0.5"), ("chat-decode-def", "10.0.0.6")])
    marker = PodDeletionCostMarker(core, "llm")

    def backend(id_: str, url: str) -> RouterBackend:
        return RouterBackend(id_, url, "decode", 0, True, True, {})

    notes = marker.mark(
        "chat", "decode", [backend("d0", "http://10.0.0.6:8000"), backend("d9", "http://10.9.9.9:8000")]
    )
    assert core.selectors == ["pdscale.io/pool=chat,pdscale.io/role=decode"]
    assert core.patched == [
        ("chat-decode-def", "llm", {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-1000"}}})
    ]
    assert notes == ["chat/decode: no pod with IP 10.9.9.9 for drained backend d9: not marked"]
