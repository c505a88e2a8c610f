"""Simulator speed: replay 1 h of Poisson arrivals at 30 req/s on 16 instances (8 prefill + 8 decode).

Prompt and output lengths are drawn (seeded) from the bundled Azure 2023 conversation trace, so the load
is realistic: ~37k prompt tokens/s and ~6k generated tokens/s. The latency model is the real one for
``llama3-8b/a100``. Prints wall and CPU seconds (``time.process_time``), counts, peak RSS and the load
average; ``--profile`` adds cProfile.

``--stall-fraction P --stall-ms S`` prices seeded decode stalls (the cpu-tiny ``decode_stall_*`` terms) on
top of that model, to measure what the stall term costs the simulator.

Run: .venv/bin/python bench/bench_sim.py [--duration-s 3600] [--rate-rps 30] [--profile]
     [--stall-fraction 0.05 --stall-ms 100]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.sim.engine import default_models
from serving.sim.fleet import single_pool
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.sim.replay_cli import default_trace_path
from serving.workload.readers import read_trace
from serving.workload.trace import Trace


def bench_trace(duration_s: float, rate_rps: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    source = read_trace(default_trace_path())
    n = int(duration_s * rate_rps * 1.1) + 10
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    arrival = arrival[arrival < duration_s] - arrival[0]
    pick = rng.integers(0, len(source), len(arrival))
    return Trace.from_arrays(
        arrival, source.prompt_tokens[pick], source.output_tokens[pick], source=f"poisson {rate_rps} rps"
    )


class _Stalled:
    """A latency model with decode stall terms added (everything else delegated)."""

    def __init__(self, inner: Any, fraction: float, stall_ms: float) -> None:
        self.inner = inner
        self.decode_stall_fraction = fraction
        self.decode_stall_ms = stall_ms
        self.decode_stall_seed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--rate-rps", type=float, default=30.0)
    ap.add_argument("--prefill", type=int, default=8)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="print the top cProfile entries")
    ap.add_argument("--stall-fraction", type=float, default=0.0, help="decode steps that stall (0: none)")
    ap.add_argument("--stall-ms", type=float, default=0.0, help="what a stalled decode step costs more")
    args = ap.parse_args()
    trace = bench_trace(args.duration_s, args.rate_rps)
    fleet = single_pool(prefill=args.prefill, decode=args.decode)
    policy = make_policy("fixed", PolicyOptions(prefill=args.prefill, decode=args.decode))
    prof = cProfile.Profile() if args.profile else None
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    if prof:
        prof.enable()
    models = None
    if args.stall_fraction > 0 and args.stall_ms > 0:

        def models(name: str) -> tuple[Any, Any]:
            profile, latency = default_models(name)
            return profile, _Stalled(latency, args.stall_fraction, args.stall_ms)

    report = replay(fleet, {"default": trace}, policy, models=models)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = {
        "requests": report.requests,
        "completed": report.completed,
        "sim_end_s": report.sim_end_s,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": round(rss_mb, 1),
        "requests_per_cpu_s": round(report.requests / cpu, 0),
        "ttft_ms": report.ttft_ms,
        "itl_ms": report.itl_ms,
        "slo_attainment": report.slo_attainment,
        "preemptions": report.preemptions,
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "stall": {"fraction": args.stall_fraction, "ms": args.stall_ms},
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(out, indent=2))
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
