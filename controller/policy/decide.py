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
    need = stages.capacity_target(obs, cap, ctx.slo_ttft_ms / 1000.0)
    if need is None:
        return None, state
    reasons = list(need.reasons)
    prefill, decode, why = stages.with_headroom(need, cfg.headroom)
    reasons.append(why)
    decode, buffer_seqs, why = stages.buffer_target(need.running_seqs, decode, cfg.buffer_multiplier, cap)
    reasons.append(why)
    degrade, state, why_degrade = stages.degrade_stage(prefill, decode, cfg, obs.now_s, state)
    if why_degrade:
        reasons.append(why_degrade)
    prefill, decode, state, why_standby = stages.standby_stage(prefill, decode, obs, cfg, state)
    reasons.extend(why_standby)
    prefill, decode, why_ratio = stages.pd_ratio_stage(prefill, decode, cfg.pd_ratio_min, cfg.pd_ratio_max)
    if why_ratio:
        reasons.append(why_ratio)

    wanted = {"prefill": prefill, "decode": decode}
    standby_target = {"prefill": cfg.standby_prefill, "decode": cfg.standby_decode}
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
