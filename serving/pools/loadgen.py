"""Open-loop load generator: replay a trace's arrival times and lengths against an OpenAI completions endpoint.

Each request is sent at its trace arrival time (divided by ``time_scale``) whatever the state of earlier
ones (open loop, as real clients behave), streams its response, and records:

- TTFT: send → first streamed chunk that carries output;
- mean ITL: (last chunk − first chunk) / (completion tokens − 1), vLLM's "time per output token". Chunks,
  not tokens, are timed: under load vLLM may pack several tokens in one chunk, so the token count comes
  from the final ``usage`` record.

Prompts are lists of token ids drawn (seeded) from the tiny model's ordinary vocabulary, so a trace row of
``n`` prompt tokens is exactly ``n`` prompt tokens on the server (no re-tokenisation drift, no BOS added).
``max_tokens`` is the row's output length with ``ignore_eos`` so generation runs to it. Random ids also keep
vLLM's prefix cache from turning the replay into cache hits.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from serving.workload.trace import Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StreamResult:
    """One streamed completion as the client saw it. Times are seconds on the generator's clock."""

    sent_s: float
    chunk_s: tuple[float, ...]  # arrival time of every chunk that carried output
    completion_tokens: int  # from the usage record (0 when the stream failed before it)
    error: str = ""  # '' on success
    chunk_tokens: tuple[int, ...] = ()  # tokens per chunk, when the body asked for ``return_token_ids``

    @property
    def ttft_s(self) -> float:
        return self.chunk_s[0] - self.sent_s if self.chunk_s and not self.error else math.nan

    @property
    def itl_mean_s(self) -> float:
        if self.error or len(self.chunk_s) < 2 or self.completion_tokens < 2:
            return math.nan
        return (self.chunk_s[-1] - self.chunk_s[0]) / (self.completion_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.chunk_s[-1] - self.sent_s if self.chunk_s and not self.error else math.nan


def _quantiles_ms(values_s: FloatArray, qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float]:
    ok = values_s[np.isfinite(values_s)]
    if ok.size == 0:
        return {f"p{round(q * 100)}": math.nan for q in qs}
    return {f"p{round(q * 100)}": float(np.quantile(ok, q) * 1e3) for q in qs}


@dataclass(frozen=True, eq=False)
class RequestTimings:
    """Per-request client-side timings of one replay, aligned with the replayed trace's rows.

    NaN marks what was not measured (a failed request; ITL of a one-token output), never zero.
    """

    scheduled_s: FloatArray  # intended send time, seconds after the replay started
    sent_s: FloatArray  # actual send time (lags scheduled_s when the client itself falls behind)
    ttft_s: FloatArray
    itl_mean_s: FloatArray
    e2e_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray  # requested (max_tokens)
    completion_tokens: IntArray  # received, per the server's usage record
    errors: tuple[str, ...]  # '' where the request succeeded
    wall_s: float  # replay duration, first send to last response

    def __len__(self) -> int:
        return len(self.ttft_s)

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        return np.array([e == "" for e in self.errors], dtype=bool)

    def summary(self) -> dict[str, Any]:
        """JSON-ready percentiles in milliseconds, counts and throughput."""
        n_ok = int(self.ok.sum())
        return {
            "requests": len(self),
            "completed": n_ok,
            "failed": len(self) - n_ok,
            "ttft_ms": _quantiles_ms(self.ttft_s),
            "itl_ms": _quantiles_ms(self.itl_mean_s),
            "e2e_ms": _quantiles_ms(self.e2e_s),
            "send_lag_ms_max": float(np.max(self.sent_s - self.scheduled_s, initial=0.0) * 1e3),
            "wall_s": self.wall_s,
            "throughput_rps": n_ok / self.wall_s if self.wall_s > 0 else math.nan,
            "output_tokens_per_s": float(self.completion_tokens.sum()) / self.wall_s
            if self.wall_s > 0
            else math.nan,
            "first_errors": [e for e in self.errors if e][:3],
        }


def make_prompts(prompt_tokens: npt.ArrayLike, vocab_ids: npt.ArrayLike, seed: int = 0) -> list[list[int]]:
    """One list of token ids per row, each of exactly that row's length (at least 1), seeded."""
    lengths = np.maximum(np.asarray(prompt_tokens, dtype=np.int64), 1)
    vocab = np.asarray(vocab_ids, dtype=np.int64)
    if vocab.size == 0:
        raise ValueError("make_prompts: vocab_ids is empty")
    rng = np.random.default_rng(seed)
    flat = vocab[rng.integers(0, vocab.size, size=int(lengths.sum()))]
    return [chunk.tolist() for chunk in np.split(flat, np.cumsum(lengths)[:-1])]


def completion_body(
    prompt: list[int], max_tokens: int, *, model: str = "tiny", stream: bool = True
) -> dict[str, Any]:
    """The /v1/completions request body the generator sends (greedy, runs to ``max_tokens``)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max(int(max_tokens), 1),
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_completion(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    clock: Callable[[], float] = time.monotonic,
) -> StreamResult:
    """POST one streaming completion and time its chunks. Errors are returned, not raised."""
    chunks: list[float] = []
    per_chunk: list[int] = []
    tokens = 0
    sent = clock()
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                return StreamResult(sent, (), 0, f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                now = clock()
                msg = json.loads(payload)
                choices = msg.get("choices")
                if choices:
                    chunks.append(now)
                    per_chunk.append(len(choices[0].get("token_ids") or ()))
                usage = msg.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens", 0))
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return StreamResult(sent, tuple(chunks), tokens, f"{type(exc).__name__}: {exc}", tuple(per_chunk))
    if not chunks:
        return StreamResult(sent, (), tokens, "stream ended without output")
    return StreamResult(sent, tuple(chunks), tokens, "", tuple(per_chunk))


async def replay(
    base_url: str,
    trace: Trace,
    vocab_ids: npt.ArrayLike,
    *,
    time_scale: float = 1.0,
    model: str = "tiny",
    seed: int = 0,
    request_timeout_s: float = 300.0,
    clock: Callable[[], float] = time.monotonic,
) -> RequestTimings:
    """Replay ``trace`` (arrival times relative to its first row, divided by ``time_scale``) against
    ``base_url`` and return every request's timings. ``time_scale=2`` sends twice as fast."""
    if not time_scale > 0:
        raise ValueError(f"replay time_scale: must be > 0, got {time_scale}")
    n = len(trace)
    arrival = np.asarray(trace.arrival_s, dtype=np.float64)
    scheduled = (arrival - arrival[0]) / time_scale if n else np.zeros(0)
    prompts = make_prompts(trace.prompt_tokens, vocab_ids, seed)
    outputs = np.maximum(np.asarray(trace.output_tokens, dtype=np.int64), 1)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s), limits=limits) as client:
        t0 = clock()

        async def one(i: int) -> StreamResult:
            delay = t0 + float(scheduled[i]) - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            return await stream_completion(
                client, base_url, completion_body(prompts[i], int(outputs[i]), model=model), clock
            )

        results = await asyncio.gather(*(one(i) for i in range(n)))
        wall = clock() - t0
    return RequestTimings(
        scheduled_s=scheduled,
        sent_s=np.array([r.sent_s - t0 for r in results], dtype=np.float64),
        ttft_s=np.array([r.ttft_s for r in results], dtype=np.float64),
        itl_mean_s=np.array([r.itl_mean_s for r in results], dtype=np.float64),
        e2e_s=np.array([r.e2e_s for r in results], dtype=np.float64),
        prompt_tokens=np.array([len(p) for p in prompts], dtype=np.int64),
        output_tokens=outputs,
        completion_tokens=np.array([r.completion_tokens for r in results], dtype=np.int64),
        errors=tuple(r.error for r in results),
        wall_s=wall,
    )


def run_replay(base_url: str, trace: Trace, vocab_ids: npt.ArrayLike, **kwargs: Any) -> RequestTimings:
    """Synchronous ``replay`` (runs its own event loop; call from plain code, not from a running loop)."""
    return asyncio.run(replay(base_url, trace, vocab_ids, **kwargs))


@dataclass(frozen=True)
class MetricsSnapshot:
    """Flat samples of one /metrics scrape: ``(name, sorted label pairs) -> value``."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def total(self, name: str, **labels: str) -> float:
        """Sum over every series of ``name`` whose labels include ``labels`` (NaN when none exists)."""
        want = set(labels.items())
        hits = [v for (n, lab), v in self.values.items() if n == name and want <= set(lab)]
        return float(sum(hits)) if hits else math.nan

    def names(self) -> set[str]:
        return {n for n, _ in self.values}


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition (as vLLM serves it) with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return MetricsSnapshot(values)


def scrape(base_url: str, timeout_s: float = 10.0) -> MetricsSnapshot:
    """GET ``{base_url}/metrics`` and parse it."""
    resp = httpx.get(f"{base_url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_metrics(resp.text)
