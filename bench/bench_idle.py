"""The predictive policy on trace files with ``PolicyConfig`` overrides side by side, and where each loses requests.

For the silences of docs/BENCHMARKS.md ("Silences and histories that start in a burst"): each ``--params`` value
(``k=v,...``; ``''`` = the defaults) is one predictive row per ``--trace`` file, beside ``--policies`` (default
reactive) with their defaults. Then, per ``--window-s`` of arrivals, the requests that missed the SLO under each
row (only windows where the rows differ), so a change in attainment is located in the trace.

llama3-8b/a100, one P/D pool, TTFT 1 s / ITL 50 ms, the shipped forecaster; every figure is deterministic.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_idle.py --trace F [--trace G] \
       --params '' --params idle_release_s=1800 [--policies reactive] [--window-s 60]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policies import _parse_params

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, oracle, dynamo-like)
from controller.config import PolicyConfig
from controller.replay_policies import PredictivePolicy
from serving.sim.fleet import single_pool
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay
from serving.workload.readers import read_trace


def rows(
    path: Path, params: list[str], policies: list[str]
) -> dict[str, tuple[float, float, np.ndarray, np.ndarray]]:
    """label -> (SLO attainment, GPU-s, arrival s, met the SLO) per row on one trace."""
    trace, fleet = read_trace(path), single_pool()
    pool = fleet.pools[0]
    runs: list[tuple[str, ReplayPolicy]] = [(p, make_policy(p, PolicyOptions())) for p in policies]
    for text in params:
        runs.append(
            (f"predictive {text or 'defaults'}", PredictivePolicy(PolicyConfig(**_parse_params(text))))
        )
    out = {}
    for label, policy in runs:
        rep = replay(fleet, {pool.name: trace}, policy)
        met = (np.asarray(rep.request_ttft_ms) <= pool.slo_ttft_ms) & (
            np.asarray(rep.request_itl_ms) <= pool.slo_itl_ms
        )
        out[label] = (rep.slo_attainment, rep.gpu_seconds, np.asarray(rep.arrival_s), met)
        print(f"| {path.name} | {label} | {rep.slo_attainment:.2%} | {rep.gpu_seconds:,.0f} |", flush=True)
    return out


def misses_by_window(res: dict[str, tuple[float, float, np.ndarray, np.ndarray]], window_s: float) -> None:
    labels = list(res)
    end = max(float(r[2].max()) for r in res.values())
    print(f"\nmissed / arrived per {window_s:.0f} s (windows where the rows differ): " + " | ".join(labels))
    for lo in np.arange(0.0, end + window_s, window_s):
        cells = []
        for label in labels:
            _, _, arrival, met = res[label]
            m = (arrival >= lo) & (arrival < lo + window_s)
            cells.append((int((~met[m]).sum()), int(m.sum())))
        if len({c[0] for c in cells}) > 1:
            print(f"{lo:7.0f} s: " + " | ".join(f"{a}/{n}" for a, n in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, action="append", required=True)
    ap.add_argument(
        "--params", action="append", default=None, help="PolicyConfig overrides k=v,k=v ('' = none)"
    )
    ap.add_argument(
        "--policies", default="reactive", help="comparison policies with their defaults ('' = none)"
    )
    ap.add_argument("--window-s", type=float, default=60.0)
    args = ap.parse_args()
    print("| trace | row | SLO attained | GPU-s |\n|---|---|---|---|")
    for path in args.trace:
        res = rows(path, args.params or [""], [p for p in args.policies.split(",") if p])
        misses_by_window(res, args.window_s)


if __name__ == "__main__":
    main()
