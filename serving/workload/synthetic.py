"""Seeded synthetic workloads: a Markov-modulated renewal process with bursts and a diurnal cycle.

Arrivals. The rate is ``rate_rps`` × burst factor × diurnal factor:

* burst factor: a two-state Markov chain (calm, burst) with exponential sojourns of mean
  ``calm_mean_s`` and ``burst_mean_s``; the rate is ``burst_multiplier`` times higher in a burst. Rates
  are normalised so that the long-run mean of the burst factor is 1, so ``rate_rps`` is the mean rate.
* diurnal factor: ``1 + diurnal_amplitude * sin(2π (t + diurnal_phase_s) / diurnal_period_s)``.
* inter-arrivals: Gamma with mean 1 in operational time (shape ``1 / interarrival_cv²``; CV 1 is a
  Poisson process, larger is burstier), mapped to wall time through the inverse of the integrated rate
  (time rescaling), evaluated on a ``grid_s`` grid.

Lengths: lognormal (``median_tokens``, ``sigma``) or Zipf-like (``min_tokens`` × Zipf(``zipf_a``)), clipped
to [min_tokens, max_tokens]. Prompt and output lengths are independent.

These parameters are not fitted to BurstGPT or any published trace; no set here claims to reproduce one.
Everything is vectorised: no Python loop per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np

from serving.workload.trace import PRIORITY_NORMAL, Trace


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution. ``kind`` is ``lognormal`` or ``zipf``."""

    kind: Literal["lognormal", "zipf"] = "lognormal"
    median_tokens: float = 1000.0  # lognormal: exp(mu)
    sigma: float = 1.0  # lognormal: std of log length
    zipf_a: float = 2.0  # zipf: exponent (> 1); heavier tail as it nears 1
    min_tokens: int = 1
    max_tokens: int = 32_768

    def problems(self, name: str) -> list[str]:
        out = []
        if self.kind not in ("lognormal", "zipf"):
            out.append(f"{name}.kind must be 'lognormal' or 'zipf', got {self.kind!r}")
        if not self.median_tokens > 0:
            out.append(f"{name}.median_tokens must be > 0, got {self.median_tokens}")
        if not self.sigma >= 0:
            out.append(f"{name}.sigma must be >= 0, got {self.sigma}")
        if not self.zipf_a > 1:
            out.append(f"{name}.zipf_a must be > 1, got {self.zipf_a}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            out.append(
                f"{name}: need 0 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}"
            )
        return out

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "lognormal":
            x = np.rint(rng.lognormal(math.log(self.median_tokens), self.sigma, n))
        else:
            x = self.min_tokens * rng.zipf(self.zipf_a, n).astype(np.float64)
        return np.clip(x, self.min_tokens, self.max_tokens).astype(np.int64)


@dataclass(frozen=True)
class SyntheticParams:
    """Parameters of a synthetic workload; units in the names, defaults a bursty chat service."""

    duration_s: float = 600.0
    rate_rps: float = 5.0  # long-run mean arrival rate
    burst_multiplier: float = 4.0  # rate in a burst / rate when calm; 1 = no bursts
    calm_mean_s: float = 120.0  # mean sojourn in the calm state
    burst_mean_s: float = 15.0  # mean sojourn in the burst state
    interarrival_cv: float = 1.0  # CV of Gamma inter-arrivals in operational time; 1 = Poisson
    diurnal_amplitude: float = 0.0  # 0 = flat, < 1 keeps the rate positive
    diurnal_period_s: float = 86_400.0
    diurnal_phase_s: float = 0.0
    prompt: LengthDist = field(default_factory=lambda: LengthDist(median_tokens=1000.0, sigma=1.0))
    output: LengthDist = field(
        default_factory=lambda: LengthDist(median_tokens=150.0, sigma=1.0, max_tokens=4096)
    )
    failure_prob: float = 0.0  # failed requests get 0 output tokens and failed=True
    model_names: tuple[str, ...] = ()  # empty: model not given (-1)
    model_weights: tuple[float, ...] = ()  # same length as model_names; empty = uniform
    start_time: datetime | None = None
    grid_s: float = 0.05  # resolution of the integrated-rate grid

    def problems(self) -> list[str]:
        """One message per broken rule; empty when valid."""
        out: list[str] = []
        for name in (
            "duration_s",
            "rate_rps",
            "calm_mean_s",
            "burst_mean_s",
            "interarrival_cv",
            "diurnal_period_s",
            "grid_s",
        ):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                out.append(f"{name} must be a finite number > 0, got {v}")
        if not (math.isfinite(self.burst_multiplier) and self.burst_multiplier >= 1):
            out.append(f"burst_multiplier must be >= 1, got {self.burst_multiplier}")
        if not 0 <= self.diurnal_amplitude < 1:
            out.append(f"diurnal_amplitude must be in [0, 1), got {self.diurnal_amplitude}")
        if not 0 <= self.failure_prob <= 1:
            out.append(f"failure_prob must be in [0, 1], got {self.failure_prob}")
        if self.model_weights and len(self.model_weights) != len(self.model_names):
            out.append("model_weights must be empty or as long as model_names")
        if self.model_weights and (min(self.model_weights) < 0 or sum(self.model_weights) <= 0):
            out.append("model_weights must be >= 0 with a positive sum")
        finite = math.isfinite(self.duration_s) and math.isfinite(self.grid_s) and self.grid_s > 0
        if finite and self.duration_s / self.grid_s > 50_000_000:
            out.append("duration_s / grid_s exceeds 5e7 grid points: raise grid_s")
        return out + self.prompt.problems("prompt") + self.output.problems("output")


