"""Hyper-parameter sweeps of the forecaster (``train-forecaster tune``): Optuna over Lightning fits.

One study searches the attention window, LSTM hidden size, attention heads and learning rate
(:class:`SearchSpace`). Every trial trains the network on the same series (built once by
``training.fit.build_series``: same splits, same augmentation, same seed) and reports its validation loss
after every epoch to Optuna through ``optuna_integration.PyTorchLightningPruningCallback``, so a pruner can
stop a trial whose loss curve lags the others'.

Objective (minimised), chosen by :class:`Objective`:

- ``mae-ratio`` (default when request traces are given): for every trace, the learned model's MAE of
  next-``horizon_s`` arrivals on the trace's **validation** slice, divided by the best simple baseline's MAE
  on the same slice — the protocol of ``train-forecaster evaluate`` (``training.evaluate.evaluate``) with
  the training part as history; the mean over traces is the objective. The issue's goal is ≤ 0.85 on
  bursty traffic. The hold-out (last ``holdout_frac``) is never read, so ``evaluate`` on it afterwards
  stays an honest test. Baselines (ARIMA included unless disabled) are scored once per study.
- ``val-loss``: the best epoch's validation loss (pinball + burst BCE), the loss ``fit`` early-stops on.

Pruning always watches ``val_loss`` per epoch: it is what is known while a trial trains, and it measures
the same thing in every trial (the loss does not depend on the tuned parameters).

Each completed trial writes its best epoch's weights as an inference checkpoint (the format of
``forecaster.checkpoint.save_checkpoint``, what ``train-forecaster export`` writes) under
``out/trials/``; the study's best is copied to ``out/best.safetensors`` with ``out/best.json``.
Several processes pointed at the same storage and study share the trials.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from training.augment import MaskingConfig
from training.datamodule import WindowConfig
from training.fit import LabelConfig, SeriesSet, TraceSource

if TYPE_CHECKING:
    import optuna
    import torch

    from forecaster.features import Normalizer

MAE_RATIO_GOAL = 0.85
"""Issue 4's accuracy goal on bursty traffic: learned MAE ≤ 0.85 × the best simple baseline's MAE."""

BEST_CHECKPOINT = "best.safetensors"
BEST_JSON = "best.json"
_SPACE_ATTR = "pdscale_search_space"
_OBJECTIVE_ATTR = "pdscale_objective"


class TuneError(ValueError):
    """A sweep that cannot run as asked (bad storage URL, search space, no trial completed...)."""


class Objective(StrEnum):
    """What a trial's value is (see the module docstring)."""

    mae_ratio = "mae-ratio"
    val_loss = "val-loss"


def _positive_ints(name: str, values: tuple[int, ...]) -> list[str]:
    if not values:
        return [f"{name} must not be empty"]
    bad = [v for v in values if int(v) < 1]
    return [f"{name} must be integers >= 1, got {list(values)}"] if bad else []


