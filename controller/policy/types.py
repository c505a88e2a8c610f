"""Values the policy reads and returns. All frozen: the policy never mutates its inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

ROLES: tuple[str, ...] = ("prefill", "decode")


@dataclass(frozen=True)
class PoolForecast:
    """A pool's forecast for (now, now + horizon_s]: totals over the horizon, NaN = unknown."""

    horizon_s: float
    arrivals_p50: float
    arrivals_p90: float
    prompt_tokens_p90: float
    gen_tokens_p90: float
    burst_prob: float

    def rate(self, total: float) -> float:
        """A horizon total as a per-second rate."""
        return total / self.horizon_s


@dataclass(frozen=True)
class PoolObservation:
    """What the controller knows about one pool at ``now_s``: counts, measured load, forecast.

    Loads are pool-wide sums over active instances. NaN means unknown (missing series, outage); the
    policy never reads it as zero. ``complete`` is False when some instances could not be observed,
    in which case the policy may scale up but never down.
    """

    pool: str
    now_s: float
    replicas: dict[
        str, int
    ]  # role -> replicas the pool is set to (a Deployment's spec.replicas): serving + starting
    active: dict[str, int]  # role -> active instances (serving)
    standby: dict[str, int]  # role -> warm standby instances (loaded, out of rotation)
    provisioning: dict[str, int]  # role -> instances still starting
    arrival_rps: float
    prompt_tps: float
    gen_tps: float
    running_seqs: float  # sequences decoding now (decode instances, or mixed)
    waiting_requests: float  # queued, not yet prefilled
    oldest_wait_s: float  # age of the oldest waiting request (NaN = unknown)
    kv_usage: float  # mean KV-cache usage of decode instances, 0..1
    mean_prompt_tokens: float  # recent mean prompt length (NaN = unknown)
    mean_output_tokens: float  # recent mean output length (NaN = unknown)
    forecast: PoolForecast | None = None
    complete: bool = True
    # prompt_tps counts prompt tokens as they arrive (the router's counter), not as they were prefilled: it
    # does not flatten at the fleet's throughput, so no offered-load estimate is needed on top of it
    prompt_at_arrival: bool = False
    # of waiting_requests, those in an instance's own waiting queue (vLLM's num_requests_waiting): only that
    # instance serves them, so capacity added elsewhere serves new arrivals, not them. The rest wait at a
    # gateway for any instance. NaN = unknown (all taken as movable)
    pinned_waiting: float = math.nan


@dataclass(frozen=True)
class PoolCapacity:
    """Per-instance capacity of one pool's hardware profile at its SLOs (from serving.sim.capacity).

    ``prefill_tps``: prompt tokens/s one prefill instance sustains while meeting the TTFT SLO.
    ``decode_seqs``: concurrent sequences one decode instance holds while meeting the ITL SLO and KV limits.
    ``decode_tps``: generation tokens/s of one decode instance at that batch.
    """

    prefill_tps: float
    decode_seqs: float
    decode_tps: float
    gpus_per_instance: int
    # a divisor of the capacities (> 1: slower than modelled); the pipeline leaves it 1: its latency correction
    # computes the capacities with the profile's latency model scaled instead (controller.latency_correction)
    correction: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill_tps", "decode_seqs", "decode_tps", "correction"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"PoolCapacity.{name} must be a positive finite number, got {value!r}")
        if self.gpus_per_instance < 1:
            raise ValueError(f"PoolCapacity.gpus_per_instance must be >= 1, got {self.gpus_per_instance}")


@dataclass(frozen=True)
class ScalingPlan:
    """Desired capacity of one pool. ``reasons`` says, stage by stage, why."""

    pool: str
    prefill: int
    decode: int
    standby_prefill: int
    standby_decode: int
    buffer_seqs: int = 0  # sequence capacity reserved on active decode instances
    degrade: bool = False  # demand beyond max replicas: degradation active
    silent: bool = False  # arrivals stopped dead: no scale-down (stages.sudden_silence, silence_hold_s)
    reasons: tuple[str, ...] = ()

    def count(self, role: str) -> int:
        return self.prefill if role == "prefill" else self.decode

    def standby(self, role: str) -> int:
        return self.standby_prefill if role == "prefill" else self.standby_decode

    def gpus(self, gpus_per_instance: int) -> int:
        total = self.prefill + self.decode + self.standby_prefill + self.standby_decode
        return total * gpus_per_instance


@dataclass(frozen=True)
class RoleHistory:
    """Per-role memory the hysteresis stage needs, in seconds of virtual or wall time."""

    last_scale_up_s: float = -math.inf
    last_change_s: float = -math.inf
    recent_targets: tuple[tuple[float, int], ...] = ()  # (time_s, wanted) over the scale-down window


