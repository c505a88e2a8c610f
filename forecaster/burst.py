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

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from forecaster.features import future_sums
from forecaster.types import CHANNELS, ForecastBatch, Forecaster

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


# ---------------------------------------------------------------------------------------------------
# A streaming onset detector that needs no training
#
# Reactive by nature: it fires on the first seconds of a rise it has *seen*. Against the onset definition
# above (the first decision whose *next* H seconds hold the burst) its best lead is about -1 s; after a
# silence the first burst request arrives exactly H seconds after the onset (the onset is the first
# decision whose window reaches it), so such onsets cannot be caught within a lag shorter than H by any
# detector that reacts to arrivals (docs/FORECASTER.md, "Onset detector").


@dataclass(frozen=True)
class OnsetDetectorConfig:
    """Settings of :func:`onset_scores` / :class:`OnsetDetector` (defaults chosen a priori, not tuned).

    ``trailing_s``: seconds of baseline (the burst definition's 60 s). ``evidence_s``: the detector tests
    the sums of the last 1 .. ``evidence_s`` seconds against the baseline that ends just before them.
    ``hold_s``: after a score, the output holds the running maximum of the last ``hold_s`` scores (a
    refractory period: one rising edge per burst; the definition's onsets are >= 31 s apart).
    ``decades``: a Bonferroni-corrected p-value of ``10**-decades`` maps to score 1 (``10**-(decades/2)``
    to 0.5). ``rate_factor``: a k-second sum counts as evidence only when its rate exceeds
    ``rate_factor`` × the definition's threshold ``max(2 m, m + 3 σ)`` of the baseline.
    """

    trailing_s: int = 60
    evidence_s: int = 3
    hold_s: int = 30
    decades: float = 6.0
    rate_factor: float = 1.0

    def __post_init__(self) -> None:
        problems = []
        for name in ("trailing_s", "evidence_s", "hold_s"):
            v = getattr(self, name)
            if v != int(v) or v < 1:
                problems.append(f"{name} must be a whole number >= 1, got {v}")
        if not (math.isfinite(self.decades) and self.decades > 0):
            problems.append(f"decades must be a finite number > 0, got {self.decades}")
        if not (math.isfinite(self.rate_factor) and self.rate_factor >= 0):
            problems.append(f"rate_factor must be a finite number >= 0, got {self.rate_factor}")
        if problems:
            raise ValueError("OnsetDetectorConfig: " + "; ".join(problems))

    @property
    def warmup_s(self) -> int:
        """Seconds observed before the first score (earlier scores are NaN)."""
        return self.trailing_s + self.evidence_s


def _raw_scores(
    base_s: np.ndarray, base_ss: np.ndarray, evid: np.ndarray, cfg: OnsetDetectorConfig
) -> np.ndarray:
    """Scores in [0, 1] from the baseline's sum / sum of squares ``[M]`` and evidence sums ``[M, K]``.

    ``evid[:, k-1]`` = arrivals in the last ``k`` seconds. Shared by the offline and streaming paths, so both
    do the same arithmetic. Null model per k: negative binomial with mean ``k m`` and variance ``k m D``
    (``D`` = variance / mean of the baseline's per-second counts, floored at 1; ``m`` floored at half a
    request per baseline window so that silence is not infinitely surprising).
    """
    from forecaster.baselines import count_exceed_prob  # lazy: baselines imports this module

    w, k_max = cfg.trailing_s, cfg.evidence_s
    mean, sigma = mean_sigma_from_sums(base_s, base_ss, w)
    thr = threshold_from_stats(mean, sigma)
    with np.errstate(invalid="ignore", divide="ignore"):
        disp = np.where(mean > 0, sigma * sigma / np.where(mean > 0, mean, 1.0), 1.0)
    disp = np.maximum(disp, 1.0)
    m = np.maximum(mean, 0.5 / w)
    p_min = np.ones(len(base_s))
    for k in range(1, k_max + 1):  # a handful of vectorised passes
        s_k = evid[:, k - 1]
        gate = (s_k > 0) & (s_k / k > cfg.rate_factor * thr * (1.0 + TIE_RTOL))
        p = np.ones(len(base_s))
        if gate.any():
            p[gate] = count_exceed_prob(s_k[gate] - 1.0, k * m[gate], disp[gate])  # P(N >= s_k)
        p_min = np.minimum(p_min, p)
    with np.errstate(divide="ignore"):
        decades = -np.log10(np.clip(k_max * p_min, 1e-300, 1.0))
    return np.clip(decades / cfg.decades, 0.0, 1.0)


