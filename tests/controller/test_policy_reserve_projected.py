"""The burst reserve leaves out the rises the trend stage projected (``PolicyConfig.burst_reserve_projected``,
``stages.burst_reserve_kept``'s ``projected``, ``stages.mark_projected``)."""

from __future__ import annotations

import math

import pytest
from policy_fixtures import CAP, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolState, stages

# 5-s blocks (start, prefill need, decode need, ticks): a flat load of 2 with one rise to 10 over 15 s
FLAT = 2.0
RISE_AT = 50.0


def _blocks() -> tuple[tuple[float, float, float, int], ...]:
    rows = []
    for k in range(40):
        t = 5.0 * k
        high = RISE_AT < t <= RISE_AT + 15.0
        need = 10.0 if high else FLAT
        rows.append((t, need, need, 5))
    return tuple(rows)


def test_projected_rise_left_out_unprojected_kept() -> None:
    blocks = _blocks()
    # q = 1.0: the largest rise, which only the blocks before the rise have (their lead window holds it)
    (rise_plain, peak_plain), _ = stages.burst_reserve_kept(blocks, 20.0, 1.0)
    assert rise_plain[0] == pytest.approx(8.0) and rise_plain[1] == pytest.approx(8.0)
    # every block that saw it coming
    before = tuple((b[0], math.inf) for b in blocks if RISE_AT - 20.0 <= b[0] <= RISE_AT)
    (rise_proj, peak_proj), _ = stages.burst_reserve_kept(blocks, 20.0, 1.0, projected=before)
    assert rise_proj == (0.0, 0.0)
    assert peak_proj == peak_plain  # the peaks are kept: only the rises are left out
    # the same burst, marked elsewhere (blocks far from it): kept as it is
    (rise_other, _), _ = stages.burst_reserve_kept(
        blocks, 20.0, 1.0, projected=((150.0, math.inf), (155.0, math.inf))
    )
    assert rise_other == rise_plain


def test_projected_with_kept_lead_peaks_agrees() -> None:
    blocks = _blocks()
    before = tuple((b[0], math.inf) for b in blocks if RISE_AT - 20.0 <= b[0] <= RISE_AT)
    _, final = stages.burst_reserve_kept(blocks[:-3], 20.0, 0.9)
    fresh, _ = stages.burst_reserve_kept(blocks, 20.0, 1.0, projected=before)
    cached, _ = stages.burst_reserve_kept(blocks, 20.0, 1.0, final=final, projected=before)
    assert cached == fresh


def test_beyond_trend_counts_what_the_projection_missed() -> None:
    blocks = _blocks()
    # the blocks before the rise projected × 3 (need 2 → 6 with no headroom): 10 − 6 = 4 of the 8 is left
    before = tuple((b[0], 3.0) for b in blocks if RISE_AT - 20.0 <= b[0] <= RISE_AT)
    (rise, _), _ = stages.burst_reserve_kept(blocks, 20.0, 1.0, projected=before)
    assert rise[0] == pytest.approx(4.0) and rise[1] == pytest.approx(4.0)
    # a projection as large as the rise leaves nothing
    covered = tuple((t, 5.0) for t, _ in before)
    assert stages.burst_reserve_kept(blocks, 20.0, 1.0, projected=covered)[0][0] == (0.0, 0.0)


def test_mark_projected_every_tick_of_a_block() -> None:
    blocks = ((0.0, 1.0, 1.0, 1),)
    marks = stages.mark_projected((), blocks, opened=True, factor=2.0)
    assert marks == ((0.0, 2.0),)
    # the block keeps its smallest factor, and a tick without a ramp unmarks it
    assert stages.mark_projected(marks, ((0.0, 1.0, 1.0, 2),), opened=False, factor=1.5) == ((0.0, 1.5),)
    assert stages.mark_projected(marks, ((0.0, 1.0, 1.0, 2),), opened=False, factor=None) == ()
    # a new block forgets marks older than the oldest block kept
    later = ((5.0, 1.0, 1.0, 5), (10.0, 1.0, 1.0, 1))
    old = ((0.0, 2.0), (5.0, 2.0))
    assert stages.mark_projected(old, later, opened=True, factor=None) == ((5.0, 2.0),)


def test_default_beyond_trend_and_validation_names_the_field() -> None:
    assert PolicyConfig().burst_reserve_projected == "beyond_trend"
    with pytest.raises(ValidationError, match="burst_reserve_projected"):
        PolicyConfig(burst_reserve_projected="dropped")


def _run(cfg: PolicyConfig, trend_from: float, trend_to: float) -> PoolState:
    """Ticks each second: 2 req/s, a 15-s burst of 10 from t=200, 2 again; the trend projects x 2 in between."""
    state = PoolState()
    for t in range(0, 300):
        rps = 10.0 if 200 <= t < 215 else 2.0
        o = obs(now_s=float(t), arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0,
                running_seqs=rps * 2.0, standby={"prefill": 0, "decode": 0})  # fmt: skip
        trend = 2.0 if trend_from <= t < trend_to else None
        state = stages.burst_reserve_stage(1, 1, o, CAP, cfg, state, trend=trend)[3]
    return state


def test_stage_marks_the_projected_blocks_and_their_rise_goes() -> None:
    kept = _run(PolicyConfig(burst_reserve_projected="kept"), 80.0, 215.0)
    assert kept.projected_blocks == ()  # 'kept' writes nothing
    left = _run(PolicyConfig(burst_reserve_projected="left_out"), 80.0, 215.0)
    assert left.projected_blocks and all(f == math.inf for _, f in left.projected_blocks)
    assert kept.reserve[0][0] > 0.0 and left.reserve[0][0] < kept.reserve[0][0]
    # the same burst with no trend: the reserve is the default's
    assert _run(PolicyConfig(burst_reserve_projected="left_out"), 0.0, 0.0).reserve == kept.reserve
