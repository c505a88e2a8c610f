"""The controller's policies in the simulator's replay loop: ``reactive``, ``dynamo-like``, ``predictive``
and ``oracle``, registered with ``serving.sim.replay.register_policy`` on import.

Each reads the simulator exactly as the daemon reads Prometheus (per-instance vLLM metrics turned into
per-pool load by ``controller.sources.aggregate``), decides with the pure functions of
``controller.policy`` and answers with scale commands. Only the oracle looks at the trace's future.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import ValidationError

from controller.capacity import CapacityCache, prompt_load_per_node
from controller.config import PolicyConfig, format_validation_error
from controller.pipeline import (
    BudgetInput,
    FleetBudget,
    LengthTracker,
    Pipeline,
    PoolCounts,
    PoolSetup,
    RateTracker,
    ReserveSettings,
    build_observation,
    burst_halflife_s,
    pool_plan,
)
from controller.policy import PoolObservation, ScalingPlan
from controller.policy.dynamo import DynamoConfig, DynamoState, decide_dynamo
from controller.policy.reactive import ReactiveConfig, ReactiveState, decide_reactive
from controller.policy.types import PoolCapacity
from controller.sources.aggregate import LoadAggregator, PoolLoad
from forecaster.types import Forecaster
from serving.sim.fleet import FleetSpec, PoolSpec
from serving.sim.hardware import get_profile
from serving.sim.replay import PolicyOptions, ReplayPolicy, ReplayView, ScaleCommand, register_policy
from serving.workload.trace import Trace

ROLES = ("prefill", "decode")


def _require_disaggregated(fleet: FleetSpec, policy: str) -> None:
    for pool in fleet.pools:
        if not pool.disaggregated:
            raise ValueError(
                f"policy {policy!r}: pool {pool.name!r} is colocated (one vLLM instance doing both phases, "
                "role 'mixed'); the controller sizes prefill and decode instances — run such a pool with "
                "fixed or static-peak, or as PD-mixed nodes (placement: mixed-node, prefill/decode roles)"
            )
        if pool.placement == "mixed-node" and (pool.prefill.standby or pool.decode.standby):
            raise ValueError(
                f"policy {policy!r}: pool {pool.name!r} has placement 'mixed-node', which has no standby tier "
                f"(a warm node would hold both instances' memory), but asks for standby "
                f"prefill={pool.prefill.standby}, decode={pool.decode.standby}: set them to 0"
            )


def _mixed_node_config(config: C, spec: PoolSpec, policy: str) -> C:
    """``config`` for a mixed-node pool: standby fields at their defaults set to 0 (mixed nodes have no
    standby tier); a non-zero standby other than the default is an error naming the pool and the field."""
    if spec.placement != "mixed-node":
        return config
    update = {}
    for name in ("standby_prefill", "standby_decode"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            if value != type(config).model_fields[name].default:
                raise ValueError(
                    f"policy {policy!r}: pool {spec.name!r} has placement 'mixed-node', which has no standby "
                    f"tier; {name}={value} cannot apply: set it to 0"
                )
            update[name] = 0
    return config.model_copy(update=update) if update else config


@dataclass
class _PoolTrack:
    """Per-pool running state the glue keeps beside the pure policy state."""

    spec: PoolSpec
    capacity: CapacityCache
    lengths: LengthTracker = field(default_factory=LengthTracker)
    replicas: dict[str, int] = field(default_factory=dict)  # what the pool was last set to (spec.replicas)
    burst: RateTracker = field(default_factory=lambda: RateTracker(5.0))  # reset() sets the pool's half-life


def view_counts(name: str, view: ReplayView, replicas: Mapping[str, int]) -> PoolCounts:
    """A pool's counts from the simulator's view. ``replicas`` is what the policy last set (a Deployment's
    spec.replicas); before the first decision it is what is serving or on its way to serving."""
    counts = view.counts.get(name, {})
    heading_active = {
        r: sum(counts.get(r, {}).get(s, 0) for s in ("active", "activating", "provisioning")) for r in ROLES
    }
    return PoolCounts(
        replicas={r: replicas.get(r, heading_active[r]) for r in ROLES},
        active={r: counts.get(r, {}).get("active", 0) for r in ROLES},
        standby={r: counts.get(r, {}).get("standby", 0) for r in ROLES},
        provisioning={r: counts.get(r, {}).get("provisioning", 0) for r in ROLES},
        pending=float(sum(view.pending.get(name, {}).values())),
    )


def plan_commands(plan: ScalingPlan, spec: PoolSpec, replicas: dict[str, int]) -> list[ScaleCommand]:
    """The plan as scale commands; records in ``replicas`` the (clamped) counts it sets, as a Deployment would."""
    out = []
    for role in ROLES:
        bounds = spec.role(role)
        replicas[role] = min(max(plan.count(role), bounds.min), bounds.max)
        out.append(ScaleCommand(plan.pool, role, plan.count(role), plan.standby(role)))
    return out


def _epoch_offset(trace: Trace | None) -> float:
    """Wall-clock seconds of the trace's start; 0 (midnight UTC) when the format carries no time of day, so
    the forecaster's time-of-day features see a consistent (if arbitrary) clock."""
    start: datetime | None = trace.start_time if trace is not None else None
    return start.timestamp() if start is not None else 0.0