def _running_max(x: np.ndarray, width: int) -> np.ndarray:
    """``max(x[t-width+1 .. t])`` over the values that exist, NaN ignored (all NaN -> NaN)."""
    if width == 1 or len(x) == 0:
        return x.copy()
    filled = np.where(np.isnan(x), -np.inf, x)
    padded = np.concatenate((np.full(width - 1, -np.inf), filled))
    out = np.lib.stride_tricks.sliding_window_view(padded, width).max(axis=1)
    return np.where(np.isneginf(out), np.nan, out)


def onset_scores(arrivals_per_s: np.ndarray, config: OnsetDetectorConfig | None = None) -> np.ndarray:
    """Offline, vectorised: the detector's output for every second of a complete per-second series.

    ``out[t]`` uses ``counts[:t+1]`` only (causal) and equals what :class:`OnsetDetector` returns after its
    ``t+1``-th update (tested). NaN during the warm-up (``config.warmup_s - 1`` seconds). Score in [0, 1]:
    a monotone map of how surprising the last 1 .. ``evidence_s`` seconds are against the trailing baseline
    (not a calibrated probability; 0.5 = a Bonferroni p-value of ``10**-(decades/2)``), held for ``hold_s``.
    """
    cfg = config or OnsetDetectorConfig()
    y = _check_counts(arrivals_per_s)
    w, k_max = cfg.trailing_s, cfg.evidence_s
    n = len(y)
    raw = np.full(n, np.nan)
    first = w + k_max - 1
    if n > first:
        cs = np.concatenate(([0.0], np.cumsum(y)))
        cs2 = np.concatenate(([0.0], np.cumsum(y * y)))
        t = np.arange(first, n)
        base_s = cs[t - k_max + 1] - cs[t - k_max - w + 1]
        base_ss = cs2[t - k_max + 1] - cs2[t - k_max - w + 1]
        evid = np.stack([cs[t + 1] - cs[t + 1 - k] for k in range(1, k_max + 1)], axis=1)
        raw[first:] = _raw_scores(base_s, base_ss, evid, cfg)
    return _running_max(raw, cfg.hold_s)


def _push(buf: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """Shift ``buf[rows]`` one column left (oldest out) and append ``values[rows]``; in place."""
    if rows.all():  # the common case: no fancy-indexed copies
        buf[:, :-1] = buf[:, 1:]
        buf[:, -1] = values
    else:
        buf[rows] = np.concatenate((buf[rows, 1:], values[rows, None]), axis=1)


class OnsetDetector:
    """Streaming :func:`onset_scores`, batched over nodes: ``update(counts [N]) -> scores [N]`` once a second.

    A NaN (unknown) count leaves that node's state untouched and gives a NaN score for this update (an
    outage is not a silence). Memory per node: ``trailing_s + evidence_s + hold_s`` floats. No torch, and
    scipy only at the first score.
    """

    def __init__(self, config: OnsetDetectorConfig | None = None, n_nodes: int = 0) -> None:
        self.config = config or OnsetDetectorConfig()
        self.reset(n_nodes)

    def reset(self, n_nodes: int) -> None:
        """Forget everything; track ``n_nodes`` fresh nodes."""
        cfg = self.config
        self._buf = np.zeros((n_nodes, cfg.trailing_s + cfg.evidence_s))  # oldest first
        self._seen = np.zeros(n_nodes, dtype=np.int64)
        self._held = np.full((n_nodes, cfg.hold_s), np.nan)  # last hold_s raw scores, oldest first

    @property
    def n_nodes(self) -> int:
        return int(self._buf.shape[0])

    def take(self, keep: np.ndarray) -> None:
        """Re-index nodes: row ``i`` becomes old row ``keep[i]``, or a fresh node where ``keep[i] < 0``."""
        keep = np.asarray(keep, dtype=np.int64)
        old = (self._buf, self._seen, self._held)
        self.reset(len(keep))
        src = keep >= 0
        self._buf[src], self._seen[src], self._held[src] = (a[keep[src]] for a in old)

    def update(self, counts: np.ndarray) -> np.ndarray:
        """Consume one second of arrivals per node (NaN = unknown) and return each node's score."""
        cfg = self.config
        c = np.asarray(counts, dtype=np.float64)
        if c.shape != (self.n_nodes,):
            raise ValueError(f"OnsetDetector.update: counts {c.shape} != [{self.n_nodes} nodes]")
        ok = np.isfinite(c)
        out = np.full(self.n_nodes, np.nan)
        if not ok.any():
            return out
        _push(self._buf, ok, c)
        self._seen[ok] += 1
        ready = ok & (self._seen >= cfg.warmup_s)
        raw = np.full(self.n_nodes, np.nan)
        if ready.any():
            b = self._buf[ready]
            base = b[:, : cfg.trailing_s]
            tail = b[:, cfg.trailing_s :][:, ::-1]  # newest first
            evid = np.cumsum(tail, axis=1)  # evid[:, k-1] = last k seconds
            raw[ready] = _raw_scores(base.sum(axis=1), (base * base).sum(axis=1), evid, cfg)
        _push(self._held, ok, raw)
        h = self._held[ok]
        with np.errstate(invalid="ignore"):
            mx = np.where(np.isnan(h), -np.inf, h).max(axis=1)
        out[ok] = np.where(np.isneginf(mx), np.nan, mx)
        return out


def combine_burst(learned: np.ndarray, detector: np.ndarray) -> np.ndarray:
    """The burst probability the controller should read: the larger of the two; NaN only where both are."""
    a = np.asarray(learned, dtype=np.float64)
    b = np.asarray(detector, dtype=np.float64)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.maximum(a, b)))


