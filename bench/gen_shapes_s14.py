"""Traffic shapes no earlier set had (session 14, issue 5): a fresh set, not tuned on, written as Azure CSV
files that ``bench/bench_policies.py --workloads file:PATH`` (and bench_misses.py, bench_decisions.py) replay.

Same conventions as ``bench/gen_shapes_s11.py`` (whose ``Lengths``, ``Piece``, ``pieces_trace``, ``merge`` and
``linear_pieces`` it uses): Poisson arrivals within each piece, lognormal lengths of round medians named here
(sigma 0.7), or generic transforms of the bundled traces. None of these kinds is in s9u's shape variants
(``serving/workload/variants.py``: ×10 steps, periodic bursts of one height, on/off with 20-min silences, a
first-minute peak, Pareto prompts, a flash crowd after 5 min at 2 req/s for 60 s) nor in s11u's set:

* ``s14_growing_bursts``: 2 req/s, a 40-s burst every 240 s whose height grows each time (× 2, 3, ... 8): every
  burst is taller than any before it;
* ``s14_sawtooth``: six 5-min teeth, each a linear rise 1 -> 10 req/s (15-s steps), then a drop to 1 within a
  second;
* ``s14_staircase_slow``: 4-min plateaus at 2, 5, 9, 6, 12, 4 req/s joined by 2-min linear ramps (10-s steps);
* ``s14_flash_after_quiet``: 20 min at 0.5 req/s, then 12 req/s (× 24) within a second for 6 min, then 1 req/s;
* ``s14_decay_return``: 10 req/s decaying exponentially to 0.1 over 20 min (30-s steps), 3 min at 0.1, then 10
  req/s again within a second for 7 min;
* ``s14_onoff_90s``: 30 min of 45 s at 10 req/s and 45 s at 1 req/s (a 90-s period, shorter than one cold start);
* ``s14_class_shift``: 4 req/s throughout, the share of long documents (prompt 8,000 / output 150) among chat
  (800 / 300) growing linearly 0 -> 60 % over 30 min (1-min pieces): flat requests, the prompt tokens of the
  last 5 min 3.6 × those of the first;
* ``s14_conv_plus_code``: the bundled Azure conv trace with the Azure code trace laid over it 300 s later;
* ``s14_code_half_speed``: the first 1,100 s of the Azure code trace played at half speed (times × 2);
* ``s14_mooncake_slow_thin``: the bundled Mooncake trace played at half speed and thinned to 50 % (rate / 4,
  bursts twice as long), prompts / 8 and at most 8,000 tokens: the ``file:`` pool's TTFT is 1 s, which a lone
  22,682-token prompt cannot meet (2.4 s); an 8,000-token one takes 0.66 s. 1.2 % of the prompts are capped.

Run: ``.venv/bin/python bench/gen_shapes_s14.py --out DIR [--only NAME ...] [--seed N]``; prints one line per file
(requests, duration, mean rate, prompt/output medians).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gen_shapes_s11 import Lengths, Piece, linear_pieces, merge, pieces_trace, shapes_main  # noqa: E402

from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from serving.workload.variants import (  # noqa: E402
    CODE_TRACE,
    CONV_TRACE,
    MOONCAKE_TRACE,
    bundled,
    thin,
)

#: Mooncake's prompts (median 11,587 tokens) are divided by this and capped to ``FILE_POOL_MAX_PROMPT``: the
#: ``file:`` pool's TTFT SLO is 1 s, out of reach for a lone prompt above ~10,000 tokens on llama3-8b/a100.
MOONCAKE_PROMPT_DIVISOR = 8
FILE_POOL_MAX_PROMPT = 8_000

__all__ = [
    "build",
    "class_shift",
    "exp_decay_pieces",
    "growing_bursts",
    "laid_over",
    "main",
    "on_off_pieces",
    "sawtooth_pieces",
    "staircase_pieces",
    "time_stretched",
]


def growing_bursts(
    duration_s: float,
    base_rps: float,
    factors: tuple[float, ...],
    period_s: float,
    burst_s: float,
    lengths: Lengths,
) -> list[Piece]:
    """``base_rps``, and from ``period_s`` on a ``burst_s`` burst every ``period_s`` at ``factors[i]`` × base
    (the i-th burst; the last factor repeats if the trace outlasts the list)."""
    pieces: list[Piece] = []
    t, i = 0.0, 0
    while t < duration_s:
        gap = min(period_s - burst_s if i else period_s, duration_s - t)
        pieces.append(Piece(gap, base_rps, lengths))
        t += gap
        if t >= duration_s:
            break
        on = min(burst_s, duration_s - t)
        pieces.append(Piece(on, base_rps * factors[min(i, len(factors) - 1)], lengths))
        t += on
        i += 1
    return [p for p in pieces if p.duration_s > 0]


def sawtooth_pieces(
    teeth: int, tooth_s: float, low_rps: float, high_rps: float, step_s: float, lengths: Lengths
) -> list[Piece]:
    """``teeth`` teeth of ``tooth_s``: each a linear rise ``low_rps`` -> ``high_rps`` in steps of ``step_s``,
    then back to ``low_rps`` at once (the next tooth's first step)."""
    k = max(1, round(tooth_s / step_s))
    rise = [low_rps + (high_rps - low_rps) * j / (k - 1) if k > 1 else high_rps for j in range(k)]
    return [Piece(tooth_s / k, float(r), lengths) for _ in range(teeth) for r in rise]


def staircase_pieces(
    levels: tuple[float, ...], plateau_s: float, ramp_s: float, step_s: float, lengths: Lengths
) -> list[Piece]:
    """A plateau of ``plateau_s`` at each level, consecutive levels joined by a linear ramp of ``ramp_s``."""
    pieces: list[Piece] = []
    for i, level in enumerate(levels):
        if i:
            pieces += linear_pieces(levels[i - 1], level, ramp_s, step_s, lengths)
        pieces.append(Piece(plateau_s, level, lengths))
    return pieces


def exp_decay_pieces(
    start_rps: float, end_rps: float, duration_s: float, step_s: float, lengths: Lengths
) -> list[Piece]:
    """An exponential decay from ``start_rps`` to ``end_rps`` over ``duration_s`` (each step's rate the curve at
    its middle)."""
    k = max(1, round(duration_s / step_s))
    mids = (np.arange(k) + 0.5) / k
    rates = start_rps * (end_rps / start_rps) ** mids
    return [Piece(duration_s / k, float(r), lengths) for r in rates]


def on_off_pieces(
    duration_s: float, on_s: float, off_s: float, on_rps: float, off_rps: float, lengths: Lengths
) -> list[Piece]:
    """``on_s`` at ``on_rps``, ``off_s`` at ``off_rps``, repeated for ``duration_s`` (starting on)."""
    pieces: list[Piece] = []
    t, on = 0.0, True
    while t < duration_s:
        d = min(on_s if on else off_s, duration_s - t)
        pieces.append(Piece(d, on_rps if on else off_rps, lengths))
        t += d
        on = not on
    return pieces


def class_shift(
    duration_s: float,
    rate_rps: float,
    share: tuple[float, float],
    step_s: float,
    base: Lengths,
    other: Lengths,
    seed: int,
) -> Trace:
    """``rate_rps`` in total; the ``other`` class's share of requests moves linearly from ``share[0]`` to
    ``share[1]`` over ``duration_s`` (in steps of ``step_s``), the ``base`` class takes the rest."""
    k = max(1, round(duration_s / step_s))
    mids = share[0] + (share[1] - share[0]) * (np.arange(k) + 0.5) / k
    d = duration_s / k
    return merge(
        pieces_trace([Piece(d, rate_rps * (1.0 - s), base) for s in mids], seed),
        pieces_trace([Piece(d, rate_rps * s, other) for s in mids], seed + 1),
    )


def time_stretched(trace: Trace, factor: float) -> Trace:
    """``trace`` played ``factor`` times slower (every arrival time × ``factor``; lengths kept)."""
    return replace(trace, arrival_s=trace.arrival_s * factor, line=None)


def laid_over(first: Trace, second: Trace, offset_s: float) -> Trace:
    """``first`` and ``second`` on one clock, ``second`` starting ``offset_s`` later."""
    return merge(first, replace(second, arrival_s=second.arrival_s - second.arrival_s[0] + offset_s))


def build(seed: int = 0) -> dict[str, tuple[str, Trace]]:
    """Every shape: name -> (description, trace)."""
    chat = Lengths(1_200.0, 250.0)
    out: dict[str, tuple[str, Trace]] = {}
    out["s14_growing_bursts"] = (
        "2 req/s, a 40-s burst every 240 s at x2, x3, ... x8 (each taller than any before)",
        pieces_trace(
            growing_bursts(1920.0, 2.0, (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0), 240.0, 40.0, chat), seed + 1
        ),
    )
    out["s14_sawtooth"] = (
        "six 5-min teeth: 1 -> 10 req/s linearly, then 1 at once",
        pieces_trace(sawtooth_pieces(6, 300.0, 1.0, 10.0, 15.0, chat), seed + 2),
    )
    out["s14_staircase_slow"] = (
        "4-min plateaus 2, 5, 9, 6, 12, 4 req/s joined by 2-min ramps",
        pieces_trace(staircase_pieces((2.0, 5.0, 9.0, 6.0, 12.0, 4.0), 240.0, 120.0, 10.0, chat), seed + 3),
    )
    out["s14_flash_after_quiet"] = (
        "20 min at 0.5 req/s, 6 min at 12 (x24 within a second), 4 min at 1",
        pieces_trace([Piece(1200.0, 0.5, chat), Piece(360.0, 12.0, chat), Piece(240.0, 1.0, chat)], seed + 4),
    )
    out["s14_decay_return"] = (
        "10 -> 0.1 req/s exponentially over 20 min, 3 min at 0.1, 7 min at 10 (within a second)",
        pieces_trace(
            [
                *exp_decay_pieces(10.0, 0.1, 1200.0, 30.0, chat),
                Piece(180.0, 0.1, chat),
                Piece(420.0, 10.0, chat),
            ],
            seed + 5,
        ),
    )
    out["s14_onoff_90s"] = (
        "30 min of 45 s at 10 req/s, 45 s at 1 req/s",
        pieces_trace(on_off_pieces(1800.0, 45.0, 45.0, 10.0, 1.0, chat), seed + 6),
    )
    out["s14_class_shift"] = (
        "4 req/s; long documents (8000/150) among chat (800/300) 0 -> 60 % of requests over 30 min",
        class_shift(1800.0, 4.0, (0.0, 0.6), 60.0, Lengths(800.0, 300.0), Lengths(8_000.0, 150.0), seed + 7),
    )
    code = read_trace(bundled(CODE_TRACE))
    conv = read_trace(bundled(CONV_TRACE))
    moon = read_trace(bundled(MOONCAKE_TRACE))
    out["s14_conv_plus_code"] = (
        "Azure conv with Azure code laid over it 300 s later",
        laid_over(conv, code, 300.0),
    )
    out["s14_code_half_speed"] = (
        "the first 1100 s of Azure code at half speed (times x2)",
        time_stretched(code.window(0.0, 1100.0), 2.0),
    )
    slow = thin(time_stretched(moon, 2.0), 0.5, seed + 8)
    out["s14_mooncake_slow_thin"] = (
        "Mooncake at half speed (times x2), thinned to 50 %, prompts / 8 (at most 8000)",
        replace(
            slow,
            prompt_tokens=np.minimum(slow.prompt_tokens // MOONCAKE_PROMPT_DIVISOR, FILE_POOL_MAX_PROMPT),
        ),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    return shapes_main(build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
