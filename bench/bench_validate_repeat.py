"""Repeatability of the real-vLLM reference, and real vs sim in both views, over repeated runs of the same slices.

Run (real servers, one at a time; ~3.5 min per run on the shared 2-core box):
    nice -n -10 .venv/bin/python bench/bench_validate_repeat.py --run --rounds 3 --out-dir DIR
Summary only, from recorded runs (no server; the sim side is rerun, deterministic):
    .venv/bin/python bench/bench_validate_repeat.py --out-dir DIR [--profile-json P.json ...]
    .venv/bin/python bench/bench_validate_repeat.py --out-dir serving/sim/profiles/validation  # session 6's runs

``--run`` replays each slice of ``SLICES`` once per round, rounds interleaved (round 1: every slice, then round 2,
...), each with ``bench/bench_vllm_cpu.py --autogroup-nice -20 --validate --iteration-details`` (its own server;
``DIR/<slice>_r<round>.json``, the start/end time and 1-min load in ``DIR/runs.jsonl``). The summary prints, per
slice and figure, every run's real value, the real-vs-real spread (max/min - 1, and the largest deviation from
the runs' median against the goal's tolerance: 10 % at P50, 20 % at P90), and sim/real per run, for the
client-side figures (what the load generator measured) and the server-side ones (vLLM's own histograms over the
slice, ``serving.sim.server_view``; recordings made before session 6 have none). Per run also: the engine-timed
decode step p50 and the share of multi-token requests whose first token reached the client after 80 % of their
e2e (the deferred first tokens of docs/BENCHMARKS.md, W2), the two things known to move between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.sim.validate import validate_against_sim  # noqa: E402
from serving.workload.readers import read_trace  # noqa: E402

CONV = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"
CODE = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
# the three slices of the W1/W2 validation (docs/BENCHMARKS.md): name -> (trace, first row)
SLICES: dict[str, tuple[Path, int]] = {"conv0": (CONV, 0), "code0": (CODE, 0), "conv600": (CONV, 600)}
# how the repository's recordings of these slices are named (serving/sim/profiles/validation/<prefix>_s6r<k>.json)
RECORDED_PREFIX = {
    "conv0": "conv_rows0-119_1rps",
    "code0": "code_rows0-119_1rps",
    "conv600": "conv_rows600-719_1rps",
}
RECORDED = ROOT / "serving/sim/profiles/validation"
CLIENT_FIGURES = ("ttft_ms.p50", "ttft_ms.p90", "itl_ms.p50", "itl_ms.p90")
SERVER_FIGURES = (*CLIENT_FIGURES, "ttft_ms.mean", "itl_ms.mean", "e2e_ms.mean")
DEFERRED_SHARE_OF_E2E = 0.8  # a first token after this share of the request's e2e came with the rest


def tolerance(figure: str) -> float:
    """The goal's tolerance for a figure: 10 % at P50 (and for means), 20 % at P90."""
    return 0.2 if figure.endswith("p90") else 0.1


def deferred_share(real: dict[str, Any]) -> float | None:
    """Share of multi-token requests whose client TTFT is at least ``DEFERRED_SHARE_OF_E2E`` of their e2e."""
    rows = real.get("requests")
    if not isinstance(rows, dict):
        return None
    n = late = 0
    for ttft, e2e, tokens in zip(rows["ttft_ms"], rows["e2e_ms"], rows["completion_tokens"], strict=True):
        if ttft is None or e2e is None or tokens <= 1:
            continue
        n += 1
        late += ttft >= DEFERRED_SHARE_OF_E2E * e2e
    return late / n if n else None


def run_conditions(real: dict[str, Any]) -> dict[str, Any]:
    its = real.get("iterations") or {}
    return {
        "engine_decode_p50_ms": (its.get("decode_only") or {}).get("p50_ms"),
        "engine_prefill_p50_ms": (its.get("prefill_or_mixed") or {}).get("p50_ms"),
        "deferred_share": deferred_share(real),
        "server_ttft_mean_ms": (real.get("server_metrics") or {}).get("time_to_first_token_mean_ms"),
    }


def meets_goal(sim_over_real: float | None, figure: str) -> bool:
    """Within the goal's tolerance of the real figure (an unknown ratio does not meet it)."""
    return sim_over_real is not None and abs(sim_over_real - 1.0) <= tolerance(figure)


def spread(values: list[float | None], figure: str) -> dict[str, Any]:
    """max/min - 1 and the largest |run/median - 1| over the runs, against the figure's tolerance."""
    v = np.array([x for x in values if x is not None and x > 0], dtype=np.float64)
    if v.size < 2:
        return {
            "runs": int(v.size),
            "max_over_min": None,
            "max_dev_from_median": None,
            "within_tolerance": None,
        }
    dev = float(np.max(np.abs(v / np.median(v) - 1.0)))
    return {
        "runs": int(v.size),
        "max_over_min": float(v.max() / v.min()),
        "max_dev_from_median": dev,
        "within_tolerance": bool(dev <= tolerance(figure)),
    }


