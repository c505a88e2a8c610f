"""Two models under one GPU budget: a shared budget (one controller) against a static split (issue 8's goal).

The fleet (replayed through the simulator, ``serving.sim.fleet_file.replay_fleet``):

* ``chat``: a bursty chat/code workload on ``llama3-8b/a100`` (1 GPU per instance), TTFT 1 s / ITL 50 ms —
  ``--chat code`` the bundled Azure 2023 code trace (default), ``--chat mmpp`` the synthetic Markov-modulated
  trace of bench_policies.py (4 req/s, 6x bursts of ~20 s every ~150 s); ``--chat conv`` the smoother
  Azure 2023 conversation trace (a control: the predictive policy meets the SLO on it alone);
* ``longdoc``: a steady long-context workload on ``llama2-70b/a100`` (4 GPUs per instance), TTFT 8 s /
  ITL 100 ms — ``--longdoc synthetic`` (default) Poisson 0.3 req/s, prompts lognormal median 8,000 tokens
  (sigma 0.3), outputs median 300; ``--longdoc mooncake`` the bundled Mooncake trace (TTFT 30 s).

Both cut to ``--duration-s`` (1000). The budget is a fraction (``--budgets``) of the two pools' summed peak
demand (the capacity model on each trace's busiest 60 s, as the static split uses). For each budget and
policy: ``shared`` (one policy decides both pools every tick with the whole budget; when it binds, the pool at
the highest SLO risk gets the GPUs, each pool's static share guaranteed to it, and the fleet reserve step:
``controller.pipeline.FleetBudget``), ``shared-no-reserve`` (the same without the reserve step),
``shared-risk-only`` (neither guarantees nor reserve: SLO risk alone decides), ``static`` (the issue's
baseline: the budget split by peak demand, each pool's controller replayed alone in its share) and
``static-reserve`` (a control: each pool's controller alone with the reserve step, to show what the step saves
without sharing). Pools start at their trace's static-peak counts (``--cold-start``: at 1 + 1). The goal: both pools meet their SLO (attainment >= ``--slo-target``) under ``shared`` at lower
total GPU-seconds than under ``static``.

The predictive policy runs the Holt forecaster (``--forecaster holt``, as bench_policies.py, so rows compare
policy logic); ``--forecaster default`` loads the shipped checkpoint. Figures are deterministic (seeded traces,
virtual clock); only the wall seconds depend on the machine.

Run: .venv/bin/python bench/bench_fleet.py [--chat mmpp] [--budgets 1.0,1.5,2.0] [--policies predictive,reactive]
[--splits static,shared] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, oracle, dynamo-like)
from controller.config import PolicyConfig
from controller.replay_policies import (
    FLEET_KEYS,
    PredictivePolicy,
    _gpu_shares,
    _pool_configs,
    fleet_reserve,
)
from forecaster.baselines import Holt
from forecaster.types import Forecaster
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.fleet_file import FleetReplay, peak_demand_gpus, replay_fleet
from serving.sim.replay import PolicyOptions, ReplayPolicy, static_peak_counts
from serving.workload.readers import read_trace
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[1]


def _dataset(*parts: str) -> Path:
    for base in (ROOT / "datasets", ROOT.parent / "shared" / "datasets"):
        if (base.joinpath(*parts)).exists():
            return base.joinpath(*parts)
    raise FileNotFoundError(f"{'/'.join(parts)} not found under {ROOT / 'datasets'}")


def chat_trace(kind: str, duration_s: float) -> Trace:
    if kind in ("code", "conv"):
        trace = read_trace(_dataset("azure2023", f"AzureLLMInferenceTrace_{kind}.dev_before_1850.csv"))
    else:
        params = SyntheticParams(
            duration_s=duration_s, rate_rps=4.0, burst_multiplier=6.0, calm_mean_s=150.0, burst_mean_s=20.0,
            prompt=LengthDist(median_tokens=1000.0, sigma=0.8, max_tokens=8000),
            output=LengthDist(median_tokens=150.0, sigma=0.8, max_tokens=2000),
        )  # fmt: skip
        trace = generate(params, seed=11)
    return trace.window(0.0, duration_s)


def longdoc_trace(kind: str, duration_s: float) -> Trace:
    if kind == "mooncake":
        return read_trace(_dataset("mooncake", "synthetic_trace.jsonl")).window(0.0, duration_s)
    params = SyntheticParams(
        duration_s=duration_s, rate_rps=0.3, burst_multiplier=1.0,
        prompt=LengthDist(median_tokens=8000.0, sigma=0.3, max_tokens=32_000),
        output=LengthDist(median_tokens=300.0, sigma=0.5, max_tokens=2000),
    )  # fmt: skip
    return generate(params, seed=7)


def warm_start(pool: PoolSpec, trace: Trace) -> PoolSpec:
    """``pool`` starting at its trace's static-peak counts, as a fleet that has been running would (both
    splits start so; a cold start at 1 + 1 makes the first burst a loss no controller can avoid)."""
    counts = static_peak_counts(pool, trace)
    return dataclasses.replace(
        pool,
        prefill=dataclasses.replace(pool.prefill, initial=counts["prefill"]),
        decode=dataclasses.replace(pool.decode, initial=counts["decode"]),
    )


def fleet_pools(longdoc: str) -> tuple[PoolSpec, PoolSpec]:
    chat = PoolSpec(
        name="chat", profile="llama3-8b/a100", slo_ttft_ms=1000.0, slo_itl_ms=50.0,
        prefill=RoleCounts(initial=1, min=1, max=32), decode=RoleCounts(initial=1, min=1, max=32),
    )  # fmt: skip
    doc = PoolSpec(
        name="longdoc", profile="llama2-70b/a100", slo_ttft_ms=30_000.0 if longdoc == "mooncake" else 8000.0,
        slo_itl_ms=100.0, prefill=RoleCounts(initial=1, min=1, max=16), decode=RoleCounts(initial=1, min=1, max=16),
    )  # fmt: skip
    return chat, doc


# split label -> (replay_fleet's split, guarantee each pool its static share, fleet reserve step)
SPLITS: dict[str, tuple[str, bool, bool]] = {
    "static": ("static", True, False),  # the baseline: independent controllers, budget split by peak
    "shared": ("shared", True, True),  # one controller: SLO floors held, reserves pooled, shares guaranteed
    "shared-no-reserve": ("shared", True, False),  # one controller, budget by SLO risk only when it binds
    "shared-risk-only": ("shared", False, False),  # the same without guaranteed shares
    "static-reserve": ("static", True, True),  # control: each pool's controller alone with the reserve step
}


def predictive_holt(options: PolicyOptions) -> ReplayPolicy:
    base = PolicyConfig(**{k: v for k, v in options.params.items() if k not in FLEET_KEYS})

    def holt() -> Forecaster:
        return Holt()

    return PredictivePolicy(
        base,
        forecaster=holt,
        pool_configs=_pool_configs(options, base),
        gpu_shares=_gpu_shares(options),
        reserve=fleet_reserve(options),
    )


def row(label: str, budget: int, policy: str, result: FleetReplay, target: float) -> dict[str, Any]:
    doc = result.to_json()
    pools = doc["pools"]
    met = all((p["slo_attainment"] or 0.0) >= target for p in pools.values())
    return {
        "workload": label, "budget_gpus": budget, "policy": policy, "split": result.split,
        "chat_budget": pools["chat"]["gpu_budget"], "longdoc_budget": pools["longdoc"]["gpu_budget"],
        "chat_slo": pools["chat"]["slo_attainment"], "chat_gpu_s": pools["chat"]["gpu_seconds"],
        "longdoc_slo": pools["longdoc"]["slo_attainment"], "longdoc_gpu_s": pools["longdoc"]["gpu_seconds"],
        "fleet_slo": doc["slo_attainment"], "fleet_gpu_s": doc["gpu_seconds"], "both_meet_slo": met,
        "wall_s": doc["wall_s"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chat", choices=("code", "mmpp", "conv"), default="code")
    ap.add_argument("--longdoc", choices=("synthetic", "mooncake"), default="synthetic")
    ap.add_argument("--duration-s", type=float, default=1000.0)
    ap.add_argument("--budgets", default="1.0,0.75", help="fractions of the summed peak demand in GPUs")
    ap.add_argument("--policies", default="predictive,reactive")
    ap.add_argument(
        "--splits", default="static,shared,shared-no-reserve,static-reserve", help=", ".join(SPLITS)
    )
    ap.add_argument("--forecaster", choices=("holt", "default"), default="holt")
    ap.add_argument("--cold-start", action="store_true", help="pools start at 1 + 1, not their static peak")
    ap.add_argument("--slo-target", type=float, default=0.99, help="a pool meets its SLO at this attainment")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    args = ap.parse_args()

    chat, doc = fleet_pools(args.longdoc)
    traces = {
        "chat": chat_trace(args.chat, args.duration_s),
        "longdoc": longdoc_trace(args.longdoc, args.duration_s),
    }
    if not args.cold_start:
        chat, doc = warm_start(chat, traces["chat"]), warm_start(doc, traces["longdoc"])
    peaks = {p.name: peak_demand_gpus(p, traces[p.name]) for p in (chat, doc)}
    label = f"{args.chat}+{args.longdoc}"
    print(
        f"initial counts: chat {chat.prefill.initial}+{chat.decode.initial}, longdoc {doc.prefill.initial}+{doc.decode.initial}"
    )
    print(
        f"peak demand GPUs: {peaks}; requests: chat {len(traces['chat'])}, longdoc {len(traces['longdoc'])}"
    )
    print(
        "| workload | budget GPUs | policy | split | chat / longdoc GPUs | chat SLO | chat GPU-s | longdoc SLO "
        "| longdoc GPU-s | fleet SLO | fleet GPU-s | both meet SLO | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for fraction in (float(x) for x in args.budgets.split(",")):
        budget = max(round(fraction * sum(peaks.values())), 2)
        fleet = FleetSpec(pools=(chat, doc), gpu_budget=budget)
        for policy in args.policies.split(","):
            chosen: Any = predictive_holt if policy == "predictive" and args.forecaster == "holt" else policy
            for split in args.splits.split(","):
                if split not in SPLITS:
                    raise SystemExit(f"--splits: unknown split {split!r} (known: {', '.join(SPLITS)})")
                mode, guarantee, reserve = SPLITS[split]
                result = replay_fleet(
                    fleet, traces, chosen, split=mode, guarantee_shares=guarantee, reserve=reserve
                )
                r = row(label, budget, policy, result, args.slo_target)
                r["split"] = split
                rows.append(r)
                print(
                    f"| {label} | {budget} ({fraction:g} × peak) | {policy} | {split} | {r['chat_budget']} / "
                    f"{r['longdoc_budget']} | {r['chat_slo']:.2%} | {r['chat_gpu_s']:,.0f} | {r['longdoc_slo']:.2%} | "
                    f"{r['longdoc_gpu_s']:,.0f} | {r['fleet_slo']:.2%} | {r['fleet_gpu_s']:,.0f} | "
                    f"{'yes' if r['both_meet_slo'] else 'no'} | {r['wall_s']:.0f} |",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps({"peaks": peaks, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
