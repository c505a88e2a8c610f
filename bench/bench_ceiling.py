"""What SLO attainment any causal policy can reach from the benchmark's start, row by row of bench_policies.py.

Every workload of ``bench/bench_policies.py`` starts at the fleet spec's 1 prefill + 1 decode with no standby,
and a cold start takes 120 s: what arrives before the first order is ready is served by 1 + 1, whatever the
policy. The ceiling here is the oracle (knows every arrival, ``controller.replay_policies.OraclePolicy``) made
blind until T s (``bench_rise.BlindOracle``: it asks for nothing before T, so the fleet stays at 1 + 1; from T
on it sizes for the true load × (1 + headroom)). T = 0 is the plain oracle, whose t = 0 answer the replay
applies warm (no causal policy can: it has seen nothing); T = 1 s is where the predictive policy's first plan
lands; T = 5 / 30 s: a policy that has read the load by then. Headroom 0.3 is the predictive policy's own;
headroom 3 (4 × the need) stands for "any cost", so the T = 1 / headroom 3 cell is about the most a causal
policy can reach from this start (no cheaper rule can beat it by more than the oracle's sizing errors).

Beside them, on the same trace: predictive (``--forecaster``, default ``default``: the shipped checkpoint),
reactive and static-peak (which answers at t = 0 and so starts warm), each with its SLO attainment, that of the
requests arriving from ``--warmup-s`` (600 s) on, and its GPU-s. One row per (workload, policy), in long form.

Workloads: bench_policies.py's names (``code``, ``conv``, ``mmpp``, ``mmpp@SEED``, ``mmpp-holdout[@SEED]``,
``mmpp-diurnal``, ``mooncake``, ``ramp``), and ``sine:P`` for the sinusoid with period P s (``sine`` = 600).
Deterministic (seeded traces, virtual clock).

Run: OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_ceiling.py [--workloads sine:600,mmpp]
     [--oracles 0:3,1:3,0:0.3,1:0.3,5:0.3,30:0.3] [--policies predictive,reactive,static-peak]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_policies import attainment_after, format_after, make, run, workload
from bench.bench_rise import BlindOracle
from serving.sim.fleet import FleetSpec
from serving.sim.replay import ReplayPolicy
from serving.workload.trace import Trace

ROWS = (
    "code,conv,mmpp,mmpp-holdout,mooncake,mmpp@3,mmpp@4,mmpp-holdout@1,mmpp-holdout@2,mmpp-diurnal,ramp,"
    "sine:300,sine:600,sine:1200"
)
ORACLES = "0:3,1:3,0:0.3,1:0.3,5:0.3,30:0.3"


def row_workload(name: str) -> tuple[Trace, FleetSpec]:
    """The trace and fleet of one row: a bench_policies workload, or ``sine:P`` (the sinusoid, period P s)."""
    base, sep, period = name.partition(":")
    if sep and base != "sine":
        raise ValueError(f"workload {name!r}: only the sinusoid takes a period (sine:P)")
    try:
        period_s = float(period) if sep else 600.0
    except ValueError:
        raise ValueError(f"workload {name!r}: the period must be a number of seconds") from None
    return workload(base, None, period_s)


def parse_oracles(text: str) -> list[tuple[float, float]]:
    """``T:H,...`` → [(blind until T s, headroom H)]; each T ≥ 0, each H in [0, 10] (the oracle's range)."""
    out = []
    for item in filter(None, text.split(",")):
        blind, sep, headroom = item.partition(":")
        try:
            pair = (float(blind), float(headroom) if sep else 0.3)
        except ValueError:
            raise ValueError(f"--oracles {item!r}: expected T:H, two numbers") from None
        if not (pair[0] >= 0 and 0 <= pair[1] <= 10):
            raise ValueError(f"--oracles {item!r}: T must be >= 0 and H in [0, 10]")
        out.append(pair)
    return out


def blind_oracle(blind_s: float, headroom: float) -> BlindOracle:
    pol = BlindOracle(headroom=headroom)
    pol.blind_s = blind_s
    return pol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=ROWS)
    ap.add_argument("--oracles", default=ORACLES, help="blind oracles T:H (blind until T s, headroom H)")
    ap.add_argument("--policies", default="predictive,reactive,static-peak")
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--warmup-s", type=float, default=600.0)
    args = ap.parse_args()
    try:
        oracles = parse_oracles(args.oracles)
        rows = [(wl, row_workload(wl)) for wl in args.workloads.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    print(f"| workload | policy | SLO attained | SLO after {args.warmup_s:.0f} s | GPU-s | CPU s |")
    print("|---|---|---|---|---|---|")
    for wl, (trace, fleet) in rows:
        runs: list[tuple[str, ReplayPolicy]] = [
            (f"oracle blind {t:g} s, h {h:g}", blind_oracle(t, h)) for t, h in oracles
        ]
        runs += [(p, make(p, args.forecaster, {})) for p in filter(None, args.policies.split(","))]
        for label, policy in runs:
            t0 = time.process_time()
            rep = run(wl, trace, fleet, policy)
            after = format_after(attainment_after(rep, fleet, args.warmup_s), args.warmup_s)
            print(
                f"| {wl} | {label} | {rep.slo_attainment:.2%} | {after} | {rep.gpu_seconds:,.0f} |"
                f" {time.process_time() - t0:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
