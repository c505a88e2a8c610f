"""Lightning data module: long per-node sequences cut from time-ordered training and validation series.

Training draws ``windows_per_epoch`` random windows of ``seq_len`` steps (a new draw each epoch, seeded
from ``seed`` and the epoch), with random channel masking and a random time of day (trace files cover a
few minutes of one day: the model must not learn that 18:20 UTC means bursts). Validation uses fixed
windows, ``seq_len - burn_in`` apart, so every validation step after the first burn-in is scored once;
no masking, no augmentation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from forecaster.features import (
    DEFAULT_SCHEMA,
    FeatureSchema,
    Normalizer,
    descriptor_series,
    encode_inputs,
    level_offsets,
    level_series,
)
from forecaster.lengths import TOKEN_CHANNELS
from training.augment import MaskingConfig, mask_channels
from training.data import NodeSeries, cut_window, window_starts

_DAY_S = 86_400.0
DEFAULT_HORIZON_S = 5.0
"""The horizon assumed for series that do not say theirs (``NodeSeries.horizon_s`` None) on absolute schemas."""


def resolve_horizon(
    series: Sequence[NodeSeries], horizon_s: float | None, schema: FeatureSchema, where: str
) -> float:
    """The horizon the targets of ``series`` were built for, checked against ``horizon_s`` when given.

    Level-relative schemas decode each target with ``log1p(horizon_s * level)``: a horizon other than the
    one the totals were summed over would silently mis-scale every target, so a mismatch (or a mix of
    horizons) is an error naming the series; a level-relative schema with no known horizon is one too.
    """
    known = {float(s.horizon_s) for s in series if s.horizon_s is not None}
    if len(known) > 1:
        by = {h: next(s.name for s in series if s.horizon_s == h) for h in sorted(known)}
        raise ValueError(
            f"{where}: the series were built for different horizons: "
            + ", ".join(f"{h:g} s (e.g. {n!r})" for h, n in by.items())
        )
    if horizon_s is not None and known and float(horizon_s) not in known:
        (h,) = known
        name = next(s.name for s in series if s.horizon_s is not None)
        raise ValueError(
            f"{where}: horizon_s={horizon_s:g} but the series' targets are totals over {h:g} s "
            f"(e.g. {name!r}, built with LabelConfig.horizon_s={h:g}); pass horizon_s={h:g}"
        )
    if horizon_s is not None:
        return float(horizon_s)
    if known:
        return known.pop()
    if schema.level_relative:
        raise ValueError(
            f"{where}: a level-relative schema needs the targets' horizon, and no series says it "
            "(NodeSeries.horizon_s is None): pass horizon_s"
        )
    return DEFAULT_HORIZON_S


@dataclass(frozen=True)
class WindowConfig:
    """Shape of the training sequences.

    ``seq_len``: steps per sequence (256 s: several attention windows, often a burst and its aftermath).
    ``burn_in``: first steps of each sequence not scored (the LSTM state is still warming up).
    ``windows_per_epoch``: random training sequences drawn per epoch. ``batch_size``: sequences per step.
    """

    seq_len: int = 256
    burn_in: int = 32
    batch_size: int = 16
    windows_per_epoch: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.seq_len < 2:
            problems.append(f"seq_len must be >= 2, got {self.seq_len}")
        if not 0 <= self.burn_in < self.seq_len:
            problems.append(f"burn_in must be in [0, seq_len), got {self.burn_in} (seq_len {self.seq_len})")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if self.windows_per_epoch < 1:
            problems.append(f"windows_per_epoch must be >= 1, got {self.windows_per_epoch}")
        if problems:
            raise ValueError("WindowConfig: " + "; ".join(problems))


class SequenceDataset(Dataset[dict[str, torch.Tensor]]):
    """Windows ``(series, start)`` of a list of node series, encoded for the network.

    Item: ``x`` float32 ``[L, F_in]``, ``y`` float32 ``[L, K]`` normalised targets (NaN = not scored),
    ``burst`` float32 ``[L]`` (NaN = not scored). With ``masking``, item ``i`` of epoch ``e`` hides
    channels drawn from ``rng(seed, e, i)``, so a run is reproducible. ``horizon_s``: the targets' horizon,
    by default the series' own (``resolve_horizon``: a mismatch is an error).
    """

    def __init__(
        self,
        series: Sequence[NodeSeries],
        starts: np.ndarray,
        *,
        seq_len: int,
        normalizer: Normalizer,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        masking: MaskingConfig | None = None,
        random_time_of_day: bool = False,
        seed: int = 0,
        epoch: int = 0,
        horizon_s: float | None = None,
    ) -> None:
        self.series = list(series)
        self.horizon_s = resolve_horizon(self.series, horizon_s, schema, "SequenceDataset")
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1, 2)
        self.seq_len = seq_len
        self.normalizer = normalizer
        self.schema = schema
        self.masking = masking
        self._token_columns = tuple(i for i, c in enumerate(schema.channels) if c in TOKEN_CHANNELS)
        self.random_time_of_day = random_time_of_day
        self.seed = seed
        self.epoch = epoch
        # per-pool descriptors (schema v2) of each WHOLE series, before any channel masking: a window sees
        # what the forecaster would have accumulated over the node's history up to each of its steps
        self._desc: dict[int, np.ndarray] = {}

    def _descriptors(self, s_idx: int, start: int) -> np.ndarray | None:
        if not self.schema.descriptors:
            return None
        if s_idx not in self._desc:
            x = self.series[s_idx].x_raw
            self._desc[s_idx] = descriptor_series(x, np.isfinite(x), self.schema).astype(np.float32)
        d = self._desc[s_idx][start : start + self.seq_len]
        pad = self.seq_len - d.shape[0]
        return np.concatenate([d, np.zeros((pad, d.shape[1]), np.float32)]) if pad > 0 else d

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s_idx, start = (int(v) for v in self.starts[i])
        series = self.series[s_idx]
        x_raw, totals, burst = cut_window(series, start, self.seq_len)
        rng = np.random.default_rng([self.seed, self.epoch, i])
        if self.masking is not None:
            x_raw = mask_channels(x_raw, rng, self.masking, self._token_columns)
        t0 = float(rng.uniform(0, _DAY_S)) if self.random_time_of_day else series.t0_unix_s
        if not np.isfinite(t0):
            t0 = 0.0  # unknown wall time: midnight (time features carry no information then)
        times = t0 + start * self.schema.step_s + self.schema.step_s * np.arange(self.seq_len)
        mask = np.isfinite(x_raw)
        # level-relative schema: the window's own trailing levels, after masking, from its first step (what
        # a forecaster reset at the window start would hold; the level EWMA has no warm-up bias)
        levels = level_series(x_raw, mask, self.schema) if self.schema.level_relative else None
        x = encode_inputs(
            x_raw, mask, self.normalizer, times, self.schema, self._descriptors(s_idx, start), levels
        )
        y_off = level_offsets(levels, self.schema, self.horizon_s)[1] if levels is not None else None
        y = self.normalizer.normalize_targets(totals, y_off).astype(np.float32)
        return {"x": torch.from_numpy(x), "y": torch.from_numpy(y), "burst": torch.from_numpy(burst)}


def random_starts(lengths: Sequence[int], seq_len: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random ``(series, start)`` pairs; a series is drawn in proportion to its usable length."""
    if not lengths:
        raise ValueError("random_starts: no series to draw from")
    usable = np.array([max(1, n_t - seq_len + 1) for n_t in lengths], dtype=np.float64)
    which = rng.choice(len(lengths), size=n, p=usable / usable.sum())
    starts = np.floor(rng.random(n) * usable[which]).astype(np.int64)
    return np.stack([which.astype(np.int64), starts], axis=1)


