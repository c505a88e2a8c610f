"""Traffic shapes no earlier set had (session 11, issue 5): written as Azure CSV files that
``bench/bench_policies.py --workloads file:PATH`` (and bench_misses.py, bench_decisions.py) replay.

Each shape is 20-40 min, Poisson arrivals within each piece (or an overdispersed, gamma-mixed rate), lengths
drawn from lognormal distributions named here (round numbers, not fitted to any bundled trace) or, for the
generic transforms (time reversal, rate × 0.3 / × 3), from the bundled Azure traces themselves:

* ``s11_decline_rebound``: 12 -> 3 req/s over 15 min (1-min steps), 5 min at 3, back to 12 within 2 min, 8 min;
* ``s11_two_level_day``: 8-min plateaus at 3, 9, 4.5, 14, 3.5 req/s (abrupt changes × 3, ÷ 2, × 3.1, ÷ 4);
* ``s11_isl_regime``: 4 req/s throughout; prompts median 500 tokens for 15 min, then median 6,000;
* ``s11_osl_regime``: 4 req/s throughout; outputs median 100 tokens for 15 min, then median 1,500;
* ``s11_two_classes``: chat (2.5 req/s, prompt 300 / output 700) and summarise (1 req/s, prompt 7,000 /
  output 60) interleaved; the summarise class doubles to 2 req/s for the last 10 of 30 min;
* ``s11_very_low``: 30 min, rates 0.05-0.3 req/s in 5-min pieces (a GPU-s floor of 1 + 1 instance);
* ``s11_overdispersed``: 30 min, mean 6 req/s, each 10-s bin's rate Gamma(shape 1.5) around it (no trend);
* ``s11_burst_train_jitter``: 30 min at 2 req/s, bursts × 6 of 20-60 s, gaps 60 s + Exp(150 s) (not periodic);
* ``s11_code_reversed``: the bundled Azure code trace with time reversed (the last request first);
* ``s11_code_x0.3``, ``s11_conv_x3``: Azure code thinned to 30 %, Azure conv laid over itself three times.

Run: ``.venv/bin/python bench/gen_shapes_s11.py --out DIR [--only NAME ...]``; prints one line per file
(requests, duration, mean rate, prompt/output medians).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.workload import formats as F  # noqa: E402
from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.synthetic import LengthDist  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from serving.workload.variants import CODE_TRACE, CONV_TRACE, bundled, superpose, thin  # noqa: E402
from serving.workload.writers import write_trace  # noqa: E402

CONTEXT_TOKENS = 131_072  # llama3-8b/a100's max_model_len


@dataclass(frozen=True)
class Lengths:
    """Lognormal prompt and output lengths: medians and log-space sigmas, capped to [1, max]."""

    prompt_median: float
    output_median: float
    sigma: float = 0.7
    prompt_max: int = 32_000
    output_max: int = 4_000

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` prompt lengths, then ``n`` output lengths (the workload generator's ``LengthDist``)."""
        prompt = LengthDist(median_tokens=self.prompt_median, sigma=self.sigma, max_tokens=self.prompt_max)
        output = LengthDist(median_tokens=self.output_median, sigma=self.sigma, max_tokens=self.output_max)
        return prompt.sample(rng, n), output.sample(rng, n)


@dataclass(frozen=True)
class Piece:
    """``duration_s`` seconds at ``rate_rps`` (Poisson), lengths from ``lengths``."""

    duration_s: float
    rate_rps: float
    lengths: Lengths


def pieces_trace(pieces: list[Piece], seed: int) -> Trace:
    """The pieces one after the other: Poisson arrivals at each piece's rate, its own lengths."""
    rng = np.random.default_rng(seed)
    ts, ps, os_ = [], [], []
    t0 = 0.0
    for piece in pieces:
        n = int(rng.poisson(piece.rate_rps * piece.duration_s))
        ts.append(t0 + np.sort(rng.uniform(0.0, piece.duration_s, n)))
        p, o = piece.lengths.draw(n, rng)
        ps.append(p)
        os_.append(o)
        t0 += piece.duration_s
    return Trace.from_arrays(np.concatenate(ts), np.concatenate(ps), np.concatenate(os_))


