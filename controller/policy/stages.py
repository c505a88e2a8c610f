"""The policy's stages, each a small pure function (no I/O, no clock: time comes in as ``now_s``).

Order (see ``decide``): capacity target from the forecast → headroom → pre-allocated buffer → warm
standby → P:D ratio → hysteresis and rate limits → GPU budget → min/max. Every stage returns the reasons
for what it changed, so a decision can be read back.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from controller.config import PolicyConfig
from controller.policy import reserve_fast
from controller.policy.types import (
    BlockMedian,
    LeadPeaks,
    PackedRates,
    PoolCapacity,
    PoolObservation,
    PoolState,
    RoleHistory,
    evolve,
)

MAX_NEED = 1e9  # instances; larger demand is clipped here (min/max clamp it far lower anyway)

Row = TypeVar("Row", bound=tuple[Any, ...])
_TIME = operator.itemgetter(0)
# a row's columns, read in C (no Python loop per row)
_SECOND, _THIRD = operator.itemgetter(1), operator.itemgetter(2)


class TimeRows(tuple):  # type: ignore[type-arg]
    """Rows (tuples, their time first) whose times are known finite and never decreasing: built only by
    ``recent_rows``, ``time_suffix`` and ``append_row``, which have checked it. Equal to the plain tuple of the
    same rows, printed as it, hashed as it; ``_recent_from`` takes one without its O(n) check (the stages'
    histories are kept every tick, so each would otherwise be checked row by row every tick). Any other tuple
    is checked as before."""

    __slots__ = ()


def append_row(rows: tuple[Row, ...], row: Row) -> tuple[Row, ...]:
    """``(*rows, row)``: a ``TimeRows`` when ``rows`` is one (or empty) and ``row``'s time is finite and not
    before the last row's (an O(1) check), else a plain tuple."""
    t = row[0]
    if (type(rows) is TimeRows or not rows) and math.isfinite(t) and (not rows or rows[-1][0] <= t):
        # concatenation copies a subclass's items in C (unpacking one iterates them: ~1.6× the time)
        return TimeRows(rows + (row,))  # noqa: RUF005
    return (*rows, row)


def time_suffix(rows: tuple[Row, ...], start: int) -> tuple[Row, ...]:
    """``rows[start:]`` for ``start`` from ``_recent_from`` (not None: the rows are in time order with finite
    times), kept a ``TimeRows``."""
    if start == 0 and type(rows) is TimeRows:
        return rows
    return TimeRows(rows[start:])


def _recent_from(rows: tuple[Row, ...], now_s: float, window_s: float, closed: bool) -> int | None:
    """The first index from which every row (a tuple, its time first) has ``now_s - time < window_s``
    (``<=`` when ``closed``) and none before it has, or None when the times are not in order or not all finite
    (nor ``now_s``).
    The stages append their rows in time order, and ``now_s - time`` falls as the time rises (float
    subtraction is monotone), so the rows within a window are a suffix, found by bisection: a window kept
    every tick costs O(log n) comparisons instead of one per row. A ``TimeRows`` has been checked when it was
    built, so only ``now_s`` is."""
    if type(rows) is not TimeRows:
        times = list(map(_TIME, rows))
        # finite times and now only (a finite sum has no NaN or inf in it): inf - inf is NaN, no order
        if not math.isfinite(sum(times)) or times != sorted(times):
            return None
    if not math.isfinite(now_s):
        return None
    if closed:
        return bisect.bisect_left(rows, True, key=lambda r: now_s - r[0] <= window_s)
    return bisect.bisect_left(rows, True, key=lambda r: now_s - r[0] < window_s)


def _suffix_start(rows: tuple[Row, ...], now_s: float, window_s: float, closed: bool = False) -> int:
    """``_recent_from`` for rows the caller knows to be in time order, with finite times and ``now_s`` (a
    suffix of rows it has checked, say): the bisection alone, without the O(n) check."""
    if closed:
        return bisect.bisect_left(rows, True, key=lambda r: now_s - r[0] <= window_s)
    return bisect.bisect_left(rows, True, key=lambda r: now_s - r[0] < window_s)


def recent_rows(
    rows: tuple[Row, ...], now_s: float, window_s: float, closed: bool = False
) -> tuple[Row, ...]:
    """The rows (tuples, their time first) with ``now_s - time < window_s`` (``<=`` when ``closed``), in
    order: exactly what filtering them one by one gives (``_recent_from`` finds them as a suffix, returned as
    a ``TimeRows``)."""
    start = _recent_from(rows, now_s, window_s, closed)
    if start is not None:
        return time_suffix(rows, start)
    if closed:
        return tuple(r for r in rows if now_s - r[0] <= window_s)
    return tuple(r for r in rows if now_s - r[0] < window_s)


def _median(values: list[float]) -> float:
    """``np.median(values)`` without numpy: the middle of the sorted values, or the mean of the middle two,
    ``(a + b) / 2`` as numpy computes it (Python's sort puts the same floats at each rank: only NaN, or -0.0
    beside 0.0, could tell two sorts apart, and the median of those is only ever compared); numpy itself for
    a NaN (it sorts last) or no value."""
    n = len(values)
    if n == 0 or math.isnan(sum(values)):  # (a sum is NaN for any NaN, and for inf beside -inf: numpy then)
        return float(np.median(np.asarray(values, dtype=np.float64)))
    ordered = sorted(values)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def block_totals(blocks: tuple[tuple[float, float, float, int], ...]) -> list[float]:
    """Each need block's total need (prefill + decode instances), as floats."""
    return [float(b[1] + b[2]) for b in blocks]


def _plain_total(x: float) -> bool:
    """A total the sorted totals may hold: finite and not -0.0 (a bisection places those as a sort does)."""
    return math.isfinite(x) and not (x == 0.0 and math.copysign(1.0, x) < 0)


def block_median(
    completed: tuple[tuple[float, float, float, int], ...], cache: BlockMedian
) -> tuple[float, BlockMedian]:
    """``_median(block_totals(completed))`` and the cache that holds it: ``cache``'s own where it was computed
    from these very rows (an O(n) identity check in C, not a pass in Python and a sort). Where ``completed``
    is ``cache``'s rows less some oldest, and newer rows after them (a block opened: the one before it
    completed), its sorted totals lose the old rows' totals and take the new ones by bisection (``_moved``)."""
    n, k = len(completed), len(cache.blocks)
    if completed and k == n and all(map(operator.is_, cache.blocks, completed)):
        return cache.median, cache
    moved = _moved(completed, cache)
    if moved is not None:
        mid = n // 2
        median = moved[mid] if n % 2 else (moved[mid - 1] + moved[mid]) / 2
        return median, BlockMedian(completed, median, moved.tobytes())
    median = _median(totals := block_totals(completed))
    kept = array("d", sorted(totals)).tobytes() if all(map(_plain_total, totals)) else b""
    return median, BlockMedian(completed, median, kept)


_MOVED_MAX = 4  # the most rows a block median moves on by (dropped or new) before it is sorted anew


def _moved(completed: tuple[tuple[float, float, float, int], ...], cache: BlockMedian) -> array[float] | None:
    """``cache.totals`` moved on to ``completed`` (sorted, the same floats as ``sorted(block_totals(...))``):
    None where ``completed`` does not start with a suffix of ``cache.blocks`` followed by at most a few new
    rows, or a total is not finite or is -0.0. The suffix's first row is matched by identity, the rest by
    value (tuple ==, in C: a check per row by ``operator.is_`` cost more than the sort it saves): rows equal
    in value have the same totals, a zero's sign aside, and the median is only ever compared."""
    k, n = len(cache.blocks), len(completed)
    if not cache.totals or not completed:
        return None
    first = completed[0]  # the oldest rows dropped (a few at most): the first kept row is completed[0]
    d = next((i for i in range(min(k, _MOVED_MAX)) if cache.blocks[i] is first), k)
    new = n - (k - d)
    if d == k or not 0 <= new <= _MOVED_MAX:
        return None
    if cache.blocks[d:] != completed[: n - new]:  # (tuple ==: identity first, then value, in C)
        return None
    out = reserve_fast.doubles(cache.totals)
    for b in cache.blocks[:d]:
        x = float(b[1] + b[2])
        at = bisect.bisect_left(out, x)
        if at == len(out) or out[at] != x:
            return None
        del out[at]
    for b in completed[n - new :]:
        x = float(b[1] + b[2])
        if not _plain_total(x):
            return None
        bisect.insort(out, x)
    return out


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


def offered_prompt_tps(obs: PoolObservation) -> float:
    """Prompt tokens/s arriving (arrivals × mean prompt length) while requests wait; NaN when unknown or
    when nothing waits.

    The prompt-token counter counts what was prefilled, and a saturated pool prefills no more than its
    capacity however much arrives: sizing from it alone under-sizes exactly when it matters (a rise that
    outruns the fleet reads as a load the fleet can carry). A pool that keeps up (no queue) prefills what
    arrives, and there the counter is the better number: the mean prompt length is a slow average."""
    if not (_known(obs.waiting_requests) and obs.waiting_requests > 0):
        return math.nan
    if _known(obs.arrival_rps) and _known(obs.mean_prompt_tokens):
        return obs.arrival_rps * obs.mean_prompt_tokens
    return math.nan


def forecast_token_tps(obs: PoolObservation, channel: str, mode: str = "tokens") -> float:
    """The forecast prompt (``channel`` "prompt") or generation ("gen") load, tokens/s; NaN when unknown.

    ``mode``: "tokens" = the forecaster's token p90 for that channel; "arrivals" = its arrival p90 × the measured
    mean tokens per request (prompt or output; the token p90 while either is unknown); "max" / "min" = the
    larger / smaller of the two (either alone when the other is unknown).

    The token forecasts follow the loop's token channels: prompt tokens at arrival where the router exports
    them (``PoolLoad.prompt_at_arrival``: the simulator and pdscale's router do; else the tokens prefilled,
    capped by the fleet), generation tokens as generated (spread over each request's output, while training
    counts them at arrival); a forecaster that reads them relative to the arrival level jumps with every long
    prompt (a 5-s p90 of one 8,000-token prompt on a quiet pool starts cold
    capacity that the scale-down window releases unused). The arrival p90 × a slow mean length moves only
    with arrivals; the smaller of the two keeps a spike in either out of the target, and the measured load
    stays a floor under it in ``capacity_target``."""
    fc = obs.forecast
    if fc is None:
        return math.nan
    if channel == "prompt":
        tokens, per_request = fc.rate(fc.prompt_tokens_p90), obs.mean_prompt_tokens
    elif channel == "gen":
        tokens, per_request = fc.rate(fc.gen_tokens_p90), obs.mean_output_tokens
    else:
        raise ValueError(f"forecast_token_tps: channel must be prompt or gen, got {channel!r}")
    if mode == "tokens":
        return tokens
    arrivals = fc.rate(fc.arrivals_p90)
    by_arrivals = arrivals * per_request if _known(arrivals) and _known(per_request) else math.nan
    if mode == "arrivals":
        return by_arrivals if _known(by_arrivals) else tokens
    if mode == "max":
        return _nanmax(tokens, by_arrivals)
    if mode == "min":
        return (
            min(tokens, by_arrivals)
            if _known(tokens) and _known(by_arrivals)
            else _nanmax(tokens, by_arrivals)
        )
    raise ValueError(f"token forecast mode: expected tokens, arrivals, max or min, got {mode!r}")


DECODE_SATURATED = 0.9  # running sequences at this fraction of the active decode fleet's batch: it is full


def decode_saturated(obs: PoolObservation, cap: PoolCapacity, kv: bool = False) -> bool:
    """The active decode fleet runs at ``DECODE_SATURATED`` of its sequence capacity or more (False when
    unknown). Then what decode measures is capped by the fleet: the generation rate, the running sequences and
    the mean output length read from them (generated tokens per arrival) are floors of the load, not the
    load (a cold pool's first rise: the output length reads ~330 tokens of ~1,000 for two minutes).

    ``kv`` (``PolicyConfig.decode_saturated_kv``): also saturated when the decode instances' mean KV-cache
    usage is at ``DECODE_SATURATED`` or more. The sequence capacity is modelled from the measured mean
    lengths, which lag when outputs lengthen (the fleet fills its KV memory with fewer, longer sequences than
    the model's batch, and the running count then never reaches 90 % of it); the KV gauge measures the
    fullness itself."""
    return decode_full(obs.active.get("decode", 0), obs.running_seqs, obs.kv_usage, cap.decode_seqs, kv)


def decode_full(active: float, running: float, kv_usage: float, decode_seqs: float, kv: bool = False) -> bool:
    """:func:`decode_saturated` on the raw measurements (the pipeline's per-tick track reads them before an
    observation exists): ``active`` decode instances, ``running`` sequences, their mean ``kv_usage`` and the
    modelled ``decode_seqs`` per instance; unknown measurements are not saturation."""
    if not active > 0:
        return False
    if kv and _known(kv_usage) and kv_usage >= DECODE_SATURATED:
        return True
    return _known(running) and running >= DECODE_SATURATED * active * decode_seqs


