"""The server-side view of a validation slice: histogram deltas between scrapes, quantiles from buckets computed
as Prometheus (and the controller) compute them, and the comparison's handling of what is missing or coarse."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.pools.loadgen import parse_metrics
from serving.sim import samples
from serving.sim.server_view import (
    BucketCounts,
    bucket_of,
    compare_server,
    from_samples,
    from_snapshot,
    histogram_quantile,
    histograms_from_json,
    histograms_to_json,
    summarize,
    table_rows,
)
from serving.sim.validate import server_histogram_deltas

BOUNDS = (0.01, 0.02, 0.04)


@pytest.mark.parametrize(
    ("q", "cumulative", "expected"),
    [
        # rank 4 of 8 in (0.01, 0.02]: 2 below, 4 inside -> halfway
        (0.5, (2, 6, 8, 8), 0.015),
        # rank 7.2 in (0.02, 0.04]: 6 below, 2 inside -> 0.02 + 0.02 * 0.6
        (0.9, (2, 6, 8, 8), 0.032),
        # the first bucket's lower bound is 0
        (0.25, (4, 4, 4, 4), 0.0025),
        # rank in the +Inf bucket: the highest finite bound
        (0.95, (2, 6, 8, 10), 0.04),
        (1.0, (2, 6, 8, 10), 0.04),
    ],
    ids=["mid-bucket", "upper-bucket", "first-bucket-from-zero", "inf-bucket", "q-one-inf"],
)
def test_quantiles_of_known_buckets(q: float, cumulative: tuple[int, ...], expected: float) -> None:
    assert histogram_quantile(q, BOUNDS, cumulative) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("q", "cumulative"),
    [(0.5, (0, 0, 0, 0)), (-0.1, (1, 2, 3, 3)), (1.5, (1, 2, 3, 3)), (math.nan, (1, 2, 3, 3))],
    ids=["empty", "q-below-0", "q-above-1", "q-nan"],
)
def test_quantile_unknown_is_nan_not_zero(q: float, cumulative: tuple[int, ...]) -> None:
    assert math.isnan(histogram_quantile(q, BOUNDS, cumulative))


@st.composite
def _histograms(draw: st.DrawFn) -> tuple[tuple[float, ...], np.ndarray]:
    bounds = sorted(draw(st.sets(st.floats(1e-4, 100.0, allow_nan=False), min_size=1, max_size=12)))
    per_bucket = draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    return tuple(bounds), np.cumsum(per_bucket)


@given(_histograms(), st.floats(0.001, 1.0))
def test_quantile_lies_in_the_bucket_of_its_rank(
    hist: tuple[tuple[float, ...], np.ndarray], q: float
) -> None:
    """The answer is inside the first bucket whose cumulative count reaches rank q * count (found here by a plain
    loop), or the highest finite bound when that is the +Inf bucket; NaN only for an empty histogram."""
    bounds, cumulative = hist
    got = histogram_quantile(q, bounds, cumulative.tolist())
    total = int(cumulative[-1])
    if total == 0:
        assert math.isnan(got)
        return
    rank = q * total
    i = next(k for k, c in enumerate(cumulative) if c >= rank)
    if i == len(bounds):
        assert got == bounds[-1]
    else:
        lo = 0.0 if i == 0 else bounds[i - 1]
        assert lo < got <= bounds[i] * (1 + 1e-12)


def test_delta_is_what_was_observed_between_scrapes() -> None:
    before = BucketCounts(BOUNDS, (1, 3, 4, 4), 0.05)
    after = BucketCounts(BOUNDS, (3, 8, 10, 11), 0.25)
    d = after.delta(before)
    assert d.cumulative == (2, 5, 6, 7) and d.count == 7
    assert d.sum_s == pytest.approx(0.20)


def test_delta_refuses_other_bounds_and_a_restart() -> None:
    with pytest.raises(ValueError, match="bounds differ"):
        BucketCounts((0.01, 0.05, 0.1), (1, 1, 1, 1), 0.0).delta(BucketCounts(BOUNDS, (0, 0, 0, 0), 0.0))
    with pytest.raises(ValueError, match="went down"):
        BucketCounts(BOUNDS, (1, 1, 1, 1), 0.0).delta(BucketCounts(BOUNDS, (2, 2, 2, 2), 0.0))


@pytest.mark.parametrize(
    ("bounds", "cumulative"),
    [(BOUNDS, (1, 2, 3)), ((0.02, 0.01), (1, 2, 3)), (BOUNDS, (3, 2, 3, 4)), ((0.01, math.inf), (1, 2, 3))],
    ids=["too-few-counts", "bounds-not-increasing", "counts-decreasing", "inf-bound-given"],
)
def test_malformed_buckets_are_rejected(bounds: tuple[float, ...], cumulative: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="BucketCounts"):
        BucketCounts(bounds, cumulative, 0.0)


def _exposition(ttft_counts: tuple[int, ...], ttft_sum: float, engines: int = 2) -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for e in range(engines):
        labels = f'engine="{e}",model_name="tiny"'
        for le, c in zip((*BOUNDS, "+Inf"), ttft_counts, strict=True):
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {c}')
        lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {ttft_counts[-1]}")
        lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {ttft_sum}")
    return "\n".join(lines) + "\n"


def test_a_scrape_is_summed_over_label_sets_per_bucket() -> None:
    h = from_snapshot(parse_metrics(_exposition((1, 2, 3, 4), 0.1)), samples.TIME_TO_FIRST_TOKEN_SECONDS)
    assert h is not None
    assert h.bounds_s == BOUNDS and h.cumulative == (2, 4, 6, 8) and h.sum_s == pytest.approx(0.2)
    assert from_snapshot(parse_metrics(_exposition((1, 2, 3, 4), 0.1)), "vllm:nope") is None


def test_server_deltas_over_a_window_and_a_histogram_not_exported() -> None:
    before = parse_metrics(_exposition((1, 1, 2, 2), 0.03, engines=1))
    after = parse_metrics(_exposition((1, 4, 6, 7), 0.13, engines=1))
    doc = server_histogram_deltas(before, after)
    ttft = BucketCounts.from_json(doc["ttft_ms"])
    assert ttft.cumulative == (0, 3, 4, 5) and ttft.sum_s == pytest.approx(0.10)
    assert doc["itl_ms"] is None and doc["e2e_ms"] is None


def test_simulator_scrape_is_summed_over_instances() -> None:
    counts = np.array([[1, 2, 2, 3], [0, 1, 4, 4]])
    scrape = samples.InstanceSamples(
        now_s=1.0,
        instance_ids=("a", "b"),
        pools=("default",) * 2,
        roles=("mixed",) * 2,
        nodes=("a", "b"),
        states=("active",) * 2,
        histograms={
            samples.INTER_TOKEN_LATENCY_SECONDS: samples.Histogram(BOUNDS, counts, np.array([0.1, 0.2]))
        },
    )
    h = from_samples(scrape, samples.INTER_TOKEN_LATENCY_SECONDS)
    assert h is not None and h.cumulative == (1, 3, 6, 7) and h.sum_s == pytest.approx(0.3)
    assert from_samples(scrape, samples.TIME_TO_FIRST_TOKEN_SECONDS) is None


def test_summary_in_ms_with_exact_means() -> None:
    out = summarize({"ttft_ms": BucketCounts(BOUNDS, (2, 6, 8, 8), 0.16), "itl_ms": None})
    assert out["ttft_ms"]["p50"] == pytest.approx(15.0) and out["ttft_ms"]["p90"] == pytest.approx(32.0)
    assert out["ttft_ms"]["mean"] == pytest.approx(20.0) and out["ttft_ms"]["count"] == 8
    assert out["itl_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None, "count": None}
    assert out["e2e_ms"]["mean"] is None


def test_json_round_trip() -> None:
    hists = {"ttft_ms": BucketCounts(BOUNDS, (2, 6, 8, 8), 0.16), "itl_ms": None}
    assert histograms_from_json(histograms_to_json(hists)) == hists
    assert histograms_from_json(None) == {}


def test_comparison_side_by_side_with_buckets() -> None:
    real = {"ttft_ms": BucketCounts(BOUNDS, (2, 6, 8, 8), 0.16)}
    sim = {"ttft_ms": BucketCounts(BOUNDS, (6, 8, 8, 8), 0.08)}
    row = compare_server(real, sim)
    p50 = row["ttft_ms.p50"]
    assert p50["real"] == pytest.approx(15.0) and p50["sim"] == pytest.approx(10.0 * 4 / 6)
    assert p50["sim_over_real"] == pytest.approx(p50["sim"] / p50["real"])
    assert p50["real_bucket_ms"] == pytest.approx([10.0, 20.0]) and p50["sim_bucket_ms"] == pytest.approx(
        [0.0, 10.0]
    )
    assert p50["bounds_match"] is True
    assert row["ttft_ms.mean"]["sim_over_real"] == pytest.approx(0.5)
    assert row["itl_ms.p50"] == {
        "real": None,
        "sim": None,
        "sim_over_real": None,
        "bounds_match": None,
        "real_bucket_ms": None,
        "sim_bucket_ms": None,
    }


def test_other_bounds_give_no_quantile_ratio_but_a_mean_ratio() -> None:
    real = {"ttft_ms": BucketCounts(BOUNDS, (2, 6, 8, 8), 0.16)}
    sim = {"ttft_ms": BucketCounts((0.01, 0.05, 0.1), (2, 6, 8, 8), 0.32)}
    row = compare_server(real, sim)
    assert row["ttft_ms.p50"]["bounds_match"] is False and row["ttft_ms.p50"]["sim_over_real"] is None
    assert row["ttft_ms.mean"]["sim_over_real"] == pytest.approx(2.0)
    assert "bounds differ" in table_rows(row)[0][4]


def test_a_recording_without_histograms_compares_its_window_means_only() -> None:
    sim = {"ttft_ms": BucketCounts(BOUNDS, (2, 6, 8, 8), 0.16)}
    row = compare_server({}, sim, real_means_ms={"ttft_ms": 40.0, "e2e_ms": None})
    assert row["ttft_ms.mean"]["real"] == 40.0 and row["ttft_ms.mean"]["sim_over_real"] == pytest.approx(0.5)
    assert row["ttft_ms.p50"]["real"] is None and row["ttft_ms.p50"]["sim_over_real"] is None
    assert row["e2e_ms.mean"]["real"] is None


def test_bucket_of_a_value() -> None:
    assert bucket_of(0.015, BOUNDS) == (0.01, 0.02)
    assert bucket_of(0.02, BOUNDS) == (0.01, 0.02)  # le: a bound belongs to its own bucket
    assert bucket_of(0.5, BOUNDS) == (0.04, math.inf)
    assert bucket_of(math.nan, BOUNDS) is None
