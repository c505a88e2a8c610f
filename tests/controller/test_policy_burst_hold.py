"""Burst hold (inter-burst gap survival), the short-burst cap on cold starts, and the at-arrival prompt flag:
labelled tables on hand-built inputs, properties, and a run through ``decide``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, ctx, obs

from controller.config import PolicyConfig
from controller.pipeline import LengthTracker, PoolCounts, build_observation
from controller.policy import PoolState, decide, stages
from controller.policy.types import RoleHistory
from controller.sources.aggregate import LoadAggregator
from serving.sim import samples as s

BLOCK = stages.NEED_BLOCK_S
HOLD = PolicyConfig(burst_hold="survival", short_burst_cap=True)
OFF = PolicyConfig(burst_hold="off", short_burst_cap=False, young_hold_s=0.0)  # no hold of any kind
Runs = tuple[tuple[float, float], ...]


def _blocks(totals: list[float]) -> tuple[tuple[float, float, float, int], ...]:
    """One 5-s block per value; prefill need = the value, decode 0."""
    return tuple((i * BLOCK, v, 0.0, 5) for i, v in enumerate(totals))


def _fold(totals: list[float], headroom: float = 0.3) -> Runs:
    """The runs update_burst_runs finds, fed one opened block at a time (the last value is the open block)."""
    runs: Runs = ()
    for k in range(2, len(totals) + 1):
        runs = stages.update_burst_runs(runs, _blocks(totals[:k]), headroom, keep_s=3600.0)
    return runs


@pytest.mark.parametrize(
    ("label", "totals", "runs"),
    [
        ("flat load has no burst", [3, 3, 3, 3, 3, 3, 0], ()),
        ("noise under median + 1 instance is no burst", [1, 1.8, 1, 1.9, 1, 1, 0], ()),
        ("one spike block", [1, 1, 1, 6, 1, 1, 0], ((15.0, 20.0),)),
        ("consecutive high blocks are one run", [1, 1, 1, 1, 1, 1, 6, 7, 6, 1, 1, 0], ((30.0, 45.0),)),
        ("two runs", [1, 1, 6, 1, 1, 1, 7, 1, 0], ((10.0, 15.0), (30.0, 35.0))),
        ("the open block is not judged yet", [1, 1, 1, 9], ()),
    ],
)
def test_burst_runs_table(label: str, totals: list[float], runs: Runs) -> None:
    assert _fold(totals) == runs, label


def test_old_runs_are_forgotten() -> None:
    runs = ((0.0, 5.0), (500.0, 505.0))
    blocks = tuple((900.0 + i * BLOCK, 1.0, 0.0, 5) for i in range(3))
    assert stages.update_burst_runs(runs, blocks, 0.3, keep_s=410.0) == ((500.0, 505.0),)


def _cfg(**kw: object) -> PolicyConfig:
    return PolicyConfig(**{"burst_hold": "survival", **kw})


# Runs of 10 s; gaps 60, 80, 100 s between them (all shorter than the 120-s lead).
SHORT_GAPS: Runs = ((0.0, 10.0), (70.0, 80.0), (160.0, 170.0), (270.0, 280.0))
# Gaps of 400, 500, 600 s: each longer than lead + τ for small τ.
LONG_GAPS: Runs = ((0.0, 10.0), (410.0, 420.0), (920.0, 930.0), (1530.0, 1540.0))


@pytest.mark.parametrize(
    ("label", "runs", "now_s", "cfg", "holds"),
    [
        ("off never holds", SHORT_GAPS, 300.0, OFF, False),
        ("no burst seen, nothing to hold", (), 300.0, _cfg(), False),
        ("too few gaps: unknown is held", ((0.0, 10.0),), 100.0, _cfg(), True),
        ("short gaps: the next burst is likely within a cold start", SHORT_GAPS, 300.0, _cfg(), True),
        ("long gaps: unlikely within a cold start, released", LONG_GAPS, 1560.0, _cfg(), False),
        ("beyond every gap seen: released", SHORT_GAPS, 400.0, _cfg(), False),
        ("past burst_hold_max_s: released", ((0.0, 10.0),), 400.0, _cfg(), False),
        (
            "a high load as long as a cold start is a level, not a burst",
            ((0.0, 130.0),),
            150.0,
            _cfg(),
            False,
        ),
    ],
)
def test_burst_hold_table(label: str, runs: Runs, now_s: float, cfg: PolicyConfig, holds: bool) -> None:
    window, why = stages.burst_hold(runs, now_s, cfg)
    assert (window > 0) == holds, label
    assert (why is not None) == holds, label
    if holds:
        assert window >= now_s - runs[-1][1], label  # reaches back to the burst


def test_hold_probability_is_the_empirical_hazard() -> None:
    # Gaps 60, 80, 100, 400, 500 s; τ = 20 s after the last burst: 3 of the 5 gaps fall in (20, 140] → 0.6.
    runs: Runs = ((0.0, 10.0), (70.0, 80.0), (160.0, 170.0), (270.0, 280.0), (680.0, 690.0), (1190.0, 1200.0))
    assert stages.burst_hold(runs, 1220.0, _cfg(burst_hold_probability=0.6))[0] > 0
    assert stages.burst_hold(runs, 1220.0, _cfg(burst_hold_probability=0.61))[0] == 0


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(1.0, 900.0), min_size=0, max_size=12),
    tau=st.floats(0.0, 1000.0),
    p=st.floats(0.05, 1.0),
)
def test_hold_window_is_bounded(gaps: list[float], tau: float, p: float) -> None:
    runs: list[tuple[float, float]] = [(0.0, 10.0)]
    for g in gaps:
        start = runs[-1][1] + g
        runs.append((start, start + 10.0))
    cfg = _cfg(burst_hold_probability=p)
    window, _ = stages.burst_hold(tuple(runs), runs[-1][1] + tau, cfg)
    assert 0.0 <= window <= cfg.burst_hold_max_s + 10.0
    assert window == 0.0 or tau < cfg.burst_hold_max_s


def test_short_burst_by_duration_survival() -> None:
    cfg = HOLD
    quiet_then_high = tuple((1200.0 + b[0], *b[1:]) for b in _blocks([1.0] * 20 + [8.0]))  # open block high
    short_runs: Runs = ((0.0, 20.0), (100.0, 130.0), (200.0, 215.0))
    long_runs: Runs = ((0.0, 300.0), (400.0, 700.0), (800.0, 1100.0))
    now = quiet_then_high[-1][0] + 1.0
    assert stages.short_burst(short_runs, quiet_then_high, now, cfg)[0]
    assert not stages.short_burst(long_runs, quiet_then_high, now, cfg)[0]
    assert not stages.short_burst(short_runs[:1], quiet_then_high, now, cfg)[0]  # too few bursts seen
    assert not stages.short_burst(short_runs, _blocks([1.0] * 21), now, cfg)[0]  # not in a burst
    assert not stages.short_burst(short_runs, quiet_then_high, now, OFF)[0]  # off


def test_hysteresis_hold_keeps_the_burst_target() -> None:
    cfg = HOLD
    hist = RoleHistory(last_scale_up_s=0.0, last_change_s=0.0, recent_targets=((10.0, 12), (100.0, 2)))
    # 150 s later the scale-down delay (60 s) alone would release; a 200-s hold keeps 12.
    assert stages.hysteresis_stage("prefill", 2, 12, 150.0, cfg, hist, True, 0)[0] < 12
    assert stages.hysteresis_stage("prefill", 2, 12, 150.0, cfg, hist, True, 0, hold_s=200.0)[0] == 12
    # Targets are remembered for burst_hold_max_s when a hold may need them, else for the delay only.
    _, kept, _ = stages.hysteresis_stage("prefill", 2, 12, 150.0, cfg, hist, True, 0)
    assert (10.0, 12) in kept.recent_targets
    _, short, _ = stages.hysteresis_stage("prefill", 2, 12, 150.0, OFF, hist, True, 0)
    assert (10.0, 12) not in short.recent_targets


def test_decide_holds_after_short_bursts_and_releases_without_them() -> None:
    """A pool with 10-s bursts every ~60 s keeps its burst capacity through the gaps with the hold; without
    it the target falls back after the scale-down delay."""

    def run(cfg: PolicyConfig) -> list[int]:
        state = PoolState()
        replicas = {"prefill": 1, "decode": 1}
        out = []
        for t in range(0, 750):
            burst = (t % 150) < 10
            rps = 40.0 if burst else 2.0
            o = obs(now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0,
                    running_seqs=rps * 2, replicas=dict(replicas), active=dict(replicas),
                    standby={"prefill": 0, "decode": 0})  # fmt: skip
            plan, state = decide(ctx(o, cfg), state)
            assert plan is not None
            replicas = {"prefill": plan.prefill, "decode": plan.decode}
            out.append(plan.prefill)
        return out

    held = run(PolicyConfig(burst_hold="survival", standby_decode=0, burst_reserve="off"))
    plain = run(PolicyConfig(standby_decode=0, burst_reserve="off", burst_hold="off"))
    # Gaps of 140 s: the next burst is sure within one cold start from 20 s after one on, so the held pool
    # keeps its burst prefill through the last gap (bursts at 600 and 750); the plain one sheds it.
    assert min(held[610:750]) > min(plain[610:750])


def test_prompt_at_arrival_skips_the_offered_estimate_only_when_configured() -> None:
    waiting = {
        "waiting_requests": 50.0,
        "arrival_rps": 20.0,
        "mean_prompt_tokens": 2000.0,
        "prompt_tps": 10_000.0,
    }
    at_arrival = obs(prompt_at_arrival=True, **waiting)
    counted = obs(prompt_at_arrival=False, **waiting)
    skip = PolicyConfig(offered_at_arrival=False)
    assert stages.uses_offered(at_arrival, PolicyConfig())
    assert not stages.uses_offered(at_arrival, skip)
    assert stages.uses_offered(counted, skip)  # the prefilled counter flattens: the offered load stays
    # load_need: arrivals × mean prompt (40k tok/s) lifts the prefill need over the counter's 10k only when used
    assert stages.load_need(at_arrival, CAP, offered=True)[0] == pytest.approx(4.0)
    assert stages.load_need(at_arrival, CAP, offered=False)[0] == pytest.approx(1.0)
    p_skip, _ = decide(ctx(at_arrival, skip), PoolState())
    p_max, _ = decide(ctx(at_arrival), PoolState())
    assert p_skip is not None and p_max is not None
    assert p_skip.prefill < p_max.prefill


def _scrape(now_s: float, routed: bool) -> s.InstanceSamples:
    counters = {
        s.PROMPT_TOKENS_TOTAL: np.asarray([100.0 * now_s, 0.0]),
        s.GENERATION_TOKENS_TOTAL: np.asarray([0.0, 10.0 * now_s]),
        s.ROUTER_REQUESTS_TOTAL: np.asarray([now_s, now_s]),
    }
    if routed:
        counters[s.ROUTER_PROMPT_TOKENS_TOTAL] = np.asarray([300.0 * now_s, 0.0])
    return s.InstanceSamples(
        now_s=now_s, instance_ids=("p0", "d0"), pools=("default",) * 2, roles=("prefill", "decode"),
        nodes=("p0", "d0"), states=("active",) * 2,
        gauges={s.NUM_REQUESTS_RUNNING: np.full(2, 1.0), s.NUM_REQUESTS_WAITING: np.full(2, 0.0),
                s.KV_CACHE_USAGE_PERC: np.full(2, 0.1)},
        counters=counters,
    )  # fmt: skip


@pytest.mark.parametrize(("routed", "prompt_tps"), [(True, 300.0), (False, 100.0)])
def test_the_aggregator_says_whether_prompt_load_is_counted_at_arrival(
    routed: bool, prompt_tps: float
) -> None:
    agg = LoadAggregator()
    agg.update(_scrape(10.0, routed), ["default"])
    load = agg.update(_scrape(11.0, routed), ["default"])["default"]
    assert load.prompt_tps == pytest.approx(prompt_tps)
    assert load.prompt_at_arrival is routed
    counts = PoolCounts(
        replicas={"prefill": 1, "decode": 1}, active={"prefill": 1, "decode": 1}, standby={}, provisioning={}
    )
    o = build_observation("default", load, counts, 11.0, None, LengthTracker())
    assert o.prompt_at_arrival is routed
    assert not math.isnan(o.prompt_tps)


@pytest.mark.parametrize(
    ("label", "seen_from_s", "holds"),
    [
        ("first burst, watched 600 s before it without one: no hold", 400.0, False),
        ("first burst, watched only 60 s before it: hold (unknown is not 'no burst')", 940.0, True),
        ("first burst, history unknown: hold", math.nan, True),
    ],
)
def test_quiet_time_before_the_first_burst_counts(label: str, seen_from_s: float, holds: bool) -> None:
    runs: Runs = ((1000.0, 1030.0),)
    window, _ = stages.burst_hold(runs, 1060.0, _cfg(), seen_from_s)
    assert (window > 0) == holds, label
    # once a gap between bursts is known, the survival estimate decides, whatever came before
    two: Runs = ((1000.0, 1030.0), (1100.0, 1130.0))
    assert stages.burst_hold(two, 1150.0, _cfg(), 0.0)[0] > 0  # gap 70 s < one cold start: hold
