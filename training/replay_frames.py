"""Training data from a trace replayed through the simulator: the per-pool inputs the loop's forecaster receives.

A request trace alone gives only what arrives (arrival_rps, prompt_tps, gen_tps counted at arrival); the loop's
forecaster sees something else: the pipeline's per-pool channels (``controller.pipeline``'s ``_forecast``: the
aggregated load's ``channels()``, masked where unknown or negative), with the generation tokens counted as they
are generated (capped by the decode fleet the policy chose) and the running / waiting / KV / latency channels
filled in. ``replay_frame`` replays a trace with ``serving.sim.replay.replay`` (the engine ``pdscale replay``
and ``bench/bench_policies.py`` use) under the predictive policy and keeps, each tick, exactly the ``x`` the
forecaster's ``step`` was given (``FrameRecorder``), as a ``MetricFrame`` whose metrics are the channels by
name. ``frame_to_inputs`` takes named channels as they are, so ``training.fit.FrameSource`` trains on the very
values the loop fed the forecaster (its normalisation, time-ordered splits and targets, not a copy of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from forecaster.types import CHANNELS, ForecastBatch, Forecaster, MetricFrame
from serving.workload.trace import Trace

#: ``--replay-policy``: the predictive policy with the shipped checkpoint (what the controller loads by
#: default, so the recorded inputs follow the fleet sizes the default loop would choose) or with the Holt
#: baseline (training-free: the inputs do not depend on the checkpoint being replaced).
ReplayPolicyName = Literal["predictive", "predictive-holt"]
REPLAY_POLICIES: tuple[str, ...] = ("predictive", "predictive-holt")


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
        """The recorded inputs as a ``MetricFrame`` (metrics = ``CHANNELS`` by name) on a regular ``step_s``
        grid from the first step to the last; a grid point no step fell on is NaN (unknown, never zero)."""
        if not self.times_s:
            return MetricFrame(
                tuple(self.node_ids), CHANNELS, np.zeros(0), np.zeros((len(self.node_ids), len(CHANNELS), 0))
            )
        t = np.asarray(self.times_s)
        idx = np.rint((t - t[0]) / step_s).astype(np.int64)
        if np.any(np.abs(t - t[0] - idx * step_s) > 1e-6 * max(step_s, 1.0)) or np.any(np.diff(idx) <= 0):
            raise ValueError(f"the forecaster was stepped off a regular {step_s} s grid (times {t[:5]}...)")
        n_t = int(idx[-1]) + 1
        values = np.full((len(self.node_ids), len(CHANNELS), n_t), np.nan)
        values[:, :, idx] = np.stack(self.inputs, axis=-1)  # [N, C, T]
        return MetricFrame(tuple(self.node_ids), CHANNELS, t[0] + np.arange(n_t) * step_s, values)


@dataclass(frozen=True)
class ReplayedFrame:
    """What ``replay_frame`` returns: the recorded frame and what was replayed (for the checkpoint's summary)."""

    frame: MetricFrame
    info: dict[str, object]


def replay_frame(
    trace: Trace,
    *,
    policy: str = "predictive",
    profile: str = "llama3-8b/a100",
    speed: float = 1.0,
    slo_ttft_ms: float = 1000.0,
    slo_itl_ms: float = 50.0,
    checkpoint: Path | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> ReplayedFrame:
    """Replay ``trace`` (time-compressed by ``speed``) on a one-pool fleet of ``profile`` (the default pool of
    ``bench/bench_policies.py``: TTFT 1 s, ITL 50 ms) under ``policy`` (``REPLAY_POLICIES``) and record the
    forecaster's per-tick inputs (``FrameRecorder.frame``). ``checkpoint``: the predictive policy's checkpoint
    (default: the shipped one). ``progress(now_s, end_s)`` per tick."""
    import controller.replay_policies  # noqa: F401  (registers the replay policies)
    from controller.config import PolicyConfig
    from controller.forecasting import DEFAULT_CHECKPOINT, load_default_forecaster
    from controller.replay_policies import PredictivePolicy
    from forecaster.baselines import Holt
    from serving.sim.fleet import single_pool
    from serving.sim.hardware import get_profile
    from serving.sim.replay import replay
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
    recorders: list[FrameRecorder] = []
    ckpt = checkpoint or DEFAULT_CHECKPOINT

    def make() -> Forecaster:
        inner: Forecaster = Holt() if policy == "predictive-holt" else load_default_forecaster(ckpt)
        rec = FrameRecorder(inner)
        recorders.append(rec)
        return rec

    fleet = single_pool(profile=profile, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)
    rep = replay(
        fleet, {fleet.pools[0].name: tr}, PredictivePolicy(PolicyConfig(), forecaster=make), progress=progress
    )
    if not recorders or not recorders[-1].times_s:
        raise RuntimeError("the replay never stepped the forecaster: no inputs recorded")
    rec = recorders[-1]
    frame = rec.frame()
    info: dict[str, object] = {
        "policy": policy,
        "forecaster": rec.inner.name,
        "checkpoint": None if policy == "predictive-holt" else str(ckpt),
        "profile": profile,
        "speed": speed,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_itl_ms": slo_itl_ms,
        "requests": len(tr),
        "replay_slo_attainment": float(rep.slo_attainment),
        "replay_gpu_seconds": float(rep.gpu_seconds),
    }
    return ReplayedFrame(frame=frame, info=info)