def _budget_input(
    track: _PoolTrack,
    plan: ScalingPlan | None,
    obs: PoolObservation,
    cap: PoolCapacity,
    counts: PoolCounts,
    floor: tuple[int, int],
) -> BudgetInput:
    """What the fleet budget step needs from one pool's tick (its plan, load, capacity, SLO and rates)."""
    return BudgetInput(
        plan,
        obs,
        cap,
        track.spec.slo_ttft_ms,
        counts,
        floor,
        track.lengths.rate_ewma,
        track.burst.rps,
        mixed_node=track.spec.placement == "mixed-node",
    )


class _ControllerPolicy:
    """Shared plumbing: tracks, aggregation, the tick interval, the fleet's GPU budget."""

    name = "controller"

    def __init__(self) -> None:
        self.tracks: dict[str, _PoolTrack] = {}
        self.aggregator = LoadAggregator()
        self.last_tick_s = math.nan
        self.decisions: list[tuple[float, ScalingPlan]] = []
        self.last_obs: dict[str, PoolObservation] = {}
        self.gpu_budget: int | None = None
        self.gpu_shares: dict[str, int] = {}  # pool -> GPUs of the budget guaranteed to it
        self.reserve: ReserveSettings | None = None  # the fleet reserve step (FleetBudget); None = off
        self.budget: FleetBudget | None = None

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        _require_disaggregated(fleet, self.name)
        self.tracks = {
            p.name: _PoolTrack(p, CapacityCache(p), burst=RateTracker(burst_halflife_s(p.slo_ttft_ms)))
            for p in fleet.pools
        }
        self.aggregator = LoadAggregator()
        self.last_tick_s = math.nan
        self.decisions = []
        self.last_obs = {}
        self.gpu_budget = fleet.gpu_budget
        self.budget = (
            FleetBudget(fleet.gpu_budget, guarantees=self.gpu_shares, reserve=self.reserve)
            if fleet.gpu_budget is not None
            else None
        )

    def _loads(self, view: ReplayView) -> tuple[dict[str, PoolLoad], float]:
        dt = view.now_s - self.last_tick_s if math.isfinite(self.last_tick_s) else 1.0
        self.last_tick_s = view.now_s
        loads = self.aggregator.update(view.samples, list(self.tracks))
        for name, load in loads.items():
            self.tracks[name].lengths.update(load, dt)
            self.tracks[name].burst.update(load.arrival_rps, dt)
        return loads, dt

    def _commands(self, now_s: float, inputs: Mapping[str, BudgetInput]) -> list[ScaleCommand]:
        """Every pool's plan of this tick, fitted into the fleet's GPU budget by SLO risk, as commands."""
        plans = {}
        if self.budget is not None:
            plans = self.budget.fit(now_s, inputs)
        out: list[ScaleCommand] = []
        for name, b in inputs.items():
            plan = plans.get(name, b.plan)
            if plan is not None:
                track = self.tracks[name]
                nodes = pool_plan(plan, track.spec)
                self.decisions.append((now_s, nodes))
                out.extend(plan_commands(nodes, track.spec, track.replicas))
                if nodes is not plan:  # mixed-node: each role decides next from its own target (see Pipeline)
                    track.replicas.update({r: min(plan.count(r), track.replicas[r]) for r in ROLES})
        return out


BC = TypeVar("BC", ReactiveConfig, DynamoConfig)
BS = TypeVar("BS", ReactiveState, DynamoState)


