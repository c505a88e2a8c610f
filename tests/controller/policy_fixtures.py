"""Builders for policy tests: a plausible observation and capacity, overridable per field."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from controller.config import PolicyConfig
from controller.policy import PolicyContext, PoolCapacity, PoolForecast, PoolObservation

CAP = PoolCapacity(prefill_tps=10_000.0, decode_seqs=64.0, decode_tps=2_000.0, gpus_per_instance=1)


def obs(**kw: Any) -> PoolObservation:
    base = PoolObservation(
        pool="default",
        now_s=1000.0,
        replicas={"prefill": 2, "decode": 4},
        active={"prefill": 2, "decode": 4},
        standby={"prefill": 0, "decode": 2},
        provisioning={"prefill": 0, "decode": 0},
        arrival_rps=10.0,
        prompt_tps=10_000.0,
        gen_tps=2_000.0,
        running_seqs=100.0,
        waiting_requests=0.0,
        oldest_wait_s=0.0,
        kv_usage=0.5,
        mean_prompt_tokens=1000.0,
        mean_output_tokens=200.0,
        forecast=None,
    )
    return replace(base, **kw)


def forecast(
    prompt_tps: float = 10_000.0, gen_tps: float = 2_000.0, burst: float = 0.0, rps: float = 10.0
) -> PoolForecast:
    h = 5.0
    return PoolForecast(
        horizon_s=h,
        arrivals_p50=rps * h,
        arrivals_p90=rps * h,
        prompt_tokens_p90=prompt_tps * h,
        gen_tokens_p90=gen_tps * h,
        burst_prob=burst,
    )


def ctx(o: PoolObservation, cfg: PolicyConfig | None = None, cap: PoolCapacity = CAP) -> PolicyContext:
    return PolicyContext(
        obs=o, capacity=cap, config=cfg or PolicyConfig(), slo_ttft_ms=1000.0, slo_itl_ms=50.0
    )


NAN = math.nan
