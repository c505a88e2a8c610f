"""bench/gen_shapes_s11.py: the session-11 traffic shapes are what their names say."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.trace import Trace
from tests.support.bench import load_bench

gen = load_bench("gen_shapes_s11")
L = gen.Lengths(1000.0, 200.0)


def test_pieces_keep_their_rates_and_lengths() -> None:
    t = gen.pieces_trace(
        [
            gen.Piece(600.0, 2.0, gen.Lengths(500.0, 100.0)),
            gen.Piece(600.0, 8.0, gen.Lengths(6000.0, 1500.0)),
        ],
        1,
    )
    first, second = t.arrival_s < 600.0, t.arrival_s >= 600.0
    assert abs(first.sum() - 1200) < 5 * np.sqrt(1200) and abs(second.sum() - 4800) < 5 * np.sqrt(4800)
    assert 400 < np.median(t.prompt_tokens[first]) < 600 and 5000 < np.median(t.prompt_tokens[second]) < 7000
    assert 1200 < np.median(t.output_tokens[second]) < 1800
    assert np.all(np.diff(t.arrival_s) >= 0)


def test_overdispersed_counts_vary_more_than_poisson_without_trend() -> None:
    pieces = gen.overdispersed_pieces(3600.0, 6.0, 10.0, 1.5, L, 3)
    t = gen.pieces_trace(pieces, 4)
    counts = np.bincount((t.arrival_s // 10).astype(int), minlength=360)
    assert counts.var() / counts.mean() > 5.0  # Poisson: 1; gamma-mixed: 1 + 60 / 1.5 = 41
    halves = counts[:180].mean(), counts[180:].mean()
    assert abs(halves[0] - halves[1]) < 0.2 * counts.mean()


def test_jittered_bursts_are_not_periodic() -> None:
    pieces = gen.jittered_bursts(3600.0, 2.0, 6.0, (20.0, 60.0), 60.0, 150.0, L, 5)
    assert abs(sum(p.duration_s for p in pieces) - 3600.0) < 1e-6
    gaps = [p.duration_s for p in pieces if p.rate_rps == 2.0][:-1]
    bursts = [p.duration_s for p in pieces if p.rate_rps == 12.0]
    assert min(gaps) >= 60.0 and np.std(gaps) > 30.0
    assert len(bursts) >= 5 and all(20.0 <= b <= 60.0 for b in bursts[:-1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=1, max_size=50))
def test_time_reversal_mirrors_the_arrivals(times: list[float]) -> None:
    t = np.sort(np.asarray(times))
    n = len(t)
    trace = Trace.from_arrays(t, np.arange(1, n + 1), np.arange(n + 1, 2 * n + 1))
    back = gen.time_reversed(trace)
    assert back.arrival_s[0] == 0.0 and np.all(np.diff(back.arrival_s) >= 0)
    assert np.allclose(back.arrival_s, t[-1] - t[::-1])
    assert back.prompt_tokens.tolist() == list(range(n, 0, -1))  # the last request first, its lengths kept
    again = gen.time_reversed(back)
    assert np.allclose(again.arrival_s, t - t[0])


def test_merge_interleaves_classes_in_order() -> None:
    a = gen.pieces_trace([gen.Piece(300.0, 2.0, gen.Lengths(300.0, 700.0))], 6)
    b = gen.pieces_trace([gen.Piece(300.0, 1.0, gen.Lengths(7000.0, 60.0))], 7)
    m = gen.merge(a, b)
    assert len(m) == len(a) + len(b) and np.all(np.diff(m.arrival_s) >= 0)
    assert sorted(m.prompt_tokens.tolist()) == sorted(a.prompt_tokens.tolist() + b.prompt_tokens.tolist())


def test_linear_pieces_run_from_start_to_end() -> None:
    p = gen.linear_pieces(12.0, 3.0, 900.0, 60.0, L)
    assert len(p) == 15 and p[0].rate_rps > p[-1].rate_rps
    assert abs(sum(x.duration_s for x in p) - 900.0) < 1e-9
    assert abs(np.mean([x.rate_rps for x in p]) - 7.5) < 1e-9


def test_an_unknown_only_name_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        gen.main(["--out", str(tmp_path / "out"), "--only", "s11_very_low", "s11_nosuch"])
    assert exc.value.code == 2
    assert "s11_nosuch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written on a refused command
