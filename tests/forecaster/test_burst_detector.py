"""The training-free onset detector (forecaster/burst.py): offline = streaming, behaviour, the wrapper."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.baselines import EWMA
from forecaster.burst import (
    OnsetBoostedForecaster,
    OnsetDetector,
    OnsetDetectorConfig,
    alarm_times,
    burst_onsets,
    combine_burst,
    onset_scores,
    score_bursts,
    silent_onsets,
)
from forecaster.types import CHANNELS

SMALL = OnsetDetectorConfig(trailing_s=20, evidence_s=3, hold_s=5)
counts = st.lists(st.integers(0, 40), min_size=0, max_size=200).map(lambda v: np.array(v, dtype=float))


def _stream(y: np.ndarray, cfg: OnsetDetectorConfig) -> np.ndarray:
    det = OnsetDetector(cfg, n_nodes=1)
    return np.array([det.update(np.array([v]))[0] for v in y])


@settings(max_examples=40, deadline=None)
@given(counts)
def test_offline_equals_streaming(y: np.ndarray) -> None:
    off = onset_scores(y, SMALL)
    on = _stream(y, SMALL)
    np.testing.assert_array_equal(np.isnan(off), np.isnan(on))
    np.testing.assert_allclose(off[~np.isnan(off)], on[~np.isnan(on)], rtol=0, atol=1e-12)
    assert np.all(np.isnan(off[: SMALL.warmup_s - 1]))
    assert np.all((off[SMALL.warmup_s - 1 :] >= 0) & (off[SMALL.warmup_s - 1 :] <= 1))


@settings(max_examples=30, deadline=None)
@given(counts, st.integers(0, 199))
def test_causal(y: np.ndarray, cut: int) -> None:
    """Changing the future never changes a score already given."""
    if cut >= len(y):
        return
    z = y.copy()
    z[cut:] = z[cut:][::-1] + 7
    np.testing.assert_array_equal(onset_scores(y, SMALL)[:cut], onset_scores(z, SMALL)[:cut])


def test_step_fires_on_the_first_burst_second_and_once() -> None:
    rng = np.random.default_rng(3)
    y = rng.poisson(5.0, 400).astype(float)
    y[200:230] = rng.poisson(25.0, 30)
    s = onset_scores(y)
    alarms = alarm_times(s, 0.5)
    assert alarms.tolist() == [200]  # seen at the end of second 200; held through the burst (hold 30 s)
    assert np.all(s[200:230] >= 0.5)
    assert np.nanmax(s[:200]) < 0.3  # calm Poisson traffic stays low


def test_poisson_false_alarm_rate_is_low() -> None:
    """At 0.5 (p ~ 1e-3 per second, Bonferroni over 3 sums) Poisson traffic alarms rarely."""
    rng = np.random.default_rng(0)
    y = rng.poisson(8.0, 20_000).astype(float)
    n = len(alarm_times(onset_scores(y), 0.5))
    assert n <= 20_000 * 3e-3  # ~1e-3 expected; loose bound against seed luck


def test_after_silence_one_request_is_not_a_burst_three_are() -> None:
    y = np.zeros(300)
    y[100] = 1.0
    y[250] = 3.0
    s = onset_scores(y)
    # silence: mean floored at half a request per 60 s; P(N >= 1) ~ 0.8 %, x3 (Bonferroni) -> 10^-1.6 -> 0.27
    assert 0.2 < s[100] < 0.35
    assert s[250] == 1.0  # P(N >= 3) ~ 1e-7: beyond 10^-6
    assert alarm_times(s, 0.5).tolist() == [250]
    y[40] = 1.0  # one request in the baseline makes the next single one less surprising still
    assert onset_scores(y)[100] < s[100]


def test_unknown_is_not_silence() -> None:
    cfg = SMALL
    y = np.full(60, 4.0)
    det = OnsetDetector(cfg, n_nodes=2)
    for v in y:
        det.update(np.array([v, v]))
    before = det.update(np.array([4.0, np.nan]))
    assert np.isfinite(before[0]) and np.isnan(before[1])
    # node 1 skipped a second: its state equals a node that never saw it
    ref = OnsetDetector(cfg, n_nodes=1)
    for v in y:
        ref.update(np.array([v]))
    np.testing.assert_allclose(det.update(np.array([40.0, 40.0]))[1], ref.update(np.array([40.0]))[0])
    with pytest.raises(ValueError, match="2 nodes"):
        det.update(np.zeros(3))


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="evidence_s"):
        OnsetDetectorConfig(evidence_s=0)
    with pytest.raises(ValueError, match="decades"):
        OnsetDetectorConfig(decades=float("nan"))


def test_combine_burst_nan_rules() -> None:
    a = np.array([0.1, np.nan, 0.7, np.nan])
    b = np.array([0.4, 0.2, 0.3, np.nan])
    out = combine_burst(a, b)
    np.testing.assert_array_equal(out[:3], [0.4, 0.2, 0.7])
    assert np.isnan(out[3])


def test_silent_onsets_bound_reactive_recall() -> None:
    y = np.zeros(400)
    y[205:215] = 9.0  # after silence: onset at 200, first requests at 205
    y[260:] = 1.0  # a trickle: no onset (the burst is still in the trailing window), no alarm
    y[360:370] = 20.0  # onset at 355 after a non-silent baseline
    onsets = burst_onsets(y)
    assert onsets.tolist() == [200, 355]
    assert silent_onsets(y, onsets, max_lag_s=3).tolist() == [True, False]
    assert silent_onsets(y, onsets, max_lag_s=5).tolist() == [False, False]
    # the detector sees both real bursts 5 s after their onsets: only inside a 5-s lag allowance
    alarms = alarm_times(onset_scores(y), 0.5)
    assert alarms.tolist() == [205, 360]
    assert score_bursts(onsets, alarms, 10, 3).recall == 0.0
    assert score_bursts(onsets, alarms, 10, 5).leads_s.tolist() == [-5.0, -5.0]


def _xm(n: int, arrivals: float) -> tuple[np.ndarray, np.ndarray]:
    x = np.full((n, len(CHANNELS)), np.nan)
    x[:, CHANNELS.index("arrival_rps")] = arrivals
    return x, ~np.isnan(x)


def test_wrapper_raises_burst_prob_and_keeps_the_rest() -> None:
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.poisson(5.0, 150), rng.poisson(30.0, 10)]).astype(float)
    inner, wrapped = EWMA(), OnsetBoostedForecaster(EWMA())
    inner.reset(["a"])
    wrapped.reset(["a"])
    probs = []
    for v in y:
        x, m = _xm(1, v)
        fi, fw = inner.step(x, m), wrapped.step(x, m)
        np.testing.assert_array_equal(fi.arrivals_p90, fw.arrivals_p90)
        assert fw.model_version == fi.model_version + "+onset"
        probs.append((fi.burst_prob[0], fw.burst_prob[0]))
    p = np.array(probs)
    expected = combine_burst(p[:, 0], onset_scores(y))
    np.testing.assert_allclose(p[:, 1], expected, equal_nan=True)
    assert p[150, 1] >= 0.5 > np.nanmax(p[:150, 1])


def test_wrapper_ensure_nodes_keeps_known_state() -> None:
    fc = OnsetBoostedForecaster(EWMA(), SMALL)
    fc.reset(["a", "b"])
    for _ in range(40):
        fc.step(*_xm(2, 3.0))
    fc.ensure_nodes(["b", "c"])
    out = fc.step(*_xm(2, 3.0))
    assert np.isfinite(out.burst_prob[0])  # b: warmed up, its detector kept its history
    assert out.node_ids == ("b", "c")


def test_importing_the_detector_loads_no_torch() -> None:
    code = "import sys, forecaster.burst; print('torch' in sys.modules or 'statsmodels' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _Recorder(EWMA):
    """An inner forecaster that keeps its nodes across ensure_nodes (like LearnedForecaster) and says so."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        super().__init__()  # resets (no nodes)
        self.calls.clear()

    def reset(self, node_ids: Sequence[str]) -> None:
        self.calls.append(("reset", tuple(node_ids)))
        super().reset(node_ids)

    def ensure_nodes(self, node_ids: Sequence[str]) -> None:
        self.calls.append(("ensure_nodes", tuple(node_ids)))
        super().reset(node_ids)


def test_wrapper_forwards_ensure_nodes_when_the_inner_has_it() -> None:
    inner = _Recorder()
    fc = OnsetBoostedForecaster(inner, SMALL)
    fc.reset(["a"])
    fc.ensure_nodes(["a"])  # unchanged: nothing forwarded
    fc.ensure_nodes(["a", "b"])
    assert inner.calls == [("reset", ("a",)), ("ensure_nodes", ("a", "b"))]
    assert fc.name == "ewma+onset" and fc.horizon_s == inner.horizon_s