def fit_normalizer(
    series: Sequence[NodeSeries], schema: FeatureSchema = DEFAULT_SCHEMA, *, horizon_s: float | None = None
) -> Normalizer:
    """Normalisation statistics of the given (training) series only (level-relative schemas: of the values
    relative to each series' own trailing levels; ``horizon_s`` as in ``resolve_horizon``)."""
    if not series:
        raise ValueError("fit_normalizer: no training series")
    horizon_s = resolve_horizon(series, horizon_s, schema, "fit_normalizer")
    x = np.concatenate([s.x_raw for s in series]).astype(np.float64)
    totals = np.concatenate([s.totals for s in series]).astype(np.float64)
    x_off = y_off = None
    if schema.level_relative:
        offs = [
            level_offsets(level_series(s.x_raw, np.isfinite(s.x_raw), schema), schema, horizon_s)
            for s in series
        ]
        x_off = np.concatenate([o[0] for o in offs])
        y_off = np.concatenate([o[1] for o in offs])
    return Normalizer.fit(x, np.isfinite(x), totals, schema=schema, input_offsets=x_off, target_offsets=y_off)


class ForecastDataModule(L.LightningDataModule):
    """Training and validation sequences for :class:`training.module.ForecastModule`.

    ``train`` and ``val`` are already split by time (see ``training.data.split_trace``); the normaliser
    must have been fitted on ``train`` only (``fit_normalizer``). ``horizon_s``: the targets' horizon, by
    default the series' own; a mismatch is an error (``resolve_horizon``).
    """

    def __init__(
        self,
        train: Sequence[NodeSeries],
        val: Sequence[NodeSeries],
        normalizer: Normalizer,
        config: WindowConfig = WindowConfig(),
        *,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        masking: MaskingConfig | None = MaskingConfig(),
        num_workers: int = 0,
        horizon_s: float | None = None,
    ) -> None:
        super().__init__()
        if not train:
            raise ValueError("ForecastDataModule: no training series")
        self.horizon_s = resolve_horizon([*train, *val], horizon_s, schema, "ForecastDataModule")
        self.train_series = list(train)
        self.val_series = list(val)
        self.normalizer = normalizer
        self.config = config
        self.schema = schema
        self.masking = masking
        self.num_workers = num_workers

    def _epoch(self) -> int:
        trainer = getattr(self, "trainer", None)
        return int(trainer.current_epoch) if trainer is not None else 0

    def train_dataset(self, epoch: int) -> SequenceDataset:
        """The random windows of ``epoch`` (deterministic given the seed)."""
        rng = np.random.default_rng([self.config.seed, epoch, 7])
        starts = random_starts(
            [len(s) for s in self.train_series], self.config.seq_len, self.config.windows_per_epoch, rng
        )
        return SequenceDataset(
            self.train_series,
            starts,
            seq_len=self.config.seq_len,
            normalizer=self.normalizer,
            schema=self.schema,
            masking=self.masking,
            random_time_of_day=True,
            seed=self.config.seed,
            epoch=epoch,
            horizon_s=self.horizon_s,
        )

    def val_dataset(self) -> SequenceDataset:
        """Fixed windows over the validation series, each scored step once."""
        stride = self.config.seq_len - self.config.burn_in
        starts = window_starts([len(s) for s in self.val_series], self.config.seq_len, stride)
        return SequenceDataset(
            self.val_series,
            starts,
            seq_len=self.config.seq_len,
            normalizer=self.normalizer,
            schema=self.schema,
            masking=None,
            random_time_of_day=False,
            seed=self.config.seed,
            horizon_s=self.horizon_s,
        )

    def train_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return DataLoader(
            self.train_dataset(self._epoch()),
            batch_size=self.config.batch_size,
            shuffle=False,  # the windows are already a random draw
            num_workers=self.num_workers,
            persistent_workers=False,
        )

    def val_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        if not self.val_series:
            return DataLoader(_Empty(), batch_size=1)
        return DataLoader(self.val_dataset(), batch_size=self.config.batch_size, num_workers=self.num_workers)


class _Empty(Dataset[Any]):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)
