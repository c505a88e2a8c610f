"""Forecast accuracy off the training rates: shipped checkpoint vs candidates vs baselines, one run.

Run: ``.venv/bin/python bench/bench_forecast_rates.py --candidates NAME=PATH ... [--json OUT] [--work DIR]``

Rows, each scored by ``training.evaluate.evaluate`` (the function behind ``train-forecaster evaluate``; the
learned models run their full-sequence forward, equal to stepping — tests/training/test_fit_variants.py):

* held-out real traffic: the bundled Azure 2023 code / conv traces, last 30 % (never read by ``fit`` at
  ``--holdout-frac 0.3``), ``--score-from 70%``;
* rates and traces never trained on, built by ``serving.workload.variants`` into ``--work``:
  ``burstgpt_30min_int_seconds_crlf`` (5 req/s MMPP, BurstGPT CSV), ``azure_code_x0.25`` (thinned),
  ``azure_code_x4`` (4 jittered copies), ``burstgpt_2h_30rps`` (30 req/s; its first ``--long-slice-s``
  seconds), and the conv trace at ×0.1 and ×10 (``variants.thin`` / ``variants.superpose``). Each is scored
  from a third of its span (``--score-from +S``, as bench/bench_unseen.py does), like
  ``train-forecaster evaluate FILE --score-from +S --checkpoint C``;
* long-prompt traffic, far from the training traces' token lengths: ``sine ISL~8k`` (bench/bench_policies.py's
  ``sine`` workload: 1 <-> 24 req/s, prompts ~8,000 tokens, outputs ~1,000, 1,200 s) and ``mooncake ISL~15k``
  (the bundled Mooncake FAST'25 trace), each scored from a third of its span.

Baselines (last value, EWMA, Holt, seasonal-naive, ARIMA) are scored once per trace; ARIMA is skipped on
traces longer than ``--arima-max-s`` (too slow on these cores; the table says where). Columns: mean rate,
the best baseline and its next-5-s arrivals MAE, then each model's MAE and its ratio to the best baseline.
A second table gives the p90 side (what the predictive policy sizes on): each model's pinball loss at 0.9
and coverage, beside the baseline with the lowest pinball loss. A third gives the token channels (next-5-s
prompt and generation tokens): each model's p50 MAE over the best baseline's and its p90 coverage.

Summary lines: the geometric mean over the unseen rows (all but the two hold-outs) of arrivals MAE / best
baseline, of prompt-token MAE / best baseline, and of both together (the selection score of docs/BENCHMARKS.md
"A level-relative candidate for long prompts").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forecaster.combination import CombinationConfig  # noqa: E402
from serving.workload.readers import read_trace  # noqa: E402
from serving.workload.trace import Trace  # noqa: E402
from training.evaluate import COMBINED, LEARNED, default_checkpoint, evaluate  # noqa: E402

if TYPE_CHECKING:
    from forecaster.streaming import LearnedForecaster, SequenceForecast

AZURE = {
    "code": "AzureLLMInferenceTrace_code.dev_before_1850.csv",
    "conv": "AzureLLMInferenceTrace_conv.dev_before_1850.csv",
}
SEARCH = (ROOT / "datasets" / "azure2023", ROOT.parent / "shared" / "datasets" / "azure2023")
VARIANTS = ("burstgpt_30min_int_seconds_crlf", "azure_code_x0.25", "azure_code_x4", "burstgpt_2h_30rps")


def _find(name: str) -> Path:
    for d in SEARCH:
        if (d / name).is_file():
            return d / name
    raise SystemExit(f"trace {name} not found under {[str(d) for d in SEARCH]}")


def long_prompt_traces() -> dict[str, Trace]:
    """The long-prompt rows: bench_policies' ``sine`` workload and the bundled Mooncake trace."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_policies", ROOT / "bench" / "bench_policies.py")
    if spec is None or spec.loader is None:
        raise SystemExit("bench/bench_policies.py not found (the sine workload comes from it)")
    bp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bp)
    sine, _ = bp.workload("sine", None, 600.0)
    return {
        "sine ISL~8k": sine,
        "mooncake ISL~15k": read_trace(ROOT / "datasets" / "mooncake" / "synthetic_trace.jsonl"),
    }


