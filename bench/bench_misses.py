"""Where a policy's SLO misses and GPU-seconds sit over time, bin by bin, against the oracle's need.

For one workload of ``bench/bench_policies.py`` (the same traces, fleets and policies), each policy is replayed
and, per bin of ``--bin-s`` seconds of arrival time: the requests arriving, those missing the TTFT SLO and those
missing the ITL SLO (a request can miss both), the mean active prefill / decode instances, the GPU-seconds
held, and the instances the oracle's capacity model says that bin's true load needs (mean of its per-second
prefill / decode need, no headroom). A ``--lead-s`` column says what the need is one cold start later (what
had to be ordered in this bin). What a bin's requests queue behind: ``waiting`` is the requests that have arrived
and have no first token yet at the bin's start (a prefill backlog left by earlier bins; never-served ones
count), ``TTFT p50 / max`` that of the bin's requests. The figures are deterministic; nothing is fitted.

Run: .venv/bin/python bench/bench_misses.py --workload sine --sine-period-s 600 --policies predictive,oracle
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_policies import _parse_params, make, row_trace, run
from controller.replay_policies import oracle_needs
from serving.sim.fleet import FleetSpec
from serving.sim.hardware import get_profile
from serving.sim.report import ReplayReport
from serving.workload.trace import Trace


def bins(rep: ReplayReport, trace: Trace, fleet: FleetSpec, bin_s: float) -> list[dict[str, float]]:
    """One row per bin of arrival time (see the module docstring)."""
    pool = fleet.pools[0]
    gpus = get_profile(pool.profile).gpus
    lead = get_profile(pool.profile).cold_start_s
    arrival = np.asarray(rep.arrival_s)
    ttft_ms = np.asarray(rep.request_ttft_ms)
    ttft_miss = ttft_ms > pool.slo_ttft_ms  # NaN (never served) compares False
    itl_miss = np.asarray(rep.request_itl_ms) > pool.slo_itl_ms
    unserved = ~np.isfinite(ttft_ms)
    first_token_s = np.where(unserved, np.inf, arrival + np.nan_to_num(ttft_ms) / 1000.0)
    need_p, need_d = oracle_needs(pool, trace, 5.0)
    assert rep.timeline is not None
    t, tl = rep.timeline.t_s, rep.timeline
    dt = np.diff(t, append=t[-1])
    end = float(arrival.max()) if len(arrival) else 0.0
    rows: list[dict[str, float]] = []
    for lo in np.arange(0.0, end + 1e-9, bin_s):
        hi = lo + bin_s
        req = (arrival >= lo) & (arrival < hi)
        tick = (t >= lo) & (t < hi)
        sec = slice(int(lo), int(hi))
        ahead = slice(int(lo + lead), int(hi + lead))
        ttft_bin = ttft_ms[req & ~unserved]
        rows.append(
            {
                "t": float(lo),
                "requests": float(req.sum()),
                "waiting": float(((arrival < lo) & (first_token_s > lo)).sum()),
                "ttft_p50_s": float(np.median(ttft_bin)) / 1000.0 if len(ttft_bin) else np.nan,
                "ttft_max_s": float(ttft_bin.max()) / 1000.0 if len(ttft_bin) else np.nan,
                "ttft_miss": float((ttft_miss | unserved)[req].sum()),
                "itl_miss": float(itl_miss[req].sum()),
                "missed": float((ttft_miss | itl_miss | unserved)[req].sum()),
                "prefill": float(tl.active["prefill"][tick].mean()) if tick.any() else np.nan,
                "decode": float(tl.active["decode"][tick].mean()) if tick.any() else np.nan,
                "gpu_s": float((tl.holding_gpu * dt)[tick].sum() * gpus),
                "need_p": float(need_p[sec].mean()) if len(need_p[sec]) else np.nan,
                "need_d": float(need_d[sec].mean()) if len(need_d[sec]) else np.nan,
                "ahead_p": float(need_p[ahead].mean()) if len(need_p[ahead]) else np.nan,
                "ahead_d": float(need_d[ahead].mean()) if len(need_d[ahead]) else np.nan,
            }
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="sine")
    ap.add_argument("--policies", default="predictive,oracle")
    ap.add_argument("--sine-period-s", type=float, default=600.0)
    ap.add_argument("--ramp-s", type=float, default=1200.0)
    ap.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="only the first DURATION_S s of the trace bench_policies.py replays for the workload",
    )
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--params", default="", help="PolicyConfig overrides for predictive: k=v,k=v")
    ap.add_argument("--bin-s", type=float, default=30.0)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    trace, fleet = row_trace(args.workload, args)
    params = _parse_params(args.params)
    for name in filter(None, args.policies.split(",")):
        rep = run(name, trace, fleet, make(name, args.forecaster, params))
        rows = bins(rep, trace, fleet, args.bin_s)
        print(f"\n{args.workload} {name}: SLO {rep.slo_attainment:.2%}, GPU-s {rep.gpu_seconds:,.0f}")
        print(
            "| t s | req | missed | TTFT miss | ITL miss | waiting | TTFT p50 / max s | active P | active D |"
            " GPU-s | need P | need D | need P +lead | need D +lead |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['t']:.0f} | {r['requests']:.0f} | {r['missed']:.0f} | {r['ttft_miss']:.0f} |"
                f" {r['itl_miss']:.0f} | {r['waiting']:.0f} | {r['ttft_p50_s']:.1f} / {r['ttft_max_s']:.1f} |"
                f" {r['prefill']:.1f} | {r['decode']:.1f} | {r['gpu_s']:,.0f} |"
                f" {r['need_p']:.1f} | {r['need_d']:.1f} | {r['ahead_p']:.1f} | {r['ahead_d']:.1f} |"
            )


if __name__ == "__main__":
    main()
