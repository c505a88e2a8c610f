"""The router: an OpenAI-compatible HTTP proxy doing the prefill/decode flow, with QoS and admin API.

Endpoints: ``POST /v1/completions`` and ``/v1/chat/completions`` (streaming or not), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (the router's own), and the controller's admin API: ``GET|POST
/admin/backends``, ``DELETE /admin/backends/{id}`` (drains; ``?wait=1`` answers once drained), ``PUT
/admin/node-scores`` (``{"scores": {node: 0..1}}``).

P/D flow (as vLLM's disaggregation proxy): when healthy prefill and decode backends exist, the request
goes to a prefill backend with ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params={"do_remote_
decode": true, "do_remote_prefill": false, ...}``; the ``kv_transfer_params`` of its answer are put into the
original request, which goes to a decode backend and streams back. Otherwise a mixed backend serves it.

Failures: a connection error, timeout or 5xx from a backend marks it unhealthy (``on_unhealthy`` hook;
probed on ``/health`` until it heals) and, while nothing reached the client, the request is tried again on
another backend (``max_attempts`` in all); once bytes were streamed, the client gets an SSE error event.
4xx answers are the client's problem and pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from serving.router.backends import BackendError, BackendRegistry, Role, UnhealthyHook, parse_vllm_load
from serving.router.config import BackendModel, RouterConfig
from serving.router.metrics import RouterMetrics
from serving.router.policies import ContextAware, RouteContext, make_policy
from serving.router.qos import (
    CLASS_NAMES,
    CLIENT_HEADER,
    PRIORITY_HEADER,
    AdmissionQueues,
    QosError,
    QueueFull,
    QueueTimeout,
    parse_priority,
)

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
CHARS_PER_TOKEN = 4.0  # prompt length estimate for text prompts (the router does not tokenize)
_MAX_CLIENTS = 100_000  # per-client output means kept; the table is reset beyond it
_log = logging.getLogger(__name__)


class BackendFailed(Exception):
    """A backend failed a request before the client saw any byte of it."""

    def __init__(self, backend_id: str, kind: str, message: str) -> None:
        super().__init__(f"backend {backend_id}: {kind}: {message}")
        self.backend_id, self.kind = backend_id, kind


@dataclass
class _Timing:
    start: float
    outside_s: float = 0.0  # queue waits and backend time: not the router's overhead


@dataclass(frozen=True)
class _Body:
    """A client's JSON body, with its original bytes while unchanged (forwarded as they came)."""

    doc: dict[str, Any]
    raw: bytes | None


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request a prefill backend gets: one token, not streamed, asked to keep its KV for a decode."""
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return out


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Prompt tokens: exact for token-id prompts, ``chars / 4`` for text and chat messages."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    chars = 0
    if isinstance(prompt, str):
        chars = len(prompt)
    elif isinstance(prompt, list):
        chars = sum(len(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 0 for p in prompt)
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
    return math.ceil(chars / CHARS_PER_TOKEN)


def requested_output_tokens(body: Mapping[str, Any]) -> float:
    """``max_completion_tokens`` or ``max_tokens`` when the client set one; NaN otherwise."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return float(value)
    return math.nan


def usage_completion_tokens(chunk: bytes) -> int | None:
    """``usage.completion_tokens`` from a JSON answer or the SSE lines of a stream chunk, if present."""
    if b'"completion_tokens"' not in chunk:
        return None
    for raw in chunk.split(b"\n"):
        line = raw.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{"):
            continue
        try:
            usage = json.loads(line).get("usage")
        except (ValueError, AttributeError):
            continue
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            return int(usage["completion_tokens"])
    return None


def _error_json(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"object": "error", "message": message, "type": kind, "code": status}}


