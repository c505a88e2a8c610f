"""`pdscale tune` figures: replay cost per forecaster, the 50-trial goal, and a train/test split of traces.

1. ``speed``: one 30-minute replay of the bundled Azure code trace under the predictive policy with the
   default config, per forecaster (``holt`` baseline, ``default`` = the shipped learned checkpoint), best of
   ``--repeats``. Decides which forecaster `pdscale tune` can afford by default.
2. ``sweep``: ``python -m training.tune_cli`` (what `pdscale tune` runs) on the code trace's first 30 min,
   ``--trials`` trials, timed end to end (imports, study, test replays, plots), with held-out traces: the
   Azure conv trace, the MMPP synthetic trace of bench/bench_policies.py and the bundled Mooncake trace.
   Prints one markdown row per trace (defaults vs tuned) and the wall time.

The replay figures are deterministic (seeded traces, virtual clock); wall seconds depend on the machine and on
its load (the shared 2-core machine: run it under ``nice`` and record the load).

Run: .venv/bin/python bench/bench_tune.py [--part speed,sweep] [--trials 50] [--forecaster default]
     [--objective constrained] [--out-dir out/bench_tune]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_policies import _azure, workload
from controller.config import PolicyConfig
from serving.workload.readers import read_trace
from serving.workload.writers import write_trace
from training import tune

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "datasets" / "mooncake" / "synthetic_trace.jsonl"


def speed(repeats: int) -> None:
    trace = read_trace(_azure("code")).window(0.0, 1800.0)
    steps = [tune.Step("code[0,1800)", trace, tune.TuneSettings().fleet())]
    print(f"| forecaster | replay wall s (best of {repeats}) | SLO attained | GPU-s |")
    print("|---|---|---|---|")
    for name in ("holt", "default"):
        make = tune.forecaster_factory(name)
        best, ev = float("inf"), None
        for _ in range(repeats):
            t0 = time.perf_counter()
            ev = tune.evaluate(PolicyConfig(), steps, make)
            best = min(best, time.perf_counter() - t0)
        assert ev is not None
        print(f"| {name} | {best:.2f} | {ev.slo_attainment:.2%} | {ev.gpu_seconds:,.0f} |", flush=True)


def sweep(args: argparse.Namespace) -> None:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mmpp, _ = workload("mmpp", None, 600.0)
    mmpp_path = write_trace(mmpp, out / "mmpp.csv", "azure")
    tests = [_azure("conv"), mmpp_path] + ([MOONCAKE] if MOONCAKE.exists() else [])
    db = out / f"{args.study}.db"
    if db.exists():
        db.unlink()  # a fresh study: the wall time is one sweep's
    cmd = [
        sys.executable, "-m", "training.tune_cli", "--trace", str(_azure("code")), "--duration-s", "1800",
        "--trials", str(args.trials), "--objective", args.objective, "--forecaster", args.forecaster,
        "--chunks", str(args.chunks), "--storage", f"sqlite:///{db}", "--study", args.study, "--seed", "0",
        "--out", str(out / f"{args.study}-best.yaml"), "--json", str(out / f"{args.study}.json"),
        "--plots", str(out / f"{args.study}-plots"),
        *[a for t in tests for a in ("--test-trace", str(t))],
    ]  # fmt: skip
    print("command:", " ".join(cmd[1:]), flush=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "COLUMNS": "160"})
    wall = time.perf_counter() - t0
    doc = json.loads((out / f"{args.study}.json").read_text())
    t = doc["trials"]
    print(
        f"\nwall {wall:.0f} s for {args.trials} trials ({t['complete']} complete, {t['pruned']} pruned), "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; chosen trial {doc['best']['trial']}: "
        f"{doc['best']['rule']}; defaults better on train: {doc['defaults_better']}"
    )
    print("\n| trace | SLO default | SLO tuned | GPU-s default | GPU-s tuned | tuned/default |")
    print("|---|---|---|---|---|---|")
    for c in doc["comparisons"]:
        d, u = c["default"], c["tuned"]
        print(
            f"| {Path(c['trace'].removeprefix('train: ')).name}{' (train)' if c['trace'].startswith('train') else ''} "
            f"| {d['slo_attainment']:.2%} | {u['slo_attainment']:.2%} | {d['gpu_seconds']:,.0f} | "
            f"{u['gpu_seconds']:,.0f} | {u['gpu_seconds'] / d['gpu_seconds']:.2f} |"
        )
    print("\nparams:", json.dumps(doc["best"]["params"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="speed,sweep")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--objective", choices=tune.MODES, default="constrained")
    ap.add_argument("--forecaster", choices=tune.FORECASTERS, default="default")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--study", default="bench-code30")
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "bench_tune"))
    args = ap.parse_args()
    parts = args.part.split(",")
    if "speed" in parts:
        speed(args.repeats)
    if "sweep" in parts:
        sweep(args)


if __name__ == "__main__":
    main()
