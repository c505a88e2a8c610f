"""bench/bench_latency_correction.py: the rows on a slowed fleet, the known row's swap undone, the table printed."""

from __future__ import annotations

import argparse

import pytest

import controller.pipeline as pipeline_module
from tests.support.bench import load_bench

bench = load_bench("bench_latency_correction")


def _args(**kw: object) -> argparse.Namespace:
    base = {
        "duration_s": 300.0,
        "sine_period_s": 600.0,
        "ramp_s": 1200.0,
        "warmup_s": 100.0,
        "forecaster": "holt",
    }
    return argparse.Namespace(**{**base, **kw})


def test_rows_on_a_slow_fleet_read_its_speed_and_the_known_row_leaves_the_factory_as_it_was() -> None:
    factory = getattr(pipeline_module, "latency_correction")  # noqa: B009  (the bench swaps it)
    rows = {row: bench.run_row(row, "conv", 1.5, {}, _args()) for row in ("off", "slower", "known")}
    assert getattr(pipeline_module, "latency_correction") is factory  # noqa: B009
    assert rows["off"]["estimate"] != rows["off"]["estimate"]  # NaN: no correction when off
    assert rows["slower"]["estimate"] == pytest.approx(1.5, rel=0.05)
    assert rows["known"]["applied"] == 1.5
    assert rows["known"]["gpu_s"] > rows["off"]["gpu_s"]  # sized at the true speed: more GPUs


def test_main_prints_one_row_per_policy_and_factor(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--workloads", "conv", "--factors", "1", "--duration-s", "120", "--forecaster", "holt"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| workload | k | row |")
    assert [line.split("|")[3].strip() for line in out[2:]] == list(bench.ROWS)
