"""Honest baselines behind the ``Forecaster`` protocol: last value, EWMA, Holt, seasonal naive, ARIMA.

Every baseline forecasts the next-``horizon_s`` **totals** of arrivals, prompt tokens and generation
tokens per node (from the ``arrival_rps``, ``prompt_tps`` and ``gen_tps`` channels, read as per-second
counts), with p50, p90 and a burst probability, so that each can be scored on every field.

Shared parts (see ``docs/FORECASTER.md``):

- **Point forecast** ``mu``: model specific (below), clamped at 0.
- **Predictive distribution**: negative binomial with mean ``mu`` and variance ``mu * D``, where ``D`` is
  the index of dispersion (variance / mean, floored at 1 = Poisson) of the ``horizon_s``-second sums inside
  the trailing ``trailing_s`` seconds. p50 / p90 are its quantiles. This states the honest assumption
  "the next window is as over-dispersed as the recent ones"; it ignores the model's own error in ``mu``,
  so p90 coverage below 0.9 means the point forecast is off, not just the noise.
- **burst_prob**: the probability under that distribution that the next-``horizon_s`` arrival total exceeds
  ``horizon_s * burst_threshold`` (the threshold of ``forecaster.burst``, from the same trailing window).
- **Warm-up**: no forecast (NaN) until ``trailing_s`` observed seconds exist, and longer where a model
  needs it (seasonal naive: one period; ARIMA: its first fit).
- **Unknown is not zero**: a masked or NaN input holds that node/channel's state and its last forecast.

``step`` (streaming, batched over nodes) and ``predict_series`` (offline, vectorised over a whole series)
compute the same thing; for integer-valued series they agree exactly (tested).

Importing this module imports neither torch nor statsmodels nor scipy (the controller's reactive
fallback uses it); scipy.special loads at the first forecast (scipy.signal for the offline EWMA/Holt
paths and ARIMA), statsmodels at the first ARIMA fit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from forecaster.burst import TIE_RTOL, mean_sigma_from_sums, threshold_from_stats
from forecaster.types import CHANNELS, ForecastBatch

#: The input channels baselines read, in the order of the targets they forecast.
INPUT_CHANNELS: tuple[str, ...] = ("arrival_rps", "prompt_tps", "gen_tps")
_IDX = np.array([CHANNELS.index(c) for c in INPUT_CHANNELS])
_VERSION = "baseline-1"


# ---------------------------------------------------------------------------------------------------
# distribution and window statistics (shared by both paths)


# Count distributions through scipy.special (what scipy.stats' poisson/nbinom do inside, without the
# seconds-long import of scipy.stats and its per-call argument checking).


def _poisson_ppf(q: float, mu: np.ndarray) -> np.ndarray:
    from scipy import special

    vals = np.ceil(special.pdtrik(q, mu))
    below = np.maximum(vals - 1.0, 0.0)
    return np.asarray(np.where(special.pdtr(below, mu) >= q, below, vals), dtype=np.float64)


def _nbinom_ppf(q: float, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    from scipy import special

    vals = np.ceil(special.nbdtrik(q, n, p))
    below = np.maximum(vals - 1.0, 0.0)
    return np.asarray(np.where(special.betainc(n, below + 1.0, p) >= q, below, vals), dtype=np.float64)


def count_quantile(mu: np.ndarray, dispersion: np.ndarray, q: float) -> np.ndarray:
    """``q``-quantile of a negative binomial with mean ``mu`` and variance ``mu * dispersion``.

    ``dispersion <= 1`` means Poisson; ``mu == 0`` gives 0; NaN in either gives NaN.
    """
    mu = np.maximum(np.asarray(mu, dtype=np.float64), 0.0)
    d = np.asarray(dispersion, dtype=np.float64)
    out = np.full(np.broadcast(mu, d).shape, np.nan)
    mu, d = np.broadcast_arrays(mu, d)
    known = ~np.isnan(mu) & ~np.isnan(d)
    zero = known & (mu == 0)
    pois = known & ~zero & (d <= 1.0 + 1e-9)
    nb = known & ~zero & ~pois
    out[zero] = 0.0
    out[pois] = _poisson_ppf(q, mu[pois])
    out[nb] = _nbinom_ppf(q, mu[nb] / (d[nb] - 1.0), 1.0 / d[nb])
    return out


_Z_CACHE: dict[float, float] = {}


def _normal_quantile(q: float) -> float:
    if q not in _Z_CACHE:
        from statistics import NormalDist

        _Z_CACHE[q] = NormalDist().inv_cdf(q)
    return _Z_CACHE[q]


def fast_count_quantiles(
    mu: np.ndarray, dispersion: np.ndarray, qs: Sequence[float] = (0.5, 0.9), exact_below: int = 8
) -> np.ndarray:
    """:func:`count_quantile` at each of ``qs`` in plain numpy, cheap enough to run every tick over many
    nodes: ``[..., len(qs)]`` for ``mu`` and ``dispersion`` broadcast together (NaN in either gives NaN).

    Exact (the CDF summed term by term) where the quantile is below ``exact_below``. Above it, the
    Wilson-Hilferty quantile of the gamma with the same mean and variance (``mu``, ``mu * D``), rounded with
    a continuity correction, and 0 where the negative binomial's mass at zero already reaches ``q``. Its
    expected pinball loss is within ~1 % of the exact quantile's for ``D <= 20`` and within ~4 % up to
    ``D = 10^4`` (token totals; tested). scipy's iterative inversion costs microseconds per value; this
    a small fraction of that.
    ``qs`` in increasing order.
    """
    q_arr = np.asarray(qs, dtype=np.float64)
    if q_arr.ndim != 1 or not np.all((q_arr > 0.0) & (q_arr < 1.0)):
        raise ValueError(f"qs must be quantile levels in (0, 1), got {qs}")
    # NaN propagates through every step below (np.maximum keeps it; comparisons with it are False)
    # D = 1 (Poisson) is taken as 1 + 1e-6: the same quantiles but at exact ties, one formula for both
    d = np.maximum(np.asarray(dispersion, dtype=np.float64), 1.0 + 1e-6)
    log_ratio = np.log(d) / (d - 1.0)
    m, d = np.broadcast_arrays(np.maximum(np.asarray(mu, dtype=np.float64), 0.0), d)
    neg_log_p0 = m * log_ratio  # -log P(N = 0): mu for a Poisson, (mu / (D - 1)) log D for an NB
    c = d / (9.0 * np.maximum(m, 1e-300))  # 1 / (9 k) of the gamma, shape k = mu / D
    sqrt_c, base = np.sqrt(c), 1.0 - c
    out = np.empty((*m.shape, len(q_arr)))
    for j, q in enumerate(q_arr):
        y = np.maximum(base + _normal_quantile(float(q)) * sqrt_c, 0.0)
        out[..., j] = np.ceil(m * (y * y * y) - 0.5) * (neg_log_p0 > -math.log(q))
    flat = out.reshape(-1, len(q_arr))
    small = np.flatnonzero(((m > 0) & (out[..., 0] < 2 * exact_below)).reshape(-1))  # qs[0] is the lowest
    if len(small):
        ms, ds = m.reshape(-1)[small], d.reshape(-1)[small]
        a, b = ms / ds, 1.0 - 1.0 / ds  # pmf(k+1) = pmf(k) (a + k b) / (k + 1), Poisson and NB alike
        pmf = np.exp(-neg_log_p0.reshape(-1)[small])
        cdf = np.zeros(len(small))
        below = np.zeros((len(small), len(q_arr)))  # = the quantile, while it is under exact_below
        for k in range(exact_below):
            cdf += pmf
            below += cdf[:, None] < q_arr[None, :] - 1e-12
            pmf *= (a + k * b) / (k + 1)
        flat[small] = np.where(below < exact_below, below, np.maximum(flat[small], exact_below))
    return np.asarray(flat.reshape(out.shape) + 0.0, dtype=np.float64)  # + 0.0: no negative zeros


def count_exceed_prob(limit: np.ndarray, mu: np.ndarray, dispersion: np.ndarray) -> np.ndarray:
    """``P(N > limit)`` for the distribution of :func:`count_quantile`; NaN where any input is NaN."""
    from scipy import special

    mu = np.maximum(np.asarray(mu, dtype=np.float64), 0.0)
    mu, d, lim = np.broadcast_arrays(mu, np.asarray(dispersion, float), np.asarray(limit, float))
    out = np.full(mu.shape, np.nan)
    known = ~np.isnan(mu) & ~np.isnan(d) & ~np.isnan(lim)
    k = np.floor(np.where(known, lim, 0.0))
    neg = known & (k < 0)
    zero = known & ~neg & (mu == 0)
    pois = known & ~neg & ~zero & (d <= 1.0 + 1e-9)
    nb = known & ~neg & ~zero & ~pois
    out[neg] = 1.0
    out[zero] = 0.0
    out[pois] = special.pdtrc(k[pois], mu[pois])
    n, p = mu[nb] / (d[nb] - 1.0), 1.0 / d[nb]
    out[nb] = special.betaincc(n, k[nb] + 1.0, p)
    return out


def _finish_stats(
    s: np.ndarray, ss: np.ndarray, s5: np.ndarray, ss5: np.ndarray, w: int, h: int
) -> tuple[np.ndarray, np.ndarray]:
    """Burst threshold (req/s) and dispersion of H-sums from window sums; same arithmetic both paths."""
    mean, sigma = mean_sigma_from_sums(s, ss, w)
    n5 = w - h + 1
    m5 = s5 / n5
    v5 = np.maximum(ss5 / n5 - m5 * m5, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        disp = np.where(m5 > 0, v5 / np.where(m5 > 0, m5, 1.0), 1.0)
    return threshold_from_stats(mean, sigma), np.maximum(disp, 1.0)


def _window_stats_offline(y: np.ndarray, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Threshold and dispersion for every prefix end ``i`` (NaN for ``i < w - 1``), by cumulative sums."""
    thr = np.full(len(y), np.nan)
    disp = np.full(len(y), np.nan)
    if len(y) < w:
        return thr, disp
    cs = np.concatenate(([0.0], np.cumsum(y)))
    cs2 = np.concatenate(([0.0], np.cumsum(y * y)))
    s = cs[w:] - cs[:-w]
    ss = cs2[w:] - cs2[:-w]
    hs = cs[h:] - cs[:-h]  # hs[j] = y[j : j+h].sum(), the H-sum ending at j+h-1
    c5 = np.concatenate(([0.0], np.cumsum(hs)))
    c52 = np.concatenate(([0.0], np.cumsum(hs * hs)))
    n5 = w - h + 1
    # window ending at i (i >= w-1) holds H-sums starting at i-w+1 .. i-h+1  -> hs indices [i-w+1, i-h+2)
    s5 = c5[n5:] - c5[:-n5]
    ss5 = c52[n5:] - c52[:-n5]
    thr[w - 1 :], disp[w - 1 :] = _finish_stats(s, ss, s5, ss5, w, h)
    return thr, disp


