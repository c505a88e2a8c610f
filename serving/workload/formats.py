"""The three trace formats: their columns, detection from the first line, and per-line diagnosis.

Diagnosis is the slow, exact path: readers validate whole chunks with numpy first and only call
:func:`diagnose_line` on the first row a vectorised check rejected, to word the error message.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

import pandas as pd

from serving.workload.errors import TraceError, TraceWarning

AZURE = "azure"
MOONCAKE = "mooncake"
BURSTGPT = "burstgpt"
FORMATS: tuple[str, ...] = (AZURE, MOONCAKE, BURSTGPT)

AZURE_COLUMNS: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS: tuple[str, ...] = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)
MOONCAKE_FIELDS: tuple[str, ...] = ("timestamp", "input_length", "output_length")  # hash_ids optional
CSV_COLUMNS = {AZURE: AZURE_COLUMNS, BURSTGPT: BURSTGPT_COLUMNS}
BURSTGPT_LOG_TYPES: tuple[str, ...] = ("Conversation log", "API log")

TIME_COLUMN = {AZURE: "TIMESTAMP", MOONCAKE: "timestamp", BURSTGPT: "Timestamp"}

FORMATS_HELP = (
    "known formats: 'azure' (CSV, header TIMESTAMP,ContextTokens,GeneratedTokens), "
    "'mooncake' (JSONL, one object per line with timestamp, input_length, output_length[, hash_ids]), "
    "'burstgpt' (CSV, header Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type); "
    "force one with fmt='azure' in Python or --format azure on the command line"
)


def check_format(fmt: str) -> str:
    """Return ``fmt`` if it names a known format, else raise ``ValueError`` listing them."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; {FORMATS_HELP}")
    return fmt


SECONDS_PER_YEAR = 3.156e7


def warn_finer_unit(
    path: Path, line: int, rows: int, what: str, first: float, first_s: float, finer: str
) -> None:
    """One ``TraceWarning``: the first time (``first`` as written, ``first_s`` seconds in the format's unit)
    looks like ``finer`` units (epoch ms/µs written where the format has s/ms): read as written."""
    years = first_s / SECONDS_PER_YEAR
    msg = (
        f"{what} at {first:.6g}: in this format's unit that is {years:,.0f} years after 1970; {finer}: divide "
        "by 1000 (or 1e6), or the trace replays 1000 (1e6) times slower (read as written)"
    )
    warnings.warn(TraceWarning(path, line, rows, msg), stacklevel=3)


def raw_lines(path: Path, start_line: int = 1) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending) from ``start_line`` on; the slow path for messages."""
    with path.open("rb") as f:
        for number, raw in enumerate(islice(f, start_line - 1, None), start=start_line):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def raw_line(path: Path, line: int) -> str:
    """The text of one line (1-based), or '' past the end of the file."""
    for _, text in raw_lines(path, line):
        return text
    return ""


_COMPRESSED: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"PK\x03\x04", "zip archive"),
)
_UNPACK = {
    "gzip-compressed": "gunzip -k",
    "bzip2-compressed": "bunzip2 -k",
    "xz-compressed": "unxz -k",
    "zstd-compressed": "unzstd",
    "zip archive": "unzip",
}


# UTF-32 first: its little-endian BOM starts with UTF-16's
_WIDE_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
    (b"\xff\xfe", "UTF-16 (little-endian)"),
    (b"\xfe\xff", "UTF-16 (big-endian)"),
)


def first_line(path: Path) -> str:
    """The first line of the file without BOM and line ending; raises ``TraceError`` if the file is empty."""
    try:
        with path.open("rb") as f:
            raw = f.readline(1 << 20)
    except FileNotFoundError:
        raise TraceError(path, None, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, None, "is a directory, not a trace file") from None
    packed = next((kind for magic, kind in _COMPRESSED if raw.startswith(magic)), None)
    if packed is not None:
        raise TraceError(
            path,
            None,
            f"is a {packed} file, not a trace: decompress it first ({_UNPACK[packed]} {path}) and pass "
            "the decompressed .csv / .jsonl",
        )
    encoding = next((name for bom, name in _WIDE_BOMS if raw.startswith(bom)), None)
    if encoding is None and b"\x00" in raw:
        encoding = "UTF-16 or UTF-32 (NUL bytes in its first line)"
    if encoding is not None:
        raise TraceError(
            path,
            1,
            f"is encoded as {encoding}, not UTF-8 (Excel's 'Unicode text' and PowerShell write that): convert "
            f"it first (iconv -f UTF-16 -t UTF-8 {path} > {path.stem}.utf8{path.suffix}) and pass the UTF-8 file",
        )
    text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff").rstrip("\r\n")
    if not text.strip():
        raise TraceError(
            path,
            None,
            f"empty file: no header or first record on line 1, so no trace to read ({FORMATS_HELP})",
        )
    return text


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its first line (CSV header or first JSON object).

    Raises ``TraceError`` for an empty file or a first line no format recognises; the message lists the
    formats and how to force one.
    """
    p = Path(path)
    line = first_line(p).strip()
    if line.startswith("{"):
        return MOONCAKE
    columns = {c.strip() for c in line.split(",")}
    if columns >= set(BURSTGPT_COLUMNS):  # extra columns are allowed (ignored, with a warning)
        return BURSTGPT
    if columns >= set(AZURE_COLUMNS):
        return AZURE
    shown = line if len(line) <= 120 else line[:117] + "..."
    _refuse_near_header(p, columns, shown)
    for fmt, expected in CSV_COLUMNS.items():  # a known header with columns missing: say which
        if TIME_COLUMN[fmt] in columns and len(columns & set(expected)) >= 2:
            missing = [c for c in expected if c not in columns]
            raise TraceError(
                p,
                1,
                f"the header looks like the {fmt!r} format but lacks column(s) {missing}: first line is "
                f"{shown!r}; the {fmt!r} format needs {','.join(expected)} (in any order; extra columns are "
                "ignored)",
            )
    raise TraceError(p, 1, f"unknown trace format: first line is {shown!r}; {FORMATS_HELP}")


