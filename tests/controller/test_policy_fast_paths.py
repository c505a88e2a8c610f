"""The per-tick fast paths of the burst reserve and the ramp detector give bit-identical results to their
plain definitions (a decision must not move when a stage gets faster): the reserve's lead-window peaks
(sparse table, checked against the subtraction) against a loop over every block pair, its quantiles against
``np.quantile``, and the trend's sliced windows and deferred step test against ``ramp_fit`` window by window.
Compared with ``==`` on floats, NaN for NaN: no tolerance."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import PolicyConfig
from controller.policy import stages
from controller.policy.types import (
    ArrivalCalibration,
    PoolObservation,
    PoolState,
    RoleHistory,
    ScalingPlan,
    evolve,
)

FLOATS = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
ODD = st.sampled_from([math.nan, math.inf, -math.inf, -1.0])


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _reference_peaks(blocks: tuple[tuple[float, float, float, int], ...], lead_s: float) -> list[np.ndarray]:
    """Per role, per block: the most of the role's need over the next ceil(lead / block) blocks starting
    within the lead (-inf where there is none)."""
    n, m = len(blocks), max(math.ceil(lead_s / stages.NEED_BLOCK_S), 1)
    peaks_by_role = []
    for col in (1, 2):
        peaks = []
        for k in range(n):
            ahead = [blocks[j][col] for j in range(k + 1, min(k + m, n - 1) + 1)
                     if blocks[j][0] - blocks[k][0] <= lead_s + 1e-9]  # fmt: skip
            peaks.append(float(np.max(ahead)) if ahead else -math.inf)
        peaks_by_role.append(np.array(peaks))
    return peaks_by_role


def _reference_reserve(
    blocks: tuple[tuple[float, float, float, int], ...], lead_s: float, q: float, h: float, pq: float | None
) -> tuple[float, ...]:
    """``burst_reserve`` by its definition: per block, the lead peaks (``_reference_peaks``); rises beyond
    headroom; numpy's quantiles."""
    if len(blocks) < 2 or lead_s <= 0:
        return (math.nan,) * 4
    out: list[float] = []
    for col, peak in zip((1, 2), _reference_peaks(blocks, lead_s), strict=True):
        ok = np.isfinite(peak)
        if not ok.any():
            return (math.nan,) * 4
        v = np.array([b[col] for b in blocks])
        out.append(float(np.quantile(np.maximum(peak[ok] - (1 + h) * v[ok], 0.0), q)))
        out.append(float(np.quantile(peak[ok], q if pq is None else pq)))
    return out[0], out[2], out[1], out[3]


@st.composite
def block_tuples(draw: st.DrawFn) -> tuple[tuple[float, float, float, int], ...]:
    n = draw(st.integers(0, 40))
    gaps = draw(st.lists(st.sampled_from([5.0, 5.0, 5.0, 10.0, 35.0, 200.0]), min_size=n, max_size=n))
    origin = draw(st.sampled_from([0.0, 1.7e9, 12_347.5]))
    starts = origin + np.cumsum(gaps) if n else np.array([])
    if draw(st.booleans()) and n > 2 and draw(st.integers(0, 9)) == 0:
        starts = starts[::-1]  # out of order: the window path
    needs = draw(st.lists(st.tuples(FLOATS, FLOATS), min_size=n, max_size=n))
    rows = [(float(t), p, d, 5) for t, (p, d) in zip(starts, needs, strict=True)]
    if rows and draw(st.integers(0, 9)) == 0:
        k = draw(st.integers(0, len(rows) - 1))
        rows[k] = (rows[k][0], draw(ODD), rows[k][2], 5)
    return tuple(rows)


