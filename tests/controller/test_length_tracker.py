"""LengthTracker's output-length estimate: a floor while decode warms up or is saturated, plain EWMA elsewhere."""

from __future__ import annotations

import copy
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.pipeline import LengthTracker, Pipeline, PoolCounts
from controller.sources.aggregate import PoolLoad


def _load(arrival_rps: float, gen_tps: float, running: float = 10.0) -> PoolLoad:
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
        kv_usage=nan,
        ttft_p50_s=nan,
        ttft_p90_s=nan,
        itl_p50_s=nan,
        itl_p90_s=nan,
        mean_prompt_tokens=100.0,
        complete=True,
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


def test_pipeline_flags_a_saturated_decode_fleet() -> None:
    counts = PoolCounts(replicas={"decode": 2}, active={"decode": 2}, standby={}, provisioning={})

    class _Cap:
        decode_seqs = 100.0

    class _Cache:
        def get(self, *_: object) -> _Cap:
            return _Cap()

    class _Track:
        capacity = _Cache()
        lengths = LengthTracker()

    full = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=180.0), counts)  # type: ignore[arg-type]
    room = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=179.0), counts)  # type: ignore[arg-type]
    none = Pipeline._decode_capped(_Track(), _load(1.0, 100.0, running=math.nan), counts)  # type: ignore[arg-type]
    assert (full, room, none) == (True, False, False)
