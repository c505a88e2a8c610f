"""s12s: the cold-start persistence (``cold_start_persist_s``) for the standby target too
(``PolicyConfig.standby_start_persist``). Under a held active target the spare active replica flips the decode
standby 1 ↔ 0 per tick, and each flip up was a cold start cancelled the next second (s11w, issue 5)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import decode_flap_plans, obs

from controller.config import PolicyConfig
from controller.policy import PoolState
from controller.policy.decide import _standby_persisted

PERSIST = {"prefill": 30.0, "decode": 30.0}


def _run(plan: list[int], warm: int, persist: dict[str, float] = PERSIST) -> list[int]:
    state, out = PoolState(), []
    for t, target in enumerate(plan):
        o = obs(now_s=float(t), standby={"prefill": 0, "decode": warm})
        got, state, _ = _standby_persisted({"prefill": 0, "decode": target}, o, persist, state)
        out.append(got["decode"])
    return out


def test_a_flapping_standby_target_starts_no_cold_instance() -> None:
    """0, 1, 0, 1, ...: off, every odd tick asks for a cold standby that the next tick cancels; on, the lowest
    of the last 30 s is 0, so nothing above the warm standby is asked for."""
    plan = [0, 1] * 40
    assert _run(plan, warm=0) == [0] * len(plan)
    assert _run(plan, warm=0, persist={"prefill": 0.0, "decode": 0.0}) == plan  # no wait: every tick's target


def test_a_standby_target_that_lasted_is_started() -> None:
    plan = [0] * 5 + [2] * 40
    got = _run(plan, warm=0)
    first = got.index(2)
    assert got[:first] == [0] * first
    # the first tick whose targets younger than 30 s (the active rule's window) are all 2
    assert first == 5 + 29
    assert got[first:] == [2] * (len(plan) - first)


def test_warm_standby_is_never_released_by_the_wait() -> None:
    """The rule cuts only starts: a target at or below the warm standby passes, and a cut stops at the warm."""
    assert _run([0, 1, 0, 3, 1], warm=1) == [0, 1, 0, 1, 1]


@given(
    plan=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=80),
    warm=st.integers(0, 3),
    persist=st.floats(0.0, 60.0),
)
@settings(max_examples=200, deadline=None)
def test_persisted_standby_is_between_the_warm_and_the_target(
    plan: list[tuple[int, int]], warm: int, persist: float
) -> None:
    state = PoolState()
    for t, (p, d) in enumerate(plan):
        o = obs(now_s=float(t), standby={"prefill": warm, "decode": warm})
        target = {"prefill": p, "decode": d}
        got, state, why = _standby_persisted(target, o, {"prefill": persist, "decode": 0.0}, state)
        assert got["decode"] == d  # no wait for the role: untouched
        assert min(p, warm) <= got["prefill"] <= p
        if p <= warm or persist == 0.0:
            assert got["prefill"] == p
        # a cut is a start left out, and says so; the window keeps this tick's uncut target
        assert (got["prefill"] < p) == bool(why)
        assert state.standby_start_recent[-1] == (float(t), p, d)
        assert all(float(t) - row[0] <= persist for row in state.standby_start_recent)


def test_decide_stops_the_flap_of_a_promoted_standby() -> None:
    """Through ``decide``: wanted decode flips by one each tick under a held active target, no warm standby
    left (promoted). Off, the planned standby rises above the warm standby on some ticks and falls the next
    (a cold start cancelled); on, it never rises above it while the flap goes on."""
    rows = {}
    for on in (False, True):
        cfg = PolicyConfig(
            standby_start_persist=on,  # the burst reserve on: its need blocks are what "watched" reads
            standby_spare_settle="tick",  # the flap as session 12 had it ('persist_reset' settles it already)
            burst_hold="off",
            short_burst_cap=False,
            standby_decode=2,
        )
        plans = decode_flap_plans(cfg, 300, warm_standby_decode=0)
        assert all(p.decode >= 1 and p.prefill >= 1 for p in plans)
        out = [p.standby_decode for p in plans]
        rows[on] = np.asarray(out[150:])  # after the pool was watched for one cold start
    assert int(np.count_nonzero(np.diff(rows[False]))) > 0 and rows[False].max() > 0
    assert rows[True].max() == 0


def test_standby_start_persist_is_validated() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="standby_start_persist"):
        PolicyConfig(standby_start_persist="sometimes")
