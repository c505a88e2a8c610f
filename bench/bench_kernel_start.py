"""What the compiled forecaster step costs at start-up: load and first tick, cold and warm numba cache.

Usage::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_kernel_start.py --repeats 3 --nodes 8 1000

Each run is a fresh interpreter that imports ``forecaster.inference``, loads the shipped checkpoint with
``NumpyLearnedForecaster.load``, resets it to ``--nodes`` nodes (above 64 nodes the default ``kernel="auto"``
then imports numba and compiles the kernels, or loads them from the disk cache) and steps them once, then once
more: printed are the wall and CPU seconds of the import, the load + reset, the first and the second tick,
and which step ran. Three cases: ``numpy`` (``PDSCALE_NUMBA=0``), ``numba cold``
(an empty ``NUMBA_CACHE_DIR``: the first start on a machine) and ``numba warm`` (the cache the cold run left).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
from forecaster.inference import NumpyLearnedForecaster
from forecaster.types import CHANNELS
t1, c1 = time.perf_counter(), time.process_time()
f = NumpyLearnedForecaster.load(sys.argv[1])
n = int(sys.argv[2])
f.reset([str(i) for i in range(n)])
t2, c2 = time.perf_counter(), time.process_time()
x, m = np.full((n, len(CHANNELS)), 3.0), np.ones((n, len(CHANNELS)), bool)
f.step(x, m, 1.7e9)
t3, c3 = time.perf_counter(), time.process_time()
f.step(x, m, 1.7e9 + 1)
t4, c4 = time.perf_counter(), time.process_time()
print(json.dumps({"kernel": "numba" if f._ring.compiled else "numpy", "import": [t1 - t0, c1 - c0], "load": [t2 - t1, c2 - c1],
                  "tick1": [t3 - t2, c3 - c2], "tick2": [t4 - t3, c4 - c3]}))
"""

DEFAULT_CHECKPOINT = (
    Path(__file__).resolve().parents[1] / "forecaster" / "checkpoints" / "default.safetensors"
)


def run(case: str, cache: Path, nodes: int, checkpoint: Path) -> dict[str, object]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PDSCALE_NUMBA="0" if case == "numpy" else "1")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(checkpoint), str(nodes)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    res: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 1000])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    a = p.parse_args()
    rows: dict[tuple[str, int], list[dict[str, object]]] = {}
    for _ in range(a.repeats):
        for n in a.nodes:
            with tempfile.TemporaryDirectory(prefix="numba-cache-") as tmp:
                cache = Path(tmp)
                for case in ("numpy", "numba cold", "numba warm"):
                    rows.setdefault((case, n), []).append(run(case, cache, n, a.checkpoint))
    print(
        "| case | nodes | step run | import, CPU s | load + reset, CPU s (wall) | first tick, CPU ms | second tick, CPU ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for (case, n), rs in rows.items():

        def med(key: str, i: int, rs: list[dict[str, object]] = rs) -> float:
            return float(np.median([r[key][i] for r in rs]))  # type: ignore[index]

        print(
            f"| {case} | {n} | {rs[0]['kernel']} | {med('import', 1):.2f} | {med('load', 1):.2f} "
            f"({med('load', 0):.2f}) | {1e3 * med('tick1', 1):.1f} | {1e3 * med('tick2', 1):.1f} |"
        )


if __name__ == "__main__":
    main()
