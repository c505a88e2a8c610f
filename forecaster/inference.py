"""Torch-free streaming inference: the LSTM + attention network's per-tick step in numpy.

What runs where: the controller (the daemon, ``pdscale replay --policy predictive``, the demo) reads the
checkpoint with :func:`forecaster.checkpoint.read_checkpoint` and steps :class:`NumpyLearnedForecaster`, so it
never imports torch (torch and its libraries alone are ~170 MB of RSS). Training, export, ``train-forecaster
evaluate`` and the offline ``predict_sequence`` use the torch model (``forecaster.streaming.LearnedForecaster``).
Both step through :class:`StreamingBase`: the same encoding, node bookkeeping, staleness rule and decoding,
around one network step per tick — torch's or :class:`NumpyNet`'s, the same arithmetic on the same float32
weights (tests/forecaster/test_numpy_inference.py bounds the difference).

:class:`NumpyNet` is exactly the architecture of ``forecaster.network.LstmAttentionNet``: a stacked LSTM
(PyTorch's gate order i, f, g, o), multi-head attention of the newest output over a ring of the keys and
values of the last ``window`` outputs, the ``[o, attn]`` trunk with exact (erf) GELU, the quantile head
(first quantile plus softplus increments) and the burst head, and the optional baseline skip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from forecaster.checkpoint import CheckpointData, read_checkpoint
from forecaster.features import (
    DescriptorState,
    FeatureSchema,
    LevelState,
    Normalizer,
    encode_step_masked,
    level_offsets,
)
from forecaster.netconfig import NetConfig, parameter_shapes
from forecaster.types import ForecastBatch


def decode_totals(q: np.ndarray, normalizer: Normalizer, offsets: np.ndarray | None = None) -> np.ndarray:
    """Normalised quantiles ``[..., K, Q]`` → totals over the horizon (requests / tokens), float64, >= 0.

    ``offsets [..., K]``: the level-relative target offsets (``forecaster.features.level_offsets``), if any."""
    moved = np.moveaxis(np.asarray(q), -1, -2)  # [..., Q, K] so the normaliser's per-target stats broadcast
    off = None if offsets is None else np.asarray(offsets)[..., None, :]
    return np.moveaxis(normalizer.denormalize_targets(moved, off), -2, -1)


class StreamingBase:
    """Per-node streaming around one network step per tick (shared by the numpy and the torch forecaster).

    Subclasses hold the network's per-node state and implement ``_reset_net``, ``_net_state``,
    ``_keep_net`` and ``_step_net``; this class keeps the node order, the ring slot (``_tick``), the
    steps since each node's last observation, the descriptor and level states, and does the encoding, the
    staleness rule (nothing observed for ``window`` steps → NaN) and the decoding.
    """

    name = "lstm-attn"

    def __init__(
        self,
        config: NetConfig,
        schema: FeatureSchema,
        normalizer: Normalizer,
        horizon_s: float,
        model_version: str,
    ) -> None:
        qs = config.quantiles
        missing = [q for q in (0.5, 0.9) if q not in qs]
        if missing:
            raise ValueError(
                f"LearnedForecaster needs the network to predict quantiles 0.5 and 0.9, has {qs}"
            )
        if config.n_inputs != schema.n_inputs:
            raise ValueError(f"network n_inputs {config.n_inputs} != schema inputs {schema.n_inputs}")
        self.net_config = config
        self.schema, self.normalizer = schema, normalizer
        self.horizon_s, self.model_version = float(horizon_s), model_version
        self._q50, self._q90 = qs.index(0.5), qs.index(0.9)
        self.reset(())

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._node_ids

    def reset(self, node_ids: Sequence[str]) -> None:
        """Forget all state and start tracking these nodes (in this order)."""
        ids = tuple(node_ids)
        if len(set(ids)) != len(ids):
            raise ValueError("reset: node_ids contain duplicates")
        self._node_ids = ids
        n = len(ids)
        self._tick = 0  # ring slot written next is _tick % window, the same for every node
        self._since_obs = np.full(n, self.net_config.window, dtype=np.int64)  # steps since any observation
        self._desc = DescriptorState(n, self.schema)  # per-pool descriptors (schema v2); unused when none
        # trailing levels of the rate channels (schema v3, level-relative encoding); None when off
        self._level = LevelState(n, self.schema) if self.schema.level_relative else None
        self._reset_net(n)

    def ensure_nodes(self, node_ids: Sequence[str]) -> None:
        """Track exactly these nodes, in this order: known ones keep their state, new ones start fresh."""
        new_ids = tuple(node_ids)
        if new_ids == self._node_ids:
            return
        if len(set(new_ids)) != len(new_ids):
            raise ValueError("ensure_nodes: node_ids contain duplicates")
        old = {nid: i for i, nid in enumerate(self._node_ids)}
        since, desc, level, net, tick = (
            self._since_obs,
            self._desc,
            self._level,
            self._net_state(),
            self._tick,
        )
        self.reset(new_ids)
        self._tick = tick  # kept nodes' ring slots stay where they are
        src_of = [old.get(nid, -1) for nid in new_ids]
        dst = np.array([i for i, s in enumerate(src_of) if s >= 0], dtype=np.int64)
        src = np.array([s for s in src_of if s >= 0], dtype=np.int64)
        if len(src):
            self._keep_net(net, dst, src)
            self._desc.sums[dst] = desc.sums[src]
            if self._level is not None and level is not None:
                self._level.sums[dst] = level.sums[src]
            self._since_obs[dst] = since[src]

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        """Consume one step for every tracked node and forecast totals over ``(now_s, now_s + horizon_s]``.

        ``x``: ``[N, C]`` raw channels (NaN = unknown), ``mask``: ``[N, C]`` bool, rows in ``node_ids`` order;
        ``now_s``: seconds since the Unix epoch (needed by the time-of-day features).
        """
        n = len(self._node_ids)
        if np.shape(x) != (n, len(self.schema.channels)) or np.shape(mask) != np.shape(x):
            raise ValueError(
                f"step: x {np.shape(x)} and mask {np.shape(mask)} must be [{n} tracked nodes, "
                f"{len(self.schema.channels)} channels]; call ensure_nodes() when the node set changes"
            )
        desc = self._desc.update(x, mask) if self.schema.descriptors else None
        levels = self._level.update(x, mask) if self._level is not None else None
        x_off, y_off = (
            level_offsets(levels, self.schema, self.horizon_s) if levels is not None else (None, None)
        )
        # one normalisation per tick: the encoding also returns what it counted as observed
        z, ok = encode_step_masked(
            x, mask, self.normalizer, now_s, self.schema, desc, levels, x_offsets=x_off
        )
        self._since_obs = np.where(ok.any(axis=1), 0, self._since_obs + 1)
        quantiles, burst = self._step_net(z)
        totals = decode_totals(quantiles, self.normalizer, y_off)
        stale = self._since_obs >= self.net_config.window
        totals[stale] = np.nan
        burst[stale] = np.nan
        return ForecastBatch(
            node_ids=self._node_ids,
            horizon_s=self.horizon_s,
            arrivals_p50=totals[:, 0, self._q50],
            arrivals_p90=totals[:, 0, self._q90],
            prompt_tokens_p50=totals[:, 1, self._q50],
            prompt_tokens_p90=totals[:, 1, self._q90],
            gen_tokens_p50=totals[:, 2, self._q50],
            gen_tokens_p90=totals[:, 2, self._q90],
            burst_prob=burst,
            model_version=self.model_version,
        )

    # --- the network's part ---------------------------------------------------------------------------

    def _reset_net(self, n: int) -> None:
        """Fresh network state for ``n`` nodes."""
        raise NotImplementedError

    def _net_state(self) -> Any:
        """The current network state (kept by ``ensure_nodes`` across its ``reset``)."""
        raise NotImplementedError

    def _keep_net(self, old: Any, dst: np.ndarray, src: np.ndarray) -> None:
        """Copy nodes ``src`` of the ``old`` state (from ``_net_state``) into rows ``dst`` of the fresh one."""
        raise NotImplementedError

    def _step_net(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step on encoded inputs ``z [N, n_inputs]`` (advancing ``_tick``) → normalised quantiles
        ``[N, K, Q]`` and the burst probability, float64 ``[N]`` (a fresh array: the caller writes NaN)."""
        raise NotImplementedError


