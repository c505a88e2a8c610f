"""Long unseen traces: the replay plot's per-bin TTFT quantiles, vectorised for a day of arrivals."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.plots import ttft_bins


def _naive(arrival_s: np.ndarray, ttft_ms: np.ndarray, bin_s: float) -> tuple[list[float], ...]:
    """The loop the plot used before: one mask per bin."""
    bins = np.floor(arrival_s / bin_s).astype(np.int64)
    centers, p50, p99 = [], [], []
    for b in np.unique(bins):
        vals = ttft_ms[(bins == b) & np.isfinite(ttft_ms)]
        if len(vals):
            centers.append((b + 0.5) * bin_s)
            p50.append(float(np.percentile(vals, 50)))
            p99.append(float(np.percentile(vals, 99)))
    return centers, p50, p99


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0, 500, allow_nan=False),
            st.one_of(st.floats(0, 1e6, allow_nan=False), st.just(float("nan")), st.just(float("inf"))),
        ),
        max_size=80,
    ),
    bin_s=st.sampled_from([1.0, 10.0, 60.0]),
)
def test_ttft_bins_equal_the_per_bin_loop(rows: list[tuple[float, float]], bin_s: float) -> None:
    arrival = np.sort(np.array([r[0] for r in rows], dtype=np.float64))
    ttft = np.array([r[1] for r in rows], dtype=np.float64)
    got = ttft_bins(arrival, ttft, bin_s)
    want = _naive(arrival, ttft, bin_s)
    for g, w in zip(got, want, strict=True):
        assert np.allclose(g, np.asarray(w, dtype=np.float64))


def test_ttft_bins_skip_empty_and_unfinished_bins() -> None:
    centers, p50, p99 = ttft_bins(np.array([0.5, 1.0, 25.0, 31.0]), np.array([10.0, 30.0, np.nan, 7.0]), 10.0)
    assert (
        centers.tolist() == [5.0, 35.0]
        and p50.tolist() == [20.0, 7.0]
        and p99[0] == np.percentile([10, 30], 99)
    )
