"""Every cold start of the predictive policy, one row each: which stage's target asked for it, how long that
target lasted, and how the instance ended (cancelled before ready, released idle, or serving).

For one or more workloads of ``bench/bench_policies.py`` (``--workloads`` as there: ``code``, ``mmpp``,
``file:PATH``, ...; the same traces, fleets and policy), the predictive policy is replayed with the simulator
kept (``ChurnProbe``), and for each instance started after t = 0:

* ``asked by``: the stage whose value first reached the instance's slot in the plan of the tick it was started
  (its slot: the role's previous target + its rank among the instances started that tick). The stages are
  read from the plan's reasons in their order, as ``bench_policies.py --decompose`` reads them: capacity
  (``ceil(need)``; ``capacity+queue`` when the plan carries a queue line), trend, headroom, buffer, burst reserve,
  alert, P:D ratio; past them ``hysteresis`` (the final target above every stage: a scale-down still held), and
  ``standby`` when the slot is above the active target (a warm standby provisioned);
* ``target held s``: from that tick until the role's active + standby target first fell below the slot;
* ``end``: ``cancelled`` (released before it was ever seen active or standby), ``idle`` (ready, released having
  served no request), ``served N`` (released after N requests), ``up`` (still held at the end);
* ``fall``: the stage binding at the tick the target fell below the slot (what the target fell to).

Then a summary per role and per (asked by, end). The figures are deterministic; nothing is fitted.

Run: .venv/bin/python bench/bench_cold_starts.py --workloads file:/tmp/shapes/s11_overdispersed.csv --rows
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_misses import parse_args as misses_args
from bench.bench_policies import ChurnProbe, _parse_params, make, row_trace, run
from bench.bench_policies import stage_walk as policies_stage_walk
from controller.policy import ScalingPlan
from controller.replay_policies import PredictivePolicy

ROLES = ("prefill", "decode")


def stage_walk(plan: ScalingPlan) -> list[tuple[str, list[int]]]:
    """``bench_policies.stage_walk`` (capacity named ``capacity+queue`` when the plan carries a queue line),
    then ``hysteresis`` with the final active target."""
    queue = any(r.startswith("queue:") for r in plan.reasons)
    steps = [
        ("capacity+queue" if queue and st == "capacity" else st, v) for st, v in policies_stage_walk(plan)
    ]
    steps.append(("hysteresis", [plan.prefill, plan.decode]))
    return steps


def asked_by(plan: ScalingPlan, role: str, slot: int) -> str:
    """The first stage of ``plan`` whose ``role`` target reaches ``slot`` (1-based); ``standby`` when the slot
    is above the active target (and within active + standby)."""
    i = ROLES.index(role)
    if slot > (plan.prefill, plan.decode)[i]:
        return "standby"
    for stage, value in stage_walk(plan):
        if value[i] >= slot:
            return stage
    return "hysteresis"


def binding(plan: ScalingPlan, role: str) -> str:
    """The stage that set ``role``'s final target: the last stage that changed it (``hysteresis`` when the
    final target differs from every stage's)."""
    i = ROLES.index(role)
    walk = stage_walk(plan)
    final = walk[-1][1][i]
    last = "capacity"
    prev: int | None = None
    for stage, value in walk[:-1]:
        if value[i] != prev:
            last, prev = stage, value[i]
    return last if prev == final else "hysteresis"


@dataclass(frozen=True)
class ColdStart:
    role: str
    start_s: float
    slot: int
    asked_by: str
    held_s: float  # the target's life at or above the slot (inf: to the end)
    fall: str  # the stage binding when it fell ("" when it never fell)
    end: str  # "cancelled", "idle", "served", "up"
    served: int
    release_s: float


def total(plan: ScalingPlan, role: str) -> int:
    return plan.prefill + plan.standby_prefill if role == "prefill" else plan.decode + plan.standby_decode


def cold_starts(
    decisions: list[tuple[float, ScalingPlan]], instances: list[Any], seen: dict[int, set[str]]
) -> list[ColdStart]:
    """One ColdStart per instance started after t = 0 (instances: the simulator's, with ``role``,
    ``t_alloc_s``, ``t_release_s``, ``router_requests_total``, ``index``; seen: index -> states seen per tick)."""
    times = [t for t, _ in decisions]
    out: list[ColdStart] = []
    rank: Counter[tuple[str, float]] = Counter()
    for inst in sorted((i for i in instances if i.t_alloc_s > 0), key=lambda i: (i.t_alloc_s, i.index)):
        role, t0 = inst.role, float(inst.t_alloc_s)
        k = max(bisect.bisect_right(times, t0 + 1e-9) - 1, 0)
        prev = total(decisions[k - 1][1], role) if k > 0 else 0
        rank[role, t0] += 1
        slot = prev + rank[role, t0]
        plan = decisions[k][1]
        held, fall = math.inf, ""
        for t, p in decisions[k + 1 :]:
            if total(p, role) < slot:
                held, fall = t - t0, binding(p, role)
                break
        gone = math.isfinite(inst.t_release_s)
        states = seen.get(inst.index, set())
        if not gone:
            end = "up"
        elif not states & {"active", "standby"}:
            end = "cancelled"
        elif inst.router_requests_total == 0:
            end = "idle"
        else:
            end = "served"
        out.append(
            ColdStart(role, t0, slot, asked_by(plan, role, slot), held, fall, end,
                      int(inst.router_requests_total), float(inst.t_release_s))
        )  # fmt: skip
    return out


def summary(rows: list[ColdStart]) -> Counter[tuple[str, str, str]]:
    """(role, asked by, end) -> count."""
    return Counter((r.role, r.asked_by, r.end) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="code,mmpp")
    ap.add_argument("--rows", action="store_true", help="print every cold start, not only the summary")
    own, rest = ap.parse_known_args()
    for wl in own.workloads.split(","):
        args = misses_args(["--workload", wl, *rest])
        trace, fleet = row_trace(args.workload, args)
        params = _parse_params(args.params)
        policy = make("predictive", args.forecaster, params)
        assert isinstance(policy, PredictivePolicy)
        probe = ChurnProbe(policy)
        rep = run("predictive", trace, fleet, probe)
        rows = cold_starts(policy.decisions, probe.sim.instances, probe.seen)
        zero = sum(1 for r in rows if r.end in ("cancelled", "idle"))
        print(
            f"\n{wl} predictive {args.params}: SLO {rep.slo_attainment:.2%}, GPU-s {rep.gpu_seconds:,.0f}; "
            f"cold starts {len(rows)}, served no request {zero}"
        )
        if own.rows:
            print(
                "| role | start s | slot | asked by | target held s | fell to (stage) | end | served | released s |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                print(
                    f"| {r.role} | {r.start_s:.0f} | {r.slot} | {r.asked_by} | {r.held_s:.0f} | {r.fall} | "
                    f"{r.end} | {r.served} | {r.release_s:.0f} |"
                )
        print("| role | asked by | end | cold starts | median target held s | instance-s until released |")
        print("|---|---|---|---|---|---|")
        for (role, by, end), n in sorted(summary(rows).items()):
            mine = [r for r in rows if (r.role, r.asked_by, r.end) == (role, by, end)]
            held = sorted(r.held_s for r in mine)
            spent = sum(r.release_s - r.start_s for r in mine if math.isfinite(r.release_s))
            print(f"| {role} | {by} | {end} | {n} | {held[len(held) // 2]:.0f} | {spent:,.0f} |")


if __name__ == "__main__":
    main()