def decode_fullness(obs: PoolObservation, cap: PoolCapacity, kv: bool = False) -> float:
    """How full the active decode fleet is, as a number: running sequences over its modelled batch (active ×
    ``cap.decode_seqs``), and with ``kv`` the larger of that and the mean KV-cache usage. NaN when unknown (no
    active decode instance, no batch, or neither measurement known). :func:`decode_saturated` is this at
    ``DECODE_SATURATED`` or more; the arrival calibration's ``eased`` form reads the number itself
    (``PolicyConfig.arrival_calibration_saturated``). It may exceed 1: the batch is modelled from mean lengths."""
    return decode_fill(obs.active.get("decode", 0), obs.running_seqs, obs.kv_usage, cap.decode_seqs, kv)


def decode_fill(
    active: float, running: float, kv_usage: float, decode_seqs: float, kv: bool = False
) -> float:
    """:func:`decode_fullness` on the raw measurements (as :func:`decode_full` is :func:`decode_saturated`'s)."""
    if not (active > 0 and decode_seqs > 0 and math.isfinite(active * decode_seqs)):
        return math.nan
    by_seqs = running / (active * decode_seqs) if _known(running) else math.nan
    by_kv = kv_usage if kv and _known(kv_usage) else math.nan
    return _nanmax(by_seqs, by_kv)


