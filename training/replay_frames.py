"""Training data from a trace replayed through the simulator: the per-pool inputs the loop's forecaster receives.

A request trace alone gives only what arrives (arrival_rps, prompt_tps, gen_tps counted at arrival); the loop's
forecaster sees something else: the pipeline's per-pool channels (``controller.pipeline``'s ``_forecast``: the
aggregated load's ``channels()``, masked where unknown or negative), with the generation tokens counted as they
are generated (capped by the decode fleet the policy chose) and the running / waiting / KV / latency channels
filled in. ``replay_frame`` replays a trace with ``serving.sim.replay.replay`` (the engine ``pdscale replay``
and ``bench/bench_policies.py`` use) under a replay policy and keeps the per-tick inputs as a ``MetricFrame``
whose metrics are the channels by name:

- under the predictive policies, exactly the ``x`` the forecaster's ``step`` was given (``FrameRecorder``
  wraps the policy's forecaster);
- under the baseline policies (reactive, dynamo-like), which step no forecaster, what the predictive pipeline
  would have given one (``RecordingPolicy`` wraps the policy: each tick's scrape through its own
  ``LoadAggregator``, the pools in fleet order, the same mask) — so the data do not depend on any checkpoint.

``frame_to_inputs`` takes named channels as they are, so ``training.fit.FrameSource`` trains on those values
(its normalisation, time-ordered splits and targets, not a copy of them).

``replay_source`` resolves what ``fit --replay`` names: a trace file, ``file:PATH``, or one of the project's
generated workloads (``serving.workload.named``: ``mmpp``, ``sine@101``, ...), on that workload's fleet (SLOs).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from controller.replay_policies import _epoch_offset
from controller.sources.aggregate import LoadAggregator
from forecaster.types import CHANNELS, ForecastBatch, Forecaster, MetricFrame
from serving.sim.fleet import FleetSpec
from serving.sim.replay import ReplayPolicy, ReplayView, ScaleCommand
from serving.workload.trace import Trace

#: ``--replay-policy``: ``reactive`` / ``dynamo-like`` (the baseline policies: no forecaster, so the recorded
#: inputs do not depend on any checkpoint), the predictive policy with the shipped checkpoint (``predictive``:
#: the fleet sizes the default loop would choose) or with the Holt baseline (``predictive-holt``).
ReplayPolicyName = Literal["reactive", "dynamo-like", "predictive", "predictive-holt"]
REPLAY_POLICIES: tuple[str, ...] = ("reactive", "dynamo-like", "predictive", "predictive-holt")
FORECASTING_POLICIES: tuple[str, ...] = ("predictive", "predictive-holt")


class FrameRecorder:
    """A forecaster that passes every step through and keeps the inputs it was given: per step ``now_s`` and
    ``x`` with the masked entries set to NaN (``[N, C]``, the pools in ``reset``'s order). ``on_step`` is
    called after each step with ``now_s`` (a progress bar)."""

    def __init__(self, inner: Forecaster, on_step: Callable[[float], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.horizon_s = inner.horizon_s
        self.node_ids: tuple[str, ...] = ()
        self.times_s: list[float] = []
        self.inputs: list[np.ndarray] = []
        self.on_step = on_step

    def reset(self, node_ids: Sequence[str]) -> None:
        self.inner.reset(node_ids)
        self.node_ids = tuple(node_ids)
        self.times_s, self.inputs = [], []

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        batch = self.inner.step(x, mask, now_s=now_s)
        self.times_s.append(float(now_s))
        self.inputs.append(np.where(np.asarray(mask, dtype=bool), np.asarray(x, dtype=np.float64), np.nan))
        if self.on_step is not None:
            self.on_step(float(now_s))
        return batch

    def frame(self, step_s: float = 1.0) -> MetricFrame:
        """The recorded inputs as a ``MetricFrame`` (``grid_frame``)."""
        return grid_frame(self.node_ids, self.times_s, self.inputs, step_s)


def grid_frame(
    node_ids: Sequence[str], times_s: Sequence[float], inputs: Sequence[np.ndarray], step_s: float = 1.0
) -> MetricFrame:
    """Per-step inputs (``[N, C]`` each, NaN = unknown) as a ``MetricFrame`` (metrics = ``CHANNELS`` by name) on
    a regular ``step_s`` grid from the first step to the last; a grid point no step fell on is NaN (unknown,
    never zero). Steps off the grid, or not strictly increasing, are an error."""
    if not times_s:
        return MetricFrame(
            tuple(node_ids), CHANNELS, np.zeros(0), np.zeros((len(node_ids), len(CHANNELS), 0))
        )
    t = np.asarray(times_s)
    idx = np.rint((t - t[0]) / step_s).astype(np.int64)
    if np.any(np.abs(t - t[0] - idx * step_s) > 1e-6 * max(step_s, 1.0)) or np.any(np.diff(idx) <= 0):
        raise ValueError(f"the forecaster was stepped off a regular {step_s} s grid (times {t[:5]}...)")
    n_t = int(idx[-1]) + 1
    values = np.full((len(node_ids), len(CHANNELS), n_t), np.nan)
    values[:, :, idx] = np.stack(inputs, axis=-1)  # [N, C, T]
    return MetricFrame(tuple(node_ids), CHANNELS, t[0] + np.arange(n_t) * step_s, values)


class RecordingPolicy:
    """A replay policy that passes every tick to ``inner`` and records, before it decides, each pool's forecaster
    input as the predictive pipeline computes it (``controller.pipeline.Pipeline.tick`` / ``_forecast``): the
    scrape through a ``LoadAggregator``, the pools in fleet order, NaN where the pipeline's mask is off (not
    finite, or negative). The clock is the forecaster's: the trace's wall-clock start + the replay's time. For
    policies that step no forecaster (reactive, dynamo-like); the decisions are ``inner``'s, unchanged."""

    def __init__(self, inner: ReplayPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.pools: tuple[str, ...] = ()
        self.epoch_offset_s = 0.0
        self.times_s: list[float] = []
        self.inputs: list[np.ndarray] = []
        self.aggregator = LoadAggregator()

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        self.inner.reset(fleet, traces)
        self.pools = tuple(p.name for p in fleet.pools)
        self.epoch_offset_s = _epoch_offset(traces.get(fleet.pools[0].name))
        self.times_s, self.inputs = [], []
        self.aggregator = LoadAggregator()

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        loads = self.aggregator.update(view.samples, list(self.pools))
        x = np.array([loads[name].channels() for name in self.pools], dtype=np.float64)
        self.inputs.append(np.where(np.isfinite(x) & (x >= 0), x, np.nan))
        self.times_s.append(self.epoch_offset_s + now_s)
        return self.inner.on_tick(now_s, view)

    def frame(self, step_s: float = 1.0) -> MetricFrame:
        """The recorded inputs as a ``MetricFrame`` (``grid_frame``)."""
        return grid_frame(self.pools, self.times_s, self.inputs, step_s)


@dataclass(frozen=True)
class ReplayedFrame:
    """What ``replay_frame`` returns: the recorded frame and what was replayed (for the checkpoint's summary)."""

    frame: MetricFrame
    info: dict[str, object]


def replay_frame(
    trace: Trace,
    *,
    policy: str = "reactive",
    profile: str = "llama3-8b/a100",
    speed: float = 1.0,
    slo_ttft_ms: float = 1000.0,
    slo_itl_ms: float = 50.0,
    checkpoint: Path | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> ReplayedFrame:
    """Replay ``trace`` (time-compressed by ``speed``) on a one-pool fleet of ``profile`` (the default pool of
    ``bench/bench_policies.py``: TTFT 1 s, ITL 50 ms; a named workload's SLOs through ``slo_ttft_ms`` /
    ``slo_itl_ms``) under ``policy`` (``REPLAY_POLICIES``) and record the forecaster's per-tick inputs: what
    the predictive policy's forecaster was given (``FrameRecorder``), or for a baseline policy what the
    pipeline would have given one (``RecordingPolicy``). ``checkpoint``: the predictive policy's checkpoint
    (default: the shipped one). ``progress(now_s, end_s)`` per tick."""
    from controller.config import PolicyConfig
    from controller.forecasting import DEFAULT_CHECKPOINT, load_default_forecaster
    from controller.replay_policies import PredictivePolicy
    from forecaster.baselines import Holt
    from serving.sim.fleet import single_pool
    from serving.sim.hardware import get_profile
    from serving.sim.replay import PolicyOptions, make_policy, replay
    from training.augment import time_scale

    if policy not in REPLAY_POLICIES:
        raise ValueError(f"replay policy {policy!r} unknown; known: {', '.join(REPLAY_POLICIES)}")
    if not speed > 0 or not math.isfinite(speed):
        raise ValueError(f"replay speed must be a finite number > 0, got {speed}")
    get_profile(profile)  # raises naming the known profiles
    if len(trace) < 2 or not trace.duration_s > 0:
        raise ValueError(
            f"the trace has {len(trace)} request(s) over {trace.duration_s} s: nothing to replay"
        )
    tr = time_scale(trace, speed) if speed != 1.0 else trace
    fleet = single_pool(profile=profile, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)
    traces = {fleet.pools[0].name: tr}
    forecaster: str | None = None
    ckpt: Path | None = None
    if policy in FORECASTING_POLICIES:
        recorders: list[FrameRecorder] = []
        ckpt = None if policy == "predictive-holt" else (checkpoint or DEFAULT_CHECKPOINT)

        def make() -> Forecaster:
            inner: Forecaster = Holt() if ckpt is None else load_default_forecaster(ckpt)
            recorders.append(FrameRecorder(inner))
            return recorders[-1]

        rep = replay(fleet, traces, PredictivePolicy(PolicyConfig(), forecaster=make), progress=progress)
        if not recorders or not recorders[-1].times_s:
            raise RuntimeError("the replay never stepped the forecaster: no inputs recorded")
        frame, forecaster = recorders[-1].frame(), recorders[-1].inner.name
    else:
        recording = RecordingPolicy(make_policy(policy, PolicyOptions()))
        rep = replay(fleet, traces, recording, progress=progress)
        if not recording.times_s:
            raise RuntimeError("the replay never ticked: no inputs recorded")
        frame = recording.frame()
    info: dict[str, object] = {
        "policy": policy,
        "forecaster": forecaster,
        "checkpoint": None if ckpt is None else str(ckpt),
        "profile": profile,
        "speed": speed,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_itl_ms": slo_itl_ms,
        "requests": len(tr),
        "replay_slo_attainment": float(rep.slo_attainment),
        "replay_gpu_seconds": float(rep.gpu_seconds),
    }
    return ReplayedFrame(frame=frame, info=info)


#: The workloads the controller is judged on (docs/BENCHMARKS.md, "Session 10's final measurements": the rows
#: of the reference rule) as ``(workload name, sine period s)``. Replaying one of them for training makes its
#: row no longer unseen; ``replay_source`` names the row it matches (by the requests, not by the name, so
#: ``mmpp@5`` is the ``mmpp`` row). s11u's shapes (``bench/gen_shapes_s11.py``) are files and are not listed.
SCORED_ROWS: tuple[tuple[str, float], ...] = (
    ("code", 600.0), ("conv", 600.0), ("mmpp", 600.0), ("mmpp-holdout", 600.0), ("sine", 600.0),
    ("mooncake", 600.0), ("mmpp@3", 600.0), ("mmpp@4", 600.0), ("mmpp-holdout@1", 600.0),
    ("mmpp-holdout@2", 600.0), ("mmpp-diurnal", 600.0), ("ramp", 600.0), ("sine", 300.0), ("sine", 1200.0),
)  # fmt: skip


def trace_digest(trace: Trace) -> str:
    """Hex sha256 of a trace's requests (arrival times, prompt and output tokens): equal for the same requests
    however they were made (generated, or read from a file)."""
    h = hashlib.sha256()
    t0 = trace.arrival_s[0] if len(trace) else 0.0
    for a in (trace.arrival_s - t0, trace.prompt_tokens, trace.output_tokens):
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


@functools.cache
def _scored_digests() -> dict[str, str]:
    from serving.workload.named import workload

    out: dict[str, str] = {}
    for name, period in SCORED_ROWS:
        try:
            trace, _ = workload(name, None, period)
        except FileNotFoundError:  # a bundled trace missing here: its row cannot be replayed either
            continue
        out[trace_digest(trace)] = name if name != "sine" else f"sine-{period:g}"
    return out


def scored_row(trace: Trace) -> str | None:
    """The reference row (``SCORED_ROWS``) whose requests ``trace`` has, if any."""
    return _scored_digests().get(trace_digest(trace))


@dataclass(frozen=True)
class ReplaySource:
    """What one ``--replay`` names: the trace, its fleet's SLOs and what the training-data summary records."""

    spec: str
    trace: Trace
    slo_ttft_ms: float
    slo_itl_ms: float
    info: dict[str, object]


def replay_source(spec: str, fmt: str | None = None) -> ReplaySource:
    """``spec``: a trace file (``file:PATH`` or an existing path; read with ``fmt``, detected if None) on the
    default pool (TTFT 1 s, ITL 50 ms), or a workload name of ``serving.workload.named`` (``mmpp``,
    ``sine@101``, ``code``, ...) on that workload's fleet, generated as ``bench/bench_policies.py`` generates it
    (default length, sine period 600 s, ramp 1,200 s). ``ValueError`` names the spec and the known names."""
    from serving.workload.named import SEEDED, WORKLOADS, workload
    from serving.workload.readers import read_trace
    from training.data import sha256_file

    path = Path(spec.removeprefix("file:"))
    info: dict[str, object]
    if spec.startswith("file:") or path.is_file():
        if not path.is_file():
            raise ValueError(f"{spec}: no such file")
        trace = read_trace(path, fmt)
        slo_ttft_ms, slo_itl_ms = 1000.0, 50.0
        info = {"trace": str(path), "trace_sha256": sha256_file(path), "trace_format": trace.format}
    else:
        base = spec.partition("@")[0]
        if base not in WORKLOADS:
            raise ValueError(
                f"{spec}: no such file, and not a workload name (known: {', '.join(WORKLOADS)}; "
                f"{', '.join(s + '@SEED' for s in SEEDED)}; or file:PATH)"
            )
        trace, fleet = workload(spec, None, 600.0)
        pool = fleet.pools[0]
        slo_ttft_ms, slo_itl_ms = pool.slo_ttft_ms, pool.slo_itl_ms
        info = {"workload": spec, "trace": trace.source, "trace_format": trace.format}
    info["requests_sha256"] = trace_digest(trace)
    info["scored_row"] = scored_row(trace)
    return ReplaySource(spec, trace, slo_ttft_ms, slo_itl_ms, info)
