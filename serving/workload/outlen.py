"""Output-length prediction from what is known when a request arrives (issue 8).

What is known at arrival: the prompt length, the model, the client id when the client sends one, and the
request's ``max_tokens`` when it sets one. The output length itself is known only once the request has
completed, so the predictor learns from completions only (:meth:`OutputLengthPredictor.observe`), never
from the request it is predicting.

The model, three layers, each shrunk towards the one above it:

1. **global**: the running mean of every output seen so far;
2. **bucket**: the running mean of the outputs of the same model and prompt-length bucket (buckets are
   powers of two of ``1 + prompt_tokens``, ``bucket_log2_width`` octaves wide), shrunk towards the global
   mean as if ``bucket_prior`` requests at the global mean had been seen in the bucket;
3. **client**: when a client id is present, the bucket estimate times the client's running ratio of
   observed to estimated outputs, shrunk towards 1 with ``client_prior`` pseudo-requests.

Finally the estimate is clipped to ``max_tokens`` when the request sets one. Two statistics are kept side by
side: ``kind="mean"`` (arithmetic means, what a decode-demand estimate sums) and ``kind="typical"`` (the same
chain on ``log1p(tokens)``, an additive client residual, back-transformed: about the median of a log-normal
length, the better point estimate under absolute error, and what routing compares).

Costs: :meth:`predict` and :meth:`observe` are O(1) dictionary look-ups. :func:`prequential` computes, for
a whole trace at once and without a per-row Python loop, exactly what predicting each row and then observing
it, in row order, gives (grouped exclusive cumulative sums). Unknown is NaN: with nothing observed yet a
prediction is NaN (the caller falls back to ``max_tokens`` or treats the request as not known to be long).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["mean", "typical"]
KINDS: tuple[str, ...] = ("mean", "typical")
MAX_BUCKET = 63


@dataclass(frozen=True)
class OutlenConfig:
    """Settings of :class:`OutputLengthPredictor`.

    ``bucket_log2_width``: octaves of ``1 + prompt_tokens`` per bucket (1.0: 1-2, 2-4, ... 1024-2048 tokens;
    prompt length explains little of the output in chat traces, so finer buckets only add noise).
    ``bucket_prior``: pseudo-requests at the global mean in every bucket (a bucket with 20 real requests
    is half its own mean). ``client_prior``: pseudo-requests at ratio 1 in every client's history.
    ``max_clients``: the client table is emptied when it would grow past this (bounded memory on a proxy
    that sees unbounded client ids; the batch :func:`prequential` keeps every client).
    """

    bucket_log2_width: float = 1.0
    bucket_prior: float = 20.0
    client_prior: float = 5.0
    max_clients: int = 100_000

    def __post_init__(self) -> None:
        errors = []
        if not self.bucket_log2_width > 0:
            errors.append(f"bucket_log2_width={self.bucket_log2_width} must be > 0")
        if not self.bucket_prior >= 0:
            errors.append(f"bucket_prior={self.bucket_prior} must be >= 0")
        if not self.client_prior > 0:
            errors.append(
                f"client_prior={self.client_prior} must be > 0 (it keeps a new client's ratio finite)"
            )
        if self.max_clients < 1:
            errors.append(f"max_clients={self.max_clients} must be >= 1")
        if errors:
            raise ValueError("invalid OutlenConfig: " + "; ".join(errors))


def prompt_bucket(prompt_tokens: np.ndarray | int, log2_width: float = 1.0) -> np.ndarray:
    """Bucket index ``floor(log2(1 + prompt) / log2_width)`` in ``[0, 63]`` (negative prompts count as 0)."""
    p = np.maximum(np.asarray(prompt_tokens, dtype=np.float64), 0.0)
    out: np.ndarray = np.minimum(np.floor(np.log2(1.0 + p) / log2_width), MAX_BUCKET).astype(np.int64)
    return out


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")


def _clip(pred: float, max_tokens: float) -> float:
    return min(pred, max_tokens) if max_tokens > 0 else pred  # NaN max_tokens compares False: no cap


class OutputLengthPredictor:
    """Online predictor of output tokens; one object per router (or per simulated fleet).

    ``model`` and ``client`` are any hashable keys (a model name or code, a client id string); ``None``
    means not given. Example::

        p = OutputLengthPredictor()
        p.observe(512, 200, model="llama3-8b", client="team-a")
        p.predict(480, model="llama3-8b", client="team-a", max_tokens=128)  # 128.0: clipped
    """

    def __init__(self, config: OutlenConfig | None = None) -> None:
        self.config = config or OutlenConfig()
        self.observed = 0
        self._sum = 0.0
        self._sum_log = 0.0
        self._buckets: dict[tuple[Hashable, int], list[float]] = {}  # -> [n, sum, sum_log]
        self._clients: dict[Hashable, list[float]] = {}  # -> [sum y, sum estimate, sum log residual, n]

    @property
    def mean_output_tokens(self) -> float:
        """Mean of every output observed (NaN before the first): "longer than usual" means above it."""
        return self._sum / self.observed if self.observed else math.nan

    def _bucket_key(self, prompt_tokens: int, model: Hashable) -> tuple[Hashable, int]:
        return model, int(prompt_bucket(prompt_tokens, self.config.bucket_log2_width))

    def _base(self, key: tuple[Hashable, int]) -> tuple[float, float]:
        """Bucket estimates (mean, mean of log1p) shrunk towards the global ones; NaN before any data."""
        if self.observed == 0:
            return math.nan, math.nan
        g, g_log = self._sum / self.observed, self._sum_log / self.observed
        w = self.config.bucket_prior
        n, s, s_log = self._buckets.get(key, (0.0, 0.0, 0.0))
        if n + w == 0:
            return g, g_log
        return (s + w * g) / (n + w), (s_log + w * g_log) / (n + w)

    def predict(
        self,
        prompt_tokens: int,
        *,
        model: Hashable = None,
        client: Hashable = None,
        max_tokens: float = math.nan,
        kind: Kind = "mean",
    ) -> float:
        """Predicted output tokens (float, >= 0); NaN when nothing has been observed yet."""
        _check_kind(kind)
        base, base_log = self._base(self._bucket_key(prompt_tokens, model))
        if math.isnan(base):
            return math.nan
        k = self.config.client_prior
        c = self._clients.get(client) if client is not None else None
        if kind == "mean":
            g = self._sum / self.observed
            pred = base * ((c[0] + k * g) / (c[1] + k * g)) if c is not None and g > 0 else base
        else:
            pred = math.expm1(base_log + (c[2] / (c[3] + k) if c is not None else 0.0))
        return _clip(max(pred, 0.0), max_tokens)

    def observe(
        self, prompt_tokens: int, output_tokens: int, *, model: Hashable = None, client: Hashable = None
    ) -> None:
        """Learn from one completed request (its real output length)."""
        y = float(max(output_tokens, 0))
        y_log = math.log1p(y)
        key = self._bucket_key(prompt_tokens, model)
        if client is not None and self.observed > 0:
            base, base_log = self._base(key)
            c = self._clients.get(client)
            if c is None:
                if len(self._clients) >= self.config.max_clients:
                    self._clients.clear()
                c = self._clients[client] = [0.0, 0.0, 0.0, 0.0]
            c[0] += y
            c[1] += base
            c[2] += y_log - base_log
            c[3] += 1.0
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = [0.0, 0.0, 0.0]
        b[0] += 1.0
        b[1] += y
        b[2] += y_log
        self.observed += 1
        self._sum += y
        self._sum_log += y_log


def _group_exclusive_cumsum(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Row i: the sum of ``values`` over rows j < i with ``keys[j] == keys[i]`` (``values`` [n] or [n, k])."""
    n = len(keys)
    if n == 0:
        return np.zeros_like(values, dtype=np.float64)
    order = np.argsort(keys, kind="stable")
    v = np.asarray(values, dtype=np.float64)[order]
    excl = np.cumsum(v, axis=0) - v
    sk = keys[order]
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    new_group[1:] = sk[1:] != sk[:-1]
    first = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    out = np.empty_like(excl)
    out[order] = excl - excl[first]
    return out


