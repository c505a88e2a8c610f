"""``train-forecaster fit --level-halflife-s``: a tiny fit evaluated end to end (stepping == full forward), and
the data module's level-relative targets decode back to the window's totals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster.checkpoint import load_checkpoint
from forecaster.features import LEVEL_SCHEMA, level_offsets, level_series
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.data import cut_window, node_series_from_trace
from training.datamodule import SequenceDataset, fit_normalizer
from training.evaluate import evaluate
from training.fit import LabelConfig

runner = CliRunner()


def test_tiny_level_relative_fit_loads_and_evaluates(tmp_path: Path) -> None:
    trace = generate(SyntheticParams(duration_s=500, rate_rps=3, burst_multiplier=6), seed=11)
    csv = write_trace(trace, tmp_path / "tiny.csv", "azure")
    ckpt_path = tmp_path / "m.safetensors"
    args = [
        "fit", "--trace", str(csv), "--out", str(tmp_path / "run"), "--epochs", "1", "--seq-len", "48",
        "--burn-in", "8", "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1",
        "--heads", "2", "--window", "4", "--copies", "1", "--synthetic", "0", "--accelerator", "cpu",
        "--threads", "1", "--quiet", "--checkpoint-out", str(ckpt_path), "--level-halflife-s", "20",
        "--rate-range", "0.1,20",
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ckpt = load_checkpoint(ckpt_path)
    assert ckpt.schema.version == 3 and ckpt.schema.level_halflife_s == 20.0
    assert ckpt.meta["augment"]["rate_range"] == [0.1, 20.0]
    r = evaluate(trace, checkpoint=ckpt_path, score_from="70%", with_arima=False)
    assert np.isfinite(r.models["learned"].mae)
    fast = evaluate(trace, checkpoint=ckpt_path, score_from="70%", with_arima=False, offline=True)
    np.testing.assert_allclose(fast.p50, r.p50, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "flags",
    [
        ["--rate-range", "5,1"],
        ["--rate-range", "1"],
        ["--level-halflife-s", "-3"],
        ["--token-range", "8,0.25"],
        ["--token-range", "0.25"],
        ["--token-range", "0,4"],
        ["--token-drift", "-0.5"],
        ["--token-drift", "nan"],
        ["--mask-tokens", "1.5"],
        ["--mask-tokens", "-0.1"],
    ],
)
def test_bad_level_options_are_a_clear_error(flags: list[str], tmp_path: Path) -> None:
    result = runner.invoke(app, ["fit", "--synthetic", "1", "--out", str(tmp_path), *flags])
    assert result.exit_code != 0 and flags[0] in result.output


def test_dataset_targets_are_relative_to_the_windows_own_level() -> None:
    trace = generate(SyntheticParams(duration_s=300, rate_rps=5, burst_multiplier=4), seed=3)
    lab = LabelConfig()
    s = node_series_from_trace(
        "t", trace, t0_s=0.0, t1_s=300.0, horizon_s=5, onsets=lab.onsets, lead_s=3, after_s=2
    )
    nz = fit_normalizer([s], LEVEL_SCHEMA, horizon_s=5.0)
    starts = np.array([[0, 0], [0, 120]])
    ds = SequenceDataset([s], starts, seq_len=64, normalizer=nz, schema=LEVEL_SCHEMA, horizon_s=5.0)
    for i, (_, start) in enumerate(starts):
        item = ds[i]
        x_raw, totals, _ = cut_window(s, int(start), 64)
        levels = level_series(x_raw, np.isfinite(x_raw), LEVEL_SCHEMA)  # from the window's first step
        back = nz.denormalize_targets(
            item["y"].numpy().astype(np.float64), level_offsets(levels, LEVEL_SCHEMA, 5.0)[1]
        )
        ok = np.isfinite(totals)
        np.testing.assert_allclose(back[ok], totals[ok], rtol=1e-4, atol=1e-3)
        assert item["x"].shape == (64, LEVEL_SCHEMA.n_inputs)
