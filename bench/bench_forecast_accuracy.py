"""Forecast accuracy of every baseline (and the shipped learned model, when present) on the Azure traces.

Run: ``.venv/bin/python bench/bench_forecast_accuracy.py [--json out/bench_forecast_accuracy.json]``

Protocol: ``training.evaluate.evaluate`` on each bundled Azure 2023 trace (code = bursty on/off, conv =
smooth), one node, next-5-s arrivals, time split: the first 70 % is history, the last 30 % is scored. The
learned model's row appears automatically once ``forecaster/checkpoints/`` holds the shipped checkpoint.
Prints a Markdown section for docs/BENCHMARKS.md.

``--detector-speed``: the streaming onset detector's cost per tick for 1,000 and 10,000 nodes.

``--candidates NAME=PATH ... [--mmpp]``: candidate checkpoints beside the shipped one on the hold-outs
(arrivals MAE against the best baseline and the noise floor, coverage, burst scores), each as the network
alone (NAME) and inside the online forecast combination (NAME+comb; forecaster/combination.py).

``--blend``: MAE of fixed blends of the learned p50 with a baseline's (Azure traces; a negative result).

``--bursts``: burst-onset scores only (no ARIMA), on the Azure hold-outs AND traces the project never tuned
on: the Mooncake trace and synthetic MMPP traces with other burst lengths and rates. For the learned model,
the training-free onset detector (``forecaster.burst.onset_scores``) and their max: recall within 3 s,
precision, mean lead, with the alarm threshold tuned on the history (the ``evaluate`` protocol); the
detector also at the controller's fixed threshold 0.5 within 3 s and 5 s; and the share of onsets no
reactive detector can catch within 3 s (``silent_onsets``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forecaster.burst import (  # noqa: E402
    OnsetDetector,
    OnsetDetectorConfig,
    alarm_times,
    burst_onsets,
    onset_scores,
    score_bursts,
    silent_onsets,
)
from forecaster.features import future_sums, series_from_trace  # noqa: E402
from forecaster.scoring import poisson_noise_floor  # noqa: E402
from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.synthetic import SyntheticParams, _burst_factor, generate  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from training.evaluate import (  # noqa: E402
    COMBINED,
    LEARNED,
    EvaluationResult,
    default_checkpoint,
    evaluate,
    parse_score_from,
)

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


#: Synthetic MMPP traces never used to tune anything: (rate_rps, burst_multiplier, calm_mean_s, burst_mean_s,
#: interarrival_cv), 2 hours each, fixed seeds.
MMPP = {
    "mmpp x3 30s": (5.0, 3.0, 120.0, 30.0, 1.0),
    "mmpp x4 15s": (5.0, 4.0, 120.0, 15.0, 1.0),
    "mmpp x8 5s": (3.0, 8.0, 90.0, 5.0, 1.0),
    "mmpp x6 60s cv2": (10.0, 6.0, 300.0, 60.0, 2.0),
}


def burst_traces() -> tuple[dict[str, Trace], dict[str, np.ndarray]]:
    """The traces, and for each MMPP trace the times (s) at which its hidden state switched to "burst"."""
    out = {key: read_trace(find_trace(name)) for key, name in TRACES.items()}
    out["mooncake"] = read_trace(ROOT / "datasets" / "mooncake" / "synthetic_trace.jsonl")
    starts: dict[str, np.ndarray] = {}
    for i, (key, (rate, mult, calm, burst, cv)) in enumerate(MMPP.items()):
        params = SyntheticParams(
            duration_s=7200.0,
            rate_rps=rate,
            burst_multiplier=mult,
            calm_mean_s=calm,
            burst_mean_s=burst,
            interarrival_cv=cv,
        )
        out[key] = generate(params, seed=100 + i)
        # generate() draws the Markov states first from default_rng(seed): replay that draw (bench only)
        grid = np.arange(0.0, params.duration_s + params.grid_s, params.grid_s)
        factor = _burst_factor(params, np.random.default_rng(100 + i), grid)
        starts[key] = grid[1:][np.diff(factor) > 0] - float(out[key].arrival_s[0])
    return out, starts


def info_ceiling(onsets: np.ndarray, burst_starts_s: np.ndarray, max_lag_s: int = 3) -> float:
    """MMPP: share of onsets whose burst has begun by the end of second ``o + max_lag_s``.

    The switch to the burst state is memoryless (nothing before it predicts it), so a causal detector can
    alarm on an onset within ``max_lag_s`` only if the burst started by then: an upper bound on recall.
    """
    if len(onsets) == 0:
        return float("nan")
    j = np.searchsorted(burst_starts_s, onsets - 10.0)  # the first switch after the alarm window opens
    tau = burst_starts_s[np.minimum(j, len(burst_starts_s) - 1)]
    return float(np.mean((j < len(burst_starts_s)) & (np.floor(tau) <= onsets + max_lag_s)))


def burst_rows(
    key: str, trace: Trace, r: EvaluationResult, wall_s: float, burst_starts_s: np.ndarray | None
) -> tuple[list[str], dict[str, float]]:
    """Markdown rows for one trace, and the pooled counts (onsets, detected, alarms, matched) per entry."""
    n_steps = math.floor(trace.duration_s) + 1
    counts = series_from_trace(
        trace.arrival_s, trace.prompt_tokens, trace.output_tokens, 1.0, duration_s=float(n_steps)
    ).arrivals
    first = max(math.ceil(r.score_from_s) - 1, 0)
    onsets = burst_onsets(counts, int(r.horizon_s))
    onsets = onsets[onsets >= first]
    silent = silent_onsets(counts, onsets, 3)
    if burst_starts_s is not None:
        ceiling = info_ceiling(onsets, burst_starts_s)
    else:
        ceiling = 1.0 - float(silent.mean()) if len(onsets) else float("nan")
    alarms = alarm_times(onset_scores(counts), 0.5)
    alarms = alarms[alarms >= first]
    fixed = {lag: score_bursts(onsets, alarms, r.max_lead_s, lag) for lag in (3, 5)}
    rows, pooled = [], {}
    for name in (r.burst_model, "onset", f"{r.burst_model}+onset"):
        thr, b = r.burst_by_model[name] if name in r.burst_by_model else r.burst_detectors[name]
        rows.append(
            f"| {key} | {b.onsets} | {fmt(ceiling)} | {name} | {thr:g} | {b.alarms} | {fmt(b.recall)} | "
            f"{fmt(b.precision)} | {fmt(b.mean_lead_s, 1)} | | |"
        )
        pooled[f"{name.replace(r.burst_model, 'model')}:detected"] = b.recall * b.onsets if b.onsets else 0.0
        pooled[f"{name.replace(r.burst_model, 'model')}:alarms"] = float(b.alarms)
        pooled[f"{name.replace(r.burst_model, 'model')}:matched"] = (
            b.precision * b.alarms if b.alarms else 0.0
        )
    f3, f5 = fixed[3], fixed[5]
    rows.append(
        f"| {key} | {f3.onsets} | {fmt(ceiling)} | onset @ 0.5 (fixed) | 0.5 | {f3.alarms} | {fmt(f3.recall)} | "
        f"{fmt(f3.precision)} | {fmt(f3.mean_lead_s, 1)} | {fmt(f5.recall)} / {fmt(f5.precision)} | {wall_s:.0f} |"
    )
    for lag, sc in fixed.items():
        pooled[f"fixed{lag}:detected"] = sc.recall * sc.onsets if sc.onsets else 0.0
        pooled[f"fixed{lag}:alarms"] = float(sc.alarms)
        pooled[f"fixed{lag}:matched"] = sc.precision * sc.alarms if sc.alarms else 0.0
    pooled["onsets"] = float(len(onsets))
    pooled["silent"] = float(silent.sum())
    pooled["ceiling_detected"] = ceiling * len(onsets) if len(onsets) else 0.0
    return rows, pooled


def sensitivity(traces: dict[str, Trace], score_from: str) -> list[str]:
    """The detector alone at the fixed threshold 0.5 under other settings, pooled over every trace's scored part."""
    data = []
    for trace in traces.values():
        n_steps = math.floor(trace.duration_s) + 1
        counts = series_from_trace(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, 1.0, duration_s=float(n_steps)
        ).arrivals
        first = max(math.ceil(parse_score_from(score_from, trace)) - 1, 0)
        onsets = burst_onsets(counts)
        data.append((counts, onsets[onsets >= first], first))
    lines = [
        "Detector settings at the fixed threshold 0.5, pooled over the same scored parts "
        "(recall / precision; defaults in bold):",
        "",
        "| evidence_s | decades | hold_s | alarms | within 3 s | within 5 s |",
        "|---|---|---|---|---|---|",
    ]
    default = OnsetDetectorConfig()
    for ev, dec, hold in (
        (1, 6.0, 30),
        (2, 6.0, 30),
        (3, 6.0, 30),
        (5, 6.0, 30),
        (3, 4.0, 30),
        (3, 8.0, 30),
        (3, 6.0, 10),
    ):
        cfg = OnsetDetectorConfig(evidence_s=ev, decades=dec, hold_s=hold)
        tot = {"n": 0.0, "al": 0.0, "d3": 0.0, "m3": 0.0, "d5": 0.0, "m5": 0.0}
        for counts, onsets, first in data:
            alarms = alarm_times(onset_scores(counts, cfg), 0.5)
            alarms = alarms[alarms >= first]
            tot["n"] += len(onsets)
            tot["al"] += len(alarms)
            for lag in (3, 5):
                sc = score_bursts(onsets, alarms, 10.0, lag)
                tot[f"d{lag}"] += sc.recall * len(onsets) if len(onsets) else 0.0
                tot[f"m{lag}"] += sc.precision * len(alarms) if len(alarms) else 0.0
        cell = [
            f"{tot[f'd{lag}'] / tot['n']:.2f} / {tot[f'm{lag}'] / max(tot['al'], 1):.2f}" for lag in (3, 5)
        ]
        row = f"| {ev} | {dec:g} | {hold} | {tot['al']:.0f} | {cell[0]} | {cell[1]} |"
        lines.append(row.replace("| 3 | 6 | 30 |", "| **3** | **6** | **30** |") if cfg == default else row)
    return lines


