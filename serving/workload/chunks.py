"""What every format parser hands the readers: validated chunks in file order, and error helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from serving.workload import formats as F
from serving.workload.errors import TraceError
from serving.workload.trace import PRIORITY_NORMAL, Trace


@dataclass(frozen=True, eq=False)
class RawChunk:
    """One parsed, validated chunk in file order; ``time_s`` counts from the file's own origin."""

    first_line: int
    time_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    model: np.ndarray | None = None
    failed: np.ndarray | None = None
    model_names: tuple[str, ...] = ()
    origin: pd.Timestamp | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def as_trace(self) -> Trace:
        n = len(self.time_s)
        return Trace(
            arrival_s=self.time_s,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            priority=np.full(n, PRIORITY_NORMAL, dtype=np.int8),
            model=np.full(n, -1, dtype=np.int16) if self.model is None else self.model,
            failed=np.zeros(n, dtype=bool) if self.failed is None else self.failed,
            model_names=self.model_names,
            extra=self.extra,
            line=np.arange(self.first_line, self.first_line + n, dtype=_line_dtype(self.first_line + n)),
        )


def _line_dtype(last_line: int) -> type[np.signedinteger]:
    """int32 line numbers (4 bytes a row) unless the file has more lines than int32 holds."""
    return np.int32 if last_line < np.iinfo(np.int32).max else np.int64


def error_at(
    path: Path, fmt: str, header: list[str], line: int, fallback: str = "malformed row"
) -> TraceError:
    text = F.raw_line(path, line)
    if not text.strip():
        return blank_then_text(path, line)
    problem = F.diagnose_line(fmt, header, text)
    shown = text if len(text) <= 200 else text[:197] + "..."
    return TraceError(path, line, problem if problem is not None else f"{fallback}: {shown!r}")


def blank_then_text(path: Path, blank_line: int) -> TraceError:
    """A blank line at ``blank_line`` with more text after it: the error names the blank line and shows the
    first non-blank line after it (often a summary or comment an export tool appended)."""
    for number, text in F.raw_lines(path, blank_line + 1):
        if text.strip():
            shown = text if len(text) <= 80 else text[:77] + "..."
            return TraceError(
                path,
                blank_line,
                f"blank line, then more text on line {number}: {shown!r}; blank lines are allowed only at the end "
                f"of the file (if the lines from {number} on are not records, delete them)",
            )
    return TraceError(path, blank_line, "blank line (blank lines are allowed only at the end of the file)")


def first_bad_from(path: Path, fmt: str, header: list[str], start_line: int, cause: str) -> TraceError:
    """Scan lines from ``start_line`` for the first one that is wrong on its own (error path only)."""
    for number, text in F.raw_lines(path, start_line):
        if not text.strip():
            return blank_then_text(path, number)
        problem = F.diagnose_line(fmt, header, text)
        if problem is not None:
            return TraceError(path, number, problem)
    return TraceError(path, None, f"cannot parse the file after line {start_line - 1}: {cause}")


def counts(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Token counts as int64 and a mask of rows that are not non-negative whole numbers."""
    if pd.api.types.is_integer_dtype(s.dtype) and not isinstance(s.dtype, pd.api.extensions.ExtensionDtype):
        v = s.to_numpy(np.int64)
        return v, v < 0
    a = pd.to_numeric(s, errors="coerce").to_numpy(np.float64, na_value=np.nan)
    bad = ~np.isfinite(a) | (a < 0) | (a != np.floor(a))
    return np.where(bad, 0, a).astype(np.int64), bad


def seconds(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    a = pd.to_numeric(s, errors="coerce").to_numpy(np.float64, na_value=np.nan)
    bad = ~np.isfinite(a) | (a < 0)
    return np.where(bad, 0.0, a), bad