def _refuse_near_header(path: Path, columns: set[str], shown: str) -> None:
    """A header that names a format's columns in quotes or in another case: say what differs (the readers
    match column names exactly and read CSV without quoting, one record per line)."""
    unquoted = {c.strip().strip('"').strip() for c in columns}
    lower = {c.lower(): c for c in unquoted}
    for fmt, expected in CSV_COLUMNS.items():
        if unquoted >= set(expected):
            raise TraceError(path, 1, f"the header names the {fmt!r} columns in double quotes ({shown!r}): "
                             "quoted CSV is not read (one unquoted record per line); remove the quotes, e.g. "
                             f"sed 's/\"//g' {path} > {path.stem}.unquoted{path.suffix}")  # fmt: skip
        if set(lower) >= {c.lower() for c in expected}:
            renames = [f"{lower[c.lower()]!r} -> {c!r}" for c in expected if lower[c.lower()] != c]
            raise TraceError(path, 1, f"the header names the {fmt!r} columns in another case: column names "
                             f"are case-sensitive; rename {', '.join(renames)} (first line is {shown!r})")  # fmt: skip


def csv_header(path: Path, fmt: str, expected: tuple[str, ...]) -> list[str]:
    """The header's column names in file order: every ``expected`` column (in any order), once each.

    Columns beyond ``expected`` are allowed (a trace exported with a region or status column): they are
    read as text and ignored; :func:`extra_columns` names them for a warning.
    """
    names = [c.strip() for c in first_line(path).split(",")]
    missing = [c for c in expected if c not in names]
    twice = sorted({c for c in names if names.count(c) > 1})
    if missing or twice:
        raise TraceError(
            path,
            1,
            f"header does not match the {fmt!r} format: missing columns {missing}, columns named twice "
            f"{twice} (expected {','.join(expected)}, extra columns are ignored); {FORMATS_HELP}",
        )
    return names


def extra_columns(header: list[str], expected: tuple[str, ...]) -> list[str]:
    """The header's columns that the format does not use (ignored by the readers)."""
    return [c for c in header if c not in expected]


# ---- per-value checks: None = fine, else what is wrong --------------------------------------------


def _check_count(value: str) -> str | None:
    if not value.strip():
        return "missing value"
    try:
        x = float(value)
    except ValueError:
        return "not a number"
    if not math.isfinite(x):
        return "not a finite number"
    if x != math.floor(x):
        return "token count is not a whole number"
    return "negative token count" if x < 0 else None


