"""The discrete-event simulator of P/D (and colocated) LLM serving pools on a virtual clock.

Events exist only where a batch changes membership (an arrival, a prefill iteration's end, the end of a
decode run, a KV transfer landing) or an instance changes lifecycle state; many decode steps are advanced
at once (see :mod:`serving.sim.instance`).

Lifecycle of an instance: ``provisioning`` (cold start) → ``active`` (or ``standby``: loaded, out of
rotation) → ``activating`` (standby promoted, ``standby_activation_s``) → ``active`` → ``draining`` (no new
requests; finishes what it holds) → gone, or ``failed`` (crash injection: its requests are routed again,
restarting from a recompute prefill, never lost). GPU-seconds count every state that holds GPUs
(provisioning, standby, activating, active, draining).

Disaggregated pools follow vLLM's P/D proxy (``disagg_prefill_proxy_server.py``, ``toy_proxy_server.py``):
the proxy sends the prompt to a ``prefill`` instance with ``max_tokens=1`` and drops that response, then
sends the request to a ``decode`` instance and streams *its* output to the client. So here: a request
prefills on a prefill instance (which samples one token, counted there, never streamed); its KV moves to a
decode instance in ``kv_transfer_latency_ms + bytes / kv_transfer_gbps`` (gigabits per second); it waits in
that instance's queue for a place in the decode batch (``max_num_seqs`` and KV blocks, FCFS); the first step
that includes it samples the client's first token (vLLM's decode side recomputes the last prompt token of a
fully transferred prompt to sample it: ``_update_waiting_for_remote_kv`` in ``v1/core/sched/scheduler.py``).
TTFT = queue at prefill + prefill + transfer + wait for a decode slot + that first step; the decode
instance then runs ``output - 1`` more steps. KV ownership (NIXL): the prefill instance keeps the request's
KV blocks allocated until the decode instance admits it (its blocks there are allocated then), so a
saturated decode pool back-pressures the prefill instances through their KV cache. Simplification: the
transfer starts when the prefill ends (vLLM pulls after the decode side allocated blocks), so when decode is
KV-bound the transfer overlaps the wait instead of following it: TTFT is low by at most one transfer time
(ms). A prefill instance that fails while holding KV for a pull loses it: the decode instance recomputes the
prompt itself (vLLM's recompute policy on a failed KV load). Requests that find no active instance of the
role they need wait in the pool's router queue. A request reaches its pool's router the latency model's
``request_overhead_ms`` after it arrives (the per-request HTTP and API-server cost; 0 for the GPU profiles,
fitted for ``cpu-tiny``); the client's TTFT and e2e count from the arrival, the exported histograms (vLLM's
view) from the arrival plus the latency model's outside shares of this overhead and of the admission delay
below (:mod:`serving.sim.instance`; 0 by default: from the arrival). The entry instance it is routed to then takes
it into its queue ``admission_delay_ms(sequences decoding there)`` later (the API server busy with running
streams; 0 for the GPU profiles, then the request is queued at once): meanwhile it counts in that instance's
``load`` for the router, and if the instance has left service by then it is routed again (no second delay).
A latency model keyed on the streams' age (``admission_young_tokens`` > 0) is also told how many of those
sequences are young (fewer output tokens than that, counting the steps of a decode run done by then).
An arrival parked first (at the gateway queue, or at the router queue while no instance of its role is active)
pays the delay at the instance that takes it from there; while on its way in it counts against that
instance's gateway room.
The wake-up cost after an idle spell is the instance's (see :mod:`serving.sim.instance`).

Gateway queue (``GatewayPolicy``, see :mod:`serving.sim.router`; off by default): a request goes to an
active instance of its role only while that instance's waiting queue is shorter than ``max_waiting``;
otherwise it waits at the pool's gateway, FCFS within its QoS class, and the first instance to have room
takes it: when its scheduler admits from its waiting queue (each step's end), when it becomes active (a cold
start ending, a standby promoted, a drain cancelled), when a waiting request leaves it. So a burst that
finds the fleet small no longer stays queued on the instances it was routed to: the instances that come up
later serve it. Requests are never dropped. The gateway's entry-role queue counts in :meth:`Simulator.pending`
(the controller adds it to the pool's waiting requests, as the router queue before it), and a request held
there is counted by ``pdscale:router_requests_total`` (and the prompt and predicted-output counters) as it
arrives, on an active instance of its role, so the arrival rate the controller reads is not capped at what
the fleet can take.

Tail requests (``TailPolicy``, off by default): a request still waiting in the queue of its entry role
(prefill, or mixed when colocated; an instance's queue or the pool's router queue) ``fraction`` of its pool's
TTFT SLO after arrival is moved to the front of that queue (priority ``PRIORITY_PROMOTED``, ahead of VIP;
once per request), and, with ``promote_standby``, one warm standby instance of that role is activated for it
(``standby_activation_s``); when it is active the request moves to it if still waiting. The promoted instance
is held on top of the controller's target for ``hold_s`` after it is ready, then drains back to standby;
a new target from the controller for that role ends every hold at once (the controller saw the promoted
instance in its counts). Counted per instance as ``pdscale:tail_promotions_total`` (on the instance where the
request waited) and ``pdscale:standby_promotions_total`` (on the promoted instance), exported only when a
TailPolicy is set, and per pool in the report (``tail_promotions``, ``standby_promotions``; requests promoted
in a router queue count there only).

Where metrics land: ``vllm:time_to_first_token_seconds`` on the instance that delivers the first token (the
decode instance when disaggregated), ``vllm:e2e_request_latency_seconds`` and ``vllm:request_success_total``
on the instance that completes the request, tokens on the instance that produced them (a prefill instance
counts the prompt and the token it samples: fleet generation tokens = output tokens + one per KV handoff),
``pdscale:router_requests_total`` on each instance a request is routed to (entry and, when disaggregated,
decode), ``pdscale:router_prompt_tokens_total`` (the prompt tokens of those requests) on entry instances only.
On the entry role these router counters count each request once: one routed again after its instance failed
(or failed during its admission delay) is the same offered load and is not counted again.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.sim.fleet import ROLES, FleetSpec, PoolSpec
from serving.sim.instance import Instance, LatencyLike, ProfileLike, RequestTable
from serving.sim.interference import Interference
from serving.sim.latency import OperatorLatencyModel
from serving.sim.report import ReplayReport, Timeline, percentiles, request_latencies_ms, slo_met
from serving.sim.router import (
    GatewayPolicy,
    GatewayQueue,
    LeastLoadedRouter,
    Router,
    RouteRequest,
    least_loaded_in_id_order,
    make_router,
)
from serving.sim.samples import (
    E2E_REQUEST_LATENCY_SECONDS,
    GENERATION_TOKENS_TOTAL,
    INTER_TOKEN_LATENCY_SECONDS,
    KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS_TOTAL,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PREDICTED_OUTPUT_TOKENS_TOTAL,
    PROMPT_TOKENS_TOTAL,
    REQUEST_SUCCESS_TOTAL,
    ROUTER_PROMPT_TOKENS_TOTAL,
    ROUTER_REQUESTS_TOTAL,
    STANDBY_PROMOTIONS_TOTAL,
    TAIL_PROMOTIONS_TOTAL,
    TIME_TO_FIRST_TOKEN_SECONDS,
    Histogram,
    InstanceSamples,
)
from serving.workload.outlen import OutputLengthPredictor
from serving.workload.trace import Trace

HOLDS_GPU = frozenset({"provisioning", "standby", "activating", "active", "draining"})
STATES: tuple[str, ...] = ("provisioning", "standby", "activating", "active", "draining", "failed")

_EV_SEGMENT = 0
_EV_TRANSFER = 1
_EV_READY = 2
_EV_TAIL = 3
_EV_TAIL_EXPIRE = 4
_EV_ADMIT = 5

PRIORITY_PROMOTED = -1  # a tail request: ahead of every class (PRIORITY_VIP is 0)

ModelResolver = Callable[[str], tuple[ProfileLike, LatencyLike]]


def default_models(profile: str) -> tuple[ProfileLike, LatencyLike]:
    """The hardware profile and latency model registered under ``profile`` (e.g. ``llama3-8b/a100``)."""
    from serving.sim import hardware, latency

    return hardware.get_profile(profile), latency.get_latency_model(profile)


def pool_kv_tokens(spec: PoolSpec, profile: ProfileLike) -> dict[str, int]:
    """KV tokens one instance of each role of ``spec`` holds (a mixed node's KV memory is partitioned between
    its prefill and decode instance by ``prefill_mem_frac``)."""
    cap = int(profile.kv_capacity_tokens)
    out = {role: cap for role in ROLES}
    if spec.placement == "mixed-node":
        out["prefill"] = int(cap * spec.prefill_mem_frac)
        out["decode"] = cap - out["prefill"]
    return out


def kv_needs(trace: Trace) -> dict[str, np.ndarray]:
    """KV tokens each request of ``trace`` needs on an instance of each role: a prefill instance holds the
    prompt and the token it samples, a decode or mixed instance the prompt and the whole output (lengths count
    as at least one token, as served)."""
    prompt = np.maximum(trace.prompt_tokens, 1)
    whole = prompt + np.maximum(trace.output_tokens, 1)
    return {"prefill": prompt + 1, "decode": whole, "mixed": whole}


def kv_rejected(spec: PoolSpec, kv_tokens: Mapping[str, int], trace: Trace) -> np.ndarray:
    """Bool per request of ``trace``: it does not fit the KV cache of an instance of some role of ``spec``
    (``kv_tokens``: role -> tokens, :func:`pool_kv_tokens`), so no instance can ever serve it."""
    needs = kv_needs(trace)
    out = np.zeros(len(trace), dtype=bool)
    for role in spec.roles:
        out |= needs[role] > kv_tokens[role]
    return out


def served_trace(spec: PoolSpec, trace: Trace, profile: ProfileLike | None = None) -> Trace:
    """``trace`` without the requests the simulator rejects on ``spec`` (:func:`kv_rejected`; ``profile``
    default: the pool's registered profile); ``trace`` itself when it rejects none."""
    if profile is None:
        from serving.sim.hardware import get_profile

        profile = get_profile(spec.profile)
    rejected = kv_rejected(spec, pool_kv_tokens(spec, profile), trace)
    return trace.take(np.flatnonzero(~rejected)) if rejected.any() else trace


class RejectedRequestWarning(UserWarning):
    """Requests that no instance of their pool can hold were rejected (see :class:`Simulator`)."""


@dataclass(frozen=True)
class TailPolicy:
    """Promotion of requests left waiting (the seeds' "preemptive scheduling of long-tail requests").

    ``fraction``: of the pool's ``slo_ttft_ms`` a request may wait in its entry queue before promotion
    (0.5: half the TTFT budget is gone, the other half is left to prefill it). ``promote_standby``: also
    activate one warm standby instance of that role per promoted request while the pool has one.
    ``hold_s``: how long a promoted instance stays active on top of the controller's target once ready.
    """

    fraction: float = 0.5
    promote_standby: bool = True
    hold_s: float = 60.0

    def __post_init__(self) -> None:
        errors = []
        if not 0.0 < self.fraction <= 1.0:
            errors.append(f"fraction={self.fraction} must lie in (0, 1]")
        if not self.hold_s >= 0.0:
            errors.append(f"hold_s={self.hold_s} must be >= 0")
        if errors:
            raise ValueError("invalid TailPolicy: " + "; ".join(errors))


@dataclass(frozen=True)
class ScaleEvent:
    """A change of target made through :meth:`Simulator.set_target` (after clamping)."""

    t_s: float
    pool: str
    role: str
    active: int
    standby: int


class _Pool:
    def __init__(self, index: int, spec: PoolSpec, profile: ProfileLike, latency: LatencyLike) -> None:
        self.index = index
        self.spec = spec
        self.profile = profile
        self.latency = latency
        self.router: Router = make_router(spec.router)
        # least-loaded routing is done by the simulator itself, without a RouteRequest (see Simulator._route)
        self.least_loaded = type(self.router) is LeastLoadedRouter
        self.entry_role = "prefill" if spec.disaggregated else "mixed"
        # the latency model's admission delay (absent, or 0 for a call: the request is queued on arrival;
        # the operator model, which has none, is not asked once per arrival)
        delay = getattr(latency, "admission_delay_ms", None)
        if type(latency) is OperatorLatencyModel:
            delay = None
        self.admission_delay_ms: Callable[..., float] | None = delay if callable(delay) else None
        # streams younger than this many output tokens count as young for it (0: not keyed on age)
        self.admission_young_tokens = float(getattr(latency, "admission_young_tokens", 0.0) or 0.0)
        self.admission_outside = _outside(latency, "admission_outside_fraction")
        self.ready: dict[str, list[Instance]] = {r: [] for r in ROLES}
        # every instance of each role ever provisioned (gone ones too), in creation order
        self.members: dict[str, list[Instance]] = {r: [] for r in ROLES}
        self.pending: dict[str, deque[int]] = {r: deque() for r in ROLES}
        self.gateway: dict[str, GatewayQueue] = {r: GatewayQueue() for r in ROLES}  # GatewayPolicy on only
        self.gateway_peak: dict[str, int] = {r: 0 for r in ROLES}
        self.serial: dict[str, int] = {r: 0 for r in ROLES}
        self.target: dict[str, tuple[int, int]] = {}
        # tail promotion: standby instances activated on top of the target, per role, and a generation that
        # a new target bumps (pending hold expiries of an older generation do nothing)
        self.boost: dict[str, int] = {r: 0 for r in ROLES}
        self.boost_gen: dict[str, int] = {r: 0 for r in ROLES}
        self.tail_promotions = 0
        self.standby_promotions = 0
        transfer_bits_per_token = 8.0 * float(profile.kv_bytes_per_token)
        self.transfer_s_per_token = transfer_bits_per_token / (float(profile.kv_transfer_gbps) * 1e9)
        self.transfer_latency_s = float(profile.kv_transfer_latency_ms) / 1000.0
        self.mixed_node = spec.placement == "mixed-node"
        self.node_serial = 0
        self.kv_tokens = pool_kv_tokens(spec, profile)
        # mixed-node interference: a fixed factor when the spec names one, else derived from the latency model
        self.slowdown = 1.0
        self.interference: Interference | None = None
        if self.mixed_node:
            if spec.mixed_node_slowdown is not None:
                self.slowdown = spec.mixed_node_slowdown
            else:
                self.interference = Interference(latency)


def _outside(latency: object, name: str) -> float:
    """A latency model's share (0-1) of a client-side term outside the server's histograms (0 if it has none)."""
    return float(getattr(latency, name, 0.0) or 0.0)


class Simulator:
    """Virtual-clock simulator of one fleet replaying one trace per pool.

    ``models`` maps a profile name to its (hardware profile, latency model); by default both come from
    ``serving.sim.hardware.get_profile`` and ``serving.sim.latency.get_latency_model``. ``seed`` is kept
    for reproducible extensions (the simulation itself is deterministic). ``output_predictor``: the
    router's output-length predictions come from it (predicted at arrival, keyed by pool name as the model,
    taught every completion) instead of the trace's own lengths (the default, an oracle), and their sum is
    exported per entry instance as ``pdscale:predicted_output_tokens_total`` (decode demand known at
    arrival, seconds before the decode instances generate it). ``tail``:
    promotion of requests left waiting (see the module doc); None = off. ``gateway``: the pools' gateway
    queues (:class:`serving.sim.router.GatewayPolicy`; see the module doc); None = off.

    A request no instance of its pool can hold (:func:`kv_rejected`: prompt + 1 KV tokens above a prefill
    instance's cache, prompt + output above a decode or mixed instance's) is rejected, as a real vLLM server
    refuses it (HTTP 400: longer than ``max_model_len``, which vLLM never lets exceed the KV cache) and serves
    the rest: it never arrives, so no instance, metric or router counter sees it; ``rejected`` marks it (a
    bool per request), the report counts it (an SLO miss), and one :class:`RejectedRequestWarning` per pool
    names the first by its trace line.
    """

    def __init__(
        self,
        fleet: FleetSpec,
        traces: Mapping[str, Trace],
        seed: int = 0,
        *,
        models: ModelResolver | None = None,
        output_predictor: OutputLengthPredictor | None = None,
        tail: TailPolicy | None = None,
        gateway: GatewayPolicy | None = None,
    ) -> None:
        unknown = set(traces) - {p.name for p in fleet.pools}
        if unknown:
            raise ValueError(f"traces given for pools not in the fleet: {sorted(unknown)}")
        resolve = models or default_models
        self.fleet = fleet
        self.seed = seed
        self.output_predictor = output_predictor
        self.tail = tail
        self.gateway = gateway
        self._gw_on = gateway is not None
        self._gw_max = gateway.max_waiting if gateway is not None else 0
        self._gw_counted: set[int] = set()  # held at a gateway, already counted by the router counters
        # arrivals parked (gateway or router queue) before paying the latency model's admission delay: they
        # pay it at the instance that later takes them (module doc)
        self._unadmitted: set[int] = set()
        self.rng = np.random.default_rng(seed)
        self.now_s = 0.0
        self.pools: list[_Pool] = []
        self._pool_by_name: dict[str, _Pool] = {}
        for i, spec in enumerate(fleet.pools):
            profile, latency = resolve(spec.profile)
            pool = _Pool(i, spec, profile, latency)
            self.pools.append(pool)
            self._pool_by_name[spec.name] = pool
        self.req, self.traces = self._build_requests(traces)
        # A request reaches its pool's instances request_overhead_ms after it arrives (the per-request
        # client-side cost of the latency model; 0 for the GPU profiles): TTFT and e2e count from arrival.
        delay_s = np.array(
            [float(getattr(p.latency, "request_overhead_ms", 0.0)) / 1000.0 for p in self.pools]
        )
        engine_arrival_s = self.req.arrival_s
        if np.any(delay_s != 0.0):
            engine_arrival_s = self.req.arrival_s + delay_s[self.req.pool]
            # the server's histograms count from vLLM's arrival stamp: after the overhead's outside share
            outside = np.array([_outside(p.latency, "request_overhead_outside_fraction") for p in self.pools])
            if np.any(outside != 0.0):
                self.req.stamp = (self.req.arrival_s + (delay_s * outside)[self.req.pool]).tolist()
        order = np.argsort(engine_arrival_s, kind="stable")
        if self.rejected.any():  # never arrive: no instance can hold them (see the class doc)
            order = order[~self.rejected[order]]
        self._arrival_order = order.tolist()
        self._arrival_times = engine_arrival_s[order].tolist()
        self._next_arrival = 0
        self.instances: list[Instance] = []
        self._by_id: dict[str, Instance] = {}
        self._node_members: dict[str, list[Instance]] = {}  # node id -> instances placed there, ever
        self._node_gpus: dict[str, int] = {}
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.scale_events: list[ScaleEvent] = []
        self.budget_denied = 0
        for pool in self.pools:
            for role in pool.spec.roles:
                counts = pool.spec.role(role)
                self.set_target(pool.spec.name, role, counts.initial, counts.standby, warm=True)

    # -- setup -----------------------------------------------------------------------------------------
    def _build_requests(self, traces: Mapping[str, Trace]) -> tuple[RequestTable, dict[str, Trace]]:
        parts = []
        by_pool: dict[str, Trace] = {}
        rejected: list[np.ndarray] = []
        for pool in self.pools:
            trace = traces.get(pool.spec.name)
            if trace is None:
                trace = Trace.from_arrays(np.empty(0), np.empty(0), np.empty(0), source="empty")
            by_pool[pool.spec.name] = trace
            rejected.append(kv_rejected(pool.spec, pool.kv_tokens, trace))
            if rejected[-1].any():
                _warn_rejected(pool, trace, rejected[-1])
            parts.append((trace, pool.index))
        self.rejected = np.concatenate(rejected) if rejected else np.zeros(0, dtype=bool)
        req = RequestTable(
            np.concatenate([t.arrival_s for t, _ in parts]),
            np.concatenate([t.prompt_tokens for t, _ in parts]),
            np.concatenate([t.output_tokens for t, _ in parts]),
            np.concatenate([t.priority for t, _ in parts]),
            np.concatenate([np.full(len(t), i, dtype=np.int64) for t, i in parts]),
        )
        return req, by_pool

    def _push(self, t_s: float, kind: int, a: int, b: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t_s, self._seq, kind, a, b))

    # -- the clock ---------------------------------------------------------------------------------------
    def run_until(self, t_s: float) -> None:
        """Process every event and arrival at or before ``t_s``; then ``now_s == t_s``."""
        if t_s < self.now_s:
            raise ValueError(f"run_until({t_s}) is in the past (now_s={self.now_s})")
        # the hottest loop of the simulator: everything it reads per event is bound to a local
        events = self._events
        times = self._arrival_times
        order = self._arrival_order
        n_arr = len(times)
        pools, pool_of, instances = self.pools, self.req.pool_of, self.instances
        predictor, tail = self.output_predictor, self.tail
        heappop, inf = heapq.heappop, math.inf
        route, on_segment_end = self._route, self._on_segment_end
        nxt = self._next_arrival
        t_arr = times[nxt] if nxt < n_arr else inf
        while True:
            t_ev = events[0][0] if events else inf
            if t_arr < t_ev:
                if t_arr > t_s:
                    break
                self.now_s = t_arr
                rid = order[nxt]
                nxt += 1
                self._next_arrival = nxt
                pool = pools[pool_of[rid]]
                if predictor is not None:
                    self.req.predicted[rid] = predictor.predict(self.req.prompt[rid], model=pool.spec.name)
                if tail is not None:
                    wait_s = tail.fraction * pool.spec.slo_ttft_ms / 1000.0
                    self._push(t_arr + wait_s, _EV_TAIL, rid, 0)
                route(pool, pool.entry_role, rid, admit=True)
                t_arr = times[nxt] if nxt < n_arr else inf
                continue
            if t_ev > t_s:
                break
            t, _, kind, a, b = heappop(events)
            self.now_s = t
            if kind == _EV_SEGMENT:
                inst = instances[a]
                if inst.version == b and inst.busy and inst.seg_end_s == t:
                    on_segment_end(inst)
            elif kind == _EV_TRANSFER:
                route(pools[pool_of[a]], "decode", a)
            elif kind == _EV_TAIL:
                self._on_tail(a)
            elif kind == _EV_TAIL_EXPIRE:
                self._on_hold_expired(self.pools[a], ROLES[b % len(ROLES)], b // len(ROLES))
            elif kind == _EV_ADMIT:
                self._on_admit(a, self.instances[b])
            else:
                inst = self.instances[a]
                if inst.version == b:
                    self._on_ready(inst)
        self.now_s = float(t_s)

    @property
    def idle(self) -> bool:
        """No event pending and no arrival left (requests parked at a router queue may remain)."""
        return not self._events and self._next_arrival >= len(self._arrival_times)

    def run_to_completion(self, limit_s: float = math.inf, step_s: float = 1.0) -> None:
        """Advance in ``step_s`` steps until idle or ``limit_s`` (requests may remain parked if no
        instance of their role is active: :meth:`unfinished` says how many)."""
        while not self.idle and self.now_s < limit_s:
            self.run_until(min(self.now_s + step_s, limit_s))

    # -- routing and batching ----------------------------------------------------------------------------
    def _route(self, pool: _Pool, role: str, rid: int, *, admit: bool = False) -> None:
        """Send ``rid`` to an instance of ``role`` (or park it at the router). ``admit``: a new arrival, which
        reaches the instance's queue after the latency model's admission delay (module doc); one parked at
        the gateway or the router queue first pays it where it goes from there."""
        ready = pool.ready[role]
        if not admit and self._unadmitted and rid in self._unadmitted:
            admit = True  # parked on arrival: the delay is still to pay
        if self.gateway is not None:
            gq = pool.gateway[role]
            if gq:  # requests are held: none of the ready instances has room (see _pull); FCFS behind them
                self._park_unadmitted(pool, rid, admit)
                self._hold(pool, role, gq, rid)
                return
            w = self._gw_max
            room = [i for i in ready if len(i.waiting) + i.admitting < w]
            if not room:
                self._park_unadmitted(pool, rid, admit)
                self._hold(pool, role, gq, rid)
                return
            if len(room) < len(ready):
                ready = room
        elif not ready:
            self._park_unadmitted(pool, rid, admit)
            pool.pending[role].append(rid)
            return
        if len(ready) > 1:
            if pool.least_loaded:  # LeastLoadedRouter's rule, no RouteRequest (``ready`` is in id order)
                inst = ready[least_loaded_in_id_order(ready)]
            else:
                req = self.req
                # positional: a frozen dataclass's keyword construction costs twice as much, once per routing
                request = RouteRequest(req.prompt[rid], req.predicted[rid], req.priority[rid], role)
                inst = ready[pool.router.choose(request, ready)]
        else:
            inst = ready[0]
        routed = role != pool.entry_role or self._count_routed(pool, inst, role, rid)
        if (
            admit
            and pool.admission_delay_ms is not None
            and self._start_admission(pool, inst, rid, routed=routed)
        ):
            return
        self._enqueue(inst, rid, routed=routed)

    def _park_unadmitted(self, pool: _Pool, rid: int, admit: bool) -> None:
        """``rid`` (an arrival when ``admit``) is parked before reaching an instance: remember that it still
        owes the admission delay (only where the latency model has one)."""
        if admit and pool.admission_delay_ms is not None:
            self._unadmitted.add(rid)

    def _start_admission(self, pool: _Pool, inst: Instance, rid: int, *, routed: bool) -> bool:
        """Send arrival ``rid`` to ``inst`` through the admission delay; False when the delay is 0 (the
        caller queues it at once). ``routed``: count it on ``inst``'s router request counter now, with its
        prompt tokens (it may be routed again if ``inst`` fails meanwhile; ``_on_admit`` never counts it)."""
        self._unadmitted.discard(rid)
        if pool.admission_delay_ms is None:
            return False
        if pool.admission_young_tokens > 0.0:
            young = inst.young_decoding(self.req, self.now_s, pool.admission_young_tokens)
            delay_ms = float(pool.admission_delay_ms(len(inst.decoding), young))
        else:
            delay_ms = float(pool.admission_delay_ms(len(inst.decoding)))
        if delay_ms <= 0.0:
            return False
        inst.load += 1  # on its way in: the router sees it
        inst.admitting += 1  # and the gateway counts it against the instance's room
        if routed:
            inst.router_requests_total += 1
        # that share is outside vLLM's TTFT and e2e (serving.sim.instance doc)
        if pool.admission_outside > 0.0:
            self.req.stamp[rid] += pool.admission_outside * delay_ms / 1000.0
        self._push(self.now_s + delay_ms / 1000.0, _EV_ADMIT, rid, inst.index)
        return True

    def _count_routed(self, pool: _Pool, inst: Instance, role: str, rid: int) -> bool:
        """Count ``rid`` routed to ``inst`` on the router's prompt and predicted-output counters; whether its
        router request counter should count it too. False for the entry role when the request was counted
        there before (routed again after its instance failed: the same offered load, counted once)."""
        if role != pool.entry_role:
            return True
        req = self.req
        if req.entry_counted[rid]:
            return False
        req.entry_counted[rid] = True
        inst.router_prompt_tokens_total += int(req.prompt[rid])
        if self.output_predictor is not None:
            predicted = req.predicted[rid]
            if not math.isnan(predicted):
                inst.predicted_output_tokens_total += predicted
        return True

    # -- the gateway queue (GatewayPolicy) -----------------------------------------------------------------
    # Invariant: a role's gateway queue holds requests only while no active instance of the role has room
    # (fewer than max_waiting waiting). Room appears only where an instance's waiting queue shrinks (its
    # scheduler admitting, a tail request moved away) or an instance becomes active; each of those places
    # pulls from the gateway (_pull), so per event the work is what moved, never a scan of the queue.
    def _hold(self, pool: _Pool, role: str, gq: GatewayQueue, rid: int) -> None:
        gq.push(rid, self.req.priority[rid])
        self.req.where[rid] = -1
        ready = pool.ready[role]
        if ready:
            # The gateway counts the request now, as it arrives (the pool's sum of the router counters is the
            # arrival count the controller reads: counted at dispatch it would be capped by the fleet's
            # capacity exactly when the fleet is short); kept on an active instance of the role.
            first = ready[0]
            if self._count_routed(pool, first, role, rid):
                first.router_requests_total += 1
            self._gw_counted.add(rid)
        if len(gq) > pool.gateway_peak[role]:
            pool.gateway_peak[role] = len(gq)

    def _pull(self, inst: Instance, *, replan: bool = False, step: bool = False) -> int:
        """Move requests from the gateway into ``inst``'s waiting queue while it has room (``inst`` active);
        returns how many. A decode run in progress is cut at its current step (as an arrival would);
        ``replan``: push its new end event here (else the caller plans the segment).

        ``step``: the instance is about to plan a step, so it also takes what its scheduler could start in
        that step beyond the lookahead: while a sequence slot is free and, for a prefill (or mixed) instance,
        the queued prompt tokens are short of ``max_num_batched_tokens``, for a decode instance the head's KV
        blocks fit in the free ones. (Without this the lookahead would cap admissions at ``max_waiting`` per
        step under a backlog.)"""
        pool = self.pools[inst.pool_index]
        gq = pool.gateway[inst.role]
        req = self.req
        n = 0
        moved = False
        w = self._gw_max
        seats = tokens = blocks = 0
        if step and gq:
            seats = inst.max_seqs - inst.running - len(inst.waiting) - inst.admitting
            if inst.role == "decode":
                bs = inst.block_size
                blocks = inst.total_blocks - inst.used_blocks
                blocks -= sum(-(-req.ctx[r] // bs) + 1 for _, r in inst.waiting)
            else:
                tokens = inst.max_batched - sum(req.prefill_left[r] for _, r in inst.waiting)
        decode = inst.role == "decode"
        while gq:
            if step:  # what the head takes of the step's room
                head = gq.peek()
                need = -(-req.ctx[head] // inst.block_size) + 1 if decode else req.prefill_left[head]
                fits = seats > 0 and (need <= blocks if decode else tokens > 0)
                if len(inst.waiting) + inst.admitting >= w and not fits:
                    break
                seats -= 1
                if decode:
                    blocks -= need
                else:
                    tokens -= need
            elif len(inst.waiting) + inst.admitting >= w:
                break
            rid = gq.pop()
            if rid in self._gw_counted:
                self._gw_counted.discard(rid)
                routed = False
            else:  # held while no instance of its role was active: counted where it goes, as the router queue
                routed = self._count_routed(pool, inst, inst.role, rid)
            self.req.where[rid] = inst.index
            n += 1
            if (
                self._unadmitted
                and rid in self._unadmitted
                and self._start_admission(pool, inst, rid, routed=routed)
            ):
                continue  # held on arrival: it pays the admission delay here first (module doc; _on_admit)
            moved = inst.enqueue(rid, self.req.priority[rid], self.now_s, routed=routed) or moved
        if moved and replan:
            inst.version += 1
            self._push(inst.seg_end_s, _EV_SEGMENT, inst.index, inst.version)
        return n

    def _refill(self, inst: Instance) -> None:
        """``inst`` may have room now (it became active, or a waiting request left it): take from the gateway."""
        if (
            self.gateway is None
            or inst.state != "active"
            or not self.pools[inst.pool_index].gateway[inst.role]
        ):
            return
        if inst.busy:
            self._pull(inst, replan=True)
        else:
            self._schedule(inst)

    def _on_admit(self, rid: int, inst: Instance) -> None:
        """``rid``'s admission delay at ``inst`` is over: queue it there, or route it again if ``inst``
        left service meanwhile (a failed instance's load was reset when it failed)."""
        if inst.state != "failed":
            inst.load -= 1
            inst.admitting -= 1
        if inst.state in ("active", "draining"):
            self._enqueue(inst, rid, routed=False)  # counted when it was routed here
        else:
            pool = self.pools[self.req.pool_of[rid]]
            self._route(pool, pool.entry_role, rid)

    def _enqueue(self, inst: Instance, rid: int, *, routed: bool = True) -> None:
        self.req.where[rid] = inst.index
        if inst.enqueue(rid, self.req.priority[rid], self.now_s, routed=routed):
            inst.version += 1
            self._push(inst.seg_end_s, _EV_SEGMENT, inst.index, inst.version)
        elif not inst.busy:
            self._schedule(inst)

    def _schedule(self, inst: Instance, was_busy: bool = False) -> None:
        gateway = (
            self._gw_on and inst.state == "active" and bool(self.pools[inst.pool_index].gateway[inst.role])
        )
        if gateway:
            self._pull(inst, step=True)  # before planning: what the step can take joins it
        end = inst.schedule(self.now_s, self.req)
        while gateway and self._pull(inst):  # the scheduler made room: refill the lookahead
            if inst.busy:  # they join at the next step; a decode run may have been cut short
                inst.version += 1
                end = inst.seg_end_s
                break
            end = inst.schedule(self.now_s, self.req)  # idle (its queue's head blocked): plan again
        if end is not None:  # self._push, inline: once per segment
            self._seq += 1
            heapq.heappush(self._events, (end, self._seq, _EV_SEGMENT, inst.index, inst.version))
        elif inst.state == "draining" and inst.empty:
            self._finish_drain(inst)
        sibling = inst.sibling
        if sibling is not None and inst.busy != was_busy and sibling.interrupt(self.now_s):
            # the node's compute share changed: re-plan the sibling's decode run from its next step
            sibling.version += 1
            self._push(sibling.seg_end_s, _EV_SEGMENT, sibling.index, sibling.version)
        if inst.pulled:
            pulled, inst.pulled = inst.pulled, []
            for rid in pulled:
                self._release_kv(rid)

    def _release_kv(self, rid: int) -> None:
        """``rid``'s KV no longer needs its prefill instance: free the blocks kept there, and let that
        instance use them (it may have been idle for want of blocks, or draining until they were freed)."""
        src = self.instances[self.req.kv_src[rid]]
        self.req.kv_src[rid] = -1
        src.release_held(rid)
        if not src.busy and (src.state == "draining" or (src.waiting and src.state == "active")):
            self._schedule(src)

    def _on_segment_end(self, inst: Instance) -> None:
        out = inst.finish_segment(self.now_s, self.req)
        if self.output_predictor is not None:
            name = self.pools[inst.pool_index].spec.name
            for rid in out.completed:
                self.output_predictor.observe(self.req.prompt[rid], self.req.target[rid], model=name)
        if out.handoff:
            pool = self.pools[inst.pool_index]
            ctx, events = self.req.ctx, self._events
            for rid in out.handoff:  # self._push, inline: once per request
                self._seq += 1
                t_s = self.now_s + pool.transfer_latency_s + ctx[rid] * pool.transfer_s_per_token
                heapq.heappush(events, (t_s, self._seq, _EV_TRANSFER, rid, 0))
        self._schedule(inst, True)

    # -- tail requests ----------------------------------------------------------------------------------
    def _on_tail(self, rid: int) -> None:
        """``rid`` has waited ``tail.fraction`` of its TTFT SLO: promote it if still in its entry queue."""
        req = self.req
        if req.promoted[rid] or req.prompt_counted[rid] or not math.isnan(req.first_s[rid]):
            return
        pool = self.pools[req.pool_of[rid]]
        role = pool.entry_role
        where = req.where[rid]
        inst = self.instances[where] if where >= 0 else None
        if inst is not None and inst.role == role and inst.promote_waiting(rid, PRIORITY_PROMOTED):
            inst.tail_promotions_total += 1
            if not inst.busy and inst.state in ("active", "draining"):
                self._schedule(inst)
        elif rid in pool.pending[role]:  # parked at the router: no instance of the role is active
            pool.pending[role].remove(rid)
            pool.pending[role].appendleft(rid)
        elif self.gateway is not None and pool.gateway[role].remove(rid, req.priority[rid]):
            pool.gateway[role].push(rid, PRIORITY_PROMOTED)  # held at the gateway: ahead of every class
        else:
            return  # its prefill has started
        req.priority[rid] = PRIORITY_PROMOTED
        req.promoted[rid] = True
        pool.tail_promotions += 1
        if self.tail is not None and self.tail.promote_standby:
            self._promote_standby(pool, role, rid)

    def _promote_standby(self, pool: _Pool, role: str, rid: int) -> None:
        """Activate one warm standby instance of ``role`` for ``rid``, held on top of the target."""
        spare = next(
            (
                i
                for i in reversed(self.instances)
                if i.pool_index == pool.index and i.role == role and i.state == "standby"
            ),
            None,
        )
        if spare is None or self.tail is None:
            return
        pool.boost[role] += 1
        spare.state = "activating"
        spare.version += 1
        ready_s = self.now_s + float(pool.profile.standby_activation_s)
        self._push(ready_s, _EV_READY, spare.index, spare.version)
        spare.tail_rids.append(rid)
        spare.standby_promotions_total += 1
        pool.standby_promotions += 1
        code = pool.boost_gen[role] * len(ROLES) + ROLES.index(role)
        self._push(ready_s + self.tail.hold_s, _EV_TAIL_EXPIRE, pool.index, code)

    def _on_hold_expired(self, pool: _Pool, role: str, generation: int) -> None:
        if pool.boost_gen[role] != generation or pool.boost[role] <= 0:
            return  # the controller set a new target since: its counts included the promoted instance
        pool.boost[role] -= 1
        want_active, _ = self._effective_target(pool, role)
        mine = pool.members[role]
        active = [i for i in mine if i.state == "active"]
        heading = len(active) + sum(1 for i in mine if i.state == "activating")
        if heading > want_active and active:
            # back to standby through a drain (set_target alone would release it and cold-start a new one)
            self._start_drain(min(active, key=lambda i: (i.load, i.instance_id)), "standby")
        self._retarget(pool, role)

    def _take_tail_requests(self, inst: Instance) -> None:
        """A standby promoted for tail requests is active: move those still waiting elsewhere to it."""
        rids, inst.tail_rids = inst.tail_rids, []
        for rid in rids:
            where = self.req.where[rid]
            if where < 0 or where == inst.index:
                continue
            old = self.instances[where]
            if old.role == inst.role and old.take_waiting(rid):
                self._enqueue(inst, rid, routed=False)
                if old.state == "draining" and old.empty and not old.busy:
                    self._finish_drain(old)
                self._refill(old)

    # -- lifecycle --------------------------------------------------------------------------------------
    def _node_holds_gpu(self, node: str) -> bool:
        return any(i.state in HOLDS_GPU for i in self._node_members[node])

    def _gpus_in_use(self) -> int:
        return sum(self._node_gpus[n] for n in self._node_members if self._node_holds_gpu(n))

    def _place(self, pool: _Pool, role: str, inst_id: str) -> tuple[str, Instance | None]:
        """The node for a new instance (and its sibling there): its own node when dedicated; on mixed
        nodes the first node without a live instance of ``role``, else a new node."""
        if not pool.mixed_node:
            return inst_id, None
        for node, members in self._node_members.items():
            if not node.startswith(f"{pool.spec.name}-node-"):
                continue
            live = [i for i in members if i.state not in ("gone", "failed")]
            if not any(i.role == role for i in live):
                return node, next((i for i in live if i.role != role), None)
        node = f"{pool.spec.name}-node-{pool.node_serial}"
        pool.node_serial += 1
        return node, None

    def _provision(self, pool: _Pool, role: str, dest: str) -> bool:
        n = pool.serial[role]
        inst_id = f"{pool.spec.name}-{role}-{n}"
        node, sibling = self._place(pool, role, inst_id)
        extra = 0 if node in self._node_members and self._node_holds_gpu(node) else int(pool.profile.gpus)
        if self._gpus_in_use() + extra > self.fleet.gpu_budget:
            self.budget_denied += 1
            return False
        pool.serial[role] = n + 1
        marks = {"prefill": pool.spec.long_context_prefill, "decode": pool.spec.high_memory_decode}
        inst = Instance(
            index=len(self.instances),
            instance_id=inst_id,
            pool_index=pool.index,
            pool=pool.spec.name,
            role=role,
            node=node,
            profile=pool.profile,
            latency=pool.latency,
            marked=n < marks.get(role, 0),
            now_s=self.now_s,
            kv_capacity_tokens=pool.kv_tokens[role],
            slowdown=pool.slowdown,
            interference=pool.interference,
        )
        if sibling is not None:
            inst.sibling, sibling.sibling = sibling, inst
        inst.dest = dest
        self.instances.append(inst)
        pool.members[role].append(inst)
        self._by_id[inst_id] = inst
        self._node_members.setdefault(node, []).append(inst)
        self._node_gpus[node] = int(pool.profile.gpus)
        self._push(self.now_s + float(pool.profile.cold_start_s), _EV_READY, inst.index, inst.version)
        return True

    def _on_ready(self, inst: Instance) -> None:
        if inst.state == "provisioning":
            if inst.dest == "active":
                self._activate(inst)
            else:
                inst.state = "standby"
        elif inst.state == "activating":
            self._activate(inst)

    def _ready_now(self, inst: Instance) -> None:
        """Initial instances exist at t=0, already loaded (the replay starts from a running fleet)."""
        inst.version += 1
        self._on_ready(inst)

    def _activate(self, inst: Instance) -> None:
        pool = self.pools[inst.pool_index]
        inst.state = "active"
        ready = pool.ready[inst.role]
        ready.append(inst)
        ready.sort(key=lambda i: i.instance_id)
        if inst.tail_rids:
            self._take_tail_requests(inst)
        pending = pool.pending[inst.role]
        while pending:
            self._route(pool, inst.role, pending.popleft())
        self._refill(inst)

    def _deactivate(self, inst: Instance) -> None:
        ready = self.pools[inst.pool_index].ready[inst.role]
        if inst in ready:
            ready.remove(inst)

    def _release(self, inst: Instance, state: str = "gone") -> None:
        inst.state = state
        inst.t_release_s = self.now_s
        inst.version += 1

    def _start_drain(self, inst: Instance, dest: str) -> None:
        self._deactivate(inst)
        inst.state = "draining"
        inst.dest = dest
        if inst.empty and not inst.busy:
            self._finish_drain(inst)

    def _finish_drain(self, inst: Instance) -> None:
        if inst.dest == "standby":
            inst.state = "standby"
        else:
            self._release(inst)

    def fail_instance(self, instance_id: str) -> list[int]:
        """Crash an instance now: it releases its GPUs; every request queued or running on it is routed
        again (restarting from a recompute prefill on the pool's entry role). A prefill instance's KV kept
        for pulls is lost: those requests stay on (or in transit to) their decode instance, which recomputes
        the prompt. Returns the request ids re-queued."""
        inst = self._instance(instance_id)
        if inst.state in ("gone", "failed"):
            raise ValueError(f"instance {instance_id} is already {inst.state}")
        self._deactivate(inst)
        req = self.req
        for rid in inst.drop_held():
            # its KV, awaiting a pull, is lost: the decode instance recomputes the prompt itself (vLLM's
            # recompute policy on a failed KV load); the request stays where it is (in transit or queued)
            req.kv_src[rid] = -1
            req.reset_for_recompute(rid)
        rids = inst.evict_all(self.now_s, req)
        self._release(inst, "failed")
        pool = self.pools[inst.pool_index]
        for rid in rids:
            if req.kv_src[rid] >= 0:  # queued here with its KV still on a prefill instance
                self._release_kv(rid)
        for rid in sorted(rids):
            self._route(pool, pool.entry_role, rid)
        return rids

    def _instance(self, instance_id: str) -> Instance:
        try:
            return self._by_id[instance_id]
        except KeyError:
            raise KeyError(f"no instance {instance_id!r}") from None

    # -- the actuator -----------------------------------------------------------------------------------
    def set_target(
        self, pool: str, role: str, active: int, standby: int = 0, *, warm: bool = False
    ) -> tuple[int, int]:
        """Aim for ``active`` serving and ``standby`` warm instances of ``role`` in ``pool``.

        Idempotent. Clamps ``active`` to the role's [min, max] and ``standby`` to [0, max - active].
        Scale-up reuses, cheapest first: a draining instance (back to active at once), a warm standby
        (``standby_activation_s``), one provisioning for standby, then a new cold start. Scale-down
        cancels provisioning first, then drains the least-loaded active instances (they finish their
        requests; nothing is lost). ``warm=True`` brings new instances up already loaded, with no cold
        start (for the starting fleet at t=0; not counted as a scale event). Returns the clamped
        (active, standby).
        """
        p = self._pool_by_name.get(pool)
        if p is None:
            raise KeyError(f"no pool named {pool!r}")
        if role not in p.spec.roles:
            raise ValueError(f"pool {pool!r} has no {role!r} role (roles: {p.spec.roles})")
        counts = p.spec.role(role)
        want_active = min(max(int(active), counts.min), counts.max)
        want_standby = min(max(int(standby), 0), counts.max - want_active)
        if warm and self.now_s > 0.0:
            raise ValueError(f"set_target(warm=True) is only for the starting fleet (now_s={self.now_s})")
        changed = p.target.get(role) != (want_active, want_standby)
        if changed and not warm:
            self.scale_events.append(ScaleEvent(self.now_s, pool, role, want_active, want_standby))
        if changed and p.boost[role]:  # a new decision: it saw the tail-promoted instances in its counts
            p.boost[role] = 0
            p.boost_gen[role] += 1
        p.target[role] = (want_active, want_standby)
        self._retarget(p, role, warm)
        return want_active, want_standby

    def _effective_target(self, p: _Pool, role: str) -> tuple[int, int]:
        """The controller's (active, standby) target with the tail-promoted instances moved to active."""
        want_active, want_standby = p.target[role]
        boost = p.boost[role]
        if boost:
            top = p.spec.role(role).max
            want_active = min(want_active + boost, top)
            want_standby = max(min(want_standby - boost, top - want_active), 0)
        return want_active, want_standby

    def _retarget(self, p: _Pool, role: str, warm: bool = False) -> None:
        """Bring the role to its target, plus the standby instances promoted for tail requests."""
        want_active, want_standby = self._effective_target(p, role)
        mine = p.members[role]
        # the controller's target is set every tick and is mostly met already: then neither step below acts
        heading_active = heading_standby = 0
        for i in mine:
            state = i.state
            if state == "active" or state == "activating":
                heading_active += 1
            elif state == "provisioning" or state == "draining":
                if i.dest == "standby":
                    heading_standby += 1
                elif state == "provisioning" and i.dest == "active":
                    heading_active += 1
            elif state == "standby":
                heading_standby += 1
        if heading_active == want_active and heading_standby == want_standby:
            return
        mine = list(mine)  # as it is now: the steps below provision new members
        self._adjust_active(p, role, mine, want_active, want_standby, warm)
        self._adjust_standby(p, role, mine, want_standby, warm)

    def _adjust_active(
        self, p: _Pool, role: str, mine: list[Instance], want: int, want_standby: int, initial: bool
    ) -> None:
        def heading_active(i: Instance) -> bool:
            return i.state in ("active", "activating") or (i.state == "provisioning" and i.dest == "active")

        have = sum(1 for i in mine if heading_active(i))
        if have < want:
            for i in sorted(mine, key=lambda i: -i.load):
                if have >= want:
                    break
                if i.state == "draining":
                    self._activate(i)
                    have += 1
            for i in reversed(mine):
                if have >= want:
                    break
                if i.state == "standby":
                    i.state = "activating"
                    i.version += 1
                    delay = float(p.profile.standby_activation_s)
                    self._push(self.now_s + delay, _EV_READY, i.index, i.version)
                    have += 1
                elif i.state == "provisioning" and i.dest == "standby":
                    i.dest = "active"
                    have += 1
            while have < want and self._provision(p, role, "active"):
                if initial:
                    self._ready_now(self.instances[-1])
                have += 1
        elif have > want:
            for i in reversed(mine):
                if have <= want:
                    break
                if i.state == "provisioning" and i.dest == "active":
                    i.dest = "standby"  # _adjust_standby trims it if standby is not wanted
                    have -= 1
            for i in reversed(mine):
                if have <= want:
                    break
                if i.state == "activating":
                    i.state = "standby"
                    i.version += 1
                    have -= 1
            for i in sorted((i for i in mine if i.state == "active"), key=lambda i: (i.load, i.instance_id)):
                if have <= want:
                    break
                self._start_drain(i, "gone")
                have -= 1

    def _adjust_standby(self, p: _Pool, role: str, mine: list[Instance], want: int, initial: bool) -> None:
        def heading_standby(i: Instance) -> bool:
            return i.state == "standby" or (i.state in ("provisioning", "draining") and i.dest == "standby")

        have = sum(1 for i in mine if heading_standby(i))
        if have < want:
            for i in mine:
                if have >= want:
                    break
                if i.state == "draining" and i.dest == "gone":
                    i.dest = "standby"
                    have += 1
            while have < want and self._provision(p, role, "standby"):
                if initial:
                    self._ready_now(self.instances[-1])
                have += 1
        elif have > want:
            for i in reversed(mine):
                if have <= want:
                    break
                if i.state == "provisioning" and i.dest == "standby":
                    self._release(i)
                    have -= 1
            for i in reversed(mine):
                if have <= want:
                    break
                if i.state == "standby":
                    self._release(i)
                    have -= 1
                elif i.state == "draining" and i.dest == "standby":
                    i.dest = "gone"
                    have -= 1

    # -- what the controller and the report read --------------------------------------------------------
    def counts(self, pool: str) -> dict[str, dict[str, int]]:
        """``{role: {state: n}}`` for the pool's roles, every state in :data:`STATES` present."""
        p = self._pool_by_name.get(pool)
        if p is None:
            raise KeyError(f"no pool named {pool!r}")
        out = {}
        for role in p.spec.roles:
            out[role] = n = dict.fromkeys(STATES, 0)
            for i in p.members[role]:
                if i.state != "gone":
                    n[i.state] += 1
        return out

    def pending(self, pool: str) -> dict[str, int]:
        """Requests parked at the pool's router because no instance of their role is active, and, with a
        gateway queue, those it holds for the entry role (prefill or mixed: they wait to be prefilled, as a
        server's ``vllm:num_requests_waiting`` counts them) and for decode while no decode instance is
        active. Decode requests held behind busy decode instances are left out, as the controller leaves out
        a decode server's own waiting requests (prefilled, waiting for a slot): see :meth:`gateway_queued`."""
        p = self._pool_by_name[pool]
        out = {role: len(p.pending[role]) for role in p.spec.roles}
        if self.gateway is not None:
            for role in p.spec.roles:
                if role == p.entry_role or not p.ready[role]:
                    out[role] += len(p.gateway[role])
        return out

    def gateway_queued(self, pool: str) -> dict[str, int]:
        """Requests held at the pool's gateway queue now, per role (all 0 without a gateway queue)."""
        p = self._pool_by_name[pool]
        return {role: len(p.gateway[role]) for role in p.spec.roles}

    def gpu_seconds(self) -> float:
        """GPUs x seconds held so far by every instance (provisioning through draining)."""
        return self._gpu_seconds(None)

    def _gpu_seconds(self, pool_index: int | None) -> float:
        """Per node, its GPUs x the union of the intervals its instances held them."""
        total = 0.0
        for node, members in self._node_members.items():
            if pool_index is not None and members[0].pool_index != pool_index:
                continue
            spans = sorted(
                (i.t_alloc_s, self.now_s if math.isnan(i.t_release_s) else i.t_release_s) for i in members
            )
            held, reach = 0.0, -math.inf
            for start, end in spans:
                if end > reach:
                    held += end - max(start, reach)
                    reach = end
            total += self._node_gpus[node] * held
        return total

    def unfinished(self) -> int:
        """Requests neither completed nor rejected."""
        # rejected requests never complete: the requests not completed, less those
        return self.req.completed.count(0) - int(np.count_nonzero(self.rejected))

    def rejected_in(self, pool: str) -> np.ndarray:
        """Bool per request of ``pool``'s trace (arrival order): rejected (no instance can hold it)."""
        p = self._pool_by_name[pool]
        start = sum(len(self.traces[q.spec.name]) for q in self.pools[: p.index])
        return self.rejected[start : start + len(self.traces[pool])]

    @property
    def served_traces(self) -> dict[str, Trace]:
        """Pool -> its trace without the rejected requests (the trace itself where none is): the load the
        fleet serves, which is what a policy sizes for."""
        out = {}
        for name, trace in self.traces.items():
            mine = self.rejected_in(name)
            out[name] = trace.take(np.flatnonzero(~mine)) if mine.any() else trace
        return out

    def observe(self) -> InstanceSamples:
        """One scrape of every instance that exists now (gone ones drop out, as in Prometheus)."""
        now = self.now_s
        live = [i for i in self.instances if i.state != "gone"]
        for i in live:
            i.settle(now, self.req)
        # Called every tick with a policy in the loop: one pass over the instances reads every gauge and
        # counter (a row each), then each metric becomes one float64 column.
        names = [
            NUM_REQUESTS_RUNNING,
            NUM_REQUESTS_WAITING,
            KV_CACHE_USAGE_PERC,
            PROMPT_TOKENS_TOTAL,
            GENERATION_TOKENS_TOTAL,
            NUM_PREEMPTIONS_TOTAL,
            REQUEST_SUCCESS_TOTAL,
            ROUTER_REQUESTS_TOTAL,
            ROUTER_PROMPT_TOKENS_TOTAL,
        ]
        predicted, tail = self.output_predictor is not None, self.tail is not None
        if predicted:
            names.append(PREDICTED_OUTPUT_TOKENS_TOTAL)
        if tail:
            names += [TAIL_PROMOTIONS_TOTAL, STANDBY_PROMOTIONS_TOTAL]
        rows: list[list[float]] = []
        for i in live:
            row = [
                i.running,
                len(i.waiting),
                i.kv_usage(now),
                i.prompt_tokens_total,
                i.generation_tokens(now),
                i.preemptions_total,
                i.success_total,
                i.router_requests_total,
                i.router_prompt_tokens_total,
            ]
            if predicted:
                row.append(i.predicted_output_tokens_total)
            if tail:
                row += [i.tail_promotions_total, i.standby_promotions_total]
            rows.append(row)
        table = np.array(rows, dtype=np.float64).reshape(len(live), len(names))
        values = {name: table[:, j].copy() for j, name in enumerate(names)}  # each its own array, as before
        gauges = {name: values.pop(name) for name in names[:3]}

        def hist(name: str) -> Histogram:
            hs = [getattr(i, name) for i in live]
            bounds = hs[0].bounds if hs else ()
            counts = (
                np.cumsum(np.array([h.counts for h in hs], dtype=np.int64), axis=1)
                if hs
                else np.zeros((0, len(bounds) + 1), dtype=np.int64)
            )
            sums = np.array([h.sum for h in hs], dtype=np.float64)
            return Histogram(bounds_s=bounds, counts=counts, sums=sums)

        return InstanceSamples(
            now_s=now,
            instance_ids=tuple(i.instance_id for i in live),
            pools=tuple(i.pool for i in live),
            roles=tuple(i.role for i in live),
            nodes=tuple(i.node for i in live),
            states=tuple(i.state for i in live),
            gauges=gauges,
            counters=values,
            histograms={
                TIME_TO_FIRST_TOKEN_SECONDS: hist("ttft"),
                INTER_TOKEN_LATENCY_SECONDS: hist("itl"),
                E2E_REQUEST_LATENCY_SECONDS: hist("e2e"),
            },
        )

    def report(
        self, *, policy: str = "", wall_s: float = math.nan, timeline: Timeline | None = None
    ) -> ReplayReport:
        """Summary of every request so far (see :mod:`serving.sim.report` for the definitions)."""
        req = self.req
        for i in self.instances:
            i.settle(self.now_s, req)
        done = req.completions > 0
        rejected = self.rejected
        ttft, itl, e2e = request_latencies_ms(req.arrival_s, req.t_first_s, req.t_done_s, req.target_arr)
        slo_ttft = np.array([p.spec.slo_ttft_ms for p in self.pools])[req.pool]
        slo_itl = np.array([p.spec.slo_itl_ms for p in self.pools])[req.pool]
        met = slo_met(ttft, itl, done, slo_ttft, slo_itl)
        pools: dict[str, dict[str, Any]] = {}
        for p in self.pools:
            mine = req.pool == p.index
            pools[p.spec.name] = {
                "profile": p.spec.profile,
                "requests": int(mine.sum()),
                "completed": int((done & mine).sum()),
                "rejected": int((rejected & mine).sum()),
                "ttft_ms": percentiles(ttft[mine & done]),
                "itl_ms": percentiles(itl[mine & done]),
                "e2e_ms": percentiles(e2e[mine & done]),
                "slo_ttft_ms": p.spec.slo_ttft_ms,
                "slo_itl_ms": p.spec.slo_itl_ms,
                "slo_attainment": float(met[mine].mean()) if mine.any() else math.nan,
                "gpu_seconds": self._gpu_seconds(p.index),
                "tail_promotions": p.tail_promotions,
                "standby_promotions": p.standby_promotions,
            }
            if self.gateway is not None:  # absent when off: today's reports unchanged
                pools[p.spec.name]["gateway_peak"] = {r: p.gateway_peak[r] for r in p.spec.roles}
        profiles = sorted({p.spec.profile for p in self.pools})
        return ReplayReport(
            policy=policy,
            profile=",".join(profiles),
            requests=req.n,
            completed=int(done.sum()),
            unfinished=int(req.n - done.sum() - rejected.sum()),
            rejected=int(rejected.sum()),
            ttft_ms=percentiles(ttft[done]),
            itl_ms=percentiles(itl[done]),
            e2e_ms=percentiles(e2e[done]),
            slo_attainment=float(met.mean()) if req.n else math.nan,
            gpu_seconds=self.gpu_seconds(),
            scale_events=len(self.scale_events),
            preemptions=int(req.preemptions.sum()),
            sim_end_s=self.now_s,
            wall_s=wall_s,
            pools=pools,
            arrival_s=req.arrival_s,
            pool_index=req.pool,
            request_ttft_ms=ttft,
            request_itl_ms=itl,
            timeline=timeline,
        )


def _warn_rejected(pool: _Pool, trace: Trace, rejected: np.ndarray) -> None:
    """One warning per pool naming its first rejected request (by file line when the trace has lines)."""
    idx = np.flatnonzero(rejected)
    i = int(idx[np.argmin(trace.line[idx])]) if trace.line is not None else int(idx[0])
    needs = kv_needs(trace.take(slice(i, i + 1)))
    role = next(r for r in pool.spec.roles if int(needs[r][0]) > pool.kv_tokens[r])
    warnings.warn(
        f"{trace.where(i)}: {len(idx):,} of {len(trace):,} requests of pool {pool.spec.name!r} cannot fit an "
        f"instance's KV cache (the first: {int(trace.prompt_tokens[i]):,} prompt + {int(trace.output_tokens[i]):,} "
        f"output tokens need {int(needs[role][0]):,} KV tokens on a {role} instance; profile "
        f"{pool.spec.profile!r} holds {pool.kv_tokens[role]:,} there); a real vLLM server refuses such a request "
        "(HTTP 400, longer than max_model_len): rejected, counted as rejected and as missing the SLO, the rest "
        "replayed",
        RejectedRequestWarning,
        stacklevel=4,
    )
