"""Routing policies, registered by name. Pure functions of a request context and backend snapshots.

Every policy first keeps the *eligible* backends: the stage's role, routable (healthy, not draining,
below its in-flight cap) and not on a node the controller scored above ``NODE_FULL`` (0.8; a node with
no fresh score is allowed: unknown is not "full"). ``None`` means nobody can take the request now: it
waits in the priority queue.

- ``least-loaded``: lowest load (polled running + waiting, at least the router's own in-flight count),
  then fewest in flight, then lowest id.
- ``context-aware`` (the seeds' policy, as ``serving/sim/router.py``): prefill/mixed prompts above 2048
  tokens go to ``long_context`` instances, shorter ones prefer the others; a decode whose predicted output
  is long goes to ``high_memory`` instances. The prediction comes from the policy's
  ``OutputLengthPredictor`` (``serving.workload.outlen``: prompt length, model, client, capped by
  ``max_tokens``; taught by :meth:`ContextAware.observe` with each completion's real length) and "long"
  means above ``long_output_tokens`` when set, else above the mean output it has observed. Until it has
  observed anything it is NaN, and the context's own ``predicted_output_tokens`` (``max_tokens``, or the
  client's mean) against ``mean_output_tokens`` decides, as before. With no such instance eligible it falls
  back to all eligible ones; least-loaded within the group.
- ``node-score``: least-loaded, but prefill prefers nodes the controller scored below ``NODE_PREFILL_OK``
  (0.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from serving.router.backends import BackendView, Role
from serving.workload.outlen import OutputLengthPredictor

LONG_CONTEXT_TOKENS = 2048
NODE_FULL = 0.8  # no new requests to a node scored above this
NODE_PREFILL_OK = 0.5  # prefill prefers nodes scored below this


@dataclass(frozen=True)
class RouteContext:
    """What a policy knows about the request being placed."""

    stage: Role  # the role the request needs now
    prompt_tokens: int
    predicted_output_tokens: float = math.nan  # NaN = unknown
    mean_output_tokens: float = math.nan  # running mean of predicted outputs; NaN = none yet
    priority: int = 1
    node_scores: Mapping[str, float] = field(default_factory=dict)  # fresh scores only, node -> [0, 1]
    max_tokens: float = math.nan  # the request's max_tokens / max_completion_tokens; NaN = not set
    client: str | None = None  # the client id header, when sent
    model: str | None = None  # the body's "model", when sent


class Policy(Protocol):
    name: str

    def choose(self, ctx: RouteContext, candidates: Sequence[BackendView]) -> str | None:
        """The id of the backend that takes the request, or None when none is eligible now."""
        ...


def eligible(ctx: RouteContext, candidates: Sequence[BackendView]) -> list[BackendView]:
    """Backends of the stage's role that are routable and not on a full node."""
    out: list[BackendView] = []
    for c in candidates:
        if c.spec.role != ctx.stage or not c.routable:
            continue
        score = ctx.node_scores.get(c.spec.node, math.nan)
        if score > NODE_FULL:  # NaN compares False: unknown is allowed
            continue
        out.append(c)
    return out


def least_loaded(group: Sequence[BackendView]) -> str | None:
    if not group:
        return None
    return min(group, key=lambda c: (c.load, c.in_flight, c.id)).id


def _prefer(group: list[BackendView], keep: Callable[[BackendView], bool]) -> list[BackendView]:
    preferred = [c for c in group if keep(c)]
    return preferred or group


class LeastLoaded:
    name = "least-loaded"

    def choose(self, ctx: RouteContext, candidates: Sequence[BackendView]) -> str | None:
        return least_loaded(eligible(ctx, candidates))


class ContextAware:
    name = "context-aware"

    def __init__(
        self,
        long_context_tokens: int = LONG_CONTEXT_TOKENS,
        *,
        predictor: OutputLengthPredictor | None = None,
        long_output_tokens: float | None = None,
    ) -> None:
        if long_output_tokens is not None and not long_output_tokens >= 0:
            raise ValueError(f"long_output_tokens={long_output_tokens} must be >= 0 (or None: the mean)")
        self.long_context_tokens = long_context_tokens
        self.predictor = predictor
        self.long_output_tokens = long_output_tokens

    def predicted_output(self, ctx: RouteContext) -> tuple[float, float]:
        """(predicted output tokens, the "long" threshold) for ``ctx``; NaN in either = not known long."""
        if self.predictor is not None:
            predicted = self.predictor.predict(
                ctx.prompt_tokens, model=ctx.model, client=ctx.client, max_tokens=ctx.max_tokens
            )
            if not math.isnan(predicted):
                mean = self.predictor.mean_output_tokens
                return predicted, mean if self.long_output_tokens is None else self.long_output_tokens
        if self.long_output_tokens is not None:
            return ctx.predicted_output_tokens, self.long_output_tokens
        return ctx.predicted_output_tokens, ctx.mean_output_tokens

    def observe(
        self, prompt_tokens: int, output_tokens: int, *, model: str | None = None, client: str | None = None
    ) -> None:
        """A request completed with ``output_tokens`` (the answer's ``usage.completion_tokens``)."""
        if self.predictor is not None:
            self.predictor.observe(prompt_tokens, output_tokens, model=model, client=client)

    def choose(self, ctx: RouteContext, candidates: Sequence[BackendView]) -> str | None:
        group = eligible(ctx, candidates)
        if ctx.stage == "decode":
            predicted, threshold = self.predicted_output(ctx)
            want = predicted > threshold  # NaN on either side: not known to be long
            return least_loaded(_prefer(group, lambda c: c.spec.high_memory == want))
        want = ctx.prompt_tokens > self.long_context_tokens
        return least_loaded(_prefer(group, lambda c: c.spec.long_context == want))


class NodeScore:
    name = "node-score"

    def choose(self, ctx: RouteContext, candidates: Sequence[BackendView]) -> str | None:
        group = eligible(ctx, candidates)
        if ctx.stage == "prefill":
            group = _prefer(group, lambda c: ctx.node_scores.get(c.spec.node, math.nan) < NODE_PREFILL_OK)
        return least_loaded(group)


_REGISTRY: dict[str, Callable[[], Policy]] = {
    "least-loaded": LeastLoaded,
    "context-aware": lambda: ContextAware(predictor=OutputLengthPredictor()),
    "node-score": NodeScore,
}


def register_policy(name: str, factory: Callable[[], Policy]) -> None:
    """Add a routing policy under ``name`` (a later registration under the same name replaces it)."""
    _REGISTRY[name] = factory


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_policy(name: str) -> Policy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}: registered are {policy_names()}") from None
    return factory()
