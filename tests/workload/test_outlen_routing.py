"""The output-length predictor in routing: the simulator's context-aware router and the live policy."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from serving.router.backends import BackendSpec, BackendView
from serving.router.policies import ContextAware, RouteContext, make_policy
from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.router import ContextAwareRouter, RouteRequest
from serving.sim.samples import PREDICTED_OUTPUT_TOKENS_TOTAL
from serving.workload.outlen import OutlenConfig, OutputLengthPredictor
from serving.workload.trace import Trace


@dataclass(frozen=True)
class B:
    instance_id: str
    load: int = 0
    marked: bool = False


def decode(predicted: float) -> RouteRequest:
    return RouteRequest(prompt_tokens=100, predicted_output_tokens=predicted, priority=1, stage="decode")


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        pytest.param(600.0, 1, id="above threshold: high-memory"),
        pytest.param(500.0, 0, id="at threshold: not long"),
        pytest.param(100.0, 0, id="short"),
        pytest.param(math.nan, 0, id="unknown: not long"),
    ],
)
def test_sim_router_threshold(predicted: float, expected: int) -> None:
    cands = [B("a"), B("b", marked=True)]
    assert ContextAwareRouter(long_output_tokens=500).choose(decode(predicted), cands) == expected


def test_sim_router_running_mean_ignores_unknown_predictions() -> None:
    r = ContextAwareRouter()
    cands = [B("a"), B("b", marked=True)]
    assert r.choose(decode(math.nan), cands) == 0
    assert r.choose(decode(100.0), cands) == 0  # first known: mean is 100 now, NaN did not count
    assert r.choose(decode(150.0), cands) == 1
    with pytest.raises(ValueError, match="long_output_tokens"):
        ContextAwareRouter(long_output_tokens=-1.0)


def pd_sim(tr: Trace, predictor: OutputLengthPredictor | None) -> Simulator:
    pool = PoolSpec(
        router="context-aware",
        prefill=RoleCounts(initial=1, max=2),
        decode=RoleCounts(initial=2, max=2),
        high_memory_decode=1,
    )
    models = analytic_models(AnalyticProfile(), AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01))
    return Simulator(FleetSpec(pools=(pool,)), {"default": tr}, models=models, output_predictor=predictor)


def test_simulator_predicts_at_arrival_and_learns_from_completions() -> None:
    """One request a second (each done before the next): request i is predicted from requests < i only."""
    out = np.array([10, 30, 50, 70])
    sim = pd_sim(Trace.from_arrays(np.arange(4.0), np.full(4, 100), out), OutputLengthPredictor())
    sim.run_until(10.0)
    predicted = np.array(sim.req.predicted)
    assert math.isnan(predicted[0])
    np.testing.assert_allclose(predicted[1:], [10.0, 20.0, 30.0])  # running means of earlier outputs
    samples = sim.observe()
    by_role = dict(zip(samples.roles, samples.counters[PREDICTED_OUTPUT_TOKENS_TOTAL].tolist(), strict=False))
    assert by_role["prefill"] == pytest.approx(60.0)  # counted at the entry instance; the NaN adds nothing
    oracle = pd_sim(Trace.from_arrays(np.arange(4.0), np.full(4, 100), out), None)
    assert oracle.req.predicted == [10.0, 30.0, 50.0, 70.0]  # no predictor: the trace's own (oracle)
    oracle.run_until(10.0)
    assert PREDICTED_OUTPUT_TOKENS_TOTAL not in oracle.observe().counters


def test_simulator_sends_predicted_long_outputs_to_the_high_memory_decode() -> None:
    """Short prompts get 8-token answers, long prompts 400 (4 s to decode; one arrival every 5 s): once
    learnt, long ones go to decode-0 (marked), short ones to decode-1."""
    n = 40
    long = np.arange(n) % 2 == 1
    tr = Trace.from_arrays(np.arange(n) * 5.0, np.where(long, 4000, 50), np.where(long, 400, 8))
    sim = pd_sim(tr, OutputLengthPredictor(OutlenConfig(bucket_prior=2.0)))
    sim.run_until(300.0)
    assert sim.report().completed == n
    marked = {i.index for i in sim.instances if i.role == "decode" and i.marked}
    on_marked = np.array([sim.req.where[r] in marked for r in range(n)])
    late = np.arange(n) >= 10
    assert on_marked[late & long].all()
    assert not on_marked[late & ~long].any()


def view(vid: str, high_memory: bool = False) -> BackendView:
    return BackendView(spec=BackendSpec(vid, f"http://{vid}:1", role="decode", high_memory=high_memory))


def test_live_policy_uses_its_predictor_once_it_has_learnt() -> None:
    policy = make_policy("context-aware")
    assert isinstance(policy, ContextAware)
    cands = [view("a"), view("b", high_memory=True)]
    ctx = RouteContext("decode", 4000, predicted_output_tokens=900.0, mean_output_tokens=100.0)
    assert policy.choose(ctx, cands) == "b"  # nothing learnt yet: the context's own figures decide
    for _ in range(20):
        policy.observe(50, 10, client="short")
        policy.observe(4000, 800, client="long")
    short = RouteContext(
        "decode", 50, predicted_output_tokens=900.0, mean_output_tokens=100.0, client="short"
    )
    assert policy.choose(short, cands) == "a"  # learnt: a 50-token prompt gets a short answer
    assert policy.choose(RouteContext("decode", 4000, client="long"), cands) == "b"
    capped = RouteContext("decode", 4000, client="long", max_tokens=16.0)
    assert policy.predicted_output(capped)[0] == 16.0
    assert policy.choose(capped, cands) == "a"


def test_live_policy_fixed_threshold() -> None:
    policy = ContextAware(long_output_tokens=500.0)
    cands = [view("a"), view("b", high_memory=True)]
    assert policy.choose(RouteContext("decode", 10, predicted_output_tokens=600.0), cands) == "b"
    assert policy.choose(RouteContext("decode", 10, predicted_output_tokens=400.0), cands) == "a"
    with pytest.raises(ValueError, match="long_output_tokens"):
        ContextAware(long_output_tokens=math.nan)
