"""Per-pool workload descriptors (feature schema v2): maths, streaming == offline, schema compatibility."""

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
    POOL_DESCRIPTORS,
    POOL_SCHEMA,
    DescriptorState,
    FeatureError,
    FeatureSchema,
    Normalizer,
    descriptor_series,
    encode_inputs,
    encode_step,
)
from forecaster.network import LstmAttentionNet
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS, TARGETS

T0_S = 1.7e9
A, P, G = (CHANNELS.index(c) for c in ("arrival_rps", "prompt_tps", "gen_tps"))


def _series(n: int, t: int, seed: int, *, drop: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.full((n, t, len(CHANNELS)), np.nan)
    a = rng.poisson(rng.uniform(0.5, 20.0, (n, 1)), (n, t)).astype(float)
    x[..., A], x[..., P], x[..., G] = a, a * rng.uniform(100, 2000), a * rng.uniform(10, 300)
    x[..., 3] = rng.gamma(2.0, 5.0, (n, t))
    mask = np.isfinite(x) & (rng.random(x.shape) > drop)
    return np.where(mask, x, np.nan), mask


def test_schema_v2_round_trip_and_differences_are_listed() -> None:
    assert POOL_SCHEMA.version == 2 and POOL_SCHEMA.descriptors == POOL_DESCRIPTORS
    assert POOL_SCHEMA.n_inputs == DEFAULT_SCHEMA.n_inputs + 3
    assert POOL_SCHEMA.input_names[-3:] == POOL_DESCRIPTORS
    assert FeatureSchema.from_dict(POOL_SCHEMA.to_dict()) == POOL_SCHEMA
    old = DEFAULT_SCHEMA.to_dict()
    assert "descriptors" not in old and FeatureSchema.from_dict(old) == DEFAULT_SCHEMA  # v1 dicts still load
    diffs = DEFAULT_SCHEMA.diff(POOL_SCHEMA)
    assert any(d.startswith("version: 1 != 2") for d in diffs)
    assert any("descriptors: missing [], extra ['pool_dispersion'" in d for d in diffs)
    with pytest.raises(FeatureError, match="need version >= 2"):
        FeatureSchema(descriptors=POOL_DESCRIPTORS)
    with pytest.raises(FeatureError, match="unknown or repeated"):
        FeatureSchema(version=2, descriptors=("pool_id",))


def test_descriptors_measure_dispersion_and_lengths() -> None:
    """Poisson traffic → dispersion ≈ 0; on/off traffic → large; lengths decode to the true means."""
    rng = np.random.default_rng(0)
    t = 6000
    x = np.full((2, t, len(CHANNELS)), np.nan)
    x[0, :, A] = rng.poisson(10.0, t)
    x[1, :, A] = np.where((np.arange(t) // 60) % 4 == 0, rng.poisson(40.0, t), 0.0)  # on/off, same mean
    x[..., P] = x[..., A] * 800.0
    x[..., G] = x[..., A] * 150.0
    d = descriptor_series(x, np.isfinite(x))[:, -1]  # [2, 3]
    assert abs(d[0, 0]) < 0.15 and d[1, 0] > 1.5
    np.testing.assert_allclose(np.expm1(d[:, 1] * 1.5 + 6.5), 800.0, rtol=1e-6)
    np.testing.assert_allclose(np.expm1(d[:, 2] * 1.5 + 5.0), 150.0, rtol=1e-6)


def test_nothing_observed_is_zero_and_outages_hold_the_descriptors() -> None:
    x, mask = _series(1, 400, 1, drop=0.0)
    d_full = descriptor_series(x, mask)
    x2, m2 = x.copy(), mask.copy()
    x2[:, 300:], m2[:, 300:] = np.nan, False  # an outage: nothing observed
    d_out = descriptor_series(x2, m2)
    np.testing.assert_allclose(
        d_out[:, 300:], np.broadcast_to(d_full[:, 299:300], d_out[:, 300:].shape), atol=1e-9
    )
    empty = np.full((1, 5, len(CHANNELS)), np.nan)
    assert np.all(descriptor_series(empty, np.isfinite(empty)) == 0.0)


@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 200), seed=st.integers(0, 2**16), drop=st.floats(0.0, 0.9))
def test_streaming_state_equals_offline(t: int, seed: int, drop: float) -> None:
    x, mask = _series(3, t, seed, drop=drop)
    offline = descriptor_series(x, mask)
    state = DescriptorState(3)
    for i in range(t):
        np.testing.assert_allclose(
            state.update(x[:, i], mask[:, i]), offline[:, i], atol=1e-9, err_msg=f"t={i}"
        )


def _forecaster(seed: int = 0) -> tuple[LearnedForecaster, np.ndarray, np.ndarray]:
    torch.manual_seed(seed)
    net = LstmAttentionNet(POOL_SCHEMA.n_inputs, hidden=8, heads=2, window=5)
    x, mask = _series(3, 40, seed)
    y = np.random.default_rng(seed).gamma(2.0, 50.0, size=(3, 40, len(TARGETS)))
    nz = Normalizer.fit(x, mask, y, schema=POOL_SCHEMA)
    return LearnedForecaster(net, POOL_SCHEMA, nz, 5.0, "pool"), x, mask


def test_learned_forecaster_streaming_equals_predict_sequence_with_node_churn() -> None:
    f, x, mask = _forecaster()
    times = T0_S + np.arange(x.shape[1], dtype=np.float64)
    seq = f.predict_sequence(x, mask, times)
    f.reset(["a", "b", "c"])
    for t in range(x.shape[1]):
        if t == 17:
            f.ensure_nodes(["c", "x", "a", "b"])
        ids = f.node_ids
        rows = [ids.index(k) for k in ("a", "b", "c")]
        xx = np.full((len(ids), len(CHANNELS)), np.nan)
        mm = np.zeros((len(ids), len(CHANNELS)), dtype=bool)
        xx[rows], mm[rows] = x[:, t], mask[:, t]
        out = f.step(xx, mm, T0_S + t)
        np.testing.assert_allclose(
            out.arrivals_p50[rows], seq.get("arrivals", 0.5)[:, t], rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(out.burst_prob[rows], seq.burst_prob[:, t], atol=1e-5)


def test_encode_needs_descriptors_in_streaming_and_checks_their_shape() -> None:
    f, x, mask = _forecaster()
    with pytest.raises(FeatureError, match="DescriptorState"):
        encode_step(x[:, 0], mask[:, 0], f.normalizer, T0_S, POOL_SCHEMA)
    with pytest.raises(FeatureError, match="descriptors"):
        encode_inputs(x, mask, f.normalizer, T0_S, POOL_SCHEMA, np.zeros((3, 40, 2)))
    z = encode_inputs(x, mask, f.normalizer, T0_S + np.arange(40.0), POOL_SCHEMA)
    assert z.shape == (3, 40, POOL_SCHEMA.n_inputs)
    np.testing.assert_allclose(z[..., -3:], descriptor_series(x, mask), atol=1e-6)


def test_checkpoint_keeps_the_schema_and_a_v1_expectation_lists_the_differences(tmp_path: Path) -> None:
    f, _, _ = _forecaster()
    path = tmp_path / "pool.safetensors"
    save_checkpoint(path, f.net, POOL_SCHEMA, f.normalizer, 5.0, meta={})
    assert load_checkpoint(path).schema == POOL_SCHEMA
    with pytest.raises(CheckpointError, match=r"version: 1 != 2.*descriptors: missing \[\], extra"):
        load_checkpoint(path, DEFAULT_SCHEMA)
    assert dataclasses.replace(POOL_SCHEMA, descriptors=()).n_inputs == DEFAULT_SCHEMA.n_inputs
