"""``load_smoothing_slo``: the measured rates averaged over a fraction of the pool's TTFT SLO before sizing (the
window is the larger of that and ``load_smoothing_s``), opt-in since session 16 (docs/OPERATIONS.md 7.24)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_fixtures import CAP, obs

from controller.config import PolicyConfig
from controller.policy import PolicyContext, PoolState, ScalingPlan, decide

# one second at 40,000 tok/s among seconds at 10,000: a Poisson-like spike on a 2-prefill pool
PROMPTS = (10_000.0, 10_000.0, 40_000.0, 10_000.0, 10_000.0, 10_000.0, 40_000.0, 10_000.0)


def plans(cfg: PolicyConfig, slo_ttft_ms: float) -> list[ScalingPlan | None]:
    state, out = PoolState(), []
    for k, prompt in enumerate(PROMPTS):
        o = replace(obs(), now_s=1_000.0 + k, prompt_tps=prompt, arrival_rps=prompt / 1_000.0)
        ctx = PolicyContext(obs=o, capacity=CAP, config=cfg, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=50.0)
        plan, state = decide(ctx, state)
        out.append(plan)
    return out


def test_a_fraction_of_the_slo_is_the_same_window_in_seconds() -> None:
    assert plans(PolicyConfig(load_smoothing_slo=1.0), 3_000.0) == plans(
        PolicyConfig(load_smoothing_s=3.0), 3_000.0
    )
    assert plans(PolicyConfig(load_smoothing_slo=0.5), 4_000.0) == plans(
        PolicyConfig(load_smoothing_s=2.0), 4_000.0
    )


def test_the_larger_window_wins() -> None:
    both = PolicyConfig(load_smoothing_slo=1.0, load_smoothing_s=5.0)
    assert plans(both, 2_000.0) == plans(PolicyConfig(load_smoothing_s=5.0), 2_000.0)


def test_a_one_second_slo_with_one_second_ticks_smooths_nothing() -> None:
    assert plans(PolicyConfig(load_smoothing_slo=1.0), 1_000.0) == plans(PolicyConfig(), 1_000.0)


def test_smoothing_over_the_slo_sizes_below_the_spike() -> None:
    raw = plans(PolicyConfig(), 5_000.0)
    smooth = plans(PolicyConfig(load_smoothing_slo=1.0), 5_000.0)
    assert all(p is not None for p in raw + smooth)
    # the spike tick (index 2): raw sizes on 40,000 tok/s, the 5-s window on the mean of the three seconds seen
    spike_raw, spike_smooth = raw[2], smooth[2]
    assert spike_raw is not None and spike_smooth is not None
    assert spike_smooth.prefill < spike_raw.prefill


@pytest.mark.parametrize("bad", [-0.1, 10.5])
def test_out_of_range_fractions_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="load_smoothing_slo"):
        PolicyConfig(load_smoothing_slo=bad)
