"""A low-count test for a rising arrival rate, and a projection that bends with the rise (opt-in stage 1b).

``stages.trend_factor`` fits a straight line to the per-tick rate and calls a window a ramp only when a
single step does not explain it better. At 1-3 req/s the start of a convex rise (a diurnal wave or a
sinusoid leaving its trough) is flat, then up: a step explains it better than a line, so the line test
waits until the rise is straight enough (~70-90 s into the 1 <-> 24 req/s sinusoid). Here each window is a
Poisson log-linear model of the counts, ``count(t) ~ Poisson(exp(a + g (t - t_mean)) * dt)``:

* the evidence of a rise is the signed root of the likelihood-ratio statistic against a constant rate,
  ``z = sign(g) sqrt((D_const - D_exp) / phi)`` (``D``: Poisson deviances; ``phi`` >= 1: the dispersion
  the residuals show beyond Poisson, so bursty traffic needs more evidence), first screened by the
  closed-form score test (the same statistic to first order, no iterations) so that most ticks fit nothing;
* a step (two constant rates, split anywhere) is preferred when its deviance is lower than the exponential's
  by more than ``RISE_STEP_MARGIN`` × ``phi`` (one parameter more, AIC's price): a burst's onset or a level
  change is still not a ramp, but a convex rise, which the exponential follows, is;
* the projection is the fitted growth ``exp(g × lead)``, never above ``MAX_RISE_FACTOR`` (a bounded growth
  model: the exponential is right only at the start of a rise, so it is capped as the line projection is);
* as in ``trend_factor``, the rise must also read ``RISE_CONFIRM_S`` seconds earlier (at
  ``RISE_CONFIRM_Z``), and the smallest of the projections is taken.

Pure functions: no clock, no I/O. ``decide`` consults it only with ``PolicyConfig.trend_test='poisson'``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.policy.stages import TREND_MIN_COVERAGE, TREND_MIN_SAMPLES, _ordered, _rate_arrays

# trailing windows, shortest first (the longest plus its confirmation fits stages.RATE_HISTORY_S)
RISE_WINDOWS_S = (30.0, 45.0, 60.0, 90.0, 120.0)
RISE_MIN_Z = 3.0  # likelihood-ratio evidence of a rise, in standard errors
RISE_STEP_MARGIN = 2.0  # a step is preferred when its deviance is lower by this many dispersions
RISE_CONFIRM_S = (5.0, 10.0)  # the rise must also read this long ago
RISE_CONFIRM_Z = 2.0  # there at this many standard errors
MAX_RISE_FACTOR = 4.0  # the projection's cap (as stages.MAX_TREND_FACTOR)
_NEWTON_STEPS = 25
_NEWTON_TOL = 1e-9


@dataclass(frozen=True)
class RiseFit:
    """One window's Poisson log-linear fit (``rise_fit``)."""

    window_s: float
    growth: float  # g: relative growth of the rate, per second
    z: float  # signed root of the likelihood-ratio statistic against a constant rate, dispersion-corrected
    level: float  # the fitted rate at now, req/s
    dispersion: float  # phi >= 1
    step_fits_better: bool  # a single level change explains the window better (by RISE_STEP_MARGIN)

    def factor(self, lead_s: float, cap: float = MAX_RISE_FACTOR) -> float:
        """The projected load ``lead_s`` from now over the load now, in [1, ``cap``] (1 for a falling rate)."""
        return min(math.exp(min(max(self.growth, 0.0) * lead_s, 50.0)), cap)


def _xlogx_ratio(y: np.ndarray, mu: np.ndarray) -> float:
    """Σ y log(y / mu) over y > 0 (0 log 0 = 0)."""
    pos = y > 0
    return float((y[pos] * np.log(y[pos] / mu[pos])).sum())


def _loglinear(y: np.ndarray, tc: np.ndarray) -> tuple[float, float] | None:
    """Maximum-likelihood (a, g) of ``y ~ Poisson(exp(a + g tc))`` by Newton's method (``tc`` centred); None
    when it does not converge (a window of zeros but one, say)."""
    ybar = float(y.mean())
    if ybar <= 0:
        return None
    a, g = math.log(ybar), 0.0
    for _ in range(_NEWTON_STEPS):
        mu = np.exp(np.clip(a + g * tc, -50.0, 50.0))
        r = y - mu
        g0, g1 = float(r.sum()), float(tc @ r)
        h00, h01, h11 = float(mu.sum()), float(mu @ tc), float(mu @ (tc * tc))
        det = h00 * h11 - h01 * h01
        if not det > 0:
            return None
        da, dg = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
        a, g = a + da, g + dg
        if abs(dg) < _NEWTON_TOL and abs(da) < _NEWTON_TOL:
            return a, g
    return None


