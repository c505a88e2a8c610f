"""Load a script under bench/ as a module, for tests of its pure parts (tables, summaries, parsers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str, as_name: str | None = None) -> ModuleType:
    """``bench/NAME.py`` as the module ``as_name`` (default ``NAME_under_test``), registered in ``sys.modules``
    first: dataclasses resolve their module by name."""
    spec = importlib.util.spec_from_file_location(as_name or f"{name}_under_test", BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
