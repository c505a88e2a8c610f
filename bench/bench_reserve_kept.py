"""The burst reserve on the tick that opens a need block: recomputed over every block (``burst_reserve``, what
main does) against the kept final lead peaks (``burst_reserve_kept`` with the pool's ``need_peaks``).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_reserve_kept.py [--blocks 61 720]
[--calls 300] [--rounds 3]``. Per history length: one pool is ticked through ``burst_reserve_stage`` (1-s
ticks, 3 req/s ± 50 % of 1,000-token prompts, the shipped ``PolicyConfig`` but ``burst_reserve='active'``)
until it remembers that many blocks, a new block is opened, and both calls are timed on it, alternating,
``--rounds`` rounds of ``--calls`` calls each (CPU µs per call, ``time.thread_time``; median over rounds).
It also checks that both give the same reserve, bit for bit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.config import PolicyConfig
from controller.policy import PoolState, stages
from controller.policy.types import LeadPeaks, PoolCapacity, PoolObservation

CAP = PoolCapacity(prefill_tps=10_000.0, decode_seqs=64.0, decode_tps=2_000.0, gpus_per_instance=1)


def _obs(t: float, rps: float) -> PoolObservation:
    one = {"prefill": 1, "decode": 1}
    return PoolObservation(
        pool="p", now_s=t, replicas=one, active=one, standby={"prefill": 0, "decode": 0}, provisioning=one,
        arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0, running_seqs=rps * 2.0,
        waiting_requests=0.0, oldest_wait_s=0.0, kv_usage=0.5, mean_prompt_tokens=1000.0, mean_output_tokens=100.0,
    )  # fmt: skip


def _cpu_us(f: Callable[[], object], calls: int) -> float:
    t0 = time.thread_time()
    for _ in range(calls):
        f()
    return (time.thread_time() - t0) / calls * 1e6


Args = tuple[tuple[tuple[float, float, float, int], ...], float, float, float, float | None]


def _pair(a: Args, final: LeadPeaks, calls: int, rounds: int) -> tuple[float, float]:
    """Median CPU µs per call over ``rounds`` of: the reserve recomputed, the reserve with ``final`` kept."""
    full, kept = [], []
    for _ in range(rounds):
        full.append(_cpu_us(lambda: stages.burst_reserve(*a), calls))
        kept.append(_cpu_us(lambda: stages.burst_reserve_kept(*a, final), calls))
    return statistics.median(full), statistics.median(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[61, 720])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = PolicyConfig(burst_reserve="active")
    print(
        "| blocks remembered | lead peaks kept | recomputed, CPU µs/call | kept, CPU µs/call | kept / recomputed |"
    )
    print("|---|---|---|---|---|")
    for n_blocks in args.blocks:
        cfg_n = cfg.model_copy(
            update={"burst_window_s": max(n_blocks * stages.NEED_BLOCK_S, cfg.burst_window_s)}
        )
        state, rng = PoolState(), np.random.default_rng(0)
        for i in range(n_blocks * 5):
            rps = 3.0 * rng.uniform(0.5, 1.5)
            *_, state, _ = stages.burst_reserve_stage(1, 1, _obs(1000.0 + i, rps), CAP, cfg_n, state)
        blocks = (*state.need_blocks, (state.need_blocks[-1][0] + stages.NEED_BLOCK_S, 0.3, 0.3, 1))
        a: Args = (
            blocks,
            cfg_n.provision_lead_s,
            cfg_n.burst_quantile,
            cfg_n.headroom,
            cfg_n.burst_peak_quantile,
        )
        if stages.burst_reserve(*a) != stages.burst_reserve_kept(*a, state.need_peaks)[0]:
            raise SystemExit("the kept peaks give another reserve: a bug")
        f, k = _pair(a, state.need_peaks, args.calls, args.rounds)
        print(f"| {len(blocks)} | {len(state.need_peaks.rows) // 40} | {f:.0f} | {k:.0f} | {k / f:.2f} |")


if __name__ == "__main__":
    main()
