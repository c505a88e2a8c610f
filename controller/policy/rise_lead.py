"""A lead for the start of a rise from the realised arrivals, not from the forecaster's bias (opt-in).

Stage 1 sizes from the forecast's p90. The shipped checkpoint over-forecasts arrivals 1.5-2.6 x
(docs/BENCHMARKS.md, s11f), and that bias is what covers the first rise of a wave today: a better-calibrated
checkpoint's p90 sits at the load, and the first rise is lost before the trend stage reads a ramp (its line
and Poisson tests ask for 3 standard errors over 30-120 s, confirmed 5 and 10 s earlier). This lead asks
less: the arrivals counted over the last ``window_s / 2`` against the half before, a two-sample Poisson
test ``z = (n2 - n1) / sqrt(n1 + n2)`` (the counts' own noise, no fit, no confirmation), and when it reads a
rise it projects the recent rate by the two halves' growth to now and ``ahead_s`` on, each capped at
``max_factor`` x. ``decide`` then scales stage 1's need by projected / (the p90 stage 1 read) when that is above 1:
a forecast already above the projection (the shipped model's bias) leaves it unchanged, so the lead supplies
what the forecast does not, whatever its bias. Pure functions: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_COVERAGE = 0.8  # each half must hold samples over this fraction of its span


@dataclass(frozen=True)
class RealisedRise:
    """A rise read from the realised arrivals: the two halves' mean rates (req/s), the evidence ``z`` (standard
    errors of the count difference), and the rate projected ``ahead_s`` on (req/s)."""

    earlier_rps: float
    recent_rps: float
    z: float
    projected_rps: float


def _half_count(times: np.ndarray, rates: np.ndarray, lo: float, hi: float) -> tuple[float, float] | None:
    """(arrivals counted, seconds covered) by the samples in (lo, hi]; each sample counts its rate over the
    time since the previous sample (the counter's interval), the first one over the median spacing. None when
    they cover less than ``MIN_COVERAGE`` of the span."""
    inside = (times > lo) & (times <= hi)
    if inside.sum() < 2:
        return None
    t, r = times[inside], rates[inside]
    dt = np.diff(t)
    dt = np.concatenate(([float(np.median(dt))], dt))
    covered = float(dt.sum())
    if covered < MIN_COVERAGE * (hi - lo):
        return None
    return float((r * dt).sum()), covered


def realised_rise(
    times: np.ndarray,
    rates: np.ndarray,
    now_s: float,
    *,
    window_s: float,
    ahead_s: float,
    z_min: float,
    max_factor: float,
) -> RealisedRise | None:
    """The rise the arrivals counted over the last ``window_s`` show (``times``, ``rates``: known samples,
    time-ordered), or None when the recent half's count is not ``z_min`` standard errors above the earlier
    half's, the halves are covered too little, or the rate is unknown. The projection is the recent half's
    mean rate grown at ``ln(recent / earlier) / (window_s / 2)`` per second to now (the quarter window since
    the recent half's middle) and then over ``ahead_s``, each growth capped at ``max_factor`` x (so the
    projection is never above ``max_factor ** 2`` x the recent half's rate: a convex rise is above its
    half-window mean now, and a cap on the whole projection left it below the current rate)."""
    half = window_s / 2.0
    if not (math.isfinite(now_s) and half > 0) or times.size < 4:
        return None
    first = _half_count(times, rates, now_s - window_s, now_s - half)
    second = _half_count(times, rates, now_s - half, now_s)
    if first is None or second is None:
        return None
    (n1, t1), (n2, t2) = first, second
    # equal-duration counts: the difference's variance under one constant rate is n1 + n2
    n1_eq = n1 * t2 / t1
    if n2 + n1_eq <= 0:
        return None
    z = (n2 - n1_eq) / math.sqrt(n2 + n1_eq)
    if not z >= z_min:
        return None
    r1, r2 = n1 / t1, n2 / t2
    # an earlier half with no arrivals: the growth is unbounded, the caps decide
    growth = math.inf if r1 <= 0 else math.log(r2 / r1) / half
    now_rps = r2 * min(math.exp(min(growth * half / 2.0, 50.0)), max_factor)
    projected = now_rps * min(math.exp(min(growth * ahead_s, 50.0)), max_factor)
    return RealisedRise(earlier_rps=r1, recent_rps=r2, z=z, projected_rps=projected)


def lead_factor(rise: RealisedRise | None, forecast_rps: float) -> float:
    """How far stage 1's need falls short of the projected rise: projected / ``forecast_rps`` (the arrival
    p90 stage 1 read), at least 1; 1 with no rise. An unknown or zero forecast is led by the recent rate: the
    projection over it."""
    if rise is None:
        return 1.0
    base = forecast_rps if math.isfinite(forecast_rps) and forecast_rps > 0 else rise.recent_rps
    if not base > 0:
        return 1.0
    return max(rise.projected_rps / base, 1.0)
