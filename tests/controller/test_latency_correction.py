"""The online latency correction: the mean ITL read exactly, the estimate, its dead band, bounds and warm-up, the
scaled capacity, and a replay on a fleet slower than its profile (controller.latency_correction)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.capacity import CapacityCache, pool_capacity
from controller.config import PolicyConfig
from controller.latency_correction import STEP, LatencyCorrection, latency_correction
from controller.replay_policies import PredictivePolicy
from controller.sources.aggregate import DecodeReadings, LoadAggregator, PoolLoad
from forecaster.baselines import Holt
from serving.sim import samples as s
from serving.sim.fleet import PoolSpec
from serving.sim.hardware import get_profile
from serving.sim.latency import ScaledLatencyModel, get_latency_model
from serving.sim.replay import replay
from serving.workload.named import workload

SPEC = PoolSpec()
PROMPT, OUTPUT = 1000.0, 200.0
CONTEXT = PROMPT + OUTPUT / 2


def _load(itl_s: float, running: float = 40.0, gaps: float = 500.0) -> PoolLoad:
    return PoolLoad(
        pool="default", now_s=0.0, counts={"decode": {"active": 2}}, arrival_rps=5.0, prompt_tps=5000.0,
        gen_tps=1000.0, running=running, waiting=0.0, kv_usage=0.2, ttft_p50_s=0.1, ttft_p90_s=0.2,
        itl_p50_s=math.nan, itl_p90_s=math.nan, mean_prompt_tokens=PROMPT, complete=True, itl_mean_s=itl_s,
        itl_gaps=gaps,
    )  # fmt: skip


def _step_s(batch: float) -> float:
    return float(get_latency_model(SPEC.profile).decode_step_ms(batch, CONTEXT)) / 1e3


def _feed(corr: LatencyCorrection, ratio: float, seconds: int, **kw: float) -> None:
    for _ in range(seconds):
        corr.update(_load(ratio * _step_s(20.0), **kw), 2, PROMPT, OUTPUT, 1.0)


# -- the mean ITL from the histogram's sum and count -------------------------------------------------------


def _scrape(now_s: float, itl_counts: list[int], itl_sums: list[float]) -> s.InstanceSamples:
    ids, roles = ("p0", "d0", "d1"), ("prefill", "decode", "decode")
    counts = np.array([[0, c, c] for c in itl_counts], dtype=np.int64)  # cumulative: all in (0.01, 0.025]
    return s.InstanceSamples(
        now_s=now_s, instance_ids=ids, pools=("default",) * 3, roles=roles, nodes=ids, states=("active",) * 3,
        gauges={s.NUM_REQUESTS_RUNNING: np.full(3, 4.0)},
        histograms={s.INTER_TOKEN_LATENCY_SECONDS: s.Histogram((0.01, 0.025), counts, np.asarray(itl_sums))},
    )  # fmt: skip


def test_mean_itl_is_the_decode_instances_sum_over_count_since_the_last_scrape() -> None:
    agg = LoadAggregator()
    agg.update(_scrape(0.0, [0, 100, 50], [0.0, 2.0, 1.0]), ["default"])
    load = agg.update(_scrape(1.0, [7, 300, 150], [9.0, 6.0, 4.0]), ["default"])["default"]
    # decode instances only (the prefill one's 7 gaps of 9 s are not decode steps): (4 + 3) s over 300 gaps
    assert load.itl_gaps == 300
    assert load.itl_mean_s == pytest.approx(7.0 / 300)
    # d1 restarted (its count went down): counted from zero, its sum too
    load = agg.update(_scrape(2.0, [7, 400, 10], [9.0, 8.0, 0.5]), ["default"])["default"]
    assert load.itl_gaps == 110 and load.itl_mean_s == pytest.approx(2.5 / 110)
    r = load.decode_readings
    assert r is not None  # per decode instance, aligned: d0, d1
    np.testing.assert_allclose(r.gaps, [100, 10])
    np.testing.assert_allclose(r.gap_s, [2.0, 0.5])
    np.testing.assert_allclose(r.running, [4.0, 4.0])
    assert np.isnan(r.kv_usage).all(), "no KV gauge in this scrape: unknown"


def test_mean_itl_unknown_without_sums_or_gaps() -> None:
    agg = LoadAggregator()
    agg.update(_scrape(0.0, [0, 100, 50], [0.0, math.nan, 1.0]), ["default"])
    load = agg.update(_scrape(1.0, [0, 200, 60], [0.0, math.nan, 2.0]), ["default"])["default"]
    assert math.isnan(load.itl_mean_s), "a sum not exported is unknown: no mean"
    agg = LoadAggregator()
    agg.update(_scrape(0.0, [0, 100, 50], [0.0, 2.0, 1.0]), ["default"])
    load = agg.update(_scrape(1.0, [0, 100, 50], [0.0, 2.0, 1.0]), ["default"])["default"]
    assert math.isnan(load.itl_mean_s) and load.itl_gaps == 0


# -- the estimate ------------------------------------------------------------------------------------------


def test_a_fleet_that_matches_its_profile_keeps_factor_one() -> None:
    corr = LatencyCorrection(SPEC)
    _feed(corr, 1.1, 300)  # 10 % slower: inside the dead band
    assert corr.estimate == pytest.approx(1.1) and corr.factor == 1.0


def test_a_slow_fleet_is_corrected_after_the_warm_up_only() -> None:
    corr = LatencyCorrection(SPEC)
    _feed(corr, 1.5, 29)
    assert corr.factor == 1.0, "29 s of readings: still warming up"
    _feed(corr, 1.5, 1)
    assert corr.factor == pytest.approx(1.5, rel=STEP)
    fast = LatencyCorrection(SPEC)
    _feed(fast, 0.7, 60)
    assert fast.factor == pytest.approx(0.7, rel=STEP)


def test_the_estimate_follows_a_change_with_its_half_life() -> None:
    corr = LatencyCorrection(SPEC, halflife_s=60.0)
    _feed(corr, 1.0, 120)
    _feed(corr, 2.0, 60)  # one half-life: half-way in log space
    assert corr.estimate == pytest.approx(math.sqrt(2.0), rel=1e-6)


def test_a_lightly_loaded_pool_gathers_gaps_over_ticks_and_sparse_ones_are_dropped() -> None:
    corr = LatencyCorrection(SPEC)
    _feed(corr, 2.0, 3, gaps=5.0)  # 15 gaps: not one reading yet
    assert math.isnan(corr.estimate) and corr.gathered_s == 3.0
    _feed(corr, 2.0, 1, gaps=5.0)  # 20: one reading, over the 4 s it took
    assert corr.estimate == pytest.approx(2.0) and corr.seen_s == 4.0 and corr.gathered_s == 0.0
    sparse = LatencyCorrection(SPEC)
    for _ in range(40):  # one gap a second: never 20 within 30 s... of a tick without gaps in between
        _feed(sparse, 2.0, 1, gaps=1.0)
        sparse.update(_load(math.nan, gaps=0.0), 2, PROMPT, OUTPUT, 1.0)
    assert math.isnan(sparse.estimate)


@pytest.mark.parametrize("kw", [{"running": 1.0}, {"running": math.nan}], ids=["batch-below-1", "nan"])
def test_unusable_readings_change_nothing(kw: dict[str, float]) -> None:
    corr = LatencyCorrection(SPEC)
    _feed(corr, 3.0, 100, **kw)
    assert math.isnan(corr.estimate) and corr.seen_s == 0 and corr.factor == 1.0


def test_per_instance_readings_model_each_instances_own_batch() -> None:
    model = get_latency_model(SPEC.profile)
    running = np.array([60.0, 4.0, 0.0])  # uneven batches; the idle one timed nothing
    step_s = np.asarray(model.decode_step_ms(running[:2], CONTEXT)) / 1e3
    gaps = np.array([900.0, 60.0, 0.0])
    readings = DecodeReadings(
        gaps=gaps, gap_s=np.array([*(1.3 * gaps[:2] * step_s), 0.0]), running=running,
        kv_usage=np.array([0.3, 0.02, 0.0]),
    )  # fmt: skip
    load = replace(_load(math.nan, running=float(running.sum())), decode_readings=readings)
    corr = LatencyCorrection(SPEC)
    corr.update(load, 3, PROMPT, OUTPUT, 1.0)
    # one step at the gap-weighted batch, not one per instance: within the step tables' curvature
    assert corr.last_ratio == pytest.approx(1.3, rel=0.01)
    # the same gaps read as one mean ITL at the pool's mean batch are misread
    mean_itl = float(readings.gap_s.sum() / gaps.sum())
    pooled = LatencyCorrection(SPEC)
    pooled.update(
        _load(mean_itl, running=float(running.sum()), gaps=float(gaps.sum())), 3, PROMPT, OUTPUT, 1.0
    )
    assert abs(pooled.last_ratio - 1.3) > 0.05


def test_gaps_of_an_instance_running_nothing_at_the_scrape_are_left_out() -> None:
    """The simulator books a whole decode run's gaps when the run ends: an instance that has just drained has
    seconds of gaps and no batch to price them at (pricing them at the gaps' time over the tick read the 600-s
    sinusoid's engines 1.1 x their step where they were 1.5 x)."""
    step_s = _step_s(20.0)
    readings = DecodeReadings(
        gaps=np.array([20.0 / step_s, 5000.0]), gap_s=np.array([20.0, 300.0]), running=np.array([20.0, 0.0]),
        kv_usage=np.array([CONTEXT * 20.0 / get_profile(SPEC.profile).kv_capacity_tokens, 0.0]),
    )  # fmt: skip
    corr = LatencyCorrection(SPEC)
    corr.update(replace(_load(math.nan), decode_readings=readings), 2, PROMPT, OUTPUT, 1.0)
    assert corr.last_ratio == pytest.approx(1.0, rel=1e-6)


def test_a_full_kv_cache_is_no_reading_of_the_engines_speed() -> None:
    corr = LatencyCorrection(SPEC)
    for _ in range(100):  # preemption stalls: gaps twice the step, on a full cache
        corr.update(replace(_load(2.0 * _step_s(20.0)), kv_usage=0.99), 2, PROMPT, OUTPUT, 1.0)
    assert math.isnan(corr.estimate) and corr.factor == 1.0
    kv_ok = CONTEXT * 20.0 / get_profile(SPEC.profile).kv_capacity_tokens
    per = 20.0 / _step_s(20.0)  # 20 sequences for the 1-s tick, at the profile's step on the healthy one
    readings = DecodeReadings(
        gaps=np.array([per / 2.0, per]), gap_s=np.array([20.0, 20.0]),
        running=np.array([20.0, 20.0]), kv_usage=np.array([0.99, kv_ok]),
    )  # fmt: skip
    corr.update(replace(_load(math.nan), decode_readings=readings), 2, PROMPT, OUTPUT, 1.0)
    assert corr.last_ratio == pytest.approx(1.0, rel=1e-6), "the full instance's gaps are left out"


def test_mixed_node_pools_are_not_corrected() -> None:
    corr = LatencyCorrection(replace(SPEC, placement="mixed-node"))
    _feed(corr, 2.0, 100)
    assert not corr.enabled and corr.factor == 1.0


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="min_factor"):
        LatencyCorrection(SPEC, min_factor=1.5)
    with pytest.raises(ValueError, match="halflife_s"):
        LatencyCorrection(SPEC, halflife_s=0.0)


