"""Random workloads for training, drawn from ``serving.workload.synthetic`` (MMPP with burst states).

Each call draws a fresh parameter set, so the model sees many kinds of traffic: from smooth Poisson-like
streams to on/off bursts with near-silence between them (the Azure code trace's shape), at mean rates
from under 1 to tens of requests per second (``bursty_synthetic``). ``mixed_synthetic`` adds two shapes
the MMPP alone never makes — a slow wave (the generator's sinusoidal factor, periods of minutes to an hour)
and level shifts (a piecewise-constant mean rate) — over a rate range the caller chooses.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace, concat_traces


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


SMOOTH_PROB = 0.3
"""Share of synthetic traces without burst states (Poisson-like renewal traffic, like the conv trace)."""


DEFAULT_RATE_RANGE = (0.5, 40.0)
"""Mean arrival rates (req/s, log-uniform) of ``bursty_synthetic``, the shipped checkpoint's synthetic data."""

SHAPES = ("mmpp", "mixed")
"""Synthetic mixes ``train-forecaster fit --synthetic-shapes`` offers: the MMPP alone, or MMPP + waves + steps."""

WAVE_PROB = 0.3
STEP_PROB = 0.3
"""``mixed_synthetic``'s shares of waves and level shifts (the rest is the plain MMPP)."""

WAVE_PERIOD_S = (120.0, 3600.0)
WAVE_AMPLITUDE = (0.3, 0.95)
STEP_SEGMENTS = (2, 6)
STEP_FACTOR = 8.0
"""Waves: period log-uniform, amplitude uniform. Steps: 2–6 segments, each at the trace's base rate times a
log-uniform factor in [1/8, 8] (then kept inside the rate range)."""


def random_params(
    rng: np.random.Generator,
    duration_s: float,
    smooth_prob: float = SMOOTH_PROB,
    rate_range: tuple[float, float] = DEFAULT_RATE_RANGE,
) -> SyntheticParams:
    """One random parameter set (log-uniform rates, multipliers, sojourns, token medians).

    With probability ``smooth_prob`` the trace has no bursts (multiplier 1): the model must also learn that
    smooth traffic is best forecast by a long average, not by the last few seconds.
    """
    smooth = bool(rng.random() < smooth_prob)
    return SyntheticParams(
        duration_s=duration_s,
        rate_rps=_log_uniform(rng, *rate_range),
        burst_multiplier=1.0 if smooth else _log_uniform(rng, 1.5, 40.0),
        calm_mean_s=_log_uniform(rng, 30.0, 300.0),
        burst_mean_s=_log_uniform(rng, 3.0, 60.0),
        interarrival_cv=_log_uniform(rng, 0.7, 1.5) if smooth else _log_uniform(rng, 0.7, 2.5),
        prompt=LengthDist(median_tokens=_log_uniform(rng, 100.0, 4000.0), sigma=float(rng.uniform(0.5, 1.5))),
        output=LengthDist(
            median_tokens=_log_uniform(rng, 8.0, 500.0), sigma=float(rng.uniform(0.5, 1.5)), max_tokens=4096
        ),
        grid_s=0.05,
    )


def bursty_synthetic(rng: np.random.Generator, duration_s: float) -> Trace:
    """A synthetic trace of about ``duration_s`` seconds with randomly drawn burst parameters."""
    params = random_params(rng, duration_s)
    return generate(params, seed=int(rng.integers(0, 2**31 - 1)))


def _wave(rng: np.random.Generator, params: SyntheticParams) -> SyntheticParams:
    period = _log_uniform(rng, *WAVE_PERIOD_S)
    return dataclasses.replace(
        params,
        diurnal_amplitude=float(rng.uniform(*WAVE_AMPLITUDE)),
        diurnal_period_s=period,
        diurnal_phase_s=float(rng.uniform(0.0, period)),
    )


