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

import importlib
import logging
import math
import os
import time
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
from forecaster.lengths import LengthRange, LengthState, guarded_mask, guarded_totals, length_range_of
from forecaster.netconfig import NetConfig, parameter_shapes
from forecaster.types import ForecastBatch

logger = logging.getLogger(__name__)

#: ``PDSCALE_NUMBA=0`` (or ``false``/``no``/``off``) makes ``kernel="auto"`` run the pure-numpy step.
NUMBA_ENV = "PDSCALE_NUMBA"
KERNELS = ("auto", "numba", "numpy")


def resolve_kernel(kernel: str) -> str:
    """Which step ``NumpyNet(kernel=...)`` runs: ``"numpy"`` (pure numpy), ``"numba"`` (the compiled kernels of
    :mod:`forecaster.kernels` for every node count; an error when numba does not import) or ``"auto"`` (the
    compiled kernels for states of more than ``small_n`` nodes, numba imported only when the first such state
    is made, pure numpy when it does not import), ``"numpy"`` also when ``PDSCALE_NUMBA`` is off."""
    if kernel not in KERNELS:
        raise ValueError(f"NumpyNet: kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto" and os.environ.get(NUMBA_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return "numpy"
    if kernel == "numba":
        try:
            import forecaster.kernels  # noqa: F401  (numba: compiled on first use, cached on disk)
        except ImportError as exc:
            raise ImportError(f"NumpyNet(kernel='numba'): numba is not usable here: {exc}") from exc
    return kernel


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
        *,
        length_range: LengthRange | None = None,
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
        #: the length guard's training range (``forecaster.lengths``; None = unguarded)
        self.length_range = length_range
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
        self._lengths = LengthState(n, self.schema.channels, self.schema.step_s)  # the length guard's
        self._reset_net(n)

    def ensure_nodes(self, node_ids: Sequence[str]) -> None:
        """Track exactly these nodes, in this order: known ones keep their state, new ones start fresh."""
        new_ids = tuple(node_ids)
        if new_ids == self._node_ids:
            return
        if len(set(new_ids)) != len(new_ids):
            raise ValueError("ensure_nodes: node_ids contain duplicates")
        old = {nid: i for i, nid in enumerate(self._node_ids)}
        since, desc, level, lengths, net, tick = (
            self._since_obs,
            self._desc,
            self._level,
            self._lengths,
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
            self._lengths.keep(lengths, dst, src)

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        """Consume one step for every tracked node and forecast totals over ``(now_s, now_s + horizon_s]``.

        ``x``: ``[N, C]`` raw channels (NaN = unknown), ``mask``: ``[N, C]`` bool, rows in ``node_ids`` order;
        ``now_s``: seconds since the Unix epoch (needed by the time-of-day features). With a ``length_range``,
        a node whose trailing mean lengths lie outside it is forecast from its arrivals alone
        (``forecaster.lengths``).
        """
        n = len(self._node_ids)
        if np.shape(x) != (n, len(self.schema.channels)) or np.shape(mask) != np.shape(x):
            raise ValueError(
                f"step: x {np.shape(x)} and mask {np.shape(mask)} must be [{n} tracked nodes, "
                f"{len(self.schema.channels)} channels]; call ensure_nodes() when the node set changes"
            )
        outside: np.ndarray | None = None
        if self.length_range is not None:
            lengths = self._lengths.update(x, mask)
            outside = self.length_range.outside(lengths)
            mask = guarded_mask(mask, outside, self.schema.channels)
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
        if outside is not None:
            guarded_totals(totals, outside, lengths, self.schema.targets)
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
    """:class:`NumpyNet`'s per-node state, feature-major in blocks of nodes (see :meth:`NumpyNet.layout`):
    node ``n`` is column ``n % block`` of block ``n // block``, the nodes along each array's last, contiguous
    axis, so each batched product is one matrix product per block and each element-wise stage runs over
    whole rows. LSTM ``h``/``c`` ``[blocks, layers, H, block]``; the rings of attention keys and values, in
    the order each contraction reads them fastest: for the blocked layout keys ``[blocks, heads, window,
    head_dim, block]`` and values ``[blocks, heads, head_dim, window, block]`` (numpy's einsum), for the
    node-major layout (``small``: one block up to ``small_n`` nodes, any number of blocks for the compiled
    kernels) keys ``[N, heads, head_dim, window]`` and values ``[N, heads, window, head_dim]`` (stacked
    matrix products, or one pass per node in :mod:`forecaster.kernels`); steps consumed per column ``[blocks * block]``
    (padding columns start at ``window``), the baseline skip's EWMA sums ``[N, 2K, J]`` (empty when off), and
    ``scratch``: one block's preallocated work arrays (not state; :meth:`keep` leaves them); ``compiled``:
    stepped by the numba kernels (``small`` is then true in every block)."""

    h: np.ndarray
    c: np.ndarray
    k: np.ndarray
    v: np.ndarray
    count: np.ndarray
    base: np.ndarray
    small: bool
    scratch: _Scratch
    compiled: bool = False

    @property
    def block(self) -> int:
        return int(self.h.shape[-1])

    def _nodes(self, nodes: np.ndarray) -> tuple[Any, ...]:
        """Index of these nodes in ``h`` and ``c`` (and the blocked rings): nodes first, then per-node axes."""
        b = max(self.block, 1)
        return (nodes // b, Ellipsis, nodes % b)

    def _ring_nodes(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """These nodes' keys ``[nodes, heads, window, head_dim]`` and values ``[nodes, heads, head_dim,
        window]``, whatever the layout (views for the node-major one, copies for the blocked one)."""
        if self.small:
            return self.k[nodes].swapaxes(-1, -2), self.v[nodes].swapaxes(-1, -2)
        at = self._nodes(nodes)
        return self.k[at], self.v[at]

    def keep(self, old: RingState, dst: np.ndarray, src: np.ndarray) -> None:
        to, frm = self._nodes(dst), old._nodes(src)
        self.h[to], self.c[to] = old.h[frm], old.c[frm]
        k, v = old._ring_nodes(src)
        if self.small:
            self.k[dst], self.v[dst] = k.swapaxes(-1, -2), v.swapaxes(-1, -2)
        else:
            self.k[to], self.v[to] = k, v
        self.count[dst], self.base[dst] = old.count[src], old.base[src]


class _Scratch:
    """One block's work arrays (``b`` nodes), allocated with the state, so a tick allocates only small ones.

    Each product's input ends in a row of ones: the bias is the weight matrix's last column. The trunk's
    input is ``[attention; o; 1]``, so ``top`` (``[o; 1]``, the input of q/k/v) is a view of it."""

    def __init__(self, net: NumpyNet, b: int, blocks: int, small: bool, compiled: bool) -> None:
        small = small and not compiled  # the compiled attention needs none of the stacked arrays
        cfg, dt, hd = net.config, net.dtype, net.config.hidden
        nh, dh, w = net.heads, net.head_dim, cfg.window

        def with_ones(rows: int) -> np.ndarray:
            a = np.zeros((rows + 1, b), dt)
            a[rows] = 1.0
            return a

        self.lstm_in = [with_ones(i + hd) for i in [cfg.n_inputs] + [hd] * (cfg.layers - 1)]  # [x; h; 1]
        self.gates = np.empty((4 * hd, b), dt)
        self.work = (np.empty((hd, b), dt), np.empty((hd, b), dt), np.empty((hd, b), dt))
        self.trunk_in = with_ones(2 * hd)  # [attention; o; 1] → trunk (o_proj folded into its weights)
        self.top = self.trunk_in[hd:]  # [o; 1] → q, k, v
        self.att = self.trunk_in[:hd]
        self.qkv = np.empty((3 * hd, b), dt)
        if small:  # node-major attention: stacked products over [N, heads, 1, ·]
            self.q = np.empty((b, nh, 1, dh), dt)
            self.scores = np.empty((b, nh, 1, w), dt)
            self.score_max = np.empty((b, nh, 1, 1), dt)
            self.score_sum = np.empty((b, nh, 1, 1), dt)
            self.att_nodes = np.empty((b, nh, 1, dh), dt)
        elif compiled:
            self.scores = np.empty((b, nh, w), dt)
        else:
            self.scores = np.empty((nh, w, b), dt)
            self.score_max = np.empty((nh, 1, b), dt)
            self.score_sum = np.empty((nh, 1, b), dt)
        self.trunk = with_ones(hd)  # [GELU(trunk); 1] → heads
        self.positive = np.empty((hd, b), bool)
        self.out = np.empty((blocks, cfg.n_targets * len(cfg.quantiles) + 1, b), dt)  # every block's heads


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 + 0.5 * np.tanh(0.5 * x)  # no overflow for large |x|, unlike 1 / (1 + exp(-x))
    return out


def _recip_1p_exp_(x: np.ndarray) -> None:
    """``x ← 1 / (1 + exp(x))`` in place: the logistic function of ``-x`` (exp overflowing to inf gives 0:
    call it under ``np.errstate(over="ignore")``)."""
    np.exp(x, out=x)
    x += 1.0
    np.reciprocal(x, out=x)


# erfc(a) = t · exp(-a² + P(t)), t = 1 / (1 + a/2), a >= 0: the Chebyshev-fitted formula of Numerical Recipes
# (``erfcc``; fractional error < 1.2e-7 everywhere); P's coefficients from the highest power down.
_ERFC_POLY = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223)  # fmt: skip


def _gelu(x: np.ndarray, out: np.ndarray, work: tuple[np.ndarray, ...], positive: np.ndarray) -> None:
    """Exact GELU, ``out ← x Φ(x) = x/2 · erfc(-x/√2)``, as ``torch.nn.GELU()``, in ``x``'s dtype (numpy has no
    erf, and scipy is not on the controller's path); ``x`` is overwritten. In float32 its absolute error is
    torch's own (3.8e-7 against a float64 reference over [-12, 12]); in float64 it is 1.4e-8 there.
    ``work``: two arrays like ``x``; ``positive``: a bool one."""
    a, t = work[0], work[1]
    np.abs(x, out=a)
    a *= 1.0 / math.sqrt(2.0)  # |u|, u = -x/√2
    np.multiply(a, 0.5, out=t)
    t += 1.0
    np.reciprocal(t, out=t)
    out.fill(_ERFC_POLY[0])
    for coef in _ERFC_POLY[1:]:
        out *= t
        out += coef
    a *= a
    out -= a
    np.exp(out, out=out)
    out *= t  # erfc(|u|)
    out *= x
    out *= 0.5  # x/2 · erfc(|u|): GELU where u >= 0, i.e. x <= 0
    np.greater(x, 0.0, out=positive)
    np.subtract(x, out, out=out, where=positive)  # x/2 · (2 - erfc(|u|)) where x > 0


def _softplus(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.softplus`` (beta 1, threshold 20: linear above it)."""
    out: np.ndarray = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    return out


# Nodes per block (above DEFAULT_SMALL_N): one block's work arrays (~5.3 KB a node at the default size: gates,
# scores, GELU temporaries) stay in the last-level cache while the rings stream through it, instead of ~53 MB
# at 10,000 nodes. Up to DEFAULT_SMALL_N nodes the node-major rings' stacked products beat numpy's einsum,
# whose inner loops run over the nodes. Both measured in docs/BENCHMARKS.md (s10n).
DEFAULT_BLOCK = 1024
DEFAULT_SMALL_N = 64


class NumpyNet:
    """``LstmAttentionNet``'s streaming step in numpy, from its ``state_dict`` weights (float32 by default).

    ``dtype=np.float64`` computes in double precision from the same float32 weights. The step is feature-major
    in blocks of nodes (:class:`RingState`, :meth:`layout`): per tick and block, one matrix product per LSTM
    layer, one for q/k/v, the trunk (``o_proj`` folded in) and the heads each, element-wise stages in place,
    and the attention as two contractions over the ring. ``block``: nodes per block (above ``small_n``);
    ``small_n``: up to this many nodes, one block with node-major rings. ``kernel``: ``"numba"`` runs the
    element-wise stages and the attention as compiled one-pass kernels (:mod:`forecaster.kernels`, node-major
    rings in every block; the products stay in BLAS), ``"numpy"`` the pure-numpy step, ``"auto"`` (default)
    the compiled kernels above ``small_n`` nodes only, where they pay (numba and LLVM add ~115 MB of RSS, and
    below 64 nodes the step is under a millisecond either way), falling back to numpy when numba does not
    import; ``PDSCALE_NUMBA=0`` makes it ``"numpy"`` (:func:`resolve_kernel`). The kernels are compiled, or
    loaded from numba's disk cache, when the net is built (``"numba"``) or when it first makes a state above
    ``small_n`` nodes (``"auto"``): 0.6 s with the cache, ~2 s without (docs/BENCHMARKS.md, s11n).
    """

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        config: NetConfig,
        *,
        dtype: type[np.floating[Any]] = np.float32,
        block: int = DEFAULT_BLOCK,
        small_n: int = DEFAULT_SMALL_N,
        kernel: str = "auto",
    ) -> None:
        self.kernel = resolve_kernel(kernel)
        if block < 1 or small_n < 0:
            raise ValueError(f"NumpyNet: block must be >= 1 and small_n >= 0, got {block} and {small_n}")
        self.block, self.small_n = block, small_n
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

        def affine(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:  # [out, in + 1]: bias last
            return np.ascontiguousarray(np.concatenate([weight, bias[:, None]], axis=1))

        # Each LSTM layer as one product [W_ih, W_hh, b_ih + b_hh] @ [x; h; 1], its rows reordered from PyTorch's
        # gates (i, f, g, o) to (i, f, o, g), the logistic gates negated and g's rows times -2 (both exact), so
        # one pass of 1 / (1 + exp(·)) gives σ(i), σ(f), σ(o) and σ(2g), and tanh(g) = 2σ(2g) - 1.
        order = np.r_[0 : 2 * hd, 3 * hd : 4 * hd, 2 * hd : 3 * hd]
        sign = np.where(np.arange(4 * hd) < 3 * hd, -1.0, -2.0).astype(self.dtype)[:, None]
        self._lstm_w = [
            sign
            * affine(
                np.concatenate([w(f"lstm.weight_ih_l{i}"), w(f"lstm.weight_hh_l{i}")], 1),
                w(f"lstm.bias_ih_l{i}") + w(f"lstm.bias_hh_l{i}"),
            )[order]
            for i in range(config.layers)
        ]
        # q, k and v as one product; q's rows carry the attention's 1/√head_dim
        q_scale = self.dtype.type(1.0 / math.sqrt(self.head_dim))
        self._qkv = affine(
            np.concatenate([w("q_proj.weight") * q_scale, w("k_proj.weight"), w("v_proj.weight")]),
            np.concatenate([w("q_proj.bias") * q_scale, w("k_proj.bias"), w("v_proj.bias")]),
        )
        # the trunk on [attention; o; 1] with o_proj folded in (products in float64, then rounded):
        # W_t [o; W_o a + b_o] + b_t = [W_t,2 W_o, W_t,1, W_t,2 b_o + b_t] @ [a; o; 1]
        wt, bt, wo, bo = (
            np.asarray(weights[k], np.float64)
            for k in ("trunk.0.weight", "trunk.0.bias", "o_proj.weight", "o_proj.bias")
        )
        self._trunk = affine(
            np.concatenate([wt[:, hd:] @ wo, wt[:, :hd]], axis=1).astype(self.dtype),
            (wt[:, hd:] @ bo + bt).astype(self.dtype),
        )
        # the quantile and burst heads as one product: the last row is the burst logit
        self._out = affine(
            np.concatenate([w("quantile_head.weight"), w("burst_head.weight")]),
            np.concatenate([w("quantile_head.bias"), w("burst_head.bias")]),
        )
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
        self._kernels: Any = None
        self._erfc_poly = np.asarray(_ERFC_POLY, dtype=self.dtype)
        if self.kernel == "numba":
            self._load_kernels()
        logger.info(
            "forecaster step: %s (%s)",
            self.kernel,
            {
                "numba": "compiled kernels, forecaster/kernels.py",
                "numpy": "pure numpy",
                "auto": f"compiled kernels above {small_n} nodes if numba imports, pure numpy up to it",
            }[self.kernel],
        )

    def _load_kernels(self) -> bool:
        """Import :mod:`forecaster.kernels` and compile them (or load numba's disk cache); False (and the pure
        numpy step from now on) when ``kernel="auto"`` and numba does not import."""
        if self._kernels is not None:
            return True
        t0 = time.perf_counter()
        try:
            kernels = importlib.import_module("forecaster.kernels")
        except ImportError as exc:
            if self.kernel == "numba":
                raise
            logger.warning("numba does not import (%s): the forecaster runs its pure-numpy step", exc)
            self.kernel = "numpy"
            return False
        kernels.warm_up(self.dtype)
        self._kernels = kernels
        logger.info("forecaster step: numba kernels ready in %.2f s", time.perf_counter() - t0)
        return True

    def compiled_for(self, n: int) -> bool:
        """Whether a state of ``n`` nodes is stepped by the compiled kernels (``"auto"``: loads them the first
        time it says yes)."""
        if self.kernel == "numpy" or (self.kernel == "auto" and n <= self.small_n):
            return False
        return self._load_kernels()

    def layout(self, n: int) -> tuple[int, int, bool]:
        """How ``n`` nodes are stepped: ``(blocks, block, small)``. Up to ``small_n`` nodes, one block with the
        node-major rings (stacked products: numpy's einsum runs its inner loops over the nodes, slow when
        they are few); above, ``ceil(n / block)`` blocks of equal size (the last padded), so one block's
        work arrays stay in the core's cache while the rings stream through it. The compiled kernels
        (:meth:`compiled_for`) keep node-major rings in every block (``small`` is then always true)."""
        if n <= self.small_n:
            return 1, n, True
        blocks = -(-n // self.block)
        return blocks, -(-n // blocks), self.compiled_for(n)

    def new_state(self, n: int) -> RingState:
        cfg, dt = self.config, self.dtype
        nh, dh, w = self.heads, self.head_dim, cfg.window
        blocks, b, small = self.layout(n)
        compiled = self.compiled_for(n)
        count = np.full(blocks * b, w, np.int64)  # padding columns: as if full, never masked
        count[:n] = 0
        return RingState(
            h=np.zeros((blocks, cfg.layers, cfg.hidden, b), dt),
            c=np.zeros((blocks, cfg.layers, cfg.hidden, b), dt),
            k=np.zeros((n, nh, dh, w) if small else (blocks, nh, w, dh, b), dt),
            v=np.zeros((n, nh, w, dh) if small else (blocks, nh, dh, w, b), dt),
            count=count,
            base=np.zeros((n, 2 * cfg.n_targets if self.n_baselines else 0, self.n_baselines), dt),
            small=small,
            scratch=_Scratch(self, b, blocks, small, compiled),
            compiled=compiled,
        )

    def step(self, state: RingState, z: np.ndarray, tick: int) -> tuple[np.ndarray, np.ndarray]:
        """One step for every node: encoded inputs ``z [N, n_inputs]``, written to ring slot ``tick % window``
        (``state`` is updated in place) → normalised quantiles ``[N, K, Q]`` and burst logits ``[N]``."""
        with np.errstate(over="ignore"):  # a logistic gate's exp overflowing to inf is its limit 0
            return self._step(state, z, tick)

    def _step(self, state: RingState, z: np.ndarray, tick: int) -> tuple[np.ndarray, np.ndarray]:
        s, hd, n, b = state.scratch, self.config.hidden, z.shape[0], state.block
        state.count += 1
        for blk in range(s.out.shape[0]):
            lo = blk * b
            m = min(b, n - lo)  # the last block's padding columns keep the previous block's (finite) values
            s.lstm_in[0][: self.config.n_inputs, :m] = z[lo : lo + m].T
            self._lstm(state, blk)
            if state.compiled:
                self._attend_compiled(state, lo, m, tick)
            elif state.small:
                self._attend_small(state, tick)
            else:
                self._attend(state, blk, tick)
            trunk_pre = s.work[2]
            np.matmul(self._trunk, s.trunk_in, out=trunk_pre)
            if state.compiled:  # the same formula: two one-pass kernels around numpy's SIMD exp
                gelu_out = s.trunk[:hd]
                self._kernels.gelu_exponent(trunk_pre, self._erfc_poly, gelu_out, s.work[1])
                np.exp(gelu_out, out=gelu_out)
                self._kernels.gelu_finish(trunk_pre, gelu_out, s.work[1])
            else:
                _gelu(trunk_pre, s.trunk[:hd], s.work, s.positive)
            np.matmul(self._out, s.trunk, out=s.out[blk])
        k, nq = self.n_targets, self.n_quantiles
        out = s.out[0] if s.out.shape[0] == 1 else s.out.transpose(1, 0, 2).reshape(k * nq + 1, -1)
        raw = out[: k * nq, :n].reshape(k, nq, n).transpose(2, 0, 1).copy()  # [N, K, Q]
        if self.n_baselines:
            raw[..., 0] += self._baseline_offset(state, x=np.asarray(z, dtype=self.dtype))
        if nq > 1:
            raw[..., 1:] = raw[..., :1] + np.cumsum(_softplus(raw[..., 1:]), axis=-1)
        return raw, out[-1, :n].copy()

    def _lstm(self, state: RingState, blk: int) -> None:
        """The stacked LSTM's step for block ``blk`` (its inputs in ``scratch.lstm_in[0]``) → ``scratch.top``."""
        s, hd = state.scratch, self.config.hidden
        h, c = state.h[blk], state.c[blk]
        for layer, weight in enumerate(self._lstm_w):
            x_h = s.lstm_in[layer]
            x_h[-1 - hd : -1] = h[layer]
            np.matmul(weight, x_h, out=s.gates)  # [-i, -f, -o, -2g]
            nxt = s.lstm_in[layer + 1] if layer + 1 < len(self._lstm_w) else s.top
            if state.compiled:  # numpy's SIMD exp and tanh, the cell's arithmetic in one pass
                np.exp(s.gates, out=s.gates)
                self._kernels.lstm_cell(s.gates, c[layer], hd)
                np.tanh(c[layer], out=s.work[0])
                np.multiply(s.gates[2 * hd : 3 * hd], s.work[0], out=nxt[:hd])
                h[layer] = nxt[:hd]
                continue
            _recip_1p_exp_(s.gates)  # σ(i), σ(f), σ(o), σ(2g): one pass for all four
            i_g, f_g, o_g, g = (s.gates[j * hd : (j + 1) * hd] for j in range(4))
            g *= 2.0
            g -= 1.0  # tanh(g) = 2σ(2g) - 1
            g *= i_g
            c_l = c[layer]
            c_l *= f_g
            c_l += g
            tanh_c = s.work[0]
            np.tanh(c_l, out=tanh_c)
            np.multiply(o_g, tanh_c, out=nxt[:hd])
            h[layer] = nxt[:hd]

    def _attend(self, state: RingState, blk: int, tick: int) -> None:
        """q, k, v of the top layer's output (``scratch.top``); k, v into ring slot ``tick % window`` of block
        ``blk``; softmax attention of q over the ring → ``scratch.att`` (before ``o_proj``)."""
        s, hd, w = state.scratch, self.config.hidden, self.config.window
        nh, dh, b = self.heads, self.head_dim, state.block
        np.matmul(self._qkv, s.top, out=s.qkv)
        slot = tick % w
        keys, values = state.k[blk], state.v[blk]
        keys[:, slot] = s.qkv[hd : 2 * hd].reshape(nh, dh, b)
        values[:, :, slot] = s.qkv[2 * hd :].reshape(nh, dh, b)
        scores = s.scores
        np.einsum("hdn,htdn->htn", s.qkv[:hd].reshape(nh, dh, b), keys, out=scores)
        count = state.count[blk * b : (blk + 1) * b]
        if int(count.min()) < w:  # some node has not filled its ring yet
            age = (slot - np.arange(w)) % w  # 0 = written now, w-1 = oldest
            np.copyto(scores, -np.inf, where=age[:, None] >= count[None, :])
        np.max(scores, axis=1, keepdims=True, out=s.score_max)
        scores -= s.score_max
        np.exp(scores, out=scores)
        np.sum(scores, axis=1, keepdims=True, out=s.score_sum)
        att = s.att.reshape(nh, dh, b)
        np.einsum("htn,hdtn->hdn", scores, values, out=att)
        att /= s.score_sum

    def _attend_compiled(self, state: RingState, lo: int, m: int, tick: int) -> None:
        """:meth:`_attend` with the compiled kernels over the node-major rings of nodes ``lo .. lo+m-1``: the
        ring write, the masked scores in one pass over each node's keys, numpy's (SIMD) ``exp``, then the
        weighted sum in one pass over its values."""
        s = state.scratch
        np.matmul(self._qkv, s.top, out=s.qkv)
        slot = tick % self.config.window
        self._kernels.ring_write(s.qkv, state.k, state.v, lo, m, slot)
        self._kernels.ring_scores(s.qkv, state.k, state.count, lo, m, slot, s.scores)
        np.exp(s.scores[:m], out=s.scores[:m])
        self._kernels.ring_weighted_sum(s.scores, state.v, lo, m, s.att)

    def _attend_small(self, state: RingState, tick: int) -> None:
        """:meth:`_attend` for the node-major rings (one block): the contractions as stacked products."""
        s, hd, w = state.scratch, self.config.hidden, self.config.window
        nh, dh, n = self.heads, self.head_dim, state.block
        np.matmul(self._qkv, s.top, out=s.qkv)
        qkv = s.qkv.reshape(3, nh, dh, n).transpose(0, 3, 1, 2)  # [q/k/v, N, heads, head_dim]
        slot = tick % w
        state.k[..., slot] = qkv[1]
        state.v[:, :, slot] = qkv[2]
        s.q[:, :, 0] = qkv[0]
        scores = s.scores
        np.matmul(s.q, state.k, out=scores)  # [N, heads, 1, window]
        if n and int(state.count.min()) < w:
            age = (slot - np.arange(w)) % w
            np.copyto(scores, -np.inf, where=age >= state.count[:, None, None, None])
        np.max(scores, axis=-1, keepdims=True, out=s.score_max)
        scores -= s.score_max
        np.exp(scores, out=scores)
        np.sum(scores, axis=-1, keepdims=True, out=s.score_sum)
        np.matmul(scores, state.v, out=s.att_nodes)  # [N, heads, 1, head_dim]
        s.att_nodes /= s.score_sum
        s.att[...] = s.att_nodes.reshape(n, hd).T

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
        *,
        length_range: LengthRange | None = None,
    ) -> None:
        self.net = net
        super().__init__(net.config, schema, normalizer, horizon_s, model_version, length_range=length_range)

    @classmethod
    def from_data(
        cls, data: CheckpointData, *, dtype: type[np.floating[Any]] = np.float32, kernel: str = "auto"
    ) -> NumpyLearnedForecaster:
        net = NumpyNet(data.weights, data.net_config, dtype=dtype, kernel=kernel)
        return cls(
            net,
            data.schema,
            data.normalizer,
            data.horizon_s,
            data.model_version,
            length_range=length_range_of(data.meta),
        )

    @classmethod
    def load(
        cls,
        path: str | Path,
        expect_schema: FeatureSchema | None = None,
        *,
        dtype: type[np.floating[Any]] = np.float32,
        kernel: str = "auto",
    ) -> NumpyLearnedForecaster:
        """Read a checkpoint (:func:`forecaster.checkpoint.read_checkpoint`: every check, no torch) and wrap it;
        ``kernel``: :class:`NumpyNet`'s."""
        return cls.from_data(read_checkpoint(path, expect_schema), dtype=dtype, kernel=kernel)

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
