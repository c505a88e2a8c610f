"""Lease leader election against the fake API server, two replicas on one virtual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.clock import VirtualClock
from controller.leader import LeaderElector, LeaderSettings
from tests.support.kube_apiserver import FakeKubeApiServer

NS = "llm"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/pdscale-controller"


@pytest.fixture
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer() as server:
        yield server


def elector(kube: FakeKubeApiServer, identity: str, clock: VirtualClock) -> LeaderElector:
    from kubernetes import client as k8s

    cfg = k8s.Configuration()
    cfg.host = kube.url
    cfg.retries = False
    settings = LeaderSettings(namespace=NS, identity=identity, request_timeout_s=2.0)
    return LeaderElector.from_client(k8s.ApiClient(cfg), settings, clock)


def step(clock: VirtualClock, *replicas: LeaderElector, seconds: float = 2.0) -> list[bool]:
    out = [r.poll() for r in replicas]
    clock.advance(seconds)
    return out


def test_exactly_one_leads_and_the_other_takes_over_after_expiry(kube: FakeKubeApiServer) -> None:
    clock = VirtualClock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    for _ in range(10):
        assert step(clock, a, b) == [True, False]
    assert kube.lease(NS, "pdscale-controller")["spec"]["holderIdentity"] == "a"
    # a stops renewing (killed): b waits out the lease duration on its own clock, then takes over
    history = [step(clock, b, seconds=1.0)[0] for _ in range(20)]
    first = history.index(True)
    assert 13 <= first <= 17, history  # 15-s lease, seen unchanged from b's last poll
    assert all(history[first:])
    spec = kube.lease(NS, "pdscale-controller")["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # a comes back: it sees b holding and follows
    clock.advance(2.0)
    assert step(clock, a, b) == [False, True]


def test_a_leader_that_cannot_renew_stops_leading_before_the_lease_expires(kube: FakeKubeApiServer) -> None:
    clock = VirtualClock()
    a = elector(kube, "a", clock)
    assert step(clock, a) == [True]
    kube.inject_status(LEASE_PATH, 500, count=100)
    results = [step(clock, a, seconds=1.0)[0] for _ in range(14)]
    lost = results.index(False)
    assert lost <= 11, results  # renew deadline 10 s < lease duration 15 s
    assert a.failures >= 1


def test_release_hands_the_lease_over_at_once(kube: FakeKubeApiServer) -> None:
    clock = VirtualClock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert step(clock, a, b) == [True, False]
    a.release()
    assert not a.is_leader
    assert step(clock, b) == [True]


def test_settings_keep_the_timing_order() -> None:
    with pytest.raises(ValueError, match="lease_duration_s > renew_deadline_s > retry_period_s"):
        LeaderSettings(lease_duration_s=5.0, renew_deadline_s=10.0)
