"""Errors and warnings raised while reading traces: each names the file and, where it can, the line."""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file cannot be read as asked.

    ``str()`` reads ``FILE:LINE: message`` (``LINE`` is 1-based as an editor shows it, the header is
    line 1), or ``FILE: message`` when the problem is not on one line (empty file, unknown format).
    """

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


class TraceWarning(UserWarning):
    """Something in a trace was accepted but is worth telling: rows re-sorted, inconsistent totals.

    ``count`` says how many rows it concerns; ``line`` is the first of them (1-based).
    """

    def __init__(self, path: str | Path, line: int, count: int, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.count = count
        self.message = message
        super().__init__(f"{self.path}:{line}: {message}")
