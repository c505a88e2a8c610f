"""``LearnedForecaster.step`` encodes each tick once: one ``normalize_inputs`` and one ``level_offsets`` per
tick, with the same forecasts as the full-sequence forward; ``x_offsets`` is checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import forecaster.inference as inference
from forecaster.features import (
    DEFAULT_SCHEMA,
    LEVEL_SCHEMA,
    FeatureError,
    FeatureSchema,
    LevelState,
    Normalizer,
    encode_step,
    encode_step_masked,
    level_offsets,
)
from forecaster.network import LstmAttentionNet, NetConfig
from forecaster.streaming import LearnedForecaster

ARR = dataclasses.replace(LEVEL_SCHEMA, level_of="arrivals")


def _model(schema: FeatureSchema) -> LearnedForecaster:
    torch.manual_seed(0)
    net = LstmAttentionNet.from_config(
        NetConfig(n_inputs=schema.n_inputs, hidden=8, layers=1, heads=2, window=6)
    )
    return LearnedForecaster(net, schema, Normalizer.identity(schema), 5.0, "t")


def _data(n: int, t: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 5.0, size=(n, t, len(LEVEL_SCHEMA.channels)))
    mask = rng.random(x.shape) > 0.2
    mask[0, 3:12] = False  # an outage longer than the window: NaN forecasts, in both paths
    return np.where(mask, x, np.nan), mask


@pytest.mark.parametrize("schema", [LEVEL_SCHEMA, ARR, DEFAULT_SCHEMA])
def test_step_normalises_once_per_tick_and_matches_the_forward(
    schema: FeatureSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    lf = _model(schema)
    x, mask = _data(3, 20)
    times = 1.7e9 + np.arange(20.0)
    seq = lf.predict_sequence(x, mask, times)
    calls = {"norm": 0, "offsets": 0}
    real_norm = Normalizer.normalize_inputs

    def norm(
        self: Normalizer, x_raw: np.ndarray, m: np.ndarray, offsets: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        calls["norm"] += 1
        return real_norm(self, x_raw, m, offsets)

    def off(levels: np.ndarray, sch: FeatureSchema, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        calls["offsets"] += 1
        return level_offsets(levels, sch, horizon_s)

    monkeypatch.setattr(Normalizer, "normalize_inputs", norm)
    monkeypatch.setattr(inference, "level_offsets", off)  # step encodes in StreamingBase
    lf.reset(["a", "b", "c"])
    got = np.stack([lf.step(x[:, i], mask[:, i], float(times[i])).arrivals_p90 for i in range(20)], axis=1)
    assert calls["norm"] == 20
    assert calls["offsets"] == (20 if lf.schema.level_relative else 0)
    want = seq.get("arrivals", 0.9)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 10]) and np.isfinite(got[0, 2])  # stale late in the outage
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_given_offsets_equal_computed_ones_and_bad_ones_are_errors() -> None:
    nz = Normalizer.identity(ARR)
    x, mask = _data(4, 1, seed=2)
    x, mask = x[:, 0], mask[:, 0]
    levels = LevelState(4, ARR).update(x, mask)
    x_off, _ = level_offsets(levels, ARR, 5.0)
    z, ok = encode_step_masked(x, mask, nz, 1.7e9, ARR, levels=levels, x_offsets=x_off)
    np.testing.assert_array_equal(z, encode_step(x, mask, nz, 1.7e9, ARR, levels=levels))
    assert ok.shape == x.shape and not ok[~mask].any()
    with pytest.raises(FeatureError, match=r"x_offsets \(4, 3\) must be \(4, "):
        encode_step_masked(x, mask, nz, 1.7e9, ARR, levels=levels, x_offsets=x_off[:, :3])
    with pytest.raises(FeatureError, match="not level-relative"):
        encode_step_masked(x, mask, Normalizer.identity(), 1.7e9, DEFAULT_SCHEMA, x_offsets=x_off)
