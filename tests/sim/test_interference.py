"""The mixed-node interference derived from the operator timings (serving/sim/interference.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.capacity import mixed_node_capacity
from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.hardware import get_profile
from serving.sim.interference import (
    MAX_SLOWDOWN,
    Interference,
    busy_slowdown,
    mean_slowdown,
    prefill_share_tokens,
)
from serving.sim.latency import get_latency_model
from serving.workload.trace import Trace

MODEL = get_latency_model("llama3-8b/a100")


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 256),
    ctx=st.integers(16, 4096),
    prefill=st.lists(st.integers(1, 8192), min_size=2, max_size=4),
)
def test_busy_slowdown_is_bounded_and_monotone_in_the_prefill_work(
    batch: int, ctx: int, prefill: list[int]
) -> None:
    values = [busy_slowdown(MODEL, batch, batch * ctx, p) for p in sorted(prefill)]
    assert all(1.0 <= v <= MAX_SLOWDOWN for v in values)
    assert values == sorted(values), values


def test_mean_slowdown_is_monotone_in_the_prefill_busy_share() -> None:
    busy = busy_slowdown(MODEL, 64, 64 * 1500, 4096)
    shares = [0.0, 0.2, 0.5, 0.9, 1.0]
    means = [mean_slowdown(busy, s) for s in shares]
    assert means[0] == 1.0 and means[-1] == pytest.approx(busy) and means == sorted(means)
    assert means[1] < means[-1]


def test_the_derivation_follows_the_timings() -> None:
    """x prefill tokens take one decode step's time alone; the slowdown is the hybrid iteration over the
    step; no prefill work or no decode batch: no slowdown; longer contexts (more attention that does not
    merge with the prefill GEMMs) slow more."""
    alone = MODEL.iteration_ms(0, 0, 32, 32 * 1500)
    x = prefill_share_tokens(MODEL, alone, 8192)
    assert MODEL.iteration_ms(x, 0, 0, 0) <= alone < MODEL.iteration_ms(x + 1, 0, 0, 0)
    assert busy_slowdown(MODEL, 32, 32 * 1500, 8192) == pytest.approx(
        MODEL.iteration_ms(x, 0, 32, 32 * 1500) / alone
    )
    assert busy_slowdown(MODEL, 0, 0, 8192) == 1.0 and busy_slowdown(MODEL, 32, 32 * 1500, 0) == 1.0
    assert busy_slowdown(MODEL, 32, 32 * 4000, 8192) > busy_slowdown(MODEL, 32, 32 * 500, 8192)
    with pytest.raises(ValueError, match="decode_batch must be >= 0"):
        busy_slowdown(MODEL, -1, 0, 10)


def test_the_cache_quantises_but_agrees() -> None:
    cache = Interference(MODEL)
    assert cache.slowdown(32, 32 * 1472, 4096) == pytest.approx(busy_slowdown(MODEL, 32, 32 * 1472, 4096))
    assert cache.slowdown(0, 0, 4096) == 1.0


def _sim(slowdown: float | None) -> Simulator:
    pool = PoolSpec(
        placement="mixed-node",
        prefill=RoleCounts(initial=1),
        decode=RoleCounts(initial=1),
        mixed_node_slowdown=slowdown,
    )
    empty = Trace.from_arrays(*([] for _ in range(3)))  # type: ignore[arg-type]
    return Simulator(FleetSpec(pools=(pool,)), {"default": empty})


def test_the_simulator_derives_unless_the_override_is_given() -> None:
    derived = {i.role: i for i in _sim(None).instances}
    assert derived["decode"].interference is not None
    fixed = {i.role: i for i in _sim(1.7).instances}
    assert fixed["decode"].interference is None and fixed["decode"].slowdown == 1.7


def test_mixed_node_capacity_honours_the_override() -> None:
    profile = get_profile("llama3-8b/a100")

    def cap(s: float | None) -> float:
        c = mixed_node_capacity(profile, MODEL, 1000, 50, 1000, 250, prefill_mem_frac=0.4, slowdown=s)
        assert c.effective_slowdown == pytest.approx(1 + (c.busy_slowdown - 1) * c.prefill_busy)
        return c.decode.tokens_per_s

    assert cap(1.0) > cap(1.3) > cap(2.0)
    derived = mixed_node_capacity(profile, MODEL, 1000, 50, 1000, 250, prefill_mem_frac=0.4)
    assert 1.0 < derived.busy_slowdown <= MAX_SLOWDOWN
