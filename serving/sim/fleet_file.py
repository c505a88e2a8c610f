"""FLEET.yaml: several model pools, each with its own trace, under one GPU budget — and its replay.

The file (``pdscale replay --fleet FLEET.yaml``)::

    gpu_budget: 40                      # GPUs shared by every pool
    duration_s: 1000                    # optional: replay only the traces' first 1000 s
    pools:
      - name: chat
        profile: llama3-8b/a100         # MODEL/GPU, see `pdscale sim profiles`
        trace: ../datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv  # relative to this file
        format: azure                   # optional, detected from the file
        model: null                     # optional: keep only rows of this model (BurstGPT's Model column)
        slo_ttft_ms: 1000
        slo_itl_ms: 50
        router: least-loaded            # optional
        prefill: {min: 1, max: 16}      # optional bounds (initial, standby, min, max)
        decode: {min: 1, max: 16}
        policy: {headroom: 0.4}         # optional overrides of the replay policy's parameters for this pool

``policy:`` is kept as a plain mapping here (serving does not know the controller's models); the policy's
factory validates it (``PolicyOptions.params["pools"][name]``, see ``controller.replay_policies``) and its
errors name the pool and the field.

Two ways to spend the budget (:func:`replay_fleet`):

- ``shared``: one policy decides every pool in one tick with the whole budget (the controller allocates it
  by SLO risk when it binds; the simulator refuses instances beyond it). Each pool's static share (below) is
  guaranteed to it: others borrow those GPUs only while it does not plan to use them. With two pools or more
  the controller's fleet reserve step is on (``params["fleet_reserve"]``, ``controller.pipeline.FleetBudget``):
  each pool is held at the SLO floor its last burst needed, and what plans ask beyond the floors is pooled
  into one reserve. A one-pool fleet runs without it (nor shares): the same replay as ``pdscale replay
  --policy P`` with the file's bounds, SLOs and ``gpu_budget``.
- ``static``: the budget is split in proportion to each pool's peak demand in GPUs (the capacity model on
  the trace's busiest 60 s, :func:`serving.sim.replay.static_peak_counts`) and each pool replays alone,
  with its own copy of the policy, inside its share. The figures are summed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.report import ReplayReport, percentiles
from serving.workload.trace import Trace

if TYPE_CHECKING:
    from serving.sim.replay import PolicyOptions, ReplayPolicy

SPLITS: tuple[str, ...] = ("shared", "static")
POOL_PARAMS = "pools"  # the PolicyOptions.params key carrying per-pool policy overrides
GPU_SHARES = "gpu_shares"  # the PolicyOptions.params key carrying each pool's guaranteed GPUs (shared split)
FLEET_RESERVE = "fleet_reserve"  # the PolicyOptions.params key switching the controller's fleet reserve step


class FleetFileError(ValueError):
    """A fleet file is invalid; the message names the file and the field."""


class RoleBounds(BaseModel):
    """Counts of one role: ``initial`` (default: ``max(min, 1)``), warm ``standby``, actuator ``min``/``max``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial: int | None = Field(None, ge=0, description="instances at t=0 before the policy's first answer")
    standby: int = Field(0, ge=0, description="warm standby instances at t=0")
    min: int = Field(0, ge=0, description="the actuator never goes below this")
    max: int = Field(64, ge=0, description="the actuator never goes above this")

    def counts(self) -> RoleCounts:
        initial = self.initial if self.initial is not None else min(max(self.min, 1), self.max)
        return RoleCounts(initial=initial, standby=self.standby, min=self.min, max=self.max)


class FleetPool(BaseModel):
    """One pool of the fleet file: a model on a hardware profile, its trace, SLOs and bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="pool name (metrics' pool label)")
    profile: str = Field("llama3-8b/a100", description="hardware profile MODEL/GPU")
    trace: Path = Field(
        description="trace file (Azure CSV, Mooncake JSONL, BurstGPT CSV); relative to the file"
    )
    format: Literal["azure", "mooncake", "burstgpt"] | None = Field(None, description="default: detected")
    model: str | None = Field(None, description="keep only rows of this model (the trace's model column)")
    slo_ttft_ms: float = Field(1000.0, gt=0.0, description="time-to-first-token SLO, ms")
    slo_itl_ms: float = Field(50.0, gt=0.0, description="mean inter-token latency SLO, ms")
    router: str = Field("least-loaded", description="round-robin, least-loaded or context-aware")
    placement: Literal["dedicated", "mixed-node"] = "dedicated"
    mixed_node_slowdown: float | None = Field(
        None,
        ge=1.0,
        description="mixed-node: fixed decode slowdown (default: derived, serving/sim/interference.py)",
    )
    prefill: RoleBounds = Field(default_factory=RoleBounds)
    decode: RoleBounds = Field(default_factory=RoleBounds)
    mixed: RoleBounds | None = Field(None, description="colocated instances instead of prefill/decode")
    policy: dict[str, Any] = Field(default_factory=dict, description="policy parameter overrides (this pool)")

    def spec(self) -> PoolSpec:
        none = RoleCounts(initial=0, max=0)
        if self.mixed is not None:
            prefill, decode, mixed = none, none, self.mixed.counts()
        else:
            prefill, decode, mixed = self.prefill.counts(), self.decode.counts(), none
        return PoolSpec(
            name=self.name,
            profile=self.profile,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_itl_ms=self.slo_itl_ms,
            router=self.router,
            placement=self.placement,
            mixed_node_slowdown=self.mixed_node_slowdown,
            prefill=prefill,
            decode=decode,
            mixed=mixed,
        )


class FleetFile(BaseModel):
    """The whole fleet file: a GPU budget and the pools that share it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_budget: int = Field(ge=1, description="GPUs shared by every pool")
    duration_s: float | None = Field(None, gt=0.0, description="replay only the traces' first DURATION_S s")
    pools: list[FleetPool] = Field(min_length=1)


