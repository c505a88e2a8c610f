"""The controller's start-up and memory with the shipped checkpoint, trees side by side.

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_controller_start.py --trees /tmp/main-copy .
[--repeats 3] [--ticks 300]``. For each tree in turn (alternating, ``--repeats`` rounds) a fresh interpreter
with ``PYTHONPATH=TREE`` imports the daemon's modules (``controller.cli``, ``controller.daemon``,
``controller.replay_policies``), loads the default forecaster as the daemon does
(``controller.forecasting.load_default_forecaster``), then runs ``--ticks`` ``Pipeline.tick`` of
bench/bench_daemon.py's synthetic 8 pools × 125 instances with it. Reported per run: wall and CPU seconds of
the imports and of the load, the forecaster's class, whether torch was imported, the peak RSS after the load
and at the end (``ru_maxrss``, what ``/usr/bin/time -f %M`` reports), the median / p99 CPU ms per tick, and of
the forecaster's own ``step`` inside those ticks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = r"""
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import controller.cli, controller.daemon, controller.replay_policies
from controller.forecasting import load_default_forecaster
t1, c1 = time.perf_counter(), time.process_time()
fc = load_default_forecaster()
t2, c2 = time.perf_counter(), time.process_time()
rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
inner = fc
while hasattr(inner, "inner"):
    inner = inner.inner
sys.path.insert(0, "bench")
from bench_daemon import SyntheticSource, _setups
from controller.pipeline import Pipeline, PoolCounts
n_pools, per_pool, ticks = 8, 125, int(sys.argv[1])
source = SyntheticSource(n_pools, per_pool)
step_ms = []
class Timed:  # the forecaster's own step, timed inside the tick
    def __init__(self, inner):
        self.inner, self.name, self.horizon_s = inner, inner.name, inner.horizon_s
    def reset(self, node_ids):
        self.inner.reset(node_ids)
    def step(self, x, mask, now_s=float("nan")):
        c = time.thread_time()
        out = self.inner.step(x, mask, now_s=now_s)
        step_ms.append((time.thread_time() - c) * 1e3)
        return out
pipe = Pipeline(_setups(n_pools), Timed(fc), gpu_budget=8 * n_pools * per_pool)
one = {"prefill": per_pool // 2, "decode": per_pool // 2}
zero = {"prefill": 0, "decode": 0}
counts = {f"p{p}": PoolCounts(one, one, zero, zero) for p in range(n_pools)}
cpu = []
for k in range(5 + ticks):
    now = 1.7e9 + k
    scrape = source.scrape(now)
    c = time.thread_time()
    pipe.tick(scrape, counts, now)
    cpu.append((time.thread_time() - c) * 1e3)
print(json.dumps({
    "import_wall_s": t1 - t0, "import_cpu_s": c1 - c0, "load_wall_s": t2 - t1, "load_cpu_s": c2 - c1,
    "forecaster": type(inner).__name__, "torch": "torch" in sys.modules,
    "rss_after_load_mb": rss_load, "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    "tick_cpu_ms": cpu[5:], "step_cpu_ms": step_ms[5:],
}))
"""


def run_child(tree: Path, ticks: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(ticks)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise SystemExit(f"{tree}: child failed:\n{res.stderr}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=Path, nargs="+", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    print(f"load average before {os.getloadavg()[0]:.2f}")
    print(
        "| tree | run | forecaster | torch | import wall / cpu s | load wall / cpu s | RSS after load MB | peak RSS MB | tick cpu median (p99) ms | forecaster step cpu median (p99) ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    runs = []
    for r in range(args.repeats):
        for tree in args.trees:
            o = run_child(tree.resolve(), args.ticks)
            cpu = sorted(o["tick_cpu_ms"])
            med, p99 = statistics.median(cpu), cpu[int(0.99 * (len(cpu) - 1))]
            steps = sorted(o["step_cpu_ms"])
            s_med, s_p99 = statistics.median(steps), steps[int(0.99 * (len(steps) - 1))]
            runs.append({"tree": str(tree), "run": r, **{k: v for k, v in o.items() if not k.endswith("_cpu_ms")},
                         "tick_cpu_median_ms": med, "tick_cpu_p99_ms": p99, "step_cpu_median_ms": s_med})  # fmt: skip
            print(
                f"| {tree} | {r + 1} | {o['forecaster']} | {o['torch']} | {o['import_wall_s']:.2f} / "
                f"{o['import_cpu_s']:.2f} | {o['load_wall_s']:.2f} / {o['load_cpu_s']:.2f} | "
                f"{o['rss_after_load_mb']:.0f} | {o['rss_peak_mb']:.0f} | {med:.2f} ({p99:.2f}) | "
                f"{s_med:.2f} ({s_p99:.2f}) |",
                flush=True,
            )
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
