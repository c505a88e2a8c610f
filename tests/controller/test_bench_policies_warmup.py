"""bench/bench_policies.py: the "SLO after 600 s" cell on a trace shorter than the warm-up says so (no nan%)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies_warmup_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench_policies = _bench()


def test_format_after_names_the_warm_up_when_nothing_arrived_after_it() -> None:
    assert bench_policies.format_after(math.nan, 600.0) == "— (trace shorter than 600 s)"
    assert bench_policies.format_after(0.98765, 600.0) == "98.77%"
    assert bench_policies.format_after(1.0, 900.0) == "100.00%"


def test_a_trace_shorter_than_the_warm_up_prints_a_dash_not_nan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["bench_policies.py", "--workloads", "conv", "--policies", "static-peak", "--duration-s", "120"]
    monkeypatch.setattr(sys, "argv", argv)
    bench_policies.main()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| conv | static-peak")]
    assert len(rows) == 1, out
    assert "nan" not in rows[0]
    assert "— (trace shorter than 600 s)" in rows[0]


@pytest.mark.parametrize(
    ("mode", "targets"), [("all", ("arrivals", "prompt_tokens", "gen_tokens")), ("arrivals", ("arrivals",))]
)
def test_combination_rows_build_the_combined_forecaster(mode: str, targets: tuple[str, ...]) -> None:
    from forecaster.combination import CombinedForecaster

    ckpt = Path(__file__).resolve().parents[2] / "forecaster" / "checkpoints" / "default.safetensors"
    if not ckpt.exists():
        pytest.skip("no shipped checkpoint")
    pytest.importorskip("torch")
    combined = bench_policies.make("predictive", "default", {}, None, mode).make_forecaster()
    assert isinstance(combined, CombinedForecaster) and combined.config.targets == targets
    plain = bench_policies.make("predictive", "default", {}, None, "off").make_forecaster()
    assert not isinstance(plain, CombinedForecaster)
