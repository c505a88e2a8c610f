"""The controller's policies drive the real simulator: nothing lost, decisions explained, oracle cheapest."""

from __future__ import annotations

import numpy as np
import pytest

from controller.replay_policies import OraclePolicy, PredictivePolicy, oracle_needs
from forecaster.baselines import Holt
from serving.sim.fleet import single_pool
from serving.sim.replay import make_policy, replay
from serving.workload.trace import Trace


def _bursty_trace(seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    # 4 req/s for 200 s, a 30 req/s burst for 40 s, then 4 req/s again.
    segments = [(0.0, 200.0, 4.0), (200.0, 240.0, 30.0), (240.0, 400.0, 4.0)]
    arrivals = np.sort(np.concatenate([rng.uniform(a, b, rng.poisson((b - a) * r)) for a, b, r in segments]))
    n = len(arrivals)
    return Trace.from_arrays(arrivals - arrivals[0], rng.integers(200, 2000, n), rng.integers(20, 300, n))


@pytest.mark.parametrize("name", ["reactive", "dynamo-like", "predictive", "oracle", "static-peak"])
def test_every_policy_replays_without_loss(name: str) -> None:
    trace = _bursty_trace()
    policy = make_policy(name)
    if isinstance(policy, PredictivePolicy):
        policy.make_forecaster = Holt  # keep the test free of the checkpoint
    report = replay(single_pool(), {"default": trace}, policy)
    assert report.requests == len(trace)
    assert report.completed == len(trace) and report.dropped == 0
    assert report.gpu_seconds > 0


def test_predictive_explains_each_decision() -> None:
    policy = PredictivePolicy(forecaster=Holt)
    replay(single_pool(), {"default": _bursty_trace()}, policy)
    assert policy.decisions
    assert all(plan.reasons for _, plan in policy.decisions)
    assert max(plan.decode for _, plan in policy.decisions) >= 1


def test_oracle_is_cheaper_than_static_peak_and_needs_follow_the_burst() -> None:
    trace = _bursty_trace()
    prefill, decode = oracle_needs(single_pool().pools[0], trace, 5.0)
    assert decode[210:235].max() >= decode[100:190].max()
    assert prefill[210:235].max() > prefill[100:190].max()
    oracle = replay(single_pool(), {"default": trace}, OraclePolicy())
    static = replay(single_pool(), {"default": trace}, make_policy("static-peak"))
    assert oracle.gpu_seconds < static.gpu_seconds


def test_controller_policies_refuse_explicit_counts() -> None:
    from serving.sim.replay import PolicyOptions

    with pytest.raises(ValueError, match="only go with 'fixed'"):
        make_policy("predictive", PolicyOptions(prefill=2))
    with pytest.raises(ValueError, match="invalid parameters"):
        make_policy("predictive", PolicyOptions(params={"headroom": -1}))
