"""``train-forecaster tune``: Optuna sweeps over tiny Lightning fits, pruning, export of the best trial."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from forecaster.checkpoint import load_checkpoint
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.datamodule import WindowConfig
from training.fit import AugmentConfig, LabelConfig, SeriesSet, TraceSource, build_series, fit_forecaster
from training.tune_forecaster import (
    BEST_CHECKPOINT,
    BEST_JSON,
    FIT_DEFAULTS,
    Objective,
    SearchSpace,
    TuneConfig,
    TuneError,
    open_study,
    tune_forecaster,
)

runner = CliRunner()

TINY_SPACE = SearchSpace(windows=(4, 8), hidden_sizes=(8, 16), heads=(1, 2), lr_range=(2e-3, 1e-2))
TINY_WINDOW = WindowConfig(seq_len=32, burn_in=8, batch_size=4, windows_per_epoch=8)


def tiny_config(**kw: object) -> TuneConfig:
    base: dict[str, object] = {
        "trials": 2,
        "epochs": 2,
        "patience": 2,
        "layers": 1,
        "window": TINY_WINDOW,
        "startup_trials": 1,
        "with_arima": False,
    }
    base.update(kw)
    return TuneConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def trace_source() -> TraceSource:
    trace = generate(SyntheticParams(duration_s=900, rate_rps=3, burst_multiplier=6), seed=11)
    return TraceSource(name="tiny-bursty", trace=trace)


@pytest.fixture(scope="module")
def series(trace_source: TraceSource) -> SeriesSet:
    return build_series(
        [trace_source], labels=LabelConfig(), augment=AugmentConfig(copies_per_source=1, synthetic_traces=0)
    )


class PruneFrom(optuna.pruners.BasePruner):
    """Prunes every trial numbered ``first`` or later at its first report (and none before)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return trial.number >= self.first


def test_a_sweep_exports_a_loadable_best_checkpoint(
    series: SeriesSet, trace_source: TraceSource, tmp_path: Path
) -> None:
    result = tune_forecaster(
        series, tmp_path, traces=[trace_source], space=TINY_SPACE, config=tiny_config(), log=lambda m: None
    )
    study = optuna.load_study(study_name="forecaster", storage=result.storage)
    states = {t.state for t in study.trials}
    assert len(study.trials) == 2
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert optuna.trial.TrialState.COMPLETE in states
    ckpt = load_checkpoint(tmp_path / BEST_CHECKPOINT)
    doc = json.loads((tmp_path / BEST_JSON).read_text())
    assert doc["objective"] == "mae-ratio"
    assert doc["best"]["model_version"] == ckpt.model_version
    assert doc["best"]["value"] == pytest.approx(study.best_value)
    # the exported network is the best trial's architecture, and its score is the mean traced ratio
    params = study.best_params
    assert (ckpt.net_config.hidden, ckpt.net_config.heads, ckpt.net_config.window) == (
        params["hidden"],
        params["heads"],
        params["window"],
    )
    per_trace = doc["best"]["attrs"]["traces"]["tiny-bursty"]
    assert per_trace["mae_ratio"] == pytest.approx(study.best_value)
    assert per_trace["learned_mae"] == pytest.approx(per_trace["mae_ratio"] * per_trace["best_baseline_mae"])
    assert np.isfinite(per_trace["learned_mae"]) and per_trace["learned_mae"] > 0


def test_a_pruned_trial_writes_no_checkpoint_and_a_joined_study_keeps_counting(
    series: SeriesSet, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    cfg = tiny_config(objective=Objective.val_loss, trials=2)
    result = tune_forecaster(
        series,
        tmp_path,
        space=TINY_SPACE,
        config=cfg,
        storage=storage,
        pruner=PruneFrom(1),
        log=lambda m: None,
    )
    study = optuna.load_study(study_name="forecaster", storage=storage)
    assert [t.state for t in study.trials] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
    ]
    assert result.best_number == 0 and result.states == {"COMPLETE": 1, "PRUNED": 1}
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == ["forecaster-trial0000.safetensors"]
    # a second worker on the same storage and study adds its trials to the same study
    tune_forecaster(
        series,
        tmp_path / "worker2",
        space=TINY_SPACE,
        config=tiny_config(objective=Objective.val_loss, trials=1),
        storage=storage,
        pruner=PruneFrom(99),
        log=lambda m: None,
    )
    assert len(optuna.load_study(study_name="forecaster", storage=storage).trials) == 3
    # ... but not with another search space
    with pytest.raises(TuneError, match="different settings"):
        tune_forecaster(
            series,
            tmp_path / "worker3",
            space=SearchSpace(windows=(4,), hidden_sizes=(8,), heads=(1,)),
            config=cfg,
            storage=storage,
            log=lambda m: None,
        )


