"""forecaster.network: shapes, causality, the attention band, losses, overfitting and masking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forecaster.features import DEFAULT_SCHEMA, Normalizer, encode_inputs
from forecaster.network import LstmAttentionNet, NetConfig, burst_bce, decode_quantiles, pinball_loss
from forecaster.types import CHANNELS


def _net(window: int = 5, seed: int = 0, **kw: int) -> LstmAttentionNet:
    torch.manual_seed(seed)
    return LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=kw.get("hidden", 16), heads=4, window=window)


def _reference_attention(net: LstmAttentionNet, o: torch.Tensor) -> torch.Tensor:
    """Position by position, the textbook way."""
    b, t, d = o.shape
    nh, dh, w = net.heads, net.head_dim, net.window
    q, k, v = net.q_proj(o), net.k_proj(o), net.v_proj(o)
    rows = []
    for i in range(t):
        lo = max(0, i - w + 1)
        qq = q[:, i].view(b, nh, dh)
        kk, vv = k[:, lo : i + 1].view(b, -1, nh, dh), v[:, lo : i + 1].view(b, -1, nh, dh)
        p = (torch.einsum("bhd,bshd->bhs", qq, kk) / dh**0.5).softmax(-1)
        rows.append(torch.einsum("bhs,bshd->bhd", p, vv).reshape(b, d))
    return torch.stack(rows, 1)


def test_output_shapes_and_quantile_order() -> None:
    net = _net()
    x = torch.randn(3, 23, DEFAULT_SCHEMA.n_inputs)
    out = net(x)
    assert out.quantiles.shape == (3, 23, 3, 2)
    assert out.burst_logit.shape == (3, 23)
    assert (out.quantiles[..., 1] >= out.quantiles[..., 0]).all()


def test_wrong_input_width_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"\[B, T, 22\]"):
        _net()(torch.randn(1, 4, 7))


@pytest.mark.parametrize("t", [1, 4, 5, 6, 13, 20], ids=lambda t: f"T={t}")
def test_blocked_attention_equals_reference(t: int) -> None:
    net = _net(window=5)
    o = torch.randn(2, t, 16)
    torch.testing.assert_close(net.attend_window(o), _reference_attention(net, o), atol=1e-6, rtol=1e-5)


def test_attention_sees_exactly_the_last_window_outputs() -> None:
    net = _net(window=4)
    o = torch.randn(1, 15, 16)
    base = net.attend_window(o)
    o2 = o.clone()
    o2[0, 6] += 5.0
    changed = (net.attend_window(o2) - base).abs().amax(-1)[0] > 1e-6
    assert changed.nonzero().flatten().tolist() == [6, 7, 8, 9]


def test_forward_is_causal() -> None:
    net = _net()
    x = torch.randn(2, 20, DEFAULT_SCHEMA.n_inputs)
    x2 = x.clone()
    x2[:, 12:] = torch.randn(2, 8, DEFAULT_SCHEMA.n_inputs)
    a, b = net(x), net(x2)
    torch.testing.assert_close(a.quantiles[:, :12], b.quantiles[:, :12])
    assert not torch.allclose(a.quantiles[:, 12:], b.quantiles[:, 12:])


def test_netconfig_roundtrip_and_validation() -> None:
    cfg = _net().config
    assert NetConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="multiple of heads"):
        NetConfig(n_inputs=4, hidden=10, heads=4)
    with pytest.raises(ValueError, match="quantiles"):
        NetConfig(n_inputs=4, quantiles=(0.9, 0.5))
    with pytest.raises(ValueError, match="unknown field"):
        NetConfig.from_dict({"n_inputs": 4, "dropout": 0.1})


def test_pinball_loss_values_and_mask() -> None:
    pred = torch.tensor([[[1.0, 2.0]]])  # [1, K=1, Q=2]
    target = torch.tensor([[3.0]])
    # q=0.5: 0.5*2 = 1.0 ; q=0.9: 0.9*1 = 0.9 ; mean over quantiles
    assert pinball_loss(pred, target, (0.5, 0.9)).item() == pytest.approx(0.95)
    over = pinball_loss(pred, torch.tensor([[0.0]]), (0.5, 0.9)).item()  # 0.5*1 + 0.1*2 = 0.7 → 0.35
    assert over == pytest.approx(0.35)
    nan_t = torch.tensor([[float("nan")]])
    assert pinball_loss(pred, nan_t, (0.5, 0.9)).item() == 0.0
    p = pred.clone().requires_grad_(True)
    pinball_loss(p, nan_t, (0.5, 0.9)).backward()  # type: ignore[no-untyped-call]
    assert p.grad is not None and torch.isfinite(p.grad).all()


def test_burst_bce_masks_unknown_targets() -> None:
    logit = torch.tensor([0.0, 10.0])
    assert burst_bce(logit, torch.tensor([1.0, float("nan")])).item() == pytest.approx(np.log(2.0))
    with pytest.raises(ValueError, match="must match"):
        burst_bce(logit, torch.tensor([1.0]))


def test_overfits_a_tiny_batch() -> None:
    torch.manual_seed(1)
    net = LstmAttentionNet(6, hidden=16, heads=2, window=8)
    x = torch.randn(4, 40, 6)
    y = torch.cumsum(x[..., :3], dim=1) * 0.3  # depends on the past: needs memory, not just the input
    burst = (x[..., 0] > 0.5).float()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)

    def loss_fn() -> torch.Tensor:
        out = net(x)
        return pinball_loss(out.quantiles, y, (0.5, 0.9)) + burst_bce(out.burst_logit, burst)

    first = loss_fn().item()
    for _ in range(150):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    assert loss_fn().item() < first / 8  # seeds 1-3 reach 16-23x


def test_all_nan_channel_gives_finite_outputs_that_differ_from_zeros() -> None:
    rng = np.random.default_rng(0)
    x = rng.gamma(2.0, 3.0, size=(1, 30, len(CHANNELS)))
    mask = np.ones(x.shape, bool)
    times = 1.7e9 + np.arange(30.0)
    nz = Normalizer.identity()
    k = CHANNELS.index("kv_usage")
    outage, zeros = x.copy(), x.copy()
    outage[..., k], zeros[..., k] = np.nan, 0.0
    m_out = mask.copy()
    m_out[..., k] = False
    net = _net()
    a = net(torch.from_numpy(encode_inputs(outage, m_out, nz, times)))
    b = net(torch.from_numpy(encode_inputs(zeros, mask, nz, times)))
    assert torch.isfinite(a.quantiles).all() and torch.isfinite(a.burst_logit).all()
    assert not torch.allclose(a.quantiles, b.quantiles)


def test_decode_quantiles_inverts_target_normalisation() -> None:
    nz = Normalizer.identity()
    nz = Normalizer.from_dict({**nz.to_dict(), "target_mean": [1.0, 2.0, 3.0], "target_std": [2.0, 1.0, 0.5]})
    totals = np.array([[10.0, 15.0], [100.0, 200.0], [0.0, 7.0]])  # [K, Q]
    y = np.moveaxis(nz.normalize_targets(np.moveaxis(totals, -1, -2)), -2, -1)
    np.testing.assert_allclose(decode_quantiles(torch.tensor(y), nz), totals, atol=1e-9)
    assert (decode_quantiles(np.full((3, 2), -50.0), nz) >= 0).all()


def test_every_parameter_gets_a_gradient() -> None:
    net = _net(window=4)
    x = torch.randn(2, 11, DEFAULT_SCHEMA.n_inputs)
    out = net(x)
    loss = pinball_loss(out.quantiles, torch.randn(2, 11, 3), (0.5, 0.9)) + burst_bce(
        out.burst_logit, (torch.rand(2, 11) > 0.5).float()
    )
    loss.backward()  # type: ignore[no-untyped-call]
    # k_proj.bias shifts every score of a query equally, which softmax ignores: its gradient is 0 up to rounding.
    dead = [
        name
        for name, p in net.named_parameters()
        if name != "k_proj.bias" and (p.grad is None or not p.grad.abs().sum() > 1e-6)
    ]
    assert dead == []
