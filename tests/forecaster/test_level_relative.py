"""Feature schema v3: rate inputs and targets relative to each node's own trailing level (issue 4, W4)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from forecaster.features import (
    DEFAULT_SCHEMA,
    LEVEL_FEATURE,
    LEVEL_SCHEMA,
    FeatureError,
    FeatureSchema,
    LevelState,
    Normalizer,
    encode_inputs,
    encode_step,
    level_offsets,
    level_series,
)
from forecaster.network import LstmAttentionNet
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS, TARGETS
from tests.support.forecast_series import rate_series, step_with_churn

T0_S = 1.7e9
SHIPPED = Path(__file__).resolve().parents[2] / "forecaster" / "checkpoints" / "default.safetensors"


def _series(
    n: int, t: int, seed: int, *, rate: float = 5.0, drop: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    return rate_series(n, t, seed, rate=rate, drop=drop)


def test_schema_v3_layout_roundtrip_and_errors() -> None:
    s = LEVEL_SCHEMA
    assert s.level_relative and not DEFAULT_SCHEMA.level_relative
    assert s.n_inputs == DEFAULT_SCHEMA.n_inputs + 1 == len(s.input_names)
    assert s.input_names[-1] == LEVEL_FEATURE
    assert FeatureSchema.from_dict(s.to_dict()) == s
    assert "level_halflife_s" not in DEFAULT_SCHEMA.to_dict()  # v1 / v2 layout unchanged
    assert any("level_halflife_s" in d for d in DEFAULT_SCHEMA.diff(s))
    with pytest.raises(FeatureError, match="level_halflife_s needs version"):
        FeatureSchema(level_halflife_s=30.0)
    with pytest.raises(FeatureError, match="level_halflife_s must be >= 0"):
        dataclasses.replace(LEVEL_SCHEMA, level_halflife_s=-1.0)
    with pytest.raises(FeatureError, match="rate channel"):
        dataclasses.replace(LEVEL_SCHEMA, channels=("arrival_rps",), masked=(True,))


@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 60), seed=st.integers(0, 10_000), drop=st.floats(0.0, 0.9))
def test_level_streaming_state_equals_offline_and_is_a_weighted_mean(t: int, seed: int, drop: float) -> None:
    x, mask = _series(2, t, seed, drop=drop)
    offline = level_series(x, mask, LEVEL_SCHEMA)
    state = LevelState(2, LEVEL_SCHEMA)
    a = CHANNELS.index("arrival_rps")
    for i in range(t):
        np.testing.assert_allclose(state.update(x[:, i], mask[:, i]), offline[:, i], atol=1e-9, rtol=1e-9)
        for n in range(2):
            seen = x[n, : i + 1, a][mask[n, : i + 1, a]]
            if len(seen) == 0:
                assert np.isnan(offline[n, i, 0])  # never observed: no level
            else:  # a weighted mean of what was observed
                assert seen.min() - 1e-9 <= offline[n, i, 0] <= seen.max() + 1e-9


def test_level_relative_encoding_round_trip() -> None:
    x, mask = _series(3, 50, 1)
    rng = np.random.default_rng(1)
    totals = rng.gamma(2.0, 20.0, size=(3, 50, len(TARGETS)))
    levels = level_series(x, mask, LEVEL_SCHEMA)
    x_off, y_off = level_offsets(levels, LEVEL_SCHEMA, 5.0)
    nz = Normalizer.fit(x, mask, totals, schema=LEVEL_SCHEMA, input_offsets=x_off, target_offsets=y_off)
    y = nz.normalize_targets(totals, y_off)
    back = nz.denormalize_targets(y, y_off)
    known = np.isfinite(y_off)
    np.testing.assert_allclose(back[known], totals[known], rtol=1e-9)
    assert np.isnan(back[~known]).all()  # a target with no level yet stays unknown
    # the inputs are log1p(x) - log1p(level), standardised
    z, ok = nz.normalize_inputs(x, mask, x_off)
    a = CHANNELS.index("arrival_rps")
    rel = np.log1p(x[..., a]) - np.log1p(levels[..., 0])
    np.testing.assert_allclose(z[..., a][ok[..., a]], ((rel - nz.mean[a]) / nz.std[a])[ok[..., a]], rtol=1e-9)
    # the extra input: (log1p(arrival level) - 2) / 2, 0 while unknown
    enc = encode_inputs(x, mask, nz, T0_S + np.arange(50.0), LEVEL_SCHEMA)
    assert enc.shape == (3, 50, LEVEL_SCHEMA.n_inputs)
    want = np.where(np.isfinite(levels[..., 0]), (np.log1p(np.nan_to_num(levels[..., 0])) - 2.0) / 2.0, 0.0)
    np.testing.assert_allclose(enc[..., -1], want, atol=1e-6)


def _forecaster(seed: int = 0) -> LearnedForecaster:
    torch.manual_seed(seed)
    net = LstmAttentionNet(LEVEL_SCHEMA.n_inputs, hidden=8, heads=2, window=5)
    return LearnedForecaster(net, LEVEL_SCHEMA, Normalizer.identity(LEVEL_SCHEMA), 5.0, "level")


def test_scaling_the_rates_scales_the_forecast_when_the_model_says_as_usual() -> None:
    """An identity model (all outputs 0 = "as the level") forecasts horizon × level: scaling the series'
    rates by k scales its p50 by k exactly — the encoding, not training, makes a new rate level in range."""
    f = _forecaster()
    with torch.no_grad():
        for p in f.net.parameters():
            p.zero_()
    x, mask = _series(1, 80, 3, rate=3.0, drop=0.0)
    times = T0_S + np.arange(80.0)
    base = f.predict_sequence(x, mask, times).get("arrivals", 0.5)[0]
    lv = level_series(x, mask, LEVEL_SCHEMA)[0, :, 0]
    np.testing.assert_allclose(base, 5.0 * lv, rtol=1e-9)
    for k in (0.1, 10.0, 100.0):
        got = f.predict_sequence(x * k, mask, times).get("arrivals", 0.5)[0]
        np.testing.assert_allclose(got, k * base, rtol=1e-9)


def test_relative_inputs_are_nearly_rate_invariant_at_high_rates() -> None:
    """At rates well above 1/s, scaling the rates by k leaves the rate inputs unchanged up to log1p's
    curvature; only the level input moves (by log(k)/2)."""
    x, mask = _series(1, 120, 4, rate=50.0, drop=0.0)
    nz = Normalizer.identity(LEVEL_SCHEMA)
    times = T0_S + np.arange(120.0)
    z1 = encode_inputs(x, mask, nz, times, LEVEL_SCHEMA)
    z2 = encode_inputs(x * 20.0, mask, nz, times, LEVEL_SCHEMA)
    a = CHANNELS.index("arrival_rps")
    assert np.abs(z1[..., a] - z2[..., a]).max() < 0.05
    np.testing.assert_allclose(z2[0, 10:, -1] - z1[0, 10:, -1], np.log(20.0) / 2.0, atol=0.03)
    # the absolute v1 encoding moves by log(20) ≈ 3: out of any training range
    d = encode_inputs(x * 20.0, mask, nz, times) - encode_inputs(x, mask, nz, times)
    assert np.abs(d[..., a]).mean() > 2.5


def test_streaming_equals_predict_sequence_with_node_churn() -> None:
    f = _forecaster(1)
    x, mask = _series(3, 30, 5, drop=0.3)
    times = T0_S + np.arange(30.0)
    seq = f.predict_sequence(x, mask, times)
    for t, out, rows in step_with_churn(f, x, mask, 13, ["c", "x", "a", "b"]):
        for name, got in (("arrivals", out.arrivals_p50), ("gen_tokens", out.gen_tokens_p90)):
            q = 0.5 if name == "arrivals" else 0.9
            np.testing.assert_allclose(
                got[rows], seq.get(name, q)[:, t], rtol=1e-4, atol=1e-5, err_msg=f"t={t}"
            )
        np.testing.assert_allclose(out.burst_prob[rows], seq.burst_prob[:, t], atol=1e-5)


def test_encode_step_needs_levels() -> None:
    x, mask = _series(2, 3, 0)
    with pytest.raises(FeatureError, match="level-relative"):
        encode_step(x[:, 0], mask[:, 0], Normalizer.identity(LEVEL_SCHEMA), T0_S, LEVEL_SCHEMA)


def test_checkpoint_round_trip_and_schema_mismatch(tmp_path: Path) -> None:
    f = _forecaster(2)
    path = tmp_path / "v3.safetensors"
    save_checkpoint(path, f.net, LEVEL_SCHEMA, f.normalizer, 5.0)
    ck = load_checkpoint(path, expect_schema=LEVEL_SCHEMA)
    assert ck.schema == LEVEL_SCHEMA
    x, mask = _series(2, 12, 1)
    times = T0_S + np.arange(12.0)
    a = LearnedForecaster.from_checkpoint(ck).predict_sequence(x, mask, times).totals
    np.testing.assert_allclose(a, f.predict_sequence(x, mask, times).totals, rtol=1e-6)
    with pytest.raises(CheckpointError, match="level_halflife_s"):
        load_checkpoint(path, expect_schema=DEFAULT_SCHEMA)


@pytest.mark.skipif(not SHIPPED.is_file(), reason="no shipped checkpoint in this checkout")
def test_an_absolute_schema_checkpoint_still_loads_and_runs() -> None:
    ck = load_checkpoint(SHIPPED)
    f = LearnedForecaster.from_checkpoint(ck)
    x, mask = _series(1, 20, 2)
    out = f.predict_sequence(x, mask, T0_S + np.arange(20.0))
    assert np.isfinite(out.get("arrivals", 0.5)).all()
    f.reset(["n"])
    fb = f.step(x[:, 0], mask[:, 0], T0_S)
    assert np.isfinite(fb.arrivals_p50).all()


def test_doctor_accepts_a_level_relative_checkpoint_and_still_rejects_other_schemas(tmp_path: Path) -> None:
    from controller.doctor import judge_checkpoint, read_checkpoint_header

    f = _forecaster(3)
    path = tmp_path / "v3.safetensors"
    save_checkpoint(path, f.net, LEVEL_SCHEMA, f.normalizer, 5.0)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, None, 1.0, is_default=False)
    assert check.verdict == "ok", check
    odd = dataclasses.replace(LEVEL_SCHEMA, time_features=())
    net = LstmAttentionNet(odd.n_inputs, hidden=8, heads=2, window=5)
    save_checkpoint(path, net, odd, Normalizer.identity(odd), 5.0)
    check = judge_checkpoint(path, read_checkpoint_header(path), None, None, 1.0, is_default=False)
    assert check.verdict == "fail" and "time_features" in check.detail, check


def test_level_of_arrivals_makes_every_rate_relative_to_the_arrival_level() -> None:
    schema = dataclasses.replace(LEVEL_SCHEMA, level_of="arrivals")
    assert FeatureSchema.from_dict(schema.to_dict()) == schema
    assert any("level_of" in d for d in LEVEL_SCHEMA.diff(schema))
    with pytest.raises(FeatureError, match="level_of"):
        dataclasses.replace(LEVEL_SCHEMA, level_of="tokens")
    x, mask = _series(2, 40, 7, drop=0.0)
    levels = level_series(x, mask, schema)
    own = level_series(x, mask, LEVEL_SCHEMA)
    for k in range(len(TARGETS)):
        np.testing.assert_allclose(levels[..., k], own[..., 0])  # the arrival level for every target
    x_off, y_off = level_offsets(levels, schema, 5.0)
    p = CHANNELS.index("prompt_tps")
    np.testing.assert_allclose(x_off[..., p], np.log1p(own[..., 0]))
    np.testing.assert_allclose(y_off[..., 1], np.log1p(5.0 * own[..., 0]))
    # an identity model forecasts horizon × arrival level for every target; scaling the rates scales it
    torch.manual_seed(0)
    net = LstmAttentionNet(schema.n_inputs, hidden=8, heads=2, window=5)
    with torch.no_grad():
        for prm in net.parameters():
            prm.zero_()
    f = LearnedForecaster(net, schema, Normalizer.identity(schema), 5.0, "arr")
    times = T0_S + np.arange(40.0)
    base = f.predict_sequence(x, mask, times).get("prompt_tokens", 0.5)
    np.testing.assert_allclose(base, 5.0 * own[..., 0], rtol=1e-9)
    np.testing.assert_allclose(f.predict_sequence(x * 10.0, mask, times).get("prompt_tokens", 0.5), 10 * base)
