"""The burst history across a long silence (``idle_stretch``, ``resume_history``) and a history that starts in
a burst (``leading_run``, the run cut by the start of the history in ``burst_hold`` / ``short_burst``): tables on
hand-built inputs and runs through ``burst_reserve_stage`` and ``decide``. Each case failed before the change
(docs/BENCHMARKS.md, "Silences and histories that start in a burst")."""

from __future__ import annotations

import math

import pytest
from policy_fixtures import CAP, ctx, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages
from controller.policy.types import PoolObservation

BLOCK = stages.NEED_BLOCK_S
Runs = tuple[tuple[float, float], ...]
Blocks = tuple[tuple[float, float, float, int], ...]


def _load(t: float, rps: float) -> PoolObservation:
    """A pool at ``rps`` arrivals/s of 1,000-token prompts and 100-token outputs (0: nothing at all)."""
    o: PoolObservation = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0,
                             running_seqs=rps * 2.0, standby={"prefill": 0, "decode": 0})  # fmt: skip
    return o


def _bursty(t: float) -> float:
    """10 s at 40 req/s every 60 s, 2 req/s between."""
    return 40.0 if t % 60.0 < 10.0 else 2.0


@pytest.mark.parametrize(
    ("label", "needs", "since", "idle_s"),
    [
        ("load needs something: no idle stretch", [(0.0, 0.0), (0.5, 0.0)], math.nan, 0.0),
        ("nil need from t=1 on", [(1.0, 1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)], 1.0, 2.0),
        (
            "an unknown need neither breaks nor extends it",
            [(0.0, 0.0), (math.nan, 0.0), (0.0, 0.0)],
            0.0,
            2.0,
        ),
        ("decode still generating is not idle", [(0.0, 0.0), (0.0, 0.2)], math.nan, 0.0),
    ],
)
def test_idle_stretch_table(
    label: str, needs: list[tuple[float, float]], since: float, idle_s: float
) -> None:
    state = PoolState()
    got = 0.0
    for t, need in enumerate(needs):
        got, state = stages.idle_stretch(need, float(t), 300.0, state)
    assert got == idle_s, label
    assert (math.isnan(state.idle_since_s) and math.isnan(since)) or state.idle_since_s == since, label


def test_resume_cuts_the_pause_out_of_the_history() -> None:
    blocks: Blocks = ((100.0, 1.0, 1.0, 5), (105.0, 6.0, 1.0, 5), (110.0, 0.0, 0.0, 5), (115.0, 0.0, 0.0, 5))
    state = PoolState(need_blocks=blocks, burst_runs=((105.0, 110.0),), idle_since_s=110.0)
    moved = stages.resume_history(state, 4003.0)  # its block starts at 4000: the idle blocks go, shift 3890
    assert [b[0] for b in moved.need_blocks] == [3990.0, 3995.0]
    assert [b[1:] for b in moved.need_blocks] == [b[1:] for b in blocks[:2]]  # needs kept as they were
    assert moved.burst_runs == ((3995.0, 4000.0),)
    assert moved.pauses == (4000.0,)
    assert stages.resume_history(PoolState(), 4003.0) == PoolState()  # nothing to move


def test_a_history_of_idle_blocks_only_is_moved_not_cut() -> None:
    """A pool idle from its start keeps its watched quiet: the first burst after it is not held for it."""
    blocks: Blocks = tuple((i * BLOCK, 0.0, 0.0, 5) for i in range(60))
    moved = stages.resume_history(PoolState(need_blocks=blocks, idle_since_s=0.0), 4003.0)
    assert len(moved.need_blocks) == 60
    assert moved.need_blocks[-1][0] == 3995.0


@pytest.mark.parametrize(
    ("label", "pauses", "holds"),
    [
        # runs 10 s long, gaps 30 s then 40 s; τ = 60 s after the last: both gaps outlasted, hazard 0
        ("no pause: both gaps count, released", (), False),
        # the 40-s gap spans a pause: one gap of 30 s is left, still outlasted → released
        ("a pause in one gap: the other still decides", (70.0,), False),
        # both gaps span pauses: no gap left, too few to release → held
        ("pauses in every gap: too few gaps, held", (35.0, 70.0), True),
    ],
)
def test_a_gap_across_a_pause_is_not_an_inter_burst_gap(
    label: str, pauses: tuple[float, ...], holds: bool
) -> None:
    runs: Runs = ((0.0, 10.0), (40.0, 50.0), (90.0, 100.0))
    window, _ = stages.burst_hold(runs, 160.0, PolicyConfig(), math.nan, pauses)
    assert (window > 0) == holds, label


def _reserve_run(ticks: list[tuple[float, float]], cfg: PolicyConfig) -> list[tuple[int, tuple[str, ...]]]:
    """(prefill target, reasons) of ``burst_reserve_stage`` per (t, rps) tick, from a target of 1."""
    state, out = PoolState(), []
    for t, rps in ticks:
        p, _, _, state, why = stages.burst_reserve_stage(1, 1, _load(t, rps), CAP, cfg, state)
        out.append((p, why))
    return out