def _check_seconds(value: str) -> str | None:
    if not value.strip():
        return "missing value"
    try:
        x = float(value)
    except ValueError:
        return "unparsable time: not a number of seconds"
    if not math.isfinite(x):
        return "unparsable time: not a finite number"
    return "negative time" if x < 0 else None


def _quoted(value: str) -> bool:
    v = value.strip()
    return len(v) >= 2 and v[0] == v[-1] == '"'


QUOTED_FIELD = (
    "quoted field: the readers take unquoted CSV, one record per line (remove the double quotes, e.g. "
    "sed 's/\"//g' FILE)"
)


def _check_timestamp(value: str) -> str | None:
    if not value.strip():
        return "missing value"
    if _quoted(value):
        return QUOTED_FIELD
    try:
        float(value)
    except ValueError:
        pass
    else:
        return (
            "unparsable time: a number (epoch seconds?) where the azure format takes a date-time "
            "YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM]; write date-times, or relative seconds in the burstgpt format"
        )
    parsed = pd.to_datetime(pd.Series([value]), format="ISO8601", utc=True, errors="coerce")
    return "unparsable time (expected YYYY-MM-DD HH:MM:SS.fffffff)" if parsed.isna().iloc[0] else None


def _check_text(value: str) -> str | None:
    return "missing value" if not value.strip() else None


def _check_log_type(value: str) -> str | None:
    if value in BURSTGPT_LOG_TYPES:
        return None
    return "missing value" if not value.strip() else f"unknown log type, expected one of {BURSTGPT_LOG_TYPES}"


_CSV_CHECKS: dict[str, dict[str, Callable[[str], str | None]]] = {
    AZURE: {"TIMESTAMP": _check_timestamp, "ContextTokens": _check_count, "GeneratedTokens": _check_count},
    BURSTGPT: {
        "Timestamp": _check_seconds,
        "Model": _check_text,
        "Request tokens": _check_count,
        "Response tokens": _check_count,
        "Total tokens": _check_count,
        "Log Type": _check_log_type,
    },
}


def _diagnose_csv(fmt: str, header: list[str], text: str) -> str | None:
    if not text.strip():
        return "blank line (blank lines are allowed only at the end of the file)"
    fields = text.split(",")
    if len(fields) != len(header):
        return f"wrong column count: expected {len(header)} fields ({','.join(header)}), found {len(fields)}"
    checks = _CSV_CHECKS[fmt]
    for column, value in zip(header, fields, strict=True):
        if column not in checks:
            continue  # an extra column: ignored
        problem = QUOTED_FIELD if _quoted(value) else checks[column](value)
        if problem is not None:
            return f"{problem} (column {column} = {value!r})"
    return None


def _json_number_problem(obj: dict[str, object], key: str, whole: bool) -> str | None:
    if key not in obj or obj[key] is None:
        return f"missing field {key!r}"
    value = obj[key]
    shown = f"(field {key} = {json.dumps(value)[:60]})"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"not a number {shown}"
    if not math.isfinite(value):
        return f"not a finite number {shown}"
    if whole and value != math.floor(value):
        return f"token count is not a whole number {shown}"
    return f"negative value {shown}" if value < 0 else None


def _diagnose_json(text: str) -> str | None:
    if not text.strip():
        return "blank line (blank lines are allowed only at the end of the file)"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"bad JSON: {e.msg} at column {e.colno}"
    if not isinstance(obj, dict):
        return f"bad record: expected a JSON object, found {type(obj).__name__}"
    for key, whole in (("timestamp", False), ("input_length", True), ("output_length", True)):
        problem = _json_number_problem(obj, key, whole)
        if problem is not None:
            return problem
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None and not (
        isinstance(hash_ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids)
    ):
        return "field hash_ids is not a list of integers"
    return None


def diagnose_line(fmt: str, header: list[str], text: str) -> str | None:
    """What is wrong with one line of a trace file, or None if that line alone is fine."""
    return _diagnose_json(text) if fmt == MOONCAKE else _diagnose_csv(fmt, header, text)


def time_field_text(fmt: str, header: list[str], text: str) -> str:
    """The raw text of the time value on one (valid) line, for messages."""
    if fmt == MOONCAKE:
        return json.dumps(json.loads(text).get("timestamp"))
    fields = text.split(",")
    return fields[header.index(TIME_COLUMN[fmt])]
