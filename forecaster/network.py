"""The LSTM + sliding-window attention network, its losses and the decoding of its outputs.

Imports torch: never import this module from ``forecaster/__init__.py`` or anything the controller loads
before a learned forecaster is asked for.

Targets live in normalised space (see ``forecaster.features.Normalizer``):
``y = (log1p(total over (t, t + horizon_s]) - target_mean) / target_std``. :func:`decode_quantiles` maps
network outputs back to counts / tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from forecaster.features import Normalizer
from forecaster.inference import decode_totals
from forecaster.netconfig import NetConfig

__all__ = ["LstmAttentionNet", "NetConfig", "Output", "burst_bce", "decode_quantiles", "pinball_loss"]


class Output(NamedTuple):
    """Network outputs at every position.

    ``quantiles``: ``[B, T, n_targets, n_quantiles]`` normalised targets, non-decreasing along the last axis;
    ``burst_logit``: ``[B, T]`` logit of the probability that a burst starts within the horizon.
    """

    quantiles: Tensor
    burst_logit: Tensor


class LstmAttentionNet(nn.Module):
    """A stacked LSTM, multi-head attention over its last ``window`` outputs, quantile and burst heads.

    At position t the query is the LSTM output ``o_t``; keys/values are ``o_s`` for
    ``s = max(0, t - window + 1) .. t`` (causal, sliding). The context ``[o_t, attn_t]`` feeds an MLP trunk,
    then the quantile head (first quantile plus ``softplus`` increments, so quantiles never cross) and the
    burst head.

    Optional baseline skip (``baseline_halflives``, off by default): masked EWMAs of the targets' own rate
    inputs, mapped by a learned affine per target, are added to the quantiles, so the rest of the network
    predicts a log-ratio to a smoothed level (see :meth:`baseline_scan`); streaming keeps the EWMA sums.
    """

    # buffers of the baseline skip (registered only when it is on)
    baseline_decay: Tensor
    baseline_cols: Tensor
    baseline_mask_cols: Tensor
    baseline_has_mask: Tensor

    def __init__(
        self,
        n_inputs: int,
        hidden: int = 64,
        layers: int = 2,
        heads: int = 4,
        window: int = 60,
        n_targets: int = 3,
        quantiles: Sequence[float] = (0.5, 0.9),
        *,
        baseline_halflives: Sequence[float] = (),
        baseline_inputs: Sequence[int] = (),
        baseline_masks: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.config = NetConfig(
            n_inputs,
            hidden,
            layers,
            heads,
            window,
            n_targets,
            tuple(quantiles),
            tuple(float(h) for h in baseline_halflives),
            tuple(int(i) for i in baseline_inputs),
            tuple(int(m) for m in baseline_masks),
        )
        self.hidden, self.heads, self.window = hidden, heads, window
        self.head_dim = hidden // heads
        self.n_targets, self.n_quantiles = n_targets, len(self.config.quantiles)
        self.lstm = nn.LSTM(n_inputs, hidden, num_layers=layers, batch_first=True)
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.trunk = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU())
        self.quantile_head = nn.Linear(hidden, n_targets * self.n_quantiles)
        self.burst_head = nn.Linear(hidden, 1)
        self.n_baselines = len(self.config.baseline_halflives)
        if self.n_baselines:
            hl = torch.tensor(self.config.baseline_halflives, dtype=torch.float64)
            # non-persistent: derived from the config, so the weights file holds parameters only
            self.register_buffer("baseline_decay", (0.5 ** (1.0 / hl)).to(torch.float32), persistent=False)
            self.register_buffer(
                "baseline_cols", torch.tensor(self.config.baseline_inputs, dtype=torch.long), persistent=False
            )
            masks = torch.tensor(self.config.baseline_masks, dtype=torch.long)
            self.register_buffer("baseline_mask_cols", masks.clamp_min(0), persistent=False)
            self.register_buffer("baseline_has_mask", masks >= 0, persistent=False)
            self.baseline_weight = nn.Parameter(
                torch.full((n_targets, self.n_baselines), 1.0 / self.n_baselines)
            )
            self.baseline_bias = nn.Parameter(torch.zeros(n_targets))

    @classmethod
    def from_config(cls, config: NetConfig) -> LstmAttentionNet:
        return cls(
            config.n_inputs,
            config.hidden,
            config.layers,
            config.heads,
            config.window,
            config.n_targets,
            config.quantiles,
            baseline_halflives=config.baseline_halflives,
            baseline_inputs=config.baseline_inputs,
            baseline_masks=config.baseline_masks,
        )

    def forward(self, x: Tensor) -> Output:
        """``x``: float32 ``[B, T, n_inputs]`` encoded inputs → :class:`Output` at every position.

        ``quantiles`` ``[B, T, n_targets, n_quantiles]``, ``burst_logit`` ``[B, T]``. Position t sees
        inputs 0..t only (causal), and attends over LSTM outputs ``max(0, t-window+1)..t``.
        """
        if x.dim() != 3 or x.shape[-1] != self.config.n_inputs:
            raise ValueError(f"expected x of shape [B, T, {self.config.n_inputs}], got {list(x.shape)}")
        o, _ = self.lstm(x)
        base = self.baseline_offset(self.baseline_scan(self.baseline_terms(x))) if self.n_baselines else None
        return self.heads_from(o, self.attend_window(o), base)

    # --- baseline skip -------------------------------------------------------------------------------
    # For each target k and half-life j: a masked, bias-free exponentially weighted mean of the encoded
    # input column ``baseline_inputs[k]`` (normalised log rate), ``level = S / W`` with
    # ``S_t = d S_{t-1} + (1 - d) m_t z_t`` and ``W_t = d W_{t-1} + (1 - d) m_t`` (``m`` = observed, from the
    # mask column), both 0 before the first step: unobserved steps leave the level where it was, and the
    # first observed step is its own level (no warm-up bias). ``offset_k = sum_j a_kj level_kj + b_k`` is
    # added to every quantile of target k: the LSTM + attention learn the log-ratio to that smoothed level.

    def baseline_terms(self, x: Tensor) -> Tensor:
        """Encoded inputs ``[..., n_inputs]`` → ``[..., 2K]``: ``m * z`` for each target, then ``m``."""
        z = x.index_select(-1, self.baseline_cols)
        m = torch.where(
            self.baseline_has_mask, x.index_select(-1, self.baseline_mask_cols), torch.ones_like(z)
        )
        return torch.cat([m * z, m], dim=-1)

    def baseline_scan(self, u: Tensor, state: Tensor | None = None, block: int = 64) -> Tensor:
        """EWMA sums of ``u [B, T, P]`` for every half-life → ``[B, T, P, J]``, starting from ``state [B, P, J]``
        (zeros when None). Blocked: one ``[L, L, J]`` decay-matrix product per block of ``L`` steps."""
        b, t, p = u.shape
        d = self.baseline_decay
        lag = torch.arange(block, device=u.device)
        diff = (lag[:, None] - lag[None, :]).to(u.dtype)  # [L, L] a - b
        mat = torch.where(
            (diff >= 0)[..., None],
            (1 - d) * d ** diff.clamp_min(0)[..., None],
            torch.zeros((), dtype=u.dtype),
        )  # [L, L, J]
        carry_pow = d ** (lag.to(u.dtype) + 1)[:, None]  # [L, J]: d^(a+1)
        s = u.new_zeros(b, p, self.n_baselines) if state is None else state
        out = []
        for lo in range(0, t, block):
            ub = u[:, lo : lo + block]
            n = ub.shape[1]
            sb = torch.einsum("abj,nbp->napj", mat[:n, :n], ub) + carry_pow[:n, None, :] * s[:, None]
            out.append(sb)
            s = sb[:, -1]
        return torch.cat(out, dim=1) if out else u.new_zeros(b, 0, p, self.n_baselines)

    def baseline_step(self, state: Tensor, u: Tensor) -> Tensor:
        """One step of :meth:`baseline_scan`: ``state [N, P, J]``, ``u [N, P]`` → the new state."""
        d = self.baseline_decay
        return d * state + (1 - d) * u[..., None]

    def baseline_offset(self, sums: Tensor) -> Tensor:
        """EWMA sums ``[..., 2K, J]`` → the offset added to each target's quantiles, ``[..., K]``."""
        k = self.n_targets
        s, w = sums[..., :k, :], sums[..., k:, :]
        level = torch.where(w > 1e-6, s / w.clamp_min(1e-6), torch.zeros_like(s))
        return (level * self.baseline_weight).sum(-1) + self.baseline_bias

    def attend_window(self, o: Tensor) -> Tensor:
        """Sliding causal attention for every position: ``o [B, T, H] → [B, T, H]`` (before ``o_proj``).

        Blocked: queries in block i (positions ``i*w .. i*w+w-1``) see keys of blocks i-1 and i, masked to
        the band ``t-w < s <= t``. Memory is O(B·T·w), never O(T²).
        """
        b, t, d = o.shape
        w, nh, dh = self.window, self.heads, self.head_dim
        nb = -(-t // w)
        tp = nb * w
        q, k, v = self.q_proj(o), self.k_proj(o), self.v_proj(o)
        pad = (0, 0, 0, tp - t)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        front = (0, 0, w, 0)
        kp, vp = F.pad(k, front), F.pad(v, front)  # [B, w + tp, D]; block i's keys are kp[:, i*w : i*w+2w]
        kb = torch.cat([kp[:, :tp].view(b, nb, w, d), kp[:, w:].view(b, nb, w, d)], dim=2)  # [B, nb, 2w, D]
        vb = torch.cat([vp[:, :tp].view(b, nb, w, d), vp[:, w:].view(b, nb, w, d)], dim=2)
        qh = q.view(b, nb, w, nh, dh).permute(0, 3, 1, 2, 4)  # [B, nh, nb, w, dh]
        kh = kb.view(b, nb, 2 * w, nh, dh).permute(0, 3, 1, 4, 2)  # [B, nh, nb, dh, 2w]
        vh = vb.view(b, nb, 2 * w, nh, dh).permute(0, 3, 1, 2, 4)  # [B, nh, nb, 2w, dh]
        scores = torch.matmul(qh, kh) * (1.0 / math.sqrt(dh))  # [B, nh, nb, w, 2w]
        scores = scores.masked_fill(~self._band_mask(nb, o.device), float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1), vh)  # [B, nh, nb, w, dh]
        return att.permute(0, 2, 3, 1, 4).reshape(b, tp, d)[:, :t]

    def _band_mask(self, nb: int, device: torch.device) -> Tensor:
        """``[nb, w, 2w]`` True where query a of block i may see key c: ``a < c <= a + w`` and ``s >= 0``."""
        w = self.window
        a = torch.arange(w, device=device)[:, None]
        c = torch.arange(2 * w, device=device)[None, :]
        band = (c > a) & (c <= a + w)
        first = torch.arange(nb, device=device)[:, None, None] > 0
        return band[None] & (first | (c >= w)[None])

    def heads_from(self, o: Tensor, att: Tensor, base: Tensor | None = None) -> Output:
        """LSTM outputs and attention (before ``o_proj``), ``[..., H]`` each → :class:`Output` ``[..., K, Q]``.

        ``base [..., K]``: the baseline skip's offset (:meth:`baseline_offset`), added to every quantile.
        """
        z = self.trunk(torch.cat([o, self.o_proj(att)], dim=-1))
        raw = self.quantile_head(z).unflatten(-1, (self.n_targets, self.n_quantiles))
        if base is not None:
            raw = torch.cat([raw[..., :1] + base.unsqueeze(-1), raw[..., 1:]], dim=-1)
        if self.n_quantiles > 1:
            steps = F.softplus(raw[..., 1:])
            quantiles = torch.cat([raw[..., :1], raw[..., :1] + torch.cumsum(steps, dim=-1)], dim=-1)
        else:
            quantiles = raw
        return Output(quantiles=quantiles, burst_logit=self.burst_head(z).squeeze(-1))