def bursts_main(json_out: Path | None, score_from: str) -> None:
    lines = [
        "| trace | scored onsets | recall ceiling (3 s) | burst score | alarm threshold | alarms | recall (3 s) "
        "| precision | mean lead s | recall / precision within 5 s | evaluate wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    doc: dict[str, object] = {}
    total: dict[str, float] = {}
    traces, starts = burst_traces()
    for key, trace in traces.items():
        t0 = time.perf_counter()
        r = evaluate(trace, score_from=score_from, with_arima=False)
        wall = time.perf_counter() - t0
        rows, pooled = burst_rows(key, trace, r, wall, starts.get(key))
        lines += rows
        for k, v in pooled.items():
            total[k] = total.get(k, 0.0) + v
        doc[key] = {k: r.as_json()[k] for k in ("burst", "burst_by_model", "burst_detectors")} | pooled
    n = total["onsets"]

    def ratio(a: float, b: float) -> str:
        return fmt(a / b) if b else "—"

    lines += [
        "",
        f"Pooled over all traces: {n:.0f} scored onsets, reactive ceiling {ratio(total['ceiling_detected'], n)}.",
        "",
    ]
    lines += ["| burst score | recall (3 s) | precision |", "|---|---|---|"]
    for name in ("model", "onset", "model+onset", "fixed3", "fixed5"):
        lines.append(
            f"| {name} | {ratio(total[name + ':detected'], n)} | "
            f"{ratio(total[name + ':matched'], total[name + ':alarms'])} |"
        )
    lines += ["", *sensitivity(traces, score_from)]
    print(f"learned model: {default_checkpoint() or 'none (the burst model is the best baseline)'}\n")
    print("\n".join(lines))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"traces": doc, "pooled": total}, indent=2) + "\n", encoding="utf-8")


