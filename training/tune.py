"""Optuna sweeps of the predictive controller's parameters on trace replays (``pdscale tune``, issue 7).

Each trial is a set of ``PolicyConfig`` values drawn from :data:`SEARCH_SPACE` and judged by replaying
training traces through the simulator (``serving.sim.replay``) under ``controller.replay_policies.
PredictivePolicy``. Two figures come out of a replay: the SLO violation rate (1 - attainment over every
request) and GPU-seconds. Three ways to optimise them:

* ``improve`` (the default): beat the shipped defaults on every training trace. The defaults are replayed
  first (:func:`make_baseline`); per trace a trial scores ``GPU-s / defaults' GPU-s x (1 + penalty x
  deficit)``, the deficit measured against ``max(defaults' SLO, target)`` when the trace's target is
  reachable (the defaults or :data:`PROBE_PARAMS`, the most generous corner of the space, reach it), else
  against the defaults' own SLO (``pdscale tune`` sets no target in this mode unless asked: every trace
  keeps its defaults' SLO); the study minimises the mean over traces, so each trace weighs the same
  whatever its length or load, and a trial cannot win by trading one axis for the other (penalty 100: one
  point of SLO lost doubles a trace's score). 1.0 is the defaults; below 1, fewer GPU-s with every trace's
  SLO kept. The first trial is the defaults (:func:`default_params`); when no trial beats them the
  defaults are the answer (:func:`choose_improve`). Pruned per step like ``constrained``, on the score of
  the steps done so far against the defaults on the same steps.

* ``pareto``: both, NSGA-II, a Pareto front. Optuna cannot prune multi-objective studies, so every trial
  runs to its end.
* ``constrained``: one objective, GPU-seconds *penalised* by the SLO deficit,
  ``gpu_s * (1 + penalty * max(0, slo_target - attainment))``, TPE. A penalty, not an Optuna constraint
  (``trial.set_constraint``): while no trial is feasible, Optuna's constrained TPE ranks trials by their
  violation alone, i.e. chases SLO whatever the GPU cost (measured: with a 99 % target the Azure code trace
  never reaches, 50 trials drifted to ever costlier configs), and its plots grey out every infeasible
  trial. The deficit is recorded in the trial's user attributes (``slo_deficit``). After each
  step the objective projected from the steps done so far is reported (:func:`running_objective`), and a
  trial worse than the median at the same step is pruned (:class:`SameStepMedianPruner`, with warm-up).
  The penalty is what makes pruning sound: pruning on raw GPU-s would kill the expensive trials that meet
  the SLO and keep the cheap ones that don't.

Steps: each training trace is split into ``chunks`` consecutive time windows; each window is replayed on its
own (re-based to start at 0, the fleet starting warm from the policy's first answer, as any replay does) and
the projected objective is reported after each. A chunked evaluation is not a continuous replay: state does not
carry over a chunk boundary and each chunk drains its own requests; with ``chunks=1`` it is one replay.

The chosen trial (pareto, constrained): among completed trials those meeting ``slo_target``, the one with the
least GPU-seconds; when none does, the least penalised GPU-seconds (constrained) or the best SLO attainment
(pareto). That trial is on the Pareto front by construction.

Train/test split (:func:`split_table`): defaults vs the chosen config per training trace and per held-out
trace, with a :func:`verdict` each (dominates / same / trade-off / worse). Traces are given as
``FILE[:key=value,...]`` (:func:`parse_trace_spec`): a trace's own TTFT/ITL SLOs, window and SLO target.

Only the tune command imports this module (optuna at its top, matplotlib inside :func:`write_plots`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import yaml
from annotated_types import Ge, Gt, Le, Lt

from controller.config import ControllerConfig, PolicyConfig, PoolConfig
from forecaster.types import Forecaster
from serving.sim.fleet import FleetSpec, single_pool
from serving.workload.trace import Trace

Mode = Literal["improve", "pareto", "constrained"]
MODES: tuple[str, ...] = ("improve", "pareto", "constrained")
# The penalty each single-objective mode prices one unit of SLO deficit with, when none is given: "improve"
# normalises GPU-s by the defaults', so 100 makes 1 point of SLO lost double a trace's score.
DEFAULT_PENALTY: Mapping[str, float] = {"improve": 100.0, "constrained": 10.0, "pareto": 10.0}
# The SLO target when none is given: "improve" has none (0: every trace keeps its defaults' own SLO).
DEFAULT_SLO_TARGET: Mapping[str, float] = {"improve": 0.0, "constrained": 0.99, "pareto": 0.99}
FORECASTERS: tuple[str, ...] = ("default", "holt")
ForecasterFactory = Callable[[], Forecaster]


class TuneError(ValueError):
    """A tuning run cannot go on as asked; the message says what to change."""


# -- trace specs: FILE[:key=value,...] -----------------------------------------------------------------
SPEC_KEYS: tuple[str, ...] = ("ttft_ms", "itl_ms", "duration_s", "slo_target")


@dataclass(frozen=True)
class TraceSpec:
    """A ``--trace`` / ``--holdout`` argument: a trace file and, optionally, its own SLOs, window and SLO
    target (None: the run's ``--slo-ttft-ms``, ``--slo-itl-ms``, ``--duration-s``, ``--slo-target``)."""

    text: str
    path: str
    ttft_ms: float | None = None
    itl_ms: float | None = None
    duration_s: float | None = None
    slo_target: float | None = None

    @property
    def label(self) -> str:
        """The file name and its options, for tables (``code.csv:duration_s=1800``)."""
        opts = self.text[len(self.path) :]
        return Path(self.path).name + opts


def parse_trace_spec(text: str, option: str = "--trace") -> TraceSpec:
    """``FILE`` or ``FILE:key=value[,key=value...]`` with keys :data:`SPEC_KEYS` (e.g.
    ``mooncake.jsonl:ttft_ms=10000``). A ``:`` whose tail holds no ``=`` is part of the file name. Errors
    name the option, the argument and the key."""
    path, sep, tail = text.rpartition(":")
    if not sep or "=" not in tail:
        path, tail = text, ""
    where = f"{option} {text!r}"
    if not path:
        raise TuneError(f"{where}: no file name before the ':'")
    values: dict[str, float] = {}
    for item in tail.split(",") if tail else []:
        key, eq, raw = (x.strip() for x in item.partition("="))
        if not eq or not key:
            raise TuneError(f"{where}: {item!r} is not key=value (keys: {', '.join(SPEC_KEYS)})")
        if key not in SPEC_KEYS:
            raise TuneError(f"{where}: unknown key {key!r} (expected one of {', '.join(SPEC_KEYS)})")
        if key in values:
            raise TuneError(f"{where}: {key} given twice")
        try:
            value = float(raw)
        except ValueError:
            raise TuneError(f"{where}: {key}={raw!r} is not a number") from None
        if key == "slo_target":
            if not 0.0 <= value <= 1.0:
                raise TuneError(f"{where}: slo_target must be in [0, 1], got {raw}")
        elif not (math.isfinite(value) and value > 0):
            raise TuneError(f"{where}: {key} must be a finite number > 0, got {raw}")
        values[key] = value
    return TraceSpec(text=text, path=path, **values)


# -- the search space ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchParam:
    """One ``PolicyConfig`` field searched over ``[low, high]`` (log-uniform when ``log``; integers when
    ``integer``)."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False


# The parameters. P:D bounds: pd_ratio_min in [0, 1] (0 = no lower bound) and pd_ratio_max in [1, 8],
# so that every draw satisfies PolicyConfig's min <= max rule without rewriting anything.
SEARCH_SPACE: tuple[SearchParam, ...] = (
    SearchParam("buffer_multiplier", 1.0, 4.0),
    SearchParam("standby_prefill", 0, 4, integer=True),
    SearchParam("standby_decode", 0, 6, integer=True),
    SearchParam("burst_threshold", 0.2, 0.95),
    SearchParam("qps_change_alert_per_min", 0.05, 2.0, log=True),
    SearchParam("ramp_up_s", 10.0, 600.0, log=True),
    SearchParam("scale_down_delay_s", 10.0, 900.0, log=True),
    SearchParam("headroom", 0.0, 1.0),
    SearchParam("pd_ratio_min", 0.0, 1.0),
    SearchParam("pd_ratio_max", 1.0, 8.0),
)


def space_problems(space: Sequence[SearchParam], model: type[PolicyConfig] = PolicyConfig) -> list[str]:
    """One message per entry that does not fit ``model``: unknown field, wrong type, range outside the
    field's bounds, empty range, log range touching 0, duplicate name. Empty when the table is valid."""
    out: list[str] = []
    seen: set[str] = set()
    for p in space:
        where = f"SEARCH_SPACE[{p.name}]"
        if p.name in seen:
            out.append(f"{where}: listed twice")
        seen.add(p.name)
        info = model.model_fields.get(p.name)
        if info is None:
            out.append(f"{where}: {model.__name__} has no field {p.name!r}")
            continue
        kind = int if p.integer else float
        if info.annotation is not kind:
            out.append(f"{where}: the field is {info.annotation}, the table searches {kind.__name__}")
        if not p.low < p.high:
            out.append(f"{where}: empty range [{p.low}, {p.high}]")
        if p.log and p.low <= 0:
            out.append(f"{where}: a log range needs low > 0, got {p.low}")
        if p.integer and (p.low != int(p.low) or p.high != int(p.high)):
            out.append(f"{where}: integer range with fractional bounds [{p.low}, {p.high}]")
        for bound in info.metadata:
            broken = (
                (isinstance(bound, Ge) and not p.low >= float(bound.ge))  # type: ignore[arg-type]
                or (isinstance(bound, Gt) and not p.low > float(bound.gt))  # type: ignore[arg-type]
                or (isinstance(bound, Le) and not p.high <= float(bound.le))  # type: ignore[arg-type]
                or (isinstance(bound, Lt) and not p.high < float(bound.lt))  # type: ignore[arg-type]
            )
            if broken:
                out.append(f"{where}: [{p.low}, {p.high}] is outside the field's bound {bound!r}")
    return out


def _check_space() -> None:
    problems = space_problems(SEARCH_SPACE)
    if problems:
        raise ImportError(
            "training/tune.py: SEARCH_SPACE does not fit PolicyConfig:\n  " + "\n  ".join(problems)
        )


_check_space()


def default_params(space: Sequence[SearchParam] = SEARCH_SPACE) -> dict[str, Any]:
    """The shipped defaults of the searched fields, exactly, even where outside the table's range (e.g.
    ``pd_ratio_max`` 0 = no bound): the improve study's first trial, which must score the defaults' own."""
    base = PolicyConfig().model_dump()
    return {p.name: base[p.name] for p in space}


def local_space(
    space: Sequence[SearchParam], factor: float, base: PolicyConfig | None = None
) -> tuple[SearchParam, ...]:
    """``space`` narrowed to the neighbourhood of ``base`` (default: the shipped defaults): a float ``d`` > 0
    searched over ``[d / factor, d * factor]``, a float at 0 over the bottom ``1 / factor`` of its range, an
    integer over ``d - 1 .. d + 1``, each clipped to the table's range. A field whose default lies outside
    its range (``pd_ratio_max`` 0 = no bound) is left out, i.e. kept at its default."""
    ref = (base or PolicyConfig()).model_dump()
    out: list[SearchParam] = []
    for p in space:
        d = float(ref[p.name])
        if not p.low <= d <= p.high:
            continue
        lo: float
        hi: float
        if p.integer:
            lo, hi = int(max(p.low, d - 1)), int(min(p.high, d + 1))
        elif d > 0:
            lo, hi = max(p.low, d / factor), min(p.high, d * factor)
        else:
            lo, hi = p.low, p.low + (p.high - p.low) / factor
        if lo < hi:
            out.append(replace(p, low=lo, high=hi))
    return tuple(out)


def config_from_params(params: Mapping[str, Any], base: PolicyConfig | None = None) -> PolicyConfig:
    """``base`` (default: ``PolicyConfig()``) with ``params`` set, validated (errors name the field)."""
    base = base or PolicyConfig()
    return PolicyConfig.model_validate({**base.model_dump(), **params})


def changed_fields(config: PolicyConfig, base: PolicyConfig | None = None) -> dict[str, Any]:
    """The fields of ``config`` that differ from ``base`` (default: the shipped defaults), in field order."""
    ref = (base or PolicyConfig()).model_dump()
    return {k: v for k, v in config.model_dump().items() if v != ref[k]}


# -- steps and evaluation ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One replay of an evaluation: a trace (or one time window of it) and the fleet it runs on."""

    name: str
    trace: Trace
    fleet: FleetSpec
    group: str = ""  # the training trace this step is a window of ("" = ``name``)
    slo_target: float | None = None  # the trace's own SLO target (None: the run's)

    @property
    def source(self) -> str:
        """The trace this step belongs to (per-trace figures group steps by it)."""
        return self.group or self.name

    @property
    def span_s(self) -> float:
        """Seconds of trace the step covers (its last arrival; re-based steps start at 0), at least 1."""
        return max(float(self.trace.arrival_s[-1]) if len(self.trace) else 0.0, 1.0)


def rebase(trace: Trace, t0_s: float, t1_s: float) -> Trace:
    """Requests arriving in ``[t0_s, t1_s)`` with times re-based so that ``t0_s`` is 0 (``start_time``
    moved with it, so time-of-day features stay right)."""
    part = trace.window(t0_s, t1_s)
    start = trace.start_time + timedelta(seconds=t0_s) if trace.start_time is not None else None
    return replace(part, arrival_s=part.arrival_s - t0_s, start_time=start)


def split_steps(name: str, trace: Trace, chunks: int, fleet: FleetSpec) -> list[Step]:
    """``trace`` cut into ``chunks`` equal time windows (empty windows left out), one step each."""
    if chunks < 1:
        raise TuneError(f"chunks must be >= 1, got {chunks}")
    if len(trace) == 0:
        raise TuneError(f"{name}: the trace has no requests")
    if chunks == 1:
        return [Step(name, trace, fleet, group=name)]
    end_s = float(trace.arrival_s[-1])
    edges = np.linspace(0.0, end_s, chunks + 1)
    edges[-1] = math.inf
    out = []
    for i in range(chunks):
        part = rebase(trace, float(edges[i]), float(edges[i + 1]))
        if len(part):
            out.append(Step(f"{name}[{i + 1}/{chunks}]", part, fleet, group=name))
    return out


@dataclass(frozen=True)
class StepResult:
    """What one step's replay measured."""

    name: str
    requests: int
    slo_met: float  # requests meeting the SLO (attainment x requests)
    gpu_seconds: float
    wall_s: float
    group: str = ""  # the step's source trace (:attr:`Step.source`)


@dataclass(frozen=True)
class Evaluation:
    """Totals over the steps replayed so far."""

    steps: tuple[StepResult, ...] = ()

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.steps)

    @property
    def gpu_seconds(self) -> float:
        return sum(s.gpu_seconds for s in self.steps)

    @property
    def slo_attainment(self) -> float:
        """Fraction of all requests that met the SLO (NaN before any request)."""
        n = self.requests
        return sum(s.slo_met for s in self.steps) / n if n else math.nan

    @property
    def violation_rate(self) -> float:
        return 1.0 - self.slo_attainment

    def by_trace(self) -> dict[str, Evaluation]:
        """The steps grouped by source trace (:attr:`StepResult.group`, else the step name), in order."""
        out: dict[str, list[StepResult]] = {}
        for s in self.steps:
            out.setdefault(s.group or s.name, []).append(s)
        return {k: Evaluation(tuple(v)) for k, v in out.items()}

    def only(self, names: Sequence[str]) -> Evaluation:
        """The steps named ``names`` (in this evaluation's order)."""
        keep = set(names)
        return Evaluation(tuple(s for s in self.steps if s.name in keep))

    def to_json(self) -> dict[str, Any]:
        return {
            "slo_attainment": self.slo_attainment,
            "slo_violation_rate": self.violation_rate,
            "gpu_seconds": self.gpu_seconds,
            "requests": self.requests,
            "steps": [s.__dict__ for s in self.steps],
        }


