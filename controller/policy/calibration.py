"""Online recalibration of the arrival forecast's quantiles by coverage tracking (``PolicyConfig.arrival_calibration``).

The forecaster's arrival p90 should be exceeded by the arrivals actually counted over its horizon in one window
of ten. On traffic unlike its training data it is not: on the 8,000-token sinusoid the shipped model's 5-s p90
reads 2-3 × the true rate (docs/BENCHMARKS.md, session 7, s7p), and decode's Little's-law concurrency reads it.
Each tick's forecast is kept with the arrival counter at that time; one horizon later the arrivals counted since
are compared with it, and a multiplier per quantile moves so that the fraction of windows above the scaled
quantile tracks its nominal 1 - q (adaptive conformal inference, Gibbs & Candès 2021, in log space, per second
of comparisons so a 1-s and a 5-s tick adapt alike). Pure functions, no clock: time comes in as ``now_s``.

Safety: the multiplier is bounded; no correction before ``warmup_s`` of comparisons; none downward while the
decode fleet is saturated (``stages.decode_saturated``: then the measured decode load is a floor, and cutting
the forecast is what the censoring hides), or with ``eased`` a cut that fades out as the fleet fills
(``ease_weight``); and the scaled forecast is never below the measured arrival rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.policy.types import ArrivalCalibration, PoolForecast, evolve

QUANTILES: tuple[float, float] = (0.5, 0.9)  # arrivals_p50, arrivals_p90
DEFAULT_HORIZON_S = 5.0  # the controller's forecast horizon, for a tick without a forecast
MAX_PENDING = 256  # forecasts awaiting their horizon at most (a 5-s horizon at 1-s ticks keeps 5)


@dataclass(frozen=True)
class CalibrationParams:
    """``gain_per_s``: log-multiplier step per second of comparisons per unit of coverage error;
    ``min_scale`` / ``max_scale``: bounds of the multiplier; ``warmup_s``: comparisons needed before any
    correction applies."""

    gain_per_s: float = 0.05
    min_scale: float = 0.3
    max_scale: float = 1.0
    warmup_s: float = 60.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gain_per_s) and self.gain_per_s > 0):
            raise ValueError(
                f"CalibrationParams.gain_per_s must be positive and finite, got {self.gain_per_s!r}"
            )
        if not (0 < self.min_scale <= 1.0 <= self.max_scale < math.inf):
            raise ValueError(
                f"CalibrationParams: need 0 < min_scale <= 1 <= max_scale, got {self.min_scale!r}, {self.max_scale!r}"
            )
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"CalibrationParams.warmup_s must be >= 0 and finite, got {self.warmup_s!r}")


def _known(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _issued(forecast: PoolForecast | None, cal: ArrivalCalibration) -> tuple[float, float] | None:
    """The forecast's (p50, p90) arrival rates times the current multipliers, before any floor; None if unknown."""
    if forecast is None or not (_known(forecast.arrivals_p50) and _known(forecast.arrivals_p90)):
        return None
    s50, s90 = cal.scales()
    return forecast.rate(forecast.arrivals_p50) * s50, forecast.rate(forecast.arrivals_p90) * s90


def update_calibration(
    cal: ArrivalCalibration,
    now_s: float,
    arrival_rps: float,
    forecast: PoolForecast | None,
    params: CalibrationParams,
) -> ArrivalCalibration:
    """Fold one tick in: count the arrivals measured since the last tick, compare every forecast whose horizon
    has passed with the arrivals counted over it, move the multipliers, and keep this tick's forecast.

    An unknown rate (NaN, negative) breaks the count: the pending forecasts are dropped, since no comparison
    over that gap can be made, and the multipliers stay. A tick at or before the last one changes nothing."""
    if math.isfinite(cal.last_s) and not now_s > cal.last_s:
        return cal
    if not _known(arrival_rps):
        return evolve(cal, last_s=now_s, pending=())
    dt_s = now_s - cal.last_s if math.isfinite(cal.last_s) else 0.0
    counted = cal.counted + arrival_rps * dt_s
    # a forecast matures one horizon after it was issued (this tick's horizon; the default 5 s when it has none)
    horizon_s = forecast.horizon_s if forecast is not None and forecast.horizon_s > 0 else DEFAULT_HORIZON_S
    due = [p for p in cal.pending if now_s - p[0] >= horizon_s - 1e-9]
    waiting = [p for p in cal.pending if now_s - p[0] < horizon_s - 1e-9]
    log50, log90 = cal.log_scale
    compared, cov50, cov90 = cal.compared_s, cal.covered[0], cal.covered[1]
    lo, hi = math.log(params.min_scale), math.log(params.max_scale)
    weight = dt_s / len(due) if due else 0.0  # each second of comparisons counts once, whatever the tick
    for issued_s, counted_then, q50, q90 in due:
        actual = (counted - counted_then) / (now_s - issued_s)
        miss50, miss90 = float(actual > q50), float(actual > q90)
        log50 = min(max(log50 + params.gain_per_s * weight * (miss50 - (1 - QUANTILES[0])), lo), hi)
        log90 = min(max(log90 + params.gain_per_s * weight * (miss90 - (1 - QUANTILES[1])), lo), hi)
        compared += weight
        cov50 += weight * (1 - miss50)
        cov90 += weight * (1 - miss90)
    cal = evolve(
        cal,
        log_scale=(log50, log90),
        counted=counted,
        last_s=now_s,
        compared_s=compared,
        covered=(cov50, cov90),
    )
    issued = _issued(forecast, cal)
    if issued is not None:
        waiting.append((now_s, counted, *issued))
    return evolve(cal, pending=tuple(waiting[-MAX_PENDING:]))


