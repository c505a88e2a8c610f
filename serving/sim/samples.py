"""What the simulator exports each simulated second: per-instance samples under vLLM's metric names.

The controller reads these exactly as it reads Prometheus (same names, same semantics: gauges are
instantaneous, counters and histogram buckets cumulative since the instance started).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Gauges
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
# Counters
PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "vllm:generation_tokens_total"
NUM_PREEMPTIONS_TOTAL = "vllm:num_preemptions_total"
REQUEST_SUCCESS_TOTAL = "vllm:request_success_total"
# Not a vLLM metric: arrivals routed to the instance (a router-side counter, exported by pdscale's router)
ROUTER_REQUESTS_TOTAL = "pdscale:router_requests_total"
# Not a vLLM metric: prompt tokens of the requests routed to an entry (prefill or mixed) instance, counted at
# routing (the router's estimate on real vLLM). Demand as it arrives: vllm:prompt_tokens_total counts tokens as
# they are processed, so it flattens at the instances' throughput exactly when demand exceeds it.
ROUTER_PROMPT_TOKENS_TOTAL = "pdscale:router_prompt_tokens_total"
# Not vLLM metrics, pdscale's router only: requests it sent to the instance (after any wait for a slot; every
# attempt), and requests waiting in its queues (labels stage, priority_class; pool when the router names it)
ROUTER_DISPATCHED_TOTAL = "pdscale:router_dispatched_total"
ROUTER_QUEUE_LENGTH = "pdscale:router_queue_length"
# Not exported by anything: the sources' own gauge, per entry instance, of the router-queued requests they added to
# its vllm:num_requests_waiting (``controller.sources.prometheus.add_router_queues``). Those wait for any instance;
# the rest of the waiting gauge is the instance's own queue, which only it serves.
ROUTER_QUEUE_SHARE = "pdscale:router_queue_share"
# Not vLLM metrics: tail-request handling in the simulator (serving.sim.engine.TailPolicy). Requests moved to
# the front of this instance's queue after waiting a fraction of the TTFT SLO, and times this instance was
# promoted from standby for such a request. Exported only when a TailPolicy is set.
TAIL_PROMOTIONS_TOTAL = "pdscale:tail_promotions_total"
STANDBY_PROMOTIONS_TOTAL = "pdscale:standby_promotions_total"
# Not a vLLM metric: the sum of the output-length predictions (serving.workload.outlen) of the requests routed
# to this entry (prefill or mixed) instance, counted at routing: decode demand known at arrival. Exported only
# when the simulator has an output predictor (unknown predictions add nothing).
PREDICTED_OUTPUT_TOKENS_TOTAL = "pdscale:predicted_output_tokens_total"
# Histograms (seconds)
TIME_TO_FIRST_TOKEN_SECONDS = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY_SECONDS = "vllm:e2e_request_latency_seconds"

# vLLM's own bucket bounds (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS_S: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


@dataclass(frozen=True, eq=False)
class Histogram:
    """Cumulative histogram per instance: ``counts[i, b]`` observations <= ``bounds_s[b]`` (last = +Inf)."""

    bounds_s: tuple[float, ...]
    counts: np.ndarray  # int64 [N, len(bounds_s) + 1], cumulative over buckets
    sums: np.ndarray  # float64 [N]


@dataclass(frozen=True, eq=False)
class InstanceSamples:
    """One scrape of every instance that exists at ``now_s`` (arrays aligned with ``instance_ids``)."""

    now_s: float
    instance_ids: tuple[str, ...]
    pools: tuple[str, ...]
    roles: tuple[str, ...]  # "prefill" | "decode" | "mixed"
    nodes: tuple[str, ...]
    states: tuple[str, ...]  # "provisioning" | "standby" | "active" | "draining" | "failed"
    gauges: dict[str, np.ndarray] = field(default_factory=dict)  # name -> float64 [N]
    counters: dict[str, np.ndarray] = field(default_factory=dict)  # name -> float64 [N], cumulative
    histograms: dict[str, Histogram] = field(default_factory=dict)


def histogram_quantile(
    q: float, bounds_s: Sequence[float], cumulative: Sequence[float] | np.ndarray
) -> float:
    """Prometheus' ``histogram_quantile(q, ...)`` on one cumulative bucket vector (the last entry the +Inf bucket).

    The rank ``q · count`` is found in the first bucket whose cumulative count reaches it and interpolated
    linearly between that bucket's bounds (the first bucket's lower bound is 0); in the +Inf bucket the answer is
    the highest finite bound. NaN when there are no observations or ``q`` is outside [0, 1] or NaN. One
    function for every reader: the controller (``controller.sources.aggregate``, the doctor) and both sides of
    ``sim validate``'s server view.
    """
    total = float(cumulative[-1]) if len(cumulative) else 0.0
    if not (total > 0 and 0.0 <= q <= 1.0) or not bounds_s:
        return math.nan
    rank = q * total
    idx = int(np.searchsorted(np.asarray(cumulative, dtype=np.float64), rank, side="left"))
    if idx >= len(bounds_s):
        return float(bounds_s[-1])
    lo_bound = 0.0 if idx == 0 else float(bounds_s[idx - 1])
    lo_count = 0.0 if idx == 0 else float(cumulative[idx - 1])
    in_bucket = float(cumulative[idx]) - lo_count
    if in_bucket <= 0:
        return float(bounds_s[idx])
    return lo_bound + (float(bounds_s[idx]) - lo_bound) * (rank - lo_count) / in_bucket
