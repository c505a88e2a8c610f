"""``decide``: the predictive policy for one pool, composed from the stages in ``stages.py``, and
``allocate_budget``: the fleet-wide GPU budget across pools."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.config import PolicyConfig
from controller.policy import calibration, rise, rise_lead, stages
from controller.policy.types import (
    ROLES,
    PackedRates,
    PoolCapacity,
    PoolObservation,
    PoolState,
    RoleHistory,
    ScalingPlan,
    evolve,
)


@dataclass(frozen=True)
class PolicyContext:
    """Everything one decision may look at; nothing else (no clock, no I/O)."""

    obs: PoolObservation
    capacity: PoolCapacity
    config: PolicyConfig
    slo_ttft_ms: float
    slo_itl_ms: float


def _same_time(a: float, b: float) -> bool:
    """Equal times, NaN (none) equal to NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


def decide(ctx: PolicyContext, state: PoolState) -> tuple[ScalingPlan | None, PoolState]:
    """One tick's decision for one pool: a plan, or None ("no opinion") when the load is unknown.

    Unknown load never scales down: the caller keeps the current scale on None. The state it returns then
    has this tick folded into the memories that take unknown ticks by their own rules (the smoothing window,
    the queue's age, the arrival calibration, whose count an unknown rate breaks); the scaling memory
    (targets, bursts, rates) is left as it was."""
    obs, cfg, cap = ctx.obs, ctx.config, ctx.capacity
    window_s = max(cfg.load_smoothing_s, cfg.load_smoothing_slo * ctx.slo_ttft_ms / 1000.0)
    obs, smoothed = stages.smooth_load(obs, state, window_s)
    queue_s, smoothed = stages.queue_age(obs, smoothed)
    # stage 1 reads the recalibrated arrival forecast; the standby's spread stays the forecaster's own ratio
    stage1_obs, smoothed, why_calibrated = _calibrate_arrivals(ctx.obs, obs, cap, cfg, smoothed)
    need = stages.capacity_target(
        stage1_obs,
        cap,
        ctx.slo_ttft_ms / 1000.0,
        cfg.provision_lead_s,
        offered=stages.uses_offered(obs, cfg),
        persistent_queue=queue_s >= cfg.queue_persist_s,
        prompt_forecast=cfg.prompt_forecast,
        gen_forecast=cfg.gen_forecast,
        pinned_queue=cfg.queue_pinned,
        little_arrivals=cfg.little_arrivals,
        saturated_kv=cfg.decode_saturated_kv,
    )
    if need is None:
        return None, smoothed
    state = smoothed if math.isfinite(smoothed.first_known_s) else evolve(smoothed, first_known_s=obs.now_s)
    reasons = [*need.reasons, why_calibrated] if why_calibrated else list(need.reasons)
    history = stages.update_rate_history(state.rate_history, obs.now_s, obs.arrival_rps)
    # the trend reads the history's arrays, packed from the last tick's with the new row (the same values)
    packed = stages.packed_rates(history, state.rate_packed)
    state = evolve(state, rate_history=history, rate_packed=packed)
    silent, silent_since, why_silent = stages.sudden_silence(
        history,
        obs.now_s,
        obs.arrival_rps,
        state.silent_since_s,
        cfg.silence_hold_s,
        queued=obs.waiting_requests > 0,  # NaN (unknown) compares False: the other rules guard unknown data
    )
    if not _same_time(silent_since, state.silent_since_s):
        state = evolve(state, silent_since_s=silent_since)
    if why_silent:
        reasons.append(why_silent)
    factor, why_trend = stages.trend_from_rates(
        *stages.known_rates(packed),
        obs.now_s,
        cfg.provision_lead_s,
        ordered=type(packed.history) is stages.TimeRows,
    )
    if cfg.trend_test == "poisson" and why_trend is None:  # opt-in: a convex or slow rise the line misses
        factor, why_trend = rise.rise_factor(state.rate_history, obs.now_s, cfg.provision_lead_s)
    led = 1.0
    if cfg.rise_lead == "realised":  # opt-in: what the p90 misses of a rise, read from the realised arrivals
        led, why_led = _rise_lead(packed, stage1_obs, cfg)
        if led > (factor if why_trend else 1.0):
            reasons.append(why_led)
        else:
            led = 1.0
    if led > 1.0 and not why_trend:
        need = stages.with_trend(need, led)
    if why_trend:
        queued = stages.queued_decode(obs, cap)
        need = stages.with_trend(need, led if led > 1.0 else factor, queued)  # led > 1 only above factor
        reasons.append(
            f"{why_trend}; + {queued:.2f} decode for the queue it will prefill" if queued else why_trend
        )
    if queue_s < cfg.queue_persist_s:  # not for a persistent queue (see stages.drained_decode)
        need, why_drain = stages.with_drain(need, *stages.drained_decode(obs, cap, need.prefill))
        if why_drain:
            reasons.append(why_drain)
    prefill, decode, why = stages.with_headroom(
        need, *stages.role_headroom(cfg.headroom, cfg.headroom_decode, ramp=bool(why_trend))
    )
    reasons.append(why)
    decode, buffer_seqs, why = stages.buffer_target(need.running_seqs, decode, cfg.buffer_multiplier, cap)
    reasons.append(why)
    degrade, state, why_degrade = stages.degrade_stage(prefill, decode, cfg, obs.now_s, state)
    if why_degrade:
        reasons.append(why_degrade)
    prefill, decode, reserve_standby, state, why_reserve = stages.burst_reserve_stage(
        prefill, decode, obs, cap, cfg, state, trend=factor if why_trend else None
    )
    reasons.extend(why_reserve)
    standby_target, state, why_sized = _standby_targets(
        need, prefill, decode, obs, cfg, state, bool(why_trend)
    )
    reasons.extend(why_sized)
    standby_target = {r: max(standby_target[r], reserve_standby[i]) for i, r in enumerate(ROLES)}
    prefill, decode, state, why_standby = stages.standby_stage(
        prefill,
        decode,
        obs,
        cfg,
        state,
        (standby_target["prefill"], standby_target["decode"]),
        rate_history_updated=True,
    )
    reasons.extend(why_standby)

    prefill, decode, why_ratio = stages.pd_ratio_stage(prefill, decode, cfg.pd_ratio_min, cfg.pd_ratio_max)
    if why_ratio:
        reasons.append(why_ratio)

    wanted = {"prefill": prefill, "decode": decode}
    asked = dict(wanted)  # the stages' targets before the short-burst cap and the cold-start wait
    seen_from = state.need_blocks[0][0] if state.need_blocks else math.nan
    hold_s, why_hold = stages.burst_hold(state.burst_runs, obs.now_s, cfg, seen_from, state.pauses)
    if why_hold:
        reasons.append(why_hold)
    short, why_short = stages.short_burst(
        state.burst_runs, state.need_blocks, obs.now_s, cfg, state.block_median
    )
    # A rise of decode's need per request (longer outputs) is a level, not an arrival burst (decode_length_rise).
    lengths, state, why_lengths = _length_rise(obs, cap, cfg, state)
    if why_lengths:
        reasons.append(why_lengths)
    # A ramp is not a short burst: the load the trend projects is still there when cold capacity serves.
    if short and queue_s < cfg.queue_persist_s and why_trend is None:
        for role in ROLES:
            if lengths and role == "decode":
                continue
            warm = obs.replicas.get(role, 0) + obs.standby.get(role, 0)
            if wanted[role] > warm:
                reasons.append(f"{why_short}: {role} {wanted[role]} → {warm}")
                wanted[role] = warm
    young = _young_hold(hold_s, obs.now_s, state, seen_from, wanted, cfg)
    reasons.extend(young.reasons)
    # Prefill, no request waiting, a pool watched for a cold start: a target above the warm fleet may be a
    # one-tick spike (one long prompt), and cold capacity follows only a target that lasted. A queue (or an
    # unknown one) is load already here, and before one cold start of history a spike is not known to be one.
    # Not decode: its overload shows as ITL, with no queue to lift the wait (on the 1800-s sinusoid's first rise
    # waiting for decode targets to last sized it at the bottom of their noise: -0.1 SLO points).
    watched = obs.now_s - seen_from >= cfg.provision_lead_s  # False while seen_from is NaN
    cold_persist_s = cfg.cold_start_persist_s if obs.waiting_requests == 0 and watched else 0.0
    decode_persists = cfg.cold_start_persist_decode and why_trend is None and not lengths
    # the wait the active rule applies this tick, per role (the settled spare reads it too)
    waits = {r: cold_persist_s if r == "prefill" or decode_persists else 0.0 for r in ROLES}
    # A projected ramp's target is the load one cold start ahead: rate-limiting it only delays that capacity.
    rate_limited = not (cfg.ramp_up_on_trend == "lifted" and (why_trend is not None or led > 1.0))
    bounds = {"prefill": (cfg.min_prefill, cfg.max_prefill), "decode": (cfg.min_decode, cfg.max_decode)}
    roles = dict(state.roles)
    final: dict[str, int] = {}
    for role in ROLES:
        current = obs.replicas.get(role, 0)
        # while silent the pool wants what it has: no scale-down now (the window's highest target is the
        # current count), and the window, which reads the targets wanted, starts only when the silence ends (on s18's outage with seed 1 the first tick of
        # the retries, its target not yet risen, released a third of the pool into the storm)
        target, roles[role], why_h = stages.hysteresis_stage(
            role,
            max(wanted[role], current) if silent else wanted[role],
            current,
            obs.now_s,
            cfg,
            state.roles.get(role, RoleHistory()),
            can_scale_down=obs.complete,
            fast_up=obs.standby.get(role, 0),
            hold_s=young.hold_s.get(role, hold_s),
            cold_persist_s=waits[role],
            rate_limited=rate_limited,
            floor=young.floor.get(role, 0),
        )
        if why_h:
            reasons.append(why_h)
        lo, hi = bounds[role]
        clamped = stages.clamp(target, lo, hi)
        if clamped != target:
            reasons.append(f"{role}: clamped {target} → {clamped} to [{lo}, {hi}]")
        final[role] = clamped
    # the untested standby (cfg.standby_untested_s) and its hold are a bet on top of what is held: with
    # standby_untested_spare off, the spare does not eat it (its per-tick flaps cancel the cold starts)
    bet_until_s = (
        state.first_known_s + cfg.standby_untested_s + max(cfg.scale_down_delay_s, cfg.provision_lead_s)
    )
    on_top = cfg.standby_untested_s > 0 and not cfg.standby_untested_spare and obs.now_s < bet_until_s
    if cfg.standby_counts_spare and not on_top:
        spares = {r: max(final[r] - wanted[r], 0) for r in ROLES}
        if cfg.standby_spare_settle != "tick":
            past = {r: asked[r] > obs.replicas.get(r, 0) for r in ROLES}
            spares, state = _settled_spare(spares, obs.now_s, cfg, state, past, waits)
        for role in ROLES:
            spare = spares[role]
            if spare > 0 and standby_target[role] > 0:
                kept = max(0, standby_target[role] - spare)
                settled = " (the most over the settle window)" if cfg.standby_spare_settle != "tick" else ""
                reasons.append(
                    f"{role}: standby {standby_target[role]} → {kept}: {spare} active replica(s) held above the"
                    f" target{settled} already absorb a burst"
                )
                standby_target[role] = kept
    if cfg.standby_start_persist:
        persist = {r: cold_persist_s if r == "prefill" or decode_persists else 0.0 for r in ROLES}
        standby_target, state, why_persist = _standby_persisted(standby_target, obs, persist, state)
        reasons.extend(why_persist)
    state = evolve(state, roles=roles)
    plan = ScalingPlan(
        pool=obs.pool,
        prefill=final["prefill"],
        decode=final["decode"],
        standby_prefill=standby_target["prefill"],
        standby_decode=standby_target["decode"],
        buffer_seqs=buffer_seqs,
        degrade=degrade,
        silent=silent,
        reasons=tuple(reasons),
    )
    return plan, state


