"""Training data: time-ordered splits, per-second node series, targets, and sequence windows.

Time conventions (one node, step 1 s; those of ``forecaster.features`` and ``forecaster.burst``): row ``t``
holds what was observed during ``[t, t + 1)`` s from the series start (arrivals counted, tokens summed); the
decision at row ``t`` is taken at time ``t + 1`` having seen rows ``0..t``, and its targets are the totals of
rows ``t+1 .. t+horizon_s`` (``forecaster.features.future_sums``). Rows whose horizon runs past the end of the
series, or covers an unknown (NaN) row, have NaN targets and are not scored.

Burst label (documented here, used by the loss): row ``t`` is labelled 1 when a burst onset (as
``forecaster.burst.burst_onsets`` defines it) lies in ``[t − after_s, t + lead_s]`` — i.e. from
``lead_s`` seconds *before* the onset (the warning we want) until ``after_s`` seconds after it (a
late but still useful alarm). Everything else is 0.

Splits are by time and per source: train is the earliest part, validation after it, test (the
held-out part) last. Augmentation only ever sees the training part.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from forecaster.features import DEFAULT_SCHEMA, future_sums, series_from_trace, trace_inputs
from forecaster.types import CHANNELS
from serving.workload.trace import Trace

# Channels a request trace determines; the rest (running, waiting, latencies...) are unknown (NaN).
TRACE_CHANNELS: tuple[str, ...] = ("arrival_rps", "prompt_tps", "gen_tps")
N_TARGETS = 3  # arrivals, prompt tokens, generation tokens over the horizon (forecaster.types.TARGETS)


@dataclass(frozen=True, eq=False)
class TraceSplit:
    """A trace cut by time: ``train`` < ``val`` < ``test`` (each keeps the trace's own time axis)."""

    train: Trace
    val: Trace
    test: Trace
    cut_val_s: float
    cut_test_s: float


def split_trace(trace: Trace, *, holdout_frac: float = 0.3, val_frac: float = 0.1) -> TraceSplit:
    """Cut ``trace`` by time: the last ``holdout_frac`` of its span is test, the ``val_frac`` before it val.

    Fractions are of the time span (not of the rows), so a quiet tail still holds out the same time.
    """
    if not (0.0 <= holdout_frac < 1.0 and 0.0 <= val_frac < 1.0 and holdout_frac + val_frac < 1.0):
        raise ValueError(
            f"split_trace: need 0 <= holdout_frac, val_frac and holdout_frac + val_frac < 1; "
            f"got holdout_frac={holdout_frac}, val_frac={val_frac}"
        )
    if len(trace) == 0:
        raise ValueError(f"split_trace: trace {trace.source!r} has no requests")
    t0 = float(trace.arrival_s[0])
    span = trace.duration_s
    cut_test = t0 + span * (1.0 - holdout_frac)
    cut_val = t0 + span * (1.0 - holdout_frac - val_frac)
    end = float(trace.arrival_s[-1]) + 1.0
    return TraceSplit(
        train=trace.window(t0, cut_val),
        val=trace.window(cut_val, cut_test),
        test=trace.window(cut_test, end),
        cut_val_s=cut_val,
        cut_test_s=cut_test,
    )


def burst_label(onsets: np.ndarray, n_t: int, *, lead_s: int, after_s: int = 2) -> np.ndarray:
    """``[n_t]`` float32: 1 where an onset lies in ``[t − after_s, t + lead_s]``, else 0 (module docstring)."""
    label = np.zeros(n_t + 1, dtype=np.float32)
    onsets = np.asarray(onsets, dtype=np.int64)
    onsets = onsets[(onsets >= 0) & (onsets < n_t)]
    lo = np.clip(onsets - lead_s, 0, n_t)
    hi = np.clip(onsets + after_s + 1, 0, n_t)
    # difference array: +1 at lo, -1 at hi, cumulative sum > 0 inside any interval
    np.add.at(label, lo, 1.0)
    np.add.at(label, hi, -1.0)
    return (np.cumsum(label)[:n_t] > 0).astype(np.float32)


OnsetFn = Callable[[np.ndarray], np.ndarray]
"""Per-step arrival counts ``[T]`` → onset indices (``forecaster.burst.burst_onsets`` fits)."""


@dataclass(frozen=True, eq=False)
class NodeSeries:
    """One node's training series with its targets, ready to be cut into windows.

    ``x_raw``: raw channels ``[T, C]`` float32 in ``CHANNELS`` order (NaN = unknown). ``totals``: future
    totals ``[T, 3]`` over ``(t, t + horizon_s]`` (NaN = not scored). ``burst``: ``[T]`` 0/1 label (NaN =
    not scored). ``t0_unix_s``: wall time of row 0 (time-of-day features), NaN when unknown. ``horizon_s``:
    the horizon of ``totals`` (None when unknown; the data module checks it against the one it trains for).
    """

    name: str
    x_raw: np.ndarray
    totals: np.ndarray
    burst: np.ndarray
    t0_unix_s: float = float("nan")
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        n_t = self.x_raw.shape[0]
        if (
            self.x_raw.shape != (n_t, len(CHANNELS))
            or self.totals.shape != (n_t, N_TARGETS)
            or self.burst.shape != (n_t,)
        ):
            raise ValueError(
                f"NodeSeries {self.name!r}: x_raw {self.x_raw.shape}, totals {self.totals.shape}, "
                f"burst {self.burst.shape} do not align (expected [T, {len(CHANNELS)}], [T, {N_TARGETS}], [T])"
            )

    def __len__(self) -> int:
        return int(self.x_raw.shape[0])


def node_series_from_values(
    name: str,
    x_raw: np.ndarray,
    *,
    horizon_s: float,
    onsets: OnsetFn,
    lead_s: int,
    after_s: int = 2,
    step_s: float = 1.0,
    t0_unix_s: float = float("nan"),
) -> NodeSeries:
    """Targets and burst labels for one node's raw channels ``[T, C]`` (rates per second).

    Totals per step are rate × ``step_s``; a NaN (unknown) step makes every horizon covering it unscored.
    """
    if x_raw.ndim != 2 or x_raw.shape[1] != len(CHANNELS):
        raise ValueError(
            f"node_series_from_values({name!r}): x_raw must be [T, {len(CHANNELS)}], got {x_raw.shape}"
        )
    load = x_raw[:, [CHANNELS.index(c) for c in TRACE_CHANNELS]].astype(np.float64) * step_s
    totals = future_sums(load.T, horizon_s, step_s).T
    arrivals = load[:, 0]
    known = np.isfinite(arrivals)
    label = burst_label(onsets(np.where(known, arrivals, 0.0)), len(x_raw), lead_s=lead_s, after_s=after_s)
    burst = np.where(np.isfinite(totals[:, 0]), label, np.nan)
    return NodeSeries(
        name=name,
        x_raw=np.asarray(x_raw, dtype=np.float32),
        totals=totals.astype(np.float32),
        burst=burst.astype(np.float32),
        t0_unix_s=t0_unix_s,
        horizon_s=float(horizon_s),
    )


def node_series_from_trace(
    name: str,
    trace: Trace,
    *,
    t0_s: float,
    t1_s: float,
    horizon_s: float,
    onsets: OnsetFn,
    lead_s: int,
    after_s: int = 2,
    step_s: float = 1.0,
) -> NodeSeries:
    """One node receiving ``trace`` over ``[t0_s, t1_s)`` (trace time): channels, targets, labels."""
    series = series_from_trace(
        trace.arrival_s, trace.prompt_tokens, trace.output_tokens, step_s, t0_s=t0_s, duration_s=t1_s - t0_s
    )
    x_raw, _ = trace_inputs(series, DEFAULT_SCHEMA)
    t0_unix = trace.start_time.timestamp() + t0_s if trace.start_time is not None else float("nan")
    return node_series_from_values(
        name,
        x_raw,
        horizon_s=horizon_s,
        onsets=onsets,
        lead_s=lead_s,
        after_s=after_s,
        step_s=step_s,
        t0_unix_s=t0_unix,
    )


def window_starts(lengths: Sequence[int], seq_len: int, stride: int) -> np.ndarray:
    """``(series index, start row)`` of windows of ``seq_len`` rows, ``stride`` apart, covering each series.

    ``[N, 2]`` int64. The last window of a series may run past its end (the dataset pads it with NaN):
    with ``stride = seq_len - burn_in`` every row from ``burn_in`` on lies after the burn-in of exactly
    one window.
    """
    if seq_len < 1 or not 1 <= stride <= seq_len:
        raise ValueError(
            f"window_starts: need seq_len >= 1 and 1 <= stride <= seq_len, got {seq_len}, {stride}"
        )
    overlap = seq_len - stride
    rows: list[np.ndarray] = []
    for i, n in enumerate(lengths):
        starts = np.arange(0, max(1, n - overlap), stride, dtype=np.int64)
        rows.append(np.stack([np.full_like(starts, i), starts], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)


def cut_window(series: NodeSeries, start: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``start .. start+seq_len`` of x_raw, totals, burst; padded with NaN (unknown) past the end."""
    end = start + seq_len
    x_raw, totals, burst = series.x_raw[start:end], series.totals[start:end], series.burst[start:end]
    pad = seq_len - x_raw.shape[0]
    if pad > 0:
        x_raw = np.concatenate([x_raw, np.full((pad, x_raw.shape[1]), np.nan, np.float32)])
        totals = np.concatenate([totals, np.full((pad, N_TARGETS), np.nan, np.float32)])
        burst = np.concatenate([burst, np.full(pad, np.nan, np.float32)])
    return x_raw, totals, burst


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
