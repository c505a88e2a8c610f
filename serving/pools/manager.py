"""A local P/D pool: N prefill + M decode (+ mixed) real vLLM servers behind an in-process router.

``PoolManager`` owns the servers (``serving.pools.local``) and a ``serving.router.Router`` that runs on its
own event loop in a background thread. Every change keeps requests whole:

- ``scale(role, n)`` up: new servers start in parallel and are registered with the router only once their
  ``/health`` answers, so no request is sent to a server still loading.
- ``scale(role, n)`` down: the newest servers of the role are removed from the router first (drain: no new
  request, in-flight ones finish), then their process groups are stopped.
- ``heal()``: servers the router marked unhealthy (its ``on_unhealthy`` hook) whose API process died or
  whose ``/health`` fails are stopped and started again on the same port under the same id; the router's
  own health probe brings them back into rotation. ``start_healer()`` runs ``heal`` in a thread whenever
  the hook fires.

The manager's public methods are thread-safe (one lock; a scale or heal holds it while servers start,
~40-110 s on a shared 2-core box) but must not be called from the router's loop thread (the
``on_unhealthy`` hook): they run code on that loop and wait for it. The router's registry is touched only
on the router's loop thread.

Example::

    with PoolManager(PoolSettings(model_dir=build_tiny_model("out/tiny"), work_dir=Path("out/pool"))) as pool:
        url = pool.up(prefill=1, decode=1)  # http://127.0.0.1:PORT, OpenAI-compatible
        pool.scale("decode", 2)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from serving.pools.local import (
    ROLES,
    InstanceConfig,
    InstanceStartError,
    KVTransfer,
    LocalInstance,
    Role,
    free_port,
    start_instance,
)
from serving.router.app import Router
from serving.router.backends import BackendSpec
from serving.router.config import RouterConfig

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
STATE_VERSION = 1
_PREFIX: dict[Role, str] = {"prefill": "p", "decode": "d", "mixed": "m"}


@dataclass(frozen=True)
class PoolSettings:
    """How the pool's servers and router are launched.

    ``work_dir`` holds the server logs (``logs/``) and ExampleConnector's KV directory (``kv/``).
    ``router_port`` 0 picks a free port. ``state_path``: when set, a JSON file of the router and every
    server (ids, urls, pids = process-group ids) is rewritten on each change, for ``pdscale pool down``.
    """

    model_dir: Path
    work_dir: Path
    router_host: str = "127.0.0.1"
    router_port: int = 0
    policy: str = "least-loaded"
    max_num_seqs: int | None = 16
    num_gpu_blocks_override: int | None = 64
    max_model_len: int = 1024
    health_timeout_s: float = 240.0
    drain_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    max_in_flight: int = 64  # per backend, in the router
    router_poll_interval_s: float = 1.0
    router_health_interval_s: float = 1.0
    state_path: Path | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("health_timeout_s", "drain_timeout_s", "stop_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PoolSettings.{name}: must be > 0, got {getattr(self, name)}")
        if not 0 <= self.router_port <= 65535:
            raise ValueError(
                f"PoolSettings.router_port: {self.router_port} is not a TCP port (0 = free port)"
            )


@dataclass(frozen=True)
class ScaleResult:
    """What one ``scale`` call did: ids started (now serving) and ids stopped (drained first)."""

    role: Role
    before: int
    after: int
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    drain_s: float = 0.0  # longest drain wait
    start_s: float = 0.0  # seconds until the last new server answered /health


@dataclass(frozen=True)
class HealResult:
    """One restart by ``heal``: which server, why, and how long it took to answer /health again."""

    id: str
    reason: str
    restart_s: float
    healthy_at_s: float = 0.0  # the manager's clock when the restarted server first answered /health


@dataclass
class _Member:
    id: str
    instance: LocalInstance
    registered: bool = False


class RouterThread:
    """A ``Router`` serving on its own asyncio loop in a daemon thread; ``call`` runs code on that loop."""

    def __init__(self, config: RouterConfig, router: Router) -> None:
        self.config = config
        self.router = router
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="pdscale-router", daemon=True)
        self.port = 0

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; return the router's base URL."""
        self._thread.start()
        self.port = self._run(self._start(), timeout_s)
        return f"http://{self.config.host}:{self.port}"

    async def _start(self) -> int:
        self._runner = web.AppRunner(self.router.build_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        return int(self._runner.addresses[0][1])

    def _run(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None) -> _T:
        fut: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout_s)

    def call(self, fn: Callable[[], _T], timeout_s: float | None = 30.0) -> _T:
        """Run ``fn()`` on the router's loop (the registry is single-threaded) and return its result."""

        async def wrapped() -> _T:
            return fn()

        return self._run(wrapped(), timeout_s)

    def wait_event(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait (from another thread) for an event of the router's loop; False on timeout."""

        async def wait() -> bool:
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                return False
            return True

        return self._run(wait(), None)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving and end the thread. Idempotent."""
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            with contextlib.suppress(Exception):
                self._run(self._runner.cleanup(), timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


def _health_ok(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


class PoolManager:
    """Owns a local pool's vLLM servers and its router. Call ``up`` first, ``down`` at the end (or use
    ``with``: leaving the block stops everything, even on an error)."""

    def __init__(
        self,
        settings: PoolSettings,
        *,
        name: str = "local",
        starter: Callable[[InstanceConfig, Path], LocalInstance] = start_instance,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.name = name
        self._starter = starter
        self._clock = clock
        self._lock = threading.RLock()
        self._members: dict[str, _Member] = {}
        self._next: dict[Role, int] = dict.fromkeys(ROLES, 0)
        self._unhealthy: dict[str, str] = {}  # id -> reason, filled by the router's hook
        self._unhealthy_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._healer: threading.Thread | None = None
        self._router: RouterThread | None = None
        self.heal_log: list[HealResult] = []
        self.url = ""
        self.log_dir = settings.work_dir / "logs"
        self.kv = KVTransfer(shared_storage_path=settings.work_dir / "kv")

    # ----------------------------------------------------------------- reading
    @property
    def router(self) -> RouterThread:
        """The running router (``.router.registry``, ``.call(fn)`` to run code on its loop); after ``up``."""
        return self._require_router()

    def ids(self, role: Role | None = None) -> list[str]:
        """Ids of the pool's servers (of ``role``), starting or serving, oldest first."""
        with self._lock:
            return [m.id for m in self._members.values() if role is None or m.instance.role == role]

    def instance(self, member_id: str) -> LocalInstance:
        with self._lock:
            return self._members[member_id].instance

    def count(self, role: str) -> int:
        """Servers of ``role`` the pool is set to (serving, starting, or being healed)."""
        with self._lock:
            return sum(1 for m in self._members.values() if m.instance.role == role)

    def ready(self, role: str) -> int:
        """Servers of ``role`` registered with the router and healthy in its view."""
        router = self._router
        if router is None:
            return 0
        views = router.call(lambda: router.router.registry.views())
        return sum(1 for v in views if v.spec.role == role and v.healthy and not v.draining)

    def backends(self) -> list[dict[str, Any]]:
        """The router's view of every backend (the admin API's ``GET /admin/backends`` documents)."""
        router = self._require_router()
        views = router.call(lambda: router.router.registry.views())
        return [
            {"id": v.id, "role": v.spec.role, "url": v.spec.url, "in_flight": v.in_flight,
             "healthy": v.healthy, "draining": v.draining}
            for v in views
        ]  # fmt: skip

    # ----------------------------------------------------------------- lifecycle
    def up(self, prefill: int = 1, decode: int = 1, mixed: int = 0) -> str:
        """Start the router and the servers (in parallel); return the router's URL once all serve."""
        for role_name, n in (("prefill", prefill), ("decode", decode), ("mixed", mixed)):
            if n < 0:
                raise ValueError(f"PoolManager.up: {role_name}={n} must be >= 0")
        if (prefill > 0) != (decode > 0):
            raise ValueError(f"PoolManager.up: P/D needs both roles, got prefill={prefill} decode={decode}")
        with self._lock:
            if self._router is not None:
                raise RuntimeError(f"PoolManager.up: the pool is already up at {self.url}")
            if not (self.settings.model_dir / "config.json").exists():
                raise FileNotFoundError(
                    f"{self.settings.model_dir}/config.json: not a model directory (pdscale pool model DIR)"
                )
            (self.settings.work_dir / "kv").mkdir(parents=True, exist_ok=True)
            self._stopping.clear()
            self._healer = None
            config = RouterConfig(
                host=self.settings.router_host,
                port=self.settings.router_port,
                policy=self.settings.policy,
                poll_interval_s=self.settings.router_poll_interval_s,
                health_interval_s=self.settings.router_health_interval_s,
            )
            router = Router(config, on_unhealthy=self._on_unhealthy)
            self._router = RouterThread(config, router)
            try:
                self.url = self._router.start()
                self._write_state()
                self._grow({"prefill": prefill, "decode": decode, "mixed": mixed})
            except BaseException:
                self.down()
                raise
            return self.url

    def down(self) -> None:
        """Stop every server (their whole process groups) and the router. Idempotent; no drain."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            errors: list[str] = []
            for member in list(self._members.values()):
                try:
                    member.instance.stop(self.settings.stop_timeout_s)
                except RuntimeError as err:
                    errors.append(str(err))
            self._members.clear()
            if self._router is not None:
                self._router.stop()
                self._router = None
            if self.settings.state_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.settings.state_path.unlink()
        if self._healer is not None and self._healer is not threading.current_thread():
            self._healer.join(10.0)
        if errors:
            raise RuntimeError("PoolManager.down: " + "; ".join(errors))

    def __enter__(self) -> PoolManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ----------------------------------------------------------------- scaling
    def scale(self, role_name: str, n: int) -> ScaleResult:
        """Set ``role`` to ``n`` servers: start and register new ones, or drain then stop the newest."""
        if role_name not in ROLES:
            raise ValueError(f"PoolManager.scale: role {role_name!r} is not one of {ROLES}")
        role: Role = role_name
        if n < 0:
            raise ValueError(f"PoolManager.scale: {role} count {n} must be >= 0")
        with self._lock:
            self._require_router()
            before = self.count(role)
            if n > before:
                started, start_s = self._grow({role: n - before})
                return ScaleResult(role, before, n, started=started, start_s=start_s)
            if n < before:
                victims = self.ids(role)[n:][::-1]  # newest first
                stopped, drain_s = self._shrink(victims)
                return ScaleResult(role, before, n, stopped=stopped, drain_s=drain_s)
            return ScaleResult(role, before, n)

    def _config(self, role: Role, port: int | None = None) -> InstanceConfig:
        s = self.settings
        return InstanceConfig(
            model_dir=s.model_dir,
            role=role,
            port=port,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_num_seqs,
            num_gpu_blocks_override=s.num_gpu_blocks_override,
            kv_transfer=None if role == "mixed" else self.kv,
            extra_args=s.extra_args,
        )

    def _grow(self, wanted: dict[Role, int]) -> tuple[tuple[str, ...], float]:
        """Start ``wanted`` servers per role in parallel, wait for health, register the healthy ones."""
        t0 = self._clock()
        new: list[_Member] = []
        for role, k in wanted.items():
            for _ in range(k):
                member_id = f"{_PREFIX[role]}{self._next[role]}"
                self._next[role] += 1
                port = free_port(self.settings.router_host)
                member = _Member(member_id, self._starter(self._config(role, port), self.log_dir))
                self._members[member_id] = member
                new.append(member)
        self._write_state()
        failures: list[str] = []
        for member in new:
            try:
                member.instance.wait_healthy(self.settings.health_timeout_s)
            except InstanceStartError as err:
                failures.append(f"{member.id}: {err}")
                member.instance.stop(self.settings.stop_timeout_s)
                del self._members[member.id]
        start_s = self._clock() - t0
        for member in new:
            if member.id in self._members:
                self._register(member)
        self._write_state()
        if failures:
            raise InstanceStartError(
                f"pool {self.name}: {len(failures)} of {len(new)} new servers failed to start "
                "(the others serve):\n" + "\n".join(failures)
            )
        return tuple(m.id for m in new), start_s

    def _register(self, member: _Member) -> None:
        router = self._require_router()
        spec = BackendSpec(
            id=member.id,
            url=member.instance.url,
            role=member.instance.role,
            max_in_flight=self.settings.max_in_flight,
        )
        router.call(lambda: router.router.registry.add(spec))
        member.registered = True

    def _shrink(self, victims: list[str]) -> tuple[tuple[str, ...], float]:
        """Drain ``victims`` in the router (all at once), then stop each one's process group."""
        router = self._require_router()
        t0 = self._clock()
        events = {
            vid: router.call(lambda vid=vid: router.router.registry.remove(vid))  # type: ignore[misc]
            for vid in victims
            if self._members[vid].registered
        }
        undrained = []
        for vid, event in events.items():
            remaining = max(0.1, self.settings.drain_timeout_s - (self._clock() - t0))
            if not router.wait_event(event, remaining):
                undrained.append(vid)
        drain_s = self._clock() - t0
        for vid in victims:
            self._members.pop(vid).instance.stop(self.settings.stop_timeout_s)
            with self._unhealthy_lock:
                self._unhealthy.pop(vid, None)
        self._write_state()
        if undrained:
            _log.warning(
                "pool %s: %s still had requests after %.0f s of drain; stopped anyway",
                self.name, undrained, self.settings.drain_timeout_s,
            )  # fmt: skip
        return tuple(victims), drain_s

    # ----------------------------------------------------------------- healing
    def _on_unhealthy(self, spec: BackendSpec, reason: str) -> None:
        """The router's hook (runs on its loop: must not block): remember the id, wake the healer."""
        with self._unhealthy_lock:
            self._unhealthy[spec.id] = reason
        self._wake.set()

    def unhealthy(self) -> dict[str, str]:
        """Ids the router marked unhealthy since the last ``heal``, with the router's reason."""
        with self._unhealthy_lock:
            return dict(self._unhealthy)

    def heal(self) -> list[HealResult]:
        """Restart the servers the router marked unhealthy that are really down (API process exited or
        ``/health`` failing); ones that answer again are left to the router's own health probe."""
        with self._lock:
            with self._unhealthy_lock:
                marked, self._unhealthy = self._unhealthy, {}
            healed: list[HealResult] = []
            failures: list[str] = []
            for member_id, reason in sorted(marked.items()):
                member = self._members.get(member_id)
                if member is None:  # removed meanwhile
                    continue
                inst = member.instance
                if inst.is_running() and _health_ok(inst.url):
                    continue
                t0 = self._clock()
                inst.stop(self.settings.stop_timeout_s)
                config = replace(inst.config, port=inst.port)
                try:
                    restarts = sum(1 for h in self.heal_log if h.id == member_id)
                    # A fresh log directory: the dead server's log (same port, same name) is kept.
                    fresh = self._starter(config, self.log_dir / f"{member_id}-restart{restarts + 1}")
                    member.instance = fresh
                    self._write_state()
                    fresh.wait_healthy(self.settings.health_timeout_s)
                    healthy_at = self._clock()
                except InstanceStartError as err:
                    failures.append(f"{member_id}: {err}")
                    with self._unhealthy_lock:  # try again on the next heal
                        self._unhealthy.setdefault(member_id, reason)
                    continue
                healed.append(HealResult(member_id, reason, healthy_at - t0, healthy_at))
            self.heal_log.extend(healed)
            if failures:
                raise InstanceStartError(f"pool {self.name}: heal failed for " + "\n".join(failures))
            return healed

    def start_healer(self, poll_s: float = 5.0) -> None:
        """Run ``heal`` in a daemon thread whenever the router reports a server unhealthy (and every
        ``poll_s`` for earlier failures) until ``down``."""
        if self._healer is not None:
            return

        def loop() -> None:
            while not self._stopping.is_set():
                self._wake.wait(poll_s)
                self._wake.clear()
                if self._stopping.is_set():
                    return
                if self.unhealthy():
                    try:
                        for r in self.heal():
                            _log.warning("pool %s: restarted %s (%s) in %.0f s", self.name, r.id, r.reason,
                                         r.restart_s)  # fmt: skip
                    except Exception:
                        _log.exception("pool %s: heal failed; retrying in %.0f s", self.name, poll_s)

        self._healer = threading.Thread(target=loop, name="pdscale-healer", daemon=True)
        self._healer.start()

    # ----------------------------------------------------------------- state file
    def _require_router(self) -> RouterThread:
        if self._router is None:
            raise RuntimeError(f"pool {self.name} is not up (call PoolManager.up first)")
        return self._router

    def state(self) -> dict[str, Any]:
        """The state file's document: the router (this process) and every server (pid = its group)."""
        with self._lock:
            return {
                "version": STATE_VERSION,
                "pool": self.name,
                "router": {"url": self.url, "pid": os.getpid()},
                "instances": [
                    {"id": m.id, "role": m.instance.role, "url": m.instance.url, "pid": m.instance.pid,
                     "log": str(m.instance.log_path)}
                    for m in self._members.values()
                ],
            }  # fmt: skip

    def _write_state(self) -> None:
        path = self.settings.state_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.state(), indent=2) + "\n")
        tmp.replace(path)


__all__ = [
    "HealResult",
    "PoolManager",
    "PoolSettings",
    "RouterThread",
    "ScaleResult",
]
