"""Compiled (numba) kernels for :class:`forecaster.inference.NumpyNet`'s streaming step (``kernel="numba"``).

What numpy does badly in the step, done in single passes: the LSTM cell's arithmetic (numpy makes ~10 passes
over ``[4H, nodes]``; :func:`lstm_cell` one, after numpy's SIMD ``exp``), and the attention over each node's
ring, node-major so each node's keys and values are read once, in order: :func:`ring_write` (this step's key
and value into the ring slot), :func:`ring_scores` (q·k, the empty-slot mask and the max subtracted, one pass
over the keys), numpy's SIMD ``exp`` over the scores, :func:`ring_weighted_sum` (the softmax's sum and the
weighted sum, one pass over the values); and the exact GELU's formula (``inference._gelu``) as two one-pass
kernels around numpy's ``exp`` (:func:`gelu_exponent`, :func:`gelu_finish`). The matrix products stay in BLAS, the transcendental functions in
numpy's SIMD loops (numba's ``math.exp`` / ``math.tanh`` are scalar libm calls here, 10–40× slower: measured
in docs/BENCHMARKS.md, s11n). Single-threaded.

Importing this module compiles nothing: each kernel compiles on its first call with the argument types it
gets (float32 or float64) and is cached on disk (``cache=True``: ``__pycache__`` beside this file, or
``NUMBA_CACHE_DIR``), so later processes load the machine code. :class:`NumpyNet` calls :func:`warm_up` when
it first makes a state the kernels step (``NumpyNet.compiled_for``: at ``reset`` / ``ensure_nodes``), not
inside a step. The pure-numpy step (``kernel="numpy"``)
stays the fallback when numba is missing or disabled (``PDSCALE_NUMBA=0``).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# Fast-math flags that keep infinities and NaNs meaningful (the empty ring slots are -inf): contractions into
# FMA, reassociated sums (vectorised reductions), no signed zeros, reciprocals.
_FLAGS = {"contract", "reassoc", "nsz", "arcp"}
_jit = numba.njit(cache=True, nogil=True, fastmath=_FLAGS, error_model="numpy")


@_jit
def lstm_cell(gates: Any, c: Any, hd: int) -> None:  # pragma: no cover - compiled
    """The LSTM cell's update from exponentiated pre-activations, in place.

    ``gates [4 hd, b]``: ``exp`` of ``[-i, -f, -o, -2g]`` (``NumpyNet``'s reordered, negated rows, through one
    numpy ``exp`` pass), so ``1 / (1 + ·)`` gives σ(i), σ(f), σ(o) and σ(2g), and tanh(g) = 2σ(2g) − 1.
    ``c [hd, b]`` ← f c + i tanh(g); the o rows of ``gates`` ← σ(o) (the caller forms h = σ(o) tanh(c))."""
    b = c.shape[1]
    one = c.dtype.type(1.0)
    two = c.dtype.type(2.0)
    for j in range(hd):
        gi, gf, go, gg = gates[j], gates[hd + j], gates[2 * hd + j], gates[3 * hd + j]
        cj = c[j]
        for n in range(b):
            cj[n] = cj[n] / (one + gf[n]) + (two / (one + gg[n]) - one) / (one + gi[n])
            go[n] = one / (one + go[n])


@_jit
def ring_write(qkv: Any, keys: Any, values: Any, lo: int, m: int, slot: int) -> None:  # pragma: no cover
    """This step's keys and values into ring slot ``slot``: ``qkv [3 hd, b]`` feature-major q, k, v of
    block-local nodes ``0 .. m-1`` (global ``lo + n``); ``keys [N, heads, head_dim, window]``, ``values [N,
    heads, window, head_dim]`` (node-major). A pass of its own: fused into :func:`ring_scores` (the stores into
    the rows being read), that kernel ran ~2.5× slower, and written a chunk of 8 nodes ahead inside it, 1.2×
    (docs/BENCHMARKS.md, s11n)."""
    heads, dh = keys.shape[1], keys.shape[2]
    hd = heads * dh
    for n in range(m):
        g = lo + n
        for h in range(heads):
            for d in range(dh):
                keys[g, h, d, slot] = qkv[hd + h * dh + d, n]
                values[g, h, slot, d] = qkv[2 * hd + h * dh + d, n]


@_jit
def ring_scores(
    qkv: Any, keys: Any, count: Any, lo: int, m: int, slot: int, scores: Any
) -> None:  # pragma: no cover
    """Score q against each node's ring (:func:`ring_write` has put this step's keys in slot ``slot``).

    ``qkv [3 hd, b]``: feature-major q (already scaled by 1/√head_dim) of block-local nodes ``0 .. m-1``,
    global ``lo + n``; ``keys [N, heads, head_dim, window]``: the node-major rings; ``count [N']``: steps
    consumed per node. ``scores [b, heads, window]`` ← q·k minus the node's and head's largest score over its
    filled slots, ``-inf`` for the empty ones (age ``(slot - t) mod window >= count``), ready for one
    ``np.exp`` pass."""
    heads, dh, w = keys.shape[1], keys.shape[2], keys.shape[3]
    for n in range(m):
        g = lo + n
        filled = count[g]
        for h in range(heads):
            base = h * dh
            kr = keys[g, h]
            sc = scores[n, h]
            q0 = qkv[base, n]
            for t in range(w):
                sc[t] = q0 * kr[0, t]
            for d in range(1, dh):
                qd = qkv[base + d, n]
                for t in range(w):
                    sc[t] += qd * kr[d, t]
            if filled < w:  # slots not written yet take no weight
                for t in range(w):
                    if (slot - t) % w >= filled:
                        sc[t] = -np.inf
            top = sc[slot]  # the slot written now always counts
            for t in range(w):
                top = max(top, sc[t])
            for t in range(w):
                sc[t] -= top


@_jit
def ring_weighted_sum(weights: Any, values: Any, lo: int, m: int, att: Any) -> None:  # pragma: no cover
    """The attention's output from the exponentiated scores: ``att [hd, b]`` ← Σ_t e_t v_t / Σ_t e_t per node
    and head, ``weights [b, heads, window]`` (``exp`` of :func:`ring_scores`' output, 0 for empty slots),
    ``values [N, heads, window, head_dim]`` (node ``n``'s ring is row ``lo + n``)."""
    heads, w, dh = values.shape[1], values.shape[2], values.shape[3]
    acc = np.empty(dh, att.dtype)
    for n in range(m):
        g = lo + n
        for h in range(heads):
            e = weights[n, h]
            vr = values[g, h]
            total = e[0]
            for t in range(1, w):
                total += e[t]
            for d in range(dh):
                acc[d] = e[0] * vr[0, d]
            for t in range(1, w):
                p = e[t]
                for d in range(dh):
                    acc[d] += p * vr[t, d]
            for d in range(dh):
                att[h * dh + d, n] = acc[d] / total


@_jit
def gelu_exponent(x: Any, coef: Any, out: Any, t: Any) -> None:  # pragma: no cover - compiled
    """The first half of ``NumpyNet``'s exact GELU (``inference._gelu``'s formula, row by row in one pass):
    with ``a = |x|/√2`` and ``t = 1 / (1 + a/2)``, ``out ← P(t) − a²`` (``coef``: P's coefficients from the
    highest power down) and ``t``; ``exp(out) · t`` is then erfc(a) (:func:`gelu_finish`)."""
    r = x.dtype.type(1.0 / np.sqrt(2.0))
    half, one = x.dtype.type(0.5), x.dtype.type(1.0)
    for j in range(x.shape[0]):
        xr, o, tr = x[j], out[j], t[j]
        for n in range(xr.shape[0]):
            tr[n] = one / (one + half * (abs(xr[n]) * r))
            o[n] = coef[0]
        for c in coef[1:]:
            for n in range(xr.shape[0]):
                o[n] = o[n] * tr[n] + c
        for n in range(xr.shape[0]):
            a = abs(xr[n]) * r
            o[n] -= a * a


@_jit
def gelu_finish(x: Any, out: Any, t: Any) -> None:  # pragma: no cover - compiled
    """The second half: ``out`` holds ``exp(P(t) − a²)`` (numpy's SIMD exp of :func:`gelu_exponent`'s output);
    ``out ← x/2 · erfc(a)`` where x <= 0 and ``x − x/2 · erfc(a)`` where x > 0, i.e. x Φ(x)."""
    half = x.dtype.type(0.5)
    for j in range(x.shape[0]):
        xr, o, tr = x[j], out[j], t[j]
        for n in range(xr.shape[0]):
            v = xr[n]
            g = half * v * (o[n] * tr[n])
            o[n] = v - g if v > 0 else g


def warm_up(dtype: np.dtype[Any]) -> None:
    """Call every kernel once on tiny arrays of ``dtype`` (compiling, or loading the disk cache)."""
    hd, heads, w, b = 2, 1, 2, 1
    lstm_cell(np.ones((4 * hd, b), dtype), np.zeros((hd, b), dtype), hd)
    qkv = np.zeros((3 * hd, b), dtype)
    keys, values = np.zeros((1, heads, hd, w), dtype), np.zeros((1, heads, w, hd), dtype)
    scores = np.zeros((b, heads, w), dtype)
    ring_write(qkv, keys, values, 0, 1, 0)
    ring_scores(qkv, keys, np.ones(1, np.int64), 0, 1, 0, scores)
    ring_weighted_sum(np.exp(scores), values, 0, 1, np.zeros((hd, b), dtype))
    x, out, t = np.ones((hd, b), dtype), np.zeros((hd, b), dtype), np.zeros((hd, b), dtype)
    gelu_exponent(x, np.ones(3, dtype), out, t)
    gelu_finish(x, out, t)