@dataclass(frozen=True)
class _YoungHold:
    """What ``cfg.young_hold_s`` changes this tick: per role, a longer scale-down window (``hold_s``) or a floor
    no scale-down goes below (``floor``); roles absent keep the usual window."""

    hold_s: Mapping[str, float]
    floor: Mapping[str, int]
    reasons: tuple[str, ...]


_NO_YOUNG_HOLD = _YoungHold({}, {}, ())


def _length_rise(
    obs: PoolObservation, cap: PoolCapacity, cfg: PolicyConfig, state: PoolState
) -> tuple[bool, PoolState, str | None]:
    """Whether decode reads a length rise this tick (``stages.length_rise``; True only with
    ``cfg.decode_length_rise``), the state with the usual output length moved on (kept with either
    ``decode_length_rise`` or ``output_floor_kv: rise``, whose pipeline side reads it), and the reason. A young
    pool's first ``provision_lead_s`` of readings (the length tracker's warm-up, which reads low) are not
    folded into the usual."""
    if not (cfg.decode_length_rise or cfg.output_floor_kv == "rise"):
        return False, state, None
    usual = state.output_usual
    rose = stages.length_rise(obs.mean_output_tokens, usual, cfg.headroom, obs.gen_tps, cap)
    if obs.now_s >= state.first_known_s + cfg.provision_lead_s:
        state = evolve(state, output_usual=stages.usual_output(usual, obs.now_s, obs.mean_output_tokens))
    if not (rose and cfg.decode_length_rise):
        return False, state, None
    return (
        True,
        state,
        (
            f"decode: mean output {obs.mean_output_tokens:.0f} tokens above {1 + cfg.headroom:.2f} × its usual"
            f" {usual[1] / usual[2]:.0f}: a length rise, not a burst (no short-burst cap or cold-start wait for decode)"
        ),
    )