@dataclass
class RingState:
    """:class:`NumpyNet`'s per-node state: LSTM ``h``/``c`` ``[layers, N, H]``, the rings of attention keys
    ``[N, heads, head_dim, window]`` (transposed for ``q @ K``) and values ``[N, heads, window, head_dim]``,
    steps consumed per node ``[N]`` and the baseline skip's EWMA sums ``[N, 2K, J]`` (empty when off)."""

    h: np.ndarray
    c: np.ndarray
    k: np.ndarray
    v: np.ndarray
    count: np.ndarray
    base: np.ndarray

    def keep(self, old: RingState, dst: np.ndarray, src: np.ndarray) -> None:
        self.h[:, dst], self.c[:, dst] = old.h[:, src], old.c[:, src]
        self.k[dst], self.v[dst] = old.k[src], old.v[src]
        self.count[dst], self.base[dst] = old.count[src], old.base[src]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 + 0.5 * np.tanh(0.5 * x)  # no overflow for large |x|, unlike 1 / (1 + exp(-x))
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x Φ(x) = x/2 · erfc(-x/√2)``, as ``torch.nn.GELU()``; erfc by the Chebyshev-fitted formula
    of Numerical Recipes (``erfcc``; fractional error < 1.2e-7 everywhere), in ``x``'s dtype (numpy has no
    erf, and scipy is not on the controller's path). In float32 its absolute error is torch's own (3.8e-7
    against a float64 reference over [-12, 12]); in float64 it is 1.4e-8 there."""
    u = x * (-1.0 / math.sqrt(2.0))
    a = np.abs(u)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))  # fmt: skip
    erfc_a = t * np.exp(-a * a + poly)
    out: np.ndarray = 0.5 * x * np.where(u >= 0.0, erfc_a, 2.0 - erfc_a)
    return out


def _softplus(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.softplus`` (beta 1, threshold 20: linear above it)."""
    out: np.ndarray = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    return out


