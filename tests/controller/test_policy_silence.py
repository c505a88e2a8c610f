"""``PolicyConfig.silence_hold_s`` (session 18): a pool whose arrivals stop dead, where its rate made that
implausible, wants what it has (scale up, never down) until traffic returns or the hold ends.
s18_outage_retry (6 req/s, 60 s of nothing, then 18 req/s of retries) lost a third of its prefill and half its
decode during the outage and met the storm with them: 83.49 % SLO against reactive's 99.63 %. The decide cases
below fail with the hysteresis stage given the plain target while silent."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import ctx, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages

HOLD = 300.0


def _history(rates: list[float], t0: float = 0.0) -> tuple[tuple[float, float], ...]:
    return tuple((t0 + i, r) for i, r in enumerate(rates))


def _run(rates: list[float], hold_s: float = HOLD) -> list[bool]:
    """``sudden_silence`` tick by tick over 1-s rates (history and state carried as decide carries them)."""
    history: tuple[tuple[float, float], ...] = ()
    since, out = math.nan, []
    for t, r in enumerate(rates):
        history = stages.update_rate_history(history, float(t), r)
        silent, since, _ = stages.sudden_silence(history, float(t), r, since, hold_s)
        out.append(silent)
    return out


def test_the_value_is_validated_and_named() -> None:
    assert PolicyConfig().silence_hold_s == 120.0
    for bad in (-1.0, 86401.0):
        with pytest.raises(ValidationError, match="silence_hold_s"):
            PolicyConfig(silence_hold_s=bad)


def test_a_steady_stream_that_stops_is_silent_from_ten_seconds_until_it_returns() -> None:
    silent = _run([6.0] * 60 + [0.0] * 40 + [6.0] * 5)
    assert not any(silent[:69])  # 9 s of nothing: not yet
    assert all(silent[70:100])  # from 10 s after the last arrival
    assert not any(silent[100:])  # traffic back: over at once


def test_a_low_rate_needs_a_longer_silence() -> None:
    # 0.5 req/s: 20 arrivals expected only after 40 s (10 s of nothing at 0.5 req/s is ordinary)
    silent = _run([0.5] * 60 + [0.0] * 60)
    assert not any(silent[:99]) and all(silent[100:])


def test_the_hold_ends_and_the_same_silence_is_not_read_again() -> None:
    silent = _run([6.0] * 60 + [0.0] * 400, hold_s=120.0)
    assert all(silent[70:179]) and not any(silent[179:])


def test_traffic_that_falls_gradually_is_not_a_silence() -> None:
    # 6 req/s falling linearly to 0 over 10 min, then nothing: the minute before the silence held ~0.3 req/s
    fall = [6.0 * (1 - i / 600) for i in range(600)]
    silent = _run([6.0] * 60 + fall + [0.0] * 60)
    assert not any(silent)


def test_an_unknown_rate_changes_nothing_and_zero_hold_is_off() -> None:
    history = _history([6.0] * 60 + [0.0] * 20)
    silent, since, why = stages.sudden_silence(history, 79.0, 0.0, math.nan, HOLD)
    assert silent and since == 59.0 and why is not None and "no scale-down" in why
    assert stages.sudden_silence(history, 80.0, math.nan, since, HOLD)[:2] == (True, 59.0)
    unknown, since_unknown, _ = stages.sudden_silence(history, 80.0, math.nan, math.nan, HOLD)
    assert unknown is False and math.isnan(since_unknown)
    assert stages.sudden_silence(history, 79.0, 0.0, math.nan, 0.0)[0] is False


def test_a_bursts_tail_is_not_a_silence() -> None:
    # a minute of on/off bursts (12 req/s for 5 s, then 1 for 5 s; index of dispersion ~14), then nothing
    bursty = [12.0 if (i // 5) % 2 == 0 else 1.0 for i in range(120)]
    assert not any(_run(bursty + [0.0] * 60))
    # the same mean rate, steady: a silence
    assert any(_run([6.5] * 120 + [0.0] * 60))


def test_a_gap_like_the_streams_own_is_not_a_silence() -> None:
    # 3 req/s with a 6-s gap every 20 s (index ~1.8: thinned bursty traffic looks Poisson), then nothing:
    # silent only once the silence is 4x the longest gap (7 ticks) = 28 s, not at 10 s
    gappy = [0.0 if i % 20 >= 14 else 4.3 for i in range(120)]
    silent = _run(gappy[:114] + [0.0] * 60)  # the last gap runs into the silence: it starts at 113
    assert not any(silent[: 113 + 28]) and all(silent[113 + 28 : 174])


def test_too_little_history_before_it_is_not_a_silence() -> None:
    assert not any(_run([20.0] * 30 + [0.0] * 60))  # 30 s seen: not a stream known to be steady


def test_a_waiting_queue_suspends_the_hold_but_keeps_the_start() -> None:
    history = _history([6.0] * 60 + [0.0] * 20)
    silent, since, why = stages.sudden_silence(history, 79.0, 0.0, math.nan, HOLD, queued=True)
    assert not silent and since == 59.0 and why is None
    assert stages.sudden_silence(history, 80.0, 0.0, since, HOLD)[:2] == (True, 59.0)


def test_a_silence_older_than_the_history_is_judged_once() -> None:
    history = _history([0.0] * 130)  # an idle pool: nothing in the whole history
    silent, since, _ = stages.sudden_silence(history, 129.0, 0.0, math.nan, HOLD)
    assert not silent and since == -math.inf
    assert stages.sudden_silence(history, 130.0, 0.0, since, HOLD)[:2] == (False, -math.inf)
    assert stages.sudden_silence(history, 131.0, 2.0, since, HOLD)[:2][0] is False  # arrivals: over
    assert math.isnan(stages.sudden_silence(history, 131.0, 2.0, since, HOLD)[1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=200))
def test_never_silent_while_arrivals_come(rates: list[float]) -> None:
    silent = _run(rates)
    assert not any(s for s, r in zip(silent, rates, strict=True) if r > 0)


def _prefill_replicas(cfg: PolicyConfig, back_s: float = math.inf, back_rps: float = 1.0) -> list[int]:
    """decide's prefill + decode targets tick by tick: 4 min at 6 req/s on a pool held at 3 prefill / 2
    decode, then nothing (the outage) until ``back_s``, then ``back_rps``."""
    state, out = PoolState(), []
    replicas = {"prefill": 3, "decode": 2}
    for t in range(330):
        rps = 6.0 if t < 240 else (0.0 if t < back_s else back_rps)
        o = obs(now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0,
                running_seqs=rps * 8.0 if t < 240 or t >= back_s else max(0.0, 48.0 - 4.0 * (t - 240)),
                replicas=dict(replicas), active=dict(replicas), standby={"prefill": 0, "decode": 0},
                waiting_requests=0.0, kv_usage=0.1)  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        replicas = {"prefill": plan.prefill, "decode": plan.decode}
        out.append(plan.prefill + plan.decode)
    return out


def test_decide_holds_the_pool_through_an_outage() -> None:
    base = dict(min_prefill=1, min_decode=1, standby_prefill=0, standby_decode=0, young_hold_s=0.0)
    held = _prefill_replicas(PolicyConfig(**base))
    off = _prefill_replicas(PolicyConfig(**base, silence_hold_s=0.0))
    assert held[239] == off[239]  # the same pool before the outage
    assert min(held[240:]) >= held[239]  # no scale-down during the silence
    assert min(off[240:]) < off[239]  # without the hold, the 60-s window releases capacity within 90 s


def test_the_scale_down_window_starts_when_the_silence_ends() -> None:
    # the traffic comes back after 60 s, its first ticks low (a retry storm's first second, or a slow return):
    # the window must read the targets from the return on, not the silence's low ones (s18's outage, seed 1)
    base = dict(min_prefill=1, min_decode=1, standby_prefill=0, standby_decode=0, young_hold_s=0.0)
    held = _prefill_replicas(PolicyConfig(**base), back_s=300.0, back_rps=1.0)
    assert min(held[240:330]) >= held[239]  # 30 s after the return: nothing released yet
