"""Tail-request promotion in the simulator (TailPolicy), on hand-stepped virtual time.

The analytic model with ``max_num_batched_tokens=2000``: one 2000-token prompt per iteration, 10 + 20 = 30 ms;
one output token, so a colocated request completes (and gets its first token) when its prefill ends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator, TailPolicy
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.samples import STANDBY_PROMOTIONS_TOTAL, TAIL_PROMOTIONS_TOTAL
from serving.workload.trace import Trace

LAT = AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01)
NONE = RoleCounts(initial=0, max=0)


def fleet(active: int = 1, standby: int = 0, slo_ttft_ms: float = 100.0) -> FleetSpec:
    pool = PoolSpec(
        slo_ttft_ms=slo_ttft_ms,
        prefill=NONE,
        decode=NONE,
        mixed=RoleCounts(initial=active, standby=standby, max=4),
    )
    return FleetSpec(pools=(pool,))


def sim_of(
    f: FleetSpec,
    arrival_s: list[float],
    priority: list[int],
    tail: TailPolicy | None,
    activation_s: float = 5.0,
) -> Simulator:
    n = len(arrival_s)
    tr = Trace.from_arrays(
        np.array(arrival_s), np.full(n, 2000), np.ones(n, dtype=np.int64), priority=np.array(priority)
    )
    profile = AnalyticProfile(max_num_batched_tokens=2000, standby_activation_s=activation_s)
    return Simulator(f, {"default": tr}, models=analytic_models(profile, LAT), tail=tail)


# A, B, C (normal) at t=0; D, E, F (VIP) at 55 ms. Without promotion the VIPs overtake C (C ends last, at
# 180 ms). With fraction 0.5 of a 100-ms SLO: at 50 ms C (waiting; B is prefilling) moves to the front and
# runs at 60 ms; at 105 ms E and F (D is prefilling) are promoted, in arrival order.
ARRIVALS = [0.0, 0.0, 0.0, 0.055, 0.055, 0.055]
PRIORITIES = [1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize(
    ("tail", "ttft_ms", "promotions"),
    [
        pytest.param(None, [30, 60, 180, 35, 65, 95], 0, id="off: VIPs overtake the waiting C"),
        pytest.param(TailPolicy(promote_standby=False), [30, 60, 90, 65, 95, 125], 3, id="on: C goes first"),
    ],
)
def test_promotion_moves_a_waiting_request_to_the_front(
    tail: TailPolicy | None, ttft_ms: list[float], promotions: int
) -> None:
    sim = sim_of(fleet(), ARRIVALS, PRIORITIES, tail)
    sim.run_until(1.0)
    rep = sim.report()
    np.testing.assert_allclose(rep.request_ttft_ms, ttft_ms, atol=1e-9)
    assert rep.pools["default"]["tail_promotions"] == promotions
    assert rep.pools["default"]["standby_promotions"] == 0
    samples = sim.observe()
    if tail is None:
        assert TAIL_PROMOTIONS_TOTAL not in samples.counters
    else:
        assert samples.counters[TAIL_PROMOTIONS_TOTAL].tolist() == [promotions]


def test_standby_promoted_for_a_tail_request_takes_it_then_returns_to_standby() -> None:
    """Ten requests at t=0 on one active instance and one warm standby (activation 5 ms). At 50 ms C..J are
    waiting and promoted; C's promotion activates the standby, which at 55 ms takes C (TTFT 85 ms instead of
    90). The only standby is used once. After the hold (1 s from ready) it drains back to standby."""
    tail = TailPolicy(fraction=0.5, promote_standby=True, hold_s=1.0)
    sim = sim_of(fleet(active=1, standby=1), [0.0] * 10, [1] * 10, tail, activation_s=0.005)
    sim.run_until(0.5)
    rep = sim.report()
    ttft = rep.request_ttft_ms
    assert ttft[2] == pytest.approx(85.0)
    np.testing.assert_allclose(ttft[[0, 1, 3, 4]], [30.0, 60.0, 90.0, 120.0], atol=1e-9)
    assert rep.pools["default"]["tail_promotions"] == 8
    assert rep.pools["default"]["standby_promotions"] == 1
    assert sim.counts("default")["mixed"]["active"] == 2
    samples = sim.observe()
    by_id = dict(zip(samples.instance_ids, samples.counters[STANDBY_PROMOTIONS_TOTAL].tolist(), strict=True))
    assert by_id == {"default-mixed-0": 0.0, "default-mixed-1": 1.0}
    assert samples.counters[TAIL_PROMOTIONS_TOTAL].sum() == 8
    sim.set_target("default", "mixed", 1, 1)  # the controller repeats its target: the hold stays
    assert sim.counts("default")["mixed"]["active"] == 2
    sim.run_until(2.0)
    counts = sim.counts("default")["mixed"]
    assert (counts["active"], counts["standby"]) == (1, 1)
    assert sim.report().completed == 10


def test_a_new_target_ends_the_hold() -> None:
    tail = TailPolicy(hold_s=1.0)
    sim = sim_of(fleet(active=1, standby=1), [0.0] * 10, [1] * 10, tail, activation_s=0.005)
    sim.run_until(0.5)
    assert sim.counts("default")["mixed"]["active"] == 2
    sim.set_target("default", "mixed", 2, 0)  # the controller saw 2 active and keeps them
    sim.run_until(3.0)
    counts = sim.counts("default")["mixed"]
    assert (counts["active"], counts["standby"]) == (2, 0)


def test_request_parked_at_the_router_gets_a_standby() -> None:
    """No active instance: the request waits at the router; promotion activates the standby for it."""
    sim = sim_of(fleet(active=0, standby=1), [0.0], [1], TailPolicy(), activation_s=0.005)
    sim.run_until(1.0)
    rep = sim.report()
    assert rep.request_ttft_ms[0] == pytest.approx(85.0)  # 50 ms wait + 5 ms activation + 30 ms prefill
    assert rep.pools["default"]["standby_promotions"] == 1
    without = sim_of(fleet(active=0, standby=1), [0.0], [1], None, activation_s=0.005)
    without.run_until(1.0)
    assert without.report().completed == 0


def test_disaggregated_pool_promotes_prefill_waiters_only() -> None:
    pool = PoolSpec(
        slo_ttft_ms=100.0,
        prefill=RoleCounts(initial=1, standby=1, max=4),
        decode=RoleCounts(initial=1, standby=1, max=4),
    )
    n = 6
    tr = Trace.from_arrays(np.zeros(n), np.full(n, 2000), np.full(n, 20))
    profile = AnalyticProfile(max_num_batched_tokens=2000, standby_activation_s=0.005)
    sim = Simulator(
        FleetSpec(pools=(pool,)), {"default": tr}, models=analytic_models(profile, LAT), tail=TailPolicy()
    )
    sim.run_until(2.0)
    rep = sim.report()
    assert rep.completed == n
    assert rep.pools["default"]["tail_promotions"] == 4  # C..F waited at 50 ms
    assert rep.pools["default"]["standby_promotions"] == 1
    counts = sim.counts("default")
    assert counts["decode"]["standby"] == 1  # the decode standby was never touched
    assert counts["prefill"]["active"] == 2  # still held (hold_s 60 s)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"fraction": 0.0}, "fraction", id="fraction 0"),
        pytest.param({"fraction": 1.5}, "fraction", id="fraction > 1"),
        pytest.param({"hold_s": -1.0}, "hold_s", id="negative hold"),
        pytest.param({"fraction": math.nan}, "fraction", id="NaN fraction"),
    ],
)
def test_tail_policy_errors_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TailPolicy(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    arrivals=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=40),
    prompts=st.lists(st.integers(1, 3000), min_size=40, max_size=40),
    outputs=st.lists(st.integers(1, 50), min_size=40, max_size=40),
    standby=st.integers(0, 2),
    fraction=st.floats(0.05, 1.0),
    disaggregated=st.booleans(),
)
def test_every_request_completes_exactly_once(
    arrivals: list[float],
    prompts: list[int],
    outputs: list[int],
    standby: int,
    fraction: float,
    disaggregated: bool,
) -> None:
    n = len(arrivals)
    arr = np.sort(np.array(arrivals))
    tr = Trace.from_arrays(arr, np.array(prompts[:n]), np.array(outputs[:n]), priority=np.arange(n) % 3)
    if disaggregated:
        counts = RoleCounts(initial=1, standby=standby, max=4)
        pool = PoolSpec(slo_ttft_ms=50.0, prefill=counts, decode=counts)
    else:
        pool = PoolSpec(
            slo_ttft_ms=50.0, prefill=NONE, decode=NONE, mixed=RoleCounts(initial=1, standby=standby, max=4)
        )
    profile = AnalyticProfile(max_num_seqs=4, standby_activation_s=0.01)
    tail = TailPolicy(fraction=fraction, hold_s=0.2)
    sim = Simulator(
        FleetSpec(pools=(pool,)), {"default": tr}, models=analytic_models(profile, LAT), tail=tail
    )
    sim.run_to_completion(limit_s=60.0, step_s=0.1)
    assert sim.req.completions.tolist() == [1] * n
    rep = sim.report()
    assert rep.pools["default"]["standby_promotions"] <= rep.pools["default"]["tail_promotions"]
    for role, c in sim.counts("default").items():
        assert c["active"] + c["activating"] + c["standby"] + c["draining"] <= 4, role


def test_replay_passes_the_tail_policy_to_the_simulator() -> None:
    """``replay(..., tail=)`` turns promotion on: a queue behind one busy instance promotes the warm standby."""
    from serving.sim.replay import PolicyOptions, make_policy, replay

    n = 12
    tr = Trace.from_arrays(np.zeros(n), np.full(n, 2000), np.ones(n, dtype=np.int64))
    f = fleet(active=1, standby=1)
    models = analytic_models(AnalyticProfile(max_num_batched_tokens=2000, standby_activation_s=0.05), LAT)
    keep = PolicyOptions(standby=1)  # the fixed policy holds the counts it starts with, standby included
    off = replay(f, {"default": tr}, make_policy("fixed", keep), models=models, tick_s=0.05)
    on = replay(
        f, {"default": tr}, make_policy("fixed", keep), models=models, tick_s=0.05, tail=TailPolicy(0.5)
    )
    assert off.pools["default"].get("tail_promotions", 0) == 0
    assert on.pools["default"]["tail_promotions"] > 0 and on.pools["default"]["standby_promotions"] == 1
    assert on.completed == off.completed == n