def pinball_loss(
    pred: Tensor, target: Tensor, quantiles: Sequence[float], mask: Tensor | None = None
) -> Tensor:
    """Mean quantile (pinball) loss over observed targets.

    ``pred [..., K, Q]``, ``target [..., K]`` (NaN allowed where ``mask`` is False or when ``mask`` is None:
    NaN targets are always excluded), ``mask [..., K]`` bool. Returns a scalar; 0 when nothing is observed.
    """
    if pred.shape[:-1] != target.shape or pred.shape[-1] != len(quantiles):
        raise ValueError(f"pred {list(pred.shape)} must be target {list(target.shape)} + [{len(quantiles)}]")
    ok = torch.isfinite(target) if mask is None else mask & torch.isfinite(target)
    tgt = torch.where(ok, target, torch.zeros_like(target))
    q = torch.as_tensor(quantiles, dtype=pred.dtype, device=pred.device)
    err = tgt.unsqueeze(-1) - pred  # [..., K, Q]
    loss = torch.maximum(q * err, (q - 1.0) * err).mean(-1)
    okf = ok.to(pred.dtype)
    return (loss * okf).sum() / okf.sum().clamp_min(1.0)


def burst_bce(logit: Tensor, target: Tensor, mask: Tensor | None = None, pos_weight: float = 1.0) -> Tensor:
    """Binary cross-entropy of the burst head: ``logit [...]``, ``target [...]`` in {0, 1} (NaN = unknown)."""
    if logit.shape != target.shape:
        raise ValueError(f"logit {list(logit.shape)} and target {list(target.shape)} must match")
    ok = torch.isfinite(target) if mask is None else mask & torch.isfinite(target)
    tgt = torch.where(ok, target, torch.zeros_like(target))
    pw = torch.as_tensor(pos_weight, dtype=logit.dtype, device=logit.device)
    loss = F.binary_cross_entropy_with_logits(logit, tgt, reduction="none", pos_weight=pw)
    okf = ok.to(logit.dtype)
    return (loss * okf).sum() / okf.sum().clamp_min(1.0)


def decode_quantiles(
    quantiles: Tensor | np.ndarray, normalizer: Normalizer, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Normalised quantiles ``[..., K, Q]`` → totals over the horizon (requests / tokens), float64, >= 0.

    ``offsets [..., K]``: the level-relative target offsets (``forecaster.features.level_offsets``), if any."""
    q = quantiles.detach().cpu().numpy() if isinstance(quantiles, Tensor) else np.asarray(quantiles)
    return decode_totals(q, normalizer, offsets)
