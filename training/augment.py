"""Trace- and series-level augmentation for training the forecaster on traffic in general.

Every function is pure: it takes a ``Trace`` (or an array) and a ``numpy.random.Generator`` and returns a
new value; nothing is modified in place. Augmentations are applied to the *training* part of a trace only
(see ``training.data.split_trace``), so nothing of the validation or test period leaks into training.

- ``time_scale``: replay a trace faster or slower (rates scale by ``speed``, bursts get shorter/longer).
- ``thin`` / ``rate_scale``: scale the arrival rate while keeping the shape of the traffic (independent
  thinning below 1, superposition of circularly shifted copies above 1).
- ``superpose``: merge several traces into one node's traffic.
- ``scale_tokens``: multiply prompt/output lengths by a random factor (other models, other users).
- ``drift_tokens``: multiply them by slowly drifting factors (a length mix that changes while the arrivals
  do not), so token rates are not read as a forecast of arrivals.
- ``mask_channels``: hide whole channels or stretches of time (metrics outages, missing exporters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from serving.workload.trace import Trace


def time_scale(trace: Trace, speed: float) -> Trace:
    """The same requests replayed ``speed`` times faster (``speed`` 2: twice the rate, half the span)."""
    if not np.isfinite(speed) or speed <= 0:
        raise ValueError(f"time_scale: speed must be a finite number > 0, got {speed!r}")
    return _with_arrivals(trace, trace.arrival_s / speed, np.arange(len(trace)))


def thin(trace: Trace, keep_prob: float, rng: np.random.Generator) -> Trace:
    """Keep each request independently with probability ``keep_prob`` (a thinned point process)."""
    if not 0.0 <= keep_prob <= 1.0:
        raise ValueError(f"thin: keep_prob must be in [0, 1], got {keep_prob!r}")
    keep = rng.random(len(trace)) < keep_prob
    return trace.take(np.flatnonzero(keep))


def superpose(traces: Sequence[Trace], offsets_s: Sequence[float] | None = None) -> Trace:
    """One trace holding every request of ``traces``, each shifted by its offset, in arrival order."""
    if not traces:
        raise ValueError("superpose: needs at least one trace")
    offsets = [0.0] * len(traces) if offsets_s is None else list(offsets_s)
    if len(offsets) != len(traces):
        raise ValueError(f"superpose: {len(traces)} traces but {len(offsets)} offsets")
    arrival = np.concatenate([t.arrival_s + off for t, off in zip(traces, offsets, strict=True)])
    order = np.argsort(arrival, kind="stable")
    prompt = np.concatenate([t.prompt_tokens for t in traces])[order]
    output = np.concatenate([t.output_tokens for t in traces])[order]
    priority = np.concatenate([t.priority for t in traces])[order]
    return Trace.from_arrays(
        arrival[order],
        prompt,
        output,
        priority=priority,
        source=" + ".join(t.source for t in traces),
        format="synthetic",
    )


def circular_shift(trace: Trace, shift_s: float) -> Trace:
    """Rotate a trace in time over its own span: what falls past the end wraps round to the start."""
    span_s = trace.duration_s + 1.0
    arrival = (
        np.mod(trace.arrival_s - trace.arrival_s[0] + shift_s, span_s) if len(trace) else trace.arrival_s
    )
    order = np.argsort(arrival, kind="stable")
    return _with_arrivals(trace, arrival[order], order)


def rate_scale(trace: Trace, factor: float, rng: np.random.Generator) -> Trace:
    """The trace's traffic at ``factor`` times its rate, same time span.

    Below 1: independent thinning. Above 1: ``floor(factor)`` copies, each circularly shifted by a random
    offset, plus one copy thinned to the fractional part. Copies keep the trace's burst shapes but put
    them at new times, so bursts are not simply made taller.
    """
    if not np.isfinite(factor) or factor <= 0:
        raise ValueError(f"rate_scale: factor must be a finite number > 0, got {factor!r}")
    if factor <= 1.0:
        return thin(trace, factor, rng)
    whole, frac = int(np.floor(factor)), float(factor - np.floor(factor))
    span_s = trace.duration_s + 1.0
    copies = [trace] + [circular_shift(trace, float(rng.uniform(0, span_s))) for _ in range(whole - 1)]
    if frac > 0:
        copies.append(thin(circular_shift(trace, float(rng.uniform(0, span_s))), frac, rng))
    return superpose(copies)


def scale_tokens(trace: Trace, prompt_factor: float, output_factor: float) -> Trace:
    """Prompt and output lengths multiplied by the given factors (rounded, at least 1 token)."""
    for name, value in (("prompt_factor", prompt_factor), ("output_factor", output_factor)):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"scale_tokens: {name} must be a finite number > 0, got {value!r}")
    return _with_lengths(trace, prompt_factor, output_factor)


def _with_lengths(
    trace: Trace, prompt_factor: float | np.ndarray, output_factor: float | np.ndarray
) -> Trace:
    """``trace`` with its lengths multiplied by the factors (one, or one per request), rounded, >= 1 token."""
    return replace(
        trace,
        prompt_tokens=np.maximum(1, np.rint(trace.prompt_tokens * prompt_factor)).astype(np.int64),
        output_tokens=np.maximum(1, np.rint(trace.output_tokens * output_factor)).astype(np.int64),
    )


def drift_tokens(trace: Trace, sigma: float, timescale_s: float, rng: np.random.Generator) -> Trace:
    """Prompt and output lengths multiplied by ``exp(x(t))`` at each request's arrival ``t``, where ``x`` is a
    stationary Ornstein-Uhlenbeck process (standard deviation ``sigma`` in log space, correlation time
    ``timescale_s``), one for prompts and one for outputs, on a 1-s grid. The arrivals are unchanged: the
    token rates move on their own, as a pool's length mix does when its users change."""
    for name, value in (("sigma", sigma), ("timescale_s", timescale_s)):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"drift_tokens: {name} must be a finite number > 0, got {value!r}")
    if len(trace) == 0:
        return trace
    t0 = float(trace.arrival_s[0])
    n = int(np.floor(float(trace.arrival_s[-1]) - t0)) + 2
    a = float(np.exp(-1.0 / timescale_s))
    from scipy.signal import lfilter

    noise = rng.standard_normal((2, n)) * sigma * np.sqrt(1.0 - a * a)
    noise[:, 0] = rng.standard_normal(2) * sigma  # start in the stationary law
    x = lfilter([1.0], [1.0, -a], noise, axis=-1)
    k = np.clip((trace.arrival_s - t0).astype(np.int64), 0, n - 1)
    return _with_lengths(trace, np.exp(x[0, k]), np.exp(x[1, k]))


