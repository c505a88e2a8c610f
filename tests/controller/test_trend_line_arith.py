"""The ramp detector's least-squares line (``stages._line``) computes its means and residuals without numpy's
dispatch: the same floats, to the bit, as the plain ``np.mean`` formulas on a copy of the window."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.policy import stages


def _plain_line(t: np.ndarray, r: np.ndarray, now_s: float, window_s: float) -> tuple[float, ...] | None:
    """The line's (slope, se, level, rss, var) by the formulas as written, on the masked window."""
    sel = (t > now_s - window_s) & (t <= now_s)
    t, r = t[sel].copy(), r[sel].copy()
    n = len(t)
    if n < stages.TREND_MIN_SAMPLES:
        return None
    span = float(t.max() - t.min())
    if span < stages.TREND_MIN_COVERAGE * window_s:
        return None
    t_mean = t.mean()
    tc = t - t_mean
    sxx = float(tc @ tc)
    if sxx <= 0:
        return None
    mean = float(r.mean())
    slope = float(tc @ (r - mean)) / sxx
    rss = float(((r - mean - slope * tc) ** 2).sum())
    var = max(rss / (n - 2), max(mean, 0.0) / (span / (n - 1)))
    return slope, math.sqrt(var / sxx), mean + slope * (now_s - float(t_mean)), rss, var


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 300),
    st.sampled_from([0.0, 1.7e9, 12_345.5]),
    st.integers(0, 2**32 - 1),
    st.sampled_from(stages.TREND_WINDOWS_S),
    st.sampled_from([0.0, 3.0, 40.0]),
    st.booleans(),
)
def test_the_line_is_the_plain_formulas_to_the_bit(
    n: int, origin: float, seed: int, window_s: float, back_s: float, shuffle: bool
) -> None:
    rng = np.random.default_rng(seed)
    t = origin + np.cumsum(rng.choice([1.0, 1.0, 2.0, 0.5], size=n))
    r = rng.poisson(rng.uniform(0, 40), size=n) + rng.normal(0.0, rng.uniform(0, 3), size=n)
    if shuffle:
        t = rng.permutation(t)
    now = (float(t.max()) if n else origin) - back_s
    ordered = stages._ordered(t)
    line = stages._line(t, r, now, window_s, ordered)
    plain = _plain_line(t, r, now, window_s)
    got = None if line is None else (line.slope, line.se, line.level, line.rss, line.var)
    assert got == plain