def _burst_factor(p: SyntheticParams, rng: np.random.Generator, grid: np.ndarray) -> np.ndarray:
    """The Markov-modulated factor on the grid, long-run mean 1; starts in the stationary distribution."""
    p_burst = p.burst_mean_s / (p.burst_mean_s + p.calm_mean_s)
    calm_level = 1.0 / (1.0 - p_burst + p_burst * p.burst_multiplier)
    start_burst = bool(rng.random() < p_burst)
    cycle_s = p.burst_mean_s + p.calm_mean_s
    n = int(2 * p.duration_s / cycle_s) + 16
    while True:  # a few rounds at most: sojourns until the trace is covered
        means = np.where((np.arange(n) % 2 == 0) == start_burst, p.burst_mean_s, p.calm_mean_s)
        ends = np.cumsum(rng.exponential(means))
        if ends[-1] > p.duration_s:
            break
        n *= 2
    state = np.searchsorted(ends, grid, side="right")  # index of the sojourn holding each grid point
    in_burst = (state % 2 == 0) == start_burst
    return np.where(in_burst, calm_level * p.burst_multiplier, calm_level)


def _arrivals(p: SyntheticParams, rng: np.random.Generator) -> np.ndarray:
    grid = np.arange(0.0, p.duration_s + p.grid_s, p.grid_s)
    rate = p.rate_rps * _burst_factor(p, rng, grid)
    if p.diurnal_amplitude:
        rate = rate * (
            1 + p.diurnal_amplitude * np.sin(2 * np.pi * (grid + p.diurnal_phase_s) / p.diurnal_period_s)
        )
    cum = np.concatenate(([0.0], np.cumsum(rate[:-1] * np.diff(grid))))  # integrated rate, left sums
    total = float(cum[-1])
    shape = 1.0 / p.interarrival_cv**2
    n = int(total + 10 * math.sqrt(total + 1) * max(1.0, p.interarrival_cv) + 16)
    while True:
        ops = np.cumsum(rng.gamma(shape, 1.0 / shape, n))
        if ops[-1] > total:
            break
        n *= 2
    ops = ops[ops <= total]
    arrivals: np.ndarray = np.interp(ops, cum, grid)
    return arrivals


def generate(params: SyntheticParams, seed: int) -> Trace:
    """A synthetic trace; the same (params, seed) always gives the same trace.

    Raises ``ValueError`` listing every invalid parameter. ``arrival_s`` starts at 0.0 (the first arrival).

    Example: ``generate(SyntheticParams(duration_s=300, rate_rps=8, burst_multiplier=6), seed=7)``
    """
    errors = params.problems()
    if errors:
        raise ValueError("invalid SyntheticParams: " + "; ".join(errors))
    rng = np.random.default_rng(seed)
    t = _arrivals(params, rng)
    if len(t) == 0:
        raise ValueError(
            f"no arrivals in {params.duration_s} s at {params.rate_rps} req/s: lengthen duration_s"
        )
    t = t - t[0]
    n = len(t)
    prompt = params.prompt.sample(rng, n)
    output = params.output.sample(rng, n)
    failed = rng.random(n) < params.failure_prob
    output = np.where(failed, 0, output)
    if params.model_names:
        w = np.asarray(params.model_weights or [1.0] * len(params.model_names), dtype=np.float64)
        model = rng.choice(len(params.model_names), size=n, p=w / w.sum()).astype(np.int16)
    else:
        model = np.full(n, -1, dtype=np.int16)
    return Trace(
        arrival_s=t,
        prompt_tokens=prompt,
        output_tokens=output,
        priority=np.full(n, PRIORITY_NORMAL, dtype=np.int8),
        model=model,
        failed=failed,
        model_names=params.model_names,
        start_time=params.start_time,
        source=f"synthetic(seed={seed}, {params!r})",
        format="synthetic",
    )