@settings(max_examples=100, deadline=None)
@given(
    block_tuples(),
    st.sampled_from([0.0, 3.0, 20.0, 120.0, 121.5]),
    st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0]),
    st.sampled_from([0.0, 0.2]),
    st.sampled_from([None, 0.9, 0.99]),
)
def test_burst_reserve_is_its_definition_bit_for_bit(
    blocks: tuple[tuple[float, float, float, int], ...], lead_s: float, q: float, h: float, pq: float | None
) -> None:
    with np.errstate(invalid="ignore"):
        (rp, rd), (pp, pd) = stages.burst_reserve(blocks, lead_s, q, h, pq)
        want = _reference_reserve(blocks, lead_s, q, h, pq)
    assert all(_same(a, b) for a, b in zip((rp, rd, pp, pd), want, strict=True)), (want, (rp, rd, pp, pd))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(FLOATS, st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=30),
        min_size=1,
        max_size=4,
    ).filter(lambda rows: len({len(r) for r in rows}) == 1),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_quantiles_are_numpys(rows: list[list[float]], q: float) -> None:
    arr = np.array(rows, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        want = np.quantile(arr, q, axis=1).tolist()
        got = stages._quantiles(arr, q)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True)), (got, want)


def _reference_trend(history: tuple[tuple[float, float], ...], now_s: float, lead_s: float) -> float:
    """``trend_factor``'s factor from ``ramp_fit`` (every window fitted in full, the step test included)."""

    def at(t: float, min_z: float) -> float:
        for w in stages.TREND_WINDOWS_S:
            fit = stages.ramp_fit(history, t, w)
            if fit is None or fit.step_fits_better or fit.z < min_z or fit.level <= 0:
                continue
            factor = min((fit.level + fit.slope * lead_s) / fit.level, stages.MAX_TREND_FACTOR)
            if factor > 1.0:
                return factor
        return 1.0

    if lead_s <= 0:
        return 1.0
    factor = at(now_s, stages.TREND_MIN_Z)
    if factor <= 1.0:
        return 1.0
    for lag in stages.TREND_CONFIRM_S:
        earlier = at(now_s - lag, stages.TREND_CONFIRM_Z)
        if earlier <= 1.0:
            return 1.0
        factor = min(factor, earlier)
    return factor


@st.composite
def rate_histories(draw: st.DrawFn) -> tuple[tuple[tuple[float, float], ...], float]:
    n = draw(st.integers(0, 140))
    origin = draw(st.sampled_from([0.0, 1.7e9, 12_345.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = origin + np.cumsum(rng.choice([1.0, 1.0, 1.0, 2.0, 0.5], size=n))
    base, kind = rng.uniform(0, 30), draw(st.sampled_from(["ramp", "step", "flat", "wave"]))
    el = t - origin
    lam = {
        "ramp": base + rng.uniform(0, 0.5) * el,
        "step": base + 20.0 * (el > rng.uniform(0, n + 1)),
        "flat": np.full(n, base),
        "wave": base * (1 + np.sin(el / 40.0)),
    }[kind]
    r = rng.poisson(np.maximum(lam, 0.0)).astype(np.float64)
    if draw(st.booleans()):
        r = r + rng.normal(0.0, 0.3, n)
    if n and draw(st.integers(0, 9)) == 0:
        r[rng.integers(n)] = draw(ODD)
    if n > 2 and draw(st.integers(0, 9)) == 0:
        t = rng.permutation(t)
    now = (float(t.max()) if n else 0.0) - draw(st.sampled_from([0.0, 0.0, 3.0, 12.0]))
    return tuple(zip(t.tolist(), r.tolist(), strict=True)), now


@settings(max_examples=100, deadline=None)
@given(rate_histories(), st.sampled_from([0.0, 60.0, 120.0]))
def test_trend_factor_is_ramp_fit_window_by_window(
    case: tuple[tuple[tuple[float, float], ...], float], lead_s: float
) -> None:
    history, now_s = case
    factor, reason = stages.trend_factor(history, now_s, lead_s)
    assert factor == _reference_trend(history, now_s, lead_s)
    assert (reason is None) == (factor == 1.0)


def test_the_sliced_window_is_the_masked_one() -> None:
    """On ordered times the window is a slice found by bisection: the same line, to the bit, as the mask."""
    rng = np.random.default_rng(3)
    t = 1.7e9 + np.cumsum(rng.choice([1.0, 2.0], size=130))
    r = rng.poisson(5.0 + 0.2 * (t - t[0])).astype(np.float64)
    for w in stages.TREND_WINDOWS_S:
        for now in (float(t[-1]), float(t[-1]) - 7.0):
            sliced, masked = stages._line(t, r, now, w, True), stages._line(t, r, now, w, False)
            assert sliced is not None and masked is not None
            assert (sliced.slope, sliced.se, sliced.level, sliced.rss, sliced.var) == (
                masked.slope, masked.se, masked.level, masked.rss, masked.var,
            )  # fmt: skip


TIMES = st.one_of(
    st.floats(min_value=-1e3, max_value=1e10, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 1.7e9]),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(TIMES, st.integers(0, 9)), max_size=30),
    st.booleans(),
    st.one_of(TIMES, st.just(1.7e9 + 5.0)),
    st.sampled_from([0.0, 1.0, 5.0, 60.0, 300.0, math.inf]),
    st.booleans(),
)
def test_recent_rows_is_the_filter(
    rows: list[tuple[float, int]], in_order: bool, now_s: float, window_s: float, closed: bool
) -> None:
    """In time order (how the stages append) and out of it, NaN and inf times included."""
    if in_order and not any(math.isnan(t) for t, _ in rows):
        rows = sorted(rows)
    kept = stages.recent_rows(tuple(rows), now_s, window_s, closed)
    want = tuple(r for r in rows if (now_s - r[0] <= window_s if closed else now_s - r[0] < window_s))
    assert kept == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(FLOATS, st.integers(0, 50), ODD), min_size=1, max_size=30))
