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
"""

from __future__ import annotations

import math
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


class Router(Protocol):
    name: str

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        """Index into ``candidates`` (non-empty, all ready) of the instance that takes the request."""
        ...


def _least_loaded(candidates: Sequence[Backend], allowed: Sequence[int] | None = None) -> int:
    """Fewest requests; ties to the lowest instance id."""
    indices = range(len(candidates)) if allowed is None else allowed
    loads = [candidates[i].load for i in indices]
    low = min(loads)
    ties = [i for i, load in zip(indices, loads, strict=True) if load == low]
    if len(ties) == 1:
        return ties[0]
    return min(ties, key=lambda i: candidates[i].instance_id)


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        n = self._next.get(request.stage, 0)
        self._next[request.stage] = n + 1
        return n % len(candidates)


class LeastLoadedRouter:
    name = "least-loaded"

    def choose(self, request: RouteRequest, candidates: Sequence[Backend]) -> int:
        return _least_loaded(candidates)


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
            return _least_loaded(candidates)
        if not group:
            group = list(range(len(candidates)))
        return _least_loaded(candidates, group)


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
