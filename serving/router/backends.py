"""The router's view of its backends: specs, live state, the registry the admin API edits.

A backend is one vLLM OpenAI server (``mixed``, ``prefill`` or ``decode``). The registry tracks what the
router knows itself (requests in flight, health, draining) and what it polls from the backend's
``/metrics`` (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``; NaN until a poll answers:
unknown, never zero). Policies see immutable ``BackendView`` snapshots only.

Removal drains: a removed backend takes no new request, its in-flight requests finish, then it is
forgotten (``wait_drained`` returns). No I/O happens here; the HTTP side lives in ``app.py``.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

Role = Literal["mixed", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("mixed", "prefill", "decode")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True)
class BackendSpec:
    """One backend as the controller or the config file declares it.

    ``long_context``: a prefill instance meant for prompts above 2048 tokens (context-aware policy);
    ``high_memory``: a decode instance meant for long outputs. ``max_in_flight``: requests the router
    sends it at once; beyond that requests queue by priority (QoS).
    """

    id: str
    url: str  # http://host:port, no trailing slash, no /v1
    role: Role = "mixed"
    node: str = ""
    long_context: bool = False
    high_memory: bool = False
    max_in_flight: int = 64

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"BackendSpec.id: {self.id!r} must match {_ID.pattern}")
        if not self.url.startswith(("http://", "https://")) or self.url.endswith("/"):
            raise ValueError(
                f"BackendSpec.url: {self.url!r} must be http(s)://host:port without a trailing /"
            )
        if self.role not in ROLES:
            raise ValueError(f"BackendSpec.role: {self.role!r} is not one of {ROLES}")
        if self.max_in_flight < 1:
            raise ValueError(f"BackendSpec.max_in_flight: must be >= 1, got {self.max_in_flight}")


@dataclass(frozen=True)
class BackendView:
    """A snapshot of one backend for a routing policy (pure data)."""

    spec: BackendSpec
    in_flight: int = 0
    running: float = math.nan  # polled vllm:num_requests_running; NaN = unknown
    waiting: float = math.nan  # polled vllm:num_requests_waiting; NaN = unknown
    healthy: bool = True
    draining: bool = False

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def load(self) -> float:
        """Requests on the backend: the polled running + waiting when known (it sees other clients too),
        never less than what this router has in flight there."""
        polled = self.running + self.waiting
        return float(self.in_flight) if math.isnan(polled) else max(float(self.in_flight), polled)

    @property
    def has_room(self) -> bool:
        return self.in_flight < self.spec.max_in_flight

    @property
    def routable(self) -> bool:
        """May take a new request now: healthy, not draining, below its in-flight cap."""
        return self.healthy and not self.draining and self.has_room


@dataclass
class _State:
    spec: BackendSpec
    in_flight: int = 0
    running: float = math.nan
    waiting: float = math.nan
    healthy: bool = True
    draining: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> BackendView:
        return BackendView(self.spec, self.in_flight, self.running, self.waiting, self.healthy, self.draining)


class BackendError(ValueError):
    """An admin request the registry refuses (unknown id, duplicate id); the message says which."""


UnhealthyHook = Callable[[BackendSpec, str], None]


class BackendRegistry:
    """The live set of backends. Single-threaded: call from the router's event loop only.

    ``on_unhealthy(spec, reason)`` is called once each time a backend goes from healthy to unhealthy
    (the pool manager restarts it there: self-healing); ``on_change()`` after every state change that
    may let a queued request proceed (a slot freed, a backend added or healed).
    """

    def __init__(
        self,
        specs: Iterable[BackendSpec] = (),
        *,
        on_unhealthy: UnhealthyHook | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._states: dict[str, _State] = {}
        self.on_unhealthy = on_unhealthy
        self.on_change = on_change
        for spec in specs:
            self.add(spec)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def add(self, spec: BackendSpec) -> None:
        """Register a backend; re-adding a draining backend with the same spec cancels its drain."""
        old = self._states.get(spec.id)
        if old is not None:
            if old.draining and old.spec == spec:
                old.draining = False
                self._changed()
                return
            raise BackendError(f"backend {spec.id!r} already exists ({old.spec.url}, {old.spec.role})")
        self._states[spec.id] = _State(spec)
        self._changed()

    def remove(self, backend_id: str) -> asyncio.Event:
        """Start draining ``backend_id``; the returned event is set once its last request finished."""
        state = self._get(backend_id)
        state.draining = True
        self._forget_if_drained(state)
        return state.drained

    def _forget_if_drained(self, state: _State) -> None:
        if state.draining and state.in_flight == 0:
            self._states.pop(state.spec.id, None)
            state.drained.set()

    def _get(self, backend_id: str) -> _State:
        try:
            return self._states[backend_id]
        except KeyError:
            raise BackendError(f"no backend {backend_id!r}; known: {sorted(self._states)}") from None

    def views(self, role: Role | None = None) -> list[BackendView]:
        """Snapshots of every backend (of ``role``), draining and unhealthy ones included, by id."""
        return [s.view() for _, s in sorted(self._states.items()) if role is None or s.spec.role == role]

    def view(self, backend_id: str) -> BackendView:
        return self._get(backend_id).view()

    def spec(self, backend_id: str) -> BackendSpec:
        return self._get(backend_id).spec

    def roles(self) -> tuple[set[Role], set[Role]]:
        """Roles of the backends not draining: ``(of the healthy ones, of all of them)``."""
        healthy: set[Role] = set()
        known: set[Role] = set()
        for s in self._states.values():
            if not s.draining:
                known.add(s.spec.role)
                if s.healthy:
                    healthy.add(s.spec.role)
        return healthy, known

    def acquire(self, backend_id: str) -> None:
        """Count one more request in flight on ``backend_id`` (the policy just picked it)."""
        state = self._get(backend_id)
        if not state.view().routable:
            raise BackendError(f"backend {backend_id!r} is not routable (healthy/draining/full)")
        state.in_flight += 1

    def release(self, backend_id: str) -> None:
        """One request on ``backend_id`` finished (whatever its outcome)."""
        state = self._states.get(backend_id)
        if state is None:  # cannot happen: a backend with requests in flight is never forgotten
            raise BackendError(f"release: no backend {backend_id!r}")
        state.in_flight -= 1
        self._forget_if_drained(state)
        self._changed()

    def mark_unhealthy(self, backend_id: str, reason: str) -> None:
        state = self._states.get(backend_id)
        if state is None or not state.healthy:
            return
        state.healthy = False
        state.running = state.waiting = math.nan
        if self.on_unhealthy is not None:
            self.on_unhealthy(state.spec, reason)

    def mark_healthy(self, backend_id: str) -> None:
        state = self._states.get(backend_id)
        if state is not None and not state.healthy:
            state.healthy = True
            self._changed()

    def set_polled(self, backend_id: str, running: float, waiting: float) -> None:
        """Record one ``/metrics`` poll (NaN for a gauge the page lacked)."""
        state = self._states.get(backend_id)
        if state is not None:
            state.running, state.waiting = running, waiting


_LOAD_LINES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "# TYPE vllm:num_requests_",
    "# HELP vllm:num_requests_",
)


def parse_vllm_load(text: str) -> tuple[float, float]:
    """``(running, waiting)`` summed over every series on a vLLM ``/metrics`` page; NaN when absent.

    Only the two gauges' lines go through the Prometheus parser: a whole vLLM page (hundreds of histogram
    lines) took ~45 ms to parse, a stall of the router's event loop at every poll.
    """
    totals = {"vllm:num_requests_running": math.nan, "vllm:num_requests_waiting": math.nan}
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_LOAD_LINES))
    for family in text_string_to_metric_families(wanted + "\n" if wanted else ""):
        for sample in family.samples:
            if sample.name in totals:
                prior = totals[sample.name]
                totals[sample.name] = sample.value if math.isnan(prior) else prior + sample.value
    return totals["vllm:num_requests_running"], totals["vllm:num_requests_waiting"]
