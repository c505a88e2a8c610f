"""A command started early in the session and checked later by a test (the whole-project mypy run)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class BackgroundRun:
    """``argv`` running in ``cwd`` from now on, its stdout and stderr into a temporary file.

    ``result`` waits for it (``timeout_s`` counted from the start, as ``subprocess.run``'s would be) and gives
    the exit code and the output; ``kill`` stops it if it still runs (idempotent)."""

    def __init__(self, argv: Sequence[str], cwd: Path, timeout_s: float = 600.0) -> None:
        self.argv, self.timeout_s = list(argv), timeout_s
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 - open for the run's life, closed by kill()
        self._started = time.monotonic()
        self._proc = subprocess.Popen(self.argv, cwd=cwd, stdout=self._out, stderr=subprocess.STDOUT)

    def result(self) -> tuple[int, str]:
        remaining = max(0.0, self.timeout_s - (time.monotonic() - self._started))
        try:
            code = self._proc.wait(remaining)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._out.seek(0)
        return code, self._out.read().decode(errors="replace")

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._out.close()


MYPY_RUN = pytest.StashKey[BackgroundRun]()


def mypy_run() -> BackgroundRun:
    """The whole-project strict mypy check (``[tool.mypy]`` in pyproject.toml), started now, niced: the tests
    that run meanwhile keep their CPU share (so it gets twice the 600 s it had when it ran alone)."""
    return BackgroundRun(
        ["nice", "-n", "10", str(Path(sys.executable).parent / "mypy")], ROOT, timeout_s=1200.0
    )
