"""Optuna sweeps of the predictive controller's parameters on trace replays (``pdscale tune``, issue 7).

Each trial is a set of ``PolicyConfig`` values drawn from :data:`SEARCH_SPACE` and judged by replaying
training traces through the simulator (``serving.sim.replay``) under ``controller.replay_policies.
PredictivePolicy``. Two objectives come out of a replay: the SLO violation rate (1 - attainment over every
request) and GPU-seconds. Two ways to optimise them:

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

The chosen trial (both modes): among completed trials those meeting ``slo_target``, the one with the least
GPU-seconds; when none does, the least penalised GPU-seconds (constrained) or the best SLO attainment
(pareto). That trial is on the Pareto front by construction.

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

Mode = Literal["pareto", "constrained"]
MODES: tuple[str, ...] = ("pareto", "constrained")
FORECASTERS: tuple[str, ...] = ("default", "holt")
ForecasterFactory = Callable[[], Forecaster]


class TuneError(ValueError):
    """A tuning run cannot go on as asked; the message says what to change."""


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
        return [Step(name, trace, fleet)]
    end_s = float(trace.arrival_s[-1])
    edges = np.linspace(0.0, end_s, chunks + 1)
    edges[-1] = math.inf
    out = []
    for i in range(chunks):
        part = rebase(trace, float(edges[i]), float(edges[i + 1]))
        if len(part):
            out.append(Step(f"{name}[{i + 1}/{chunks}]", part, fleet))
    return out


@dataclass(frozen=True)
class StepResult:
    """What one step's replay measured."""

    name: str
    requests: int
    slo_met: float  # requests meeting the SLO (attainment x requests)
    gpu_seconds: float
    wall_s: float


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

    def problems(self) -> list[str]:
        out = []
        if self.mode not in MODES:
            out.append(f"objective {self.mode!r}: expected one of {MODES}")
        if not 0.0 < self.slo_target <= 1.0:
            out.append(f"slo_target must be in (0, 1], got {self.slo_target}")
        if not (math.isfinite(self.penalty) and self.penalty >= 0):
            out.append(f"penalty must be a finite number >= 0, got {self.penalty}")
        if self.chunks < 1:
            out.append(f"chunks must be >= 1, got {self.chunks}")
        if self.forecaster not in FORECASTERS:
            out.append(f"forecaster {self.forecaster!r}: expected one of {FORECASTERS}")
        if self.duration_s is not None and not self.duration_s > 0:
            out.append(f"duration_s must be > 0, got {self.duration_s}")
        return out

    @property
    def choice_penalty(self) -> float | None:
        """The penalty :func:`choose` prices an SLO deficit with when no trial meets the target (constrained
        mode); None in pareto mode (the best SLO is chosen then)."""
        return self.penalty if self.mode == "constrained" else None

    def fleet(self) -> FleetSpec:
        return single_pool(profile=self.profile, slo_ttft_ms=self.slo_ttft_ms, slo_itl_ms=self.slo_itl_ms)

    def to_attrs(self) -> dict[str, Any]:
        """JSON-able form stored in the study's user attributes."""
        d = dict(self.__dict__)
        d["traces"] = list(self.traces)
        return d


def load_steps(settings: TuneSettings, traces: Sequence[tuple[str, Trace]]) -> list[Step]:
    """The training steps: each trace (cut to ``duration_s``) split into ``chunks`` windows."""
    fleet = settings.fleet()
    out: list[Step] = []
    for name, trace in traces:
        if settings.duration_s is not None:
            trace = trace.window(0.0, settings.duration_s)
        out.extend(split_steps(name, trace, settings.chunks, fleet))
    return out


def suggest(trial: optuna.Trial, space: Sequence[SearchParam] = SEARCH_SPACE) -> dict[str, Any]:
    """Draw one value per table entry."""
    out: dict[str, Any] = {}
    for p in space:
        if p.integer:
            out[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
        else:
            out[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
    return out


def make_objective(
    settings: TuneSettings, steps: Sequence[Step], make_forecaster: ForecasterFactory, worker: int
) -> Callable[[optuna.Trial], float | tuple[float, float]]:
    """The Optuna objective: sample, replay the steps, report/prune (constrained), record the figures."""

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        config = config_from_params(suggest(trial))
        trial.set_user_attr("worker", worker)

        def after_step(i: int, ev: Evaluation) -> None:
            if settings.mode != "constrained" or i == len(steps) - 1:
                return
            value = running_objective(ev, steps, settings)
            trial.report(value, step=i)
            if trial.should_prune():
                _record(trial, ev, settings.slo_target)
                raise optuna.TrialPruned(
                    f"after {steps[i].name}: projected {value:,.0f} worse than the median"
                )

        ev = evaluate(config, steps, make_forecaster, after_step=after_step)
        _record(trial, ev, settings.slo_target)
        if settings.mode == "pareto":
            return ev.violation_rate, ev.gpu_seconds
        return penalised_gpu_seconds(ev.gpu_seconds, ev.slo_attainment, settings.slo_target, settings.penalty)

    return objective


def _record(trial: optuna.Trial, ev: Evaluation, slo_target: float) -> None:
    trial.set_user_attr("slo_attainment", ev.slo_attainment)
    trial.set_user_attr("slo_deficit", slo_target - ev.slo_attainment)
    trial.set_user_attr("gpu_seconds", ev.gpu_seconds)
    trial.set_user_attr("steps_done", len(ev.steps))
    trial.set_user_attr("wall_s", sum(s.wall_s for s in ev.steps))


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
        with _quiet_experimental():
            study.set_metric_names(
                ["slo_violation_rate", "gpu_seconds"]
                if settings.mode == "pareto"
                else ["penalised_gpu_seconds"]
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
        out.append(Candidate(t.number, float(slo), float(gpu), dict(t.params)))
    return out


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
    header = [
        f"pdscale tune: study {study_name!r} ({storage}), trial {c.number}",
        f"chosen: {choice.rule}",
        f"objective {settings.mode}: SLO attainment {c.slo_attainment:.4%} (target {settings.slo_target:.2%}), "
        f"GPU-seconds {c.gpu_seconds:,.0f}",
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
    gpu_name = "penalised_gpu_seconds"
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
            "pareto_front.png: constrained mode has one objective, no Pareto front (use --objective pareto)"
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
@dataclass(frozen=True)
class Comparison:
    """The shipped defaults and the tuned config on the same steps."""

    name: str
    default: Evaluation
    tuned: Evaluation

    def to_json(self) -> dict[str, Any]:
        return {"trace": self.name, "default": self.default.to_json(), "tuned": self.tuned.to_json()}


def compare(
    name: str, steps: Sequence[Step], tuned: PolicyConfig, make_forecaster: ForecasterFactory
) -> Comparison:
    """Replay ``steps`` under ``PolicyConfig()`` and under ``tuned``."""
    return Comparison(
        name, evaluate(PolicyConfig(), steps, make_forecaster), evaluate(tuned, steps, make_forecaster)
    )
