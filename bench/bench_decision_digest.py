"""A digest of every decision the predictive policy makes on named workloads, to show that a change to the
policy's code (a faster stage, a refactor) moves no decision.

Run on two trees and compare the digests: ``PYTHONPATH=TREE .venv/bin/python bench/bench_decision_digest.py
[--workloads code,conv,mooncake] [--forecaster default|holt]``. Each line: workload, decisions, SHA-256 of
every tick's ``(now_s, ScalingPlan)`` repr (replica and standby counts, buffer, degrade and every reason string,
whose numbers are printed to two decimals or more), then the report's SLO attainment and GPU-seconds. The
workloads are bench/bench_policies.py's (same traces, SLOs and seeds); the replay is deterministic, so equal
trees give equal digests; ``--dump DIR`` writes every decision, one per line, for a ``diff`` of the two trees.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policies import make, run, workload

from controller.replay_policies import PredictivePolicy


def digest(name: str, forecaster: str, dump: Path | None) -> str:
    trace, fleet = workload(name, None, 600.0)
    policy = make("predictive", forecaster, {})
    rep = run(name, trace, fleet, policy)
    assert isinstance(policy, PredictivePolicy)
    decisions = policy.decisions
    h = hashlib.sha256()
    lines = []
    for now_s, plan in decisions:
        line = repr((now_s, plan))
        h.update(line.encode())
        h.update(b"\n")
        if dump is not None:
            lines.append(line)
    if dump is not None:
        (dump / f"{name}-{forecaster}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return (
        f"{name} {forecaster}: {len(decisions)} decisions, sha256 {h.hexdigest()[:16]}, "
        f"SLO {rep.slo_attainment:.6f}, GPU-s {rep.gpu_seconds:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="code,conv,mooncake")
    ap.add_argument("--forecaster", choices=("default", "holt"), default="default")
    ap.add_argument("--dump", type=Path, default=None, help="also write every decision, one per line, here")
    args = ap.parse_args()
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
    for name in args.workloads.split(","):
        print(digest(name, args.forecaster, args.dump), flush=True)


if __name__ == "__main__":
    main()
