"""Session 5 (W4) cost cuts: the burst reserve's cap from an observed peak quantile without the headroom, the
scale-down window on a quantile of its targets, and a standby that does not flap with the spare active
capacity. Tables on hand-built inputs, properties, and runs through ``decide``."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import decode_flap_plans

from controller.config import PolicyConfig
from controller.policy import PoolState, stages
from controller.policy.decide import _settled_spare

Recent = tuple[tuple[float, int], ...]


@pytest.mark.parametrize(
    ("label", "recent", "quantile", "held"),
    [
        ("empty window", (), 1.0, 0),
        ("the maximum by default", ((1.0, 2), (2.0, 5), (3.0, 3)), 1.0, 5),
        # 10 targets within the delay, one spike of 4: q0.9 = the 9th smallest = 2
        (
            "a one-tick spike is not held at q0.9",
            tuple((float(t), 4 if t == 5 else 2) for t in range(10)),
            0.9,
            2,
        ),
        # two ticks of 4 in 10 (20 %) are more than 1 - 0.9: held
        (
            "a target wanted 20 % of the window is held at q0.9",
            tuple((float(t), 4 if t < 2 else 2) for t in range(10)),
            0.9,
            4,
        ),
        # a burst hold's longer window (targets older than the delay) keeps its maximum
        (
            "the hold's older part keeps its maximum",
            ((0.0, 7), *((float(t), 2) for t in range(50, 60))),
            0.5,
            7,
        ),
    ],
)
def test_window_hold_table(label: str, recent: Recent, quantile: float, held: int) -> None:
    now = max((t for t, _ in recent), default=0.0) + 1.0
    assert stages.window_hold(recent, now, 30.0, quantile) == held, label


@given(
    targets=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    q=st.floats(0.01, 1.0),
)
@settings(max_examples=200, deadline=None)
def test_window_hold_is_a_target_between_min_and_max_and_monotone_in_q(targets: list[int], q: float) -> None:
    recent = tuple((float(t), w) for t, w in enumerate(targets))
    now = float(len(targets))
    got = stages.window_hold(recent, now, 1e9, q)
    assert got in targets
    assert min(targets) <= got <= stages.window_hold(recent, now, 1e9, 1.0) == max(targets)
    assert stages.window_hold(recent, now, 1e9, q / 2) <= got


@pytest.mark.parametrize(
    ("level", "rise", "peak", "with_h", "without_h"),
    [
        # mmpp after its first bursts: the observed peak binds; 3.77 * 1.3 = 4.9 -> 5 with, 4 without
        (0.96, 3.04, 3.77, 5, 4),
        # decode: 1.69 * 1.3 = 2.2 -> 3 with, 2 without
        (0.79, 1.36, 1.69, 3, 2),
        # a pool already above its usual peak: the level with headroom, either way
        (4.0, 0.0, 3.0, 6, 6),
        # the rise binds below the peak: no change (ceil(1.2 * 1.3) = 2)
        (0.2, 1.0, 5.0, 2, 2),
    ],
)
def test_reserve_target_table(level: float, rise: float, peak: float, with_h: int, without_h: int) -> None:
    assert stages.reserve_target(level, rise, peak, 0.3, True) == with_h
    assert stages.reserve_target(level, rise, peak, 0.3, False) == without_h


@given(
    level=st.floats(0.0, 100.0),
    rise=st.floats(0.0, 100.0),
    peak=st.floats(0.0, 100.0),
    h=st.floats(0.0, 2.0),
)
@settings(max_examples=300, deadline=None)
def test_reserve_without_peak_headroom_is_never_more_and_never_below_the_level(
    level: float, rise: float, peak: float, h: float
) -> None:
    with_h = stages.reserve_target(level, rise, peak, h, True)
    without_h = stages.reserve_target(level, rise, peak, h, False)
    assert without_h <= with_h
    assert without_h >= math.ceil(level * (1 + h) - 1e-9)
    # the session-4 formula
    assert with_h == math.ceil(min(level + rise, max(peak, level)) * (1 + h) - 1e-9)


def _blocks(needs: list[float]) -> tuple[tuple[float, float, float, int], ...]:
    return tuple((stages.NEED_BLOCK_S * k, x, x / 2, 5) for k, x in enumerate(needs))


def test_peak_quantile_reads_the_tail_of_the_peaks() -> None:
    # a burst every 10 blocks; its height grows with k: the peaks' q0.99 is above their q0.9
    needs = [(1.0 + k / 10) * 5 if k % 10 == 9 else 1.0 for k in range(200)]
    _, (p90, _) = stages.burst_reserve(_blocks(needs), 30.0, 0.9)
    _, (same, _) = stages.burst_reserve(_blocks(needs), 30.0, 0.9, peak_quantile=None)
    _, (p99, _) = stages.burst_reserve(_blocks(needs), 30.0, 0.9, peak_quantile=0.99)
    assert same == p90 < p99 <= max(needs)


@given(
    needs=st.lists(st.floats(0.0, 50.0), min_size=3, max_size=80),
    q=st.floats(0.0, 1.0),
    q2=st.floats(0.0, 1.0),
)
@settings(max_examples=100, deadline=None)
def test_peak_quantile_is_monotone_and_leaves_the_rise_alone(needs: list[float], q: float, q2: float) -> None:
    lo, hi = sorted((q, q2))
    (r_lo, _), (p_lo, _) = stages.burst_reserve(_blocks(needs), 20.0, 0.9, 0.3, peak_quantile=lo)
    (r_hi, _), (p_hi, _) = stages.burst_reserve(_blocks(needs), 20.0, 0.9, 0.3, peak_quantile=hi)
    assert p_lo <= p_hi + 1e-9
    assert r_lo == r_hi


@pytest.mark.parametrize("settle", ["window", "persist"])
def test_settled_spare_is_the_most_over_the_window(settle: Literal["window", "persist"]) -> None:
    """A spare of 1 every other tick (the flap) counts as 1 throughout, and as 0 only once no spare has been
    seen for the whole window: max(scale-down delay, provision lead) for 'window', the cold-start wait for
    'persist'."""
    cfg = PolicyConfig(standby_spare_settle=settle)
    window_s = (
        max(cfg.scale_down_delay_s, cfg.provision_lead_s) if settle == "window" else cfg.cold_start_persist_s
    )
    state = PoolState()
    seen = []
    plan = [0, 1] * 10 + [0] * int(window_s + 5)
    for t, spare in enumerate(plan):
        held, state = _settled_spare({"prefill": 0, "decode": spare}, float(t), cfg, state)
        seen.append(held["decode"])
    assert seen[1:20] == [1] * 19  # no flap once a spare was seen
    assert all(x == 1 for x in seen[1 : 19 + int(window_s)])
    assert seen[-1] == 0
    # the last spare (t = 19) is remembered for the window, no longer
    assert seen.index(0, 20) == 19 + int(window_s)


def test_persist_settle_follows_the_cold_start_wait() -> None:
    """'persist' remembers the spare for exactly ``cold_start_persist_s``: a longer wait, a longer memory."""
    last_one = {}
    for wait_s in (10.0, 30.0):
        cfg = PolicyConfig(standby_spare_settle="persist", cold_start_persist_s=wait_s)
        state = PoolState()
        seen = []
        for t in range(80):
            held, state = _settled_spare({"prefill": 0, "decode": 1 if t == 0 else 0}, float(t), cfg, state)
            seen.append(held["decode"])
        last_one[wait_s] = max(i for i, x in enumerate(seen) if x == 1)
    assert last_one == {10.0: 9, 30.0: 29}  # the window is (now - wait, now]


@given(
    plan=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=40),
)
@settings(max_examples=100, deadline=None)
def test_settled_spare_is_at_least_this_ticks(plan: list[tuple[int, int]]) -> None:
    cfg = PolicyConfig(standby_spare_settle="window")
    state = PoolState()
    for t, (p, d) in enumerate(plan):
        held, state = _settled_spare({"prefill": p, "decode": d}, float(t), cfg, state)
        assert held["prefill"] >= p and held["decode"] >= d
        assert held["prefill"] <= max(x for x, _ in plan) and held["decode"] <= max(y for _, y in plan)


def test_decide_standby_does_not_flap_with_the_spare() -> None:
    """Wanted decode flips by one each tick under a held active target: the spare flips with it, and tick by
    tick the standby it leaves flips too (each rise a cold start); settled over the window it stays put."""
    rows = {}
    for settle in ("tick", "window", "persist"):
        cfg = PolicyConfig(
            standby_spare_settle=settle,
            burst_reserve="off",
            burst_hold="off",
            short_burst_cap=False,
            standby_decode=2,
        )
        out = [p.standby_decode for p in decode_flap_plans(cfg, 200, warm_standby_decode=2)]
        rows[settle] = np.asarray(out[60:])
    flips = {k: int(np.count_nonzero(np.diff(v))) for k, v in rows.items()}
    assert flips["tick"] > 0
    assert flips["window"] == 0
    assert flips["persist"] == 0
    assert rows["window"].max() <= rows["tick"].max()
    assert rows["persist"].max() <= rows["tick"].max()


def test_churn_probe_tallies_gpu_seconds_by_state_and_counts_cancelled_cold_starts() -> None:
    """bench_policies' probe: GPU-seconds per (role, lifecycle state) between ticks, active split by whether
    the instance held a request, and cold starts released before they were ever seen ready."""
    import importlib.util
    import sys
    from pathlib import Path
    from types import SimpleNamespace
    from typing import Any

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"
    spec = importlib.util.spec_from_file_location("bench_policies_probe_test", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)

    def inst(index: int, role: str, state: str, empty: bool = True, t_alloc_s: float = 0.0) -> Any:
        return SimpleNamespace(
            index=index, role=role, state=state, empty=empty, gpus=2, t_alloc_s=t_alloc_s,
            t_release_s=math.nan, router_requests_total=0,
        )  # fmt: skip

    class Sim:
        def __init__(self) -> None:
            self.instances = [
                inst(0, "prefill", "active", empty=False),
                inst(1, "prefill", "active"),
                inst(2, "decode", "provisioning", t_alloc_s=5.0),
            ]

        def scrape(self) -> None:
            return None

    class Inner:
        name = "stub"

        def reset(self, fleet: Any, traces: Any) -> None:
            return None

        def on_tick(self, now_s: float, view: Any) -> list[Any]:
            return []

    sim = Sim()
    probe = bench.ChurnProbe(Inner())
    view = SimpleNamespace(scrape=sim.scrape)
    probe.on_tick(10.0, view)
    probe.on_tick(13.0, view)  # 3 s of the states seen at t = 13
    sim.instances[2].state, sim.instances[2].t_release_s = "gone", 14.0  # released while provisioning
    probe.on_tick(14.0, view)
    assert probe.by_state[("prefill", "active")] == pytest.approx(2 * 4.0)
    assert probe.by_state[("prefill", "active idle")] == pytest.approx(2 * 4.0)
    assert probe.by_state[("decode", "provisioning")] == pytest.approx(2 * 3.0)
    assert probe.cancelled() == {"decode": 1}


def _settle_run(
    plan: list[tuple[int, bool]], settle: Literal["persist", "persist_reset"], wait_s: float = 30.0
) -> list[int]:
    """``_settled_spare`` tick by tick on a decode spare and whether the stages asked past the fleet that tick,
    with the active rule waiting ``wait_s`` for decode (prefill: a spare of 1 throughout, never past)."""
    cfg = PolicyConfig(standby_spare_settle=settle)
    state, seen = PoolState(), []
    for t, (spare, past) in enumerate(plan):
        held, state = _settled_spare(
            {"prefill": 1 if t == 0 else 0, "decode": spare},
            float(t),
            cfg,
            state,
            {"prefill": False, "decode": past},
            {"prefill": 30.0, "decode": wait_s},
        )
        seen.append(held["decode"])
        assert held["prefill"] == (1 if t < 30 else 0)  # decode going past leaves prefill's memory alone
    return seen


def test_persist_reset_forgets_the_spare_once_the_load_goes_past_the_fleet() -> None:
    """s13p: a spare of 1 for 5 ticks, then 0 with the stages asking past the held fleet at t = 5 (the ramp at
    383 s: wanted 10 over 7 replicas, cut to 7 by the cold-start wait). 'persist' still counts the spare for
    30 s (the standby it leaves waits); 'persist_reset' counts it no longer from that tick on."""
    plan = [(1, False)] * 5 + [(0, True)] + [(0, False)] * 40
    assert _settle_run(plan, "persist") == [1] * 34 + [0] * 12  # the last spare (t = 4) counts until t = 33
    assert _settle_run(plan, "persist_reset") == [1] * 5 + [0] * 41


def test_persist_reset_keeps_the_flap_settled_while_nothing_goes_past() -> None:
    """The flap (spare 1, 0, 1, 0 under a held target, never past it) counts as 1 throughout, as 'persist';
    a spare seen after a tick that went past is remembered again."""
    flap = [(t % 2, False) for t in range(40)]
    assert _settle_run(flap, "persist_reset") == _settle_run(flap, "persist") == [0] + [1] * 39
    after = [(1, False), (0, True), (1, False)] + [(0, False)] * 35
    assert _settle_run(after, "persist_reset") == [1, 0] + [1] * 30 + [0] * 6


def test_persist_reset_settles_only_while_the_active_rule_waits() -> None:
    """No wait for the role this tick (a request waiting, a pool not yet watched, decode on a projected ramp):
    this tick's spare, as 'tick'; 'persist' waits anyway."""
    flap = [(t % 2, False) for t in range(40)]
    assert _settle_run(flap, "persist_reset", wait_s=0.0) == [t % 2 for t in range(40)]
    assert _settle_run(flap, "persist", wait_s=0.0) == [0] + [1] * 39


