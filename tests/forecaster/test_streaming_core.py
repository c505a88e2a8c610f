"""forecaster.streaming: one step per tick equals the full-sequence forward; node churn; staleness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.checkpoint import save_checkpoint
from forecaster.features import DEFAULT_SCHEMA, Normalizer, encode_inputs
from forecaster.network import LstmAttentionNet, decode_quantiles
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS, TARGETS, Forecaster

WINDOW = 6
T0_S = 1.7e9


def _setup(n: int = 3, t: int = 25, seed: int = 0) -> tuple[LearnedForecaster, np.ndarray, np.ndarray]:
    torch.manual_seed(seed)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=16, heads=4, window=WINDOW)
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 5.0, size=(n, t, len(CHANNELS)))
    mask = rng.random(x.shape) > 0.2
    x[~mask] = np.nan
    y = rng.gamma(2.0, 50.0, size=(n, t, len(TARGETS)))
    nz = Normalizer.fit(x, mask, y)
    return LearnedForecaster(net, DEFAULT_SCHEMA, nz, 5.0, "test-v1"), x, mask


def _full(f: LearnedForecaster, x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = encode_inputs(x, mask, f.normalizer, T0_S + np.arange(x.shape[1], dtype=np.float64))
    with torch.no_grad():
        out = f.net(torch.from_numpy(z))
    return decode_quantiles(out.quantiles, f.normalizer), torch.sigmoid(out.burst_logit).numpy()


def test_implements_the_protocol() -> None:
    f, _, _ = _setup()
    proto: Forecaster = f
    assert proto.name == "lstm-attn" and proto.horizon_s == 5.0


def test_streaming_equals_full_forward_at_every_position_past_the_ring_wrap() -> None:
    f, x, mask = _setup(n=4, t=4 * WINDOW + 3)
    full_q, full_b = _full(f, x, mask)
    f.reset(["a", "b", "c", "d"])
    for t in range(x.shape[1]):
        out = f.step(x[:, t], mask[:, t], T0_S + t)
        got = np.stack(
            [
                np.stack([out.arrivals_p50, out.arrivals_p90], -1),
                np.stack([out.prompt_tokens_p50, out.prompt_tokens_p90], -1),
                np.stack([out.gen_tokens_p50, out.gen_tokens_p90], -1),
            ],
            axis=1,
        )
        np.testing.assert_allclose(got, full_q[:, t], rtol=1e-4, atol=1e-5, err_msg=f"t={t}")
        np.testing.assert_allclose(out.burst_prob, full_b[:, t], atol=1e-5, err_msg=f"t={t}")
        assert out.node_ids == ("a", "b", "c", "d") and out.model_version == "test-v1"


def test_step_encoded_equals_forward_in_normalised_space() -> None:
    f, x, mask = _setup(n=2, t=3 * WINDOW)
    z = torch.from_numpy(encode_inputs(x, mask, f.normalizer, T0_S + np.arange(x.shape[1], dtype=np.float64)))
    with torch.no_grad():
        full = f.net(z)
    f.reset(["a", "b"])
    for t in range(z.shape[1]):
        out = f.step_encoded(z[:, t])
        torch.testing.assert_close(out.quantiles, full.quantiles[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.burst_logit, full.burst_logit[:, t], atol=1e-5, rtol=0)


def test_nodes_keep_their_state_when_others_come_and_go() -> None:
    f, x, mask = _setup(n=3, t=20)
    full_q, _ = _full(f, x, mask)
    f.reset(["a", "b", "c"])
    for t in range(10):
        f.step(x[:, t], mask[:, t], T0_S + t)
    f.ensure_nodes(["c", "new", "a"])  # b leaves, new arrives, order changes
    assert f.node_ids == ("c", "new", "a")
    fresh = np.random.default_rng(9).gamma(2.0, 5.0, size=(len(CHANNELS),))
    for t in range(10, 20):
        xt = np.stack([x[2, t], fresh, x[0, t]])
        mt = np.stack([mask[2, t], np.ones(len(CHANNELS), bool), mask[0, t]])
        out = f.step(xt, mt, T0_S + t)
        np.testing.assert_allclose(out.arrivals_p90[[0, 2]], full_q[[2, 0], t, 0, 1], rtol=1e-4, atol=1e-5)
    assert np.isfinite(out.arrivals_p90[1])


def test_new_node_starts_from_scratch() -> None:
    f, x, mask = _setup(n=1, t=8)
    f.reset(["a"])
    for t in range(8):
        f.step(x[:, t], mask[:, t], T0_S + t)
    f.ensure_nodes(["a", "b"])
    f2, _, _ = _setup(n=1, t=8)
    f2.reset(["b"])
    one = np.ones((1, len(CHANNELS)), bool)
    xb = np.full((1, len(CHANNELS)), 3.0)
    got = f.step(np.concatenate([x[:, 0], xb]), np.concatenate([mask[:, 0], one]), T0_S + 8)
    want = f2.step(xb, one, T0_S + 8)
    assert got.gen_tokens_p90[1] == pytest.approx(want.gen_tokens_p90[0], rel=1e-5)


def test_all_masked_node_gets_nan_until_it_reports_and_after_a_long_outage() -> None:
    f, x, mask = _setup(n=2, t=3 * WINDOW)
    f.reset(["up", "down"])
    nothing = np.zeros(len(CHANNELS), bool)
    nan_row = np.full(len(CHANNELS), np.nan)
    out = f.step(np.stack([x[0, 0], nan_row]), np.stack([mask[0, 0], nothing]), T0_S)
    assert np.isfinite(out.arrivals_p50[0]) and np.isnan(out.arrivals_p50[1]) and np.isnan(out.burst_prob[1])
    # "down" reports once, then goes dark: forecasts stay finite for window-1 steps, then NaN
    seen = []
    for t in range(1, 2 * WINDOW + 1):
        xt = np.stack([x[0, t], x[1, t] if t == 1 else nan_row])
        mt = np.stack([mask[0, t], np.ones(len(CHANNELS), bool) if t == 1 else nothing])
        seen.append(bool(np.isfinite(f.step(xt, mt, T0_S + t).gen_tokens_p90[1])))
    assert seen == [True] * WINDOW + [False] * WINDOW


def test_step_rejects_a_mismatched_node_count() -> None:
    f, x, mask = _setup(n=2)
    f.reset(["a"])
    with pytest.raises(ValueError, match="ensure_nodes"):
        f.step(x[:, 0], mask[:, 0], T0_S)
    with pytest.raises(ValueError, match="duplicates"):
        f.ensure_nodes(["a", "a"])


def test_load_from_checkpoint(tmp_path: Path) -> None:
    f, x, mask = _setup(n=2, t=5)
    path = tmp_path / "m.safetensors"
    version = save_checkpoint(path, f.net, f.schema, f.normalizer, 5.0, {})
    g = LearnedForecaster.load(path, expect_schema=DEFAULT_SCHEMA)
    assert g.model_version == version
    f.reset(["a", "b"])
    g.reset(["a", "b"])
    for t in range(5):
        a, b = f.step(x[:, t], mask[:, t], T0_S + t), g.step(x[:, t], mask[:, t], T0_S + t)
        np.testing.assert_array_equal(a.prompt_tokens_p90, b.prompt_tokens_p90)


def test_no_nodes_is_an_empty_forecast() -> None:
    f, _, _ = _setup()
    f.reset([])
    out = f.step(np.zeros((0, len(CHANNELS))), np.zeros((0, len(CHANNELS)), bool), T0_S)
    assert out.node_ids == () and out.arrivals_p90.shape == (0,)


def test_predict_sequence_equals_stepping_including_stale_nans() -> None:
    f, x, mask = _setup(n=3, t=4 * WINDOW)
    x[1, 5 : 5 + 2 * WINDOW] = np.nan  # node 1 goes dark for two windows
    mask[1, 5 : 5 + 2 * WINDOW] = False
    x[2, :3], mask[2, :3] = np.nan, False  # node 2 reports nothing at first
    times = T0_S + np.arange(x.shape[1], dtype=np.float64)
    seq = f.predict_sequence(x, mask, times, node_ids=["a", "b", "c"], chunk_nodes=2)
    assert seq.totals.shape == (3, x.shape[1], 3, 2) and seq.node_ids == ("a", "b", "c")
    f.reset(["a", "b", "c"])
    for t in range(x.shape[1]):
        out = f.step(x[:, t], mask[:, t], float(times[t]))
        np.testing.assert_allclose(seq.get("arrivals", 0.9)[:, t], out.arrivals_p90, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(seq.get("gen_tokens", 0.5)[:, t], out.gen_tokens_p50, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(seq.burst_prob[:, t], out.burst_prob, atol=1e-5)
    assert np.isnan(seq.burst_prob[1, 5 + WINDOW : 5 + 2 * WINDOW]).all()
    assert np.isnan(seq.burst_prob[2, :3]).all() and np.isfinite(seq.burst_prob[0]).all()
    with pytest.raises(KeyError, match="no forecast"):
        seq.get("arrivals", 0.99)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 7), st.integers(1, 24), st.integers(1, 3), st.integers(0, 2**16))
def test_streaming_equals_forward_for_any_window_and_length(
    window: int, t: int, layers: int, seed: int
) -> None:
    torch.manual_seed(seed)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=8, layers=layers, heads=2, window=window)
    f = LearnedForecaster(net, DEFAULT_SCHEMA, Normalizer.identity(), 5.0, "prop")
    z = torch.randn(2, t, DEFAULT_SCHEMA.n_inputs)
    with torch.no_grad():
        full = net(z)
    f.reset(["a", "b"])
    for i in range(t):
        out = f.step_encoded(z[:, i])
        torch.testing.assert_close(out.quantiles, full.quantiles[:, i], atol=1e-5, rtol=0)
