"""bench/bench_policies.py --forecast-stats: the loop's forecasts against what arrived next (s11f)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.baselines import Holt
from forecaster.types import CHANNELS

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies_forecast_stats_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=2, max_size=60), st.integers(1, 8))
def test_realised_totals_with_one_second_ticks_is_the_sum_of_the_next_h_rates(
    rates: list[float], h: int
) -> None:
    r = np.array(rates)
    t = np.arange(len(r), dtype=np.float64)
    got = bench.realised_totals(t, r, float(h))
    for i in range(len(r)):
        if i + h <= len(r) - 1:
            assert math.isclose(got[i], r[i + 1 : i + 1 + h].sum(), rel_tol=1e-9, abs_tol=1e-6)
        else:
            assert math.isnan(got[i])


def test_realised_totals_weights_uneven_ticks_and_propagates_unknown_rates() -> None:
    t = np.array([0.0, 2.0, 3.0, 5.0, 6.0])
    r = np.array([9.0, 1.0, 4.0, np.nan, 2.0])
    got = bench.realised_totals(t, r, 3.0)
    assert got[0] == 1.0 * 2 + 4.0 * 1  # ticks at 2 and 3 (the one at 5 is past 0 + 3)
    assert math.isnan(got[1])  # (2, 5] covers the unknown rate at 5
    assert math.isnan(got[4])  # runs past the last tick


def _records(p90: np.ndarray, arrivals: np.ndarray) -> list[tuple[float, np.ndarray, np.ndarray]]:
    out = []
    for k, (f, a) in enumerate(zip(p90, arrivals, strict=True)):
        inputs = np.array([[a, 10 * a, 100 * a]])
        out.append((float(k), inputs, np.array([[f, 10 * f, 100 * f]])))
    return out


def test_forecast_stats_coverage_bias_and_jumps() -> None:
    arrivals = np.full(40, 2.0)  # 2/s: 10 over a 5-s horizon
    steady = bench.forecast_stats(_records(np.full(40, 12.0), arrivals), 5.0)
    for name in ("arrivals", "prompt tokens", "gen tokens"):
        assert steady[name]["coverage"] == 1.0
        assert math.isclose(steady[name]["bias"], 1.2)
        assert steady[name]["jump"] == 0.0 and steady[name]["up_moves"] == 0
        assert steady[name]["n"] == 35
    low = bench.forecast_stats(_records(np.full(40, 8.0), arrivals), 5.0)
    assert low["arrivals"]["coverage"] == 0.0 and math.isclose(low["arrivals"]["bias"], 0.8)
    jumpy = np.where(np.arange(40) % 2 == 0, 8.0, 16.0)  # doubles every other tick
    s = bench.forecast_stats(_records(jumpy, arrivals), 5.0)
    assert s["arrivals"]["up_moves"] == 17  # rises at ticks 1, 3, ..., 33 (both ends scored)
    assert math.isclose(s["arrivals"]["jump"], math.log(17 / 9), rel_tol=1e-9)
    assert math.isclose(s["arrivals"]["coverage"], 0.0 + 17 / 35)


def test_forecast_stats_of_nothing_is_unknown() -> None:
    s = bench.forecast_stats([], 5.0)
    assert math.isnan(s["arrivals"]["coverage"]) and s["arrivals"]["n"] == 0


def test_recorder_passes_the_forecast_through_and_keeps_the_measured_rates() -> None:
    sink: list[tuple[float, np.ndarray, np.ndarray]] = []
    rec = bench.ForecastRecorder(Holt(), sink)
    plain = Holt()
    rec.reset(["a", "b"])
    plain.reset(["a", "b"])
    rng = np.random.default_rng(0)
    for k in range(20):
        x = rng.uniform(0, 50, size=(2, len(CHANNELS)))
        mask = np.ones_like(x, dtype=bool)
        mask[1, 1] = False  # an unknown prompt rate is recorded as unknown
        got, want = rec.step(x, mask, now_s=float(k)), plain.step(x, mask, now_s=float(k))
        np.testing.assert_array_equal(got.arrivals_p90, want.arrivals_p90)
        np.testing.assert_array_equal(sink[-1][1][0], x[0, :3])
        assert math.isnan(sink[-1][1][1, 1])
        np.testing.assert_array_equal(sink[-1][2][:, 0], want.arrivals_p90)
    assert len(sink) == 20 and rec.horizon_s == plain.horizon_s


def test_make_wraps_every_predictive_forecaster() -> None:
    sink: list[tuple[float, np.ndarray, np.ndarray]] = []
    policy = bench.make("predictive", "holt", {}, wrap=lambda f: bench.ForecastRecorder(f, sink))
    built = policy.make_forecaster()
    assert isinstance(built, bench.ForecastRecorder) and isinstance(built.inner, Holt)
    plain = bench.make("predictive", "holt", {})
    assert isinstance(plain.make_forecaster(), Holt)
