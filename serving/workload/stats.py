"""Summary statistics of a trace, computed in one streaming pass.

Binning convention (it reproduces every figure in datasets/*/PROVENANCE.md):

* Bins are aligned to the FIRST ARRIVAL, not to wall-clock seconds: a request arriving ``t`` seconds
  after the first one falls in 1-s bin ``floor(t)`` and in w-s bin ``floor(t) // w`` (integer w).
* The bins run from 0 to the bin holding the last arrival, inclusive: empty bins count, and the last,
  partial bin counts as a whole bin.
* ``peak_rate_rps_w`` = the largest count in a w-s bin divided by w.
* ``cv_5s`` = population standard deviation (ddof = 0) of the 5-s counts divided by their mean.
* ``duration_s`` = last arrival − first arrival; ``mean_rate_rps`` = requests / duration_s
  (NaN — unknown — when duration_s is 0, e.g. a single request).
* Token rates: tokens (prompt + output) per 5-s bin / 5, mean over the same bins and peak.
* Percentiles are numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

import numpy as np

from serving.workload.trace import Trace


@dataclass(frozen=True)
class TraceStats:
    """What ``pdscale trace stats`` reports; NaN means unknown (never 0 in disguise)."""

    format: str
    requests: int
    duration_s: float
    mean_rate_rps: float
    peak_rate_rps_1s: float
    peak_rate_rps_5s: float
    cv_5s: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    prompt_tokens_p50: float
    prompt_tokens_p99: float
    output_tokens_p50: float
    output_tokens_p99: float
    prompt_tokens_max: int
    output_tokens_max: int
    tokens_rate_mean_5s: float
    tokens_rate_peak_5s: float
    failed: int
    first_time: str | None
    last_time: str | None
    models: dict[str, int] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, object]:
        """A JSON-safe dict: NaN and infinities become None (null)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


MAX_SPAN_S = 1 << 23  # per-second bins held densely: 8.4M bins, 134 MB


class LengthSummary:
    """Exact mean, max and percentiles of non-negative token counts in O(max length) memory.

    Counts are kept as a histogram (one int64 per possible length) while the largest length is below
    ``HISTOGRAM_LIMIT``; past that the raw values are kept instead. Percentiles equal
    ``np.percentile(values, q)`` (linear interpolation) either way.
    """

    HISTOGRAM_LIMIT = 1 << 22

    def __init__(self) -> None:
        self.hist = np.zeros(0, dtype=np.int64)
        self.parts: list[np.ndarray] | None = None
        self.n = 0
        self.total = 0
        self.max = 0

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        self.n += len(values)
        self.total += int(values.sum())
        self.max = max(self.max, int(values.max()))
        if self.parts is None and self.max < self.HISTOGRAM_LIMIT:
            h = np.bincount(values, minlength=len(self.hist))
            if len(h) > len(self.hist):
                self.hist = np.concatenate([self.hist, np.zeros(len(h) - len(self.hist), np.int64)])
            self.hist += h
            return
        if self.parts is None:
            self.parts = [np.repeat(np.arange(len(self.hist)), self.hist)]
        self.parts.append(np.asarray(values))

    def percentile(self, q: float) -> float:
        if self.parts is not None:
            return float(np.percentile(np.concatenate(self.parts), q))
        pos = q / 100.0 * (self.n - 1)
        lo = math.floor(pos)
        cum = np.cumsum(self.hist)
        v_lo, v_hi = np.searchsorted(cum, [lo, min(lo + 1, self.n - 1)], side="right")
        return float(v_lo + (v_hi - v_lo) * (pos - lo))