def penalised_gpu_seconds(
    gpu_seconds: float, slo_attainment: float, slo_target: float, penalty: float
) -> float:
    """``gpu_seconds * (1 + penalty * deficit)``, deficit = ``max(0, slo_target - attainment)``: the
    constrained mode's objective (unknown attainment counts as a full deficit)."""
    deficit = slo_target if math.isnan(slo_attainment) else max(0.0, slo_target - slo_attainment)
    return gpu_seconds * (1.0 + penalty * deficit)


def running_objective(ev: Evaluation, steps: Sequence[Step], settings: TuneSettings) -> float:
    """The constrained objective projected from the steps done so far to the whole evaluation: GPU-seconds
    scaled by trace seconds (all / done), penalised by the SLO deficit so far. Trials are compared at the same
    step (:class:`SameStepMedianPruner`), where the projection is a common factor; it makes the reported
    values read as estimates of the final objective (Optuna's intermediate-values plot)."""
    done_s = sum(s.span_s for s in steps[: len(ev.steps)])
    total_s = sum(s.span_s for s in steps)
    gpu = ev.gpu_seconds * total_s / done_s if done_s > 0 else math.nan
    return penalised_gpu_seconds(gpu, ev.slo_attainment, settings.slo_target, settings.penalty)


# -- the "improve" objective: beat the defaults on every training trace -----------------------------------
# The most generous corner of SEARCH_SPACE (most capacity, fastest up, slowest down): the probe that decides
# whether a trace's SLO target is reachable at all.
PROBE_PARAMS: Mapping[str, Any] = {
    "buffer_multiplier": 4.0,
    "standby_prefill": 4,
    "standby_decode": 6,
    "burst_threshold": 0.2,
    "qps_change_alert_per_min": 0.05,
    "ramp_up_s": 10.0,
    "scale_down_delay_s": 900.0,
    "headroom": 1.0,
}


