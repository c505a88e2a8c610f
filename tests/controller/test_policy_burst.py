"""The burst reserve (stages 3a): per-block needs, the observed cold-start-long rises and peaks, and the
stage that keeps them warm; the offered prompt load. Labelled tables on hand-built inputs, properties, and a
stepped on/off run through ``decide``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, ctx, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages

BLOCK = stages.NEED_BLOCK_S


def _blocks(needs: list[float], decode: float = 1.0) -> tuple[tuple[float, float, float, int], ...]:
    """One block per value, consecutive, prefill need = the value."""
    return tuple((i * BLOCK, v, decode, 5) for i, v in enumerate(needs))


def test_a_block_keeps_the_mean_of_its_ticks_and_old_blocks_are_forgotten() -> None:
    blocks: tuple[tuple[float, float, float, int], ...] = ()
    blocks, opened = stages.update_need_blocks(blocks, 0.0, (2.0, 1.0), keep_s=12.0)
    assert opened and blocks == ((0.0, 2.0, 1.0, 1),)
    blocks, opened = stages.update_need_blocks(blocks, 1.0, (4.0, 3.0), keep_s=12.0)
    assert not opened and blocks == ((0.0, 3.0, 2.0, 2),)
    blocks, _ = stages.update_need_blocks(blocks, 5.0, (1.0, 1.0), keep_s=12.0)
    blocks, _ = stages.update_need_blocks(blocks, 10.0, (1.0, 1.0), keep_s=12.0)
    blocks, opened = stages.update_need_blocks(blocks, 15.0, (1.0, 1.0), keep_s=12.0)
    assert opened and [b[0] for b in blocks] == [5.0, 10.0, 15.0]


@pytest.mark.parametrize(
    ("label", "need"),
    [("prefill unknown", (NAN, 1.0)), ("decode unknown", (1.0, NAN)), ("negative", (-1.0, 1.0))],
)
def test_unknown_need_is_not_a_quiet_block(label: str, need: tuple[float, float]) -> None:
    blocks = _blocks([3.0])
    assert stages.update_need_blocks(blocks, 7.0, need, keep_s=100.0) == (blocks, False), label


@pytest.mark.parametrize(
    ("label", "needs", "lead_s", "q", "rise", "peak"),
    [
        # A step 0 -> 10 at block 4; lead 20 s = 4 blocks: blocks 0..3 see it coming (rise 10), later none.
        ("step seen within the lead", [0, 0, 0, 0, 10, 10, 10, 10], 20.0, 1.0, 10.0, 10.0),
        # Block 0 ends 25 s before the step: with a 10-s lead only blocks 2, 3 see it (2 of 7 pairs).
        ("median ignores a rare rise", [0, 0, 0, 0, 10, 10, 10, 10], 10.0, 0.5, 0.0, 10.0),
        ("flat load has no rise", [4, 4, 4, 4], 20.0, 1.0, 0.0, 4.0),
        # Falling load: rises floor at 0; the peak ahead of each block is what followed it.
        ("falling load", [8, 6, 4, 2], 20.0, 1.0, 0.0, 6.0),
    ],
)
def test_burst_reserve_table(
    label: str, needs: list[float], lead_s: float, q: float, rise: float, peak: float
) -> None:
    (rise_p, _), (peak_p, _) = stages.burst_reserve(_blocks(needs), lead_s, q)
    assert rise_p == pytest.approx(rise), label
    assert peak_p == pytest.approx(peak), label


def test_burst_reserve_counts_time_not_blocks() -> None:
    # A 60-s gap (no data) between blocks: the block before the gap must not see past the 20-s lead.
    blocks = ((0.0, 0.0, 1.0, 5), (5.0, 0.0, 1.0, 5), (70.0, 9.0, 1.0, 5))
    (rise, _), _ = stages.burst_reserve(blocks, 20.0, 1.0)
    assert rise == 0.0


def test_burst_reserve_unknown_without_a_pair() -> None:
    (rise, _), (peak, _) = stages.burst_reserve(_blocks([3.0]), 120.0, 0.9)
    assert math.isnan(rise) and math.isnan(peak)


@settings(max_examples=60, deadline=None)
@given(
    needs=st.lists(st.floats(0.0, 100.0), min_size=2, max_size=60),
    lead_s=st.floats(BLOCK, 300.0),
    q=st.floats(0.0, 1.0),
)
def test_rise_and_peak_are_bounded_by_what_was_seen(needs: list[float], lead_s: float, q: float) -> None:
    (rise, _), (peak, _) = stages.burst_reserve(_blocks(needs), lead_s, q)
    assert 0.0 <= rise <= max(needs) - min(needs) + 1e-9
    assert min(needs) - 1e-9 <= peak <= max(needs) + 1e-9


def _with_reserve(mode: str, rise: float, peak: float, now_s: float = 1000.0) -> PoolState:
    """A state whose remembered reserve is (rise, peak) for prefill and (0, 0) for decode, with a block open
    at now_s (so the stage does not recompute it)."""
    start = math.floor(now_s / BLOCK) * BLOCK
    return PoolState(need_blocks=((start, 1.0, 1.0, 1),), reserve=((rise, 0.0), (peak, 0.0)))


@pytest.mark.parametrize(
    ("label", "mode", "rise", "peak", "prefill", "standby_prefill"),
    [
        ("off changes nothing", "off", 5.0, 8.0, 2, 0),
        # load need 1 prefill (10k tok/s / 10k); min(1 + 5, 8) = 6, x1.3 headroom = 7.8 -> 8.
        ("active: now + rise, with headroom", "active", 5.0, 8.0, 8, 0),
        # min(1 + 5, 3) = 3 -> 3.9 -> 4: the observed peak caps the rise.
        ("active: capped by the peak", "active", 5.0, 3.0, 4, 0),
        ("standby: the difference kept warm", "standby", 5.0, 8.0, 2, 6),
        ("never lowers the target", "active", 0.0, 0.0, 2, 0),
    ],
)
def test_burst_reserve_stage(
    label: str, mode: str, rise: float, peak: float, prefill: int, standby_prefill: int
) -> None:
    cfg = PolicyConfig(burst_reserve=mode)  # a Literal from a table (pydantic validates it)
    p, _, standby, _, reasons = stages.burst_reserve_stage(
        2, 4, obs(), CAP, cfg, _with_reserve(mode, rise, peak)
    )
    assert (p, standby[0]) == (prefill, standby_prefill), label
    assert bool(reasons) == (mode != "off"), label


def test_offered_prompt_load_sizes_a_saturated_pool() -> None:
    # The pool prefills 10k tok/s (its capacity) while 30 req/s x 1000 tokens arrive and a queue forms.
    saturated = obs(arrival_rps=30.0, prompt_tps=10_000.0, waiting_requests=1.0)
    need = stages.capacity_target(saturated, CAP, slo_ttft_s=1.0, offered=True)
    assert need is not None and need.prefill == pytest.approx(3.1)  # 30k offered + 1k/s of queue
    blind = stages.capacity_target(saturated, CAP, slo_ttft_s=1.0)
    assert blind is not None and blind.prefill == pytest.approx(1.1)  # what the counter alone says


@pytest.mark.parametrize(
    ("label", "kw"),
    [
        # No queue: the pool keeps up, so the counter is what arrives (the mean length is a slow average).
        ("no queue", {"arrival_rps": 30.0, "waiting_requests": 0.0}),
        ("arrivals unknown", {"arrival_rps": NAN, "waiting_requests": 5.0}),
        ("mean prompt unknown", {"mean_prompt_tokens": NAN, "waiting_requests": 5.0}),
    ],
)
def test_offered_load_only_where_it_is_known_and_a_queue_says_so(label: str, kw: dict[str, float]) -> None:
    assert math.isnan(stages.offered_prompt_tps(obs(**kw))), label


def _run(cfg: PolicyConfig, schedule: list[tuple[float, float]]) -> list[tuple[float, int]]:
    """Step ``decide`` once a second through (until_s, arrival_rps) segments, the replicas following the
    plan at once; returns (t, prefill) per tick."""
    state, replicas, out, t = PoolState(), {"prefill": 1, "decode": 1}, [], 0.0
    for until_s, rps in schedule:
        while t < until_s:
            o = obs(
                now_s=t,
                arrival_rps=rps,
                prompt_tps=rps * 1000.0,
                gen_tps=rps * 200.0,
                running_seqs=rps * 10.0,
                replicas=dict(replicas),
                active=dict(replicas),
                standby={"prefill": 0, "decode": 0},
            )
            plan, state = decide(ctx(o, cfg), state)
            assert plan is not None
            replicas = {"prefill": plan.prefill, "decode": plan.decode}
            out.append((t, plan.prefill))
            t += 1.0
    return out


def test_capacity_for_a_seen_burst_stays_through_the_quiet_that_follows() -> None:
    # 30-s bursts of 60 req/s (6 prefill instances of load) every 5 minutes, idle in between.
    burst = [(300.0, 0.0), (330.0, 60.0), (600.0, 0.0), (630.0, 60.0), (900.0, 0.0)]
    # The reserve alone: the burst hold (test_policy_burst_hold.py) would also keep it through the quiet.
    on = _run(PolicyConfig(burst_reserve="active", burst_hold="off"), burst)
    off = _run(PolicyConfig(burst_reserve="off", burst_hold="off"), burst)
    quiet_on = min(p for t, p in on if 500.0 <= t < 600.0)
    quiet_off = min(p for t, p in off if 500.0 <= t < 600.0)
    assert quiet_off <= 1  # without the reserve the quiet sheds the burst's capacity
    assert quiet_on >= 6  # with it the next burst finds its capacity warm (load need 6)


def test_smooth_load_means_the_window_and_keeps_unknown_unknown() -> None:
    state = PoolState()
    seen = []
    for t, rps in ((0.0, 10.0), (1.0, 20.0), (2.0, NAN), (3.0, 30.0), (9.0, 40.0)):
        o, state = stages.smooth_load(obs(now_s=t, arrival_rps=rps), state, window_s=5.0)
        seen.append(o.arrival_rps)
    assert seen[:2] == [10.0, 15.0]
    assert math.isnan(seen[2])  # unknown now stays unknown: never filled in from the past
    assert seen[3] == pytest.approx(20.0)  # (10 + 20 + 30) / 3, the NaN left out
    assert seen[4] == pytest.approx(40.0)  # t=3 is 6 s old: out of the 5-s window
    o, _ = stages.smooth_load(obs(arrival_rps=7.0), state, window_s=0.0)
    assert o.arrival_rps == 7.0


def test_queue_age_counts_an_unbroken_queue_only() -> None:
    state = PoolState()
    ages = []
    for t, waiting in ((0.0, 0.0), (1.0, 3.0), (5.0, 8.0), (6.0, NAN), (9.0, 2.0), (10.0, 0.0), (11.0, 4.0)):
        age, state = stages.queue_age(obs(now_s=t, waiting_requests=waiting), state)
        ages.append(age)
    # unknown at t=6 neither breaks nor starts the queue; an empty tick breaks it
    assert ages == [0.0, 0.0, 4.0, 5.0, 8.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("label", "persistent", "prompt_tps", "provisioning", "prefill"),
    [
        # 200 waiting x 1000 tokens beside 19k tok/s of load: within 1 s that is 21.9 instances; cold ones only
        # get it over the lead (1.9 + 0.2), beyond the 2 warm instances (see test_policy_lead).
        ("a young queue uses the warm instances", False, 19_000.0, 0, 2.1),
        # the 2 warm instances have 1k tok/s to spare: 200 s for the queue, longer than the 100-s lead
        ("a persistent queue is cleared within the SLO", True, 19_000.0, 0, 21.9),
        # 10k tok/s to spare clears it in 20 s: capacity started now would serve an empty queue
        ("a persistent queue the warm fleet clears within the lead", True, 10_000.0, 0, 2.0),
        # 4 instances starting count too: 41k tok/s spare
        ("a persistent queue the starting fleet clears within the lead", True, 19_000.0, 4, 2.1),
    ],
)
def test_persistent_queue_is_cleared_within_the_slo(
    label: str, persistent: bool, prompt_tps: float, provisioning: int, prefill: float
) -> None:
    o = obs(waiting_requests=200.0, oldest_wait_s=0.0, prompt_tps=prompt_tps,
            provisioning={"prefill": provisioning, "decode": 0})  # fmt: skip
    need = stages.capacity_target(o, CAP, slo_ttft_s=1.0, lead_s=100.0, persistent_queue=persistent)
    assert need is not None and need.prefill == pytest.approx(prefill), label


def test_decide_clears_a_queue_that_outlives_queue_persist_s() -> None:
    cfg = PolicyConfig(queue_persist_s=30.0, ramp_up_s=0, burst_reserve="off")
    state, plans = PoolState(), {}
    for t in range(0, 40):
        # the load takes 1.9 of the 2 warm instances: they alone would take 200 s for the queue
        o = obs(now_s=float(t), waiting_requests=200.0, oldest_wait_s=0.0, prompt_tps=19_000.0)
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        plans[t] = plan.prefill
    assert plans[10] < 10  # young queue: warm instances plus what the lead can clear
    assert plans[35] >= 21  # persistent: 21.9 instances of need, with headroom


@pytest.mark.parametrize(
    "running", [0.0, 100.0, 1762.0, NAN], ids=["idle", "above-little", "backlog", "unknown"]
)
def test_reserve_sizes_decode_from_arrivals_not_from_a_backlog(running: float) -> None:
    """The reserve's decode need is Little's law on what arrived (10 req/s × 200 tokens at 2,000/64 tok/s
    per sequence = 64 sequences = 1 instance), whatever the running gauge reads: an overloaded pool's running
    count is its backlog, and a remembered backlog would hold the pool at its peak for the whole window."""
    prefill, decode = stages.load_need(obs(running_seqs=running), CAP)
    assert decode == pytest.approx(1.0)
    assert prefill == pytest.approx(1.0)


def test_the_tick_s_own_target_still_serves_a_backlog_and_says_both_concurrencies() -> None:
    """The capacity stage (this tick's target, not the reserve) keeps the measured running as a floor: the
    sequences are there and need slots now. Its reason names both figures, which bench_policies reads."""
    need = stages.capacity_target(obs(running_seqs=1280.0), CAP, slo_ttft_s=1.0)
    assert need is not None
    assert need.decode == pytest.approx(20.0)
    assert any("running 1280, Little 64" in why for why in need.reasons)
