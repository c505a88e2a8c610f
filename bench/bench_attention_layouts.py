"""The streaming attention's two contractions over each node's ring, in the layouts numpy can run them: which is
cheapest per node, by node count (what forecaster/inference.py's ``NumpyNet`` chose from).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/bench_attention_layouts.py [--nodes 8 64 1000 4000]``. The
default network's sizes (4 heads × 16, window 60, hidden 64), float32, random data; CPU ms per 1,000 nodes
(median of ``--reps``) of the scores (query · every key in the ring) plus the weighted sum of the values:

- ``feature-major einsum``: keys ``[heads, window, head_dim, N]``, values ``[heads, head_dim, window, N]``,
  nodes along the contiguous axis; ``np.einsum`` (what the step runs above ``DEFAULT_SMALL_N`` nodes).
- ``node-major matmul``: keys ``[N, heads, head_dim, window]``, values ``[N, heads, window, head_dim]``;
  stacked ``np.matmul`` of ``[N, heads, 1, ·]`` (what it runs up to ``DEFAULT_SMALL_N``).
- ``absorbed einsum`` / ``absorbed matmul``: the ring holds only the top layer's outputs ``h_j`` (64 floats a
  slot instead of 128 for k and v: half the memory read); the scores are ``(W_k,h^T q_h) · h_j`` (``q_h ·
  b_k,h`` is the same for every slot, so the softmax drops it) and the output ``W_v,h (Σ_j a_hj h_j) + b_v,h``.
  Four times the multiply-adds in the contractions (every head against all 64 features); the two small
  products around them (``W_k^T q``, ``W_v u``) are not timed, so these rows are a lower bound.

Each variant's attention output is checked against the feature-major one (relative 1e-4, float32) before it is
timed, so the rows compute the same thing.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

HEADS, HEAD_DIM, WINDOW = 4, 16, 60
HIDDEN = HEADS * HEAD_DIM


def _cpu_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        c0 = time.thread_time()
        fn()
        times.append(time.thread_time() - c0)
    return float(np.median(times)) * 1e3


def _softmax(scores: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=axis, keepdims=True))
    out: np.ndarray = e / e.sum(axis=axis, keepdims=True)
    return out


def variants(n: int, rng: np.random.Generator) -> dict[str, tuple[Callable[[], np.ndarray], np.ndarray]]:
    """Each variant: a function running both contractions (and the softmax between) → its output ``[HIDDEN,
    n]``, and that output in the feature-major order for the check."""
    f32 = np.float32
    h = rng.standard_normal((WINDOW, HIDDEN, n)).astype(f32)  # ring of top-layer outputs, feature-major
    wk, wv = ((rng.standard_normal((HIDDEN, HIDDEN)) / 8).astype(f32) for _ in range(2))
    bk, bv = (rng.standard_normal(HIDDEN).astype(f32) for _ in range(2))
    q = rng.standard_normal((HIDDEN, n)).astype(f32) / 4
    k = np.einsum("oc,tcn->ton", wk, h) + bk[None, :, None]  # [window, HIDDEN, n]
    v = np.einsum("oc,tcn->ton", wv, h) + bv[None, :, None]
    k_fm = np.ascontiguousarray(k.reshape(WINDOW, HEADS, HEAD_DIM, n).transpose(1, 0, 2, 3))
    v_fm = np.ascontiguousarray(v.reshape(WINDOW, HEADS, HEAD_DIM, n).transpose(1, 2, 0, 3))
    k_nm = np.ascontiguousarray(k_fm.transpose(3, 0, 2, 1))  # [n, heads, head_dim, window]
    v_nm = np.ascontiguousarray(v_fm.transpose(3, 0, 2, 1))  # [n, heads, window, head_dim]
    q_fm = q.reshape(HEADS, HEAD_DIM, n)
    q_nm = np.ascontiguousarray(q_fm.transpose(2, 0, 1))[:, :, None, :]
    # absorbed: q̃_h = W_k,h^T q_h [heads, HIDDEN, n]; ring of h node-major too [n, window, HIDDEN]
    qt = np.einsum("hdc,hdn->hcn", wk.reshape(HEADS, HEAD_DIM, HIDDEN), q_fm)
    qt_nm = np.ascontiguousarray(qt.transpose(2, 0, 1))
    h_nm = np.ascontiguousarray(h.transpose(2, 0, 1))
    wv_h = wv.reshape(HEADS, HEAD_DIM, HIDDEN)

    def feature_major() -> np.ndarray:
        a = _softmax(np.einsum("hdn,htdn->htn", q_fm, k_fm), axis=1)
        out: np.ndarray = np.einsum("htn,hdtn->hdn", a, v_fm)
        return out.reshape(HIDDEN, n)

    def node_major() -> np.ndarray:
        a = _softmax(np.matmul(q_nm, k_nm), axis=-1)
        out: np.ndarray = np.matmul(a, v_nm)  # [n, heads, 1, head_dim]
        return out

    def absorbed_einsum() -> np.ndarray:
        a = _softmax(np.einsum("hcn,tcn->htn", qt, h), axis=1)
        out: np.ndarray = np.einsum("htn,tcn->hcn", a, h)  # u_h [heads, HIDDEN, n]
        return out

    def absorbed_matmul() -> np.ndarray:
        a = _softmax(np.matmul(qt_nm, h_nm.transpose(0, 2, 1)), axis=-1)  # [n, heads, window]
        out: np.ndarray = np.matmul(a, h_nm)  # [n, heads, HIDDEN]
        return out

    def from_u(u: np.ndarray) -> np.ndarray:  # u [heads, HIDDEN, n] → W_v,h u_h + b_v,h, feature-major
        out: np.ndarray = np.einsum("hdc,hcn->hdn", wv_h, u) + bv.reshape(HEADS, HEAD_DIM, 1)
        return out.reshape(HIDDEN, n)

    def values_to_fm(out: np.ndarray) -> np.ndarray:
        return out.reshape(n, HIDDEN).T

    return {
        "feature-major einsum": (feature_major, feature_major()),
        "node-major matmul": (node_major, values_to_fm(node_major())),
        "absorbed einsum": (absorbed_einsum, from_u(absorbed_einsum())),
        "absorbed matmul": (absorbed_matmul, from_u(absorbed_matmul().transpose(1, 2, 0))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 1000, 4000])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    print(f"load average before {os.getloadavg()}")
    rng = np.random.default_rng(0)
    for n in args.nodes:
        runs = variants(n, rng)
        ref = runs["feature-major einsum"][1]
        cells = []
        for name, (fn, out) in runs.items():
            np.testing.assert_allclose(
                out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()), err_msg=name
            )
            cells.append(f"{name} {_cpu_ms(fn, args.reps) * 1000 / n:7.2f}")
        print(f"{n:>6} nodes, CPU ms per 1,000 nodes: " + " | ".join(cells))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