@dataclass(frozen=True)
class SearchSpace:
    """Values a trial may take; every hidden size must be divisible by every head count.

    Defaults: the shipped model (window 60, hidden 64, 4 heads, lr 3e-3) sits inside the space, with
    half and double of each size around it.
    """

    windows: tuple[int, ...] = (30, 60, 120)
    hidden_sizes: tuple[int, ...] = (32, 64, 128)
    heads: tuple[int, ...] = (1, 2, 4, 8)
    lr_range: tuple[float, float] = (1e-3, 1e-2)

    def __post_init__(self) -> None:
        problems = _positive_ints("windows", self.windows)
        problems += _positive_ints("hidden_sizes", self.hidden_sizes)
        problems += _positive_ints("heads", self.heads)
        lo, hi = self.lr_range
        if not (0 < lo <= hi and math.isfinite(hi)):
            problems.append(f"lr_range must satisfy 0 < low <= high, got {(lo, hi)}")
        pairs = [(h, k) for h in self.hidden_sizes for k in self.heads if k >= 1 and h % k]
        if pairs:
            problems.append(
                "every hidden size must be divisible by every head count; not: "
                + ", ".join(f"hidden {h} / heads {k}" for h, k in pairs)
            )
        if problems:
            raise TuneError("SearchSpace: " + "; ".join(problems))

    def suggest(self, trial: optuna.Trial) -> TrialParams:
        """Draw one point of the space (single values are fixed, not searched)."""
        lo, hi = self.lr_range
        return TrialParams(
            window=int(trial.suggest_categorical("window", list(self.windows))),
            hidden=int(trial.suggest_categorical("hidden", list(self.hidden_sizes))),
            heads=int(trial.suggest_categorical("heads", list(self.heads))),
            lr=float(trial.suggest_float("lr", lo, hi, log=True)) if lo < hi else lo,
        )

    def contains(self, p: TrialParams) -> bool:
        lo, hi = self.lr_range
        return (
            p.window in self.windows
            and p.hidden in self.hidden_sizes
            and p.heads in self.heads
            and lo <= p.lr <= hi
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "windows": list(self.windows),
            "hidden_sizes": list(self.hidden_sizes),
            "heads": list(self.heads),
            "lr_range": list(self.lr_range),
        }


@dataclass(frozen=True)
class TrialParams:
    """One trial's hyper-parameters: attention ``window`` (steps), LSTM ``hidden`` size, ``heads``, ``lr``."""

    window: int
    hidden: int
    heads: int
    lr: float


FIT_DEFAULTS = TrialParams(window=60, hidden=64, heads=4, lr=3e-3)
"""``fit``'s defaults (``training.fit.fit_forecaster``), i.e. the shipped model's: a fresh study runs them
first (``TuneConfig.enqueue_defaults``), so the sweep's best is never worse than the default on its own
objective."""


