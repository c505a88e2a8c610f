"""The reactive baseline: Kubernetes-HPA-like scaling on measured utilisation and queue.

It sees only what has already happened (no forecast, no warm standby), exactly as an HPA or KEDA
scaler on vLLM metrics would: per role, ``desired = ceil(need / target_utilization)`` where ``need`` is the
measured load in instances (the same capacity arithmetic as the predictive policy, queue included), with
HPA's defaults: a 10 % tolerance, a 300 s scale-down stabilisation window (the highest recommendation of
the window wins) and a scale-up limit of max(+100 %, +4 replicas) per 15 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ConfigDict, Field

from controller.policy.stages import capacity_target, clamp
from controller.policy.types import ROLES, PoolCapacity, PoolObservation, ScalingPlan


class ReactiveConfig(BaseModel):
    """HPA's documented defaults; bounds shared with the predictive policy's config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_utilization: float = Field(0.7, gt=0.0, le=1.0, description="utilisation the HPA aims for")
    tolerance: float = Field(0.1, ge=0.0, lt=1.0, description="HPA's default tolerance")
    scale_down_window_s: float = Field(300.0, ge=0.0, description="HPA's default scale-down stabilisation")
    scale_up_period_s: float = Field(15.0, gt=0.0, description="HPA's default scale-up policy period")
    min_prefill: int = Field(1, ge=0)
    max_prefill: int = Field(64, ge=0)
    min_decode: int = Field(1, ge=0)
    max_decode: int = Field(64, ge=0)


@dataclass(frozen=True)
class ReactiveState:
    recommendations: dict[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    last_up_s: dict[str, float] = field(default_factory=dict)


def decide_reactive(
    obs: PoolObservation, cap: PoolCapacity, cfg: ReactiveConfig, slo_ttft_ms: float, state: ReactiveState
) -> tuple[ScalingPlan | None, ReactiveState]:
    """One HPA-like decision for one pool; None when the measured load is unknown."""
    measured = replace(obs, forecast=None)
    need = capacity_target(measured, cap, slo_ttft_ms / 1000.0)
    if need is None:
        return None, state
    wanted = {"prefill": need.prefill, "decode": need.decode}
    bounds = {"prefill": (cfg.min_prefill, cfg.max_prefill), "decode": (cfg.min_decode, cfg.max_decode)}
    recs = dict(state.recommendations)
    last_up = dict(state.last_up_s)
    final: dict[str, int] = {}
    reasons: list[str] = []
    for role in ROLES:
        current = obs.replicas.get(role, 0)
        desired = math.ceil(wanted[role] / cfg.target_utilization - 1e-9)
        if current > 0 and abs(wanted[role] / cfg.target_utilization / current - 1) <= cfg.tolerance:
            desired = current
        window = (
            *tuple((t, r) for t, r in recs.get(role, ()) if obs.now_s - t < cfg.scale_down_window_s),
            (obs.now_s, desired),
        )
        recs[role] = window
        target = desired
        if desired < current:
            target = min(current, max(r for _, r in window))
        elif desired > current:
            since = obs.now_s - last_up.get(role, -math.inf)
            if since < cfg.scale_up_period_s:
                target = current
            else:
                target = min(desired, max(2 * current, current + 4))
            if target > current:
                last_up[role] = obs.now_s
        lo, hi = bounds[role]
        final[role] = clamp(target, lo, hi)
        reasons.append(f"{role}: need {wanted[role]:.2f} → desired {desired}, target {final[role]}")
    plan = ScalingPlan(
        pool=obs.pool,
        prefill=final["prefill"],
        decode=final["decode"],
        standby_prefill=0,
        standby_decode=0,
        reasons=tuple(reasons),
    )
    return plan, ReactiveState(recommendations=recs, last_up_s=last_up)
