"""Where the torch-free network step's time goes, stage by stage, for the numpy and the compiled step.

Usage::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/bench_numpy_stages.py --nodes 1000 10000 --ticks 20

``NumpyNet.step`` on the shipped checkpoint's weights (random encoded inputs, after ``window + 10`` warm-up
ticks so the rings are full), with ``kernel="numpy"`` and ``kernel="numba"`` alternating tick by tick; each
stage is timed with ``time.thread_time`` around its call: ``lstm`` (both layers: the products, and numpy's or
the compiled cell update), ``attention`` (the q/k/v product, ring write, scores, softmax, weighted sum),
within it the compiled kernels ``ring write``, ``scores`` and ``weighted sum`` (the ``exp`` between them is
numpy's), ``gelu``, and ``rest`` (the trunk and head products, the inputs' copy, the outputs' decoding). CPU
ms per tick, medians over ``--ticks``. The ring bytes read per tick (keys and values: ``2 × hidden × window ×
4`` bytes a node) are printed beside, with the fastest ``np.sum`` over as many float32 (the time to stream
them once: the memory-traffic floor of the attention).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import forecaster.inference as inference
from forecaster.checkpoint import read_checkpoint
from forecaster.inference import NumpyNet

DEFAULT_CHECKPOINT = (
    Path(__file__).resolve().parents[1] / "forecaster" / "checkpoints" / "default.safetensors"
)


class _Timed:
    """Attributes of ``inner`` whose names are in ``names``, wrapped to add their CPU time to ``acc``."""

    def __init__(self, inner: Any, names: dict[str, str], acc: dict[str, float]) -> None:
        self._inner, self._names, self._acc = inner, names, acc

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)
        return _wrap(self._names[name], fn, self._acc) if name in self._names else fn


def _wrap(stage: str, fn: Callable[..., Any], acc: dict[str, float]) -> Callable[..., Any]:
    def timed(*a: Any, **k: Any) -> Any:
        c0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            acc[stage] = acc.get(stage, 0.0) + time.thread_time() - c0

    return timed


def _read_ms(floats: int, reps: int = 10) -> float:
    """The fastest of ``reps`` ``np.sum`` passes over ``floats`` float32 (fresh array, so not cached when it
    is larger than the last-level cache): the time to stream the rings once, the attention's floor."""
    x = np.ones(floats, np.float32)
    best = np.inf
    for _ in range(reps):
        c0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - c0)
    return 1e3 * float(best)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--ticks", type=int, default=20)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    a = p.parse_args()
    data = read_checkpoint(a.checkpoint)
    cfg = data.net_config
    stages = ("lstm", "attention", "ring write", "scores", "weighted sum", "gelu", "rest", "total")
    print(f"| nodes | kernel | {' | '.join(stages)} | ring read per tick |")
    print("|---|---|" + "---|" * (len(stages) + 1))
    for n in a.nodes:
        nets = {k: NumpyNet(data.weights, cfg, kernel=k, small_n=0) for k in ("numpy", "numba")}
        acc: dict[str, dict[str, float]] = {k: {} for k in nets}
        per_tick: dict[str, list[dict[str, float]]] = {k: [] for k in nets}
        states = {k: net.new_state(n) for k, net in nets.items()}
        for k, net in nets.items():
            for meth, stage in (
                ("_lstm", "lstm"),
                ("_attend", "attention"),
                ("_attend_compiled", "attention"),
            ):
                setattr(net, meth, _wrap(stage, getattr(net, meth), acc[k]))
            if net._kernels is not None:
                names = {
                    "ring_write": "ring write",
                    "ring_scores": "scores",
                    "ring_weighted_sum": "weighted sum",
                }
                names |= {"gelu_exponent": "gelu", "gelu_finish": "gelu"}
                net._kernels = _Timed(net._kernels, names, acc[k])
        gelu = inference._gelu
        rng = np.random.default_rng(0)
        zs = [rng.standard_normal((n, cfg.n_inputs)).astype(np.float32) for _ in range(7)]
        warm = cfg.window + 10
        for t in range(warm + a.ticks):
            for k, net in nets.items():
                acc[k].clear()
                inference._gelu = _wrap("gelu", gelu, acc[k])  # type: ignore[assignment]
                c0 = time.thread_time()
                net.step(states[k], zs[t % len(zs)], t)
                acc[k]["total"] = time.thread_time() - c0
                inference._gelu = gelu  # type: ignore[assignment]
                if t >= warm:
                    row = dict(acc[k])
                    row["rest"] = row["total"] - sum(row.get(s, 0.0) for s in ("lstm", "attention", "gelu"))
                    per_tick[k].append(row)
        ring_mb = n * 2 * cfg.hidden * cfg.window * 4 / 1e6
        floor_ms = _read_ms(n * 2 * cfg.hidden * cfg.window)
        for k, rows in per_tick.items():
            cells = []
            for s in stages:
                vals = [r[s] for r in rows if s in r]
                cells.append(f"{1e3 * float(np.median(vals)):.2f}" if vals else "—")
            print(f"| {n} | {k} | {' | '.join(cells)} | {ring_mb:.1f} MB ({floor_ms:.2f} ms to read once) |")


if __name__ == "__main__":
    main()