def summarize_slice(paths: list[Path], trace: Path, profile_jsons: list[Path] | None) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for path in paths:
        doc = validate_against_sim(
            read_trace(trace), work_dir=Path("/tmp"), real_json=path, profile_jsons=profile_jsons
        )
        runs.append({"file": path.name, "doc": doc, "conditions": run_conditions(doc["real"])})
    out: dict[str, Any] = {"runs": [r["file"] for r in runs], "conditions": [r["conditions"] for r in runs]}
    for view, key, figures in (
        ("client", "compare", CLIENT_FIGURES),
        ("server", "compare_server", SERVER_FIGURES),
    ):
        profiles = list(runs[0]["doc"][key])
        table: dict[str, Any] = {}
        for figure in figures:
            real = [r["doc"][key][profiles[0]][figure]["real"] for r in runs]
            row: dict[str, Any] = {"real": real, "spread": spread(real, figure)}
            for p in profiles:
                row[f"sim {p}"] = runs[0]["doc"][key][p][figure]["sim"]
                ratios = [r["doc"][key][p][figure]["sim_over_real"] for r in runs]
                row[f"sim/real {p}"] = ratios
                row[f"goal met {p}"] = sum(1 for x in ratios if meets_goal(x, figure))
            table[figure] = row
        out[view] = table
    return out


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return f"{x:.{digits}f}"


def print_summary(name: str, s: dict[str, Any]) -> None:
    print(f"\n## {name}: runs {', '.join(s['runs'])}")
    for c, f in zip(s["conditions"], s["runs"], strict=True):
        print(
            f"  {f}: engine decode p50 {_fmt(c['engine_decode_p50_ms'], 2)} ms, prefill p50 "
            f"{_fmt(c['engine_prefill_p50_ms'])} ms, deferred first tokens {_fmt(c['deferred_share'], 2)}, "
            f"server TTFT mean {_fmt(c['server_ttft_mean_ms'])} ms"
        )
    for view in ("client", "server"):
        print(
            f"  {view} side | real per run | max/min | max dev from median (tol) | sim | sim/real per run "
            "[runs within the goal]"
        )
        for figure, row in s[view].items():
            sp = row["spread"]
            sims = [k for k in row if k.startswith("sim ")]
            ratios = [k for k in row if k.startswith("sim/real ")]
            print(
                f"  {figure:13s} | {' '.join(_fmt(v) for v in row['real'])} | {_fmt(sp['max_over_min'], 2)} | "
                f"{_fmt(sp['max_dev_from_median'], 2)} ({_fmt(sp['within_tolerance'])}) | "
                + " ; ".join(_fmt(row[k]) for k in sims)
                + " | "
                + " ; ".join(
                    " ".join(_fmt(v, 2) for v in row[k]) + f" [{row['goal met ' + k[9:]]}/{len(row[k])}]"
                    for k in ratios
                )
            )


def run_rounds(out_dir: Path, rounds: int, slices: list[str], first_round: int = 1) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in range(first_round, first_round + rounds):
        for name in slices:
            trace, start = SLICES[name]
            cmd = [
                sys.executable,
                str(ROOT / "bench/bench_vllm_cpu.py"),
                "--autogroup-nice",
                "-20",
                "--validate",
                "--iteration-details",
                "--trace",
                str(trace),
                "--start-index",
                str(start),
                "--validate-json",
                str(out_dir / f"{name}_r{r}.json"),
                "--out",
                str(out_dir / "work"),
            ]
            t0, load0 = datetime.now(UTC).isoformat(timespec="seconds"), os.getloadavg()[0]
            rc = subprocess.run(cmd, check=False).returncode
            entry = {"slice": name, "round": r, "start": t0, "load_start": load0, "rc": rc}
            entry |= {"end": datetime.now(UTC).isoformat(timespec="seconds"), "load_end": os.getloadavg()[0]}
            with (out_dir / "runs.jsonl").open("a") as f:
                f.write(json.dumps(entry) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="where the runs' JSONs are (or go, with --run)"
    )
    parser.add_argument("--run", action="store_true", help="replay the slices on real servers first")
    parser.add_argument(
        "--tag",
        default="s6",
        help="without --run, when --out-dir holds no <slice>_r<k>.json: the recordings <prefix>_<tag>r<k>.json "
        f"(as in {RECORDED.relative_to(ROOT)})",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-round", type=int, default=1, help="--run: number of the first round (files)")
    parser.add_argument("--slices", default=",".join(SLICES), help=f"comma-separated, of {', '.join(SLICES)}")
    parser.add_argument(
        "--profile-json", type=Path, action="append", default=None, help="sim side (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args()
    slices = [s for s in args.slices.split(",") if s]
    unknown = sorted(set(slices) - set(SLICES))
    if unknown:
        parser.error(f"--slices: unknown {unknown}; known: {', '.join(SLICES)}")
    if args.run:
        run_rounds(args.out_dir, args.rounds, slices, args.first_round)
    summary = {}
    for name in slices:
        paths = sorted(args.out_dir.glob(f"{name}_r*.json")) or sorted(
            args.out_dir.glob(f"{RECORDED_PREFIX[name]}_{args.tag}r*.json")
        )
        if not paths:
            print(f"{name}: no runs in {args.out_dir}")
            continue
        summary[name] = summarize_slice(paths, SLICES[name][0], args.profile_json)
        print_summary(name, summary[name])
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
