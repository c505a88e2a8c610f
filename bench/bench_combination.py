"""Choosing the online combination's settings (forecaster/combination.py) on traffic no other bench scores.

Run: ``.venv/bin/python bench/bench_combination.py [--checkpoints NAME=PATH ...] [--json OUT]``

The tuning set is synthetic (``serving.workload.synthetic.generate``, seeds 900+, used by no other bench and
by no training run): bursty MMPP at 0.3, 3 and 20 req/s, a Poisson sinusoid (900-s period), a flat Poisson
stream at 10 req/s and one at 80 req/s, with prompts from ~500 to ~4,000 tokens. Each is scored from a third
of its span as ``train-forecaster evaluate --score-from +S`` does. The rows of bench_forecast_rates.py and
bench_forecast_accuracy.py are *not* used here, so that they stay a test of the chosen settings.

For every checkpoint (default: the shipped one and ``candidate_v2``), the network's forecasts are computed
once per trace (full-sequence forward) and each setting in the grid combines them
(``CombinedForecaster.combine_sequence``, equal to stepping). Printed per setting: the geometric mean and
the worst, over traces, of next-5-s arrivals MAE / the best baseline's (last value, EWMA, Holt, seasonal
naive; no ARIMA), the same for prompt-token MAE and for arrivals pinball loss at 0.9, and the mean |p90
coverage - 0.9| — beside the raw network's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forecaster.baselines import make_baselines  # noqa: E402
from forecaster.combination import CombinationConfig, CombinedForecaster  # noqa: E402
from forecaster.features import future_sums, series_from_trace, trace_inputs  # noqa: E402
from forecaster.scoring import score_forecasts  # noqa: E402
from serving.workload.synthetic import LengthDist, SyntheticParams, generate  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402

CHECKPOINTS = {
    "shipped": ROOT / "forecaster" / "checkpoints" / "default.safetensors",
    "v2": ROOT / "forecaster" / "checkpoints" / "candidate_v2.safetensors",
}


def tuning_traces() -> dict[str, Trace]:
    def p(median: float) -> LengthDist:
        return LengthDist(median_tokens=median, sigma=0.8)

    specs = {
        "mmpp 0.3 req/s": SyntheticParams(2400.0, 0.3, 4.0, 150.0, 30.0, prompt=p(800)),
        "mmpp 3 req/s": SyntheticParams(2400.0, 3.0, 6.0, 120.0, 20.0, 1.5, prompt=p(1000)),
        "mmpp 20 req/s long prompts": SyntheticParams(2400.0, 20.0, 3.0, 200.0, 40.0, prompt=p(4000)),
        "sinusoid 8 req/s, 900 s": SyntheticParams(
            2700.0, 8.0, 1.0, diurnal_amplitude=0.8, diurnal_period_s=900.0, prompt=p(2000)
        ),
        "poisson 10 req/s": SyntheticParams(1800.0, 10.0, 1.0, prompt=p(500)),
        "poisson 80 req/s": SyntheticParams(1200.0, 80.0, 1.0, prompt=p(1500)),
    }
    return {name: generate(params, seed=900 + i) for i, (name, params) in enumerate(specs.items())}


def grid() -> list[CombinationConfig]:
    out = [CombinationConfig()]
    for hl, eta in itertools.product((30.0, 120.0, 600.0), (3.0, 10.0, 30.0)):
        out.append(CombinationConfig(halflife_s=hl, eta=eta))
    for hl in (30.0, 120.0, 600.0):
        out.append(CombinationConfig(halflife_s=hl, rule="best"))
    return list(dict.fromkeys(out))  # the default is also in the grid: once


def label(c: CombinationConfig) -> str:
    return f"{c.rule} hl={c.halflife_s:g}" + (f" eta={c.eta:g}" if c.rule == "exp" else "")


def _geo(v: list[float]) -> float:
    ok = [x for x in v if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in ok) / len(ok)) if ok else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", nargs="*", default=[], help="NAME=PATH (default: shipped and v2)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    from forecaster.streaming import LearnedForecaster

    torch.set_num_threads(1)
    ckpts = dict(CHECKPOINTS)
    if args.checkpoints:
        ckpts = {s.partition("=")[0]: Path(s.partition("=")[2]) for s in args.checkpoints}
    configs = grid()
    results: dict[str, Any] = {}
    traces = tuning_traces()
    for tname, trace in traces.items():
        t0 = time.perf_counter()
        n = math.floor(trace.duration_s) + 1
        ser = series_from_trace(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, 1.0, duration_s=float(n)
        )
        series = {"arrivals": ser.arrivals, "prompt_tokens": ser.prompt_tokens}
        first = int(trace.duration_s // 3)
        scored = np.arange(n) >= first
        targets = {k: np.where(scored, future_sums(v, 5.0), np.nan) for k, v in series.items()}
        best: dict[str, float] = {}
        for k, v in series.items():
            scores = [
                score_forecasts(targets[k], *m.predict_series(v)[:2])
                for m in make_baselines(5.0, with_arima=False)
            ]
            best[k] = min(s.mae for s in scores)
            if k == "arrivals":
                best["pinball"] = min(s.pinball_p90 for s in scores)
        row: dict[str, Any] = {"best": best}
        for cname, path in ckpts.items():
            lf = LearnedForecaster.load(path)
            x, mask = trace_inputs(ser, lf.schema)
            times = 1.0 + np.arange(n, dtype=np.float64)
            raw = lf.predict_sequence(x[None], mask[None], times)
            variants = {"raw": raw}
            for c in configs:
                variants[label(c)] = CombinedForecaster(lf, c).combine_sequence(x[None], mask[None], raw)
            for vname, sf in variants.items():
                a = score_forecasts(
                    targets["arrivals"], sf.get("arrivals", 0.5)[0], sf.get("arrivals", 0.9)[0]
                )
                pr = score_forecasts(
                    targets["prompt_tokens"], sf.get("prompt_tokens", 0.5)[0], sf.get("prompt_tokens", 0.9)[0]
                )
                row[f"{cname} {vname}"] = {
                    "arrivals": a.mae / best["arrivals"],
                    "prompt": pr.mae / best["prompt_tokens"],
                    "pinball": a.pinball_p90 / best["pinball"],
                    "coverage": a.coverage_p90,
                }
        results[tname] = row
        print(f"{tname}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    names = [k for k in next(iter(results.values())) if k != "best"]
    print(
        "| model | arrivals MAE / best: geo | worst | prompt MAE / best: geo | worst | pinball p90 / best: geo | worst | mean abs(cov - 0.9) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for name in names:
        vals = {
            m: [results[t][name][m] for t in results] for m in ("arrivals", "prompt", "pinball", "coverage")
        }
        summary[name] = {
            **{f"geo_{m}": _geo(vals[m]) for m in ("arrivals", "prompt", "pinball")},
            **{f"worst_{m}": max(vals[m]) for m in ("arrivals", "prompt", "pinball")},
            "coverage_dev": float(np.mean(np.abs(np.asarray(vals["coverage"]) - 0.9))),
        }
        s = summary[name]
        print(
            f"| {name} | {s['geo_arrivals']:.3f} | {s['worst_arrivals']:.3f} | {s['geo_prompt']:.3f} | "
            f"{s['worst_prompt']:.3f} | {s['geo_pinball']:.3f} | {s['worst_pinball']:.3f} | {s['coverage_dev']:.3f} |"
        )
    print("\nper trace, arrivals MAE / best baseline:")
    for t, row in results.items():
        print(
            f"  {t}: "
            + ", ".join(
                f"{k}={v['arrivals']:.3f}"
                for k, v in row.items()
                if k != "best" and (k.endswith("raw") or "hl=120 eta=10" in k)
            )
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"traces": results, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
