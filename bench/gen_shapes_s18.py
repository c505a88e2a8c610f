"""Traffic shapes no earlier set had (session 18, issues 4 and 5): a fresh set nobody has tuned on, written as
Azure CSV files that ``bench/bench_policies.py --workloads file:PATH`` (and bench_misses.py, bench_decisions.py)
replay.

Same conventions as ``bench/gen_shapes_s11.py`` (``Lengths``, ``Piece``, ``pieces_trace``, ``merge``): Poisson
arrivals within each piece, lognormal lengths of round medians (sigma 0.7), seeded. None of these kinds is in
s9u's variants (``serving/workload/variants.py``), s11's, s14's or s14k's sets:

* ``s18_exp_growth``: 0.5 req/s doubling every 5 min (20-s steps) up to 16 req/s, then 8 min flat at 16 (viral
  growth: each minute ~15 % above the one before, no step);
* ``s18_batch_clumps``: 3 req/s of chat, and at random times (gaps 60 s + Exp(120 s)) a batch job that submits
  60-200 requests within 2 s (an offline evaluation run hitting the online pool);
* ``s18_random_walk``: a geometric random walk of the rate in 30-s steps (log sigma 0.15 per step, reflected at
  1 and 24 req/s), from 4 req/s (no shape at all, 30 min);
* ``s18_pareto_bursts``: 3 req/s with bursts at random times (gaps 90 s + Exp(120 s)), each 15-60 s long and of
  a heavy-tailed height: ×(1 + Pareto(1.5)), at most ×20;
* ``s18_reasoning_shift``: 3 req/s throughout, the share of reasoning requests (prompt 600 / output 3,000) among
  chat (1,000 / 200) growing 0 -> 50 % over 30 min (1-min pieces): flat requests, a decode load that grows ×6;
* ``s18_two_peak_day``: a day in 40 min: 1 req/s at night, a morning peak of 10 req/s and an evening peak of 14
  (two Gaussian humps, 10-s steps);
* ``s18_outage_retry``: 6 req/s; at 15 min nothing for 60 s (an upstream outage), then the retries: 18 req/s
  for 90 s falling linearly to 6 over 2 min, then 6 again;
* ``s18_long_doc_waves``: 2 req/s of chat (800 / 250) throughout, and every 5 min a 60-s wave of long documents
  at 1 req/s (prompt 6,000 / output 100): the prompt tokens burst ×4 while the requests rise by half;
* ``s18_code_double_speed``: the bundled Azure code trace at double speed (times / 2; twice the rate, bursts
  half as long) laid twice end to end (its second half 1 s after the first ends);
* ``s18_conv_reversed_x2``: the bundled Azure conv trace with time reversed, laid over itself once (jitter 60 s):
  twice conv's rate, its slow drift run backwards.

Run: ``.venv/bin/python bench/gen_shapes_s18.py --out DIR [--only NAME ...] [--seed N]``; prints one line per file
(requests, duration, mean rate, prompt/output medians).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gen_shapes_s11 import (  # noqa: E402
    Lengths,
    Piece,
    merge,
    pieces_trace,
    random_bursts,
    shapes_main,
    time_reversed,
)
from gen_shapes_s14 import exp_decay_pieces  # noqa: E402

from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from serving.workload.variants import CODE_TRACE, CONV_TRACE, bundled, superpose  # noqa: E402

__all__ = [
    "batch_clumps",
    "build",
    "exp_growth_pieces",
    "main",
    "mix_shift",
    "pareto_bursts",
    "random_walk_pieces",
    "two_peak_pieces",
]


def exp_growth_pieces(
    start_rps: float, end_rps: float, doubling_s: float, step_s: float, lengths: Lengths
) -> list[Piece]:
    """From ``start_rps`` doubling every ``doubling_s`` until ``end_rps`` (steps of ``step_s``, each at the curve's
    value at its middle): gen_shapes_s14's geometric ``exp_decay_pieces`` run upwards."""
    return exp_decay_pieces(start_rps, end_rps, doubling_s * np.log2(end_rps / start_rps), step_s, lengths)