def _young_hold(
    hold_s: float,
    now_s: float,
    state: PoolState,
    seen_from: float,
    wanted: Mapping[str, int],
    cfg: PolicyConfig,
) -> _YoungHold:
    """``cfg.young_hold_s``: for the first ``young_hold_s`` of the pool's known load (from
    ``state.first_known_s``), a scale-down keeps capacity the pool asked for while young. Before one cold start
    of history nothing waits for a target to last (``cold_start_persist_s``), and a window of
    ``scale_down_delay_s`` cancelled what the first ticks started before it was warm.

    ``young_hold_scope='all'``: the scale-down window (``hold_s``, the burst hold's) reaches back to the first
    known tick, so nothing the pool asked for since is released. ``'unwatched'``: only the targets wanted before
    the pool was watched for one cold start (``seen_from + provision_lead_s``; all of them while no need block
    is seen) are kept, as a floor (the most of them); later targets get the usual window. ``'first'``: only
    those of its first ``NEED_BLOCK_S`` of known load (the pool's first sizing, from one block of measurements and
    the forecaster's first look), as a floor. ``young_hold_roles``:
    both roles or prefill alone. No change outside the window, when it is off and while no load was known (NaN)."""
    known_s = now_s - state.first_known_s
    young_s = cfg.young_hold_s
    if not (young_s > 0 and 0.0 <= known_s < young_s):  # NaN: False
        return _NO_YOUNG_HOLD
    roles = ROLES if cfg.young_hold_roles == "both" else ("prefill",)
    since = f"since t={state.first_known_s:.0f} s"
    if cfg.young_hold_scope == "all":
        why = f"young pool: load known for {known_s:.0f} s < {young_s:.0f} s: no scale-down below the most wanted"
        window = max(hold_s, known_s + stages.NEED_BLOCK_S)
        return _YoungHold({r: window for r in roles}, {}, (f"{why} {since} ({', '.join(roles)})",))
    if cfg.young_hold_scope == "first":  # the pool's first sizing: one need block of measurements
        watched_from = state.first_known_s + stages.NEED_BLOCK_S
        what = "in its first need block"
    else:
        watched_from = seen_from + cfg.provision_lead_s if math.isfinite(seen_from) else math.inf
        what = "before one cold start of history"
    floor: dict[str, int] = {}
    for role in roles:
        rows = state.roles.get(role, RoleHistory()).recent_targets
        early = [w for t, w in rows if state.first_known_s <= t < watched_from]
        if now_s < watched_from:
            early.append(wanted[role])
        if early:
            floor[role] = max(early)
    if not floor:
        return _NO_YOUNG_HOLD
    held = ", ".join(f"{r} {n}" for r, n in floor.items())
    why = (
        f"young pool: load known for {known_s:.0f} s < {young_s:.0f} s: no scale-down below the most wanted"
        f" {what} ({held}) {since}"
    )
    return _YoungHold({}, floor, (why,))


