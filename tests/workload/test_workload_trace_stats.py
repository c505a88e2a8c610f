"""Trace statistics against the figures in datasets/*/PROVENANCE.md, and edge cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.readers import iter_trace_chunks, read_trace
from serving.workload.stats import LengthSummary, trace_stats
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[2]

# file, rows, span s, mean req/s, peak 1 s, peak 5 s, CV 5 s, mean tok/s 5 s, peak tok/s 5 s (PROVENANCE.md)
CARDS = [
    (
        "azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv",
        6118,
        1976,
        3.10,
        67,
        53.6,
        1.79,
        6377,
        114868,
    ),
    (
        "azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv",
        11997,
        2053,
        5.84,
        16,
        10.6,
        0.29,
        8520,
        19404,
    ),
    ("mooncake/synthetic_trace.jsonl", 3993, 1022, 3.91, 13, 6.4, 0.23, None, 157630),
]


@pytest.mark.parametrize("card", CARDS, ids=["azure-code", "azure-conv", "mooncake"])
@pytest.mark.parametrize("chunk_rows", [997, 1_000_000])
def test_stats_match_provenance_cards(card: tuple, chunk_rows: int) -> None:  # type: ignore[type-arg]
    name, rows, span, rate, peak1, peak5, cv5, tok_mean, tok_peak = card
    s = trace_stats(iter_trace_chunks(ROOT / "datasets" / name, chunk_rows=chunk_rows))
    assert s.requests == rows
    assert round(s.duration_s) == span
    assert round(s.mean_rate_rps, 2) == rate
    assert s.peak_rate_rps_1s == peak1
    assert round(s.peak_rate_rps_5s, 1) == peak5
    assert round(s.cv_5s, 2) == cv5
    if tok_mean is not None:
        assert round(s.tokens_rate_mean_5s) == tok_mean
    assert round(s.tokens_rate_peak_5s) == tok_peak


def test_mooncake_lengths_match_card() -> None:
    s = trace_stats(read_trace(ROOT / "datasets/mooncake/synthetic_trace.jsonl"))
    assert (
        round(s.prompt_tokens_mean) == 15325
        and s.prompt_tokens_p50 == 11587
        and s.prompt_tokens_max == 191378
    )
    assert round(s.output_tokens_mean) == 149 and s.output_tokens_p50 == 69 and s.output_tokens_max == 893


def test_bins_are_aligned_to_first_arrival() -> None:
    # 0.6 s apart: on wall-clock seconds these could share a bin or not; from the first arrival they do
    t = Trace.from_arrays(np.array([0.0, 0.6, 0.9, 1.0]), np.ones(4), np.ones(4))
    s = trace_stats(t)
    assert s.peak_rate_rps_1s == 3.0
    assert s.peak_rate_rps_5s == pytest.approx(4 / 5)
    assert s.cv_5s == 0.0  # one 5 s bin


def test_empty_bins_and_last_partial_bin_count() -> None:
    t = Trace.from_arrays(np.array([0.0, 1.0, 12.0]), np.ones(3), np.ones(3))
    s = trace_stats(t)
    counts = np.array([2, 0, 1])  # bins [0,5) [5,10) [10,15)
    assert s.cv_5s == pytest.approx(counts.std() / counts.mean())
    assert s.mean_rate_rps == pytest.approx(3 / 12)


def test_one_request_and_zero_duration_are_unknown_not_infinite() -> None:
    one = trace_stats(Trace.from_arrays(np.array([0.0]), np.array([5]), np.array([7])))
    assert one.requests == 1 and one.duration_s == 0.0 and math.isnan(one.mean_rate_rps)
    assert one.peak_rate_rps_1s == 1.0 and one.cv_5s == 0.0
    assert one.to_json_dict()["mean_rate_rps"] is None
    same = trace_stats(Trace.from_arrays(np.zeros(4), np.ones(4), np.ones(4)))
    assert same.peak_rate_rps_1s == 4.0 and math.isnan(same.mean_rate_rps)


def test_models_and_failed_counted() -> None:
    s = trace_stats(read_trace(Path(__file__).parent / "data/burstgpt_sample.csv"))
    assert s.models == {"ChatGPT": 5, "GPT-4": 3} and s.failed == 2


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=30), min_size=1, max_size=4),
    q=st.sampled_from([0, 1, 37.5, 50, 99, 100]),
    huge=st.booleans(),
)
def test_length_summary_matches_numpy(parts: list[list[int]], q: float, huge: bool) -> None:
    if huge:  # switches the summary from a histogram to raw values midway
        parts = [*parts, [LengthSummary.HISTOGRAM_LIMIT + 5]]
    s = LengthSummary()
    for p in parts:
        s.add(np.asarray(p, dtype=np.int64))
    every = np.concatenate([np.asarray(p) for p in parts])
    assert s.percentile(q) == pytest.approx(float(np.percentile(every, q)), abs=1e-9)
    assert s.max == every.max() and s.total == every.sum() and s.n == len(every)


def test_absurd_span_is_a_clear_error_not_a_huge_allocation() -> None:
    t = Trace.from_arrays(np.array([0.0, 1e12]), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="1e\\+12 s after the first one"):
        trace_stats(t)
