"""Where the controller tick's tail comes from: the 5-s tick of the burst reserve, garbage collection, or else.

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_tick_tail.py [--forecaster default]
[--modes plain,freeze,gen0-10000] [--repeats 3] [--ticks 300]``. Each run is a fresh interpreter (modes
alternate, ``--repeats`` rounds) ticking bench/bench_daemon.py's ``Pipeline.tick`` on 8 pools × 125
instances after 5 warm-up ticks. Modes: ``plain`` (Python's defaults), ``freeze`` (``gc.freeze()`` after the
warm-up: start-up objects leave the collector's generations), ``gen0-N`` (``gc.set_threshold(N)`` after the
warm-up). Per run: CPU ms per tick (``time.thread_time``) median and p99, the mean of the ticks that open a
burst-reserve need block (``now_s`` a multiple of 5 s: every pool recomputes its reserve on the same tick)
and of the others, and the CPU ms spent in the collector during the measured ticks (``gc.callbacks``) with
the collections per generation.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def one_run(mode: str, forecaster: str, ticks: int) -> dict[str, Any]:
    from bench_daemon import SyntheticSource, _setups, make_forecaster

    from controller.pipeline import Pipeline, PoolCounts

    n_pools, per_pool = 8, 125
    source = SyntheticSource(n_pools, per_pool)
    pipe = Pipeline(_setups(n_pools), make_forecaster(forecaster), gpu_budget=8 * n_pools * per_pool)
    one = {"prefill": per_pool // 2, "decode": per_pool // 2}
    zero = {"prefill": 0, "decode": 0}
    counts = {f"p{p}": PoolCounts(one, one, zero, zero) for p in range(n_pools)}
    spent = {"ms": 0.0, "start": 0.0}
    gens = [0, 0, 0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent["start"] = time.thread_time()
        else:
            spent["ms"] += (time.thread_time() - spent["start"]) * 1e3
            gens[info["generation"]] += 1

    five: list[float] = []
    other: list[float] = []
    cpu: list[float] = []
    for k in range(5 + ticks):
        if k == 5:  # after start-up and warm-up, as a daemon would before its loop
            if mode == "freeze":
                gc.freeze()
            elif mode.startswith("gen0-"):
                gc.set_threshold(int(mode.removeprefix("gen0-")))
            gc.callbacks.append(on_gc)
        now = 1.7e9 + k
        scrape = source.scrape(now)
        c0 = time.thread_time()
        pipe.tick(scrape, counts, now)
        c = (time.thread_time() - c0) * 1e3
        if k >= 5:
            cpu.append(c)
            (five if now % 5 == 0 else other).append(c)
    ordered = sorted(cpu)
    return {
        "mode": mode,
        "median_ms": statistics.median(ordered),
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "max_ms": ordered[-1],
        "five_s_mean_ms": statistics.fmean(five),
        "other_mean_ms": statistics.fmean(other),
        "gc_ms": spent["ms"],
        "gc_collections": gens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--modes", default="plain,freeze")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one run in this mode
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.forecaster, args.ticks)))
        return
    print(f"forecaster {args.forecaster}; load average before {os.getloadavg()[0]:.2f}")
    print(
        "| run | mode | cpu median ms | cpu p99 ms | max ms | 5-s ticks mean ms | other ticks mean ms | GC ms (gen 0/1/2) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in range(args.repeats):
        for mode in args.modes.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--one",
                mode,
                "--forecaster",
                args.forecaster,
                "--ticks",
                str(args.ticks),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            o = json.loads(res.stdout.strip().splitlines()[-1])
            g = "/".join(str(x) for x in o["gc_collections"])
            print(
                f"| {r + 1} | {mode} | {o['median_ms']:.2f} | {o['p99_ms']:.2f} | {o['max_ms']:.2f} | "
                f"{o['five_s_mean_ms']:.2f} | {o['other_mean_ms']:.2f} | {o['gc_ms']:.1f} ({g}) |",
                flush=True,
            )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