def merge(*traces: Trace) -> Trace:
    """Several traces' requests on one clock, in arrival order (classes of traffic interleaved)."""
    t = np.concatenate([tr.arrival_s for tr in traces])
    order = np.argsort(t, kind="stable")
    return Trace.from_arrays(
        t[order],
        np.concatenate([tr.prompt_tokens for tr in traces])[order],
        np.concatenate([tr.output_tokens for tr in traces])[order],
    )


def linear_pieces(
    start_rps: float, end_rps: float, duration_s: float, step_s: float, lengths: Lengths
) -> list[Piece]:
    """A linear change from ``start_rps`` to ``end_rps`` over ``duration_s``, as steps of ``step_s``."""
    k = max(1, round(duration_s / step_s))
    mids = start_rps + (end_rps - start_rps) * (np.arange(k) + 0.5) / k
    return [Piece(duration_s / k, float(r), lengths) for r in mids]


def overdispersed_pieces(
    duration_s: float, mean_rps: float, bin_s: float, shape: float, lengths: Lengths, seed: int
) -> list[Piece]:
    """Bins of ``bin_s`` whose rates are Gamma(``shape``, mean ``mean_rps``): counts overdispersed against a
    Poisson of the same mean (variance/mean = 1 + mean·bin/shape), no trend."""
    rng = np.random.default_rng(seed)
    k = max(1, round(duration_s / bin_s))
    rates = rng.gamma(shape, mean_rps / shape, k)
    return [Piece(duration_s / k, float(r), lengths) for r in rates]


def jittered_bursts(
    duration_s: float,
    base_rps: float,
    factor: float,
    burst_s: tuple[float, float],
    gap_min_s: float,
    gap_mean_s: float,
    lengths: Lengths,
    seed: int,
) -> list[Piece]:
    """``base_rps`` with bursts of ``factor`` × base lasting U(burst_s); between bursts gap_min_s + Exp(gap_mean_s)
    seconds (no period); starts with a gap."""
    return random_bursts(
        duration_s, base_rps, lambda _: factor, burst_s, gap_min_s, gap_mean_s, lengths, seed
    )


def random_bursts(
    duration_s: float,
    base_rps: float,
    factor: Callable[[np.random.Generator], float],
    burst_s: tuple[float, float],
    gap_min_s: float,
    gap_mean_s: float,
    lengths: Lengths,
    seed: int,
) -> list[Piece]:
    """``jittered_bursts`` with each burst's factor drawn by ``factor(rng)`` after its length (a constant draws
    nothing, so ``jittered_bursts`` keeps its requests)."""
    rng = np.random.default_rng(seed)
    pieces: list[Piece] = []
    t = 0.0
    while t < duration_s:
        gap = min(gap_min_s + rng.exponential(gap_mean_s), duration_s - t)
        pieces.append(Piece(gap, base_rps, lengths))
        t += gap
        if t >= duration_s:
            break
        on = min(rng.uniform(*burst_s), duration_s - t)
        pieces.append(Piece(on, base_rps * factor(rng), lengths))
        t += on
    return [p for p in pieces if p.duration_s > 0]


def time_reversed(trace: Trace) -> Trace:
    """The trace played backwards: the last arrival at 0, each request keeping its lengths."""
    t = float(trace.arrival_s[-1]) - trace.arrival_s[::-1]
    return replace(
        Trace.from_arrays(t, trace.prompt_tokens[::-1].copy(), trace.output_tokens[::-1].copy()),
        start_time=trace.start_time,
    )