def _steps(
    rng: np.random.Generator, params: SyntheticParams, rate_range: tuple[float, float]
) -> Trace | None:
    """Segments of one parameter set at different mean rates, end to end (None when none has arrivals).

    The trace's ``source`` starts with ``steps(rates=[...])``, each segment's mean rate in req/s.
    """
    n = int(rng.integers(STEP_SEGMENTS[0], STEP_SEGMENTS[1] + 1))
    cuts = np.concatenate(([0.0], np.sort(rng.uniform(0.0, params.duration_s, n - 1)), [params.duration_s]))
    parts: list[Trace] = []
    rates: list[float] = []
    for t0, t1 in itertools.pairwise(cuts):
        rate = min(
            max(params.rate_rps * _log_uniform(rng, 1 / STEP_FACTOR, STEP_FACTOR), rate_range[0]),
            rate_range[1],
        )
        seed = int(rng.integers(0, 2**31 - 1))
        if t1 - t0 < 1.0:
            continue
        try:
            seg = generate(dataclasses.replace(params, duration_s=float(t1 - t0), rate_rps=rate), seed=seed)
        except ValueError:  # no arrival in a short, slow segment: a silence, which is a shape too
            continue
        seg = seg.window(0.0, float(t1 - t0))  # the generator's grid runs one step past its duration
        parts.append(dataclasses.replace(seg, arrival_s=seg.arrival_s + t0))
        rates.append(rate)
    if not parts:
        return None
    label = "steps(rates=[" + ", ".join(f"{r:.6g}" for r in rates) + "]) "
    whole = concat_traces(parts)
    return dataclasses.replace(whole, source=label + whole.source)


def mixed_synthetic(
    rng: np.random.Generator,
    duration_s: float,
    rate_range: tuple[float, float] = DEFAULT_RATE_RANGE,
) -> Trace:
    """A synthetic trace of about ``duration_s`` s: an MMPP, an MMPP on a slow wave, or level shifts.

    The shape is drawn first (``WAVE_PROB`` waves, ``STEP_PROB`` steps, the rest the plain MMPP), then a
    ``random_params`` set with its mean rate log-uniform in ``rate_range``. Waves and steps keep the set's
    bursts (or its smoothness), so a burst can ride a rise or a shifted level.
    """
    u = float(rng.random())
    params = random_params(rng, duration_s, rate_range=rate_range)
    if u < WAVE_PROB:
        return generate(_wave(rng, params), seed=int(rng.integers(0, 2**31 - 1)))
    if u < WAVE_PROB + STEP_PROB:
        stepped = _steps(rng, params, rate_range)
        if stepped is not None:
            return stepped
    return generate(params, seed=int(rng.integers(0, 2**31 - 1)))


def synthetic_fn(
    shapes: str = "mmpp", rate_range: tuple[float, float] = DEFAULT_RATE_RANGE
) -> Callable[[np.random.Generator, float], Trace]:
    """``(rng, duration_s) -> Trace`` for ``shapes`` (one of ``SHAPES``) at mean rates in ``rate_range``.

    ``mmpp`` at the default range is ``bursty_synthetic`` itself (the shipped checkpoint's data, bit for bit).
    """
    if shapes not in SHAPES:
        raise ValueError(f"synthetic shapes {shapes!r}: one of {', '.join(SHAPES)}")
    lo, hi = rate_range
    if not 0 < lo <= hi:
        raise ValueError(f"synthetic rate range {rate_range}: need 0 < low <= high")
    if shapes == "mixed":
        return functools.partial(mixed_synthetic, rate_range=(lo, hi))
    if (lo, hi) == DEFAULT_RATE_RANGE:
        return bursty_synthetic

    def mmpp(rng: np.random.Generator, duration_s: float) -> Trace:
        return generate(
            random_params(rng, duration_s, rate_range=(lo, hi)), seed=int(rng.integers(0, 2**31 - 1))
        )

    return mmpp
