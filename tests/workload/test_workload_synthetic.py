"""The synthetic generator: determinism, mean rate, burstiness, lengths, validation."""

from __future__ import annotations

import numpy as np
import pytest

from serving.workload.stats import trace_stats
from serving.workload.synthetic import LengthDist, SyntheticParams, generate


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    p = SyntheticParams(duration_s=300, rate_rps=5, model_names=("a", "b"), failure_prob=0.1)
    a, b, c = generate(p, seed=3), generate(p, seed=3), generate(p, seed=4)
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "model", "failed"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_mean_rate_without_bursts(cv: float) -> None:
    t = generate(
        SyntheticParams(duration_s=2000, rate_rps=10, burst_multiplier=1, interarrival_cv=cv), seed=1
    )
    # 20,000 expected arrivals: the count's sd is about cv * sqrt(20000) = 141 * cv
    assert abs(len(t) - 20_000) < 5 * 141 * cv
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[-1] <= 2000


def test_mean_rate_with_bursts_averages_to_rate() -> None:
    p = SyntheticParams(duration_s=4000, rate_rps=4, burst_multiplier=5, calm_mean_s=60, burst_mean_s=10)
    rates = [len(generate(p, seed=s)) / 4000 for s in range(6)]
    assert float(np.mean(rates)) == pytest.approx(4.0, rel=0.08)


def test_cv_grows_with_burstiness() -> None:
    def cv(**kw: float) -> float:
        base = {"duration_s": 3000.0, "rate_rps": 8.0}
        return trace_stats(generate(SyntheticParams(**{**base, **kw}), seed=11)).cv_5s

    poisson = cv(burst_multiplier=1, interarrival_cv=1)
    assert poisson == pytest.approx(1 / np.sqrt(40), rel=0.15)  # Poisson: CV of 5 s counts = 1/sqrt(40)
    assert cv(burst_multiplier=1, interarrival_cv=3) > 2 * poisson
    assert poisson < cv(burst_multiplier=3) < cv(burst_multiplier=10)


def test_diurnal_component_shapes_the_rate() -> None:
    p = SyntheticParams(
        duration_s=2000, rate_rps=20, burst_multiplier=1, diurnal_amplitude=0.8, diurnal_period_s=2000
    )
    t = generate(p, seed=2)
    first_half = int(np.sum(t.arrival_s < 1000))
    assert first_half > 2.5 * (len(t) - first_half)  # sin is positive over the first half period


def test_lengths_and_failures() -> None:
    p = SyntheticParams(
        duration_s=2000,
        rate_rps=10,
        failure_prob=0.2,
        prompt=LengthDist(median_tokens=800, sigma=0.5, max_tokens=4000),
        output=LengthDist(kind="zipf", zipf_a=2.5, min_tokens=5, max_tokens=300),
    )
    t = generate(p, seed=5)
    assert np.median(t.prompt_tokens) == pytest.approx(800, rel=0.05)
    assert t.prompt_tokens.max() <= 4000 and t.prompt_tokens.min() >= 1
    ok = t.output_tokens[~t.failed]
    assert ok.min() >= 5 and ok.max() <= 300 and np.mean(ok == 5) > 0.5  # Zipf: mass at the minimum
    assert t.failed.mean() == pytest.approx(0.2, abs=0.03)
    assert (t.output_tokens[t.failed] == 0).all()


def test_invalid_params_list_every_problem() -> None:
    with pytest.raises(ValueError) as info:
        generate(SyntheticParams(rate_rps=-1, burst_multiplier=0.5, diurnal_amplitude=1.5), seed=0)
    msg = str(info.value)
    assert "rate_rps" in msg and "burst_multiplier" in msg and "diurnal_amplitude" in msg
