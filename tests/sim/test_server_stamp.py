"""The exported TTFT and e2e histograms count from vLLM's arrival stamp: the outside shares of the cpu-tiny request
overhead and admission delay (client-side terms) are left out of them, the wake-up (the engine's) stays in; the
client's figures never change, and with the shares 0 (the default) both views agree as before."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.engine import Simulator
from serving.sim.fleet import single_pool
from serving.sim.hardware import ProfileError
from serving.sim.latency import LinearLatencyModel
from serving.workload.trace import Trace
from tests.support.cpu_tiny import COEF, PROFILE
from tests.support.cpu_tiny import make_trace as _trace

OUTSIDE = {"request_overhead_outside_fraction": 1.0, "admission_outside_fraction": 1.0}


def _run(trace: Trace, **terms: Any) -> Simulator:
    model = LinearLatencyModel(PROFILE, COEF, "test", **terms)
    sim = Simulator(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        models=lambda _name: (PROFILE, model),
    )
    sim.run_until(120.0)
    assert sim.report().completed == len(trace)
    return sim


def _exported(sim: Simulator) -> tuple[float, float, int]:
    """Exported TTFT and e2e sums (ms) over the fleet, and the TTFT count."""
    ttft = sum(i.ttft.sum for i in sim.instances) * 1000.0
    e2e = sum(i.e2e.sum for i in sim.instances) * 1000.0
    return ttft, e2e, sum(sum(i.ttft.counts) for i in sim.instances)


def _client(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    """Client TTFT and e2e per request (ms), from the arrival."""
    req = sim.req
    return (req.t_first_s - req.arrival_s) * 1000.0, (req.t_done_s - req.arrival_s) * 1000.0


@settings(max_examples=20, deadline=None)
@given(overhead_ms=st.floats(0.5, 200.0), prompt=st.integers(1, 900), output=st.integers(1, 64))
def test_exported_ttft_and_e2e_leave_the_request_overhead_out(
    overhead_ms: float, prompt: int, output: int
) -> None:
    trace = _trace([0.0, 30.0], [prompt, prompt], [output, output])  # far apart: no interaction
    base = _run(trace)
    sim = _run(trace, request_overhead_ms=overhead_ms, **OUTSIDE)
    ttft, e2e = _client(sim)
    ttft0, _ = _client(base)
    np.testing.assert_allclose(ttft, ttft0 + overhead_ms, atol=1e-6)  # the client's view keeps it
    got_ttft, got_e2e, n = _exported(sim)
    assert n == 2
    assert got_ttft == pytest.approx(float(np.sum(ttft)) - 2 * overhead_ms, abs=1e-6)
    assert got_e2e == pytest.approx(float(np.sum(e2e)) - 2 * overhead_ms, abs=1e-6)
    # and it is what the server saw without the overhead at all
    assert got_ttft == pytest.approx(_exported(base)[0], abs=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    running=st.integers(1, 6),
    overhead_ms=st.floats(0.0, 30.0),
    busy_ms=st.floats(1.0, 80.0),
    per_seq_ms=st.floats(0.0, 40.0),
)
def test_exported_ttft_leaves_the_admission_delay_out(
    running: int, overhead_ms: float, busy_ms: float, per_seq_ms: float
) -> None:
    # `running` long streams start together on an idle instance (no delay); a probe arrives while they decode
    trace = _trace([0.0] * running + [0.5], [64] * running + [256], [400] * running + [1])
    sim = _run(
        trace,
        request_overhead_ms=overhead_ms,
        admission_busy_ms=busy_ms,
        admission_ms_per_running_seq=per_seq_ms,
        **OUTSIDE,
    )
    ttft, e2e = _client(sim)
    delay = busy_ms + per_seq_ms * running
    got_ttft, got_e2e, _ = _exported(sim)
    outside = (running + 1) * overhead_ms + delay
    assert got_ttft == pytest.approx(float(np.sum(ttft)) - outside, abs=1e-6)
    assert got_e2e == pytest.approx(float(np.sum(e2e)) - outside, abs=1e-6)
    assert sim.req.stamp[-1] == pytest.approx(0.5 + (overhead_ms + delay) / 1000.0, abs=1e-12)


def test_young_stream_admission_delay_is_outside_too() -> None:
    # loops of short requests: the probe at 0.2 s finds young streams decoding
    trace = _trace([0.0, 0.0, 0.2], [64, 64, 256], [40, 40, 1])
    sim = _run(trace, admission_young_busy_ms=50.0, admission_young_tokens=64, **OUTSIDE)
    ttft, _ = _client(sim)
    got_ttft, _, _ = _exported(sim)
    assert got_ttft == pytest.approx(float(np.sum(ttft)) - 50.0, abs=1e-6)


def test_the_wake_up_stays_inside_the_servers_ttft() -> None:
    """The engine core's wake-up after an idle spell happens after vLLM's arrival stamp: both views pay it."""
    trace = _trace([0.0, 5.0], [128, 128], [4, 4])
    sim = _run(trace, request_overhead_ms=10.0, wake_up_ms=30.0, **OUTSIDE)
    ttft, _ = _client(sim)
    got_ttft, _, _ = _exported(sim)
    assert got_ttft == pytest.approx(float(np.sum(ttft)) - 2 * 10.0, abs=1e-6)
    no_wake = _exported(_run(trace, request_overhead_ms=10.0, **OUTSIDE))[0]
    assert got_ttft == pytest.approx(no_wake + 30.0, abs=1e-6)  # the second request finds the instance idle


def test_a_deferred_first_token_counts_at_the_engine_from_the_stamp() -> None:
    trace = _trace([0.0, 30.0], [128, 128], [8, 8])
    plain = _run(trace, request_overhead_ms=12.0, **OUTSIDE)
    deferred = _run(trace, request_overhead_ms=12.0, first_token_deferred_fraction=1.0, **OUTSIDE)
    ttft, e2e = _client(deferred)
    np.testing.assert_allclose(ttft, e2e)  # the client gets every first token with the last
    assert _exported(deferred)[0] == pytest.approx(_exported(plain)[0], abs=1e-9)
    assert _exported(deferred)[0] == pytest.approx(float(np.sum(_client(plain)[0])) - 2 * 12.0, abs=1e-6)


BUSY = _trace([0.0, 0.01, 0.02, 0.5, 0.52, 0.9], [300, 120, 512, 64, 200, 400], [30, 5, 32, 1, 12, 20])


@pytest.mark.parametrize(
    "terms",
    [
        {"wake_up_ms": 5.0, **OUTSIDE},  # nothing to leave out
        {"request_overhead_ms": 15.0, "admission_busy_ms": 30.0, "wake_up_ms": 5.0},  # shares 0: all inside
    ],
)
def test_with_nothing_outside_the_stamp_is_the_arrival_and_both_views_agree(terms: dict[str, float]) -> None:
    trace = BUSY
    sim = _run(trace, **terms)
    assert sim.req.stamp == sim.req.arrival
    ttft, e2e = _client(sim)
    got_ttft, got_e2e, _ = _exported(sim)
    assert got_ttft == pytest.approx(float(np.sum(ttft)), abs=1e-9)
    assert got_e2e == pytest.approx(float(np.sum(e2e)), abs=1e-9)
    assert not any(math.isnan(x) for x in ttft)


@settings(max_examples=15, deadline=None)
@given(share_o=st.floats(0.0, 1.0), share_a=st.floats(0.0, 1.0))
def test_a_share_leaves_that_part_out(share_o: float, share_a: float) -> None:
    trace = _trace([0.0, 0.5], [64, 256], [400, 1])  # the second arrives while the first decodes
    sim = _run(
        trace,
        request_overhead_ms=20.0,
        admission_busy_ms=40.0,
        request_overhead_outside_fraction=share_o,
        admission_outside_fraction=share_a,
    )
    ttft, _ = _client(sim)
    np.testing.assert_allclose(
        ttft, _client(_run(trace, request_overhead_ms=20.0, admission_busy_ms=40.0))[0]
    )
    assert _exported(sim)[0] == pytest.approx(
        float(np.sum(ttft)) - 2 * 20.0 * share_o - 40.0 * share_a, abs=1e-6
    )


def test_shares_must_be_in_0_1() -> None:
    for name in OUTSIDE:
        with pytest.raises(ProfileError, match=name):
            LinearLatencyModel(PROFILE, COEF, "test", **{name: 1.5})
