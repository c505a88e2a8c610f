"""``train-forecaster fit --baseline-halflives`` and ``--pool-features``: a tiny fit each, evaluated end to end;
the data module's descriptor columns are the whole series' descriptors at the window's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster.checkpoint import load_checkpoint
from forecaster.features import POOL_SCHEMA, descriptor_series
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.data import node_series_from_trace
from training.datamodule import SequenceDataset, fit_normalizer
from training.evaluate import evaluate
from training.fit import LabelConfig

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "skip", "schema_version"),
    [(["--baseline-halflives", "5,30"], (5.0, 30.0), 1), (["--pool-features"], (), 2)],
    ids=["baseline-skip", "pool-features"],
)
def test_tiny_fit_variant_loads_and_evaluates(
    flags: list[str], skip: tuple[float, ...], schema_version: int, tmp_path: Path
) -> None:
    trace = generate(SyntheticParams(duration_s=500, rate_rps=3, burst_multiplier=6), seed=11)
    csv = write_trace(trace, tmp_path / "tiny.csv", "azure")
    ckpt_path = tmp_path / "m.safetensors"
    args = [
        "fit", "--trace", str(csv), "--out", str(tmp_path / "run"), "--epochs", "1", "--seq-len", "48",
        "--burn-in", "8", "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1",
        "--heads", "2", "--window", "4", "--copies", "1", "--synthetic", "0", "--accelerator", "cpu",
        "--threads", "1", "--quiet", "--checkpoint-out", str(ckpt_path), *flags,
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ckpt = load_checkpoint(ckpt_path)
    assert ckpt.net_config.baseline_halflives == skip and ckpt.schema.version == schema_version
    r = evaluate(trace, checkpoint=ckpt_path, score_from="70%", with_arima=False)
    assert np.isfinite(r.models["learned"].mae)
    fast = evaluate(trace, checkpoint=ckpt_path, score_from="70%", with_arima=False, offline=True)
    np.testing.assert_allclose(fast.p50, r.p50, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fast.burst_prob, r.burst_prob, atol=1e-5)
    for k in ("mae", "pinball_p90", "coverage_p90"):
        assert getattr(fast.models["learned"], k) == pytest.approx(getattr(r.models["learned"], k), rel=1e-4)


def test_bad_halflives_are_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["fit", "--synthetic", "1", "--out", str(tmp_path), "--baseline-halflives", "5,x"]
    )
    assert result.exit_code != 0 and "--baseline-halflives" in result.output


def test_dataset_descriptors_come_from_the_whole_series() -> None:
    trace = generate(SyntheticParams(duration_s=400, rate_rps=5, burst_multiplier=4), seed=3)
    lab = LabelConfig()
    s = node_series_from_trace(
        "t", trace, t0_s=0.0, t1_s=400.0, horizon_s=5, onsets=lab.onsets, lead_s=3, after_s=2
    )
    nz = fit_normalizer([s], POOL_SCHEMA)
    starts = np.array([[0, 0], [0, 150], [0, 380]])
    ds = SequenceDataset([s], starts, seq_len=64, normalizer=nz, schema=POOL_SCHEMA)
    full = descriptor_series(s.x_raw, np.isfinite(s.x_raw), POOL_SCHEMA)
    for i, (_, start) in enumerate(starts):
        x = ds[i]["x"].numpy()
        assert x.shape == (64, POOL_SCHEMA.n_inputs)
        rows = full[start : start + 64]
        np.testing.assert_allclose(x[: len(rows), -3:], rows, atol=1e-5)
        assert np.all(x[len(rows) :, -3:] == 0.0)
