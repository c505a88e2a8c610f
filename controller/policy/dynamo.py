"""The ``dynamo-like`` baseline: NVIDIA Dynamo planner's SLA mode, as published.

Every ``adjustment_interval_s`` (Dynamo's default: 180 s) it takes the interval's request count, mean
prompt length and mean output length, predicts the next interval's count with a Kalman filter (a local-
level model; Dynamo also offers constant, ARIMA and Prophet predictors), and sizes each pool with the
throughput formulas of its planner: ``prefill = ceil(rate × ISL / prefill_throughput_per_instance)`` and
``decode = ceil(rate × OSL / decode_throughput_per_instance)`` where the per-instance throughputs are taken
at the TTFT and ITL SLOs from the same profile (``PoolCapacity``), each pool rounded up separately. Like
Dynamo it ignores the queue and keeps no warm standby. Pure: state in, state out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from controller.policy.stages import clamp
from controller.policy.types import PoolCapacity, PoolObservation, ScalingPlan


class DynamoConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    adjustment_interval_s: float = Field(180.0, gt=0.0, description="Dynamo planner's default interval")
    process_noise: float = Field(1.0, gt=0.0, description="Kalman process variance, relative to the level")
    measurement_noise: float = Field(1.0, gt=0.0, description="Kalman measurement variance (Poisson: ~count)")
    min_prefill: int = Field(1, ge=0)
    max_prefill: int = Field(64, ge=0)
    min_decode: int = Field(1, ge=0)
    max_decode: int = Field(64, ge=0)


@dataclass(frozen=True)
class DynamoState:
    interval_start_s: float = math.nan
    arrivals: float = 0.0
    prompt_tokens: float = 0.0
    gen_tokens: float = 0.0
    level: float = math.nan  # Kalman estimate of requests per interval
    variance: float = math.nan
    last_plan: tuple[int, int] | None = None


def kalman_update(level: float, variance: float, observed: float, q: float, r: float) -> tuple[float, float]:
    """One predict+update step of a local-level Kalman filter; returns (level, variance)."""
    if math.isnan(level):
        return observed, max(observed, 1.0) * r
    prior_var = variance + q * max(level, 1.0)
    meas_var = r * max(observed, 1.0)
    gain = prior_var / (prior_var + meas_var)
    return level + gain * (observed - level), (1 - gain) * prior_var


def decide_dynamo(
    obs: PoolObservation, cap: PoolCapacity, cfg: DynamoConfig, dt_s: float, state: DynamoState
) -> tuple[ScalingPlan | None, DynamoState]:
    """Accumulate this tick's load; at the end of each interval, predict and size. None between adjustments
    and when the interval's load is unknown."""
    start = obs.now_s - dt_s if math.isnan(state.interval_start_s) else state.interval_start_s
    known = all(math.isfinite(x) for x in (obs.arrival_rps, obs.prompt_tps, obs.gen_tps))
    acc = DynamoState(
        interval_start_s=start,
        arrivals=state.arrivals + (obs.arrival_rps * dt_s if known else 0.0),
        prompt_tokens=state.prompt_tokens + (obs.prompt_tps * dt_s if known else 0.0),
        gen_tokens=state.gen_tokens + (obs.gen_tps * dt_s if known else 0.0),
        level=state.level,
        variance=state.variance,
        last_plan=state.last_plan,
    )
    if obs.now_s - start < cfg.adjustment_interval_s:
        return None, acc
    if acc.arrivals <= 0:
        level, variance = kalman_update(
            acc.level, acc.variance, 0.0, cfg.process_noise, cfg.measurement_noise
        )
        isl = osl = 0.0
    else:
        level, variance = kalman_update(
            acc.level, acc.variance, acc.arrivals, cfg.process_noise, cfg.measurement_noise
        )
        isl = acc.prompt_tokens / acc.arrivals
        osl = acc.gen_tokens / acc.arrivals
    interval_s = obs.now_s - start
    rate_rps = max(level, 0.0) / interval_s
    prefill = clamp(math.ceil(rate_rps * isl / cap.prefill_tps - 1e-9), cfg.min_prefill, cfg.max_prefill)
    decode = clamp(math.ceil(rate_rps * osl / cap.decode_tps - 1e-9), cfg.min_decode, cfg.max_decode)
    plan = ScalingPlan(
        pool=obs.pool,
        prefill=prefill,
        decode=decode,
        standby_prefill=0,
        standby_decode=0,
        reasons=(
            f"interval {interval_s:.0f} s: {acc.arrivals:.0f} requests, ISL {isl:.0f}, OSL {osl:.0f}; "
            f"Kalman next {level:.0f} → {rate_rps:.2f} req/s → prefill {prefill}, decode {decode}",
        ),
    )
    return plan, DynamoState(
        interval_start_s=obs.now_s, level=level, variance=variance, last_plan=(prefill, decode)
    )
