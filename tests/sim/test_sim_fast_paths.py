"""The simulator's shortcuts give what the general paths give, to the last digit: the operator model's unchecked
decode step against ``iteration_ms``, least-loaded routing done by the simulator against the router object."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.fleet import single_pool
from serving.sim.hardware import get_profile, list_profiles
from serving.sim.latency import build_operator_model
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.sim.router import LeastLoadedRouter, register_router
from serving.workload.trace import Trace

GPU_PROFILES = [n for n in list_profiles() if n != "cpu-tiny"]


@pytest.mark.parametrize("name", GPU_PROFILES)
@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.integers(1, 512), st.integers(0, 4_000_000), st.integers(0, 4096)),
        min_size=1,
        max_size=20,
    )
)
def test_decode_ms_is_iteration_ms_of_a_decode_step(name: str, calls: list[tuple[int, int, int]]) -> None:
    """Equal floats, whatever was asked before (both paths memoise per batch size; prefill calls of the same
    batch tokens come in between)."""
    model = build_operator_model(get_profile(name))
    for batch, context, prefill in calls:
        if prefill:
            model.iteration_ms(prefill, 0, 0, 0)
        want = model.iteration_ms(0, 0, batch, context)
        assert model.decode_ms(batch, context) == want
        assert model.decode_ms(batch, context) == model.iteration_ms(0.0, 0.0, float(batch), float(context))
        assert not math.isnan(want)


class _ObjectLeastLoaded(LeastLoadedRouter):
    """The same policy, not the built-in type: the simulator asks it through ``choose`` with a RouteRequest."""

    name = "least-loaded-object"


def _trace(seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / 25.0, 1500))
    n = len(arrival)
    return Trace.from_arrays(arrival - arrival[0], rng.integers(50, 3000, n), rng.integers(1, 400, n))


@pytest.mark.parametrize("seed", [0, 1])
def test_least_loaded_shortcut_routes_as_the_router(seed: int) -> None:
    register_router("least-loaded-object", _ObjectLeastLoaded)
    trace = _trace(seed)
    docs = []
    for router in ("least-loaded", "least-loaded-object"):
        fleet = single_pool(prefill=3, decode=3, router=router)
        report = replay(fleet, {"default": trace}, make_policy("fixed", PolicyOptions(prefill=3, decode=3)))
        doc = report.to_json()
        doc.pop("wall_s")
        docs.append((doc, report.request_ttft_ms, report.request_itl_ms))
    (doc_a, ttft_a, itl_a), (doc_b, ttft_b, itl_b) = docs
    assert doc_a == doc_b
    np.testing.assert_array_equal(ttft_a, ttft_b)  # NaN (one-token outputs' ITL) equal to NaN
    np.testing.assert_array_equal(itl_a, itl_b)
    assert doc_a["completed"] == len(trace)