def build(seed: int = 0) -> dict[str, tuple[str, Trace]]:
    """Every shape: name -> (description, trace)."""
    chat = Lengths(1_200.0, 250.0)
    out: dict[str, tuple[str, Trace]] = {}
    out["s11_decline_rebound"] = (
        "12 -> 3 req/s over 15 min, 5 min at 3, back to 12 in 2 min, 8 min at 12",
        pieces_trace(
            [
                *linear_pieces(12.0, 3.0, 900.0, 60.0, chat),
                Piece(300.0, 3.0, chat),
                *linear_pieces(3.0, 12.0, 120.0, 30.0, chat),
                Piece(480.0, 12.0, chat),
            ],
            seed + 1,
        ),
    )
    out["s11_two_level_day"] = (
        "8-min plateaus 3, 9, 4.5, 14, 3.5 req/s",
        pieces_trace([Piece(480.0, r, chat) for r in (3.0, 9.0, 4.5, 14.0, 3.5)], seed + 2),
    )
    out["s11_isl_regime"] = (
        "4 req/s; prompt median 500 for 15 min, then 6000",
        pieces_trace(
            [Piece(900.0, 4.0, Lengths(500.0, 200.0)), Piece(900.0, 4.0, Lengths(6_000.0, 200.0))], seed + 3
        ),
    )
    out["s11_osl_regime"] = (
        "4 req/s; output median 100 for 15 min, then 1500",
        pieces_trace(
            [Piece(900.0, 4.0, Lengths(1_000.0, 100.0)), Piece(900.0, 4.0, Lengths(1_000.0, 1_500.0))],
            seed + 4,
        ),
    )
    talk, summ = Lengths(300.0, 700.0), Lengths(7_000.0, 60.0)
    out["s11_two_classes"] = (
        "chat 2.5 req/s (300/700) + summarise 1 req/s (7000/60), summarise 2 req/s for the last 10 min",
        merge(
            pieces_trace([Piece(1800.0, 2.5, talk)], seed + 5),
            pieces_trace([Piece(1200.0, 1.0, summ), Piece(600.0, 2.0, summ)], seed + 6),
        ),
    )
    out["s11_very_low"] = (
        "30 min at 0.05-0.3 req/s (5-min pieces)",
        pieces_trace([Piece(300.0, r, chat) for r in (0.1, 0.3, 0.05, 0.2, 0.08, 0.25)], seed + 7),
    )
    out["s11_overdispersed"] = (
        "30 min, mean 6 req/s, 10-s bins' rates Gamma(1.5)",
        pieces_trace(overdispersed_pieces(1800.0, 6.0, 10.0, 1.5, chat, seed + 8), seed + 9),
    )
    out["s11_burst_train_jitter"] = (
        "30 min at 2 req/s, bursts x6 of 20-60 s, gaps 60 s + Exp(150 s)",
        pieces_trace(
            jittered_bursts(1800.0, 2.0, 6.0, (20.0, 60.0), 60.0, 150.0, chat, seed + 10), seed + 11
        ),
    )
    code = read_trace(bundled(CODE_TRACE))
    conv = read_trace(bundled(CONV_TRACE))
    out["s11_code_reversed"] = ("Azure code, time reversed", time_reversed(code))
    out["s11_code_x0.3"] = ("Azure code thinned to 30 %", thin(code, 0.3, seed + 12))
    out["s11_conv_x3"] = (
        "Azure conv laid over itself 3 times (jitter 60 s)",
        superpose(conv, 3, 60.0, seed + 13),
    )
    return out


def shapes_main(
    build_fn: Callable[[int], dict[str, tuple[str, Trace]]], doc: str | None, argv: list[str] | None
) -> int:
    """The command line every shape generator shares: ``--out DIR [--only NAME ...] [--seed N]``; writes each
    shape of ``build_fn(seed)`` as an Azure-format CSV and prints one line per file."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--only", nargs="*", default=None, help="write only these shapes (file names without .csv)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shapes = build_fn(args.seed)
    unknown = sorted(set(args.only or ()) - set(shapes))
    if unknown:
        ap.error(f"--only: unknown shape(s) {', '.join(unknown)}; known: {', '.join(shapes)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (desc, trace) in shapes.items():
        if args.only and name not in args.only:
            continue
        path = args.out / f"{name}.csv"
        write_trace(trace, path, F.AZURE)
        dur = float(trace.arrival_s[-1])
        print(
            f"{path}  {len(trace):>6} req  {dur:7.0f} s  {len(trace) / max(dur, 1.0):6.2f} req/s  "
            f"prompt p50 {np.median(trace.prompt_tokens):6.0f}  output p50 {np.median(trace.output_tokens):5.0f}  ({desc})"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return shapes_main(build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
