"""Every user-facing entry point on generated unseen-trace variants: crash, clear error or success.

Builds the variants (serving/workload/variants.py) under --out, then runs, each as its own process under
``/usr/bin/time -v`` (wall time, peak RSS):

* ``pdscale replay --policy P`` for P in static-peak, reactive, predictive;
* ``pdscale bench`` (all five policies);
* ``train-forecaster evaluate --score-from +S`` with the shipped checkpoint (S = a third of the trace);
* ``train-forecaster fit`` once, on a small variant (2 epochs, 1 torch thread);

and checks the figures: completed == requests, dropped == 0, GPU-s > 0, SLO attainment in [0, 1],
and, for variants that must be refused, exit code 2 with the line named and no traceback.
Long variants (2 h at 30 req/s, a day at 3 req/s) run replay and bench in full.

``--set hostile`` (or ``all``) adds the edge cases of ``build_hostile_variants`` (silences, a flash crowd, prompts
past the context window, one timestamp, other time zones, broken and compressed files), and ``--entries`` can add
``plan``, ``controller``, ``controller-config``, ``fleet``, ``tune``, ``validate`` (``run_extra``) and ``export``
(after ``fit``); every ``--json`` they write is checked for NaN/inf and requests == completed + rejected + unfinished.

Usage: OMP_NUM_THREADS=1 nice .venv/bin/python bench/bench_unseen.py [--out /tmp/unseen] [--no-long]
       [--set generated|hostile|all] [--only NAME ...] [--entries E,...] [--json OUT]
       [--gateway-queue off|on|off,on]

``--gateway-queue off,on`` runs every replay entry (``replay:speed``, ``replay:POLICY``) both ways, side by
side (``pdscale replay --gateway-queue``; the entry name ends in ``gw on`` / ``gw off``).

``--params k=v,...`` (PolicyConfig overrides, as bench_policies.py's) runs the ``replay:predictive`` entry with
them, to try a candidate default on the variants: ``pdscale replay`` has no option for them, so the entry
replays a one-pool fleet file (``pdscale replay --fleet``, written beside the JSON) with the default pool's
bounds, SLOs and GPU budget and ``policy:`` the overrides, which replays as ``--policy predictive`` does (the
entry name ends in ``+params``). The other entries ignore them; with ``--gateway-queue on`` it is refused
(``--fleet`` has no gateway queue).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.workload.variants import (  # noqa: E402
    Variant,
    build_hostile_variants,
    build_shape_variants,
    build_variants,
)

# the project's venv; a git worktree without one runs the interpreter's own (e.g. /work/main/.venv/bin)
BIN = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin").is_dir() else Path(sys.executable).parent
MOONCAKE_SLO = ["--slo-ttft-ms", "10000"]  # 1 s TTFT is out of reach for Mooncake's 10k-token prompts


@dataclass
class Run:
    variant: str
    entry: str
    outcome: str  # ok | clear-error | CRASH | WRONG
    wall_s: float
    cpu_s: float
    rss_mb: float
    note: str


def _timed(cmd: list[str], timeout_s: float) -> tuple[int, str, float, float, float]:
    """(exit code, stdout+stderr, wall s, peak RSS MB, CPU s) of one command under /usr/bin/time -v."""
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200"}
    try:
        p = subprocess.run(
            ["/usr/bin/time", "-v", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return 124, "timeout", time.perf_counter() - t0, float("nan"), float("nan")
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    rss = int(m.group(1)) / 1024 if m else float("nan")
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", p.stderr))
    return p.returncode, p.stdout + p.stderr, wall, rss, cpu


def _mb(rss: float) -> float:
    """Peak RSS for the table: NaN (a run killed at its timeout has no /usr/bin/time report) stays NaN."""
    return round(rss) if math.isfinite(rss) else rss


def _classify(rc: int, out: str, expect: str) -> tuple[str, str]:
    if rc == 124:
        return "CRASH", "timeout"
    if "Traceback (most recent call last)" in out:
        last = [ln for ln in out.splitlines() if ln and not ln.startswith(("\t", " "))]
        return "CRASH", (last[-1] if last else "traceback")[:160]
    if rc != 0:
        err = next((ln for ln in out.splitlines() if "error" in ln.lower()), out.strip()[-160:])
        return ("clear-error" if expect == "error" else "WRONG"), err.strip()[:200]
    return ("ok" if expect == "ok" else "WRONG"), ""


def _check_replay(doc: dict[str, Any], requests: int) -> str:
    problems = []
    if doc.get("requests") != requests:
        problems.append(f"requests {doc.get('requests')} != {requests}")
    if _settled(doc) != doc.get("requests"):  # lost without a word
        problems.append(
            f"completed {doc.get('completed')} + rejected {doc.get('rejected', 0)} + unfinished "
            f"{doc.get('unfinished')} != requests {doc.get('requests')}"
        )
    if doc.get("dropped", 0) != 0:
        problems.append(f"dropped {doc['dropped']}")
    gpu = doc.get("gpu_seconds") or 0.0
    if not gpu > 0:
        problems.append(f"gpu_seconds {gpu}")
    slo = doc.get("slo_attainment")
    if slo is None or not 0.0 <= slo <= 1.0:
        problems.append(f"slo_attainment {slo}")
    return "; ".join(problems)


def _settled(doc: dict[str, Any]) -> int:
    """completed + rejected + unfinished of one report (every request is one of the three)."""
    return int(doc.get("completed", 0) + doc.get("rejected", 0) + doc.get("unfinished", 0))


def _summary_replay(doc: dict[str, Any]) -> str:
    p99 = doc["ttft_ms"]["p99"]
    return (
        f"SLO {doc['slo_attainment']:.1%}, TTFT p99 {'n/a' if p99 is None else f'{p99:,.0f} ms'}, "
        f"{doc['gpu_seconds']:,.0f} GPU-s, {doc['scale_events']} ev"
        + (f", {doc['unfinished']:,} unfinished" if doc.get("unfinished") else "")
        + (f", {doc['over_context']:,} over max_model_len" if doc.get("over_context") else "")
        + (f", {doc['rejected']:,} rejected" if doc.get("rejected") else "")
    )


def params_fleet(v: Variant, params: Mapping[str, Any], out: Path) -> Path:
    """A one-pool fleet file at ``out`` replaying ``v`` as ``pdscale replay --trace`` does (pool ``default``,
    the default profile, bounds and GPU budget, the Mooncake SLO for Mooncake) with ``params`` as the policy's
    overrides (validated by the policy when the replay loads it)."""
    from serving.sim.fleet import single_pool

    default = single_pool()
    pool: dict[str, Any] = {
        "name": default.pools[0].name,
        "trace": str(v.path.resolve()),
        "policy": dict(params),
    }
    if v.fmt == "mooncake":
        pool["slo_ttft_ms"] = float(MOONCAKE_SLO[1])
    out.write_text(json.dumps({"gpu_budget": default.gpu_budget, "pools": [pool]}, indent=1) + "\n")
    return out


def run_variant(
    v: Variant,
    work: Path,
    entries: set[str],
    gateways: tuple[str, ...] = ("off",),
    params: Mapping[str, Any] | None = None,
) -> list[Run]:
    runs: list[Run] = []
    slo = MOONCAKE_SLO if v.fmt == "mooncake" else []
    timeout = 3 * TIMEOUT_S if v.long else TIMEOUT_S

    def record(entry: str, cmd: list[str], check: Any = None, expect: str | None = None) -> None:
        rc, out, wall, rss, cpu = _timed(cmd, timeout)
        outcome, note = _classify(rc, out, expect or v.expect)
        if outcome == "clear-error" and v.error_line is not None and f":{v.error_line}:" not in out:
            outcome, note = "WRONG", f"error does not name line {v.error_line}: {note}"
        if outcome == "ok" and check is not None:
            problem, summary = check()
            outcome, note = ("WRONG", problem) if problem else ("ok", summary)
            if outcome == "ok" and "unfinished" in summary:
                outcome = "UNFINISHED"  # reported, not lost: still queued when the replay's drain limit came
        runs.append(Run(v.name, entry, outcome, round(wall, 1), round(cpu, 1), _mb(rss), note))
        print(
            f"{v.name:34s} {entry:22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}",
            flush=True,
        )

    def gw(g: str) -> tuple[str, str, list[str]]:  # (entry suffix, file suffix, pdscale replay arguments)
        if len(gateways) == 1:
            return "", "", ["--gateway-queue", g]
        return f" gw {g}", f".gw-{g}", ["--gateway-queue", g]

    for g in gateways if "replay:speed" in entries and v.name == "burstgpt_2h_30rps" else ():
        # issue 3's goal: 1 h, 30 req/s, 16 instances
        suffix, fsuffix, gw_args = gw(g)
        out = work / f"{v.name}.replay.speed{fsuffix}.json"

        def check_speed(out: Path = out) -> tuple[str, str]:
            doc = json.loads(out.read_text())
            return (("" if doc["dropped"] == 0 and doc["unfinished"] == 0 else "dropped/unfinished"),
                    f"{doc['requests']:,} requests in 1 h, 8P+8D fixed: " + _summary_replay(doc))  # fmt: skip

        cmd = [str(BIN / "pdscale"), "replay", "--trace", str(v.path), "--policy", "fixed", "--prefill", "8",
               "--decode", "8", "--duration-s", "3600", "--json", str(out), *gw_args]  # fmt: skip
        record(f"replay 1 h fixed 8P+8D{suffix}", cmd, check_speed)
    for policy in ("static-peak", "reactive", "predictive"):
        if f"replay:{policy}" not in entries:
            continue
        for g in gateways:
            suffix, fsuffix, gw_args = gw(g)
            out = work / f"{v.name}.replay.{policy}{fsuffix}.json"

            def check_replay(out: Path = out) -> tuple[str, str]:
                doc = json.loads(out.read_text())
                return _check_replay(doc, v.requests), _summary_replay(doc)

            cmd = [
                str(BIN / "pdscale"),
                "replay",
                "--trace",
                str(v.path),
                "--policy",
                policy,
                "--json",
                str(out),
            ]
            if policy == "predictive" and params and v.expect != "error":
                fleet = params_fleet(v, params, work / f"{v.name}.replay.{policy}.fleet.json")
                cmd = [str(BIN / "pdscale"), "replay", "--fleet", str(fleet), "--policy", policy, "--json",
                       str(out)]  # fmt: skip
                record(f"replay {policy}{suffix} +params", cmd + gw_args, check_replay)
                continue
            record(f"replay {policy}{suffix}", cmd + slo + gw_args, check_replay)
            if v.expect == "error":
                break
        if v.expect == "error":
            break  # one refusal is enough: the reader is shared
    if v.expect == "error" and v.name.endswith("unsorted_far") and "replay:static-peak" in entries:
        out = work / f"{v.name}.replay.inf.json"

        def check_inf() -> tuple[str, str]:
            doc = json.loads(out.read_text())
            return _check_replay(doc, v.requests), _summary_replay(doc)

        v_ok = Variant(v.name, v.fmt, v.path, v.description, "ok", v.requests)
        cmd = [
            str(BIN / "pdscale"),
            "replay",
            "--trace",
            str(v.path),
            "--max-reorder-s",
            "inf",
            "--json",
            str(out),
        ]
        rc, text, wall, rss, cpu = _timed(cmd, timeout)
        outcome, note = _classify(rc, text, v_ok.expect)
        if outcome == "ok":
            problem, summary = check_inf()
            outcome, note = ("WRONG", problem) if problem else ("ok", summary)
        runs.append(
            Run(v.name, "replay --max-reorder-s inf", outcome, round(wall, 1), round(cpu, 1), _mb(rss), note)
        )
        print(
            f"{v.name:34s} {'replay reorder inf':22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}",
            flush=True,
        )
    if v.expect == "error":
        return runs
    if "bench" in entries:
        out = work / f"{v.name}.bench.json"

        def check_bench() -> tuple[str, str]:
            doc = json.loads(out.read_text())["traces"]
            (fig,) = doc.values()
            bad = []
            for name, f in fig["policies"].items():
                if f.get("error"):
                    bad.append(f"{name}: {f['error'][:80]}")
                elif _settled(f) != v.requests:
                    bad.append(
                        f"{name}: completed {f['completed']} + rejected {f.get('rejected', 0)} + unfinished "
                        f"{f.get('unfinished')}/{v.requests}"
                    )
                elif not f["gpu_seconds"] > 0:
                    bad.append(f"{name}: gpu_seconds {f['gpu_seconds']}")
            slo_s = " ".join(
                f"{n[:4]} {f['slo_attainment']:.0%}/{f['gpu_ratio_to_oracle'] or 0:.2f}x"
                for n, f in fig["policies"].items()
                if f.get("slo_attainment") is not None
            )
            left = {n[:4]: f["unfinished"] for n, f in fig["policies"].items() if f.get("unfinished")}
            refused = {n[:4]: f["rejected"] for n, f in fig["policies"].items() if f.get("rejected")}
            bad.extend(nonsense(doc))
            return "; ".join(bad), (slo_s + (f"; unfinished {left}" if left else "")
                                    + (f"; rejected {refused}" if refused else ""))  # fmt: skip

        record("bench (5 policies)", [str(BIN / "pdscale"), "bench", "-t", str(v.path), "--json", str(out), *slo],
               check_bench)  # fmt: skip
    if "evaluate" in entries and not v.name.startswith("azure_day"):  # a day: see EVALUATE_DAY_NOTE
        out = work / f"{v.name}.evaluate.json"
        score_from = _score_from(v)

        def check_eval() -> tuple[str, str]:
            return eval_summary(json.loads(out.read_text()))

        trace_arg = ["--trace", str(v.path)] if EVALUATE_TAKES_TRACE_OPTION else [str(v.path)]
        cmd = [str(BIN / "train-forecaster"), "evaluate", *trace_arg, "--score-from", score_from,
               "--json", str(out)]  # fmt: skip
        # a trace spanning 0 s (or less than the horizon) has no second to score: refusing it is right
        record("evaluate", cmd, check_eval, expect="error" if v.name in TOO_SHORT_TO_SCORE else None)
    return runs


TIMEOUT_S = 600.0  # per entry point (3× for long variants); --timeout-s


VALIDATE_REAL_JSON = ROOT / "serving/sim/profiles/validation/code_rows0-119_1rps_quiet.json"
EXTRA_ENTRIES = ("plan", "controller", "controller-config", "fleet", "tune", "validate")


def nonsense(doc: Any, where: str = "") -> list[str]:
    """JSON paths holding NaN/inf (Python's json writes them as NaN/Infinity) or a negative GPU-s/-hours."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in nonsense(v, f"{where}.{k}")]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc[:10_000]) for p in nonsense(v, f"{where}[{i}]")]
    if isinstance(doc, float) and not math.isfinite(doc):
        return [f"{where} = {doc}"]
    if isinstance(doc, int | float) and ("gpu_s" in where or "gpu_h" in where) and doc < 0:
        return [f"{where} = {doc}"]
    return []


def _accounted(doc: dict[str, Any], where: str) -> list[str]:
    """completed + rejected + unfinished == requests, dropped == 0, GPU-s > 0 in one report (``where`` names
    it)."""
    bad = []
    if _settled(doc) != doc.get("requests"):
        bad.append(f"{where}: completed {doc.get('completed')} + rejected {doc.get('rejected', 0)} + unfinished "
                   f"{doc.get('unfinished')} != requests {doc.get('requests')}")  # fmt: skip
    if doc.get("dropped"):
        bad.append(f"{where}: dropped {doc['dropped']}")
    if not (doc.get("gpu_seconds") or 0) > 0:
        bad.append(f"{where}: gpu_seconds {doc.get('gpu_seconds')}")
    return bad


def _policies_summary(doc: dict[str, Any]) -> str:
    pols = doc["policies"]
    return ", ".join(
        f"{n} {f['requests']:,} req SLO {f['slo_attainment']:.1%} {f['gpu_seconds']:,.0f} GPU-s"
        + (f" {f['unfinished']:,} unfinished" if f.get("unfinished") else "")
        + (f" {f['rejected']:,} rejected" if f.get("rejected") else "")
        for n, f in pols.items()
    )


def _json_check(out: Path, summary: Any = None) -> tuple[str, str]:
    doc = json.loads(out.read_text())
    bad = nonsense(doc)
    if isinstance(doc.get("policies"), dict):  # pdscale controller
        bad += [b for n, f in doc["policies"].items() for b in _accounted(f, n)]
    elif "requests" in doc and "completed" in doc:  # pdscale replay --fleet
        bad += _accounted(doc, "fleet")
    return ("; ".join(bad[:3]) + (f" (+{len(bad) - 3})" if len(bad) > 3 else "") if bad else "",
            summary(doc) if summary is not None else "")  # fmt: skip


def run_extra(v: Variant, work: Path, entries: set[str]) -> list[Run]:
    """The other entry points, bounded: `pdscale plan --trace`, `pdscale controller` (embedded default
    and --config with a simulator trace), `pdscale replay --fleet` (one pool), `pdscale tune` (2 trials,
    holt), `pdscale sim validate --real-json` (simulator side only). Each JSON is checked for NaN/inf."""
    runs: list[Run] = []
    if v.expect == "error":
        return runs
    slo = MOONCAKE_SLO if v.fmt == "mooncake" else []
    pd_ = str(BIN / "pdscale")

    def record(entry: str, cmd: list[str], out: Path, summary: Any = None) -> None:
        rc, text, wall, rss, cpu = _timed(cmd, 900.0)
        outcome, note = _classify(rc, text, "ok")
        if outcome == "ok":
            if not out.exists():
                outcome, note = "WRONG", f"no {out.name} written"
            else:
                problem, note = _json_check(out, summary)
                outcome = "WRONG" if problem else "ok"
                note = problem or note
        runs.append(Run(v.name, entry, outcome, round(wall, 1), round(cpu, 1), _mb(rss), note))
        print(
            f"{v.name:34s} {entry:22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}",
            flush=True,
        )

    if "plan" in entries:
        out = work / f"{v.name}.plan.json"
        ttft = "10000" if v.fmt == "mooncake" else "1000"
        record("plan --trace", [pd_, "plan", "--trace", str(v.path), "--slo-ttft-ms", ttft, "--slo-itl-ms", "50",
                                "--json", str(out)], out,
               lambda d: f"{d['prefill']}P + {d['decode']}D = {d['gpus']} GPUs ({d['sizing']})")  # fmt: skip
    if "controller" in entries:
        out = work / f"{v.name}.controller.json"
        cmd = [pd_, "controller", "--trace", str(v.path), "--json", str(out)]  # the whole trace
        record("controller (default)", cmd, out, _policies_summary)
    if "controller-config" in entries:
        cfg = work / f"{v.name}.controller.yaml"
        cfg.write_text(f"simulator:\n  trace: {v.path}\n  duration_s: 600\n")
        out = work / f"{v.name}.controller-config.json"
        record("controller --config", [pd_, "controller", "--config", str(cfg), "--json", str(out)], out,
               _policies_summary)  # fmt: skip
    if "fleet" in entries:
        fleet = work / f"{v.name}.fleet.yaml"
        ttft_ms = 10000 if v.fmt == "mooncake" else 1000
        fleet.write_text(
            f"gpu_budget: 64\npools:\n  - name: unseen\n    profile: llama3-8b/a100\n"
            f"    trace: {v.path}\n    slo_ttft_ms: {ttft_ms}\n    slo_itl_ms: 50\n"
            "    prefill: {min: 1, max: 32}\n    decode: {min: 1, max: 32}\n"
        )
        out = work / f"{v.name}.fleet.json"
        record("replay --fleet", [pd_, "replay", "--fleet", str(fleet), "--policy", "reactive", "--json", str(out)],
               out, lambda d: f"reactive, {d['requests']:,} req SLO {d['slo_attainment']:.1%} {d['gpu_seconds']:,.0f} "
               "GPU-s")  # fmt: skip
    if "tune" in entries:
        out = work / f"{v.name}.tune.json"
        db = work / f"{v.name}.tune.db"
        db.unlink(missing_ok=True)
        cmd = [pd_, "tune", "--trace", str(v.path), "--trials", "2", "--forecaster", "holt", "--duration-s", "300",
               "--chunks", "1", "--storage", f"sqlite:///{db}", "--study", v.name, "--out",
               str(work / f"{v.name}.tune.yaml"), "--json", str(out), *slo]  # fmt: skip
        record(
            "tune (2 trials)",
            cmd,
            out,
            lambda d: f"{d['trials']['complete']} complete; {d['best']['rule'][:60]}",
        )
    if "validate" in entries:
        out = work / f"{v.name}.validate.json"
        cmd = [pd_, "sim", "validate", str(v.path), "--real-json", str(VALIDATE_REAL_JSON), "--json", str(out),
               "--work-dir", str(work / "validate")]  # fmt: skip
        rc, text, wall, rss, cpu = _timed(cmd, 600.0)
        outcome, note = _classify(rc, text, "error")  # another trace's recorded run: a refusal is right
        if rc == 0:
            problem, _ = _json_check(out)
            outcome, note = ("WRONG", problem) if problem else ("ok", "slice matches the recorded run")
        runs.append(
            Run(v.name, "sim validate --real-json", outcome, round(wall, 1), round(cpu, 1), _mb(rss), note)
        )
        print(f"{v.name:34s} {'sim validate':22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}",
              flush=True)  # fmt: skip
    return runs


def eval_summary(doc: dict[str, Any]) -> tuple[str, str]:
    """(problem or '', summary) of a `train-forecaster evaluate --json` document."""
    models = doc["models"]
    bad = [
        m for m, f in models.items() if f.get("points") and not (f.get("mae") is not None and f["mae"] >= 0)
    ]
    points = {m: f.get("points", 0) for m, f in models.items()}
    uneven = "" if len(set(points.values())) == 1 else f"; models scored on unequal points {points}"
    ours = ("learned", "combined")  # the network alone, and inside the online combination: not baselines
    base = min((f["mae"], m) for m, f in models.items() if f.get("mae") is not None and m not in ours)
    lstm = models.get("learned", {}).get("mae") or float("nan")
    comb = models.get("combined", {}).get("mae")
    comb_text = "" if comb is None else f", combined {comb:.2f} (×{comb / base[0]:.2f})"
    burst = doc.get("burst") or {}
    summary = (
        f"{doc['scored_points']} pts, learned MAE {lstm:.2f} (×{lstm / base[0]:.2f}){comb_text} vs best baseline "
        f"{base[1]} {base[0]:.2f}; onsets {burst.get('onsets')}, recall {burst.get('recall') or 0:.2f}{uneven}"
    )
    return (f"bad MAE for {bad}" if bad else ""), summary


def _evaluate_takes_trace_option() -> bool:
    """Issue 4 spells `train-forecaster evaluate --trace FILE`; older code took the file as an argument."""
    cmd = [str(BIN / "train-forecaster"), "evaluate", "--help"]
    text = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    return re.search(r"--trace\b(?!-)", text) is not None


EVALUATE_TAKES_TRACE_OPTION = True  # set in main()


def _score_from(v: Variant) -> str:
    import warnings

    from serving.workload.readers import read_trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-sorted rows: already reported by the entry points themselves
        return f"+{int(read_trace(v.path).duration_s // 3)}"


def run_fit(v: Variant, work: Path, epochs: int = 2, export: bool = False) -> list[Run]:
    """`train-forecaster fit` (``epochs``, one torch thread); with ``export``, then `train-forecaster export`
    of the Lightning .ckpt it wrote. A trace too short to train on must be a clear error (exit 2)."""
    out = work / f"fit-{v.name}" if v.name != "azure_code_x0.25" else work / "fit"
    cmd = [str(BIN / "train-forecaster"), "fit", "--trace", str(v.path), "--out", str(out), "--epochs", str(epochs),
           "--threads", "1"]  # fmt: skip
    rc, text, wall, rss, cpu = _timed(cmd, 900.0)
    expect = "error" if v.expect == "error" or v.name in TOO_SHORT_TO_FIT else "ok"
    outcome, note = _classify(rc, text, expect)
    if outcome == "ok" and not (out / "forecaster.safetensors").exists():
        outcome, note = "WRONG", "no forecaster.safetensors written"
    entry = f"fit ({epochs} epochs)"
    runs = [Run(v.name, entry, outcome, round(wall, 1), round(cpu, 1), _mb(rss), note)]
    print(
        f"{v.name:34s} {entry:22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}", flush=True
    )
    ckpts = sorted((out / "lightning").rglob("*.ckpt")) if outcome == "ok" else []
    if export and ckpts:
        dest = out / "exported.safetensors"
        rc, text, wall, rss, cpu = _timed(
            [str(BIN / "train-forecaster"), "export", "--checkpoint", str(ckpts[-1]), "--out", str(dest)],
            600.0,
        )
        outcome, note = _classify(rc, text, "ok")
        if outcome == "ok" and not dest.exists():
            outcome, note = "WRONG", f"no {dest.name} written"
        runs.append(
            Run(v.name, "export", outcome, round(wall, 1), round(cpu, 1), _mb(rss), note or ckpts[-1].name)
        )
        print(
            f"{v.name:34s} {'export':22s} {outcome:11s} {wall:7.1f}s {cpu:7.1f}cpu {rss:6.0f}MB {note}",
            flush=True,
        )
    return runs


# hostile variants `fit` must refuse clearly: no span of time to cut windows from
TOO_SHORT_TO_FIT = ("hostile_one_timestamp", "hostile_single_request")
# ... and those `evaluate` must refuse: 0 s, or (Mooncake read in ms from a file in seconds) 1 s < the 5-s horizon
TOO_SHORT_TO_SCORE = (*TOO_SHORT_TO_FIT, "hostile_mooncake_seconds")
FIT_HOSTILE = ("hostile_silence_1h", "hostile_flash_crowd_x20", *TOO_SHORT_TO_FIT)


def plot_speed() -> None:
    """`pdscale replay --plot` on a day of trace: the per-bin TTFT loop (before) against ttft_bins (after)."""
    import numpy as np

    from serving.sim.plots import TTFT_BIN_S, ttft_bins

    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 86_400, 266_819))  # a day at ~3 req/s, as azure_day_3rps
    ttft = rng.lognormal(5, 1, len(arrival))
    t0 = time.process_time()
    bins = np.floor(arrival / TTFT_BIN_S).astype(np.int64)
    old = [np.percentile(ttft[(bins == b) & np.isfinite(ttft)], 99) for b in np.unique(bins)]
    t1 = time.process_time()
    new = ttft_bins(arrival, ttft, TTFT_BIN_S)[2]
    t2 = time.process_time()
    assert np.allclose(old, new)
    print(f"TTFT bins of a day ({len(arrival):,} requests, {len(new):,} bins): per-bin mask loop {t1 - t0:.2f} s CPU, "
          f"ttft_bins {t2 - t1:.2f} s CPU (same values)")  # fmt: skip


