"""PD-mixed-node pools under the controller's policies: whole nodes, the binding role, no standby (issue 8)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import controller.replay_policies  # noqa: F401  (registers the policies)
from controller.capacity import pool_capacity
from controller.config import ControllerConfig, PolicyConfig
from controller.pipeline import setups_from_config
from controller.policy.mixed_node import binding_role, node_plan
from controller.policy.types import ScalingPlan
from controller.replay_policies import PredictivePolicy, pool_plan
from forecaster.baselines import Holt
from forecaster.types import Forecaster
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts, single_pool
from serving.sim.fleet_file import peak_demand_gpus
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay, static_peak_counts
from serving.sim.replay_cli import replay_cmd
from serving.workload.trace import Trace


def mixed_fleet(slowdown: float | None = None, **pool: Any) -> FleetSpec:
    fleet = single_pool(max_per_role=32)
    spec = dataclasses.replace(fleet.pools[0], placement="mixed-node", mixed_node_slowdown=slowdown, **pool)
    return dataclasses.replace(fleet, pools=(spec,))


def steady(rate_rps: float, prompt: int, output: int, duration_s: float = 90.0) -> Trace:
    n = int(rate_rps * duration_s)
    arrival = np.arange(n, dtype=np.float64) / rate_rps
    return Trace.from_arrays(arrival, np.full(n, prompt), np.full(n, output))


def holt() -> Forecaster:
    return Holt()


def make(name: str) -> ReplayPolicy:
    if name == "predictive":
        return PredictivePolicy(PolicyConfig(), forecaster=holt)
    return make_policy(name, PolicyOptions())


def plan(prefill: int, decode: int, standby: int = 0) -> ScalingPlan:
    return ScalingPlan("default", prefill, decode, standby, standby, reasons=("sized",))


def test_node_plan_takes_the_larger_need_and_names_the_binding_role() -> None:
    pre = node_plan(plan(5, 2))
    assert (pre.prefill, pre.decode) == (5, 5) and pre.reasons[0] == "sized"
    assert "prefill binds" in pre.reasons[-1] and "3 decode instance(s) spare" in pre.reasons[-1]
    dec = node_plan(plan(1, 4, standby=2))
    assert (dec.prefill, dec.decode, dec.standby_prefill, dec.standby_decode) == (4, 4, 0, 0)
    assert "decode binds" in dec.reasons[-1] and "no standby tier" in dec.reasons[-1]
    assert node_plan(plan(9, 3), min_nodes=1, max_nodes=6).prefill == 6
    assert node_plan(plan(0, 0), min_nodes=2).decode == 2
    assert binding_role(3, 3) == "prefill"


def test_pool_plan_uses_both_roles_bounds_and_leaves_dedicated_pools_alone() -> None:
    spec = mixed_fleet(
        prefill=RoleCounts(initial=2, min=2, max=8), decode=RoleCounts(initial=2, min=1, max=5)
    )
    p = pool_plan(plan(1, 9), spec.pools[0])
    assert (p.prefill, p.decode) == (5, 5)
    dedicated = single_pool().pools[0]
    assert pool_plan(plan(1, 9), dedicated) == plan(1, 9)


def test_mixed_capacity_is_partitioned_and_shrinks_with_interference() -> None:
    dedicated = pool_capacity(single_pool().pools[0], 1000.0, 250.0)
    caps = [pool_capacity(mixed_fleet(s).pools[0], 1000.0, 250.0) for s in (1.0, 1.3, 2.0)]
    assert all(c.decode_seqs < dedicated.decode_seqs for c in caps)  # 60 % of the KV at most
    seqs = [c.decode_seqs for c in caps]
    assert seqs == sorted(seqs, reverse=True) and seqs[0] > seqs[-1]
    derived = pool_capacity(mixed_fleet(None).pools[0], 1000.0, 250.0)
    assert caps[-1].decode_seqs <= derived.decode_seqs <= caps[0].decode_seqs


@pytest.mark.parametrize(
    ("name", "prompt", "output", "binds"),
    [
        ("reactive", 4000, 8, "prefill binds"),
        ("reactive", 64, 1500, "decode binds"),
        ("predictive", 4000, 8, "prefill binds"),
        ("predictive", 64, 1500, "decode binds"),
    ],
)
def test_policies_size_nodes_from_the_binding_role(name: str, prompt: int, output: int, binds: str) -> None:
    chosen = make(name)
    rate = 12.0 if prompt > output else 30.0
    report = replay(mixed_fleet(), {"default": steady(rate, prompt, output, 45.0)}, chosen)
    assert report.unfinished == 0 and report.dropped == 0
    decisions = [p for _, p in getattr(chosen, "decisions", [])]
    assert decisions and all(p.prefill == p.decode for p in decisions)
    peak = max(decisions, key=lambda p: p.prefill)
    assert peak.prefill >= 2 and binds in peak.reasons[-1], peak.reasons[-1]
    # the role that does not bind keeps its own (smaller) target: its hysteresis does not hold the nodes
    last = decisions[-1].reasons[-1]
    assert "spare" in last or "prefill 1, decode 1" in last, last


def test_the_measured_prefill_load_sets_the_decode_interference() -> None:
    spec = mixed_fleet(2.0).pools[0]
    idle = pool_capacity(spec, 1000.0, 250.0, prompt_tps_per_node=0.0)
    at_capacity = pool_capacity(spec, 1000.0, 250.0)
    saturated = pool_capacity(spec, 1000.0, 250.0, prompt_tps_per_node=1e7)
    assert idle.decode_seqs > at_capacity.decode_seqs >= saturated.decode_seqs
    assert idle.prefill_tps == at_capacity.prefill_tps == saturated.prefill_tps


@pytest.mark.parametrize("name", ["predictive", "reactive", "dynamo-like", "oracle", "static-peak"])
def test_every_policy_replays_a_mixed_pool_to_the_end(name: str) -> None:
    chosen = make(name)
    report = replay(mixed_fleet(), {"default": steady(10.0, 1500, 200, 60.0)}, chosen)
    assert report.requests == 600 and report.unfinished == 0 and report.dropped == 0
    assert report.completed == 600
    for _, p in getattr(chosen, "decisions", []):  # the controller's policies decide whole nodes
        assert p.prefill == p.decode and "mixed-node pool" in p.reasons[-1]


def test_a_local_mixed_node_pool_is_sized_in_nodes_by_the_daemon() -> None:
    cfg = ControllerConfig.model_validate(
        {
            "source": {"kind": "direct"},
            "actuator": {"kind": "local", "pool": {"placement": "mixed-node", "prefill": 2, "decode": 2}},
        }
    )
    spec = setups_from_config(cfg)[0].spec
    assert spec.placement == "mixed-node" and spec.prefill_mem_frac == pytest.approx(0.4 / 0.9)
    assert setups_from_config(ControllerConfig())[0].spec.placement == "dedicated"
    pool = {"name": "m", "placement": "mixed-node", "policy": {"standby_decode": 1}}
    with pytest.raises(
        ValueError, match=r"'m': placement 'mixed-node' has no standby tier.*standby_decode=1"
    ):
        ControllerConfig.model_validate({"pools": [pool]})
    k8s = ControllerConfig.model_validate({"pools": [{"name": "m", "placement": "mixed-node"}]})
    assert setups_from_config(k8s)[0].spec.placement == "mixed-node"


def test_static_peak_sizes_whole_nodes_and_the_budget_split_counts_nodes() -> None:
    pool, trace = mixed_fleet().pools[0], steady(10.0, 4000, 8, 60.0)
    counts = static_peak_counts(pool, trace)
    assert counts["prefill"] == counts["decode"] >= 2
    assert peak_demand_gpus(pool, trace) == counts["prefill"]  # one GPU set per node, not per instance


def test_standby_is_refused_for_mixed_pools_with_the_field_named() -> None:
    with_standby = mixed_fleet(decode=RoleCounts(initial=1, standby=1))
    trace = {"default": steady(1.0, 100, 10, 5.0)}
    with pytest.raises(ValueError, match=r"'default' has placement 'mixed-node', which has no standby tier"):
        make("reactive").reset(with_standby, trace)
    with pytest.raises(ValueError, match=r"standby_decode=3 cannot apply"):
        PredictivePolicy(PolicyConfig(standby_decode=3), forecaster=holt).reset(mixed_fleet(), trace)
    PredictivePolicy(PolicyConfig(), forecaster=holt).reset(mixed_fleet(), trace)  # the default 2 is dropped


def test_colocated_pools_are_still_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"colocated .*\(placement: mixed-node"):
        make("reactive").reset(single_pool(mixed=2), {"default": steady(1.0, 100, 10, 5.0)})


def test_pool_spec_defaults_to_derived_interference() -> None:
    assert PoolSpec().mixed_node_slowdown is None
    assert "must be >= 1" in " ".join(PoolSpec(mixed_node_slowdown=0.5).errors())


def test_cli_replays_a_mixed_node_pool_under_a_controller_policy(tmp_path: Path) -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s:02d}.000000,{3000 + 10 * s},{20 + s}" for s in range(40)]
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n")
    app = typer.Typer()
    app.command()(replay_cmd)
    out = tmp_path / "out.json"
    args = ["--trace", str(path), "--policy", "reactive", "--placement", "mixed-node", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["requests"] == doc["completed"] == 40 and doc["dropped"] == 0
    bad = CliRunner().invoke(app, ["--trace", str(path), "--policy", "fixed", "--mixed-node-slowdown", "1.5"])
    assert bad.exit_code == 2 and "applies to --placement mixed-node only" in bad.output
