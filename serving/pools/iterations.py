"""Per-iteration engine timings from a vLLM server's log (``--enable-logging-iteration-details``).

With that flag vLLM logs one line per engine step::

    Iteration(12): 1 context requests, 900 context tokens, 0 generation requests, 0 generation tokens,
    iteration elapsed time: 41.07 ms, CPU KV cache usage: 0.1%

The elapsed time is measured inside the engine core around the step, so it excludes the HTTP, detokenising
and streaming work of the API server process, which on a shared CPU box is where most client-side noise
comes from. This is what a simulator's ``iteration_ms`` models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

ITERATION_FLAG = "--enable-logging-iteration-details"

_LINE = re.compile(
    r"Iteration\((?P<i>\d+)\): (?P<cr>\d+) context requests, (?P<ct>\d+) context tokens, "
    r"(?P<gr>\d+) generation requests, (?P<gt>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[0-9.]+) ms(?P<dummy> \(dummy\))?"
)

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Iterations:
    """Engine steps in log order (arrays aligned)."""

    index: IntArray
    ctx_requests: IntArray  # requests with prompt tokens in this step (prefill or a prefill chunk)
    ctx_tokens: IntArray  # prompt tokens computed in this step
    gen_requests: IntArray  # decoding requests in this step
    gen_tokens: IntArray
    elapsed_ms: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.index)


def parse_iterations(text: str) -> Iterations:
    """Every non-dummy ``Iteration(...)`` line of ``text`` (other lines are ignored)."""
    rows = [m for m in _LINE.finditer(text) if not m.group("dummy")]

    def col(key: str) -> IntArray:
        return np.array([int(m.group(key)) for m in rows], dtype=np.int64)

    return Iterations(
        index=col("i"),
        ctx_requests=col("cr"),
        ctx_tokens=col("ct"),
        gen_requests=col("gr"),
        gen_tokens=col("gt"),
        elapsed_ms=np.array([float(m.group("ms")) for m in rows], dtype=np.float64),
    )


class LogCursor:
    """Reads what a server appended to its log since the last ``read`` (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> str:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # leave a partial last line for the next read
        self.offset += end
        return data[:end].decode(errors="replace")
