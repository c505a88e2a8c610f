"""Fake vLLM backends for router tests: aiohttp servers on loopback that record what they were sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from serving.router.app import Router
from serving.router.config import RouterConfig


@dataclass
class FakeBackend:
    """A backend whose behaviour a test sets: ``mode`` ok | http500 | die_mid_stream | hold.

    ``hold``: requests wait until ``release`` is set (to saturate the router). ``bodies`` records each
    request's JSON body in arrival order.
    """

    name: str
    role: str = "mixed"
    mode: str = "ok"
    chunks: int = 3
    bodies: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    url: str = ""

    def text(self, body: dict[str, Any]) -> str:
        return f"{self.name}:{body.get('prompt')}:{body.get('max_tokens')}"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "http500":
            return web.json_response({"error": "boom"}, status=500)
        if self.mode == "hold":
            self.running += 1
            await self.release.wait()
            self.running -= 1
        if body.get("prompt") == "bad":
            return web.json_response({"error": {"message": "bad prompt"}}, status=400)
        if not body.get("stream"):
            doc: dict[str, Any] = {
                "choices": [{"text": self.text(body)}],
                "usage": {"completion_tokens": body.get("max_tokens", 16)},
            }
            if self.role == "prefill":
                doc["kv_transfer_params"] = {"remote_engine_id": self.name, "remote_block_ids": [7, 8]}
            return web.json_response(doc)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(self.chunks):
            piece = {"choices": [{"text": f"{self.name}-{i};"}]}
            await out.write(f"data: {json.dumps(piece)}\n\n".encode())
            await asyncio.sleep(0.001)
            if self.mode == "die_mid_stream" and i == 0:
                assert request.transport is not None
                request.transport.close()
                return out
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200 if self.mode == "ok" else 503)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        text = (
            f'vllm:num_requests_running{{model_name="tiny"}} {self.running}\n'
            'vllm:num_requests_waiting{model_name="tiny"} 0\n'
        )
        return web.Response(text=text)

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "tiny"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        return app


@asynccontextmanager
async def serve_backends(*fakes: FakeBackend) -> AsyncIterator[list[FakeBackend]]:
    servers = [TestServer(f.app(), host="127.0.0.1") for f in fakes]
    for fake, server in zip(fakes, servers, strict=True):
        await server.start_server()
        fake.url = f"http://127.0.0.1:{server.port}"
    try:
        yield list(fakes)
    finally:
        for f in fakes:
            f.release.set()
        for server in servers:
            await server.close()


@asynccontextmanager
async def serve_router(
    config: RouterConfig, router: Router | None = None
) -> AsyncIterator[tuple[Router, str]]:
    router = router or Router(config)
    server = TestServer(router.build_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield router, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def backend_doc(fake: FakeBackend, **extra: Any) -> dict[str, Any]:
    return {"id": fake.name, "url": fake.url, "role": fake.role, **extra}
