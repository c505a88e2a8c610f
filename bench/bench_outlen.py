"""Output-length predictor (serving/workload/outlen.py) against the trivial predictors, prequentially.

Every request is predicted from the requests before it (in arrival order), then observed: held-in
traces, no request sees its own output. Figures per trace: MAE and RMSE (tokens), MdAPE (median of
|error| / max(actual, 1)), and "long-output agreement": how often ``prediction > running mean`` agrees
with ``actual > running mean`` (the context-aware router's decision). Rows: the global running mean, the
per-client running mean (only where the trace carries a client id: none of the bundled ones does), and
the predictor with ``kind="mean"`` and ``kind="typical"``. Also the predictor's speed, batch and online.

Run: .venv/bin/python bench/bench_outlen.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.workload.outlen import OutputLengthPredictor, prequential, prequential_group_mean
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = {
    "azure-code": ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv",
    "azure-conv": ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv",
    "mooncake": ROOT / "datasets/mooncake/synthetic_trace.jsonl",
    "burstgpt-fixture": ROOT / "tests/workload/data/burstgpt_sample.csv",
}


def scores(pred: np.ndarray, actual: np.ndarray, threshold: np.ndarray) -> dict[str, float]:
    """Errors over rows with a prediction (row 0 and, for per-group means, each group's first row excluded)."""
    ok = ~np.isnan(pred) & ~np.isnan(threshold)
    e = pred[ok] - actual[ok]
    if not len(e):
        return {"n": 0, "mae": math.nan, "rmse": math.nan, "mdape": math.nan, "long_agreement": math.nan}
    long_pred = pred[ok] > threshold[ok]
    long_true = actual[ok] > threshold[ok]
    return {
        "n": int(ok.sum()),
        "mae": float(np.abs(e).mean()),
        "rmse": float(np.sqrt((e * e).mean())),
        "mdape": float(np.median(np.abs(e) / np.maximum(actual[ok], 1.0))),
        "long_agreement": float((long_pred == long_true).mean()),
    }


def evaluate(trace: Trace) -> dict[str, Any]:
    y = trace.output_tokens.astype(np.float64)
    p = trace.prompt_tokens
    model = trace.model if len(trace.model_names) > 1 else None
    global_mean = prequential_group_mean(y)
    rows: dict[str, dict[str, float]] = {"global-mean": scores(global_mean, y, global_mean)}
    # per-client mean: no bundled trace carries a client id (Azure, Mooncake, BurstGPT have none)
    rows["outlen-mean"] = scores(prequential(p, y, model=model, kind="mean"), y, global_mean)
    rows["outlen-typical"] = scores(prequential(p, y, model=model, kind="typical"), y, global_mean)
    return {"requests": len(trace), "client_id": False, "rows": rows}


def speed(trace: Trace, repeat: int = 3) -> dict[str, float]:
    p, y = trace.prompt_tokens, trace.output_tokens
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        prequential(p, y)
        best = min(best, time.perf_counter() - t0)
    pl, yl = p.tolist(), y.tolist()
    pred = OutputLengthPredictor()
    t0 = time.perf_counter()
    for i in range(len(pl)):
        pred.predict(pl[i], client=i % 50)
        pred.observe(pl[i], yl[i], client=i % 50)
    online = time.perf_counter() - t0
    return {"batch_rows_per_s": len(p) / best, "online_us_per_request": online / len(p) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    for name, path in TRACES.items():
        trace = read_trace(path)
        out[name] = evaluate(trace)
        print(f"\n{name}: {len(trace)} requests, client id: no (per-client mean not measurable)")
        print(f"{'predictor':<16} {'n':>6} {'MAE':>9} {'RMSE':>9} {'MdAPE':>7} {'long agree':>10}")
        for row, s in out[name]["rows"].items():
            print(
                f"{row:<16} {s['n']:>6} {s['mae']:>9.1f} {s['rmse']:>9.1f} {s['mdape']:>7.2f} "
                f"{s['long_agreement']:>10.3f}"
            )
    big = read_trace(TRACES["azure-conv"])
    reps = 100
    tiled = Trace.from_arrays(
        np.arange(len(big) * reps, dtype=np.float64),
        np.tile(big.prompt_tokens, reps),
        np.tile(big.output_tokens, reps),
    )
    out["speed"] = speed(tiled)
    print(
        f"\nspeed ({len(tiled)} rows): batch {out['speed']['batch_rows_per_s'] / 1e6:.2f} M rows/s, "
        f"online predict+observe {out['speed']['online_us_per_request']:.2f} us/request"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