@dataclass(frozen=True)
class Fleet:
    """A loaded fleet file: the simulator's spec, each pool's trace, and per-pool policy overrides."""

    spec: FleetSpec
    traces: Mapping[str, Trace]
    policy_params: Mapping[str, Mapping[str, Any]]  # pool -> parameter overrides (non-empty ones only)
    source: str


def parse_fleet_file(path: Path) -> FleetFile:
    """Read and validate ``path`` (YAML or JSON); every error names the file and the field."""
    import yaml

    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FleetFileError(f"{path}: no such fleet file") from None
    except yaml.YAMLError as exc:
        raise FleetFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise FleetFileError(f"{path}: the top level must be a mapping with gpu_budget and pools")
    try:
        doc = FleetFile.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"{path}: {loc}: {e['msg']} (got {e.get('input')!r})")
        raise FleetFileError("\n".join(lines)) from None
    names = [p.name for p in doc.pools]
    if len(set(names)) != len(names):
        raise FleetFileError(f"{path}: pools: names must be unique, got {names}")
    return doc


def load_fleet_file(path: Path, *, duration_s: float | None = None) -> Fleet:
    """The fleet file at ``path`` with its traces read (relative paths against the file's folder), rows of
    ``model`` selected where a pool names one, and cut to ``duration_s`` (the argument wins over the file's).
    """
    from serving.workload.readers import read_trace

    doc = parse_fleet_file(path)
    try:
        spec = FleetSpec(pools=tuple(p.spec() for p in doc.pools), gpu_budget=doc.gpu_budget)
    except ValueError as exc:
        raise FleetFileError(f"{path}: {exc}") from None
    limit_s = duration_s if duration_s is not None else doc.duration_s
    cache: dict[tuple[Path, str | None], Trace] = {}
    traces: dict[str, Trace] = {}
    for i, pool in enumerate(doc.pools):
        where = f"{path}: pools[{i}] ({pool.name})"
        file = pool.trace if pool.trace.is_absolute() else path.parent / pool.trace
        key = (file.resolve(), pool.format)
        if key not in cache:
            if not file.exists():
                raise FleetFileError(f"{where}.trace: no such file {file}")
            cache[key] = read_trace(file, pool.format)
        trace = cache[key]
        if pool.model is not None:
            trace = select_model(trace, pool.model, f"{where}.model")
        if limit_s is not None:
            trace = trace.window(-math.inf, limit_s)
        traces[pool.name] = trace
    params = {p.name: dict(p.policy) for p in doc.pools if p.policy}
    return Fleet(spec=spec, traces=traces, policy_params=params, source=str(path))


def select_model(trace: Trace, model: str, where: str = "model") -> Trace:
    """The rows of ``trace`` whose model column is ``model`` (times keep the file's clock, so pools cut from
    one file stay aligned); an error listing the available names when the trace has no such model."""
    if model not in trace.model_names:
        available = ", ".join(repr(n) for n in trace.model_names) or "none: the trace has no model column"
        raise FleetFileError(f"{where}: {model!r} is not in trace {trace.source} (models: {available})")
    code = trace.model_names.index(model)
    return trace.take(np.flatnonzero(trace.model == code))


# -- budget split ---------------------------------------------------------------------------------------
def peak_demand_gpus(pool: PoolSpec, trace: Trace) -> int:
    """GPUs the capacity model says ``trace``'s busiest 60 s need on ``pool`` (static-peak sizing); a
    mixed-node pool's prefill and decode instances share their node's GPUs."""
    from serving.sim.hardware import get_profile
    from serving.sim.replay import static_peak_counts

    counts = static_peak_counts(pool, trace)
    instances = max(counts.values()) if pool.placement == "mixed-node" else sum(counts.values())
    return instances * int(get_profile(pool.profile).gpus)