def test_median_is_numpys(values: list[float]) -> None:
    with np.errstate(invalid="ignore"):
        arr = np.asarray(values, dtype=np.float64)
        assert _same(stages._median(arr), float(np.median(arr)))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 400.0), st.integers(0, 20)), max_size=40),
    st.booleans(),
    st.sampled_from([30.0, 60.0]),
    st.sampled_from([0.5, 0.9, 1.0]),
)
def test_window_hold_is_its_definition(
    rows: list[tuple[float, int]], in_order: bool, delay_s: float, q: float
) -> None:
    recent = tuple(sorted(rows) if in_order else rows)
    now_s = 400.0
    inner = sorted(w for t, w in recent if now_s - t < delay_s)
    outer = [w for t, w in recent if now_s - t >= delay_s]
    held = inner[max(math.ceil(q * len(inner) - 1e-9) - 1, 0)] if inner else 0
    assert stages.window_hold(recent, now_s, delay_s, q) == max([held, *outer])
    if in_order:  # what hysteresis_stage passes for a history it has checked: no second check, same hold
        assert stages.window_hold(recent, now_s, delay_s, q, in_order=True) == max([held, *outer])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(TIMES, st.integers(0, 9)), max_size=30),
    st.booleans(),
    st.one_of(TIMES, st.just(1.7e9 + 5.0)),
    st.integers(0, 9),
    st.integers(0, 9),
    st.sampled_from([0.0, 5.0, 60.0, 300.0]),
)
def test_hysteresis_keeps_the_filtered_targets(
    rows: list[tuple[float, int]], in_order: bool, now_s: float, wanted: int, current: int, hold_s: float
) -> None:
    """The targets the stage remembers are its keep window filtered one by one, in and out of time order,
    NaN and inf times included (the order is checked once and the windows bisected)."""
    if in_order and not any(math.isnan(t) for t, _ in rows):
        rows = sorted(rows)
    cfg = PolicyConfig(scale_down_delay_s=60.0, burst_hold_max_s=300.0)
    history = RoleHistory(recent_targets=tuple(rows))
    _, new, _ = stages.hysteresis_stage(
        "decode", wanted, current, now_s, cfg, history, can_scale_down=True, fast_up=0, hold_s=hold_s
    )
    keep_s = max(cfg.scale_down_delay_s, cfg.burst_hold_max_s if cfg.burst_hold != "off" else 0.0)
    assert new.recent_targets == (*(r for r in rows if now_s - r[0] < keep_s), (now_s, wanted))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(TIMES, st.one_of(FLOATS, ODD)), max_size=30),
    st.booleans(),
    st.one_of(TIMES, st.just(1.7e9 + 5.0)),
    st.one_of(FLOATS, ODD),
)
def test_the_rate_history_update_is_idempotent(
    rows: list[tuple[float, float]], in_order: bool, now_s: float, rps: float
) -> None:
    """What lets ``decide`` pass ``rate_history_updated`` to ``standby_stage``: a second update with the same
    observation changes nothing, in and out of time order, NaN and inf included."""
    if in_order and not any(math.isnan(t) for t, _ in rows):
        rows = sorted(rows, key=lambda r: r[0])
    once = stages.update_rate_history(tuple(rows), now_s, rps)
    twice = stages.update_rate_history(once, now_s, rps)
    assert len(twice) == len(once)
    pairs = (xy for a, b in zip(once, twice, strict=True) for xy in zip(a, b, strict=True))
    assert all(_same(x, y) for x, y in pairs)


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(FLOATS, ODD),
    st.lists(st.tuples(TIMES, FLOATS), max_size=5),
    st.sampled_from(["smoothed", "state", "calibration", "plan"]),
)
def test_evolve_is_dataclasses_replace(rate: float, rows: list[tuple[float, float]], which: str) -> None:
    """The policy's fast replace gives the value ``dataclasses.replace`` gives (equal, same repr, fields in
    the same order), leaves its input as it was, and refuses a field the class does not have."""
    obs = PoolObservation(
        pool="p", now_s=1.0, replicas={"prefill": 1}, active={}, standby={}, provisioning={},
        arrival_rps=2.0, prompt_tps=3.0, gen_tps=4.0, running_seqs=5.0, waiting_requests=0.0,
        oldest_wait_s=math.nan, kv_usage=0.1, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
    )  # fmt: skip
    state = PoolState(rate_history=((0.0, 1.0),))
    cal = ArrivalCalibration(counted=3.0, pending=((1.0, 2.0, 3.0, 4.0),))
    plan = ScalingPlan("p", 1, 2, 0, 1, reasons=("why",))
    before = repr(obs), repr(state), repr(cal), repr(plan)
    fast: PoolObservation | PoolState | ArrivalCalibration | ScalingPlan
    slow: PoolObservation | PoolState | ArrivalCalibration | ScalingPlan
    if which == "smoothed":
        c: dict[str, object] = {"arrival_rps": rate, "forecast": None, "complete": False}
        fast, slow = evolve(obs, **c), dataclasses.replace(obs, **c)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            evolve(obs, no_such_field=1)
    elif which == "calibration":
        c = {"log_scale": (rate, 0.0), "last_s": rate, "pending": ()}
        fast, slow = evolve(cal, **c), dataclasses.replace(cal, **c)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            evolve(cal, no_such_field=1)
    elif which == "plan":  # the pipeline's notes before the policy's reasons
        c = {"reasons": (f"note {rate}", *plan.reasons)}
        fast, slow = evolve(plan, **c), dataclasses.replace(plan, **c)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            evolve(plan, no_such_field=1)
    else:
        c = {"rate_history": tuple(rows), "alert_until_s": rate}
        fast, slow = evolve(state, **c), dataclasses.replace(state, **c)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            evolve(state, no_such_field=1)
    assert type(fast) is type(slow)
    assert fast == slow  # the same field objects: NaN included
    assert list(vars(fast)) == list(vars(slow))
    assert repr(fast) == repr(slow)
    assert (repr(obs), repr(state), repr(cal), repr(plan)) == before