def random_walk_pieces(
    duration_s: float,
    start_rps: float,
    step_s: float,
    sigma: float,
    bounds: tuple[float, float],
    lengths: Lengths,
    seed: int,
) -> list[Piece]:
    """A geometric random walk of the rate: each ``step_s`` piece's log rate moves by N(0, ``sigma``), reflected
    into ``bounds``."""
    rng = np.random.default_rng(seed)
    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    x = float(np.log(start_rps))
    pieces: list[Piece] = []
    for _ in range(max(1, round(duration_s / step_s))):
        pieces.append(Piece(step_s, float(np.exp(x)), lengths))
        x += float(rng.normal(0.0, sigma))
        x = 2 * hi - x if x > hi else (2 * lo - x if x < lo else x)
    return pieces


def pareto_bursts(
    duration_s: float,
    base_rps: float,
    burst_s: tuple[float, float],
    gap_min_s: float,
    gap_mean_s: float,
    alpha: float,
    max_factor: float,
    lengths: Lengths,
    seed: int,
) -> list[Piece]:
    """``base_rps`` with bursts at random times (gaps ``gap_min_s`` + Exp(``gap_mean_s``)), each U(``burst_s``)
    long at ×(1 + Pareto(``alpha``)) the base, at most ×``max_factor``; starts with a gap."""

    def factor(rng: np.random.Generator) -> float:
        return min(1.0 + float(rng.pareto(alpha)), max_factor)

    return random_bursts(duration_s, base_rps, factor, burst_s, gap_min_s, gap_mean_s, lengths, seed)


def batch_clumps(
    duration_s: float,
    base_rps: float,
    batch: tuple[int, int],
    within_s: float,
    gap_min_s: float,
    gap_mean_s: float,
    lengths: Lengths,
    batch_lengths: Lengths,
    seed: int,
) -> Trace:
    """``base_rps`` of Poisson traffic, plus batches of U(``batch``) requests each submitted within ``within_s``
    at random times (gaps ``gap_min_s`` + Exp(``gap_mean_s``), the first after one gap)."""
    rng = np.random.default_rng(seed)
    background = pieces_trace([Piece(duration_s, base_rps, lengths)], seed + 1000)
    parts = [background]
    t = gap_min_s + rng.exponential(gap_mean_s)
    while t < duration_s - within_s:
        n = int(rng.integers(batch[0], batch[1] + 1))
        arrivals = t + np.sort(rng.uniform(0.0, within_s, n))
        prompt, output = batch_lengths.draw(n, rng)
        parts.append(Trace.from_arrays(arrivals, prompt, output))
        t += within_s + gap_min_s + rng.exponential(gap_mean_s)
    return merge(*parts)


def mix_shift(
    duration_s: float,
    rate_rps: float,
    share: tuple[float, float],
    piece_s: float,
    base: Lengths,
    other: Lengths,
    seed: int,
) -> Trace:
    """``rate_rps`` throughout; the share of ``other`` among ``base`` requests moving linearly from ``share[0]``
    to ``share[1]`` (one share per ``piece_s`` piece)."""
    k = max(1, round(duration_s / piece_s))
    shares = share[0] + (share[1] - share[0]) * (np.arange(k) + 0.5) / k
    d = duration_s / k
    first = pieces_trace([Piece(d, rate_rps * (1 - s), base) for s in shares], seed)
    second = pieces_trace([Piece(d, rate_rps * s, other) for s in shares], seed + 1)
    return merge(first, second)


def two_peak_pieces(
    duration_s: float,
    night_rps: float,
    peaks: tuple[tuple[float, float, float], ...],
    step_s: float,
    lengths: Lengths,
) -> list[Piece]:
    """``night_rps`` plus Gaussian humps ``(centre_s, height_rps, width_s)`` (height above the night rate), as
    steps of ``step_s``."""
    k = max(1, round(duration_s / step_s))
    mids = (np.arange(k) + 0.5) * (duration_s / k)
    rate = np.full(k, night_rps)
    for centre, height, width in peaks:
        rate += height * np.exp(-0.5 * ((mids - centre) / width) ** 2)
    return [Piece(duration_s / k, float(r), lengths) for r in rate]


