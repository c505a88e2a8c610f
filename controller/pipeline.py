"""The per-tick core shared by the live daemon and the simulator's replay policy.

One tick: a scrape (``InstanceSamples``) and each pool's replica counts → per-pool load
(``LoadAggregator``) → smoothed request lengths → one batched forecaster step → ``PoolObservation`` →
``controller.policy.decide`` → the fleet's GPU budget (``allocate_budget``) → per-pool
``ScalingPlan | None`` with its reasons. No I/O: the caller scrapes, reads counts and applies.

``None`` is "no opinion" (the load is unknown): the caller applies nothing for that pool, so unknown data
never scales down. Instances that vanish from the scrape between two ticks mark their pool's observation
incomplete for that tick (the policy may scale up but not down on it), because a vanished node reads as a
drop in load that did not happen.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.capacity import CapacityCache, prompt_load_per_node
from controller.config import ControllerConfig, PolicyConfig
from controller.latency_correction import LatencyCorrection, latency_correction
from controller.policy import (
    PolicyContext,
    PoolCapacity,
    PoolForecast,
    PoolObservation,
    PoolState,
    ScalingPlan,
    decide,
    stages,
)
from controller.policy.decide import (
    RiskTable,
    allocate_budget,
    plan_gpus,
    prefill_floor,
    queue_risk,
    slo_risk,
)
from controller.policy.mixed_node import node_plan
from controller.policy.types import ROLES, RoleHistory, evolve
from controller.sources.aggregate import LoadAggregator, PoolLoad
from forecaster.types import ForecastBatch, Forecaster
from serving.sim.fleet import PoolSpec, RoleCounts
from serving.sim.samples import InstanceSamples

log = logging.getLogger(__name__)

LENGTH_HALFLIFE_S = 60.0  # mean prompt/output lengths are smoothed over about a minute of arrivals


@dataclass(frozen=True)
class PoolSetup:
    """What the pipeline needs to know about one pool: its spec (profile, SLOs) and its policy."""

    spec: PoolSpec
    policy: PolicyConfig

    @property
    def name(self) -> str:
        return self.spec.name


def setups_from_config(cfg: ControllerConfig) -> list[PoolSetup]:
    """One ``PoolSetup`` per configured pool (the spec carries the policy's min/max per role). A pool placed
    on mixed nodes (``placement``, or the local pool's ``actuator.pool.placement``, whose KV splits in the
    proportion of the two servers' memory shares) is sized in nodes on the partitioned capacities."""
    out = []
    local = cfg.actuator.pool if cfg.actuator.kind == "local" else None
    for pool in cfg.pools:
        p = pool.policy
        placement: dict[str, Any] = {}
        if pool.placement == "mixed-node":
            placement = {"placement": "mixed-node", "prefill_mem_frac": pool.prefill_mem_frac}
        if local is not None and local.placement == "mixed-node":
            from serving.pools.local import DEFAULT_PREFILL_SHARE, default_decode_share

            pre = DEFAULT_PREFILL_SHARE if local.prefill_mem_frac is None else local.prefill_mem_frac
            dec = default_decode_share(pre) if local.decode_mem_frac is None else local.decode_mem_frac
            placement = {"placement": "mixed-node", "prefill_mem_frac": pre / (pre + dec)}
        spec = PoolSpec(
            name=pool.name,
            profile=pool.profile,
            slo_ttft_ms=pool.slo_ttft_ms,
            slo_itl_ms=pool.slo_itl_ms,
            prefill=RoleCounts(initial=p.min_prefill, min=p.min_prefill, max=p.max_prefill),
            decode=RoleCounts(initial=p.min_decode, min=p.min_decode, max=p.max_decode),
            **placement,
        )
        out.append(PoolSetup(spec, p))
    return out


@dataclass(frozen=True)
class PoolCounts:
    """A pool's instances per role as the actuator (or simulator) reports them.

    ``replicas``: what the pool is set to (a Deployment's ``spec.replicas``); ``active``: serving;
    ``standby``: warm and out of rotation; ``provisioning``: still starting. ``pending``: requests parked
    in front of the pool with no instance to take them (the simulator's router knows; 0 elsewhere).
    """

    replicas: Mapping[str, int]
    active: Mapping[str, int]
    standby: Mapping[str, int]
    provisioning: Mapping[str, int]
    pending: float = 0.0


BURST_WINDOW_SLOS = 5.0  # the burst rate is smoothed over this many TTFT SLOs (at least MIN_BURST_HALFLIFE_S)
MIN_BURST_HALFLIFE_S = 5.0


def burst_halflife_s(slo_ttft_ms: float) -> float:
    """Half-life of a pool's burst rate: a few TTFT SLOs, the span over which a queue of excess arrivals
    must clear (1-s SLO: 5 s, so a chat burst shows in seconds; 8-s SLO: 40 s, so one 8k-token prompt in
    a second of a 0.3 req/s pool does not read as a 1 req/s burst)."""
    return max(MIN_BURST_HALFLIFE_S, BURST_WINDOW_SLOS * slo_ttft_ms / 1000.0)


@dataclass
class RateTracker:
    """Arrivals/s smoothed with ``halflife_s`` over every tick with a known rate (idle seconds count as 0).

    Bias-corrected (the weight given so far divides the average), and unknown (NaN) until one half-life has
    been seen: one 8k-token request in a 0.3 req/s pool's first second is not a 1 req/s rate.
    """

    halflife_s: float
    total: float = 0.0
    weight: float = 0.0

    @property
    def rps(self) -> float:
        return self.total / self.weight if self.weight >= 0.5 else math.nan

    def update(self, arrival_rps: float, dt_s: float) -> None:
        if not (math.isfinite(arrival_rps) and arrival_rps >= 0):
            return
        a = 1.0 - 0.5 ** (dt_s / self.halflife_s)
        self.total += a * (arrival_rps - self.total)
        self.weight += a * (1.0 - self.weight)


@dataclass
class LengthTracker:
    """Smoothed mean prompt and output lengths of one pool (output ≈ generation tokens per arrival).

    The output length is read as generation tokens/s ÷ arrivals/s, which is the mean output only in steady
    state. Two states bias it low, never high:

    - **warm-up**: a request generates over its whole lifetime, so for the first lifetime of traffic the
      tokens/s measured lag the arrivals that will produce them (a cold pool's first rise reads ~330 tokens
      of ~1,000). The tracker is warming while the seconds with arrivals it has seen are fewer than one
      request lifetime, estimated as output ÷ per-sequence token rate (gen_tps ÷ running), or unknown;
    - **capped**: while the decode fleet is saturated (``stages.decode_saturated``: running ≥ 90 % of its
      sequence capacity), gen_tps is the fleet's throughput, not the load's, and arrivals still rise.

    In either state the measurement is a floor of the mean output, so the estimate may rise but not fall
    (``output_ewma = max(previous, new EWMA)``); elsewhere it is the plain EWMA. Per-sequence evidence
    (running × token rate) cannot lift it further: by Little's law it equals gen_tps and is capped alike.

    While capped, a second reading can: tokens per request *admitted to decode* (completions/s plus the
    change in running sequences), both smoothed alike. A saturated fleet admits requests only as fast as it
    finishes them, so numerator and denominator are capped together and their ratio is the mean output of
    what decode serves, whatever the queue in front of it (a cold sinusoid: ~1,000 where the per-arrival
    ratio reads ~350). It needs ``completion_rps`` (vllm:request_success_total; skipped when NaN) and is used
    only as a further floor while capped: outside saturation a falling fleet (running shrinking) would bias it
    high. The hold errs on the safe side (more decode while unsure) and lasts only while the fleet is full or
    one lifetime: a pool whose outputs really shrink is followed again as soon as decode has headroom.

    The ratio itself (``ratio``, ``PolicyConfig.output_ratio``): 'per-tick' smooths each tick's generation
    divided by the arrivals' EWMA, whose mean lag is about 1.4 half-lives (~87 s) against the generation's
    half a request lifetime, so outside the two states above it also reads high on a rise and low on a fall
    (the 600-s sinusoid: 520–1,690 tokens for a true 1,000); 'smoothed' divides the generation's EWMA by the
    arrivals' EWMA, both over the same ticks with the same weights: exact whenever generation is proportional
    to arrivals, and only the lifetime's lag left otherwise.
    """

    prompt_ewma: float = math.nan
    output_ewma: float = math.nan
    arrivals_ewma: float = math.nan  # over ticks with arrivals only: the per-arrival denominator, not a rate
    rate: RateTracker = field(default_factory=lambda: RateTracker(LENGTH_HALFLIFE_S))  # idle seconds included
    seen_s: float = 0.0  # seconds with arrivals seen so far
    lifetime_s: float = math.nan  # a request's decode lifetime: output ÷ token rate per sequence
    decode_gen_ewma: float = math.nan  # generation tokens/s, ticks with a known admission rate only
    admitted_ewma: float = math.nan  # requests admitted to decode per second: completions + Δrunning/dt
    last_running: float = math.nan
    gen_ewma: float = math.nan  # generation tokens/s, smoothed over the same ticks as arrivals_ewma

    @property
    def rate_ewma(self) -> float:
        """Arrivals/s over about a minute, idle seconds included (NaN until known)."""
        return self.rate.rps

    @property
    def warming(self) -> bool:
        """Fewer seconds of arrivals seen than one request lifetime (or the lifetime is unknown)."""
        return not (math.isfinite(self.lifetime_s) and self.seen_s >= self.lifetime_s)

    def _per_admitted(self, load: PoolLoad, dt_s: float, a: float) -> float:
        """Generation tokens per request admitted to decode, smoothed (NaN until completions are known)."""
        running, prev = load.running, self.last_running
        self.last_running = running
        known = (load.completion_rps, load.gen_tps, running, prev, dt_s)
        if not all(math.isfinite(v) for v in known) or dt_s <= 0:
            return math.nan
        admitted = load.completion_rps + (running - prev) / dt_s
        if math.isnan(self.admitted_ewma):
            self.admitted_ewma = admitted
            self.decode_gen_ewma = load.gen_tps
        else:
            self.admitted_ewma += a * (admitted - self.admitted_ewma)
            self.decode_gen_ewma += a * (load.gen_tps - self.decode_gen_ewma)
        return self.decode_gen_ewma / self.admitted_ewma if self.admitted_ewma > 0 else math.nan

    def update(
        self,
        load: PoolLoad,
        dt_s: float,
        *,
        capped: bool = False,
        mode: str = "admitted",
        ratio: str = "per-tick",
    ) -> None:
        """Fold one scrape in; ``capped``: the decode fleet is saturated, so gen_tps is a floor of the load.
        ``mode`` (``PolicyConfig.output_floor``): 'admitted' = both floors, 'held' = no tokens-per-admitted
        floor, 'off' = the plain EWMA. ``ratio`` (``PolicyConfig.output_ratio``): 'per-tick' or 'smoothed' (see
        the class docstring)."""
        a = 1.0 - 0.5 ** (dt_s / LENGTH_HALFLIFE_S)
        self.rate.update(load.arrival_rps, dt_s)
        per_admitted = self._per_admitted(load, dt_s, a)
        if not (math.isfinite(load.arrival_rps) and load.arrival_rps > 0):
            return

        def ewma(old: float, new: float) -> float:
            if not math.isfinite(new):
                return old
            return new if math.isnan(old) else old + a * (new - old)

        self.prompt_ewma = ewma(self.prompt_ewma, load.mean_prompt_tokens)
        self.arrivals_ewma = ewma(self.arrivals_ewma, load.arrival_rps)
        if math.isfinite(load.gen_tps):
            floor = mode != "off" and (capped or self.warming)
            self.gen_ewma = ewma(self.gen_ewma, load.gen_tps)
            gen = (
                self.gen_ewma
                if ratio == "smoothed"
                else ewma(self.output_ewma * self.arrivals_ewma, load.gen_tps)
            )
            new = gen / self.arrivals_ewma if self.arrivals_ewma > 0 else math.nan
            self.output_ewma = (
                max(self.output_ewma, new) if floor and math.isfinite(self.output_ewma) else new
            )
            if math.isfinite(load.running) and load.running > 0 and load.gen_tps > 0:
                self.lifetime_s = self.output_ewma * load.running / load.gen_tps
            if mode == "admitted" and capped and math.isfinite(per_admitted):
                self.output_ewma = max(self.output_ewma, per_admitted)
        self.seen_s += dt_s


def build_observation(
    pool: str,
    load: PoolLoad,
    counts: PoolCounts,
    now_s: float,
    forecast: PoolForecast | None,
    lengths: LengthTracker,
) -> PoolObservation:
    """The pure policy's input for one pool: measured load, counts, smoothed lengths and the forecast."""
    waiting = load.waiting + counts.pending if math.isfinite(load.waiting) else math.nan
    return PoolObservation(
        pool=pool,
        now_s=now_s,
        replicas={r: int(counts.replicas.get(r, 0)) for r in ROLES},
        active={r: int(counts.active.get(r, 0)) for r in ROLES},
        standby={r: int(counts.standby.get(r, 0)) for r in ROLES},
        provisioning={r: int(counts.provisioning.get(r, 0)) for r in ROLES},
        arrival_rps=load.arrival_rps,
        prompt_tps=load.prompt_tps,
        gen_tps=load.gen_tps,
        running_seqs=load.running,
        waiting_requests=waiting,
        oldest_wait_s=math.nan,
        kv_usage=load.kv_usage,
        mean_prompt_tokens=lengths.prompt_ewma,
        mean_output_tokens=lengths.output_ewma,
        forecast=forecast,
        complete=load.complete,
        prompt_at_arrival=load.prompt_at_arrival,
        pinned_waiting=load.waiting - load.router_waiting,
    )


@dataclass(frozen=True)
class PoolDecision:
    """One pool's outcome of a tick. ``plan`` None = no opinion (apply nothing)."""

    pool: str
    plan: ScalingPlan | None
    observation: PoolObservation
    load: PoolLoad
    forecast: PoolForecast | None
    reasons: tuple[str, ...]
    vanished: tuple[str, ...] = ()  # instances seen in the previous scrape and missing from this one
    # the latency correction (policy.latency_correction): the factor the capacities were computed with, and
    # the smoothed measured / modelled ITL (NaN: off, or no usable reading yet)
    latency_scale: float = 1.0
    latency_estimate: float = math.nan


@dataclass(frozen=True)
class TickResult:
    """Every pool's decision at ``now_s``; ``forecast_error`` says why the forecast was skipped, if it was."""

    now_s: float
    decisions: Mapping[str, PoolDecision]
    forecaster: str
    forecast_error: str | None = None

    def plans(self) -> list[ScalingPlan]:
        return [d.plan for d in self.decisions.values() if d.plan is not None]


def pool_forecast(batch: ForecastBatch, i: int) -> PoolForecast | None:
    """Row ``i`` of a forecast batch, or None when both token forecasts are unknown."""
    fc = PoolForecast(
        horizon_s=batch.horizon_s,
        arrivals_p50=float(batch.arrivals_p50[i]),
        arrivals_p90=float(batch.arrivals_p90[i]),
        prompt_tokens_p90=float(batch.prompt_tokens_p90[i]),
        gen_tokens_p90=float(batch.gen_tokens_p90[i]),
        burst_prob=float(batch.burst_prob[i]),
    )
    return None if math.isnan(fc.prompt_tokens_p90) and math.isnan(fc.gen_tokens_p90) else fc


def recovered_state(counts: PoolCounts, now_s: float) -> PoolState:
    """Policy state for a controller that (re)starts on a running pool: the current replicas count as a
    scale-up made just now and a target wanted just now, so no role scales down before
    ``scale_down_delay_s`` has passed (a fresh ``PoolState`` would allow an immediate full scale-down on the
    first low reading). Scale-up is not held back: it is never the unsafe direction."""
    roles = {
        r: RoleHistory(last_scale_up_s=now_s, recent_targets=((now_s, int(counts.replicas.get(r, 0))),))
        for r in ROLES
    }
    return replace(PoolState(), roles=roles)


@dataclass
class _Track:
    setup: PoolSetup
    capacity: CapacityCache
    lengths: LengthTracker = field(default_factory=LengthTracker)
    state: PoolState = field(default_factory=PoolState)
    previous_state: PoolState = field(default_factory=PoolState)
    instances: frozenset[str] = frozenset()
    burst: RateTracker = field(default_factory=lambda: RateTracker(MIN_BURST_HALFLIFE_S))
    latency: LatencyCorrection | None = None  # None: policy.latency_correction off

    @property
    def latency_scale(self) -> float:
        """The factor the pool's capacities are computed with (1 = the profile's latency model)."""
        return self.latency.factor if self.latency is not None else 1.0


def serving_decode_only(load: PoolLoad) -> int:
    """The pool's serving (active or draining) decode instances, or 0 when it also has serving mixed instances
    (their inter-token gaps hold prefill's interference: not a reading of the engine's speed)."""
    if any(load.counts.get("mixed", {}).get(s, 0) for s in ("active", "draining")):
        return 0
    dec = load.counts.get("decode", {})
    return int(dec.get("active", 0) + dec.get("draining", 0))


class Pipeline:
    """The per-tick core (see the module docstring). Holds the aggregator's previous scrape, the smoothed
    lengths, the policy state per pool and the forecaster's streaming state; does no I/O.

    ``epoch_offset_s`` is added to ``now_s`` for the forecaster's time features (0 when ``now_s`` is
    already Unix time). ``guard_vanished``: mark a pool incomplete for a tick when instances vanish from
    the scrape. ``gpu_budget``: GPUs shared by all pools (None = unbounded); ``gpu_shares``: pool -> GPUs of
    the budget guaranteed to it (others borrow them only while it does not plan to use them); ``reserve``:
    the fleet reserve step before the budget (``ReserveSettings``, ``FleetBudget``; None = off).
    """

    def __init__(
        self,
        pools: Sequence[PoolSetup],
        forecaster: Forecaster,
        *,
        gpu_budget: int | None = None,
        gpu_shares: Mapping[str, int] | None = None,
        reserve: ReserveSettings | None = None,
        epoch_offset_s: float = 0.0,
        guard_vanished: bool = True,
    ) -> None:
        if not pools:
            raise ValueError("Pipeline: at least one pool is needed")
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"Pipeline: pool names must be unique, got {names}")
        if gpu_budget is not None and gpu_budget < 1:
            raise ValueError(f"Pipeline.gpu_budget must be >= 1 or None, got {gpu_budget}")
        self.tracks = {
            p.name: _Track(
                p,
                CapacityCache(p.spec),
                burst=RateTracker(burst_halflife_s(p.spec.slo_ttft_ms)),
                latency=latency_correction(p.spec, p.policy.latency_correction),
            )
            for p in pools
        }
        self.forecaster = forecaster
        self.gpu_budget = gpu_budget
        self.gpu_shares = dict(gpu_shares or {})
        self.budget = (
            FleetBudget(gpu_budget, guarantees=self.gpu_shares, reserve=reserve)
            if gpu_budget is not None
            else None
        )
        self.epoch_offset_s = epoch_offset_s
        self.guard_vanished = guard_vanished
        self.aggregator = LoadAggregator()
        self.last_tick_s = math.nan
        self._seen: set[str] = set()  # every instance id scraped so far
        self._previous: set[str] = set()  # the instance ids of the previous scrape
        self._previous_ids: tuple[str, ...] | None = None  # the same, in its order
        # each pool's instance ids in the scrape of these (instance ids, pools): an unchanged fleet's are kept
        self._members_of: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._members: dict[str, frozenset[str]] = {}
        # mixed-node pools: each role's own last target before the node conversion (``_mixed_nodes``)
        self._role_targets: dict[str, dict[str, int]] = {}
        forecaster.reset(names)

    @property
    def pools(self) -> list[str]:
        return list(self.tracks)

    def recover(self, counts: Mapping[str, PoolCounts], now_s: float) -> None:
        """Seed each pool's policy state from the cluster's counts (see ``recovered_state``)."""
        for name, c in counts.items():
            if name in self.tracks:
                self.tracks[name].state = recovered_state(c, now_s)

    def rollback(self, pool: str) -> None:
        """Forget the last tick's decision for ``pool`` because it was not applied: the policy's memory
        (last scale-up, last change) must describe the cluster, or a failed write would throttle the retry."""
        track = self.tracks[pool]
        track.state = track.previous_state

    def tick(self, samples: InstanceSamples, counts: Mapping[str, PoolCounts], now_s: float) -> TickResult:
        """One decision per pool from this scrape and these counts (see the module docstring)."""
        missing = [p for p in self.tracks if p not in counts]
        if missing:
            raise ValueError(f"Pipeline.tick: no replica counts for pools {missing}")
        dt = now_s - self.last_tick_s if math.isfinite(self.last_tick_s) else 1.0
        self.last_tick_s = now_s
        counts = self._role_counts(counts)
        samples, back = self._mask_returning(samples)
        vanished = self._vanished(samples)
        loads = self.aggregator.update(samples, self.pools)
        for name, load in loads.items():
            track = self.tracks[name]
            capped = self._decode_capped(track, load, counts[name])
            track.lengths.update(
                load,
                dt,
                capped=capped,
                mode=track.setup.policy.output_floor,
                ratio=track.setup.policy.output_ratio,
            )
            self.tracks[name].burst.update(load.arrival_rps, dt)
            if track.latency is not None:
                lengths = track.lengths
                track.latency.update(
                    load, serving_decode_only(load), lengths.prompt_ewma, lengths.output_ewma, dt
                )
        forecasts, error = self._forecast(loads, now_s)
        decisions = {}
        capacities = {}  # the capacity each pool decided with: the budget reads the same
        for name, track in self.tracks.items():
            obs = self._observation(track, loads[name], counts[name], now_s, forecasts[name])
            notes: list[str] = []
            if vanished.get(name):
                obs = replace(obs, complete=False)
                notes.append(f"instances vanished from the scrape: {sorted(vanished[name])}; no scale-down")
            if back.get(name):
                notes.append(
                    f"instances back in the scrape: {sorted(back[name])}; their counters are unknown"
                )
            if error is not None:
                notes.append(f"forecast skipped ({error}); measured load only")
            if track.latency_scale != 1.0:
                notes.append(
                    f"latency correction: engines measured {track.latency_scale:.2f}x the profile's step time"
                    f" ({track.setup.spec.profile}); capacities sized at that speed"
                )
            ctx = self._context(track, obs)
            capacities[name] = ctx.capacity
            track.previous_state = track.state
            plan, track.state = decide(ctx, track.state)
            if plan is None:
                notes.append("no opinion: load unknown (missing or NaN series); holding the current scale")
            else:
                plan = evolve(plan, reasons=(*notes, *plan.reasons))
            reasons = plan.reasons if plan is not None else tuple(notes)
            gone = tuple(sorted(vanished.get(name, ())))
            latency = track.latency
            decisions[name] = PoolDecision(
                name, plan, obs, loads[name], forecasts[name], reasons, gone,
                latency_scale=track.latency_scale,
                latency_estimate=latency.estimate if latency is not None else math.nan,
            )  # fmt: skip
        if self.budget is not None:
            decisions = self._budget(decisions, counts, capacities, now_s)
        decisions = self._mixed_nodes(decisions)
        return TickResult(now_s, decisions, self.forecaster.name, error)

    # -- steps -----------------------------------------------------------------------------------

    def _mixed_nodes(self, decisions: dict[str, PoolDecision]) -> dict[str, PoolDecision]:
        """Mixed-node pools scale whole nodes: both roles at the larger need (``node_plan``, issue 8). Each
        role's own target is remembered: the next tick decides each role from it (``_role_counts``)."""
        for name, d in decisions.items():
            spec = self.tracks[name].setup.spec
            if d.plan is None or spec.placement != "mixed-node":
                continue
            self._role_targets[name] = {"prefill": d.plan.prefill, "decode": d.plan.decode}
            plan = pool_plan(d.plan, spec)
            decisions[name] = replace(d, plan=plan, reasons=plan.reasons)
        return decisions

    def _role_counts(self, counts: Mapping[str, PoolCounts]) -> Mapping[str, PoolCounts]:
        """A mixed-node pool's replicas as each role last wanted them, not the node count both are set to:
        the role that does not bind keeps its own scale-down history (its hysteresis would otherwise hold the
        nodes the other role no longer needs). The nodes actually serving stay in ``active``."""
        if not self._role_targets:
            return counts
        out = dict(counts)
        for name, wanted in self._role_targets.items():
            if name in out:
                c = out[name]
                replicas = {r: min(wanted.get(r, n), n) for r, n in c.replicas.items()}
                out[name] = replace(c, replicas=replicas)
        return out

    def _vanished(self, samples: InstanceSamples) -> dict[str, set[str]]:
        key = (tuple(samples.instance_ids), tuple(samples.pools))
        if key != self._members_of:  # the fleet changed (or the first scrape): group its ids by pool again
            now: dict[str, set[str]] = {p: set() for p in self.tracks}
            for iid, pool in zip(samples.instance_ids, samples.pools, strict=True):
                if pool in now:
                    now[pool].add(iid)
            self._members_of, self._members = key, {p: frozenset(ids) for p, ids in now.items()}
        out = {}
        for name, track in self.tracks.items():
            gone = set(track.instances - self._members[name])
            track.instances = self._members[name]
            if gone and self.guard_vanished:
                out[name] = gone
        return out

    def _mask_returning(self, samples: InstanceSamples) -> tuple[InstanceSamples, dict[str, set[str]]]:
        """Counters of instances that come back after missing scrapes are unknown for this tick.

        The aggregator counts an instance it did not see in the previous scrape from zero, which is right
        for a new instance but turns a returning one's whole counter into one tick's increment (a burst
        that never happened). Their counters read NaN now (the pool's rates are unknown: no opinion) and
        the next tick differences from proper values again.
        """
        ids = samples.instance_ids
        if tuple(ids) == self._previous_ids:  # the previous scrape's instances: none comes back
            return samples, {}
        back_rows = [i for i, iid in enumerate(ids) if iid in self._seen and iid not in self._previous]
        self._seen.update(ids)
        self._previous = set(ids)
        self._previous_ids = tuple(ids)
        if not self.guard_vanished or not back_rows:
            return samples, {}
        counters = {}
        for name, values in samples.counters.items():
            masked = np.array(values, dtype=np.float64, copy=True)
            masked[back_rows] = np.nan
            counters[name] = masked
        back: dict[str, set[str]] = {}
        for i in back_rows:
            back.setdefault(samples.pools[i], set()).add(ids[i])
        return replace(samples, counters=counters), back

    def _forecast(
        self, loads: Mapping[str, PoolLoad], now_s: float
    ) -> tuple[dict[str, PoolForecast | None], str | None]:
        x = np.array([loads[name].channels() for name in self.tracks], dtype=np.float64)
        mask = np.isfinite(x) & (x >= 0)
        try:
            batch = self.forecaster.step(x, mask, now_s=self.epoch_offset_s + now_s)
        except (ValueError, RuntimeError, FloatingPointError) as exc:
            log.warning("forecaster %s failed this tick: %s", self.forecaster.name, exc)
            return {name: None for name in self.tracks}, f"{type(exc).__name__}: {exc}"
        return {name: pool_forecast(batch, i) for i, name in enumerate(self.tracks)}, None

    @staticmethod
    def _decode_capped(track: _Track, load: PoolLoad, c: PoolCounts) -> bool:
        """The active decode fleet is saturated (``stages.DECODE_SATURATED`` of its sequences or more)."""
        active = int(c.active.get("decode", 0))
        if active <= 0:
            return False
        cap = track.capacity.get(
            track.lengths.prompt_ewma, track.lengths.output_ewma, latency_scale=track.latency_scale
        )
        policy = track.setup.policy
        kv = policy.decode_saturated_kv or policy.output_floor_kv == "on"
        if (
            policy.output_floor_kv == "rise" and not kv
        ):  # the rise the policy reads (its usual as of last tick)
            usual = track.state.output_usual
            kv = stages.length_rise(track.lengths.output_ewma, usual, policy.headroom, load.gen_tps, cap)
        return stages.decode_full(active, load.running, load.kv_usage, cap.decode_seqs, kv)

    @staticmethod
    def _observation(
        track: _Track, load: PoolLoad, c: PoolCounts, now_s: float, forecast: PoolForecast | None
    ) -> PoolObservation:
        return build_observation(track.setup.name, load, c, now_s, forecast, track.lengths)

    @staticmethod
    def _context(track: _Track, obs: PoolObservation) -> PolicyContext:
        spec = track.setup.spec
        return PolicyContext(
            obs=obs,
            capacity=track.capacity.get(
                track.lengths.prompt_ewma,
                track.lengths.output_ewma,
                prompt_load_per_node(obs),
                latency_scale=track.latency_scale,
            ),
            config=track.setup.policy,
            slo_ttft_ms=spec.slo_ttft_ms,
            slo_itl_ms=spec.slo_itl_ms,
        )

    def _budget(
        self,
        decisions: dict[str, PoolDecision],
        counts: Mapping[str, PoolCounts],
        capacities: Mapping[str, PoolCapacity],
        now_s: float,
    ) -> dict[str, PoolDecision]:
        """Fit the plans into what the budget leaves after the pools held at their current scale."""
        assert self.budget is not None
        inputs = {}
        for name, d in decisions.items():
            track = self.tracks[name]
            cfg = track.setup.policy
            inputs[name] = BudgetInput(
                plan=d.plan,
                observation=d.observation,
                capacity=capacities[name],
                slo_ttft_ms=track.setup.spec.slo_ttft_ms,
                counts=counts[name],
                floor=(cfg.min_prefill, cfg.min_decode),
                smoothed_rps=track.lengths.rate_ewma,
                burst_rps=track.burst.rps,
                mixed_node=track.setup.spec.placement == "mixed-node",
            )
        out = dict(decisions)
        for name, plan in self.budget.fit(now_s, inputs).items():
            if plan is not None and plan is not decisions[name].plan:
                out[name] = replace(decisions[name], plan=plan, reasons=plan.reasons)
        return out


@dataclass(frozen=True)
class BudgetInput:
    """One pool's part in the fleet's GPU budget: its plan (None = no opinion, held at its current scale),
    what the risk is computed from, and the minimums the budget may not cut below."""

    plan: ScalingPlan | None
    observation: PoolObservation
    capacity: PoolCapacity
    slo_ttft_ms: float
    counts: PoolCounts
    floor: tuple[int, int] = (0, 0)  # (prefill, decode)
    smoothed_rps: float = math.nan  # the pool's arrival rate over about a minute (NaN = unknown)
    burst_rps: float = math.nan  # the rate over a few TTFT SLOs (``burst_halflife_s``; NaN = unknown)
    # placed on PD-mixed nodes: its plan becomes max(prefill, decode) nodes, each node's GPUs counted once
    mixed_node: bool = False

    def plan_gpus(self, plan: ScalingPlan) -> int:
        """GPUs ``plan`` holds for this pool (``decide.plan_gpus``: a mixed node's GPUs once)."""
        return plan_gpus(plan, self.capacity.gpus_per_instance, mixed_node=self.mixed_node)

    def held_gpus(self) -> int:
        """GPUs the pool holds at its current replicas and standby. A mixed pool holds its nodes: the larger
        role's instances, where the replicas of a role the glue counts at its own target (``_role_counts``)
        may read below the nodes still serving or starting."""
        c = self.counts
        if self.mixed_node:
            held = max(
                max(int(c.replicas.get(r, 0)), int(c.active.get(r, 0)) + int(c.provisioning.get(r, 0)))
                + int(c.standby.get(r, 0))
                for r in ROLES
            )
        else:
            held = sum(int(c.replicas.get(r, 0)) + int(c.standby.get(r, 0)) for r in ROLES)
        return held * self.capacity.gpus_per_instance

    def risk_observation(self) -> PoolObservation:
        """What the SLO risk is computed from: the observation with its load replaced by the smoothed
        arrival rate times the smoothed lengths (queue and running sequences kept as measured).

        A one-second reading of a low-rate, long-prompt pool swings by a whole request (0.3 req/s of 8k-token
        prompts reads 0 or 8,000 tok/s), and its p90 forecast follows the swings; arbitrating the budget on
        that gave such a pool the GPUs over a pool with a real queue (bench/bench_fleet.py).
        """
        o, rate = self.observation, self.smoothed_rps
        if not (
            math.isfinite(rate)
            and math.isfinite(o.mean_prompt_tokens)
            and math.isfinite(o.mean_output_tokens)
        ):
            return o
        return replace(
            o,
            arrival_rps=rate,
            prompt_tps=rate * o.mean_prompt_tokens,
            gen_tps=rate * o.mean_output_tokens,
            forecast=None,
        )


def fit_budget(
    budget_gpus: int,
    pools: Mapping[str, BudgetInput],
    *,
    guarantees: Mapping[str, int] | None = None,
    risk_tables: Mapping[str, RiskTable] | None = None,
) -> dict[str, ScalingPlan | None]:
    """All pools' plans of one tick fitted into ``budget_gpus`` by SLO risk (``allocate_budget``).

    A pool without a plan keeps its current replicas and standby, and those GPUs come off the budget first.
    Each planned pool's need (the SLO-risk numerator) is stage 1's instances for the SLO *now* on the load of
    ``BudgetInput.risk_observation`` (the smoothed rate when known, else the p90 forecast or measured load),
    plus the queue cleared within the TTFT SLO (no provisioning lead). ``guarantees``: pool -> GPUs no other
    pool may borrow (see ``allocate_budget``); ``risk_tables``: pool -> risks by count instead of need / count
    (``risk_table``). Plans that fit are returned unchanged (the same objects).
    """
    held_gpus = 0
    plans: list[ScalingPlan] = []
    gpus: dict[str, int] = {}
    for name, b in pools.items():
        gpus[name] = b.capacity.gpus_per_instance
        if b.plan is None:
            held_gpus += b.held_gpus()
        else:
            plans.append(b.plan)
    left = max(budget_gpus - held_gpus, 0)
    out: dict[str, ScalingPlan | None] = {name: b.plan for name, b in pools.items()}
    if sum(pools[p.pool].plan_gpus(p) for p in plans) <= left:
        return out
    needs: dict[str, tuple[float, float]] = {}
    for plan in plans:
        b = pools[plan.pool]
        need = stages.capacity_target(b.risk_observation(), b.capacity, b.slo_ttft_ms / 1000.0)
        needs[plan.pool] = (need.prefill, need.decode) if need is not None else (0.0, 0.0)
    floors = {name: b.floor for name, b in pools.items()}
    mixed = {name for name, b in pools.items() if b.mixed_node}
    chosen = allocate_budget(
        plans,
        needs,
        gpus,
        left,
        floors=floors,
        guarantees=guarantees,
        risk_tables=risk_tables,
        mixed_node=mixed,
    )
    for plan in chosen:
        out[plan.pool] = plan
    return out


@dataclass(frozen=True)
class ReserveSettings:
    """The fleet reserve step of a shared budget (``FleetBudget``): each pool is held at the highest SLO
    floor it needed over the last ``hold_s`` (its queueing floor: the fewest prefill instances whose TTFT
    ``quantile`` meets the SLO, ``queue_risk``, and the decode instances its load needs), and what plans ask
    beyond those floors is pooled into one fleet reserve of ``reserve_gpus`` (None: the largest instance of
    any pool), kept by the pools at the highest SLO risk.

    Why: a pool alone must keep its own headroom, standby and burst reserve within its share; under one
    budget the pools' bursts are not simultaneous, so their reserves need not add up. And capacity released
    in a lull comes back only after a cold start (``hold_s`` >= the profiles' ``cold_start_s``), which is
    longer than a chat burst: a bursty pool keeps the floor its last burst needed.

    ``service_scv`` = 1 (M/M/c): the synthetic long-context trace (lognormal sigma 0.3) would allow less, but
    the real traces' prompts are heavy-tailed (Azure code, Mooncake); with 0.5 the trim starved the chat pool on
    Azure code (bench/bench_fleet.py, docs/BENCHMARKS.md).
    """

    hold_s: float = (
        300.0  # > the 120-s cold start of the a100 profiles: a lull shorter than this keeps capacity
    )
    reserve_gpus: int | None = None
    quantile: float = 0.99  # the TTFT quantile held within the SLO: a pool "meets" its SLO at 99 %
    service_scv: float = 1.0  # prefill time's squared coefficient of variation; 1 = exponential (see below)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.hold_s) and self.hold_s >= 0):
            raise ValueError(f"ReserveSettings.hold_s must be a finite number >= 0, got {self.hold_s!r}")
        if self.reserve_gpus is not None and self.reserve_gpus < 0:
            raise ValueError(f"ReserveSettings.reserve_gpus must be >= 0 or None, got {self.reserve_gpus!r}")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"ReserveSettings.quantile must be in (0, 1), got {self.quantile!r}")
        if not (math.isfinite(self.service_scv) and self.service_scv >= 0):
            raise ValueError(f"ReserveSettings.service_scv must be >= 0, got {self.service_scv!r}")


