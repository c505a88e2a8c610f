"""Which forecaster the controller runs: the shipped (or configured) checkpoint, else a baseline; the
learned one optionally inside the online forecast combination (``with_combination``), and optionally the
training-free onset detector on top (``with_onset_detector``).

The controller never imports torch: the checkpoint is read and checked with numpy
(``forecaster.checkpoint.read_checkpoint``) and stepped by ``forecaster.inference.NumpyLearnedForecaster``, the
same network in numpy (torch is for training, export and ``train-forecaster evaluate``). The onset detector
needs neither torch nor statsmodels.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

import forecaster
from forecaster.baselines import CountBaseline, Holt
from forecaster.burst import OnsetBoostedForecaster, OnsetDetectorConfig
from forecaster.combination import CombinationConfig, CombinedForecaster
from forecaster.types import CHANNELS, ForecastBatch, Forecaster

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT = Path(forecaster.__file__).parent / "checkpoints" / "default.safetensors"


def with_onset_detector(forecaster: Forecaster, config: OnsetDetectorConfig | None = None) -> Forecaster:
    """``forecaster`` with its ``burst_prob`` raised to the onset detector's score (``OnsetBoostedForecaster``;
    name ``<inner>+onset``). Already wrapped: returned as it is (one detector, not two). The detector reads
    the ``arrival_rps`` channel once per ``step`` as that second's arrivals, so it is meant for 1-s steps.

    Example: ``fc = with_onset_detector(load_default_forecaster())``
    """
    if isinstance(forecaster, OnsetBoostedForecaster):
        return forecaster
    return OnsetBoostedForecaster(forecaster, config)


def with_combination(forecaster: Forecaster, config: CombinationConfig | None = None) -> Forecaster:
    """``forecaster`` inside the online combination with the EWMA, Holt and last-value experts
    (``forecaster.combination.CombinedForecaster``; name ``<inner>+combination``): its p50/p90 per pool
    become a weighted mix, by recent realised loss, of the network's and the baselines' (burst_prob stays
    the network's). A baseline (the Holt fallback), an already combined forecaster or one with the onset
    detector on top (combine first, then add the detector) is returned as it is.
    Like the baselines, it reads the rate channels as per-second counts: meant for ``tick_s = 1``."""
    if isinstance(forecaster, CombinedForecaster | CountBaseline | OnsetBoostedForecaster):
        return forecaster
    return CombinedForecaster(forecaster, config)


#: ``ControllerConfig.forecaster_combination``: which targets the online combination mixes.
CombinationMode = Literal["off", "arrivals", "all"]


def combination_config(mode: CombinationMode) -> CombinationConfig | None:
    """The combination's settings for a ``forecaster_combination`` mode (None = off). "arrivals" leaves the
    token forecasts to the network: in the loop the generation channel (and the prompt channel where the
    router does not count prompts at arrival) is tokens processed (capped by the pool's throughput), so
    realised token totals would score the experts against a capped load."""
    if mode == "off":
        return None
    return CombinationConfig() if mode == "all" else CombinationConfig(targets=("arrivals",))


def load_default_forecaster(
    path: Path | None = None,
    *,
    burst_detector: bool = False,
    combination: CombinationMode = "off",
    length_guard: bool = True,
) -> Forecaster:
    """Load ``path`` (default: the shipped checkpoint). A missing, corrupt or mismatched checkpoint falls
    back to the Holt baseline, logged with the reason — the controller keeps running either way.
    ``combination``: run a learned model inside ``with_combination`` with ``combination_config(mode)``
    (``ControllerConfig.forecaster_combination``; the Holt fallback is not wrapped). ``burst_detector``: wrap
    whatever was loaded (the baseline too) with ``with_onset_detector``; both off by default so the replay
    policies keep what they measure (the live daemon sets them from its config). ``length_guard`` False:
    a learned model runs without its length guard (``ControllerConfig.forecaster_length_guard``)."""
    loaded = _load(path)
    if not length_guard:
        without_length_guard(loaded)
    settings = combination_config(combination)
    if settings is not None:
        loaded = with_combination(loaded, settings)
    return with_onset_detector(loaded) if burst_detector else loaded


def _load(path: Path | None) -> Forecaster:
    ckpt = path or DEFAULT_CHECKPOINT
    if not ckpt.exists():
        log.warning("forecaster checkpoint %s not found: falling back to the Holt baseline", ckpt)
        return Holt()
    from forecaster.checkpoint import CheckpointError
    from forecaster.inference import NumpyLearnedForecaster

    try:
        learned = NumpyLearnedForecaster.load(ckpt)
    except (CheckpointError, ValueError) as exc:
        log.warning("forecaster checkpoint %s unusable (%s): falling back to the Holt baseline", ckpt, exc)
        return Holt()
    trained = trained_channels(learned.normalizer.channels, learned.normalizer.mean, learned.normalizer.std)
    if len(trained) < len(CHANNELS):
        log.info("forecaster %s was trained on %s only: the other channels are masked", ckpt.name, trained)
        return ChannelSubset(learned, trained)
    return learned


def without_length_guard(forecaster: Forecaster) -> None:
    """Switch off the length guard (``forecaster.lengths``) of the learned model in ``forecaster`` (itself or
    inside ``ChannelSubset``); anything else is left as it is."""
    from forecaster.inference import StreamingBase

    inner = forecaster.inner if isinstance(forecaster, ChannelSubset) else forecaster
    if isinstance(inner, StreamingBase):
        inner.length_range = None


def trained_channels(channels: Sequence[str], mean: Sequence[float], std: Sequence[float]) -> tuple[str, ...]:
    """Channels whose normalisation was fitted on observed data. A channel never observed in training keeps
    the identity statistics (mean 0, std 1) — values the network has never seen would push it off its
    training distribution, so they are better masked (read as unknown) than fed in."""
    return tuple(c for c, m, sd in zip(channels, mean, std, strict=True) if not (m == 0.0 and sd == 1.0))


class ChannelSubset:
    """A forecaster that sees only ``channels``: every other input is masked before each step."""

    def __init__(self, inner: Forecaster, channels: Sequence[str]) -> None:
        self.inner = inner
        self.keep = np.array([c in set(channels) for c in CHANNELS], dtype=bool)
        self.name = inner.name
        self.horizon_s = inner.horizon_s

    def reset(self, node_ids: Sequence[str]) -> None:
        self.inner.reset(node_ids)

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        return self.inner.step(x, np.asarray(mask, dtype=bool) & self.keep[None, :], now_s=now_s)
