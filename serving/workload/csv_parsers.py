"""CSV trace parsers: Azure LLM inference (pyarrow fast path, exact pandas path) and BurstGPT (pandas).

Both read with quoting off (one record per line, so line numbers are exact) and blank lines kept, so that
a blank line inside the file is an error and trailing blank lines are allowed.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from serving.workload import formats as F
from serving.workload.chunks import RawChunk, blank_then_text, counts, error_at, first_bad_from, seconds
from serving.workload.errors import TraceError, TraceWarning


def _csv_frames(
    path: Path,
    fmt: str,
    header: list[str],
    dtypes: dict[str, str],
    chunk_rows: int,
    start_line: int = 2,
    rows_before: int = 0,
) -> Iterator[tuple[int, pd.DataFrame]]:
    """(first line, frame) per chunk from ``start_line`` on; trailing blank lines removed; tokenizer errors
    located by line. ``rows_before`` rows were already read (by a fast path) before ``start_line``."""
    line, rows, pending_blank = start_line, rows_before, 0
    with path.open("rb") as f:
        for _ in islice(f, start_line - 1):  # position after the header (and rows already read)
            pass
        reader = pd.read_csv(
            f,
            chunksize=chunk_rows,
            dtype=dtypes,
            skip_blank_lines=False,
            quoting=csv.QUOTE_NONE,
            encoding="utf-8",
            engine="c",
            names=header,
            header=None,
        )
        while True:
            try:
                df = next(reader)
            except StopIteration:
                break
            except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
                if isinstance(e, pd.errors.EmptyDataError):
                    break
                raise first_bad_from(path, fmt, header, line, str(e)) from None
            n = len(df)
            blank: np.ndarray = np.asarray(df.isna().to_numpy().all(axis=1))
            if pending_blank and not blank.all():
                raise blank_then_text(path, pending_blank)
            if blank.any():
                i = int(np.argmax(blank))
                if blank[i:].all():
                    pending_blank = pending_blank or line + i
                    df = df.iloc[:i]
            if len(df):
                rows += len(df)
                yield line, df
            line += n
    if pending_blank:  # all-empty rows at the end: only truly blank lines may stay
        for number, text in F.raw_lines(path, pending_blank):
            if text.strip():
                raise error_at(path, fmt, header, number)
    if rows == 0:
        raise TraceError(path, None, "has a header but no data rows: nothing to read")


# a first Timestamp this large is past the year 5000 in seconds: epoch milliseconds (now ~1.7e12) or finer
EPOCH_MS_SUSPECT_S = 1e11


class _FastPathStop(Exception):
    """The pyarrow fast path met something it does not judge; the pandas path takes over at ``line``."""

    def __init__(self, line: int, rows: int) -> None:
        super().__init__(line)
        self.line, self.rows = line, rows


# pyarrow reads ahead several blocks: small blocks keep that memory small (1 MiB is about 29k Azure rows);
# blocks are joined into chunks of about chunk_rows rows.
_AZURE_ROW_BYTES = 36
_AZURE_MAX_BLOCK_BYTES = 1 << 20


def _azure_arrow(
    path: Path, header: list[str], aware: bool, chunk_rows: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(first line, ns since epoch, prompt, output) per block, parsed by pyarrow on one thread.

    Any parse error, null, negative count or blank line stops it with ``_FastPathStop`` at the first line
    of the block, before that block is yielded; the exact pandas path then re-reads from there.
    """
    ts_type = pa.timestamp("ns", tz="UTC") if aware else pa.timestamp("ns")
    try:  # opening already parses the first block
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(
                use_threads=False,
                skip_rows=1,
                column_names=header,
                block_size=max(1 << 16, min(chunk_rows * _AZURE_ROW_BYTES, _AZURE_MAX_BLOCK_BYTES)),
            ),
            parse_options=pacsv.ParseOptions(quote_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={
                    "TIMESTAMP": ts_type,
                    "ContextTokens": pa.int64(),
                    "GeneratedTokens": pa.int64(),
                },
                include_columns=list(F.AZURE_COLUMNS),  # extra columns: tokenized, not converted
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        raise _FastPathStop(2, 0) from None
    line, rows = 2, 0  # first line and row count of what has been yielded so far
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pending_rows = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise _FastPathStop(line, rows) from None
        if batch.num_rows == 0:
            continue
        if any(batch.column(i).null_count for i in range(3)):
            raise _FastPathStop(line, rows)
        ns = pc.cast(batch.column(0), pa.int64()).to_numpy()  # include_columns order: AZURE_COLUMNS
        prompt = batch.column(1).to_numpy()
        output = batch.column(2).to_numpy()
        if (prompt < 0).any() or (output < 0).any():
            raise _FastPathStop(line, rows)
        pending.append((ns, prompt, output))
        pending_rows += batch.num_rows
        if pending_rows >= chunk_rows:
            yield _joined(line, pending)
            line, rows, pending, pending_rows = line + pending_rows, rows + pending_rows, [], 0
    if pending:
        yield _joined(line, pending)


def _joined(
    line: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    ns, prompt, output = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return line, ns, prompt, output


def _warn_extra(path: Path, header: list[str], expected: tuple[str, ...]) -> None:
    extra = F.extra_columns(header, expected)
    if extra:
        msg = f"columns {extra} are not part of the format and were ignored (used: {','.join(expected)})"
        warnings.warn(TraceWarning(path, 1, 0, msg), stacklevel=3)


def azure_chunks(path: Path, chunk_rows: int) -> Iterator[RawChunk]:
    header = F.csv_header(path, F.AZURE, F.AZURE_COLUMNS)
    _warn_extra(path, header, F.AZURE_COLUMNS)
    fields = F.raw_line(path, 2).split(",")
    first_time = fields[header.index("TIMESTAMP")] if len(fields) == len(header) else ""
    aware = any(c in first_time[19:] for c in "+-Z")  # a UTC offset after YYYY-MM-DD HH:MM:SS
    origin_ns: int | None = None

    def raw(line: int, ns: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> RawChunk:
        nonlocal origin_ns
        origin_ns = int(ns[0]) if origin_ns is None else origin_ns
        origin = pd.Timestamp(origin_ns, unit="ns", tz="UTC" if aware else None)
        return RawChunk(line, (ns - origin_ns) / 1e9, prompt, output, origin=origin)

    try:
        for line, ns, prompt, output in _azure_arrow(path, header, aware, chunk_rows):
            yield raw(line, ns, prompt, output)
        if origin_ns is None:
            raise TraceError(path, None, "has a header but no data rows: nothing to read")
        return
    except _FastPathStop as stop:
        start_line, rows_before = stop.line, stop.rows
    dtypes = {"TIMESTAMP": "str", **{c: "str" for c in F.extra_columns(header, F.AZURE_COLUMNS)}}
    for line, df in _csv_frames(path, F.AZURE, header, dtypes, chunk_rows, start_line, rows_before):
        ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", utc=True, errors="coerce").dt.as_unit("ns")
        prompt, bad_p = counts(df["ContextTokens"])
        output, bad_o = counts(df["GeneratedTokens"])
        bad = ts.isna().to_numpy() | bad_p | bad_o
        if bad.any():
            raise error_at(path, F.AZURE, header, line + int(np.argmax(bad)))
        yield raw(line, ts.to_numpy(dtype="datetime64[ns]").view(np.int64), prompt, output)


def burstgpt_chunks(path: Path, chunk_rows: int) -> Iterator[RawChunk]:
    header = F.csv_header(path, F.BURSTGPT, F.BURSTGPT_COLUMNS)
    _warn_extra(path, header, F.BURSTGPT_COLUMNS)
    names: list[str] = []
    mismatch, first_mismatch = 0, 0
    first_s, rows = math.inf, 0
    dtypes = {
        "Model": "str",
        "Log Type": "str",
        **{c: "str" for c in F.extra_columns(header, F.BURSTGPT_COLUMNS)},
    }
    for line, df in _csv_frames(path, F.BURSTGPT, header, dtypes, chunk_rows):
        t, bad = seconds(df["Timestamp"])
        prompt, bad_p = counts(df["Request tokens"])
        output, bad_o = counts(df["Response tokens"])
        total, bad_t = counts(df["Total tokens"])
        log_type = pd.Index(F.BURSTGPT_LOG_TYPES).get_indexer(pd.Index(df["Log Type"].fillna("")))
        model_text = df["Model"]
        bad |= bad_p | bad_o | bad_t | (log_type < 0) | model_text.isna().to_numpy()
        if bad.any():
            raise error_at(path, F.BURSTGPT, header, line + int(np.argmax(bad)))
        names.extend(m for m in pd.unique(model_text) if m not in names)
        codes = pd.Index(names).get_indexer(pd.Index(model_text)).astype(np.int16)
        off = total != prompt + output
        if off.any():
            first_mismatch = first_mismatch or line + int(np.argmax(off))
            mismatch += int(off.sum())
        first_s, rows = min(first_s, float(t.min())), rows + len(t)
        extra = {"log_type": log_type.astype(np.int8)}
        yield RawChunk(line, t, prompt, output, codes, output == 0, tuple(names), extra=extra)
    if first_s >= EPOCH_MS_SUSPECT_S:
        F.warn_finer_unit(path, 2, rows, "Timestamp starts", first_s, first_s,
                          "it looks like epoch milliseconds (or microseconds), not BurstGPT's seconds")  # fmt: skip
    if mismatch:
        msg = f"{mismatch} rows have Total tokens != Request tokens + Response tokens (kept as read)"
        warnings.warn(TraceWarning(path, first_mismatch, mismatch, msg), stacklevel=2)
