"""Burst onsets, defined once, in code, for scoring every forecaster the same way.

Time convention (shared with ``forecaster.baselines`` and ``training.evaluate``)
---------------------------------------------------------------------------------
``counts[t]`` is the number of arrivals in second ``[t, t+1)`` from the trace start. "Second ``t``" is
the decision made at the *end* of that second, i.e. at time ``t + 1``, having observed ``counts[:t+1]``:

- the **trailing window** of second ``t`` is ``counts[t-W+1 : t+1]`` (the last ``W = trailing_s`` observed
  per-second counts, second ``t`` included);
- the **next-H-s total** of second ``t`` is ``counts[t+1 : t+H+1]`` (what a forecaster issued at time
  ``t + 1`` must predict); the **next-H-s rate** is that total divided by ``H``.

Definition
----------
- ``mean[t]`` and ``sigma[t]``: mean and population standard deviation (ddof=0) of the per-second counts
  in the trailing window. Both are NaN while fewer than ``W`` seconds have been observed: there is no
  threshold, hence no exceedance and no onset, during the first ``W - 1`` seconds.
- ``burst_threshold[t] = max(2 * mean[t], mean[t] + 3 * sigma[t])``, in requests per second.
- Second ``t`` is an **exceedance** when its next-H-s rate is above ``burst_threshold[t]`` by more than a
  relative ``1e-9`` (so exact ties stay ties under floating-point rounding and scaling). It is undefined,
  and never an exceedance, where the threshold is NaN or the next-H-s window runs past the data.
- Second ``t`` is a **burst onset** when it is an exceedance and none of the ``quiet_s`` seconds before it
  (those that exist) is. Seconds without a threshold cannot be exceedances, so the first possible onset
  is second ``W - 1`` (60 s of history), and onsets are at least ``quiet_s + 1`` seconds apart: a series
  of ``T`` seconds has at most ``T / quiet_s`` onsets.

Consequences worth knowing: the definition is invariant to scaling the series by a positive constant;
after a silence (mean = sigma = 0) any arrival in the next H seconds is an exceedance, so the first
request after 30 s or more of silence is an onset once 60 s of history exist (the code trace's on/off
bursts). A step from a flat level ``a`` to ``10 a`` at second ``s >= W + H - 1`` has exactly one onset, at
``s - H``: the first second whose next-H-s window holds one second of the step
(rate ``(H - 1 + 10) a / H > 2 a``). The onset second is the first decision time at which the burst is inside the horizon: a perfect
forecaster alarms *at* the onset (lead 0 s); a purely reactive model, which sees the burst only once it
has started, alarms up to ``H`` seconds after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecaster.features import future_sums

TIE_RTOL = 1e-9  # relative margin that makes exact ties (e.g. a flat series) robust to rounding


def _check_counts(arrivals_per_s: np.ndarray) -> np.ndarray:
    counts = np.asarray(arrivals_per_s, dtype=np.float64)
    if counts.ndim != 1:
        raise ValueError(f"arrivals_per_s must be one series [T], got shape {counts.shape}")
    if np.isnan(counts).any():
        raise ValueError(
            "arrivals_per_s contains NaN: burst onsets are defined on complete per-second counts "
            f"(first NaN at second {int(np.flatnonzero(np.isnan(counts))[0])})"
        )
    return counts


def trailing_mean_sigma(series: np.ndarray, trailing_s: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population sigma of ``series[t-W+1 : t+1]`` for every ``t``; NaN for ``t < W-1``.

    Vectorised with cumulative sums; exact for integer-valued series (sums stay below 2**53).
    """
    x = np.asarray(series, dtype=np.float64)
    w = int(trailing_s)
    if w < 1:
        raise ValueError(f"trailing_s must be >= 1, got {trailing_s}")
    mean = np.full(len(x), np.nan)
    sigma = np.full(len(x), np.nan)
    if len(x) < w:
        return mean, sigma
    cs = np.concatenate(([0.0], np.cumsum(x)))
    cs2 = np.concatenate(([0.0], np.cumsum(x * x)))
    s = cs[w:] - cs[:-w]
    ss = cs2[w:] - cs2[:-w]
    mean[w - 1 :], sigma[w - 1 :] = mean_sigma_from_sums(s, ss, w)
    return mean, sigma