def _realised_rise(packed: PackedRates, now_s: float, cfg: PolicyConfig) -> rise_lead.RealisedRise | None:
    """``rise_lead.realised_rise`` on the known samples of ``packed`` with ``cfg``'s window, test and cap, one
    cold start (``provision_lead_s``) ahead."""
    return rise_lead.realised_rise(
        *stages.known_rates(packed),
        now_s,
        window_s=cfg.rise_lead_window_s,
        ahead_s=cfg.provision_lead_s,
        z_min=cfg.rise_lead_z,
        max_factor=cfg.rise_lead_max_factor,
    )


def _rise_lead(packed: PackedRates, obs: PoolObservation, cfg: PolicyConfig) -> tuple[float, str]:
    """``cfg.rise_lead='realised'``: how far the arrival p90 stage 1 read (``obs``, the recalibrated
    observation) falls short of the rise the realised arrivals project one cold start on
    (``rise_lead.realised_rise``), as a factor on stage 1's need (1 when they read none or the p90 covers
    it), and why."""
    found = _realised_rise(packed, obs.now_s, cfg)
    p90 = obs.forecast.rate(obs.forecast.arrivals_p90) if obs.forecast is not None else math.nan
    factor = rise_lead.lead_factor(found, p90)
    if found is None:
        return 1.0, ""
    why = (
        f"rise lead: arrivals {found.earlier_rps:.1f} → {found.recent_rps:.1f} req/s over the last"
        f" {cfg.rise_lead_window_s:.0f} s ({found.z:.1f} standard errors) → {found.projected_rps:.1f} req/s"
        f" in {cfg.provision_lead_s:.0f} s, above the p90 {p90:.1f}: need × {factor:.2f}"
    )
    return factor, why


def _calibrate_arrivals(
    raw: PoolObservation, obs: PoolObservation, cap: PoolCapacity, cfg: PolicyConfig, state: PoolState
) -> tuple[PoolObservation, PoolState, str | None]:
    """``cfg.arrival_calibration``: track the coverage of the raw observation's arrival forecast against the
    arrivals it counts (``calibration.update_calibration``), and return ``obs`` (the smoothed observation) with
    the recalibrated forecast, floored at its measured rate, for stage 1. Not for the standby's spread
    (``stages.forecast_spread``): p50 and p90 move by their own multipliers, and the wider spread that left
    kept 2.6 × the standby GPU-s on mmpp-holdout for no SLO. 'off' passes everything through."""
    if cfg.arrival_calibration == "off":
        return obs, state, None
    lifted = cfg.rise_lead == "calibrated"
    eased = cfg.arrival_calibration_saturated == "eased"
    top = cfg.arrival_calibration_max_scale
    params = calibration.CalibrationParams(
        gain_per_s=cfg.arrival_calibration_gain_per_s,
        min_scale=cfg.arrival_calibration_min_scale,
        max_scale=max(top, cfg.rise_lead_max_scale) if lifted else top,
        warmup_s=cfg.arrival_calibration_warmup_s,
    )
    # rise_lead='calibrated': above arrival_calibration_max_scale only while the realised arrivals read a rise
    # (on the last tick's rate history: the test sees this tick's rate one tick later)
    max_applied = math.inf
    if lifted:
        rising = _realised_rise(state.rate_packed, raw.now_s, cfg) is not None
        max_applied = params.max_scale if rising else top
    cal = calibration.update_calibration(
        state.arrival_calibration, raw.now_s, raw.arrival_rps, raw.forecast, params
    )
    forecast, why = calibration.calibrated_forecast(
        obs.forecast,
        cal,
        obs.arrival_rps,
        params,
        saturated=not eased and stages.decode_saturated(obs, cap, cfg.decode_saturated_kv),  # 'lift' reads it
        fullness=stages.decode_fullness(obs, cap, cfg.decode_saturated_kv) if eased else math.nan,
        ease=(cfg.arrival_calibration_ease_from, cfg.arrival_calibration_ease_full) if eased else None,
        max_applied=max_applied,
    )
    if why and lifted and max_applied > top:
        why += "; rise lead: a rise read, the bound lifted"
    return evolve(obs, forecast=forecast), evolve(state, arrival_calibration=cal), why