def slo_floor(b: BudgetInput, settings: ReserveSettings) -> tuple[int, int]:
    """(prefill, decode) instances the pool needs for its SLO at its current rate: prefill by the queueing
    model (``prefill_floor`` on the burst rate, ``BudgetInput.burst_rps``, else the smoothed one, and the
    smoothed mean prompt); decode by stage 1's need on ``risk_observation``. Never below the pool's minimums.

    The floor sizes for the rate, not for a backlog: a queue is cleared by the warm instances (the policy and
    the budget's risk see it), while instances started for it serve only after a cold start, when a chat
    burst is over; holding those for ``hold_s`` would pay for a burst that is gone.
    """
    o = b.risk_observation()
    need = stages.capacity_target(replace(o, waiting_requests=0.0), b.capacity, b.slo_ttft_ms / 1000.0)
    need_d = need.decode if need is not None else 0.0
    rate = b.burst_rps if math.isfinite(b.burst_rps) else b.smoothed_rps  # never a one-second reading
    queue_p = prefill_floor(
        rate,
        _service_s(o, b.capacity),
        b.slo_ttft_ms / 1000.0,
        quantile=settings.quantile,
        service_scv=settings.service_scv,
    )
    return max(queue_p, b.floor[0]), max(math.ceil(need_d - 1e-9), b.floor[1])


