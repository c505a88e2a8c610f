"""Requests the gateway queue (or the router queue) holds on arrival still pay the latency model's admission
delay at the instance that takes them (the cpu-tiny API server is busy with the running streams whichever way
the request got there); without an admission term nothing changes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.latency import LinearLatencyModel
from serving.sim.router import GatewayPolicy
from serving.workload.trace import Trace
from tests.support.cpu_tiny import COEF, PROFILE, make_trace, replay_mixed

DELAY_MS = 200.0
_trace = make_trace
_report = replay_mixed


def _burst(n: int) -> Trace:
    # one long stream decodes from t = 0; a burst of n short requests arrives at 0.5 s while it does
    return _trace([0.0] + [0.5] * n, [64] + [128] * n, [2000] + [4] * n)


@settings(max_examples=10, deadline=None)
@given(extra=st.integers(1, 4), max_waiting=st.integers(1, 3))
def test_requests_held_at_the_gateway_pay_the_admission_delay(extra: int, max_waiting: int) -> None:
    n = max_waiting + extra  # more than the instance's room: some are held
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=DELAY_MS)
    report = _report(_burst(n), late, GatewayPolicy(max_waiting=max_waiting))
    ttft = np.asarray(report.request_ttft_ms)
    assert report.to_json()["completed"] == n + 1
    assert report.to_json()["pools"]["default"]["gateway_peak"]["mixed"] >= 1  # some were held
    # every burst request arrived while the stream decoded: each reaches the engine DELAY_MS later at least
    assert np.all(ttft[1:] >= DELAY_MS), ttft


def test_the_gateway_delays_no_request_less_than_without_it() -> None:
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=DELAY_MS)
    on = np.asarray(_report(_burst(4), late, GatewayPolicy(max_waiting=1)).request_ttft_ms)
    off = np.asarray(_report(_burst(4), late, None).request_ttft_ms)
    assert np.all(off[1:] >= DELAY_MS)
    # held ones wait for room, then pay the delay too: never earlier than the first of the burst
    assert np.all(on[2:] >= on[1]) and on[1] >= DELAY_MS


def test_a_request_on_its_way_in_counts_against_the_instance_room() -> None:
    # max_waiting 1: while the first burst request is in its admission delay the instance has no room, so the
    # others wait at the gateway instead of piling onto its queue
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=DELAY_MS)
    doc = _report(_burst(4), late, GatewayPolicy(max_waiting=1)).to_json()
    assert doc["pools"]["default"]["gateway_peak"]["mixed"] == 3


def test_without_an_admission_term_the_gateway_is_unchanged() -> None:
    plain = LinearLatencyModel(PROFILE, COEF, "test")
    a = _report(_burst(5), plain, GatewayPolicy(max_waiting=1)).to_json()
    b = _report(_burst(5), plain, GatewayPolicy(max_waiting=1)).to_json()
    a.pop("wall_s")
    b.pop("wall_s")
    assert a == b
    assert np.all(
        np.asarray(_report(_burst(5), plain, GatewayPolicy(max_waiting=1)).request_ttft_ms) < DELAY_MS
    )
