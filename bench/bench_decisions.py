"""When the predictive policy asked for each instance of one role, and why: the decision audit of one workload.

For one workload of ``bench/bench_policies.py`` (the same trace, fleet and policy; ``--duration-s`` replays the
first seconds of the row's own trace, as ``bench_misses.py`` does), the predictive policy is replayed and its
plans are read back. Printed: every tick in ``[--from-s, --to-s]`` at which the role's planned active or
standby count changes (a cold start asked for then serves one ``provision_lead_s`` later at the earliest), and
the role's stage values (the plan's reasons that name it: stage 1's need, the headroom, the burst reserve, the
standby's sizing) every ``--every-s`` seconds. The figures are deterministic; nothing is fitted.

Run: .venv/bin/python bench/bench_decisions.py --workload mmpp-diurnal --duration-s 400 --role decode --to-s 240
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_misses import parse_args as misses_args
from bench.bench_policies import _parse_params, make, row_trace, run
from controller.config import PolicyConfig
from controller.policy import ScalingPlan
from controller.replay_policies import PredictivePolicy


def changes(decisions: list[tuple[float, ScalingPlan]], role: str) -> list[tuple[float, int, int]]:
    """(tick, active target, standby target) at every tick where the role's pair differs from the tick before."""
    out: list[tuple[float, int, int]] = []
    for t, plan in decisions:
        pair = (
            (plan.prefill, plan.standby_prefill) if role == "prefill" else (plan.decode, plan.standby_decode)
        )
        if not out or out[-1][1:] != pair:
            out.append((t, *pair))
    return out


def role_reasons(plan: ScalingPlan, role: str) -> list[str]:
    """The plan's reasons that bear on ``role``: those naming it, and stage 1's load line."""
    return [r for r in plan.reasons if role in r or r.startswith("load:")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("prefill", "decode"), default="decode")
    ap.add_argument("--from-s", type=float, default=0.0)
    ap.add_argument("--to-s", type=float, default=240.0)
    ap.add_argument("--every-s", type=float, default=10.0)
    own, rest = ap.parse_known_args()
    args = misses_args(rest)  # --workload, --duration-s, --params, ... as bench_misses.py takes them
    trace, fleet = row_trace(args.workload, args)
    params = _parse_params(args.params)
    policy = make("predictive", args.forecaster, params)
    assert isinstance(policy, PredictivePolicy)
    rep = run("predictive", trace, fleet, policy)
    lead_s = PolicyConfig(**params).provision_lead_s
    window = [(t, p) for t, p in policy.decisions if own.from_s <= t <= own.to_s]
    print(
        f"{args.workload} predictive {args.params}: SLO {rep.slo_attainment:.2%}, GPU-s {rep.gpu_seconds:,.0f}"
    )
    print(
        f"\n{own.role}: planned counts as they change (a cold start asked for at t serves from t + {lead_s:.0f} s)"
    )
    print("| t s | active target | standby target |\n|---|---|---|")
    for t, active, standby in changes(window, own.role):
        print(f"| {t:.0f} | {active} | {standby} |")
    print(f"\n{own.role}: the stages every {own.every_s:.0f} s")
    next_s = own.from_s
    for t, plan in window:
        if t + 1e-9 >= next_s:
            print(f"t={t:.0f}:")
            for r in role_reasons(plan, own.role):
                print(f"    {r}")
            next_s = t + own.every_s


if __name__ == "__main__":
    main()
