"""Decode sized for the flow out of a draining prefill backlog (stages.drained_decode / with_drain).

CAP: 10,000 prompt tok/s per prefill instance, 64 sequences and 2,000 tok/s per decode instance, so one
sequence decodes at 31.25 tok/s; with 200 output tokens it holds a slot for L = 6.4 s. The default
observation: 2 active prefill instances, 10 req/s of 1,000-token prompts (20 req/s of prefill capacity).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.policy import decide, stages
from controller.policy.types import PoolState
from tests.controller.policy_fixtures import CAP, NAN, ctx, obs

LIFETIME_S = 200 / (2_000 / 64)  # 6.4 s


def test_no_backlog_no_opinion() -> None:
    assert stages.drained_decode(obs(waiting_requests=0.0), CAP, 2.0) == (0.0, None)
    assert stages.drained_decode(obs(waiting_requests=NAN), CAP, 2.0) == (0.0, None)


def test_long_backlog_sizes_decode_for_prefill_throughput() -> None:
    # 2 prefill instances clear 20 req/s (arrivals 10): 20 × 6.4 = 128 sequences = 2 decode instances,
    # where Little's law on arrivals gives 64 = 1
    decode, why = stages.drained_decode(obs(waiting_requests=1_000.0), CAP, 2.0)
    assert decode == pytest.approx(20 * LIFETIME_S / 64) == pytest.approx(2.0)
    assert why is not None and "1000 waiting" in why and "20.0 req/s" in why


def test_short_backlog_adds_at_most_itself() -> None:
    # 10 waiting: gone before the first of them finishes decoding, so 64 + 10 sequences, not 128
    decode, _ = stages.drained_decode(obs(waiting_requests=10.0), CAP, 2.0)
    assert decode == pytest.approx((10 * LIFETIME_S + 10) / 64)


def test_planned_prefill_counts_and_active_is_a_floor() -> None:
    # the plan's 5 prefill instances clear 50 req/s: 320 sequences = 5 decode instances
    assert stages.drained_decode(obs(waiting_requests=1e4), CAP, 5.0)[0] == pytest.approx(5.0)
    # a plan below the active fleet: the active instances still drain
    assert stages.drained_decode(obs(waiting_requests=1e4), CAP, 0.5)[0] == pytest.approx(2.0)
    assert stages.drained_decode(obs(waiting_requests=1e4), CAP, NAN)[0] == pytest.approx(2.0)


def test_measured_prefill_rate_above_the_model_counts() -> None:
    # 30,000 tok/s prefilled on 2 instances: 15,000 each, 30 req/s drained, 192 sequences
    o = obs(waiting_requests=1e4, prompt_tps=30_000.0)
    assert stages.drained_decode(o, CAP, 2.0)[0] == pytest.approx(3.0)
    # ... not when the prompt counter counts at arrival (it is not what was prefilled)
    o = replace(o, prompt_at_arrival=True)
    assert stages.drained_decode(o, CAP, 2.0)[0] == pytest.approx(2.0)


def test_correction_slows_the_drain() -> None:
    slow = replace(CAP, correction=2.0)
    assert stages.drained_decode(obs(waiting_requests=1e4, prompt_tps=0.0), slow, 2.0)[0] == pytest.approx(
        1.0
    )


def test_arrivals_above_the_drain_rate_give_littles_law() -> None:
    # prefill cannot keep up (40 req/s arriving, 20 cleared): the flow is at most the arrivals'
    decode, _ = stages.drained_decode(obs(waiting_requests=1e4, arrival_rps=40.0), CAP, 2.0)
    assert decode == pytest.approx(40 * LIFETIME_S / 64)


@pytest.mark.parametrize(
    "field", ["mean_prompt_tokens", "mean_output_tokens"], ids=["prompt length", "output length"]
)
def test_unknown_lengths_no_opinion(field: str) -> None:
    assert stages.drained_decode(obs(waiting_requests=1e4, **{field: NAN}), CAP, 2.0) == (0.0, None)
    assert stages.drained_decode(obs(waiting_requests=1e4, **{field: 0.0}), CAP, 2.0) == (0.0, None)


def test_with_drain_only_raises() -> None:
    need = stages.Need(prefill=2.0, decode=3.0, running_seqs=100.0, reasons=("x",))
    assert stages.with_drain(need, 2.0, "drain: lower") == (need, None)
    assert stages.with_drain(need, 9.0, None) == (need, None)
    raised, why = stages.with_drain(need, 4.0, "drain: higher")
    assert raised.decode == 4.0 and raised.prefill == 2.0 and why == "drain: higher"


@given(
    waiting=st.floats(0.0, 1e6),
    more=st.floats(0.0, 1e6),
    prefill=st.floats(0.0, 1e4),
    arrivals=st.floats(0.0, 1e4),
)
def test_properties(waiting: float, more: float, prefill: float, arrivals: float) -> None:
    """Non-negative, finite, monotone in the backlog and the prefill plan, bounded by arrivals + backlog."""
    o = obs(waiting_requests=waiting, arrival_rps=arrivals)
    d, _ = stages.drained_decode(o, CAP, prefill)
    assert 0.0 <= d < math.inf
    assert d <= (arrivals * LIFETIME_S + waiting) / 64 * (1 + 1e-9) + 1e-9
    assert stages.drained_decode(replace(o, waiting_requests=waiting + more), CAP, prefill)[0] >= d - 1e-9
    assert stages.drained_decode(o, CAP, prefill + more)[0] >= d - 1e-9


def test_decide_sizes_decode_for_the_drain() -> None:
    """A backlog on a pool whose prefill is ahead of arrivals: decide's decode target covers the drained
    flow and says so; with no backlog, no drain reason."""
    o = obs(waiting_requests=2_000.0, oldest_wait_s=0.5, active={"prefill": 8, "decode": 4})
    plan, _ = decide(ctx(o), PoolState())
    assert plan is not None
    drain = [r for r in plan.reasons if r.startswith("drain:")]
    assert drain, plan.reasons
    # at least the 8 active prefill instances' 80 req/s × 6.4 s = 512 sequences = 8 decode, + 30 % headroom
    assert plan.decode >= math.ceil(8 * 1.3)
    plan0, _ = decide(ctx(obs(waiting_requests=0.0)), PoolState())
    assert plan0 is not None and not any(r.startswith("drain:") for r in plan0.reasons)


def test_decide_leaves_the_drain_out_for_a_persistent_queue() -> None:
    """A queue older than ``queue_persist_s`` is the load exceeding the fleet (its prefill target clears it
    whatever it costs): no decode is sized from that target's drain."""
    o = obs(waiting_requests=2_000.0, oldest_wait_s=0.5, active={"prefill": 8, "decode": 4})
    old = PoolState(queue_since_s=o.now_s - 121.0)  # queue_persist_s defaults to 120 s
    plan, _ = decide(ctx(o), old)
    assert plan is not None and not any(r.startswith("drain:") for r in plan.reasons)
    young, _ = decide(ctx(o), PoolState(queue_since_s=o.now_s - 119.0))
    assert young is not None and any(r.startswith("drain:") for r in young.reasons)
