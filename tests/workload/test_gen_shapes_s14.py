"""bench/gen_shapes_s14.py: the session-14 traffic shapes are readable, seeded, and what their names say."""

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

gen = load_bench("gen_shapes_s14")
L = gen.Lengths(1000.0, 200.0)


@pytest.fixture(scope="module")
def shapes() -> dict[str, tuple[str, Trace]]:
    return dict(gen.build(0))


def _counts(t: Trace, bin_s: float, duration_s: float) -> np.ndarray:
    return np.bincount((t.arrival_s // bin_s).astype(int), minlength=int(duration_s // bin_s))


def _rate(t: Trace, t0: float, t1: float) -> float:
    return float(((t.arrival_s >= t0) & (t.arrival_s < t1)).sum()) / (t1 - t0)


def test_every_shape_is_written_and_read_back_whole(
    tmp_path: Path, shapes: dict[str, tuple[str, Trace]]
) -> None:
    assert_written_and_read_back(gen, tmp_path, shapes, "s14_", 10)


def test_a_seed_gives_the_same_requests_and_another_seed_others(shapes: dict[str, tuple[str, Trace]]) -> None:
    again, other = gen.build(0), gen.build(1)
    for name, (_, trace) in shapes.items():
        assert np.array_equal(again[name][1].arrival_s, trace.arrival_s), name
        assert np.array_equal(again[name][1].prompt_tokens, trace.prompt_tokens), name
    generated = [n for n in shapes if n not in ("s14_conv_plus_code", "s14_code_half_speed")]
    for name in generated:  # the two pure transforms of the bundled traces draw nothing
        assert not np.array_equal(other[name][1].arrival_s[:50], shapes[name][1].arrival_s[:50]), name


def test_growing_bursts_each_taller_than_any_before(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_growing_bursts"][1]
    peaks = [_rate(t, 240.0 * k, 240.0 * k + 40.0) for k in range(1, 8)]  # bursts at 240, 480, ... 1680 s
    between = [_rate(t, 240.0 * k + 60.0, 240.0 * (k + 1) - 20.0) for k in range(1, 7)]
    assert all(b > a for a, b in itertools.pairwise(peaks)), peaks
    assert peaks[0] > 3.0 and peaks[-1] > 13.0 and max(between) < 3.0


def test_growing_bursts_pieces_follow_the_factors() -> None:
    pieces = gen.growing_bursts(1000.0, 2.0, (2.0, 5.0), 200.0, 40.0, L)
    assert abs(sum(p.duration_s for p in pieces) - 1000.0) < 1e-9
    bursts = [p.rate_rps for p in pieces if p.rate_rps > 2.0]
    assert bursts == [4.0, 10.0, 10.0, 10.0]  # the last factor repeats
    assert pieces[0].duration_s == 200.0 and pieces[1].duration_s == 40.0 and pieces[2].duration_s == 160.0


def test_sawtooth_rises_slowly_and_drops_at_once(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_sawtooth"][1]
    for k in range(6):
        s = 300.0 * k
        first, last = _rate(t, s, s + 60.0), _rate(t, s + 240.0, s + 300.0)
        assert last > 2.5 * first, (k, first, last)
        if k:
            assert _rate(t, s - 15.0, s) > 4.0 * _rate(t, s, s + 15.0)  # the drop, within one step


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.floats(0.1, 4.0), st.floats(5.0, 50.0))
def test_sawtooth_pieces_rise_within_each_tooth(k: int, low: float, high: float) -> None:
    pieces = gen.sawtooth_pieces(3, 15.0 * k, low, high, 15.0, L)
    rates = [p.rate_rps for p in pieces]
    assert len(rates) == 3 * k
    for tooth in range(3):
        r = rates[tooth * k : (tooth + 1) * k]
        assert r[0] == pytest.approx(low) and r[-1] == pytest.approx(high)
        assert all(b > a for a, b in itertools.pairwise(r))


def test_staircase_plateaus_and_slow_ramps(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_staircase_slow"][1]
    levels = (2.0, 5.0, 9.0, 6.0, 12.0, 4.0)
    for i, level in enumerate(levels):
        s = 360.0 * i
        assert abs(_rate(t, s, s + 240.0) - level) < 4 * np.sqrt(level / 240.0) + 0.05, (i, level)
        if i < len(levels) - 1:  # the ramp's middle minute lies between the two levels
            mid = _rate(t, s + 270.0, s + 330.0)
            lo, hi = sorted((level, levels[i + 1]))
            assert lo < mid < hi, (i, mid)


def test_flash_crowd_comes_after_twenty_quiet_minutes(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_flash_after_quiet"][1]
    quiet = _counts(t, 60.0, 1800.0)[:20]
    assert quiet.max() < 50 and abs(quiet.mean() - 30.0) < 5.0  # 0.5 req/s for 20 min, no minute above 50
    assert _rate(t, 1199.0, 1200.0) < 3.0 and _rate(t, 1200.0, 1210.0) > 8.0
    assert abs(_rate(t, 1200.0, 1560.0) - 12.0) < 0.6 and _rate(t, 1560.0, 1800.0) < 1.5


def test_decay_to_near_zero_then_a_sharp_return(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_decay_return"][1]
    minutes = _counts(t, 60.0, 1800.0) / 60.0
    assert minutes[0] > 8.0 and minutes[19] < 0.5 and max(minutes[20:23]) < 0.4
    assert np.all(np.diff(np.convolve(minutes[:20], np.ones(3) / 3, "valid")) < 0.2)  # falls, no rebound
    assert _rate(t, 1370.0, 1380.0) < 1.0 and abs(_rate(t, 1380.0, 1800.0) - 10.0) < 0.6


def test_exp_decay_pieces_fall_by_the_same_ratio_each_step() -> None:
    p = gen.exp_decay_pieces(10.0, 0.1, 1200.0, 30.0, L)
    r = np.array([x.rate_rps for x in p])
    assert len(p) == 40 and np.allclose(r[1:] / r[:-1], (0.01) ** (1 / 40))
    assert 9.0 < r[0] < 10.0 and 0.1 < r[-1] < 0.12


def test_on_off_period_is_90_s(shapes: dict[str, tuple[str, Trace]]) -> None:
    t = shapes["s14_onoff_90s"][1]
    c = _counts(t, 45.0, 1800.0)[:40]
    on, off = c[0::2], c[1::2]
    assert on.min() > 3 * off.max()  # every on-half busier than every off-half
    assert abs(on.mean() / 45.0 - 10.0) < 0.5 and abs(off.mean() / 45.0 - 1.0) < 0.3


def test_class_shift_keeps_the_rate_and_grows_the_long_documents(
    shapes: dict[str, tuple[str, Trace]],
) -> None:
    t = shapes["s14_class_shift"][1]
    early, late = t.arrival_s < 300.0, t.arrival_s >= 1500.0
    assert abs(_rate(t, 0.0, 300.0) - _rate(t, 1500.0, 1800.0)) < 0.5  # flat requests
    long_share = [float((t.prompt_tokens[m] > 3000).mean()) for m in (early, late)]
    assert long_share[0] < 0.1 and 0.45 < long_share[1] < 0.7
    assert t.prompt_tokens[late].sum() > 3 * t.prompt_tokens[early].sum()  # 3.6x in the first and last 5 min


def test_conv_plus_code_holds_both_traces_the_code_one_300_s_later(
    shapes: dict[str, tuple[str, Trace]],
) -> None:
    t = shapes["s14_conv_plus_code"][1]
    conv = read_trace(gen.bundled(gen.CONV_TRACE))
    code = read_trace(gen.bundled(gen.CODE_TRACE))
    assert len(t) == len(conv) + len(code)
    assert int((t.arrival_s < 300.0).sum()) == int((conv.arrival_s < 300.0).sum())
    assert abs(t.duration_s - (300.0 + code.duration_s)) < 1e-6


def test_time_stretch_halves_the_rate_and_doubles_the_burst_lengths() -> None:
    t = Trace.from_arrays(np.array([0.0, 1.0, 1.5, 10.0]), np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]))
    s = gen.time_stretched(t, 2.0)
    assert s.arrival_s.tolist() == [0.0, 2.0, 3.0, 20.0] and s.prompt_tokens.tolist() == [1, 2, 3, 4]


def test_code_half_speed_and_mooncake_slow_thin(shapes: dict[str, tuple[str, Trace]]) -> None:
    code = read_trace(gen.bundled(gen.CODE_TRACE)).window(0.0, 1100.0)
    half = shapes["s14_code_half_speed"][1]
    assert np.allclose(half.arrival_s, 2.0 * code.arrival_s)
    moon = read_trace(gen.bundled(gen.MOONCAKE_TRACE))
    slow = shapes["s14_mooncake_slow_thin"][1]
    assert abs(len(slow) / len(moon) - 0.5) < 0.05 and abs(slow.duration_s / moon.duration_s - 2.0) < 0.05
    assert slow.prompt_tokens.max() <= gen.FILE_POOL_MAX_PROMPT
    assert abs(np.median(slow.prompt_tokens) - np.median(moon.prompt_tokens) / 8) < 300


def test_an_unknown_only_name_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        gen.main(["--out", str(tmp_path / "out"), "--only", "s14_sawtooth", "s14_nosuch"])
    assert exc.value.code == 2
    assert "s14_nosuch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