def mean_sigma_from_sums(s: np.ndarray, ss: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population sigma from window sums ``s`` and sums of squares ``ss`` of ``w`` values.

    Shared by the offline (cumsum) and streaming (ring buffer) paths so both do the same arithmetic.
    """
    m = s / w
    var = np.maximum(ss / w - m * m, 0.0)
    return m, np.sqrt(var)


def threshold_from_stats(mean: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """``max(2 * mean, mean + 3 * sigma)`` in requests per second (NaN stays NaN)."""
    return np.maximum(2.0 * mean, mean + 3.0 * sigma)


def burst_threshold(arrivals_per_s: np.ndarray, trailing_s: int = 60) -> np.ndarray:
    """Per-second exceedance threshold (requests/s) of the next-H-s rate; NaN before ``trailing_s`` s."""
    mean, sigma = trailing_mean_sigma(_check_counts(arrivals_per_s), trailing_s)
    return threshold_from_stats(mean, sigma)


def exceedances(
    arrivals_per_s: np.ndarray, horizon_s: int = 5, trailing_s: int = 60
) -> tuple[np.ndarray, np.ndarray]:
    """``(exceeds [T] bool, defined [T] bool)`` per the module definition."""
    counts = _check_counts(arrivals_per_s)
    if horizon_s != int(horizon_s) or horizon_s < 1:
        raise ValueError(f"horizon_s must be a whole number of seconds >= 1, got {horizon_s}")
    thr = burst_threshold(counts, trailing_s)
    total = future_sums(counts, horizon_s)
    defined = ~np.isnan(thr) & ~np.isnan(total)
    with np.errstate(invalid="ignore"):
        exceeds = defined & (total / int(horizon_s) > thr * (1.0 + TIE_RTOL))
    return exceeds, defined


def burst_onsets(
    arrivals_per_s: np.ndarray, horizon_s: int = 5, trailing_s: int = 60, quiet_s: int = 30
) -> np.ndarray:
    """Seconds (indices into ``arrivals_per_s``) that are burst onsets, ascending, int64."""
    exceeds, _ = exceedances(arrivals_per_s, horizon_s, trailing_s)
    q = int(quiet_s)
    if q < 1:
        raise ValueError(f"quiet_s must be >= 1, got {quiet_s}")
    # seen[t] = exceedances among the (existing) q seconds before t
    ce = np.concatenate(([0], np.cumsum(exceeds.astype(np.int64))))
    t = np.arange(len(exceeds))
    seen = ce[t] - ce[np.maximum(t - q, 0)]
    return np.flatnonzero(exceeds & (seen == 0)).astype(np.int64)


def alarm_times(burst_prob: np.ndarray, threshold: float) -> np.ndarray:
    """Seconds at which ``burst_prob`` rises to ``>= threshold`` from below it (NaN counts as below).

    Second 0 is never an alarm: there is no "below" before it.
    """
    p = np.asarray(burst_prob, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        above = p >= threshold  # NaN -> False
    return (np.flatnonzero(above[1:] & ~above[:-1]) + 1).astype(np.int64)


@dataclass(frozen=True)
class BurstScore:
    """How well alarms anticipate onsets. NaN where undefined (no onsets, no alarms, nothing detected)."""

    onsets: int
    alarms: int
    recall: float  # detected onsets / onsets
    precision: float  # alarms that match some onset / alarms
    mean_lead_s: float  # mean of leads over detected onsets; negative = alarm after the onset
    leads_s: np.ndarray  # per onset: onset - earliest matching alarm, NaN when missed

    def as_dict(self) -> dict[str, float | int | list[float | None] | None]:
        """JSON-ready (NaN becomes None)."""
        return {
            "onsets": self.onsets,
            "alarms": self.alarms,
            "recall": _nan_none(self.recall),
            "precision": _nan_none(self.precision),
            "mean_lead_s": _nan_none(self.mean_lead_s),
            "leads_s": [None if np.isnan(v) else float(v) for v in self.leads_s],
        }


def _nan_none(v: float) -> float | None:  # json has no NaN
    return None if np.isnan(v) else float(v)


def score_bursts(
    onsets: np.ndarray, alarm_times: np.ndarray, max_lead_s: float, max_lag_s: float = 3.0
) -> BurstScore:
    """Match alarms to onsets: an alarm at ``a`` detects onset ``o`` when ``o - max_lead_s <= a <= o + max_lag_s``.

    An onset's lead is ``o - a`` for its earliest matching alarm (positive = early warning). An alarm is a
    true positive when it lies in the window of any onset.
    """
    o = np.asarray(onsets, dtype=np.float64)
    a = np.sort(np.asarray(alarm_times, dtype=np.float64))
    if max_lead_s < 0 or max_lag_s < 0:
        raise ValueError(f"max_lead_s and max_lag_s must be >= 0, got {max_lead_s}, {max_lag_s}")
    leads = np.full(len(o), np.nan)
    detected = np.zeros(len(o), dtype=bool)
    matched = np.zeros(len(a), dtype=bool)
    if len(a) and len(o):
        # earliest alarm at or after o - max_lead_s, for each onset
        idx = np.searchsorted(a, o - max_lead_s, side="left")
        first = a[np.minimum(idx, len(a) - 1)]
        detected = (idx < len(a)) & (first <= o + max_lag_s)
        leads[detected] = (o - first)[detected]
        # an alarm matches when the first onset at or after a - max_lag_s is at most a + max_lead_s
        os_ = np.sort(o)
        j = np.searchsorted(os_, a - max_lag_s, side="left")
        nxt = os_[np.minimum(j, len(os_) - 1)]
        matched = (j < len(os_)) & (nxt <= a + max_lead_s)
    n_det = int(detected.sum())
    return BurstScore(
        onsets=len(o),
        alarms=len(a),
        recall=n_det / len(o) if len(o) else float("nan"),
        precision=float(matched.sum()) / len(a) if len(a) else float("nan"),
        mean_lead_s=float(np.mean(leads[detected])) if n_det else float("nan"),
        leads_s=leads,
    )


def choose_alarm_threshold(
    burst_prob: np.ndarray,
    onsets: np.ndarray,
    max_lead_s: float,
    max_lag_s: float = 3.0,
    candidates: np.ndarray | None = None,
) -> float:
    """The alarm threshold with the best F1 of (recall, precision) on this (training) data.

    Candidates default to 0.05, 0.10, ..., 0.95. Ties go to the higher threshold (fewer alarms). With no
    onsets in the data there is nothing to tune on and 0.5 is returned.
    """
    if len(onsets) == 0:
        return 0.5
    cands = np.round(np.arange(0.05, 0.951, 0.05), 2) if candidates is None else np.asarray(candidates)
    best, best_f1 = 0.5, -1.0
    for thr in cands:  # ~20 candidates, each vectorised
        s = score_bursts(onsets, alarm_times(burst_prob, float(thr)), max_lead_s, max_lag_s)
        r = 0.0 if np.isnan(s.recall) else s.recall
        p = 0.0 if np.isnan(s.precision) else s.precision
        f1 = 2 * r * p / (r + p) if r + p > 0 else 0.0
        if f1 >= best_f1:
            best, best_f1 = float(thr), f1
    return best
