"""Layer rules: import-linter's contracts hold, and the controller's import path stays free of torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "lightning", "optuna", "matplotlib", "statsmodels")


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), f"import-linter is not installed beside {sys.executable} (the test extra)"
    proc = run([str(lint_imports), "--no-cache"])
    assert proc.returncode == 0, f"lint-imports failed:\n{proc.stdout}\n{proc.stderr}"
    assert "0 broken" in proc.stdout, proc.stdout


def heavy_modules_after_import(package: str, *, walk: bool) -> list[str]:
    """Heavy libraries in ``sys.modules`` after importing ``package`` (and, with ``walk``, every submodule)."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        f"if {walk!r}:\n"
        "    for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(mod.name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, f"importing {package} failed:\n{proc.stderr}"
    heavy: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return heavy


@pytest.mark.parametrize("package", ["controller", "forecaster", "serving"])
def test_importing_a_top_level_package_does_not_import_torch(package: str) -> None:
    assert heavy_modules_after_import(package, walk=False) == []


@pytest.mark.parametrize("package", ["controller", "serving"])
def test_every_module_of_the_package_imports_without_heavy_libraries(package: str) -> None:
    """The controller starts without torch (the reactive fallback), so none of its modules may need it at
    import time; serving's launchers and simulator neither. (forecaster's learned model needs torch by design:
    only its top-level package is checked above.) CLI modules must import heavy libraries inside commands."""
    assert heavy_modules_after_import(package, walk=True) == []