def _service_s(o: PoolObservation, cap: PoolCapacity) -> float:
    """One mean prompt's prefill time on one instance (NaN when the mean prompt is unknown)."""
    return o.mean_prompt_tokens / cap.prefill_tps if math.isfinite(o.mean_prompt_tokens) else math.nan


def risk_table(b: BudgetInput, settings: ReserveSettings, up_to: int) -> RiskTable:
    """The pool's SLO risk with 0..``up_to`` instances per role: prefill by its queueing delay against the
    TTFT SLO (``queue_risk``), decode by need / count (``slo_risk``)."""
    o = b.risk_observation()
    service_s, slo_s = _service_s(o, b.capacity), b.slo_ttft_ms / 1000.0
    need = stages.capacity_target(o, b.capacity, slo_s)
    need_p, need_d = (need.prefill, need.decode) if need is not None else (0.0, 0.0)
    known = math.isfinite(o.arrival_rps) and math.isfinite(service_s)
    counts = range(up_to + 1)
    if known:
        q, scv = settings.quantile, settings.service_scv
        prefill = [
            max(
                queue_risk(c, o.arrival_rps, service_s, slo_s, quantile=q, service_scv=scv),
                slo_risk(c, need_p),
            )
            for c in counts
        ]
    else:
        prefill = [slo_risk(c, need_p) for c in counts]
    return prefill, [slo_risk(c, need_d) for c in counts]


