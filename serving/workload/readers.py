"""Streaming trace readers: Azure LLM CSV, Mooncake JSONL and BurstGPT CSV into columnar ``Trace`` chunks.

Parsing is columnar: Azure CSV goes through pyarrow's streaming CSV reader (one thread, 1 MiB blocks)
and, from the first block holding anything it does not accept, through pandas' C parser, which is exact
about what is wrong; BurstGPT CSV goes through pandas, Mooncake JSONL through pyarrow's JSON reader, with
a line-by-line fallback for blocks it refuses. Validation is vectorised; only the first rejected row is
re-read as text to word the error. Nothing is dropped: a bad row is a ``TraceError``
naming the file and line (1-based, header = line 1). Blank lines are allowed only at the end of a file.

Ordering: a row may arrive up to ``max_reorder_s`` seconds earlier than the latest row before it; such
rows are stably re-sorted (one ``TraceWarning`` per file says how many). A larger step back is an error
that names the line (``max_reorder_s=inf`` sorts a file in any order). Duplicate timestamps are kept.

Tolerated as real files have them: a UTF-8 BOM, CRLF or LF line ends, trailing blank lines, CSV columns in
any order, extra CSV columns (ignored, one ``TraceWarning``), extra JSON fields (ignored). A last line cut
short (a truncated download) is an error naming that line, never silently dropped.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from serving.workload import formats as F
from serving.workload.chunks import RawChunk
from serving.workload.csv_parsers import azure_chunks, burstgpt_chunks
from serving.workload.errors import TraceError, TraceWarning
from serving.workload.jsonl_parser import mooncake_chunks
from serving.workload.trace import Trace, concat_traces

DEFAULT_CHUNK_ROWS = 250_000
DEFAULT_MAX_REORDER_S = 1.0
# no trace spans this long (31.7 years); past it times are in the wrong unit, and seconds past 9.2e9 do not
# even fit the simulator's int64 nanoseconds
MAX_SPAN_S = 1e9
TIME_UNIT = {F.AZURE: "a date-time", F.MOONCAKE: "milliseconds", F.BURSTGPT: "seconds"}

_PARSERS = {F.AZURE: azure_chunks, F.MOONCAKE: mooncake_chunks, F.BURSTGPT: burstgpt_chunks}


def _sorted_tail(carry: Trace | None, new: Trace) -> Trace:
    both = new if carry is None else concat_traces([carry, new])
    t = both.arrival_s
    if len(t) > 1 and bool(np.any(t[1:] < t[:-1])):
        both = both.take(np.argsort(t, kind="stable"))
    return both


def _in_order(raws: Iterator[RawChunk], path: Path, fmt: str, max_reorder_s: float) -> Iterator[Trace]:
    """Check ordering, stably re-sort rows within ``max_reorder_s``, rebase times on the first arrival.

    A row can only be emitted once no later row can precede it: every later row is at least
    (latest time so far − max_reorder_s), so rows before that bound are final.
    """
    latest = -math.inf
    carry: Trace | None = None
    base: float | None = None
    origin: pd.Timestamp | None = None
    moved, first_moved, worst_back = 0, 0, 0.0
    header = [] if fmt == F.MOONCAKE else F.csv_header(path, fmt, F.CSV_COLUMNS[fmt])

    def emit(rows: Trace) -> Trace:
        nonlocal base
        if base is None:
            base = float(rows.arrival_s[0])
        start = None if origin is None else origin + pd.Timedelta(round(base * 1e9), unit="ns")
        return replace(rows, arrival_s=rows.arrival_s - base, start_time=start, source=str(path), format=fmt)

    def time_error(line: int, what: str, advice: str) -> TraceError:
        value = F.time_field_text(fmt, header, F.raw_line(path, line))
        return TraceError(path, line, f"{what} (column {F.TIME_COLUMN[fmt]} = {value!r}){advice}")

    first = math.inf
    for raw in raws:
        t = raw.time_s
        origin = raw.origin if origin is None else origin
        first = min(first, float(t.min())) if len(t) else first
        beyond = t - first > MAX_SPAN_S
        if beyond.any():
            i = int(np.argmax(beyond))
            raise time_error(
                raw.first_line + i,
                f"arrival {t[i] - first:.6g} s after the first row's, more than {MAX_SPAN_S:.0e} s "
                f"({MAX_SPAN_S / F.SECONDS_PER_YEAR:.0f} years)",
                f": not a time in this format's unit ({TIME_UNIT[fmt]}); check the column's unit",
            )
        before = np.maximum.accumulate(np.concatenate(([latest], t[:-1])))
        back = before - t
        too_far = back > max_reorder_s
        if too_far.any():
            i = int(np.argmax(too_far))
            raise time_error(
                raw.first_line + i,
                f"arrival goes back {back[i]:.6g} s before an earlier row, more than max_reorder_s = "
                f"{max_reorder_s:g} s",
                "; sort the file by time, or read it with a larger max_reorder_s (inf reads rows in any order: "
                "pdscale replay/bench --max-reorder-s inf)",
            )
        behind = back > 0
        if behind.any():
            first_moved = first_moved or raw.first_line + int(np.argmax(behind))
            moved += int(behind.sum())
            worst_back = max(worst_back, float(back.max()))
        latest = max(latest, float(t.max()))
        rows = _sorted_tail(carry, raw.as_trace())
        cut = int(np.searchsorted(rows.arrival_s, latest - max_reorder_s, side="left"))
        carry = rows.take(slice(cut, None))
        if cut:
            yield emit(rows.take(slice(0, cut)))
    if carry is not None and len(carry):
        yield emit(carry)
    if moved:
        msg = (
            f"{moved} rows arrived up to {worst_back:.6g} s before an earlier row (within max_reorder_s = "
            f"{max_reorder_s:g} s); they were stably re-sorted by time"
        )
        warnings.warn(TraceWarning(path, first_moved, moved, msg), stacklevel=2)


def iter_trace_chunks(
    path: str | Path,
    fmt: str | None = None,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    max_reorder_s: float = DEFAULT_MAX_REORDER_S,
) -> Iterator[Trace]:
    """Read a trace file as a stream of ``Trace`` chunks of about ``chunk_rows`` rows, in arrival order.

    ``fmt`` is one of ``azure``, ``mooncake``, ``burstgpt``; None detects it from the first line.
    ``arrival_s`` counts from the file's first arrival (0.0) in every chunk; ``start_time`` is that
    arrival's wall-clock time (Azure: a ``pd.Timestamp`` with the file's full ns precision) or None.
    Rows going back in time by at most ``max_reorder_s`` are stably re-sorted (a ``TraceWarning`` says
    how many); further back is a ``TraceError``, as is any malformed row. ``max_reorder_s=inf`` accepts
    rows in any order, at the cost of holding the whole file before the first chunk comes out.

    Example: ``sum(len(c) for c in iter_trace_chunks("big.csv", chunk_rows=500_000))``
    """
    p = Path(path)
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if not max_reorder_s >= 0:  # NaN fails too
        raise ValueError(f"max_reorder_s must be a number >= 0 (inf: any order), got {max_reorder_s}")
    chosen = detect_format(p) if fmt is None else F.check_format(fmt)
    try:
        yield from _in_order(_PARSERS[chosen](p, chunk_rows), p, chosen, max_reorder_s)
    except TraceError as e:
        if e.line is not None and _cut_short_at(p) == e.line:
            raise TraceError(p, e.line, f"{e.message}; this last line has no line end: the file looks "
                             "truncated (cut during a download or copy?)") from None  # fmt: skip
        raise


def _cut_short_at(path: Path) -> int | None:
    """The number of the last line when the file does not end with a line end, else None (error path)."""
    with path.open("rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return None
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return None
        f.seek(0)
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b"")) + 1


def read_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    max_reorder_s: float = DEFAULT_MAX_REORDER_S,
) -> Trace:
    """Read a whole trace file into one ``Trace`` (see :func:`iter_trace_chunks` for the rules).

    Example: ``read_trace("datasets/mooncake/synthetic_trace.jsonl").duration_s``  # 1022.025
    """
    return concat_traces(
        list(iter_trace_chunks(path, fmt, chunk_rows=chunk_rows, max_reorder_s=max_reorder_s))
    )


detect_format = F.detect_format