def ease_weight(fullness: float, start: float, full: float) -> float:
    """How much of a cut below 1 the ``eased`` form lifts at decode ``fullness``: 0 up to ``start``, rising
    linearly to 1 at ``full`` and above (``PolicyConfig.arrival_calibration_ease_from`` / ``_ease_full``).
    An unknown fullness (NaN) lifts nothing, as an unknown fleet is not saturated (``stages.decode_full``)."""
    if not (0.0 <= start < full < math.inf):
        raise ValueError(f"ease_weight: need 0 <= start < full < inf, got {start!r}, {full!r}")
    if math.isnan(fullness):
        return 0.0
    return min(max((fullness - start) / (full - start), 0.0), 1.0)


def eased_scale(scale: float, weight: float) -> float:
    """A multiplier below 1 moved ``weight`` of the way to 1 (``weight`` 1 is ``lift``'s ``max(scale, 1)``);
    one at or above 1 is left as it is (the easing lifts cuts, it never pulls a raise down)."""
    return scale if scale >= 1.0 else scale + (1.0 - scale) * weight


def calibrated_forecast(
    forecast: PoolForecast | None,
    cal: ArrivalCalibration,
    measured_rps: float,
    params: CalibrationParams,
    *,
    saturated: bool = False,
    fullness: float = math.nan,
    ease: tuple[float, float] | None = None,
    max_applied: float = math.inf,
) -> tuple[PoolForecast | None, str | None]:
    """The forecast with its arrival p50 and p90 scaled by the tracked multipliers, and why (None when
    unchanged).

    Unchanged before ``params.warmup_s`` of comparisons, or for an unknown forecast. While ``saturated`` (the
    decode fleet is full) a multiplier below 1 is not applied. With ``ease = (start, full)``
    (``PolicyConfig.arrival_calibration_saturated='eased'``) ``saturated`` is not read: a multiplier below 1
    is moved toward 1 by ``ease_weight(fullness, start, full)``, the decode fleet's ``fullness``
    (``stages.decode_fullness``), so the cut fades out as the fleet fills instead of switching off at 90 %.
    Neither quantile is scaled below the measured rate ``measured_rps`` (when known), and the p90 is never
    below the p50; neither multiplier applies above ``max_applied`` (``PolicyConfig.rise_lead='calibrated'``:
    the bound off a rise). The token forecasts are untouched."""
    issued = _issued(forecast, cal)
    if forecast is None or issued is None or cal.compared_s < params.warmup_s:
        return forecast, None
    s50, s90 = (min(s, max_applied) for s in cal.scales())
    tracked = (s50, s90)
    weight = 0.0
    if ease is not None:
        weight = ease_weight(fullness, *ease)
        s50, s90 = eased_scale(s50, weight), eased_scale(s90, weight)
    elif saturated:
        s50, s90 = max(s50, 1.0), max(s90, 1.0)
    floor = measured_rps if _known(measured_rps) else 0.0
    p50 = max(forecast.rate(forecast.arrivals_p50) * s50, floor)
    p90 = max(forecast.rate(forecast.arrivals_p90) * s90, p50)
    if s50 == 1.0 and s90 == 1.0:
        return forecast, None
    cov50, cov90 = cal.coverage()
    if ease is not None and weight > 0.0 and (s50, s90) != tracked:
        note = (
            f"; decode {fullness:.0%} full: cut eased {weight:.0%} toward 1"
            f" (tracked p50 × {tracked[0]:.2f}, p90 × {tracked[1]:.2f})"
        )
    else:
        note = "; decode full: not cut" if saturated and ease is None else ""
    why = (
        f"arrival forecast recalibrated: p50 × {s50:.2f}, p90 × {s90:.2f} → {p50:.1f} / {p90:.1f} req/s"
        f" (coverage {cov50:.2f} / {cov90:.2f} over {cal.compared_s:.0f} s{note})"
    )
    scaled = replace(forecast, arrivals_p50=p50 * forecast.horizon_s, arrivals_p90=p90 * forecast.horizon_s)
    return scaled, why
