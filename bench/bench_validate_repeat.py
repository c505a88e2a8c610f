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
decode step p50 and the share of multi-token requests answered in one burst (the deferred first tokens of
docs/BENCHMARKS.md, W2; the rule of bench/bench_vllm_deferral.py), the two things known to move between runs, and
over all runs of a slice that share by output length and by the server's state at send.
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

from serving.sim.validate import load_real, meets_goal, tolerance, validate_against_sim  # noqa: E402
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
BURST_GAP_MS = 1.0  # as bench_vllm_deferral.py: tokens closer than this per token came in one burst
OUTPUT_BANDS = ((2, 4), (5, 8), (9, 16), (17, 31), (32, 32))  # output lengths (the slices clip at 32)


def _request_arrays(real: dict[str, Any]) -> dict[str, np.ndarray] | None:
    rows = real.get("requests")
    if not isinstance(rows, dict):
        return None
    keys = ("sent_ms", "ttft_ms", "e2e_ms", "completion_tokens")
    return {k: np.array([np.nan if v is None else float(v) for v in rows[k]]) for k in keys}


def burst_answers(real: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(multi-token completed requests, those of them answered in one burst: first to last token under
    ``BURST_GAP_MS`` per further token, the rule of bench_vllm_deferral.py), as boolean arrays."""
    a = _request_arrays(real)
    if a is None:
        return None
    tokens = a["completion_tokens"]
    multi = np.isfinite(a["ttft_ms"]) & np.isfinite(a["e2e_ms"]) & (tokens > 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        burst = multi & ((a["e2e_ms"] - a["ttft_ms"]) / np.maximum(tokens - 1, 1) < BURST_GAP_MS)
    return multi, burst


def deferred_share(real: dict[str, Any]) -> float | None:
    """Share of the multi-token requests answered in one burst (their first token came with the rest)."""
    got = burst_answers(real)
    if got is None or not got[0].any():
        return None
    return float(got[1].sum() / got[0].sum())


def deferred_breakdown(reals: list[dict[str, Any]]) -> dict[str, tuple[int, float | None]]:
    """Over several runs: ``{group: (multi-token requests, share answered in one burst)}`` by output-length band
    (``OUTPUT_BANDS``) and by the server's state when the request was sent (another request in flight or not)."""
    counts: dict[str, list[int]] = {}

    def add(group: str, multi: np.ndarray, burst: np.ndarray) -> None:
        c = counts.setdefault(group, [0, 0])
        c[0] += int(multi.sum())
        c[1] += int(burst.sum())

    for real in reals:
        got, a = burst_answers(real), _request_arrays(real)
        if got is None or a is None:
            continue
        multi, burst = got
        add("all", multi, burst)
        tokens = a["completion_tokens"]
        for lo, hi in OUTPUT_BANDS:
            band = (tokens >= lo) & (tokens <= hi)
            add(f"tokens {lo}-{hi}", multi & band, burst & band)
        done = a["sent_ms"] + a["e2e_ms"]
        sent = a["sent_ms"]
        busy = np.array([np.any((sent < t) & (done > t)) for t in sent])  # another request in flight at send
        add("sent busy", multi & busy, burst & busy)
        add("sent idle", multi & ~busy, burst & ~busy)
    return {g: (n, (b / n if n else None)) for g, (n, b) in counts.items()}


def run_conditions(real: dict[str, Any]) -> dict[str, Any]:
    its = real.get("iterations") or {}
    return {
        "engine_decode_p50_ms": (its.get("decode_only") or {}).get("p50_ms"),
        "engine_prefill_p50_ms": (its.get("prefill_or_mixed") or {}).get("p50_ms"),
        "deferred_share": deferred_share(real),
        "server_ttft_mean_ms": (real.get("server_metrics") or {}).get("time_to_first_token_mean_ms"),
        "server_api_mean_ms": server_api_ms(real),
        "calibrated": calibrated_terms(real),
    }


def server_api_ms(real: dict[str, Any]) -> float | None:
    """vLLM's TTFT mean less its queue and prefill means (ms): the time inside its TTFT window that is not the
    engine's (tokenising, the hand-off to the engine core, the API process taking the first token back)."""
    m = real.get("server_metrics") or {}
    parts = [
        m.get(k)
        for k in ("time_to_first_token_mean_ms", "request_queue_time_mean_ms", "request_prefill_time_mean_ms")
    ]
    ttft, queue, prefill = parts
    if ttft is None or queue is None or prefill is None:
        return None
    return float(ttft) - float(queue) - float(prefill)


def ttft_split(doc: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Mean TTFT as the client timed it and as the server's histogram holds it, real and per sim profile (ms):
    their difference is what a request spends outside the server's own TTFT (HTTP, the client, first tokens
    the API server holds back)."""

    def mean(values: list[Any] | None) -> float | None:
        v = [float(x) for x in values or [] if x is not None]
        return float(np.mean(v)) if v else None

    server = doc["compare_server"]
    first = next(iter(server.values()))
    out = {
        "real": {"client": mean(doc["real"]["requests"]["ttft_ms"]), "server": first["ttft_ms.mean"]["real"]}
    }
    for key, sim in doc["sim"].items():
        out[key] = {"client": mean(sim.get("request_ttft_ms")), "server": server[key]["ttft_ms.mean"]["sim"]}
    return out


def calibrated_terms(real: dict[str, Any]) -> dict[str, Any] | None:
    """The profile a ``--calibrate`` run fitted on its own server (coefficients and overheads in one dict, plus
    how long the calibration took); None for a run without one."""
    cal = real.get("calibration")
    if not isinstance(cal, dict):
        return None
    profile = cal["profile"]
    terms: dict[str, Any] = profile["coefficients"] | profile["overheads"]
    return terms | {"elapsed_s": cal["provenance"]["elapsed_s"]}


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


def summarize_slice(
    paths: list[Path],
    trace: Path,
    profile_jsons: list[Path] | None,
    overheads: dict[str, float] | None = None,
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for path in paths:
        doc = validate_against_sim(
            read_trace(trace),
            work_dir=Path("/tmp"),
            real_json=path,
            profile_jsons=profile_jsons,
            overheads=overheads,
        )
        conditions = run_conditions(doc["real"]) | {"ttft_split": ttft_split(doc)}
        runs.append({"file": path.name, "doc": doc, "conditions": conditions})
    out: dict[str, Any] = {"runs": [r["file"] for r in runs], "conditions": [r["conditions"] for r in runs]}
    for view, key, figures in (
        ("client", "compare", CLIENT_FIGURES),
        ("server", "compare_server", SERVER_FIGURES),
    ):
        # profiles every run has (a calibrated profile is each run's own fit: its sim side differs per run)
        profiles = [p for p in runs[0]["doc"][key] if all(p in r["doc"][key] for r in runs)]
        table: dict[str, Any] = {}
        for figure in figures:
            real = [r["doc"][key][profiles[0]][figure]["real"] for r in runs]
            row: dict[str, Any] = {"real": real, "spread": spread(real, figure)}
            for p in profiles:
                sims = [r["doc"][key][p][figure]["sim"] for r in runs]
                row[f"sim {p}"] = sims[0] if len(set(sims)) == 1 else sims
                ratios = [r["doc"][key][p][figure]["sim_over_real"] for r in runs]
                row[f"sim/real {p}"] = ratios
                row[f"goal met {p}"] = sum(1 for x in ratios if meets_goal(x, figure))
            table[figure] = row
        out[view] = table
    out["deferred"] = deferred_breakdown([r["doc"]["real"] for r in runs])
    return out


def totals(summary: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """Over every slice, figure (quantiles only) and run: ``{view: {profile or "median run": [met, pairs]}}``;
    "median run" is the ceiling of any deterministic simulator: one equal to each figure's median real run."""
    out: dict[str, dict[str, list[int]]] = {}
    for s in summary.values():
        for view in ("client", "server"):
            for figure, row in s[view].items():
                if figure not in CLIENT_FIGURES:
                    continue
                real = [x for x in row["real"] if x is not None]
                med = float(np.median(real)) if real else None
                ceiling = sum(1 for x in real if med and meets_goal(med / x, figure))
                cell = out.setdefault(view, {}).setdefault("median run", [0, 0])
                cell[0], cell[1] = cell[0] + ceiling, cell[1] + len(row["real"])
                for key in row:
                    if key.startswith("goal met "):
                        cell = out[view].setdefault(key[9:], [0, 0])
                        cell[0], cell[1] = cell[0] + row[key], cell[1] + len(row["real"])
    return out


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    return f"{x:.{digits}f}"


def _fmt_sim(x: Any) -> str:
    """One sim value, or a run's each (a calibrated profile differs per run)."""
    return " ".join(_fmt(v) for v in x) if isinstance(x, list) else _fmt(x)


def print_summary(name: str, s: dict[str, Any]) -> None:
    print(f"\n## {name}: runs {', '.join(s['runs'])}")
    for c, f in zip(s["conditions"], s["runs"], strict=True):
        print(
            f"  {f}: engine decode p50 {_fmt(c['engine_decode_p50_ms'], 2)} ms, prefill p50 "
            f"{_fmt(c['engine_prefill_p50_ms'])} ms, deferred first tokens {_fmt(c['deferred_share'], 2)}, "
            f"server TTFT mean {_fmt(c['server_ttft_mean_ms'])} ms (of it outside the engine's queue and "
            f"prefill {_fmt(c.get('server_api_mean_ms'))} ms)"
        )
        split = c.get("ttft_split") or {}
        print(
            "    TTFT mean client / server (ms): "
            + "; ".join(f"{Path(k).name} {_fmt(v['client'])} / {_fmt(v['server'])}" for k, v in split.items())
        )
        cal = c.get("calibrated")
        if cal:
            print(
                f"    calibrated in {cal['elapsed_s']:.0f} s: a {cal['a_ms']:.2f} b {cal['b_ms_per_prefill_token']:.4f} "
                f"c {cal['c_ms_per_decode_seq']:.3f} d {cal['d_ms_per_decode_context_token']:.5f}, request overhead "
                f"{cal['request_overhead_ms']:.1f}, admission {cal.get('admission_busy_ms', 0):.1f} + "
                f"{cal.get('admission_ms_per_running_seq', 0):.2f}/seq (young {cal.get('admission_young_busy_ms', 0):.1f}"
                f" + {cal.get('admission_ms_per_young_seq', 0):.2f}/seq), stalls "
                f"{cal.get('decode_stall_fraction', 0):.3f} x {cal.get('decode_stall_ms', 0):.1f} ms"
            )
    print(
        "  answered in one burst, all runs: "
        + ", ".join(f"{g} {_fmt(v, 2)} (n {n})" for g, (n, v) in s["deferred"].items())
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
                + " ; ".join(_fmt_sim(row[k]) for k in sims)
                + " | "
                + " ; ".join(
                    " ".join(_fmt(v, 2) for v in row[k]) + f" [{row['goal met ' + k[9:]]}/{len(row[k])}]"
                    for k in ratios
                )
            )


def run_rounds(
    out_dir: Path, rounds: int, slices: list[str], first_round: int = 1, calibrate: bool = False
) -> None:
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
                *(["--calibrate"] if calibrate else []),
            ]
            t0, load0 = datetime.now(UTC).isoformat(timespec="seconds"), os.getloadavg()[0]
            rc = subprocess.run(cmd, check=False).returncode
            entry = {"slice": name, "round": r, "start": t0, "load_start": load0, "rc": rc}
            entry |= {"end": datetime.now(UTC).isoformat(timespec="seconds"), "load_end": os.getloadavg()[0]}
            with (out_dir / "runs.jsonl").open("a") as f:
                f.write(json.dumps(entry) + "\n")