def silent_onsets(
    arrivals_per_s: np.ndarray, onsets: np.ndarray, max_lag_s: int = 3, trailing_s: int = 60
) -> np.ndarray:
    """Bool per onset: no arrival in its trailing window nor in the ``max_lag_s`` seconds after it.

    Everything observed up to ``o + max_lag_s`` is then silence, exactly as if no burst were coming, so
    no detector that reacts to arrivals can catch such an onset within ``max_lag_s`` — except by alarming
    during silence, which it would do in every silence alike. ``1 - silent.mean()`` bounds the recall
    of any reactive detector (docs/FORECASTER.md, "Onset detector").
    """
    y = _check_counts(arrivals_per_s)
    o = np.asarray(onsets, dtype=np.int64)
    cs = np.concatenate(([0.0], np.cumsum(y)))
    lo = np.clip(o - int(trailing_s) + 1, 0, len(y))
    hi = np.clip(o + int(max_lag_s) + 1, 0, len(y))
    return np.asarray(cs[hi] - cs[lo] == 0.0)


class OnsetBoostedForecaster:
    """Any :class:`forecaster.types.Forecaster` with its ``burst_prob`` raised to the onset detector's score.

    ``step`` forwards to ``inner`` and returns its forecast with ``burst_prob = combine_burst(inner's,
    detector's)``; the detector reads the ``arrival_rps`` channel as per-second counts (one step = 1 s),
    NaN or masked = unknown. Imports neither torch nor statsmodels, so the controller can wrap a baseline
    or the learned model alike. Example::

        fc = OnsetBoostedForecaster(LearnedForecaster.load(path))   # or EWMA(), ...
        fc.reset(["pool-a"]); batch = fc.step(x, mask, now_s)       # batch.burst_prob includes the detector
    """

    def __init__(self, inner: Forecaster, config: OnsetDetectorConfig | None = None) -> None:
        self.inner = inner
        self.detector = OnsetDetector(config)
        self.name = f"{inner.name}+onset"
        self.horizon_s = inner.horizon_s
        self._node_ids: tuple[str, ...] = ()
        self._arrivals = CHANNELS.index("arrival_rps")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._node_ids

    def reset(self, node_ids: Sequence[str]) -> None:
        """Forget all state (inner forecaster's and detector's) and track these nodes, in this order."""
        self.inner.reset(node_ids)
        self._node_ids = tuple(node_ids)
        self.detector.reset(len(self._node_ids))

    def ensure_nodes(self, node_ids: Sequence[str]) -> None:
        """Track exactly these nodes: known ones keep their detector state (and the inner forecaster's, when it
        has ``ensure_nodes``; otherwise the inner forecaster is reset), new ones start fresh."""
        ids = tuple(node_ids)
        if ids == self._node_ids:
            return
        ensure = getattr(self.inner, "ensure_nodes", None)
        if callable(ensure):
            ensure(ids)
        else:
            self.inner.reset(ids)
        old = {nid: i for i, nid in enumerate(self._node_ids)}
        self.detector.take(np.array([old.get(nid, -1) for nid in ids], dtype=np.int64))
        self._node_ids = ids

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        """The inner forecast with the detector's score folded into ``burst_prob`` (see the class doc)."""
        fb = self.inner.step(x, mask, now_s)
        a = np.asarray(x, dtype=np.float64)[:, self._arrivals]
        seen = np.asarray(mask, dtype=bool)[:, self._arrivals] & np.isfinite(a)
        score = self.detector.update(np.where(seen, a, np.nan))
        return replace(
            fb,
            burst_prob=combine_burst(fb.burst_prob, score),
            model_version=f"{fb.model_version}+onset",
        )
