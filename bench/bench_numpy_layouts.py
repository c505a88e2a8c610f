"""``NumpyNet``'s step (forecaster/inference.py) under several layouts, stepped alternately on the same inputs: the
evidence for ``DEFAULT_BLOCK`` and ``DEFAULT_SMALL_N``.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/bench_numpy_layouts.py --nodes 8 64 1000 10000 --layouts
1024:64 1024:0 100000:0 512:0``. Each layout is ``block:small_n`` (``NumpyNet(block=, small_n=)``: up to
``small_n`` nodes one block with node-major rings; above it, equal blocks of at most ``block`` nodes; a block
larger than the node count is no blocking). The shipped checkpoint's weights, random encoded inputs, after
``window + 5`` warm-up ticks; per layout the network step's CPU time (``time.thread_time``), median and p90.
The layouts' outputs are checked to agree (float32 products summed in another order: 1e-5).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from forecaster.checkpoint import read_checkpoint
from forecaster.inference import NumpyNet

CKPT = Path(__file__).resolve().parents[1] / "forecaster" / "checkpoints" / "default.safetensors"


def run(
    n: int, ticks: int, layouts: list[tuple[int, int]], seed: int = 0
) -> dict[tuple[int, int], list[float]]:
    data = read_checkpoint(CKPT)
    nets = {lay: NumpyNet(data.weights, data.net_config, block=lay[0], small_n=lay[1]) for lay in layouts}
    states = {lay: net.new_state(n) for lay, net in nets.items()}
    rng = np.random.default_rng(seed)
    warm = data.net_config.window + 5
    cpu: dict[tuple[int, int], list[float]] = {lay: [] for lay in layouts}
    for t in range(warm + ticks):
        z = rng.standard_normal((n, data.net_config.n_inputs)).astype(np.float32)
        outs = []
        for lay, net in nets.items():
            c0 = time.thread_time()
            outs.append(net.step(states[lay], z, t)[0])
            if t >= warm:
                cpu[lay].append(time.thread_time() - c0)
        for lay, out in zip(layouts[1:], outs[1:], strict=True):
            np.testing.assert_allclose(out, outs[0], atol=1e-5, err_msg=f"layout {lay}")
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 1000, 10000])
    ap.add_argument("--layouts", nargs="+", default=["1024:64", "1024:0", "100000:0"])
    ap.add_argument("--ticks", type=int, default=40)
    args = ap.parse_args()
    layouts = [(int(b), int(s)) for b, s in (x.split(":") for x in args.layouts)]
    print(f"load average before {os.getloadavg()}")
    for n in args.nodes:
        cpu = run(n, args.ticks if n <= 2000 else max(args.ticks // 4, 10), layouts)
        cells = [
            f"{b}:{s} {np.median(v) * 1e3:.3f} (p90 {np.percentile(v, 90) * 1e3:.3f})"
            for (b, s), v in cpu.items()
        ]
        print(f"{n:>6} nodes, network step CPU ms, block:small_n: " + " | ".join(cells))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
