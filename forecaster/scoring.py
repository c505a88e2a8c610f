"""Accuracy of count forecasts: point errors, a quantile loss, coverage, and the Poisson noise floor.

All functions take aligned 1-D arrays and ignore positions where the target or the prediction is NaN
(NaN = no forecast / no target); ``ForecastScores.points`` says how many positions were scored.
scipy is imported lazily (only the noise floor needs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecaster.features import future_sums


def _aligned(target: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(target, dtype=np.float64)
    p = np.asarray(pred, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"target and prediction must be 1-D of the same length, got {y.shape} and {p.shape}")
    ok = ~np.isnan(y) & ~np.isnan(p)
    return y[ok], p[ok]


def mae(target: np.ndarray, pred: np.ndarray) -> float:
    """Mean absolute error over positions where both are known; NaN when there are none."""
    y, p = _aligned(target, pred)
    return float(np.mean(np.abs(y - p))) if len(y) else float("nan")


def rmse(target: np.ndarray, pred: np.ndarray) -> float:
    """Root mean squared error over positions where both are known; NaN when there are none."""
    y, p = _aligned(target, pred)
    return float(np.sqrt(np.mean((y - p) ** 2))) if len(y) else float("nan")


def pinball(target: np.ndarray, pred: np.ndarray, q: float = 0.9) -> float:
    """Mean pinball (quantile) loss of ``pred`` as the ``q`` quantile: ``max(q*(y-p), (q-1)*(y-p))``."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    y, p = _aligned(target, pred)
    d = y - p
    return float(np.mean(np.maximum(q * d, (q - 1.0) * d))) if len(y) else float("nan")


def coverage(target: np.ndarray, upper: np.ndarray) -> float:
    """Fraction of targets ``<= upper`` (a calibrated p90 covers about 0.9)."""
    y, u = _aligned(target, upper)
    return float(np.mean(y <= u)) if len(y) else float("nan")


@dataclass(frozen=True)
class ForecastScores:
    """One model's scores on one series; NaN where nothing could be scored."""

    points: int  # positions with a target and a p50 forecast
    mae: float
    rmse: float
    pinball_p90: float
    coverage_p90: float

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready (NaN becomes None)."""
        out: dict[str, float | int | None] = {"points": self.points}
        for k in ("mae", "rmse", "pinball_p90", "coverage_p90"):
            v = float(getattr(self, k))
            out[k] = None if np.isnan(v) else v
        return out


def score_forecasts(target: np.ndarray, p50: np.ndarray, p90: np.ndarray) -> ForecastScores:
    """MAE and RMSE of ``p50``; pinball loss at 0.9 and coverage of ``p90``."""
    y = np.asarray(target, dtype=np.float64)
    return ForecastScores(
        points=int(np.sum(~np.isnan(y) & ~np.isnan(np.asarray(p50, dtype=np.float64)))),
        mae=mae(y, p50),
        rmse=rmse(y, p50),
        pinball_p90=pinball(y, p90, 0.9),
        coverage_p90=coverage(y, p90),
    )


def poisson_abs_dev_from_median(lam: np.ndarray) -> np.ndarray:
    """``E|N - median(N)|`` for ``N ~ Poisson(lam)``, elementwise, exactly.

    With ``m`` the median and ``F`` the Poisson CDF: ``E|N - m| = lam - m + 2 (m F(m-1) - lam F(m-2))``,
    since ``sum_{k<=m-1} k pmf(k) = lam F(m-2)``. This is the smallest MAE any forecaster can reach on a
    count whose mean is ``lam`` when the count is Poisson.
    """
    from scipy.stats import poisson  # lazy: keeps the controller's import path light

    lam = np.asarray(lam, dtype=np.float64)
    if np.any(lam < 0):
        raise ValueError("Poisson means must be >= 0")
    m = poisson.ppf(0.5, lam)
    m = np.where(lam == 0, 0.0, m)
    out: np.ndarray = lam - m + 2.0 * (m * poisson.cdf(m - 1, lam) - lam * poisson.cdf(m - 2, lam))
    return np.asarray(np.maximum(out, 0.0), dtype=np.float64)


def smoothed_rate(counts_per_s: np.ndarray, smooth_s: int = 31) -> np.ndarray:
    """Centred moving average of per-second counts over ``smooth_s`` seconds (shrunk at the edges).

    This is an *oracle* estimate of the true rate: it looks ``smooth_s // 2`` seconds into the future.
    """
    x = np.asarray(counts_per_s, dtype=np.float64)
    if smooth_s < 1 or smooth_s % 2 == 0:
        raise ValueError(f"smooth_s must be an odd number >= 1, got {smooth_s}")
    half = smooth_s // 2
    cs = np.concatenate(([0.0], np.cumsum(x)))
    t = np.arange(len(x))
    lo = np.maximum(t - half, 0)
    hi = np.minimum(t + half + 1, len(x))
    out: np.ndarray = (cs[hi] - cs[lo]) / (hi - lo)
    return out


def poisson_noise_floor(
    counts_per_s: np.ndarray,
    horizon_s: int,
    score_mask: np.ndarray | None = None,
    smooth_s: int = 31,
) -> float:
    """Best achievable MAE of the next-``horizon_s`` total if arrivals were Poisson around a smooth rate.

    Method: the true rate is estimated by an oracle, the centred ``smooth_s``-second moving average of
    the per-second counts (:func:`smoothed_rate`); for second ``t`` the expected total is
    ``lam_t = sum(rate[t+1 : t+H+1])`` (the same window as the target) and the floor is the mean over
    scored seconds of ``E|N - median|`` with ``N ~ Poisson(lam_t)``. An oracle knowing ``lam_t`` could do
    no better if the arrivals were Poisson; real traffic that is burstier than Poisson inside the
    smoothing window has a higher true floor, so models may not reach this figure — but none should
    beat it by much, and one that does is likely leaking the future.
    """
    rate = smoothed_rate(counts_per_s, smooth_s)
    lam = future_sums(rate, horizon_s)
    mask = ~np.isnan(lam)
    if score_mask is not None:
        mask &= np.asarray(score_mask, dtype=bool)
    if not mask.any():
        return float("nan")
    return float(np.mean(poisson_abs_dev_from_median(lam[mask])))
