"""bench_cost_gap.py's pure parts: the early/late split of plans, the cold-start bound, and the seen-peak estimate
(the oracle plus a reserve of the largest need seen) that says what a policy blind to burst timing holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.policy import ScalingPlan
from tests.support.bench import load_bench

gap = load_bench("bench_cost_gap", "bench_cost_gap_under_test")


def _plan(p: int) -> ScalingPlan:
    return ScalingPlan(pool="default", prefill=p, decode=1, standby_prefill=0, standby_decode=0)


@given(times=st.lists(st.floats(0.0, 2000.0), max_size=40), split=st.floats(0.0, 2000.0))
def test_split_decisions_puts_every_plan_in_exactly_one_window_in_order(
    times: list[float], split: float
) -> None:
    decisions = [(t, _plan(i)) for i, t in enumerate(sorted(times))]
    halves = gap.split_decisions(decisions, split)
    assert halves["early"] + halves["late"] == decisions
    assert all(t < split for t, _ in halves["early"])
    assert all(t >= split for t, _ in halves["late"])


def test_cold_start_bound_is_the_ratio_with_the_late_part_matched() -> None:
    assert gap.cold_start_bound({"early": 300.0, "late": 900.0}, {"early": 100.0, "late": 400.0}) == 1.4
    assert math.isnan(gap.cold_start_bound({"early": 1.0, "late": 1.0}, {"early": 0.0, "late": 0.0}))


def test_seen_peak_estimate_keeps_a_burst_once_it_has_been_seen() -> None:
    need = np.zeros(20)
    need[5] = 4.0  # one burst at t = 5 s; lead 3 s
    held, estimate, floor_s = gap.seen_peak_estimate(need, 3)
    # the oracle: 4 over t = 2..5 (the burst a cold start ahead), 1 on the other 16 s; with the reserve also
    # 4 from t = 8 (seen at 5, ready one lead later) to 19, so 1 only at t = 0, 1, 6, 7
    assert held == 4 * 4 + 16 * 1
    assert estimate == 4 * 4 + 12 * 4 + 4 * 1
    assert floor_s == 16


@given(
    need=st.lists(st.integers(0, 30), min_size=1, max_size=200).map(lambda xs: np.array(xs, dtype=float)),
    lead=st.integers(0, 50),
)
def test_seen_peak_estimate_never_holds_less_than_the_oracle(need: np.ndarray, lead: int) -> None:
    held, estimate, floor_s = gap.seen_peak_estimate(need, lead)
    assert estimate >= held >= len(need)
    assert 0 <= floor_s <= len(need)
    assert estimate <= max(float(need.max()), 1.0) * len(need)


@pytest.mark.parametrize("level", [0.0, 1.0, 5.0])
def test_seen_peak_estimate_of_a_constant_need_is_the_oracle(level: float) -> None:
    held, estimate, _ = gap.seen_peak_estimate(np.full(50, level), 10)
    assert estimate == held == max(level, 1.0) * 50


def test_parse_oracle_h() -> None:
    assert gap.parse_oracle_h("code=0.6,conv=0") == {"code": 0.6, "conv": 0.0}
    with pytest.raises(ValueError, match="ROW=H"):
        gap.parse_oracle_h("code")