def _json_response(status: int, doc: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(doc, status=status, headers=headers)


ROUTER_KEY: web.AppKey[Router] = web.AppKey("router")


class Router:
    """The proxy's state and handlers. ``build_app()`` gives the aiohttp application.

    ``clock`` (seconds, monotonic) times node-score freshness and the proxy overhead; inject one in tests.
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        on_unhealthy: UnhealthyHook | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = RouterMetrics(config.pool)
        self.policy = make_policy(config.policy)
        self.queues = AdmissionQueues(config.max_queue)
        self.registry = BackendRegistry(
            (b.spec() for b in config.backends), on_unhealthy=self._unhealthy, on_change=self.queues.wake
        )
        self.on_unhealthy = on_unhealthy
        self._scores: dict[str, tuple[float, float]] = {}  # node -> (score, set at)
        self._client_out: dict[str, tuple[float, int]] = {}  # client -> (sum, n) of completion tokens
        self._pred_sum, self._pred_n = 0.0, 0
        self._session: aiohttp.ClientSession | None = None
        self._id_prefix, self._ids = uuid.uuid4().hex[:16], itertools.count()
        self._arrival_turn = itertools.count()

    # ----------------------------------------------------------------- state
    def _unhealthy(self, spec: Any, reason: str) -> None:
        if self.on_unhealthy is not None:
            self.on_unhealthy(spec, reason)

    def set_node_scores(self, scores: Mapping[str, float]) -> None:
        """The controller's node scores in [0, 1] (fraction busy); replaces the scores of these nodes."""
        now = self.clock()
        for node, score in scores.items():
            self._scores[node] = (float(score), now)
        self.queues.wake()

    def node_scores(self) -> dict[str, float]:
        """Scores younger than ``node_score_ttl_s``; older ones are unknown (left out)."""
        now = self.clock()
        ttl = self.config.node_score_ttl_s
        return {n: s for n, (s, t) in self._scores.items() if now - t <= ttl}

    def mode(self) -> str | None:
        """``pd`` when a prefill and a decode backend can serve, else ``mixed``, else None (no backends).

        Healthy backends decide first; with none healthy, registered ones do (the request then waits).
        """
        for roles in self.registry.roles():
            if {"prefill", "decode"} <= roles:
                return "pd"
            if "mixed" in roles:
                return "mixed"
        return None

    def predicted_output(self, body: Mapping[str, Any], client: str | None) -> float:
        predicted = requested_output_tokens(body)
        if math.isnan(predicted) and client is not None and client in self._client_out:
            total, n = self._client_out[client]
            predicted = total / n
        return predicted

    def _learns(self, ctx: RouteContext) -> bool:
        """Whether a completion's output length teaches anything: a per-client mean or the policy's
        predictor. Otherwise the answer is relayed without parsing it."""
        return ctx.client is not None or isinstance(self.policy, ContextAware)

    def _observe_output(self, ctx: RouteContext, tokens: int | None) -> None:
        """A request finished with ``tokens`` output tokens: teach the per-client means and the policy's
        output-length predictor (the context-aware policy's), if it has one."""
        if tokens is None:
            return
        if isinstance(self.policy, ContextAware):
            self.policy.observe(ctx.prompt_tokens, tokens, model=ctx.model, client=ctx.client)
        client = ctx.client
        if client is None:
            return
        if len(self._client_out) >= _MAX_CLIENTS and client not in self._client_out:
            self._client_out.clear()
        total, n = self._client_out.get(client, (0.0, 0))
        self._client_out[client] = (total + tokens, n + 1)

    def _new_request_id(self) -> str:
        """A request id unique to this router (random per router, then counted): no urandom per request."""
        return f"{self._id_prefix}{next(self._ids):016x}"

    # ----------------------------------------------------------------- backend calls
    def _pick(self, ctx: RouteContext) -> str | None:
        if self._scores:  # scores as they are now: a queued request must see the controller's updates
            ctx = replace(ctx, node_scores=self.node_scores())
        chosen = self.policy.choose(ctx, self.registry.views(ctx.stage))
        if chosen is not None:
            self.registry.acquire(chosen)
        return chosen

    def _count_arrival(self, backend_id: str, ctx: RouteContext) -> None:
        """``pdscale:router_requests_total`` (and, where requests enter the pool, the prompt tokens) on
        ``backend_id`` for a request arriving at ``ctx.stage``."""
        spec = self.registry.spec(backend_id)
        m = self.metrics
        m.child(m.backend_requests, spec.id, spec.role, spec.node).inc()
        if spec.role != "decode":  # where requests enter the pool: their prompt demand, counted at arrival
            m.child(m.backend_prompt_tokens, spec.id, spec.role, spec.node).inc(max(0, ctx.prompt_tokens))

    def _arrival_backend(self, stage: Role) -> str | None:
        """The backend a request that must queue at ``stage`` is counted on as it arrives: the stage's
        serving backends (healthy and not draining; else any of the stage) in turn, so the counts spread
        over them. None when the stage has no backend."""
        views = self.registry.views(stage)
        serving = [v for v in views if v.healthy and not v.draining] or views
        return serving[next(self._arrival_turn) % len(serving)].id if serving else None

    async def _admit(self, ctx: RouteContext, timing: _Timing, *, arrival: bool) -> str:
        """A backend slot at ``ctx.stage`` (waiting in the stage's queue if none is free).

        ``arrival``: this is the request's arrival at the stage, counted by ``pdscale:router_requests_total``
        (and the prompt tokens) as it arrives: on the backend that takes it at once or, when it must queue,
        at once on one of the stage's backends (``_arrival_backend``), so the arrival rate the controller
        reads is not capped at what the busy fleet dispatches. Retries are not arrivals. Every dispatch
        counts in ``pdscale:router_dispatched_total`` on the backend that takes the request."""
        counted = not arrival

        def on_wait() -> None:
            nonlocal counted
            backend = self._arrival_backend(ctx.stage)
            if backend is not None:
                self._count_arrival(backend, ctx)
                counted = True

        t = self.clock()
        backend_id = await self.queues.admit(
            ctx.stage,
            ctx.priority,
            lambda: self._pick(ctx),
            self.config.queue_timeout_s,
            self.registry.release,
            on_wait if arrival else None,
        )
        waited = self.clock() - t
        timing.outside_s += waited
        m = self.metrics
        if waited > 0.0005:
            m.child(m.queue_wait, ctx.stage, CLASS_NAMES[ctx.priority]).observe(waited)
        if not counted:
            self._count_arrival(backend_id, ctx)
        spec = self.registry.spec(backend_id)
        m.child(m.dispatched, spec.id, spec.role, spec.node).inc()
        return backend_id

    def _failed(self, backend_id: str, kind: str, message: str) -> BackendFailed:
        self.metrics.backend_errors.labels(backend_id, kind).inc()
        self.registry.mark_unhealthy(backend_id, f"{kind}: {message}")
        return BackendFailed(backend_id, kind, message)

    async def _send(
        self, backend_id: str, path: str, body: _Body, headers: Mapping[str, str], timing: _Timing
    ) -> aiohttp.ClientResponse:
        """POST to a backend; the response once its headers are in. 5xx and I/O errors: BackendFailed."""
        assert self._session is not None, "Router.build_app() must be running"
        url = self.registry.spec(backend_id).url + path
        data = body.raw if body.raw is not None else json.dumps(body.doc).encode()
        t = self.clock()
        try:
            resp = await self._session.post(
                url, data=data, headers={**headers, "Content-Type": "application/json"}
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._failed(backend_id, "connect", repr(err)) from None
        finally:
            timing.outside_s += self.clock() - t
        if resp.status >= 500:
            text = ""
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                text = (await resp.read())[:300].decode(errors="replace")
            resp.release()
            raise self._failed(backend_id, f"http_{resp.status}", text)
        return resp

    async def _read(self, backend_id: str, resp: aiohttp.ClientResponse, timing: _Timing) -> bytes:
        t = self.clock()
        try:
            return await resp.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._failed(backend_id, "read", repr(err)) from None
        finally:
            timing.outside_s += self.clock() - t

    async def _prefill(
        self,
        ctx: RouteContext,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        timing: _Timing,
        *,
        arrival: bool,
    ) -> tuple[dict[str, Any] | None, web.Response | None]:
        """Run the prefill step; ``(kv_transfer_params, None)``, or ``(None, response)`` for a 4xx."""
        backend_id = await self._admit(ctx, timing, arrival=arrival)
        try:
            resp = await self._send(backend_id, path, _Body(prefill_body(body), None), headers, timing)
            data = await self._read(backend_id, resp, timing)
            if resp.status >= 400:
                return None, web.Response(body=data, status=resp.status, content_type="application/json")
            try:
                params = json.loads(data).get("kv_transfer_params")
            except (ValueError, AttributeError):
                raise self._failed(backend_id, "bad_prefill", data[:200].decode(errors="replace")) from None
            return (params if isinstance(params, dict) else None), None
        finally:
            self.registry.release(backend_id)

    # ----------------------------------------------------------------- the proxy handler
    async def _proxy(self, request: web.Request, path: str, endpoint: str) -> web.StreamResponse:
        timing = _Timing(self.clock())
        try:
            priority = parse_priority(request.headers.get(PRIORITY_HEADER))
        except QosError as err:
            return _json_response(400, _error_json(str(err), "invalid_request_error", 400))
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            message = "request body: expected a JSON object"
            return _json_response(400, _error_json(message, "invalid_request_error", 400))
        cls = CLASS_NAMES[priority]
        mode = self.mode()
        if mode is None:
            self.metrics.client_requests.labels(cls, "none", endpoint, "503").inc()
            message = "no backends registered (POST /admin/backends or the config's backends)"
            return _json_response(503, _error_json(message, "service_unavailable", 503))
        client = request.headers.get(CLIENT_HEADER)
        predicted = self.predicted_output(body, client)
        if not math.isnan(predicted):
            self._pred_sum, self._pred_n = self._pred_sum + predicted, self._pred_n + 1
        base = RouteContext(
            stage="mixed",
            prompt_tokens=estimate_prompt_tokens(body),
            predicted_output_tokens=predicted,
            mean_output_tokens=self._pred_sum / self._pred_n if self._pred_n else math.nan,
            priority=priority,
            node_scores=self.node_scores() if self._scores else {},
            max_tokens=requested_output_tokens(body),
            client=client,
            model=model if isinstance(model := body.get("model"), str) else None,
        )
        headers = {"X-Request-Id": request.headers.get("X-Request-Id") or self._new_request_id()}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        response = await self._attempts(request, path, _Body(body, raw), base, mode, headers, timing, client)
        m = self.metrics
        m.child(m.client_requests, cls, mode, endpoint, str(response.status)).inc()
        return response

    async def _attempts(
        self,
        request: web.Request,
        path: str,
        body: _Body,
        base: RouteContext,
        mode: str,
        headers: Mapping[str, str],
        timing: _Timing,
        client: str | None,
    ) -> web.StreamResponse:
        last = ""
        for attempt in range(self.config.max_attempts):
            stage: Role = "mixed"
            if attempt:
                self.metrics.retries.labels(mode).inc()
                mode = self.mode() or mode  # e.g. every prefill instance failed: mixed ones may serve
            try:
                out_body = body
                if mode == "pd":
                    kv, refused = await self._prefill(
                        _stage(base, "prefill"), path, body.doc, headers, timing, arrival=not attempt
                    )
                    if refused is not None:
                        return refused
                    if kv is not None:
                        out_body = _Body({**body.doc, "kv_transfer_params": kv}, None)
                    stage = "decode"
                # the request arrives at decode when prefilled (counted there per dispatch, as before),
                # at mixed on its first attempt only
                arrival = stage == "decode" or not attempt
                return await self._serve(
                    request, path, out_body, _stage(base, stage), headers, timing, client, arrival=arrival
                )
            except BackendFailed as err:
                last = str(err)
            except (QueueTimeout, QueueFull) as err:
                return _json_response(503, _error_json(str(err), "service_unavailable", 503))
        message = f"all {self.config.max_attempts} attempts failed; last: {last}"
        return _json_response(502, _error_json(message, "bad_gateway", 502))

    async def _serve(
        self,
        request: web.Request,
        path: str,
        body: _Body,
        ctx: RouteContext,
        headers: Mapping[str, str],
        timing: _Timing,
        client: str | None,
        *,
        arrival: bool,
    ) -> web.StreamResponse:
        """Send to a decode or mixed backend and relay the answer (streamed when the client asked)."""
        backend_id = await self._admit(ctx, timing, arrival=arrival)
        try:
            resp = await self._send(backend_id, path, body, headers, timing)
            try:
                out_headers = {"x-pdscale-backend": backend_id}
                if resp.status >= 400 or not body.doc.get("stream"):
                    data = await self._read(backend_id, resp, timing)
                    if resp.status < 400 and self._learns(ctx):  # else no need to parse the answer
                        self._observe_output(ctx, usage_completion_tokens(data))
                    self._record_overhead(ctx, timing)
                    ctype = resp.content_type or "application/json"
                    return web.Response(
                        body=data, status=resp.status, content_type=ctype, headers=out_headers
                    )
                return await self._relay(request, backend_id, resp, ctx, timing, client, out_headers)
            finally:
                resp.release()
        finally:
            self.registry.release(backend_id)

    async def _relay(
        self,
        request: web.Request,
        backend_id: str,
        resp: aiohttp.ClientResponse,
        ctx: RouteContext,
        timing: _Timing,
        client: str | None,
        out_headers: dict[str, str],
    ) -> web.StreamResponse:
        t = self.clock()
        try:
            first = await resp.content.readany()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._failed(backend_id, "read", repr(err)) from None
        finally:
            timing.outside_s += self.clock() - t
        if not first:
            raise self._failed(backend_id, "empty_stream", "stream ended before its first byte")
        out = web.StreamResponse(status=resp.status, headers=out_headers)
        out.content_type = resp.content_type or "text/event-stream"
        await out.prepare(request)
        await out.write(first)
        self._record_overhead(ctx, timing)
        tokens = usage_completion_tokens(first)
        while True:
            try:
                chunk = await resp.content.readany()
            except (aiohttp.ClientError, TimeoutError) as err:
                self._failed(backend_id, "stream", repr(err))
                event = _error_json(f"backend {backend_id} failed mid-stream: {err!r}", "backend_error", 502)
                with contextlib.suppress(ConnectionError):
                    await out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                break
            if not chunk:
                break
            found = usage_completion_tokens(chunk)
            tokens = found if found is not None else tokens
            try:
                await out.write(chunk)
            except ConnectionError:  # the client went away: not the backend's fault
                return out
        self._observe_output(ctx, tokens)
        with contextlib.suppress(ConnectionError):
            await out.write_eof()
        return out

    def _record_overhead(self, ctx: RouteContext, timing: _Timing) -> None:
        spent = self.clock() - timing.start - timing.outside_s
        m = self.metrics
        m.child(m.overhead, "mixed" if ctx.stage == "mixed" else "pd").observe(max(spent, 0.0))

    # ----------------------------------------------------------------- other endpoints
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/completions", "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/chat/completions", "chat.completions")

    async def models(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        for view in self.registry.views():
            if view.healthy and not view.draining:
                try:
                    timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
                    async with self._session.get(view.spec.url + "/v1/models", timeout=timeout) as resp:
                        if resp.status == 200:
                            return web.Response(body=await resp.read(), content_type="application/json")
                except (aiohttp.ClientError, TimeoutError):
                    continue
        return _json_response(503, _error_json("no healthy backend answered /v1/models", "unavailable", 503))

    async def health(self, request: web.Request) -> web.StreamResponse:
        views = self.registry.views()
        healthy = {r: sum(1 for v in views if v.spec.role == r and v.healthy and not v.draining) for r in
                   ("mixed", "prefill", "decode")}  # fmt: skip
        ok = healthy["mixed"] > 0 or (healthy["prefill"] > 0 and healthy["decode"] > 0)
        return _json_response(200 if ok else 503, {"ok": ok, "healthy": healthy, "backends": len(views)})

    async def metrics_page(self, request: web.Request) -> web.StreamResponse:
        m = self.metrics
        m.queue_length.clear()
        for (stage, prio), n in self.queues.lengths().items():
            m.queue_length.labels(stage, CLASS_NAMES[prio]).set(n)
        m.in_flight.clear()
        for v in self.registry.views():
            m.in_flight.labels(v.id, v.spec.role).set(v.in_flight)
        return web.Response(
            body=m.page(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    # ----------------------------------------------------------------- admin API
    def _check_admin(self, request: web.Request) -> web.Response | None:
        token = self.config.admin_token
        if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
            return _json_response(401, {"error": "admin API: missing or wrong 'Authorization: Bearer' token"})
        return None

    async def list_backends(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_admin(request)) is not None:
            return denied
        return _json_response(200, {"backends": [_view_doc(v) for v in self.registry.views()]})

    async def add_backend(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_admin(request)) is not None:
            return denied
        try:
            model = BackendModel.model_validate_json(await request.read())
            self.registry.add(model.spec())
        except ValidationError as err:
            fields = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
            return _json_response(400, {"error": "POST /admin/backends: " + "; ".join(fields)})
        except BackendError as err:
            return _json_response(409, {"error": str(err)})
        return _json_response(201, _view_doc(self.registry.view(model.id)))

    async def remove_backend(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_admin(request)) is not None:
            return denied
        backend_id = request.match_info["backend_id"]
        try:
            in_flight = self.registry.view(backend_id).in_flight
            drained = self.registry.remove(backend_id)
        except BackendError as err:
            return _json_response(404, {"error": str(err)})
        if request.query.get("wait", "") in ("1", "true", "yes"):
            await drained.wait()
            return _json_response(200, {"removed": backend_id})
        return _json_response(202, {"draining": backend_id, "in_flight": in_flight})

    async def put_node_scores(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_admin(request)) is not None:
            return denied
        try:
            doc = json.loads(await request.read())
            scores = doc["scores"]
            bad = [n for n, s in scores.items() if not isinstance(s, int | float) or not 0.0 <= s <= 1.0]
        except (ValueError, KeyError, TypeError, AttributeError):
            return _json_response(
                400, {"error": 'PUT /admin/node-scores: expected {"scores": {node: number}}'}
            )
        if bad:
            return _json_response(400, {"error": f"PUT /admin/node-scores: scores of {bad} not in [0, 1]"})
        self.set_node_scores(scores)
        return _json_response(200, {"scores": self.node_scores()})

    # ----------------------------------------------------------------- background loops
    async def _poll_loop(self) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.config.poll_interval_s))
        while True:
            views = [v for v in self.registry.views() if v.healthy]
            await asyncio.gather(*(self._poll_one(v.id, v.spec.url, timeout) for v in views))
            await asyncio.sleep(self.config.poll_interval_s)

    async def _guarded(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Keep a background loop alive: log an unexpected error, count it, start the loop again."""
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("router background loop %s failed; restarting it in 1 s", loop.__name__)
                self.metrics.backend_errors.labels("", "background_loop").inc()
                await asyncio.sleep(1.0)

    async def _poll_one(self, backend_id: str, url: str, timeout: aiohttp.ClientTimeout) -> None:
        assert self._session is not None
        try:
            async with self._session.get(url + "/metrics", timeout=timeout) as resp:
                text = await resp.text() if resp.status == 200 else ""
            running, waiting = parse_vllm_load(text)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            running = waiting = math.nan  # unknown, not idle
        self.registry.set_polled(backend_id, running, waiting)

    async def _heal_loop(self) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.config.health_interval_s))
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            self.queues.wake()  # node scores may have aged out: queued requests may fit now
            for view in self.registry.views():
                if view.healthy:
                    continue
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self._session.get(view.spec.url + "/health", timeout=timeout) as resp:
                        if resp.status == 200:
                            self.registry.mark_healthy(view.id)

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(
            total=self.config.request_timeout_s, sock_connect=self.config.connect_timeout_s
        )
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        )
        tasks = [asyncio.create_task(self._guarded(self._heal_loop))]
        if self.config.poll_interval_s > 0:
            tasks.append(asyncio.create_task(self._guarded(self._poll_loop)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._session.close()
            self._session = None

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[ROUTER_KEY] = self
        app.cleanup_ctx.append(self._lifecycle)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/admin/backends", self.list_backends)
        app.router.add_post("/admin/backends", self.add_backend)
        app.router.add_delete("/admin/backends/{backend_id}", self.remove_backend)
        app.router.add_put("/admin/node-scores", self.put_node_scores)
        return app


def _stage(base: RouteContext, stage: Role) -> RouteContext:
    return base if base.stage == stage else replace(base, stage=stage)


def _view_doc(v: Any) -> dict[str, Any]:
    return {
        **{k: getattr(v.spec, k) for k in ("id", "url", "role", "node", "long_context", "high_memory")},
        "max_in_flight": v.spec.max_in_flight,
        "in_flight": v.in_flight,
        "healthy": v.healthy,
        "draining": v.draining,
        "running": None if math.isnan(v.running) else v.running,
        "waiting": None if math.isnan(v.waiting) else v.waiting,
    }


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (about half the per-request cost), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _freeze_gc(app: web.Application) -> None:
    """Move what start-up allocated (modules, the app, prometheus_client, pydantic: ~56,000 objects) out of
    the collector's reach: full collections then walk only what serving allocates since."""
    gc.collect()
    gc.freeze()


def run_router(config: RouterConfig, *, on_unhealthy: UnhealthyHook | None = None) -> None:
    """Serve until interrupted (blocking)."""
    router = Router(config, on_unhealthy=on_unhealthy)
    app = router.build_app()
    app.on_startup.append(_freeze_gc)
    web.run_app(app, host=config.host, port=config.port, print=None, access_log=None, loop=new_event_loop())