class FleetBudget:
    """The budget step of one controller over several pools, with its memory (see ``ReserveSettings``).

    ``fit(now_s, inputs)``: with ``reserve`` set, each planned pool is first raised to its held SLO floor
    and trimmed to those floors plus the fleet reserve (cuts by SLO risk, lowest first); then the hard
    budget (``fit_budget``: ``gpu_budget``, ``guarantees``) as without it. Without ``reserve`` it is
    ``fit_budget`` alone. Plans, reasons and cuts as ``allocate_budget`` writes them.
    """

    def __init__(
        self,
        gpu_budget: int,
        *,
        guarantees: Mapping[str, int] | None = None,
        reserve: ReserveSettings | None = None,
    ) -> None:
        if gpu_budget < 1:
            raise ValueError(f"FleetBudget.gpu_budget must be >= 1, got {gpu_budget}")
        self.gpu_budget = gpu_budget
        self.guarantees = dict(guarantees or {})
        self.reserve = reserve
        # pool -> the SLO floors of the last hold_s: (t_s, prefill, decode)
        self.floors: dict[str, tuple[tuple[float, int, int], ...]] = {}

    def held_floor(self, pool: str, now_s: float, floor: tuple[int, int]) -> tuple[int, int]:
        """Record ``floor`` at ``now_s`` and return the highest floor per role over the last ``hold_s``."""
        assert self.reserve is not None
        keep = [e for e in self.floors.get(pool, ()) if e[0] >= now_s - self.reserve.hold_s]
        keep.append((now_s, floor[0], floor[1]))
        self.floors[pool] = tuple(keep)
        return max(e[1] for e in keep), max(e[2] for e in keep)

    def fit(self, now_s: float, pools: Mapping[str, BudgetInput]) -> dict[str, ScalingPlan | None]:
        if self.reserve is None:
            return fit_budget(self.gpu_budget, pools, guarantees=self.guarantees)
        settings = self.reserve
        planned = {n: b for n, b in pools.items() if b.plan is not None}
        raised: dict[str, BudgetInput] = dict(pools)
        held: dict[str, tuple[int, int]] = {}
        tables: dict[str, RiskTable] = {}
        gpus = {n: b.capacity.gpus_per_instance for n, b in pools.items()}
        for name, b in planned.items():
            assert b.plan is not None
            if name not in self.floors:  # a controller starting on a running pool holds what runs
                running = tuple(int(b.counts.replicas.get(r, 0)) for r in ROLES)
                self.floors[name] = ((now_s, running[0], running[1]),)
            held[name] = self.held_floor(name, now_s, slo_floor(b, settings))
            plan = _raise_to(b.plan, held[name])
            raised[name] = replace(b, plan=plan)
            tables[name] = risk_table(b, settings, max(plan.prefill, plan.decode) + 1)
        reserve_gpus = settings.reserve_gpus if settings.reserve_gpus is not None else max(gpus.values())
        soft = sum(_floor_gpus(held[n], planned[n]) for n in planned) + reserve_gpus
        plans = [b.plan for b in raised.values() if b.plan is not None]
        # A pool with a real backlog keeps this tick's plan (the model may misjudge heavy-tailed prompts);
        # its plan is not held beyond the tick, so a burst's scale-up is not paid for after the burst.
        keep = {
            n: (b.plan.prefill, b.plan.decode) if b.plan is not None and _backlogged(b) else held[n]
            for n, b in raised.items()
            if n in held
        }
        label = f"fleet reserve (held SLO floors + {reserve_gpus} GPUs) ="
        mixed = {n for n, b in pools.items() if b.mixed_node}
        trimmed = allocate_budget(
            plans, {}, gpus, soft, floors=keep, risk_tables=tables, label=label, mixed_node=mixed
        )
        for plan in trimmed:
            raised[plan.pool] = replace(raised[plan.pool], plan=plan)
        # The hard budget cuts above the held floors first; below them only if the floors alone do not fit.
        at_floors = {n: replace(b, floor=held.get(n, b.floor)) for n, b in raised.items()}
        out = fit_budget(self.gpu_budget, at_floors, guarantees=self.guarantees, risk_tables=tables)
        if _gpus_of(out, pools) > self.gpu_budget:
            again = {n: replace(b, plan=out[n]) if n in planned else b for n, b in raised.items()}
            out = fit_budget(self.gpu_budget, again, guarantees=self.guarantees, risk_tables=tables)
        return out