@dataclass(frozen=True)
class MaskingConfig:
    """How often inputs are hidden during training, so the model copes with missing metrics.

    ``channel_prob``: each channel of a sequence is hidden entirely with this probability (an exporter
    that is not there). ``gap_prob``: a sequence gets one outage, all channels hidden, lasting
    ``gap_len_s`` (a scrape failure). Defaults are small: the model should mostly see its inputs.
    ``token_prob``: both token channels (the ``token_columns`` given to ``mask_channels``) are hidden together for
    a whole sequence with this probability, so the network learns to forecast from the arrivals alone too and
    leans less on token rates that may mislead it (0, the default, draws nothing: the shipped recipe's sequences).
    """

    channel_prob: float = 0.1
    gap_prob: float = 0.2
    gap_len_s: tuple[int, int] = (2, 30)
    token_prob: float = 0.0


def mask_channels(
    values: np.ndarray, rng: np.random.Generator, config: MaskingConfig, token_columns: Sequence[int] = ()
) -> np.ndarray:
    """A copy of ``values`` (``[T, C]``, NaN = unknown) with random channels and one random gap set to NaN, and
    with ``config.token_prob`` > 0 the ``token_columns`` together (drawn last, so 0 leaves the rest as it was)."""
    if values.ndim != 2:
        raise ValueError(f"mask_channels: values must be [T, C], got shape {values.shape}")
    out = values.copy()
    n_t, n_c = values.shape
    hide = rng.random(n_c) < config.channel_prob
    out[:, hide] = np.nan
    if n_t > 0 and rng.random() < config.gap_prob:
        lo, hi = config.gap_len_s
        gap = int(rng.integers(lo, hi + 1))
        start = int(rng.integers(0, max(1, n_t - gap)))
        out[start : start + gap, :] = np.nan
    if config.token_prob > 0 and len(token_columns) and rng.random() < config.token_prob:
        out[:, list(token_columns)] = np.nan
    return out


def _with_arrivals(trace: Trace, arrival_s: np.ndarray, order: np.ndarray) -> Trace:
    """``trace`` with rows reordered by ``order`` and new arrival times (already in that order)."""
    taken = trace.take(order)
    return Trace(
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        prompt_tokens=taken.prompt_tokens,
        output_tokens=taken.output_tokens,
        priority=taken.priority,
        model=taken.model,
        failed=taken.failed,
        model_names=taken.model_names,
        start_time=taken.start_time,
        source=taken.source,
        format=taken.format,
    )