def build_traces(work: Path, long_slice_s: float) -> dict[str, tuple[Trace, str]]:
    """name → (trace, score_from)."""
    import warnings

    from serving.workload.variants import build_variants, superpose, thin

    out: dict[str, tuple[Trace, str]] = {}
    for key, name in AZURE.items():
        out[f"{key} hold-out"] = (read_trace(_find(name)), "70%")
    variants = {v.name: v for v in build_variants(work, long=True)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # integer-second BurstGPT rows re-sorted: reported elsewhere
        for name in VARIANTS:
            t = read_trace(variants[name].path)
            if name == "burstgpt_2h_30rps" and t.duration_s > long_slice_s:
                t0 = float(t.arrival_s[0])
                t = t.window(t0, t0 + long_slice_s)
                name = f"{name}[:{long_slice_s:.0f}s]"
            out[name] = (t, f"+{int(t.duration_s // 3)}")
    conv = read_trace(_find(AZURE["conv"]))
    for label, t in (
        ("azure_conv_x0.1", thin(conv, 0.1, 0)),
        ("azure_conv_x10", superpose(conv, 10, 1.0, 0)),
    ):
        out[label] = (t, f"+{int(t.duration_s // 3)}")
    for label, t in long_prompt_traces().items():
        out[label] = (t, f"+{int(t.duration_s // 3)}")
    return out


class Ensemble:
    """Mean of the members' quantile forecasts (and burst probabilities), for offline scoring only.

    ``evaluate(..., offline=True)`` reads ``schema`` and calls ``predict_sequence``; the members must share
    the feature schema and horizon. Streaming an ensemble costs one ``step`` per member per tick.
    """

    name = "ensemble"

    def __init__(self, members: list[LearnedForecaster]) -> None:
        first = members[0]
        for m in members[1:]:
            if m.schema != first.schema or m.horizon_s != first.horizon_s:
                raise SystemExit("--ensembles: members must share the feature schema and horizon")
        self.members = members
        self.schema = first.schema
        self.horizon_s = first.horizon_s

    def predict_sequence(self, x: Any, mask: Any, times_s: Any) -> SequenceForecast:
        import dataclasses

        import numpy as np

        outs = [m.predict_sequence(x, mask, times_s) for m in self.members]
        return dataclasses.replace(
            outs[0],
            totals=np.mean([o.totals for o in outs], axis=0),
            burst_prob=np.mean([o.burst_prob for o in outs], axis=0),
            model_version="+".join(o.model_version for o in outs),
        )


def _parse_kv(text: str) -> dict[str, Any]:
    """``k=v,k=v`` → a dict, numbers parsed (``rule=best`` stays a string)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--combination takes k=v pairs, got {part!r}")
        try:
            out[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def _geo(values: list[float]) -> float:
    ok = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in ok) / len(ok)) if ok else float("nan")


def _baseline_scores(trace: Trace, score_from: str, arima: bool) -> dict[str, Any]:
    """The baselines' figures on one row (the slow part: ARIMA is re-fitted along the trace)."""
    base = evaluate(trace, score_from=score_from, with_arima=arima, use_default_checkpoint=False)
    pin_name = min(base.models, key=lambda k: base.models[k].pinball_p90)
    row: dict[str, Any] = {
        "rate_rps": len(trace) / max(trace.duration_s, 1.0),
        "score_from": score_from,
        "scored_points": base.scored_points,
        "arima": arima,
        "noise_floor": base.noise_floor_mae,
        "baselines": {k: v.mae for k, v in base.models.items()},
        "best_baseline": min(base.models, key=lambda k: base.models[k].mae),
        "pinball_p90_baselines": {k: v.pinball_p90 for k, v in base.models.items()},
        "best_pinball_baseline": pin_name,
        "best_pinball_coverage_p90": base.models[pin_name].coverage_p90,
        "tokens": {},
    }
    for ch in ("prompt_tokens", "gen_tokens"):
        ch_scores = {k: v[ch] for k, v in base.token_models.items()}
        bn = min(ch_scores, key=lambda k: ch_scores[k].mae)
        row["tokens"][ch] = {
            "baselines": {k: v.mae for k, v in ch_scores.items()},
            "best_baseline": bn,
            "best_coverage_p90": ch_scores[bn].coverage_p90,
        }
    return row


_BASELINE_KEYS = (
    "rate_rps", "score_from", "scored_points", "arima", "noise_floor", "baselines", "best_baseline",
    "pinball_p90_baselines", "best_pinball_baseline", "best_pinball_coverage_p90", "tokens",
)  # fmt: skip


def _baseline_row(earlier: dict[str, Any] | None, score_from: str) -> dict[str, Any] | None:
    """The baseline part of an earlier run's row (``--baselines-from``); None when it has none or was
    scored from another point (then the baselines are re-scored)."""
    if not earlier or "baselines" not in earlier or earlier.get("score_from") != score_from:
        return None
    return {k: earlier[k] for k in _BASELINE_KEYS if k in earlier}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--candidates", nargs="*", default=[], help="NAME=PATH checkpoints beside the shipped one"
    )
    ap.add_argument(
        "--ensembles",
        nargs="*",
        default=[],
        help="NAME=A+B[+C]: the mean of the quantile forecasts of candidates A, B, ... (offline scoring)",
    )
    ap.add_argument("--no-shipped", action="store_true", help="leave the shipped checkpoint out")
    ap.add_argument("--work", type=Path, default=Path("/tmp/w4v"), help="where the variant files are written")
    ap.add_argument("--long-slice-s", type=float, default=2400.0, help="seconds of burstgpt_2h_30rps scored")
    ap.add_argument("--arima-max-s", type=float, default=2400.0, help="no ARIMA on traces longer than this")
    ap.add_argument("--json", type=Path, help="also write every figure as JSON here")
    ap.add_argument(
        "--no-combination", action="store_true", help="no '+comb' columns (the online combination)"
    )
    ap.add_argument(
        "--combination",
        default="",
        help="CombinationConfig overrides for the '+comb' columns, k=v,k=v (e.g. rule=best,halflife_s=60)",
    )
    ap.add_argument(
        "--rows", default="", help="comma-separated substrings: score only the rows whose name contains one"
    )
    ap.add_argument(
        "--baselines-from",
        type=Path,
        help="an earlier --json of the same rows and tree: reuse its baseline figures (no ARIMA re-fit)",
    )
    args = ap.parse_args()
    earlier: dict[str, Any] = {}
    if args.baselines_from is not None:
        earlier = json.loads(args.baselines_from.read_text(encoding="utf-8"))

    import torch

    from forecaster.streaming import LearnedForecaster

    torch.set_num_threads(1)
    models: dict[str, LearnedForecaster | Ensemble] = {}
    ckpt = default_checkpoint()
    if ckpt is not None and not args.no_shipped:
        models["shipped"] = LearnedForecaster.load(ckpt)
    for spec in args.candidates:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--candidates takes NAME=PATH, got {spec!r}")
        models[name] = LearnedForecaster.load(Path(path))
    for spec in args.ensembles:
        name, _, members = spec.partition("=")
        parts = [m for m in members.split("+") if m]
        bad = [m for m in parts if not isinstance(models.get(m), LearnedForecaster)]
        if len(parts) < 2 or bad:
            raise SystemExit(f"--ensembles {spec!r}: give NAME=A+B with A, B among --candidates (bad: {bad})")
        models[name] = Ensemble([cast("LearnedForecaster", models[m]) for m in parts])
    if not models:
        raise SystemExit("no model to score: give --candidates NAME=PATH (and/or keep the shipped one)")
    traces = build_traces(args.work, args.long_slice_s)
    if args.rows:
        wanted = [w.strip() for w in args.rows.split(",") if w.strip()]
        traces = {k: v for k, v in traces.items() if any(w in k for w in wanted)}
        if not traces:
            raise SystemExit(f"--rows {args.rows!r} matches no row")
    combo = None if args.no_combination else CombinationConfig(**_parse_kv(args.combination))

    def columns(name: str) -> list[tuple[str, str]]:
        """(column, row of evaluate's models) per model: the network, then its combination."""
        return [(name, LEARNED)] + ([] if combo is None else [(f"{name}+comb", COMBINED)])

    names = [col for name in models for col, _ in columns(name)]
    head = "| trace | req/s | score from | best baseline | MAE | " + " | ".join(
        f"{n} MAE | {n} / best" for n in names
    )
    lines = [head + " |", "|" + "---|" * (5 + 2 * len(names))]
    doc: dict[str, Any] = {}
    p90_lines = [
        "| trace | best p90 baseline | pinball p90 | coverage | "
        + " | ".join(f"{n} pinball p90 | {n} coverage" for n in names)
        + " |",
        "|" + "---|" * (4 + 2 * len(names)),
    ]
    tok_lines = [
        "| trace | channel | best baseline | MAE | coverage p90 | "
        + " | ".join(f"{n} MAE / best | {n} coverage" for n in names)
        + " |",
        "|" + "---|" * (5 + 2 * len(names)),
    ]
    for key, (trace, score_from) in traces.items():
        t0 = time.perf_counter()
        arima = trace.duration_s <= args.arima_max_s
        row = _baseline_row(earlier.get(key), score_from)
        if row is None:
            row = _baseline_scores(trace, score_from, arima)
        arima = row["arima"]
        best_name = row["best_baseline"]
        best = row["baselines"][best_name]
        pin_name = row["best_pinball_baseline"]
        best_pin = row["pinball_p90_baselines"][pin_name]
        pin_cov = row.get("best_pinball_coverage_p90", float("nan"))
        p90_cells: list[str] = []
        rate = row["rate_rps"]
        tok_best = {
            ch: (
                row["tokens"][ch]["best_baseline"],
                row["tokens"][ch]["baselines"][row["tokens"][ch]["best_baseline"]],
            )
            for ch in ("prompt_tokens", "gen_tokens")
        }
        tok_cells: dict[str, list[str]] = {"prompt_tokens": [], "gen_tokens": []}
        cells = []
        for name, lf in models.items():
            learned = cast("LearnedForecaster", lf)  # an Ensemble offers what offline scoring reads
            r = evaluate(
                trace,
                score_from=score_from,
                with_arima=False,
                learned=learned,
                offline=True,
                combination=combo,
            )
            for col, model_key in columns(name):
                sc_a = r.models[model_key]
                mae, pin = sc_a.mae, sc_a.pinball_p90
                row[col] = {
                    "mae": mae,
                    "ratio_best_baseline": mae / best,
                    "coverage_p90": sc_a.coverage_p90,
                    "pinball_p90": pin,
                    "pinball_p90_ratio_best": pin / best_pin,
                }
                if model_key == COMBINED and r.combination is not None:
                    row[col]["mean_weights"] = r.combination["mean_weights"]
                for ch in ("prompt_tokens", "gen_tokens"):
                    sc = r.token_models[model_key][ch]
                    ratio = sc.mae / tok_best[ch][1] if tok_best[ch][1] > 0 else float("nan")
                    row[col][ch] = {
                        "mae": sc.mae,
                        "ratio_best_baseline": ratio,
                        "coverage_p90": sc.coverage_p90,
                        "pinball_p90": sc.pinball_p90,
                    }
                    tok_cells[ch].append(f"{ratio:.3f} | {sc.coverage_p90:.3f}")
                p90_cells.append(f"{pin:.2f} | {sc_a.coverage_p90:.3f}")
                cells.append(f"{mae:.2f} | {mae / best:.3f}")
        doc[key] = row
        label = best_name + ("" if arima else " (no ARIMA)")
        lines.append(
            f"| {key} | {rate:.1f} | {score_from} | {label} | {best:.2f} | " + " | ".join(cells) + " |"
        )
        p90_lines.append(
            f"| {key} | {pin_name} | {best_pin:.2f} | {pin_cov:.3f} | " + " | ".join(p90_cells) + " |"
        )
        for ch in ("prompt_tokens", "gen_tokens"):
            bn, bm = tok_best[ch]
            cov = row["tokens"][ch]["best_coverage_p90"]
            tok_lines.append(
                f"| {key} | {ch} | {bn} | {bm:,.0f} | {cov:.3f} | " + " | ".join(tok_cells[ch]) + " |"
            )
        print(f"{key}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    unseen_rows = [k for k in doc if "hold-out" not in k]
    geo, geo_prompt, geo_both = [], [], []
    for name in names:
        arr = [doc[k][name]["ratio_best_baseline"] for k in unseen_rows]
        prm = [doc[k][name]["prompt_tokens"]["ratio_best_baseline"] for k in unseen_rows]
        geo.append(_geo(arr))
        geo_prompt.append(_geo(prm))
        geo_both.append(_geo(arr + prm))
        doc.setdefault("_summary", {})[name] = {
            "geo_arrivals_unseen": geo[-1],
            "geo_prompt_tokens_unseen": geo_prompt[-1],
            "geo_selection_score": geo_both[-1],
        }
    lines.append(
        "| geometric mean of / best, unseen rows | | | | | " + " | ".join(f" | {g:.3f}" for g in geo) + " |"
    )
    print("\n".join(lines))
    print(
        "\np90 (what the predictive policy sizes on): pinball loss at 0.9 and coverage, next-5-s arrivals\n"
    )
    print("\n".join(p90_lines))
    print("\ntoken channels, next-5-s totals: p50 MAE / best baseline's, and p90 coverage\n")
    print("\n".join(tok_lines))
    print("\n| geometric mean over unseen rows | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, vals in (
        ("arrivals MAE / best", geo),
        ("prompt-token MAE / best", geo_prompt),
        ("both (selection score)", geo_both),
    ):
        print(f"| {label} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
