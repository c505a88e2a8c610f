"""The controller's queue-aware stages see the simulator's gateway queue (serving.sim.router.GatewayPolicy).

A burst lands on a one-prefill, one-decode pool. Without a gateway it queues on the prefill instance (its
``vllm:num_requests_waiting``); with one, all but ``max_waiting`` wait at the gateway (``Simulator.pending``).
Either way the policies must see the same backlog.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.replay_policies import PredictivePolicy, view_counts
from forecaster.baselines import Holt
from forecaster.types import Forecaster
from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.replay import ReplayView
from serving.sim.router import GatewayPolicy
from serving.sim.samples import NUM_REQUESTS_WAITING
from serving.workload.trace import Trace


def holt() -> Forecaster:
    return Holt()


def _view(sim: Simulator) -> ReplayView:
    names = [p.name for p in sim.fleet.pools]
    return ReplayView(
        now_s=sim.now_s,
        fleet=sim.fleet,
        counts={n: sim.counts(n) for n in names},
        pending={n: sim.pending(n) for n in names},
        scrape=sim.observe,
    )


@pytest.mark.parametrize("gateway", [None, GatewayPolicy(max_waiting=2)], ids=["off", "on"])
def test_the_backlog_is_seen_wherever_it_waits(gateway: GatewayPolicy | None) -> None:
    fleet = FleetSpec(
        pools=(PoolSpec(prefill=RoleCounts(initial=1, max=8), decode=RoleCounts(initial=1, max=8)),)
    )
    n = 40
    trace = Trace.from_arrays(np.linspace(0.0, 0.5, n), np.full(n, 4000), np.full(n, 20))
    models = analytic_models(AnalyticProfile(), AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.05))
    sim = Simulator(fleet, {"default": trace}, models=models, gateway=gateway)
    sim.run_until(1.0)
    view = _view(sim)
    on_instances = float(
        sum(
            w
            for w, role in zip(view.samples.gauges[NUM_REQUESTS_WAITING], view.samples.roles, strict=True)
            if role == "prefill"
        )
    )
    counts = view_counts("default", view, {})
    held = sim.gateway_queued("default")["prefill"]
    assert counts.pending == held
    if gateway is None:
        assert held == 0
    else:
        assert held > 0 and on_instances <= gateway.max_waiting
    policy = PredictivePolicy(forecaster=holt)
    policy.reset(fleet, sim.traces)
    policy.on_tick(1.0, view)
    obs = policy.last_obs["default"]
    # the queue-aware stages read waiting_requests: the instances' queues plus the gateway's
    assert obs.waiting_requests == on_instances + held
    # 40 requests of 4000 tokens arrive in 0.5 s; 1 s in, most still wait, whichever side of the gateway
    assert obs.waiting_requests >= 20