def _window_stats_stream(last_w: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Threshold and dispersion of rows ``[K, w]`` (the last ``w`` observed values of each series)."""
    w = last_w.shape[1]
    cs = np.concatenate((np.zeros((len(last_w), 1)), np.cumsum(last_w, axis=1)), axis=1)
    hs = cs[:, h:] - cs[:, :-h]
    return _finish_stats(
        last_w.sum(axis=1), (last_w * last_w).sum(axis=1), hs.sum(axis=1), (hs * hs).sum(axis=1), w, h
    )


# ---------------------------------------------------------------------------------------------------
# the shared streaming / offline machinery


class CountBaseline:
    """Base of every baseline: history buffers, masking, distribution, burst probability.

    Subclasses define the point forecast twice, once per path: ``_mean_offline(y)`` over a fully observed
    series and ``_mean_stream(vals, observed)`` from their own per-node state plus ``self._hist``.
    """

    name = "baseline"

    def __init__(self, horizon_s: float = 5.0, trailing_s: int = 60) -> None:
        if horizon_s != int(horizon_s) or horizon_s < 1:
            raise ValueError(f"horizon_s must be a whole number of seconds >= 1, got {horizon_s}")
        if trailing_s < int(horizon_s) + 1:
            raise ValueError(f"trailing_s ({trailing_s}) must exceed horizon_s ({horizon_s})")
        self.horizon_s = float(horizon_s)
        self._h = int(horizon_s)
        self.trailing_s = int(trailing_s)
        self._node_ids: tuple[str, ...] = ()
        self.reset(())

    # -- what subclasses provide ------------------------------------------------------------------
    def _history_len(self) -> int:
        """How many past observed values the streaming path must keep."""
        return self.trailing_s

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define _mean_offline")

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must define _mean_stream")

    def _reset_state(self, n: int) -> None:
        """Reset per-node model state for ``n`` nodes (history buffers are handled here)."""

    # -- streaming --------------------------------------------------------------------------------
    def reset(self, node_ids: Sequence[str]) -> None:
        """Forget all state and track these nodes, in this order."""
        self._node_ids = tuple(node_ids)
        n = len(self._node_ids)
        self._hist = np.zeros((n, len(INPUT_CHANNELS), max(self._history_len(), self.trailing_s)))
        self._n_obs = np.zeros((n, len(INPUT_CHANNELS)), dtype=np.int64)
        self._last = np.full((n, len(INPUT_CHANNELS), 2), np.nan)  # p50, p90 per channel
        self._last_burst = np.full(n, np.nan)
        self._reset_state(n)

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        """Consume one second for every node (``x``, ``mask``: ``[N, len(CHANNELS)]``) and forecast.

        ``now_s`` is accepted for call compatibility with ``LearnedForecaster.step`` and ignored: baselines
        do not use the wall clock.
        """
        x = np.asarray(x, dtype=np.float64)
        mask = np.asarray(mask, dtype=bool)
        n = len(self._node_ids)
        if x.shape != (n, len(CHANNELS)) or mask.shape != x.shape:
            raise ValueError(
                f"{self.name}.step: x and mask must be [{n}, {len(CHANNELS)}] (nodes from reset), "
                f"got {x.shape} and {mask.shape}"
            )
        vals = x[:, _IDX]
        observed = mask[:, _IDX] & np.isfinite(vals)
        if np.any(vals[observed] < 0):
            raise ValueError(f"{self.name}.step: negative counts in {INPUT_CHANNELS}")
        rows = self._hist[observed]
        self._hist[observed] = np.concatenate((rows[:, 1:], vals[observed][:, None]), axis=1)
        self._n_obs += observed
        mu = np.maximum(self._mean_stream(vals, observed), 0.0)
        ready = observed & (self._n_obs >= self.trailing_s) & ~np.isnan(mu)
        if ready.any():
            thr, disp = _window_stats_stream(self._hist[ready][:, -self.trailing_s :], self._h)
            m = mu[ready]
            self._last[ready, 0] = count_quantile(m, disp, 0.5)
            self._last[ready, 1] = count_quantile(m, disp, 0.9)
            is_arrival = np.nonzero(ready)[1] == 0  # rows of thr/disp are (node, channel) in C order
            self._last_burst[ready[:, 0]] = count_exceed_prob(
                self._h * thr[is_arrival] * (1.0 + TIE_RTOL), m[is_arrival], disp[is_arrival]
            )
        # observed but not ready (warm-up): no forecast
        warm = observed & ~ready
        self._last[warm] = np.nan
        self._last_burst[warm[:, 0]] = np.nan
        return ForecastBatch(
            node_ids=self._node_ids,
            horizon_s=self.horizon_s,
            arrivals_p50=self._last[:, 0, 0].copy(),
            arrivals_p90=self._last[:, 0, 1].copy(),
            prompt_tokens_p50=self._last[:, 1, 0].copy(),
            prompt_tokens_p90=self._last[:, 1, 1].copy(),
            gen_tokens_p50=self._last[:, 2, 0].copy(),
            gen_tokens_p90=self._last[:, 2, 1].copy(),
            burst_prob=self._last_burst.copy(),
            model_version=f"{_VERSION}:{self.name}",
        )

    # -- offline ----------------------------------------------------------------------------------
    def predict_mean_series(self, series: np.ndarray) -> np.ndarray:
        """Point forecast ``mu[t]`` of ``series[t+1 : t+H+1].sum()`` issued after ``series[t]``; NaN = none."""
        y, pos = self._compress(series)
        mu = np.maximum(self._mean_offline(y), 0.0)
        return self._expand(mu, pos, len(series))

    def predict_series(self, series: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(p50, p90, burst_prob)``, each ``[T]``: what ``step`` would return after ``series[t]``.

        ``series`` is one node's per-second counts (NaN or inf = unknown: state and forecast are held).
        ``burst_prob`` treats the series as arrivals (it is meaningful for the arrival channel).
        """
        y, pos = self._compress(series)
        mu = np.maximum(self._mean_offline(y), 0.0)
        thr, disp = _window_stats_offline(y, self.trailing_s, self._h)
        p50 = count_quantile(mu, disp, 0.5)
        p90 = count_quantile(mu, disp, 0.9)
        burst = count_exceed_prob(self._h * thr * (1.0 + TIE_RTOL), mu, disp)
        t = len(series)
        return self._expand(p50, pos, t), self._expand(p90, pos, t), self._expand(burst, pos, t)

    @staticmethod
    def _compress(series: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(series, dtype=np.float64)
        if x.ndim != 1:
            raise ValueError(f"predict_series takes one series [T], got shape {x.shape}")
        known = np.isfinite(x)
        if np.any(x[known] < 0):
            raise ValueError("predict_series: negative counts")
        # pos[t] = index into the compressed series of the last observed value at or before t (-1: none)
        pos = np.cumsum(known) - 1
        return x[known], pos

    @staticmethod
    def _expand(values: np.ndarray, pos: np.ndarray, t: int) -> np.ndarray:
        out = np.full(t, np.nan)
        have = pos >= 0
        out[have] = values[pos[have]]
        return out


# ---------------------------------------------------------------------------------------------------
# the models


class LastValue(CountBaseline):
    """The last ``horizon_s`` seconds repeat: ``mu = sum of the last H observed per-second counts``."""

    name = "last_value"

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        h = self._h
        out = np.full(len(y), np.nan)
        if len(y) >= h:
            cs = np.concatenate(([0.0], np.cumsum(y)))
            out[h - 1 :] = cs[h:] - cs[:-h]
        return out

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        return np.where(self._n_obs >= self._h, self._hist[:, :, -self._h :].sum(axis=2), np.nan)


def ewma_step(rate: np.ndarray, vals: np.ndarray, observed: np.ndarray, alpha: float) -> None:
    """One EWMA step in place: ``rate = alpha*y + (1-alpha)*rate`` where ``observed``, starting at the first
    observed value (NaN = not started); unobserved entries keep their state. Shared by :class:`EWMA` and
    ``forecaster.combination``'s EWMA expert."""
    fresh = observed & np.isnan(rate)
    rate[fresh] = vals[fresh]
    upd = observed & ~fresh
    rate[upd] = alpha * vals[upd] + (1.0 - alpha) * rate[upd]


def holt_step(
    level: np.ndarray, trend: np.ndarray, vals: np.ndarray, observed: np.ndarray, alpha: float, beta: float
) -> None:
    """One Holt step in place where ``observed`` (level NaN = not started: ``l = y``, ``b`` stays 0):
    ``l = a*y + (1-a)(l + b)``, ``b = beta(l - l_prev) + (1-beta) b``. Shared by :class:`Holt` and
    ``forecaster.combination``'s Holt expert."""
    fresh = observed & np.isnan(level)
    level[fresh] = vals[fresh]
    upd = observed & ~fresh
    prev = level[upd]
    lvl = alpha * vals[upd] + (1 - alpha) * (prev + trend[upd])
    trend[upd] = beta * (lvl - prev) + (1 - beta) * trend[upd]
    level[upd] = lvl


def _alpha_from_halflife(halflife_s: float) -> float:
    if not halflife_s > 0:
        raise ValueError(f"halflife_s must be > 0, got {halflife_s}")
    return float(1.0 - 2.0 ** (-1.0 / halflife_s))


class EWMA(CountBaseline):
    """Exponentially weighted mean rate: ``r = a*y + (1-a)*r``, ``a = 1 - 2**(-1/halflife_s)``; ``mu = H*r``.

    Starts at the first observed value.
    """

    name = "ewma"

    def __init__(self, horizon_s: float = 5.0, trailing_s: int = 60, halflife_s: float = 10.0) -> None:
        self.halflife_s = float(halflife_s)
        self._alpha = _alpha_from_halflife(halflife_s)
        super().__init__(horizon_s, trailing_s)

    def _reset_state(self, n: int) -> None:
        self._rate = np.full((n, len(INPUT_CHANNELS)), np.nan)

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        from scipy.signal import lfilter

        if len(y) == 0:
            return np.zeros(0)
        a = self._alpha
        r = lfilter([a], [1.0, -(1.0 - a)], y, zi=[(1.0 - a) * y[0]])[0]
        return np.asarray(self._h * r, dtype=np.float64)

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        ewma_step(self._rate, vals, observed, self._alpha)
        return self._h * self._rate


class Holt(CountBaseline):
    """Holt's local linear trend on per-second counts (level ``alpha``, trend ``beta``).

    ``l = a*y + (1-a)(l + b)``; ``b = beta(l - l_prev) + (1-beta) b``; starts at ``l = y_0, b = 0``.
    ``mu = H*l + b*H(H+1)/2`` (the sum of the next H one-step-ahead points), clamped at 0.
    """

    name = "holt"

    def __init__(
        self, horizon_s: float = 5.0, trailing_s: int = 60, alpha: float = 0.2, beta: float = 0.05
    ) -> None:
        if not (0 < alpha <= 1 and 0 <= beta <= 1):
            raise ValueError(f"Holt needs 0 < alpha <= 1 and 0 <= beta <= 1, got {alpha}, {beta}")
        self.alpha, self.beta = float(alpha), float(beta)
        super().__init__(horizon_s, trailing_s)

    def _reset_state(self, n: int) -> None:
        self._level = np.full((n, len(INPUT_CHANNELS)), np.nan)
        self._trend = np.zeros((n, len(INPUT_CHANNELS)))

    def _total(self, level: np.ndarray, trend: np.ndarray) -> np.ndarray:
        h = self._h
        return np.asarray(h * level + trend * (h * (h + 1) / 2.0), dtype=np.float64)

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        from scipy.signal import lfilter, ss2tf

        if len(y) == 0:
            return np.zeros(0)
        a, b = self.alpha, self.beta
        # state s_t = [l_t, b_t] = A s_{t-1} + B u_t on deviations u = y - y_0 (zero initial state)
        A = np.array([[1 - a, 1 - a], [-a * b, 1 - a * b]])
        B = np.array([[a], [a * b]])
        num, den = ss2tf(A, B, A, B)
        u = y - y[0]
        level = lfilter(num[0], den, u) + y[0]
        trend = lfilter(num[1], den, u)
        return self._total(level, trend)

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        holt_step(self._level, self._trend, vals, observed, self.alpha, self.beta)
        return self._total(self._level, self._trend)


class SeasonalNaive(CountBaseline):
    """The same window one period ago: ``mu = sum(y[t+1-P : t+H+1-P])`` (needs ``period_s >= horizon_s``).

    No forecast until one period has been observed. Use ``period_s=60`` for minute-scale cycles, or
    ``86400`` (daily) for traces of several days.
    """

    name = "seasonal_naive"

    def __init__(self, horizon_s: float = 5.0, trailing_s: int = 60, period_s: int = 60) -> None:
        if period_s < horizon_s:
            raise ValueError(f"period_s ({period_s}) must be >= horizon_s ({horizon_s})")
        self.period_s = int(period_s)
        super().__init__(horizon_s, trailing_s)

    def _history_len(self) -> int:
        return self.period_s

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        p, h = self.period_s, self._h
        out = np.full(len(y), np.nan)
        if len(y) >= p:
            cs = np.concatenate(([0.0], np.cumsum(y)))
            i = np.arange(p - 1, len(y))
            out[p - 1 :] = cs[i + 1 - p + h] - cs[i + 1 - p]
        return out

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        p, h = self.period_s, self._h
        window = self._hist[:, :, -p : -p + h] if p > h else self._hist[:, :, -p:]
        return np.where(self._n_obs >= p, window.sum(axis=2), np.nan)


@dataclass(frozen=True)
class ArmaParams:
    """A fitted ARMA(p, q) around a mean, as statsmodels reports it (``phi``: AR, ``theta``: MA)."""

    mean: float
    phi: tuple[float, ...]
    theta: tuple[float, ...]


def fit_arma(y: np.ndarray, order: tuple[int, int]) -> ArmaParams:
    """Fit ARMA(p, q) with a constant by maximum likelihood (statsmodels' ARIMA, innovations MLE).

    A flat window, or a fit that fails, gives the mean-only model (``phi = theta = 0``): honest, and it
    keeps a long replay going.
    """
    p, q = order
    mean = float(np.mean(y)) if len(y) else 0.0
    if len(y) < 2 * (p + q) + 10 or np.ptp(y) == 0:
        return ArmaParams(mean, (0.0,) * p, (0.0,) * q)
    from statsmodels.tsa.arima.model import ARIMA  # lazy: heavy

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ARIMA(np.asarray(y, dtype=np.float64), order=(p, 0, q), trend="c")
            res = model.fit(method="innovations_mle")
        params = np.asarray(res.params, dtype=np.float64)
        phi = tuple(float(v) for v in np.asarray(res.arparams)) if p else ()
        theta = tuple(float(v) for v in np.asarray(res.maparams)) if q else ()
        if not np.all(np.isfinite(params)):
            raise ValueError("non-finite parameters")
        return ArmaParams(float(params[0]), phi, theta)
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
        return ArmaParams(mean, (0.0,) * p, (0.0,) * q)


def arma_forecast_totals(windows: np.ndarray, params: ArmaParams, horizon_s: int) -> np.ndarray:
    """Sum of the next ``horizon_s`` ARMA point forecasts after each row of ``windows`` ``[S, L]``.

    Innovations are rebuilt over the window from zero (a truncation that forgets after ~L steps).
    """
    from scipy.signal import lfilter

    z = windows - params.mean
    ar_poly = np.concatenate(([1.0], -np.asarray(params.phi)))
    ma_poly = np.concatenate(([1.0], np.asarray(params.theta)))
    e = lfilter(ar_poly, ma_poly, z, axis=1)
    p, q = len(params.phi), len(params.theta)
    zs = [z[:, -k] for k in range(1, p + 1)]  # zs[0] = most recent
    es = [e[:, -k] for k in range(1, q + 1)]
    total = np.zeros(len(windows))
    for _ in range(horizon_s):  # H steps, each vectorised over the rows
        nxt = np.zeros(len(windows))
        for k, ph in enumerate(params.phi):
            nxt = nxt + ph * zs[k]
        for j, th in enumerate(params.theta):
            nxt = nxt + th * es[j]
        total = total + nxt
        zs = [nxt, *zs[:-1]] if p else zs
        es = [np.zeros(len(windows)), *es[:-1]] if q else es
    return np.asarray(total + horizon_s * params.mean, dtype=np.float64)


class Arima(CountBaseline):
    """ARMA(p, q) with a constant on per-second counts, refit periodically on a trailing window.

    Refit every ``refit_every_s`` observed seconds on the last ``window_s`` (statsmodels, lazily imported);
    the first fit happens once ``min_fit_s`` seconds are observed, with no forecast before it. Between
    fits the parameters are fixed and forecasts come from the last ``innov_s`` values (innovations
    rebuilt from zero over them), so one step costs microseconds and the fits dominate.
    """

    name = "arima"

    def __init__(
        self,
        horizon_s: float = 5.0,
        trailing_s: int = 60,
        order: tuple[int, int] = (2, 1),
        window_s: int = 600,
        refit_every_s: int = 300,
        min_fit_s: int = 120,
        innov_s: int = 60,
    ) -> None:
        if not (innov_s <= min_fit_s <= window_s) or refit_every_s < 1:
            raise ValueError(
                "Arima needs innov_s <= min_fit_s <= window_s and refit_every_s >= 1, got "
                f"innov_s={innov_s}, min_fit_s={min_fit_s}, window_s={window_s}, refit_every_s={refit_every_s}"
            )
        self.order = (int(order[0]), int(order[1]))
        self.window_s, self.refit_every_s = int(window_s), int(refit_every_s)
        self.min_fit_s, self.innov_s = int(min_fit_s), int(innov_s)
        super().__init__(horizon_s, trailing_s)

    def _history_len(self) -> int:
        return self.window_s

    def _reset_state(self, n: int) -> None:
        self._params: list[list[ArmaParams | None]] = [[None] * len(INPUT_CHANNELS) for _ in range(n)]

    def _is_fit_point(self, n_obs: int) -> bool:
        return n_obs >= self.min_fit_s and (n_obs - self.min_fit_s) % self.refit_every_s == 0

    def _mean_offline(self, y: np.ndarray) -> np.ndarray:
        from numpy.lib.stride_tricks import sliding_window_view

        out = np.full(len(y), np.nan)
        fit_ends = range(self.min_fit_s, len(y) + 1, self.refit_every_s)  # n_obs at each fit
        for f in fit_ends:
            params = fit_arma(y[max(0, f - self.window_s) : f], self.order)
            lo, hi = f - 1, min(f - 1 + self.refit_every_s, len(y))  # prefix ends i in [lo, hi)
            wins = sliding_window_view(y[lo - self.innov_s + 1 : hi], self.innov_s)
            out[lo:hi] = arma_forecast_totals(np.ascontiguousarray(wins), params, self._h)
        return out

    def _mean_stream(self, vals: np.ndarray, observed: np.ndarray) -> np.ndarray:
        out = np.full(observed.shape, np.nan)
        for i, c in zip(*np.nonzero(observed), strict=True):
            n = int(self._n_obs[i, c])
            if self._is_fit_point(n):
                k = min(n, self.window_s)
                self._params[i][c] = fit_arma(self._hist[i, c, -k:], self.order)
            params = self._params[i][c]
            if params is not None:
                win = self._hist[i, c, -self.innov_s :][None, :]
                out[i, c] = arma_forecast_totals(win, params, self._h)[0]
        return out


def make_baselines(
    horizon_s: float = 5.0, trailing_s: int = 60, period_s: int = 60, with_arima: bool = True
) -> list[CountBaseline]:
    """The standard set, in report order: last value, EWMA, Holt, seasonal naive, ARIMA."""
    models: list[CountBaseline] = [
        LastValue(horizon_s, trailing_s),
        EWMA(horizon_s, trailing_s),
        Holt(horizon_s, trailing_s),
        SeasonalNaive(horizon_s, trailing_s, period_s=period_s),
    ]
    if with_arima:
        models.append(Arima(horizon_s, trailing_s))
    return models


def default_period_s(duration_s: float) -> int:
    """Daily seasonality when at least two days are available, else one minute."""
    return 86400 if duration_s >= 2 * 86400 else 60


__all__ = [
    "EWMA",
    "INPUT_CHANNELS",
    "Arima",
    "ArmaParams",
    "CountBaseline",
    "Holt",
    "LastValue",
    "SeasonalNaive",
    "arma_forecast_totals",
    "count_exceed_prob",
    "count_quantile",
    "default_period_s",
    "fit_arma",
    "make_baselines",
]
