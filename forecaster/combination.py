"""Online forecast combination per node: the learned network and cheap streaming baselines, weighted by
their recent realised losses (docs/FORECASTER.md, "Forecast combination").

Every tick, for every node, target channel (arrivals, prompt tokens, generation tokens) and output (p50,
p90), each expert's forecast is kept until its target is known: the forecast issued after step ``t`` covers
steps ``t+1 .. t+H`` and is scored after step ``t+H``, against the realised sum — absolute error for the
p50, pinball loss at 0.9 for the p90. Each expert keeps an exponentially discounted mean of those losses
(half-life ``halflife_s`` ticks). The output is a convex combination of the experts' forecasts, weighted by
``exp(-eta * (loss / best loss - 1))`` (``rule="exp"``) or all on the lowest loss (``rule="best"``).

Experts: the network (``inner``), EWMA, Holt and last value, the last three as in ``forecaster.baselines``
(the same point forecasts and the same negative-binomial spread, with ``fast_count_quantiles`` and a
discounted dispersion estimate so that a tick stays cheap). Until a baseline has ``min_scored`` realised
targets it gets no weight, so a new node starts on the network alone.

Unknown is not zero: an unobserved value (mask False, NaN, inf or negative) updates no baseline state and
makes every target whose window covers it unknown, so it scores nothing. Where the network gives no
forecast (NaN, a stale node) the combination gives none either. ``burst_prob`` is the network's, untouched.

The realised targets are sums of the per-step channel values over ``H = horizon_s`` steps, so steps are
taken as 1 s (the controller's default ``tick_s``), as the baselines and the onset detector do.

State per node: ``H * 3`` recent values, ``H * 4 * 3 * 2`` pending forecasts, ``2 * 4 * 3 * 2`` discounted
loss sums and counts, and ``7 * 3`` baseline values plus a counter — about 1.6 KB at ``H = 5``. No torch here: the module
wraps any ``Forecaster``; :meth:`CombinedForecaster.predict_sequence` needs the inner one to have it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast, overload

import numpy as np

from forecaster.baselines import INPUT_CHANNELS, ewma_step, fast_count_quantiles, holt_step
from forecaster.types import CHANNELS, TARGETS, ForecastBatch, Forecaster

if TYPE_CHECKING:
    from forecaster.features import FeatureSchema
    from forecaster.streaming import SequenceForecast

#: The experts, in the order of the weight arrays' expert axis.
EXPERTS: tuple[str, ...] = ("network", "ewma", "holt", "last_value")
#: The outputs combined, in the order of the quantile axis (each scored by its own loss).
QUANTILES: tuple[float, float] = (0.5, 0.9)
_IDX = np.array([CHANNELS.index(c) for c in INPUT_CHANNELS])
_FIELDS = (
    ("arrivals_p50", "arrivals_p90"),
    ("prompt_tokens_p50", "prompt_tokens_p90"),
    ("gen_tokens_p50", "gen_tokens_p90"),
)


@dataclass(frozen=True)
class CombinationConfig:
    """How the experts are scored and weighted (units: ticks, i.e. seconds at 1-s ticks)."""

    #: half-life of the discounted losses: how far back "recent" reaches
    halflife_s: float = 120.0
    #: "exp": weights exp(-eta (loss / best - 1)); "best": everything on the lowest recent loss
    rule: Literal["exp", "best"] = "exp"
    #: sharpness of "exp": an expert whose recent loss is 10 % above the best gets exp(-eta / 10) = 5 % of
    #: the best one's weight
    eta: float = 30.0
    #: realised targets an expert needs before it can get weight (the network is used alone until then)
    min_scored: int = 30
    #: observed steps before a baseline forecasts at all (its spread needs a few horizons of history)
    warmup_s: int = 30
    #: the EWMA expert's half-life (forecaster.baselines.EWMA's default)
    ewma_halflife_s: float = 10.0
    #: the Holt expert's level and trend smoothing (forecaster.baselines.Holt's defaults)
    holt_alpha: float = 0.2
    holt_beta: float = 0.05
    #: half-life of the discounted mean and variance of the H-step sums that give the baselines' spread
    dispersion_halflife_s: float = 30.0
    #: the targets combined; the others keep the network's forecast (e.g. ("arrivals",) where the token
    #: channels are tokens processed, capped by capacity, rather than tokens arriving)
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self) -> None:
        problems = []
        for name in ("halflife_s", "ewma_halflife_s", "dispersion_halflife_s", "eta"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.rule not in ("exp", "best"):
            problems.append(f"rule must be 'exp' or 'best', got {self.rule!r}")
        if self.min_scored < 1 or self.warmup_s < 1:
            problems.append(f"min_scored and warmup_s must be >= 1, got {self.min_scored}, {self.warmup_s}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            problems.append(f"targets must be a non-empty subset of {TARGETS}, got {self.targets}")
        if not (0 < self.holt_alpha <= 1 and 0 <= self.holt_beta <= 1):
            problems.append(
                f"Holt needs 0 < holt_alpha <= 1 and 0 <= holt_beta <= 1, got {self.holt_alpha}, {self.holt_beta}"
            )
        if problems:
            raise ValueError("CombinationConfig: " + "; ".join(problems))


def _decay(halflife: float) -> float:
    return float(2.0 ** (-1.0 / halflife))


class OnlineCombination:
    """The per-node state and the one update shared by the streaming and the offline paths.

    Arrays are expert-major, ``[E, N, C, Q]`` (``E = len(EXPERTS)``, ``N`` nodes, ``C = 3`` channels,
    ``Q = 2`` outputs), so that the per-tick sums over experts run on contiguous blocks: ``weights`` (the
    last combination's; they sum to 1 over experts) and ``loss_sum`` / ``loss_count`` (discounted; both
    move only when a target is realised, so ``loss_count = (1 - lam ** k) / (1 - lam)`` after ``k``).
    """

    def __init__(self, n_nodes: int, horizon_s: float, config: CombinationConfig | None = None) -> None:
        if horizon_s != int(horizon_s) or horizon_s < 1:
            raise ValueError(f"horizon_s must be a whole number of steps >= 1, got {horizon_s}")
        self.config = cfg = config or CombinationConfig()
        self.h = h = int(horizon_s)
        e, n, c, q = len(EXPERTS), n_nodes, len(INPUT_CHANNELS), len(QUANTILES)
        self.values = np.full((h, n, c), np.nan)  # the last h steps' values, slot = step % h
        self.pending = np.full((h, e, n, c, q), np.nan)  # forecasts awaiting their targets, same slots
        self.tick = 0
        self.loss_sum = np.zeros((e, n, c, q))
        self.loss_count = np.zeros((e, n, c, q))
        self.weights = np.zeros((e, n, c, q))
        self.weights[0] = 1.0
        self.n_obs = np.zeros((n, c), dtype=np.int64)
        self.rate = np.full((n, c), np.nan)  # EWMA
        self.level = np.full((n, c), np.nan)  # Holt
        self.trend = np.zeros((n, c))
        self.last_mu = np.full((n, c), np.nan)  # last value, held through gaps
        # discounted weight, sum and sum of squares of the complete h-step sums (the baselines' spread)
        self.disp_w, self.disp_s, self.disp_ss = np.zeros((n, c)), np.zeros((n, c)), np.zeros((n, c))
        self._loss_decay = lam = _decay(cfg.halflife_s)
        self._min_count = (1.0 - lam**cfg.min_scored) / (1.0 - lam) * (1.0 - 1e-9)  # see _combine
        self._disp_decay = _decay(cfg.dispersion_halflife_s)
        self._alpha = 1.0 - 2.0 ** (-1.0 / cfg.ewma_halflife_s)
        self._holt_sum = h * (h + 1) / 2.0
        # [1, 1, C, 1]: the channels whose baselines may get weight
        self._combined = np.array([t in cfg.targets for t in TARGETS])[None, None, :, None]

    @property
    def n_nodes(self) -> int:
        return int(self.n_obs.shape[0])

    def update(self, values: np.ndarray, network: np.ndarray) -> np.ndarray:
        """Consume one step: ``values [N, C]`` (per-step counts of the three channels, NaN = unknown) and the
        network's forecast ``network [N, C, Q]`` issued after this step → the combination ``[N, C, Q]``."""
        values = np.asarray(values, dtype=np.float64)
        slot = self.tick % self.h
        self.values[slot] = values
        target = self.values.sum(axis=0)  # steps tick-h+1 .. tick: NaN if any is unknown or not yet seen
        self._score(target, self.pending[slot])
        experts = self.pending[slot]  # the slot's old forecasts are scored: reuse it for this step's
        experts[0] = network
        self._baselines(values, target, experts[1:])
        self.tick += 1
        return self._combine(experts)

    def _score(self, target: np.ndarray, forecast: np.ndarray) -> None:
        err = target[None, :, :, None] - forecast  # [E, N, C, Q]; NaN where either is unknown
        ok = np.isfinite(err)
        q = QUANTILES[1]
        loss = np.abs(err)
        np.fmax(q * err[..., 1], (q - 1.0) * err[..., 1], out=loss[..., 1])
        np.fmax(loss, 0.0, out=loss)  # the losses are >= 0: this only turns NaN (nothing realised) into 0
        decay = 1.0 - (1.0 - self._loss_decay) * ok  # lam where scored, 1 (frozen) where not
        self.loss_sum *= decay
        self.loss_sum += loss
        self.loss_count *= decay
        self.loss_count += ok

    def _baselines(self, values: np.ndarray, target: np.ndarray, out: np.ndarray) -> None:
        """Update the baselines' state with this step and write their forecasts into ``out [3, N, C, Q]``."""
        obs = np.isfinite(values)
        self.n_obs += obs
        ewma_step(self.rate, values, obs, self._alpha)  # the baselines' own recurrences, in place
        holt_step(self.level, self.trend, values, obs, self.config.holt_alpha, self.config.holt_beta)
        # last value: the last h steps' total (their mean times h where some are unknown), held through gaps
        seen = np.isfinite(self.values)
        n_seen = seen.sum(axis=0)
        total = np.fmax(self.values, 0.0).sum(axis=0)  # fmax: unknown adds 0 (values are >= 0)
        self.last_mu = np.where(n_seen > 0, self.h * total / np.maximum(n_seen, 1), self.last_mu)
        # spread: discounted mean and variance of the h-step sums, whenever one is complete
        done = np.isfinite(target)
        decay = 1.0 - (1.0 - self._disp_decay) * done
        t0 = np.fmax(target, 0.0)
        self.disp_w = self.disp_w * decay + done
        self.disp_s = self.disp_s * decay + t0
        self.disp_ss = self.disp_ss * decay + t0 * t0
        w = np.maximum(self.disp_w, 1e-300)
        mean = self.disp_s / w
        var = np.maximum(self.disp_ss / w - mean * mean, 0.0)
        dispersion = var / np.maximum(mean, 1e-300)  # mean 0: D 0, floored at 1 (Poisson) below
        ready = (self.n_obs >= self.config.warmup_s) & (self.disp_w > 0)
        dispersion[~ready] = np.nan  # not yet: no forecast
        mu = np.stack(
            [self.h * self.rate, self.h * self.level + self.trend * self._holt_sum, self.last_mu]
        )  # [3, N, C]
        out[...] = fast_count_quantiles(mu, dispersion, QUANTILES)

    def _combine(self, experts: np.ndarray) -> np.ndarray:
        cfg = self.config
        # loss_count is sum(lam ** i, i < scored) exactly (it moves only when scored), so this is
        # "scored >= min_scored" without a counter of its own
        eligible = np.isfinite(experts) & (self.loss_count >= self._min_count) & self._combined
        with np.errstate(divide="ignore"):
            mean = (self.loss_sum + 1e-300) / (self.loss_count * eligible)  # not eligible: x / 0 = inf
        best = mean.min(axis=0)  # inf where no expert is eligible yet
        if cfg.rule == "best":
            w = np.zeros_like(mean)
            np.put_along_axis(w, mean.argmin(axis=0)[None], 1.0, axis=0)  # ties: the first (the network)
        else:
            with np.errstate(invalid="ignore"):
                rel = mean / best  # inf / inf (nothing eligible): NaN, weight 0 below
            w = np.exp(-cfg.eta * (np.fmax(rel, 1.0) - 1.0))
        w *= eligible
        w[0] += ~eligible.any(axis=0)  # nothing scored yet: the network alone
        w /= w.sum(axis=0)
        self.weights = w
        out: np.ndarray = (w * np.fmax(experts, 0.0)).sum(axis=0)  # [N, C, Q]; fmax: NaN (weight 0) adds 0
        out += experts[0] * 0.0  # no network forecast (NaN): no forecast
        np.maximum(out[..., 1], out[..., 0], out=out[..., 1])  # the p90 never below the p50
        return out


