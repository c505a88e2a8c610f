"""``Pipeline.tick`` CPU time per tick, trees side by side: bench/bench_daemon.py run alternately on each tree.

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_tick_ab.py --trees /tmp/main-copy .
[--repeats 3] [--shapes 8x125 1x1000] [--forecaster default] [--ticks 300]``. Each run is a fresh interpreter
with ``PYTHONPATH=TREE`` running that tree's own bench/bench_daemon.py (``--what pipeline``; the script puts
its own tree first on ``sys.path``, so each tree must have it: copy it into an older one), under
``/usr/bin/time -f %M`` (peak RSS, KB); for every shape the trees alternate, ``--repeats`` rounds. Prints one
Markdown row per run (CPU median and p99 ms per tick, peak RSS, load average before it) and per shape the
median over the rounds of each tree and their ratio (second tree / first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path("bench") / "bench_daemon.py"


def one_run(tree: Path, pools: int, per_pool: int, forecaster: str, ticks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out, rss = Path(tmp) / "out.json", Path(tmp) / "rss"
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss), sys.executable, str((tree / BENCH).resolve()), "--what", "pipeline",
               "--pools", str(pools), "--instances", str(per_pool), "--ticks", str(ticks),
               "--forecaster", forecaster, "--json", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
        load = os.getloadavg()[0]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tree)
        row = json.loads(out.read_text())["rows"][0]
        return {
            "cpu_median_ms": row["cpu_median_ms"],
            "cpu_p99_ms": row["cpu_p99_ms"],
            "rss_mb": int(rss.read_text().split()[-1]) / 1024.0,
            "load": load,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=Path, nargs=2, required=True, help="first (e.g. main) and second tree")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", default=["8x125", "1x1000"], help="POOLSxINSTANCES_PER_POOL")
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--ticks", type=int, default=300)
    args = ap.parse_args()
    for tree in args.trees:
        if not (tree / "controller" / "pipeline.py").is_file() or not (tree / BENCH).is_file():
            raise SystemExit(f"--trees {tree}: not a pdscale tree with {BENCH}")
    names = [str(t) for t in args.trees]
    print(f"forecaster {args.forecaster}, {args.ticks} ticks; CPU ms per tick (time.thread_time)")
    print("| shape | round | tree | cpu median ms | cpu p99 ms | peak RSS MB | load before |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for shape in args.shapes:
        pools, per_pool = (int(x) for x in shape.split("x"))
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for r in range(args.repeats):
            order = list(zip(names, args.trees, strict=True))
            for name, tree in order if r % 2 == 0 else order[::-1]:
                o = one_run(tree, pools, per_pool, args.forecaster, args.ticks)
                runs[name].append(o)
                print(f"| {pools} × {per_pool} | {r + 1} | {name} | {o['cpu_median_ms']:.2f} | "
                      f"{o['cpu_p99_ms']:.2f} | {o['rss_mb']:.0f} | {o['load']:.2f} |", flush=True)  # fmt: skip
        med = {n: {k: statistics.median(o[k] for o in runs[n]) for k in ("cpu_median_ms", "cpu_p99_ms", "rss_mb")}
               for n in names}  # fmt: skip
        summary.append((shape, med))
    print()
    print(f"| shape | {names[0]}: median (p99), RSS | {names[1]}: median (p99), RSS | ratio median (p99) |")
    print("|---|---|---|---|")
    for shape, med in summary:
        a, b = med[names[0]], med[names[1]]
        print(f"| {shape} | {a['cpu_median_ms']:.2f} ({a['cpu_p99_ms']:.2f}), {a['rss_mb']:.0f} MB | "
              f"{b['cpu_median_ms']:.2f} ({b['cpu_p99_ms']:.2f}), {b['rss_mb']:.0f} MB | "
              f"{b['cpu_median_ms'] / a['cpu_median_ms']:.2f} ({b['cpu_p99_ms'] / a['cpu_p99_ms']:.2f}) |")  # fmt: skip
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
