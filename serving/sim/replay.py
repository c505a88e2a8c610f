"""Trace replay: a scaling policy drives the simulator tick by tick, as the controller drives a cluster.

A :class:`ReplayPolicy` sees, every ``tick_s`` of virtual time, a :class:`ReplayView` (the simulator's
Prometheus-like scrape, instance counts per role and state, router queues, the fleet spec) and returns
:class:`ScaleCommand` s, applied through ``Simulator.set_target`` (idempotent, clamped).

Policies are registered by name. Built in here: ``fixed`` (the counts given, held constant) and
``static-peak`` (sized once with the capacity model for the trace's peak 60-second windows and its shorter
bursts, the "meets the SLO at a high cost" baseline). The controller package registers ``reactive``, ``dynamo-like``, ``predictive``, ``oracle``
with :func:`register_policy`.

The fleet starts from the policy's first answer (at t=0) with those instances already loaded: a replay
measures scaling during the trace, not the first cold start.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from serving.sim.engine import HOLDS_GPU, ModelResolver, Simulator, TailPolicy, served_trace
from serving.sim.fleet import FleetSpec, PoolSpec
from serving.sim.report import ReplayReport, Timeline
from serving.sim.router import GatewayPolicy
from serving.sim.samples import InstanceSamples
from serving.workload.outlen import OutputLengthPredictor
from serving.workload.trace import Trace

PEAK_WINDOW_S = 60.0
# Static sizing serves (1 + headroom) x the peak window's load (the capacity model already budgets the
# P90 TTFT queueing); the margin covers burstiness inside the window.
STATIC_HEADROOM = 0.2


@dataclass(frozen=True)
class ScaleCommand:
    """Target ``active`` serving and ``standby`` warm instances of ``role`` in ``pool``."""

    pool: str
    role: str
    active: int
    standby: int = 0


@dataclass(frozen=True, eq=False)
class ReplayView:
    """What a policy may read at one tick. ``samples`` is scraped on first access only."""

    now_s: float
    fleet: FleetSpec
    counts: Mapping[str, Mapping[str, Mapping[str, int]]]  # pool -> role -> state -> instances
    pending: Mapping[str, Mapping[str, int]]  # pool -> role -> requests waiting for an active instance
    scrape: Callable[[], InstanceSamples] = field(repr=False)

    @cached_property
    def samples(self) -> InstanceSamples:
        return self.scrape()


class ReplayPolicy(Protocol):
    name: str

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None: ...

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]: ...


@dataclass(frozen=True)
class PolicyOptions:
    """What the CLI knows; a factory reads the fields it needs and rejects what it cannot use."""

    prefill: int | None = None
    decode: int | None = None
    mixed: int | None = None
    standby: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)


PolicyFactory = Callable[[PolicyOptions], ReplayPolicy]
_POLICIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make a policy available to :func:`make_policy` and ``pdscale replay --policy NAME``."""
    _POLICIES[name] = factory


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_POLICIES))


def make_policy(name: str, options: PolicyOptions | None = None) -> ReplayPolicy:
    try:
        factory = _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown replay policy {name!r}: registered are {policy_names()}") from None
    return factory(options or PolicyOptions())


# -- built-in policies ---------------------------------------------------------------------------------
class FixedPolicy:
    """Holds the given counts on every pool (re-issued every tick, so a failed instance is replaced)."""

    name = "fixed"

    def __init__(self, prefill: int | None, decode: int | None, mixed: int | None, standby: int = 0) -> None:
        self.wanted = {"prefill": prefill, "decode": decode, "mixed": mixed}
        self.standby = standby
        self._commands: list[ScaleCommand] = []

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        self._commands = []
        for pool in fleet.pools:
            for role in pool.roles:
                n = self.wanted[role]
                if n is None:
                    n = pool.role(role).initial
                self._commands.append(ScaleCommand(pool.name, role, n, self.standby))

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        return list(self._commands)


def _fixed(options: PolicyOptions) -> ReplayPolicy:
    for name in ("prefill", "decode", "mixed"):
        n = getattr(options, name)
        if n is not None and n < 0:
            raise ValueError(f"fixed policy: --{name} must be >= 0, got {n}")
    return FixedPolicy(options.prefill, options.decode, options.mixed, options.standby)