def _standby_targets(
    need: stages.Need,
    prefill: int,
    decode: int,
    obs: PoolObservation,
    cfg: PolicyConfig,
    state: PoolState,
    ramp: bool = False,
) -> tuple[dict[str, int], PoolState, list[str]]:
    """Standby per role: the configured counts ('flat'), or sized by the forecast's spread and held like
    replicas for max(scale-down delay, provision lead) ('uncertainty'), against each role's headroom
    (``stages.role_headroom``; ``ramp``: the trend stage projects one this tick). For the first
    ``cfg.standby_untested_s`` of known load the spread counts as unknown: the configured counts, or
    ``cfg.standby_untested_prefill`` / ``_decode`` where set."""
    target = {"prefill": cfg.standby_prefill, "decode": cfg.standby_decode}
    if cfg.standby_sizing == "flat":
        return target, state, []
    spread = stages.forecast_spread(obs)
    reasons = []
    known_s = obs.now_s - state.first_known_s
    if known_s < cfg.standby_untested_s:  # what the spread is worth on this pool is not known yet
        spread = math.nan
        for role, count in (
            ("prefill", cfg.standby_untested_prefill),
            ("decode", cfg.standby_untested_decode),
        ):
            target[role] = target[role] if count is None else count
        reasons.append(
            f"standby: load known for {known_s:.0f} s < {cfg.standby_untested_s:.0f} s: spread untested"
        )
    heads = stages.role_headroom(cfg.headroom, cfg.headroom_decode, ramp)
    for role, role_need, active, head in (
        ("prefill", need.prefill, prefill, heads[0]),
        ("decode", need.decode, decode, heads[1]),
    ):
        target[role], why = stages.standby_size(role_need, active, head, spread, target[role])
        reasons.append(f"{role}: {why}")
    hold_s = max(cfg.scale_down_delay_s, cfg.provision_lead_s)
    recent, held = stages.hold_standby(
        state.standby_recent, obs.now_s, (target["prefill"], target["decode"]), hold_s
    )
    if held != (target["prefill"], target["decode"]):
        reasons.append(f"standby held at {held[0]} prefill, {held[1]} decode for {hold_s:.0f} s")
    return {"prefill": held[0], "decode": held[1]}, evolve(state, standby_recent=recent), reasons


def _settled_spare(
    spares: dict[str, int],
    now_s: float,
    cfg: PolicyConfig,
    state: PoolState,
    past: Mapping[str, bool] | None = None,
    waits: Mapping[str, float] | None = None,
) -> tuple[dict[str, int], PoolState]:
    """The spare active replicas (final − wanted) per role, as the most seen over max(scale-down delay,
    provision lead) (``stages.hold_standby``'s window). The spare follows the per-second wanted target under a
    held active target, so the standby it leaves flips with it, and each flip back up is a cold start
    cancelled at the next flip down; counted at its most over the window, the standby it leaves changes only
    with a change that lasted. A rise of the sized standby itself (a rising load, no spare) is not delayed.
    ``standby_spare_settle='persist'`` takes the window as ``cold_start_persist_s`` instead: the standby
    asked for again when the spare vanishes waits as long as a cold active target does.

    ``'persist_reset'``: as 'persist', with the wait the active rule applies this tick, ``waits[role]`` (0 while
    a request waits, before one cold start of history, for decode while a ramp is projected: then this tick's
    spare), and a role whose stages ask for more than its active replicas (``past[role]``: the load has gone
    past the fleet held before this tick) forgets the spares it remembers. Those replicas were spare only while
    the load was below the held fleet; past it they are in use, and the standby they stood for is asked for at
    once, as with 'tick'. A flap under a held target (wanted 2 ↔ 3 under 3) never goes past it, so its spare
    stays settled. Why (docs/BENCHMARKS.md, s13p): on a long rise the spare vanishes for good when the load
    reaches the held fleet, and 'persist' delayed that standby's cold start by the wait (on the 2 → 24 req/s
    ramp one decode instance 29 s later; one fewer ready decode at 525-531 s read the decode fleet as full,
    which lifts the arrival calibration's cut: decode's need 10 → 18 and 8 cold starts for a target held 60-88
    s), and on the 1200-s sinusoid the same in the pool's first, unwatched minutes."""
    mode = cfg.standby_spare_settle
    if mode == "window":
        recent, held = stages.hold_standby(
            state.spare_recent, now_s, (spares["prefill"], spares["decode"]),
            max(cfg.scale_down_delay_s, cfg.provision_lead_s),
        )  # fmt: skip
        return {"prefill": held[0], "decode": held[1]}, evolve(state, spare_recent=recent)
    window_s = cfg.cold_start_persist_s
    kept = stages.recent_rows(state.spare_recent, now_s, window_s)
    reset = mode == "persist_reset"
    gone = tuple(reset and past is not None and past.get(r, False) for r in ROLES)
    if any(gone):  # the role's remembered spares are in use now: 0 (a spare is never negative)
        kept = tuple((row[0], 0 if gone[0] else row[1], 0 if gone[1] else row[2]) for row in kept)
    rows = stages.append_row(kept, (now_s, spares["prefill"], spares["decode"]))
    out = {}
    for i, role in enumerate(ROLES):
        wait_s = min(window_s, waits.get(role, window_s)) if reset and waits is not None else window_s
        out[role] = max([spares[role], *(int(row[1 + i]) for row in rows if now_s - row[0] < wait_s)])
    return out, evolve(state, spare_recent=rows)