@settings(max_examples=60, deadline=None)
@given(ratio=st.floats(0.2, 8.0))
def test_a_steady_ratio_is_applied_bounded_or_not_at_all(ratio: float) -> None:
    corr = LatencyCorrection(SPEC)
    _feed(corr, ratio, 40)
    assert corr.estimate == pytest.approx(ratio, rel=1e-9)
    if abs(math.log(ratio)) <= math.log1p(corr.deadband):
        assert corr.factor == 1.0
    else:
        bounded = min(max(ratio, corr.min_factor), corr.max_factor)
        assert corr.factor == pytest.approx(bounded, rel=STEP / 2 + 1e-9)


# -- the scaled model and capacity -------------------------------------------------------------------------


def test_scaled_model_scales_every_iteration_and_keeps_the_rest() -> None:
    inner = get_latency_model(SPEC.profile)
    slow = ScaledLatencyModel(inner, 1.5)
    assert slow.iteration_ms(512, 0, 8, 8000) == pytest.approx(1.5 * inner.iteration_ms(512, 0, 8, 8000))
    assert slow.decode_step_ms(16, 900.0) == pytest.approx(1.5 * inner.decode_step_ms(16, 900.0))
    assert slow.profile is inner.profile
    assert getattr(slow, "request_overhead_ms", None) == getattr(inner, "request_overhead_ms", None)
    with pytest.raises(ValueError, match="factor"):
        ScaledLatencyModel(inner, 0.0)


