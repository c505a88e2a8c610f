"""The client's TTFT outside vLLM's own, measured per probe by ``--calibrate`` and modelled (session 9).

For every recorded ``--calibrate`` run in DIR (``bench_validate_repeat.py --run --calibrate``'s ``<slice>_r<k>.json``)
this prints the calibration's outside rows (client TTFT less vLLM's own TTFT for the same requests: alone, and
per closed-loop concurrency), the term fitted from them (``serving.sim.cpu_tiny_fit.fit_client_outside``), and on
the slice itself (never fitted on) the real mean outside (client TTFT mean - server TTFT mean) against what each
calibrated variant's simulator puts there. No server; the sim side is deterministic.

    .venv/bin/python bench/bench_client_outside.py --out-dir DIR [--json OUT]
    .venv/bin/python bench/bench_client_outside.py --out-dir serving/sim/profiles/validation --tag s9o  # session 9's
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_validate_repeat import SLICES, _paths, ttft_split  # noqa: E402
from serving.sim.cpu_tiny_measure import parse_outside  # noqa: E402
from serving.sim.validate import (  # noqa: E402
    CALIBRATED,
    CALIBRATED_OUTSIDE,
    CALIBRATED_OUTSIDE_MEAN,
    CALIBRATED_OUTSIDE_SAMPLED,
    CALIBRATED_OUTSIDE_SHARE,
    validate_against_sim,
)
from serving.workload.readers import read_trace  # noqa: E402

VARIANTS = (
    CALIBRATED,
    CALIBRATED_OUTSIDE,
    CALIBRATED_OUTSIDE_SHARE,
    CALIBRATED_OUTSIDE_SAMPLED,
    CALIBRATED_OUTSIDE_MEAN,
)


def outside_table(csv_text: str) -> dict[str, Any]:
    """Median outside (ms) of the lone rows, and mean outside per loaded concurrency (with its in-flight mean)."""
    rows = parse_outside(csv_text, "the recorded outside rows")
    out = rows["client_ttft_mean_ms"] - rows["server_ttft_mean_ms"]
    lone = rows["kind"] == "lone"
    table: dict[str, Any] = {
        "lone_median_ms": float(np.median(out[lone])),
        "lone_range_ms": [float(out[lone].min()), float(out[lone].max())],
    }
    for c in sorted(set(rows["concurrency"][~lone].tolist())):
        pick = ~lone & (rows["concurrency"] == c)
        table[f"c{int(c)}"] = {
            "outside_ms": float(np.mean(out[pick])),
            "inflight": float(np.mean(rows["inflight_mean"][pick])),
            "server_ttft_ms": float(np.mean(rows["server_ttft_mean_ms"][pick])),
        }
    return table


def run_summary(path: Path, trace: Path) -> dict[str, Any]:
    doc = validate_against_sim(read_trace(trace), work_dir=Path("/tmp"), real_json=path)
    cal = doc["real"]["calibration"]
    split = ttft_split(doc)
    return {
        "file": path.name,
        "calibration_load": cal["provenance"]["load_1min"],
        "outside_rows": outside_table(cal["outside"]["csv"]),
        "fit": doc["client_outside_fit"],
        "slice_outside_mean_ms": {
            k: (v["client"] - v["server"]) if v["client"] is not None and v["server"] is not None else None
            for k, v in split.items()
            if k == "real" or k in VARIANTS
        },
        "within_goal": {k: doc["within_goal"][k] for k in VARIANTS if k in doc["within_goal"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--tag", default="s9o", help="recordings <prefix>_<tag>r<k>.json when DIR has no --run files"
    )
    args = ap.parse_args()
    runs = []
    for name, (trace, _start) in SLICES.items():
        for path in _paths(args.out_dir, name, args.tag):
            s = run_summary(path, trace)
            runs.append(s)
            f, o = s["fit"], s["outside_rows"]
            loaded = ", ".join(
                f"{k} {v['outside_ms']:.0f} (in flight {v['inflight']:.1f})"
                for k, v in o.items()
                if k[0] == "c"
            )
            print(f"{s['file']} (calibration load {s['calibration_load']})")
            print(
                f"  outside rows: lone median {o['lone_median_ms']:.0f} ms "
                f"[{o['lone_range_ms'][0]:.0f}..{o['lone_range_ms'][1]:.0f}]; loaded mean {loaded}"
            )
            print(
                f"  fit: {f['const_ms']:.1f} ms + {f['per_prompt_token_ms']:.4f} ms/prompt token + "
                f"{f['per_inflight_ms']:.1f} ms/in flight (max miss {f['max_abs_miss_ms']:.0f} ms); overhead share "
                f"{f['request_overhead_outside_fraction']:.2f}"
            )
            m = f["mean_fit"]
            print(
                f"  least squares: {m['const_ms']:.1f} + {m['per_prompt_token_ms']:.4f}/token + "
                f"{m['per_inflight_ms']:.1f}/in flight"
            )
            print(
                "  slice mean outside (client - server TTFT mean, ms): "
                + ", ".join(f"{k} {v:.0f}" for k, v in s["slice_outside_mean_ms"].items() if v is not None)
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
