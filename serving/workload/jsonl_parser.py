"""Mooncake JSONL parser: pyarrow's JSON reader per block of lines, line by line where it refuses."""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from serving.workload import formats as F
from serving.workload.chunks import RawChunk, blank_then_text
from serving.workload.errors import TraceError, TraceWarning

# more than this many records per second on average (and at least SECONDS_SUSPECT_MIN_ROWS of them): the
# timestamps are probably seconds, not Mooncake's milliseconds; a warning says so
SECONDS_SUSPECT_RPS = 1000.0
SECONDS_SUSPECT_MIN_ROWS = 100

# a first timestamp this large is past the year 5000 in ms: epoch microseconds (now ~1.7e15) or nanoseconds
EPOCH_US_SUSPECT_MS = 1e14

_MOONCAKE_SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("input_length", pa.int64()),
        ("output_length", pa.int64()),
        ("hash_ids", pa.list_(pa.int64())),
    ]
)


def _mooncake_fast(lines: list[bytes]) -> tuple[np.ndarray, ...] | None:
    """Parse a block of JSONL lines with pyarrow; None when it cannot (then the slow path decides)."""
    data = b"".join(lines)
    try:
        table = pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
            parse_options=pajson.ParseOptions(
                explicit_schema=_MOONCAKE_SCHEMA, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(lines):
        return None
    cols = [table[name] for name in F.MOONCAKE_FIELDS]
    if any(c.null_count for c in cols):
        return None
    ts = cols[0].to_numpy()
    prompt = cols[1].to_numpy().astype(np.int64, copy=False)
    output = cols[2].to_numpy().astype(np.int64, copy=False)
    blocks = pc.fill_null(pc.list_value_length(table["hash_ids"]), -1).to_numpy().astype(np.int32)
    if not (np.isfinite(ts).all() and (ts >= 0).all() and (prompt >= 0).all() and (output >= 0).all()):
        return None
    return ts, prompt, output, blocks


def _mooncake_slow(path: Path, first_line: int, lines: list[bytes]) -> tuple[tuple[np.ndarray, ...], int]:
    """Line-by-line parse of a block the fast path refused: raises on the first bad line.

    Returns the arrays and the number of leading non-blank lines (the rest are trailing blanks).
    """
    texts = [raw.decode("utf-8", errors="replace").rstrip("\r\n") for raw in lines]
    nonblank = [i for i, t in enumerate(texts) if t.strip()]
    keep = nonblank[-1] + 1 if nonblank else 0
    for i, text in enumerate(texts[:keep]):
        if not text.strip():
            raise blank_then_text(path, first_line + i)
        problem = F.diagnose_line(F.MOONCAKE, [], text)
        if problem is not None:
            raise TraceError(path, first_line + i, problem)
    objs = [json.loads(t) for t in texts[:keep]]
    arrays = (
        np.array([o["timestamp"] for o in objs], dtype=np.float64),
        np.array([o["input_length"] for o in objs], dtype=np.int64),
        np.array([o["output_length"] for o in objs], dtype=np.int64),
        np.array([len(o["hash_ids"]) if o.get("hash_ids") is not None else -1 for o in objs], np.int32),
    )
    return arrays, keep


def mooncake_chunks(path: Path, chunk_rows: int) -> Iterator[RawChunk]:
    F.first_line(path)  # empty-file check
    line, rows, pending_blank = 1, 0, 0
    lo_ms, hi_ms = math.inf, -math.inf
    with path.open("rb") as f:
        while lines := list(islice(f, chunk_rows)):
            fast = _mooncake_fast(lines)
            if fast is not None:
                arrays, keep = fast, len(lines)
            else:
                arrays, keep = _mooncake_slow(path, line, lines)
            if pending_blank and keep:
                raise blank_then_text(path, pending_blank)
            if keep < len(lines):
                pending_blank = pending_blank or line + keep
            if keep:
                ts, prompt, output, blocks = arrays
                rows += keep
                lo_ms, hi_ms = min(lo_ms, float(ts.min())), max(hi_ms, float(ts.max()))
                yield RawChunk(line, ts / 1000.0, prompt, output, extra={"prefix_blocks": blocks})
            line += len(lines)
    if rows == 0:
        raise TraceError(path, None, "empty file: only blank lines, no records")
    if lo_ms >= EPOCH_US_SUSPECT_MS:
        F.warn_finer_unit(path, 1, rows, "timestamps start", lo_ms, lo_ms / 1000.0,
                          "they look like epoch microseconds (or nanoseconds), not Mooncake's milliseconds")  # fmt: skip
    span_s = (hi_ms - lo_ms) / 1000.0
    if rows >= SECONDS_SUSPECT_MIN_ROWS and rows > SECONDS_SUSPECT_RPS * span_s:
        msg = (
            f"{rows} records within {span_s:.6g} s ({rows / max(span_s, 1e-3):,.0f} req/s): Mooncake timestamps "
            f"are milliseconds; if this file's are seconds, multiply them by 1000 (read as written)"
        )
        warnings.warn(TraceWarning(path, 1, rows, msg), stacklevel=2)
