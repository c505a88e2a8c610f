"""The ``train-forecaster`` CLI: help that teaches, clear errors, a tiny fit from a trace file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster.checkpoint import load_checkpoint
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.data import sha256_file

# Wide enough that rich's error panel never wraps a path (under xdist tmp_path is longer: .../popen-gw0/...)
runner = CliRunner(env={"COLUMNS": "400"})


@pytest.mark.parametrize(
    "command", [[], ["fit"], ["export"], ["evaluate"]], ids=["root", "fit", "export", "evaluate"]
)
def test_every_help_has_an_example(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


def test_fit_without_sources_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["fit", "--out", str(tmp_path), "--synthetic", "0"])
    assert result.exit_code != 0
    assert "--trace" in result.output and "--prometheus" in result.output


def test_fit_with_a_missing_trace_names_the_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["fit", "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "nope.csv" in result.output


def test_export_of_a_non_checkpoint_fails_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    result = runner.invoke(
        app, ["export", "--checkpoint", str(bad), "--out", str(tmp_path / "o.safetensors")]
    )
    assert result.exit_code != 0
    assert "bad.ckpt" in str(result.exception) + result.output


def test_tiny_fit_from_an_azure_csv(tmp_path: Path) -> None:
    trace = generate(SyntheticParams(duration_s=600, rate_rps=3, burst_multiplier=6), seed=11)
    csv = write_trace(trace, tmp_path / "tiny.csv", "azure")
    out = tmp_path / "run"
    args = [
        "fit", "--trace", str(csv), "--out", str(out), "--epochs", "1", "--seq-len", "64", "--burn-in", "8",
        "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1", "--heads", "2",
        "--window", "4", "--copies", "1", "--synthetic", "0", "--accelerator", "cpu", "--threads", "1",
        "--quiet", "--checkpoint-out", str(tmp_path / "shipped.safetensors"), "--json", str(tmp_path / "run.json"),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ckpt = load_checkpoint(tmp_path / "shipped.safetensors")
    src = ckpt.meta["sources"][0]
    assert src["sha256"] == sha256_file(csv)
    assert src["format"] == "azure"
    assert (tmp_path / "run.json").is_file()
    assert np.isfinite(ckpt.meta["run"]["best_val_loss"])


@pytest.mark.prometheus
def test_tiny_fit_from_prometheus_history(prometheus_bin: str, tmp_path: Path) -> None:
    from tests.support.prometheus import PrometheusServer, Series, backfill_openmetrics

    end_s, n_t = 1_700_000_000.0, 1200
    ts = end_s - n_t + 1 + np.arange(n_t, dtype=np.float64)
    counts = np.random.default_rng(1).poisson(5.0, n_t).astype(np.float64)
    lab = {"node": "gpu-0"}
    series = [
        Series("pdscale_router_requests_total", lab, ts, np.cumsum(counts)),
        Series("vllm_prompt_tokens_total", lab, ts, np.cumsum(counts * 300)),
        Series("vllm_generation_tokens_total", lab, ts, np.cumsum(counts * 30)),
    ]
    data = backfill_openmetrics(series, tmp_path / "tsdb")
    with PrometheusServer(prometheus_bin, data_dir=data, retention="10y") as prom:
        args = [
            "fit", "--prometheus", prom.url, "--range", "20m", "--step", "1s", "--end", f"{end_s:.0f}",
            "--out", str(tmp_path / "run"), "--epochs", "1", "--seq-len", "64", "--burn-in", "8",
            "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1", "--heads", "2",
            "--window", "4", "--synthetic", "0", "--accelerator", "cpu", "--threads", "1", "--quiet",
        ]  # fmt: skip
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = load_checkpoint(tmp_path / "run" / "forecaster.safetensors").meta
    src = meta["sources"][0]
    assert src["kind"] == "prometheus" and src["nodes"] == ["gpu-0"] and src["steps"] == n_t
    assert src["train_steps"] == int(n_t * 0.6)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--level-halflife-s", "30", "--level-of", "bogus"], "--level-of 'bogus': one of own, arrivals"),
        (["--level-of", "arrivals"], "--level-of 'arrivals' needs --level-halflife-s > 0"),
    ],
    ids=["unknown", "without-level-schema"],
)
def test_fit_rejects_a_bad_or_unused_level_of(tmp_path: Path, extra: list[str], named: str) -> None:
    trace = tmp_path / "empty.csv"  # checked before any trace is read: an empty file will do
    trace.write_text("")
    args = ["fit", "--trace", str(trace), "--out", str(tmp_path / "out"), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    assert named in " ".join(result.output.replace("│", " ").split())  # the error box wraps lines
