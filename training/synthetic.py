"""Random bursty workloads for training, drawn from ``serving.workload.synthetic`` (MMPP with burst states).

Each call draws a fresh parameter set, so the model sees many kinds of traffic: from smooth Poisson-like
streams to on/off bursts with near-silence between them (the Azure code trace's shape), at mean rates
from under 1 to tens of requests per second.
"""

from __future__ import annotations

import math

import numpy as np

from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


SMOOTH_PROB = 0.3
"""Share of synthetic traces without burst states (Poisson-like renewal traffic, like the conv trace)."""


def random_params(
    rng: np.random.Generator, duration_s: float, smooth_prob: float = SMOOTH_PROB
) -> SyntheticParams:
    """One random parameter set (log-uniform rates, multipliers, sojourns, token medians).

    With probability ``smooth_prob`` the trace has no bursts (multiplier 1): the model must also learn that
    smooth traffic is best forecast by a long average, not by the last few seconds.
    """
    smooth = bool(rng.random() < smooth_prob)
    return SyntheticParams(
        duration_s=duration_s,
        rate_rps=_log_uniform(rng, 0.5, 40.0),
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
