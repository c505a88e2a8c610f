"""Mixed-node against dedicated placement under the controller's policies, side by side in one run (issue 8).

Run: ``nice .venv/bin/python bench/bench_mixed_controller.py`` (``--traces conv,code,poisson-decode``,
``--duration-s`` to cut the traces, ``--json OUT``). For each bundled Azure 2023 trace (conv, code; llama3-8b/a100,
TTFT 1 s, ITL 50 ms, the simulator's and ``bench_policies.py``'s defaults), a decode-bound synthetic control
(``poisson-decode``: Poisson 12 req/s, 256/1,024 tokens, 20 min, ITL 30 ms) and each policy (predictive with the Holt forecaster,
pinned as in bench_policies.py; reactive), it replays one pool three ways:

- ``dedicated``: one instance per node (prefill and decode pools scaled per role);
- ``mixed-node``: every node hosts a prefill instance (40 % of the node's KV memory) and a decode instance (the
  rest); the policy sizes each role on the node's partitioned capacities and scales whole nodes,
  ``max(prefill, decode)``; the decode steps slow down while the node's prefill works by the interference
  *derived* from the operator timings (``serving/sim/interference.py``);
- ``mixed-node x1.3``: the same with the old constant interference (``mixed_node_slowdown=1.3``), to show how
  much the verdict rests on the interference model.

Columns: SLO attainment (TTFT and ITL both met; an unfinished request is a miss), GPU-seconds, mean GPUs held,
P90 TTFT, mean of per-request ITL, requests, unfinished (0 = none dropped), and for the mixed rows the share
of decisions in which decode was the binding role. Every figure except wall seconds is deterministic (virtual
clock, no randomness in the replay).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

import controller.replay_policies  # noqa: F401  (registers the controller's policies)
from controller.config import PolicyConfig
from controller.replay_policies import PredictivePolicy
from forecaster.baselines import Holt
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.plan import poisson_trace
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

AZURE = Path(__file__).resolve().parents[1] / "datasets" / "azure2023"
TRACES = {
    "conv": AZURE / "AzureLLMInferenceTrace_conv.dev_before_1850.csv",
    "code": AZURE / "AzureLLMInferenceTrace_code.dev_before_1850.csv",
}
PLACEMENTS: dict[str, tuple[str, float | None]] = {
    "dedicated": ("dedicated", None),
    "mixed-node": ("mixed-node", None),  # derived interference
    "mixed-node x1.3": ("mixed-node", 1.3),  # the old constant
}


# a decode-bound control (the Azure traces are prompt-heavy): Poisson 12 req/s, 256-token prompts, 1,024-token
# outputs, 20 min, seed 0, ITL SLO 30 ms — the node count follows decode, where the interference model decides
SYNTHETIC = {"poisson-decode": (12.0, 256, 1024, 1200.0, 1000.0, 30.0)}


def load(name: str) -> tuple[Trace, float, float]:
    """(trace, TTFT SLO ms, ITL SLO ms) of a named workload."""
    if name in SYNTHETIC:
        rate, isl, osl, duration, ttft, itl = SYNTHETIC[name]
        return poisson_trace(rate, isl, osl, duration, seed=0), ttft, itl
    return read_trace(TRACES[name]), 1000.0, 50.0


def policy(name: str) -> ReplayPolicy:
    if name == "predictive":
        return PredictivePolicy(PolicyConfig(), forecaster=Holt)
    return make_policy(name, PolicyOptions())


def fleet_for(
    placement: str, slowdown: float | None, slo_ttft_ms: float = 1000.0, slo_itl_ms: float = 50.0
) -> FleetSpec:
    fleet = single_pool(slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)
    pool = dataclasses.replace(fleet.pools[0], placement=placement, mixed_node_slowdown=slowdown)
    return dataclasses.replace(fleet, pools=(pool,))


def decode_binds_share(chosen: ReplayPolicy) -> float:
    decisions = getattr(chosen, "decisions", [])
    marks = [p.reasons[-1] for _, p in decisions if p.reasons and p.reasons[-1].startswith("mixed-node pool")]
    return sum("decode binds" in r for r in marks) / len(marks) if marks else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conv,code,poisson-decode")
    ap.add_argument("--policies", default="predictive,reactive")
    ap.add_argument("--duration-s", type=float, default=None, help="replay only each trace's first seconds")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    print(
        "| trace | policy | placement | SLO attainment | GPU·s | mean GPUs | P90 TTFT ms | mean ITL ms | "
        "requests | unfinished | decode binds | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for trace_name in args.traces.split(","):
        trace, slo_ttft_ms, slo_itl_ms = load(trace_name)
        if args.duration_s is not None:
            trace = trace.window(0.0, args.duration_s)
        span_s = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace) else 0.0
        for policy_name in args.policies.split(","):
            for label, (placement, slowdown) in PLACEMENTS.items():
                t0 = time.perf_counter()
                chosen = policy(policy_name)
                fleet = fleet_for(placement, slowdown, slo_ttft_ms, slo_itl_ms)
                rep = replay(fleet, {"default": trace}, chosen)
                wall = time.perf_counter() - t0
                itl = rep.request_itl_ms[np.isfinite(rep.request_itl_ms)]
                row = {
                    "trace": trace_name,
                    "policy": policy_name,
                    "placement": label,
                    "slo_attainment": rep.slo_attainment,
                    "gpu_seconds": rep.gpu_seconds,
                    "mean_gpus": rep.gpu_seconds / span_s if span_s > 0 else math.nan,
                    "ttft_p90_ms": rep.ttft_ms["p90"],
                    "itl_mean_ms": float(itl.mean()) if len(itl) else math.nan,
                    "requests": len(trace),
                    "unfinished": rep.unfinished,
                    "decode_binds": decode_binds_share(chosen),
                    "wall_s": wall,
                }
                rows.append(row)
                binds = "" if math.isnan(row["decode_binds"]) else f"{row['decode_binds']:.0%}"
                print(
                    f"| {trace_name} | {policy_name} | {label} | {row['slo_attainment']:.4f} | "
                    f"{row['gpu_seconds']:,.0f} | {row['mean_gpus']:.2f} | {row['ttft_p90_ms']:,.0f} | "
                    f"{row['itl_mean_ms']:.1f} | {row['requests']:,} | {row['unfinished']} | {binds} | "
                    f"{wall:.0f} |",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