def _paths(out_dir: Path, name: str, tag: str) -> list[Path]:
    """A slice's runs: ``<slice>_r<k>.json`` (--run's), else the recordings ``<prefix>_<tag>r<k>.json``."""
    return sorted(out_dir.glob(f"{name}_r*.json")) or sorted(
        out_dir.glob(f"{RECORDED_PREFIX[name]}_{tag}r*.json")
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="where the runs' JSONs are (or go, with --run)"
    )
    parser.add_argument("--run", action="store_true", help="replay the slices on real servers first")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="--run: each run fits a cpu-tiny profile on its own server first (bench_vllm_cpu.py --calibrate); "
        "the summary then has a 'calibrated' profile beside --profile-json",
    )
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
    parser.add_argument(
        "--overheads",
        default="",
        help="sim side: set these overheads in every profile, NAME=VALUE,... (e.g. "
        "request_overhead_outside_fraction=1,admission_outside_fraction=1: a variant of where the server's "
        "TTFT starts)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args()
    overheads: dict[str, float] = {}
    for item in (x for x in args.overheads.split(",") if x):
        name, sep, value = item.partition("=")
        try:
            overheads[name.strip()] = float(value)
        except ValueError:
            parser.error(f"--overheads: {item!r} is not NAME=NUMBER")
        if not sep:
            parser.error(f"--overheads: {item!r} is not NAME=NUMBER")
    slices = [s for s in args.slices.split(",") if s]
    unknown = sorted(set(slices) - set(SLICES))
    if unknown:
        parser.error(f"--slices: unknown {unknown}; known: {', '.join(SLICES)}")
    if args.run:
        run_rounds(args.out_dir, args.rounds, slices, args.first_round, args.calibrate)
    summary = {}
    for name in slices:
        paths = _paths(args.out_dir, name, args.tag)
        if not paths:
            print(f"{name}: no runs in {args.out_dir}")
            continue
        summary[name] = summarize_slice(paths, SLICES[name][0], args.profile_json, overheads or None)
        print_summary(name, summary[name])
    print("\n## (run, figure) pairs within the goal, P50/P90 TTFT and ITL over every slice")
    for view, cells in totals(summary).items():
        print(f"  {view}: " + "; ".join(f"{k} {met}/{n}" for k, (met, n) in cells.items()))
    everything = deferred_breakdown(
        [load_real(p) for name in summary for p in _paths(args.out_dir, name, args.tag)]
    )
    print(
        "  answered in one burst, every run of every slice: "
        + ", ".join(f"{g} {_fmt(v, 2)} (n {n})" for g, (n, v) in everything.items())
    )
    if args.json is not None:
        args.json.write_text(json.dumps(summary | {"totals": totals(summary)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
