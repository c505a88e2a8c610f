"""The outcome of a replay: latency percentiles, SLO attainment, GPU-seconds, plus per-request arrays.

Definitions (fixed here so that every policy is judged alike):

- TTFT: arrival to first token reaching the client. Disaggregated: the end of the first decode step that
  includes the request on its decode instance (queue + prefill + KV transfer + wait for a decode slot + that
  step), as vLLM's P/D proxy streams the decode instance's tokens (see :mod:`serving.sim.engine`).
- ITL of a request: its *mean* inter-token latency, ``(t_done - t_first) / (tokens - 1)``; a one-token
  request has no ITL (NaN) and meets any ITL SLO.
- SLO attainment: the fraction of *all* requests of the trace that completed with TTFT <= its pool's
  ``slo_ttft_ms`` and ITL <= ``slo_itl_ms``; an unfinished request counts as a miss, and so does a rejected
  one (its client got an error, not an answer).
- GPU-seconds: GPUs x time of every instance in a state that holds GPUs (provisioning, standby,
  activating, active, draining).
- ``dropped`` is always 0: the simulator queues, it never drops; ``unfinished`` counts requests that had
  not completed when the replay stopped (see ``drain`` in :func:`serving.sim.replay.replay`).
- ``rejected``: requests no instance of their pool can hold (prompt + 1, or prompt + output on a decode or
  colocated instance, above one instance's KV cache): a real vLLM server refuses them (HTTP 400, longer than
  ``max_model_len``, which never exceeds the KV cache), so the simulator never routes them; no metric counts
  them. ``requests == completed + rejected + unfinished``.
- ``over_context``: requests *served* whose prompt + output exceeds their pool profile's ``max_model_len`` but
  fits the KV cache (a real vLLM server refuses them with HTTP 400); the simulator serves them as if it did not,
  and says how many. Rejected requests are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


def percentiles(values: np.ndarray) -> dict[str, float]:
    """``{p50, p90, p99}`` of the finite values; NaN for each when there are none."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return {f"p{q}": float("nan") for q in PERCENTILES}
    qs = np.percentile(finite, PERCENTILES)
    return {f"p{q}": float(v) for q, v in zip(PERCENTILES, qs, strict=True)}


@dataclass(frozen=True, eq=False)
class Timeline:
    """Per-tick series recorded by the replay loop (for plots)."""

    t_s: np.ndarray  # float64 [T], tick times
    active: dict[str, np.ndarray]  # role -> int64 [T], active instances summed over pools
    holding_gpu: np.ndarray  # int64 [T], instances holding GPUs (any role)


@dataclass(frozen=True, eq=False)
class ReplayReport:
    """What one replay measured. ``to_json()`` is the ``--json`` document."""

    policy: str
    profile: str
    requests: int
    completed: int
    unfinished: int
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    slo_attainment: float
    gpu_seconds: float
    scale_events: int
    preemptions: int
    sim_end_s: float
    wall_s: float
    pools: dict[str, dict[str, Any]]
    # per request, aligned with the concatenated traces (pool order of the fleet)
    arrival_s: np.ndarray = field(repr=False)
    pool_index: np.ndarray = field(repr=False)
    request_ttft_ms: np.ndarray = field(repr=False)
    request_itl_ms: np.ndarray = field(repr=False)
    timeline: Timeline | None = field(default=None, repr=False)
    dropped: int = 0
    over_context: int = 0
    rejected: int = 0

    def to_json(self) -> dict[str, Any]:
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not np.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            return x

        doc = {
            "policy": self.policy,
            "profile": self.profile,
            "requests": self.requests,
            "completed": self.completed,
            "dropped": self.dropped,
            "unfinished": self.unfinished,
            "rejected": self.rejected,
            "over_context": self.over_context,
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "e2e_ms": self.e2e_ms,
            "slo_attainment": self.slo_attainment,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": self.gpu_seconds / 3600.0,
            "scale_events": self.scale_events,
            "preemptions": self.preemptions,
            "sim_end_s": self.sim_end_s,
            "wall_s": self.wall_s,
            "itl_definition": "per-request mean inter-token latency",
            "pools": self.pools,
        }
        return {k: clean(v) for k, v in doc.items()}


def request_latencies_ms(
    arrival_s: np.ndarray, t_first_s: np.ndarray, t_done_s: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-request TTFT, mean ITL and end-to-end latency in ms (NaN where not defined or unfinished)."""
    ttft = (t_first_s - arrival_s) * 1000.0
    e2e = (t_done_s - arrival_s) * 1000.0
    gaps = (tokens - 1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(gaps > 0, (t_done_s - t_first_s) * 1000.0 / np.maximum(gaps, 1.0), np.nan)
    return ttft, itl, e2e


def slo_met(
    ttft_ms: np.ndarray, itl_ms: np.ndarray, done: np.ndarray, slo_ttft_ms: np.ndarray, slo_itl_ms: np.ndarray
) -> np.ndarray:
    """Boolean per request: completed, TTFT within its SLO, and ITL within its SLO (or no ITL)."""
    ttft_ok = ttft_ms <= slo_ttft_ms
    itl_ok = np.isnan(itl_ms) | (itl_ms <= slo_itl_ms)
    met: np.ndarray = done & ttft_ok & itl_ok
    return met