def detector_speed() -> None:
    """Per-tick cost of the streaming detector (``OnsetDetector.update``) for 1,000 and 10,000 nodes."""
    rng = np.random.default_rng(0)
    print("| nodes | arrivals | median ms per tick | p90 ms |\n|---|---|---|---|")
    for n, burst in ((1_000, 1.0), (10_000, 1.0), (1_000, 10.0), (10_000, 10.0)):
        det = OnsetDetector(n_nodes=n)
        rates = rng.uniform(0.5, 20.0, n)
        for _ in range(OnsetDetectorConfig().warmup_s):  # warm up: every node scores from now on
            det.update(rng.poisson(rates).astype(float))
        times = []
        for _ in range(50):
            c = rng.poisson(rates * burst).astype(float)  # x10: every node gated in, scipy tail on all
            t0 = time.perf_counter()
            det.update(c)
            times.append((time.perf_counter() - t0) * 1e3)
        what = "calm Poisson" if burst == 1.0 else "every node jumps x10 (50 ticks)"
        print(f"| {n:,} | {what} | {np.median(times):.2f} | {np.percentile(times, 90):.2f} |")


def blend_main(score_from: str) -> None:
    """MAE of ``w * learned p50 + (1 - w) * baseline p50`` (next-5-s arrivals) on the Azure traces.

    ``hist`` = the history part (NB: the learned model trained on its first 60 %, so it flatters the learned
    side); ``scored`` = the hold-out, as in ``evaluate``.
    """
    import torch

    from forecaster.baselines import make_baselines
    from forecaster.features import trace_inputs
    from forecaster.streaming import LearnedForecaster
    from training.evaluate import _learned_series

    torch.set_num_threads(1)
    ckpt = default_checkpoint()
    if ckpt is None:
        raise SystemExit("--blend needs the shipped checkpoint under forecaster/checkpoints/")
    lf = LearnedForecaster.load(ckpt)
    print("| trace | p50 | MAE history | MAE scored | scored / best baseline |\n|---|---|---|---|---|")
    for key, name in TRACES.items():
        trace = read_trace(find_trace(name))
        n = math.floor(trace.duration_s) + 1
        ser = series_from_trace(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, 1.0, duration_s=float(n)
        )
        y = future_sums(ser.arrivals, 5.0)
        first = max(math.ceil(parse_score_from(score_from, trace)) - 1, 0)
        preds = {m.name: m.predict_series(ser.arrivals)[0] for m in make_baselines(5.0)}
        x, mask = trace_inputs(ser, lf.schema)
        t0 = trace.start_time.timestamp() if trace.start_time is not None else 0.0
        learned = _learned_series(lf, x, mask, t0)[0].quantiles["arrivals"][0]
        idx = np.arange(n)
        parts = {"hist": (idx < first) & ~np.isnan(y), "scored": (idx >= first) & ~np.isnan(y)}

        def mae(p: np.ndarray, part: str, y: np.ndarray = y, parts: dict[str, np.ndarray] = parts) -> float:
            ok = parts[part] & ~np.isnan(p)
            return float(np.mean(np.abs(p[ok] - y[ok])))

        best = min(mae(p, "scored") for p in preds.values())
        rows = {"learned": learned, **{k: preds[k] for k in ("arima", "ewma", "last_value")}}
        for b in ("arima", "ewma", "last_value"):
            for w in (0.3, 0.5, 0.7):
                rows[f"{w:g} learned + {1 - w:g} {b}"] = w * learned + (1 - w) * preds[b]
        for label, p in rows.items():
            print(
                f"| {key} | {label} | {mae(p, 'hist'):.2f} | {mae(p, 'scored'):.2f} | {mae(p, 'scored') / best:.3f} |"
            )