BACKLOG_SLO_FRACTION = 0.5  # a queue the serving prefill instances need half the TTFT SLO to clear is real


def _backlogged(b: BudgetInput) -> bool:
    """The measured queue takes the serving prefill instances over ``BACKLOG_SLO_FRACTION`` of the TTFT SLO."""
    o = b.observation
    waiting, prompt = o.waiting_requests, o.mean_prompt_tokens
    if not (math.isfinite(waiting) and waiting > 0 and math.isfinite(prompt)):
        return False
    active = int(b.counts.active.get("prefill", 0))
    if active <= 0:
        return True
    return (
        waiting * prompt / (active * b.capacity.prefill_tps) > BACKLOG_SLO_FRACTION * b.slo_ttft_ms / 1000.0
    )


def _gpus_of(plans: Mapping[str, ScalingPlan | None], pools: Mapping[str, BudgetInput]) -> int:
    """GPUs of the plans, pools without one counted at their current replicas and standby."""
    total = 0
    for name, b in pools.items():
        plan = plans.get(name)
        total += b.held_gpus() if plan is None else b.plan_gpus(plan)
    return total


def pool_plan(plan: ScalingPlan, spec: PoolSpec) -> ScalingPlan:
    """The plan the pool's actuator gets: for a mixed-node pool, whole nodes (``node_plan``: both roles at
    the larger need, the binding role in the reasons), within the pool's bounds of both roles."""
    if spec.placement != "mixed-node":
        return plan
    return node_plan(plan, max(spec.prefill.min, spec.decode.min), min(spec.prefill.max, spec.decode.max))


def _floor_gpus(floor: tuple[int, int], b: BudgetInput) -> int:
    """GPUs of a (prefill, decode) floor: both roles' instances, or a mixed pool's nodes (the larger)."""
    instances = max(floor) if b.mixed_node else floor[0] + floor[1]
    return instances * b.capacity.gpus_per_instance


def _raise_to(plan: ScalingPlan, floor: tuple[int, int]) -> ScalingPlan:
    """``plan`` with each role at least at ``floor`` (standby promoted first), the raise in its reasons."""
    prefill, decode = max(plan.prefill, floor[0]), max(plan.decode, floor[1])
    if (prefill, decode) == (plan.prefill, plan.decode):
        return plan
    why = (
        f"fleet reserve: held at the SLO floor of the last burst (prefill {floor[0]}, decode {floor[1]}): "
        f"prefill {plan.prefill} → {prefill}, decode {plan.decode} → {decode}"
    )
    return replace(
        plan,
        prefill=prefill,
        decode=decode,
        standby_prefill=max(plan.standby_prefill - (prefill - plan.prefill), 0),
        standby_decode=max(plan.standby_decode - (decode - plan.decode), 0),
        reasons=(*plan.reasons, why),
    )