@given(
    plan=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=60),
    wait_s=st.sampled_from([0.0, 10.0, 30.0]),
)
@settings(max_examples=150, deadline=None)
def test_persist_reset_is_between_this_ticks_and_persists(
    plan: list[tuple[int, bool]], wait_s: float
) -> None:
    """Never below this tick's spare, never above what 'persist' counts; equal to 'persist' while nothing went
    past and the role waits the full cold-start wait."""
    reset, persist = _settle_run(plan, "persist_reset", wait_s), _settle_run(plan, "persist", wait_s)
    for t, (spare, _) in enumerate(plan):
        assert spare <= reset[t] <= persist[t]
    if wait_s == 30.0 and not any(past for _, past in plan):
        assert reset == persist


def _rise_plans(settle: str) -> list[tuple[int, int]]:
    """``decide`` (burst reserve on, so the pool is watched after one cold start) on the flap of
    ``decode_flap_plans``, no warm standby, then from t = 160 a load whose decode target (7) is past the 6
    replicas and cut to them by the cold-start wait: (active, standby) decode per tick."""
    from policy_fixtures import ctx, obs

    from controller.policy import decide

    cfg = PolicyConfig(standby_spare_settle=settle, standby_decode=2)
    state, out = PoolState(), []
    for t in range(200):
        rps = 30.0 if t < 20 else ((12.0 if t % 2 else 16.0) if t < 160 else 22.0)
        o = obs(
            now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0,
            running_seqs=rps * 10.0, replicas={"prefill": 4, "decode": 6}, active={"prefill": 4, "decode": 6},
            standby={"prefill": 0, "decode": 0},
        )  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        out.append((plan.decode, plan.standby_decode))
    return out


