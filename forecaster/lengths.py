"""The length guard: a node whose requests are far longer (or shorter) than any the network was trained on is
forecast from its arrivals alone (numpy only: the controller imports this without torch).

Why. The token channels (prompt and generation tokens per second, counted at arrival) enter the network as
rates. A pool whose mean prompt is 8,000 tokens, when training saw 130-5,800, feeds it token rates at an
arrival rate it never saw them with, and the arrival forecast goes wrong with them: the shipped checkpoint's
next-5-s arrivals MAE on the 1 <-> 24 req/s sinusoid with ~8,000-token prompts is 46.9 with the token channels
and 9.9 with them hidden (Holt: 7.9), on Mooncake (~15,000-token prompts) 13.4 against 4.7
(docs/BENCHMARKS.md, "The length guard"). Hidden channels are in the training distribution (training masks each
channel in 10 % of its sequences), so the network is asked what it was taught to answer.

The rule, per node and per step:

* the node's **trailing mean lengths**, prompt and output tokens per request, are the ratios of causal EWMAs
  (half-life :data:`LENGTH_HALFLIFE_S`) of the token rates and the arrival rate, over the steps where all
  three are observed (a step with any of them unknown changes neither sum; the ratio stays as it was);
  unknown (NaN) until :data:`LENGTH_MIN_ARRIVALS` requests have been counted on such steps;
* when either known length lies outside the checkpoint's :class:`LengthRange` (the range of the same trailing
  lengths over its training series, recorded at fit time in the checkpoint's ``meta.length_range``), the
  network sees that step with its prompt and generation channels masked, and the node's token forecasts
  are its arrival quantiles times the trailing lengths (the p90 of the tokens = the p90 of the arrivals ×
  the mean length: the length is the slow part, the count the noisy one);
* otherwise nothing changes: a node inside the range gets exactly the unguarded network's forecasts.

A checkpoint without ``meta.length_range`` (older than the guard) runs unguarded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from forecaster.features import FeatureError

#: The trailing lengths' half-life (seconds): a pool's length mix, not one request's.
LENGTH_HALFLIFE_S = 600.0
#: Requests counted before a node's trailing lengths are known (one long prompt is not a pool's length).
LENGTH_MIN_ARRIVALS = 10.0
#: The quantiles of the training series' trailing lengths that bound a checkpoint's range.
LENGTH_QUANTILES = (0.005, 0.995)
#: The raw channels the guard reads: the arrival rate, then the two token rates.
LENGTH_CHANNELS = ("arrival_rps", "prompt_tps", "gen_tps")
TOKEN_CHANNELS = LENGTH_CHANNELS[1:]  # what the guard hides (and training's MaskingConfig.token_prob)
_MAX_RATE = 1e12  # as forecaster.features: larger is not a measurement


@dataclass(frozen=True)
class LengthRange:
    """Mean tokens per request (prompt; output) a checkpoint was trained on, each as ``(low, high)``."""

    prompt: tuple[float, float]
    output: tuple[float, float]

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            lo, hi = getattr(self, name)
            if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 <= lo <= hi):
                raise FeatureError(f"LengthRange.{name} must be finite with 0 <= low <= high, got {(lo, hi)}")

    def to_doc(self) -> dict[str, Any]:
        """JSON form, as written to a checkpoint's ``meta.length_range``."""
        return {
            "prompt": [float(self.prompt[0]), float(self.prompt[1])],
            "output": [float(self.output[0]), float(self.output[1])],
            "halflife_s": LENGTH_HALFLIFE_S,
            "min_arrivals": LENGTH_MIN_ARRIVALS,
            "quantiles": list(LENGTH_QUANTILES),
        }

    @classmethod
    def from_doc(cls, doc: Any) -> LengthRange:
        """Read :meth:`to_doc`'s form; a malformed one is a :class:`FeatureError` naming the field."""
        if not isinstance(doc, Mapping):
            raise FeatureError(f"meta.length_range must be an object, got {type(doc).__name__}")
        pair: dict[str, tuple[float, float]] = {}
        for name in ("prompt", "output"):
            value = doc.get(name)
            if not (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2):
                raise FeatureError(f"meta.length_range.{name} must be [low, high], got {value!r}")
            try:
                pair[name] = (float(value[0]), float(value[1]))
            except (TypeError, ValueError) as exc:
                raise FeatureError(f"meta.length_range.{name} must be two numbers, got {value!r}") from exc
        return cls(prompt=pair["prompt"], output=pair["output"])

    def outside(self, lengths: np.ndarray) -> np.ndarray:
        """``lengths [..., 2]`` (prompt, output; NaN = unknown) → bool ``[...]``: a known length out of range."""
        p, o = np.asarray(lengths)[..., 0], np.asarray(lengths)[..., 1]
        with np.errstate(invalid="ignore"):
            out_p = (p < self.prompt[0]) | (p > self.prompt[1])
            out_o = (o < self.output[0]) | (o > self.output[1])
        result: np.ndarray = out_p | out_o  # NaN compares False: unknown is never outside
        return result


def length_range_of(meta: Mapping[str, Any] | None) -> LengthRange | None:
    """The :class:`LengthRange` a checkpoint's ``meta`` records (None when it has none: an unguarded model)."""
    if not meta or meta.get("length_range") is None:
        return None
    return LengthRange.from_doc(meta["length_range"])


def _decay(step_s: float) -> float:
    return float(0.5 ** (step_s / LENGTH_HALFLIFE_S))


