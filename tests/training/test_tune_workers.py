"""`pdscale tune` end to end: two worker processes on one SQLite study; the CLI's files (config, JSON, plots)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from controller.config import ControllerConfig, load_yaml_model
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.writers import write_trace
from training import tune

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, seed: int, duration_s: float = 120.0) -> Path:
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=3.0,
        burst_multiplier=4.0,
        calm_mean_s=40.0,
        burst_mean_s=10.0,
        prompt=LengthDist(median_tokens=800.0, sigma=0.5, max_tokens=4000),
        output=LengthDist(median_tokens=80.0, sigma=0.5, max_tokens=500),
        start_time=datetime(2023, 11, 16, 18, 0, 0),
    )
    return write_trace(generate(params, seed), path, "azure")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("traces")
    return _write(d / "train.csv", 1), _write(d / "test.csv", 2)


def test_two_workers_share_one_sqlite_study(tmp_path: Path) -> None:
    # Trials long enough (a 400-s trace: ~1 s each) that both workers, started together, get some: the
    # study is shared, so a worker that started seconds late could otherwise find nothing left to do.
    train = _write(tmp_path / "train.csv", 3, duration_s=400.0)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    n_trials = 6

    def worker(i: int) -> subprocess.Popen[str]:
        cmd = [
            sys.executable, "-m", "training.tune_cli", "--trace", str(train), "--trials", str(n_trials),
            "--forecaster", "holt", "--chunks", "2", "--storage", url, "--study", "shared",
            "--worker-index", str(i), "--out", str(tmp_path / f"best{i}.yaml"),
        ]  # fmt: skip
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [worker(0), worker(1)]
    outputs = [p.communicate(timeout=100)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    study = optuna.load_study(study_name="shared", storage=url)
    trials = study.get_trials()
    finished = [t for t in trials if t.state.is_finished()]
    assert all(t.state != optuna.trial.TrialState.FAIL for t in trials)
    # N trials shared: at most one extra per other worker, and every trial is one of the two workers'
    assert n_trials <= len(finished) <= n_trials + 1
    workers = {t.user_attrs["worker"] for t in finished}
    assert workers == {0, 1}, [t.user_attrs for t in finished]
    # both wrote the same choice, from the same study
    assert (tmp_path / "best0.yaml").exists() and (tmp_path / "best1.yaml").exists()


def test_cli_pareto_writes_config_json_and_plots(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    import typer

    from training.pdscale_cli import app
    from training.tune_cli import tune_cmd

    cli = typer.Typer()
    cli.command()(tune_cmd)
    out, js, plots = tmp_path / "best.yaml", tmp_path / "r.json", tmp_path / "plots"
    args = [
        "--trace", str(traces[0]), "--test-trace", str(traces[1]), "--trials", "3", "--objective", "pareto",
        "--forecaster", "holt", "--chunks", "1", "--study", "p", "--out", str(out), "--json", str(js),
        "--plots", str(plots), "--seed", "4",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(js.read_text())
    assert (tmp_path / "tune.db").exists()  # default storage beside --out
    assert doc["settings"]["mode"] == "pareto" and doc["trials"]["complete"] == 3
    best = doc["best"]
    front = {f["trial"] for f in doc["pareto_front"]}
    assert best["trial"] in front
    assert [(c["trace"], c["role"]) for c in doc["comparisons"]] == [
        (str(traces[0]), "train"), (str(traces[1]), "held-out"),
    ]  # fmt: skip
    assert doc["held_out_verdicts"] == {str(traces[1]): doc["comparisons"][1]["verdict"]}
    for c in doc["comparisons"]:
        assert 0.0 <= c["tuned"]["slo_attainment"] <= 1.0 and c["default"]["gpu_seconds"] > 0
    # the train row's tuned figures are the chosen trial's own
    assert doc["comparisons"][0]["tuned"]["gpu_seconds"] == pytest.approx(best["gpu_seconds"])
    assert sorted(Path(p).name for p in doc["plots"]) == [
        "optimization_history.png", "param_importances.png", "pareto_front.png",
    ]  # fmt: skip
    for p in doc["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check = CliRunner().invoke(app, ["config", "check", str(out)])
    assert check.exit_code == 0, check.output
    policy = load_yaml_model(out, ControllerConfig).pools[0].policy.model_dump()
    for key, value in tune.config_from_params(best["params"]).model_dump().items():
        assert policy[key] == (pytest.approx(value, abs=1e-6) if isinstance(value, float) else value), key


def test_cli_rejects_bad_objective(tmp_path: Path, traces: tuple[Path, Path]) -> None:
    import typer

    from training.tune_cli import tune_cmd

    cli = typer.Typer()
    cli.command()(tune_cmd)
    result = CliRunner().invoke(
        cli, ["--trace", str(traces[0]), "--objective", "both", "--out", str(tmp_path / "b.yaml")]
    )
    assert result.exit_code == 2
    assert "--objective 'both'" in result.output