def test_decide_persist_reset_asks_for_the_standby_when_the_load_goes_past_the_fleet() -> None:
    """Through ``decide``: during the flap (watched: 130-159 s) 'persist_reset' plans the standby 'persist'
    plans (0: the settled spare of 2 absorbs it; 'tick' flips it); once the load goes past the fleet (t = 160,
    the active target held at 6 by the cold-start wait) it plans the sized standby at once, where 'persist'
    waits out the remembered spare's 30 s."""
    plans = {s: _rise_plans(s) for s in ("tick", "persist", "persist_reset")}
    flap = slice(130, 160)
    assert plans["persist_reset"][flap] == plans["persist"][flap]
    assert {sb for _, sb in plans["persist"][flap]} == {0}
    assert len({sb for _, sb in plans["tick"][flap]}) > 1
    rise = slice(160, 185)
    assert [a for a, _ in plans["persist_reset"][rise]] == [6] * 25  # the wait holds the active target
    assert [sb for _, sb in plans["persist_reset"][rise]] == [2] * 25
    assert [sb for _, sb in plans["persist"][rise]] == [0] * 25


def test_decide_persist_reset_reads_the_stages_target_before_the_short_burst_cap() -> None:
    """The ramp at 383 s (s13p): the stages ask past the fleet, but the short-burst cap (6 short bursts seen)
    holds the wanted target at the warm fleet. 'persist_reset' reads the stages' own target, so the standby is
    asked for at once; read after the cap the load would not have gone past the fleet ('persist': 30 s later)."""
    from policy_fixtures import ctx, obs

    from controller.policy import decide

    def load(t: int) -> float:
        if t < 20 or (t < 300 and t % 40 < 6):  # 6-s bursts every 40 s: short ones, for the cap
            return 30.0
        return (12.0 if t % 2 else 16.0) if t < 340 else 22.0

    standby = {}
    for settle in ("persist", "persist_reset"):
        cfg = PolicyConfig(standby_spare_settle=settle, standby_decode=2)
        state, out = PoolState(), []
        for t in range(372):
            rps = load(t)
            o = obs(
                now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 200.0,
                running_seqs=rps * 10.0, replicas={"prefill": 4, "decode": 6},
                active={"prefill": 4, "decode": 6}, standby={"prefill": 0, "decode": 0},
            )  # fmt: skip
            plan, state = decide(ctx(o, cfg), state)
            assert plan is not None
            if 340 <= t < 345:  # the load's first ticks past the fleet: capped at the warm 6
                assert any(r.startswith("short burst") and "decode 7 → 6" in r for r in plan.reasons)
            if t >= 340:
                out.append(plan.standby_decode)
        standby[settle] = out
    assert standby["persist"][:25] == [0] * 25
    assert standby["persist_reset"][4:] == [2] * 28
