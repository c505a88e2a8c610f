"""bench/gen_shapes_s18.py: the session-18 traffic shapes are readable, seeded, and what their names say."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.readers import read_trace
from serving.workload.trace import Trace
from tests.support.bench import load_bench
from tests.support.shapes import assert_written_and_read_back

gen = load_bench("gen_shapes_s18")
L = gen.Lengths(1000.0, 200.0)


@pytest.fixture(scope="module")
def shapes() -> dict[str, tuple[str, Trace]]:
    return dict(gen.build(0))


def _rate(t: Trace, t0: float, t1: float) -> float:
    return float(((t.arrival_s >= t0) & (t.arrival_s < t1)).sum()) / (t1 - t0)


def test_every_shape_is_written_and_read_back_whole(
    tmp_path: Path, shapes: dict[str, tuple[str, Trace]]
) -> None:
    assert_written_and_read_back(gen, tmp_path, shapes, "s18_", 10, minutes=(25.0, 41.0))


def test_a_seed_gives_the_same_requests_and_another_seed_others(shapes: dict[str, tuple[str, Trace]]) -> None:
    again, other = gen.build(0), gen.build(1)
    for name, (_, trace) in shapes.items():
        assert np.array_equal(again[name][1].arrival_s, trace.arrival_s), name
        assert np.array_equal(again[name][1].output_tokens, trace.output_tokens), name
    for name in (n for n in shapes if n != "s18_code_double_speed"):  # a pure transform draws nothing
        assert not np.array_equal(other[name][1].arrival_s[:50], shapes[name][1].arrival_s[:50]), name


def test_exp_growth_doubles_every_five_minutes_then_holds(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_exp_growth"][1]
    minutes = [_rate(t, 300.0 * k, 300.0 * (k + 1)) for k in range(5)]
    ratios = [b / a for a, b in itertools.pairwise(minutes)]
    assert all(1.6 < r < 2.5 for r in ratios), ratios
    assert abs(_rate(t, 1500.0, 1980.0) - 16.0) < 0.8


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 5.0), st.floats(2.0, 64.0), st.floats(30.0, 600.0))
def test_exp_growth_pieces_grow_by_the_same_ratio(start: float, mult: float, doubling: float) -> None:
    pieces = gen.exp_growth_pieces(start, start * mult, doubling, 10.0, L)
    r = np.array([p.rate_rps for p in pieces])
    assert sum(p.duration_s for p in pieces) == pytest.approx(doubling * np.log2(mult))
    if len(r) > 1:
        assert np.allclose(r[1:] / r[:-1], r[1] / r[0])
    assert start <= r[0] and r[-1] <= start * mult


def test_batch_clumps_are_tight_and_the_background_flat(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_batch_clumps"][1]
    per_2s = np.bincount((t.arrival_s // 2).astype(int))
    clumps = per_2s[per_2s > 40]
    assert (
        5 <= len(clumps) <= 25 and clumps.max() <= 200 + 40
    )  # batches of 60-200 (split over two bins at most)
    calm = per_2s[per_2s <= 20]
    assert abs(calm.mean() / 2.0 - 3.0) < 0.3


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.5))
def test_random_walk_pieces_stay_within_their_bounds(seed: int, sigma: float) -> None:
    pieces = gen.random_walk_pieces(1800.0, 4.0, 30.0, sigma, (1.0, 24.0), L, seed)
    r = np.array([p.rate_rps for p in pieces])
    assert len(r) == 60 and r[0] == pytest.approx(4.0)
    assert r.min() >= 1.0 - 1e-9 and r.max() <= 24.0 + 1e-9


def test_random_walk_wanders(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_random_walk"][1]
    minutes = np.array([_rate(t, 60.0 * k, 60.0 * (k + 1)) for k in range(30)])
    assert minutes.max() > 2.0 * minutes.min()  # it moved
    assert minutes.min() >= 0.5 and minutes.max() <= 26.0


def test_pareto_bursts_have_heavy_tailed_heights_at_most_x20() -> None:
    pieces = gen.pareto_bursts(200_000.0, 1.0, (15.0, 60.0), 90.0, 120.0, 1.5, 20.0, L, 0)
    factors = np.array([p.rate_rps for p in pieces[1::2]])
    assert len(factors) > 500 and factors.min() >= 1.0 and factors.max() == 20.0
    assert np.mean(factors > 5.0) > 0.04  # Pareto(1.5): P(1 + X > 5) = 5^-1.5 = 0.089
    assert all(p.rate_rps == 1.0 for p in pieces[0::2])


def test_reasoning_shift_keeps_the_rate_and_grows_the_outputs(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_reasoning_shift"][1]
    early, late = t.arrival_s < 300.0, t.arrival_s >= 1500.0
    assert abs(_rate(t, 0.0, 300.0) - _rate(t, 1500.0, 1800.0)) < 0.5
    assert t.output_tokens[late].sum() > 4 * t.output_tokens[early].sum()
    assert abs(t.prompt_tokens[late].mean() / t.prompt_tokens[early].mean() - 1.0) < 0.35


def test_two_peak_day_has_its_night_and_two_peaks(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_two_peak_day"][1]
    assert _rate(t, 0.0, 120.0) < 1.5 and _rate(t, 1200.0, 1320.0) < 3.0
    assert 8.5 < _rate(t, 660.0, 780.0) < 11.0 and 12.5 < _rate(t, 1740.0, 1860.0) < 15.0


def test_outage_then_a_retry_storm(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_outage_retry"][1]
    assert _rate(t, 900.0, 960.0) == 0.0
    assert abs(_rate(t, 960.0, 1050.0) - 18.0) < 1.5 and abs(_rate(t, 1200.0, 1800.0) - 6.0) < 0.5


def test_long_doc_waves_burst_the_prompt_tokens(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s18_long_doc_waves"][1]
    wave = (t.arrival_s % 300.0) >= 240.0
    calm_tokens = t.prompt_tokens[~wave].sum() / (240.0 * 6)
    wave_tokens = t.prompt_tokens[wave].sum() / (60.0 * 6)
    assert wave_tokens > 3.0 * calm_tokens
    assert wave.sum() / (60.0 * 6) < 2.0 * (~wave).sum() / (240.0 * 6)  # the requests rise by half


def test_the_two_azure_transforms(shapes: dict[str, tuple[str, Trace]]) -> None:
    code = read_trace(gen.bundled(gen.CODE_TRACE))
    fast = shapes["s18_code_double_speed"][1]
    assert len(fast) == 2 * len(code)
    assert abs(fast.duration_s - (code.duration_s + 1.0)) < 2.0  # two halves of half the span, 1 s apart
    conv = read_trace(gen.bundled(gen.CONV_TRACE))
    rev = shapes["s18_conv_reversed_x2"][1]
    assert len(rev) == 2 * len(conv)
    first, last = conv.arrival_s < conv.arrival_s[0] + 300.0, conv.arrival_s > conv.arrival_s[-1] - 300.0
    # reversed: the reversed trace's first 5 min are conv's last (twice over)
    assert abs(_rate(rev, 60.0, 300.0) / (last.sum() / 300.0) - 2.0) < 0.4
    assert first.any()
