"""Where the controller tick's tail comes from: the 5-s tick of the burst reserve, garbage collection, or else.

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_tick_tail.py [--forecaster default]
[--modes plain,freeze,gen0-10000] [--repeats 3] [--ticks 300]``. Each run is a fresh interpreter (modes
alternate, ``--repeats`` rounds) ticking bench/bench_daemon.py's ``Pipeline.tick`` on 8 pools × 125
instances after 5 warm-up ticks. Modes: ``plain`` (Python's defaults), ``freeze`` (``gc.freeze()`` after the
warm-up: start-up objects leave the collector's generations), ``gen0-N`` (``gc.set_threshold(N)`` after the
warm-up). Per run: CPU ms per tick (``time.thread_time``) median and p99, the mean of the ticks that open a
burst-reserve need block (``now_s`` a multiple of 5 s: every pool recomputes its reserve on the same tick)
and of the others, and the CPU ms spent in the collector during the measured ticks (``gc.callbacks``) with
the collections per generation. ``--profile`` instead runs one cProfile of 300 ticks after 100 and prints the
functions whose cumulative time per tick most exceeds, on the 5-s ticks, their time on the others (profiled
ms: cProfile inflates Python-heavy code several-fold).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _pipeline(forecaster: str) -> tuple[Any, Any, dict[str, Any]]:
    """bench/bench_daemon.py's synthetic source of 8 pools × 125 instances, its ``Pipeline`` and counts."""
    from bench_daemon import SyntheticSource, _setups, make_forecaster

    from controller.pipeline import Pipeline, PoolCounts

    n_pools, per_pool = 8, 125
    source = SyntheticSource(n_pools, per_pool)
    pipe = Pipeline(_setups(n_pools), make_forecaster(forecaster), gpu_budget=8 * n_pools * per_pool)
    one = {"prefill": per_pool // 2, "decode": per_pool // 2}
    zero = {"prefill": 0, "decode": 0}
    counts = {f"p{p}": PoolCounts(one, one, zero, zero) for p in range(n_pools)}
    return source, pipe, counts


def one_run(mode: str, forecaster: str, ticks: int) -> dict[str, Any]:
    source, pipe, counts = _pipeline(forecaster)
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


def profile(forecaster: str) -> None:
    source, pipe, counts = _pipeline(forecaster)
    profs = {"five": cProfile.Profile(), "other": cProfile.Profile()}
    n = {"five": 0, "other": 0}
    for k in range(400):
        now = 1.7e9 + k
        scrape = source.scrape(now)
        which = "five" if now % 5 == 0 else "other"
        if k >= 100:
            profs[which].enable()
            n[which] += 1
        pipe.tick(scrape, counts, now)
        if k >= 100:
            profs[which].disable()
    per_tick: dict[tuple[str, int, str], dict[str, float]] = {}
    for which, prof in profs.items():
        for key, row in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
            per_tick.setdefault(key, {})[which] = row[3] / n[which] * 1e3
    rows = sorted(per_tick.items(), key=lambda kv: kv[1].get("other", 0.0) - kv[1].get("five", 0.0))
    print("| function | 5-s tick, profiled ms | other tick | excess |")
    print("|---|---|---|---|")
    for (path, line, fn), d in rows[:15]:
        five, other = d.get("five", 0.0), d.get("other", 0.0)
        print(f"| `{Path(path).name}:{line}({fn})` | {five:.2f} | {other:.2f} | {five - other:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--modes", default="plain,freeze")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one run in this mode
    ap.add_argument("--profile", action="store_true", help="cProfile the 5-s ticks against the others")
    args = ap.parse_args()
    if args.profile:
        profile(args.forecaster)
        return
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