@dataclass(frozen=True)
class LeadPeaks:
    """The burst reserve's lead peaks that no later need block can change (``stages.burst_reserve_kept``):
    float64 rows (block_start_s, prefill need, decode need, prefill peak, decode peak) of the oldest blocks,
    in native byte order, for the lead ``lead_s`` they were computed with (another lead ignores them).

    Beside them, the cache ``controller.policy.reserve_fast`` reads (empty: none, the numpy path runs): the
    ``headroom`` the rises were computed with; ``rises``, float64 rows (prefill rise, decode rise) aligned
    with ``rows`` (NaN where the peak is not finite); ``ordered``, the rows' finite-peak (prefill rises,
    decode rises, prefill peaks, decode peaks), each sorted, as float64 bytes; ``marks``, the (start, trend factor) marks
    (``PoolState.projected_blocks``) on the rows' blocks that the rises were computed with."""

    lead_s: float = math.nan
    rows: bytes = b""
    headroom: float = math.nan
    rises: bytes = b""
    ordered: tuple[bytes, ...] = ()
    marks: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class PackedRates:
    """The known samples of ``PoolState.rate_history`` (``stages._rate_arrays``: a finite time, a finite
    non-negative rate) as float64 ``times`` and ``rates`` in native byte order, for the trend stage
    (``stages.packed_rates``). ``history`` is the very tuple they were read from, compared by identity, so a
    history built any other way is read anew, never from a stale cache."""

    history: tuple[tuple[float, float], ...] = ()
    times: bytes = b""
    rates: bytes = b""


@dataclass(frozen=True)
class BlockMedian:
    """The median total need (prefill + decode instances) of the completed need blocks ``blocks``
    (``stages.block_median``): the burst runs and the short-burst test judge blocks against it, and it changes
    only when a block completes. Read back only for these very rows (identity), or moved on to rows that
    continue a suffix of them (``stages._moved``: matched by value, which gives the same totals), so any other
    blocks are computed anew, never read from a stale cache. ``totals``: the blocks' totals sorted, as float64 bytes,
    kept where every total is finite and none is -0.0 (empty otherwise), so the next block's median is a
    bisection, not a sort."""

    blocks: tuple[tuple[float, float, float, int], ...] = ()
    median: float = math.nan
    totals: bytes = b""


@dataclass(frozen=True)
class ArrivalCalibration:
    """Per-pool state of the arrival forecast's recalibration (``controller.policy.calibration``).

    ``log_scale``: the log multipliers of (p50, p90); ``counted``: arrivals counted since the first tick (the
    integral of the measured rate); ``last_s``: the last tick (NaN before the first);
    ``pending``: (issued_s, counted then, scaled p50 rate, scaled p90 rate) of forecasts awaiting their horizon;
    ``compared_s``: seconds of comparisons made; ``covered``: of them, (p50, p90) seconds the quantile covered."""

    log_scale: tuple[float, float] = (0.0, 0.0)
    counted: float = 0.0
    last_s: float = math.nan
    pending: tuple[tuple[float, float, float, float], ...] = ()
    compared_s: float = 0.0
    covered: tuple[float, float] = (0.0, 0.0)

    def scales(self) -> tuple[float, float]:
        return math.exp(self.log_scale[0]), math.exp(self.log_scale[1])

    def coverage(self) -> tuple[float, float]:
        """The empirical coverage of the issued (scaled) p50 and p90 so far; NaN before any comparison."""
        if self.compared_s <= 0:
            return math.nan, math.nan
        return self.covered[0] / self.compared_s, self.covered[1] / self.compared_s


