"""``train-forecaster evaluate``: score every baseline (and the learned model, alone and combined) on one trace.

The trace is read as ONE node's arrivals, binned per second from its first arrival. Second ``i`` is the
decision made at time ``i + 1`` s after the trace start, having seen arrivals in ``[0, i + 1)``; its target
is the number of arrivals over the next ``horizon_s`` seconds (``forecaster.features.future_sums``). Decisions
at or after ``--score-from`` are scored; everything before is history (models warm up on it, the burst
alarm threshold is chosen on it). The protocol is written out for users in ``docs/FORECASTER.md``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import numpy as np
import typer

import forecaster
from forecaster.baselines import CountBaseline, default_period_s, make_baselines
from forecaster.burst import (
    BurstScore,
    OnsetDetectorConfig,
    alarm_times,
    burst_onsets,
    choose_alarm_threshold,
    combine_burst,
    onset_scores,
    score_bursts,
)
from forecaster.combination import EXPERTS, QUANTILES, CombinationConfig, CombinedForecaster
from forecaster.features import future_sums, series_from_trace, trace_inputs
from forecaster.lengths import length_series
from forecaster.scoring import ForecastScores, poisson_noise_floor, score_forecasts
from forecaster.types import TARGETS, ForecastBatch, Forecaster
from serving.workload.trace import Trace

if TYPE_CHECKING:
    from forecaster.streaming import LearnedForecaster

#: Where the shipped checkpoint may live, in order of preference (used when ``checkpoint`` is not given):
#: the brief names ``default.safetensors``; ``training/cli.py`` names ``forecaster.safetensors``.
DEFAULT_CHECKPOINTS: tuple[Path, ...] = tuple(
    Path(forecaster.__file__).resolve().parent / "checkpoints" / name
    for name in ("default.safetensors", "forecaster.safetensors")
)
#: Default ``--score-from``: score the last 30 % of the trace.
DEFAULT_SCORE_FROM = "70%"
LEARNED = "learned"
#: The row of the learned model's online combination with the EWMA, Holt and last-value experts
#: (``forecaster.combination``); ``LEARNED`` stays the raw network's row.
COMBINED = "combined"
#: The training-free onset detector's entry in ``burst_detectors`` (``forecaster.burst.onset_scores``), and
#: the suffix of its combination (``combine_burst``: the larger of the two) with the burst model.
ONSET = "onset"


class EvaluationError(ValueError):
    """An evaluation that cannot run as asked (bad ``--score-from``, trace too short, checkpoint mismatch)."""


# ---------------------------------------------------------------------------------------------------
# --score-from


def _fmt_time(dt: datetime) -> str:
    return dt.isoformat(sep=" ", timespec="milliseconds")


def parse_score_from(text: str, trace: Trace) -> float:
    """Seconds from the trace start at which scoring begins.

    Accepts ``+SECONDS`` (from the trace's first arrival), ``PERCENT%`` of the trace's duration, or an ISO
    timestamp compared with the trace's wall-clock start (a naive time on one side and an aware one on the
    other are both read as UTC). Raises :class:`EvaluationError` for anything outside the trace.
    """
    s = text.strip()
    duration = trace.duration_s
    if not duration > 0:
        raise EvaluationError(
            f"trace {trace.source or '<memory>'} spans 0 s ({len(trace):,} request(s), all on one timestamp): "
            "there is no later second to forecast and score; evaluate needs a trace that lasts"
        )
    if m := re.fullmatch(r"\+\s*([0-9]*\.?[0-9]+)", s):
        offset = float(m.group(1))
        where = f"+{offset:g} s"
    elif m := re.fullmatch(r"([0-9]*\.?[0-9]+)\s*%", s):
        pct = float(m.group(1))
        if not 0 <= pct < 100:
            raise EvaluationError(f"--score-from {text!r}: a percentage must be in [0, 100)")
        offset = duration * pct / 100.0
        where = f"{pct:g}% = +{offset:.1f} s"
    else:
        try:
            when = datetime.fromisoformat(s)
        except ValueError as e:
            raise EvaluationError(
                f"--score-from {text!r} is neither +SECONDS, PERCENT% nor an ISO timestamp "
                "(e.g. +1400, 70%, 2023-11-16T18:40:00)"
            ) from e
        start = trace.start_time
        if start is None:
            raise EvaluationError(
                f"--score-from {text!r} is a timestamp but trace {trace.source or '<memory>'} has no "
                "wall-clock start time (its format carries none): use +SECONDS instead"
            )
        a = when if when.tzinfo else when.replace(tzinfo=UTC)
        b = start if start.tzinfo else start.replace(tzinfo=UTC)
        offset = (a - b).total_seconds()
        where = f"{text} = {offset:+.1f} s from the start {_fmt_time(start)}"
    if not 0 <= offset < duration:
        raise EvaluationError(
            f"--score-from {where} is outside trace {trace.source or '<memory>'}, which spans "
            f"+0 .. +{duration:.1f} s"
            + (
                f" ({_fmt_time(trace.start_time)} .. "
                f"{_fmt_time(datetime.fromtimestamp(trace.start_time.timestamp() + duration, trace.start_time.tzinfo))})"
                if trace.start_time is not None
                else ""
            )
        )
    return offset


# ---------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class EvaluationResult:
    """Everything ``evaluate`` measured; ``as_json()`` is the ``--json`` document."""

    source: str
    horizon_s: float
    score_from_s: float
    scored_points: int
    models: dict[str, ForecastScores]  # next-H-s arrivals
    token_models: dict[str, dict[str, ForecastScores]]  # model -> prompt_tokens / gen_tokens -> scores
    burst_model: str
    burst_threshold: float
    burst: BurstScore
    burst_by_model: dict[str, tuple[float, BurstScore]]  # every model's (alarm threshold, scores)
    max_lead_s: float
    max_lag_s: float
    noise_floor_mae: float
    # per scored second, for --predictions and --plot (of the burst model)
    time_s: np.ndarray  # decision time, seconds from the trace start
    target: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    burst_prob: np.ndarray
    onsets_s: np.ndarray  # decision times of the scored onsets
    alarms_s: np.ndarray  # decision times of the scored alarms
    # "onset" (the training-free detector) and "<burst model>+onset" (their max): (alarm threshold, scores)
    burst_detectors: dict[str, tuple[float, BurstScore]] = field(default_factory=dict)
    # the COMBINED row's settings and its mean expert weights over the scored seconds (None: no such row)
    combination: dict[str, Any] | None = None
    # the learned model's length guard (forecaster.lengths) on this trace: its range, the scored seconds it
    # hid the token channels on, the trace's trailing lengths there (None: no learned model or no range)
    length_guard: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` document (NaN written as null)."""
        b = self.burst.as_dict()
        return {
            "trace": self.source,
            "horizon_s": self.horizon_s,
            "score_from_s": self.score_from_s,
            "scored_points": self.scored_points,
            "models": {
                k: {**v.as_dict(), **{t: s.as_dict() for t, s in self.token_models[k].items()}}
                for k, v in self.models.items()
            },
            "burst": {
                "model": self.burst_model,
                "burst_threshold": self.burst_threshold,
                "max_lead_s": self.max_lead_s,
                "max_lag_s": self.max_lag_s,
                **b,
            },
            "burst_by_model": {
                name: {"burst_threshold": t, **{k: v for k, v in b.as_dict().items() if k != "leads_s"}}
                for name, (t, b) in self.burst_by_model.items()
            },
            "burst_detectors": {
                name: {"burst_threshold": t, **{k: v for k, v in b.as_dict().items() if k != "leads_s"}}
                for name, (t, b) in self.burst_detectors.items()
            },
            "noise_floor_mae": None if math.isnan(self.noise_floor_mae) else self.noise_floor_mae,
            **({"combination": self.combination} if self.combination is not None else {}),
            **({"length_guard": self.length_guard} if self.length_guard is not None else {}),
        }


