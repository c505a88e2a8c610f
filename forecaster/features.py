"""Model inputs and targets, shared by training and the controller (numpy only: no torch here).

Pipeline, per node:

1. raw channels ``x_raw[..., T, C]`` in ``CHANNELS`` order (rates per second, latencies in seconds) plus a
   boolean ``mask`` (True = observed). Built from a ``MetricFrame`` by :func:`frame_to_inputs` or from a
   request trace by :func:`series_from_trace` + :func:`trace_inputs`.
2. :class:`Normalizer` (fitted on TRAINING data only) maps each channel through ``log1p`` (counts, rates,
   latencies) or identity (KV usage, a 0..1 fraction) and standardises it.
3. :func:`encode_inputs` (a sequence) or :func:`encode_step` (one tick, all nodes) concatenates
   ``[normalised values, masks, time features]`` into float32 ``[..., F_in]``. An unobserved value is
   written as 0 (the training mean) AND flagged 0 in its mask channel, so an outage is distinguishable from
   idle (idle = observed 0 requests/s, which normalises to a non-zero value with mask 1).

Targets (:func:`future_sums`, :func:`trace_targets`) are totals over ``(t, t + horizon_s]``; the network
predicts them in normalised space ``(log1p(total) - target_mean) / target_std`` (see ``Normalizer``).
Quantiles commute with monotone maps, so a p90 learned in that space decodes to the p90 of the total.

Level-relative schemas (version 3, ``FeatureSchema.level_halflife_s > 0``, :data:`LEVEL_SCHEMA`): the three
rate channels and the targets are taken relative to the node's own trailing level in log space
(``log1p(x) - log1p(level)``, ``log1p(total) - log1p(horizon_s * level)``) before standardising, and the
arrival level itself is one extra input; see "Level-relative encoding" below. A rate level never seen in
training then maps to familiar inputs, and the decoded totals follow the level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from forecaster.types import CHANNELS, TARGETS, MetricFrame

FEATURE_SCHEMA_VERSION = 1
#: Schema version 2 adds per-pool workload descriptors (``FeatureSchema.descriptors``); version-1 schemas
#: (no descriptors) stay valid, so older checkpoints load unchanged.
POOL_SCHEMA_VERSION = 2
#: Schema version 3 adds level-relative rate inputs and targets (``FeatureSchema.level_halflife_s``); older
#: schemas (absolute inputs) stay valid, so older checkpoints load and run unchanged.
LEVEL_SCHEMA_VERSION = 3

# Level-relative encoding (schema v3, see ``level_series``): the extra input appended last, the trailing
# arrival level on a fixed affine map (no fitted statistics: a rate never seen in training is encoded the
# same way, not standardised by training data): (log1p(level req/s) - 2) / 2 → 1 req/s ≈ -0.65, 100 ≈ 1.3.
LEVEL_FEATURE = "arrival_level"
LEVEL_SOURCES: tuple[str, ...] = ("own", "arrivals")
_LEVEL_CENTER, _LEVEL_SCALE = 2.0, 2.0
# Rates above this are not measurements (garbage such as 1e300): they never enter a level.
_MAX_RATE = 1e12

# Per-pool workload descriptors: exponentially weighted over the node's own history (half-life
# POOL_HALFLIFE_S), computed by the forecaster itself from the arrival / token rate channels (see
# ``descriptor_series`` and ``DescriptorState``), so they need no input from the caller and generalise to
# pools never seen in training (unlike a pool-id embedding).
POOL_DESCRIPTORS: tuple[str, ...] = ("pool_dispersion", "pool_prompt_len", "pool_output_len")
POOL_HALFLIFE_S = 600.0

# Time features computed from ``now_s`` (seconds since the Unix epoch, UTC): time of day on the unit circle.
TIME_FEATURES: tuple[str, ...] = ("tod_sin", "tod_cos")
_DAY_S = 86_400.0

# Channels that are fractions in [0, 1] and are standardised without log1p.
_LINEAR_CHANNELS = frozenset({"kv_usage"})

# Metric names (the vLLM / pdscale names; kept here because forecaster imports nothing of ours).
ROUTER_REQUESTS_TOTAL = "pdscale:router_requests_total"
PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "vllm:generation_tokens_total"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"

# channel -> (metric name, kind). A frame may also carry a channel under its own name (e.g. "ttft_p90_s"
# precomputed by a source); that takes precedence and is used as a gauge.
METRIC_SOURCES: dict[str, tuple[str, str]] = {
    "arrival_rps": (ROUTER_REQUESTS_TOTAL, "counter"),
    "prompt_tps": (PROMPT_TOKENS_TOTAL, "counter"),
    "gen_tps": (GENERATION_TOKENS_TOTAL, "counter"),
    "running": (NUM_REQUESTS_RUNNING, "gauge"),
    "waiting": (NUM_REQUESTS_WAITING, "gauge"),
    "kv_usage": (KV_CACHE_USAGE_PERC, "gauge"),
}


# A normalised input further than this from 0 is not a measurement (see Normalizer.normalize_inputs).
MAX_ABS_Z = 1e6


#: The input channel that measures each target's rate (the baseline skip smooths it, see
#: forecaster.network; the level-relative encoding divides by its trailing level).
TARGET_CHANNELS: dict[str, str] = {
    "arrivals": "arrival_rps",
    "prompt_tokens": "prompt_tps",
    "gen_tokens": "gen_tps",
}


class FeatureError(ValueError):
    """Inputs that cannot be turned into features; the message names the argument or field."""


@dataclass(frozen=True)
class FeatureSchema:
    """What the network's input vector holds, in order: values, then masks, then time features.

    ``masked[i]`` says whether channel ``channels[i]`` gets a mask channel (default: all do).
    ``step_s`` is the spacing of the input series (one LSTM step per ``step_s``).
    """

    channels: tuple[str, ...] = CHANNELS
    masked: tuple[bool, ...] = (True,) * len(CHANNELS)
    time_features: tuple[str, ...] = TIME_FEATURES
    targets: tuple[str, ...] = TARGETS
    step_s: float = 1.0
    version: int = FEATURE_SCHEMA_VERSION
    descriptors: tuple[str, ...] = ()
    #: > 0: level-relative encoding (schema v3) with a trailing level of this half-life (seconds); 0 = off.
    level_halflife_s: float = 0.0
    #: Whose level each target is relative to: ``"own"`` (its own rate channel's) or ``"arrivals"`` (the
    #: arrival rate's, for all: token inputs then read as tokens per request, token targets follow arrivals).
    level_of: str = "own"

    def __post_init__(self) -> None:
        if self.level_of not in LEVEL_SOURCES:
            raise FeatureError(
                f"FeatureSchema.level_of must be one of {LEVEL_SOURCES}, got {self.level_of!r}"
            )
        if not (self.level_halflife_s >= 0 and math.isfinite(self.level_halflife_s)):
            raise FeatureError(
                f"FeatureSchema.level_halflife_s must be >= 0 seconds (0 = off), got {self.level_halflife_s}"
            )
        if self.level_halflife_s > 0:
            if self.version < LEVEL_SCHEMA_VERSION:
                raise FeatureError(
                    f"FeatureSchema.level_halflife_s needs version >= {LEVEL_SCHEMA_VERSION}, got version "
                    f"{self.version}"
                )
            lacking = [
                t
                for t in self.targets
                if TARGET_CHANNELS.get(t) is None or TARGET_CHANNELS[t] not in self.channels
            ]
            if lacking or "arrivals" not in self.targets:
                raise FeatureError(
                    f"FeatureSchema.level_halflife_s: every target needs its rate channel ({TARGET_CHANNELS}) "
                    f"and 'arrivals' must be a target; targets {list(self.targets)} lack {lacking}, "
                    f"channels {list(self.channels)}"
                )
        bad = [d for d in self.descriptors if d not in POOL_DESCRIPTORS]
        if bad or len(set(self.descriptors)) != len(self.descriptors):
            raise FeatureError(
                f"FeatureSchema.descriptors: unknown or repeated {list(self.descriptors)}, known {list(POOL_DESCRIPTORS)}"
            )
        if self.descriptors and self.version < POOL_SCHEMA_VERSION:
            raise FeatureError(
                f"FeatureSchema.descriptors need version >= {POOL_SCHEMA_VERSION}, got version {self.version}"
            )
        if self.descriptors and any(c not in self.channels for c in _DESCRIPTOR_INPUTS):
            raise FeatureError(
                f"FeatureSchema.descriptors are computed from {list(_DESCRIPTOR_INPUTS)}; channels "
                f"{list(self.channels)} lack some"
            )
        if len(self.masked) != len(self.channels):
            raise FeatureError(
                f"FeatureSchema.masked has {len(self.masked)} flags for {len(self.channels)} channels"
            )
        unknown = [f for f in self.time_features if f not in TIME_FEATURES]
        if unknown:
            raise FeatureError(f"FeatureSchema.time_features: unknown {unknown}, known {list(TIME_FEATURES)}")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise FeatureError(
                f"FeatureSchema.step_s must be a positive number of seconds, got {self.step_s}"
            )

    @property
    def n_inputs(self) -> int:
        """Width ``F_in`` of the encoded input vector."""
        return (
            len(self.channels)
            + sum(self.masked)
            + len(self.time_features)
            + len(self.descriptors)
            + int(self.level_halflife_s > 0)
        )

    @property
    def level_relative(self) -> bool:
        """Whether rate inputs and targets are encoded relative to a trailing level (schema v3)."""
        return self.level_halflife_s > 0

    @property
    def input_names(self) -> tuple[str, ...]:
        """Name of every column of the encoded input, in order."""
        masks = tuple(f"{c}_mask" for c, m in zip(self.channels, self.masked, strict=True) if m)
        level = (LEVEL_FEATURE,) if self.level_relative else ()
        return self.channels + masks + self.time_features + self.descriptors + level

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels": list(self.channels),
            "masked": list(self.masked),
            "time_features": list(self.time_features),
            "targets": list(self.targets),
            "step_s": self.step_s,
            "version": self.version,
            **({"descriptors": list(self.descriptors)} if self.descriptors else {}),
            **(
                {"level_halflife_s": self.level_halflife_s, "level_of": self.level_of}
                if self.level_relative
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureSchema:
        missing = [
            k for k in ("channels", "masked", "time_features", "targets", "step_s", "version") if k not in d
        ]
        if missing:
            raise FeatureError(f"feature schema dict lacks field(s) {missing}")
        return cls(
            channels=tuple(str(c) for c in d["channels"]),
            masked=tuple(bool(m) for m in d["masked"]),
            time_features=tuple(str(f) for f in d["time_features"]),
            targets=tuple(str(t) for t in d["targets"]),
            step_s=float(d["step_s"]),
            version=int(d["version"]),
            descriptors=tuple(str(x) for x in d.get("descriptors", ())),
            level_halflife_s=float(d.get("level_halflife_s", 0.0)),
            level_of=str(d.get("level_of", "own")),
        )

    def diff(self, other: FeatureSchema) -> list[str]:
        """Human-readable differences ``self`` → ``other``; empty when the schemas are interchangeable."""
        out: list[str] = []
        if self.version != other.version:
            out.append(f"version: {self.version} != {other.version}")
        for name in ("channels", "time_features", "targets", "descriptors"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                gone = [x for x in a if x not in b]
                new = [x for x in b if x not in a]
                detail = f"missing {gone}, extra {new}" if gone or new else "same names, different order"
                out.append(f"{name}: {detail} ({list(a)} != {list(b)})")
        if self.channels == other.channels and self.masked != other.masked:
            flips = [c for c, x, y in zip(self.channels, self.masked, other.masked, strict=True) if x != y]
            out.append(f"masked: mask flag differs for {flips}")
        if self.step_s != other.step_s:
            out.append(f"step_s: {self.step_s} != {other.step_s}")
        if self.level_halflife_s != other.level_halflife_s:
            out.append(f"level_halflife_s: {self.level_halflife_s} != {other.level_halflife_s}")
        if self.level_of != other.level_of:
            out.append(f"level_of: {self.level_of} != {other.level_of}")
        return out


_DESCRIPTOR_INPUTS = ("arrival_rps", "prompt_tps", "gen_tps")

DEFAULT_SCHEMA = FeatureSchema()
#: DEFAULT_SCHEMA plus the per-pool workload descriptors (issue 8), schema version 2.
POOL_SCHEMA = FeatureSchema(version=POOL_SCHEMA_VERSION, descriptors=POOL_DESCRIPTORS)
#: DEFAULT_SCHEMA with level-relative rate inputs and targets (schema version 3), level half-life 30 s.
LEVEL_SCHEMA = FeatureSchema(version=LEVEL_SCHEMA_VERSION, level_halflife_s=30.0)


def baseline_columns(schema: FeatureSchema = DEFAULT_SCHEMA) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For each target of ``schema``: the encoded-input column of its rate channel, and of that channel's
    mask (-1 when unmasked). Raises :class:`FeatureError` naming a target whose channel the schema lacks."""
    names = schema.input_names
    inputs, masks = [], []
    for target in schema.targets:
        ch = TARGET_CHANNELS.get(target)
        if ch is None or ch not in schema.channels:
            raise FeatureError(
                f"baseline skip: target {target!r} has no rate channel in the schema "
                f"(known {TARGET_CHANNELS}, schema channels {list(schema.channels)})"
            )
        inputs.append(names.index(ch))
        masks.append(names.index(f"{ch}_mask") if f"{ch}_mask" in names else -1)
    return tuple(inputs), tuple(masks)


