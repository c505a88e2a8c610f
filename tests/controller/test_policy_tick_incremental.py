"""The tick's incremental paths give what the plain definitions give, bit for bit (a decision must not move
when a stage gets faster): histories that carry their time order (``stages.TimeRows``) against the same rows
as plain tuples, checked row by row; the trend's arrays packed from the last tick's (``packed_rates``)
against ``np.fromiter`` of the whole history; the trend's screened lines against every line fitted to the
end; the block median by Python's sort against ``np.median``. Floats compared with ``==`` (NaN for NaN) or
by their bytes: no tolerance."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import PolicyConfig
from controller.policy import reserve_fast, stages
from controller.policy.types import BlockMedian, PackedRates, RoleHistory

RATES = st.one_of(
    st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -1.0, -0.0, 0.0]),
)
# steps between ticks: mostly forward, sometimes none, back, or to a non-finite time
STEPS = st.one_of(
    st.floats(min_value=0.1, max_value=3.0),
    st.sampled_from([1.0, 1.0, 1.0, 0.0, -2.0, math.nan, math.inf]),
)

# hysteresis_stage takes a finite now (a NaN one fails its cold-start wait on main too)
FINITE_STEPS = st.one_of(st.floats(min_value=0.1, max_value=3.0), st.sampled_from([1.0, 1.0, 0.0, -2.0]))


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _in_time_order(rows: tuple[tuple[float, ...], ...]) -> bool:
    times = [r[0] for r in rows]
    return all(math.isfinite(t) for t in times) and times == sorted(times)


@settings(max_examples=200, deadline=None)
@given(
    ticks=st.lists(st.tuples(STEPS, RATES), min_size=1, max_size=160),
    window_s=st.sampled_from([5.0, 30.0, stages.RATE_HISTORY_S]),
)
def test_a_kept_history_equals_the_plain_one_and_its_cache_the_whole_pack(
    ticks: list[tuple[float, float]], window_s: float
) -> None:
    """update_rate_history tick by tick: the history that carries its order (TimeRows from the first
    tick) and the one rebuilt as a plain tuple every tick (checked row by row every time) stay equal; a
    TimeRows is only ever in time order; the QPS alert reads the same from both; the packed arrays, each
    from the last tick's, are bytes-equal to _rate_arrays of the whole history."""
    fast: tuple[tuple[float, float], ...] = ()
    plain: tuple[tuple[float, float], ...] = ()
    packed = PackedRates()
    now = 1.7e9
    for step, rate in ticks:
        now = now + step if math.isfinite(now) else 1.7e9
        fast = stages.update_rate_history(fast, now, rate, window_s)
        plain = tuple(stages.update_rate_history(tuple(plain), now, rate, window_s))
        assert fast == plain
        if type(fast) is stages.TimeRows:
            assert _in_time_order(fast)
        assert _same(stages.qps_change_per_min(fast), stages.qps_change_per_min(tuple(fast)))
        packed = stages.packed_rates(fast, packed)
        times, rates = stages.known_rates(packed)
        ref_times, ref_rates = stages._rate_arrays(fast)
        assert times.tobytes() == ref_times.tobytes() and rates.tobytes() == ref_rates.tobytes()


def test_a_history_rebuilt_with_equal_rows_is_packed_anew() -> None:
    """The cache is matched by identity: equal rows rebuilt (or -0.0 where 0.0 was) are not read from it."""
    history = stages.update_rate_history((), 100.0, 0.0)
    packed = stages.packed_rates(history, PackedRates())
    rebuilt = ((100.0, -0.0),)
    again = stages.packed_rates(rebuilt, packed)
    assert np.signbit(stages.known_rates(again)[1][0])
    assert not np.signbit(stages.known_rates(packed)[1][0])


def test_append_row_keeps_the_order_only_when_it_holds() -> None:
    rows = stages.append_row((), (1.0, 5))
    assert type(rows) is stages.TimeRows
    assert type(stages.append_row(rows, (2.0, 5))) is stages.TimeRows
    assert type(stages.append_row(rows, (0.5, 5))) is tuple  # back in time
    assert type(stages.append_row(rows, (math.nan, 5))) is tuple
    assert type(stages.append_row(((2.0, 1), (1.0, 1)), (3.0, 5))) is tuple  # never checked: stays plain
    assert stages.append_row(rows, (0.5, 5)) == ((1.0, 5), (0.5, 5))
    assert repr(rows) == repr(((1.0, 5),)) and hash(rows) == hash(((1.0, 5),))