def test_capacity_on_a_slower_engine_is_lower_and_one_is_the_profile() -> None:
    base = pool_capacity(SPEC, PROMPT, OUTPUT)
    assert pool_capacity(SPEC, PROMPT, OUTPUT, latency_scale=1.0) == base
    slow = pool_capacity(SPEC, PROMPT, OUTPUT, latency_scale=1.5)
    assert slow.prefill_tps < base.prefill_tps / 1.4  # the SLO leaves less to queueing too
    assert slow.decode_tps < base.decode_tps and slow.decode_seqs < base.decode_seqs
    cache = CapacityCache(SPEC)
    assert cache.get(PROMPT, OUTPUT) == base
    assert cache.get(PROMPT, OUTPUT, latency_scale=1.5) == slow, "a new factor recomputes the capacity"


# -- in the loop -------------------------------------------------------------------------------------------


def _slow(k: float):  # type: ignore[no-untyped-def]
    def resolve(name: str):  # type: ignore[no-untyped-def]
        return get_profile(name), ScaledLatencyModel(get_latency_model(name), k)

    return resolve


@pytest.mark.parametrize("k", [0.7, 1.5])
def test_replay_on_a_fleet_off_its_profile_measures_the_factor_and_sizes_with_it(k: float) -> None:
    trace, fleet = workload("conv", 400.0, 600.0, prefix=True)
    pool = fleet.pools[0]
    fleet = replace(fleet, pools=(pool,))
    runs = {}
    for mode in ("off", "slower", "both"):
        policy = PredictivePolicy(PolicyConfig(latency_correction=mode), forecaster=Holt)
        rep = replay(fleet, {pool.name: trace}, policy, models=_slow(k))
        assert policy.pipeline is not None
        runs[mode] = (rep.gpu_seconds, policy.pipeline.tracks[pool.name])
    off, slower, both = runs["off"][1], runs["slower"][1], runs["both"][1]
    assert off.latency is None and off.latency_scale == 1.0
    assert slower.latency is not None and both.latency is not None
    assert slower.latency.estimate == pytest.approx(k, rel=0.05) == both.latency.estimate
    assert both.latency_scale == pytest.approx(k, rel=0.05)
    # 'slower' corrects a slower fleet only: a faster one keeps the profile's capacities
    assert slower.latency_scale == (both.latency_scale if k > 1 else 1.0)
    # a slower fleet gets more GPUs than the profile-sized one, a faster one fewer ('both')
    gpu = {mode: g for mode, (g, _) in runs.items()}
    if k > 1:
        assert gpu["slower"] == gpu["both"] > gpu["off"]
    else:
        assert gpu["both"] < gpu["slower"] == gpu["off"]


def test_the_config_names_the_modes() -> None:
    assert PolicyConfig().latency_correction == "slower"
    assert latency_correction(SPEC, "off") is None
    corr = latency_correction(SPEC, "slower")
    assert corr is not None and corr.min_factor == 1.0
    with pytest.raises(ValueError, match="latency_correction"):
        latency_correction(SPEC, "faster")
    with pytest.raises(ValidationError, match="latency_correction"):
        PolicyConfig(latency_correction="on")