class StatsAccumulator:
    """Per-second arrival and token counts, plus the length columns, fed chunk by chunk.

    All chunks must share one time base (first arrival = 0.0), as ``iter_trace_chunks`` yields them.
    """

    def __init__(self) -> None:
        self._counts = np.zeros(0, dtype=np.int64)
        self._prompt_tok = np.zeros(0, dtype=np.int64)
        self._output_tok = np.zeros(0, dtype=np.int64)
        self._prompt = LengthSummary()
        self._output = LengthSummary()
        self._models: dict[int, int] = {}
        self._model_names: tuple[str, ...] = ()
        self._failed = 0
        self._last_s = 0.0
        self._format = ""
        self._start: datetime | None = None

    def add(self, chunk: Trace) -> None:
        if len(chunk) == 0:
            return
        if self._prompt.n == 0:
            self._format, self._start = chunk.format, chunk.start_time
        sec = np.floor(chunk.arrival_s).astype(np.int64)
        if sec.min() < 0:
            raise ValueError("StatsAccumulator: arrival_s must be >= 0 (times from the first arrival)")
        size = int(sec.max()) + 1
        if size > MAX_SPAN_S:
            raise ValueError(
                f"a request arrives {float(chunk.arrival_s.max()):.6g} s after the first one; per-second "
                f"statistics stop at {MAX_SPAN_S} s (about 97 days): check the file's time column"
            )
        if size > len(self._counts):
            self._counts = np.concatenate([self._counts, np.zeros(size - len(self._counts), np.int64)])
            grow = np.zeros(size - len(self._prompt_tok), np.int64)
            self._prompt_tok = np.concatenate([self._prompt_tok, grow])
            self._output_tok = np.concatenate([self._output_tok, grow])
        self._counts += np.bincount(sec, minlength=len(self._counts))
        for acc, tok in ((self._prompt_tok, chunk.prompt_tokens), (self._output_tok, chunk.output_tokens)):
            acc += np.bincount(sec, weights=tok, minlength=len(acc)).astype(np.int64)
        self._prompt.add(chunk.prompt_tokens)
        self._output.add(chunk.output_tokens)
        self._failed += int(chunk.failed.sum())
        codes, n = np.unique(chunk.model[chunk.model >= 0], return_counts=True)
        for c, k in zip(codes.tolist(), n.tolist(), strict=True):
            self._models[c] = self._models.get(c, 0) + k
        self._model_names = chunk.model_names
        self._last_s = max(self._last_s, float(chunk.arrival_s.max()))

    def result(self) -> TraceStats:
        prompt, output = self._prompt, self._output
        n = prompt.n
        if n == 0:
            raise ValueError("no requests: statistics of an empty trace are undefined")
        counts5, tokens5 = _rebin(self._counts, 5), _rebin(self._prompt_tok + self._output_tok, 5)
        mean5 = float(counts5.mean())
        duration = self._last_s

        def when(offset_s: float) -> str | None:
            return None if self._start is None else str(self._start + timedelta(seconds=offset_s))

        return TraceStats(
            format=self._format,
            requests=n,
            duration_s=duration,
            mean_rate_rps=n / duration if duration > 0 else math.nan,
            peak_rate_rps_1s=float(self._counts.max()),
            peak_rate_rps_5s=float(counts5.max()) / 5.0,
            cv_5s=float(counts5.std()) / mean5,
            prompt_tokens_mean=prompt.total / n,
            output_tokens_mean=output.total / n,
            prompt_tokens_p50=prompt.percentile(50),
            prompt_tokens_p99=prompt.percentile(99),
            output_tokens_p50=output.percentile(50),
            output_tokens_p99=output.percentile(99),
            prompt_tokens_max=prompt.max,
            output_tokens_max=output.max,
            tokens_rate_mean_5s=float(tokens5.mean()) / 5.0,
            tokens_rate_peak_5s=float(tokens5.max()) / 5.0,
            failed=self._failed,
            first_time=when(0.0),
            last_time=when(duration),
            models={self._name(c): k for c, k in sorted(self._models.items())},
        )

    def _name(self, code: int) -> str:
        return self._model_names[code] if code < len(self._model_names) else f"model#{code}"

    def per_second(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrivals, prompt tokens and output tokens per 1-s bin from the first arrival, for plots."""
        return self._counts.copy(), self._prompt_tok.copy(), self._output_tok.copy()


def _rebin(per_second: np.ndarray, width: int) -> np.ndarray:
    """Sum 1-s bins into ``width``-s bins aligned to bin 0; a last partial bin is kept."""
    padded = np.zeros(-(-len(per_second) // width) * width, dtype=per_second.dtype)
    padded[: len(per_second)] = per_second
    binned: np.ndarray = padded.reshape(-1, width).sum(axis=1)
    return binned


def trace_stats(chunks: Trace | Iterable[Trace]) -> TraceStats:
    """Statistics of a trace or of the chunks of one (see the module docstring for the exact definitions).

    Example: ``trace_stats(iter_trace_chunks("datasets/mooncake/synthetic_trace.jsonl")).peak_rate_rps_1s``
    gives 13.0.
    """
    acc = StatsAccumulator()
    for chunk in [chunks] if isinstance(chunks, Trace) else chunks:
        acc.add(chunk)
    return acc.result()
