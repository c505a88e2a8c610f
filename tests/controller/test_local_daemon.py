"""``pdscale controller`` over a local pool (actuator ``local``, source ``direct``) with fake vLLM servers: a ``python`` process group per server answering ``/health``
and ``/metrics`` with a canned vLLM page. Counters grow by a per-scrape amount read from a JSON load file
(``{"prefill": {...}, "decode": {...}}``) at each scrape, so a test on a virtual clock that ticks 1 s per
scrape reads exact rates."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from controller.clock import VirtualClock
from controller.config import ControllerConfig, format_validation_error, load_yaml_model
from controller.daemon import Daemon, build_daemon, serve
from serving.pools.local import InstanceConfig, InstanceStartError, LocalInstance, free_port, group_pids
from serving.pools.manager import PoolManager, PoolSettings

SERVER = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, role, load_path, delay_s = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
time.sleep(delay_s)  # a server still loading its model: no /health yet
totals = {"prompt": 0.0, "gen": 0.0, "ttft": 0}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/health":
            body = b""
        elif self.path == "/metrics":
            try:
                with open(load_path) as f:
                    load = json.load(f).get(role, {})
            except (OSError, ValueError):
                load = {}
            totals["prompt"] += load.get("prompt", 0.0)
            totals["gen"] += load.get("gen", 0.0)
            totals["ttft"] += int(load.get("requests", 0))
            lab = '{model_name="tiny",engine="0"}'
            lines = [
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{lab} {load.get('running', 0.0)}",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{lab} {load.get('waiting', 0.0)}",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{lab} {load.get('kv', 0.0)}",
                "# TYPE vllm:prompt_tokens counter",
                f"vllm:prompt_tokens_total{lab} {totals['prompt']}",
                "# TYPE vllm:generation_tokens counter",
                f"vllm:generation_tokens_total{lab} {totals['gen']}",
                "# TYPE vllm:num_preemptions counter",
                f"vllm:num_preemptions_total{lab} 0.0",
                "# TYPE vllm:time_to_first_token_seconds histogram",
                'vllm:time_to_first_token_seconds_bucket{model_name="tiny",engine="0",le="0.1"} 0.0',
                f'vllm:time_to_first_token_seconds_bucket{{model_name="tiny",engine="0",le="0.5"}} {totals["ttft"]}',
                f'vllm:time_to_first_token_seconds_bucket{{model_name="tiny",engine="0",le="+Inf"}} {totals["ttft"]}',
                f"vllm:time_to_first_token_seconds_count{lab} {totals['ttft']}",
                f"vllm:time_to_first_token_seconds_sum{lab} {0.3 * totals['ttft']}",
            ]
            body = ("\n".join(lines) + "\n").encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@dataclass(frozen=True, eq=False)
class FakeServer(LocalInstance):
    """A fake server: the real ``LocalInstance`` (stop, is_running) polling ``/health`` every 50 ms."""

    def wait_healthy(self, timeout_s: float = 180.0, **_: object) -> float:
        return super().wait_healthy(min(timeout_s, 30.0), poll_s=0.05)


def fake_starter(
    load_path: Path, started: list[LocalInstance], *, delay_s: float = 0.0, pid_log: Path | None = None
) -> Callable[[InstanceConfig, Path], LocalInstance]:
    """A ``PoolManager`` starter launching ``SERVER`` in its own process group (session); it answers
    ``/health`` after ``delay_s``. ``pid_log``: each group id is appended there (for another process)."""
    script = load_path.parent / "fake_vllm.py"
    script.write_text(SERVER)

    def start(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        port = config.port if config.port is not None else free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{config.role}-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(script), str(port), config.role, str(load_path), str(delay_s)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        inst = FakeServer(f"http://127.0.0.1:{port}", config.role, proc.pid, log, config, proc)
        started.append(inst)
        if pid_log is not None:
            with pid_log.open("a") as f:
                f.write(f"{proc.pid}\n")
        return inst

    return start


# -- the daemon over a local pool of fake servers ------------------------------------------------

NO_CKPT = "/nonexistent/model.safetensors"  # the Holt fallback: no torch here
LOW = {"prefill": {"prompt": 50.0, "requests": 1}, "decode": {"gen": 20.0, "running": 1.0, "kv": 0.05}}
HIGH = {"prefill": {"prompt": 500.0, "requests": 5}, "decode": {"gen": 200_000.0, "running": 12.0, "kv": 0.9}}


def local_config(tmp_path: Path, **pool: object) -> ControllerConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return ControllerConfig.model_validate(
        {
            "tick_s": 1.0,
            "forecaster_checkpoint": NO_CKPT,
            "source": {"kind": "direct", "timeout_s": 5.0},
            "actuator": {
                "kind": "local",
                "pool": {
                    "model_dir": str(model),
                    "work_dir": str(tmp_path / "pool"),
                    "state_path": str(tmp_path / "state.json"),
                    "prefill": 1,
                    "decode": 1,
                    **pool,
                },
            },
            "pools": [
                {
                    "name": "local",
                    "policy": {
                        "min_prefill": 1,
                        "max_prefill": 1,
                        "min_decode": 1,
                        "max_decode": 3,
                        "ramp_up_s": 0.0,
                        "standby_decode": 0,
                        "standby_sizing": "flat",
                    },
                }
            ],
        }
    )


def _daemon(
    tmp_path: Path, load: Mapping[str, object], **pool: object
) -> tuple[Daemon, list[LocalInstance], Path]:
    load_path = tmp_path / "load.json"
    load_path.write_text(json.dumps(load))
    started: list[LocalInstance] = []
    starter = fake_starter(load_path, started)

    def factory(settings: PoolSettings, name: str) -> PoolManager:
        return PoolManager(settings, name=name, starter=starter)

    daemon = build_daemon(local_config(tmp_path, **pool), clock=VirtualClock(), pool_factory=factory)
    return daemon, started, load_path


def _alive(started: list[LocalInstance]) -> list[int]:
    return [i.pid for i in started if group_pids(i.pid)]


def test_the_daemon_starts_its_pool_reads_load_scales_decode_and_stops_everything(tmp_path: Path) -> None:
    daemon, started, load_path = _daemon(tmp_path, LOW)
    try:
        pool = daemon.actuator.pool  # type: ignore[attr-defined]
        assert pool.url.startswith("http://127.0.0.1:") and (pool.count("prefill"), pool.count("decode")) == (
            1,
            1,
        )
        assert json.loads((tmp_path / "state.json").read_text())["router"]["url"] == pool.url
        reports = []
        for _ in range(3):
            reports.append(daemon.tick())
            daemon.clock.sleep(1.0)
        assert all(r.ok for r in reports), [r.message for r in reports]
        load = reports[-1].result.decisions["local"].load  # type: ignore[union-attr]
        assert load.gen_tps == pytest.approx(20.0) and load.prompt_tps == pytest.approx(50.0)
        assert pool.count("decode") == 1  # low load: held at the minimum
        load_path.write_text(json.dumps(HIGH))
        for _ in range(3):
            report = daemon.tick()
            daemon.clock.sleep(1.0)
            assert report.ok, report.message
        assert (
            pool.count("decode") == 3 and pool.ready("decode") == 3
        )  # up to max_decode, every server serving
        assert report.result.decisions["local"].load.gen_tps == pytest.approx(600_000.0)  # type: ignore[union-attr]
        assert len(_alive(started)) == 4
    finally:
        assert serve(daemon, metrics_port=None, max_ticks=1) == 0  # one more tick, then the clean-up
    assert _alive(started) == []
    assert not (tmp_path / "state.json").exists()
    with pytest.raises(RuntimeError, match="not up"):
        _ = daemon.actuator.pool.router  # type: ignore[attr-defined]


def test_a_dead_server_reads_unknown_and_the_tick_goes_on(tmp_path: Path) -> None:
    daemon, started, _ = _daemon(tmp_path, LOW, heal=False)
    try:
        for _ in range(2):
            assert daemon.tick().ok
            daemon.clock.sleep(1.0)
        decode = next(i for i in started if i.role == "decode")
        decode.stop(5.0)
        report = daemon.tick()
        assert report.ok, report.message
        decision = report.result.decisions["local"]  # type: ignore[union-attr]
        assert math.isnan(decision.load.gen_tps) and decision.plan is None  # unknown: holding, not idle
        assert daemon.source.stats().failed == {"d0": 1}  # type: ignore[attr-defined]
        assert daemon.actuator.pool.count("decode") == 1  # type: ignore[attr-defined]
    finally:
        daemon.close()
    assert _alive(started) == []


def test_a_pool_that_fails_to_start_leaves_nothing_running(tmp_path: Path) -> None:
    load_path = tmp_path / "load.json"
    load_path.write_text("{}")
    started: list[LocalInstance] = []
    good = fake_starter(load_path, started)

    def starter(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        inst = good(config, log_dir)
        if config.role == "decode":
            inst.stop(5.0)  # exits before /health answers: InstanceStartError
        return inst

    def factory(settings: PoolSettings, name: str) -> PoolManager:
        return PoolManager(settings, name=name, starter=starter)

    with pytest.raises(InstanceStartError):
        build_daemon(local_config(tmp_path), clock=VirtualClock(), pool_factory=factory)
    assert started and _alive(started) == []


# -- configuration -------------------------------------------------------------------------------


def _problems(doc: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as err:
        ControllerConfig.model_validate(doc)
    return format_validation_error(err.value)


LOCAL = {"kind": "local", "pool": {"model_dir": "/m"}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"source": {"kind": "direct"}, "actuator": {"kind": "dry-run"}},
                     "source.kind 'direct' scrapes the local pool", id="direct-needs-local"),
        pytest.param({"source": {"kind": "direct"}, "actuator": {"kind": "local"}},
                     "actuator: Value error, pool: kind 'local' needs a pool section", id="local-needs-pool"),
        pytest.param({"source": {"kind": "prometheus", "url": "http://p"},
                      "actuator": {"kind": "dry-run", "pool": {"model_dir": "/m"}}},
                     "pool: a local pool section goes with kind 'local'", id="pool-needs-local"),
        pytest.param({"source": {"kind": "direct"}, "actuator": LOCAL, "pools": [{"name": "a"}, {"name": "b"}]},
                     "pools: actuator.kind 'local' runs one pool, got 2", id="one-pool"),
        pytest.param({"source": {"kind": "direct"}, "actuator": {"kind": "local", "pool": {"decode": 9}},
                      "pools": [{"policy": {"max_decode": 4}}]},
                     "actuator.pool.decode: 9 is outside pools.0.policy [min_decode, max_decode] = [1, 4]",
                     id="counts-in-bounds"),
        pytest.param({"source": {"kind": "direct"}, "actuator": {"kind": "local", "pool": {"prefill": 0}}},
                     "P/D needs both roles", id="pd-both"),
        pytest.param({"source": {"kind": "direct"},
                      "actuator": {"kind": "local", "pool": {"prefill_mem_frac": 0.3}}},
                     "prefill_mem_frac: applies to placement 'mixed-node' only", id="mixed-option-dedicated"),
        pytest.param({"source": {"kind": "direct"},
                      "actuator": {"kind": "local", "pool": {"placement": "mixed-node", "standby_decode": 1}}},
                     "has no standby tier", id="mixed-no-standby"),
    ],
)  # fmt: skip
def test_config_rules_name_the_field(doc: dict[str, object], message: str) -> None:
    assert message in _problems(doc)


def test_local_configs_that_are_valid_load() -> None:
    cfg = ControllerConfig.model_validate({"source": {"kind": "direct"}, "actuator": LOCAL})
    assert cfg.actuator.pool is not None and cfg.actuator.pool.decode == 1
    with_prom = {"source": {"kind": "prometheus", "url": "http://p:9090"}, "actuator": LOCAL}
    assert ControllerConfig.model_validate(with_prom).actuator.kind == "local"


def test_the_example_config_is_valid() -> None:
    cfg = load_yaml_model(Path("examples/controller-local.yaml"), ControllerConfig)
    assert (cfg.source.kind, cfg.actuator.kind, len(cfg.pools)) == ("direct", "local", 1)


def test_a_missing_model_dir_is_refused_naming_the_field(tmp_path: Path) -> None:
    cfg = ControllerConfig.model_validate(
        {"source": {"kind": "direct"}, "forecaster_checkpoint": NO_CKPT,
         "actuator": {"kind": "local", "pool": {"model_dir": str(tmp_path / "none")}}}
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"actuator.pool.model_dir: .*none/config.json not found"):
        build_daemon(cfg, clock=VirtualClock())


# -- the command's process: SIGTERM at any point leaves no server running ------------------------

RUN = """
import sys
from pathlib import Path
sys.path.insert(0, ".")
from controller.cli import run_live_daemon
from controller.daemon import DaemonOptions
from serving.pools.manager import PoolManager
from tests.controller.test_local_daemon import fake_starter, local_config