def _as_floats(d: Mapping[str, Any], key: str, n: int) -> tuple[float, ...]:
    if key not in d:
        raise FeatureError(f"normalizer dict lacks field {key!r}")
    vals = tuple(float(v) for v in d[key])
    if len(vals) != n:
        raise FeatureError(f"normalizer field {key!r} has {len(vals)} entries, expected {n}")
    return vals


@dataclass(frozen=True)
class Normalizer:
    """Per-channel ``log1p`` (or identity) then standardisation, for inputs and targets.

    Inputs: ``z = (f(x) - mean) / std`` with ``f = log1p`` unless ``log1p[i]`` is False.
    Targets: ``y = (log1p(total) - target_mean) / target_std``, total over the horizon.
    Fit it with :meth:`fit` on training data only.
    """

    channels: tuple[str, ...]
    log1p: tuple[bool, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    targets: tuple[str, ...]
    target_mean: tuple[float, ...]
    target_std: tuple[float, ...]
    # Cached numpy views (not part of equality or the serialised form).
    _arrays: dict[str, np.ndarray] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        n, k = len(self.channels), len(self.targets)
        for name, size in (("log1p", n), ("mean", n), ("std", n), ("target_mean", k), ("target_std", k)):
            if len(getattr(self, name)) != size:
                raise FeatureError(
                    f"Normalizer.{name} has {len(getattr(self, name))} entries, expected {size}"
                )
        for name, names, positive in (
            ("std", self.channels, True),
            ("target_std", self.targets, True),
            ("mean", self.channels, False),
            ("target_mean", self.targets, False),
        ):
            bad = {
                f: v
                for f, v in zip(names, getattr(self, name), strict=True)
                if not math.isfinite(v) or (positive and v <= 0)
            }
            if bad:
                rule = "positive and finite" if positive else "finite"
                raise FeatureError(f"Normalizer.{name} must be {rule}; bad entries {bad}")
        arrays = {
            "mean": np.asarray(self.mean, dtype=np.float64),
            "std": np.asarray(self.std, dtype=np.float64),
            "log1p": np.asarray(self.log1p, dtype=bool),
            "target_mean": np.asarray(self.target_mean, dtype=np.float64),
            "target_std": np.asarray(self.target_std, dtype=np.float64),
        }
        object.__setattr__(self, "_arrays", arrays)  # a private cache, set once, never mutated

    @classmethod
    def identity(cls, schema: FeatureSchema = DEFAULT_SCHEMA) -> Normalizer:
        """A normaliser that only applies the log1p transforms (mean 0, std 1): for tests and smoke runs."""
        n, k = len(schema.channels), len(schema.targets)
        return cls(
            channels=schema.channels,
            log1p=tuple(c not in _LINEAR_CHANNELS for c in schema.channels),
            mean=(0.0,) * n,
            std=(1.0,) * n,
            targets=schema.targets,
            target_mean=(0.0,) * k,
            target_std=(1.0,) * k,
        )

    @classmethod
    def fit(
        cls,
        x_raw: np.ndarray,
        mask: np.ndarray,
        targets: np.ndarray,
        *,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        train_end: int | None = None,
        horizon_steps: int = 0,
        input_offsets: np.ndarray | None = None,
        target_offsets: np.ndarray | None = None,
    ) -> Normalizer:
        """Fit statistics on the observed entries of the training data.

        ``x_raw``/``mask``: ``[..., T, C]``; ``targets``: ``[..., T, K]`` totals (NaN = unknown).
        ``input_offsets`` ``[..., T, C]`` / ``target_offsets`` ``[..., T, K]`` (level-relative schemas, from
        :func:`level_offsets`) are subtracted in log space before the statistics are taken; a NaN target
        offset makes that target unknown.
        With ``train_end``, only time steps ``t < train_end`` are read for inputs and only
        ``t < train_end - horizon_steps`` for targets (a target at t sums data up to t + horizon_steps),
        so nothing at or after ``train_end`` (the validation split) influences the statistics.
        Channels never observed get mean 0, std 1; constant channels get std 1.
        """
        x_raw, mask, targets = np.asarray(x_raw), np.asarray(mask, dtype=bool), np.asarray(targets)
        c, k = len(schema.channels), len(schema.targets)
        if x_raw.shape != mask.shape or x_raw.shape[-1] != c:
            raise FeatureError(
                f"x_raw {x_raw.shape} and mask {mask.shape} must match and end in {c} channels"
            )
        if targets.shape[-1] != k or targets.shape[:-1] != x_raw.shape[:-1]:
            raise FeatureError(f"targets has shape {targets.shape}, expected {(*x_raw.shape[:-1], k)}")
        # offsets: 0.0 (a scalar, no full-size array of zeros) when not level-relative
        x_off: np.ndarray | float = 0.0
        y_off: np.ndarray | float = 0.0
        if input_offsets is not None:
            x_off = np.asarray(input_offsets, dtype=np.float64)
            if x_off.shape != x_raw.shape:
                raise FeatureError(f"input_offsets {x_off.shape} must match x_raw {x_raw.shape}")
        if target_offsets is not None:
            y_off = np.asarray(target_offsets, dtype=np.float64)
            if y_off.shape != targets.shape:
                raise FeatureError(f"target_offsets {y_off.shape} must match targets {targets.shape}")
        if train_end is not None:
            y_end = max(train_end - horizon_steps, 0)
            x_raw, mask = x_raw[..., :train_end, :], mask[..., :train_end, :]
            targets = targets[..., :y_end, :]
            if isinstance(x_off, np.ndarray):
                x_off = x_off[..., :train_end, :]
            if isinstance(y_off, np.ndarray):
                y_off = y_off[..., :y_end, :]
        log1p = np.array([ch not in _LINEAR_CHANNELS for ch in schema.channels])
        xt = (_transform(x_raw, log1p) - x_off).reshape(-1, c)
        ok = mask.reshape(-1, c) & np.isfinite(xt)
        mean, std = _masked_stats(xt, ok)
        yt = (np.log1p(np.where(targets >= 0, targets, np.nan)) - y_off).reshape(-1, k)
        t_mean, t_std = _masked_stats(yt, np.isfinite(yt))
        return cls(
            channels=schema.channels,
            log1p=tuple(bool(v) for v in log1p),
            mean=tuple(float(v) for v in mean),
            std=tuple(float(v) for v in std),
            targets=schema.targets,
            target_mean=tuple(float(v) for v in t_mean),
            target_std=tuple(float(v) for v in t_std),
        )

    def normalize_inputs(
        self, x_raw: np.ndarray, mask: np.ndarray, offsets: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``[..., C]`` raw → (normalised float64 with 0 where unobserved, effective bool mask).

        ``offsets`` ``[..., C]`` (level-relative schemas: :func:`level_offsets`) are subtracted after the
        log1p, before standardising. The effective mask also drops non-finite values, negatives in log1p
        channels (a negative rate or count is not a measurement) and values more than ``MAX_ABS_Z``
        standard deviations from the training mean (garbage such as 1e300; it would overflow float32): all
        are treated as unknown, never clipped.
        """
        z = _transform(x_raw, self._arrays["log1p"])
        if offsets is not None:
            z = z - offsets
        with np.errstate(over="ignore", invalid="ignore"):
            z = (z - self._arrays["mean"]) / self._arrays["std"]
            ok = np.asarray(mask, dtype=bool) & (np.abs(z) <= MAX_ABS_Z)
        return np.where(ok, z, 0.0), ok

    def normalize_targets(self, totals: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
        """Totals ``[..., K]`` (NaN = unknown) → normalised targets (NaN stays NaN).

        ``offsets`` ``[..., K]`` (level-relative: :func:`level_offsets`) are subtracted in log space; a NaN
        offset (no level yet) makes the target unknown."""
        t = np.asarray(totals, dtype=np.float64)
        y = np.log1p(np.where(t >= 0, t, np.nan))
        if offsets is not None:
            y = y - offsets
        out: np.ndarray = (y - self._arrays["target_mean"]) / self._arrays["target_std"]
        return out

    def denormalize_targets(self, y: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
        """Normalised values ``[..., K]`` → totals (counts / tokens), clipped at 0 (totals are never negative).

        ``offsets`` ``[..., K]``: the ones :meth:`normalize_targets` subtracted (NaN → NaN total)."""
        logs = np.asarray(y, dtype=np.float64) * self._arrays["target_std"] + self._arrays["target_mean"]
        if offsets is not None:
            logs = logs + offsets
        with np.errstate(over="ignore"):
            t = np.expm1(logs)
        out: np.ndarray = np.maximum(t, 0.0)  # NaN (unknown offset) stays NaN
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels": list(self.channels),
            "log1p": list(self.log1p),
            "mean": list(self.mean),
            "std": list(self.std),
            "targets": list(self.targets),
            "target_mean": list(self.target_mean),
            "target_std": list(self.target_std),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Normalizer:
        for key in ("channels", "targets", "log1p"):
            if key not in d:
                raise FeatureError(f"normalizer dict lacks field {key!r}")
        channels = tuple(str(c) for c in d["channels"])
        targets = tuple(str(t) for t in d["targets"])
        log1p = tuple(bool(v) for v in d["log1p"])
        return cls(
            channels=channels,
            log1p=log1p,
            mean=_as_floats(d, "mean", len(channels)),
            std=_as_floats(d, "std", len(channels)),
            targets=targets,
            target_mean=_as_floats(d, "target_mean", len(targets)),
            target_std=_as_floats(d, "target_std", len(targets)),
        )


def _transform(x: np.ndarray, log1p: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(log1p, np.log1p(np.where(x >= 0, x, np.nan)), x)


def _masked_stats(x: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = ok.sum(axis=0)
    xs = np.where(ok, x, 0.0)
    mean = np.divide(xs.sum(axis=0), n, out=np.zeros(x.shape[-1]), where=n > 0)
    var = np.divide((np.where(ok, x - mean, 0.0) ** 2).sum(axis=0), n, out=np.zeros(x.shape[-1]), where=n > 0)
    std = np.sqrt(var)
    return mean, np.where(std > 1e-6, std, 1.0)


def time_features(now_s: np.ndarray | float, schema: FeatureSchema = DEFAULT_SCHEMA) -> np.ndarray:
    """``[..., len(schema.time_features)]`` float64 from times in seconds since the Unix epoch (UTC)."""
    t = np.asarray(now_s, dtype=np.float64)
    if schema.time_features and not np.all(np.isfinite(t)):
        raise FeatureError("now_s must be finite: the schema has time features (time of day)")
    phase = 2.0 * np.pi * np.mod(t, _DAY_S) / _DAY_S
    cols = {"tod_sin": np.sin(phase), "tod_cos": np.cos(phase)}
    return (
        np.stack([cols[f] for f in schema.time_features], axis=-1)
        if schema.time_features
        else t[..., None][..., :0]
    )


# ---------------------------------------------------------------------------------------------------------
# Per-pool workload descriptors (schema version 2)
#
# Exponentially weighted sums (decay d = 0.5 ** (step_s / POOL_HALFLIFE_S), each update
# ``S <- d S + (1 - d) u``, all zero before the first step) of, per step: m (arrivals observed), m a, m a²,
# m' p and m' g (arrivals a, prompt tokens p, generation tokens g per step; m' = all three observed) and m'
# a. From them, encoded with fixed affine maps (no fitted statistics, so an unseen pool is encoded the same
# way):
#   pool_dispersion = log(var / mean of per-step arrivals) / 2         (Poisson → 0, on/off bursts → 1 … 4)
#   pool_prompt_len = (log1p(prompt tokens per request) − 6.5) / 1.5
#   pool_output_len = (log1p(output tokens per request) − 5.0) / 1.5
# Undefined (nothing observed yet, no arrivals yet) → 0.

_N_SUMS = 6


def _descriptor_terms(x_raw: np.ndarray, mask: np.ndarray, schema: FeatureSchema) -> np.ndarray:
    """``[..., C]`` raw channels → ``[..., 6]`` per-step terms (m, m a, m a², m' a, m' p, m' g)."""
    idx = [schema.channels.index(c) for c in _DESCRIPTOR_INPUTS]
    v = np.asarray(x_raw, dtype=np.float64)[..., idx] * schema.step_s  # per-step totals
    ok = np.asarray(mask, dtype=bool)[..., idx] & np.isfinite(v) & (v >= 0)
    v = np.where(ok, v, 0.0)
    m = ok[..., 0].astype(np.float64)
    m3 = ok.all(axis=-1).astype(np.float64)
    a = v[..., 0]
    return np.stack([m, m * a, m * a * a, m3 * a, m3 * v[..., 1], m3 * v[..., 2]], axis=-1)


def _descriptors_from_sums(sums: np.ndarray, schema: FeatureSchema) -> np.ndarray:
    """EW sums ``[..., 6]`` → encoded descriptors ``[..., len(schema.descriptors)]`` (float64)."""
    w, sa, sa2, sa3, sp, sg = (sums[..., i] for i in range(_N_SUMS))
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(w > 1e-9, sa / w, np.nan)
        var = np.where(w > 1e-9, sa2 / w, np.nan) - mean * mean
        disp = np.log(np.maximum(var, 1e-6) / mean) / 2.0
        plen = (np.log1p(sp / sa3) - 6.5) / 1.5
        olen = (np.log1p(sg / sa3) - 5.0) / 1.5
    cols = {
        "pool_dispersion": np.where(mean > 1e-6, disp, 0.0),
        "pool_prompt_len": np.where(sa3 > 1e-6, plen, 0.0),
        "pool_output_len": np.where(sa3 > 1e-6, olen, 0.0),
    }
    out = [np.nan_to_num(np.clip(cols[d], -10.0, 10.0)) for d in schema.descriptors]
    return np.stack(out, axis=-1) if out else np.zeros((*sums.shape[:-1], 0))


def _descriptor_decay(schema: FeatureSchema) -> float:
    return float(0.5 ** (schema.step_s / POOL_HALFLIFE_S))


def descriptor_series(x_raw: np.ndarray, mask: np.ndarray, schema: FeatureSchema = POOL_SCHEMA) -> np.ndarray:
    """Descriptors at every step of whole series: ``x_raw [..., T, C]`` → ``[..., T, len(schema.descriptors)]``.

    Step t summarises steps 0..t (causal). Equal to feeding the steps one by one to :class:`DescriptorState`.
    """
    from scipy.signal import lfilter

    x_raw = np.asarray(x_raw)
    if not schema.descriptors:
        return np.zeros((*x_raw.shape[:-1], 0))
    d = _descriptor_decay(schema)
    terms = _descriptor_terms(x_raw, mask, schema)  # [..., T, 6]
    sums = lfilter([1.0 - d], [1.0, -d], terms, axis=-2)
    return _descriptors_from_sums(np.asarray(sums), schema)


class DescriptorState:
    """Streaming per-node descriptors: ``2 * 3`` floats per node, one update per tick for all nodes."""

    def __init__(self, n_nodes: int, schema: FeatureSchema = POOL_SCHEMA) -> None:
        self.schema = schema
        self.decay = _descriptor_decay(schema)
        self.sums = np.zeros((n_nodes, _N_SUMS))

    def update(self, x_raw: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Consume one step ``x_raw [N, C]`` / ``mask [N, C]`` → descriptors ``[N, len(schema.descriptors)]``."""
        self.sums = self.decay * self.sums + (1.0 - self.decay) * _descriptor_terms(x_raw, mask, self.schema)
        return _descriptors_from_sums(self.sums, self.schema)


# ---------------------------------------------------------------------------------------------------------
# Level-relative encoding (schema version 3)
#
# For each target k with rate channel c_k (TARGET_CHANNELS): a masked, causal EWMA of the node's own rate,
# ``level = S / W`` with ``S <- d S + (1 - d) m x`` and ``W <- d W + (1 - d) m`` (m = observed, d =
# 0.5 ** (step_s / level_halflife_s), both 0 before the first step): unbiased from the first observation (no
# warm-up), frozen while the channel is unobserved, NaN until it has been observed once. Then:
#   input  z_c = (log1p(x_c) - log1p(level_k) - mean_c) / std_c          (statistics of the relative values)
#   target y_k = (log1p(total_k) - log1p(horizon_s * level_k) - target_mean_k) / target_std_k
# and one extra input, LEVEL_FEATURE = (log1p(arrival level) - 2) / 2 (0 while unknown), so the model can
# still learn level-dependent noise (Poisson noise shrinks relatively as the rate grows). Scaling a
# series' rates by k scales its levels by k, so at rates well above 1/s the relative inputs are unchanged
# and the decoded totals scale by k: a new rate level is not out of the training distribution.
# A target whose channel has never been observed has no level: it is not scored in training and is NaN
# when forecast. Other channels (running, waiting, KV usage, latencies) keep the absolute encoding.


def _rate_columns(schema: FeatureSchema) -> list[int]:
    """Each target's own rate channel (the inputs made relative)."""
    return [schema.channels.index(TARGET_CHANNELS[t]) for t in schema.targets]


def _level_columns(schema: FeatureSchema) -> list[int]:
    """The channel whose level each target is relative to (``FeatureSchema.level_of``)."""
    if schema.level_of == "arrivals":
        return [schema.channels.index("arrival_rps")] * len(schema.targets)
    return _rate_columns(schema)


def _level_terms(x_raw: np.ndarray, mask: np.ndarray, schema: FeatureSchema) -> np.ndarray:
    """``[..., C]`` → ``[..., 2K]``: ``m * x`` of each target's rate channel, then ``m``."""
    idx = _level_columns(schema)
    v = np.asarray(x_raw, dtype=np.float64)[..., idx]
    with np.errstate(invalid="ignore"):
        ok = np.asarray(mask, dtype=bool)[..., idx] & np.isfinite(v) & (v >= 0) & (v <= _MAX_RATE)
    m = ok.astype(np.float64)
    return np.concatenate([np.where(ok, v, 0.0), m], axis=-1)


def _levels_from_sums(sums: np.ndarray) -> np.ndarray:
    k = sums.shape[-1] // 2
    s, w = sums[..., :k], sums[..., k:]
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.where(w > 1e-12, s / w, np.nan)
    return out


def _level_decay(schema: FeatureSchema) -> float:
    if not schema.level_relative:
        raise FeatureError("the feature schema has no level-relative encoding (level_halflife_s = 0)")
    return float(0.5 ** (schema.step_s / schema.level_halflife_s))


def level_series(x_raw: np.ndarray, mask: np.ndarray, schema: FeatureSchema = LEVEL_SCHEMA) -> np.ndarray:
    """Trailing levels of whole series: ``x_raw [..., T, C]`` → ``[..., T, K]`` rates (per second), NaN
    before a target's channel is first observed. Step t reads steps 0..t (causal); equal to feeding the
    steps one by one to :class:`LevelState`."""
    from scipy.signal import lfilter

    d = _level_decay(schema)
    terms = _level_terms(x_raw, mask, schema)
    return _levels_from_sums(np.asarray(lfilter([1.0 - d], [1.0, -d], terms, axis=-2)))


class LevelState:
    """Streaming per-node levels: ``2 K`` floats per node, one update per tick for all nodes."""

    def __init__(self, n_nodes: int, schema: FeatureSchema = LEVEL_SCHEMA) -> None:
        self.schema = schema
        self.decay = _level_decay(schema)
        self.sums = np.zeros((n_nodes, 2 * len(schema.targets)))

    def update(self, x_raw: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Consume one step ``x_raw [N, C]`` / ``mask [N, C]`` → levels ``[N, K]``."""
        self.sums = self.decay * self.sums + (1.0 - self.decay) * _level_terms(x_raw, mask, self.schema)
        return _levels_from_sums(self.sums)


def level_offsets(
    levels: np.ndarray, schema: FeatureSchema, horizon_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Levels ``[..., K]`` → (input offsets ``[..., C]``, target offsets ``[..., K]``) in log space.

    Input offset of target k's rate channel: ``log1p(level_k)`` (0 while unknown: the value is unobserved
    then anyway); target offset: ``log1p(horizon_s * level_k)`` (NaN while unknown). Other channels: 0.
    """
    lv = np.asarray(levels, dtype=np.float64)
    if lv.shape[-1] != len(schema.targets):
        raise FeatureError(
            f"levels {lv.shape} must end in {len(schema.targets)} targets {list(schema.targets)}"
        )
    x_off = np.zeros((*lv.shape[:-1], len(schema.channels)))
    x_off[..., _rate_columns(schema)] = np.log1p(np.nan_to_num(lv, nan=0.0))
    return x_off, np.log1p(horizon_s * lv)


def level_feature(levels: np.ndarray, schema: FeatureSchema) -> np.ndarray:
    """The extra input ``[..., 1]``: ``(log1p(arrival level) - 2) / 2``, 0 while unknown."""
    a = np.asarray(levels, dtype=np.float64)[..., schema.targets.index("arrivals")]
    z = (np.log1p(np.nan_to_num(a, nan=0.0)) - _LEVEL_CENTER) / _LEVEL_SCALE
    return np.where(np.isfinite(a), z, 0.0)[..., None]


def encode_inputs(
    x_raw: np.ndarray,
    mask: np.ndarray,
    normalizer: Normalizer,
    times_s: np.ndarray | float,
    schema: FeatureSchema = DEFAULT_SCHEMA,
    descriptors: np.ndarray | None = None,
    levels: np.ndarray | None = None,
) -> np.ndarray:
    """Raw channels ``[..., C]`` + mask → float32 network input ``[..., F_in]``.

    ``times_s`` broadcasts against the leading dimensions (e.g. ``[T]`` for ``x_raw [N, T, C]``, or a scalar).
    With per-pool descriptors in the schema, ``descriptors [..., D]`` are appended; when None they are
    computed from ``x_raw`` itself, read as whole series from their start (:func:`descriptor_series`).
    With a level-relative schema, ``levels [..., K]`` (:func:`level_series` / :class:`LevelState`) set the
    rate channels' offsets and the last input; when None they are computed from ``x_raw`` as whole series.
    """
    return encode_inputs_masked(x_raw, mask, normalizer, times_s, schema, descriptors, levels)[0]


def encode_inputs_masked(
    x_raw: np.ndarray,
    mask: np.ndarray,
    normalizer: Normalizer,
    times_s: np.ndarray | float,
    schema: FeatureSchema = DEFAULT_SCHEMA,
    descriptors: np.ndarray | None = None,
    levels: np.ndarray | None = None,
    *,
    x_offsets: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode_inputs` and the effective observed mask ``[..., C]`` it used (``normalize_inputs``'s).

    ``x_offsets``: the input offsets of ``level_offsets(levels, ...)`` when the caller has them already
    (level-relative schemas; they do not depend on the horizon), so they are not computed twice per tick.
    """
    if normalizer.channels != schema.channels:
        raise FeatureError(f"normalizer channels {normalizer.channels} != schema channels {schema.channels}")
    x_raw = np.asarray(x_raw)
    if x_raw.shape[-1] != len(schema.channels) or np.shape(mask) != x_raw.shape:
        raise FeatureError(
            f"x_raw {x_raw.shape} and mask {np.shape(mask)} must match and end in {len(schema.channels)} channels"
        )
    x_off = None
    if schema.level_relative:
        levels = level_series(x_raw, mask, schema) if levels is None else np.asarray(levels)
        if levels.shape != (*x_raw.shape[:-1], len(schema.targets)):
            raise FeatureError(
                f"levels {levels.shape} must be {(*x_raw.shape[:-1], len(schema.targets))} (one per target)"
            )
        if x_offsets is None:
            x_off, _ = level_offsets(levels, schema, 1.0)
        elif np.shape(x_offsets) != x_raw.shape:
            raise FeatureError(f"x_offsets {np.shape(x_offsets)} must be {x_raw.shape} (one per channel)")
        else:
            x_off = np.asarray(x_offsets)
    elif x_offsets is not None:
        raise FeatureError("x_offsets given but the feature schema is not level-relative")
    z, ok = normalizer.normalize_inputs(x_raw, mask, x_off)
    tf = np.broadcast_to(time_features(times_s, schema), (*x_raw.shape[:-1], len(schema.time_features)))
    masks = ok[..., np.asarray(schema.masked, dtype=bool)]
    parts = [z, masks, tf]
    if schema.descriptors:
        desc = descriptor_series(x_raw, mask, schema) if descriptors is None else np.asarray(descriptors)
        if desc.shape != (*x_raw.shape[:-1], len(schema.descriptors)):
            raise FeatureError(
                f"descriptors {desc.shape} must be {(*x_raw.shape[:-1], len(schema.descriptors))} "
                f"(schema descriptors {list(schema.descriptors)})"
            )
        parts.append(desc)
    if schema.level_relative and levels is not None:
        parts.append(level_feature(levels, schema))
    out: np.ndarray = np.concatenate(parts, axis=-1).astype(np.float32)
    return out, ok


def encode_step(
    x_raw: np.ndarray,
    mask: np.ndarray,
    normalizer: Normalizer,
    now_s: float,
    schema: FeatureSchema = DEFAULT_SCHEMA,
    descriptors: np.ndarray | None = None,
    levels: np.ndarray | None = None,
) -> np.ndarray:
    """One tick for every node: ``x_raw [N, C]``, ``mask [N, C]`` → float32 ``[N, F_in]``.

    Identical to a row of :func:`encode_inputs` (the streaming == full-sequence guarantee depends on it).
    With per-pool descriptors in the schema, pass ``descriptors [N, D]`` (from :class:`DescriptorState`);
    with a level-relative schema, ``levels [N, K]`` (from :class:`LevelState`).
    """
    return encode_step_masked(x_raw, mask, normalizer, now_s, schema, descriptors, levels)[0]


def encode_step_masked(
    x_raw: np.ndarray,
    mask: np.ndarray,
    normalizer: Normalizer,
    now_s: float,
    schema: FeatureSchema = DEFAULT_SCHEMA,
    descriptors: np.ndarray | None = None,
    levels: np.ndarray | None = None,
    *,
    x_offsets: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode_step` and the effective observed mask ``[N, C]`` (one normalisation per tick).

    ``x_offsets``: see :func:`encode_inputs_masked`.
    """
    if schema.descriptors and descriptors is None:
        raise FeatureError(
            "encode_step: the schema has per-pool descriptors; pass DescriptorState.update(...)"
        )
    if schema.level_relative and levels is None:
        raise FeatureError("encode_step: the schema is level-relative; pass levels=LevelState.update(...)")
    return encode_inputs_masked(
        x_raw, mask, normalizer, now_s, schema, descriptors, levels, x_offsets=x_offsets
    )


# ---------------------------------------------------------------------------------------------------------
# From metric frames


def counter_rate(counter: np.ndarray, times_s: np.ndarray) -> np.ndarray:
    """Per-second rate of a cumulative counter ``[..., T]``: NaN at t=0, across gaps (NaN) and resets (drops)."""
    c = np.asarray(counter, dtype=np.float64)
    out = np.full(c.shape, np.nan)
    dt = np.diff(np.asarray(times_s, dtype=np.float64))
    d = np.diff(c, axis=-1)
    with np.errstate(invalid="ignore"):
        out[..., 1:] = np.where(d >= 0, d / dt, np.nan)
    return out


def frame_to_inputs(
    frame: MetricFrame, schema: FeatureSchema = DEFAULT_SCHEMA
) -> tuple[np.ndarray, np.ndarray]:
    """Map a frame's vLLM metrics to raw channels: ``(x [N, T, C] float64, mask [N, T, C] bool)``.

    Counters (``*_total``) become per-second rates by differencing (NaN at the first step, across gaps and
    counter resets); gauges are taken as they are. A frame may carry a channel under its own name (e.g.
    ``ttft_p90_s`` computed by a source), which wins. Channels with no source in the frame are all-masked.
    TTFT/ITL quantiles from histogram buckets are not derived here yet: a source must supply them by name.
    """
    times = np.asarray(frame.times_s, dtype=np.float64)
    if len(times) > 1:
        steps = np.diff(times)
        if not np.allclose(steps, schema.step_s, rtol=1e-6, atol=1e-9):
            raise FeatureError(
                f"MetricFrame.times_s step is {float(np.median(steps))} s (min {steps.min()}, max {steps.max()}), "
                f"but the feature schema expects a regular {schema.step_s} s grid"
            )
    n, t = len(frame.node_ids), len(times)
    x = np.full((n, t, len(schema.channels)), np.nan)
    for i, ch in enumerate(schema.channels):
        if ch in frame.metrics:
            x[:, :, i] = frame.series(ch)
        elif ch in METRIC_SOURCES and METRIC_SOURCES[ch][0] in frame.metrics:
            metric, kind = METRIC_SOURCES[ch]
            s = frame.series(metric)
            x[:, :, i] = counter_rate(s, times) if kind == "counter" else s
    return x, np.isfinite(x)


# ---------------------------------------------------------------------------------------------------------
# From request traces


class TraceSeries(NamedTuple):
    """Per-step totals from a trace: step ``t`` covers ``[t0_s + t*step_s, t0_s + (t+1)*step_s)``."""

    arrivals: np.ndarray  # float64 [T], requests arriving in the step
    prompt_tokens: np.ndarray  # float64 [T], prompt tokens of those requests
    gen_tokens: np.ndarray  # float64 [T], output tokens of those requests (counted at arrival)


def series_from_trace(
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    step_s: float = 1.0,
    *,
    t0_s: float = 0.0,
    duration_s: float | None = None,
) -> TraceSeries:
    """Bin a trace into per-step totals with ``np.bincount`` (O(n), no Python loop over requests).

    Output tokens are counted at their request's arrival (the decode work the request brings), not when
    they are generated. ``duration_s`` fixes the length (default: up to the last arrival); requests outside
    ``[t0_s, t0_s + duration_s)`` are dropped.
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    if not (len(a) == len(prompt_tokens) == len(output_tokens)):
        raise FeatureError(
            f"arrival_s ({len(a)}), prompt_tokens ({len(prompt_tokens)}) and output_tokens "
            f"({len(output_tokens)}) must have the same length"
        )
    if not step_s > 0:
        raise FeatureError(f"step_s must be positive, got {step_s}")
    idx = np.floor((a - t0_s) / step_s).astype(np.int64)
    if duration_s is None:
        n_steps = int(idx.max()) + 1 if len(idx) else 0
    else:
        n_steps = math.ceil(duration_s / step_s - 1e-9)
    keep = (idx >= 0) & (idx < n_steps)
    idx = idx[keep]

    def binned(w: np.ndarray | None) -> np.ndarray:
        return np.bincount(idx, weights=w, minlength=n_steps).astype(np.float64)

    return TraceSeries(
        arrivals=binned(None),
        prompt_tokens=binned(np.asarray(prompt_tokens, dtype=np.float64)[keep]),
        gen_tokens=binned(np.asarray(output_tokens, dtype=np.float64)[keep]),
    )


def trace_inputs(
    series: TraceSeries, schema: FeatureSchema = DEFAULT_SCHEMA
) -> tuple[np.ndarray, np.ndarray]:
    """Single-node raw channels from trace series: ``(x [T, C], mask [T, C])``.

    arrival_rps, prompt_tps and gen_tps are filled (per-step totals / step_s); every channel a trace
    cannot tell (running, waiting, KV usage, latencies) is NaN and masked.
    """
    fill = {
        "arrival_rps": series.arrivals,
        "prompt_tps": series.prompt_tokens,
        "gen_tps": series.gen_tokens,
    }
    t = len(series.arrivals)
    x = np.full((t, len(schema.channels)), np.nan)
    for i, ch in enumerate(schema.channels):
        if ch in fill:
            x[:, i] = fill[ch] / schema.step_s
    return x, np.isfinite(x)


def future_sums(series: np.ndarray, horizon_s: float, step_s: float = 1.0) -> np.ndarray:
    """``out[t] = sum(series[t+1 : t+1+H])``, the total over ``(t, t + horizon_s]``, ``H = horizon_s/step_s``.

    NaN where the horizon runs past the end or covers a NaN. Vectorised with cumulative sums.
    """
    h_f = horizon_s / step_s
    h = round(h_f)
    if h < 1 or abs(h - h_f) > 1e-9:
        raise FeatureError(f"horizon_s ({horizon_s}) must be a positive multiple of step_s ({step_s})")
    s = np.asarray(series, dtype=np.float64)
    t = s.shape[-1]
    out = np.full(s.shape, np.nan)
    if t <= h:
        return out
    bad = ~np.isfinite(s)
    zero = np.zeros((*s.shape[:-1], 1))
    cs = np.concatenate([zero, np.cumsum(np.where(bad, 0.0, s), axis=-1)], axis=-1)
    cb = np.concatenate([zero, np.cumsum(bad, axis=-1)], axis=-1)
    # window (t, t+h] = indices t+1..t+h  →  cs[t+h+1] - cs[t+1], for t = 0..T-h-1
    tot = cs[..., h + 1 :] - cs[..., 1 : t - h + 1]
    nbad = cb[..., h + 1 :] - cb[..., 1 : t - h + 1]
    out[..., : t - h] = np.where(nbad > 0, np.nan, tot)
    return out


def trace_targets(series: TraceSeries, horizon_s: float = 5.0, step_s: float = 1.0) -> np.ndarray:
    """Targets ``[T, len(TARGETS)]``: arrivals, prompt tokens and generation tokens over ``(t, t + horizon_s]``."""
    return np.stack(
        [
            future_sums(s, horizon_s, step_s)
            for s in (series.arrivals, series.prompt_tokens, series.gen_tokens)
        ],
        axis=-1,
    )
