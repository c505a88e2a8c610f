"""bench/bench_unseen.py --params: the replay:predictive entry replays a one-pool fleet file whose policy overrides
are the params, and that fleet replays as ``pdscale replay --policy predictive`` does on the same trace."""

from __future__ import annotations

from pathlib import Path

import pytest

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, ...)
from serving.sim.fleet import single_pool
from serving.sim.fleet_file import load_fleet_file, replay_fleet
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.workload.readers import read_trace
from serving.workload.variants import Variant, bundled
from tests.support.bench import load_bench

bench_unseen = load_bench("bench_unseen")
CONV = bundled(Path("datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"))


def _variant(fmt: str = "azure") -> Variant:
    return Variant("conv_copy", fmt, CONV, "the bundled conversation trace", "ok", 0)


def test_the_fleet_file_is_the_default_pool_with_the_params(tmp_path: Path) -> None:
    params = {"headroom": 0.5, "standby_decode": 1}
    path = bench_unseen.params_fleet(_variant(), params, tmp_path / "f.json")
    fleet = load_fleet_file(path, duration_s=60.0)
    default = single_pool()
    assert fleet.spec.gpu_budget == default.gpu_budget
    (pool,) = fleet.spec.pools
    assert pool == default.pools[0]  # name, profile, SLOs, router, role bounds
    assert fleet.policy_params == {pool.name: params}


def test_mooncake_variants_keep_the_mooncake_slo(tmp_path: Path) -> None:
    path = bench_unseen.params_fleet(_variant("mooncake"), {"headroom": 0.5}, tmp_path / "f.json")
    (pool,) = load_fleet_file(path, duration_s=60.0).spec.pools
    assert pool.slo_ttft_ms == float(bench_unseen.MOONCAKE_SLO[1]) != single_pool().pools[0].slo_ttft_ms


def test_the_fleet_replays_as_the_single_pool_replay_with_the_same_config(tmp_path: Path) -> None:
    params = {"headroom": 0.6}
    fleet = load_fleet_file(
        bench_unseen.params_fleet(_variant(), params, tmp_path / "f.json"), duration_s=150.0
    )
    via_fleet = replay_fleet(
        fleet.spec, fleet.traces, "predictive", pool_params=fleet.policy_params
    ).to_json()
    trace = read_trace(CONV).window(0.0, 150.0)
    policy = make_policy("predictive", PolicyOptions(params=params))
    direct = replay(single_pool(), {"default": trace}, policy).to_json()
    plain = replay(single_pool(), {"default": trace}, make_policy("predictive")).to_json()
    for key in ("requests", "completed", "slo_attainment", "gpu_seconds", "scale_events"):
        assert via_fleet[key] == direct[key], key
    assert via_fleet["gpu_seconds"] != plain["gpu_seconds"]  # the params reached the policy


def test_params_are_checked_once_up_front() -> None:
    assert bench_unseen._policy_params("") == {}
    assert bench_unseen._policy_params("headroom=0.4,standby_decode=1") == {
        "headroom": 0.4,
        "standby_decode": 1,
    }
    with pytest.raises(SystemExit, match="headroom"):
        bench_unseen._policy_params("headroom=lots")