@dataclass(frozen=True)
class Baseline:
    """The shipped defaults replayed on the training steps, and per trace the SLO rule a trial is held to.

    ``reachable[trace]``: the trace's SLO target is met by the defaults or by the probe (:data:`PROBE_PARAMS`);
    then a trial must reach ``max(default SLO, target)``, else only the default's own SLO
    (:meth:`reference`)."""

    default: Evaluation
    targets: Mapping[str, float]
    reachable: Mapping[str, bool]
    probe_slo: Mapping[str, float] = field(default_factory=dict)  # only traces whose defaults miss the target

    def reference(self, trace: str, default_slo: float) -> float:
        """The SLO attainment a trial must keep on ``trace`` (``default_slo``: the defaults' on the same
        steps): ``max(default_slo, target)`` when the target is reachable, else ``default_slo``."""
        if self.reachable[trace]:
            return max(default_slo, self.targets[trace])
        return default_slo

    def default_score(self, penalty: float) -> float:
        """The improve objective of the defaults themselves: 1.0 unless they miss a reachable target."""
        return improve_objective(self.default, self, penalty)

    def candidate(self, penalty: float) -> Candidate:
        """The shipped defaults as a :class:`Candidate` (number :data:`DEFAULTS_TRIAL`, no params)."""
        ev = self.default
        return Candidate(DEFAULTS_TRIAL, ev.slo_attainment, ev.gpu_seconds, {}, self.default_score(penalty))

    def to_json(self) -> dict[str, Any]:
        return {
            trace: {
                "default": ev.to_json(),
                "slo_target": self.targets[trace],
                "target_reachable": self.reachable[trace],
                "probe_slo_attainment": self.probe_slo.get(trace),
                "reference_slo": self.reference(trace, ev.slo_attainment),
            }
            for trace, ev in self.default.by_trace().items()
        }