def _codes(values: np.ndarray | None, n: int, name: str) -> np.ndarray:
    if values is None:
        return np.full(n, -1, dtype=np.int64)
    arr = np.asarray(values)
    if len(arr) != n:
        raise ValueError(f"prequential: {name} has {len(arr)} rows, prompt_tokens has {n}")
    if arr.dtype.kind not in "iu":
        _, inverse = np.unique(arr, return_inverse=True)  # strings etc.: codes; None-like not supported
        return inverse.astype(np.int64)
    return arr.astype(np.int64)


def prequential(
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    *,
    model: np.ndarray | None = None,
    client: np.ndarray | None = None,
    max_tokens: np.ndarray | None = None,
    config: OutlenConfig | None = None,
    kind: Kind = "mean",
) -> np.ndarray:
    """Row i's prediction by a fresh :class:`OutputLengthPredictor` that has observed rows ``0..i-1``.

    ``model``: int codes (-1 = not given) or labels; ``client``: int ids with -1 = no client id, or labels
    (every label a client); ``max_tokens``: per-row cap, NaN or <= 0 = none. Vectorised (a few sorts and
    cumulative sums). Row 0 is NaN (nothing observed yet). Equals predicting then observing row by row.
    """
    _check_kind(kind)
    cfg = config or OutlenConfig()
    p = np.asarray(prompt_tokens, dtype=np.int64)
    y = np.maximum(np.asarray(output_tokens, dtype=np.float64), 0.0)
    n = len(p)
    if len(y) != n:
        raise ValueError(f"prequential: output_tokens has {len(y)} rows, prompt_tokens has {n}")
    models = _codes(model, n, "model")
    clients = _codes(client, n, "client")
    y_log = np.log1p(y)
    seen = np.arange(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = np.concatenate(([np.nan], np.cumsum(y)[:-1])) / seen if n else y
        g_log = np.concatenate(([np.nan], np.cumsum(y_log)[:-1])) / seen if n else y
        # models may be any int (including -1): shift into non-negative keys before combining with buckets
        key = (models - models.min(initial=0)) * (MAX_BUCKET + 1) + prompt_bucket(p, cfg.bucket_log2_width)
        b = _group_exclusive_cumsum(key, np.stack([np.ones(n), y, y_log], axis=1))
        w = cfg.bucket_prior
        denom = b[:, 0] + w
        base = np.where(denom > 0, (b[:, 1] + w * g) / denom, g)
        base_log = np.where(denom > 0, (b[:, 2] + w * g_log) / denom, g_log)
        has = clients >= 0 if client is None or np.asarray(client).dtype.kind in "iu" else np.ones(n, bool)
        known = has & ~np.isnan(base)  # rows that feed a client's history (as observe() does)
        contrib = np.where(known[:, None], np.stack([y, base, y_log - base_log, np.ones(n)], axis=1), 0.0)
        c = _group_exclusive_cumsum(np.where(has, clients, -1), contrib)
        c = np.where(has[:, None], c, 0.0)
        k = cfg.client_prior
        if kind == "mean":
            ratio = np.where(has & (g > 0), (c[:, 0] + k * g) / (c[:, 1] + k * g), 1.0)
            pred = base * ratio
        else:
            pred = np.expm1(base_log + np.where(has, c[:, 2] / (c[:, 3] + k), 0.0))
    pred = np.maximum(pred, 0.0)
    if max_tokens is not None:
        cap = np.asarray(max_tokens, dtype=np.float64)
        if len(cap) != n:
            raise ValueError(f"prequential: max_tokens has {len(cap)} rows, prompt_tokens has {n}")
        pred = np.where(cap > 0, np.minimum(pred, cap), pred)
    return np.asarray(pred, dtype=np.float64)


def prequential_group_mean(output_tokens: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """The trivial baselines: row i's prediction = mean output of earlier rows of its group (NaN when
    none). ``group=None``: the global running mean; a client id array: the per-client running mean."""
    y = np.maximum(np.asarray(output_tokens, dtype=np.float64), 0.0)
    keys = np.zeros(len(y), dtype=np.int64) if group is None else _codes(group, len(y), "group")
    s = _group_exclusive_cumsum(keys, np.stack([np.ones(len(y)), y], axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(s[:, 0] > 0, s[:, 1] / s[:, 0], np.nan), dtype=np.float64)
