"""Fitting end to end on a tiny configuration: checkpoint contents, normaliser provenance, export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forecaster.checkpoint import load_checkpoint, read_metadata
from forecaster.features import DEFAULT_SCHEMA
from forecaster.lengths import length_range_of
from forecaster.streaming import LearnedForecaster
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.trace import Trace
from training.datamodule import WindowConfig, fit_normalizer
from training.export import export_lightning_checkpoint
from training.fit import (
    AugmentConfig,
    FitResult,
    LabelConfig,
    SeriesSet,
    TraceSource,
    TrainerConfig,
    build_series,
    fit_forecaster,
)

Fitted = tuple[Path, SeriesSet, FitResult]


def _synthetic(rng: np.random.Generator, duration_s: float) -> Trace:
    return generate(
        SyntheticParams(duration_s=duration_s, rate_rps=4, burst_multiplier=8),
        int(rng.integers(1_000_000_000)),
    )


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Fitted:
    out = tmp_path_factory.mktemp("fit")
    real = generate(SyntheticParams(duration_s=900, rate_rps=3, burst_multiplier=10), seed=5)
    series = build_series(
        [TraceSource("real.csv", real, sha256="ab" * 32)],
        labels=LabelConfig(),
        augment=AugmentConfig(copies_per_source=2, synthetic_traces=1, synthetic_duration_s=300),
        synthetic=_synthetic,
        seed=0,
    )
    result = fit_forecaster(
        series,
        out,
        window=WindowConfig(seq_len=96, burn_in=16, batch_size=4, windows_per_epoch=8, seed=0),
        net_hidden=16,
        net_layers=1,
        net_heads=2,
        net_window=8,
        trainer=TrainerConfig(max_epochs=2, accelerator="cpu", progress=False, num_threads=1),
        log=lambda _m: None,
    )
    return out, series, result


def test_fit_writes_a_loadable_checkpoint_with_the_training_summary(
    fitted: Fitted,
) -> None:
    out, _, result = fitted
    ckpt = load_checkpoint(out / "forecaster.safetensors", expect_schema=DEFAULT_SCHEMA)
    assert ckpt.net_config.hidden == 16 and ckpt.net_config.window == 8
    assert ckpt.horizon_s == 5.0
    assert ckpt.model_version == result.model_version
    meta = ckpt.meta
    src = meta["sources"][0]
    assert src["source"] == "real.csv" and src["sha256"] == "ab" * 32
    assert src["rows"] > 0 and src["holdout_from_s"] == pytest.approx(0.7 * src["span_s"])
    assert meta["run"]["epochs"] == 2
    assert np.isfinite(meta["run"]["best_val_loss"])
    assert ckpt.code_version["pdscale"]
    # the length guard's range: the training series' trailing mean lengths (forecaster.lengths)
    lengths = length_range_of(meta)
    assert lengths is not None and 0 < lengths.prompt[0] < lengths.prompt[1]
    assert LearnedForecaster.load(out / "forecaster.safetensors").length_range == lengths


def test_normalizer_comes_from_the_training_series_only(fitted: Fitted) -> None:
    out, series, _ = fitted
    ckpt = load_checkpoint(out / "forecaster.safetensors")
    expected = fit_normalizer(series.train)
    assert ckpt.normalizer == expected
    with_val = fit_normalizer([*series.train, *series.val])
    assert ckpt.normalizer != with_val


def test_lightning_logs_and_best_ckpt_under_out(fitted: Fitted) -> None:
    out, _, result = fitted
    metrics = list((out / "lightning").glob("version_*/metrics.csv"))
    assert metrics, "CSV logs missing"
    header = metrics[0].read_text().splitlines()[0]
    assert "val_loss" in header and "train_loss" in header
    assert result.lightning_ckpt is not None and result.lightning_ckpt.is_file()


def test_export_reproduces_the_fit_checkpoint(fitted: Fitted, tmp_path: Path) -> None:
    out, _, result = fitted
    assert result.lightning_ckpt is not None
    version = export_lightning_checkpoint(result.lightning_ckpt, tmp_path / "exported.safetensors")
    assert version == result.model_version  # same weights → same digest
    a = read_metadata(out / "forecaster.safetensors")
    b = read_metadata(tmp_path / "exported.safetensors")
    assert a["normalizer"] == b["normalizer"] and a["schema"] == b["schema"] and a["net"] == b["net"]
    assert a["meta"]["length_range"] == b["meta"]["length_range"]


def test_export_rejects_files_that_are_not_fit_checkpoints(tmp_path: Path) -> None:
    import torch

    bogus = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 1.0}}, bogus)
    with pytest.raises(ValueError, match=r"other\.ckpt.*not written by train-forecaster fit"):
        export_lightning_checkpoint(bogus, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="no such"):
        export_lightning_checkpoint(tmp_path / "missing.ckpt", tmp_path / "x.safetensors")
