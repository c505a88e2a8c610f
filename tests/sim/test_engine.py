"""The simulator engine on hand-stepped virtual time, with the linear (analytic) latency model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts, fleet_from_dict, single_pool
from serving.sim.samples import (
    E2E_REQUEST_LATENCY_SECONDS,
    GENERATION_TOKENS_TOTAL,
    KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS_TOTAL,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PROMPT_TOKENS_TOTAL,
    REQUEST_SUCCESS_TOTAL,
    ROUTER_REQUESTS_TOTAL,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from serving.workload.trace import Trace

# base 10 ms per iteration, 0.01 ms per prefill token; KV moves at 1 GB/s: 1 µs per token of 1000 bytes
LAT = AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01)


def trace(
    arrival_s: list[float], prompt: list[int], output: list[int], priority: list[int] | None = None
) -> Trace:
    return Trace.from_arrays(
        np.array(arrival_s, dtype=np.float64),
        np.array(prompt),
        np.array(output),
        priority=None if priority is None else np.array(priority),
    )


def sim_of(
    fleet: FleetSpec, tr: Trace, profile: AnalyticProfile | None = None, lat: AnalyticLatency = LAT
) -> Simulator:
    return Simulator(fleet, {"default": tr}, models=analytic_models(profile or AnalyticProfile(), lat))


# id, fleet, trace, latency, expected TTFT ms per request, expected mean ITL ms per request
CASES = [
    pytest.param(
        single_pool(prefill=1, decode=1),
        trace([0.0], [1000], [11]),
        LAT,
        [31.0],
        [10.0],
        id="pd-single: ttft = prefill 20 + transfer 1 + first decode step 10, itl = step",
    ),
    pytest.param(
        single_pool(mixed=1),
        trace([0.0], [1000], [11]),
        LAT,
        [20.0],
        [10.0],
        id="mixed-single: ttft = prefill, itl = step",
    ),
    pytest.param(
        single_pool(mixed=1),
        trace([0.0], [1000], [11]),
        AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01, decode_ms_per_context_token=0.001),
        [20.0],
        [11.0045],
        id="mixed-growing-context: steps 11.000..11.009 ms, mean 11.0045",
    ),
    pytest.param(
        single_pool(mixed=1),
        trace([0.0, 0.0], [1000, 1000], [1, 1]),
        LAT,
        [20.0, 40.0],
        [math.nan, math.nan],
        id="mixed-queue: a same-instant arrival waits for the iteration in progress",
    ),
    pytest.param(
        single_pool(prefill=1, decode=1),
        trace([0.0, 0.005], [500, 500], [2, 2]),
        LAT,
        [25.5, 40.5],
        [10.0, 10.0],
        id="pd-queue: second waits 10 ms for prefill, lands mid-step on decode, joins at 35.5 ms",
    ),
    pytest.param(
        single_pool(prefill=1, decode=1),
        trace([0.0], [100], [1]),
        LAT,
        [21.1],
        [math.nan],
        id="pd-one-token: the decode instance still samples it: prefill 11 + transfer 0.1 + step 10",
    ),
    pytest.param(
        single_pool(prefill=1, decode=2),
        trace([0.0, 0.005], [1000, 1000], [2, 2]),
        AnalyticLatency(
            base_ms=10.0, prefill_ms_per_token=0.01, decode_ms_per_seq=1.0, decode_ms_per_context_token=0.001
        ),
        [33.0, 48.0],
        [12.001, 12.001],
        id="pd-ample-decode: ttft = queue 15 + prefill 20 + transfer 1 + one decode step 12 (10+1+1000/1000)",
    ),
]


@pytest.mark.parametrize(("fleet", "tr", "lat", "ttft_ms", "itl_ms"), CASES)
def test_hand_stepped_latencies(
    fleet: FleetSpec, tr: Trace, lat: AnalyticLatency, ttft_ms: list[float], itl_ms: list[float]
) -> None:
    sim = sim_of(fleet, tr, lat=lat)
    sim.run_until(10.0)
    rep = sim.report()
    assert rep.completed == len(tr)
    np.testing.assert_allclose(rep.request_ttft_ms, ttft_ms, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(rep.request_itl_ms, itl_ms, rtol=1e-9, atol=1e-9)


# One decode slot (max_num_seqs=1), two requests at t=0 of 1000 prompt tokens and 11 output tokens: prefill
# R0 0-20 ms, R1 20-40 ms (one slot there too); KV moves in 1 ms. R0 decodes 11 steps of 10 ms from 21 ms
# (first token at 31, done at 131); R1's KV lands at 41 ms and waits for the slot until 131 ms.
ONE_SLOT = AnalyticProfile(max_num_seqs=1)
TWO_AT_ONCE = trace([0.0, 0.0], [1000, 1000], [11, 11])
R1_BLOCKS = -(-1000 // 16)


def test_pd_ttft_includes_the_wait_for_a_decode_slot() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), TWO_AT_ONCE, ONE_SLOT)
    sim.run_until(10.0)
    rep = sim.report()
    np.testing.assert_allclose(rep.request_ttft_ms, [31.0, 141.0], rtol=1e-9)  # R1: 131 + its first step
    np.testing.assert_allclose(rep.request_itl_ms, [10.0, 10.0], rtol=1e-9)
    np.testing.assert_allclose(sim.req.t_done_s, [0.131, 0.241], rtol=1e-9)
    decode = sim.instances[1]
    assert decode.role == "decode" and decode.ttft.counts[-1] == 0 and sum(decode.ttft.counts) == 2
    # the decode instance's ITL histogram holds only gaps after a first token: 2 x 10 of 10 ms
    assert sum(decode.itl.counts) == 20 and decode.itl.sum == pytest.approx(20 * 0.010)


def test_pd_kv_stays_on_the_prefill_instance_until_decode_admits_it() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), TWO_AT_ONCE, ONE_SLOT)
    prefill = sim.instances[0]
    sim.run_until(0.1)  # R1 prefilled at 40 ms, its KV landed at 41 ms, no decode slot yet
    assert prefill.role == "prefill" and prefill.used_blocks == R1_BLOCKS and prefill.load == 0
    assert sim.observe().gauges[KV_CACHE_USAGE_PERC][0] == pytest.approx(R1_BLOCKS / prefill.total_blocks)
    sim.run_until(0.1315)  # R0 done at 131 ms: R1 admitted on decode, the prefill instance's blocks freed
    assert prefill.used_blocks == 0 and not prefill.held


def test_a_scrape_sees_a_first_token_when_its_decode_step_ends_not_when_the_run_does() -> None:
    # one request: KV lands at 21 ms, one decode run of 11 steps (21-131 ms) whose first step ends at 31 ms
    sim = sim_of(single_pool(prefill=1, decode=1), trace([0.0], [1000], [11]))
    sim.run_until(0.0309)
    assert sim.observe().histograms[TIME_TO_FIRST_TOKEN_SECONDS].counts[1, -1] == 0
    assert math.isnan(sim.report().request_ttft_ms[0])
    sim.run_until(0.031)
    ttft = sim.observe().histograms[TIME_TO_FIRST_TOKEN_SECONDS]
    assert ttft.counts[1, -1] == 1 and ttft.sums[1] == pytest.approx(0.031)
    assert sim.instances[1].busy  # still inside the run
    sim.run_until(1.0)
    assert sim.instances[1].ttft.sum == pytest.approx(0.031) and sum(sim.instances[1].ttft.counts) == 1


def test_a_draining_prefill_instance_lingers_until_its_kv_is_pulled() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), TWO_AT_ONCE, ONE_SLOT)
    sim.run_until(0.05)
    sim.set_target("default", "prefill", 0)
    prefill = sim.instances[0]
    sim.run_until(0.1)
    assert prefill.state == "draining"  # nothing to run, but R1's KV is still only here
    sim.run_until(1.0)
    assert prefill.state == "gone" and prefill.t_release_s == pytest.approx(0.131)
    assert sim.req.completions.tolist() == [1, 1]


def test_kv_lost_with_its_prefill_instance_is_recomputed_on_the_decode_instance() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), TWO_AT_ONCE, ONE_SLOT)
    sim.run_until(0.1)
    assert sim.fail_instance("default-prefill-0") == []  # R1 is queued on decode, not on the prefill
    sim.run_until(10.0)
    # R1 joins at 131 ms and prefills 1000 tokens there (20 ms): first token at 151, 10 steps to 251
    np.testing.assert_allclose(sim.report().request_ttft_ms, [31.0, 151.0], rtol=1e-9)
    np.testing.assert_allclose(sim.req.t_done_s, [0.131, 0.251], rtol=1e-9)
    assert sim.req.gen == [11, 11] and all(i.used_blocks == 0 for i in sim.instances)


def test_chunked_prefill_splits_a_long_prompt_and_batches_decode() -> None:
    # Budget 2048: the 3000-token prompt prefills in two chunks (2048 then 952).
    profile = AnalyticProfile(max_num_batched_tokens=2048)
    sim = sim_of(single_pool(mixed=1), trace([0.0], [3000], [3]), profile)
    sim.run_until(1.0)
    # chunk 1: 10 + 20.48 ms, chunk 2: 10 + 9.52 ms -> first token at 50 ms; then two 10 ms steps.
    np.testing.assert_allclose(sim.report().request_ttft_ms, [50.0])
    np.testing.assert_allclose(sim.req.t_done_s, [0.070])


def test_decode_run_is_cut_by_a_new_arrival_at_the_step_boundary() -> None:
    # Request 0 decodes 100 steps of 10 ms from t=20 ms; request 1 arrives at t=55 ms, is admitted at the
    # step boundary of 60 ms and prefills (10 + 1 ms) batched with request 0's step.
    sim = sim_of(single_pool(mixed=1), trace([0.0, 0.055], [1000, 100], [101, 2]))
    sim.run_until(5.0)
    np.testing.assert_allclose(sim.report().request_ttft_ms, [20.0, 16.0])
    assert sim.req.completions.tolist() == [1, 1]
    # request 0's 100 gaps: 99 decode steps of 10 ms and the mixed step of 11 ms
    assert sim.report().request_itl_ms[0] == pytest.approx((10 * 99 + 11) / 100, rel=1e-9)


def test_preemption_when_kv_is_full_and_requests_still_finish() -> None:
    profile = AnalyticProfile(kv_capacity_tokens=256, block_size=16, max_num_seqs=8)
    tr = trace([0.0] * 4, [50] * 4, [100] * 4)  # each needs up to 150 tokens of KV; 4 x 150 > 256
    sim = sim_of(single_pool(mixed=1), tr, profile)
    sim.run_until(30.0)
    assert sim.req.completions.tolist() == [1, 1, 1, 1]
    assert sim.req.preemptions.sum() > 0
    samples = sim.observe()
    assert samples.counters[NUM_PREEMPTIONS_TOTAL][0] == sim.req.preemptions.sum()
    assert samples.counters[GENERATION_TOKENS_TOTAL][0] == 400
    assert sim.instances[0].used_blocks == 0


def test_qos_priority_classes_are_served_vip_first_then_fcfs() -> None:
    profile = AnalyticProfile(max_num_seqs=1)
    # request 0 (normal) occupies the only slot; then batch, normal, vip, vip arrive while it runs
    tr = trace([0.0, 0.001, 0.002, 0.003, 0.004], [100] * 5, [5] * 5, priority=[1, 2, 1, 0, 0])
    sim = sim_of(single_pool(mixed=1), tr, profile)
    sim.run_until(10.0)
    order = np.argsort(sim.req.t_done_s, kind="stable").tolist()
    assert order == [0, 3, 4, 2, 1]


def test_gpu_seconds_count_provisioning_standby_and_draining() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), trace([0.0], [100], [2]))
    sim.run_until(10.0)
    sim.set_target("default", "decode", 2)  # a second decode instance starts a 120 s cold start
    sim.run_until(100.0)
    assert sim.gpu_seconds() == pytest.approx(2 * 100 + 90)
    assert sim.counts("default")["decode"]["provisioning"] == 1
    sim.set_target("default", "decode", 1)  # cancels the provisioning instance
    sim.set_target("default", "prefill", 1, standby=1)  # a standby instance cold-starts
    sim.run_until(300.0)
    assert sim.counts("default")["prefill"]["standby"] == 1
    assert sim.gpu_seconds() == pytest.approx(2 * 300 + 90 + 200)


def test_draining_finishes_in_flight_work_and_counts_gpu_time_until_done() -> None:
    # 1000 decode steps of 10 ms: ~10 s of work on the decode instance
    sim = sim_of(single_pool(prefill=1, decode=1), trace([0.0], [100], [1001]))
    sim.run_until(1.0)
    sim.set_target("default", "decode", 0)
    assert sim.counts("default")["decode"]["draining"] == 1
    sim.run_until(60.0)
    decode = next(i for i in sim.instances if i.role == "decode")
    assert decode.state == "gone"
    assert sim.req.completions.tolist() == [1]
    assert decode.t_release_s == pytest.approx(sim.req.t_done_s[0])
    assert sim.gpu_seconds() == pytest.approx(60.0 + sim.req.t_done_s[0])


def test_scale_to_zero_parks_requests_and_scale_back_serves_them() -> None:
    sim = sim_of(single_pool(prefill=1, decode=1), trace([5.0, 6.0], [100, 100], [3, 3]))
    sim.set_target("default", "prefill", 0)
    sim.run_until(10.0)
    assert sim.pending("default") == {"prefill": 2, "decode": 0}
    assert sim.req.completions.tolist() == [0, 0]
    sim.set_target("default", "prefill", 1)  # cold start: ready at 130 s
    sim.run_until(129.0)
    assert sim.req.completions.sum() == 0
    sim.run_until(131.0)
    assert sim.req.completions.tolist() == [1, 1]
    assert sim.report().request_ttft_ms[0] > 125_000


def test_standby_promotion_takes_the_activation_delay() -> None:
    fleet = single_pool(prefill=1, decode=1)
    sim = sim_of(fleet, trace([], [], []))
    sim.set_target("default", "decode", 1, standby=1)
    sim.run_until(121.0)
    assert sim.counts("default")["decode"]["standby"] == 1
    sim.set_target("default", "decode", 2, standby=0)
    assert sim.counts("default")["decode"]["activating"] == 1
    sim.run_until(125.5)
    assert sim.counts("default")["decode"]["active"] == 1
    sim.run_until(126.5)
    assert sim.counts("default")["decode"]["active"] == 2


def test_set_target_is_idempotent_and_clamps() -> None:
    pool = PoolSpec(prefill=RoleCounts(initial=1, min=1, max=3), decode=RoleCounts(initial=1, min=0, max=2))
    sim = Simulator(FleetSpec(pools=(pool,)), {}, models=analytic_models())
    assert sim.set_target("default", "prefill", 10, standby=5) == (3, 0)
    before = [(i.instance_id, i.state) for i in sim.instances]
    sim.set_target("default", "prefill", 10, standby=5)
    assert [(i.instance_id, i.state) for i in sim.instances] == before
    assert sim.set_target("default", "prefill", -4) == (1, 0)
    assert len(sim.scale_events) == 2
    with pytest.raises(ValueError, match="no 'mixed' role"):
        sim.set_target("default", "mixed", 1)


def test_crash_requeues_in_flight_requests_which_complete_elsewhere() -> None:
    sim = sim_of(single_pool(prefill=1, decode=2), trace([0.0, 0.0], [100, 100], [500, 500]))
    sim.run_until(1.0)
    victim = next(i for i in sim.instances if i.role == "decode" and i.load > 0)
    held = sim.fail_instance(victim.instance_id)
    assert held
    sim.run_until(60.0)
    assert sim.req.completions.tolist() == [1, 1]
    assert sum(sim.req.gen) == 1000
    assert victim.generation_tokens_total > 90  # steps finished before the crash were committed
    gen_counted = sum(i.generation_tokens_total for i in sim.instances)
    handoffs = sum(i.handoffs_total for i in sim.instances)
    assert handoffs >= 3  # both requests, and again the one the crash sent back to prefill
    assert gen_counted == 1000 + handoffs  # each prefill also sampled one token that the proxy drops
    assert victim.state == "failed"
    assert sim.counts("default")["decode"]["failed"] == 1


def test_router_only_uses_active_instances() -> None:
    tr = trace(list(np.linspace(0.0, 100.0, 50)), [100] * 50, [3] * 50)
    sim = sim_of(single_pool(prefill=1, decode=1), tr)
    sim.set_target("default", "prefill", 3, standby=1)  # two provisioning (ready at 120 s), one standby
    sim.run_until(110.0)
    s = sim.observe()
    for iid, state, n in zip(s.instance_ids, s.states, s.counters[ROUTER_REQUESTS_TOTAL], strict=True):
        if state != "active":
            assert n == 0, iid
    assert s.counters[ROUTER_REQUESTS_TOTAL].sum() == 2 * 50  # prefill + decode routing


def test_metrics_counters_monotone_and_gauges_match_state() -> None:
    rng = np.random.default_rng(3)
    n = 300
    tr = trace(
        list(np.sort(rng.uniform(0, 20, n))), list(rng.integers(10, 2000, n)), list(rng.integers(1, 300, n))
    )
    sim = sim_of(single_pool(prefill=2, decode=2), tr, AnalyticProfile(kv_capacity_tokens=8192))
    last: dict[tuple[str, str], float] = {}
    for t in np.arange(0.5, 120.0, 0.5):
        sim.run_until(float(t))
        s = sim.observe()
        for name in (
            PROMPT_TOKENS_TOTAL,
            GENERATION_TOKENS_TOTAL,
            REQUEST_SUCCESS_TOTAL,
            ROUTER_REQUESTS_TOTAL,
        ):
            for iid, v in zip(s.instance_ids, s.counters[name], strict=True):
                assert v >= last.get((iid, name), 0.0), (name, iid, t)
                last[(iid, name)] = v
        for k, inst in enumerate(i for i in sim.instances if i.state != "gone"):
            assert s.gauges[NUM_REQUESTS_RUNNING][k] + s.gauges[NUM_REQUESTS_WAITING][k] == inst.load
            assert 0.0 <= s.gauges[KV_CACHE_USAGE_PERC][k] <= 1.0
        e2e = s.histograms[E2E_REQUEST_LATENCY_SECONDS]
        assert (np.diff(e2e.counts, axis=1) >= 0).all()
        np.testing.assert_array_equal(e2e.counts[:, -1], s.counters[REQUEST_SUCCESS_TOTAL])
    assert sim.req.completions.tolist() == [1] * n
    s = sim.observe()
    handoffs = sum(i.handoffs_total for i in sim.instances)
    assert handoffs == n
    assert s.counters[GENERATION_TOKENS_TOTAL].sum() == sim.req.target_arr.sum() + handoffs
    assert s.counters[PROMPT_TOKENS_TOTAL].sum() == sim.req.prompt_arr.sum()
    assert (s.gauges[KV_CACHE_USAGE_PERC] == 0.0).all()


def test_pools_are_isolated() -> None:
    a = PoolSpec(name="a", prefill=RoleCounts(initial=1), decode=RoleCounts(initial=1))
    b = PoolSpec(name="b", prefill=RoleCounts(initial=1), decode=RoleCounts(initial=1), slo_ttft_ms=1.0)
    tr_a = trace([0.0, 0.001, 0.002], [1000] * 3, [50] * 3)
    tr_b = trace([0.0005, 0.0015], [200, 300], [20, 20])
    both = Simulator(FleetSpec(pools=(a, b)), {"a": tr_a, "b": tr_b}, models=analytic_models())
    alone = Simulator(FleetSpec(pools=(b,)), {"b": tr_b}, models=analytic_models())
    both.run_until(0.5)
    both.fail_instance("a-decode-0")
    both.set_target("a", "decode", 1)  # the actuator replaces the failed instance (cold start)
    both.run_until(200.0)
    alone.run_until(200.0)
    rep, rep_b = both.report(), alone.report()
    np.testing.assert_array_equal(rep.request_ttft_ms[rep.pool_index == 1], rep_b.request_ttft_ms)
    s = both.observe()
    routed = dict(zip(s.instance_ids, s.counters[ROUTER_REQUESTS_TOTAL], strict=True))
    assert routed["b-prefill-0"] == 2 and routed["b-decode-0"] == 2
    assert rep.pools["b"]["slo_attainment"] == 0.0 and rep.pools["a"]["completed"] == 3


def test_request_larger_than_kv_is_rejected_naming_it_and_the_rest_is_served() -> None:
    from serving.sim.engine import RejectedRequestWarning

    with pytest.warns(
        RejectedRequestWarning, match=r"request 1 \(arrival order\).* 20,001 KV tokens on a mixed"
    ):
        sim = sim_of(single_pool(mixed=1), trace([0.0, 1.0, 2.0], [10, 20000, 10], [1, 1, 1]))
    sim.run_to_completion()
    rep = sim.report()
    assert (rep.requests, rep.completed, rep.rejected, rep.unfinished) == (3, 2, 1, 0)
    assert math.isnan(rep.request_ttft_ms[1]) and rep.slo_attainment == pytest.approx(2 / 3)


def mixed_node_pool(prefill: int = 1, decode: int = 1, slowdown: float | None = 1.3) -> FleetSpec:
    pool = PoolSpec(
        placement="mixed-node",
        prefill=RoleCounts(initial=prefill),
        decode=RoleCounts(initial=decode),
        mixed_node_slowdown=slowdown,
    )
    return FleetSpec(pools=(pool,))


def test_mixed_node_hosts_a_pair_that_shares_gpus_and_partitions_kv() -> None:
    sim = sim_of(mixed_node_pool(prefill=2, decode=1), trace([], [], []), AnalyticProfile(gpus=4))
    nodes = {i.instance_id: i.node for i in sim.instances}
    assert nodes == {"default-prefill-0": "default-node-0", "default-prefill-1": "default-node-1",
                     "default-decode-0": "default-node-0"}  # fmt: skip
    by_id = {i.instance_id: i for i in sim.instances}
    assert by_id["default-prefill-0"].total_blocks == int(16384 * 0.4) // 16
    assert by_id["default-decode-0"].total_blocks == (16384 - int(16384 * 0.4)) // 16
    sim.run_until(100.0)
    assert sim.gpu_seconds() == pytest.approx(2 * 4 * 100.0)  # two nodes, not three instances
    sim.set_target("default", "decode", 2)  # goes to node 1, already holding its GPUs
    assert by_id["default-prefill-1"].node == sim.instances[-1].node
    sim.run_until(200.0)
    assert sim.gpu_seconds() == pytest.approx(2 * 4 * 200.0)


def test_mixed_node_decode_slows_while_its_prefill_sibling_is_busy() -> None:
    # R0's KV lands at 21 ms; it decodes in 10 ms steps (its first token at 31 ms); R1's prefill (55-75 ms)
    # cuts the run at 61 ms, two steps run at 13 ms (slowdown 1.3), the run is cut again at 87 ms when the
    # prefill instance goes idle; R1 (landed at 76 ms) joins then and gets its first token at 97 ms.
    sim = sim_of(mixed_node_pool(), trace([0.0, 0.055], [1000, 1000], [101, 2]))
    sim.run_until(5.0)
    rep = sim.report()
    np.testing.assert_allclose(rep.request_ttft_ms, [31.0, 42.0], rtol=1e-9)
    np.testing.assert_allclose(rep.request_itl_ms, [(98 * 10 + 2 * 13) / 100, 10.0], rtol=1e-9)


def test_fleet_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"pools\[x\]\.decode\.initial=5 is outside"):
        FleetSpec(pools=(PoolSpec(name="x", decode=RoleCounts(initial=5, max=2)),))


def test_fleet_config_document_round_trips_and_rejects_unknown_fields() -> None:
    doc = {
        "gpu_budget": 16,
        "pools": [{"name": "chat", "router": "context-aware", "prefill": {"initial": 2, "max": 8}}],
    }
    fleet = fleet_from_dict(doc, "f.yaml")
    assert fleet.gpu_budget == 16 and fleet.pool("chat").prefill == RoleCounts(initial=2, max=8)
    with pytest.raises(ValueError, match=r"f.yaml: pools\[0\]\.prefill: unknown field\(s\) \['inital'\]"):
        fleet_from_dict({"pools": [{"prefill": {"inital": 2}}]}, "f.yaml")
    with pytest.raises(ValueError, match=r"f.yaml: invalid FleetSpec"):
        fleet_from_dict({"gpu_budget": 0}, "f.yaml")
