"""Tail-request promotion (serving.sim.engine.TailPolicy): SLO attainment with and without it, same policy.

Workload: the MMPP bursty trace of bench/bench_policies.py (serving.workload.synthetic, 4 req/s mean, 6x
bursts of ~20 s every ~150 s, 1200 s, seed 5; ISL median 1500, OSL median 200), llama3-8b/a100, one P/D pool,
TTFT SLO 1 s, ITL SLO 50 ms. Policies: ``fixed`` at a few sizes with warm standby (prefill and decode), and
``predictive`` (Holt forecaster, as bench_policies pins it), each run without and with tail promotion
(fraction 0.5 of the TTFT SLO): "bump only" (priority bump, no standby) and "bump + standby" (one standby
promoted per tail request while the pool has one, held 60 s). The trace has one priority class, so the bump
alone can only reorder a queue where a request was re-queued (preempted) or parked at the router. Replays through
``serving.sim.replay.replay`` (tick 1 s, drain) with its ``tail`` argument.

Run: .venv/bin/python bench/bench_tail.py [--json OUT] [--duration-s 1200]
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import controller.replay_policies  # noqa: F401  (registers predictive)
from controller.config import PolicyConfig
from controller.replay_policies import PredictivePolicy
from forecaster.baselines import Holt
from forecaster.types import Forecaster
from serving.sim.engine import TailPolicy
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay
from serving.sim.report import ReplayReport
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace


def mmpp(duration_s: float) -> Trace:
    """bench_policies.py's ``mmpp`` workload, same parameters and seed."""
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=4.0,
        burst_multiplier=6.0,
        calm_mean_s=150.0,
        burst_mean_s=20.0,
        prompt=LengthDist(median_tokens=1500.0, sigma=0.8, max_tokens=8000),
        output=LengthDist(median_tokens=200.0, sigma=0.8, max_tokens=2000),
    )
    return generate(params, seed=5)


def with_priorities(trace: Trace, seed: int = 7) -> Trace:
    """The same requests with mixed classes: 20 % VIP, 50 % normal, 30 % batch (drawn with ``seed``)."""
    rng = np.random.default_rng(seed)
    prio = rng.choice([0, 1, 2], size=len(trace), p=[0.2, 0.5, 0.3]).astype(np.int8)
    return replace(trace, priority=prio)


def run(fleet: FleetSpec, trace: Trace, policy: ReplayPolicy, tail: TailPolicy | None) -> ReplayReport:
    """``serving.sim.replay.replay`` (tick 1 s, drain) with ``tail``."""
    return replay(fleet, {"default": trace}, policy, tail=tail)


def policies() -> dict[str, Any]:
    def holt() -> Forecaster:
        return Holt()

    out: dict[str, Any] = {}
    for p, d, s in ((1, 1, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2)):
        out[f"fixed {p}P+{d}D, standby {s}"] = lambda p=p, d=d, s=s: make_policy(
            "fixed", PolicyOptions(prefill=p, decode=d, standby=s)
        )
    out["predictive (holt)"] = lambda: PredictivePolicy(PolicyConfig(), forecaster=holt)
    out["predictive (holt), standby_prefill=2"] = lambda: PredictivePolicy(
        PolicyConfig(standby_prefill=2), forecaster=holt
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=1200.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    traces = {"mmpp": mmpp(args.duration_s)}
    traces["mmpp, mixed classes"] = with_priorities(traces["mmpp"])
    base = single_pool()
    pool = base.pools[0]
    fleet = replace(base, pools=(pool,))
    modes = {
        "off": None,
        "bump only": TailPolicy(fraction=0.5, promote_standby=False),
        "bump + standby": TailPolicy(fraction=0.5, promote_standby=True, hold_s=60.0),
    }
    rows: list[dict[str, Any]] = []
    print(
        "| workload | policy | tail | SLO attained | GPU-s | TTFT p99 ms | tail promotions | standby promotions | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (wl, trace), (name, factory), (mode, t) in itertools.product(
        traces.items(), policies().items(), modes.items()
    ):
        rep = run(fleet, trace, factory(), t)
        pools = rep.pools["default"]
        row = {
            "workload": wl,
            "policy": name,
            "tail": mode,
            "slo_attainment": rep.slo_attainment,
            "gpu_seconds": rep.gpu_seconds,
            "ttft_p99_ms": rep.ttft_ms["p99"],
            "tail_promotions": pools["tail_promotions"],
            "standby_promotions": pools["standby_promotions"],
            "unfinished": rep.unfinished,
            "wall_s": rep.wall_s,
        }
        rows.append(row)
        print(
            f"| {wl} | {name} | {mode} | {rep.slo_attainment:.2%} | {rep.gpu_seconds:,.0f} | "
            f"{rep.ttft_ms['p99']:,.0f} | {row['tail_promotions']} | {row['standby_promotions']} | "
            f"{rep.wall_s:.1f} |",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"requests": len(traces["mmpp"]), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