def make_baseline(steps: Sequence[Step], make_forecaster: ForecasterFactory, slo_target: float) -> Baseline:
    """Replay the defaults on ``steps``; for each trace whose defaults miss its target (the step's
    ``slo_target``, else ``slo_target``), replay the probe to decide whether the target is reachable."""
    default = evaluate(PolicyConfig(), steps, make_forecaster)
    targets: dict[str, float] = {}
    for st in steps:
        targets.setdefault(st.source, st.slo_target if st.slo_target is not None else slo_target)
    reachable: dict[str, bool] = {}
    probe: dict[str, float] = {}
    for trace, ev in default.by_trace().items():
        if ev.slo_attainment >= targets[trace]:
            reachable[trace] = True
            continue
        mine = [st for st in steps if st.source == trace]
        probe[trace] = evaluate(config_from_params(PROBE_PARAMS), mine, make_forecaster).slo_attainment
        reachable[trace] = probe[trace] >= targets[trace]
    return Baseline(default, targets, reachable, probe)


@dataclass(frozen=True)
class TraceScore:
    """One training trace's part of the improve objective."""

    gpu_ratio: float  # trial GPU-s / defaults' GPU-s on the same steps
    slo_attainment: float
    reference_slo: float
    deficit: float  # max(0, reference - attainment)
    score: float  # gpu_ratio x (1 + penalty x deficit)


def improve_scores(ev: Evaluation, baseline: Baseline, penalty: float) -> dict[str, TraceScore]:
    """Per trace replayed in ``ev`` (wholly or its first steps), the trial against the defaults on the same
    steps: ``GPU-s ratio x (1 + penalty x SLO deficit to the reference)``. 1.0 = the defaults (when they
    meet the reference); below 1 = fewer GPU-s and the SLO kept."""
    out: dict[str, TraceScore] = {}
    for trace, mine in ev.by_trace().items():
        base = baseline.default.only([s.name for s in mine.steps])
        if base.gpu_seconds <= 0 or len(base.steps) != len(mine.steps):
            raise TuneError(
                f"{trace}: the defaults' replay does not cover the steps {[s.name for s in mine.steps]}"
            )
        ratio = mine.gpu_seconds / base.gpu_seconds
        ref = baseline.reference(trace, base.slo_attainment)
        slo = mine.slo_attainment
        deficit = ref if math.isnan(slo) else max(0.0, ref - slo)
        out[trace] = TraceScore(ratio, slo, ref, deficit, ratio * (1.0 + penalty * deficit))
    return out


def improve_objective(ev: Evaluation, baseline: Baseline, penalty: float) -> float:
    """The mean of :func:`improve_scores` over the traces in ``ev``: every training trace weighs the same,
    whatever its length or load."""
    scores = improve_scores(ev, baseline, penalty)
    return float(np.mean([s.score for s in scores.values()])) if scores else math.nan


def forecaster_factory(name: str) -> ForecasterFactory:
    """``holt``: the Holt baseline; ``default``: the shipped learned checkpoint (Holt when it cannot load)."""
    if name == "holt":
        from forecaster.baselines import Holt

        return Holt
    if name == "default":
        from controller.replay_policies import default_forecaster

        return default_forecaster
    raise TuneError(f"unknown forecaster {name!r}: expected one of {FORECASTERS}")


def evaluate(
    config: PolicyConfig,
    steps: Sequence[Step],
    make_forecaster: ForecasterFactory,
    *,
    after_step: Callable[[int, Evaluation], None] | None = None,
) -> Evaluation:
    """Replay every step under ``PredictivePolicy(config)``; ``after_step(i, running totals)`` is called
    after step ``i`` (it may raise to stop early, e.g. ``optuna.TrialPruned``)."""
    from controller.replay_policies import PredictivePolicy
    from serving.sim.replay import replay

    done: list[StepResult] = []
    for i, step in enumerate(steps):
        t0 = time.perf_counter()
        pool = step.fleet.pools[0].name
        report = replay(step.fleet, {pool: step.trace}, PredictivePolicy(config, forecaster=make_forecaster))
        done.append(
            StepResult(
                name=step.name,
                requests=report.requests,
                slo_met=report.slo_attainment * report.requests,
                gpu_seconds=report.gpu_seconds,
                wall_s=time.perf_counter() - t0,
                group=step.source,
            )
        )
        if after_step is not None:
            after_step(i, Evaluation(tuple(done)))
    return Evaluation(tuple(done))


