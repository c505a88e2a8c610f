"""Where a gateway queue (serving.sim.router.GatewayPolicy) wins or loses SLO: one workload and policy replayed
with the gateway off and on, side by side.

Prints, per run, the share of requests missing the TTFT SLO and the ITL SLO, then per minute of arrivals; and
what the controller saw at a few ticks (arrival rate, prompt tokens/s, waiting requests the queue stages read,
the gateway's share of them, the replicas it had set), to tell a different decision from a different queue.

Usage: OMP_NUM_THREADS=1 nice .venv/bin/python bench/bench_gateway_queue.py [--workload sine] [--policy predictive]
       [--forecaster default|holt] [--until-s 300] [--every-s 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_policies import make, run, workload  # noqa: E402

from serving.sim.router import GatewayPolicy  # noqa: E402


class Probe:
    """Wraps a controller policy; keeps its observation every ``every_s`` up to ``until_s``."""

    def __init__(self, inner: Any, until_s: float, every_s: float) -> None:
        self.inner, self.name = inner, inner.name
        self.until_s, self.every_s = until_s, every_s
        self.rows: list[tuple[float, float, float, float, float, str]] = []

    def reset(self, fleet: Any, traces: Any) -> None:
        self.inner.reset(fleet, traces)

    def on_tick(self, now_s: float, view: Any) -> Any:
        out = self.inner.on_tick(now_s, view)
        obs = getattr(self.inner, "last_obs", {}).get("default")
        if obs is not None and now_s <= self.until_s and now_s % self.every_s == 0:
            held = float(sum(view.pending.get("default", {}).values()))
            reps = f"{obs.replicas.get('prefill', 0)}P+{obs.replicas.get('decode', 0)}D"
            self.rows.append((now_s, obs.arrival_rps, obs.prompt_tps, obs.waiting_requests, held, reps))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="sine")
    ap.add_argument("--policy", default="predictive")
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--max-waiting", type=int, default=5)
    ap.add_argument("--until-s", type=float, default=300.0)
    ap.add_argument("--every-s", type=float, default=30.0)
    args = ap.parse_args()
    trace, fleet = workload(args.workload, None, 600.0)
    pool = fleet.pools[0]
    for label, gateway in (("off", None), ("on", GatewayPolicy(max_waiting=args.max_waiting))):
        probe = Probe(make(args.policy, args.forecaster, {}), args.until_s, args.every_s)
        rep = run(args.workload, trace, fleet, probe, gateway)
        ttft, itl = np.asarray(rep.request_ttft_ms), np.asarray(rep.request_itl_ms)
        arrival = np.asarray(rep.arrival_s)
        miss_t, miss_i = ttft > pool.slo_ttft_ms, itl > pool.slo_itl_ms
        print(
            f"## {args.workload} {args.policy} gateway {label}: SLO {rep.slo_attainment:.2%}, TTFT misses "
            f"{miss_t.mean():.1%}, ITL misses {miss_i.mean():.1%}, GPU-s {rep.gpu_seconds:,.0f}"
        )
        print("| arrivals | requests | TTFT misses | ITL misses |\n|---|---|---|---|")
        for lo in range(0, int(arrival.max()) + 60, 60):
            m = (arrival >= lo) & (arrival < lo + 60)
            if m.any():
                print(
                    f"| {lo}-{lo + 60} s | {int(m.sum())} | {miss_t[m].mean():.0%} | {miss_i[m].mean():.0%} |"
                )
        print(
            "| tick | arrivals/s | prompt tok/s | waiting (queue stages) | of which at the gateway | replicas |"
        )
        print("|---|---|---|---|---|---|")
        for t, arr, prompt, waiting, held, reps in probe.rows:
            print(f"| {t:.0f} s | {arr:.1f} | {prompt:,.0f} | {waiting:,.0f} | {held:,.0f} | {reps} |")


if __name__ == "__main__":
    main()