def _step_deviance(y: np.ndarray) -> float:
    """The least Poisson deviance of two constant rates split anywhere in ``y``."""
    n = len(y)
    head = np.cumsum(y)[:-1]
    tail = float(y.sum()) - head
    k = np.arange(1, n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fit = np.where(head > 0, head * np.log(head / k), 0.0) + np.where(
            tail > 0, tail * np.log(tail / (n - k)), 0.0
        )
    pos = y > 0
    return 2.0 * (float((y[pos] * np.log(y[pos])).sum()) - float(fit.max()))


def _window(
    times: np.ndarray, rates: np.ndarray, now_s: float, window_s: float, ordered: bool
) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """(centred times, counts, sample spacing, mean time) of the samples in (now − window_s, now], or None
    when too few or spanning too little of the window (the same rules as ``stages.ramp_fit``); a sample's
    count is its rate × the mean spacing."""
    start = now_s - window_s
    if ordered:
        lo, hi = (int(i) for i in np.searchsorted(times, (start, now_s), side="right"))
        t, r = times[lo:hi], rates[lo:hi]
    else:
        sel = (times > start) & (times <= now_s)
        t, r = times[sel], rates[sel]
    n = len(t)
    if n < TREND_MIN_SAMPLES:
        return None
    span = float(t.max() - t.min())
    if span < TREND_MIN_COVERAGE * window_s or span <= 0:
        return None
    dt = span / (n - 1)
    t_mean = float(t.mean())
    return t - t_mean, r * dt, dt, t_mean


def _fit(
    times: np.ndarray, rates: np.ndarray, now_s: float, window_s: float, min_z: float, ordered: bool
) -> RiseFit | None:
    """The window's fit, or None when it is not a rise at ``min_z`` (screened by the score test first)."""
    w = _window(times, rates, now_s, window_s, ordered)
    if w is None:
        return None
    tc, y, dt, t_mean = w
    n = len(y)
    ybar = float(y.mean())
    sxx = float(tc @ tc)
    if not (ybar > 0 and sxx > 0):
        return None
    slope = float(tc @ y) / sxx
    rss = float(((y - ybar - slope * tc) ** 2).sum())
    screen_phi = max(1.0, rss / (n - 2) / ybar)
    if slope / math.sqrt(ybar * screen_phi / sxx) < 0.8 * min_z:  # the score test, with a margin
        return None
    coef = _loglinear(y, tc)
    if coef is None:
        return None
    a, g = coef
    mu = np.exp(np.clip(a + g * tc, -50.0, 50.0))
    dev_exp = 2.0 * (_xlogx_ratio(y, mu) - float((y - mu).sum()))
    dev_const = 2.0 * _xlogx_ratio(y, np.full(n, ybar))
    phi = max(1.0, float(((y - mu) ** 2 / mu).sum()) / (n - 2))
    z = math.copysign(math.sqrt(max(dev_const - dev_exp, 0.0) / phi), g)
    if z < min_z:
        return None
    step = dev_exp - _step_deviance(y) > RISE_STEP_MARGIN * phi
    level = math.exp(min(a + g * (now_s - t_mean), 50.0)) / dt
    return RiseFit(window_s, g, z, level, phi, step)


def rise_fit(history: tuple[tuple[float, float], ...], now_s: float, window_s: float) -> RiseFit | None:
    """The Poisson log-linear fit of the (time, rate) samples of ``history`` in (now − window_s, now], or None
    when they are too few, span too little of the window, or read no rise of ``RISE_MIN_Z``."""
    times, rates = _rate_arrays(history)
    return _fit(times, rates, now_s, window_s, RISE_MIN_Z, _ordered(times))


def _rise_at(
    times: np.ndarray, rates: np.ndarray, now_s: float, lead_s: float, min_z: float, ordered: bool
) -> tuple[float, RiseFit | None]:
    """The factor and fit of the shortest window at ``now_s`` that reads a rise (not a step), or (1, None)."""
    for window_s in RISE_WINDOWS_S:
        fit = _fit(times, rates, now_s, window_s, min_z, ordered)
        if fit is None or fit.step_fits_better or fit.level <= 0:
            continue
        factor = fit.factor(lead_s)
        if factor > 1.0:
            return factor, fit
    return 1.0, None


def rise_factor(
    history: tuple[tuple[float, float], ...], now_s: float, lead_s: float
) -> tuple[float, str | None]:
    """How much higher the load will be ``lead_s`` from now (when capacity started now serves), by the
    Poisson log-linear test of the module docstring: (factor in [1, ``MAX_RISE_FACTOR``], reason), or (1, None)
    when no window reads a rise now and ``RISE_CONFIRM_S`` earlier. Never below 1."""
    if lead_s <= 0:
        return 1.0, None
    times, rates = _rate_arrays(history)
    ordered = _ordered(times)
    factor, fit = _rise_at(times, rates, now_s, lead_s, RISE_MIN_Z, ordered)
    if fit is None:
        return 1.0, None
    for lag_s in RISE_CONFIRM_S:
        earlier, _ = _rise_at(times, rates, now_s - lag_s, lead_s, RISE_CONFIRM_Z, ordered)
        if earlier <= 1.0:
            return 1.0, None
        factor = min(factor, earlier)
    reason = (
        f"rise: arrivals growing {fit.growth * 6000:.1f} %/min over the last {fit.window_s:.0f} s (Poisson"
        f" log-linear, {fit.z:.1f} standard errors, dispersion {fit.dispersion:.1f}, also"
        f" {', '.join(f'{x:.0f}' for x in RISE_CONFIRM_S)} s ago) → load × {factor:.2f} by the time new"
        f" capacity serves ({lead_s:.0f} s)"
    )
    return factor, reason
