"""The controller daemon's own cost per tick, without Prometheus or Kubernetes I/O.

Run: ``nice .venv/bin/python bench/bench_daemon.py [--pools 1 8] [--instances 2 64] [--ticks 300] [--json out.json]``
(``--instances 2 64 125`` adds 8 × 125 = 1,000 instances, the issue's unit for the goal of ≤ 10 ms per tick.)
``--forecaster default`` runs the shipped learned checkpoint (what ``controller.forecasting`` loads, what users
run) instead of the Holt baseline; ``--warm-ticks N`` ticks N times before the measured ticks (default 5): the
policy's state grows for an hour of ticks (the burst reserve remembers ``burst_window_s`` + one cold start of
5-s need blocks, 744 by default, and recomputes its rises over all of them every 5th tick), so
``--warm-ticks 3720`` measures a controller that has run for an hour. ``--what pipeline`` skips the daemon rows.

- ``Pipeline.tick``: aggregate a synthetic scrape (every instance's vLLM counters and gauges growing at fixed
  rates), one batched Holt forecaster step, ``decide`` per pool, the GPU budget across pools.
- ``Daemon.tick``: the same plus the in-memory dry-run actuator (``current`` + ``apply``), the telemetry
  registry and the JSONL audit log (to a temporary file), on a virtual clock.
What a live tick adds on top is the I/O, measured in bench/bench_controller_io.py (a 10-instance scrape ≈ 50 ms,
an apply ≈ 3-5 ms). Prints a Markdown table for docs/BENCHMARKS.md: wall time per tick and the CPU time of
the ticking thread (``time.thread_time``, the figure least distorted by other processes on a shared machine),
the process's peak RSS and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.actuators.base import RoleReplicas
from controller.actuators.dryrun import DryRunActuator
from controller.audit import AuditLog
from controller.clock import VirtualClock
from controller.config import PolicyConfig
from controller.daemon import Daemon
from controller.pipeline import Pipeline, PoolCounts, PoolSetup
from controller.telemetry import Telemetry
from forecaster.baselines import Holt
from forecaster.types import Forecaster
from serving.sim import samples as s
from serving.sim.fleet import PoolSpec


class SyntheticSource:
    """``n_pools`` pools of ``per_pool`` instances (half prefill, half decode); counters grow with time."""

    def __init__(self, n_pools: int, per_pool: int) -> None:
        self.ids = tuple(
            f"p{p}-{'prefill' if i % 2 == 0 else 'decode'}-{i}"
            for p in range(n_pools)
            for i in range(per_pool)
        )
        self.pools = tuple(i.split("-")[0] for i in self.ids)
        self.roles = tuple(i.split("-")[1] for i in self.ids)
        prefill = np.array([r == "prefill" for r in self.roles])
        self.prompt_rate = np.where(prefill, 4000.0, 0.0)
        self.gen_rate = np.where(prefill, 0.0, 600.0)
        self.req_rate = np.where(prefill, 3.0, 0.0)
        self.running = np.where(prefill, 0.0, 30.0)
        # decode instances time one inter-token gap per generated token, each running / gen_rate seconds
        self.itl_bucket = int(np.searchsorted(s.ITL_BUCKETS_S, 30.0 / 600.0))

    def scrape(self, now_s: float) -> s.InstanceSamples:
        n = len(self.ids)
        return s.InstanceSamples(
            now_s=now_s,
            instance_ids=self.ids,
            pools=self.pools,
            roles=self.roles,
            nodes=self.ids,
            states=("active",) * n,
            gauges={
                s.NUM_REQUESTS_RUNNING: self.running,
                s.NUM_REQUESTS_WAITING: np.zeros(n),
                s.KV_CACHE_USAGE_PERC: np.full(n, 0.3),
            },
            counters={
                s.PROMPT_TOKENS_TOTAL: self.prompt_rate * now_s,
                s.GENERATION_TOKENS_TOTAL: self.gen_rate * now_s,
                s.ROUTER_REQUESTS_TOTAL: self.req_rate * now_s,
            },
            histograms={s.INTER_TOKEN_LATENCY_SECONDS: self._itl(now_s)},
        )

    def _itl(self, now_s: float) -> s.Histogram:
        gaps = np.round(self.gen_rate * now_s).astype(np.int64)
        counts = np.zeros((len(self.ids), len(s.ITL_BUCKETS_S) + 1), dtype=np.int64)
        counts[:, self.itl_bucket :] = gaps[:, None]
        return s.Histogram(s.ITL_BUCKETS_S, counts, self.running * now_s)


def _setups(n_pools: int) -> list[PoolSetup]:
    policy = PolicyConfig(standby_decode=1)
    return [PoolSetup(PoolSpec(name=f"p{p}"), policy) for p in range(n_pools)]


def _stats(times_s: list[float], cpu_s: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000.0 for t in times_s)
    cpu = sorted(t * 1000.0 for t in cpu_s)
    return {
        "median_ms": statistics.median(ms),
        "p99_ms": ms[int(0.99 * (len(ms) - 1))],
        "max_ms": ms[-1],
        "cpu_median_ms": statistics.median(cpu),
        "cpu_p99_ms": cpu[int(0.99 * (len(cpu) - 1))],
    }


def make_forecaster(kind: str) -> Forecaster:
    """``holt`` (the baseline) or ``default`` (the shipped checkpoint, as the daemon loads it)."""
    if kind == "holt":
        return Holt()
    from controller.forecasting import load_default_forecaster

    return load_default_forecaster()


def bench_pipeline(
    n_pools: int, per_pool: int, ticks: int, forecaster: str = "holt", warm: int = 5
) -> dict[str, float]:
    source = SyntheticSource(n_pools, per_pool)
    pipe = Pipeline(_setups(n_pools), make_forecaster(forecaster), gpu_budget=8 * n_pools * per_pool)
    one = {"prefill": per_pool // 2, "decode": per_pool // 2}
    zero = {"prefill": 0, "decode": 0}
    counts = {f"p{p}": PoolCounts(one, one, zero, zero) for p in range(n_pools)}
    times, cpu = [], []
    for k in range(warm + ticks):
        now = 1.7e9 + k
        scrape = source.scrape(now)
        t0, c0 = time.perf_counter(), time.thread_time()
        pipe.tick(scrape, counts, now)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return _stats(times[warm:], cpu[warm:])


def bench_daemon(
    n_pools: int, per_pool: int, ticks: int, forecaster: str = "holt", warm: int = 5
) -> dict[str, float]:
    source = SyntheticSource(n_pools, per_pool)
    half = per_pool // 2
    actuator = DryRunActuator(
        {f"p{p}": {r: RoleReplicas(half, half) for r in ("prefill", "decode")} for p in range(n_pools)}
    )
    clock = VirtualClock()
    with tempfile.TemporaryDirectory() as tmp, AuditLog(Path(tmp) / "audit.jsonl") as audit:
        daemon = Daemon(
            _setups(n_pools), source, actuator, make_forecaster(forecaster), clock=clock, tick_s=1.0,
            telemetry=Telemetry(clock), audit=audit,
        )  # fmt: skip
        times, cpu = [], []
        for _ in range(warm + ticks):
            t0, c0 = time.perf_counter(), time.thread_time()
            report = daemon.tick()
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            assert report.ok, report.message
            clock.advance(1.0)
    return _stats(times[warm:], cpu[warm:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--instances", type=int, nargs="+", default=[2, 64], help="instances per pool")
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--forecaster", choices=("holt", "default"), default="holt")
    parser.add_argument("--warm-ticks", type=int, default=5, help="ticks before the measured ones")
    parser.add_argument("--what", choices=("both", "pipeline", "daemon"), default="both")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for n_pools in args.pools:
        for per_pool in args.instances:
            for what, fn in (
                ("Pipeline.tick", bench_pipeline),
                ("Daemon.tick (dry-run, audit, metrics)", bench_daemon),
            ):
                if args.what != "both" and not what.lower().startswith(args.what):
                    continue
                rows.append({"what": what, "pools": n_pools, "instances_per_pool": per_pool,
                             **fn(n_pools, per_pool, args.ticks, args.forecaster, args.warm_ticks)})  # fmt: skip
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    load_after = os.getloadavg()
    print(
        "| what | pools × instances | wall median ms | wall p99 ms | wall max ms | cpu median ms | cpu p99 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| `{r['what']}` | {r['pools']} × {r['instances_per_pool']} | {r['median_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} | {r['cpu_median_ms']:.2f} | {r['cpu_p99_ms']:.2f} |"
        )
    print(
        f"forecaster {args.forecaster}, {args.warm_ticks} warm-up ticks; peak RSS {peak_rss_mb:.0f} MB;"
        f" load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    if args.json is not None:
        out = {
            "rows": rows,
            "forecaster": args.forecaster,
            "warm_ticks": args.warm_ticks,
            "peak_rss_mb": peak_rss_mb,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