def test_an_hour_of_silence_releases_the_reserve_and_keeps_it_for_the_return() -> None:
    """10 min of bursts, 1 h of nothing, then 2 req/s: the reserve is released 300 s into the silence (it
    was held for ~27 min, then read 0 at the return, before), and is there again at the first busy tick."""
    cfg = PolicyConfig(idle_release_s=300.0)
    busy = [(float(t), _bursty(t)) for t in range(600)]
    quiet = [(float(t), 0.0) for t in range(600, 4200)]
    out = _reserve_run([*busy, *quiet, (4200.0, 2.0)], cfg)
    during = out[600 + 20 : 600 + 300]  # the load ends at 600 s; 20 s on, decode has drained
    assert min(p for p, _ in out[550:600]) > 1  # the reserve holds capacity for the pool's bursts
    assert all(p > 1 for p, _ in during)  # a pause only after idle_release_s
    assert all(p == 1 for p, _ in out[600 + 320 : 4200])  # released for the rest of the silence
    assert any("burst reserve released" in w for w in out[2000][1])
    back, why = out[-1]
    assert back > 1, why  # the bursts of the pool are known again at once
    assert any("burst reserve" in w and "rises" in w for w in why)


def test_a_longer_release_keeps_the_reserve_through_a_shorter_silence() -> None:
    cfg = PolicyConfig(idle_release_s=1800.0)
    ticks = [(float(t), _bursty(t)) for t in range(600)] + [(float(t), 0.0) for t in range(600, 1800)]
    assert all(p > 1 for p, _ in _reserve_run(ticks, cfg)[620:])


def _fold(totals: list[float]) -> Runs:
    """The runs update_burst_runs finds, fed one opened block at a time (the last value is the open block)."""
    blocks: Blocks = tuple((i * BLOCK, v, 0.0, 5) for i, v in enumerate(totals))
    runs: Runs = ()
    for k in range(2, len(totals) + 1):
        runs = stages.update_burst_runs(runs, blocks[:k], 0.3, keep_s=3600.0)
    return runs


@pytest.mark.parametrize(
    ("label", "totals", "runs"),
    [
        ("a history that starts in a burst records it", [6, 6, 6, 1, 1, 1, 1, 1, 1, 0], ((0.0, 15.0),)),
        ("one high first block", [6, 1, 1, 1, 1, 1, 0], ((0.0, 5.0),)),
        ("a quiet start records nothing at the start", [1, 1, 1, 6, 1, 1, 0], ((15.0, 20.0),)),
        ("flat from the start: nothing", [3, 3, 3, 3, 3, 0], ()),
        ("a burst that is still on is extended block by block", [6, 6, 1, 1, 1, 1, 6, 0], ((0.0, 10.0),)),
    ],
)
def test_leading_run_table(label: str, totals: list[float], runs: Runs) -> None:
    assert _fold(totals)[: len(runs)] == runs, label
    assert len(_fold(totals)) >= len(runs), label


def test_a_gap_in_the_data_ends_the_leading_run() -> None:
    blocks: Blocks = ((0.0, 6.0, 0.0, 5), (10.0, 6.0, 0.0, 5), (15.0, 1.0, 0.0, 5), (20.0, 1.0, 0.0, 5))
    assert stages.leading_run(blocks, 1.0, 0.3) == ((0.0, 5.0),)


def test_an_old_history_is_not_read_as_starting_in_a_burst() -> None:
    blocks: Blocks = tuple((i * BLOCK, 6.0 if i < 2 else 1.0, 0.0, 5) for i in range(10))
    assert stages.update_burst_runs((), blocks, 0.3, keep_s=30.0) == ()  # spans more than keep_s


@pytest.mark.parametrize(
    ("label", "seen_from_s", "holds"),
    [
        # runs (0, 15) and (45, 50): one gap of 30 s, outlasted at τ = 60 s: the hazard is 0 and nothing holds
        ("first run seen whole: its gap counts, released", -300.0, False),
        # the first run starts with the history: its gap is not counted, too few gaps → held
        ("first run starts with the history: held", 0.0, True),
    ],
)
def test_the_gap_after_a_run_cut_by_the_history_start_is_not_counted(
    label: str, seen_from_s: float, holds: bool
) -> None:
    runs: Runs = ((0.0, 15.0), (45.0, 50.0))
    window, _ = stages.burst_hold(runs, 110.0, PolicyConfig(), seen_from_s)
    assert (window > 0) == holds, label


def test_short_burst_does_not_count_a_run_cut_by_the_history_start() -> None:
    blocks: Blocks = (*tuple((i * BLOCK, 1.0, 0.0, 5) for i in range(40)), (200.0, 8.0, 0.0, 1))
    runs: Runs = ((0.0, 10.0), (100.0, 110.0))  # the first starts with the history
    assert not stages.short_burst(runs, blocks, 201.0, PolicyConfig())[0]  # one whole burst: too few
    runs3: Runs = ((0.0, 10.0), (100.0, 110.0), (150.0, 160.0))
    assert stages.short_burst(runs3, blocks, 201.0, PolicyConfig())[0]


def test_decide_keeps_capacity_a_burst_at_the_start_asked_for() -> None:
    """A pool first seen in a burst (40 req/s for 15 s, then 2 req/s): the prefill it asked for is kept for
    the next burst instead of being released 60 s later, just before it would have served (mmpp@3)."""
    cfg = PolicyConfig(standby_decode=0)
    state, replicas, prefill = PoolState(), {"prefill": 1, "decode": 1}, []
    for t in range(0, 240):
        rps = 40.0 if t < 15 else 2.0
        o = _load(float(t), rps)
        o = obs(**{**o.__dict__, "replicas": dict(replicas), "active": dict(replicas)})
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        replicas = {"prefill": plan.prefill, "decode": plan.decode}
        prefill.append(plan.prefill)
    peak = max(prefill[:15])
    assert peak > 1
    assert min(prefill[15:200]) == peak  # held through the quiet that follows (burst_hold_max_s)
