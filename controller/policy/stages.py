"""The policy's stages, each a small pure function (no I/O, no clock: time comes in as ``now_s``).

Order (see ``decide``): capacity target from the forecast → headroom → pre-allocated buffer → warm
standby → P:D ratio → hysteresis and rate limits → GPU budget → min/max. Every stage returns the reasons
for what it changed, so a decision can be read back.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from controller.config import PolicyConfig
from controller.policy.types import PoolCapacity, PoolObservation, PoolState, RoleHistory

MAX_NEED = 1e9  # instances; larger demand is clipped here (min/max clamp it far lower anyway)


@dataclass(frozen=True)
class Need:
    """Instances needed per role before rounding (fractional), and why."""

    prefill: float
    decode: float
    running_seqs: float
    reasons: tuple[str, ...]


def _known(x: float) -> bool:
    """A usable measurement: finite and non-negative (NaN, inf and negative rates are unknown)."""
    return math.isfinite(x) and x >= 0


def _nanmax(*xs: float) -> float:
    known = [x for x in xs if _known(x)]
    return max(known) if known else math.nan


def capacity_target(
    obs: PoolObservation, cap: PoolCapacity, slo_ttft_s: float, lead_s: float = 0.0
) -> Need | None:
    """Stage 1: instances needed from the p90 forecast, the measured load and the queue.

    Prefill: predicted prompt tokens/s (p90) against one instance's prefill capacity at the TTFT SLO,
    plus the backlog: waiting requests' prompt tokens must be cleared before the oldest one misses its
    TTFT SLO (queueing-blind SLA math is the known failure this term avoids). Decode: predicted
    generation tokens/s against one instance's decode rate at the ITL SLO, and the concurrency (Little's
    law: arrival rate × mean output / per-sequence token rate) against its sequence capacity. The
    measured load is a floor under the forecast. Returns None when the load is unknown.

    ``lead_s`` is how long a newly started instance takes to serve. Clearing the queue within the TTFT SLO
    may use the warm instances (active + standby); beyond them the queue is spread over ``lead_s``, since
    cold capacity asked for now arrives only then (starting 40 instances for a 20-s backlog is pure cost:
    by the time they serve, the warm ones have cleared it). ``lead_s = 0`` sizes everything for the SLO.
    """
    fc = obs.forecast
    prompt_fc = fc.rate(fc.prompt_tokens_p90) if fc else math.nan
    gen_fc = fc.rate(fc.gen_tokens_p90) if fc else math.nan
    arrivals_fc = fc.rate(fc.arrivals_p90) if fc else math.nan
    prompt_tps = _nanmax(obs.prompt_tps, prompt_fc)
    gen_tps = _nanmax(obs.gen_tps, gen_fc)
    if not (_known(prompt_tps) and _known(gen_tps)):
        return None
    reasons = [
        f"load: prompt {prompt_tps:.0f} tok/s, generation {gen_tps:.0f} tok/s (max of measured and p90 forecast)"
    ]

    backlog_tps = backlog_cold_tps = 0.0
    if _known(obs.waiting_requests) and obs.waiting_requests > 0:
        mean_prompt = (
            obs.mean_prompt_tokens
            if _known(obs.mean_prompt_tokens)
            else prompt_tps / max(obs.arrival_rps, 1e-9)
        )
        age_s = obs.oldest_wait_s if _known(obs.oldest_wait_s) else 0.0
        clear_within_s = max(slo_ttft_s - age_s, slo_ttft_s / 4)
        if _known(mean_prompt):
            backlog_tps = obs.waiting_requests * mean_prompt / clear_within_s
            backlog_cold_tps = obs.waiting_requests * mean_prompt / max(clear_within_s, lead_s)
            reasons.append(
                f"queue: {obs.waiting_requests:.0f} waiting → +{backlog_tps:.0f} tok/s to clear in {clear_within_s:.2f} s"
            )
    prefill_slo = (prompt_tps + backlog_tps) * cap.correction / cap.prefill_tps
    prefill = (prompt_tps + backlog_cold_tps) * cap.correction / cap.prefill_tps
    warm = obs.active.get("prefill", 0) + obs.standby.get("prefill", 0)
    if prefill_slo > prefill:
        prefill = max(prefill, min(prefill_slo, float(warm)))
        reasons.append(
            f"queue: beyond the {warm} warm prefill instances it is cleared over the {lead_s:.0f} s lead"
        )

    per_seq_tps = cap.decode_tps / cap.decode_seqs
    arrival_rps = _nanmax(obs.arrival_rps, arrivals_fc)
    concurrency = obs.running_seqs if _known(obs.running_seqs) else 0.0
    if _known(arrival_rps) and _known(obs.mean_output_tokens):
        concurrency = max(concurrency, arrival_rps * obs.mean_output_tokens / per_seq_tps)
    decode = max(gen_tps * cap.correction / cap.decode_tps, concurrency / cap.decode_seqs)
    reasons.append(
        f"need: prefill {prefill:.2f}, decode {decode:.2f} instances (concurrency {concurrency:.0f})"
    )
    running = obs.running_seqs if _known(obs.running_seqs) else math.nan
    # Arithmetic on absurd (finite) inputs can overflow to inf: that is demand beyond any fleet.
    prefill, decode = min(prefill, MAX_NEED), min(decode, MAX_NEED)
    return Need(prefill=prefill, decode=decode, running_seqs=running, reasons=tuple(reasons))


TREND_BLOCK_S = 30.0  # the arrival rate is averaged over blocks this long (per-second rates are noise)
TREND_BLOCKS = 4  # consecutive blocks that must all rise for a trend: the last 2 minutes
TREND_MIN_Z = 2.0  # the median block-to-block rise must be this many standard errors
MAX_TREND_FACTOR = 4.0  # a projection never asks for more than this × the current need


def trend_factor(
    history: tuple[tuple[float, float], ...], now_s: float, lead_s: float
) -> tuple[float, str | None]:
    """Stage 1b: how much higher the load will be ``lead_s`` from now, when capacity started now serves.

    Capacity must be ready when the load comes, and a cold instance serves ``lead_s`` after it is asked
    for; a ramp (a diurnal rise, a sinusoid) outruns any policy that sizes for the load of the next few
    seconds. The arrival rate's mean over ``TREND_BLOCKS`` consecutive blocks of ``TREND_BLOCK_S`` must
    rise block after block, and the median rise must stand ``TREND_MIN_Z`` standard errors above the
    noise (the blocks' own sample variance, so an overdispersed bursty trace needs a clearer trend); then
    the last block's mean is extrapolated linearly to ``now + lead_s``. A one-block burst does not move the
    median rise, so a step does not read as a ramp. Returns (factor >= 1, reason or None). Never below 1:
    falling load is left to the scale-down delay.
    """
    if lead_s <= 0:
        return 1.0, None
    means: list[float] = []
    variances: list[float] = []
    for k in range(TREND_BLOCKS - 1, -1, -1):  # oldest block first
        hi = now_s - k * TREND_BLOCK_S
        xs = [r for t, r in history if hi - TREND_BLOCK_S < t <= hi]
        if len(xs) < 3:
            return 1.0, None
        m = sum(xs) / len(xs)
        means.append(m)
        variances.append(_mean_var(xs))
    rises = sorted(b - a for a, b in itertools.pairwise(means))
    noise = math.sqrt(2.0 * max(variances))
    median_rise = rises[len(rises) // 2]
    if rises[0] <= 0 or median_rise <= TREND_MIN_Z * noise or means[-1] <= 0:
        return 1.0, None
    slope_rps_per_s = median_rise / TREND_BLOCK_S
    projected = means[-1] + slope_rps_per_s * (TREND_BLOCK_S / 2 + lead_s)
    factor = min(projected / means[-1], MAX_TREND_FACTOR)
    reason = (
        f"trend: arrivals rising {slope_rps_per_s * 60:.2f} req/s per min for {TREND_BLOCKS * TREND_BLOCK_S:.0f} s"
        f" → load × {factor:.2f} by the time new capacity serves ({lead_s:.0f} s)"
    )
    return factor, reason


def with_trend(need: Need, factor: float) -> Need:
    """Scale a need by a trend factor (1 = unchanged)."""
    if factor == 1.0:
        return need
    return replace(
        need,
        prefill=min(need.prefill * factor, MAX_NEED),
        decode=min(need.decode * factor, MAX_NEED),
    )


def with_headroom(need: Need, headroom: float) -> tuple[int, int, str]:
    """Stage 2: headroom, each pool rounded up separately (one ceil over the sum can starve a pool)."""
    prefill = math.ceil(need.prefill * (1 + headroom) - 1e-9)
    decode = math.ceil(need.decode * (1 + headroom) - 1e-9)
    return prefill, decode, f"headroom {headroom:.0%}: prefill {prefill}, decode {decode}"


def buffer_target(
    running_seqs: float, decode: int, multiplier: float, cap: PoolCapacity
) -> tuple[int, int, str]:
    """Stage 3: reserve ``multiplier`` × the current decode load in sequence capacity.

    Returns (decode instances, buffer in sequences, reason). Unknown load reserves nothing extra.
    """
    if not _known(running_seqs):
        return decode, 0, "buffer: current load unknown, nothing reserved"
    buffer_seqs = math.ceil(min(multiplier * running_seqs, MAX_NEED * cap.decode_seqs))
    needed = math.ceil(buffer_seqs / cap.decode_seqs - 1e-9)
    if needed > decode:
        return needed, buffer_seqs, f"buffer: {buffer_seqs} seqs reserved → decode {needed}"
    return decode, buffer_seqs, f"buffer: {buffer_seqs} seqs fit in decode {decode}"


QPS_SMOOTHING_S = (
    15.0  # the rate at each end of the minute is a mean over this long (per-second rates are noise)
)
QPS_WINDOW_S = 60.0  # the growth per minute is measured over the last minute of history
QPS_MIN_SAMPLES = 5  # a window's own variance is used from this many rate samples on (else Poisson only)
QPS_MIN_Z = 3.0  # a rate rise counts only when it is this many Poisson standard deviations


def _mean_var(xs: list[float]) -> float:
    """The variance of the mean of ``xs`` (sample variance / n); needs two samples or more."""
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)


def qps_change_per_min(
    history: tuple[tuple[float, float], ...], smoothing_s: float = QPS_SMOOTHING_S
) -> float:
    """Relative arrival-rate growth per minute over ``history``: the mean rate of its last ``smoothing_s``
    against the mean of its first ``smoothing_s``; NaN with under 30 s of history or no earlier traffic."""
    if len(history) < 2:
        return math.nan
    history = tuple((t, r) for t, r in history if history[-1][0] - t <= QPS_WINDOW_S)
    t0, t1 = history[0][0], history[-1][0]
    if t1 - t0 < 30.0:
        return math.nan
    early = [r for t, r in history if t - t0 < smoothing_s]
    late = [r for t, r in history if t1 - t < smoothing_s]
    r0, r1 = sum(early) / len(early), sum(late) / len(late)
    if r0 <= 0:
        return math.nan
    # Noise: the two windows' arrival counts must differ by at least QPS_MIN_Z standard deviations, or a
    # low-rate pool would raise an alert every few seconds on noise alone. Poisson at least; more where the
    # windows' own samples say the arrivals are overdispersed (real traces are: Azure conv raised ~100
    # alerts in 34 min on Poisson noise alone).
    n0, n1 = r0 * smoothing_s, r1 * smoothing_s
    sd = math.sqrt(n0 + n1)
    if min(len(early), len(late)) >= QPS_MIN_SAMPLES:
        sd = max(sd, smoothing_s * math.sqrt(_mean_var(early) + _mean_var(late)))
    if n1 - n0 < QPS_MIN_Z * sd:
        return 0.0 if r1 >= r0 else (r1 - r0) / r0 * 60.0 / max((t1 - t0) - smoothing_s, 1.0)
    span_s = (t1 - t0) - smoothing_s  # between the two windows' centres
    return (r1 - r0) / r0 * 60.0 / span_s


RATE_HISTORY_S = TREND_BLOCKS * TREND_BLOCK_S  # what the trend needs; the QPS alert reads the last minute


def update_rate_history(
    history: tuple[tuple[float, float], ...],
    now_s: float,
    arrival_rps: float,
    window_s: float = RATE_HISTORY_S,
) -> tuple[tuple[float, float], ...]:
    """Append the current rate (if known; once per ``now_s``) and forget samples older than ``window_s``."""
    kept = tuple((t, r) for t, r in history if now_s - t <= window_s)
    if _known(arrival_rps) and not (kept and kept[-1][0] == now_s):
        kept = (*kept, (now_s, arrival_rps))
    return kept


def forecast_spread(obs: PoolObservation) -> float:
    """Relative uncertainty of the arrival forecast, (p90 - p50) / p90 in [0, 1]; NaN when unknown."""
    fc = obs.forecast
    if fc is None or not (_known(fc.arrivals_p90) and _known(fc.arrivals_p50)) or fc.arrivals_p90 <= 0:
        return math.nan
    return min(max((fc.arrivals_p90 - fc.arrivals_p50) / fc.arrivals_p90, 0.0), 1.0)


def standby_size(need: float, target: int, headroom: float, spread: float, most: int) -> tuple[int, str]:
    """Stage 3b: warm standby for one role, sized to the burst the active target cannot absorb.

    Standby activates in seconds, so it is what absorbs a burst inside the forecast's horizon; but it holds
    a GPU all the time, so it is only worth what the rounded-up active target lacks. The burst to cover is
    the need (p90, with headroom) pushed up by the forecast's own spread, ``(p90 - p50) / p90``: about the
    distance from p90 to p99 of the forecast. Standby = that burst's instances minus the active target, in
    [0, ``most``]. Unknown spread (no forecast) is not zero uncertainty: it gets ``most``.
    """
    if not _known(spread):
        return most, f"standby {most} (forecast spread unknown)"
    burst = math.ceil(need * (1 + headroom) * (1 + spread) - 1e-9)
    size = max(0, min(most, burst - target))
    return size, f"standby {size}: burst need {burst} (spread {spread:.0%}) over active {target}"


def hold_standby(
    recent: tuple[tuple[float, int, int], ...], now_s: float, sized: tuple[int, int], delay_s: float
) -> tuple[tuple[tuple[float, int, int], ...], tuple[int, int]]:
    """Stage 3c: the sized standby falls only after it has stayed lower for ``delay_s`` (as active replicas
    do): a standby that flaps with the forecast's spread is a cold start every few ticks and is never warm
    when the rise comes. Returns (the remembered window, the held (prefill, decode) standby)."""
    window = (*tuple(r for r in recent if now_s - r[0] < delay_s), (now_s, sized[0], sized[1]))
    return window, (max(p for _, p, _ in window), max(d for _, _, d in window))


def standby_stage(
    prefill: int,
    decode: int,
    obs: PoolObservation,
    cfg: PolicyConfig,
    state: PoolState,
    standby: tuple[int, int] | None = None,
) -> tuple[int, int, PoolState, tuple[str, ...]]:
    """Stage 4: warm standby. On a burst alert (burst probability over its threshold, or the arrival rate
    growing faster than ``qps_change_alert_per_min``) the standby replicas — ``standby`` (prefill, decode),
    default the configured counts — are promoted (counted into the active target) and held for
    ``alert_hold_s``; the standby targets stay, so standby is refilled."""
    sb_prefill, sb_decode = standby if standby is not None else (cfg.standby_prefill, cfg.standby_decode)
    history = update_rate_history(state.rate_history, obs.now_s, obs.arrival_rps)
    change = qps_change_per_min(history)
    burst = obs.forecast.burst_prob if obs.forecast else math.nan
    reasons: list[str] = []
    alert_until = state.alert_until_s
    if _known(burst) and burst >= cfg.burst_threshold:
        alert_until = obs.now_s + cfg.alert_hold_s
        reasons.append(f"alert: burst probability {burst:.2f} >= {cfg.burst_threshold:.2f}")
    if _known(change) and change >= cfg.qps_change_alert_per_min:
        alert_until = obs.now_s + cfg.alert_hold_s
        reasons.append(f"alert: arrival rate +{change:.0%}/min >= {cfg.qps_change_alert_per_min:.0%}/min")
    if obs.now_s < alert_until:
        prefill += sb_prefill
        decode += sb_decode
        reasons.append(
            f"standby promoted until t={alert_until:.0f} s: +{sb_prefill} prefill, +{sb_decode} decode"
        )
    new_state = replace(state, rate_history=history, alert_until_s=alert_until)
    return prefill, decode, new_state, tuple(reasons)


def pd_ratio_stage(
    prefill: int, decode: int, ratio_min: float, ratio_max: float
) -> tuple[int, int, str | None]:
    """Stage 5: keep prefill:decode within [ratio_min, ratio_max] (0 = unbounded) by raising the short side."""
    if ratio_min > 0 and decode > 0 and prefill < ratio_min * decode:
        new = math.ceil(ratio_min * decode - 1e-9)
        return new, decode, f"P:D ratio >= {ratio_min:g}: prefill {prefill} → {new}"
    if ratio_max > 0 and prefill > ratio_max * decode:
        new = math.ceil(prefill / ratio_max - 1e-9)
        return prefill, new, f"P:D ratio <= {ratio_max:g}: decode {decode} → {new}"
    return prefill, decode, None


def hysteresis_stage(
    role: str,
    wanted: int,
    current: int,
    now_s: float,
    cfg: PolicyConfig,
    history: RoleHistory,
    can_scale_down: bool,
    fast_up: int,
) -> tuple[int, RoleHistory, str | None]:
    """Stage 7: tolerance band, rate limits and the time-based scale-down delay for one role.

    Scale-down goes to the highest target wanted within the last ``scale_down_delay_s`` (so a dip shorter
    than the delay changes nothing), never within the delay after a scale-up, never when the data is
    incomplete, and at most ``max_scale_down_per_min`` replicas (or ``max_scale_down_fraction_per_min`` of
    the current ones, whichever is more) per minute since the last change.
    Scale-up is limited to a ramp of (max - min) replicas per ``ramp_up_s``, at least one per decision,
    plus ``fast_up`` replicas that are already warm (standby promotion is not rate-limited).
    """
    window_s = cfg.scale_down_delay_s
    recent = (*tuple((t, w) for t, w in history.recent_targets if now_s - t < window_s), (now_s, wanted))
    target = wanted
    reason = None
    if current > 0 and abs(target - current) / current <= cfg.tolerance:
        target = current
    if target > current:
        lo, hi = (cfg.min_prefill, cfg.max_prefill) if role == "prefill" else (cfg.min_decode, cfg.max_decode)
        elapsed = now_s - history.last_change_s if math.isfinite(history.last_change_s) else math.inf
        if cfg.ramp_up_s > 0 and math.isfinite(elapsed):
            limit = current + fast_up + max(1, math.floor((hi - lo) * elapsed / cfg.ramp_up_s))
            if target > limit:
                reason = f"{role}: ramp-up limit {current} → {limit} (wanted {target})"
                target = limit
    elif target < current:
        held = max(w for _, w in recent)
        since_up = now_s - history.last_scale_up_s
        if not can_scale_down:
            target, reason = current, f"{role}: no scale-down on incomplete data"
        elif since_up < cfg.scale_down_delay_s:
            target, reason = current, f"{role}: scale-down delayed ({since_up:.0f} s since scale-up)"
        elif held > target:
            target = min(held, current)
            if target == current:
                reason = f"{role}: scale-down waits until the target stays lower for {window_s:.0f} s"
        if target < current:
            elapsed = now_s - history.last_change_s
            per_min = max(cfg.max_scale_down_per_min, cfg.max_scale_down_fraction_per_min * current)
            allowed = math.floor(per_min * elapsed / 60.0) if math.isfinite(elapsed) else current
            if current - target > allowed:
                new = current - allowed
                reason = f"{role}: scale-down rate limit {current} → {new} (wanted {target})"
                target = new
    new_history = RoleHistory(
        last_scale_up_s=now_s if target > current else history.last_scale_up_s,
        last_change_s=now_s if target != current else history.last_change_s,
        recent_targets=recent,
    )
    return target, new_history, reason


def degrade_stage(
    need_prefill: int,
    need_decode: int,
    cfg: PolicyConfig,
    now_s: float,
    state: PoolState,
) -> tuple[bool, PoolState, str | None]:
    """Stage 8: degradation when demand exceeds the max replicas; lifted with hysteresis once demand has
    stayed within max for ``degrade_recover_s``."""
    over = need_prefill > cfg.max_prefill or need_decode > cfg.max_decode
    degraded = not math.isnan(state.degrade_since_s)
    if over:
        since = state.degrade_since_s if degraded else now_s
        reason = f"degrade: demand prefill {need_prefill}, decode {need_decode} exceeds max replicas"
        return True, replace(state, degrade_since_s=since, calm_since_s=math.nan), reason
    if not degraded:
        return False, state, None
    calm = state.calm_since_s if not math.isnan(state.calm_since_s) else now_s
    if now_s - calm >= cfg.degrade_recover_s:
        return False, replace(state, degrade_since_s=math.nan, calm_since_s=math.nan), "degrade lifted"
    return True, replace(state, calm_since_s=calm), f"degrade held: calm for {now_s - calm:.0f} s"


def clamp(value: int, lo: int, hi: int) -> int:
    """Min/max, applied last."""
    return max(lo, min(hi, value))
