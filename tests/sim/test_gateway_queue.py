"""The simulator's gateway queue (GatewayPolicy), on hand-stepped virtual time.

The analytic model with ``max_num_batched_tokens=2000``: one 2000-token prompt per iteration, 10 + 20 = 30 ms;
one output token, so a colocated request completes (and gets its first token) when its prefill ends.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator, TailPolicy
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.replay import make_policy, replay
from serving.sim.replay_cli import replay_cmd
from serving.sim.router import GatewayPolicy, GatewayQueue
from serving.sim.samples import REQUEST_SUCCESS_TOTAL, ROUTER_REQUESTS_TOTAL
from serving.workload.trace import Trace

LAT = AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01)
NONE = RoleCounts(initial=0, max=0)


def mixed_fleet(active: int = 1, slo_ttft_ms: float = 1000.0) -> FleetSpec:
    pool = PoolSpec(
        slo_ttft_ms=slo_ttft_ms, prefill=NONE, decode=NONE, mixed=RoleCounts(initial=active, max=4)
    )
    return FleetSpec(pools=(pool,))


def sim_of(
    f: FleetSpec,
    arrival_s: list[float],
    gateway: GatewayPolicy | None,
    priority: list[int] | None = None,
    cold_start_s: float = 120.0,
    tail: TailPolicy | None = None,
) -> Simulator:
    n = len(arrival_s)
    tr = Trace.from_arrays(
        np.array(arrival_s),
        np.full(n, 2000),
        np.ones(n, dtype=np.int64),
        priority=np.array(priority if priority is not None else [1] * n),
    )
    profile = AnalyticProfile(max_num_batched_tokens=2000, cold_start_s=cold_start_s)
    return Simulator(f, {"default": tr}, models=analytic_models(profile, LAT), gateway=gateway, tail=tail)


# -- the queue itself -----------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=2), max_size=40))
def test_queue_pops_by_class_then_fcfs(priorities: list[int]) -> None:
    q = GatewayQueue()
    for rid, p in enumerate(priorities):
        q.push(rid, p)
    assert len(q) == len(priorities)
    popped = [q.pop() for _ in range(len(priorities))]
    assert popped == sorted(range(len(priorities)), key=lambda r: (priorities[r], r))
    assert not q
    with pytest.raises(IndexError, match="empty gateway queue"):
        q.pop()


def test_queue_remove_and_rids() -> None:
    q = GatewayQueue()
    for rid, p in [(0, 1), (1, 1), (2, 0), (3, 2)]:
        q.push(rid, p)
    assert q.rids() == [2, 0, 1, 3]
    assert q.remove(1, 1) and not q.remove(1, 1) and not q.remove(3, 0)
    assert q.rids() == [2, 0, 3] and len(q) == 3


def test_policy_rejects_a_bad_threshold() -> None:
    with pytest.raises(ValueError, match="max_waiting=0"):
        GatewayPolicy(max_waiting=0)


# -- dispatch ------------------------------------------------------------------------------------------
# A, B, C, D (normal) at t=0, E (VIP) at 10 ms, one instance. Off: all five queue on the instance and the VIP
# overtakes B (heap by class). On with max_waiting=1: A runs, B waits on the instance (its lookahead), C and D
# wait at the gateway; E arrives behind no one of its class and takes the instance's next free place after B.
ARRIVALS = [0.0, 0.0, 0.0, 0.0, 0.010]
PRIORITIES = [1, 1, 1, 1, 0]


@pytest.mark.parametrize(
    ("gateway", "done_ms"),
    [
        pytest.param(None, [30, 90, 120, 150, 60], id="off: every request on the instance, the VIP first"),
        pytest.param(GatewayPolicy(max_waiting=1), [30, 60, 120, 150, 90], id="on: B already placed, then E"),
    ],
)
def test_dispatch_is_fcfs_by_class(gateway: GatewayPolicy | None, done_ms: list[float]) -> None:
    sim = sim_of(mixed_fleet(), ARRIVALS, gateway, PRIORITIES)
    sim.run_until(0.005)
    held = 2 if gateway is not None else 0
    assert sim.gateway_queued("default") == {"mixed": held}
    assert sim.pending("default") == {"mixed": held}  # what the controller adds to the waiting requests
    sim.run_until(0.015)
    assert sim.pending("default") == {"mixed": held + (gateway is not None)}
    sim.run_until(1.0)
    rep = sim.report()
    np.testing.assert_allclose(rep.request_ttft_ms + np.array(ARRIVALS) * 1000, done_ms, atol=1e-9)
    assert rep.completed == len(ARRIVALS)
    assert sim.pending("default") == {"mixed": 0}
    if gateway is not None:
        assert rep.pools["default"]["gateway_peak"] == {"mixed": 3}
    else:
        assert "gateway_peak" not in rep.pools["default"]


@pytest.mark.parametrize("gateway", [None, GatewayPolicy(max_waiting=2)], ids=["off", "on"])
def test_an_instance_coming_up_drains_the_gateway(gateway: GatewayPolicy | None) -> None:
    """Ten requests at t=0 on one instance; two more start at once (50-ms cold start). Off: the ten stay on
    the first instance (the last done at 300 ms). On: the new instances take what the gateway holds."""
    sim = sim_of(mixed_fleet(), [0.0] * 10, gateway, cold_start_s=0.05)
    sim.set_target("default", "mixed", 3)
    sim.run_until(1.0)
    rep = sim.report()
    assert rep.completed == 10 and sim.unfinished() == 0
    counters = sim.observe().counters
    # each request counted once by the router counters, as it arrives (held ones on an active instance)
    assert counters[ROUTER_REQUESTS_TOTAL].tolist() == [10, 0, 0]
    served = counters[REQUEST_SUCCESS_TOTAL].tolist()
    if gateway is None:
        assert served == [10, 0, 0]
        assert np.max(rep.request_ttft_ms) == pytest.approx(300.0)
    else:
        # t=0: one running + two waiting on the instance, seven at the gateway; by 50 ms the first has taken
        # one more (it finished one at 30 ms); the seven left go to the three instances as they free up
        assert served[1] > 0 and served[2] > 0
        assert np.max(rep.request_ttft_ms) < 200.0


def test_the_gateway_waits_for_the_first_instance() -> None:
    """No instance active: requests wait at the gateway (counted as pending), none is lost; the instance
    started at 10 ms is ready at 60 ms and serves them in order."""
    sim = sim_of(mixed_fleet(active=0), [0.0, 0.0, 0.0], GatewayPolicy(max_waiting=1), cold_start_s=0.05)
    sim.run_until(0.01)
    assert sim.pending("default") == {"mixed": 3}
    sim.set_target("default", "mixed", 1)
    sim.run_until(1.0)
    assert sim.report().completed == 3
    np.testing.assert_allclose(sim.report().request_ttft_ms, [90.0, 120.0, 150.0], atol=1e-9)


def test_a_tail_request_at_the_gateway_jumps_its_queue() -> None:
    """With tail promotion, a request held at the gateway past half its TTFT SLO goes ahead of every class."""
    tail = TailPolicy(fraction=0.5, promote_standby=False)
    sim = sim_of(
        mixed_fleet(slo_ttft_ms=100.0),
        [0.0, 0.0, 0.0, 0.055],
        GatewayPolicy(max_waiting=1),
        [1, 1, 1, 0],
        tail=tail,
    )
    sim.run_until(1.0)
    rep = sim.report()
    # A runs, B waits on the instance, C at the gateway is promoted at 50 ms (before the VIP D arrives)
    np.testing.assert_allclose(rep.request_ttft_ms, [30.0, 60.0, 90.0, 65.0], atol=1e-9)
    assert rep.pools["default"]["tail_promotions"] == 1


# -- none dropped, the invariant, P/D -----------------------------------------------------------------
def pd_fleet() -> FleetSpec:
    pool = PoolSpec(prefill=RoleCounts(initial=1, max=3), decode=RoleCounts(initial=1, max=3))
    return FleetSpec(pools=(pool,))


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=25),
    st.lists(st.integers(min_value=1, max_value=1500), min_size=25, max_size=25),
    st.lists(st.integers(min_value=1, max_value=40), min_size=25, max_size=25),
    st.integers(min_value=1, max_value=3),
)
def test_pd_none_dropped_and_no_idle_room_while_held(
    arrivals: list[float], prompts: list[int], outputs: list[int], max_waiting: int
) -> None:
    n = len(arrivals)
    tr = Trace.from_arrays(np.sort(np.array(arrivals)), np.array(prompts[:n]), np.array(outputs[:n]))
    profile = AnalyticProfile(max_num_seqs=4, cold_start_s=0.2)
    sim = Simulator(
        pd_fleet(), {"default": tr}, models=analytic_models(profile, LAT), gateway=GatewayPolicy(max_waiting)
    )
    sim.set_target("default", "prefill", 3)
    sim.set_target("default", "decode", 3)
    t = 0.0
    while t < 5.0:
        t += 0.01
        sim.run_until(t)
        for pool in sim.pools:
            for role, gq in pool.gateway.items():
                if gq:  # held only while no active instance of the role has room
                    assert all(len(i.waiting) >= max_waiting for i in pool.ready[role])
    rep = sim.report()
    assert rep.completed == n and sim.unfinished() == 0
    assert (sim.req.completions == 1).all()


# -- off is today's behaviour ---------------------------------------------------------------------------
def test_unbounded_lookahead_is_the_same_replay_as_off() -> None:
    """With room everywhere (max_waiting huge) the gateway never holds a request: the replay is identical
    to the one without a gateway (the JSON but for the gateway's own field)."""
    rng = np.random.default_rng(3)
    n = 300
    tr = Trace.from_arrays(
        np.sort(rng.uniform(0.0, 30.0, n)), rng.integers(50, 3000, n), rng.integers(1, 300, n)
    )
    docs = []
    for gateway in (None, GatewayPolicy(max_waiting=10**9)):
        rep = replay(
            pd_fleet(), {"default": tr}, make_policy("fixed"), models=analytic_models(), gateway=gateway
        )
        doc = rep.to_json()
        doc.pop("wall_s", None)
        for pool in doc["pools"].values():
            pool.pop("gateway_peak", None)
        docs.append(json.dumps(doc, sort_keys=True))
    assert docs[0] == docs[1]


def test_a_step_takes_what_its_budget_allows_beyond_the_lookahead() -> None:
    """Twenty 200-token prompts at t=0, one instance, max_waiting=1: at each step boundary the instance takes
    from the gateway as many prompts as its 2000-token step can start (not one per step), so every request
    gets its first token when it would without a gateway."""
    n = 20
    ttfts = []
    for gateway in (None, GatewayPolicy(max_waiting=1)):
        tr = Trace.from_arrays(np.zeros(n), np.full(n, 200), np.ones(n, dtype=np.int64))
        profile = AnalyticProfile(max_num_batched_tokens=2000)
        sim = Simulator(mixed_fleet(), {"default": tr}, models=analytic_models(profile, LAT), gateway=gateway)
        sim.run_until(1.0)
        ttfts.append(sim.report().request_ttft_ms)
    np.testing.assert_allclose(ttfts[1], ttfts[0], atol=1e-9)
    assert len(np.unique(ttfts[0])) == 3  # one alone, then ten, then nine per step


def test_cli_gateway_queue_reaches_the_simulator(tmp_path: Path) -> None:
    """`pdscale replay --gateway-queue on` holds the burst at the gateway (gateway_peak in the JSON); off is
    the default and leaves the JSON as it was; a bad value and --fleet are refused with exit code 2."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s // 30:02d}.{(s % 30) * 33000:06d},8000,20" for s in range(60)]
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(rows) + "\n")
    app = typer.Typer()
    app.command()(replay_cmd)
    base = ["--trace", str(path), "--policy", "fixed", "--prefill", "1", "--decode", "1"]
    docs = {}
    for name, extra in {
        "default": [],
        "off": ["--gateway-queue", "off"],
        "on": ["--gateway-queue", "on"],
    }.items():
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(app, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs[name] = json.loads(out.read_text())
        docs[name].pop("wall_s")
    assert docs["default"] == docs["off"] and "gateway_peak" not in docs["off"]["pools"]["default"]
    on = docs["on"]
    assert on["completed"] == 60 and on["pools"]["default"]["gateway_peak"]["prefill"] > 0
    bad = CliRunner().invoke(app, [*base, "--gateway-queue", "maybe"])
    assert bad.exit_code == 2 and "--gateway-queue must be on or off" in bad.output
    clash = CliRunner().invoke(app, ["--fleet", str(path), "--gateway-queue", "on"])
    assert clash.exit_code == 2 and "--gateway-queue on" in clash.output
    ignored = CliRunner().invoke(app, [*base, "--gateway-max-waiting", "3"])
    assert (
        ignored.exit_code == 2
        and "--gateway-max-waiting applies with --gateway-queue on only" in ignored.output
    )
