"""The burst runs' work on the tick that opens a need block: the completed blocks' median
(``stages.block_median`` with the pool's ``PoolState.block_median`` carried) and ``update_burst_runs`` (with no
run known and the history younger than its window, as in a pool's first hour: the leading run is judged).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_block_median.py [--blocks 61 744]
[--opens 300] [--rounds 3]``. Per history length: 1-s ticks of a need 3 ± 50 % per role fill that many
blocks, then ``--opens`` more blocks are opened one by one; each open is timed (CPU µs, ``time.thread_time``)
with the median cache carried from the last, and its median checked against the median sorted anew. Median
over ``--rounds`` rounds. Needs only functions main had before the kept sorted totals, so the same script
times either tree (``PYTHONPATH=TREE``, the script copied into it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.policy import stages
from controller.policy.types import BlockMedian

Blocks = tuple[tuple[float, float, float, int], ...]


def _opens(n_blocks: int, opens: int, seed: int) -> tuple[list[Blocks], float]:
    """The blocks at each of ``opens`` block openings after ``n_blocks`` blocks, and the window kept."""
    keep_s = n_blocks * stages.NEED_BLOCK_S
    rng = np.random.default_rng(seed)
    blocks: Blocks = ()
    out: list[Blocks] = []
    for i in range(int((n_blocks + opens) * stages.NEED_BLOCK_S)):
        need = (3.0 * rng.uniform(0.5, 1.5), 3.0 * rng.uniform(0.5, 1.5))
        blocks, opened = stages.update_need_blocks(blocks, 1000.0 + i, need, keep_s)
        if opened and i >= n_blocks * stages.NEED_BLOCK_S:
            out.append(blocks)
    return out, keep_s * 2


def _round(seq: list[Blocks], keep_s: float) -> float:
    cache, spent = BlockMedian(), 0.0
    for blocks in seq:
        t0 = time.thread_time()
        median, cache = stages.block_median(blocks[:-1], cache)
        stages.update_burst_runs((), blocks, 0.3, keep_s, median)
        spent += time.thread_time() - t0
        if median != stages._median(stages.block_totals(blocks[:-1])):
            raise SystemExit("the kept median is not the median: a bug")
    return spent / len(seq) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[61, 744])
    ap.add_argument("--opens", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| completed blocks | block opens | CPU µs per open (median, update_burst_runs) |")
    print("|---|---|---|")
    for n in args.blocks:
        seq, keep_s = _opens(n, args.opens, 0)
        us = statistics.median(_round(seq, keep_s) for _ in range(args.rounds))
        print(f"| {len(seq[-1]) - 1} | {len(seq)} | {us:.1f} |")


if __name__ == "__main__":
    main()
