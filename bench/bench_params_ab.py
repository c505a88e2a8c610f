"""Two settings of the predictive policy on one workload, bin by bin: where their GPU-seconds differ, by role
and lifecycle state, and what each planned.

For one workload of ``bench/bench_policies.py`` (``--workload`` and the other options as ``bench_misses.py``
takes them: ``--sine-period-s``, ``--ramp-s``, ``--duration-s``, ``--forecaster``), the predictive policy is
replayed twice: with ``--params`` (side A) and with ``--params-b`` (side B; both ``k=v,k=v`` PolicyConfig
overrides). A probe samples every tick the simulator's instances holding GPUs, by role and state
(``active`` with a request, ``idle`` = active with none, ``standby``, ``prov`` = provisioning or activating,
``drain``), GPU-seconds each. Printed per bin of ``--bin-s`` seconds: B − A GPU-s per role and state, the
running total of B − A, each side's mean planned active / standby target per role, the share of ticks at which
the trend stage read a ramp (side A), and each side's cold starts asked for in the bin. Then the totals per role
and state of both sides. The figures are deterministic; nothing is fitted.

Run: .venv/bin/python bench/bench_params_ab.py --workload ramp --forecaster default \
     --params standby_spare_settle=tick --params-b standby_spare_settle=persist --bin-s 60
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_misses import parse_args as misses_args
from bench.bench_policies import _parse_params, make, row_trace, run
from controller.policy import ScalingPlan
from controller.replay_policies import PredictivePolicy
from serving.sim.engine import HOLDS_GPU

ROLES = ("prefill", "decode")
STATES = ("active", "idle", "standby", "prov", "drain")
_STATE = {
    "active": "active",
    "standby": "standby",
    "provisioning": "prov",
    "activating": "prov",
    "draining": "drain",
}


class BinProbe:
    """Wraps the predictive replay policy; every tick adds the GPU-seconds since the last tick to
    (bin, role, state), as the instances were held at that tick (read-only on the simulator)."""

    def __init__(self, inner: PredictivePolicy, bin_s: float) -> None:
        self.inner, self.name, self.bin_s = inner, inner.name, bin_s
        self.sim: Any = None
        self.gpu_s: dict[tuple[int, str, str], float] = defaultdict(float)
        self._last_s = math.nan

    def reset(self, fleet: Any, traces: Any) -> None:
        self.inner.reset(fleet, traces)
        self.sim, self.gpu_s, self._last_s = None, defaultdict(float), math.nan

    def on_tick(self, now_s: float, view: Any) -> Any:
        if self.sim is None:
            self.sim = getattr(view.scrape, "__self__", None)
        if self.sim is not None and math.isfinite(self._last_s):
            dt, b = now_s - self._last_s, int(self._last_s // self.bin_s)
            for i in self.sim.instances:
                if i.state in HOLDS_GPU:
                    state = "idle" if i.state == "active" and i.empty else _STATE[i.state]
                    self.gpu_s[b, i.role, state] += i.gpus * dt
        self._last_s = now_s
        return self.inner.on_tick(now_s, view)


def planned(decisions: list[tuple[float, ScalingPlan]], bin_s: float) -> dict[int, dict[str, float]]:
    """Per bin: mean planned active and standby target per role, the share of ticks with a ramp read, and
    the cold starts the plan's counts asked for (rises of active + standby per role)."""
    acc: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    prev: dict[str, int] = {}
    for t, p in decisions:
        row = acc[int(t // bin_s)]
        row["n"] += 1
        row["ramp"] += any(r.startswith("trend:") or "ramp" in r.split(":")[0] for r in p.reasons)
        for role, active, standby in (
            ("prefill", p.prefill, p.standby_prefill),
            ("decode", p.decode, p.standby_decode),
        ):
            row[f"{role} active"] += active
            row[f"{role} standby"] += standby
            total = active + standby
            row[f"{role} up"] += max(total - prev.get(role, total), 0)
            prev[role] = total
    out: dict[int, dict[str, float]] = {}
    for b, row in acc.items():
        n = row["n"]
        out[b] = {k: (v if k.endswith(" up") else v / n) for k, v in row.items()}
    return out


def side(args: argparse.Namespace, params: str, bin_s: float) -> tuple[Any, BinProbe, PredictivePolicy]:
    trace, fleet = row_trace(args.workload, args)
    policy = make("predictive", args.forecaster, _parse_params(params))
    assert isinstance(policy, PredictivePolicy)
    probe = BinProbe(policy, bin_s)
    rep = run("predictive", trace, fleet, probe)
    return rep, probe, policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-b", required=True, help="side B's PolicyConfig overrides: k=v,k=v")
    own, rest = ap.parse_known_args()
    args = misses_args(rest)
    bin_s = args.bin_s
    rep_a, probe_a, pol_a = side(args, args.params, bin_s)
    rep_b, probe_b, pol_b = side(args, own.params_b, bin_s)
    print(
        f"{args.workload}: A {args.params!r}: SLO {rep_a.slo_attainment:.2%}, GPU-s {rep_a.gpu_seconds:,.0f}"
    )
    print(
        f"{args.workload}: B {own.params_b!r}: SLO {rep_b.slo_attainment:.2%}, GPU-s {rep_b.gpu_seconds:,.0f}"
    )
    plan_a, plan_b = planned(pol_a.decisions, bin_s), planned(pol_b.decisions, bin_s)
    bins = sorted({k[0] for k in probe_a.gpu_s} | {k[0] for k in probe_b.gpu_s})
    cols = [(r, s) for r in ROLES for s in STATES]
    print(
        f"\nB − A GPU-s per {bin_s:.0f}-s bin (P = prefill, D = decode); planned active+standby A → B; ramp read (A)"
    )
    print(
        "| t s | " + " | ".join(f"{r[0].upper()} {s}" for r, s in cols) + " | B − A | cum | P plan A → B |"
        " D plan A → B | D starts A / B | ramp |"
    )
    print("|---|" + "---|" * (len(cols) + 6))
    cum = 0.0
    for b in bins:
        diff = [probe_b.gpu_s.get((b, r, s), 0.0) - probe_a.gpu_s.get((b, r, s), 0.0) for r, s in cols]
        cum += sum(diff)
        pa, pb = plan_a.get(b, {}), plan_b.get(b, {})

        def pl(p: dict[str, float], role: str) -> str:
            return f"{p.get(f'{role} active', 0):.1f}+{p.get(f'{role} standby', 0):.1f}"

        print(
            f"| {b * bin_s:.0f} | "
            + " | ".join(f"{d:+.0f}" for d in diff)
            + f" | {sum(diff):+.0f} | {cum:+.0f} |"
            f" {pl(pa, 'prefill')} → {pl(pb, 'prefill')} | {pl(pa, 'decode')} → {pl(pb, 'decode')} |"
            f" {pa.get('decode up', 0):.0f} / {pb.get('decode up', 0):.0f} | {pa.get('ramp', 0):.0%} |"
        )
    print("\nTotals, GPU-s A / B (B − A)")
    print("| role | " + " | ".join(STATES) + " |\n|---|" + "---|" * len(STATES))
    for r in ROLES:
        cells = []
        for s in STATES:
            a = sum(v for (_, rr, ss), v in probe_a.gpu_s.items() if (rr, ss) == (r, s))
            bb = sum(v for (_, rr, ss), v in probe_b.gpu_s.items() if (rr, ss) == (r, s))
            cells.append(f"{a:,.0f} / {bb:,.0f} ({bb - a:+,.0f})")
        print(f"| {r} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
