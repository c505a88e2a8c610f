"""Stage 1's queue term with ``queue_pinned``: requests in an instance's own waiting queue are served by that
instance alone, so they count as the capacity they occupy over the cold-start lead, never as a backlog that more
instances clear within the TTFT SLO (session 16: on the 300-s sinusoid a cold instance's ~1,800 queued
requests held all 64 prefill instances for ten minutes while new arrivals met the SLO on a third of them)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, ctx, obs

from controller.config import PolicyConfig
from controller.pipeline import LengthTracker, PoolCounts, build_observation
from controller.policy import PoolState, decide, stages
from controller.sources.aggregate import PoolLoad

LEAD_S = 120.0


def _need(pinned_queue: bool, persistent: bool = False, **kw: float) -> float:
    # 10,000 tok/s measured on 2 warm prefill instances of 10,000 tok/s; 40 requests of 1,000 tokens waiting
    base: dict[str, float] = {"waiting_requests": 40.0, "oldest_wait_s": 0.0, "mean_prompt_tokens": 1_000.0}
    need = stages.capacity_target(
        obs(**(base | kw)), CAP, 1.0, LEAD_S, persistent_queue=persistent, pinned_queue=pinned_queue
    )
    assert need is not None
    return need.prefill


COLD = (10_000.0 + 40 * 1_000.0 / LEAD_S) / 10_000.0  # the load plus the queue spread over the lead
FULL = 20_000.0  # a load the 2 warm instances carry with nothing to spare: the queue persists past the lead
COLD_FULL = (FULL + 40 * 1_000.0 / LEAD_S) / 10_000.0


@pytest.mark.parametrize(
    ("label", "pinned_queue", "persistent", "pinned", "prompt", "expected"),
    [
        ("off: the warm instances clear the queue within the SLO", False, False, 40.0, 10_000.0, 2.0),
        (
            "on, all pinned: only the capacity the queue occupies over the lead",
            True,
            False,
            40.0,
            10_000.0,
            COLD,
        ),
        (
            "on, half pinned: the other half is still cleared by the warm ones",
            True,
            False,
            20.0,
            10_000.0,
            2.0,
        ),
        (
            "on, pinned unknown: every request taken as movable (the old rule)",
            True,
            False,
            NAN,
            10_000.0,
            2.0,
        ),
        ("on, none pinned (a gateway holds them all)", True, False, 0.0, 10_000.0, 2.0),
        ("off, persistent: as many instances as clear it within the SLO", False, True, 40.0, FULL, 6.0),
        ("on, persistent but pinned: more instances do not clear it", True, True, 40.0, FULL, COLD_FULL),
        ("on, persistent, 35 of 40 pinned: the 5 movable within the SLO", True, True, 35.0, FULL, 2.5),
    ],
)
def test_pinned_requests_are_not_a_backlog_to_clear(
    label: str, pinned_queue: bool, persistent: bool, pinned: float, prompt: float, expected: float
) -> None:
    got = _need(pinned_queue, persistent, pinned_waiting=pinned, prompt_tps=prompt)
    assert got == pytest.approx(expected), label


def test_pinned_beyond_the_waiting_count_is_clipped() -> None:
    assert _need(True, pinned_waiting=400.0) == pytest.approx(COLD)
    assert _need(True, pinned_waiting=-5.0) == pytest.approx(2.0)  # nonsense below 0: nothing pinned


@settings(max_examples=200, deadline=None)
@given(
    waiting=st.floats(0.0, 5_000.0),
    share=st.floats(0.0, 1.0),
    age=st.floats(0.0, 30.0),
    warm=st.integers(0, 64),
    persistent=st.booleans(),
)
def test_pinning_never_raises_the_need_nor_drops_the_occupied_capacity(
    waiting: float, share: float, age: float, warm: int, persistent: bool
) -> None:
    kw = {
        "waiting_requests": waiting,
        "oldest_wait_s": age,
        "pinned_waiting": waiting * share,
        "active": {"prefill": warm, "decode": 4},
    }
    pinned, movable = (
        stages.capacity_target(obs(**kw), CAP, 1.0, LEAD_S, persistent_queue=persistent, pinned_queue=on)
        for on in (True, False)
    )
    assert pinned is not None and movable is not None
    assert pinned.prefill <= movable.prefill + 1e-9
    occupied = (10_000.0 + waiting * 1_000.0 / max(LEAD_S, 1.0 - age, 0.25)) / 10_000.0
    assert pinned.prefill >= occupied - 1e-9


def test_decide_reads_the_config_switch() -> None:
    o = replace(obs(), waiting_requests=400.0, pinned_waiting=400.0, oldest_wait_s=0.0)
    off, _ = decide(ctx(o, PolicyConfig(queue_pinned=False)), PoolState())
    on, _ = decide(ctx(o, PolicyConfig()), PoolState())  # the default
    assert off is not None and on is not None
    assert on.prefill < off.prefill


def _load(waiting: float, router: float = 0.0) -> PoolLoad:
    nan = math.nan
    return PoolLoad(
        pool="default", now_s=11.0, counts={}, arrival_rps=1.0, prompt_tps=1_000.0, gen_tps=100.0,
        running=2.0, waiting=waiting, kv_usage=0.1, ttft_p50_s=nan, ttft_p90_s=nan, itl_p50_s=nan,
        itl_p90_s=nan, mean_prompt_tokens=1_000.0, complete=True, router_waiting=router,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("waiting", "router", "pending", "pinned"),
    [(7.0, 0.0, 0.0, 7.0), (3.0, 0.0, 12.0, 3.0), (0.0, 0.0, 5.0, 0.0), (10.0, 6.0, 0.0, 4.0)],
    ids=["instances-only", "simulator-gateway", "gateway-only", "router-queue-in-the-gauge"],
)
def test_the_observation_tells_instance_queues_from_the_gateway(
    waiting: float, router: float, pending: float, pinned: float
) -> None:
    """The simulator's gateway reports its queue as ``pending``; a live source folds pdscale's router queue
    into the waiting gauge and says how much of it came from there (``router_waiting``)."""
    counts = PoolCounts(
        replicas={"prefill": 1, "decode": 1},
        active={"prefill": 1, "decode": 1},
        standby={},
        provisioning={},
        pending=pending,
    )
    o = build_observation("default", _load(waiting, router), counts, 11.0, None, LengthTracker())
    assert o.waiting_requests == waiting + pending
    assert o.pinned_waiting == pinned


def test_unknown_instance_queues_stay_unknown() -> None:
    counts = PoolCounts(replicas={}, active={}, standby={}, provisioning={}, pending=4.0)
    o = build_observation("default", _load(NAN), counts, 11.0, None, LengthTracker())
    assert math.isnan(o.waiting_requests) and math.isnan(o.pinned_waiting)
