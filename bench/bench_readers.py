"""Reader throughput: rows/s for a generated Azure CSV (default 10M rows), Mooncake JSONL and BurstGPT CSV.

Usage: .venv/bin/python bench/bench_readers.py [--rows 10000000] [--chunk-rows N] [--json out.json]

Files are generated in a temp dir (not timed) and read with ``iter_trace_chunks`` in a fresh process with
pyarrow limited to one thread (timed: wall and CPU seconds). The reader's peak RSS shows that it streams.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from serving.workload.readers import DEFAULT_CHUNK_ROWS
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace


def _azure_block(rng: np.random.Generator, n: int) -> bytes:
    """n rows from 2023-11-16 18:00, Poisson-ish gaps (mean 1 ms), 7-digit fractions, CRLF."""
    t0 = np.datetime64("2023-11-16T18:00:00", "ns")
    ticks = np.cumsum(rng.integers(0, 20_000, n))  # 100 ns ticks: 1M rows span about 1000 s
    stamps = np.datetime_as_string(t0 + (ticks * 100).astype("timedelta64[ns]"), unit="ns")
    text = np.char.replace(stamps.astype("U27"), "T", " ")
    p = rng.integers(1, 8000, n).astype("U6")
    o = rng.integers(1, 1000, n).astype("U6")
    lines = np.char.add(np.char.add(np.char.add(np.char.add(text, ","), p), ","), o)
    return ("\r\n".join(lines.tolist()) + "\r\n").encode()


def make_azure(path: Path, rows: int, block_rows: int = 1_000_000, seed: int = 0) -> None:
    """The real Azure layout; block k repeats block 0 one day later (2023-11-16 + k days), so times rise."""
    rng = np.random.default_rng(seed)
    block = _azure_block(rng, min(rows, block_rows))
    with path.open("wb") as f:
        f.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        for k, start in enumerate(range(0, rows, block_rows)):
            day = f"2023-11-{16 + k:02d}" if k < 15 else f"2023-12-{k - 14:02d}"
            n = min(block_rows, rows - start)
            body = block if n == block_rows else _azure_block(rng, n)
            f.write(body.replace(b"2023-11-16", day.encode()) if k else body)


def time_read(path: Path, chunk_rows: int) -> dict[str, float]:
    """Read in a fresh process, so its peak RSS (VmHWM, reset by exec) is the reader's own."""
    code = (
        "import json, re, sys, time; from serving.workload.readers import iter_trace_chunks; "
        "import pyarrow as pa; pa.set_cpu_count(1); pa.set_io_thread_count(1); "
        "w, c = time.perf_counter(), time.process_time(); "
        "n = sum(len(x) for x in iter_trace_chunks(sys.argv[1], chunk_rows=int(sys.argv[2]))); "
        "print(json.dumps([n, time.perf_counter() - w, time.process_time() - c, "
        "int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(chunk_rows)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    rows, wall, cpu, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "rows": rows,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "rows_per_s_wall": round(rows / wall),
        "rows_per_cpu_s": round(rows / cpu),
        "mb_per_s_wall": round(path.stat().st_size / wall / 1e6, 1),
        "reader_peak_rss_mb": round(rss),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, object] = {"machine": f"{platform.node()} {os.cpu_count()} cpus, shared, noisy"}
    with tempfile.TemporaryDirectory() as d:
        az = Path(d) / "azure.csv"
        t = time.perf_counter()
        make_azure(az, args.rows)
        results["generate_azure_s"] = round(time.perf_counter() - t, 1)
        results["azure"] = time_read(az, args.chunk_rows)
        az.unlink()
        small = generate(SyntheticParams(duration_s=20_000, rate_rps=50, burst_multiplier=1), seed=1)
        for fmt in ("mooncake", "burstgpt"):
            p = write_trace(small, Path(d) / f"small.{fmt}", fmt)
            results[fmt] = time_read(p, args.chunk_rows)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
