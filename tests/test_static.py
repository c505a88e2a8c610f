"""The code stays ruff- and mypy-clean: checked by the test suite so CI enforces it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.background import MYPY_RUN, mypy_run

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_clean() -> None:
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_clean() -> None:
    result = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_clean(request: pytest.FixtureRequest) -> None:
    # Started when collection finished if this test was selected (tests/conftest.py): minutes of one core
    # while most of the suite leaves the other core idle.
    run = request.config.stash.get(MYPY_RUN, None) or mypy_run()
    code, output = run.result()
    assert code == 0, output
