"""bench_policies.py and bench_misses.py: ``--duration-s D`` replays the first D s of the very trace the full
run replays (the generated workloads used to be generated again for D s: another realisation)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.fleet import single_pool
from serving.workload.readers import read_trace
from tests.support.bench import load_bench

bench_policies = load_bench("bench_policies", "bench_policies_prefix_under_test")
bench_misses = load_bench("bench_misses", "bench_misses_prefix_under_test")
GENERATED = ("sine", "mmpp", "mmpp@3", "mmpp-holdout", "mmpp-holdout@1", "mmpp-diurnal")


def _same(a: object, b: object) -> bool:
    cols = ("arrival_s", "prompt_tokens", "output_tokens", "priority", "model", "failed")
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in cols)


def _args(duration_s: float | None, period_s: float = 600.0) -> argparse.Namespace:
    return argparse.Namespace(duration_s=duration_s, sine_period_s=period_s, ramp_s=1200.0)


@pytest.mark.parametrize("name", GENERATED)
def test_a_shorter_run_replays_the_start_of_the_full_runs_trace(name: str) -> None:
    full, fleet = bench_policies.row_trace(name, _args(None))
    short, short_fleet = bench_policies.row_trace(name, _args(300.0))
    assert short_fleet == fleet
    assert _same(short, full.window(0.0, 300.0))
    assert len(short) < len(full)
    # without the prefix rule the generator is run for 300 s: another trace (what the scripts used to replay)
    regenerated, _ = bench_policies.workload(name, 300.0, 600.0)
    assert not _same(regenerated, short)


@settings(max_examples=15, deadline=None)
@given(fraction=st.floats(0.001, 1.0), period_s=st.sampled_from([300.0, 600.0]))
def test_any_duration_within_the_sinusoid_is_its_prefix(fraction: float, period_s: float) -> None:
    duration_s = fraction * 2 * period_s  # the sinusoid's default length: two periods
    full, _ = bench_policies.row_trace("sine", _args(None, period_s))
    short, _ = bench_policies.row_trace("sine", _args(duration_s, period_s))
    assert _same(short, full.window(0.0, duration_s))
    assert len(short) == 0 or short.arrival_s[-1] < duration_s


def test_bench_misses_duration_is_bench_policies_duration() -> None:
    args = bench_misses.parse_args(["--workload", "sine", "--duration-s", "600", "--sine-period-s", "600"])
    misses, _ = bench_policies.row_trace(args.workload, args)
    assert _same(misses, bench_policies.row_trace("sine", _args(600.0))[0])
    full, _ = bench_policies.workload("sine", None, 600.0)  # the table's sine row (no --duration-s)
    assert _same(misses, full.window(0.0, 600.0))


def test_longer_than_the_default_generates_a_longer_trace() -> None:
    full, _ = bench_policies.row_trace("mmpp", _args(None))
    long, _ = bench_policies.row_trace("mmpp", _args(2400.0))
    assert long.arrival_s[-1] > full.arrival_s[-1] + 600.0


def test_bundled_traces_and_the_ramp_are_cut_as_before() -> None:
    for name in ("conv", "ramp"):
        a, _ = bench_policies.row_trace(name, _args(200.0))
        b, _ = bench_policies.workload(name, 200.0, 600.0)
        assert _same(a, b) and a.arrival_s[-1] < 200.0


def test_a_file_workload_replays_that_file_on_the_default_pool(tmp_path: Path) -> None:
    """``file:PATH`` (bench_policies / bench_misses / bench_decisions): any trace read_trace reads, on the
    default pool, its first D s with ``--duration-s D``."""
    path = tmp_path / "t.csv"
    rows = [f"{t / 2:.1f},m,{100 + t},{10 + t},{110 + 2 * t},Conversation log" for t in range(20)]  # BurstGPT
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(rows) + "\n"
    )
    full, fleet = bench_policies.row_trace(f"file:{path}", _args(None))
    assert fleet == single_pool()
    assert _same(full, read_trace(path))
    short, _ = bench_policies.row_trace(f"file:{path}", _args(4.0))
    assert _same(short, full.window(0.0, 4.0)) and 0 < len(short) < len(full)