class _BaselinePolicy(_ControllerPolicy, Generic[BC, BS]):
    """A comparison policy over the controller's plumbing: per pool, one pure ``decide_*`` call on the
    aggregated observation, then the fleet's GPU budget by SLO risk. Subclasses name the config and state
    types and the call (``_decide``); ``pool_configs`` (pool name -> config) override ``config`` per pool."""

    config_type: type[BC]
    state_type: type[BS]

    def __init__(
        self,
        config: BC | None = None,
        pool_configs: Mapping[str, BC] | None = None,
        gpu_shares: Mapping[str, int] | None = None,
        reserve: ReserveSettings | None = None,
    ) -> None:
        super().__init__()
        self.gpu_shares = dict(gpu_shares or {})
        self.reserve = reserve
        self.config: BC = config or self.config_type()
        self.pool_configs: dict[str, BC] = dict(pool_configs or {})
        self.configs: dict[str, BC] = {}
        self.states: dict[str, BS] = {}

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        super().reset(fleet, traces)
        _check_pool_names(self.pool_configs, fleet, self.name)
        self.configs = {
            p.name: with_spec_bounds(
                _mixed_node_config(self.pool_configs.get(p.name, self.config), p, self.name), p
            )
            for p in fleet.pools
        }
        self.states = {p.name: self.state_type() for p in fleet.pools}

    def _decide(
        self, obs: PoolObservation, cap: PoolCapacity, cfg: BC, dt: float, track: _PoolTrack, state: BS
    ) -> tuple[ScalingPlan | None, BS]:
        raise NotImplementedError(f"{type(self).__name__}._decide")

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        loads, dt = self._loads(view)
        inputs: dict[str, BudgetInput] = {}
        for name, track in self.tracks.items():
            cfg = self.configs[name]
            counts = view_counts(name, view, track.replicas)
            obs = build_observation(name, loads[name], counts, view.now_s, None, track.lengths)
            cap = track.capacity.get(
                track.lengths.prompt_ewma, track.lengths.output_ewma, prompt_load_per_node(obs)
            )
            plan, self.states[name] = self._decide(obs, cap, cfg, dt, track, self.states[name])
            floor = (cfg.min_prefill, cfg.min_decode)
            inputs[name] = _budget_input(track, plan, obs, cap, counts, floor)
        return self._commands(now_s, inputs)


class ReactivePolicy(_BaselinePolicy[ReactiveConfig, ReactiveState]):
    """HPA-like scaling on measured load (controller.policy.reactive); the fleet's GPU budget by SLO risk.

    ``pool_configs``: per-pool configs (pool name -> config) over ``config`` for the pools they name.
    """

    name = "reactive"
    config_type = ReactiveConfig
    state_type = ReactiveState

    def _decide(
        self,
        obs: PoolObservation,
        cap: PoolCapacity,
        cfg: ReactiveConfig,
        dt: float,
        track: _PoolTrack,
        state: ReactiveState,
    ) -> tuple[ScalingPlan | None, ReactiveState]:
        return decide_reactive(obs, cap, cfg, track.spec.slo_ttft_ms, state)


class DynamoLikePolicy(_BaselinePolicy[DynamoConfig, DynamoState]):
    """Dynamo planner's SLA mode (controller.policy.dynamo); the fleet's GPU budget by SLO risk."""

    name = "dynamo-like"
    config_type = DynamoConfig
    state_type = DynamoState

    def _decide(
        self,
        obs: PoolObservation,
        cap: PoolCapacity,
        cfg: DynamoConfig,
        dt: float,
        track: _PoolTrack,
        state: DynamoState,
    ) -> tuple[ScalingPlan | None, DynamoState]:
        return decide_dynamo(obs, cap, cfg, dt, state)


ForecasterFactory = Callable[[], Forecaster]


def default_forecaster() -> Forecaster:
    """The shipped checkpoint when it exists and loads; otherwise the Holt baseline (said in the name)."""
    from controller.forecasting import load_default_forecaster

    return load_default_forecaster()


