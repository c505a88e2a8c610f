"""W3's cost cuts in the predictive policy: the burst reserve stacked on a block-mean level, and a burst hold
that does not take up again capacity it let go. Labelled tables on hand-built inputs, properties, and runs
through ``burst_reserve_stage`` and ``decide``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, ctx, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages
from controller.policy.types import RoleHistory

BLOCK = stages.NEED_BLOCK_S
Block = tuple[float, float, float, int]
Runs = tuple[tuple[float, float], ...]


@pytest.mark.parametrize(
    ("label", "blocks", "level"),
    [
        ("no block: unknown", (), (math.nan, math.nan)),
        ("one block: its mean", ((10.0, 2.0, 1.0, 3),), (2.0, 1.0)),
        # 2 ticks of the current block (mean 4) + 3 of the previous (mean 1): (2·4 + 3·1) / 5
        ("topped up by the previous block", ((5.0, 1.0, 2.0, 5), (10.0, 4.0, 2.0, 2)), (11 / 5, 2.0)),
        ("a full current block stands alone", ((5.0, 1.0, 1.0, 5), (10.0, 4.0, 3.0, 5)), (4.0, 3.0)),
        (
            "a gap before the current block: it stands alone",
            ((0.0, 9.0, 9.0, 5), (10.0, 4.0, 3.0, 1)),
            (4.0, 3.0),
        ),
    ],
)
def test_trailing_need_table(label: str, blocks: tuple[Block, ...], level: tuple[float, float]) -> None:
    got = stages.trailing_need(blocks)
    for g, want in zip(got, level, strict=True):
        assert (math.isnan(g) and math.isnan(want)) or g == pytest.approx(want), label


@settings(max_examples=60, deadline=None)
@given(
    prev=st.tuples(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.integers(1, 10)),
    cur=st.tuples(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.integers(1, 10)),
)
def test_trailing_need_lies_between_the_two_block_means(
    prev: tuple[float, float, int], cur: tuple[float, float, int]
) -> None:
    blocks = ((0.0, prev[0], prev[1], prev[2]), (BLOCK, cur[0], cur[1], cur[2]))
    for role, level in enumerate(stages.trailing_need(blocks)):
        lo, hi = sorted((prev[role], cur[role]))
        assert lo - 1e-9 <= level <= hi + 1e-9


def _reserve_targets(level: str, spikes: list[float]) -> list[int]:
    """The burst reserve stage's prefill target over a quiet pool whose burst history holds a rise (q0.9:
    8.7 instances, peak 10), for ticks whose own prefill need is ``spikes``."""
    cfg = PolicyConfig(burst_reserve_level=level)
    history = [1.0] * 10 + [10.0] * 2 + [0.2] * 20  # a 10-s burst of 10 instances, then quieter than before
    blocks = tuple((i * BLOCK, v, 0.5, 5) for i, v in enumerate(history))
    state = PoolState(need_blocks=blocks)
    t0 = len(history) * BLOCK
    out = []
    for k, need in enumerate(spikes):
        # prompt tokens/s such that load_need's prefill need is `need` instances (CAP: 10k tok/s per instance)
        o = obs(now_s=t0 + k, prompt_tps=need * 10_000.0, arrival_rps=need, mean_prompt_tokens=10_000.0,
                gen_tps=100.0, waiting_requests=0.0)  # fmt: skip
        p, _, _, state, _ = stages.burst_reserve_stage(1, 1, o, CAP, cfg, state)
        out.append(p)
    return out


def test_block_level_reserve_ignores_a_one_tick_spike_that_the_tick_level_stacks_the_rise_on() -> None:
    spikes = [0.2, 0.2, 1.0, 0.2, 0.2]
    tick = _reserve_targets("tick", spikes)
    block = _reserve_targets("block", spikes)
    assert tick[2] > tick[1]  # the spike tick: tick need 3 + the rise
    assert max(block) < tick[2]  # the block mean moves by a fifth of it
    assert block[0] == tick[0]  # on a steady load both read the same level


# Gaps between bursts of 200-220 s with a 120-s lead: until τ = 80 s no gap ends within a cold start
# (hazard 0: released once the 60-s scale-down delay is over); from τ = 100 s on every remaining gap does.
LATE_GAPS: Runs = ((0.0, 10.0), (210.0, 220.0), (430.0, 440.0), (660.0, 670.0))


@pytest.mark.parametrize(
    ("label", "tau", "rebuy", "holds"),
    [
        ("just after the burst: released either way", 0.0, False, False),
        ("just after the burst: released either way (rebuy)", 0.0, True, False),
        ("hazard back above the threshold: rebuy holds again", 100.0, True, True),
        ("hazard back above the threshold: no rebuy, stays released", 100.0, False, False),
    ],
)
def test_burst_hold_does_not_rebuy_what_it_let_go(label: str, tau: float, rebuy: bool, holds: bool) -> None:
    cfg = PolicyConfig(burst_hold="survival", burst_hold_rebuy=rebuy)
    window, why = stages.burst_hold(LATE_GAPS, LATE_GAPS[-1][1] + tau, cfg)
    assert (window > 0) == holds, label
    assert (why is not None) == holds, label


def test_a_hold_never_let_go_is_kept_without_rebuy() -> None:
    cfg = PolicyConfig(burst_hold="survival", burst_hold_rebuy=False)
    short: Runs = ((0.0, 10.0), (70.0, 80.0), (160.0, 170.0), (270.0, 280.0))  # gaps 60-100 s
    assert stages.burst_hold(short, 300.0, cfg)[0] > 0
    # Gaps of 140 s: the hazard is 0 for τ < 20 s and 1 after; the dip falls inside the 60-s scale-down delay,
    # which released nothing, so the hold is taken up (and kept) all the same.
    regular: Runs = ((0.0, 10.0), (150.0, 160.0), (300.0, 310.0), (450.0, 460.0))
    assert stages.burst_hold(regular, 460.0 + 5.0, cfg)[0] == 0
    assert stages.burst_hold(regular, 460.0 + 50.0, cfg)[0] > 0
    assert stages.burst_hold(regular, 460.0 + 100.0, cfg)[0] > 0


def test_gap_hazard_table() -> None:
    gaps = np.asarray([60.0, 80.0, 100.0, 400.0, 500.0])
    assert stages.gap_hazard(gaps, 20.0, 120.0) == pytest.approx(3 / 5)
    assert stages.gap_hazard(gaps, 300.0, 120.0) == pytest.approx(1 / 2)  # of 400, 500: only 400 ≤ 420
    assert stages.gap_hazard(gaps, 600.0, 120.0) == 0.0  # none outlasts τ
    assert stages.gap_hazard(np.asarray([]), 0.0, 120.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(1.0, 900.0), min_size=1, max_size=10),
    tau=st.floats(0.0, 400.0),
    p=st.floats(0.05, 1.0),
)
def test_no_rebuy_holds_only_where_rebuy_would(gaps: list[float], tau: float, p: float) -> None:
    runs: list[tuple[float, float]] = [(0.0, 10.0)]
    for g in gaps:
        start = runs[-1][1] + g
        runs.append((start, start + 10.0))
    now = runs[-1][1] + tau
    strict = stages.burst_hold(
        tuple(runs), now, PolicyConfig(burst_hold_probability=p, burst_hold_rebuy=False)
    )
    loose = stages.burst_hold(tuple(runs), now, PolicyConfig(burst_hold_probability=p, burst_hold_rebuy=True))
    assert strict[0] <= loose[0]
    assert strict[0] == 0.0 or strict[0] == loose[0]


def test_decide_with_both_cuts_stays_within_the_seed_rules() -> None:
    """A quiet pool with one burst: both cuts plan no more prefill-seconds than session 3's rules (tick-level
    reserve, rebuy), and the same capacity for the burst itself."""

    def run(cfg: PolicyConfig) -> list[int]:
        state, out = PoolState(), []
        rng = np.random.default_rng(3)
        replicas = {"prefill": 1, "decode": 1}
        for t in range(600):
            rps = 30.0 if 100 <= t < 120 else float(rng.poisson(3.0))
            o = obs(now_s=float(t), arrival_rps=rps, prompt_tps=rps * 2000.0, gen_tps=rps * 100.0,
                    running_seqs=rps, replicas=dict(replicas), active=dict(replicas),
                    standby={"prefill": 0, "decode": 0})  # fmt: skip
            plan, state = decide(ctx(o, cfg), state)
            assert plan is not None
            replicas = {"prefill": plan.prefill, "decode": plan.decode}
            out.append(plan.prefill)
        return out

    new = run(PolicyConfig(burst_hold_rebuy=False))
    old = run(PolicyConfig(burst_reserve_level="tick", burst_hold_rebuy=True))
    assert sum(new) <= sum(old)
    assert max(new[100:125]) == max(old[100:125])  # the burst itself gets the same capacity


def _hist(*targets: tuple[float, int]) -> RoleHistory:
    return RoleHistory(last_scale_up_s=-1e9, last_change_s=-1e9, recent_targets=targets)


@pytest.mark.parametrize(
    ("label", "history", "wanted", "fast_up", "persist_s", "target"),
    [
        ("a one-tick spike starts no cold capacity", ((96.0, 2), (98.0, 2), (99.0, 2)), 6, 0, 5.0, 2),
        ("no wait configured: the spike is followed", ((96.0, 2), (98.0, 2), (99.0, 2)), 6, 0, 0.0, 6),
        ("a target that lasted the wait is followed", ((96.0, 6), (98.0, 6), (99.0, 6)), 6, 0, 5.0, 6),
        (
            "it rises only as far as the lowest target of the wait",
            ((96.0, 4), (98.0, 5), (99.0, 6)),
            7,
            0,
            5.0,
            4,
        ),
        ("targets older than the wait do not count", ((90.0, 2), (99.0, 6)), 6, 0, 5.0, 6),
        ("warm standby is promoted at once", ((96.0, 2), (98.0, 2), (99.0, 2)), 4, 2, 5.0, 4),
        ("beyond the standby only the warm part is taken", ((96.0, 2), (98.0, 2), (99.0, 2)), 6, 2, 5.0, 4),
    ],
)
def test_cold_start_waits_for_a_lasting_target(
    label: str,
    history: tuple[tuple[float, int], ...],
    wanted: int,
    fast_up: int,
    persist_s: float,
    target: int,
) -> None:
    cfg = PolicyConfig(ramp_up_s=0.0)  # no ramp limit: only the wait shapes the target
    got, _, _ = stages.hysteresis_stage(
        "prefill", wanted, 2, 100.0, cfg, _hist(*history), True, fast_up, cold_persist_s=persist_s
    )
    assert got == target, label


def test_cold_start_wait_without_a_clock_is_no_wait() -> None:
    """A NaN time has no window: the wait does not apply (it raised on an empty min before), as with no wait."""
    cfg = PolicyConfig(ramp_up_s=0.0)
    history = _hist((96.0, 2), (98.0, 2), (99.0, 2))
    got, _, _ = stages.hysteresis_stage("prefill", 6, 2, math.nan, cfg, history, True, 0, cold_persist_s=30.0)
    off, _, _ = stages.hysteresis_stage("prefill", 6, 2, math.nan, cfg, history, True, 0, cold_persist_s=0.0)
    assert got == off


def _spike_plan(
    cfg: PolicyConfig, *, waiting: float, quiet_s: int, role: str = "prefill", spike_rps: float = 12.0
) -> int:
    """``role`` planned at the one tick whose load spikes to ``spike_rps`` (6×) after ``quiet_s`` quiet seconds."""
    state = PoolState()
    replicas = {"prefill": 1, "decode": 1}
    plan = None
    for t in range(quiet_s + 1):
        rps = spike_rps if t == quiet_s else 2.0
        o = obs(now_s=float(t), arrival_rps=rps, prompt_tps=rps * 2000.0, gen_tps=rps * 1000.0,
                running_seqs=rps, replicas=dict(replicas), active=dict(replicas),
                standby={"prefill": 0, "decode": 0}, waiting_requests=waiting if t == quiet_s else 0.0,
                oldest_wait_s=0.1 if t == quiet_s and waiting else math.nan)  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        replicas = {"prefill": plan.prefill, "decode": plan.decode}
    assert plan is not None
    return plan.count(role)


def test_decide_waits_only_in_a_watched_pool_without_a_queue() -> None:
    cfg = PolicyConfig(standby_decode=0)
    off = cfg.model_copy(update={"cold_start_persist_s": 0.0})
    quiet = 300  # more than one cold start (provision_lead_s = 120 s) of history
    assert _spike_plan(cfg, waiting=0.0, quiet_s=quiet) < _spike_plan(off, waiting=0.0, quiet_s=quiet)
    # a queue is load already here: no wait
    assert _spike_plan(cfg, waiting=30.0, quiet_s=quiet) == _spike_plan(off, waiting=30.0, quiet_s=quiet)
    # under one cold start of history a spike is not known to be one: no wait
    assert _spike_plan(cfg, waiting=0.0, quiet_s=60) == _spike_plan(off, waiting=0.0, quiet_s=60)
    # decode waits too (cold_start_persist_decode, the default since session 5); without it (session 4) never
    spiked = _spike_plan(off, waiting=0.0, quiet_s=quiet, role="decode")
    assert spiked > _spike_plan(
        off, waiting=0.0, quiet_s=quiet, role="decode", spike_rps=2.0
    )  # it raises decode
    no_decode_wait = cfg.model_copy(update={"cold_start_persist_decode": False})
    assert _spike_plan(no_decode_wait, waiting=0.0, quiet_s=quiet, role="decode") == spiked
    assert _spike_plan(cfg, waiting=0.0, quiet_s=quiet, role="decode") < spiked


def test_short_burst_cap_ends_once_the_high_load_lasted_a_cold_start() -> None:
    """A high load that outlasts every short burst seen and one cold start is a level (a sinusoid's rise):
    cold capacity follows it, as ``burst_hold`` judges a level."""
    cfg = PolicyConfig(short_burst_cap=True, burst_hold="survival")
    short_runs: Runs = ((0.0, 20.0), (100.0, 130.0), (200.0, 215.0))
    base = 1200.0
    blocks = tuple((base + i * BLOCK, v, 0.0, 5) for i, v in enumerate([1.0] * 40 + [8.0] * 30))
    high_since = base + 40 * BLOCK
    runs = (*short_runs, (high_since, blocks[-2][0] + BLOCK))  # the current high run, still going
    assert stages.short_burst(runs, blocks, high_since + 30.0, cfg)[0]  # 30 s in: capped
    assert not stages.short_burst(runs, blocks, high_since + 125.0, cfg)[0]  # past one cold start: a level
