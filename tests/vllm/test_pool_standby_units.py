"""PoolManager's warm-standby tier without vLLM: the starter is injected and starts ``sleep`` process groups
whose ``wait_healthy`` answers at once; the router is the real one, on loopback, read through its admin API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from controller.actuators.base import ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.local import InstanceConfig, LocalInstance, free_port, group_pids
from serving.pools.manager import PoolManager, PoolSettings
from serving.pools.up_cli import pool_up_cmd


@dataclass(frozen=True, eq=False)
class FakeInstance(LocalInstance):
    """A ``sleep`` process group standing in for a server that is healthy as soon as it starts."""

    def wait_healthy(self, timeout_s: float = 180.0, **_: object) -> float:
        return 0.0


def fake_starter(started: list[LocalInstance]) -> Callable[[InstanceConfig, Path], LocalInstance]:
    def start(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        port = config.port if config.port is not None else free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        inst = FakeInstance(
            f"http://127.0.0.1:{port}", config.role, proc.pid, log_dir / f"{port}.log", config, proc
        )
        started.append(inst)
        return inst

    return start


class Health:
    """The injected ``/health`` probe: every fake answers, except the urls in ``failing``."""

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.asked: list[str] = []

    def __call__(self, url: str) -> bool:
        self.asked.append(url)
        return url not in self.failing


def _settings(tmp_path: Path, **kw: object) -> PoolSettings:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    return PoolSettings(
        model_dir=model_dir,
        work_dir=tmp_path / "pool",
        state_path=tmp_path / "state.json",
        **kw,  # type: ignore[arg-type]
    )


def _manager(tmp_path: Path, **kw: object) -> tuple[PoolManager, Health, list[LocalInstance]]:
    started: list[LocalInstance] = []
    health = Health()
    manager = PoolManager(_settings(tmp_path, **kw), starter=fake_starter(started), health=health)
    return manager, health, started


def _admin_ids(manager: PoolManager) -> list[str]:
    """Backend ids as the router's admin API lists them (what a client of the router sees)."""
    with urllib.request.urlopen(f"{manager.url}/admin/backends", timeout=10) as resp:
        doc = json.loads(resp.read())
    return sorted(b["id"] for b in doc["backends"])


def _tiers(tmp_path: Path) -> dict[str, str]:
    doc = json.loads((tmp_path / "state.json").read_text())
    return {i["id"]: i["tier"] for i in doc["instances"]}


def test_standby_starts_healthy_but_out_of_the_router(tmp_path: Path) -> None:
    manager, _, _ = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1, standby_decode=2)
        assert (manager.count("decode"), manager.standby_count("decode"), manager.ready("decode")) == (
            1,
            2,
            1,
        )
        assert manager.standby_ready("decode") == 2 and manager.standby_count("prefill") == 0
        assert manager.ids("decode", "standby") == ["d1", "d2"]
        assert _admin_ids(manager) == ["d0", "p0"]
        assert _tiers(tmp_path) == {"p0": "active", "d0": "active", "d1": "standby", "d2": "standby"}
    finally:
        manager.down()


def test_scale_up_promotes_standby_then_refills_it_cold(tmp_path: Path) -> None:
    manager, _, started = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1, standby_decode=1)
        d1_pid = manager.instance("d1").pid
        n_started = len(started)
        result = manager.scale("decode", 3)  # standby None: keep 1 warm
        assert result.promoted == ("d1",)  # the warm one first, same process
        assert manager.instance("d1").pid == d1_pid
        assert result.started == ("d2",) and result.started_standby == ("d3",)
        assert (result.before, result.after, result.standby_before, result.standby_after) == (1, 3, 1, 1)
        assert len(started) == n_started + 2  # one cold active, one cold standby; none for d1
        assert _admin_ids(manager) == ["d0", "d1", "d2", "p0"]
        assert _tiers(tmp_path)["d1"] == "active" and _tiers(tmp_path)["d3"] == "standby"
    finally:
        manager.down()


def test_scale_down_demotes_while_standby_is_wanted_and_stops_the_rest(tmp_path: Path) -> None:
    manager, _, _ = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=3)
        pids = {i: manager.instance(i).pid for i in ("d1", "d2")}
        result = manager.scale("decode", 1, standby=1)
        assert result.demoted == ("d2",) and result.stopped == ("d1",)  # newest first: d2 kept warm
        assert group_pids(pids["d1"]) == [] and group_pids(pids["d2"]) != []
        assert manager.ids("decode", "standby") == ["d2"] and _admin_ids(manager) == ["d0", "p0"]
        assert _tiers(tmp_path) == {"p0": "active", "d0": "active", "d2": "standby"}
        # promoting it again re-registers the same server
        again = manager.scale("decode", 2, standby=0)
        assert again.promoted == ("d2",) and again.started == () and again.started_standby == ()
        assert manager.instance("d2").pid == pids["d2"] and _admin_ids(manager) == ["d0", "d2", "p0"]
        trimmed = manager.set_standby("decode", 2)
        assert trimmed.started_standby == ("d3", "d4") and manager.count("decode") == 2
        gone = manager.instance("d4").pid
        assert manager.set_standby("decode", 1).stopped == ("d4",)  # newest standby, no drain
        assert group_pids(gone) == [] and manager.ids("decode", "standby") == ["d3"]
    finally:
        manager.down()


def test_promotion_skips_a_dead_standby_and_cold_starts_instead(tmp_path: Path) -> None:
    manager, health, _ = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1, standby_decode=2)
        health.failing.add(manager.instance("d1").url)  # d1 answers no /health
        result = manager.scale("decode", 2)
        assert result.promoted == ("d2",) and "d1" not in _admin_ids(manager)
        assert manager.tier("d1") == "standby"
    finally:
        manager.down()