class PredictivePolicy:
    """pdscale's policy: forecast each pool's next ``horizon_s``, then the staged decision of
    ``controller.policy.decide`` (capacity from the p90 forecast, headroom, buffer, standby, P:D, hysteresis).

    A thin adapter over ``controller.pipeline.Pipeline``, the same per-tick core the live daemon runs: this
    class only turns the replay view into ``PoolCounts`` and plans into scale commands. All pools are decided
    in one tick; the pipeline gets the fleet's ``gpu_budget`` and, when it binds, gives the GPUs to the pool at
    the highest SLO risk (``controller.policy.decide.allocate_budget``; the simulator also refuses to start
    instances beyond the budget). ``gpu_shares`` (pool -> GPUs) are guaranteed: another pool borrows them only
    while their pool does not plan to use them. ``pool_configs`` (pool name -> config) override ``config``
    per pool; each pool's min/max are narrowed to its ``PoolSpec`` bounds.
    """

    name = "predictive"

    def __init__(
        self,
        config: PolicyConfig | None = None,
        forecaster: ForecasterFactory = default_forecaster,
        pool_configs: Mapping[str, PolicyConfig] | None = None,
        gpu_shares: Mapping[str, int] | None = None,
        reserve: ReserveSettings | None = None,
    ) -> None:
        self.config = config or PolicyConfig()
        self.gpu_shares = dict(gpu_shares or {})
        self.reserve = reserve
        self.pool_configs = dict(pool_configs or {})
        self.make_forecaster = forecaster
        self.forecaster: Forecaster | None = None
        self.pipeline: Pipeline | None = None
        self.specs: dict[str, PoolSpec] = {}
        self.replicas: dict[str, dict[str, int]] = {}  # what each pool was last set to (spec.replicas)
        self.decisions: list[tuple[float, ScalingPlan]] = []
        self.last_obs: dict[str, PoolObservation] = {}

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        _require_disaggregated(fleet, self.name)
        _check_pool_names(self.pool_configs, fleet, self.name)
        self.specs = {p.name: p for p in fleet.pools}
        self.replicas = {p.name: {} for p in fleet.pools}
        self.decisions = []
        self.last_obs = {}
        self.forecaster = self.make_forecaster()
        setups = [
            PoolSetup(p, with_spec_bounds(_mixed_node_config(self.pool_configs.get(p.name, self.config), p,
                                                             self.name), p))
            for p in fleet.pools
        ]  # fmt: skip
        self.pipeline = Pipeline(
            setups,
            self.forecaster,
            gpu_budget=fleet.gpu_budget,
            gpu_shares=self.gpu_shares,
            reserve=self.reserve,
            epoch_offset_s=_epoch_offset(traces.get(fleet.pools[0].name)),
            guard_vanished=False,  # the simulator's instances leave only by scale-down: nothing is hidden
        )

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        assert self.pipeline is not None, "reset() first"
        counts = {name: view_counts(name, view, self.replicas[name]) for name in self.specs}
        result = self.pipeline.tick(view.samples, counts, now_s)
        out: list[ScaleCommand] = []
        for name, decision in result.decisions.items():
            self.last_obs[name] = decision.observation
            plan = decision.plan
            if plan is None:
                continue
            self.decisions.append((now_s, plan))  # mixed-node pools: in nodes already (Pipeline)
            out.extend(plan_commands(plan, self.specs[name], self.replicas[name]))
        return out


C = TypeVar("C", PolicyConfig, ReactiveConfig, DynamoConfig)


def with_spec_bounds(config: C, spec: PoolSpec) -> C:
    """``config`` with its per-role min/max narrowed to the pool's bounds (``PoolSpec.prefill``/``decode``):
    the policy never plans what the actuator would clamp away, so the GPU budget counts what will run."""
    update = {
        "min_prefill": max(config.min_prefill, spec.prefill.min),
        "max_prefill": min(config.max_prefill, spec.prefill.max),
        "min_decode": max(config.min_decode, spec.decode.min),
        "max_decode": min(config.max_decode, spec.decode.max),
    }
    if all(getattr(config, k) == v for k, v in update.items()):
        return config
    try:
        return type(config).model_validate({**config.model_dump(), **update})
    except ValidationError as exc:
        raise ValueError(
            f"pool {spec.name!r}: the policy's bounds do not fit the pool's: {format_validation_error(exc)}"
        ) from None


def _check_pool_names(configs: Mapping[str, object], fleet: FleetSpec, policy: str) -> None:
    unknown = sorted(set(configs) - {p.name for p in fleet.pools})
    if unknown:
        raise ValueError(
            f"policy {policy!r}: per-pool parameters for {unknown}, which the fleet does not have "
            f"(pools: {[p.name for p in fleet.pools]})"
        )