def capacity_target(
    obs: PoolObservation,
    cap: PoolCapacity,
    slo_ttft_s: float,
    lead_s: float = 0.0,
    *,
    offered: bool = False,
    persistent_queue: bool = False,
    prompt_forecast: str = "tokens",
    gen_forecast: str = "tokens",
    pinned_queue: bool = False,
    little_arrivals: str = "p90",
    saturated_kv: bool = False,
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

    ``offered``: the prompt load is also taken at arrival (``offered_prompt_tps``) when that is higher than
    what was prefilled (the predictive policy; the reactive baseline sizes on what it measured, as an HPA on
    vLLM's counters does). It supplements a known measurement or forecast, never replaces an unknown one.

    ``persistent_queue``: the queue has outlived a burst (see ``queue_age``): the load itself exceeds the
    fleet, so the queue is cleared within the SLO whatever it costs, as with ``lead_s = 0`` (the reactive
    baseline's rule, and what wins when a pool starts far below its load).

    ``saturated_kv``: ``decode_saturated``'s ``kv`` (a full KV cache counts as a full decode fleet).
    """
    fc = obs.forecast
    censored = decode_saturated(obs, cap, saturated_kv)
    if censored:  # the measured output length and generation are floors: cut nothing from the forecast
        gen_forecast = "max" if gen_forecast != "tokens" else gen_forecast
        little_arrivals = "p90"
    prompt_fc = forecast_token_tps(obs, "prompt", prompt_forecast)
    gen_fc = forecast_token_tps(obs, "gen", gen_forecast)
    arrivals_fc = (
        fc.rate(fc.arrivals_p50 if little_arrivals == "p50" else fc.arrivals_p90) if fc else math.nan
    )
    prompt_tps = _nanmax(obs.prompt_tps, prompt_fc)
    gen_tps = _nanmax(obs.gen_tps, gen_fc)
    if not (_known(prompt_tps) and _known(gen_tps)):
        return None
    if offered:
        prompt_tps = _nanmax(prompt_tps, offered_prompt_tps(obs))
    reasons = [
        f"load: prompt {prompt_tps:.0f} tok/s, generation {gen_tps:.0f} tok/s (max of measured and p90 forecast)"
    ]

    backlog_tps = backlog_cold_tps = 0.0
    warm = obs.active.get("prefill", 0) + obs.standby.get("prefill", 0)
    if _known(obs.waiting_requests) and obs.waiting_requests > 0:
        mean_prompt = (
            obs.mean_prompt_tokens
            if _known(obs.mean_prompt_tokens)
            else prompt_tps / max(obs.arrival_rps, 1e-9)
        )
        age_s = obs.oldest_wait_s if _known(obs.oldest_wait_s) else 0.0
        clear_within_s = max(slo_ttft_s - age_s, slo_ttft_s / 4)
        movable = obs.waiting_requests
        if pinned_queue and _known(obs.pinned_waiting):
            movable -= min(max(obs.pinned_waiting, 0.0), obs.waiting_requests)
        if _known(mean_prompt):
            backlog_tps = movable * mean_prompt / clear_within_s
            backlog_cold_tps = obs.waiting_requests * mean_prompt / max(clear_within_s, lead_s)
            reasons.append(
                f"queue: {obs.waiting_requests:.0f} waiting → +{backlog_tps:.0f} tok/s to clear in {clear_within_s:.2f} s"
            )
    prefill_slo = (prompt_tps + backlog_tps) * cap.correction / cap.prefill_tps
    prefill = (prompt_tps + backlog_cold_tps) * cap.correction / cap.prefill_tps
    starting = warm + obs.provisioning.get("prefill", 0)
    if persistent_queue and _cleared_by(obs, cap, prompt_tps, starting, lead_s):
        persistent_queue = False  # capacity asked for now would serve an empty queue: the lead rule below
        reasons.append(
            f"queue: persistent, but {starting} warm and starting prefill clear it within the lead"
        )
    if prefill_slo > prefill and persistent_queue:
        prefill = prefill_slo
        reasons.append("queue: persistent, cleared within the SLO by as many instances as it takes")
    elif prefill_slo > prefill:
        prefill = max(prefill, min(prefill_slo, float(warm)))
        reasons.append(
            f"queue: beyond the {warm} warm prefill instances it is cleared over the {lead_s:.0f} s lead"
        )

    per_seq_tps = cap.decode_tps / cap.decode_seqs
    arrival_rps = _nanmax(obs.arrival_rps, arrivals_fc)
    running = obs.running_seqs if _known(obs.running_seqs) else 0.0
    little = math.nan
    if _known(arrival_rps) and _known(obs.mean_output_tokens):
        little = arrival_rps * obs.mean_output_tokens / per_seq_tps
    concurrency = max(running, little) if _known(little) else running
    decode = max(gen_tps * cap.correction / cap.decode_tps, concurrency / cap.decode_seqs)
    reasons.append(
        f"need: prefill {prefill:.2f}, decode {decode:.2f} instances (concurrency {concurrency:.0f}:"
        f" running {running:.0f}, Little {little:.0f})"
    )
    running = obs.running_seqs if _known(obs.running_seqs) else math.nan
    # Arithmetic on absurd (finite) inputs can overflow to inf: that is demand beyond any fleet.
    prefill, decode = min(prefill, MAX_NEED), min(decode, MAX_NEED)
    return Need(prefill=prefill, decode=decode, running_seqs=running, reasons=tuple(reasons))


def _cleared_by(
    obs: PoolObservation, cap: PoolCapacity, prompt_tps: float, instances: int, lead_s: float
) -> bool:
    """Whether ``instances`` prefill instances (warm and starting, all counted as serving) clear the waiting
    prompt tokens within ``lead_s`` while carrying ``prompt_tps``: then cold capacity asked for now serves an
    empty queue (a flash crowd's persistent queue: 34 instances started at 421 s served from 545 s, 55 s after
    the 14 already starting had cleared it)."""
    if not (lead_s > 0 and _known(obs.waiting_requests) and _known(obs.mean_prompt_tokens)):
        return False
    spare_tps = instances * cap.prefill_tps / cap.correction - prompt_tps
    return spare_tps > 0 and obs.waiting_requests * obs.mean_prompt_tokens <= spare_tps * lead_s


TREND_WINDOWS_S = (30.0, 60.0, 120.0)  # least-squares windows over the per-tick arrival rate, shortest first
TREND_MIN_Z = 3.0  # a window's slope must stand this many standard errors above zero
TREND_MIN_COVERAGE = 0.8  # a window's samples must span this fraction of it (no trend from a gap)
TREND_MIN_SAMPLES = 10  # and number at least this many
# a step (two levels, split anywhere) explains a window better than the line when it leaves residuals this
# many per-sample variances smaller: it has one parameter more, its split point (AIC's 2 per parameter)
TREND_STEP_MARGIN = 2.0
TREND_CONFIRM_S = (5.0, 10.0)  # a ramp must also have been seen this long ago (a burst's first seconds pass)
TREND_CONFIRM_Z = 2.0  # there at this many standard errors (a ramp's early windows are its weakest)
MAX_TREND_FACTOR = 4.0  # a projection never asks for more than this × the current need


@dataclass(frozen=True)
class RampFit:
    """A least-squares line through one window of the arrival rate (``ramp_fit``)."""

    window_s: float
    slope: float  # req/s per second
    se: float  # its standard error: the larger of the residuals' and the Poisson counts' variance
    level: float  # the line's value at now, req/s
    step_fits_better: bool  # one level change explains the window at least as well as the line

    @property
    def z(self) -> float:
        return self.slope / self.se if self.se > 0 else (math.inf if self.slope > 0 else 0.0)


def _rate_arrays(history: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(times, rates) of the known samples of ``history`` (NaN, inf and negative rates left out)."""
    flat = np.fromiter(itertools.chain.from_iterable(history), np.float64, count=2 * len(history))
    arr = flat.reshape(-1, 2)
    keep = np.isfinite(arr[:, 1]) & (arr[:, 1] >= 0) & np.isfinite(arr[:, 0])
    return arr[keep, 0], arr[keep, 1]


def _known_samples(rows: tuple[tuple[float, float], ...]) -> tuple[list[float], list[float]]:
    """The (times, rates) ``_rate_arrays`` keeps of ``rows``, as the floats it reads (its mask, per row)."""
    times: list[float] = []
    rates: list[float] = []
    for row in rows:
        t, r = float(row[0]), float(row[1])
        if math.isfinite(r) and r >= 0 and math.isfinite(t):
            times.append(t)
            rates.append(r)
    return times, rates


def packed_rates(history: tuple[tuple[float, float], ...], cache: PackedRates) -> PackedRates:
    """``history``'s known samples packed (``PackedRates``), reusing ``cache``, the previous tick's: where
    ``history`` starts with a suffix of ``cache.history`` (the same row objects, as ``update_rate_history``
    keeps them), only the rows that left it and the rows after it are read, not the whole history."""
    old = cache.history
    if old and history and len(cache.times) == len(cache.rates):
        first = history[0]
        d = next((i for i, row in enumerate(old) if row is first), -1)
        k = len(old) - d
        if d >= 0 and k <= len(history) and all(map(operator.is_, old[d:], history[:k])):
            gone = 8 * len(_known_samples(old[:d])[0])
            times, rates = _known_samples(history[k:])
            return PackedRates(
                history,
                cache.times[gone:] + array("d", times).tobytes(),
                cache.rates[gone:] + array("d", rates).tobytes(),
            )
    times, rates = _known_samples(history)
    return PackedRates(history, array("d", times).tobytes(), array("d", rates).tobytes())


def known_rates(packed: PackedRates) -> tuple[np.ndarray, np.ndarray]:
    """``_rate_arrays(packed.history)``: the same floats, read-only."""
    return np.frombuffer(packed.times, np.float64), np.frombuffer(packed.rates, np.float64)


def ramp_fit(history: tuple[tuple[float, float], ...], now_s: float, window_s: float) -> RampFit | None:
    """Fit rate = level + slope × (t − now) to the samples of ``history`` in (now − window_s, now]; None when
    they are too few (``TREND_MIN_SAMPLES``) or span too little of the window (``TREND_MIN_COVERAGE``).

    The slope's standard error takes the larger per-sample variance of (a) the residuals around the line
    (what over-dispersed, bursty traffic shows) and (b) Poisson counting noise, mean rate / sample spacing
    (a floor: a window that happens to be smooth, or rates already averaged upstream, do not make a slope
    look certain). A step is told from a ramp by the best single level change (two means, split anywhere):
    when it leaves residuals smaller than the line's by more than ``TREND_STEP_MARGIN`` per-sample
    variances, the window is a step or a burst, not a ramp."""
    return _fit(*_rate_arrays(history), now_s, window_s)


@dataclass(frozen=True)
class _Line:
    """One window's least-squares line before the step test (``_line``); ``r`` the window's rates."""

    slope: float
    se: float
    level: float
    rss: float
    var: float
    r: np.ndarray

    @property
    def z(self) -> float:
        return self.slope / self.se if self.se > 0 else (math.inf if self.slope > 0 else 0.0)


def _ordered(times: np.ndarray) -> bool:
    return len(times) < 2 or bool((times[1:] >= times[:-1]).all())


def _line(
    times: np.ndarray, rates: np.ndarray, now_s: float, window_s: float, ordered: bool, min_z: float = 0.0
) -> _Line | None:
    """The samples in (now − window_s, now] and their line; ``ordered``: ``times`` never decrease, so the
    window is a slice (found by bisection) and its span is its ends (the same values as a mask and max − min).

    ``min_z`` > 0: None also for a line whose ``z`` is sure to be below ``min_z`` before its residuals are
    computed (``_trend_at`` drops those, and most lines are those): a slope that is not positive (z <= 0, NaN
    included), or one whose z against the Poisson floor alone is below ``min_z``. The latter is exact, not an
    estimate: the variance is the larger of the residuals' and that floor (neither NaN when the slope and the
    mean are finite), so its standard error is no smaller than the floor's, and correctly rounded division and
    square root are monotone, so the z computed is no larger than the one against the floor."""
    start = now_s - window_s
    if ordered:
        lo, hi = int(times.searchsorted(start, side="right")), int(times.searchsorted(now_s, side="right"))
        n = hi - lo
        if n < TREND_MIN_SAMPLES:
            return None
        t, r = times[lo:hi], rates[lo:hi]  # views: nothing below writes to them
        span = float(t[-1] - t[0])
    else:
        sel = (times > start) & (times <= now_s)
        t, r = times[sel], rates[sel]
        n = len(t)
        if n < TREND_MIN_SAMPLES:
            return None
        span = float(t.max() - t.min())
    if span < TREND_MIN_COVERAGE * window_s:
        return None
    # the means as np.mean computes them (the pairwise sum, then one division by the count), without its dispatch
    t_mean = float(np.add.reduce(t)) / n
    tc = t - t_mean
    sxx = float(tc @ tc)
    if sxx <= 0:
        return None
    mean = float(np.add.reduce(r)) / n
    dev = r - mean
    slope = float(tc @ dev) / sxx
    poisson = max(mean, 0.0) / (span / (n - 1))
    if min_z > 0:
        if not slope > 0:
            return None
        floor_se = math.sqrt(poisson / sxx)
        if floor_se > 0 and math.isfinite(slope + mean + poisson) and slope / floor_se < min_z:
            return None
    dev -= slope * tc  # the residuals, r - mean - slope × tc
    rss_line = float(np.add.reduce(dev * dev))
    var = max(rss_line / (n - 2), poisson)
    level = mean + slope * (now_s - t_mean)
    return _Line(slope, math.sqrt(var / sxx), level, rss_line, var, r)


def _step_fits_better(line: _Line) -> bool:
    """Whether the best single level change (two means, split anywhere) leaves residuals smaller than the
    line's by more than ``TREND_STEP_MARGIN`` per-sample variances."""
    r = line.r
    n = len(r)
    csum = np.cumsum(r)[:-1]
    k = np.arange(1, n, dtype=np.float64)
    total = float(r.sum())
    rss_step = float((r @ r) - (csum**2 / k + (total - csum) ** 2 / (n - k)).max())
    return line.rss - rss_step > TREND_STEP_MARGIN * line.var


def _fit(times: np.ndarray, rates: np.ndarray, now_s: float, window_s: float) -> RampFit | None:
    line = _line(times, rates, now_s, window_s, _ordered(times))
    if line is None:
        return None
    return RampFit(window_s, line.slope, line.se, line.level, _step_fits_better(line))


def _trend_at(
    times: np.ndarray,
    rates: np.ndarray,
    now_s: float,
    lead_s: float,
    min_z: float,
    ordered: bool,
    screen: bool = True,
) -> tuple[float, _Line | None, float]:
    """The projection factor of the shortest ramp at ``now_s`` whose slope is ``min_z`` standard errors
    above zero (1, None when there is none), its line and window. The step test, the costliest part of a
    fit, runs only for a line that passes the others (most ticks: none does)."""
    for window_s in TREND_WINDOWS_S:
        line = _line(times, rates, now_s, window_s, ordered, min_z if screen else 0.0)
        if line is None or line.z < min_z or line.level <= 0 or _step_fits_better(line):
            continue
        factor = min((line.level + line.slope * lead_s) / line.level, MAX_TREND_FACTOR)
        if factor > 1.0:
            return factor, line, window_s
    return 1.0, None, math.nan


def trend_factor(
    history: tuple[tuple[float, float], ...], now_s: float, lead_s: float
) -> tuple[float, str | None]:
    """Stage 1b: how much higher the load will be ``lead_s`` from now, when capacity started now serves.

    Capacity must be ready when the load comes, and a cold instance serves ``lead_s`` after it is asked
    for; a ramp (a diurnal rise, a sinusoid) outruns any policy that sizes for the load of the next few
    seconds. A least-squares line is fitted to the arrival rate over each window of ``TREND_WINDOWS_S``,
    shortest first (``ramp_fit``); the first whose slope is ``TREND_MIN_Z`` standard errors above zero
    (Poisson or over-dispersed noise, whichever is larger) and which a single step does not explain as
    well (a burst, or a level change, is not a ramp) is a ramp, and its line is extrapolated to
    ``now + lead_s``. The ramp must also be there ``TREND_CONFIRM_S`` seconds earlier (each judged on the
    history it had then, at ``TREND_CONFIRM_Z``), and the smallest of those projections is taken: the steep first seconds of a
    burst read as a ramp for a tick or two, a ramp persists. Returns (factor in [1, ``MAX_TREND_FACTOR``],
    reason or None). Never below 1: falling load is left to the scale-down delay.
    """
    if lead_s <= 0:
        return 1.0, None
    return trend_from_rates(*_rate_arrays(history), now_s, lead_s)


def trend_from_rates(
    times: np.ndarray,
    rates: np.ndarray,
    now_s: float,
    lead_s: float,
    *,
    screen: bool = True,
    ordered: bool = False,
) -> tuple[float, str | None]:
    """``trend_factor`` of the history whose known samples are ``times``, ``rates`` (``_rate_arrays``,
    ``known_rates``). ``screen`` False: every line is fitted to the end (``_line``'s ``min_z``; the same
    result, for tests). ``ordered``: the caller knows the times never decrease (known samples of a
    ``TimeRows``), else they are checked."""
    if lead_s <= 0:
        return 1.0, None
    ordered = ordered or _ordered(times)
    factor, fit, window_s = _trend_at(times, rates, now_s, lead_s, TREND_MIN_Z, ordered, screen)
    if fit is None:
        return 1.0, None
    for lag_s in TREND_CONFIRM_S:
        earlier, _, _ = _trend_at(times, rates, now_s - lag_s, lead_s, TREND_CONFIRM_Z, ordered, screen)
        if earlier <= 1.0:
            return 1.0, None
        factor = min(factor, earlier)
    reason = (
        f"trend: arrivals rising {fit.slope * 60:.2f} req/s per min over the last {window_s:.0f} s"
        f" ({fit.z:.1f} standard errors, also {', '.join(f'{x:.0f}' for x in TREND_CONFIRM_S)} s ago)"
        f" → load × {factor:.2f} by the time new capacity serves ({lead_s:.0f} s)"
    )
    return factor, reason


def with_trend(need: Need, factor: float, queued_decode: float = 0.0) -> Need:
    """Scale a need by a trend factor (1 = unchanged); on a ramp (factor > 1) add ``queued_decode`` decode
    instances for the prefill queue the new capacity will flush into decode (see ``queued_decode``)."""
    if factor == 1.0:
        return need
    return replace(
        need,
        prefill=min(need.prefill * factor, MAX_NEED),
        decode=min(need.decode * factor + max(queued_decode, 0.0), MAX_NEED),
    )


def queued_decode(obs: PoolObservation, cap: PoolCapacity) -> float:
    """Decode instances the prefill queue will hold once it is prefilled (0 with no queue or an unknown one).

    On a ramp the prefill capacity the trend starts clears the queue within the lead, and every request it
    clears then holds a decode slot: sized from arrivals alone (Little's law), decode lags prefill by one
    cold start just when the queue flushes into it (the 600-s sinusoid's first rise: 1,835 sequences
    running on 39 decode instances of 30, every request past the ITL SLO for a minute)."""
    waiting = obs.waiting_requests
    return waiting / cap.decode_seqs if _known(waiting) else 0.0


def drained_decode(obs: PoolObservation, cap: PoolCapacity, prefill: float) -> tuple[float, str | None]:
    """Decode instances the flow out of a draining prefill backlog holds (0 and no reason when no backlog,
    or when arrivals already ask for as much).

    While requests wait to be prefilled (at the gateway or the instances), prefill runs flat out, and decode
    receives prefill's *throughput*, not the arrival rate: sized by Little's law on arrivals, decode is short
    exactly while the backlog drains (the 600-s sinusoid with the gateway queue on: every arrival of
    180–300 s past the ITL SLO). The drained flow is ``prefill`` instances (the planned capacity, at least
    the active ones) at the per-instance rate, the higher of the modelled one at the TTFT SLO and the measured
    prompt tokens/s per active prefill instance (a saturated pool may prefill faster than its SLO rate);
    in requests/s over the mean prompt. Each request holds a decode slot for ``L`` = mean output / the
    per-sequence token rate at the ITL SLO, so the drained flow holds ``max(rate, arrivals) × L`` sequences,
    but never more than arrivals' ``arrivals × L`` plus the whole backlog (a short backlog is gone before
    the first of its requests finishes decoding). Unknown lengths or rates: 0 (no opinion).

    ``decide`` leaves it out for a persistent queue (``queue_age`` ≥ ``queue_persist_s``): the prefill target
    then clears the queue within the SLO whatever it costs, and a queue that outlived a burst sits on the
    instances it was routed to (no gateway), so the flow sized from that target never comes: on Mooncake
    with instance queues it cost +4.3 % GPU-s for no SLO (docs/BENCHMARKS.md, "Decode for a draining
    backlog")."""
    waiting = obs.waiting_requests
    if not (
        _known(waiting) and waiting > 0 and _known(obs.mean_prompt_tokens) and _known(obs.mean_output_tokens)
    ):
        return 0.0, None
    if obs.mean_prompt_tokens <= 0 or obs.mean_output_tokens <= 0:
        return 0.0, None
    per_instance_tps = cap.prefill_tps / cap.correction
    active = obs.active.get("prefill", 0)
    if active > 0 and _known(obs.prompt_tps) and not obs.prompt_at_arrival:
        per_instance_tps = max(per_instance_tps, obs.prompt_tps / active)
    instances = max(prefill, float(active)) if _known(prefill) else float(active)
    drain_rps = instances * per_instance_tps / obs.mean_prompt_tokens
    arrival_rps = obs.arrival_rps if _known(obs.arrival_rps) else 0.0
    lifetime_s = obs.mean_output_tokens / (cap.decode_tps / cap.decode_seqs)
    seqs = min(max(drain_rps, arrival_rps) * lifetime_s, arrival_rps * lifetime_s + waiting)
    decode = min(seqs / cap.decode_seqs, MAX_NEED)
    why = (
        f"drain: {waiting:.0f} waiting, prefill {instances:.1f} instances clear {drain_rps:.1f} req/s"
        f" (arrivals {arrival_rps:.1f}) → {seqs:.0f} sequences decoding {lifetime_s:.1f} s each:"
        f" decode {decode:.2f}"
    )
    return decode, why


def with_drain(need: Need, decode: float, why: str | None) -> tuple[Need, str | None]:
    """``need`` with its decode raised to ``decode`` (from ``drained_decode``) and ``why``, when that is
    higher; else ``need`` unchanged and None."""
    if why is None or not decode > need.decode:
        return need, None
    return replace(need, decode=decode), why


def with_headroom(need: Need, headroom: float, decode_headroom: float | None = None) -> tuple[int, int, str]:
    """Stage 2: headroom, each pool rounded up separately (one ceil over the sum can starve a pool).
    ``decode_headroom``: decode's own (None: ``headroom``; ``role_headroom`` says when it applies)."""
    dh = headroom if decode_headroom is None else decode_headroom
    prefill = math.ceil(need.prefill * (1 + headroom) - 1e-9)
    decode = math.ceil(need.decode * (1 + dh) - 1e-9)
    tail = "" if dh == headroom else f" (decode's {dh:.0%})"
    return prefill, decode, f"headroom {headroom:.0%}: prefill {prefill}, decode {decode}{tail}"


def role_headroom(headroom: float, decode_headroom: float | None, ramp: bool = False) -> tuple[float, float]:
    """(prefill, decode) headroom of stage 2, of the burst reserve's level and of the standby's sizing:
    decode's is ``decode_headroom`` where set and no ramp is projected (``ramp``: the trend stage projects
    one this tick). Decode's need is Little's law at the ITL SLO's per-sequence rate on the arrival p90, itself
    a bound with margin (the measured running sequences are 0.15-0.63 x of it on every bundled trace), so the
    headroom on top is margin on a margin; on a ramp the forecast lags the load, and the headroom is what
    covers the lag (the 600-s sinusoid's first rise: -4.9 SLO points without it). Prefill's need is a 5-s mean
    of prompt tokens, whose sub-block spikes the headroom absorbs (PolicyConfig.headroom_decode)."""
    return headroom, headroom if decode_headroom is None or ramp else decode_headroom


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
    history = recent_rows(history, history[-1][0], QPS_WINDOW_S, closed=True)
    t0, t1 = history[0][0], history[-1][0]
    if t1 - t0 < 30.0:
        return math.nan
    early: list[float]
    late: list[float]
    if type(history) is TimeRows:  # in time order: the first smoothing_s is a prefix, the last a suffix
        a = bisect.bisect_left(history, True, key=lambda x: not x[0] - t0 < smoothing_s)
        b = bisect.bisect_left(history, True, key=lambda x: t1 - x[0] < smoothing_s)
        early, late = list(map(_SECOND, history[:a])), list(map(_SECOND, history[b:]))
    else:
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


# what the trend needs (its longest window, seen from its earliest confirmation); the QPS alert reads the last minute
RATE_HISTORY_S = max(TREND_WINDOWS_S) + max(TREND_CONFIRM_S)


def update_rate_history(
    history: tuple[tuple[float, float], ...],
    now_s: float,
    arrival_rps: float,
    window_s: float = RATE_HISTORY_S,
) -> tuple[tuple[float, float], ...]:
    """Append the current rate (if known; once per ``now_s``) and forget samples older than ``window_s``."""
    kept = recent_rows(history, now_s, window_s, closed=True)
    if _known(arrival_rps) and not (kept and kept[-1][0] == now_s):
        kept = append_row(kept, (now_s, arrival_rps))
    return kept


def forecast_spread(obs: PoolObservation) -> float:
    """Relative uncertainty of the arrival forecast, (p90 - p50) / p90 in [0, 1]; NaN when unknown. A
    forecast of no arrivals at all (p90 = 0) is a known forecast with no spread, not an unknown one."""
    fc = obs.forecast
    if fc is None or not (_known(fc.arrivals_p90) and _known(fc.arrivals_p50)):
        return math.nan
    if fc.arrivals_p90 <= 0:
        return 0.0
    return min(max((fc.arrivals_p90 - fc.arrivals_p50) / fc.arrivals_p90, 0.0), 1.0)


def standby_size(need: float, target: int, headroom: float, spread: float, most: int) -> tuple[int, str]:
    """Stage 3b: warm standby for one role, sized to the burst the active target cannot absorb.

    Standby activates in seconds, so it is what absorbs a burst inside the forecast's horizon; but it holds
    a GPU all the time, so it is only worth what the rounded-up active target lacks. The burst to cover is
    the need (p90) pushed up by the forecast's own spread, ``(p90 - p50) / p90`` (about the distance from p90
    to p99 of the forecast), or by the headroom when that is larger: the headroom already held on the active
    target is there for the forecast's error, so standby covers only the spread beyond it (session 2 pushed
    the need up by both, ``(1 + h)(1 + spread)``: a decode standby held through every quiet minute of Azure
    conv for no SLO, docs/BENCHMARKS.md). Standby = that burst's instances minus the active target, in
    [0, ``most``]. Unknown spread (no forecast) is not zero uncertainty: it gets ``most``.
    """
    if not _known(spread):
        return most, f"standby {most} (forecast spread unknown)"
    burst = math.ceil(need * max(1 + headroom, 1 + spread) - 1e-9)
    size = max(0, min(most, burst - target))
    return size, f"standby {size}: burst need {burst} (spread {spread:.0%}) over active {target}"


def hold_standby(
    recent: tuple[tuple[float, int, int], ...], now_s: float, sized: tuple[int, int], delay_s: float
) -> tuple[tuple[tuple[float, int, int], ...], tuple[int, int]]:
    """Stage 3c: the sized standby falls only after it has stayed lower for ``delay_s`` (as active replicas
    do): a standby that flaps with the forecast's spread is a cold start every few ticks and is never warm
    when the rise comes. Returns (the remembered window, the held (prefill, decode) standby)."""
    window = append_row(recent_rows(recent, now_s, delay_s), (now_s, sized[0], sized[1]))
    return window, (max(map(_SECOND, window)), max(map(_THIRD, window)))


def standby_stage(
    prefill: int,
    decode: int,
    obs: PoolObservation,
    cfg: PolicyConfig,
    state: PoolState,
    standby: tuple[int, int] | None = None,
    *,
    rate_history_updated: bool = False,
) -> tuple[int, int, PoolState, tuple[str, ...]]:
    """Stage 4: warm standby. On a burst alert (burst probability over its threshold, or the arrival rate
    growing faster than ``qps_change_alert_per_min``) the standby replicas — ``standby`` (prefill, decode),
    default the configured counts — are promoted (counted into the active target) and held for
    ``alert_hold_s``; the standby targets stay, so standby is refilled. ``rate_history_updated``: the caller
    has already applied this ``obs``'s ``update_rate_history`` to ``state.rate_history`` (``decide`` does, for
    the trend), so it is taken as it is: a second update at the same ``now_s`` leaves it unchanged (the window
    keeps the row it appended, and it appends none twice)."""
    sb_prefill, sb_decode = standby if standby is not None else (cfg.standby_prefill, cfg.standby_decode)
    history = (
        state.rate_history
        if rate_history_updated
        else update_rate_history(state.rate_history, obs.now_s, obs.arrival_rps)
    )
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
    new_state = evolve(state, rate_history=history, alert_until_s=alert_until)
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
    hold_s: float = 0.0,
    cold_persist_s: float = 0.0,
    rate_limited: bool = True,
    floor: int = 0,
) -> tuple[int, RoleHistory, str | None]:
    """Stage 7: tolerance band, rate limits and the time-based scale-down delay for one role.

    Scale-down goes to the highest target wanted within the last ``scale_down_delay_s`` (so a dip shorter
    than the delay changes nothing), never within the delay after a scale-up, never when the data is
    incomplete, and at most ``max_scale_down_per_min`` replicas (or ``max_scale_down_fraction_per_min`` of
    the current ones, whichever is more) per minute since the last change.
    Scale-up is limited to a ramp of (max - min) replicas per ``ramp_up_s``, at least one per decision,
    plus ``fast_up`` replicas that are already warm (standby promotion is not rate-limited).
    ``hold_s`` (a burst hold, see ``burst_hold``) lengthens the scale-down window to that many seconds.
    Beyond the warm replicas (``current + fast_up``) a scale-up goes only as far as the lowest target wanted
    over the last ``cold_persist_s`` (0 = no such wait; ``decide`` passes ``cold_start_persist_s`` for prefill
    while no request waits): a cold instance serves ``provision_lead_s`` after it is asked for, and the
    scale-down window releases one started for a one-tick spike before it ever serves.
    ``floor``: no scale-down below it (``decide`` passes a young pool's, ``young_hold_scope='unwatched'``).
    ``rate_limited`` False: no ramp-up limit this decision (``decide`` passes it while a ramp is projected and
    ``ramp_up_on_trend`` is 'lifted'); the scale-down side is unchanged.
    """
    window_s = max(cfg.scale_down_delay_s, hold_s)
    keep_s = max(
        cfg.scale_down_delay_s, cfg.burst_hold_max_s if cfg.burst_hold != "off" else 0.0, cfg.young_hold_s
    )
    start = _recent_from(history.recent_targets, now_s, keep_s, closed=False)
    if start is None:  # not in time order: filtered one by one, as recent_rows does
        kept = recent_rows(history.recent_targets, now_s, keep_s)
        recent = (*recent_rows(kept, now_s, window_s), (now_s, wanted))
        in_order = False
    else:  # checked once: every window below is a suffix of it, found by bisection alone
        kept = time_suffix(history.recent_targets, start)
        recent = (*kept[_suffix_start(kept, now_s, window_s) :], (now_s, wanted))
        in_order = not kept or kept[-1][0] <= now_s
    target = wanted
    reason = None
    if current > 0 and abs(target - current) / current <= cfg.tolerance:
        target = current
    if target > current + fast_up and cold_persist_s > 0:
        # this tick's own target always counts (a NaN now_s has no window: no wait, not an empty min)
        lasting = min(min((w for t, w in kept if now_s - t < cold_persist_s), default=wanted), wanted)
        if lasting < target:
            kept_to = max(lasting, current + fast_up)
            reason = (
                f"{role}: cold start only for a target wanted {cold_persist_s:.0f} s: {target} → {kept_to}"
            )
            target = kept_to
    if target > current:
        lo, hi = (cfg.min_prefill, cfg.max_prefill) if role == "prefill" else (cfg.min_decode, cfg.max_decode)
        elapsed = now_s - history.last_change_s if math.isfinite(history.last_change_s) else math.inf
        if rate_limited and cfg.ramp_up_s > 0 and math.isfinite(elapsed):
            limit = current + fast_up + max(1, math.floor((hi - lo) * elapsed / cfg.ramp_up_s))
            if target > limit:
                reason = f"{role}: ramp-up limit {current} → {limit} (wanted {target})"
                target = limit
    elif target < current:
        held = max(
            window_hold(recent, now_s, cfg.scale_down_delay_s, cfg.scale_down_quantile, in_order=in_order),
            floor,
        )
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
        recent_targets=append_row(kept, (now_s, wanted)),
    )
    return target, new_history, reason


def window_hold(
    recent: tuple[tuple[float, int], ...],
    now_s: float,
    delay_s: float,
    quantile: float = 1.0,
    *,
    in_order: bool = False,
) -> int:
    """The target the scale-down window keeps: the highest target of ``recent`` (the window, which a burst hold
    may have lengthened) older than ``delay_s``, and the ``quantile`` of those within the last ``delay_s``
    (the smallest target at least that fraction of them is at or below; 1 = their maximum). A one-tick
    spike of the per-second target (one long prompt, Poisson noise) is then not held for a whole window,
    while a target wanted for more than ``1 - quantile`` of the window is. A burst hold's longer window
    keeps its maximum: it is there to keep the burst's peak. ``in_order``: the caller knows ``recent`` is in
    time order with finite times and ``now_s`` (``hysteresis_stage`` has checked it), so it is not checked again."""
    start = (
        _suffix_start(recent, now_s, delay_s)
        if in_order
        else _recent_from(recent, now_s, delay_s, closed=False)
    )
    if start is not None:  # in time order: the window's last delay_s is a suffix
        inner: list[int] = sorted(map(_SECOND, recent[start:]))
        outer: list[int] = list(map(_SECOND, recent[:start]))
    else:
        inner = sorted(w for t, w in recent if now_s - t < delay_s)
        outer = [w for t, w in recent if now_s - t >= delay_s]
    held = inner[max(math.ceil(quantile * len(inner) - 1e-9) - 1, 0)] if inner else 0
    return max([held, *outer])


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
        return True, evolve(state, degrade_since_s=since, calm_since_s=math.nan), reason
    if not degraded:
        return False, state, None
    calm = state.calm_since_s if not math.isnan(state.calm_since_s) else now_s
    if now_s - calm >= cfg.degrade_recover_s:
        return False, evolve(state, degrade_since_s=math.nan, calm_since_s=math.nan), "degrade lifted"
    return True, evolve(state, calm_since_s=calm), f"degrade held: calm for {now_s - calm:.0f} s"


def clamp(value: int, lo: int, hi: int) -> int:
    """Min/max, applied last."""
    return max(lo, min(hi, value))


NEED_BLOCK_S = 5.0  # the burst reserve keeps the most instances the load needed per block this long


def uses_offered(obs: PoolObservation, cfg: PolicyConfig) -> bool:
    """Whether the offered prompt load (arrivals × mean prompt) is taken beside the prompt counter: not when
    the counter already counts at arrival and ``cfg.offered_at_arrival`` is off (the max of two estimates
    of one thing only adds an upward bias)."""
    return cfg.offered_at_arrival or not obs.prompt_at_arrival


def load_need(obs: PoolObservation, cap: PoolCapacity, offered: bool = True) -> tuple[float, float]:
    """Instances (prefill, decode) the measured load needs now: no forecast, no queue, no headroom; the
    prompt load is the higher of the prefilled-token counter and arrivals × mean prompt (a burst's size is
    what arrived, whether or not the fleet kept up). NaN when the load is unknown.

    Decode concurrency comes from arrivals (Little's law at the ITL SLO's per-sequence rate), not from the
    measured running sequences: the reserve remembers what load arrived, and an overloaded pool's running
    count is its backlog (a prefill queue flushed into decode, sequences slowed past the ITL SLO). On the
    1↔24 req/s sinusoid one such flush read 1,762 running against 1,057 by Little's law, and the reserve
    held that peak (decode 90 → max) for the rest of the hour.

    ``offered=False`` takes the prompt counter as it is (right when it counts at arrival, see
    ``PoolObservation.prompt_at_arrival``)."""
    prompt_tps = obs.prompt_tps
    if offered and _known(prompt_tps) and _known(obs.arrival_rps) and _known(obs.mean_prompt_tokens):
        prompt_tps = max(prompt_tps, obs.arrival_rps * obs.mean_prompt_tokens)
    measured = evolve(obs, forecast=None, waiting_requests=0.0, prompt_tps=prompt_tps, running_seqs=math.nan)
    need = capacity_target(measured, cap, slo_ttft_s=1.0)  # no queue: the SLO is moot
    return (need.prefill, need.decode) if need is not None else (math.nan, math.nan)


def update_need_blocks(
    blocks: tuple[tuple[float, float, float, int], ...],
    now_s: float,
    need: tuple[float, float],
    keep_s: float,
) -> tuple[tuple[tuple[float, float, float, int], ...], bool]:
    """Fold this tick's load need into the mean of its ``NEED_BLOCK_S`` block (per-second rates are mostly
    Poisson noise; a block's mean is what capacity must carry) and forget blocks that started more than
    ``keep_s`` ago. Blocks are (start_s, mean prefill need, mean decode need, ticks). Returns (blocks, True
    when this tick opened a new block). An unknown need leaves the blocks as they are: a gap is not a
    quiet period."""
    if not (_known(need[0]) and _known(need[1])):
        return blocks, False
    start = math.floor(now_s / NEED_BLOCK_S) * NEED_BLOCK_S
    if blocks and blocks[-1][0] == start:
        t0, p, d, n = blocks[-1]
        merged = (t0, p + (need[0] - p) / (n + 1), d + (need[1] - d) / (n + 1), n + 1)
        # the same start as the row it replaces: a TimeRows stays one
        kept = (*blocks[:-1], merged)
        return (TimeRows(kept) if type(blocks) is TimeRows else kept), False
    kept = recent_rows(blocks, now_s, keep_s, closed=True)
    return append_row(kept, (start, need[0], need[1], 1)), True


def burst_reserve(
    blocks: tuple[tuple[float, float, float, int], ...],
    lead_s: float,
    quantile: float,
    headroom: float = 0.0,
    peak_quantile: float | None = None,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The burst distribution observed so far, per role (prefill, decode), at ``quantile`` over every block
    remembered: (rise, peak) where, for each block k with need_k, peak_k = the most the load needed in the
    blocks starting in (t_k, t_k + lead_s] and rise_k = max(peak_k − (1 + headroom) × need_k, 0): what
    the headroom the policy already keeps over the current load would not have covered (noise and slow
    drifts it does; a burst from a quiet pool it does not).

    Capacity started when a rise is seen arrives ``lead_s`` (one cold start) later, so the rises of one
    cold start are what warm capacity must cover, and the peaks bound how far: the pool's load has not
    needed more than that. Windows cut short by the present count with what they have seen (a lower bound),
    so the estimate exists from the second block on. NaN per role when there is no pair yet.
    """
    reserve, _ = burst_reserve_kept(blocks, lead_s, quantile, headroom, peak_quantile)
    return reserve


def burst_reserve_kept(
    blocks: tuple[tuple[float, float, float, int], ...],
    lead_s: float,
    quantile: float,
    headroom: float = 0.0,
    peak_quantile: float | None = None,
    final: LeadPeaks = LeadPeaks(),
    projected: tuple[tuple[float, float], ...] = (),
) -> tuple[tuple[tuple[float, float], tuple[float, float]], LeadPeaks]:
    """``burst_reserve``, and the blocks whose lead peaks no later block can change, to pass back in as
    ``final`` next time (``LeadPeaks``: start, prefill and decode need, prefill and decode peak of the oldest
    blocks, ``_final_peaks``). Those in ``final`` that are still among ``blocks`` are read as they are (one
    buffer, no per-block work) and only the newer blocks are read and computed, so the tick that opens a block
    computes about ``lead_s / NEED_BLOCK_S`` peaks instead of one per block of the window. The result is the
    same as without ``final`` (the same needs and maxima in the same order); a ``final`` that does not line up
    with ``blocks`` (another lead, its first or last start not theirs, block starts not increasing) is
    ignored. Only the newest block may have changed since ``final`` was computed, as ``update_need_blocks``
    changes them; whatever moves blocks otherwise drops it (``resume_history``).

    ``projected``: (start, trend factor) of the blocks whose rise the trend stage projected
    (``PoolState.projected_blocks``): their rise is what the peak needs beyond (1 + headroom) × factor × need,
    0 for a factor of inf (the peaks are kept); a burst nothing projected counts as it is."""
    nan2 = (math.nan, math.nan)
    n = len(blocks)
    if n < 2 or lead_s <= 0:
        return (nan2, nan2), LeadPeaks()
    fast = reserve_fast.kept_reserve(
        blocks, lead_s, quantile, headroom, peak_quantile, final, projected, NEED_BLOCK_S
    )
    if fast is not None:  # the newest blocks only, from the sorted final values (same floats)
        return fast
    m = max(math.ceil(lead_s / NEED_BLOCK_S), 1)
    lead = lead_s + 1e-9
    kept = np.frombuffer(final.rows).reshape(-1, 5) if final.rows and final.lead_s == lead_s else None
    c = 0
    if kept is not None:
        kept = kept[int(np.searchsorted(kept[:, 0], blocks[0][0])) :]
        c = len(kept)
        if not (0 < c < n and kept[0, 0] == blocks[0][0] and kept[-1, 0] == blocks[c - 1][0]):
            c = 0
    arr = _block_rows(blocks[c:])
    t, v = arr[0], arr[1:]
    increasing = bool((t[1:] > t[:-1]).all())
    if c and kept is not None and increasing and t[0] > kept[-1, 0]:
        peak = np.concatenate([kept[:, 3:5].T, _newest_peaks(t, v, 0, m, lead)], axis=1)
        t = np.concatenate([kept[:, 0], t])
        v = np.concatenate([kept[:, 1:3].T, v], axis=1)
    else:
        if c:
            arr = _block_rows(blocks)
            t, v = arr[0], arr[1:]
            increasing = bool((t[1:] > t[:-1]).all())
        c = 0
        peak = _lead_peaks(t, v, m, lead)  # [role, block]
    kept_rows = final.rows[len(final.rows) - 40 * c :] if c else b""
    covered = _trend_factors(t, projected) if projected else None
    final_out = LeadPeaks()
    if increasing:
        final_out = LeadPeaks(lead_s, _final_peaks(t, v, peak, m, lead, c, kept_rows))
        final_out = reserve_fast.cache(
            final_out, t, v, peak, _rises(peak, v, headroom, covered), headroom, projected
        )
    return _reserve_from_peaks(v, peak, quantile, headroom, peak_quantile, covered), final_out


def _block_rows(blocks: tuple[tuple[float, float, float, int], ...]) -> np.ndarray:
    """Rows start, prefill need, decode need of ``blocks`` (fromiter: a third of asarray's cost)."""
    n = len(blocks)
    return (
        np.fromiter(itertools.chain.from_iterable(blocks), np.float64, count=4 * n).reshape(n, 4).T[:3].copy()
    )


def _newest_peaks(t: np.ndarray, v: np.ndarray, c: int, m: int, lead: float) -> np.ndarray:
    """``_lead_peaks(t, v, m, lead)[:, c:]`` for the few newest blocks (about ``m`` of them), as one dense
    [role, block, m] window: block k's next ``m`` blocks j < n, those with t[j] − t[k] <= lead, their most
    (NaN if one is NaN, as the sparse table's maxima), -inf where there is none."""
    n = len(t)
    k = np.arange(c, n)
    ahead = k[:, None] + np.arange(1, m + 1)
    inside = ahead < n
    ahead = np.minimum(ahead, n - 1)
    inside &= t[ahead] - t[k, None] <= lead
    return np.asarray(np.where(inside, v[:, ahead], -np.inf).max(axis=2))


def _final_peaks(
    t: np.ndarray, v: np.ndarray, peak: np.ndarray, m: int, lead: float, c: int, kept: bytes
) -> bytes:
    """The blocks whose lead peak no later block can change, as float64 rows (start, prefill need, decode
    need, prefill peak, decode peak): block k's window is the blocks k+1 .. k+m starting within ``lead`` of
    it, so its peak is final when the open (last) block is not in it, by count (k + m < n − 1) or by time
    (t[n−1] − t[k] > lead; with starts increasing, every later block starts later still, so it is out of
    the window too). ``kept``: the rows of the first ``c`` of them, already known."""
    n = len(t)
    f = max(n - 1 - m, int(np.count_nonzero(t[-1] - t > lead)), c)
    if f <= c:
        return kept
    new = np.stack([t[c:f], v[0, c:f], v[1, c:f], peak[0, c:f], peak[1, c:f]], axis=1)
    return kept + new.tobytes()


def _reserve_from_peaks(
    v: np.ndarray,
    peak: np.ndarray,
    quantile: float,
    headroom: float,
    peak_quantile: float | None,
    covered: np.ndarray | None = None,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """``burst_reserve``'s quantiles of the rises and peaks, from the needs ``v`` and lead peaks [role, block];
    ``covered``: per block, the trend factor its rise is measured beyond (1 where nothing was projected, inf:
    rises by 0)."""
    nan2 = (math.nan, math.nan)
    ok = np.isfinite(peak)
    if not (ok[0].any() and ok[1].any()):
        return nan2, nan2
    pq = quantile if peak_quantile is None else peak_quantile
    if not (ok[0] == ok[1]).all():  # only with non-finite needs: each role over its own blocks
        rises = [
            _quantiles(_rises(peak[i], v[i], headroom, covered)[ok[i]][None], quantile)[0] for i in (0, 1)
        ]
        peaks = [_quantiles(peak[i, ok[i]][None], pq)[0] for i in (0, 1)]
        return (rises[0], rises[1]), (peaks[0], peaks[1])
    rise = _rises(peak, v, headroom, covered)[..., ok[0]]
    peak = peak[:, ok[0]]
    r = _quantiles(rise, quantile)
    p = _quantiles(peak, pq)
    return (r[0], r[1]), (p[0], p[1])


def _rises(peak: np.ndarray, v: np.ndarray, headroom: float, covered: np.ndarray | None) -> np.ndarray:
    """max(peak − (1 + headroom) × need, 0) per block (the last axis); with ``covered`` (trend factors per
    block) max(peak − (1 + headroom) × factor × need, 0), 0 where the factor is inf."""
    if covered is None:
        return np.maximum(peak - (1 + headroom) * v, 0.0)
    finite = np.isfinite(covered)
    rise = np.maximum(peak - (1 + headroom) * np.where(finite, covered, 1.0) * v, 0.0)
    return np.where(finite, rise, 0.0)


def _trend_factors(t: np.ndarray, projected: tuple[tuple[float, float], ...]) -> np.ndarray:
    """Per block start in ``t``: the trend factor ``projected`` marks it with, 1 where it is not marked."""
    marks = np.asarray(projected, dtype=np.float64).reshape(-1, 2)
    at = np.searchsorted(marks[:, 0], t)
    hit = (at < len(marks)) & (marks[np.minimum(at, len(marks) - 1), 0] == t)
    return np.where(hit, marks[np.minimum(at, len(marks) - 1), 1], 1.0)


def _quantiles(rows: np.ndarray, q: float) -> list[float]:
    """``np.quantile(rows, q, axis=1)`` (its default 'linear' method) by numpy's own arithmetic, without its
    dispatch (~90 us a call, most of an hour-long reserve's cost): the order statistics either side of
    (n − 1) q in the sorted row and numpy's two-sided lerp; NaN for a row holding NaN. Tested against
    ``np.quantile``."""
    lo, hi, gamma = reserve_fast.quantile_rank(rows.shape[1], q)
    ordered = np.sort(rows, axis=1)  # NaN sorts last
    out = []
    for a, b, last in zip(
        ordered[:, lo].tolist(), ordered[:, hi].tolist(), ordered[:, -1].tolist(), strict=True
    ):
        out.append(math.nan if math.isnan(last) else reserve_fast.lerp(a, b, gamma))
    return out


def _lead_peaks(t: np.ndarray, v: np.ndarray, m: int, lead_s: float) -> np.ndarray:
    """Per role (row of ``v``) and block k: the most of ``v[:, j]`` over the next ``m`` blocks j with
    ``t[j] - t[k] <= lead_s``; -inf where there is none.

    Block starts increase (``update_need_blocks`` appends them in time order), so those j are the first
    ``c_k`` of the next ``m`` (float subtraction is monotone) and a sparse table of maxima over power-of-two
    spans answers each block with two look-ups: O(n log m) instead of the [role, block, m] window. The
    counts are checked against the subtraction itself; any other input takes the window."""
    n = len(t)
    idx = np.arange(n)
    limit = np.minimum(idx + m, n - 1)  # the last block each window may reach
    if n > 1 and bool((t[1:] > t[:-1]).all()):
        last = np.minimum(np.searchsorted(t, t + lead_s, side="right") - 1, limit)
        last = np.maximum(last, idx)  # c_k = last - k blocks ahead are in the lead
        within = t[last] - t <= lead_s
        beyond = last < limit
        nxt = np.minimum(last + 1, n - 1)
        if bool(within.all()) and bool((t[nxt[beyond]] - t[beyond] > lead_s).all()):
            return _range_max(v, idx + 1, last)
    t_future = sliding_window_view(np.concatenate([t[1:], np.full(m, np.inf)]), m)[:n]
    in_lead = (t_future - t[:, None]) <= lead_s
    future = sliding_window_view(np.concatenate([v[:, 1:], np.full((2, m), -np.inf)], axis=1), m, axis=1)[
        :, :n
    ]
    return np.asarray(np.where(in_lead, future, -np.inf).max(axis=2))


def _range_max(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row of ``v``: ``v[:, lo[k] : hi[k] + 1].max()`` for every k, -inf where ``hi[k] < lo[k]``."""
    n = v.shape[1]
    count = hi - lo + 1
    out = np.full(v.shape, -np.inf)
    level = np.frexp(np.maximum(count, 1))[1] - 1  # floor(log2(count)), exact
    table = [v]  # table[l][:, i] = max of v[:, i : i + 2**l]
    span = 1
    while 2 * span <= int(count.max(initial=0)):
        prev = table[-1]
        nxt = np.full_like(v, -np.inf)
        np.maximum(prev[:, : n - span], prev[:, span:], out=nxt[:, : n - span])
        table.append(nxt)
        span *= 2
    for lvl, tab in enumerate(table):  # the few levels present, each with two column gathers
        at = np.flatnonzero((level == lvl) & (count > 0))
        if at.size:
            left, right = lo[at], hi[at] - (1 << lvl) + 1
            out[:, at] = np.maximum(tab.take(left, axis=1), tab.take(right, axis=1))
    return out


def trailing_need(blocks: tuple[tuple[float, float, float, int], ...]) -> tuple[float, float]:
    """The (prefill, decode) need's mean over about the last ``NEED_BLOCK_S``: the current block's mean so far,
    topped up with the previous block's mean for the ticks the current one has not had yet (when that block
    is the one just before; a gap in the data leaves the current block alone). The burst reserve's rises are
    measured between block means, so the level they stack on is a block mean too: a single tick's need adds
    the per-second noise a second time, and the scale-down window holds the top of it. NaN with no block."""
    if not blocks:
        return math.nan, math.nan
    start, p, d, n = blocks[-1]
    if len(blocks) < 2 or abs(blocks[-2][0] - (start - NEED_BLOCK_S)) > 1e-6:
        return p, d
    _, prev_p, prev_d, m = blocks[-2]
    rest = max(m - n, 0)
    return (n * p + rest * prev_p) / (n + rest), (n * d + rest * prev_d) / (n + rest)


def lead_median_level(
    blocks: tuple[tuple[float, float, float, int], ...], level: tuple[float, float], lead_s: float
) -> tuple[float, float]:
    """``burst_reserve_level`` 'lead_median': per role (prefill, decode), the lower of ``level`` (the trailing
    block's need) and the median need of the completed blocks (all but the newest, still filling) that start
    within ``lead_s`` of the newest block's start; ``level`` as it is where there is no such block or the
    median is unknown. The reserve's rises are measured from each block's need over the pool's spread, so on
    noise a high trailing block adds that spread a second time, and the scale-down window holds the top of it
    (on s11u's overdispersed shape: 1,249 of 10,148 idle active prefill GPU-s; the cold starts are the same)."""
    if len(blocks) < 2:
        return level
    newest = blocks[-1][0]
    done = [b for b in blocks[:-1] if newest - b[0] <= lead_s + 1e-9]
    if not done:
        return level
    out = []
    for i in (0, 1):
        med = _median([b[i + 1] for b in done])
        out.append(min(level[i], med) if _known(med) and _known(level[i]) else level[i])
    return out[0], out[1]


def reserve_target(
    level: float, rise: float, peak: float, headroom: float, peak_headroom: bool = True
) -> int:
    """Instances the burst reserve keeps warm for one role: the load need's level plus the observed rise, with
    headroom, capped by the observed peak (with headroom too when ``peak_headroom``; never below the level
    with headroom)."""
    h = 1 + headroom
    cap = max(peak * (h if peak_headroom else 1.0), level * h)
    return min(math.ceil(min((level + rise) * h, cap) - 1e-9), int(MAX_NEED))


def held_output(obs: PoolObservation, state: PoolState, hold_s: float) -> tuple[PoolObservation, PoolState]:
    """``PolicyConfig.reserve_output_hold_s``: ``obs`` with its mean output length the most of the known
    estimates over the last ``hold_s`` seconds of ticks, this one's included (the burst reserve's view of
    decode's load). Generation follows arrivals by a sequence lifetime, so a burst shorter than that reads a
    dipped estimate, and decode's Little's-law need under-reads it. An unknown estimate stays unknown (and
    adds nothing); ``hold_s = 0`` passes ``obs`` and ``state`` through."""
    if hold_s <= 0:
        return obs, state
    out = obs.mean_output_tokens
    recent = tuple(r for r in state.output_recent if obs.now_s - r[0] < hold_s and r[0] < obs.now_s)
    if not _known(out):
        return obs, evolve(state, output_recent=recent)
    recent = (*recent, (obs.now_s, out))
    return evolve(obs, mean_output_tokens=max(r[1] for r in recent)), evolve(state, output_recent=recent)


def burst_reserve_stage(
    prefill: int,
    decode: int,
    obs: PoolObservation,
    cap: PoolCapacity,
    cfg: PolicyConfig,
    state: PoolState,
    trend: float | None = None,
) -> tuple[int, int, tuple[int, int], PoolState, tuple[str, ...]]:
    """Stage 3a: capacity for the bursts this pool has shown, sized for what arrives within one cold start.

    Per role: min(current load need + the observed rise beyond headroom, the observed peak), with headroom
    (``burst_reserve``), is what must be warm now, because nothing started later serves sooner than
    ``provision_lead_s``; the peak keeps a pool already at its usual top from stacking a rise on it.
    ``cfg.burst_reserve`` says where it goes: 'active' raises the active target to it, 'standby' keeps the
    difference warm as standby (promoted in seconds on an alert), 'off' does nothing. Returns (prefill,
    decode, standby (prefill, decode) the reserve asks for, state, reasons).

    ``trend``: the factor the trend stage projects a ramp by this tick (None: no ramp). With
    ``cfg.burst_reserve_projected`` other than 'kept', a block it projected at every tick of is marked
    (``PoolState.projected_blocks``): 'left_out', its rise counts as 0; 'beyond_trend', only the rise beyond
    the smallest factor it projected counts.
    """
    if cfg.burst_reserve == "off" and cfg.burst_hold == "off" and not cfg.short_burst_cap:
        return prefill, decode, (0, 0), state, ()
    need_obs, state = held_output(obs, state, cfg.reserve_output_hold_s)
    now_need = load_need(need_obs, cap, offered=uses_offered(obs, cfg))
    idle_s, state = idle_stretch(now_need, obs.now_s, cfg.idle_release_s, state)
    if idle_s >= cfg.idle_release_s:
        why = f"idle {idle_s:.0f} s (no load since t={obs.now_s - idle_s:.0f} s): burst reserve released"
        return prefill, decode, (0, 0), state, (f"{why}, burst history paused",)
    keep_s = cfg.burst_window_s + cfg.provision_lead_s
    blocks, opened = update_need_blocks(state.need_blocks, obs.now_s, now_need, keep_s)
    if opened and (cfg.burst_hold != "off" or cfg.short_burst_cap) and len(blocks) >= 2:
        # the completed blocks' median, kept: short_burst reads it every tick until the next block opens
        median, kept_median = block_median(blocks[:-1], state.block_median)
        runs = update_burst_runs(state.burst_runs, blocks, cfg.headroom, keep_s, median)
        state = evolve(state, burst_runs=runs, block_median=kept_median)
    if cfg.burst_reserve == "off":
        return prefill, decode, (0, 0), evolve(state, need_blocks=blocks), ()
    if cfg.burst_reserve_projected != "kept" and blocks is not state.need_blocks:
        factor = None if trend is None else math.inf if cfg.burst_reserve_projected == "left_out" else trend
        state = evolve(state, projected_blocks=mark_projected(state.projected_blocks, blocks, opened, factor))
    level = now_need if cfg.burst_reserve_level == "tick" else trailing_need(blocks)
    if cfg.burst_reserve_level == "lead_median":
        level = lead_median_level(blocks, level, cfg.provision_lead_s)
    rise, peak = state.reserve
    final = state.need_peaks
    if opened or (math.isnan(rise[0]) and len(blocks) >= 2):
        (rise, peak), final = burst_reserve_kept(
            blocks,
            cfg.provision_lead_s,
            cfg.burst_quantile,
            cfg.headroom,
            cfg.burst_peak_quantile,
            final,
            state.projected_blocks,
        )
    state = evolve(state, need_blocks=blocks, reserve=(rise, peak), need_peaks=final)
    prior = ""
    if cfg.burst_reserve_leading == "prior" and all(_known(x) for x in (*rise, *peak)):
        lead_rise, lead_peak = leading_prior(
            blocks, state.burst_runs, cfg.provision_lead_s, cfg.burst_quantile, cfg.headroom
        )
        if all(_known(x) for x in (*lead_rise, *lead_peak)):
            rise = (max(rise[0], lead_rise[0]), max(rise[1], lead_rise[1]))
            peak = (max(peak[0], lead_peak[0]), max(peak[1], lead_peak[1]))
            a, b = state.burst_runs[0]
            prior = (
                f"; the history starts in a burst (t={a:.0f}-{b:.0f} s): its rise from the median counted"
                f" (peak {lead_peak[0]:.2f})"
            )
    if not all(_known(x) for x in (*level, *rise, *peak)):
        return prefill, decode, (0, 0), state, ()
    peak_h = (cfg.burst_peak_headroom != "none", cfg.burst_peak_headroom == "both")
    hs = role_headroom(cfg.headroom, cfg.headroom_decode, ramp=trend is not None)
    want = [reserve_target(level[i], rise[i], peak[i], hs[i], peak_h[i]) for i in (0, 1)]
    reason = (
        f"burst reserve (q{cfg.burst_quantile:.2f} of {cfg.provision_lead_s:.0f}-s rises over {len(blocks)}"
        f" blocks): prefill +{rise[0]:.2f} (peak {peak[0]:.2f}) → {want[0]},"
        f" decode +{rise[1]:.2f} (peak {peak[1]:.2f}) → {want[1]}{prior}"
    )
    if cfg.burst_reserve == "active":
        return max(prefill, want[0]), max(decode, want[1]), (0, 0), state, (reason,)
    return prefill, decode, (max(want[0] - prefill, 0), max(want[1] - decode, 0)), state, (reason,)


def leading_prior(
    blocks: tuple[tuple[float, float, float, int], ...],
    runs: tuple[tuple[float, float], ...],
    lead_s: float,
    quantile: float,
    headroom: float,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """``cfg.burst_reserve_leading`` 'prior': the (rise, peak) per role (prefill, decode) that a burst the
    history starts in (``runs[0]`` starting at the first block, see ``leading_run``) stands for, or NaNs when
    there is none or it no longer counts.

    No block was seen before such a burst, so ``burst_reserve`` measures no rise for it. The prior: the pool
    was at its median need for one cold start before the history. Those ``m = ceil(lead_s / NEED_BLOCK_S)``
    blocks would each have seen the burst within their lead, rising by its peak (the most a block of the run
    needed) beyond the median with headroom (``_rises``), their peak the burst's. An observed burst's blocks
    count in the reserve's quantiles while they are more than ``1 - quantile`` of the history, and so do these:
    with n blocks remembered, while ``m / (n + m) > 1 - quantile``. The median is over the completed blocks
    (the newest is still filling), per role. A leading run that has lasted ``lead_s`` or more is a level, not a
    burst (``burst_hold``'s rule), and has no prior; nor has one of the history's first block alone, whose need
    is read from the pool's first seconds of counters (its peak is taken over the run's later blocks). The prior
    stands in for a rise not measured: once a burst of the pool's own has been seen after it (a second run),
    the reserve measures that one's rise and the prior is dropped (the Azure code trace cut mid-burst, whose
    bursts recur within minutes: +54 % GPU-s with the prior kept for its 18 min, the same SLO)."""
    nan2 = (math.nan, math.nan)
    if len(blocks) < 2 or len(runs) != 1 or lead_s <= 0 or runs[0][0] > blocks[0][0] + 1e-9:
        return nan2, nan2  # no leading burst, or a burst seen since: the reserve has measured its own rise
    m = max(math.ceil(lead_s / NEED_BLOCK_S - 1e-9), 1)
    if m <= (1 - quantile) * (len(blocks) + m) + 1e-9:  # no longer more than 1 - q of the blocks
        return nan2, nan2
    start, end = runs[0]
    if end - start >= lead_s:  # it lasted a cold start: a level cold capacity follows (burst_hold's rule)
        return nan2, nan2
    # not the history's first block: the pool's first seconds of counters (a handful of requests make the mean
    # prompt; Mooncake's first block reads 46 prefill instances, its later peaks 25-29), no evidence of a burst
    inside = [b for b in blocks[1:] if start - 1e-9 <= b[0] < end - 1e-9]
    if not inside:
        return nan2, nan2
    done = blocks[:-1]
    rises: list[float] = []
    peaks: list[float] = []
    for i in (1, 2):
        peak = max(b[i] for b in inside)
        median = _median([b[i] for b in done])
        if not (_known(peak) and _known(median)):
            return nan2, nan2
        rises.append(max(peak - (1 + headroom) * median, 0.0))
        peaks.append(peak)
    return (rises[0], rises[1]), (peaks[0], peaks[1])


def mark_projected(
    marks: tuple[tuple[float, float], ...],
    blocks: tuple[tuple[float, float, float, int], ...],
    opened: bool,
    factor: float | None,
) -> tuple[tuple[float, float], ...]:
    """(start, trend factor) of the need blocks the trend stage projected a ramp at every tick of, after this
    tick updated ``blocks`` (``update_need_blocks``; ``opened`` when it opened the newest) with this tick's
    ``factor`` (None: no ramp): the newest block is marked when it opens on a projected tick, keeps the
    smallest factor of its ticks, and is unmarked by any tick in it that is not projected; marks older than the
    oldest block are forgotten."""
    start = blocks[-1][0]
    if opened:
        marks = tuple(m for m in marks if m[0] >= blocks[0][0])
        return (*marks, (start, factor)) if factor is not None else marks
    if not marks or marks[-1][0] != start:
        return marks
    if factor is None:
        return marks[:-1]
    return (*marks[:-1], (start, min(marks[-1][1], factor)))


SILENCE_MIN_S = 10.0  # a silence is read only after this long without an arrival
SILENCE_BEFORE_S = 60.0  # the rate the silence is judged against: the mean over this long before it began
# the arrivals that rate makes expected over the silence, at least: no arrival at all is then implausible as
# chance (Poisson: e^-20 ~ 2e-9; bursty traffic's gaps are far likelier than Poisson's, hence the margin)
SILENCE_MIN_EXPECTED = 20.0
# and the stream before it was steady: its per-tick counts no more overdispersed than this (variance / mean; 1
# for Poisson, whose sample index over 60 one-second ticks has a standard error of ~0.18). A burst's tail falls
# silent as a matter of course: the bundled Azure code trace has 25 silences of 10-173 s that pass the two tests
# above, with an index of 3.4-17.9 over the minute before each; s18_outage_retry's outage follows one of 1.3.
SILENCE_MAX_DISPERSION = 2.0
SILENCE_MIN_COVERAGE = 0.8  # the samples before the silence span at least this share of SILENCE_BEFORE_S
# and it is new: at least this many times longer than the longest gap (a run of ticks without an arrival, plus
# one tick) of that minute. Thinning Poisson-izes bursty traffic (Azure code at 30 %: index 1.8-2.0 before 3
# of its gaps), but its gaps stay: 8-23 s in the minute before silences of 23-49 s; a steady stream has none
SILENCE_GAP_RATIO = 4.0


def sudden_silence(
    history: tuple[tuple[float, float], ...],
    now_s: float,
    arrival_rps: float,
    since_s: float,
    hold_s: float,
    queued: bool = False,
) -> tuple[bool, float, str | None]:
    """Whether the pool's arrivals have stopped dead: none for at least ``SILENCE_MIN_S`` where the rate before
    made that implausible (``SILENCE_MIN_EXPECTED`` arrivals expected at the mean rate of the
    ``SILENCE_BEFORE_S`` before it, whose per-tick counts were no more than ``SILENCE_MAX_DISPERSION``
    overdispersed and whose longest gap was under 1 / ``SILENCE_GAP_RATIO`` of this one: a steady stream,
    not a burst's tail). Traffic that falls does not stop within a second; traffic cut off upstream
    does (a gateway, the network, a client fleet down), and it comes back with its retries on top (a retry
    storm: s18_outage_retry, 6 req/s, 60 s of nothing, then 18 req/s). While silent (at most ``hold_s`` from
    its start) the pool wants what it has (``decide``): it may scale up, never down, and the scale-down window
    starts when the silence ends.

    ``history``: the (time, arrival rate) samples the trend stage keeps, this tick's included; ``since_s``: when
    the current silence began (``PoolState.silent_since_s``; NaN = none; -inf = one older than the history,
    never held). Returns (silent now, the new
    ``since_s``, a reason while silent). ``hold_s`` 0: never silent. An unknown rate changes nothing.
    ``queued``: requests wait in the pool; it is then not silent (a backlog is still being served, and what it
    needs is the other stages' to judge: the end of an overloaded sinusoid's trace is no outage to hold
    through), though the silence's start is still kept."""
    if hold_s <= 0:
        return False, math.nan, None
    if not _known(arrival_rps):
        silent = math.isfinite(since_s) and now_s - since_s < hold_s and not queued
        return silent, since_s, None
    if arrival_rps > 0:
        return False, math.nan, None
    if math.isnan(since_s):
        since_s = _silence_start(history, now_s)
        if not math.isfinite(since_s):
            return False, since_s, None  # NaN: none (yet); -inf: the history holds nothing but this silence
    if now_s - since_s >= hold_s or queued:
        return False, since_s, None  # held long enough: the load has gone (kept, so it is not read again)
    return (
        True,
        since_s,
        f"silence: no arrival for {now_s - since_s:.0f} s after a steady stream (an outage upstream?):"
        f" no scale-down for {hold_s - (now_s - since_s):.0f} s more",
    )


def _silence_start(history: tuple[tuple[float, float], ...], now_s: float) -> float:
    """When the zero run at the end of ``history`` began (the time of the last sample with arrivals), if it
    is a sudden silence (``sudden_silence``'s test); -inf when the run fills the whole history (too old to
    judge); NaN otherwise."""
    i = len(history)
    while i > 0 and history[i - 1][1] <= 0:
        i -= 1
    if i == 0:  # older than the history: judged never, and not walked again while it lasts
        return -math.inf if history else math.nan
    start = history[i - 1][0]
    silence_s = now_s - start
    if silence_s < SILENCE_MIN_S:
        return math.nan
    rows = [row for row in history[:i] if start - row[0] < SILENCE_BEFORE_S]
    before = [r for _, r in rows]
    span_s = rows[-1][0] - rows[0][0]
    if len(before) < 3 or span_s < SILENCE_MIN_COVERAGE * SILENCE_BEFORE_S:
        return math.nan  # too little seen before it to call the stream steady
    rate = sum(before) / len(before)
    if rate * silence_s < SILENCE_MIN_EXPECTED:
        return math.nan
    tick_s = span_s / (len(before) - 1)
    variance = sum((r - rate) ** 2 for r in before) / (len(before) - 1)
    if variance * tick_s / rate > SILENCE_MAX_DISPERSION:
        return math.nan
    longest = run = 0
    for r in before:
        run = run + 1 if r <= 0 else 0
        longest = max(longest, run)
    return start if silence_s >= SILENCE_GAP_RATIO * (longest + 1) * tick_s else math.nan


def _idle_need(need: tuple[float, float]) -> bool:
    """The measured load needs nothing: no prompt arriving or prefilling, nothing generating."""
    return need[0] <= 0.0 and need[1] <= 0.0


def idle_stretch(
    need: tuple[float, float], now_s: float, release_s: float, state: PoolState
) -> tuple[float, PoolState]:
    """How long the pool's measured load has needed nothing (``_idle_need``), seconds (0 while it needs
    something; an unknown need extends nothing and breaks nothing), and the state that remembers it.

    The burst reserve and the burst runs are learned over the last ``burst_window_s`` of history, and a long
    silence is history too: an hour of nothing dilutes every quantile of rises to 0, so the reserve holds its
    old value for much of the silence (cost for nobody) and then reads 0 just when the load comes back (the
    first bursts after it meet the minimum fleet). An idle stretch of ``release_s`` or more is therefore a
    pause: the reserve is released and no block is recorded (``burst_reserve_stage``), and when the load comes
    back the history before it is moved forward by the time it was paused (``resume_history``), so the
    pool's bursts are known again from its first busy block, as if the silence had not been."""
    if not (_known(need[0]) and _known(need[1])):
        since = state.idle_since_s
        return (now_s - since if math.isfinite(since) else 0.0), state
    if not _idle_need(need):
        if math.isfinite(state.idle_since_s) and now_s - state.idle_since_s >= release_s:
            state = resume_history(state, now_s)
        return 0.0, evolve(state, idle_since_s=math.nan)
    since = state.idle_since_s if math.isfinite(state.idle_since_s) else now_s
    return now_s - since, evolve(state, idle_since_s=since)


def resume_history(state: PoolState, now_s: float) -> PoolState:
    """The burst history with the pause cut out: the idle blocks recorded at its start (the first
    ``release_s``) are dropped, and what was before them (need blocks, burst runs) is moved forward in time so
    that its last block ends where the block of ``now_s`` starts, on the ``NEED_BLOCK_S`` grid. In hindsight
    those idle blocks were the start of the silence, not the pool's usual quiet: kept, they dilute every
    quantile of rises (hostile_silence_1h: 60 of them took the reserve's prefill rise from 7.1 to 5.5
    instances at the next burst). The seam is remembered (``PoolState.pauses``): the gap between the bursts on
    either side of it is a silence, not an inter-burst gap, so ``burst_hold`` does not count it. A history of
    nothing but idle blocks is only moved (its quiet is the watched time before a first burst)."""
    blocks = state.need_blocks
    keep = len(blocks)
    while keep > 0 and _idle_need((blocks[keep - 1][1], blocks[keep - 1][2])):
        keep -= 1
    if keep > 0:
        blocks = blocks[:keep]
    if not blocks:
        return state
    start = math.floor(now_s / NEED_BLOCK_S) * NEED_BLOCK_S
    shift = start - (blocks[-1][0] + NEED_BLOCK_S)
    if shift <= 0:
        return state
    moved = tuple((t + shift, p, d, n) for t, p, d, n in blocks)
    runs = tuple((a + shift, b + shift) for a, b in state.burst_runs)
    pauses = (*tuple(t + shift for t in state.pauses if t + shift >= moved[0][0]), start)
    marks = tuple((t + shift, f) for t, f in state.projected_blocks if t + shift >= moved[0][0])
    return evolve(
        state,
        need_blocks=moved,
        burst_runs=runs,
        pauses=pauses,
        need_peaks=LeadPeaks(),
        projected_blocks=marks,
    )


def smooth_load(obs: PoolObservation, state: PoolState, window_s: float) -> tuple[PoolObservation, PoolState]:
    """Stage 0: the measured rates (arrivals, prompt and generation tokens/s) as their mean over the last
    ``window_s`` seconds of ticks, unknown samples left out (a window with none stays unknown).

    Per-second rates are mostly Poisson noise (24 req/s reads 16 to 34 from one second to the next), and
    the scale-down window keeps the highest target it has seen: sizing from raw seconds holds the top of
    the noise, not the load. ``window_s = 0`` passes the observation through."""
    if window_s <= 0:
        return obs, state
    sample = (obs.now_s, obs.arrival_rps, obs.prompt_tps, obs.gen_tps)
    recent = (
        *tuple(r for r in state.load_recent if obs.now_s - r[0] < window_s and r[0] < obs.now_s),
        sample,
    )

    def mean(i: int) -> float:
        known = [r[i] for r in recent if _known(r[i])]
        return sum(known) / len(known) if known and _known(sample[i]) else sample[i]

    smoothed = evolve(obs, arrival_rps=mean(1), prompt_tps=mean(2), gen_tps=mean(3))
    return smoothed, evolve(state, load_recent=recent)


def queue_age(obs: PoolObservation, state: PoolState) -> tuple[float, PoolState]:
    """How long requests have been waiting without a break, seconds (0 with no queue; a tick whose queue is
    unknown breaks nothing and extends nothing). Returns (age_s, state)."""
    waiting = obs.waiting_requests
    if not _known(waiting):
        since = state.queue_since_s
        return (obs.now_s - since if math.isfinite(since) else 0.0), state
    if waiting <= 0:
        return 0.0, evolve(state, queue_since_s=math.nan)
    since = state.queue_since_s if math.isfinite(state.queue_since_s) else obs.now_s
    return obs.now_s - since, evolve(state, queue_since_s=since)


def update_burst_runs(
    runs: tuple[tuple[float, float], ...],
    blocks: tuple[tuple[float, float, float, int], ...],
    headroom: float,
    keep_s: float,
    median: float | None = None,
) -> tuple[tuple[float, float], ...]:
    """Fold the last *completed* need block (``blocks[-2]``; call when a new block opens) into the bursts seen:
    runs of consecutive "high" blocks as (start_s, end_s). A block is high when its total need (prefill +
    decode instances) exceeds the median block of the window by more than the headroom covers and by at
    least one instance: a load the capacity kept for the typical load does not carry. Runs that ended more
    than ``keep_s`` before the block are forgotten.

    The pool's first blocks were judged against a median of themselves, so a pool first seen in a burst (a
    controller started mid-burst, a trace cut there) never records that burst: nothing holds the capacity it
    started, and the scale-down cancels it just before it serves (mmpp@3: four prefill instances asked for at
    t = 5 s released one by one from t = 69 s, and the next burst at 220 s met two). While no run is known and
    the history is younger than ``keep_s`` (its first block is the pool's first), the leading blocks are
    judged again against the window's median (``leading_run``). ``median``: that median, where the caller
    has it (``block_median``), else it is computed here."""
    if len(blocks) < 2:
        return runs
    if median is None:
        median = _median(block_totals(blocks[:-1]))
    start, need = blocks[-2][0], float(blocks[-2][1] + blocks[-2][2])
    end = start + NEED_BLOCK_S
    runs = tuple(r for r in runs if end - r[1] <= keep_s)
    if not runs and end - blocks[0][0] < keep_s:
        runs = leading_run(blocks[:-1], median, headroom)
    if not _is_high(need, median, headroom):
        return runs
    if runs and runs[-1][1] >= start - 1e-9:
        return (*runs[:-1], (runs[-1][0], end))
    return (*runs, (start, end))


def leading_run(
    blocks: tuple[tuple[float, float, float, int], ...], median: float, headroom: float
) -> tuple[tuple[float, float], ...]:
    """The run of consecutive high blocks (``_is_high`` against ``median``) that the completed ``blocks``
    start with, as one (start_s, end_s) run; () when the first block is not high. The last completed block is
    left to ``update_burst_runs``, which judges it next (and extends the run when it is high too).
    Consecutive means on the ``NEED_BLOCK_S`` grid: a gap in the data ends the run. Each block's total is
    read as the run reaches it (``block_totals``' float), not one per block of the window."""
    k = 0
    while (
        k < len(blocks) - 1
        and abs(blocks[k][0] - (blocks[0][0] + k * NEED_BLOCK_S)) < 1e-6
        and _is_high(float(blocks[k][1] + blocks[k][2]), median, headroom)
    ):
        k += 1
    return ((blocks[0][0], blocks[k - 1][0] + NEED_BLOCK_S),) if k > 0 else ()


def burst_hold(
    runs: tuple[tuple[float, float], ...],
    now_s: float,
    cfg: PolicyConfig,
    seen_from_s: float = math.nan,
    pauses: tuple[float, ...] = (),
) -> tuple[float, str | None]:
    """How long a scale-down window the bursts seen call for now (0 = none), and why.

    Capacity released between bursts comes back one cold start (``provision_lead_s``) after it is asked
    for, so it is worth holding while the next burst is likely to start sooner than that. With the gaps
    between the bursts seen (start of a burst − end of the one before) and τ = the time since the last burst
    ended, the empirical hazard is P(gap ≤ τ + lead | gap > τ) = #{τ < g ≤ τ + lead} / #{g > τ}. Hold
    (the window reaches back to the last burst's start, so its peak target stays) while that is at least
    ``burst_hold_probability``, or while fewer than ``burst_hold_min_gaps`` gaps are known (unknown is not
    "no burst coming") — except after a first burst preceded by at least one cold start of watched load
    without one (``seen_from_s``, the oldest remembered load block): that quiet time is a censored gap
    longer than a cold start, so the first burst is not held. A first run that starts with the history (the
    pool was first seen in it, see ``leading_run``) is known only in part: it is held as a burst, but the gap
    after it is not counted (with one gap, the hazard falls to 0 as soon as τ outlasts it, so one censored
    run would release the next burst's capacity at once). Nor is a gap across one of ``pauses`` (the seams
    ``resume_history`` left where an idle pause was cut out). Never more than ``burst_hold_max_s`` after
    the burst, never without a burst seen, and not after a high load that lasted one cold start or more (a
    level change, which cold capacity follows: a slow ramp or a sinusoid's crest is not a burst). Unless
    ``burst_hold_rebuy``, a hold once let go (the hazard below the threshold at some τ' < τ on a 5-s grid, from
    ``scale_down_delay_s`` on: before that the ordinary window still keeps the burst's targets, so a dip there
    releases nothing) is not taken up again before the next burst: the window would reach back to the burst's
    peak and start cold capacity for a burst that, by the same estimate, was not worth keeping warm before."""
    if cfg.burst_hold == "off" or not runs:
        return 0.0, None
    last_start, last_end = runs[-1]
    tau = max(now_s - last_end, 0.0)
    lead = cfg.provision_lead_s
    if tau >= cfg.burst_hold_max_s or last_end - last_start >= lead:
        return 0.0, None  # a high load that lasted a cold start is a level cold capacity follows, not a burst
    pairs = list(itertools.pairwise(runs))
    quiet_before = runs[0][0] - seen_from_s  # NaN when unknown
    if quiet_before <= 1e-9:
        pairs = pairs[1:]  # the first run starts with the history (``leading_run``): its gap is not counted
    # nor is a gap across a pause (``resume_history``): a silence, not the time between two bursts
    gaps = np.asarray(
        [b[0] - a[1] for a, b in pairs if not any(a[1] <= t <= b[0] for t in pauses)], dtype=np.float64
    )
    if len(gaps) == 0 and quiet_before >= lead:
        # No gap between bursts yet, but the load was watched for at least one cold start before the first
        # burst without one: bursts are not known to come faster than capacity can be started again.
        return 0.0, None
    window = min(now_s - last_start, cfg.burst_hold_max_s + (last_end - last_start))
    if len(gaps) < cfg.burst_hold_min_gaps:
        return (
            window,
            f"burst hold: {len(gaps)} gaps between bursts seen (too few to release), {tau:.0f} s since",
        )
    p = gap_hazard(gaps, tau, lead)
    if p < cfg.burst_hold_probability:
        return 0.0, None
    if not cfg.burst_hold_rebuy:
        # The scale-down window keeps the burst's targets for scale_down_delay_s after it anyway: a dip of the
        # hazard inside that releases nothing, so only a dip after it is a release.
        grid = np.arange(cfg.scale_down_delay_s, tau, NEED_BLOCK_S)
        if grid.size and float(gap_hazards(gaps, grid, lead).min()) < cfg.burst_hold_probability:
            return 0.0, None  # released since the burst: holding again would re-buy it cold
    return window, (
        f"burst hold: P(next burst within {lead:.0f} s | {tau:.0f} s since the last) = {p:.2f}"
        f" over {len(gaps)} gaps → scale-down window {window:.0f} s"
    )


def gap_hazards(gaps: np.ndarray, taus: np.ndarray, lead: float) -> np.ndarray:
    """The empirical P(gap <= τ + lead | gap > τ) over the gaps seen, for each τ in ``taus``:
    #{τ < g <= τ + lead} / #{g > τ}; 0 where no gap outlasts τ (the burst pattern seen says none is coming)."""
    alive = gaps[None, :] > taus[:, None]
    soon = alive & (gaps[None, :] <= taus[:, None] + lead)
    n_alive = alive.sum(axis=1)
    return np.where(n_alive > 0, soon.sum(axis=1) / np.maximum(n_alive, 1), 0.0)


def gap_hazard(gaps: np.ndarray, tau: float, lead: float) -> float:
    """``gap_hazards`` at one τ."""
    return float(gap_hazards(gaps, np.asarray([tau], dtype=np.float64), lead)[0])


def _is_high(need: float, median: float, headroom: float) -> bool:
    return need > max((1 + headroom) * median, median + 1.0)


USUAL_OUTPUT_HALFLIFE_S = 600.0  # the usual output length: an EWMA of the mean output over ~10 minutes
USUAL_OUTPUT_MIN_WEIGHT = 0.25  # and known once its readings weigh this much (~250 s of them)


def usual_output(
    usual: tuple[float, float, float], now_s: float, mean_output: float
) -> tuple[float, float, float]:
    """``PoolState.output_usual`` (last reading's time, EWMA total, weight) with this tick's mean output length
    folded in: an EWMA over ``USUAL_OUTPUT_HALFLIFE_S`` of time (not ticks), read as total ÷ weight (the
    readings' weighted mean, not pulled to a start value; ``RateTracker``'s form). An unknown reading changes
    nothing; the first one only starts the clock."""
    last_s, total, weight = usual
    if not (_known(mean_output) and mean_output >= 0):
        return usual
    if not math.isfinite(last_s):
        return (now_s, 0.0, 0.0)
    if now_s <= last_s:
        return usual
    a = 1.0 - 0.5 ** ((now_s - last_s) / USUAL_OUTPUT_HALFLIFE_S)
    return (now_s, total + a * (mean_output - total), weight + a * (1.0 - weight))


LENGTH_RISE_MIN_DECODE = 0.25  # a length rise moves decode's need by at least this many instances


def length_rise(
    mean_output: float,
    usual: tuple[float, float, float],
    headroom: float,
    gen_tps: float,
    cap: PoolCapacity,
) -> bool:
    """Whether the pool's mean output length (about a minute's EWMA, ``LengthTracker``) stands above
    (1 + ``headroom``) × its usual (``usual_output``, ~10 minutes; known once its readings weigh
    ``USUAL_OUTPUT_MIN_WEIGHT``), by enough to move decode's need by ``LENGTH_RISE_MIN_DECODE`` instances
    (the share of the measured generation ``gen_tps`` above the usual length, ÷ one instance's ``decode_tps``;
    the per-tick arrivals' Poisson noise made the test flicker, and the cold-start wait keeps a flickered
    tick's low target for 30 s): a rise of decode's need per request
    (longer outputs), which an arrival burst is not (the per-arrival ratio is exact when generation follows
    arrivals, and dips, not rises, while a burst's requests are still decoding). The margin in instances keeps
    out the noise of short outputs (Azure code: 14 → 21 tokens, +50 %, a few hundredths of an instance).
    False while unknown (``PolicyConfig.decode_length_rise``)."""
    _, total, weight = usual
    known = (mean_output, total, gen_tps)
    if not (all(_known(v) for v in known) and weight >= USUAL_OUTPUT_MIN_WEIGHT):
        return False
    base = total / weight
    if not mean_output > (1 + headroom) * base:
        return False
    extra = gen_tps * (1.0 - base / mean_output) * cap.correction / cap.decode_tps
    return extra >= LENGTH_RISE_MIN_DECODE


def short_burst(
    runs: tuple[tuple[float, float], ...],
    blocks: tuple[tuple[float, float, float, int], ...],
    now_s: float,
    cfg: PolicyConfig,
    median: BlockMedian = BlockMedian(),
) -> tuple[bool, str | None]:
    """Whether the load is now in a burst that, by the durations of the bursts seen, will most likely be over
    before capacity started now serves (``short_burst_cap``): P(duration > d + lead | duration > d) below
    ``burst_hold_probability``, d = how long this one has lasted. Never once it has lasted a cold start: that
    is a level cold capacity follows, not a burst (``burst_hold``'s rule; without it the 1800-s sinusoid's first
    rise, longer than the few short bursts seen, read P = 0 and was capped for minutes). The current block is
    judged by its mean so far against the window's median block, as ``update_burst_runs`` judges completed ones.
    A run that starts with the history is not counted: its duration is only a lower bound (``burst_hold``).
    ``median``: a ``block_median`` cache (``PoolState.block_median``), read where it holds these blocks."""
    if blocks and runs and runs[0][0] <= blocks[0][0] + 1e-9:
        runs = runs[1:]  # cut by the start of the history: its duration is a lower bound (see burst_hold)
    if not cfg.short_burst_cap or len(blocks) < 2 or len(runs) < cfg.burst_hold_min_gaps + 1:
        return False, None
    start = blocks[-1][0]
    if not _is_high(blocks[-1][1] + blocks[-1][2], block_median(blocks[:-1], median)[0], cfg.headroom):
        return False, None
    began = runs[-1][0] if runs[-1][1] >= start - 1e-9 else start
    lasted = now_s - began
    if lasted >= cfg.provision_lead_s:
        return False, None  # a high load that lasted a cold start is a level, as burst_hold judges it
    durations = np.asarray([b - a for a, b in runs if b < start - 1e-9], dtype=np.float64)
    alive = durations > lasted
    if not alive.any() and len(durations) < cfg.short_burst_unseen_below:
        return False, None  # longer than each of the few bursts seen: no evidence that it is short
    lead = cfg.provision_lead_s
    p = float((durations[alive] > lasted + lead).sum() / alive.sum()) if alive.any() else 0.0
    if p >= cfg.burst_hold_probability:
        return False, None
    return True, (
        f"short burst: P(lasts {lead:.0f} s more | {lasted:.0f} s so far) = {p:.2f} over {len(durations)}"
        " bursts → no cold capacity for it"
    )