def misses(variants: list[Variant], policies: tuple[str, ...], bin_s: float) -> None:
    """Where each policy's SLO misses sit on a variant: bench/bench_misses.py's bins (requests, misses, active
    instances, the oracle's need) on the variant's file, one pool, TTFT 1 s / ITL 50 ms, shipped forecaster."""
    from bench.bench_misses import bins
    from bench.bench_policies import make, run
    from serving.sim.fleet import single_pool
    from serving.workload.readers import read_trace

    for v in variants:
        trace, fleet = read_trace(v.path), single_pool()
        for name in policies:
            rep = run(name, trace, fleet, make(name, "default", {}))
            print(f"\n{v.name} {name}: SLO {rep.slo_attainment:.2%}, GPU-s {rep.gpu_seconds:,.0f}")
            print(
                "| t s | req | missed | TTFT miss | ITL miss | active P | active D | need P | need D | need P +lead |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            for r in bins(rep, trace, fleet, bin_s):
                print(f"| {r['t']:.0f} | {r['requests']:.0f} | {r['missed']:.0f} | {r['ttft_miss']:.0f} | "
                      f"{r['itl_miss']:.0f} | {r['prefill']:.1f} | {r['decode']:.1f} | {r['need_p']:.1f} | "
                      f"{r['need_d']:.1f} | {r['ahead_p']:.1f} |")  # fmt: skip


_READ_EACH = """
import sys, warnings
from serving.workload.readers import read_trace
for path in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            t = read_trace(path)
            said = [str(w.message).replace(path, "FILE") for w in caught if "Trace" in w.category.__name__]
            print(f"read {len(t):,} rows, {t.duration_s:,.1f} s" + "".join(f"; warned: {m}" for m in said))
        except Exception as e:
            print(f"{type(e).__name__}: {str(e).replace(path, 'FILE')}")
"""


def reader_messages(variants: list[Variant], trees: list[Path]) -> None:
    """What each tree's ``read_trace`` says of each variant's file (rows read and warnings, or the error), one
    process per tree (PYTHONPATH = the tree), as a table with one column per tree."""
    said = []
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, "-c", _READ_EACH, *(str(v.path) for v in variants)]
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=tree, check=True
        )  # -c: cwd first
        said.append(done.stdout.splitlines())
    print("| variant | " + " | ".join(str(t) for t in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for i, v in enumerate(variants):
        print(f"| {v.name} | " + " | ".join(f"`{s[i][:300]}`" for s in said) + " |")


def predictive_vs_reactive(work: Path, variants: list[Variant]) -> list[str]:
    """One line per variant whose reactive and predictive replays both wrote a JSON: SLO and GPU-s of each and
    whether predictive's SLO is at or above reactive's (within 0.1 point)."""
    lines = []
    for v in variants:
        docs = {}
        for policy in ("reactive", "predictive"):
            path = work / f"{v.name}.replay.{policy}.json"
            if path.exists():
                docs[policy] = json.loads(path.read_text())
        if len(docs) < 2:
            continue
        r, p = docs["reactive"], docs["predictive"]
        verdict = "at or above" if p["slo_attainment"] >= r["slo_attainment"] - 0.001 else "BELOW"
        lines.append(
            f"{v.name}: predictive {p['slo_attainment']:.2%} / {p['gpu_seconds']:,.0f} GPU-s, reactive "
            f"{r['slo_attainment']:.2%} / {r['gpu_seconds']:,.0f} GPU-s: predictive {verdict} reactive"
        )
    return lines


def _policy_params(text: str) -> dict[str, Any]:
    """``--params`` as bench_policies.py parses it, checked against PolicyConfig now (not once per variant)."""
    if not text:
        return {}
    from bench.bench_policies import _parse_params
    from controller.config import PolicyConfig

    params = _parse_params(text)
    try:
        PolicyConfig(**params)
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise SystemExit(f"--params {text!r}: {exc}") from None
    return params


def main() -> None:
    global TIMEOUT_S, EVALUATE_TAKES_TRACE_OPTION
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/unseen"))
    ap.add_argument("--no-long", action="store_true", help="skip the hours-long variants")
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run")
    ap.add_argument(
        "--entries", default="replay:static-peak,replay:reactive,replay:predictive,bench,evaluate,fit"
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--set",
        choices=("generated", "hostile", "shapes", "all"),
        default="generated",
        help="variants: generated (realistic, from the bundled traces), hostile (edge cases), shapes (traffic "
        "shapes and exports the other sets lack), or all",
    )
    ap.add_argument(
        "--gateway-queue",
        default="off",
        help="replay entries with pdscale replay --gateway-queue: off, on, or off,on (both, side by side)",
    )
    ap.add_argument(
        "--params",
        default="",
        help="PolicyConfig overrides k=v,k=v for the replay:predictive entry (a one-pool fleet file; see above)",
    )
    ap.add_argument(
        "--summarize-evaluate",
        action="store_true",
        help="only re-read OUT/runs/*.evaluate.json and summarise",
    )
    ap.add_argument(
        "--plot-speed", action="store_true", help="only time the replay plot's TTFT binning, old loop vs new"
    )
    ap.add_argument(
        "--misses",
        action="store_true",
        help="only print where reactive's and predictive's misses sit on the --only variants (bench_misses bins)",
    )
    ap.add_argument("--bin-s", type=float, default=60.0, help="--misses: the bin width in seconds")
    ap.add_argument(
        "--reader-messages",
        nargs="*",
        type=Path,
        default=None,
        help="only print what read_trace says of each variant's file, in this tree and each tree given "
        "(e.g. a `git archive main` copy), side by side",
    )
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=TIMEOUT_S,
        help="wall seconds per entry point (3× for long variants)",
    )
    args = ap.parse_args()
    TIMEOUT_S = args.timeout_s
    if args.plot_speed:
        plot_speed()
        return
    if args.summarize_evaluate:
        for path in sorted((args.out / "runs").glob("*.evaluate.json")):
            problem, summary = eval_summary(json.loads(path.read_text()))
            print(
                f"| {path.name.removesuffix('.evaluate.json')} | evaluate | {problem or 'ok'} | {summary} |"
            )
        return
    entries = set(args.entries.split(","))
    gateways = tuple(args.gateway_queue.split(","))
    if not gateways or any(g not in ("off", "on") for g in gateways):
        ap.error(f"--gateway-queue: expected off, on or off,on, got {args.gateway_queue!r}")
    params = _policy_params(args.params)
    if params and "on" in gateways:
        ap.error("--params with --gateway-queue on: pdscale replay --fleet has no gateway queue")
    EVALUATE_TAKES_TRACE_OPTION = _evaluate_takes_trace_option()
    if not EVALUATE_TAKES_TRACE_OPTION:
        print(
            "note: `train-forecaster evaluate --trace FILE` (issue 4's spelling) is refused; passing FILE as an argument"
        )
    variants = build_variants(args.out, long=not args.no_long) if args.set in ("generated", "all") else []
    if args.set in ("hostile", "all"):
        variants += build_hostile_variants(args.out, long=not args.no_long)
    if args.set in ("shapes", "all"):
        variants += build_shape_variants(args.out, long=not args.no_long)
    if args.only:
        variants = [v for v in variants if v.name in args.only]
    if args.misses:
        misses(variants, ("reactive", "predictive"), args.bin_s)
        return
    if args.reader_messages is not None:
        reader_messages(variants, [ROOT, *args.reader_messages])
        return
    work = args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: list[Run] = []
    for v in variants:
        runs.extend(run_variant(v, work, entries, gateways, params))
        runs.extend(run_extra(v, work, entries))
    if "fit" in entries:
        small = next((v for v in variants if v.name == "azure_code_x0.25"), None)
        if small is not None:
            runs.extend(run_fit(small, work))
        for v in variants:
            if v.name in FIT_HOSTILE:
                runs.extend(run_fit(v, work, epochs=1, export="export" in entries))
    print(f"\nstarted {started}; load average now {os.getloadavg()[0]:.1f}")
    print("| variant | entry point | outcome | wall s | CPU s | peak RSS MB | figures / message |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r.variant} | {r.entry} | {r.outcome} | {r.wall_s} | {r.cpu_s} | {r.rss_mb:.0f} | {r.note} |"
        )
    for line in predictive_vs_reactive(work, variants):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    if any(r.outcome in ("CRASH", "WRONG") for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