# -- the study -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneSettings:
    """Everything that makes trials comparable: workers joining a study must agree on it (checked)."""

    mode: Mode = "constrained"
    slo_target: float = 0.99
    penalty: float = 10.0
    chunks: int = 3
    forecaster: str = "default"
    traces: tuple[str, ...] = ()
    duration_s: float | None = None
    profile: str = "llama3-8b/a100"
    slo_ttft_ms: float = 1000.0
    slo_itl_ms: float = 50.0
    around_defaults: float | None = None  # search only near the defaults (:func:`local_space`); None: all

    def problems(self) -> list[str]:
        out = []
        if self.mode not in MODES:
            out.append(f"objective {self.mode!r}: expected one of {MODES}")
        if not 0.0 <= self.slo_target <= 1.0:
            out.append(f"slo_target must be in [0, 1], got {self.slo_target}")
        if not (math.isfinite(self.penalty) and self.penalty >= 0):
            out.append(f"penalty must be a finite number >= 0, got {self.penalty}")
        if self.chunks < 1:
            out.append(f"chunks must be >= 1, got {self.chunks}")
        if self.forecaster not in FORECASTERS:
            out.append(f"forecaster {self.forecaster!r}: expected one of {FORECASTERS}")
        if self.duration_s is not None and not self.duration_s > 0:
            out.append(f"duration_s must be > 0, got {self.duration_s}")
        if self.around_defaults is not None and not (
            math.isfinite(self.around_defaults) and self.around_defaults > 1
        ):
            out.append(f"around_defaults must be a finite factor > 1, got {self.around_defaults}")
        return out

    @property
    def space(self) -> tuple[SearchParam, ...]:
        """The search space: :data:`SEARCH_SPACE`, or its neighbourhood of the defaults."""
        if self.around_defaults is None:
            return SEARCH_SPACE
        return local_space(SEARCH_SPACE, self.around_defaults)

    @property
    def choice_penalty(self) -> float | None:
        """The penalty :func:`choose` prices an SLO deficit with when no trial meets the target (constrained
        mode); None in pareto mode (the best SLO is chosen then)."""
        return self.penalty if self.mode == "constrained" else None

    def fleet(self, spec: TraceSpec | None = None) -> FleetSpec:
        """The one-pool fleet of the run's profile, with ``spec``'s own SLOs where it gives them."""
        ttft = spec.ttft_ms if spec is not None and spec.ttft_ms is not None else self.slo_ttft_ms
        itl = spec.itl_ms if spec is not None and spec.itl_ms is not None else self.slo_itl_ms
        return single_pool(profile=self.profile, slo_ttft_ms=ttft, slo_itl_ms=itl)

    def to_attrs(self) -> dict[str, Any]:
        """JSON-able form stored in the study's user attributes."""
        d = dict(self.__dict__)
        d["traces"] = list(self.traces)
        return d


def load_steps(
    settings: TuneSettings,
    traces: Sequence[tuple[str, Trace]],
    *,
    chunks: int | None = None,
    option: str = "--trace",
) -> list[Step]:
    """The steps of ``traces`` (``(spec text, trace)``, the spec as :func:`parse_trace_spec` reads it): each
    trace cut to its ``duration_s`` (else the run's), on a fleet with its SLOs (else the run's), split into
    ``chunks`` windows (default: the run's)."""
    out: list[Step] = []
    for text, trace in traces:
        spec = parse_trace_spec(text, option)
        duration = spec.duration_s if spec.duration_s is not None else settings.duration_s
        if duration is not None:
            trace = trace.window(0.0, duration)
        steps = split_steps(text, trace, settings.chunks if chunks is None else chunks, settings.fleet(spec))
        out.extend(replace(st, slo_target=spec.slo_target) for st in steps)
    return out


def suggest(trial: optuna.Trial, space: Sequence[SearchParam] = SEARCH_SPACE) -> dict[str, Any]:
    """Draw one value per table entry (an enqueued value outside a range, e.g. a default, is taken as it is)."""
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Fixed parameter .* is out of range")
        for p in space:
            if p.integer:
                out[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
            else:
                out[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
    return out


def make_objective(
    settings: TuneSettings,
    steps: Sequence[Step],
    make_forecaster: ForecasterFactory,
    worker: int,
    baseline: Baseline | None = None,
) -> Callable[[optuna.Trial], float | tuple[float, float]]:
    """The Optuna objective: sample, replay the steps, report/prune (constrained, improve), record the
    figures. The improve mode needs ``baseline`` (:func:`make_baseline` on the same steps)."""
    if settings.mode == "improve" and baseline is None:
        raise TuneError("the improve objective needs the defaults' baseline (make_baseline)")

    def value_of(ev: Evaluation) -> float:
        if baseline is not None and settings.mode == "improve":
            return improve_objective(ev, baseline, settings.penalty)
        return running_objective(ev, steps, settings)

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        config = config_from_params(suggest(trial, settings.space))
        trial.set_user_attr("worker", worker)

        def after_step(i: int, ev: Evaluation) -> None:
            if settings.mode == "pareto" or i == len(steps) - 1:
                return
            value = value_of(ev)
            trial.report(value, step=i)
            if trial.should_prune():
                _record(trial, ev, settings, baseline)
                raise optuna.TrialPruned(f"after {steps[i].name}: {value:,.4g} worse than the median")

        ev = evaluate(config, steps, make_forecaster, after_step=after_step)
        _record(trial, ev, settings, baseline)
        if settings.mode == "pareto":
            return ev.violation_rate, ev.gpu_seconds
        if settings.mode == "improve":
            return value_of(ev)
        return penalised_gpu_seconds(ev.gpu_seconds, ev.slo_attainment, settings.slo_target, settings.penalty)

    return objective


def _record(trial: optuna.Trial, ev: Evaluation, settings: TuneSettings, baseline: Baseline | None) -> None:
    trial.set_user_attr("slo_attainment", ev.slo_attainment)
    trial.set_user_attr("slo_deficit", settings.slo_target - ev.slo_attainment)
    trial.set_user_attr("gpu_seconds", ev.gpu_seconds)
    trial.set_user_attr("steps_done", len(ev.steps))
    trial.set_user_attr("wall_s", sum(s.wall_s for s in ev.steps))
    if baseline is not None and settings.mode == "improve":
        scores = improve_scores(ev, baseline, settings.penalty)
        trial.set_user_attr("score", float(np.mean([s.score for s in scores.values()])))
        trial.set_user_attr("per_trace", {k: v.__dict__ for k, v in scores.items()})


@contextmanager
def _quiet_experimental() -> Iterator[None]:
    """Optuna marks heartbeats, stale-trial cleanup and metric names "experimental": say nothing about it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def storage_for(
    url: str, *, sqlite_timeout_s: float = 60.0, heartbeat_s: int = 30
) -> optuna.storages.BaseStorage:
    """An RDB storage for ``url`` (any URL SQLAlchemy and Optuna accept). SQLite waits up to
    ``sqlite_timeout_s`` for a lock held by another worker; a heartbeat lets a worker mark the trials of a
    worker that died as failed (after ``2 * heartbeat_s``), so they do not count as running forever."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": sqlite_timeout_s}
    for attempt in range(5):
        try:
            with _quiet_experimental():
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s
                )
        except Exception as exc:  # SQLAlchemy's ArgumentError, OperationalError, a missing driver ...
            # Workers started together race to create the schema (a table or the alembic version row
            # "already exists" / UNIQUE constraint failed); the schema is there on the next try.
            if type(exc).__name__ in ("OperationalError", "IntegrityError") and attempt < 4:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise TuneError(f"--storage {url}: cannot open it ({type(exc).__name__}: {exc})") from exc
    raise AssertionError("unreachable")