@dataclass
class OraclePolicy:
    """Knows every future arrival; pays the same start-up delays. The cost floor of the comparison.

    Per second τ of the trace it computes the instances the capacity model says that second's load needs
    (prompt tokens for prefill; generation tokens/s and concurrency for decode, each request decoding for
    output / per-sequence rate seconds after its arrival), with no headroom. At time t it holds the most
    any second in [t, t + cold start] needs — what is started now is ready just in time — and scales down as
    soon as the need falls. Ignores metrics entirely.
    """

    name: str = "oracle"
    window_s: float = 5.0
    # per-second needs × (1 + headroom) before the ceil: 0 is the fluid floor; the least headroom at
    # which the oracle meets the SLO is the "SLO-matched" reference (bench/bench_policies.py, oracle@slo)
    headroom: float = 0.0
    needs: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    lead_s: dict[str, float] = field(default_factory=dict)
    mixed_node: set[str] = field(default_factory=set)  # pools placed on PD-mixed nodes (sized in nodes)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.headroom) and 0.0 <= self.headroom <= 10.0):
            raise ValueError(
                f"oracle parameter 'headroom' must be a number in [0, 10], got {self.headroom!r}"
            )

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        _require_disaggregated(fleet, self.name)
        self.needs = {}
        self.mixed_node = {p.name for p in fleet.pools if p.placement == "mixed-node"}
        for pool in fleet.pools:
            trace = traces.get(pool.name)
            if trace is None or len(trace) == 0:
                continue
            self.needs[pool.name] = oracle_needs(pool, trace, self.window_s, self.headroom)
            self.lead_s[pool.name] = get_profile(pool.profile).cold_start_s

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        out: list[ScaleCommand] = []
        for name, (prefill, decode) in self.needs.items():
            lo = int(now_s)
            hi = min(int(now_s + self.lead_s[name]) + 1, len(prefill))
            if lo >= hi:
                out += [ScaleCommand(name, "prefill", 1), ScaleCommand(name, "decode", 1)]
                continue
            n_prefill, n_decode = max(1, int(prefill[lo:hi].max())), max(1, int(decode[lo:hi].max()))
            if name in self.mixed_node:  # whole nodes: both roles at the larger need
                n_prefill = n_decode = max(n_prefill, n_decode)
            out.append(ScaleCommand(name, "prefill", n_prefill))
            out.append(ScaleCommand(name, "decode", n_decode))
        return out


def oracle_needs(
    pool: PoolSpec, trace: Trace, window_s: float, headroom: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-second instances needed (prefill, decode), from the trace's true future load, × (1 + headroom)
    before the ceil."""
    from controller.capacity import pool_capacity

    prompt = np.maximum(trace.prompt_tokens, 1).astype(np.float64)
    output = np.maximum(trace.output_tokens, 1).astype(np.float64)
    cap = pool_capacity(pool, float(prompt.mean()), float(output.mean()))
    per_seq_tps = cap.decode_tps / cap.decode_seqs
    n_sec = int(trace.arrival_s[-1] + output.max() / per_seq_tps) + 2
    sec = np.floor(trace.arrival_s).astype(np.int64)
    prompt_per_s = np.bincount(sec, weights=prompt, minlength=n_sec)[:n_sec]
    # Each request decodes from its arrival for output / per-sequence-rate seconds: +1 sequence over that span.
    end = np.minimum(sec + np.ceil(output / per_seq_tps).astype(np.int64) + 1, n_sec - 1)
    diff = np.zeros(n_sec + 1)
    np.add.at(diff, sec, 1.0)
    np.add.at(diff, end, -1.0)
    concurrency = np.cumsum(diff)[:n_sec]
    w = max(int(window_s), 1)
    kernel = np.ones(w) / w
    prompt_tps = np.convolve(prompt_per_s, kernel, mode="full")[:n_sec]  # trailing mean over the window
    scale = 1.0 + headroom
    prefill = np.ceil(scale * prompt_tps / cap.prefill_tps - 1e-9)
    decode = np.ceil(
        scale * np.maximum(concurrency / cap.decode_seqs, concurrency * per_seq_tps / cap.decode_tps) - 1e-9
    )
    return prefill, decode


POOL_PARAMS = "pools"  # PolicyOptions.params key: {pool name: {config field: value}} per-pool overrides
GPU_SHARES = "gpu_shares"  # PolicyOptions.params key: {pool name: GPUs of the budget guaranteed to it}
FLEET_RESERVE = (
    "fleet_reserve"  # PolicyOptions.params key: true or {ReserveSettings field: value}; absent = off
)
FLEET_KEYS = (POOL_PARAMS, GPU_SHARES, FLEET_RESERVE)


def _policy_config(options: PolicyOptions, model: type[Any]) -> Any:
    params = {k: v for k, v in options.params.items() if k not in FLEET_KEYS}
    try:
        return model(**params)
    except Exception as exc:  # pydantic's ValidationError names the field
        raise ValueError(f"invalid parameters for the policy: {exc}") from exc


def _pool_configs(options: PolicyOptions, base: C) -> dict[str, C]:
    """Per-pool configs from ``options.params["pools"]``: each pool's overrides over ``base``, validated by
    the policy's own pydantic model (errors name the pool and the field)."""
    raw = options.params.get(POOL_PARAMS, {})
    if not isinstance(raw, Mapping):
        raise ValueError(f"policy parameter {POOL_PARAMS!r} must map pool names to parameter mappings")
    out: dict[str, C] = {}
    for pool, overrides in raw.items():
        if not isinstance(overrides, Mapping):
            raise ValueError(f"pools[{pool}].policy must be a mapping of parameters, got {overrides!r}")
        try:
            out[str(pool)] = type(base).model_validate({**base.model_dump(), **overrides})
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, f"pools[{pool}].policy")) from None
    return out