def test_all_trials_pruned_is_a_clear_error(series: SeriesSet, tmp_path: Path) -> None:
    cfg = tiny_config(objective=Objective.val_loss, trials=1)
    with pytest.raises(TuneError, match="no completed trial"):
        tune_forecaster(
            series, tmp_path, space=TINY_SPACE, config=cfg, pruner=PruneFrom(0), log=lambda m: None
        )


def test_mae_ratio_without_traces_is_refused(series: SeriesSet, tmp_path: Path) -> None:
    with pytest.raises(TuneError, match="--objective val-loss"):
        tune_forecaster(series, tmp_path, space=TINY_SPACE, config=tiny_config(), log=lambda m: None)


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("runs/tune.db", "not a database URL"),
        ("nosuchdialect://host/db", "cannot open Optuna study"),
        ("sqlite:////no/such/dir/tune.db", "does not exist"),
    ],
    ids=["no-scheme", "unknown-dialect", "missing-directory"],
)
def test_bad_storage_urls_are_clear_errors(storage: str, message: str) -> None:
    with pytest.raises(TuneError, match=message) as info:
        open_study(storage, "s", seed=0)
    assert storage in str(info.value)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"hidden_sizes": (12,), "heads": (1, 8)}, "hidden 12 / heads 8"),
        ({"windows": ()}, "windows must not be empty"),
        ({"heads": (0,)}, "heads must be integers >= 1"),
        ({"lr_range": (1e-2, 1e-3)}, "lr_range"),
    ],
    ids=["heads-not-dividing", "empty", "zero-heads", "lr-reversed"],
)
def test_search_space_rejects_bad_values(kw: dict[str, object], message: str) -> None:
    with pytest.raises(TuneError, match=message):
        SearchSpace(**kw)  # type: ignore[arg-type]


def test_cli_tune_help_teaches_with_an_example() -> None:
    result = runner.invoke(app, ["tune", "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output and "--storage" in result.output


def test_cli_tune_with_a_bad_storage_fails_before_reading_data(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["tune", "--synthetic", "1", "--storage", "nosuchdialect://x", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "nosuchdialect://x" in result.output
    assert not (tmp_path / "trials").exists()


def test_cli_tune_from_an_azure_csv_writes_best_and_plots(tmp_path: Path) -> None:
    trace = generate(SyntheticParams(duration_s=900, rate_rps=3, burst_multiplier=6), seed=5)
    csv = write_trace(trace, tmp_path / "tiny.csv", "azure")
    out = tmp_path / "run"
    args = [
        "tune", "--trace", str(csv), "--synthetic", "0", "--copies", "1", "--trials", "2", "--epochs", "1",
        "--seq-len", "32", "--burn-in", "8", "--batch-size", "4", "--windows-per-epoch", "8",
        "--windows", "4,8", "--hidden-sizes", "8,16", "--heads", "1,2", "--layers", "1", "--no-arima",
        "--no-prune", "--quiet", "--out", str(out), "--plots", str(tmp_path / "plots"),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / BEST_JSON).read_text())
    assert doc["objective"] == "mae-ratio" and doc["trials"] == {"COMPLETE": 2}
    assert load_checkpoint(out / BEST_CHECKPOINT).model_version == doc["best"]["model_version"]
    for name in ("optimization_history.png", "intermediate_values.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_fit_defaults_are_fits_own() -> None:
    sig = inspect.signature(fit_forecaster).parameters
    assert (FIT_DEFAULTS.window, FIT_DEFAULTS.hidden, FIT_DEFAULTS.heads, FIT_DEFAULTS.lr) == (
        sig["net_window"].default,
        sig["net_hidden"].default,
        sig["net_heads"].default,
        sig["lr"].default,
    )


def test_a_new_study_runs_fits_defaults_first_and_only_once(series: SeriesSet, tmp_path: Path) -> None:
    space = SearchSpace(windows=(8, 60), hidden_sizes=(16, 64), heads=(2, 4), lr_range=(1e-3, 1e-2))
    cfg = tiny_config(objective=Objective.val_loss, trials=1, epochs=1)
    storage = f"sqlite:///{tmp_path / 'd.db'}"
    for _ in range(2):
        tune_forecaster(series, tmp_path, space=space, config=cfg, storage=storage, log=lambda m: None)
    trials = optuna.load_study(study_name="forecaster", storage=storage).trials
    assert trials[0].params == {"window": 60, "hidden": 64, "heads": 4, "lr": 3e-3}
    assert trials[1].params != trials[0].params