@settings(max_examples=150, deadline=None)
@given(
    ticks=st.lists(st.tuples(FINITE_STEPS, st.integers(min_value=0, max_value=12)), min_size=1, max_size=120),
    current=st.integers(min_value=0, max_value=12),
    cold=st.sampled_from([0.0, 30.0]),
)
def test_hysteresis_on_a_kept_history_equals_the_plain_one(
    ticks: list[tuple[float, int]], current: int, cold: float
) -> None:
    """hysteresis_stage tick by tick on its own history (TimeRows from the first tick) and on the same
    rows as a plain tuple: the same target, history and reason every tick."""
    cfg = PolicyConfig(scale_down_delay_s=20.0, burst_hold_max_s=40.0)
    fast, plain = RoleHistory(), RoleHistory()
    now = 1000.0
    for step, wanted in ticks:
        now += step
        a = stages.hysteresis_stage("decode", wanted, current, now, cfg, fast, True, 1, cold_persist_s=cold)
        plain_in = RoleHistory(plain.last_scale_up_s, plain.last_change_s, tuple(plain.recent_targets))
        b = stages.hysteresis_stage(
            "decode", wanted, current, now, cfg, plain_in, True, 1, cold_persist_s=cold
        )
        assert a == b
        fast, plain = a[1], b[1]
        current = a[0]


def _ramp(
    n: int, slope: float, level: float, noise: list[float], gap_at: int
) -> tuple[np.ndarray, np.ndarray]:
    times = np.arange(n, dtype=np.float64)
    times[gap_at:] += 7.0  # a gap: the windows' spans differ
    rates = np.maximum(level + slope * times + np.resize(np.asarray(noise or [0.0]), n), 0.0)
    return times + 1.7e9, rates


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=140),
    slope=st.one_of(st.floats(min_value=-0.5, max_value=0.5), st.sampled_from([0.0, 0.02, 0.05, 0.1])),
    level=st.sampled_from([0.0, 0.5, 3.0, 20.0, 300.0]),
    noise=st.lists(st.floats(min_value=-5.0, max_value=5.0), max_size=17),
    gap_at=st.integers(min_value=0, max_value=140),
    lead_s=st.sampled_from([0.0, 30.0, 120.0]),
)
def test_screened_lines_give_the_trend_of_every_line(
    n: int, slope: float, level: float, noise: list[float], gap_at: int, lead_s: float
) -> None:
    """trend_from_rates with the screen (a line sure to fail z dropped before its residuals) equals it
    without, factor and reason, on ramps, flats and falls with noise and gaps; and with ordered=True (the
    times are in order) it equals the checked path."""
    times, rates = _ramp(n, slope, level, noise, gap_at)
    now = float(times[-1]) if n else 1.7e9
    full = stages.trend_from_rates(times, rates, now, lead_s, screen=False)
    assert stages.trend_from_rates(times, rates, now, lead_s) == full
    assert stages.trend_from_rates(times, rates, now, lead_s, ordered=True) == full


def test_the_screen_keeps_a_clear_ramp() -> None:
    """A steady ramp passes the screen (the test above must see projected ramps, not only flats)."""
    times, rates = _ramp(130, 0.1, 5.0, [0.3, -0.2, 0.1], 130)
    factor, reason = stages.trend_from_rates(times, rates, float(times[-1]), 120.0)
    assert factor > 1.0 and reason is not None


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(min_value=0.0, max_value=1e6),
            st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf, math.nan]),
        ),
        max_size=60,
    ),
    headroom=st.sampled_from([0.0, 0.3]),
    need=st.floats(min_value=0.0, max_value=1e6),
)
def test_the_block_median_is_numpys(values: list[float], headroom: float, need: float) -> None:
    """_median by Python's sort against np.median: the same float (NaN for NaN; -0.0 and 0.0 may differ
    in sign only) and the same high-block judgement."""
    ours = stages._median(values)
    ref = float(np.median(np.asarray(values, dtype=np.float64))) if values else math.nan
    assert _same(ours, ref)
    if not math.isnan(ref):
        assert stages._is_high(need, ours, headroom) == stages._is_high(need, ref, headroom)


@settings(max_examples=300, deadline=None)
@given(
    s=st.lists(st.floats(min_value=-1e3, max_value=1e3), max_size=40),
    t=st.lists(st.floats(min_value=-1e3, max_value=1e3), max_size=40),
    q=st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.95, 1.0]),
)
def test_the_merged_quantile_takes_its_upper_rank_from_the_lower_split(
    s: list[float], t: list[float], q: float
) -> None:
    """reserve_fast's quantile of two sorted lists (one bisection, the upper order statistic the smaller of
    the next two values) against numpy's 'linear' quantile of them merged."""
    if not s and not t:
        return
    s, t = sorted(s), sorted(t)
    ours = reserve_fast._quantile(s, t, q)
    assert ours == float(np.quantile(np.asarray([*s, *t], dtype=np.float64), q))


