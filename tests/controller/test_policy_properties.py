"""Invariants of the policy for any input (hypothesis), NaN and inf included."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import ctx, forecast, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, ScalingPlan, allocate_budget, decide

anything = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1e7),
)
configs = st.builds(
    PolicyConfig,
    headroom=st.floats(0, 2),
    buffer_multiplier=st.floats(0, 4),
    standby_decode=st.integers(0, 4),
    min_prefill=st.integers(0, 3),
    max_prefill=st.integers(3, 40),
    min_decode=st.integers(0, 3),
    max_decode=st.integers(3, 40),
    scale_down_delay_s=st.floats(0, 300),
    ramp_up_s=st.floats(0, 300),
    pd_ratio_min=st.sampled_from([0.0, 0.25]),
    pd_ratio_max=st.sampled_from([0.0, 1.0]),
    standby_sizing=st.sampled_from(["uncertainty", "flat"]),
    provision_lead_s=st.floats(0, 300),
    max_scale_down_fraction_per_min=st.floats(0, 1),
)


@settings(max_examples=300, deadline=None)
@given(
    cfg=configs,
    prompt=anything,
    gen=anything,
    running=anything,
    waiting=anything,
    fc_prompt=anything,
    burst=anything,
    active=st.integers(0, 50),
)
def test_replicas_always_within_min_max(
    cfg: PolicyConfig,
    prompt: float,
    gen: float,
    running: float,
    waiting: float,
    fc_prompt: float,
    burst: float,
    active: int,
) -> None:
    o = obs(
        prompt_tps=prompt,
        gen_tps=gen,
        running_seqs=running,
        waiting_requests=waiting,
        replicas={"prefill": active, "decode": active},
        forecast=forecast(prompt_tps=fc_prompt, burst=burst),
    )
    plan, _ = decide(ctx(o, cfg), PoolState())
    if plan is not None:
        assert cfg.min_prefill <= plan.prefill <= cfg.max_prefill
        assert cfg.min_decode <= plan.decode <= cfg.max_decode
        assert plan.standby_decode >= 0 and plan.buffer_seqs >= 0


@settings(max_examples=200, deadline=None)
@given(low=st.floats(0, 1e6), extra=st.floats(0, 1e6), gen_low=st.floats(0, 1e5), gen_extra=st.floats(0, 1e5))
def test_replicas_never_fall_as_forecast_rises(
    low: float, extra: float, gen_low: float, gen_extra: float
) -> None:
    cfg = PolicyConfig(ramp_up_s=0, max_prefill=10_000, max_decode=10_000)
    a, _ = decide(ctx(obs(forecast=forecast(prompt_tps=low, gen_tps=gen_low)), cfg), PoolState())
    b, _ = decide(
        ctx(obs(forecast=forecast(prompt_tps=low + extra, gen_tps=gen_low + gen_extra)), cfg), PoolState()
    )
    assert a is not None and b is not None
    assert b.prefill >= a.prefill and b.decode >= a.decode


@settings(max_examples=100, deadline=None)
@given(
    loads=st.lists(st.floats(0, 200_000), min_size=2, max_size=60),
    step_s=st.floats(0.5, 10),
    delay_s=st.floats(0, 120),
    per_min=st.floats(0.5, 20),
    fraction=st.floats(0.0, 1.0),
)
def test_stateful_no_scale_down_within_delay_and_bounded_steps(
    loads: list[float], step_s: float, delay_s: float, per_min: float, fraction: float
) -> None:
    cfg = PolicyConfig(
        scale_down_delay_s=delay_s,
        max_scale_down_per_min=per_min,
        max_scale_down_fraction_per_min=fraction,
        ramp_up_s=0,
        standby_decode=0,
        max_prefill=1000,
        max_decode=1000,
    )
    state = PoolState()
    current = {"prefill": 1, "decode": 1}
    last_up = {"prefill": -math.inf, "decode": -math.inf}
    last_change = {"prefill": -math.inf, "decode": -math.inf}
    for i, load in enumerate(loads):
        now = i * step_s
        o = obs(now_s=now, prompt_tps=load, gen_tps=load / 5, running_seqs=0.0, replicas=dict(current))
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        for role in ("prefill", "decode"):
            new = plan.count(role)
            if new < current[role]:
                assert now - last_up[role] >= delay_s, (role, now, last_up[role])
                if math.isfinite(last_change[role]):
                    rate = max(per_min, fraction * current[role])
                    allowed = math.floor(rate * (now - last_change[role]) / 60)
                    assert current[role] - new <= allowed, (role, now, current[role], new)
            if new > current[role]:
                last_up[role] = now
            if new != current[role]:
                last_change[role] = now
            current[role] = new


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 3)), min_size=1, max_size=4
    ),
    gpus=st.lists(st.integers(1, 8), min_size=4, max_size=4),
    budget=st.integers(0, 200),
)
def test_budget_never_exceeded(counts: list[tuple[int, int, int]], gpus: list[int], budget: int) -> None:
    plans = [ScalingPlan(f"p{i}", p, d, 0, s) for i, (p, d, s) in enumerate(counts)]
    needs = {f"p{i}": (p * 0.8, d * 0.8) for i, (p, d, _) in enumerate(counts)}
    per = {f"p{i}": gpus[i] for i in range(len(counts))}
    out = allocate_budget(plans, needs, per, budget)
    assert sum(p.gpus(per[p.pool]) for p in out) <= budget
    for before, after in zip(plans, out, strict=True):
        assert after.prefill <= before.prefill and after.decode <= before.decode
