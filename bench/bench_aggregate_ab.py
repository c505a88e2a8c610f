"""``LoadAggregator.update`` (controller/sources/aggregate.py) CPU time per tick: this tree against another.

Both versions of the module are loaded side by side in one process and fed the same synthetic scrapes of
bench/bench_daemon.py (``--pools`` pools of ``--instances`` instances), interleaved, their outputs checked
equal. The "before" tree is any export, e.g. ``git archive <commit> | tar -x -C /tmp/before``.

Run: ``nice .venv/bin/python bench/bench_aggregate_ab.py --before /tmp/before [--pools 8] [--instances 125]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_daemon import SyntheticSource

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="root of the tree to compare against")
    ap.add_argument("--pools", type=int, default=8)
    ap.add_argument("--instances", type=int, default=125, help="instances per pool")
    ap.add_argument("--ticks", type=int, default=400)
    args = ap.parse_args()
    rel = Path("controller/sources/aggregate.py")
    if not (args.before / rel).is_file():
        raise SystemExit(f"--before {args.before}: no {rel} there")
    mods = {
        "before": _load(args.before / rel, "aggregate_before"),
        "after": _load(ROOT / rel, "aggregate_after"),
    }
    source = SyntheticSource(args.pools, args.instances)
    pools = [f"p{p}" for p in range(args.pools)]
    aggs = {name: m.LoadAggregator() for name, m in mods.items()}
    cpu: dict[str, list[float]] = {name: [] for name in mods}
    load0 = os.getloadavg()[0]
    for k in range(args.ticks):
        scrape = source.scrape(1.7e9 + k)
        outs = {}
        for name in ("before", "after") if k % 2 else ("after", "before"):
            c0 = time.thread_time()
            outs[name] = aggs[name].update(scrape, pools)
            cpu[name].append(time.thread_time() - c0)
        if repr(outs["before"]) != repr(outs["after"]):
            raise SystemExit(f"tick {k}: the two versions disagree")
    print(f"LoadAggregator.update, {args.pools} pools x {args.instances} instances, {args.ticks} ticks:")
    for name, values in cpu.items():
        print(f"  {name:6}: CPU median {statistics.median(values[10:]) * 1e3:.2f} ms per tick")
    print(f"outputs identical; load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
