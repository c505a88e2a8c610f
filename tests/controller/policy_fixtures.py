"""Builders for policy tests: a plausible observation and capacity, overridable per field."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from controller.config import PolicyConfig
from controller.policy import PolicyContext, PoolCapacity, PoolForecast, PoolObservation, ScalingPlan

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


def decode_flap_plans(cfg: PolicyConfig, ticks: int, warm_standby_decode: int) -> list[ScalingPlan]:
    """``decide``'s plans, tick by tick, for the decode flap of the standby tests: 30 req/s for 20 s, then 12 and
    16 req/s on alternate ticks (the wanted decode count flips by one under a held active target of 6), with
    ``warm_standby_decode`` warm decode standby instances throughout."""
    from controller.policy import PoolState, decide

    state, out = PoolState(), []
    for t in range(ticks):
        rps = 30.0 if t < 20 else (12.0 if t % 2 else 16.0)
        o = obs(
            now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0,
            running_seqs=rps * 10.0, replicas={"prefill": 4, "decode": 6}, active={"prefill": 4, "decode": 6},
            standby={"prefill": 0, "decode": warm_standby_decode},
        )  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        out.append(plan)
    return out
