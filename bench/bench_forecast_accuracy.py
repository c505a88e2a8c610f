"""Forecast accuracy of every baseline (and the shipped learned model, when present) on the Azure traces.

Run: ``.venv/bin/python bench/bench_forecast_accuracy.py [--json out/bench_forecast_accuracy.json]``

Protocol: ``training.evaluate.evaluate`` on each bundled Azure 2023 trace (code = bursty on/off, conv =
smooth), one node, next-5-s arrivals, time split: the first 70 % is history, the last 30 % is scored. The
learned model's row appears automatically once ``forecaster/checkpoints/`` holds the shipped checkpoint.
Prints a Markdown section for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forecaster.features import future_sums, series_from_trace  # noqa: E402
from forecaster.scoring import poisson_noise_floor  # noqa: E402
from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from training.evaluate import EvaluationResult, default_checkpoint, evaluate  # noqa: E402

TRACES = {
    "code": "AzureLLMInferenceTrace_code.dev_before_1850.csv",
    "conv": "AzureLLMInferenceTrace_conv.dev_before_1850.csv",
}
SEARCH = (ROOT / "datasets" / "azure2023", ROOT.parent / "shared" / "datasets" / "azure2023")


def find_trace(name: str) -> Path:
    for d in SEARCH:
        if (d / name).exists():
            return d / name
    raise SystemExit(f"{name} not found in {', '.join(str(d) for d in SEARCH)}")


def fmt(v: float, nd: int = 2) -> str:
    return "—" if v is None or math.isnan(v) else f"{v:.{nd}f}"


SMOOTHINGS_S = (5, 11, 31, 61)


def floor_sensitivity(trace: Trace, r: EvaluationResult) -> dict[int, float]:
    """The noise floor with other oracle smoothing widths (the reported one uses 31 s)."""
    counts = series_from_trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens).arrivals
    first = max(math.ceil(r.score_from_s) - 1, 0)
    mask = (counts >= 0) & (future_sums(counts, r.horizon_s) >= 0)
    mask[:first] = False
    return {w: poisson_noise_floor(counts, int(r.horizon_s), mask, smooth_s=w) for w in SMOOTHINGS_S}


def markdown(results: dict[str, tuple[EvaluationResult, float]], floors: dict[str, dict[int, float]]) -> str:
    lines = [
        "| trace | model | MAE | RMSE | pinball p90 | coverage p90 | MAE / noise floor "
        "| prompt-token MAE (cov. p90) | gen-token MAE (cov. p90) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, (r, _) in results.items():
        for name, s in r.models.items():
            ratio = s.mae / r.noise_floor_mae if r.noise_floor_mae > 0 else float("nan")
            lines.append(
                f"| {key} | {name} | {fmt(s.mae)} | {fmt(s.rmse)} | {fmt(s.pinball_p90)} | "
                f"{fmt(s.coverage_p90, 3)} | {fmt(ratio)} | "
                + " | ".join(
                    f"{fmt(r.token_models[name][t].mae, 0)} ({fmt(r.token_models[name][t].coverage_p90)})"
                    for t in ("prompt_tokens", "gen_tokens")
                )
                + " |"
            )
        lines.append(f"| {key} | *Poisson noise floor* | {fmt(r.noise_floor_mae)} | | | | 1.00 | | |")
    lines += [
        "",
        "| trace | " + " | ".join(f"floor, {w} s smoothing" for w in SMOOTHINGS_S) + " |",
        "|---|" + "---|" * len(SMOOTHINGS_S),
    ]
    for key, fl in floors.items():
        lines.append(f"| {key} | " + " | ".join(fmt(fl[w]) for w in SMOOTHINGS_S) + " |")
    lines += [
        "",
        "| trace | scored s | burst model | alarm threshold | onsets | alarms | recall | precision | mean lead s | "
        "evaluate wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, (r, wall) in results.items():
        b = r.burst
        lines.append(
            f"| {key} | {r.scored_points} | {r.burst_model} | {r.burst_threshold:g} | {b.onsets} | {b.alarms} | "
            f"{fmt(b.recall)} | {fmt(b.precision)} | {fmt(b.mean_lead_s, 1)} | {wall:.1f} |"
        )
    lines += [
        "",
        "Every model's own burst alarms (threshold tuned on the history):",
        "",
        "| trace | model | alarm threshold | alarms | recall | precision | mean lead s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, (r, _) in results.items():
        for name, (thr, b) in r.burst_by_model.items():
            lines.append(
                f"| {key} | {name} | {thr:g} | {b.alarms} | {fmt(b.recall)} | {fmt(b.precision)} | "
                f"{fmt(b.mean_lead_s, 1)} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write every figure as JSON here")
    ap.add_argument("--score-from", default="70%", help="as in `train-forecaster evaluate` (default 70%%)")
    args = ap.parse_args()
    results: dict[str, tuple[EvaluationResult, float]] = {}
    floors: dict[str, dict[int, float]] = {}
    for key, name in TRACES.items():
        trace = read_trace(find_trace(name))
        t0 = time.perf_counter()
        r = evaluate(trace, score_from=args.score_from)
        results[key] = (r, time.perf_counter() - t0)
        floors[key] = floor_sensitivity(trace, r)
    ckpt = default_checkpoint()
    print(f"learned model: {ckpt if ckpt else 'no shipped checkpoint found (baselines only)'}\n")
    print(markdown(results, floors))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            k: {**r.as_json(), "wall_s": w, "noise_floor_by_smoothing_s": floors[k]}
            for k, (r, w) in results.items()
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