@settings(max_examples=150, deadline=None)
@given(
    needs=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=50.0), st.floats(min_value=0.0, max_value=50.0)),
        min_size=1,
        max_size=80,
    ),
    gap_every=st.integers(min_value=0, max_value=9),
)
def test_the_kept_block_median_is_the_median_of_the_completed_blocks(
    needs: list[tuple[float, float]], gap_every: int
) -> None:
    """burst_reserve_stage's kept median, read by short_burst every tick: always the median of the
    completed blocks it holds, and short_burst with it judges as short_burst without it; a cache of other
    rows equal in value is recomputed, not read."""
    cfg = PolicyConfig()
    blocks: tuple[tuple[float, float, float, int], ...] = ()
    cache = BlockMedian()
    now = 1000.0
    for k, need in enumerate(needs):
        now += 1.0 if not (gap_every and k % gap_every == 0) else 12.0
        blocks, opened = stages.update_need_blocks(blocks, now, need, 600.0)
        if opened and len(blocks) >= 2:
            median, cache = stages.block_median(blocks[:-1], cache)
            assert median == stages._median(stages.block_totals(blocks[:-1]))
        first = blocks[0][0]  # runs after the history's start (one at it is not counted)
        runs = (
            (first + 1.0, first + 6.0),
            (first + 11.0, first + 16.0),
            (blocks[-1][0], blocks[-1][0] + 5.0),
        )
        assert stages.short_burst(runs, blocks, now, cfg, cache) == stages.short_burst(runs, blocks, now, cfg)
    if len(blocks) >= 2:
        copies = tuple((b[0], b[1], b[2], b[3]) for b in blocks[:-1])  # equal rows, other objects
        assert stages.block_median(copies, cache)[1] is not cache


@settings(max_examples=200, deadline=None)
@given(
    needs=st.lists(
        st.tuples(
            st.one_of(
                st.floats(min_value=0.0, max_value=50.0), st.sampled_from([0.0, -0.0, math.inf, math.nan])
            ),
            st.floats(min_value=0.0, max_value=50.0),
        ),
        min_size=1,
        max_size=120,
    ),
    steps=st.lists(st.sampled_from([1.0, 1.0, 1.0, 3.0, 12.0, 31.0]), min_size=120, max_size=120),
    keep_s=st.sampled_from([20.0, 60.0, 600.0]),
)
def test_the_moved_block_median_is_the_sorted_one(
    needs: list[tuple[float, float]], steps: list[float], keep_s: float
) -> None:
    """block_median moved on block by block (oldest blocks dropped by ``keep_s``, gaps, totals NaN, inf and
    -0.0) against the median of the completed blocks sorted anew: the same float (NaN for NaN), and the
    sorted totals it keeps are those blocks' totals sorted, whenever it keeps them."""
    blocks: tuple[tuple[float, float, float, int], ...] = ()
    cache = BlockMedian()
    now = 1000.0
    for need, step in zip(needs, steps, strict=False):
        now += step
        blocks, opened = stages.update_need_blocks(blocks, now, need, keep_s)
        if opened and len(blocks) >= 2:
            median, cache = stages.block_median(blocks[:-1], cache)
            totals = stages.block_totals(blocks[:-1])
            assert _same(median, stages._median(totals))
            if cache.totals:
                assert cache.totals == np.asarray(sorted(totals), dtype=np.float64).tobytes()
            elif all(math.isfinite(x) and not (x == 0 and math.copysign(1, x) < 0) for x in totals):
                raise AssertionError("plain totals not kept")


@settings(max_examples=300, deadline=None)
@given(
    needs=st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0, 2.0, 9.0, 30.0, -0.0, math.inf, math.nan]),
            st.sampled_from([0.0, 1.0, 4.0]),
            st.sampled_from([5.0, 5.0, 5.0, 10.0, 5.0000001]),
        ),
        max_size=30,
    ),
    median=st.sampled_from([0.0, 1.0, 3.0, math.nan]),
    headroom=st.sampled_from([0.0, 0.3]),
)
def test_the_leading_run_reads_each_total_as_block_totals_does(
    needs: list[tuple[float, float, float]], median: float, headroom: float
) -> None:
    """leading_run reading each block's total as it goes against the run found with every total computed
    first (block_totals, as it was before session 10), over gaps, ties, NaN, inf and -0.0."""
    blocks, start = [], 1000.0
    for p, d, step in needs:
        blocks.append((start, p, d, 5))
        start += step
    rows = tuple(blocks)
    totals = stages.block_totals(rows)
    k = 0
    while (
        k < len(rows) - 1
        and abs(rows[k][0] - (rows[0][0] + k * stages.NEED_BLOCK_S)) < 1e-6
        and stages._is_high(totals[k], median, headroom)
    ):
        k += 1
    expected = ((rows[0][0], rows[k - 1][0] + stages.NEED_BLOCK_S),) if k > 0 else ()
    assert stages.leading_run(rows, median, headroom) == expected
