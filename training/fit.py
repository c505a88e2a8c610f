"""Fitting the forecaster end to end: sources → time-ordered splits → augmented series → Lightning → checkpoint.

``build_series`` is pure (numpy, seeded); ``fit_forecaster`` runs Lightning and writes, under ``out``:

- ``lightning/`` — CSV logs (TensorBoard too when installed) and the best-epoch Lightning ``.ckpt``;
- ``forecaster.safetensors`` — the inference checkpoint (``forecaster.checkpoint.save_checkpoint``):
  weights, feature schema, normaliser fitted on the training split only, horizon, and a training-data
  summary (sources, sha256, rows, spans, split cuts, augmentation, validation scores, code version).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from forecaster.burst import burst_onsets
from forecaster.features import (
    DEFAULT_SCHEMA,
    FeatureSchema,
    Normalizer,
    baseline_columns,
    frame_to_inputs,
)
from forecaster.lengths import training_length_range
from forecaster.types import CHANNELS, MetricFrame
from serving.workload.trace import Trace
from training.augment import (
    MaskingConfig,
    drift_tokens,
    rate_scale,
    scale_tokens,
    superpose,
    thin,
    time_scale,
)
from training.data import (
    NodeSeries,
    node_series_from_trace,
    node_series_from_values,
    split_trace,
)
from training.datamodule import WindowConfig

SyntheticFn = Callable[[np.random.Generator, float], Trace]
"""``(rng, duration_s) -> Trace``: bursty synthetic traffic (the workload generator's MMPP)."""


@dataclass(frozen=True)
class AugmentConfig:
    """How many and which augmented copies of each training trace are made (all from the training part).

    Each copy draws, log-uniformly: a replay ``speed`` in ``speed_range``, a ``rate`` factor in
    ``rate_range`` (thinning / superposition of shifted copies) and prompt/output token factors in
    ``token_range``; with ``superpose_prob`` it is also merged with another source's training part.
    ``synthetic_traces`` bursty traces of ``synthetic_duration_s`` come from the workload generator.
    ``token_drift`` > 0: each copy's lengths also drift over time (``training.augment.drift_tokens``, log-space
    standard deviation ``token_drift``, correlation time ``token_drift_s``); 0 (the default) draws nothing
    more, so the copies are those of a fit without it.
    """

    copies_per_source: int = 12
    speed_range: tuple[float, float] = (0.5, 2.0)
    rate_range: tuple[float, float] = (0.2, 12.0)
    token_range: tuple[float, float] = (0.5, 2.0)
    superpose_prob: float = 0.25
    synthetic_traces: int = 8
    synthetic_duration_s: float = 1800.0
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    token_drift: float = 0.0
    token_drift_s: float = 300.0

    def __post_init__(self) -> None:
        problems = []
        for name in ("speed_range", "rate_range", "token_range"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                problems.append(f"{name} must satisfy 0 < low <= high, got {(lo, hi)}")
        if self.copies_per_source < 0 or self.synthetic_traces < 0:
            problems.append("copies_per_source and synthetic_traces must be >= 0")
        if not 0 <= self.superpose_prob <= 1:
            problems.append(f"superpose_prob must be in [0, 1], got {self.superpose_prob}")
        if not (self.token_drift >= 0 and np.isfinite(self.token_drift)):
            problems.append(f"token_drift must be >= 0 (0 = off), got {self.token_drift}")
        if not (self.token_drift_s > 0 and np.isfinite(self.token_drift_s)):
            problems.append(f"token_drift_s must be > 0 seconds, got {self.token_drift_s}")
        if problems:
            raise ValueError("AugmentConfig: " + "; ".join(problems))


@dataclass(frozen=True)
class LabelConfig:
    """Targets: totals over ``horizon_s``; burst label 1 from ``lead_s`` before an onset to ``after_s`` after."""

    horizon_s: int = 5
    lead_s: int = 3
    after_s: int = 2
    holdout_frac: float = 0.3
    val_frac: float = 0.1

    def onsets(self, arrivals: np.ndarray) -> np.ndarray:
        return burst_onsets(arrivals, horizon_s=self.horizon_s)


@dataclass(frozen=True, eq=False)
class TraceSource:
    """A training trace and where it came from (``sha256`` of the file, None for generated traffic)."""

    name: str
    trace: Trace
    sha256: str | None = None


@dataclass(frozen=True, eq=False)
class FrameSource:
    """Per-node metric history (e.g. from Prometheus): every node becomes one training series.

    The frame may carry channels by name (``training.prometheus_history``) or raw vLLM metrics; both
    are mapped by ``forecaster.features.frame_to_inputs``, the function the controller uses at inference.
    """

    name: str
    frame: MetricFrame
    #: the summary's ``kind``: "prometheus", or "replay" (``training.replay_frames``: a trace replayed through
    #: the simulator); ``info`` is added to the source's summary entry (what was replayed: trace sha, policy, ...)
    kind: str = "prometheus"
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class SeriesSet:
    """What ``build_series`` returns: training and validation series and a JSON-ready summary."""

    train: list[NodeSeries]
    val: list[NodeSeries]
    summary: dict[str, Any]


def _log_uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    lo, hi = lo_hi
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def augmented_copies(
    train_parts: Sequence[Trace], config: AugmentConfig, rng: np.random.Generator
) -> list[tuple[str, Trace]]:
    """``copies_per_source`` augmented variants of every training part (named for the logs)."""
    out: list[tuple[str, Trace]] = []
    for i, part in enumerate(train_parts):
        if len(part) < 2:
            continue
        for k in range(config.copies_per_source):
            speed = _log_uniform(rng, config.speed_range)
            rate = _log_uniform(rng, config.rate_range)
            p_fac, o_fac = _log_uniform(rng, config.token_range), _log_uniform(rng, config.token_range)
            t = time_scale(part, speed)
            t = rate_scale(t, rate, rng)
            desc = f"src{i}#{k} speed={speed:.2f} rate={rate:.2f} tokens={p_fac:.2f}/{o_fac:.2f}"
            if len(train_parts) > 1 and rng.random() < config.superpose_prob:
                j = int(rng.choice([j for j in range(len(train_parts)) if j != i]))
                other = thin(train_parts[j], float(rng.uniform(0.2, 1.0)), rng)
                if len(other):
                    t = superpose([t, other], [0.0, float(t.arrival_s[0] - other.arrival_s[0])])
                    desc += f" +src{j}"
            if len(t) >= 2:
                t = scale_tokens(t, p_fac, o_fac)
                if config.token_drift > 0:
                    t = drift_tokens(t, config.token_drift, config.token_drift_s, rng)
                    desc += f" drift={config.token_drift:g}"
                out.append((desc, t))
    return out


def build_series(
    traces: Sequence[TraceSource],
    frames: Sequence[FrameSource] = (),
    *,
    labels: LabelConfig = LabelConfig(),
    augment: AugmentConfig = AugmentConfig(),
    synthetic: SyntheticFn | None = None,
    synthetic_info: dict[str, Any] | None = None,
    seed: int = 0,
) -> SeriesSet:
    """Split every source by time, augment the training parts, and build per-node series with targets.

    Validation series are the later ``val_frac`` of each source (never augmented); the last
    ``holdout_frac`` is held out entirely (for evaluation). Synthetic traces get their own validation
    traces (different draws), so they count in the validation loss without leaking. ``synthetic_info``
    (e.g. the shapes and rates ``synthetic`` draws) is added to the synthetic source's summary entry.
    """
    if not traces and not frames and (synthetic is None or augment.synthetic_traces == 0):
        raise ValueError("build_series: no training sources (give traces, frames, or synthetic traffic)")
    rng = np.random.default_rng(seed)
    train: list[NodeSeries] = []
    val: list[NodeSeries] = []
    kw: dict[str, Any] = {
        "horizon_s": labels.horizon_s,
        "onsets": labels.onsets,
        "lead_s": labels.lead_s,
        "after_s": labels.after_s,
    }
    sources: list[dict[str, Any]] = []
    train_parts: list[Trace] = []
    for src in traces:
        sp = split_trace(src.trace, holdout_frac=labels.holdout_frac, val_frac=labels.val_frac)
        t0 = float(src.trace.arrival_s[0])
        train.append(node_series_from_trace(src.name, sp.train, t0_s=t0, t1_s=sp.cut_val_s, **kw))
        if sp.cut_test_s > sp.cut_val_s:
            val.append(node_series_from_trace(src.name, sp.val, t0_s=sp.cut_val_s, t1_s=sp.cut_test_s, **kw))
        train_parts.append(sp.train)
        sources.append(
            {
                "kind": "trace",
                "source": src.name,
                "format": src.trace.format,
                "sha256": src.sha256,
                "rows": len(src.trace),
                "span_s": src.trace.duration_s,
                "start_time": src.trace.start_time.isoformat() if src.trace.start_time else None,
                "train_rows": len(sp.train),
                "train_until_s": sp.cut_val_s - t0,
                "val_until_s": sp.cut_test_s - t0,
                "holdout_from_s": sp.cut_test_s - t0,
            }
        )
    for desc, t in augmented_copies(train_parts, augment, rng):
        train.append(
            node_series_from_trace(desc, t, t0_s=float(t.arrival_s[0]), t1_s=float(t.arrival_s[-1]) + 1, **kw)
        )
    if synthetic is not None:
        for k in range(augment.synthetic_traces):
            for target, frac in ((train, 1.0), (val, augment_val_frac(labels))):
                t = synthetic(rng, augment.synthetic_duration_s * frac)
                if len(t) >= 2:
                    target.append(
                        node_series_from_trace(
                            f"synthetic#{k}", t, t0_s=0.0, t1_s=float(t.arrival_s[-1]) + 1, **kw
                        )
                    )
        sources.append(
            {
                "kind": "synthetic",
                "traces": augment.synthetic_traces,
                "duration_s": augment.synthetic_duration_s,
                **(synthetic_info or {}),
            }
        )
    for fsrc in frames:
        train_f, val_f, info = _frame_series(fsrc, labels, kw)
        train += train_f
        val += val_f
        sources.append(info)
    lengths = training_length_range(
        [(s.x_raw, np.isfinite(s.x_raw)) for s in train], CHANNELS
    )  # the length guard's range (forecaster.lengths): what the network will have seen
    summary = {
        "sources": sources,
        "train_series": len(train),
        "train_steps": int(sum(len(s) for s in train)),
        "val_series": len(val),
        "val_steps": int(sum(len(s) for s in val)),
        "train_onsets": int(sum(_count_onsets(s) for s in train)),
        "val_onsets": int(sum(_count_onsets(s) for s in val)),
        "labels": asdict(labels),
        "augment": _jsonable(asdict(augment)),
        "seed": seed,
        "length_range": None if lengths is None else lengths.to_doc(),
    }
    return SeriesSet(train=train, val=val, summary=summary)


def augment_val_frac(labels: LabelConfig) -> float:
    """Length of a synthetic validation trace relative to a training one (same ratio as for real sources)."""
    train_frac = 1.0 - labels.holdout_frac - labels.val_frac
    return max(labels.val_frac / train_frac, 0.1) if train_frac > 0 else 0.1


def _count_onsets(s: NodeSeries) -> int:
    # onsets are where the label switches on (each labelled band is one onset)
    b = np.nan_to_num(s.burst, nan=0.0)
    return int(((b[1:] > 0) & (b[:-1] == 0)).sum() + (b[:1] > 0).sum())


def _frame_series(
    src: FrameSource, labels: LabelConfig, kw: dict[str, Any]
) -> tuple[list[NodeSeries], list[NodeSeries], dict[str, Any]]:
    frame = src.frame
    n_t = len(frame.times_s)
    step_s = float(frame.times_s[1] - frame.times_s[0]) if n_t > 1 else 1.0
    cut_val = int(n_t * (1.0 - labels.holdout_frac - labels.val_frac))
    cut_test = int(n_t * (1.0 - labels.holdout_frac))
    train: list[NodeSeries] = []
    val: list[NodeSeries] = []
    # channels by name, or derived from raw vLLM metrics (counters → rates) by the forecaster's own mapping
    x_all, _ = frame_to_inputs(frame, DEFAULT_SCHEMA)  # [N, T, C]
    for n, node in enumerate(frame.node_ids):
        x = x_all[n]
        t0 = float(frame.times_s[0])
        train.append(
            node_series_from_values(f"{src.name}/{node}", x[:cut_val], step_s=step_s, t0_unix_s=t0, **kw)
        )
        if cut_test > cut_val:
            val.append(
                node_series_from_values(
                    f"{src.name}/{node}",
                    x[cut_val:cut_test],
                    step_s=step_s,
                    t0_unix_s=t0 + cut_val * step_s,
                    **kw,
                )
            )
    info = {
        "kind": src.kind,
        "source": src.name,
        "nodes": list(frame.node_ids),
        "steps": n_t,
        "step_s": step_s,
        "start_unix_s": float(frame.times_s[0]) if n_t else None,
        "train_steps": cut_val,
        "val_steps": cut_test - cut_val,
        "observed_fraction": float(np.isfinite(frame.values).mean()) if frame.values.size else 0.0,
        **src.info,
    }
    return train, val, info


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


@dataclass(frozen=True)
class TrainerConfig:
    """Lightning Trainer settings (``accelerator="auto"`` picks a GPU when there is one)."""

    max_epochs: int = 40
    max_minutes: float | None = None
    patience: int = 15
    gradient_clip_val: float = 1.0
    accelerator: str = "auto"
    devices: str = "auto"
    strategy: str = "auto"
    precision: str = "32-true"
    progress: bool = True
    num_threads: int | None = None


@dataclass(frozen=True, eq=False)
class FitResult:
    """Where things were written and how the run went."""

    checkpoint: Path
    lightning_ckpt: Path | None
    model_version: str
    best_val_loss: float
    epochs: int
    train_windows_per_s: float
    wall_s: float
    summary: dict[str, Any]


def fit_forecaster(
    series: SeriesSet,
    out: Path,
    *,
    window: WindowConfig = WindowConfig(),
    net_hidden: int = 64,
    net_layers: int = 2,
    net_heads: int = 4,
    net_window: int = 60,
    net_baseline_halflives: tuple[float, ...] = (),
    lr: float = 3e-3,
    burst_weight: float = 0.5,
    burst_pos_weight: float = 4.0,
    trainer: TrainerConfig = TrainerConfig(),
    schema: FeatureSchema = DEFAULT_SCHEMA,
    masking: MaskingConfig | None = MaskingConfig(),
    horizon_s: float | None = None,
    checkpoint_name: str = "forecaster.safetensors",
    log: Callable[[str], None] = print,
    resume: Path | None = None,
) -> FitResult:
    """Train with Lightning and write the inference checkpoint; see the module docstring for the layout.

    ``resume``: a Lightning ``.ckpt`` of an earlier run of the same command (e.g. ``OUT/lightning/
    checkpoints/last.ckpt`` after ``--max-minutes`` stopped it); training continues from its epoch with its
    optimiser, scheduler and early-stopping state. Epoch draws are seeded by epoch, so ``--epochs N`` in
    one sitting and the same run resumed up to N epochs train on the same data.

    ``horizon_s``: the targets' horizon (stored in the checkpoint); by default the series' own
    (``LabelConfig.horizon_s`` of ``build_series``); a different value is an error.
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar
    from lightning.pytorch.loggers import CSVLogger, Logger

    from forecaster.checkpoint import save_checkpoint
    from forecaster.network import NetConfig
    from training.datamodule import ForecastDataModule, fit_normalizer, resolve_horizon
    from training.module import ForecastModule, OptimConfig

    started = time.perf_counter()
    if trainer.num_threads is not None:
        torch.set_num_threads(trainer.num_threads)
    L.seed_everything(window.seed, workers=True, verbose=False)
    horizon_s = resolve_horizon([*series.train, *series.val], horizon_s, schema, "fit_forecaster")
    normalizer = fit_normalizer(series.train, schema, horizon_s=horizon_s)
    dm = ForecastDataModule(
        series.train, series.val, normalizer, window, schema=schema, masking=masking, horizon_s=horizon_s
    )
    base_inputs, base_masks = baseline_columns(schema) if net_baseline_halflives else ((), ())
    net_cfg = NetConfig(
        n_inputs=schema.n_inputs,
        hidden=net_hidden,
        layers=net_layers,
        heads=net_heads,
        window=net_window,
        n_targets=len(schema.targets),
        baseline_halflives=tuple(net_baseline_halflives),
        baseline_inputs=base_inputs,
        baseline_masks=base_masks,
    )
    optim = OptimConfig(
        lr=lr,
        burn_in=window.burn_in,
        burst_weight=burst_weight,
        burst_pos_weight=burst_pos_weight,
        max_epochs=trainer.max_epochs,
        has_val=bool(series.val),
        horizon_steps=round(horizon_s / schema.step_s),
    )
    extra = {
        "schema": schema.to_dict(),
        "normalizer": normalizer.to_dict(),
        "horizon_s": float(horizon_s),
        "summary": series.summary,
    }
    module = ForecastModule(net_cfg.to_dict(), asdict(optim), extra)
    out.mkdir(parents=True, exist_ok=True)
    loggers: list[Logger] = [CSVLogger(str(out), name="lightning")]
    try:
        import tensorboard  # noqa: F401
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(str(out), name="lightning"))
    except ImportError:
        pass
    has_val = bool(series.val)
    monitor = "val_loss" if has_val else "train_loss"
    ckpt_dir = str(out / "lightning" / "checkpoints")
    ckpt_cb = ModelCheckpoint(dirpath=ckpt_dir, monitor=monitor, mode="min", save_top_k=1)
    # the latest epoch, for --resume (save_last on a monitored callback only follows its own saves)
    last_cb = ModelCheckpoint(dirpath=ckpt_dir, filename="last", monitor=None, enable_version_counter=False)
    callbacks: list[Any] = [
        ckpt_cb,
        last_cb,
        EarlyStopping(monitor=monitor, mode="min", patience=trainer.patience),
    ]
    if trainer.progress:
        callbacks.append(RichProgressBar())
    accelerator = trainer.accelerator
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    pl_trainer = L.Trainer(
        max_epochs=trainer.max_epochs,
        max_time=timedelta(minutes=trainer.max_minutes) if trainer.max_minutes else None,
        accelerator=accelerator,
        devices=_devices(trainer.devices),
        strategy=trainer.strategy,
        precision=trainer.precision,  # type: ignore[arg-type]
        gradient_clip_val=trainer.gradient_clip_val,
        deterministic=True if on_cpu else "warn",
        logger=loggers,
        callbacks=callbacks,
        enable_progress_bar=trainer.progress,
        enable_model_summary=trainer.progress,
        reload_dataloaders_every_n_epochs=1,  # a fresh random draw of windows each epoch
        default_root_dir=str(out),
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if has_val else 0,
        log_every_n_steps=5,
    )
    fit_started = time.perf_counter()
    if resume is not None and not resume.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such Lightning checkpoint")
    pl_trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume is not None else None)
    fit_s = time.perf_counter() - fit_started
    epochs = int(pl_trainer.current_epoch)
    scored = epochs * window.windows_per_epoch * (window.seq_len - window.burn_in)
    best_path = Path(ckpt_cb.best_model_path) if ckpt_cb.best_model_path else None
    if best_path is not None and best_path.is_file():
        state = torch.load(best_path, map_location="cpu", weights_only=True)["state_dict"]
        module.load_state_dict(state)
    best = ckpt_cb.best_model_score
    best_val = float(best.item()) if best is not None else float("nan")
    meta = dict(series.summary)
    meta["run"] = {
        "epochs": epochs,
        "best_" + monitor: best_val if math.isfinite(best_val) else None,
        "window": asdict(window),
        "optim": asdict(optim),
        "trainer": _jsonable(asdict(trainer)),
        "train_windows_per_s": scored / fit_s if fit_s > 0 else None,
        "fit_wall_s": fit_s,
    }
    meta = _jsonable(meta)
    net = module.net.to("cpu").float()
    ckpt_path = out / checkpoint_name
    version = save_checkpoint(ckpt_path, net, schema, normalizer, horizon_s, meta)
    log(f"wrote {ckpt_path} (model_version {version}, best {monitor} {best_val:.4f}, {epochs} epochs)")
    return FitResult(
        checkpoint=ckpt_path,
        lightning_ckpt=best_path,
        model_version=version,
        best_val_loss=best_val,
        epochs=epochs,
        train_windows_per_s=scored / fit_s if fit_s > 0 else float("nan"),
        wall_s=time.perf_counter() - started,
        summary=meta,
    )


def _devices(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def normalizer_from_extra(extra: dict[str, Any]) -> tuple[FeatureSchema, Normalizer, float]:
    """Schema, normaliser and horizon stored in a Lightning checkpoint's hyper-parameters (``extra``)."""
    for key in ("schema", "normalizer", "horizon_s"):
        if key not in extra:
            raise ValueError(
                f"Lightning checkpoint hyper-parameters lack extra[{key!r}]: not a pdscale training run"
            )
    return (
        FeatureSchema.from_dict(extra["schema"]),
        Normalizer.from_dict(extra["normalizer"]),
        float(extra["horizon_s"]),
    )
