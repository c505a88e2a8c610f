"""A/B: the predictive policy with and without the onset detector (forecaster.burst.OnsetBoostedForecaster)
wrapped around its forecaster, learned and Holt, on bench_policies.py workloads (default: code, mmpp).

Run: .venv/bin/python bench/bench_onset_policy.py [code,mmpp]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_policies import run, workload

from controller.config import PolicyConfig
from controller.forecasting import with_onset_detector
from controller.replay_policies import PredictivePolicy, default_forecaster
from forecaster.baselines import Holt

rows = []
print("| workload | forecaster | onset detector | SLO attained | GPU-s | scale events |")
print("|---|---|---|---|---|---|")
for wl in (sys.argv[1] if len(sys.argv) > 1 else "code,mmpp").split(","):
    trace, fleet = workload(wl, None, 600.0)
    for fc in ("default", "holt"):
        base = (lambda: Holt()) if fc == "holt" else default_forecaster
        for onset in (False, True):
            make = (lambda b=base: with_onset_detector(b())) if onset else base
            t0 = time.time()
            rep = run("predictive", trace, fleet, PredictivePolicy(PolicyConfig(), forecaster=make))
            rows.append(
                (wl, fc, onset, rep.slo_attainment, rep.gpu_seconds, rep.scale_events, time.time() - t0)
            )
            print(
                f"| {wl} | {fc} | {'on' if onset else 'off'} | {rep.slo_attainment:.2%} | {rep.gpu_seconds:,.0f} | {rep.scale_events} |",
                flush=True,
            )