class SameStepMedianPruner(optuna.pruners.BasePruner):
    """Prune a trial whose value at its latest step is worse (higher) than the median of the values the
    completed trials reported at that same step; not before ``n_startup_trials`` of them reported it, nor
    before step ``n_warmup_steps``.

    Optuna's MedianPruner compares the trial's *best value over all its steps so far* with the median at the
    current step, which suits learning curves; here a step is a chunk of trace, values of different chunks
    differ in scale (a busier chunk costs more), and the best-so-far would mostly be the first chunk's.
    Minimisation only (the constrained mode; multi-objective studies cannot be pruned).
    """

    def __init__(self, n_startup_trials: int = 5, n_warmup_steps: int = 1) -> None:
        if n_startup_trials < 0 or n_warmup_steps < 0:
            raise TuneError(
                f"n_startup_trials and n_warmup_steps must be >= 0, got {n_startup_trials}, {n_warmup_steps}"
            )
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        others = [t.intermediate_values[step] for t in complete if step in t.intermediate_values]
        others = [v for v in others if not math.isnan(v)]
        if not others or len(others) < self.n_startup_trials:
            return False
        value = trial.intermediate_values[step]
        return math.isnan(value) or value > float(np.median(others))


def open_study(
    settings: TuneSettings,
    storage: optuna.storages.BaseStorage | str | None,
    study_name: str,
    *,
    seed: int,
    worker: int,
    n_trials: int,
    prune_startup: int = 5,
    prune_warmup: int = 1,
) -> optuna.Study:
    """Create the study or join it (``load_if_exists``); a joining worker's settings must match the
    study's (else :class:`TuneError` naming the differences). Sampler seed = ``seed + worker``."""
    sampler: optuna.samplers.BaseSampler
    if settings.mode == "pareto":
        population = min(max(n_trials // 4, 4), 50)
        sampler = optuna.samplers.NSGAIISampler(seed=seed + worker, population_size=population)
        directions: list[Literal["minimize", "maximize"]] = ["minimize", "minimize"]
    else:
        sampler = optuna.samplers.TPESampler(seed=seed + worker, constant_liar=True)
        directions = ["minimize"]
    pruner = SameStepMedianPruner(n_startup_trials=prune_startup, n_warmup_steps=prune_warmup)
    try:
        study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            directions=directions,
            load_if_exists=True,
        )
    except ValueError as exc:
        raise TuneError(f"study {study_name!r}: {exc}") from exc
    if len(study.directions) != len(directions):
        raise TuneError(
            f"study {study_name!r} has {len(study.directions)} objective(s); --objective {settings.mode} needs "
            f"{len(directions)}: use another --study name"
        )
    wanted = settings.to_attrs()
    have = study.user_attrs.get("settings")
    if have is None:
        study.set_user_attr("settings", wanted)
        if settings.mode == "improve":
            # The search starts at the defaults it must beat (TPE then explores around a known score).
            study.enqueue_trial(default_params(settings.space), user_attrs={"seeded": "defaults"})
        with _quiet_experimental():
            study.set_metric_names(
                {
                    "pareto": ["slo_violation_rate", "gpu_seconds"],
                    "constrained": ["penalised_gpu_seconds"],
                    "improve": ["improve_score"],
                }[settings.mode]
            )
    else:
        diff = [
            f"{k}: study has {have.get(k)!r}, this worker {v!r}"
            for k, v in wanted.items()
            if have.get(k) != v
        ]
        if diff:
            raise TuneError(
                f"study {study_name!r} was created with other settings (trials would not compare):\n  "
                + "\n  ".join(diff)
            )
    return study


def finished_count(study: optuna.Study) -> tuple[int, int]:
    """(finished = complete + pruned, running) trials of the study, as the storage sees them now."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    running = sum(t.state is TrialState.RUNNING for t in trials)
    return done, running


def run_worker(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | tuple[float, float]],
    n_trials: int,
    *,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
) -> int:
    """Run trials until the study holds ``n_trials`` finished (complete or pruned) trials, counting the
    ones other workers are running, so N workers share N trials. Returns how many this worker ran."""
    mine = 0
    while True:
        with _quiet_experimental():
            optuna.storages.fail_stale_trials(study)
        done, running = finished_count(study)
        if done + running >= n_trials:
            return mine
        callbacks = [on_trial] if on_trial is not None else None
        study.optimize(objective, n_trials=1, callbacks=callbacks, gc_after_trial=False)
        mine += 1


# -- choosing and writing the best ----------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A completed trial's figures."""

    number: int
    slo_attainment: float
    gpu_seconds: float
    params: Mapping[str, Any] = field(default_factory=dict)
    score: float | None = None  # the improve objective (mean penalised GPU-s ratio to the defaults)


@dataclass(frozen=True)
class Choice:
    """The trial chosen to be written, and why."""

    candidate: Candidate
    rule: str
    feasible: bool


def candidates(study: optuna.Study) -> list[Candidate]:
    """Completed trials with their SLO attainment and GPU-seconds (from the trial's user attributes)."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        slo, gpu = t.user_attrs.get("slo_attainment"), t.user_attrs.get("gpu_seconds")
        if slo is None or gpu is None or math.isnan(slo):
            continue
        score = t.user_attrs.get("score")
        out.append(Candidate(t.number, float(slo), float(gpu), dict(t.params), score))
    return out


DEFAULTS_TRIAL = -1  # the Candidate number of the shipped defaults (not a trial of the study)


def choose_improve(cands: Sequence[Candidate], defaults: Candidate) -> Choice:
    """The improve mode's choice: the least score (mean over training traces of GPU-s ratio to the defaults
    x (1 + penalty x SLO deficit)) when it beats ``defaults.score`` (``feasible``); else the shipped defaults
    themselves (``defaults``, number :data:`DEFAULTS_TRIAL`, no params): a sweep that finds nothing better
    says "keep the defaults" rather than writing its least-bad trial."""
    if defaults.score is None:
        raise TuneError("the defaults' candidate needs its improve score")
    scored = [c for c in cands if c.score is not None and not math.isnan(c.score)]
    if not scored:
        raise TuneError("no completed trial with an improve score in the study yet: nothing to choose")
    best = min(scored, key=lambda c: (c.score, c.number))
    assert best.score is not None
    if best.score < defaults.score:
        rule = (
            "the least mean GPU-s ratio to the defaults x (1 + penalty x SLO deficit) over the training "
            f"traces: {best.score:.4f} against the defaults' {defaults.score:.4f}"
        )
        return Choice(best, rule, True)
    rule = (
        f"no trial beat the shipped defaults (best trial {best.number}: {best.score:.4f} against "
        f"{defaults.score:.4f}): the defaults are kept"
    )
    return Choice(defaults, rule, False)


def choose_for(
    cands: Sequence[Candidate], settings: TuneSettings, baseline: Baseline | None = None
) -> Choice:
    """The choice rule of ``settings.mode``: :func:`choose_improve` (needs ``baseline``) or :func:`choose`."""
    if settings.mode == "improve":
        if baseline is None:
            raise TuneError("the improve objective chooses against the defaults' baseline (make_baseline)")
        return choose_improve(cands, baseline.candidate(settings.penalty))
    return choose(cands, settings.slo_target, settings.choice_penalty)


def choose(cands: Sequence[Candidate], slo_target: float, penalty: float | None = None) -> Choice:
    """Least GPU-seconds among those meeting ``slo_target``. When none does: with ``penalty`` (the
    constrained mode) the least penalised GPU-seconds (:func:`penalised_gpu_seconds`, the objective the study
    minimised); without (the pareto mode) the best SLO attainment, least GPU-seconds on a tie. Either way the
    chosen trial is never dominated, so it lies on the Pareto front."""
    if not cands:
        raise TuneError("no completed trial in the study yet: nothing to choose (run more --trials)")
    ok = [c for c in cands if c.slo_attainment >= slo_target]
    if ok:
        best = min(ok, key=lambda c: (c.gpu_seconds, -c.slo_attainment, c.number))
        return Choice(
            best, f"least GPU-seconds among the {len(ok)} trial(s) with SLO >= {slo_target:.2%}", True
        )
    if penalty is not None:
        best = min(
            cands,
            key=lambda c: (
                penalised_gpu_seconds(c.gpu_seconds, c.slo_attainment, slo_target, penalty),
                c.number,
            ),
        )
        return Choice(
            best,
            f"no trial reached SLO >= {slo_target:.2%}: the least GPU-s x (1 + {penalty:g} x SLO deficit)",
            False,
        )
    best = min(cands, key=lambda c: (-c.slo_attainment, c.gpu_seconds, c.number))
    return Choice(best, f"no trial reached SLO >= {slo_target:.2%}: the best SLO attainment", False)


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Trials no other trial beats on both SLO attainment and GPU-seconds, by GPU-seconds."""
    front = []
    for c in cands:
        dominated = any(
            o.slo_attainment >= c.slo_attainment
            and o.gpu_seconds <= c.gpu_seconds
            and (o.slo_attainment > c.slo_attainment or o.gpu_seconds < c.gpu_seconds)
            for o in cands
        )
        if not dominated:
            front.append(c)
    return sorted(front, key=lambda c: (c.gpu_seconds, c.number))


