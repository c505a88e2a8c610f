"""``decide``: the predictive policy for one pool, composed from the stages in ``stages.py``, and
``allocate_budget``: the fleet-wide GPU budget across pools."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.config import PolicyConfig
from controller.policy import stages
from controller.policy.types import (
    ROLES,
    PoolCapacity,
    PoolObservation,
    PoolState,
    RoleHistory,
    ScalingPlan,
)


@dataclass(frozen=True)
class PolicyContext:
    """Everything one decision may look at; nothing else (no clock, no I/O)."""

    obs: PoolObservation
    capacity: PoolCapacity
    config: PolicyConfig
    slo_ttft_ms: float
    slo_itl_ms: float


def decide(ctx: PolicyContext, state: PoolState) -> tuple[ScalingPlan | None, PoolState]:
    """One tick's decision for one pool: a plan, or None ("no opinion") when the load is unknown.

    Unknown load never scales down: the caller keeps the current scale on None.
    """
    obs, cfg, cap = ctx.obs, ctx.config, ctx.capacity
    need = stages.capacity_target(obs, cap, ctx.slo_ttft_ms / 1000.0, cfg.provision_lead_s)
    if need is None:
        return None, state
    reasons = list(need.reasons)
    state = replace(
        state, rate_history=stages.update_rate_history(state.rate_history, obs.now_s, obs.arrival_rps)
    )
    factor, why_trend = stages.trend_factor(state.rate_history, obs.now_s, cfg.provision_lead_s)
    if why_trend:
        need = stages.with_trend(need, factor)
        reasons.append(why_trend)
    prefill, decode, why = stages.with_headroom(need, cfg.headroom)
    reasons.append(why)
    decode, buffer_seqs, why = stages.buffer_target(need.running_seqs, decode, cfg.buffer_multiplier, cap)
    reasons.append(why)
    degrade, state, why_degrade = stages.degrade_stage(prefill, decode, cfg, obs.now_s, state)
    if why_degrade:
        reasons.append(why_degrade)
    standby_target, state, why_sized = _standby_targets(need, prefill, decode, obs, cfg, state)
    reasons.extend(why_sized)
    prefill, decode, state, why_standby = stages.standby_stage(
        prefill, decode, obs, cfg, state, (standby_target["prefill"], standby_target["decode"])
    )
    reasons.extend(why_standby)

    prefill, decode, why_ratio = stages.pd_ratio_stage(prefill, decode, cfg.pd_ratio_min, cfg.pd_ratio_max)
    if why_ratio:
        reasons.append(why_ratio)

    wanted = {"prefill": prefill, "decode": decode}
    bounds = {"prefill": (cfg.min_prefill, cfg.max_prefill), "decode": (cfg.min_decode, cfg.max_decode)}
    roles = dict(state.roles)
    final: dict[str, int] = {}
    for role in ROLES:
        current = obs.replicas.get(role, 0)
        target, roles[role], why_h = stages.hysteresis_stage(
            role,
            wanted[role],
            current,
            obs.now_s,
            cfg,
            state.roles.get(role, RoleHistory()),
            can_scale_down=obs.complete,
            fast_up=obs.standby.get(role, 0),
        )
        if why_h:
            reasons.append(why_h)
        lo, hi = bounds[role]
        clamped = stages.clamp(target, lo, hi)
        if clamped != target:
            reasons.append(f"{role}: clamped {target} → {clamped} to [{lo}, {hi}]")
        final[role] = clamped
    state = replace(state, roles=roles)
    plan = ScalingPlan(
        pool=obs.pool,
        prefill=final["prefill"],
        decode=final["decode"],
        standby_prefill=standby_target["prefill"],
        standby_decode=standby_target["decode"],
        buffer_seqs=buffer_seqs,
        degrade=degrade,
        reasons=tuple(reasons),
    )
    return plan, state


def _standby_targets(
    need: stages.Need, prefill: int, decode: int, obs: PoolObservation, cfg: PolicyConfig, state: PoolState
) -> tuple[dict[str, int], PoolState, list[str]]:
    """Standby per role: the configured counts ('flat'), or sized by the forecast's spread and held like
    replicas for max(scale-down delay, provision lead) ('uncertainty')."""
    target = {"prefill": cfg.standby_prefill, "decode": cfg.standby_decode}
    if cfg.standby_sizing == "flat":
        return target, state, []
    spread = stages.forecast_spread(obs)
    reasons = []
    for role, role_need, active in (("prefill", need.prefill, prefill), ("decode", need.decode, decode)):
        target[role], why = stages.standby_size(role_need, active, cfg.headroom, spread, target[role])
        reasons.append(f"{role}: {why}")
    hold_s = max(cfg.scale_down_delay_s, cfg.provision_lead_s)
    recent, held = stages.hold_standby(
        state.standby_recent, obs.now_s, (target["prefill"], target["decode"]), hold_s
    )
    if held != (target["prefill"], target["decode"]):
        reasons.append(f"standby held at {held[0]} prefill, {held[1]} decode for {hold_s:.0f} s")
    return {"prefill": held[0], "decode": held[1]}, replace(state, standby_recent=recent), reasons


def _with_count(plan: ScalingPlan, field: str, value: int, reason: str) -> ScalingPlan:
    counts = {
        "prefill": plan.prefill,
        "decode": plan.decode,
        "standby_prefill": plan.standby_prefill,
        "standby_decode": plan.standby_decode,
    }
    counts[field] = value
    return ScalingPlan(
        pool=plan.pool,
        prefill=counts["prefill"],
        decode=counts["decode"],
        standby_prefill=counts["standby_prefill"],
        standby_decode=counts["standby_decode"],
        buffer_seqs=plan.buffer_seqs,
        degrade=plan.degrade,
        reasons=(*plan.reasons, reason),
    )


def _risk(count: int, need: float) -> float:
    """How close a pool/role is to missing its SLO with ``count`` instances (need / count; inf at 0)."""
    if need <= 0:
        return 0.0
    return math.inf if count <= 0 else need / count


def allocate_budget(
    plans: list[ScalingPlan],
    needs: dict[str, tuple[float, float]],
    gpus_per_instance: dict[str, int],
    budget_gpus: int | None,
) -> list[ScalingPlan]:
    """Fit all pools' plans into one GPU budget (applied before min/max re-clamping by the actuator).

    Standby replicas go first (they serve nobody yet); then instances are taken one at a time from the
    pool and role at the lowest SLO risk (its need per instance after removal), so the pool that would miss
    its SLO first keeps its GPUs. Every cut is written into that plan's reasons.
    """
    if budget_gpus is None:
        return plans
    current = {p.pool: p for p in plans}

    def used() -> int:
        return sum(p.gpus(gpus_per_instance[p.pool]) for p in current.values())

    for pool in list(current):
        while used() > budget_gpus and (current[pool].standby_decode or current[pool].standby_prefill):
            p = current[pool]
            cut = "decode" if p.standby_decode >= p.standby_prefill else "prefill"
            current[pool] = _with_count(
                p, f"standby_{cut}", p.standby(cut) - 1, f"budget {budget_gpus} GPUs: standby {cut} -1"
            )
    while used() > budget_gpus:
        best: tuple[float, str, str] | None = None
        for pool, p in current.items():
            need_p, need_d = needs.get(pool, (0.0, 0.0))
            for role, count, need in (("prefill", p.prefill, need_p), ("decode", p.decode, need_d)):
                if count <= 0:
                    continue
                risk_after = _risk(count - 1, need)
                if best is None or risk_after < best[0]:
                    best = (risk_after, pool, role)
        if best is None:
            break
        _, pool, role = best
        p = current[pool]
        current[pool] = _with_count(
            p, role, p.count(role) - 1, f"budget {budget_gpus} GPUs: {role} -1 (lowest SLO risk in the fleet)"
        )
    return [current[p.pool] for p in plans]