# ---------------------------------------------------------------------------------------------------
# evaluation


@dataclass(frozen=True, eq=False)
class _Preds:
    """One model's forecasts for every second: ``quantiles[target] = (p50, p90)``, and burst_prob."""

    quantiles: dict[str, tuple[np.ndarray, np.ndarray]]
    burst_prob: np.ndarray


def _preds_from(get: Callable[[str, float], np.ndarray], burst: np.ndarray) -> _Preds:
    return _Preds({t: (get(t, 0.5), get(t, 0.9)) for t in ("arrivals", "prompt_tokens", "gen_tokens")}, burst)


def _batch_getter(rows: list[ForecastBatch]) -> Callable[[str, float], np.ndarray]:
    def get(target: str, q: float) -> np.ndarray:
        field = f"{target}_p{round(q * 100)}"
        return np.array([getattr(b, field)[0] for b in rows], dtype=np.float64)

    return get


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch on one thread for the block, then as it was: one node's tiny steps only contend with extra
    threads (20x slower on 2 busy cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _learned_series(
    lf: LearnedForecaster,
    x: np.ndarray,
    mask: np.ndarray,
    start_s: float,
    combination: CombinationConfig | None = None,
) -> tuple[_Preds, _Preds | None, np.ndarray | None]:
    """Step the learned model second by second over the whole trace (N = 1), as the controller would.

    With ``combination``: step its :class:`CombinedForecaster` instead and return the network's own
    forecasts, the combination's, and the combination's weights per step ``[T, E, C, Q]``.
    """
    model: Forecaster = lf if combination is None else CombinedForecaster(lf, combination)
    raw_rows: list[ForecastBatch] = []
    rows: list[ForecastBatch] = []
    weights: list[np.ndarray] = []
    model.reset(["trace"])
    with _one_torch_thread():
        for i in range(len(x)):
            fb = model.step(x[i : i + 1], mask[i : i + 1], now_s=start_s + i + 1.0)
            rows.append(fb)
            if isinstance(model, CombinedForecaster):
                assert model.last_raw is not None
                raw_rows.append(model.last_raw)
                weights.append(model.weights[0].copy())
    burst = np.array([b.burst_prob[0] for b in rows], dtype=np.float64)
    if combination is None:
        return _preds_from(_batch_getter(rows), burst), None, None
    return (
        _preds_from(_batch_getter(raw_rows), burst),
        _preds_from(_batch_getter(rows), burst),
        np.array(weights),
    )


def _learned_series_offline(
    lf: LearnedForecaster,
    x: np.ndarray,
    mask: np.ndarray,
    start_s: float,
    combination: CombinationConfig | None = None,
) -> tuple[_Preds, _Preds | None, np.ndarray | None]:
    """What :func:`_learned_series` returns, from one full-sequence forward (``predict_sequence``; equal to
    stepping, tested): for benchmarks that score many checkpoints on long traces."""
    with _one_torch_thread():
        times = start_s + 1.0 + np.arange(len(x), dtype=np.float64)
        sf = lf.predict_sequence(x[None], np.asarray(mask)[None], times)
    raw = _preds_from(lambda t, q: sf.get(t, q)[0], sf.burst_prob[0])
    if combination is None:
        return raw, None, None
    comb, w = CombinedForecaster(lf, combination).combine_sequence(
        x[None], np.asarray(mask)[None], sf, return_weights=True
    )
    return raw, _preds_from(lambda t, q: comb.get(t, q)[0], comb.burst_prob[0]), w[0]


def _baseline_series(model: CountBaseline, series: dict[str, np.ndarray]) -> _Preds:
    quantiles: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    burst = np.zeros(0)
    for target, values in series.items():
        p50, p90, b = model.predict_series(values)
        quantiles[target] = (p50, p90)
        if target == "arrivals":
            burst = b
    return _Preds(quantiles, burst)


def default_checkpoint() -> Path | None:
    """The shipped checkpoint, if one exists (first of ``DEFAULT_CHECKPOINTS``)."""
    return next((p for p in DEFAULT_CHECKPOINTS if p.exists()), None)


def _load_learned(checkpoint: Path | None, use_default: bool, horizon_s: float) -> LearnedForecaster | None:
    path = checkpoint
    if path is None:
        path = default_checkpoint() if use_default else None
        if path is None:
            return None
    if not path.exists():
        raise EvaluationError(f"checkpoint {path} does not exist")
    from forecaster.checkpoint import CheckpointError  # lazy: imports torch
    from forecaster.streaming import LearnedForecaster

    try:
        lf = LearnedForecaster.load(path)
    except (CheckpointError, ValueError) as e:
        raise EvaluationError(f"cannot use checkpoint {path}: {e}") from e
    if abs(lf.horizon_s - horizon_s) > 1e-9:
        raise EvaluationError(
            f"checkpoint {path} forecasts a {lf.horizon_s:g} s horizon, evaluation asked for {horizon_s:g} s"
        )
    return lf


def evaluate(
    trace: Trace,
    checkpoint: Path | None = None,
    horizon_s: float = 5.0,
    score_from: str = DEFAULT_SCORE_FROM,
    *,
    use_default_checkpoint: bool = True,
    with_arima: bool = True,
    period_s: int | None = None,
    max_lead_s: float = 10.0,
    max_lag_s: float = 3.0,
    learned: LearnedForecaster | None = None,
    onset_config: OnsetDetectorConfig | None = None,
    offline: bool = False,
    combination: CombinationConfig | None = CombinationConfig(),  # frozen: one shared default is safe
) -> EvaluationResult:
    """Score every baseline, and the learned model when there is one, on ``trace`` as one node.

    The learned model is ``learned`` if given, else loaded from ``checkpoint``, else from
    the shipped checkpoint (``default_checkpoint()``) when ``use_default_checkpoint`` and it exists. Baselines run their vectorised
    offline path (identical to stepping). Burst alarms come from the learned model, else from the
    baseline with the lowest MAE on the history (before ``score_from``); the alarm threshold is the best
    F1 on the history. ``period_s`` of the seasonal-naive model defaults to a day for traces of two days
    or more, else 60 s.

    ``burst_detectors`` scores the training-free onset detector (``forecaster.burst.onset_scores`` with
    ``onset_config``) as ``"onset"``, and its combination with the burst model (``combine_burst``) as
    ``"<burst model>+onset"``, each with its own alarm threshold tuned on the history.

    ``offline``: run the learned model's full-sequence forward instead of stepping it second by second
    (same numbers to float rounding; much faster on long traces; the CLI always steps).

    ``combination``: besides the network's own row (``"learned"``), score its online combination with the
    EWMA, Holt and last-value experts (``forecaster.combination``) as the row ``"combined"``, with these
    settings; ``None`` = no such row. A ``learned`` that is already a ``CombinedForecaster`` is unwrapped
    (its network is the ``"learned"`` row, its settings are used). ``burst_prob`` is the network's in both,
    and the burst model stays ``"learned"``.
    """
    if horizon_s != int(horizon_s) or horizon_s < 1:
        raise EvaluationError(f"horizon_s must be a whole number of seconds >= 1, got {horizon_s}")
    h = int(horizon_s)
    if len(trace) == 0:
        raise EvaluationError(f"trace {trace.source or '<memory>'} has no requests")
    start_s = parse_score_from(score_from, trace)
    n_steps = math.floor(trace.duration_s) + 1
    ser = series_from_trace(
        trace.arrival_s, trace.prompt_tokens, trace.output_tokens, 1.0, duration_s=float(n_steps)
    )
    counts = ser.arrivals
    series = {"arrivals": counts, "prompt_tokens": ser.prompt_tokens, "gen_tokens": ser.gen_tokens}
    targets = {k: future_sums(v, float(h)) for k, v in series.items()}
    target = targets["arrivals"]
    first = max(math.ceil(start_s) - 1, 0)  # first decision index at time >= score_from
    scored = np.zeros(n_steps, dtype=bool)
    scored[first:] = True
    scored &= ~np.isnan(target)
    if not scored.any():
        raise EvaluationError(
            f"--score-from +{start_s:.1f} s leaves no second with a complete {h} s target "
            f"(the trace ends at +{trace.duration_s:.1f} s)"
        )
    history = np.zeros(n_steps, dtype=bool)
    history[:first] = True
    history &= ~np.isnan(target)

    preds: dict[str, _Preds] = {}
    baselines: list[CountBaseline] = make_baselines(
        horizon_s, period_s=period_s or default_period_s(trace.duration_s), with_arima=with_arima
    )
    for model in baselines:
        preds[model.name] = _baseline_series(model, series)
    if isinstance(learned, CombinedForecaster):
        learned, combination = cast("LearnedForecaster", learned.inner), learned.config
    lf = learned if learned is not None else _load_learned(checkpoint, use_default_checkpoint, horizon_s)
    weights: np.ndarray | None = None
    guard: dict[str, Any] | None = None
    if lf is not None:
        x, mask = trace_inputs(ser, lf.schema)
        start_epoch_s = trace.start_time.timestamp() if trace.start_time is not None else 0.0
        series_fn = _learned_series_offline if offline else _learned_series
        preds[LEARNED], comb, weights = series_fn(lf, x, mask, start_epoch_s, combination)
        if comb is not None:
            preds[COMBINED] = comb
        guard = _length_guard_doc(lf, x, mask, scored)

    def masked(a: np.ndarray, m: np.ndarray) -> np.ndarray:
        return np.where(m, a, np.nan)

    models = {
        name: score_forecasts(masked(target, scored), *pr.quantiles["arrivals"]) for name, pr in preds.items()
    }
    token_models = {
        name: {
            k: score_forecasts(masked(targets[k], scored), *pr.quantiles[k])
            for k in ("prompt_tokens", "gen_tokens")
        }
        for name, pr in preds.items()
    }
    if lf is not None:
        burst_model = LEARNED
    else:
        hist_mae = {
            name: score_forecasts(masked(target, history), *pr.quantiles["arrivals"]).mae
            for name, pr in preds.items()
        }
        ranked = sorted(hist_mae, key=lambda k: (math.isnan(hist_mae[k]), hist_mae[k]))
        burst_model = ranked[0]
    p50, p90 = preds[burst_model].quantiles["arrivals"]
    prob = preds[burst_model].burst_prob

    onsets = burst_onsets(counts, h)
    on_scored = onsets[onsets >= first]

    def burst_of(prob: np.ndarray) -> tuple[float, np.ndarray, BurstScore]:
        hist_prob = np.where(np.arange(n_steps) < first, prob, np.nan)
        # tune on onsets whose defining window (t, t+H] lies wholly in the history
        thr = choose_alarm_threshold(hist_prob, onsets[onsets < first - h], max_lead_s, max_lag_s)
        alarms = alarm_times(prob, thr)
        al_scored = alarms[alarms >= first]
        return thr, al_scored, score_bursts(on_scored, al_scored, max_lead_s, max_lag_s)

    by_model = {name: burst_of(pr.burst_prob) for name, pr in preds.items()}
    detector = onset_scores(counts, onset_config)
    detectors = {ONSET: burst_of(detector), f"{burst_model}+{ONSET}": burst_of(combine_burst(prob, detector))}
    thr, al_scored, burst = by_model[burst_model]
    idx = np.flatnonzero(scored)
    return EvaluationResult(
        source=trace.source,
        horizon_s=float(h),
        score_from_s=start_s,
        scored_points=int(scored.sum()),
        models=models,
        token_models=token_models,
        burst_model=burst_model,
        burst_threshold=thr,
        burst=burst,
        burst_by_model={name: (t, b) for name, (t, _, b) in by_model.items()},
        max_lead_s=max_lead_s,
        max_lag_s=max_lag_s,
        noise_floor_mae=poisson_noise_floor(counts, h, scored),
        time_s=(idx + 1).astype(np.float64),
        target=target[idx],
        p50=p50[idx],
        p90=p90[idx],
        burst_prob=prob[idx],
        onsets_s=(on_scored + 1).astype(np.float64),
        alarms_s=(al_scored + 1).astype(np.float64),
        burst_detectors={name: (t, b) for name, (t, _, b) in detectors.items()},
        combination=None if weights is None else _combination_doc(combination, weights[scored]),
        length_guard=guard,
    )


def _length_guard_doc(
    lf: LearnedForecaster, x: np.ndarray, mask: np.ndarray, scored: np.ndarray
) -> dict[str, Any] | None:
    """The ``length_guard`` block of the JSON (``forecaster.lengths``): the checkpoint's range, the share of
    scored seconds whose trailing lengths lay outside it (the network saw arrivals only there), and the
    median trailing prompt and output lengths over the scored seconds. None for a checkpoint without a range."""
    if lf.length_range is None:
        return None
    lengths = length_series(x, mask, lf.schema.channels, lf.schema.step_s)[scored]
    outside = lf.length_range.outside(lengths)
    known = np.isfinite(lengths).all(axis=-1)

    def median(col: int) -> float | None:
        return float(np.median(lengths[known, col])) if known.any() else None

    return {
        "range": lf.length_range.to_doc(),
        "outside_share": float(outside.mean()) if len(outside) else 0.0,
        "prompt_len_median": median(0),
        "output_len_median": median(1),
    }


def _combination_doc(config: CombinationConfig | None, weights: np.ndarray) -> dict[str, Any]:
    """The ``combination`` block of the JSON: settings, and each expert's mean weight over the scored
    seconds per target and output (``weights [S, E, C, Q]``)."""
    mean = weights.mean(axis=0) if len(weights) else np.full(weights.shape[1:], np.nan)
    return {
        "config": asdict(config) if config is not None else None,
        "mean_weights": {
            target: {
                f"p{round(q * 100)}": {e: float(mean[i, k, j]) for i, e in enumerate(EXPERTS)}
                for j, q in enumerate(QUANTILES)
            }
            for k, target in enumerate(TARGETS)
        },
    }


# ---------------------------------------------------------------------------------------------------
# outputs


def write_predictions(result: EvaluationResult, path: Path) -> None:
    """CSV: ``time_s,target,p50,p90,burst_prob`` per scored second (empty cell = no forecast)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = np.column_stack([result.time_s, result.target, result.p50, result.p90, result.burst_prob])
    with path.open("w", encoding="utf-8") as f:
        f.write("time_s,target,p50,p90,burst_prob\n")
        for row in cols.tolist():  # a few thousand rows per hour of trace
            f.write(",".join("" if math.isnan(v) else f"{v:.6g}" for v in row) + "\n")


def plot_result(result: EvaluationResult, path: Path) -> None:
    """PNG: target against p50/p90 of the burst model, with onsets (red) and alarms (green) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 4.5))
    t = result.time_s
    ax.plot(t, result.target, color="0.3", lw=0.8, label=f"arrivals in next {result.horizon_s:g} s")
    ax.plot(t, result.p50, color="tab:blue", lw=0.9, label=f"{result.burst_model} p50")
    ax.fill_between(t, result.p50, result.p90, color="tab:blue", alpha=0.2, lw=0, label="p50..p90")
    for i, x in enumerate(result.onsets_s):
        ax.axvline(x, color="tab:red", lw=0.8, ls="--", label="burst onset" if i == 0 else None)
    top = np.nanmax(result.target) if len(result.target) else 1.0
    if len(result.alarms_s):
        ax.plot(
            result.alarms_s, np.full(len(result.alarms_s), top * 1.02), "v", color="tab:green", label="alarm"
        )
    ax.set_xlabel("seconds from trace start (decision time)")
    ax.set_ylabel("requests")
    ax.set_title(f"{Path(result.source).name or 'trace'}: scored from +{result.score_from_s:.0f} s")
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(result: EvaluationResult) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v: float, nd: int = 3) -> str:
        return "—" if math.isnan(v) else f"{v:.{nd}f}"

    table = Table(
        title=(
            f"{result.source}: next-{result.horizon_s:g}-s arrivals, {result.scored_points} seconds scored "
            f"from +{result.score_from_s:.0f} s"
        )
    )
    cols = (
        "model",
        "MAE",
        "RMSE",
        "pinball p90",
        "coverage p90",
        "points",
        "alarm thr",
        "recall",
        "precision",
    )
    for col in (*cols, "lead s"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, s in result.models.items():
        thr, b = result.burst_by_model[name]
        table.add_row(
            name,
            *(f(v) for v in (s.mae, s.rmse, s.pinball_p90, s.coverage_p90)),
            str(s.points),
            f"{thr:g}",
            f(b.recall, 2),
            f(b.precision, 2),
            f(b.mean_lead_s, 1),
        )
    for name, (thr, b) in result.burst_detectors.items():  # burst scores only
        table.add_row(name, *[""] * 5, f"{thr:g}", f(b.recall, 2), f(b.precision, 2), f(b.mean_lead_s, 1))
    table.add_row("Poisson noise floor", f(result.noise_floor_mae), *[""] * 8, style="dim")
    con = Console()
    con.print(table)
    b = result.burst
    con.print(
        f"bursts ({result.burst_model}, alarm threshold {result.burst_threshold:g}): {b.onsets} onsets, "
        f"{b.alarms} alarms, recall {f(b.recall, 2)}, precision {f(b.precision, 2)}, "
        f"mean lead {f(b.mean_lead_s, 1)} s (window -{result.max_lead_s:g} s .. +{result.max_lag_s:g} s)"
    )
    g = result.length_guard
    if g is not None and g["outside_share"] > 0:
        r = g["range"]
        con.print(
            f"length guard: on {g['outside_share']:.0%} of the scored seconds the trace's mean lengths (prompt"
            f" {g['prompt_len_median'] or float('nan'):,.0f}, output {g['output_len_median'] or float('nan'):,.0f}"
            f" tokens, medians) lay outside the checkpoint's training range (prompt {r['prompt'][0]:,.0f}-"
            f"{r['prompt'][1]:,.0f}, output {r['output'][0]:,.0f}-{r['output'][1]:,.0f}): the learned model saw"
            " arrivals only there, and its token forecasts are its arrival quantiles x those lengths"
        )


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def evaluate_cmd(
    trace_arg: Annotated[
        Path | None,
        typer.Argument(metavar="[TRACE]", help="Trace file: Azure CSV, Mooncake JSONL or BurstGPT CSV."),
    ] = None,
    trace_opt: Annotated[
        Path | None, typer.Option("--trace", "-t", help="The trace file (same as the TRACE argument).")
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Learned-model checkpoint (.safetensors). Default: the shipped one, if present."),
    ] = None,
    horizon_s: Annotated[float, typer.Option("--horizon-s", help="Forecast horizon, whole seconds.")] = 5.0,
    score_from: Annotated[
        str,
        typer.Option(help="Where scoring starts: +SECONDS from the trace start, PERCENT%, or an ISO time."),
    ] = DEFAULT_SCORE_FROM,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the scores as JSON here.")] = None,
    predictions: Annotated[
        Path | None, typer.Option(help="Write time_s,target,p50,p90,burst_prob per scored second (CSV).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of target vs p50/p90, onsets, alarms.")
    ] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Terminal output.")] = OutputFormat.table,
    trace_format: Annotated[
        str | None, typer.Option(help="azure | mooncake | burstgpt (default: detected from the file).")
    ] = None,
    baselines_only: Annotated[
        bool,
        typer.Option("--baselines-only", help="Skip the learned model even when a checkpoint is available."),
    ] = False,
    arima: Annotated[
        bool,
        typer.Option("--arima/--no-arima", help="Include ARIMA (the slowest baseline: periodic refits)."),
    ] = True,
    max_lead_s: Annotated[
        float,
        typer.Option("--max-lead-s", help="An alarm this many seconds before an onset still detects it."),
    ] = 10.0,
    combination: Annotated[
        bool,
        typer.Option(
            "--combination/--no-combination",
            help="Also score the learned model's online combination with EWMA, Holt and last value"
            " (row 'combined'; the row 'learned' is always the network alone).",
        ),
    ] = True,
) -> None:
    """Score forecasts of the next --horizon-s seconds of arrivals on one trace, seen as one node.

    Every second from --score-from on, each model forecasts how many requests arrive in the next
    horizon (p50, p90, burst probability); earlier seconds are history the models warm up on. Reports
    MAE, RMSE, pinball loss at 0.9 and p90 coverage for every baseline (last value, EWMA, Holt, seasonal
    naive, ARIMA), the learned model alone ("learned") and its online combination with EWMA, Holt and last
    value ("combined", the JSON's "combination" gives each expert's mean weight), the Poisson noise floor (the best MAE possible if arrivals were
    Poisson), and burst-onset recall, precision and lead time (docs/FORECASTER.md defines all of them),
    also for the training-free onset detector and its max with the burst model (rows "onset", "...+onset").
    A checkpoint that records the request lengths it was trained on (every fit does) forecasts the seconds
    at which the trace's mean prompt or output length lies outside them from the arrivals alone, its token
    forecasts being the arrival quantiles x those lengths; the JSON's "length_guard" says on how many.

    Example:

        train-forecaster evaluate datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv
        --score-from 70% --json out/eval_code.json --predictions out/code.csv --plot out/code.png
    """
    from serving.workload.errors import TraceError
    from serving.workload.readers import read_trace

    if (trace_arg is None) == (trace_opt is None):
        typer.echo("error: give the trace once: train-forecaster evaluate --trace FILE (or FILE)", err=True)
        raise typer.Exit(2)
    trace = trace_opt if trace_opt is not None else trace_arg
    assert trace is not None
    try:
        tr = read_trace(trace, trace_format)
        result = evaluate(
            tr,
            checkpoint,
            horizon_s,
            score_from,
            use_default_checkpoint=not baselines_only,
            with_arima=arima,
            max_lead_s=max_lead_s,
            combination=CombinationConfig() if combination else None,
        )
    except (EvaluationError, TraceError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    doc = result.as_json()
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if predictions is not None:
        write_predictions(result, predictions)
    if plot is not None:
        plot_result(result, plot)
    if format is OutputFormat.json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _table(result)