def candidates_main(specs: list[str], json_out: Path | None, score_from: str, with_mmpp: bool) -> None:
    """Score candidate checkpoints side by side with the shipped one and the baselines, on hold-outs only.

    ``specs``: ``NAME=PATH`` (a ``train-forecaster fit`` output). Azure code / conv: the last 30 % (never read
    by ``fit`` at ``--holdout-frac 0.3``), every baseline including ARIMA; MMPP (``--mmpp``): the synthetic
    traces of ``--bursts`` (seeds 100–103, never trained on: ``fit``'s synthetic traces use other seeds), last
    30 %, baselines without ARIMA. Rows: next-5-s arrivals MAE, its ratio to the best baseline on that trace
    and to the Poisson floor, p90 coverage, the model's own burst head and head+detector (recall within 3 s,
    precision, mean lead; thresholds tuned on the history by ``evaluate``). The learned models run their
    full-sequence forward (``evaluate(offline=True)``, equal to stepping: tests/training/test_fit_variants.py).
    """
    import torch

    from forecaster.streaming import LearnedForecaster

    torch.set_num_threads(1)
    models: dict[str, LearnedForecaster] = {}
    ckpt = default_checkpoint()
    if ckpt is not None:
        models["shipped"] = LearnedForecaster.load(ckpt)
    for spec in specs:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--candidates takes NAME=PATH, got {spec!r}")
        models[name] = LearnedForecaster.load(Path(path))
    traces = {key: read_trace(find_trace(name)) for key, name in TRACES.items()}
    if with_mmpp:
        mmpp, _ = burst_traces()
        traces |= {k: v for k, v in mmpp.items() if k.startswith("mmpp")}
    lines = [
        "| trace | model | MAE | / best baseline | / noise floor | coverage p90 | burst recall (3 s) | precision | "
        "mean lead s | +detector recall / precision |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    doc: dict[str, dict[str, dict[str, float]]] = {}
    for key, trace in traces.items():
        t0 = time.perf_counter()
        base = evaluate(trace, score_from=score_from, with_arima=key in TRACES, use_default_checkpoint=False)
        best_name = min(base.models, key=lambda k: base.models[k].mae)
        best = base.models[best_name].mae
        floor = base.noise_floor_mae
        lines.append(
            f"| {key} | {best_name} (best baseline) | {fmt(best)} | 1.000 | {fmt(best / floor)} | "
            f"{fmt(base.models[best_name].coverage_p90, 3)} | | | | |"
        )
        doc[key] = {"_baseline": {"name_" + best_name: best, "noise_floor": floor}}
        for name, lf in models.items():
            r = evaluate(trace, score_from=score_from, with_arima=False, learned=lf, offline=True)
            b = r.burst
            _, comb = r.burst_detectors[f"{r.burst_model}+onset"]
            # the network alone, then its online combination (same burst head: same burst columns)
            for label, model_key in ((name, LEARNED), (f"{name}+comb", COMBINED)):
                s = r.models[model_key]
                lines.append(
                    f"| {key} | {label} | {fmt(s.mae)} | {s.mae / best:.3f} | {fmt(s.mae / floor)} | "
                    f"{fmt(s.coverage_p90, 3)} | {fmt(b.recall)} | {fmt(b.precision)} | {fmt(b.mean_lead_s, 1)} | "
                    f"{fmt(comb.recall)} / {fmt(comb.precision)} |"
                )
                doc[key][label] = {
                    "mae": s.mae,
                    "ratio_best_baseline": s.mae / best,
                    "ratio_floor": s.mae / floor,
                    "coverage_p90": s.coverage_p90,
                    "pinball_p90": s.pinball_p90,
                    "burst_recall": b.recall,
                    "burst_precision": b.precision,
                    "onsets": float(b.onsets),
                    "combined_recall": comb.recall,
                    "combined_precision": comb.precision,
                }
        print(f"{key}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print("\n".join(lines))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write every figure as JSON here")
    ap.add_argument("--score-from", default="70%", help="as in `train-forecaster evaluate` (default 70%%)")
    ap.add_argument("--bursts", action="store_true", help="burst-onset scores on more traces (see the doc)")
    ap.add_argument("--detector-speed", action="store_true", help="per-tick cost of the streaming detector")
    ap.add_argument("--blend", action="store_true", help="MAE of learned/baseline p50 blends (Azure traces)")
    ap.add_argument(
        "--candidates",
        nargs="+",
        metavar="NAME=PATH",
        help="score these checkpoints beside the shipped one on the hold-outs (see candidates_main)",
    )
    ap.add_argument("--mmpp", action="store_true", help="with --candidates: also the synthetic MMPP traces")
    args = ap.parse_args()
    if args.candidates:
        candidates_main(args.candidates, args.json, args.score_from, args.mmpp)
        return
    if args.blend:
        blend_main(args.score_from)
        return
    if args.detector_speed:
        detector_speed()
        return
    if args.bursts:
        bursts_main(args.json, args.score_from)
        return
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
