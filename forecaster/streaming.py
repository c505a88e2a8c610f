"""Streaming inference with torch: one LSTM step plus one attention read per node per tick, batched across nodes.

The controller runs the same step without torch (``forecaster.inference.NumpyLearnedForecaster``); this
torch version serves training, export, ``train-forecaster evaluate`` and :meth:`LearnedForecaster.predict_sequence`.

State per node: the LSTM's ``(h, c)`` and ring buffers of the attention keys and values of its last
``window`` LSTM outputs (keys/values are linear in the outputs, so storing them projected is equivalent to
storing the outputs and saves two matrix products per tick). Attention is a softmax over a set, so the
ring's order does not matter; slots not yet written are masked out. Memory: ``2 * window * hidden * 4``
bytes per node (30 KB at the defaults), plus ``2 * K * J`` floats for the baseline skip's EWMAs when the
network has one (``NetConfig.baseline_halflives``).

A tick costs O(N · (LSTM step + window · hidden)) — it never re-runs the window. Outputs equal the
network's full-sequence ``forward`` at the same position (tested to 1e-5).

Nodes with no observed input in the last ``window`` steps (an outage, or a node just added that has only
reported NaN) get NaN forecasts: the model has nothing observed to attend to, and NaN means "unknown" to
the controller, which then holds or falls back. Nodes with partial inputs get normal forecasts (the mask
channels tell the model what is missing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from forecaster.checkpoint import LoadedCheckpoint, load_checkpoint
from forecaster.features import (
    FeatureSchema,
    Normalizer,
    descriptor_series,
    encode_inputs_masked,
    level_offsets,
    level_series,
)
from forecaster.inference import StreamingBase
from forecaster.lengths import LengthRange, guarded_mask, guarded_totals, length_range_of, length_series
from forecaster.network import LstmAttentionNet, Output, decode_quantiles


@dataclass(frozen=True, eq=False)
class SequenceForecast:
    """Forecasts at every step of a series (:meth:`LearnedForecaster.predict_sequence`).

    ``totals[n, t, k, j]``: quantile ``quantiles[j]`` of target ``targets[k]`` summed over
    ``(t, t + horizon_s]``, as requests / tokens; ``burst_prob[n, t]``. NaN = no forecast (stale node).
    """

    node_ids: tuple[str, ...]
    horizon_s: float
    quantiles: tuple[float, ...]
    targets: tuple[str, ...]
    totals: np.ndarray  # float64 [N, T, K, Q]
    burst_prob: np.ndarray  # float64 [N, T]
    model_version: str

    def get(self, target: str, quantile: float) -> np.ndarray:
        """``[N, T]`` totals of one target at one quantile, e.g. ``get("arrivals", 0.9)``."""
        if target not in self.targets or quantile not in self.quantiles:
            raise KeyError(
                f"no forecast for ({target!r}, {quantile}); have {self.targets} × {self.quantiles}"
            )
        return self.totals[:, :, self.targets.index(target), self.quantiles.index(quantile)]


class LearnedForecaster(StreamingBase):
    """The LSTM+attention model behind the :class:`forecaster.types.Forecaster` protocol, with torch.

    For training, export, evaluation and :meth:`predict_sequence`; the controller steps the same checkpoint
    without torch (``forecaster.inference.NumpyLearnedForecaster``; both share ``StreamingBase``).
    ``num_threads``, when given, is passed to ``torch.set_num_threads`` (process-wide); otherwise the
    process's setting is used as it is.
    """

    def __init__(
        self,
        net: LstmAttentionNet,
        schema: FeatureSchema,
        normalizer: Normalizer,
        horizon_s: float,
        model_version: str,
        *,
        num_threads: int | None = None,
        length_range: LengthRange | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.net = net.eval()
        with torch.no_grad():  # one matrix product for q, k and v (the weights are frozen for inference)
            self._w_qkv = torch.cat([net.q_proj.weight, net.k_proj.weight, net.v_proj.weight]).clone()
            self._b_qkv = torch.cat([net.q_proj.bias, net.k_proj.bias, net.v_proj.bias]).clone()
        super().__init__(net.config, schema, normalizer, horizon_s, model_version, length_range=length_range)

    @classmethod
    def from_checkpoint(cls, ckpt: LoadedCheckpoint, *, num_threads: int | None = None) -> LearnedForecaster:
        return cls(
            ckpt.net,
            ckpt.schema,
            ckpt.normalizer,
            ckpt.horizon_s,
            ckpt.model_version,
            num_threads=num_threads,
            length_range=length_range_of(ckpt.meta),
        )

    @classmethod
    def load(
        cls, path: str | Path, expect_schema: FeatureSchema | None = None, *, num_threads: int | None = None
    ) -> LearnedForecaster:
        """Load a checkpoint (see :func:`forecaster.checkpoint.load_checkpoint`) and wrap it."""
        return cls.from_checkpoint(load_checkpoint(path, expect_schema), num_threads=num_threads)

    def _reset_net(self, n: int) -> None:
        cfg = self.net.config
        nh, dh = self.net.heads, self.net.head_dim
        self._h = torch.zeros(cfg.layers, n, cfg.hidden)
        self._c = torch.zeros(cfg.layers, n, cfg.hidden)
        self._k = torch.zeros(n, nh, dh, cfg.window)  # ring of keys, per head, stored transposed for q @ K
        self._v = torch.zeros(n, nh, cfg.window, dh)
        self._count = torch.zeros(n, dtype=torch.long)  # steps consumed since the node was added
        # the baseline skip's EWMA sums (LstmAttentionNet.baseline_scan), [N, 2K, J]; empty when off
        self._base = torch.zeros(n, 2 * cfg.n_targets if self.net.n_baselines else 0, self.net.n_baselines)

    def _net_state(self) -> tuple[Tensor, ...]:
        return self._h, self._c, self._k, self._v, self._count, self._base

    def _keep_net(self, old: tuple[Tensor, ...], dst: np.ndarray, src: np.ndarray) -> None:
        h, c, k, v, count, base = old
        d, s = torch.from_numpy(dst), torch.from_numpy(src)
        self._h[:, d], self._c[:, d] = h[:, s], c[:, s]
        self._k[d], self._v[d] = k[s], v[s]
        self._count[d], self._base[d] = count[s], base[s]

    def _step_net(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.step_encoded(torch.from_numpy(z))
        return out.quantiles.numpy(), torch.sigmoid(out.burst_logit).numpy().astype(np.float64)

    def predict_sequence(
        self,
        x: np.ndarray,
        mask: np.ndarray,
        times_s: np.ndarray,
        *,
        node_ids: Sequence[str] | None = None,
        chunk_nodes: int = 256,
    ) -> SequenceForecast:
        """Offline: forecasts at every step of whole series, as if each node were ``reset`` then ``step``-ped.

        ``x``/``mask``: ``[N, T, C]`` raw channels; ``times_s``: ``[T]`` seconds since the Unix epoch. Runs
        the network's full-sequence forward (much faster than T calls to ``step``); the streaming state is
        not touched. Same NaN rule as ``step``: nothing observed in the last ``window`` steps → NaN; the same
        length guard.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 3 or x.shape[-1] != len(self.schema.channels) or np.shape(mask) != x.shape:
            raise ValueError(
                f"predict_sequence: x {x.shape} and mask {np.shape(mask)} must be [N, T, {len(self.schema.channels)}]"
            )
        n, t = x.shape[:2]
        if node_ids is not None and len(node_ids) != n:
            raise ValueError(f"predict_sequence: {len(node_ids)} node_ids for {n} series")
        outside: np.ndarray | None = None
        if self.length_range is not None:
            lengths = length_series(x, mask, self.schema.channels, self.schema.step_s)  # [N, T, 2]
            outside = self.length_range.outside(lengths)
            mask = guarded_mask(mask, outside, self.schema.channels)
        levels = level_series(x, mask, self.schema) if self.schema.level_relative else None
        x_off, y_off = (
            level_offsets(levels, self.schema, self.horizon_s) if levels is not None else (None, None)
        )
        steps = np.arange(t)
        stale = np.empty((n, t), dtype=bool)
        q = np.empty((n, t, self.net.n_targets, self.net.n_quantiles))
        logit = np.empty((n, t))
        with torch.inference_mode():
            for lo in range(0, n, chunk_nodes):
                hi = min(lo + chunk_nodes, n)
                m = np.asarray(mask)[lo:hi]
                desc = descriptor_series(x[lo:hi], m, self.schema) if self.schema.descriptors else None
                lv = levels[lo:hi] if levels is not None else None
                xo = x_off[lo:hi] if x_off is not None else None
                z, ok = encode_inputs_masked(
                    x[lo:hi], m, self.normalizer, times_s, self.schema, desc, lv, x_offsets=xo
                )
                last_obs = np.maximum.accumulate(np.where(ok.any(axis=-1), steps, -(10**12)), axis=-1)
                stale[lo:hi] = steps - last_obs >= self.net.config.window  # [n, T]
                out = self.net(torch.from_numpy(z))
                q[lo:hi], logit[lo:hi] = out.quantiles.numpy(), out.burst_logit.numpy()
        totals = decode_quantiles(q, self.normalizer, y_off)
        if outside is not None:
            guarded_totals(totals, outside, lengths, self.schema.targets)
        totals[stale] = np.nan
        burst = 1.0 / (1.0 + np.exp(-logit))
        burst[stale] = np.nan
        return SequenceForecast(
            node_ids=tuple(node_ids) if node_ids is not None else tuple(str(i) for i in range(n)),
            horizon_s=self.horizon_s,
            quantiles=self.net.config.quantiles,
            targets=self.schema.targets,
            totals=totals,
            burst_prob=burst,
            model_version=self.model_version,
        )

    @torch.inference_mode()
    def step_encoded(self, z: Tensor) -> Output:
        """One step on already-encoded inputs ``z [N, F_in]`` → :class:`Output` with ``[N, K, Q]`` / ``[N]``.

        Normalised outputs, no staleness rule (``step`` adds both decoding and the NaN rule).
        """
        net, w = self.net, self.net.window
        n = z.shape[0]
        o, (self._h, self._c) = net.lstm(z.unsqueeze(1), (self._h, self._c))
        o = o.squeeze(1)  # [N, H]
        nh, dh = net.heads, net.head_dim
        qkv = torch.nn.functional.linear(o, self._w_qkv, self._b_qkv)
        d = net.hidden
        q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
        q = q.reshape(n, nh, 1, dh) * (1.0 / math.sqrt(dh))
        slot = self._tick % w
        self._k[:, :, :, slot] = k.reshape(n, nh, dh)
        self._v[:, :, slot] = v.reshape(n, nh, dh)
        self._count += 1
        self._tick += 1
        scores = torch.matmul(q, self._k)  # [N, nh, 1, w]
        if n and int(self._count.min()) < w:  # some node has not filled its ring yet
            age = (slot - torch.arange(w)) % w  # 0 = written now, w-1 = oldest
            unwritten = age[None, :] >= self._count[:, None]  # [N, w]
            scores = scores.masked_fill(unwritten[:, None, None, :], float("-inf"))
        att = torch.matmul(torch.softmax(scores, dim=-1), self._v).reshape(n, nh * dh)
        offset = None
        if net.n_baselines:
            self._base = net.baseline_step(self._base, net.baseline_terms(z))
            offset = net.baseline_offset(self._base)
        return net.heads_from(o, att, offset)