tmp, delay_s = Path(sys.argv[1]), float(sys.argv[2])
(tmp / "load.json").write_text("{}")
starter = fake_starter(tmp / "load.json", [], delay_s=delay_s, pid_log=tmp / "pids")
factory = lambda settings, name: PoolManager(settings, name=name, starter=starter)
sys.exit(run_live_daemon(local_config(tmp), DaemonOptions(), None, "json", pool_factory=factory))
"""


def _sigterm_after(tmp_path: Path, event: str, delay_s: float) -> tuple[int, list[dict[str, Any]], list[int]]:
    """Run the daemon in its own process, SIGTERM it once ``event`` is logged; its exit code, its log
    lines and the process groups of its servers."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(tmp_path), str(delay_s)], stderr=subprocess.PIPE, text=True
    )
    lines: list[dict[str, Any]] = []
    try:
        assert proc.stderr is not None
        for raw in proc.stderr:
            if raw.startswith("{"):
                lines.append(json.loads(raw))
                if lines[-1].get("event") == event:
                    proc.send_signal(signal.SIGTERM)
                    break
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []
    return proc.returncode, lines, pids


def test_sigterm_while_serving_stops_the_pool_and_exits_0(tmp_path: Path) -> None:
    code, lines, pids = _sigterm_after(tmp_path, "decision", 0.0)
    assert code == 0, lines
    up = next(e for e in lines if e.get("event") == "pool_up")
    assert up["router_url"].startswith("http://127.0.0.1:")
    assert lines[-1]["event"] == "stopped" and len(pids) == 2
    assert [p for p in pids if group_pids(p)] == []