def best_config(choice: Choice, settings: TuneSettings) -> ControllerConfig:
    """The controller config of the chosen trial: the pool's profile and SLOs, the tuned policy."""
    policy = config_from_params(choice.candidate.params)
    pool = PoolConfig(
        profile=settings.profile,
        slo_ttft_ms=settings.slo_ttft_ms,
        slo_itl_ms=settings.slo_itl_ms,
        policy=policy,
    )
    return ControllerConfig(pools=[pool])


def config_yaml(choice: Choice, settings: TuneSettings, study_name: str, storage: str) -> str:
    """The chosen trial as a ``pdscale controller --config`` file: a header comment (study, trial, figures,
    traces) and only the policy fields that differ from the defaults."""
    cfg = best_config(choice, settings)
    pool = cfg.pools[0]
    c = choice.candidate
    doc = {
        "pools": [
            {
                "name": pool.name,
                "profile": pool.profile,
                "slo_ttft_ms": pool.slo_ttft_ms,
                "slo_itl_ms": pool.slo_itl_ms,
                "policy": {k: _plain(v) for k, v in changed_fields(pool.policy).items()},
            }
        ]
    }
    which = "the shipped defaults" if c.number == DEFAULTS_TRIAL else f"trial {c.number}"
    header = [
        f"pdscale tune: study {study_name!r} ({storage}), {which}",
        f"chosen: {choice.rule}",
        f"objective {settings.mode}: SLO attainment {c.slo_attainment:.4%} (target {settings.slo_target:.2%}), "
        f"GPU-seconds {c.gpu_seconds:,.0f}"
        + (f", score {c.score:.4f} (defaults: 1 when they keep their SLO)" if c.score is not None else ""),
        f"training traces ({settings.chunks} chunk(s) each"
        + (f", first {settings.duration_s:g} s" if settings.duration_s else "")
        + "): "
        + ", ".join(settings.traces),
        f"tuned with the {settings.forecaster!r} forecaster; the controller runs forecaster_checkpoint "
        "(default: the shipped learned checkpoint)",
    ]
    text = "".join(f"# {line}\n" for line in header)
    return text + yaml.safe_dump(doc, sort_keys=False)


