"""The baseline skip (``NetConfig.baseline_halflives``): EWMA maths, streaming == windowed, old checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.checkpoint import load_checkpoint, save_checkpoint
from forecaster.features import (
    DEFAULT_SCHEMA,
    FeatureError,
    FeatureSchema,
    Normalizer,
    baseline_columns,
    encode_inputs,
)
from forecaster.network import LstmAttentionNet, NetConfig
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS, TARGETS

T0_S = 1.7e9


def _net(halflives: tuple[float, ...] = (2.0, 7.0), window: int = 5, seed: int = 0) -> LstmAttentionNet:
    torch.manual_seed(seed)
    inputs, masks = baseline_columns(DEFAULT_SCHEMA)
    return LstmAttentionNet(
        DEFAULT_SCHEMA.n_inputs,
        hidden=8,
        heads=2,
        window=window,
        baseline_halflives=halflives,
        baseline_inputs=inputs,
        baseline_masks=masks,
    )


def _data(n: int, t: int, seed: int) -> tuple[np.ndarray, np.ndarray, Normalizer]:
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 5.0, size=(n, t, len(CHANNELS)))
    mask = rng.random(x.shape) > 0.3
    x[~mask] = np.nan
    y = rng.gamma(2.0, 50.0, size=(n, t, len(TARGETS)))
    return x, mask, Normalizer.fit(x, mask, y)


def test_columns_point_at_the_rate_channels_and_their_masks() -> None:
    inputs, masks = baseline_columns(DEFAULT_SCHEMA)
    names = DEFAULT_SCHEMA.input_names
    assert [names[i] for i in inputs] == ["arrival_rps", "prompt_tps", "gen_tps"]
    assert [names[i] for i in masks] == ["arrival_rps_mask", "prompt_tps_mask", "gen_tps_mask"]
    unmasked = FeatureSchema(masked=(False,) * len(CHANNELS))
    assert baseline_columns(unmasked)[1] == (-1, -1, -1)
    with pytest.raises(FeatureError, match="'arrivals' has no rate channel"):
        baseline_columns(FeatureSchema(channels=("running",), masked=(True,)))


def test_scan_is_a_masked_exponentially_weighted_mean() -> None:
    """level_t = sum_s d^(t-s) m_s z_s / sum_s d^(t-s) m_s, computed by hand; unobserved steps hold it."""
    net = _net(halflives=(3.0,))
    rng = np.random.default_rng(1)
    t = 150  # more than two scan blocks
    z = rng.normal(size=(1, t, 3))
    m = (rng.random((1, t, 3)) > 0.4).astype(float)
    u = torch.from_numpy(np.concatenate([m * z, m], axis=-1)).float()
    sums = net.baseline_scan(u, block=64)[0, :, :, 0].double().numpy()
    d = 0.5 ** (1 / 3.0)
    for k in range(3):
        for tt in (0, 10, 63, 64, 100, t - 1):
            w = d ** (tt - np.arange(tt + 1)) * m[0, : tt + 1, k]
            if w.sum() == 0:
                continue
            want = (w * z[0, : tt + 1, k]).sum() / w.sum()
            assert sums[tt, k] / sums[tt, 3 + k] == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_offset_shifts_every_quantile_and_follows_the_level() -> None:
    """With a zero LSTM head the output is exactly the affine map of the levels (all quantiles shifted)."""
    net = _net()
    with torch.no_grad():
        net.quantile_head.weight.zero_()
        net.quantile_head.bias.zero_()
        net.baseline_weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
        net.baseline_bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    x = torch.zeros(1, 20, DEFAULT_SCHEMA.n_inputs)
    inputs, masks = baseline_columns(DEFAULT_SCHEMA)
    x[..., list(inputs)] = 2.0
    x[..., list(masks)] = 1.0
    out = net(x).quantiles[0, -1]  # [K, Q]
    step = torch.nn.functional.softplus(torch.zeros(()))
    torch.testing.assert_close(out[:, 0], torch.tensor([2.0, 3.0, 1.0]))
    torch.testing.assert_close(out[:, 1] - out[:, 0], step.expand(3))


@settings(max_examples=12, deadline=None)
@given(
    halflives=st.lists(st.floats(0.5, 100.0), min_size=1, max_size=3).map(tuple),
    t=st.integers(1, 140),
    window=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_streaming_equals_windowed(halflives: tuple[float, ...], t: int, window: int, seed: int) -> None:
    net = _net(halflives, window=window, seed=seed % 7)
    x, mask, nz = _data(3, t, seed)
    f = LearnedForecaster(net, DEFAULT_SCHEMA, nz, 5.0, "skip")
    z = torch.from_numpy(encode_inputs(x, mask, nz, T0_S + np.arange(t, dtype=np.float64)))
    with torch.no_grad():
        full = net(z)
    f.reset(["a", "b", "c"])
    for i in range(t):
        out = f.step_encoded(z[:, i])
        torch.testing.assert_close(out.quantiles, full.quantiles[:, i], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(out.burst_logit, full.burst_logit[:, i], atol=2e-5, rtol=1e-5)


def test_node_churn_keeps_the_baseline_state() -> None:
    net = _net()
    x, mask, nz = _data(2, 30, 3)
    f = LearnedForecaster(net, DEFAULT_SCHEMA, nz, 5.0, "skip")
    z = torch.from_numpy(encode_inputs(x, mask, nz, T0_S + np.arange(30, dtype=np.float64)))
    with torch.no_grad():
        full = net(z)
    f.reset(["a", "b"])
    for i in range(30):
        if i == 12:
            f.ensure_nodes(["b", "new", "a"])
        ids = f.node_ids
        rows = [ids.index("a"), ids.index("b")]
        zz = torch.zeros(len(ids), z.shape[-1])
        zz[rows[0]], zz[rows[1]] = z[0, i], z[1, i]
        out = f.step_encoded(zz)
        torch.testing.assert_close(out.quantiles[rows], full.quantiles[:, i], atol=2e-5, rtol=1e-5)


def test_checkpoint_round_trip_and_config_validation(tmp_path: Path) -> None:
    net = _net()
    _, _, nz = _data(1, 10, 0)
    save_checkpoint(tmp_path / "m.safetensors", net, DEFAULT_SCHEMA, nz, 5.0, meta={})
    ck = load_checkpoint(tmp_path / "m.safetensors")
    assert ck.net_config == net.config and ck.net.n_baselines == 2
    assert "baseline_decay" not in ck.net.state_dict()  # derived buffers are not stored
    x = torch.randn(2, 15, DEFAULT_SCHEMA.n_inputs)
    with torch.no_grad():
        torch.testing.assert_close(ck.net(x).quantiles, net.eval()(x).quantiles)
    assert NetConfig.from_dict(net.config.to_dict()) == net.config
    assert "baseline_halflives" not in NetConfig(n_inputs=4).to_dict()  # old checkpoints' layout unchanged
    with pytest.raises(ValueError, match="one entry per target"):
        NetConfig(n_inputs=22, baseline_halflives=(5.0,), baseline_inputs=(0,), baseline_masks=(10,))
    with pytest.raises(ValueError, match="must be positive"):
        NetConfig(
            n_inputs=22, baseline_halflives=(0.0,), baseline_inputs=(0, 1, 2), baseline_masks=(10, 11, 12)
        )
    with pytest.raises(ValueError, match="without baseline_halflives"):
        NetConfig(n_inputs=22, baseline_inputs=(0, 1, 2))


def test_the_shipped_checkpoint_still_loads_without_a_skip() -> None:
    path = Path(__file__).resolve().parents[2] / "forecaster" / "checkpoints" / "default.safetensors"
    if not path.exists():
        pytest.skip("no shipped checkpoint")
    ck = load_checkpoint(path)
    assert ck.net.n_baselines == 0 and ck.net_config.baseline_halflives == ()