def _standby_persisted(
    target: dict[str, int], obs: PoolObservation, persist_s: dict[str, float], state: PoolState
) -> tuple[dict[str, int], PoolState, list[str]]:
    """``cfg.standby_start_persist``: the cold-start persistence (``cold_start_persist_s``, as
    ``stages.hysteresis_stage`` applies it to the active target) for the standby target too. A standby target
    above the role's warm standby instances goes only as far as the lowest standby target of the last
    ``persist_s[role]`` seconds (0 = no wait: a queue, a pool not yet watched for one cold start, decode while a
    ramp is projected), and never below the warm standby, so no held instance is released by this rule: under a
    held active target the spare active replica flips the standby between 1 and 0 every tick, and each flip up
    was a cold start cancelled at the next flip down (s11w). This tick's own target always counts; the window
    remembers the targets before this cut, as the active rule remembers the wanted ones."""
    longest = max(persist_s.values())
    kept = stages.recent_rows(state.standby_start_recent, obs.now_s, longest) if longest > 0 else ()
    reasons = []
    out = dict(target)
    for i, role in enumerate(ROLES):
        warm = obs.standby.get(role, 0)
        if persist_s[role] <= 0 or target[role] <= warm:
            continue
        window = [int(row[1 + i]) for row in kept if obs.now_s - row[0] < persist_s[role]]
        lasting = min(min(window, default=target[role]), target[role])
        if lasting < target[role]:
            out[role] = max(lasting, warm)
            reasons.append(
                f"{role}: standby cold start only for a target wanted {persist_s[role]:.0f} s:"
                f" {target[role]} → {out[role]}"
            )
    rows = stages.append_row(kept, (obs.now_s, target["prefill"], target["decode"]))
    return out, evolve(state, standby_start_recent=rows), reasons


def _with_count(plan: ScalingPlan, field: str, value: int, reason: str) -> ScalingPlan:
    counts = {
        "prefill": plan.prefill,
        "decode": plan.decode,
        "standby_prefill": plan.standby_prefill,
        "standby_decode": plan.standby_decode,
    }
    counts[field] = value
    return ScalingPlan(
        pool=plan.pool,
        prefill=counts["prefill"],
        decode=counts["decode"],
        standby_prefill=counts["standby_prefill"],
        standby_decode=counts["standby_decode"],
        buffer_seqs=plan.buffer_seqs,
        degrade=plan.degrade,
        silent=plan.silent,
        reasons=(*plan.reasons, reason),
    )