def _columns(channels: Sequence[str]) -> list[int] | None:
    if any(c not in channels for c in LENGTH_CHANNELS):
        return None
    return [list(channels).index(c) for c in LENGTH_CHANNELS]


def _terms(x_raw: np.ndarray, mask: np.ndarray, cols: list[int], step_s: float) -> np.ndarray:
    """``[..., C]`` → ``[..., 3]``: the per-step totals of arrivals, prompt and generation tokens where all
    three are observed (else 0)."""
    v = np.asarray(x_raw, dtype=np.float64)[..., cols] * step_s
    with np.errstate(invalid="ignore"):
        ok = (np.asarray(mask, dtype=bool)[..., cols] & np.isfinite(v) & (v >= 0) & (v <= _MAX_RATE)).all(
            axis=-1
        )
    out: np.ndarray = np.where(ok[..., None], v, 0.0)
    return out


def _lengths_from(sums: np.ndarray, counted: np.ndarray) -> np.ndarray:
    a = sums[..., 0]
    known = (counted >= LENGTH_MIN_ARRIVALS) & (a > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.stack([sums[..., 1] / a, sums[..., 2] / a], axis=-1)
    return np.where(known[..., None], out, np.nan)


class LengthState:
    """Streaming trailing lengths: 3 decayed sums and one count per node, one update per tick for all nodes."""

    def __init__(self, n_nodes: int, channels: Sequence[str], step_s: float = 1.0) -> None:
        self.cols = _columns(channels)
        self.step_s = float(step_s)
        self.decay = _decay(step_s)
        self.sums = np.zeros((n_nodes, 3))
        self.counted = np.zeros(n_nodes)

    def update(self, x_raw: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Consume one step ``[N, C]`` → the trailing lengths ``[N, 2]`` (prompt, output; NaN = unknown)."""
        if self.cols is None:
            return np.full((self.sums.shape[0], 2), np.nan)
        t = _terms(x_raw, mask, self.cols, self.step_s)
        self.sums = self.decay * self.sums + (1.0 - self.decay) * t
        self.counted = self.counted + t[..., 0]  # requests counted, not decayed
        return _lengths_from(self.sums, self.counted)

    def keep(self, old: LengthState, dst: np.ndarray, src: np.ndarray) -> None:
        """Copy nodes ``src`` of ``old`` into rows ``dst`` (node churn: kept nodes keep their lengths)."""
        self.sums[dst] = old.sums[src]
        self.counted[dst] = old.counted[src]


def length_series(
    x_raw: np.ndarray, mask: np.ndarray, channels: Sequence[str], step_s: float = 1.0
) -> np.ndarray:
    """The trailing lengths at every step of whole series: ``[..., T, C]`` → ``[..., T, 2]`` (causal; equal
    to feeding the steps one by one to :class:`LengthState`)."""
    from scipy.signal import lfilter

    x_raw = np.asarray(x_raw)
    cols = _columns(channels)
    if cols is None:
        return np.full((*x_raw.shape[:-1], 2), np.nan)
    d = _decay(step_s)
    t = _terms(x_raw, mask, cols, step_s)
    sums = np.asarray(lfilter([1.0 - d], [1.0, -d], t, axis=-2))
    return _lengths_from(sums, np.cumsum(t[..., 0], axis=-1))


def guarded_mask(mask: np.ndarray, outside: np.ndarray, channels: Sequence[str]) -> np.ndarray:
    """``mask [..., C]`` with the token channels hidden where ``outside [...]`` (a copy when any is)."""
    if not np.any(outside):
        return np.asarray(mask, dtype=bool)
    hide = np.array([c in TOKEN_CHANNELS for c in channels], dtype=bool)
    out: np.ndarray = np.asarray(mask, dtype=bool) & ~(np.asarray(outside)[..., None] & hide)
    return out


def guarded_totals(
    totals: np.ndarray, outside: np.ndarray, lengths: np.ndarray, targets: Sequence[str]
) -> None:
    """In place: where ``outside [...]``, the token targets' quantiles ``totals [..., K, Q]`` become the
    arrivals' × the trailing mean lengths ``[..., 2]``."""
    if not np.any(outside):
        return
    ts = list(targets)
    if "arrivals" not in ts:
        return
    arr = totals[..., ts.index("arrivals"), :]
    for k, target in enumerate(("prompt_tokens", "gen_tokens")):
        if target in ts:
            j = ts.index(target)
            totals[..., j, :] = np.where(
                outside[..., None], arr * lengths[..., k][..., None], totals[..., j, :]
            )


def training_length_range(
    series: Sequence[tuple[np.ndarray, np.ndarray]], channels: Sequence[str], step_s: float = 1.0
) -> LengthRange | None:
    """The :class:`LengthRange` of training series ``[(x_raw [T, C], mask [T, C]), ...]``: the
    :data:`LENGTH_QUANTILES` of their trailing lengths over every step where they are known (None when no
    step has known lengths, e.g. series without token channels)."""
    prompt: list[np.ndarray] = []
    output: list[np.ndarray] = []
    for x, m in series:
        lens = length_series(x, m, channels, step_s)
        ok = np.isfinite(lens).all(axis=-1)
        prompt.append(lens[ok, 0])
        output.append(lens[ok, 1])
    p = np.concatenate(prompt) if prompt else np.zeros(0)
    o = np.concatenate(output) if output else np.zeros(0)
    if p.size == 0:
        return None
    lo, hi = LENGTH_QUANTILES
    return LengthRange(
        prompt=(float(np.quantile(p, lo)), float(np.quantile(p, hi))),
        output=(float(np.quantile(o, lo)), float(np.quantile(o, hi))),
    )
