"""Simulator speed, two trees side by side: bench_sim.py (1 h at 30 req/s on 8+8 instances) and one
``pdscale replay`` with a policy in the loop, alternating between the trees, each run in its own process.

For each repeat and tree: bench_sim.py's CPU seconds and peak RSS (its own figures: the replay only), then
``pdscale replay --trace TRACE --policy POLICY --json OUT`` as a whole process (CPU seconds of the process:
imports, the forecaster and the simulator; its peak RSS), whose JSON must be the same on both trees (``wall_s``
aside). Prints one line per run and a summary: median CPU seconds per tree and the ratios head / base.

Run: .venv/bin/python bench/bench_sim_ab.py --base /tmp/main-copy [--head .] [--repeats 3] [--duration-s 3600]
     [--replay-trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv]
     [--replay-policy predictive]
Run it under ``OMP_NUM_THREADS=1 nice -n 10`` (the children inherit both) and quote the load it prints.
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

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "datasets" / "azure2023" / "AzureLLMInferenceTrace_code.dev_before_1850.csv"


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(cmd: list[str], tree: Path) -> tuple[str, float, float]:
    """Run ``cmd`` in ``tree``; its stdout, CPU seconds (user + system) and peak RSS in MB (from wait4)."""
    proc = subprocess.Popen(cmd, cwd=tree, env=_env(tree), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} in {tree} failed with exit code {proc.returncode}")
    return out, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def bench_sim(tree: Path, duration_s: float) -> dict[str, Any]:
    out, _, _ = _run([sys.executable, "bench/bench_sim.py", "--duration-s", str(duration_s)], tree)
    doc: dict[str, Any] = json.loads(out)
    return doc


def replay_cli(tree: Path, trace: Path, policy: str, json_out: Path) -> tuple[float, float, dict[str, Any]]:
    code = "import sys; from training.pdscale_cli import main; sys.argv[0] = 'pdscale'; main()"
    cmd = [sys.executable, "-c", code, "replay", "--trace", str(trace), "--policy", policy]
    _, cpu_s, rss_mb = _run([*cmd, "--json", str(json_out)], tree)
    doc: dict[str, Any] = json.loads(json_out.read_text())
    return cpu_s, rss_mb, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--base", type=Path, required=True, help="the tree to compare against (e.g. a copy of main)"
    )
    ap.add_argument("--head", type=Path, default=ROOT, help="the tree under test (default: this one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--replay-trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--replay-policy", default="predictive")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "head": args.head.resolve()}
    trace = args.replay_trace.resolve()
    print(f"load before: {os.getloadavg()[0]:.2f}; base {trees['base']}, head {trees['head']}", flush=True)
    sim: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    rep: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    docs: dict[str, dict[str, Any]] = {}
    results: dict[str, tuple[Any, ...]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, tree in trees.items():
                doc = bench_sim(tree, args.duration_s)
                sim[name].append((doc["cpu_s"], doc["peak_rss_mb"]))
                key = (
                    doc["requests"],
                    doc["completed"],
                    doc["ttft_ms"],
                    doc["itl_ms"],
                    doc["slo_attainment"],
                )
                results.setdefault(name, key)
                print(
                    f"repeat {r + 1} {name} bench_sim: {doc['cpu_s']:.2f} CPU s, {doc['peak_rss_mb']:.0f} MB, "
                    f"{doc['requests']} requests, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                if args.skip_replay:
                    continue
                cpu_s, rss_mb, rdoc = replay_cli(tree, trace, args.replay_policy, Path(tmp) / f"{name}.json")
                rdoc.pop("wall_s", None)
                docs.setdefault(name, rdoc)
                rep[name].append((cpu_s, rss_mb))
                print(
                    f"repeat {r + 1} {name} replay --policy {args.replay_policy}: {cpu_s:.2f} CPU s, "
                    f"{rss_mb:.0f} MB, SLO {rdoc['slo_attainment']:.6f}, GPU-s {rdoc['gpu_seconds']:.1f}, "
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"bench_sim results equal on both trees: {results['base'] == results['head']}")
    if not args.skip_replay:
        print(f"replay JSON equal on both trees (wall_s aside): {docs['base'] == docs['head']}")
    for label, runs in (("bench_sim", sim), (f"replay --policy {args.replay_policy}", rep)):
        if not runs["base"]:
            continue
        med = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
        rss = {k: max(m for _, m in v) for k, v in runs.items()}
        print(
            f"{label}: median CPU s base {med['base']:.2f}, head {med['head']:.2f}, ratio "
            f"{med['head'] / med['base']:.3f}; peak RSS MB base {rss['base']:.0f}, head {rss['head']:.0f}"
        )


if __name__ == "__main__":
    main()
