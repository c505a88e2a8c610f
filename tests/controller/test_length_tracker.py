"""LengthTracker's output-length estimate: a floor while decode warms up or is saturated, plain EWMA elsewhere."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import PolicyConfig
from controller.pipeline import LengthTracker, Pipeline, PoolCounts
from controller.policy import PoolState
from controller.sources.aggregate import LoadAggregator, PoolLoad
from serving.sim import samples as s


def _load(
    arrival_rps: float,
    gen_tps: float,
    running: float = 10.0,
    completion_rps: float = math.nan,
    kv_usage: float = math.nan,
) -> PoolLoad:
    nan = math.nan
    return PoolLoad(
        pool="p",
        now_s=0.0,
        counts={},
        arrival_rps=arrival_rps,
        prompt_tps=arrival_rps * 100.0,
        gen_tps=gen_tps,
        running=running,
        waiting=0.0,
        kv_usage=kv_usage,
        ttft_p50_s=nan,
        ttft_p90_s=nan,
        itl_p50_s=nan,
        itl_p90_s=nan,
        mean_prompt_tokens=100.0,
        complete=True,
        completion_rps=completion_rps,
    )


def _warm(output: float = 500.0, seconds: int = 300) -> LengthTracker:
    """A tracker that has seen ``seconds`` of steady traffic: 2 req/s of ``output`` tokens, 20 running."""
    t = LengthTracker()
    for _ in range(seconds):
        t.update(_load(2.0, 2.0 * output, running=20.0), 1.0)
    return t


def test_steady_traffic_reads_its_mean_output_and_warms_up() -> None:
    t = _warm(500.0)
    assert math.isclose(t.output_ewma, 500.0, rel_tol=1e-9)
    assert math.isclose(t.lifetime_s, 500.0 * 20.0 / 1000.0)  # output ÷ (gen_tps ÷ running) = 10 s
    assert not t.warming


def test_cold_start_keeps_the_highest_reading_for_one_lifetime() -> None:
    """Generation lags arrivals on a cold pool: the ratio climbs, dips as arrivals rise; the floor keeps it."""
    t = LengthTracker()
    t.update(_load(1.0, 200.0, running=5.0), 1.0)
    t.update(_load(1.0, 600.0, running=10.0), 1.0)
    high = t.output_ewma
    assert t.warming  # lifetime ≈ high × 10 / 600 s > 2 s seen
    plain = copy.deepcopy(t)
    plain.seen_s, plain.lifetime_s = math.inf, 0.0
    for tracker in (t, plain):  # arrivals jump 20-fold, tokens lag: the raw ratio falls
        tracker.update(_load(20.0, 50.0, running=10.0), 1.0)
    assert plain.output_ewma < high
    assert t.output_ewma == high


def test_leaving_warm_up_follows_shorter_outputs_again() -> None:
    t = _warm(500.0)
    for _ in range(600):
        t.update(_load(2.0, 2.0 * 100.0, running=20.0), 1.0)
    assert t.output_ewma < 110.0


def test_saturated_decode_holds_then_releases() -> None:
    t = _warm(500.0)
    for _ in range(120):
        t.update(_load(4.0, 1000.0, running=20.0), 1.0, capped=True)  # arrivals doubled, throughput capped
    assert t.output_ewma >= 500.0
    for _ in range(600):
        t.update(_load(4.0, 1000.0, running=20.0), 1.0)  # headroom again: the plain reading returns
    assert t.output_ewma < 260.0


loads = st.lists(
    st.tuples(
        st.floats(0.0, 50.0),  # arrivals/s
        st.floats(0.0, 50_000.0),  # generation tokens/s
        st.floats(0.0, 500.0),  # running sequences
        st.booleans(),  # decode saturated
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(prefix=loads, steps=loads)
def test_never_below_the_unfloored_estimate_and_equal_when_nothing_floors(
    prefix: list[tuple[float, float, float, bool]], steps: list[tuple[float, float, float, bool]]
) -> None:
    """Fed the same scrapes, the floored tracker never reads below one whose every step is a plain EWMA step
    from the same state, and reads exactly that step when neither warm-up nor saturation applies."""
    t = LengthTracker()
    for arr, gen, run, cap in prefix:
        t.update(_load(arr, gen, run), 1.0, capped=cap)
    for arr, gen, run, cap in steps:
        plain = copy.deepcopy(t)
        plain.seen_s, plain.lifetime_s = math.inf, 0.0  # never warming, never capped: the plain EWMA
        floors = cap or t.warming
        before = t.output_ewma
        t.update(_load(arr, gen, run), 1.0, capped=cap)
        plain.update(_load(arr, gen, run), 1.0)
        both = math.isfinite(t.output_ewma) and math.isfinite(plain.output_ewma)
        if both:
            assert t.output_ewma >= plain.output_ewma - 1e-9 * max(1.0, plain.output_ewma)
            if floors and math.isfinite(before) and arr > 0 and math.isfinite(gen):
                assert t.output_ewma >= before
            if not floors:
                assert t.output_ewma == plain.output_ewma


class _Cap:
    decode_seqs = 100.0
    decode_tps = 2_000.0
    correction = 1.0


class _Cache:
    def get(self, *_: object, **__: object) -> _Cap:
        return _Cap()


class _Setup:
    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy


class _Track:
    """What ``Pipeline._decode_capped`` reads of a pool's track: a modelled batch of 100 per decode instance, a
    tracker (fresh, or reading ``output`` tokens) and the policy's state (by default no usual output yet:
    output_floor_kv 'rise' reads no rise)."""

    def __init__(
        self, policy: PolicyConfig | None = None, output: float | None = None, state: PoolState | None = None
    ) -> None:
        self.capacity = _Cache()
        self.lengths = LengthTracker() if output is None else LengthTracker(output_ewma=output)
        self.setup = _Setup(policy or PolicyConfig())
        self.state = state or PoolState()
        self.latency_scale = 1.0  # the latency correction's factor: the profile's speed


COUNTS_2D = PoolCounts(replicas={"decode": 2}, active={"decode": 2}, standby={}, provisioning={})


def test_pipeline_flags_a_saturated_decode_fleet() -> None:
    counts = COUNTS_2D
    full = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=180.0), counts)  # type: ignore[arg-type]
    room = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=179.0), counts)  # type: ignore[arg-type]
    none = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=math.nan), counts)  # type: ignore[arg-type]
    assert (full, room, none) == (True, False, False)


@pytest.mark.parametrize(
    ("opted", "kv", "capped"), [(True, 0.95, True), (False, 0.95, False), (True, 0.5, False)]
)
def test_pipeline_flags_a_full_kv_cache_when_opted_in(opted: bool, kv: float, capped: bool) -> None:
    """``decode_saturated_kv``: 20 running of a modelled 200, but the KV cache at 95 % says the fleet is full."""
    track = _Track(PolicyConfig(decode_saturated_kv=opted))
    assert Pipeline._decode_capped(track, _load(1.0, 100.0, running=20.0, kv_usage=kv), COUNTS_2D) is capped  # type: ignore[arg-type]


def test_saturated_cold_pool_reads_tokens_per_admitted_request() -> None:
    """One full decode instance: 1,000 tokens/s over 50 running sequences, one 1,000-token request finishing
    a second, while arrivals climb to 8/s. Per arrival that reads ~125-330 tokens; per admitted request 1,000."""
    modes = {m: LengthTracker() for m in ("admitted", "held", "off")}
    for k in range(300):
        arr = 3.0 + 5.0 * k / 300
        for mode, t in modes.items():
            t.update(_load(arr, 1000.0, running=50.0, completion_rps=1.0), 1.0, capped=k > 0, mode=mode)
    assert math.isclose(modes["admitted"].output_ewma, 1000.0, rel_tol=0.02)
    assert modes["held"].output_ewma < 400.0
    assert modes["off"].output_ewma < modes["held"].output_ewma


def test_admitted_reading_is_unused_outside_saturation_and_without_completions() -> None:
    a, b = LengthTracker(), LengthTracker()
    for _ in range(300):
        a.update(_load(2.0, 1000.0, running=20.0, completion_rps=0.5), 1.0)  # a falling fleet: reads 2,000
        b.update(_load(2.0, 1000.0, running=20.0), 1.0, capped=True)  # no completion counter
    assert math.isclose(a.output_ewma, 500.0, rel_tol=1e-6)
    assert math.isclose(b.output_ewma, 500.0, rel_tol=1e-6)


def test_off_is_the_plain_ewma() -> None:
    t, plain = LengthTracker(), LengthTracker()
    plain.seen_s, plain.lifetime_s = math.inf, 0.0
    for k in range(100):
        load = _load(1.0 + k % 7, 300.0 * (k % 5), running=30.0, completion_rps=0.3)
        t.update(load, 1.0, capped=k % 2 == 0, mode="off")
        plain.update(load, 1.0, mode="off")
        assert t.output_ewma == plain.output_ewma or (
            math.isnan(t.output_ewma) and math.isnan(plain.output_ewma)
        )


def _scrape(now_s: float, success: list[float] | None) -> s.InstanceSamples:
    counters = {
        s.PROMPT_TOKENS_TOTAL: np.array([100.0 * now_s, 0.0]),
        s.GENERATION_TOKENS_TOTAL: np.array([0.0, 50.0 * now_s]),
        s.ROUTER_REQUESTS_TOTAL: np.array([now_s, 0.0]),
    }
    if success is not None:
        counters[s.REQUEST_SUCCESS_TOTAL] = np.asarray(success)
    return s.InstanceSamples(
        now_s=now_s,
        instance_ids=("p0", "d0"),
        pools=("default", "default"),
        roles=("prefill", "decode"),
        nodes=("p0", "d0"),
        states=("active", "active"),
        gauges={s.NUM_REQUESTS_RUNNING: np.array([0.0, 3.0]), s.NUM_REQUESTS_WAITING: np.zeros(2)},
        counters=counters,
    )


def test_aggregator_counts_completions_on_decode_instances_only() -> None:
    agg = LoadAggregator()
    agg.update(_scrape(10.0, [7.0, 4.0]), ["default"])
    load = agg.update(_scrape(12.0, [9.0, 8.0]), ["default"])[
        "default"
    ]  # a prefill hand-off is no completion
    assert load.completion_rps == 2.0
    bare = LoadAggregator()
    bare.update(_scrape(10.0, None), ["default"])
    assert math.isnan(bare.update(_scrape(12.0, None), ["default"])["default"].completion_rps)
