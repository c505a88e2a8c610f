"""The repeatability bench's spread and deferred-share arithmetic, and the deferral probe's burst rule, on
hand-made rows (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.bench import load_bench

repeat = load_bench("bench_validate_repeat")
deferral = load_bench("bench_vllm_deferral")


@pytest.mark.parametrize(
    ("values", "figure", "max_over_min", "dev", "within"),
    [
        ([100.0, 108.0, 92.0], "ttft_ms.p50", 108 / 92, 0.08, True),
        ([100.0, 112.0, 92.0], "ttft_ms.p50", 112 / 92, 0.12, False),
        ([100.0, 125.0, 100.0], "ttft_ms.p90", 1.25, 0.25, False),
        ([100.0, 119.0, 100.0], "ttft_ms.p90", 1.19, 0.19, True),
        ([100.0, None, 130.0], "itl_ms.mean", 1.3, 15 / 115, False),  # median of two: 115
    ],
    ids=["p50-within", "p50-beyond", "p90-beyond", "p90-within", "missing-run-skipped"],
)
def test_spread_against_the_goals_tolerance(
    values: list[float | None], figure: str, max_over_min: float, dev: float, within: bool
) -> None:
    s = repeat.spread(values, figure)
    assert s["max_over_min"] == pytest.approx(max_over_min)
    assert s["max_dev_from_median"] == pytest.approx(dev, rel=1e-3)
    assert s["within_tolerance"] is within


def test_spread_of_one_run_is_unknown() -> None:
    assert repeat.spread([100.0, None], "ttft_ms.p50")["max_over_min"] is None


def test_deferred_share_counts_whole_answers_in_one_burst() -> None:
    real = {
        "requests": {
            "sent_ms": [0.0, 50.0, 500.0, 600.0, 700.0],
            "ttft_ms": [99.5, 10.0, 90.0, 50.0, None],
            "e2e_ms": [100.0, 100.0, 100.0, 50.0, 80.0],
            # 7 gaps in 0.5 ms: a burst; 7 gaps of 12.9 ms; 7 gaps of 1.4 ms: streamed; one token and a failed
            # request do not count
            "completion_tokens": [8, 8, 8, 1, 8],
        }
    }
    assert repeat.deferred_share(real) == pytest.approx(1 / 3)
    assert repeat.deferred_share({}) is None
    groups = repeat.deferred_breakdown([real, real])
    assert groups["all"] == (6, pytest.approx(1 / 3))
    assert groups["tokens 5-8"] == (6, pytest.approx(1 / 3)) and groups["tokens 32-32"] == (0, None)
    # request 1 is sent while request 0 is in flight; 0 and 2 find the server idle
    assert groups["sent busy"] == (2, 0.0) and groups["sent idle"] == (4, 0.5)


def test_a_burst_is_a_whole_answer_faster_than_any_engine_step() -> None:
    data = {
        "completion_tokens": np.array([8.0, 8.0, 1.0, 2.0]),
        "client_ttft_ms": np.array([100.0, 50.0, 40.0, 40.0]),
        # 7 gaps in 0.7 ms (burst); 7 gaps of 5 ms (streamed); one token; 1 gap of 1.5 ms (streamed)
        "e2e_ms": np.array([100.7, 85.0, 40.0, 41.5]),
    }
    assert deferral.deferred(data).tolist() == [True, False, False, False]


@pytest.mark.parametrize(
    ("ratio", "figure", "met"),
    [
        (0.91, "ttft_ms.p50", True),
        (0.89, "ttft_ms.p50", False),
        (1.19, "itl_ms.p90", True),
        (None, "itl_ms.p90", False),
    ],
    ids=["p50-in", "p50-out", "p90-in", "unknown"],
)
def test_goal(ratio: float | None, figure: str, met: bool) -> None:
    assert repeat.meets_goal(ratio, figure) is met