@dataclass(frozen=True)
class TuneConfig:
    """How each trial trains and how the study is run.

    ``epochs``: maximum epochs per trial (``patience`` early-stops sooner). ``max_minutes_per_trial``: wall
    limit of one trial's training. ``startup_trials`` / ``warmup_epochs``: the median pruner prunes only
    after that many completed trials, and never in a trial's first ``warmup_epochs`` epochs.
    ``with_arima``: include ARIMA among the baselines of the mae-ratio objective (the best baseline on the
    bursty Azure code trace; costs a few seconds per trace, once per study). ``timeout_s``: no new trial
    starts after this much wall time (Optuna's ``timeout``; the running one finishes).
    ``enqueue_defaults``: a study without trials starts with :data:`FIT_DEFAULTS` when the space holds them.
    """

    trials: int = 20
    epochs: int = 10
    patience: int = 5
    layers: int = 2
    seed: int = 0
    objective: Objective = Objective.mae_ratio
    window: WindowConfig = field(default_factory=WindowConfig)
    masking: MaskingConfig | None = field(default_factory=MaskingConfig)
    horizon_s: int = 5
    startup_trials: int = 3
    warmup_epochs: int = 1
    max_minutes_per_trial: float | None = None
    accelerator: str = "cpu"
    num_threads: int | None = 1
    with_arima: bool = True
    timeout_s: float | None = None
    enqueue_defaults: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.timeout_s is not None and not self.timeout_s > 0:
            problems.append(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("trials", "epochs", "patience", "layers", "horizon_s"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.startup_trials < 0 or self.warmup_epochs < 0:
            problems.append("startup_trials and warmup_epochs must be >= 0")
        if self.max_minutes_per_trial is not None and not self.max_minutes_per_trial > 0:
            problems.append(f"max_minutes_per_trial must be > 0, got {self.max_minutes_per_trial}")
        if problems:
            raise TuneError("TuneConfig: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------------
# the mae-ratio objective: baselines once, the learned model per trial


@dataclass(frozen=True, eq=False)
class ValidationSlice:
    """One trace cut at the end of its validation slice, scored from the slice's start.

    ``baseline_mae``: every baseline's MAE on the slice; ``best_baseline`` names the lowest.
    """

    name: str
    trace: Any  # serving.workload.trace.Trace (kept Any: this module must import without torch)
    score_from: str
    baseline_mae: dict[str, float]

    @property
    def best_baseline(self) -> str:
        finite = {k: v for k, v in self.baseline_mae.items() if math.isfinite(v)}
        if not finite:
            raise TuneError(f"{self.name}: no baseline has a finite MAE on the validation slice")
        return min(finite, key=lambda k: finite[k])


def validation_slices(
    traces: Sequence[TraceSource], labels: LabelConfig, *, with_arima: bool = True
) -> list[ValidationSlice]:
    """Cut every trace at the end of its validation slice and score the baselines there (once per study).

    Raises :class:`TuneError` naming the trace when its validation slice is too short to score.
    """
    from training.data import split_trace
    from training.evaluate import EvaluationError, evaluate

    out = []
    for src in traces:
        sp = split_trace(src.trace, holdout_frac=labels.holdout_frac, val_frac=labels.val_frac)
        t0 = float(src.trace.arrival_s[0])
        head = src.trace.window(t0, sp.cut_test_s)
        score_from = f"+{sp.cut_val_s - t0:.6f}"
        try:
            res = evaluate(
                head,
                horizon_s=float(labels.horizon_s),
                score_from=score_from,
                use_default_checkpoint=False,
                with_arima=with_arima,
            )
        except EvaluationError as e:
            raise TuneError(
                f"{src.name}: cannot score its validation slice ({labels.val_frac:.0%} of the span "
                f"before the {labels.holdout_frac:.0%} hold-out): {e}"
            ) from e
        out.append(
            ValidationSlice(
                name=src.name,
                trace=head,
                score_from=score_from,
                baseline_mae={k: float(v.mae) for k, v in res.models.items()},
            )
        )
    return out


def learned_mae_ratios(checkpoint: Path, slices: Sequence[ValidationSlice], horizon_s: int) -> dict[str, Any]:
    """The learned model's MAE on every validation slice and its ratio to that slice's best baseline."""
    from forecaster.streaming import LearnedForecaster
    from training.evaluate import LEARNED, evaluate

    lf = LearnedForecaster.load(checkpoint)
    per_trace: dict[str, dict[str, Any]] = {}
    for sl in slices:
        res = evaluate(
            sl.trace,
            horizon_s=float(horizon_s),
            score_from=sl.score_from,
            with_arima=False,  # the baselines were scored once, in validation_slices
            learned=lf,
        )
        mae = float(res.models[LEARNED].mae)
        best = sl.best_baseline
        per_trace[sl.name] = {
            "learned_mae": mae,
            "best_baseline": best,
            "best_baseline_mae": sl.baseline_mae[best],
            "mae_ratio": mae / sl.baseline_mae[best] if sl.baseline_mae[best] > 0 else math.inf,
        }
    ratios = [float(v["mae_ratio"]) for v in per_trace.values()]
    return {"mae_ratio": float(np.mean(ratios)) if ratios else math.nan, "traces": per_trace}


# ---------------------------------------------------------------------------------------------------
# one trial


def _best_weights_callback() -> Any:
    """A Lightning callback keeping, in memory, the weights of the epoch with the lowest ``val_loss``."""
    from lightning.pytorch import Callback

    class BestWeights(Callback):
        def __init__(self) -> None:
            self.best = math.inf
            self.epoch = -1
            self.state: dict[str, torch.Tensor] | None = None

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            value = trainer.callback_metrics.get("val_loss")
            if trainer.sanity_checking or value is None:
                return
            v = float(value.item())
            if math.isfinite(v) and v < self.best:
                self.best, self.epoch = v, int(trainer.current_epoch)
                self.state = {k: t.detach().to("cpu").clone() for k, t in pl_module.state_dict().items()}

    return BestWeights()


def train_trial(
    trial: optuna.Trial,
    params: TrialParams,
    series: SeriesSet,
    normalizer: Normalizer,
    config: TuneConfig,
    checkpoint: Path,
) -> dict[str, Any]:
    """Train one trial (raising ``optuna.TrialPruned`` when pruned); write its best epoch's checkpoint.

    Returns the run's figures: ``val_loss`` (best epoch), ``best_epoch``, ``epochs``, ``fit_wall_s``,
    ``model_version``.
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping
    from optuna_integration import PyTorchLightningPruningCallback

    from forecaster.checkpoint import save_checkpoint
    from forecaster.features import DEFAULT_SCHEMA
    from forecaster.network import NetConfig
    from training.datamodule import ForecastDataModule
    from training.module import ForecastModule, OptimConfig

    schema = DEFAULT_SCHEMA
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    L.seed_everything(config.seed, workers=True, verbose=False)
    dm = ForecastDataModule(series.train, series.val, normalizer, config.window, masking=config.masking)
    net_cfg = NetConfig(
        n_inputs=schema.n_inputs,
        hidden=params.hidden,
        layers=config.layers,
        heads=params.heads,
        window=params.window,
        n_targets=len(schema.targets),
    )
    optim = OptimConfig(
        lr=params.lr,
        burn_in=config.window.burn_in,
        max_epochs=config.epochs,
        has_val=True,
        horizon_steps=round(config.horizon_s / schema.step_s),
    )
    extra = {
        "schema": schema.to_dict(),
        "normalizer": normalizer.to_dict(),
        "horizon_s": float(config.horizon_s),
        "summary": series.summary,
    }
    module = ForecastModule(net_cfg.to_dict(), asdict(optim), extra)
    best = _best_weights_callback()
    trainer = L.Trainer(
        max_epochs=config.epochs,
        max_time=timedelta(minutes=config.max_minutes_per_trial) if config.max_minutes_per_trial else None,
        accelerator=config.accelerator,
        devices=1,
        gradient_clip_val=1.0,
        deterministic=True if config.accelerator == "cpu" else "warn",
        logger=False,
        enable_checkpointing=False,
        callbacks=[
            best,  # before the pruning callback: a pruned epoch is still recorded
            PyTorchLightningPruningCallback(trial, monitor="val_loss"),
            EarlyStopping(monitor="val_loss", mode="min", patience=config.patience),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0,
        log_every_n_steps=5,
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm)  # raises optuna.TrialPruned when the pruner says so
    fit_s = time.perf_counter() - started
    if best.state is None:
        raise TuneError(f"trial {trial.number}: no epoch produced a finite val_loss")
    module.load_state_dict(best.state)
    meta = dict(series.summary)
    meta["tune"] = {
        "study": trial.study.study_name,
        "trial": trial.number,
        "params": asdict(params),
        "best_epoch": best.epoch,
        "best_val_loss": best.best,
        "window": asdict(config.window),
        "optim": asdict(optim),
    }
    version = save_checkpoint(
        checkpoint, module.net.to("cpu").float(), schema, normalizer, float(config.horizon_s), _jsonable(meta)
    )
    return {
        "val_loss": best.best,
        "best_epoch": best.epoch,
        "epochs": int(trainer.current_epoch),
        "fit_wall_s": fit_s,
        "model_version": version,
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ---------------------------------------------------------------------------------------------------
# the study


def open_study(
    storage: str, study_name: str, *, seed: int, pruner: optuna.pruners.BasePruner | None = None
) -> optuna.Study:
    """Create or join the study (``load_if_exists``), minimising; raises :class:`TuneError` on a bad URL.

    ``storage``: an SQLAlchemy URL Optuna accepts (``sqlite:///runs/tune.db``, ``postgresql://...``).
    """
    import optuna

    if "://" not in storage:
        raise TuneError(
            f"--storage {storage!r} is not a database URL: give e.g. sqlite:///runs/tune.db or "
            "postgresql://user:pass@host/db"
        )
    if storage.startswith("sqlite:///"):
        db = Path(storage.removeprefix("sqlite:///"))
        if str(db) not in ("", ":memory:") and not db.parent.is_dir():
            raise TuneError(f"--storage {storage!r}: directory {db.parent} does not exist")
    try:
        return optuna.create_study(
            storage=storage,
            study_name=study_name,
            direction="minimize",
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=pruner,
            load_if_exists=True,
        )
    except Exception as e:  # SQLAlchemy and Optuna raise many types (ArgumentError, OperationalError, ...)
        raise TuneError(f"--storage {storage!r}: cannot open Optuna study {study_name!r}: {e}") from e


def _check_study_attrs(study: optuna.Study, space: SearchSpace, objective: Objective) -> None:
    """A study joined by several workers must search one space for one objective."""
    mine = {_SPACE_ATTR: space.to_dict(), _OBJECTIVE_ATTR: str(objective)}
    attrs = study.user_attrs
    diffs = [
        f"{k}: study has {attrs[k]}, this run {v}" for k, v in mine.items() if k in attrs and attrs[k] != v
    ]
    if diffs:
        raise TuneError(
            f"study {study.study_name!r} was started with different settings: " + "; ".join(diffs)
        )
    for k, v in mine.items():
        if k not in attrs:
            study.set_user_attr(k, v)


@dataclass(frozen=True, eq=False)
class TuneResult:
    """What ``tune`` produced: the best trial and where its checkpoint and summary were written."""

    study_name: str
    storage: str
    best_number: int
    best_value: float
    best_params: dict[str, Any]
    best_attrs: dict[str, Any]
    checkpoint: Path
    summary_json: Path
    states: dict[str, int]
    wall_s: float


TrialCallback = Callable[["optuna.Study", "optuna.trial.FrozenTrial"], None]


def tune_forecaster(
    series: SeriesSet,
    out: Path,
    *,
    traces: Sequence[TraceSource] = (),
    labels: LabelConfig = LabelConfig(),
    space: SearchSpace = SearchSpace(),
    config: TuneConfig = TuneConfig(),
    storage: str | None = None,
    study_name: str = "forecaster",
    pruner: optuna.pruners.BasePruner | None = None,
    on_trial: TrialCallback | None = None,
    log: Callable[[str], None] = print,
) -> TuneResult:
    """Run ``config.trials`` trials of the study, then export the study's best trial (module docstring).

    ``traces``: the real traces behind ``series`` (their validation slices score the mae-ratio objective).
    ``storage``: default ``sqlite:///OUT/tune.db``. ``pruner``: default a median pruner with
    ``config.startup_trials`` / ``config.warmup_epochs``. ``on_trial`` is called after every trial (progress).
    """
    import optuna

    from training.datamodule import fit_normalizer

    started = time.perf_counter()
    if not series.val:
        raise TuneError("tune needs validation series (--val-frac > 0): pruning watches val_loss")
    if config.objective is Objective.mae_ratio and not traces:
        raise TuneError(
            "objective mae-ratio needs at least one --trace (its validation slice is scored against the "
            "baselines); with only --synthetic or --prometheus data use --objective val-loss"
        )
    if labels.horizon_s != config.horizon_s:
        raise TuneError(f"labels.horizon_s {labels.horizon_s} != config.horizon_s {config.horizon_s}")
    out.mkdir(parents=True, exist_ok=True)
    storage = storage or f"sqlite:///{(out / 'tune.db').resolve()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(
        storage,
        study_name,
        seed=config.seed,
        pruner=pruner
        or optuna.pruners.MedianPruner(
            n_startup_trials=config.startup_trials, n_warmup_steps=config.warmup_epochs
        ),
    )
    _check_study_attrs(study, space, config.objective)
    if config.enqueue_defaults and space.contains(FIT_DEFAULTS) and not study.trials:
        study.enqueue_trial(asdict(FIT_DEFAULTS))
    slices: list[ValidationSlice] = []
    if config.objective is Objective.mae_ratio:
        slices = validation_slices(traces, labels, with_arima=config.with_arima)
        for sl in slices:
            log(
                f"validation slice of {sl.name}: best baseline {sl.best_baseline} "
                f"MAE {sl.baseline_mae[sl.best_baseline]:.3f}"
            )
    normalizer = fit_normalizer(series.train)
    trial_dir = out / "trials"
    trial_dir.mkdir(exist_ok=True)

    def objective(trial: optuna.Trial) -> float:
        params = space.suggest(trial)
        ckpt = (trial_dir / f"{study_name}-trial{trial.number:04d}.safetensors").resolve()
        run = train_trial(trial, params, series, normalizer, config, ckpt)
        for k, v in run.items():
            trial.set_user_attr(k, v)
        trial.set_user_attr("checkpoint", str(ckpt))
        if config.objective is Objective.val_loss:
            return float(run["val_loss"])
        scores = learned_mae_ratios(ckpt, slices, config.horizon_s)
        trial.set_user_attr("traces", _jsonable(scores["traces"]))
        return float(scores["mae_ratio"])

    study.optimize(
        objective,
        n_trials=config.trials,
        timeout=config.timeout_s,
        callbacks=[on_trial] if on_trial else None,
    )
    return export_best(study, out, storage=storage, objective=config.objective, started=started)


def export_best(
    study: optuna.Study, out: Path, *, storage: str, objective: Objective, started: float | None = None
) -> TuneResult:
    """Copy the best completed trial's checkpoint to ``out/best.safetensors`` and write ``out/best.json``.

    The copy is checked to load with ``forecaster.checkpoint.load_checkpoint``.
    """
    import optuna

    from forecaster.checkpoint import load_checkpoint

    trials = study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    if not complete:
        raise TuneError(
            f"study {study.study_name!r}: no completed trial to export (trials by state: {states})"
        )
    best = min(complete, key=lambda t: float(t.value))  # type: ignore[arg-type]
    src = Path(str(best.user_attrs.get("checkpoint", "")))
    if not src.is_file():
        raise TuneError(
            f"study {study.study_name!r}: best trial {best.number}'s checkpoint {src} is not on this machine "
            "(written by another worker?): copy it from there"
        )
    dst = out / BEST_CHECKPOINT
    shutil.copyfile(src, dst)
    loaded = load_checkpoint(dst)
    doc = {
        "study": study.study_name,
        "storage": storage,
        "objective": str(objective),
        "goal_mae_ratio": MAE_RATIO_GOAL if objective is Objective.mae_ratio else None,
        "best": {
            "trial": best.number,
            "value": float(best.value),  # type: ignore[arg-type]
            "params": best.params,
            "attrs": _jsonable(dict(best.user_attrs)),
            "checkpoint": str(dst),
            "model_version": loaded.model_version,
        },
        "trials": states,
        "search_space": study.user_attrs.get(_SPACE_ATTR),
    }
    summary = out / BEST_JSON
    summary.write_text(json.dumps(_jsonable(doc), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return TuneResult(
        study_name=study.study_name,
        storage=storage,
        best_number=best.number,
        best_value=float(best.value),  # type: ignore[arg-type]
        best_params=dict(best.params),
        best_attrs=dict(best.user_attrs),
        checkpoint=dst,
        summary_json=summary,
        states=states,
        wall_s=time.perf_counter() - started if started is not None else math.nan,
    )


def write_plots(study: optuna.Study, plots: Path, log: Callable[[str], None] = print) -> list[Path]:
    """PNGs: optimisation history, per-epoch val_loss of every trial, parameter importances (≥ 2 trials)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    plots.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    wanted: list[tuple[str, Callable[[optuna.Study], Any]]] = [
        ("optimization_history.png", ovm.plot_optimization_history),
        ("intermediate_values.png", ovm.plot_intermediate_values),
    ]
    if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        wanted.append(("param_importances.png", ovm.plot_param_importances))
    else:
        log("param importances need at least 2 completed trials with different parameters: skipped")
    written = []
    for name, fn in wanted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ax = fn(study)
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        fig.set_size_inches(9, 5)
        fig.tight_layout()
        fig.savefig(plots / name, dpi=100)
        plt.close(fig)
        written.append(plots / name)
    return written