def _plain(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


# -- plots ---------------------------------------------------------------------------------------------
def write_plots(study: optuna.Study, out_dir: Path, mode: Mode) -> tuple[list[Path], list[str]]:
    """Pareto front (pareto mode), optimisation history and parameter importances as PNGs in ``out_dir``.
    Returns (files written, notes on plots left out and why)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    notes: list[str] = []
    n_complete = len(candidates(study))
    gpu_target: Callable[[optuna.trial.FrozenTrial], float] | None = None
    gpu_name = "improve_score" if mode == "improve" else "penalised_gpu_seconds"
    if mode == "pareto":

        def gpu_target(t: optuna.trial.FrozenTrial) -> float:
            return float(t.values[1])

        gpu_name = "gpu_seconds"

    def save(name: str, draw: Callable[[], Any]) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the matplotlib backend is "experimental"
            ax = draw()
        path = out_dir / name
        ax.figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(ax.figure)
        written.append(path)

    if n_complete == 0:
        return written, ["no completed trial: no plots"]
    if mode == "pareto":
        save(
            "pareto_front.png",
            lambda: ovm.plot_pareto_front(study, target_names=["SLO violation rate", "GPU-s"]),
        )
    else:
        notes.append(
            f"pareto_front.png: {mode} mode has one objective, no Pareto front (use --objective pareto)"
        )
    save(
        "optimization_history.png",
        lambda: ovm.plot_optimization_history(study, target=gpu_target, target_name=gpu_name),
    )
    if n_complete >= 2:
        save(
            "param_importances.png",
            lambda: ovm.plot_param_importances(study, target=gpu_target, target_name=gpu_name),
        )
    else:
        notes.append(f"param_importances.png: needs >= 2 completed trials, the study has {n_complete}")
    return written, notes


# -- train/test comparison -----------------------------------------------------------------------------
VERDICTS: tuple[str, ...] = ("dominates", "same", "trade-off", "worse")
SLO_TOLERANCE = 0.001  # 0.1 point of SLO attainment: below it, two replays' SLOs count as the same
GPU_TOLERANCE = 0.01  # 1 % of GPU-seconds: likewise


def verdict(
    default: Evaluation, tuned: Evaluation, *, slo_tol: float = SLO_TOLERANCE, gpu_tol: float = GPU_TOLERANCE
) -> str:
    """How ``tuned`` compares with ``default`` on one trace: ``dominates`` (better on SLO or GPU-s, worse on
    neither), ``same`` (within ``slo_tol`` points and ``gpu_tol`` relative), ``trade-off`` (better on one,
    worse on the other), ``worse`` (worse on one or both, better on neither). Unknown SLO counts as worse."""
    if math.isnan(tuned.slo_attainment) or default.gpu_seconds <= 0:
        return "worse"
    d_slo = tuned.slo_attainment - default.slo_attainment if not math.isnan(default.slo_attainment) else 1.0
    d_gpu = tuned.gpu_seconds / default.gpu_seconds - 1.0
    better = (d_slo > slo_tol) + (d_gpu < -gpu_tol)
    worse = (d_slo < -slo_tol) + (d_gpu > gpu_tol)
    if better and not worse:
        return "dominates"
    if worse and not better:
        return "worse"
    return "trade-off" if better else "same"


@dataclass(frozen=True)
class Comparison:
    """The shipped defaults and the tuned config on the same steps of one trace (``role``: train or held
    out)."""

    name: str
    default: Evaluation
    tuned: Evaluation
    role: Literal["train", "held-out"] = "held-out"

    @property
    def gpu_ratio(self) -> float:
        """Tuned GPU-s / default GPU-s (NaN when the defaults used none)."""
        return self.tuned.gpu_seconds / self.default.gpu_seconds if self.default.gpu_seconds else math.nan

    @property
    def slo_delta(self) -> float:
        """Tuned minus default SLO attainment (points as a fraction: 0.01 = 1 point)."""
        return self.tuned.slo_attainment - self.default.slo_attainment

    @property
    def verdict(self) -> str:
        return verdict(self.default, self.tuned)

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.name,
            "role": self.role,
            "default": self.default.to_json(),
            "tuned": self.tuned.to_json(),
            "gpu_ratio": self.gpu_ratio,
            "slo_delta": self.slo_delta,
            "verdict": self.verdict,
        }


def compare(
    name: str,
    steps: Sequence[Step],
    tuned: PolicyConfig,
    make_forecaster: ForecasterFactory,
    *,
    role: Literal["train", "held-out"] = "held-out",
    default: Evaluation | None = None,
) -> Comparison:
    """Replay ``steps`` under ``tuned`` and (unless ``default`` is given, e.g. a baseline already replayed)
    under ``PolicyConfig()``."""
    base = default if default is not None else evaluate(PolicyConfig(), steps, make_forecaster)
    return Comparison(name, base, evaluate(tuned, steps, make_forecaster), role)


def split_table(
    train_steps: Sequence[Step],
    holdout_steps: Sequence[Step],
    tuned: PolicyConfig,
    make_forecaster: ForecasterFactory,
    *,
    train_default: Evaluation | None = None,
) -> list[Comparison]:
    """Defaults vs ``tuned``: one row per training trace (its steps, as tuned; ``train_default`` reuses the
    defaults' replay of ``train_steps``), then one per held-out trace."""
    base = (
        train_default if train_default is not None else evaluate(PolicyConfig(), train_steps, make_forecaster)
    )
    mine = evaluate(tuned, train_steps, make_forecaster)
    base_by, mine_by = base.by_trace(), mine.by_trace()
    rows = [Comparison(k, base_by[k], mine_by[k], "train") for k in mine_by]
    groups: dict[str, list[Step]] = {}
    for st in holdout_steps:
        groups.setdefault(st.source, []).append(st)
    for k, steps in groups.items():
        rows.append(compare(k, steps, tuned, make_forecaster, role="held-out"))
    return rows
