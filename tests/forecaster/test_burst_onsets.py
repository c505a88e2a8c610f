"""The burst-onset definition (forecaster/burst.py): properties, hand-checked cases, alarm scoring."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.burst import (
    alarm_times,
    burst_onsets,
    burst_threshold,
    choose_alarm_threshold,
    score_bursts,
    trailing_mean_sigma,
)

counts = st.lists(st.integers(0, 60), min_size=0, max_size=600).map(lambda v: np.array(v, dtype=float))


@settings(max_examples=60, deadline=None)
@given(counts)
def test_onsets_never_exceed_one_per_quiet_period(x: np.ndarray) -> None:
    onsets = burst_onsets(x)
    assert len(onsets) <= len(x) / 30
    assert np.all(np.diff(onsets) >= 31)
    assert np.all(onsets >= 59)  # 60 s of history first


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 50), st.integers(60, 400))
def test_a_flat_series_has_no_onset(level: int, n: int) -> None:
    assert len(burst_onsets(np.full(n, float(level)))) == 0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(64, 300), st.integers(10, 100))
def test_a_tenfold_step_after_a_flat_minute_has_one_onset_where_it_enters_the_horizon(
    level: int, step_at: int, after: int
) -> None:
    x = np.concatenate([np.full(step_at, float(level)), np.full(after, 10.0 * level)])
    assert burst_onsets(x, horizon_s=5).tolist() == [step_at - 5]


def test_a_step_right_after_the_first_minute_is_caught_at_the_first_second_with_history() -> None:
    x = np.concatenate([np.full(60, 2.0), np.full(40, 20.0)])
    assert burst_onsets(x).tolist() == [59]


@settings(max_examples=60, deadline=None)
@given(counts, st.sampled_from([2.0, 3.0, 0.5, 7.25, 1000.0]))
def test_scaling_the_series_changes_nothing(x: np.ndarray, c: float) -> None:
    assert burst_onsets(x).tolist() == burst_onsets(x * c).tolist()


def test_trailing_window_includes_the_current_second_and_needs_full_history() -> None:
    x = np.arange(100, dtype=float)
    mean, sigma = trailing_mean_sigma(x, 60)
    assert np.isnan(mean[58]) and np.isnan(sigma[58])
    assert mean[59] == pytest.approx(np.mean(x[0:60]))
    assert mean[99] == pytest.approx(np.mean(x[40:100]))
    assert sigma[99] == pytest.approx(np.std(x[40:100]))  # population sigma


def test_threshold_is_the_larger_of_twice_the_mean_and_three_sigma_above_it() -> None:
    rng = np.random.default_rng(3)
    x = rng.poisson(4.0, 300).astype(float)
    thr = burst_threshold(x)
    w = x[200:260]
    assert thr[259] == pytest.approx(max(2 * w.mean(), w.mean() + 3 * w.std()))


def test_first_arrivals_after_thirty_quiet_seconds_are_an_onset_and_sooner_they_are_not() -> None:
    x = np.zeros(300)
    x[:50] = 3.0
    x[120] = 1.0  # after 70 s of silence: onset where it enters the horizon
    x[140] = 1.0  # 20 s later: an exceedance but not an onset
    assert burst_onsets(x).tolist() == [115]


def test_nan_counts_are_rejected_with_the_second() -> None:
    x = np.ones(100)
    x[42] = np.nan
    with pytest.raises(ValueError, match="second 42"):
        burst_onsets(x)


def test_alarms_are_upward_crossings_only() -> None:
    p = np.array([0.9, 0.1, 0.6, 0.7, 0.2, np.nan, 0.8, 0.1])
    assert alarm_times(p, 0.5).tolist() == [2, 6]


@pytest.mark.parametrize(
    ("onsets", "alarms", "recall", "precision", "leads"),
    [
        pytest.param([100], [95], 1.0, 1.0, [5.0], id="early-within-lead"),
        pytest.param([100], [103], 1.0, 1.0, [-3.0], id="late-within-lag"),
        pytest.param([100], [104], 0.0, 0.0, [np.nan], id="too-late"),
        pytest.param([100], [89], 0.0, 0.0, [np.nan], id="too-early"),
        pytest.param([100, 200], [92, 98, 500], 0.5, 2 / 3, [8.0, np.nan], id="earliest-alarm-counts"),
        pytest.param([], [5], np.nan, 0.0, [], id="no-onsets"),
        pytest.param([100], [], 0.0, np.nan, [np.nan], id="no-alarms"),
    ],
)
def test_score_bursts_table(
    onsets: list[int], alarms: list[int], recall: float, precision: float, leads: list[float]
) -> None:
    s = score_bursts(np.array(onsets), np.array(alarms), max_lead_s=10, max_lag_s=3)
    np.testing.assert_equal(s.recall, recall)
    np.testing.assert_allclose(s.precision, precision)
    np.testing.assert_equal(s.leads_s, np.array(leads))
    det = [v for v in leads if not np.isnan(v)]
    np.testing.assert_equal(s.mean_lead_s, np.mean(det) if det else np.nan)


def test_alarm_threshold_is_tuned_to_the_probabilities_that_separate_onsets() -> None:
    prob = np.full(1000, 0.3)
    onsets = np.array([200, 500, 800])
    for o in onsets:
        prob[o - 2 : o + 1] = 0.72
    prob[600:603] = 0.5  # a false alarm at 0.5 but not at 0.7
    assert choose_alarm_threshold(prob, onsets, max_lead_s=10) == pytest.approx(0.7)
    assert choose_alarm_threshold(prob, np.array([], dtype=np.int64), max_lead_s=10) == 0.5


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 2000), max_size=30, unique=True),
    st.lists(st.integers(0, 2000), max_size=30, unique=True),
    st.integers(0, 20),
    st.integers(0, 5),
)
def test_burst_scores_stay_in_range(onsets: list[int], alarms: list[int], lead: int, lag: int) -> None:
    s = score_bursts(np.array(sorted(onsets)), np.array(alarms), max_lead_s=lead, max_lag_s=lag)
    assert s.onsets == len(onsets) and s.alarms == len(alarms)
    for v in (s.recall, s.precision):
        assert np.isnan(v) or 0.0 <= v <= 1.0
    found = s.leads_s[~np.isnan(s.leads_s)]
    assert np.all((found >= -lag) & (found <= lead))
    assert np.isnan(s.mean_lead_s) == (len(found) == 0)
    # every detected onset has a matching alarm, so some alarm is a true positive
    if len(found):
        assert s.precision > 0