def static_split(fleet: FleetSpec, traces: Mapping[str, Trace]) -> dict[str, int]:
    """The budget split in proportion to each pool's peak demand in GPUs (largest remainder, so the shares
    add up to the budget exactly; every pool gets at least one GPU)."""
    peaks = {p.name: peak_demand_gpus(p, traces[p.name]) for p in fleet.pools}
    total = sum(peaks.values())
    if fleet.gpu_budget < len(fleet.pools):
        raise ValueError(f"gpu_budget={fleet.gpu_budget} cannot give each of {len(fleet.pools)} pools a GPU")
    total = max(total, 1)
    exact = {n: fleet.gpu_budget * v / total for n, v in peaks.items()}
    share = {n: max(math.floor(x), 1) for n, x in exact.items()}
    by_remainder = sorted(exact, key=lambda n: exact[n] - math.floor(exact[n]), reverse=True)
    i = 0
    while sum(share.values()) < fleet.gpu_budget:
        share[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    while sum(share.values()) > fleet.gpu_budget:  # the 1-GPU floors overshot: take from the largest
        share[max(share, key=lambda n: share[n])] -= 1
    return share


# -- replay ---------------------------------------------------------------------------------------------
POOL_FIGURES = ("requests", "completed", "dropped", "unfinished", "rejected", "slo_attainment", "gpu_seconds")


@dataclass(frozen=True, eq=False)
class FleetReplay:
    """A fleet replay's outcome: ``shared`` holds one report for the whole fleet, ``static`` one per pool.

    ``budgets``: pool -> GPUs it could use (the whole budget for every pool when shared).
    ``peak_demand_gpus``: pool -> the capacity model's GPUs for its trace's busiest 60 s.
    """

    split: str
    policy: str
    gpu_budget: int
    budgets: Mapping[str, int]
    peak_demand_gpus: Mapping[str, int]
    reports: Mapping[str, ReplayReport]  # "fleet" -> report (shared) or pool -> report (static)
    wall_s: float

    def pool_figures(self) -> dict[str, dict[str, Any]]:
        """Pool -> the figures of a single-pool replay (shared: from the fleet report's per-pool summary;
        per-pool scale events are not in it)."""
        out: dict[str, dict[str, Any]] = {}
        if self.split == "shared":
            report = self.reports["fleet"]
            for name, p in report.pools.items():
                out[name] = {
                    **p,
                    "dropped": 0,
                    "unfinished": p["requests"] - p["completed"] - p["rejected"],
                    "gpu_hours": p["gpu_seconds"] / 3600.0,
                    "gpu_budget": self.budgets[name],
                    "peak_demand_gpus": self.peak_demand_gpus[name],
                }
            return out
        for name, report in self.reports.items():
            doc = report.to_json()
            doc.pop("pools", None)
            doc.pop("policy", None)
            doc["slo_ttft_ms"] = report.pools[name]["slo_ttft_ms"]
            doc["slo_itl_ms"] = report.pools[name]["slo_itl_ms"]
            doc["gpu_budget"] = self.budgets[name]
            doc["peak_demand_gpus"] = self.peak_demand_gpus[name]
            out[name] = doc
        return out

    def totals(self) -> dict[str, Any]:
        """The fleet's figures: sums over pools, attainment over every request of every pool."""
        reports = list(self.reports.values())
        requests = sum(r.requests for r in reports)
        met = sum(r.slo_attainment * r.requests for r in reports if r.requests)
        ttft = np.concatenate([r.request_ttft_ms for r in reports])
        itl = np.concatenate([r.request_itl_ms for r in reports])
        return {
            "requests": requests,
            "completed": sum(r.completed for r in reports),
            "dropped": sum(r.dropped for r in reports),
            "unfinished": sum(r.unfinished for r in reports),
            "rejected": sum(r.rejected for r in reports),
            "over_context": sum(r.over_context for r in reports),
            "slo_attainment": met / requests if requests else math.nan,
            "gpu_seconds": sum(r.gpu_seconds for r in reports),
            "gpu_hours": sum(r.gpu_seconds for r in reports) / 3600.0,
            "ttft_ms": percentiles(ttft),
            "itl_ms": percentiles(itl),
            "scale_events": sum(r.scale_events for r in reports),
            "sim_end_s": max(r.sim_end_s for r in reports),
        }

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: the fleet's figures at the top, ``pools`` -> name -> a pool's figures."""
        doc = {
            "split": self.split,
            "policy": self.policy,
            "gpu_budget": self.gpu_budget,
            **self.totals(),
            "wall_s": self.wall_s,
            "pools": self.pool_figures(),
        }
        cleaned: dict[str, Any] = _clean(doc)
        return cleaned


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


def replay_fleet(
    fleet: FleetSpec,
    traces: Mapping[str, Trace],
    policy: str | Callable[[PolicyOptions], ReplayPolicy],
    *,
    split: str = "shared",
    params: Mapping[str, Any] | None = None,
    pool_params: Mapping[str, Mapping[str, Any]] | None = None,
    tick_s: float = 1.0,
    guarantee_shares: bool = True,
    reserve: bool | Mapping[str, Any] | None = None,
    progress: Callable[[str, float, float], None] | None = None,
) -> FleetReplay:
    """Replay every pool's trace under ``policy`` (a registered replay policy name, or a factory as
    ``serving.sim.replay.register_policy`` takes; one instance per replay) with the budget
    ``shared`` or split ``static`` (see the module docstring).

    ``params``: the policy's parameters for every pool; ``pool_params``: pool -> overrides, handed to the
    policy's factory as ``params["pools"]`` (only when there are any, so policies without per-pool
    parameters still run plain fleets). ``guarantee_shares`` (shared only): each pool's static share is
    handed to the policy as ``params["gpu_shares"]``, GPUs guaranteed to it: the controller lets other pools
    borrow them only while it does not plan to use them (False: SLO risk alone decides). ``reserve``: the
    controller's fleet reserve step (``params["fleet_reserve"]``: true, or a mapping of its settings; see
    ``controller.pipeline.ReserveSettings``); None = on for ``shared`` with two pools or more (one controller
    pools the reserves), off for one pool (nothing to pool: the replay is then ``pdscale replay --policy`` on
    the fleet's bounds and budget) and for ``static`` (independent controllers, as the issue's baseline); a
    value applies to both splits (so
    ``static`` with ``reserve=True`` runs each pool's controller with the same step, alone in its share).
    An explicit ``params["fleet_reserve"]`` wins over all of this.
    ``progress(label, now_s, end_s)`` is called every tick.
    """
    import time

    from serving.sim.replay import PolicyOptions, make_policy, replay

    if split not in SPLITS:
        raise ValueError(f"budget split {split!r}: expected one of {SPLITS}")
    missing = [p.name for p in fleet.pools if p.name not in traces]
    if missing:
        raise ValueError(f"no trace for pools {missing}")
    options = dict(params or {})
    if pool_params:
        options[POOL_PARAMS] = {k: dict(v) for k, v in pool_params.items()}
    # One pool has no other pool to pool a reserve with: the step would only trim its plans to its floor +
    # one instance (a shared one-pool fleet then ran below `pdscale replay --policy` on the same trace).
    use_reserve = (split == "shared" and len(fleet.pools) > 1) if reserve is None else reserve
    if use_reserve is not False and FLEET_RESERVE not in options:
        options[FLEET_RESERVE] = dict(use_reserve) if isinstance(use_reserve, Mapping) else True
    wall0 = time.perf_counter()
    peaks = {p.name: peak_demand_gpus(p, traces[p.name]) for p in fleet.pools}

    def run(
        label: str, spec: FleetSpec, pool_traces: Mapping[str, Trace], opts: dict[str, Any]
    ) -> ReplayReport:
        tick = None if progress is None else (lambda now_s, end_s: progress(label, now_s, end_s))
        given = PolicyOptions(params=opts)
        chosen = make_policy(policy, given) if isinstance(policy, str) else policy(given)
        return replay(spec, pool_traces, chosen, tick_s=tick_s, progress=tick)

    if split == "shared":
        if guarantee_shares and len(fleet.pools) > 1:
            options[GPU_SHARES] = static_split(fleet, traces)
        report = run("fleet", fleet, traces, options)
        budgets = {p.name: fleet.gpu_budget for p in fleet.pools}
        return FleetReplay(split, report.policy, fleet.gpu_budget, budgets, peaks, {"fleet": report},
                           time.perf_counter() - wall0)  # fmt: skip
    budgets = static_split(fleet, traces)
    reports = {}
    for pool in fleet.pools:
        alone = dataclasses.replace(fleet, pools=(pool,), gpu_budget=budgets[pool.name])
        opts = dict(options)
        if POOL_PARAMS in opts:
            mine = opts[POOL_PARAMS].get(pool.name)
            opts[POOL_PARAMS] = {pool.name: mine} if mine else {}
            if not opts[POOL_PARAMS]:
                del opts[POOL_PARAMS]
        reports[pool.name] = run(pool.name, alone, {pool.name: traces[pool.name]}, opts)
    name = next(iter(reports.values())).policy
    return FleetReplay(split, name, fleet.gpu_budget, budgets, peaks, reports, time.perf_counter() - wall0)
