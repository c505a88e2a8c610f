"""Hardware slower (or faster) than its profile: the predictive policy with and without the latency correction.

Every capacity the controller sizes with comes from the pool's hardware profile. Here the simulated fleet's
engines run ``k`` times as long per iteration as that profile says (``serving.sim.latency.ScaledLatencyModel``,
prefill and decode alike, the KV transfer not), while the controller is configured with the profile as it is.
Per workload and factor, side by side in one run:

* ``off``, ``slower``, ``both``: predictive (``--params`` on top) with ``latency_correction`` off, correcting slower
  engines only (the default), and correcting faster ones too (``controller.latency_correction``);
* ``known``: predictive with its capacities computed with the true factor from the first tick (the ceiling of any
  online estimate: nothing can time a token before the first one is served);
* ``reactive``: the HPA-like baseline on the same slow fleet (it sizes on measured utilisation and queues).

Columns: SLO attainment over every request and over those after ``--warmup-s``, GPU-seconds, each row's GPU-s
over the ``known`` row's, and the correction's final estimate and applied factor (measured / modelled ITL).

Run: ``.venv/bin/python bench/bench_latency_correction.py [--workloads code,conv,mmpp] [--factors 0.7,1,1.3,1.5,2]
[--params k=v,...] [--json OUT]`` (deterministic figures; ~2 s a replay).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policies import _parse_params, make, row_trace, scored

import controller.pipeline as pipeline_module
from controller.latency_correction import LatencyCorrection
from serving.sim.engine import ModelResolver
from serving.sim.fleet import PoolSpec
from serving.sim.hardware import get_profile
from serving.sim.latency import ScaledLatencyModel, get_latency_model
from serving.sim.replay import replay

ROWS = ("off", "slower", "both", "known", "reactive")


def slow_models(k: float) -> ModelResolver:
    """The simulator's models: each profile's latency ``k`` times as long per iteration."""

    def resolve(name: str) -> tuple[Any, Any]:
        model = get_latency_model(name)
        return get_profile(name), (model if k == 1.0 else ScaledLatencyModel(model, k))

    return resolve


class _Known(LatencyCorrection):
    """The correction as if the true factor were known from the first tick (the ``known`` row)."""

    true_factor: float = 1.0

    @property
    def factor(self) -> float:
        return self.true_factor if self.enabled else 1.0


def run_row(
    row: str, workload: str, k: float, params: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    trace, fleet = row_trace(workload, args)
    pool = fleet.pools[0]
    fleet = replace(fleet, pools=(pool,))
    if row == "reactive":
        policy = make("reactive", args.forecaster, {})
    else:
        policy = make(
            "predictive", args.forecaster, {**params, "latency_correction": "both" if row == "known" else row}
        )
    original = getattr(pipeline_module, "latency_correction")  # noqa: B009  (swapped for the known row)
    if row == "known":

        def known(spec: PoolSpec, mode: str) -> LatencyCorrection:
            corr = _Known(spec, min_factor=0.5)
            corr.true_factor = k
            return corr

        setattr(pipeline_module, "latency_correction", known)  # noqa: B010
    try:
        rep = replay(fleet, {pool.name: trace}, policy, models=slow_models(k))
    finally:
        setattr(pipeline_module, "latency_correction", original)  # noqa: B010
    out: dict[str, Any] = {
        "workload": workload,
        "factor": k,
        "row": row,
        "slo": rep.slo_attainment,
        "slo_after": scored(rep, fleet, args.warmup_s),
        "gpu_s": rep.gpu_seconds,
        "estimate": math.nan,
        "applied": math.nan,
    }
    pipe = getattr(policy, "pipeline", None)
    track = pipe.tracks.get(pool.name) if pipe is not None else None
    if track is not None and track.latency is not None:
        out["estimate"], out["applied"] = track.latency.estimate, track.latency.factor
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="code,conv,mmpp", help="bench_policies.py workload names")
    ap.add_argument("--factors", default="0.7,1,1.3,1.5,2", help="the simulated engines' slowdowns k")
    ap.add_argument("--params", default="", help="PolicyConfig overrides for every predictive row (k=v,...)")
    ap.add_argument("--forecaster", default="default", help="as bench_policies.py (default: the shipped one)")
    ap.add_argument("--warmup-s", type=float, default=600.0, help="'SLO after' counts requests after this")
    ap.add_argument("--duration-s", type=float, default=None, help="replay only the first seconds")
    ap.add_argument("--sine-period-s", type=float, default=600.0)
    ap.add_argument("--ramp-s", type=float, default=1200.0)
    ap.add_argument("--json", type=Path, default=None, help="also write every row as JSON here")
    args = ap.parse_args(argv)
    params = _parse_params(args.params)
    factors = [float(x) for x in args.factors.split(",") if x]
    print("| workload | k | row | SLO | SLO after | GPU-s | / known | estimate | applied |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    for workload in filter(None, args.workloads.split(",")):
        for k in factors:
            got = {row: run_row(row, workload, k, params, args) for row in ROWS}
            known = got["known"]["gpu_s"]
            for row in ROWS:
                r = got[row]
                rows.append(r)
                est = "-" if math.isnan(r["estimate"]) else f"{r['estimate']:.3f}"
                app = "-" if math.isnan(r["applied"]) else f"{r['applied']:.3f}"
                print(
                    f"| {workload} | {k:g} | {row} | {100 * r['slo']:.2f}% | {100 * r['slo_after']:.2f}% |"
                    f" {r['gpu_s']:,.0f} | {r['gpu_s'] / known:.2f} | {est} | {app} |",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1, allow_nan=True))


if __name__ == "__main__":
    main()
