"""The burst reserve's kept lead peaks (``PoolState.need_peaks``, ``stages.burst_reserve_kept``, with the sorted
cache of ``controller.policy.reserve_fast``): a pool that
carries them through its ticks gets, on every tick, the reserve its blocks give by the definition (every
block pair looked at again, ``_reference_reserve``) and the same state but for the kept peaks as a pool that
recomputes everything each tick, through gaps in the data, time going back, idle pauses (``idle_release_s``,
``resume_history`` moves the blocks), a restart (``recovered_state``), a lost cache and another lead.
Compared with ``==`` on floats, NaN for NaN: no tolerance."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, obs
from test_policy_fast_paths import _reference_peaks, _reference_reserve, _same

from controller.config import PolicyConfig
from controller.pipeline import PoolCounts, recovered_state
from controller.policy import PoolState, stages
from controller.policy.types import LeadPeaks, PoolObservation

BLOCK = stages.NEED_BLOCK_S


def _load(t: float, rps: float) -> PoolObservation:
    """A pool at ``rps`` arrivals/s of 1,000-token prompts and 100-token outputs (0: idle; NaN: unknown)."""
    o: PoolObservation = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0,
                             running_seqs=rps * 2.0, standby={"prefill": 0, "decode": 0})  # fmt: skip
    return o


def _rows(peaks: LeadPeaks) -> list[tuple[float, ...]]:
    """The kept rows: (start, prefill need, decode need, prefill peak, decode peak) per block."""
    return [tuple(r) for r in np.frombuffer(peaks.rows).reshape(-1, 5).tolist()]


# (seconds since the last tick, rps, what happens before the tick, the trend factor: NaN = none)
Event = tuple[float, float, str, float]


@st.composite
def runs(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(1, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # mostly 1-s ticks; a late tick, a gap in the data, now and then time going back (blocks out of order:
    # nothing is kept while that block is remembered)
    steps = rng.choice([1.0, 2.0, 0.5, 30.0, -7.0], p=[0.9, 0.04, 0.04, 0.015, 0.005], size=n)
    # bursts over a base load, with stretches of nothing (idle pauses) and an unknown reading now and then
    rps = np.where(rng.random(n) < 0.15, 40.0, 3.0) * rng.uniform(0.5, 1.5, n)
    quiet = np.zeros(n, dtype=bool)
    for start in rng.integers(0, n, size=int(rng.integers(0, 3))):
        quiet[start : start + int(rng.integers(20, 120))] = True
    rps = np.where(quiet, 0.0, rps)
    rps = np.where(rng.random(n) < 0.02, math.nan, rps)
    what = rng.choice(["tick"] * 400 + ["restart", "forget", "lead"], size=n)
    # the trend stage's factor this tick (NaN: no ramp projected), in stretches, as ramps come and go
    trend = np.repeat(rng.choice([math.nan, math.nan, 1.5, 2.25, math.inf], size=n // 10 + 1), 10)[:n]
    return list(zip(steps.tolist(), rps.tolist(), what.tolist(), trend.tolist(), strict=True))


@settings(max_examples=100, deadline=None)
@given(
    runs(),
    st.sampled_from([0.0, 3.0, 20.0, 60.0, 120.0, 121.5]),
    st.sampled_from([60.0, 300.0]),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.sampled_from([None, 0.99]),
    st.sampled_from([20.0, 60.0]),
    st.sampled_from(["kept", "left_out", "beyond_trend"]),
)
def test_kept_peaks_give_the_reserve_by_its_definition(
    events: list[Event],
    lead_s: float,
    window_s: float,
    q: float,
    pq: float | None,
    release_s: float,
    projected: str,
) -> None:
    cfg = PolicyConfig(
        burst_reserve="active",
        burst_reserve_projected=projected,  # type: ignore[arg-type]
        provision_lead_s=lead_s,
        burst_window_s=window_s,
        burst_quantile=q,
        burst_peak_quantile=pq,
        idle_release_s=release_s,
    )
    counts = PoolCounts({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, {}, {})
    kept = plain = recovered_state(counts, 1_000.0)
    t = 1_000.0
    for step, rps, what, factor in events:
        trend = None if math.isnan(factor) else factor
        t += step
        if what == "restart":  # a controller restarted on the pool: no history, no kept peaks
            kept = plain = recovered_state(counts, t)
        elif what == "forget":  # kept peaks lost (e.g. state rebuilt without them): recomputed, no harm
            kept = replace(kept, need_peaks=LeadPeaks())
        elif what == "lead":  # peaks kept for another lead are not taken for this one
            kept = replace(kept, need_peaks=LeadPeaks(lead_s + BLOCK, kept.need_peaks.rows))
        a = stages.burst_reserve_stage(1, 1, _load(t, rps), CAP, cfg, kept, trend)
        b = stages.burst_reserve_stage(
            1, 1, _load(t, rps), CAP, cfg, replace(plain, need_peaks=LeadPeaks()), trend
        )
        kept, plain = a[3], b[3]
        assert (a[0], a[1], a[2], a[4]) == (b[0], b[1], b[2], b[4])
        assert replace(kept, need_peaks=LeadPeaks()) == replace(plain, need_peaks=LeadPeaks())
        got = (*kept.reserve[0], *kept.reserve[1])
        # a block opened: recomputed (the reference knows no projected marks)
        if len(kept.need_blocks) >= 2 and kept.need_blocks[-1][3] == 1 and not kept.projected_blocks:
            with np.errstate(invalid="ignore"):
                want = _reference_reserve(kept.need_blocks, lead_s, q, cfg.headroom, pq)
            assert all(_same(x, y) for x, y in zip(got, want, strict=True)), (got, want)
        rows = _rows(kept.need_peaks)
        if rows and kept.need_peaks.lead_s == lead_s:  # (another lead's: injected, ignored until replaced)
            # the rows kept are the oldest blocks' starts and needs, and their peaks by the definition
            assert [r[:3] for r in rows] == [b[:3] for b in kept.need_blocks[: len(rows)]]
            with np.errstate(invalid="ignore"):
                ref = _reference_peaks(kept.need_blocks, lead_s)
            assert all(_same(r[i + 3], float(ref[i][k])) for k, r in enumerate(rows) for i in (0, 1)), rows


def test_peaks_are_kept_only_where_no_later_block_can_change_them() -> None:
    """Lead 10 s (two blocks ahead) over blocks at 0, 5, ..., 45 s: the last block is still open, so blocks
    up to 30 s (whose windows end before 45 s) are final; 35 and 40 s see the open block."""
    blocks = tuple((i * BLOCK, float(i), 1.0, 5) for i in range(10))
    _, final = stages.burst_reserve_kept(blocks, 10.0, 0.9)
    assert final.lead_s == 10.0
    assert [r[0] for r in _rows(final)] == [i * BLOCK for i in range(7)]
    assert [r[3] for r in _rows(final)] == [float(i + 2) for i in range(7)]  # the most of the next two


def test_a_gap_makes_the_blocks_before_it_final() -> None:
    """A block 200 s after the others is beyond every earlier block's lead: all of those are final."""
    blocks = (*((i * BLOCK, float(i), 1.0, 5) for i in range(4)), (215.0, 9.0, 1.0, 1))
    _, final = stages.burst_reserve_kept(blocks, 20.0, 0.9)
    assert [r[0] for r in _rows(final)] == [0.0, 5.0, 10.0, 15.0]


def test_blocks_out_of_order_keep_nothing() -> None:
    blocks = ((10.0, 1.0, 1.0, 5), (5.0, 2.0, 1.0, 5), (15.0, 3.0, 1.0, 5), (20.0, 3.0, 1.0, 5))
    assert stages.burst_reserve_kept(blocks, 5.0, 0.9)[1] == LeadPeaks()


def test_moved_history_drops_the_kept_peaks() -> None:
    """On a regular grid moved by whole blocks, old starts line up with new ones: the peaks of other blocks
    would be taken, so ``resume_history`` drops them."""
    blocks = tuple((i * BLOCK, float(i % 3), 1.0, 5) for i in range(20))
    _, final = stages.burst_reserve_kept(blocks, 10.0, 0.9)
    state = PoolState(need_blocks=blocks, need_peaks=final, idle_since_s=100.0)
    moved = stages.resume_history(state, 4003.0)
    assert moved.need_blocks[0][0] > 0.0
    assert moved.need_peaks == LeadPeaks()
