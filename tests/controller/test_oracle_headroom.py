"""The oracle's headroom (an SLO-matched reference) and the bench's oracle@slo bisection and time split."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from controller.replay_policies import OraclePolicy, oracle_needs
from serving.sim.fleet import single_pool
from serving.sim.hardware import get_profile
from serving.sim.replay import PolicyOptions, make_policy
from serving.workload.trace import Trace

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies_oracle_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench_policies = _bench()


def _trace() -> Trace:
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 120.0, 600))
    n = len(arrivals)
    return Trace.from_arrays(arrivals - arrivals[0], rng.integers(200, 4000, n), rng.integers(20, 300, n))


def test_headroom_scales_the_needs_before_the_ceil() -> None:
    pool, trace = single_pool().pools[0], _trace()
    p0, d0 = oracle_needs(pool, trace, 5.0)
    p1, d1 = oracle_needs(pool, trace, 5.0, headroom=0.5)
    assert (p1 >= p0).all() and (d1 >= d0).all()
    assert p1.sum() > p0.sum()
    # ceil(1.5 x) <= ceil(1.5 ceil(x)): never more than scaling the rounded need
    assert (p1 <= np.ceil(1.5 * p0 - 1e-9)).all()


@pytest.mark.parametrize(
    ("params", "headroom"), [({}, 0.0), ({"headroom": 0.25}, 0.25), ({"headroom": "0.5"}, 0.5)]
)
def test_the_factory_takes_headroom(params: dict[str, Any], headroom: float) -> None:
    policy = make_policy("oracle", PolicyOptions(params=params))
    assert isinstance(policy, OraclePolicy) and policy.headroom == headroom


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"headroom": -0.1}, "'headroom' must be a number in"),
        ({"headroom": 11}, "'headroom' must be a number in"),
        ({"headroom": "nan"}, "'headroom' must be a number in"),
        ({"headroom": "lots"}, "'headroom' must be a number"),
        ({"headroom": True}, "'headroom' must be a number"),
        ({"margin": 0.1}, "only the parameter 'headroom'"),
    ],
)
def test_bad_headroom_is_rejected_by_name(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy("oracle", PolicyOptions(params=params))


def _fake_run(threshold: float | None, calls: list[float]) -> Any:
    """A replay stand-in: attainment 0.999 at headroom >= threshold, else 0.9 (None: never)."""

    def run(name: str, trace: Trace, fleet: Any, policy: Any, gateway: Any = None) -> Any:
        h = policy.headroom
        calls.append(h)
        ok = threshold is not None and h >= threshold
        return SimpleNamespace(slo_attainment=0.999 if ok else 0.9, gpu_seconds=100.0 * (1 + h))

    return run


@pytest.mark.parametrize(("threshold", "expect"), [(0.0, 0.0), (0.7, 0.7), (2.9, 2.9), (None, None)])
def test_oracle_at_slo_bisects_within_eight_replays(
    monkeypatch: pytest.MonkeyPatch, threshold: float | None, expect: float | None
) -> None:
    calls: list[float] = []
    monkeypatch.setattr(bench_policies, "run", _fake_run(threshold, calls))
    h, rep = bench_policies.oracle_at_slo(_trace(), single_pool(), 0.99)
    assert len(calls) <= bench_policies.ORACLE_SLO_REPLAYS
    if expect is None:
        assert h is None and rep.slo_attainment < 0.99
    else:
        assert h is not None and rep.slo_attainment >= 0.99
        assert expect <= h <= expect + bench_policies.ORACLE_SLO_MAX_H / 2**6 + 1e-9


def test_gpu_seconds_after_a_split_counts_the_late_ticks_only() -> None:
    timeline = SimpleNamespace(t_s=np.arange(0.0, 10.0), holding_gpu=np.full(10, 2))
    rep: Any = SimpleNamespace(timeline=timeline)
    fleet = single_pool()
    gpus = get_profile(fleet.pools[0].profile).gpus
    assert bench_policies.gpu_seconds_after(rep, fleet, 0.0) == pytest.approx(18.0 * gpus)
    assert bench_policies.gpu_seconds_after(rep, fleet, 7.0) == pytest.approx(4.0 * gpus)
