"""The dynamo-like baseline: decides once per interval, Kalman-smoothed, Dynamo's throughput formulas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, obs

from controller.policy.dynamo import DynamoConfig, DynamoState, decide_dynamo, kalman_update


def test_decides_once_per_interval_with_the_throughput_formulas() -> None:
    cfg = DynamoConfig(adjustment_interval_s=10)
    state = DynamoState()
    plans = []
    for t in range(1, 21):
        o = obs(now_s=float(t), arrival_rps=10.0, prompt_tps=30_000.0, gen_tps=5_000.0)
        plan, state = decide_dynamo(o, CAP, cfg, 1.0, state)
        plans.append(plan)
    decided = [(i + 1, p) for i, p in enumerate(plans) if p is not None]
    assert [t for t, _ in decided] == [10, 20]
    plan = decided[-1][1]
    # 10 req/s × ISL 3000 / 10,000 tok/s → 3 prefill; 10 × OSL 500 / 2,000 → 2.5 → 3 decode
    assert (plan.prefill, plan.decode) == (3, 3)
    assert plan.standby_decode == 0


def test_unknown_ticks_do_not_count_as_idle() -> None:
    cfg = DynamoConfig(adjustment_interval_s=4)
    state = DynamoState()
    for t, rps in [(1, 10.0), (2, NAN), (3, 10.0), (4, 10.0)]:
        plan, state = decide_dynamo(
            obs(now_s=float(t), arrival_rps=rps, prompt_tps=1e4, gen_tps=1e3), CAP, cfg, 1.0, state
        )
    assert plan is not None and plan.prefill >= 1


@given(level=st.floats(1, 1e5), obs_=st.floats(0, 1e5))
def test_kalman_update_stays_between_prior_and_observation(level: float, obs_: float) -> None:
    new, var = kalman_update(level, level, obs_, 1.0, 1.0)
    assert min(level, obs_) - 1e-6 <= new <= max(level, obs_) + 1e-6
    assert var > 0


def test_kalman_converges_to_a_constant() -> None:
    level, var = float("nan"), float("nan")
    for _ in range(50):
        level, var = kalman_update(level, var, 100.0, 1.0, 1.0)
    assert level == pytest.approx(100.0)