def test_sigterm_while_the_servers_start_leaves_none_running(tmp_path: Path) -> None:
    code, lines, pids = _sigterm_after(tmp_path, "pool_starting", 5.0)
    assert code == 0, lines
    assert not any(e.get("event") == "pool_up" for e in lines)
    deadline = time.monotonic() + 5.0
    while not pids and time.monotonic() < deadline:  # the launch may follow the log line by a moment
        time.sleep(0.1)
        pids = (
            [int(x) for x in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []
        )
    assert [p for p in pids if group_pids(p)] == []


def test_close_runs_every_closer_once_newest_first_and_finishes_an_interrupted_one_later() -> None:
    from controller.pipeline import setups_from_config
    from forecaster.baselines import Holt

    cfg = ControllerConfig.model_validate({"source": {"kind": "prometheus", "url": "http://p"},
                                           "actuator": {"kind": "dry-run"}})  # fmt: skip
    daemon = Daemon(setups_from_config(cfg), None, None, Holt(), clock=VirtualClock(), tick_s=1.0)  # type: ignore[arg-type]
    ran: list[str] = []
    interrupt = [True]

    def pool_down() -> None:
        ran.append("pool")
        if interrupt.pop():
            raise KeyboardInterrupt  # a second SIGTERM while the servers stop

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("cannot")

    daemon.on_close("pool", pool_down)
    daemon.on_close("broken", broken)
    daemon.on_close("audit", lambda: ran.append("audit"))
    with pytest.raises(KeyboardInterrupt):
        daemon.close()
    assert ran == ["audit", "broken", "pool"]  # newest first; a failure does not stop the rest
    interrupt.append(False)
    daemon.close()
    daemon.close()
    assert ran == ["audit", "broken", "pool", "pool"]  # the interrupted one finished, nothing ran twice after
