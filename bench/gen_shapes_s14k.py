"""A second output-length change, unlike s11's step (``bench/gen_shapes_s11.py``'s ``s11_osl_regime``), so a
rule made for that one file is checked on another: Azure-format CSVs of Poisson arrivals with lognormal lengths
(sigma 0.7, as gen_shapes_s11).

* ``s14k_osl_ramp``: 6 req/s throughout, prompt median 1,000; output median 200 for 10 min, then a gradual
  5-min ramp to 2,000 (30-s steps), 8 min at 2,000, then back to 200 at once for the last 7 min (30 min).
  The ramp's per-request growth is slow enough that each minute's mean output reads only ~1.5× the minute
  before (not a step), and the drop back checks that what lifts decode for a longer output also lets it go.

Run: ``.venv/bin/python bench/gen_shapes_s14k.py --out DIR``; prints one line per file (requests, duration,
mean rate, prompt/output medians).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gen_shapes_s11 import Lengths, Piece, pieces_trace, shapes_main  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402


def output_ramp(
    rate_rps: float, prompt_median: float, start: float, end: float, duration_s: float, step_s: float
) -> list[Piece]:
    """Output median from ``start`` to ``end`` over ``duration_s`` (geometric, as steps of ``step_s``), at
    ``rate_rps``: a length change with the arrivals unchanged."""
    k = max(1, round(duration_s / step_s))
    medians = start * (end / start) ** ((np.arange(k) + 0.5) / k)
    return [Piece(duration_s / k, rate_rps, Lengths(prompt_median, float(m))) for m in medians]


def build(seed: int = 0) -> dict[str, tuple[str, Trace]]:
    """Every shape: name -> (description, trace)."""
    rate, prompt = 6.0, 1_000.0
    short, long_ = Lengths(prompt, 200.0), Lengths(prompt, 2_000.0)
    pieces = [
        Piece(600.0, rate, short),
        *output_ramp(rate, prompt, 200.0, 2_000.0, 300.0, 30.0),
        Piece(480.0, rate, long_),
        Piece(420.0, rate, short),
    ]
    return {
        "s14k_osl_ramp": (
            "6 req/s; output median 200 for 10 min, ramp to 2000 over 5 min, 8 min at 2000, back to 200",
            pieces_trace(pieces, seed + 14),
        )
    }


def main(argv: list[str] | None = None) -> int:
    return shapes_main(build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