def observed_values(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The three rate channels of raw inputs ``x [..., len(CHANNELS)]``, NaN where not observed (mask False,
    not finite, or negative)."""
    v = np.asarray(x, dtype=np.float64)[..., _IDX]
    ok = np.asarray(mask, dtype=bool)[..., _IDX] & np.isfinite(v) & (v >= 0)
    return np.where(ok, v, np.nan)


class CombinedForecaster:
    """A :class:`Forecaster` whose p50/p90 are the online combination of ``inner`` (the network) with the
    EWMA, Holt and last-value experts; ``burst_prob`` is ``inner``'s. ``last_raw`` is ``inner``'s own batch
    of the last ``step`` (for reports that show both)."""

    def __init__(self, inner: Forecaster, config: CombinationConfig | None = None) -> None:
        self.inner = inner
        self.config = config or CombinationConfig()
        self.name = f"{inner.name}+combination"
        self.horizon_s = inner.horizon_s
        self.last_raw: ForecastBatch | None = None
        self._state = OnlineCombination(0, self.horizon_s, self.config)
        self._node_ids: tuple[str, ...] = ()

    @property
    def schema(self) -> FeatureSchema:
        """The inner model's feature schema (``train-forecaster evaluate`` builds inputs with it)."""
        schema = getattr(self.inner, "schema", None)
        if schema is None:
            raise AttributeError(f"{self.inner.name} has no feature schema")
        return cast("FeatureSchema", schema)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._node_ids

    @property
    def state(self) -> OnlineCombination:
        """The combination's per-node state (read it; ``reset`` replaces it)."""
        return self._state

    @property
    def weights(self) -> np.ndarray:
        """``[N, len(EXPERTS), 3, 2]``: the weights of the last step (experts × channels × p50/p90)."""
        return np.moveaxis(self._state.weights, 0, 1)

    def reset(self, node_ids: Sequence[str]) -> None:
        self.inner.reset(node_ids)
        self._node_ids = tuple(node_ids)
        self._state = OnlineCombination(len(self._node_ids), self.horizon_s, self.config)
        self.last_raw = None

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        raw = self.inner.step(x, mask, now_s=now_s)
        self.last_raw = raw
        net = np.stack(
            [np.stack([getattr(raw, f) for f in pair], axis=-1) for pair in _FIELDS], axis=1
        )  # [N, C, Q]
        out = self._state.update(observed_values(x, mask), net)
        fields = {f: out[:, k, j].copy() for k, pair in enumerate(_FIELDS) for j, f in enumerate(pair)}
        return ForecastBatch(
            node_ids=raw.node_ids,
            horizon_s=raw.horizon_s,
            burst_prob=raw.burst_prob,
            model_version=f"{raw.model_version}+combination",
            **fields,
        )

    def predict_sequence(
        self, x: np.ndarray, mask: np.ndarray, times_s: np.ndarray, **kwargs: object
    ) -> SequenceForecast:
        """Offline: the inner model's ``predict_sequence``, then :meth:`combine_sequence` (equal to stepping)."""
        raw = self.inner.predict_sequence(x, mask, times_s, **kwargs)  # type: ignore[attr-defined]
        return self.combine_sequence(x, mask, raw)

    @overload
    def combine_sequence(
        self,
        x: np.ndarray,
        mask: np.ndarray,
        raw: SequenceForecast,
        *,
        return_weights: Literal[False] = False,
    ) -> SequenceForecast: ...

    @overload
    def combine_sequence(
        self, x: np.ndarray, mask: np.ndarray, raw: SequenceForecast, *, return_weights: Literal[True]
    ) -> tuple[SequenceForecast, np.ndarray]: ...

    def combine_sequence(
        self, x: np.ndarray, mask: np.ndarray, raw: SequenceForecast, *, return_weights: bool = False
    ) -> SequenceForecast | tuple[SequenceForecast, np.ndarray]:
        """The combination of ``raw`` (the inner model's forecasts at every step of ``x [N, T, C]``), as if
        each node were ``reset`` then ``step``-ped: the p50 and p90 of the three targets are replaced.
        ``return_weights``: also the weights of every step, ``[N, T, len(EXPERTS), 3, 2]``."""
        if tuple(raw.targets) != TARGETS:
            raise ValueError(f"combine_sequence: targets {raw.targets} are not {TARGETS}")
        qi = [raw.quantiles.index(q) for q in QUANTILES]
        vals = observed_values(x, mask)  # [N, T, C]
        n, t = vals.shape[:2]
        if raw.totals.shape[:2] != (n, t):
            raise ValueError(
                f"combine_sequence: forecasts {raw.totals.shape} do not match inputs {vals.shape}"
            )
        state = OnlineCombination(n, raw.horizon_s, self.config)
        totals = np.array(raw.totals, dtype=np.float64, copy=True)
        weights = np.empty((n, t, len(EXPERTS), *state.weights.shape[2:])) if return_weights else None
        for i in range(t):
            totals[:, i][..., qi] = state.update(vals[:, i], raw.totals[:, i][..., qi])
            if weights is not None:
                weights[:, i] = np.moveaxis(state.weights, 0, 1)
        out = dataclasses.replace(raw, totals=totals, model_version=f"{raw.model_version}+combination")
        return (out, weights) if weights is not None else out