@dataclass(frozen=True)
class PeakWindow:
    """One ``window_s`` window of a trace: its request rate and mean lengths."""

    t_start_s: float
    window_s: float
    rate_rps: float
    mean_prompt_tokens: float
    mean_output_tokens: float

    @property
    def prompt_tps(self) -> float:
        return self.rate_rps * self.mean_prompt_tokens

    @property
    def generation_tps(self) -> float:
        return self.rate_rps * self.mean_output_tokens


def peak_windows(trace: Trace, window_s: float = PEAK_WINDOW_S) -> tuple[PeakWindow, PeakWindow]:
    """The windows (starting at whole seconds) with the most prompt tokens and the most generated tokens.

    Prompt tokens drive prefill capacity, generated tokens drive decode capacity; they may peak apart.
    Lengths are served as at least one token each, as the simulator does. A trace spanning fewer whole seconds
    than the window is one window of that many seconds (at least 1), as ``pdscale plan --trace`` reads it
    (``serving.sim.plan.window_loads``): 500 requests on one timestamp are 500 req/s, not 500 per 60 s.
    """
    if len(trace) == 0:
        empty = PeakWindow(0.0, window_s, 0.0, 1.0, 1.0)
        return empty, empty
    sec = np.floor(trace.arrival_s).astype(np.int64)
    n_sec = int(sec[-1]) + 1
    w = max(round(window_s), 1)
    prompt = np.maximum(trace.prompt_tokens, 1).astype(np.float64)
    output = np.maximum(trace.output_tokens, 1).astype(np.float64)

    def windowed(weights: np.ndarray | None) -> np.ndarray:
        per_s = np.bincount(sec, weights=weights, minlength=n_sec).astype(np.float64)
        c = np.concatenate([[0.0], np.cumsum(per_s)])
        hi = np.minimum(np.arange(n_sec) + w, n_sec)
        out: np.ndarray = c[hi] - c[:n_sec]
        return out

    count, prompt_sum, output_sum = windowed(None), windowed(prompt), windowed(output)

    width = min(w, n_sec)

    def at(i: int) -> PeakWindow:
        n = max(count[i], 1.0)
        return PeakWindow(float(i), float(width), count[i] / width, prompt_sum[i] / n, output_sum[i] / n)

    return at(int(np.argmax(prompt_sum))), at(int(np.argmax(output_sum)))