def slo_risk(count: int, need: float) -> float:
    """How close a pool's role is to missing its SLO with ``count`` instances: ``need / count``.

    ``need`` is the instances the role needs to meet its SLO now (stage 1, ``capacity_target`` with no
    lead: the p90 forecast or the measured load, whichever is higher, plus the queue cleared within the TTFT
    SLO), so a risk above 1 means the role misses its SLO with ``count`` instances, and risks of pools with
    different models and GPUs compare directly. 0 when nothing is needed; inf when needed and ``count`` is 0.
    """
    if not need > 0:  # NaN (unknown) included: no evidence of risk
        return 0.0
    return math.inf if count <= 0 else need / count


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with ``servers`` servers and ``offered`` load
    (arrival rate × service time, in servers): 1 when ``offered >= servers`` (the queue grows without bound)."""
    if offered <= 0.0:
        return 0.0
    if servers <= 0 or offered >= servers:
        return 1.0
    b = 1.0  # Erlang B by its stable recursion
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1.0 - b))


def queue_ttft_s(
    count: int, arrival_rps: float, service_s: float, *, quantile: float = 0.99, service_scv: float = 1.0
) -> float:
    """The ``quantile`` of time to first token of a prefill role with ``count`` instances: one prompt's
    prefill (``service_s``: mean prompt tokens / one instance's prefill tokens/s) plus the queueing delay.

    The wait is M/M/c's tail, ``P(W > t) = C(c, a) exp(-(c - a) t / S)`` (Erlang C), stretched by the
    Allen-Cunneen factor ``(1 + scv) / 2`` (``service_scv``: the squared coefficient of variation of the
    prefill time; 1 = exponential, the default). A low-rate pool of long prompts is judged by its variance,
    which a mean-load ratio misses: 0.3 req/s of 8k-token prompts on a 70B model is 0.8 of one instance's
    throughput, and one instance misses an 8-s TTFT SLO for ~half the requests. NaN when the rate or service time is unknown; inf when ``count`` instances cannot keep up.
    """
    if not (math.isfinite(arrival_rps) and math.isfinite(service_s)) or arrival_rps < 0 or service_s < 0:
        return math.nan
    if arrival_rps == 0.0 or service_s == 0.0:
        return service_s
    offered = arrival_rps * service_s
    if count <= 0 or offered >= count:
        return math.inf
    waits = erlang_c(count, offered)
    tail = 1.0 - quantile
    if waits <= tail:
        return service_s
    scale_s = service_s * (1.0 + service_scv) / 2.0 / (count - offered)
    return service_s + scale_s * math.log(waits / tail)


def queue_risk(
    count: int,
    arrival_rps: float,
    service_s: float,
    slo_ttft_s: float,
    *,
    quantile: float = 0.99,
    service_scv: float = 1.0,
) -> float:
    """SLO risk of a prefill role from its forecast queueing delay: ``queue_ttft_s / slo_ttft_s`` (> 1: the
    ``quantile`` of TTFT misses the SLO). 0 when the load is unknown (no evidence of risk), as ``slo_risk``."""
    ttft_s = queue_ttft_s(count, arrival_rps, service_s, quantile=quantile, service_scv=service_scv)
    if math.isnan(ttft_s):
        return 0.0
    return ttft_s / slo_ttft_s


def prefill_floor(
    arrival_rps: float,
    service_s: float,
    slo_ttft_s: float,
    *,
    quantile: float = 0.99,
    service_scv: float = 1.0,
    max_count: int = 1024,
) -> int:
    """The fewest prefill instances whose ``queue_risk`` is at most 1 (``max_count`` when none up to it is;
    0 when the load is unknown or nil)."""
    if not (math.isfinite(arrival_rps) and math.isfinite(service_s)) or arrival_rps <= 0 or service_s <= 0:
        return 0
    count = max(math.ceil(arrival_rps * service_s - 1e-9), 1)
    while count < max_count:
        if (
            queue_risk(count, arrival_rps, service_s, slo_ttft_s, quantile=quantile, service_scv=service_scv)
            <= 1
        ):
            return count
        count += 1
    return max_count


RiskTable = tuple[Sequence[float], Sequence[float]]  # (prefill, decode): risk with 0, 1, 2, ... instances


def _table_risk(table: Sequence[float], count: int) -> float:
    if count < 0:
        return math.inf
    return float(table[min(count, len(table) - 1)])


def allocate_budget(
    plans: list[ScalingPlan],
    needs: Mapping[str, tuple[float, float]],
    gpus_per_instance: Mapping[str, int],
    budget_gpus: int | None,
    *,
    floors: Mapping[str, tuple[int, int]] | None = None,
    guarantees: Mapping[str, int] | None = None,
    risk_tables: Mapping[str, RiskTable] | None = None,
    label: str = "budget",
    mixed_node: Collection[str] = (),
) -> list[ScalingPlan]:
    """Fit all pools' plans into one GPU budget by SLO risk (see :func:`slo_risk`).

    Standby replicas go first (they serve nobody yet); then instances are taken one at a time from the
    pool and role whose SLO risk after the cut is lowest, so the pool that would miss its SLO first keeps its
    GPUs (the greedy cut minimises the fleet's highest risk). ``needs``: pool -> (prefill, decode) instances
    needed; ``floors``: pool -> (prefill, decode) never cut below (the policy's minimums; default 0). When the
    floors alone exceed the budget the plans stay above it, and the reasons say so. ``guarantees``: pool ->
    GPUs it is guaranteed (e.g. its peak-proportional share); an instance that would take a pool below its
    guarantee is cut only when no pool above its own guarantee has one left to give (risk decides within each
    tier), so a pool borrows idle GPUs but never a pool's guaranteed ones. Every cut is written into that plan's
    reasons, and when the budget binds every pool's reasons name the budget and the risks. ``risk_tables``:
    pool -> (prefill, decode) risks by instance count (e.g. from :func:`queue_risk`), used instead of
    ``need / count`` for the pools it names. ``label`` names the budget in the reasons. ``mixed_node``: pools
    placed on PD-mixed nodes, whose plans become ``max(prefill, decode)`` whole nodes after the budget
    (``controller.policy.mixed_node.node_plan``): they hold that many nodes' GPUs (:func:`plan_gpus`), are cut
    and given back a node at a time (every role at the node count -1), and their standby is not counted.
    """
    if budget_gpus is None:
        return plans
    current = {p.pool: p for p in plans}
    floor = floors or {}
    tables = risk_tables or {}

    def risk(pool: str, role: str, count: int) -> float:
        if pool in tables:
            return _table_risk(tables[pool][0 if role == "prefill" else 1], count)
        need_p, need_d = needs.get(pool, (0.0, 0.0))
        return slo_risk(count, need_p if role == "prefill" else need_d)

    mixed = frozenset(mixed_node)

    def gpus_of(p: ScalingPlan) -> int:
        return plan_gpus(p, gpus_per_instance[p.pool], mixed_node=p.pool in mixed)

    def used() -> int:
        return sum(gpus_of(p) for p in current.values())

    wanted = used()
    if wanted <= budget_gpus:
        return plans
    binds = f"{label} {budget_gpus} GPUs binds (plans want {wanted})"
    shares = guarantees or {}

    def borrowed(pool: str) -> int:
        return gpus_of(current[pool]) - shares.get(pool, 0)

    for pool in sorted(current, key=borrowed, reverse=True):  # the most borrowed standby goes first
        if pool in mixed:  # a mixed node has no standby tier: node_plan drops it, it holds no GPU
            continue
        while used() > budget_gpus and (current[pool].standby_decode or current[pool].standby_prefill):
            p = current[pool]
            cut = "decode" if p.standby_decode >= p.standby_prefill else "prefill"
            current[pool] = _with_count(
                p, f"standby_{cut}", p.standby(cut) - 1, f"{label} {budget_gpus} GPUs: standby {cut} -1"
            )
    while used() > budget_gpus:
        best = _lowest_risk_cut(current, risk, floor, gpus_per_instance, shares, mixed)
        if best is None:
            break
        risk_after, pool, role = best
        p = current[pool]
        why = f"lowest SLO risk in the fleet: {risk_after:.2f} after the cut"
        if role == NODE:
            current[pool] = _node_step(p, -1, f"{label} {budget_gpus} GPUs: mixed node -1", why)
        else:
            current[pool] = _with_count(
                p, role, p.count(role) - 1, f"{label} {budget_gpus} GPUs: {role} -1 ({why})"
            )
    current = _refill(
        current, {p.pool: p for p in plans}, risk, gpus_per_instance, budget_gpus - used(), mixed
    )
    short = used() > budget_gpus
    out = []
    for plan in plans:
        p = current[plan.pool]
        r = max(risk(plan.pool, "prefill", p.prefill), risk(plan.pool, "decode", p.decode))
        note = f"{binds}: SLO risk {r:.2f} here with prefill {p.prefill}, decode {p.decode}"
        if plan.pool in mixed:
            note += f" on {max(p.prefill, p.decode)} mixed nodes ({gpus_of(p)} GPUs)"
        if short:
            note += f"; the pools' minimums alone exceed the {label} ({used()} GPUs)"
        out.append(replace(p, reasons=(*p.reasons, note)))
    return out


RiskOf = Callable[[str, str, int], float]  # (pool, role, count) -> SLO risk


def _refill(
    current: dict[str, ScalingPlan],
    wanted: Mapping[str, ScalingPlan],
    risk: RiskOf,
    gpus_per_instance: Mapping[str, int],
    slack_gpus: int,
    mixed: Collection[str] = (),
) -> dict[str, ScalingPlan]:
    """Give back cut instances that fit in the slack a larger cut left (pools differ in GPUs per instance:
    the last cut of a 4-GPU instance may free more than the overrun), the highest SLO risk first. A mixed-node
    pool gets back a whole node: every role at the node count that was cut +1."""
    while slack_gpus > 0:
        best: tuple[float, str, str] | None = None
        for pool, p in current.items():
            if gpus_per_instance[pool] > slack_gpus:
                continue
            if pool in mixed:
                grow = _node_roles(p, wanted[pool])
                if grow:
                    r = max(risk(pool, role, p.count(role)) for role in grow)
                    if best is None or r > best[0]:
                        best = (r, pool, NODE)
                continue
            for role in ROLES:
                if p.count(role) < wanted[pool].count(role):
                    r = risk(pool, role, p.count(role))
                    if best is None or r > best[0]:
                        best = (r, pool, role)
        if best is None:
            break
        _, pool, role = best
        p = current[pool]
        if role == NODE:
            current[pool] = _node_step(
                p, +1, "mixed node +1 back", "it fits the budget's slack", wanted[pool]
            )
        else:
            current[pool] = _with_count(
                p, role, p.count(role) + 1, f"{role} +1 back: it fits the budget's slack"
            )
        slack_gpus -= gpus_per_instance[pool]
    return current


NODE = "node"  # a cut or give-back of one whole mixed node (both roles at the node count)


def plan_gpus(plan: ScalingPlan, gpus_per_instance: int, *, mixed_node: bool = False) -> int:
    """GPUs ``plan`` holds once applied: every instance's GPUs for a dedicated pool (``ScalingPlan.gpus``);
    for a mixed-node pool, ``max(prefill, decode)`` nodes of ``gpus_per_instance`` GPUs each (the node's
    prefill and decode instances share them; ``node_plan`` drops standby, so it holds none)."""
    if mixed_node:
        return max(plan.prefill, plan.decode) * gpus_per_instance
    return plan.gpus(gpus_per_instance)


def _node_roles(p: ScalingPlan, wanted: ScalingPlan) -> tuple[str, ...]:
    """The roles a give-back of one node raises: those at the node count, below what the plan wanted."""
    nodes = max(p.prefill, p.decode)
    return tuple(r for r in ROLES if p.count(r) == nodes and p.count(r) < wanted.count(r))


def _node_step(
    p: ScalingPlan, step: int, what: str, why: str, wanted: ScalingPlan | None = None
) -> ScalingPlan:
    """``p`` with one mixed node less (``step`` -1: every role at the node count -1) or given back (+1: the
    roles of ``_node_roles`` +1), the counts in the reason."""
    nodes = max(p.prefill, p.decode)
    if step < 0:
        roles = tuple(r for r in ROLES if p.count(r) == nodes)
    else:
        assert wanted is not None
        roles = _node_roles(p, wanted)
    counts = {r: p.count(r) + (step if r in roles else 0) for r in ROLES}
    moved = ", ".join(f"{r} {p.count(r)} → {counts[r]}" for r in roles)
    reason = f"{what} ({moved}; {why})"
    return replace(p, prefill=counts["prefill"], decode=counts["decode"], reasons=(*p.reasons, reason))


def _lowest_risk_cut(
    current: Mapping[str, ScalingPlan],
    risk: RiskOf,
    floor: Mapping[str, tuple[int, int]],
    gpus_per_instance: Mapping[str, int],
    guarantees: Mapping[str, int],
    mixed: Collection[str] = (),
) -> tuple[float, str, str] | None:
    """The (risk after the cut, pool, role) of the instance whose removal hurts the fleet least: from pools
    that stay at or above their guarantee first, then the rest; the lowest risk after the cut within each.
    A mixed-node pool offers one whole node (role ``NODE``: every role at the node count -1, none below its
    floor), at the highest risk of the roles it cuts."""
    best: tuple[float, str, str] | None = None
    best_key: tuple[int, float] | None = None
    for pool, p in current.items():
        g = gpus_per_instance[pool]
        tier = 0 if plan_gpus(p, g, mixed_node=pool in mixed) - g >= guarantees.get(pool, 0) else 1
        floor_p, floor_d = floor.get(pool, (0, 0))
        if pool in mixed:
            nodes = max(p.prefill, p.decode)
            cut = [(r, lo) for r, lo in (("prefill", floor_p), ("decode", floor_d)) if p.count(r) == nodes]
            if nodes <= 0 or any(nodes <= max(lo, 0) for _, lo in cut):
                continue
            risk_after = max(risk(pool, r, nodes - 1) for r, _ in cut)
            if best_key is None or (tier, risk_after) < best_key:
                best_key, best = (tier, risk_after), (risk_after, pool, NODE)
            continue
        for role, count, lo in (("prefill", p.prefill, floor_p), ("decode", p.decode, floor_d)):
            if count <= max(lo, 0):
                continue
            risk_after = risk(pool, role, count - 1)
            if best_key is None or (tier, risk_after) < best_key:
                best_key, best = (tier, risk_after), (risk_after, pool, role)
    return best
