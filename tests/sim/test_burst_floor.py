"""static-peak and a burst shorter than its 60-s window: sized for the burst's queue to clear within the TTFT
SLO (serving.sim.capacity.burst_floor), and a trace shorter than the window read as `pdscale plan` reads it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.capacity import DecodeCapacity, PrefillCapacity, burst_floor, instances_needed
from serving.sim.fleet import single_pool
from serving.sim.hardware import get_profile
from serving.sim.latency import get_latency_model
from serving.sim.plan import plan_capacity, trace_sizings
from serving.sim.replay import (
    PeakWindow,
    PolicyOptions,
    make_policy,
    peak_windows,
    replay,
    static_peak_counts,
)
from serving.workload.trace import Trace

PROFILE = "llama3-8b/a100"


def one_timestamp(n: int = 500, at_s: float = 0.0) -> Trace:
    """n requests on one timestamp, as bench/bench_unseen.py's hostile_one_timestamp (prompts 800+i)."""
    i = np.arange(n)
    return Trace.from_arrays(np.full(n, at_s), 800 + i, 50 + i % 7)


def steady(duration_s: float, rate_rps: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, int(duration_s * rate_rps)))
    n = len(arrivals)
    return Trace.from_arrays(arrivals - arrivals[0], rng.integers(500, 1500, n), rng.integers(20, 200, n))


def test_a_trace_shorter_than_the_window_is_sized_as_plan_sizes_it() -> None:
    trace = one_timestamp()
    by_prompt, _ = peak_windows(trace)
    assert by_prompt.rate_rps == pytest.approx(500.0)  # one window of 1 s, as plan's window_loads
    pool = single_pool().pools[0]
    plan = plan_capacity([PROFILE], trace_sizings(trace)[0], pool.slo_ttft_ms, pool.slo_itl_ms, headroom=0.3)
    assert static_peak_counts(pool, trace, headroom=0.3) == {"prefill": plan.first.prefill,
                                                             "decode": plan.first.decode}  # fmt: skip


def calm_then_burst() -> Trace:
    """10 min at 1 req/s with 300 requests on one timestamp at t=300."""
    calm = steady(600.0, 1.0, seed=3)
    burst = one_timestamp(300, at_s=300.0)
    order = np.argsort(np.concatenate([calm.arrival_s, burst.arrival_s]), kind="stable")
    return Trace.from_arrays(
        np.concatenate([calm.arrival_s, burst.arrival_s])[order],
        np.concatenate([calm.prompt_tokens, burst.prompt_tokens])[order],
        np.concatenate([calm.output_tokens, burst.output_tokens])[order],
    )


def test_a_burst_inside_a_longer_trace_is_served_within_the_slo() -> None:
    """The 60-s window reads 6 req/s; sized for the rate alone the burst queued for seconds (65.7 % SLO)."""
    trace = calm_then_burst()
    fleet = single_pool()
    report = replay(fleet, {"default": trace}, make_policy("static-peak", PolicyOptions()))
    assert report.slo_attainment >= 0.95
    in_burst = report.arrival_s == 300.0
    assert np.nanpercentile(report.request_ttft_ms[in_burst], 90) <= fleet.pools[0].slo_ttft_ms


def test_plan_and_static_peak_agree_on_a_burst_inside_a_longer_trace() -> None:
    trace = calm_then_burst()
    pool = single_pool().pools[0]
    peak = trace_sizings(trace)[0]
    plan = plan_capacity([PROFILE], peak, pool.slo_ttft_ms, pool.slo_itl_ms, headroom=0.2).first
    assert plan.prefill > plan.prefill_need.prefill  # the burst, not the window's rate, sizes prefill
    assert static_peak_counts(pool, trace) == {"prefill": plan.prefill, "decode": plan.decode}


@pytest.mark.parametrize("rate_rps", [2.0, 8.0, 20.0])
def test_steady_traffic_is_sized_by_its_rate_alone(rate_rps: float) -> None:
    pool = single_pool().pools[0]
    trace = steady(600.0, rate_rps, seed=int(rate_rps))
    by_prompt, by_output = peak_windows(trace)
    profile, model = get_profile(PROFILE), get_latency_model(PROFILE)

    def rate_sized(w: PeakWindow) -> tuple[int, int]:
        n = instances_needed(profile, model, w.rate_rps, w.mean_prompt_tokens, w.mean_output_tokens,
                             pool.slo_ttft_ms, pool.slo_itl_ms, headroom=0.2)  # fmt: skip
        return max(n.prefill, 1), max(n.decode, 1)

    wanted = {"prefill": rate_sized(by_prompt)[0], "decode": rate_sized(by_output)[1]}
    assert static_peak_counts(pool, trace) == wanted


def capacities() -> tuple[PrefillCapacity, DecodeCapacity]:
    n = instances_needed(get_profile(PROFILE), get_latency_model(PROFILE), 1.0, 1000.0, 100.0, 1000.0, 50.0)
    return n.prefill_capacity, n.decode_capacity


def floor_of(arrival_s: list[float], prompt: list[int], output: list[int]) -> tuple[int, int]:
    pre, dec = capacities()
    ints = np.int64
    return burst_floor(np.array(arrival_s, dtype=np.float64), np.array(prompt, dtype=ints),
                       np.array(output, dtype=ints), pre, dec, 1000.0, window_s=60.0)  # fmt: skip


def test_an_empty_trace_needs_no_burst_floor_and_one_huge_prompt_needs_one_instance() -> None:
    assert floor_of([], [], []) == (0, 0)
    # one prompt prefills on one instance: more instances would not clear it sooner
    assert floor_of([0.0], [120_000], [10]) == (1, 1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 400), extra=st.integers(1, 400), prompt=st.integers(100, 8000))
def test_more_requests_at_one_instant_never_lower_the_floor(n: int, extra: int, prompt: int) -> None:

    def floor(k: int) -> tuple[int, int]:
        return floor_of([0.0] * k, [prompt] * k, [100] * k)

    small, big = floor(n), floor(n + extra)
    assert big[0] >= small[0] and big[1] >= small[1]