def _end_to_end(first: Trace, second: Trace, gap_s: float) -> Trace:
    """``second`` starting ``gap_s`` after ``first``'s last arrival."""
    shift = float(first.arrival_s[-1] - second.arrival_s[0]) + gap_s
    return merge(
        first, Trace.from_arrays(second.arrival_s + shift, second.prompt_tokens, second.output_tokens)
    )


def build(seed: int = 0) -> dict[str, tuple[str, Trace]]:
    """Every shape: name -> (description, trace)."""
    chat = Lengths(1_200.0, 250.0)
    out: dict[str, tuple[str, Trace]] = {}
    out["s18_exp_growth"] = (
        "0.5 req/s doubling every 5 min to 16 req/s, then 8 min at 16",
        pieces_trace([*exp_growth_pieces(0.5, 16.0, 300.0, 20.0, chat), Piece(480.0, 16.0, chat)], seed + 1),
    )
    out["s18_batch_clumps"] = (
        "3 req/s chat; batch jobs of 60-200 requests within 2 s, gaps 60 s + Exp(120 s)",
        batch_clumps(1800.0, 3.0, (60, 200), 2.0, 60.0, 120.0, chat, Lengths(600.0, 150.0), seed + 2),
    )
    out["s18_random_walk"] = (
        "geometric random walk of the rate, 30-s steps, log sigma 0.15, within 1-24 req/s, from 4",
        pieces_trace(random_walk_pieces(1800.0, 4.0, 30.0, 0.15, (1.0, 24.0), chat, seed + 3), seed + 4),
    )
    out["s18_pareto_bursts"] = (
        "3 req/s; 15-60 s bursts of x(1 + Pareto(1.5)) (at most x20), gaps 90 s + Exp(120 s)",
        pieces_trace(
            pareto_bursts(1800.0, 3.0, (15.0, 60.0), 90.0, 120.0, 1.5, 20.0, chat, seed + 5), seed + 6
        ),
    )
    out["s18_reasoning_shift"] = (
        "3 req/s; reasoning requests (600/3000) among chat (1000/200) 0 -> 50 % over 30 min",
        mix_shift(1800.0, 3.0, (0.0, 0.5), 60.0, Lengths(1_000.0, 200.0), Lengths(600.0, 3_000.0), seed + 7),
    )
    out["s18_two_peak_day"] = (
        "a day in 40 min: 1 req/s at night, peaks of 10 req/s (12 min) and 14 req/s (30 min)",
        pieces_trace(
            two_peak_pieces(2400.0, 1.0, ((720.0, 9.0, 180.0), (1800.0, 13.0, 150.0)), 10.0, chat), seed + 8
        ),
    )
    retry = [
        Piece(900.0, 6.0, chat),
        Piece(60.0, 0.0, chat),
        Piece(90.0, 18.0, chat),
        *[Piece(10.0, 18.0 - 12.0 * (j + 0.5) / 12, chat) for j in range(12)],
        Piece(630.0, 6.0, chat),
    ]
    out["s18_outage_retry"] = (
        "6 req/s; at 15 min 60 s of nothing, then retries at 18 req/s for 90 s, back to 6 over 2 min",
        pieces_trace(retry, seed + 9),
    )
    waves: list[Piece] = []
    for _ in range(6):
        waves += [Piece(240.0, 0.0, chat), Piece(60.0, 1.0, Lengths(6_000.0, 100.0))]
    out["s18_long_doc_waves"] = (
        "2 req/s chat (800/250); every 5 min a 60-s wave of long documents (6000/100) at 1 req/s",
        merge(
            pieces_trace([Piece(1800.0, 2.0, Lengths(800.0, 250.0))], seed + 10),
            pieces_trace(waves, seed + 11),
        ),
    )
    code = read_trace(bundled(CODE_TRACE))
    fast = Trace.from_arrays(code.arrival_s / 2.0, code.prompt_tokens, code.output_tokens)
    out["s18_code_double_speed"] = (
        "Azure code at double speed (times / 2), played twice end to end",
        _end_to_end(fast, fast, 1.0),
    )
    conv = read_trace(bundled(CONV_TRACE))
    out["s18_conv_reversed_x2"] = (
        "Azure conv with time reversed, laid over itself once (jitter 60 s)",
        superpose(time_reversed(conv), 2, 60.0, seed + 12),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    return shapes_main(build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