class NumpyNet:
    """``LstmAttentionNet``'s streaming step in numpy, from its ``state_dict`` weights (float32 by default).

    ``dtype=np.float64`` computes in double precision from the same float32 weights.
    """

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        config: NetConfig,
        *,
        dtype: type[np.floating[Any]] = np.float32,
    ) -> None:
        expected = parameter_shapes(config)
        got = {k: tuple(np.shape(v)) for k, v in weights.items()}
        if got != expected:
            diffs = [f"{k}: {got.get(k, 'missing')} != {expected.get(k, 'unexpected')}"
                     for k in sorted(set(got) | set(expected)) if got.get(k) != expected.get(k)]  # fmt: skip
            raise ValueError("NumpyNet: weights do not match the hyper-parameters: " + "; ".join(diffs))
        self.config, self.dtype = config, np.dtype(dtype)
        hd, nh = config.hidden, config.heads
        self.heads, self.head_dim = nh, hd // nh

        def w(name: str) -> np.ndarray:
            return np.asarray(weights[name], dtype=self.dtype)

        # each LSTM layer as one product: [x, h] @ [W_ih; W_hh]^T + (b_ih + b_hh)
        self._lstm = [
            (
                np.ascontiguousarray(
                    np.concatenate([w(f"lstm.weight_ih_l{i}"), w(f"lstm.weight_hh_l{i}")], 1).T
                ),
                w(f"lstm.bias_ih_l{i}") + w(f"lstm.bias_hh_l{i}"),
            )
            for i in range(config.layers)
        ]
        self._w_qkv = np.ascontiguousarray(
            np.concatenate([w("q_proj.weight"), w("k_proj.weight"), w("v_proj.weight")]).T
        )
        self._b_qkv = np.concatenate([w("q_proj.bias"), w("k_proj.bias"), w("v_proj.bias")])
        self._w_o, self._b_o = np.ascontiguousarray(w("o_proj.weight").T), w("o_proj.bias")
        self._w_trunk, self._b_trunk = np.ascontiguousarray(w("trunk.0.weight").T), w("trunk.0.bias")
        # the quantile and burst heads as one product: the last column is the burst logit
        self._w_out = np.ascontiguousarray(
            np.concatenate([w("quantile_head.weight"), w("burst_head.weight")]).T
        )
        self._b_out = np.concatenate([w("quantile_head.bias"), w("burst_head.bias")])
        self.n_targets, self.n_quantiles = config.n_targets, len(config.quantiles)
        self.n_baselines = len(config.baseline_halflives)
        if self.n_baselines:
            hl = np.asarray(config.baseline_halflives, dtype=np.float64)
            # float32 like the torch buffer (0.5 ** (1 / hl) in double, then rounded), then the compute dtype
            self._decay = (0.5 ** (1.0 / hl)).astype(np.float32).astype(self.dtype)
            self._base_cols = np.asarray(config.baseline_inputs, dtype=np.int64)
            masks = np.asarray(config.baseline_masks, dtype=np.int64)
            self._base_mask_cols, self._base_has_mask = np.maximum(masks, 0), masks >= 0
            self._base_w, self._base_b = w("baseline_weight"), w("baseline_bias")

    def new_state(self, n: int) -> RingState:
        cfg, dt = self.config, self.dtype
        return RingState(
            h=np.zeros((cfg.layers, n, cfg.hidden), dt),
            c=np.zeros((cfg.layers, n, cfg.hidden), dt),
            k=np.zeros((n, self.heads, self.head_dim, cfg.window), dt),
            v=np.zeros((n, self.heads, cfg.window, self.head_dim), dt),
            count=np.zeros(n, np.int64),
            base=np.zeros((n, 2 * cfg.n_targets if self.n_baselines else 0, self.n_baselines), dt),
        )

    def step(self, state: RingState, z: np.ndarray, tick: int) -> tuple[np.ndarray, np.ndarray]:
        """One step for every node: encoded inputs ``z [N, n_inputs]``, written to ring slot ``tick % window``
        (``state`` is updated in place) → normalised quantiles ``[N, K, Q]`` and burst logits ``[N]``."""
        cfg, hd = self.config, self.config.hidden
        n, w = z.shape[0], cfg.window
        x = np.asarray(z, dtype=self.dtype)
        for layer, (wl, bl) in enumerate(self._lstm):
            gates = np.concatenate([x, state.h[layer]], axis=1) @ wl + bl  # [N, 4H]: i, f, g, o
            sig = _sigmoid(gates)
            c = sig[:, hd : 2 * hd] * state.c[layer] + sig[:, :hd] * np.tanh(gates[:, 2 * hd : 3 * hd])
            x = sig[:, 3 * hd :] * np.tanh(c)
            state.h[layer], state.c[layer] = x, c
        o = x  # [N, H]
        nh, dh = self.heads, self.head_dim
        qkv = o @ self._w_qkv + self._b_qkv
        q = qkv[:, :hd].reshape(n, nh, 1, dh) * self.dtype.type(1.0 / math.sqrt(dh))
        slot = tick % w
        state.k[:, :, :, slot] = qkv[:, hd : 2 * hd].reshape(n, nh, dh)
        state.v[:, :, slot] = qkv[:, 2 * hd :].reshape(n, nh, dh)
        state.count += 1
        scores = np.matmul(q, state.k)  # [N, nh, 1, w]
        if n and int(state.count.min()) < w:  # some node has not filled its ring yet
            age = (slot - np.arange(w)) % w  # 0 = written now, w-1 = oldest
            unwritten = age[None, :] >= state.count[:, None]  # [N, w]
            scores = np.where(unwritten[:, None, None, :], -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        att = np.matmul(scores, state.v).reshape(n, hd)
        trunk = _gelu(
            np.concatenate([o, att @ self._w_o + self._b_o], axis=1) @ self._w_trunk + self._b_trunk
        )
        out = trunk @ self._w_out + self._b_out
        k, nq = self.n_targets, self.n_quantiles
        raw = out[:, : k * nq].reshape(n, k, nq)
        if self.n_baselines:
            raw = raw.copy()
            raw[..., 0] += self._baseline_offset(state, x=np.asarray(z, dtype=self.dtype))
        if nq > 1:
            raw = np.concatenate(
                [raw[..., :1], raw[..., :1] + np.cumsum(_softplus(raw[..., 1:]), axis=-1)], -1
            )
        return raw, out[:, -1]

    def _baseline_offset(self, state: RingState, x: np.ndarray) -> np.ndarray:
        """Advance the baseline skip's EWMA sums with this step's inputs → the offset per target ``[N, K]``
        (``LstmAttentionNet.baseline_terms``, ``baseline_step`` and ``baseline_offset``)."""
        zc = x[:, self._base_cols]
        m = np.where(self._base_has_mask, x[:, self._base_mask_cols], self.dtype.type(1.0))
        u = np.concatenate([m * zc, m], axis=1)  # [N, 2K]
        d = self._decay
        state.base = d * state.base + (1 - d) * u[..., None]
        k = self.n_targets
        s, wgt = state.base[:, :k], state.base[:, k:]
        level = np.where(wgt > 1e-6, s / np.maximum(wgt, self.dtype.type(1e-6)), self.dtype.type(0.0))
        offset: np.ndarray = (level * self._base_w).sum(-1) + self._base_b
        return offset


class NumpyLearnedForecaster(StreamingBase):
    """The learned forecaster without torch: :class:`StreamingBase` stepping a :class:`NumpyNet`.

    What the controller runs (``controller.forecasting``). ``dtype``: the compute precision (float32, as torch
    computes; float64 from the same weights).
    """

    def __init__(
        self,
        net: NumpyNet,
        schema: FeatureSchema,
        normalizer: Normalizer,
        horizon_s: float,
        model_version: str,
    ) -> None:
        self.net = net
        super().__init__(net.config, schema, normalizer, horizon_s, model_version)

    @classmethod
    def from_data(
        cls, data: CheckpointData, *, dtype: type[np.floating[Any]] = np.float32
    ) -> NumpyLearnedForecaster:
        net = NumpyNet(data.weights, data.net_config, dtype=dtype)
        return cls(net, data.schema, data.normalizer, data.horizon_s, data.model_version)

    @classmethod
    def load(
        cls,
        path: str | Path,
        expect_schema: FeatureSchema | None = None,
        *,
        dtype: type[np.floating[Any]] = np.float32,
    ) -> NumpyLearnedForecaster:
        """Read a checkpoint (:func:`forecaster.checkpoint.read_checkpoint`: every check, no torch) and wrap it."""
        return cls.from_data(read_checkpoint(path, expect_schema), dtype=dtype)

    def _reset_net(self, n: int) -> None:
        self._ring = self.net.new_state(n)

    def _net_state(self) -> RingState:
        return self._ring

    def _keep_net(self, old: RingState, dst: np.ndarray, src: np.ndarray) -> None:
        self._ring.keep(old, dst, src)

    def _step_net(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        quantiles, logit = self.net.step(self._ring, z, self._tick)
        self._tick += 1
        return quantiles, _sigmoid(logit.astype(np.float64))