def _gpu_shares(options: PolicyOptions) -> dict[str, int]:
    raw = options.params.get(GPU_SHARES, {})
    if not isinstance(raw, Mapping) or not all(isinstance(v, int) and v >= 0 for v in raw.values()):
        raise ValueError(
            f"policy parameter {GPU_SHARES!r} must map pool names to GPU counts >= 0, got {raw!r}"
        )
    return {str(k): int(v) for k, v in raw.items()}


def fleet_reserve(options: PolicyOptions) -> ReserveSettings | None:
    """The fleet reserve step's settings from ``options.params["fleet_reserve"]``: absent or false = off,
    true = the defaults, a mapping = ``ReserveSettings`` fields (errors name the field)."""
    raw = options.params.get(FLEET_RESERVE, False)
    if raw is False or raw is None:
        return None
    if raw is True:
        return ReserveSettings()
    if not isinstance(raw, Mapping):
        raise ValueError(f"policy parameter {FLEET_RESERVE!r} must be true, false or a mapping, got {raw!r}")
    known = {f.name for f in dataclasses.fields(ReserveSettings)}
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        raise ValueError(
            f"policy parameter {FLEET_RESERVE!r}: unknown fields {unknown} (known: {sorted(known)})"
        )
    try:
        return ReserveSettings(**{str(k): v for k, v in raw.items()})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy parameter {FLEET_RESERVE!r}: {exc}") from None


def _no_counts(options: PolicyOptions, name: str) -> None:
    if options.prefill is not None or options.decode is not None or options.mixed is not None:
        raise ValueError(
            f"policy {name!r} decides its own counts: --prefill/--decode/--mixed only go with 'fixed'"
        )


def _reactive(options: PolicyOptions) -> ReplayPolicy:
    _no_counts(options, "reactive")
    base: ReactiveConfig = _policy_config(options, ReactiveConfig)
    return ReactivePolicy(base, _pool_configs(options, base), _gpu_shares(options), fleet_reserve(options))


def _dynamo(options: PolicyOptions) -> ReplayPolicy:
    _no_counts(options, "dynamo-like")
    base: DynamoConfig = _policy_config(options, DynamoConfig)
    return DynamoLikePolicy(base, _pool_configs(options, base), _gpu_shares(options), fleet_reserve(options))


def _predictive(options: PolicyOptions) -> ReplayPolicy:
    _no_counts(options, "predictive")
    base: PolicyConfig = _policy_config(options, PolicyConfig)
    return PredictivePolicy(
        base,
        pool_configs=_pool_configs(options, base),
        gpu_shares=_gpu_shares(options),
        reserve=fleet_reserve(options),
    )


def _oracle(options: PolicyOptions) -> ReplayPolicy:
    """``--param headroom=H`` (H in [0, 10], default 0: the issue's floor) scales the oracle's needs."""
    _no_counts(options, "oracle")
    unknown = sorted(set(options.params) - {"headroom"})
    if unknown:
        raise ValueError(f"policy 'oracle' takes only the parameter 'headroom', got {unknown}")
    raw = options.params.get("headroom", 0.0)
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"oracle parameter 'headroom' must be a number, got {raw!r}")
    try:
        headroom = float(raw)
    except ValueError:
        raise ValueError(f"oracle parameter 'headroom' must be a number, got {raw!r}") from None
    return OraclePolicy(headroom=headroom)


register_policy("reactive", _reactive)
register_policy("dynamo-like", _dynamo)
register_policy("predictive", _predictive)
register_policy("oracle", _oracle)