@dataclass(frozen=True)
class PoolState:
    """Everything the policy remembers about one pool between ticks (passed in and returned)."""

    roles: dict[str, RoleHistory] = field(default_factory=lambda: {r: RoleHistory() for r in ROLES})
    rate_history: tuple[tuple[float, float], ...] = ()  # (time_s, arrival_rps) over the last minute
    alert_until_s: float = -math.inf  # a burst alert holds promoted standby capacity until then
    degrade_since_s: float = math.nan  # when degradation started (NaN = not degraded)
    calm_since_s: float = math.nan  # when demand fell back under max while degraded
    standby_recent: tuple[tuple[float, int, int], ...] = ()  # (time_s, prefill, decode) sized standby
    # (time_s, prefill, decode) spare active replicas (final − wanted) over the settle window (decide)
    spare_recent: tuple[tuple[float, int, int], ...] = ()
    # (time_s, prefill, decode) standby targets over cold_start_persist_s (decide; standby_start_persist)
    standby_start_recent: tuple[tuple[float, int, int], ...] = ()
    # (block_start_s, prefill need, decode need, ticks): the mean instances the measured load needed in each
    # block of ``stages.NEED_BLOCK_S`` over the burst window (stages.burst_reserve reads it)
    need_blocks: tuple[tuple[float, float, float, int], ...] = ()
    # burst reserve per role ((rise prefill, rise decode), (peak prefill, peak decode)), recomputed per block
    reserve: tuple[tuple[float, float], tuple[float, float]] = ((math.nan, math.nan), (math.nan, math.nan))
    # the lead peaks (with their needs) of the oldest ``need_blocks`` that no later block
    # can change (stages.burst_reserve_kept), so a new block computes only the newest; written with the blocks
    # by stages.burst_reserve_stage, emptied where the blocks are moved (stages.resume_history)
    need_peaks: LeadPeaks = field(default_factory=lambda: LeadPeaks())
    # (start, trend factor) of the need blocks the trend stage projected a ramp at every tick of (written only
    # with PolicyConfig.burst_reserve_projected other than 'kept'; stages.burst_reserve_stage, resume_history)
    projected_blocks: tuple[tuple[float, float], ...] = ()
    # (time_s, arrival_rps, prompt_tps, gen_tps) over the last ``load_smoothing_s`` (stages.smooth_load)
    load_recent: tuple[tuple[float, float, float, float], ...] = ()
    # (time_s, mean output tokens) over the last ``reserve_output_hold_s`` (stages.held_output; written only
    # with PolicyConfig.reserve_output_hold_s > 0)
    output_recent: tuple[tuple[float, float], ...] = ()
    queue_since_s: float = math.nan  # when the current unbroken queue began (NaN = no queue)
    # (start_s, end_s) of the bursts seen over the burst window (stages.update_burst_runs, burst_hold)
    burst_runs: tuple[tuple[float, float], ...] = ()
    # when the current stretch of nil measured load began (NaN = the load needs something; stages.idle_stretch)
    idle_since_s: float = math.nan
    # when the current sudden silence began (stages.sudden_silence; PolicyConfig.silence_hold_s); NaN = none,
    # -inf = a silence older than the rate history (never held, not judged again while it lasts)
    silent_since_s: float = math.nan
    # where idle pauses were cut out of the burst history (stages.resume_history), in its moved time
    pauses: tuple[float, ...] = ()
    # the arrival forecast's coverage tracking (controller.policy.calibration; PolicyConfig.arrival_calibration)
    arrival_calibration: ArrivalCalibration = field(default_factory=lambda: ArrivalCalibration())
    # the first tick with a known load (decide; PolicyConfig.standby_untested_s); NaN = none yet
    first_known_s: float = math.nan
    # (last reading's time_s, EWMA total, weight) of the mean output length over stages.USUAL_OUTPUT_HALFLIFE_S:
    # the pool's usual output length, total ÷ weight (stages.usual_output; PolicyConfig.decode_length_rise)
    output_usual: tuple[float, float, float] = (math.nan, math.nan, 0.0)
    # rate_history packed for the trend stage (decide, stages.packed_rates): a cache, so neither compared nor
    # printed; an empty or stale one is rebuilt
    rate_packed: PackedRates = field(default_factory=lambda: PackedRates(), repr=False, compare=False)
    # the completed need blocks' median (stages.burst_reserve_stage, short_burst): a cache, as rate_packed
    block_median: BlockMedian = field(default_factory=lambda: BlockMedian(), repr=False, compare=False)


_Evolvable = TypeVar("_Evolvable", ArrivalCalibration, PoolObservation, PoolState, ScalingPlan)
_FIELDS: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in fields(cls))
    for cls in (ArrivalCalibration, PoolObservation, PoolState, ScalingPlan)
}
for _cls in _FIELDS:  # what evolve relies on: __init__ only stores the fields
    if hasattr(_cls, "__post_init__") or any(not f.init for f in fields(_cls)):
        raise TypeError(f"evolve: {_cls.__name__} must have no __post_init__ and no init=False field")


def evolve(value: _Evolvable, **changes: Any) -> _Evolvable:
    """``dataclasses.replace(value, **changes)`` for an ``ArrivalCalibration``, a ``PoolObservation``, a
    ``PoolState`` or a ``ScalingPlan``: an equal value (same fields, same order), without replace's per-field
    machinery (~1 µs instead of ~9; the policy makes ~17 per pool per tick, the pipeline one more). All four
    are frozen, with no ``__post_init__`` and no ``init=False`` field (checked at import), so their ``__init__``
    only stores the fields. An unknown field is a TypeError, as in replace."""
    cls = type(value)
    names = _FIELDS.get(cls)
    if names is None:  # a subclass: its own __init__ may do more
        return replace(value, **changes)
    if not names.issuperset(changes):
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(set(changes) - names))}")
    new = object.__new__(cls)
    new.__dict__.update(value.__dict__)
    new.__dict__.update(changes)
    return new