def static_peak_counts(
    pool: PoolSpec, trace: Trace, window_s: float = PEAK_WINDOW_S, headroom: float = STATIC_HEADROOM
) -> dict[str, int]:
    """Instances per role for the trace's peak windows, from the capacity model (serving.sim.capacity).

    Prefill is sized for the window with the most prompt tokens, decode for the window with the most
    generated tokens (each with that window's rate and mean lengths), both with ``headroom``. A colocated
    pool gets prefill + decode mixed instances (each does both jobs). A mixed-node pool gets
    ``max(prefill, decode)`` nodes sized on the node's partitioned capacities
    (``serving.sim.capacity.mixed_node_capacity``), both roles at that count. Clamped to the role's [min, max].
    Requests the simulator rejects (no instance can hold them, ``serving.sim.engine.kv_rejected``) are no load.

    Bursts shorter than the window: each role is at least what ``serving.sim.capacity.burst_floor`` says (the
    prompt tokens of a burst prefilled within the TTFT SLO but for the share of its window the TTFT quantile
    allows to wait; the decode slots of requests decoding at once), at the capacities of the peak windows.
    """
    from serving.sim.capacity import (
        PrefillCapacity,
        burst_floor,
        instances_needed,
        mixed_node_capacity,
    )
    from serving.sim.hardware import get_profile
    from serving.sim.latency import get_latency_model

    profile, model = get_profile(pool.profile), get_latency_model(pool.profile)
    trace = served_trace(pool, trace, profile)
    by_prompt, by_output = peak_windows(trace, window_s)
    caps: dict[str, Any] = {}  # role -> the capacity the peak window of that role was sized with

    def need(w: PeakWindow, role: str) -> tuple[int, int]:
        if pool.placement == "mixed-node":
            node = mixed_node_capacity(
                profile, model, pool.slo_ttft_ms, pool.slo_itl_ms, max(w.mean_prompt_tokens, 1.0),
                max(w.mean_output_tokens, 1.0), prefill_mem_frac=pool.prefill_mem_frac,
                slowdown=pool.mixed_node_slowdown,
            )  # fmt: skip
            caps[role] = node.prefill if role == "prefill" else node.decode
            load = w.rate_rps * (1.0 + headroom)
            pre_tps, dec_tps = node.prefill.tokens_per_s, node.decode.tokens_per_s
            pre_n = math.ceil(load * w.mean_prompt_tokens / pre_tps - 1e-9) if pre_tps > 0 else 10**6
            dec_n = math.ceil(load * w.mean_output_tokens / dec_tps - 1e-9) if dec_tps > 0 else 10**6
            return pre_n, dec_n
        n = instances_needed(
            profile, model, w.rate_rps, w.mean_prompt_tokens, w.mean_output_tokens,
            pool.slo_ttft_ms, pool.slo_itl_ms, headroom=headroom,
        )  # fmt: skip
        caps[role] = n.prefill_capacity if role == "prefill" else n.decode_capacity
        return n.prefill, n.decode

    n_prefill, n_decode = need(by_prompt, "prefill")[0], need(by_output, "decode")[1]
    if len(trace):
        pre_cap: PrefillCapacity = caps["prefill"]
        burst_p, burst_d = burst_floor(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, pre_cap, caps["decode"],
            pool.slo_ttft_ms, window_s=window_s,
        )  # fmt: skip
        n_prefill, n_decode = max(n_prefill, burst_p), max(n_decode, burst_d)
    if pool.placement == "mixed-node":
        n_prefill = n_decode = max(n_prefill, n_decode)
    wanted = {"prefill": n_prefill, "decode": n_decode, "mixed": n_prefill + n_decode}
    out = {}
    for role in pool.roles:
        counts = pool.role(role)
        out[role] = min(max(wanted[role], 1, counts.min), counts.max)
    return out


class StaticPeakPolicy:
    """Fixed capacity sized once for each pool's peak 60-second windows and its bursts (see
    :func:`static_peak_counts`)."""

    name = "static-peak"

    def __init__(self, window_s: float = PEAK_WINDOW_S, headroom: float = STATIC_HEADROOM) -> None:
        self.window_s = window_s
        self.headroom = headroom
        self.sizing: dict[str, dict[str, int]] = {}

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        self.sizing = {
            pool.name: static_peak_counts(pool, traces[pool.name], self.window_s, self.headroom)
            for pool in fleet.pools
            if pool.name in traces
        }

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        return [ScaleCommand(p, role, n) for p, roles in self.sizing.items() for role, n in roles.items()]


def _static_peak(options: PolicyOptions) -> ReplayPolicy:
    window_s = float(options.params.get("window_s", PEAK_WINDOW_S))
    headroom = float(options.params.get("headroom", STATIC_HEADROOM))
    return StaticPeakPolicy(window_s, headroom)


register_policy("fixed", _fixed)
register_policy("static-peak", _static_peak)


# -- the loop ------------------------------------------------------------------------------------------
def _view(sim: Simulator) -> ReplayView:
    return ReplayView(
        now_s=sim.now_s,
        fleet=sim.fleet,
        counts={p.name: sim.counts(p.name) for p in sim.fleet.pools},
        pending={p.name: sim.pending(p.name) for p in sim.fleet.pools},
        scrape=sim.observe,
    )


def _apply(sim: Simulator, commands: list[ScaleCommand], warm: bool = False) -> None:
    for c in commands:
        sim.set_target(c.pool, c.role, c.active, c.standby, warm=warm)


