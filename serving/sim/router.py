"""Routing policies inside the simulator, registered by name (one router object per pool).

A router sees only the *ready* (active) instances of the role a request needs and returns one of them;
the simulator holds a request at the pool's router queue while no instance of that role is active.

- ``round-robin``: cycle through the ready instances.
- ``least-loaded``: fewest requests (running + waiting), ties to the lowest instance id.
- ``context-aware`` (the Block article's policy): prompts above 2048 tokens go to prefill instances
  marked fast/long-context, other prompts prefer unmarked ones; a request whose predicted output is longer
  than a threshold goes to a decode instance marked high-memory: ``long_output_tokens`` when set (e.g.
  ``register_router("context-aware", lambda: ContextAwareRouter(long_output_tokens=512))``), else the
  running mean of the predictions seen so far. The prediction is the simulator's: the trace's own
  ``output_tokens`` (an oracle) unless the simulator was given an ``OutputLengthPredictor``
  (``serving.workload.outlen``); NaN = unknown, never long. Within the preferred group it is
  least-loaded. With no marked instance ready it falls back to least-loaded over all.

The gateway queue (:class:`GatewayPolicy`, optional, per pool and role): real P/D stacks hold requests in
front of saturated servers instead of pushing them into one server's local queue, so that capacity that
comes up later (a cold start ending, a standby promoted) serves them. The Gateway API Inference Extension's
endpoint picker (used by llm-d) calls a server saturated when its ``vllm:num_requests_waiting`` exceeds a
queue-depth threshold (``DefaultQueueDepthThreshold = 5`` in ``pkg/epp/saturationdetector/config.go``) or
its KV use 0.8, and its flow control holds the excess at the gateway, dispatching it in priority order as
servers free up (llm-d's flow-control tuning guide: a small "lookahead buffer" stays in the server's own
waiting queue so the continuous batcher always has work, the rest waits at the gateway for late binding).
NVIDIA Dynamo's frontend has the same saturation signals (``--active-prefill-tokens-threshold``,
``--active-decode-blocks-threshold``) but sheds load (HTTP 529) instead of queueing. Here an instance has room
while its waiting queue is shorter than ``max_waiting`` (default 5, the extension's threshold): the
simulated server admits from its waiting queue whenever ``max_num_seqs`` and its KV blocks allow, so a
server that is KV- or sequence-bound stops draining its queue and reaches the threshold; the queue depth
thus also stands for the KV test, one step late, without a KV hook. The queue itself
(:class:`GatewayQueue`) is FCFS within a QoS class, classes in priority order; nothing is dropped.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

LONG_CONTEXT_TOKENS = 2048


class Backend(Protocol):
    """What a router may know about an instance."""

    @property
    def instance_id(self) -> str: ...
    @property
    def marked(self) -> bool: ...  # fast/long-context prefill, or high-memory decode
    @property
    def load(self) -> int: ...  # requests running + waiting


@dataclass(frozen=True)
class RouteRequest:
    """The request being placed. ``stage`` is the role needed: prefill, decode or mixed."""

    prompt_tokens: int
    predicted_output_tokens: float  # NaN = unknown
    priority: int
    stage: str


@dataclass(frozen=True)
class GatewayPolicy:
    """The gateway queue's one knob: an active instance takes a request from the gateway while its own
    waiting queue holds fewer than ``max_waiting`` requests (the lookahead its scheduler sees at a step)."""

    max_waiting: int = 5

    def __post_init__(self) -> None:
        if not (isinstance(self.max_waiting, int) and self.max_waiting >= 1):
            raise ValueError(
                f"invalid GatewayPolicy: max_waiting={self.max_waiting!r} must be an integer >= 1"
            )


class GatewayQueue:
    """Requests held at a pool's gateway for one role: FCFS within a priority class, the lowest class
    value first (tail-promoted, then VIP, normal, batch). Push and pop are O(1) (a handful of classes)."""

    def __init__(self) -> None:
        self._classes: dict[int, deque[int]] = {}
        self._order: list[int] = []  # the class values present, ascending
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def push(self, rid: int, priority: int) -> None:
        q = self._classes.get(priority)
        if q is None:
            q = self._classes[priority] = deque()
            self._order = sorted(self._classes)
        q.append(rid)
        self._n += 1

    def pop(self) -> int:
        """The head: the oldest request of the best class present."""
        for priority in self._order:
            q = self._classes[priority]
            if q:
                self._n -= 1
                return q.popleft()
        raise IndexError("pop from an empty gateway queue")

    def peek(self) -> int:
        """The head, left in place."""
        for priority in self._order:
            q = self._classes[priority]
            if q:
                return q[0]
        raise IndexError("peek at an empty gateway queue")

    def remove(self, rid: int, priority: int) -> bool:
        """Take ``rid`` out of class ``priority`` (O(class length)); False when it is not there."""
        q = self._classes.get(priority)
        if q is None or rid not in q:
            return False
        q.remove(rid)
        self._n -= 1
        return True

    def rids(self) -> list[int]:
        """Every request held, in dispatch order."""
        return [rid for priority in self._order for rid in self._classes[priority]]


class Router(Protocol):
    name: str

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        """Index into ``candidates`` (non-empty, all ready) of the instance that takes the request."""
        ...


def least_loaded(candidates: Sequence[Backend], allowed: Sequence[int] | None = None) -> int:
    """Fewest requests; ties to the lowest instance id (the first of equal ids). One pass: this runs per
    routed request."""
    best = -1
    best_load = 0
    best_id = ""
    for i in range(len(candidates)) if allowed is None else allowed:
        c = candidates[i]
        load = c.load
        if best < 0 or load < best_load or (load == best_load and c.instance_id < best_id):
            best, best_load, best_id = i, load, c.instance_id
    if best < 0:
        raise ValueError("least-loaded routing needs at least one candidate")
    return best


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        n = self._next.get(request.stage, 0)
        self._next[request.stage] = n + 1
        return n % len(candidates)


def least_loaded_in_id_order(candidates: Sequence[Backend]) -> int:
    """``least_loaded`` for candidates already in instance-id order (the simulator's ready lists, sorted by
    id): the first of the fewest requests is then the lowest id among them, so the ids need not be compared
    (one pass, run per routed request)."""
    best, best_load = 0, candidates[0].load
    for i, c in enumerate(candidates):
        if c.load < best_load:
            best, best_load = i, c.load
    return best


class LeastLoadedRouter:
    name = "least-loaded"

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        return least_loaded(candidates)


class ContextAwareRouter:
    name = "context-aware"

    def __init__(
        self, long_context_tokens: int = LONG_CONTEXT_TOKENS, long_output_tokens: float | None = None
    ) -> None:
        if long_output_tokens is not None and not long_output_tokens >= 0:
            raise ValueError(f"long_output_tokens={long_output_tokens} must be >= 0 (or None: running mean)")
        self.long_context_tokens = long_context_tokens
        self.long_output_tokens = long_output_tokens
        self._output_sum = 0.0
        self._output_n = 0

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        if request.stage == "decode":
            predicted = request.predicted_output_tokens
            threshold = self.long_output_tokens
            if threshold is None:
                threshold = self._output_sum / self._output_n if self._output_n else math.inf
                if not math.isnan(predicted):
                    self._output_sum += predicted
                    self._output_n += 1
            want_marked = predicted > threshold  # NaN: not known to be long
        else:
            want_marked = request.prompt_tokens > self.long_context_tokens
        group = [i for i, c in enumerate(candidates) if c.marked == want_marked]
        if not group and want_marked:
            return least_loaded(candidates)
        if not group:
            group = list(range(len(candidates)))
        return least_loaded(candidates, group)


_REGISTRY: dict[str, Callable[[], Router]] = {
    "round-robin": RoundRobinRouter,
    "least-loaded": LeastLoadedRouter,
    "context-aware": ContextAwareRouter,
}


def register_router(name: str, factory: Callable[[], Router]) -> None:
    """Add a routing policy under ``name`` (a later registration under the same name replaces it)."""
    _REGISTRY[name] = factory


def router_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_router(name: str) -> Router:
    """A fresh router (its own state) for one pool."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown router policy {name!r}: registered are {router_names()}") from None
    return factory()
