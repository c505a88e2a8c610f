"""Values that cross the forecaster's boundary: metric frames in, forecasts out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Per-node input channels, in this order (forecaster/features.py builds them from a MetricFrame).
# Rates are per second; latencies in seconds. NaN = unknown; features carry a mask channel per input.
CHANNELS: tuple[str, ...] = (
    "arrival_rps",
    "prompt_tps",
    "gen_tps",
    "running",
    "waiting",
    "kv_usage",
    "ttft_p50_s",
    "ttft_p90_s",
    "itl_p50_s",
    "itl_p90_s",
)

# What is forecast over the next horizon_s, per node.
TARGETS: tuple[str, ...] = ("arrivals", "prompt_tokens", "gen_tokens")


@dataclass(frozen=True, eq=False)
class MetricFrame:
    """Per-node metric series on a regular time grid.

    ``values[n, m, t]`` is metric ``metrics[m]`` of node ``node_ids[n]`` at time ``times_s[t]``.
    NaN means unknown (no sample, outage, missing series) and must never be read as zero.
    """

    node_ids: tuple[str, ...]
    metrics: tuple[str, ...]
    times_s: np.ndarray  # float64 [T], increasing, regular step
    values: np.ndarray  # float64 [N, M, T]

    def __post_init__(self) -> None:
        expected = (len(self.node_ids), len(self.metrics), len(self.times_s))
        if self.values.shape != expected:
            raise ValueError(f"MetricFrame.values has shape {self.values.shape}, expected {expected}")

    def series(self, metric: str) -> np.ndarray:
        """All nodes' series of one metric, ``[N, T]``; all-NaN when the metric is absent."""
        if metric not in self.metrics:
            return np.full((len(self.node_ids), len(self.times_s)), np.nan)
        return self.values[:, self.metrics.index(metric), :]


@dataclass(frozen=True, eq=False)
class ForecastBatch:
    """One forecast per node for the window (now, now + horizon_s].

    Totals over the horizon (not rates): ``arrivals_p90[i]`` is the 90th-percentile number of requests
    node ``node_ids[i]`` will receive in the next ``horizon_s`` seconds. NaN = no forecast for that node.
    """

    node_ids: tuple[str, ...]
    horizon_s: float
    arrivals_p50: np.ndarray
    arrivals_p90: np.ndarray
    prompt_tokens_p50: np.ndarray
    prompt_tokens_p90: np.ndarray
    gen_tokens_p50: np.ndarray
    gen_tokens_p90: np.ndarray
    burst_prob: np.ndarray
    model_version: str


class Forecaster(Protocol):
    """Streaming per-node forecaster: one ``step`` per control tick, batched across nodes."""

    name: str
    horizon_s: float

    def reset(self, node_ids: Sequence[str]) -> None:
        """Forget all state and start tracking these nodes (in this order)."""
        ...

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        """Consume one new time step for every node and forecast.

        ``x``: float ``[N, len(CHANNELS)]`` raw channel values (NaN where unknown);
        ``mask``: bool ``[N, len(CHANNELS)]``, True where observed;
        ``now_s``: the time of this step, seconds since the Unix epoch (UTC). Forecasters with time features
        (the learned one) require it to be finite; others may ignore it.
        """
        ...