def replay(
    fleet: FleetSpec,
    traces: Mapping[str, Trace],
    policy: ReplayPolicy,
    *,
    tick_s: float = 1.0,
    drain: bool = True,
    drain_limit_s: float = 3600.0,
    models: ModelResolver | None = None,
    progress: Callable[[float, float], None] | None = None,
    tail: TailPolicy | None = None,
    output_predictor: OutputLengthPredictor | None = None,
    gateway: GatewayPolicy | None = None,
) -> ReplayReport:
    """Replay ``traces`` (pool name -> trace) under ``policy``; ticks every ``tick_s`` of virtual time.

    After the last arrival the replay keeps ticking until every request has completed (``drain``), for at
    most ``drain_limit_s`` more; what is still running then is reported as ``unfinished``, never dropped.
    ``progress(now_s, end_s)`` is called every tick. ``tail`` turns on tail-request promotion and
    ``output_predictor`` predicts output lengths at arrival for the router (see ``Simulator``); both off by
    default. ``gateway`` holds requests at each pool's gateway while every instance of their role is
    saturated (``serving.sim.router.GatewayPolicy``; None = off: a request is routed at once).
    """
    if tick_s <= 0:
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    wall0 = time.perf_counter()
    sim = Simulator(
        fleet, traces, models=models, tail=tail, output_predictor=output_predictor, gateway=gateway
    )
    policy.reset(fleet, sim.served_traces)  # rejected requests are no load: a policy never sees them
    _apply(sim, policy.on_tick(0.0, _view(sim)), warm=True)
    end_s = max((float(t.arrival_s[-1]) for t in sim.traces.values() if len(t)), default=0.0)
    limit_s = end_s + (drain_limit_s if drain else 0.0)
    roles = ("prefill", "decode", "mixed")
    t_s: list[float] = []
    active: dict[str, list[int]] = {r: [] for r in roles}
    holding: list[int] = []
    t = 0.0
    while True:
        t_s.append(t)
        counts = _counts(sim).values()  # once per tick, not once per role
        for role in roles:
            active[role].append(sum(c.get(role, {}).get("active", 0) for c in counts))
        holding.append(sum(1 for i in sim.instances if i.state in HOLDS_GPU))
        if progress is not None:
            progress(t, end_s)
        if t >= limit_s or (t >= end_s and (not drain or sim.unfinished() == 0)):
            break
        t = min(t + tick_s, limit_s)
        sim.run_until(t)
        _apply(sim, policy.on_tick(t, _view(sim)))
    timeline = Timeline(
        t_s=np.asarray(t_s),
        active={r: np.asarray(v, dtype=np.int64) for r, v in active.items()},
        holding_gpu=np.asarray(holding, dtype=np.int64),
    )
    report = sim.report(policy=policy.name, wall_s=time.perf_counter() - wall0, timeline=timeline)
    return replace(report, over_context=over_context(sim))


def over_context(sim: Simulator) -> int:
    """Requests served whose prompt + output exceeds their pool profile's ``max_model_len``; one warning names
    the first of them per pool (a real vLLM server would refuse them; the simulator serves them). Requests
    the simulator rejected (they fit no instance's KV cache) are not among them."""
    total = 0
    for pool in sim.pools:
        trace = sim.traces.get(pool.spec.name)
        limit = getattr(pool.profile, "max_model_len", None)  # a custom profile may not say
        if trace is None or not len(trace) or limit is None:
            continue
        limit = int(limit)
        past = trace.prompt_tokens + trace.output_tokens > limit
        over = np.flatnonzero(past & ~sim.rejected_in(pool.spec.name))
        if len(over):
            i = int(over[0])
            first = (
                f"line {int(trace.line[i])}" if trace.line is not None else f"request {i} in arrival order"
            )
            warnings.warn(
                f"{trace.source or 'trace'} (pool {pool.spec.name!r}): {len(over):,} of {len(trace):,} requests "
                f"need more than max_model_len = {limit:,} tokens of profile {pool.spec.profile!r} (the first, "
                f"{first}: {int(trace.prompt_tokens[i]):,} prompt + "
                f"{int(trace.output_tokens[i]):,} output tokens); a real vLLM server refuses them (HTTP 400), "
                "the simulator serves them; counted as over_context in the report",
                OverContextWarning,
                stacklevel=3,
            )
        total += len(over)
    return total


class OverContextWarning(UserWarning):
    """Requests past the profile's context window were replayed anyway (see :func:`over_context`)."""


def _counts(sim: Simulator) -> dict[str, dict[str, dict[str, int]]]:
    return {p.name: sim.counts(p.name) for p in sim.fleet.pools}