def test_heal_restarts_a_dead_standby_without_the_router_seeing_it(tmp_path: Path) -> None:
    manager, health, _ = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1, standby_decode=2, standby_prefill=1)
        dead = manager.instance("d1")
        dead.process.kill()
        dead.process.wait(10)
        hung = manager.instance("p1")
        health.failing.add(hung.url)
        assert manager.standby_ready("decode") == 1
        healed = {h.id: h for h in manager.heal()}
        assert sorted(healed) == ["d1", "p1"]
        assert healed["d1"].reason == "standby: API process exited" and healed["d1"].tier == "standby"
        assert healed["p1"].reason == "standby: /health failed"
        fresh = manager.instance("d1")
        assert fresh.pid != dead.pid and fresh.url == dead.url and manager.tier("d1") == "standby"
        assert group_pids(dead.pid) == [] and group_pids(hung.pid) == []
        assert _admin_ids(manager) == ["d0", "p0"]  # never registered
        assert manager.standby_ready("decode") == 2
        health.failing.clear()
        assert manager.heal() == []  # all healthy: nothing restarted
    finally:
        manager.down()


def test_the_healer_thread_restarts_a_standby_nobody_reported(tmp_path: Path) -> None:
    manager, _, _ = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1, standby_decode=1)
        manager.start_healer(poll_s=0.05)
        dead = manager.instance("d1")
        dead.process.kill()
        dead.process.wait(10)
        deadline = time.monotonic() + 30.0
        while not manager.heal_log and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(h.id, h.tier) for h in manager.heal_log] == [("d1", "standby")]
        assert manager.instance("d1").pid != dead.pid and manager.unhealthy() == {}
    finally:
        manager.down()


def test_the_actuator_sets_standby_and_reports_it_by_tier(tmp_path: Path) -> None:
    manager, _, _ = _manager(tmp_path)
    actuator = LocalPoolActuator(manager)
    bounds = ReplicaBounds(min_prefill=1, max_prefill=4, min_decode=1, max_decode=6)

    def plan(decode: int, sd: int) -> ScalingPlan:
        return ScalingPlan(pool="local", prefill=1, decode=decode, standby_prefill=0, standby_decode=sd)

    try:
        manager.up(prefill=1, decode=1)
        first = actuator.apply(plan(1, 2), bounds)
        assert [(c.role, c.tier, c.before, c.after) for c in first.changes] == [("decode", "standby", 0, 2)]
        assert first.targets["decode"] == (1, 2) and not first.notes
        now = actuator.current("local").role("decode")
        assert (now.replicas, now.ready, now.standby, now.standby_ready) == (1, 1, 2, 2)
        up = actuator.apply(plan(3, 0), bounds)  # both warm servers promoted, nothing cold
        assert [(c.tier, c.before, c.after) for c in up.changes] == [("active", 1, 3), ("standby", 2, 0)]
        assert (
            manager.ids("decode", "active") == ["d0", "d1", "d2"]
            and actuator.apply(plan(3, 0), bounds).changes == ()
        )
    finally:
        manager.down()


def test_mixed_node_pools_refuse_standby(tmp_path: Path) -> None:
    manager, _, _ = _manager(tmp_path, placement="mixed-node", platform="cpu")
    assert not manager.standby_supported
    with pytest.raises(ValueError, match="'mixed-node' has no standby tier"):
        manager.up(prefill=1, decode=1, standby_decode=1)
    try:
        manager.up(prefill=1, decode=1)
        with pytest.raises(ValueError, match="decode standby=1: placement 'mixed-node' has no standby"):
            manager.scale("decode", 1, standby=1)
        result = LocalPoolActuator(manager).apply(
            ScalingPlan(pool="local", prefill=1, decode=1, standby_prefill=0, standby_decode=1),
            ReplicaBounds(min_prefill=1, max_prefill=2, min_decode=1, max_decode=4),
        )
        assert result.changes == () and result.targets["decode"] == (1, 0)
        assert "standby 1 set to 0" in " ".join(result.notes)
    finally:
        manager.down()


def test_pool_up_refuses_standby_on_mixed_node(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("up")(pool_up_cmd)
    app.command("noop")(lambda: None)
    args = ["up", "--state-file", str(tmp_path / "s.json"), "--work-dir", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--placement", "mixed-node", "--standby-decode", "1"])
    assert result.exit_code == 2, result.output
    assert "--standby-prefill/--standby-decode: placement 'mixed-node' has no standby" in " ".join(
        result.output.split()
    )
    assert not (tmp_path / "tiny").exists()
    negative = CliRunner().invoke(app, [*args, "--standby-decode", "-1"])
    assert negative.exit_code == 2


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=4))
def test_any_sequence_of_targets_leaves_exactly_the_active_tier_in_the_router(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, int]]
) -> None:
    tmp_path = tmp_path_factory.mktemp("seq")
    manager, _, started = _manager(tmp_path)
    try:
        manager.up(prefill=1, decode=1)
        for n, k in steps:
            warm_before = set(manager.ids("decode", "standby"))
            cold_before = len(started)
            result = manager.scale("decode", n, standby=k)
            assert (manager.count("decode"), manager.standby_count("decode")) == (n, k)
            assert sorted([*manager.ids("decode", "active"), "p0"]) == _admin_ids(manager)
            assert set(result.promoted) <= warm_before
            # warm servers are used before anything cold starts
            assert len(result.promoted) == min(len(warm_before), max(0, n - result.before))
            assert len(started) - cold_before == len(result.started) + len(result.started_standby)
            assert all(manager.instance(i).is_running() for i in manager.ids())
    finally:
        manager.down()
    assert all(group_pids(i.pid) == [] for i in started)
