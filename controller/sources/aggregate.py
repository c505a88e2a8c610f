"""From successive per-instance scrapes to per-pool load: the arithmetic every source shares.

Counters become per-second rates by differencing two scrapes (an instance seen for the first time
counts from zero; a counter that went down was reset and counts from zero again). Gauges are summed
(running, waiting) or averaged (KV usage) over the instances that serve, each over the role it describes:
running over decode and mixed instances (sequences decoding; a prefill instance's running requests are
prefilling), waiting over prefill and mixed instances (queued, not yet prefilled; a decode instance's waiting
requests are prefilled and wait for a decode slot). Histograms give quantiles by
linear interpolation inside the bucket, as Prometheus' ``histogram_quantile`` does. A value that cannot
be computed is NaN — unknown, never zero.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from serving.sim import samples as names
from serving.sim.samples import Histogram, InstanceSamples, histogram_quantile

SERVING_STATES = ("active", "draining")


@dataclass(frozen=True)
class PoolLoad:
    """One pool's measured load between two scrapes (rates per second; NaN = unknown)."""

    pool: str
    now_s: float
    counts: dict[str, dict[str, int]]  # role -> state -> instances
    arrival_rps: float
    prompt_tps: float
    gen_tps: float
    running: float  # sequences decoding: decode and mixed instances
    waiting: float  # requests queued for prefill: prefill and mixed instances
    kv_usage: float
    ttft_p50_s: float
    ttft_p90_s: float
    itl_p50_s: float
    itl_p90_s: float
    mean_prompt_tokens: float
    complete: bool
    # True when prompt_tps is the router's at-arrival counter (pdscale:router_prompt_tokens_total), not the
    # tokens the instances prefilled (which flatten at their throughput while a queue builds)
    prompt_at_arrival: bool = False
    # requests finished per second (vllm:request_success_total on decode and mixed instances; NaN: not exported)
    completion_rps: float = math.nan
    # of ``waiting``, the requests a router queues for any entry instance (pdscale:router_queue_length, added to
    # the instances' waiting by the sources); the rest wait in an instance's own queue
    router_waiting: float = 0.0
    # mean inter-token latency on the pool's serving decode (and mixed) instances since the last scrape, from
    # the ITL histogram's sum and count (exact, unlike a quantile read off its coarse buckets); NaN when no
    # gap was timed or the sum is not exported. ``itl_gaps``: how many inter-token gaps it averages
    itl_mean_s: float = math.nan
    itl_gaps: float = 0.0
    # the same per serving decode instance, for a model of each one's step (controller.latency_correction)
    decode_readings: DecodeReadings | None = None

    def channels(self) -> list[float]:
        """Values in the forecaster's CHANNELS order (forecaster.types.CHANNELS)."""
        return [
            self.arrival_rps,
            self.prompt_tps,
            self.gen_tps,
            self.running,
            self.waiting,
            self.kv_usage,
            self.ttft_p50_s,
            self.ttft_p90_s,
            self.itl_p50_s,
            self.itl_p90_s,
        ]


@dataclass(frozen=True, eq=False)
class DecodeReadings:
    """Per serving decode (or mixed) instance of a pool, aligned: inter-token gaps timed since the last
    scrape and their summed seconds (NaN: the ``_sum`` is not exported), and the running sequences and KV-cache
    usage (0..1) at the scrape (NaN: unknown)."""

    gaps: np.ndarray
    gap_s: np.ndarray
    running: np.ndarray
    kv_usage: np.ndarray


@dataclass(frozen=True)
class _Deltas:
    """Per-instance increments between two scrapes, aligned with the current scrape's instances."""

    dt_s: float
    arrivals: np.ndarray
    prompt: np.ndarray
    routed_prompt: np.ndarray  # prompt tokens counted at routing (router-side); NaN where not exported
    gen: np.ndarray
    success: np.ndarray
    ttft: Histogram | None
    itl: Histogram | None


def _deltas(prev: InstanceSamples | None, rows: np.ndarray, cur: InstanceSamples) -> _Deltas:
    """``rows``: each current instance's row in ``prev`` (-1 = not there)."""
    n = len(cur.instance_ids)
    seen = rows >= 0
    safe = np.maximum(rows, 0)

    def counter(metric: str) -> np.ndarray:
        now = cur.counters.get(metric)
        if now is None or prev is None or metric not in prev.counters:
            return np.full(n, np.nan)
        before = np.where(seen, prev.counters[metric][safe] if len(prev.instance_ids) else 0.0, 0.0)
        d = now - before
        return np.where(d < 0, now, d)  # a counter that went down was reset: count from zero

    def hist(metric: str) -> Histogram | None:
        h = cur.histograms.get(metric)
        if h is None or prev is None or metric not in prev.histograms or not len(prev.instance_ids):
            return None
        before = np.where(seen[:, None], prev.histograms[metric].counts[safe], 0)
        d = h.counts - before
        reset = d.min(axis=1) < 0  # a histogram that went down was reset: count from zero
        sums_before = np.where(seen, prev.histograms[metric].sums[safe], 0.0)
        return Histogram(
            h.bounds_s, np.where(reset[:, None], h.counts, d), np.where(reset, h.sums, h.sums - sums_before)
        )

    return _Deltas(
        dt_s=cur.now_s - prev.now_s if prev is not None else math.nan,
        arrivals=counter(names.ROUTER_REQUESTS_TOTAL),
        prompt=counter(names.PROMPT_TOKENS_TOTAL),
        routed_prompt=counter(names.ROUTER_PROMPT_TOKENS_TOTAL),
        gen=counter(names.GENERATION_TOKENS_TOTAL),
        success=counter(names.REQUEST_SUCCESS_TOTAL),
        ttft=hist(names.TIME_TO_FIRST_TOKEN_SECONDS),
        itl=hist(names.INTER_TOKEN_LATENCY_SECONDS),
    )


def _rate(total: float, dt_s: float) -> float:
    """A sum of increments (``float(values.sum())``) as a per-second rate: NaN when ``dt_s`` is not a usable
    interval or an increment is NaN (then so is the sum; a NaN sum of no NaN, inf - inf, is NaN either way)."""
    if not math.isfinite(dt_s) or dt_s <= 0 or math.isnan(total):
        return math.nan
    return total / dt_s


def _quantiles(h: Histogram | None, mask: np.ndarray) -> tuple[float, float]:
    if h is None:
        return math.nan, math.nan
    summed = h.counts[mask].sum(axis=0)
    return histogram_quantile(0.5, h.bounds_s, summed), histogram_quantile(0.9, h.bounds_s, summed)


def _mean(h: Histogram | None, rows: np.ndarray) -> tuple[float, float]:
    """The mean observation of the histogram deltas over ``rows`` (their summed sum over their summed count) and
    that count; NaN (and the count) when nothing was observed or a sum is unknown (a source that does not read
    the ``_sum`` series leaves them NaN)."""
    if h is None or not len(rows):
        return math.nan, 0.0
    n = float(h.counts[rows, -1].sum())
    total = float(h.sums[rows].sum())
    if n <= 0 or not math.isfinite(total) or total < 0:
        return math.nan, n
    return total / n, n


@dataclass(frozen=True)
class _PoolRows:
    """One pool's instances in a scrape as index arrays: the elements a boolean mask selects, in its order,
    so a sum over them is the mask's sum to the bit, without a pass over the whole fleet per pool."""

    in_pool: np.ndarray
    prompt: np.ndarray  # prefill or mixed: where requests enter the pool
    decode: np.ndarray  # decode or mixed
    serving_decode: np.ndarray  # active or draining, decode or mixed
    serving_prompt: np.ndarray  # active or draining, prefill or mixed
    counts: dict[str, dict[str, int]]  # role -> state -> instances (first appearance order)


class _Layout:
    """What a scrape's instance tuples (ids, pools, roles, states) determine: the id → row index and each
    pool's rows. Successive scrapes of an unchanged fleet share it (with many pools, the per-pool passes over
    every instance were a fifth of a tick, then the per-scrape masks and the id index most of the rest)."""

    def __init__(self, cur: InstanceSamples) -> None:
        self.key = (tuple(cur.instance_ids), tuple(cur.pools), tuple(cur.roles), tuple(cur.states))
        self.index = {iid: i for i, iid in enumerate(self.key[0])}
        self.all_rows = np.arange(len(self.key[0]), dtype=np.int64)
        self._pools: np.ndarray | None = None
        self._masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._by_pool: dict[str, _PoolRows] = {}

    def same(self, cur: InstanceSamples) -> bool:
        ids, pools, roles, states = self.key
        return (
            tuple(cur.instance_ids) == ids
            and tuple(cur.pools) == pools
            and tuple(cur.roles) == roles
            and tuple(cur.states) == states
        )

    def rows_in(self, prev: _Layout | None) -> np.ndarray:
        """Each instance's row in the scrape ``prev`` describes (-1 = not there)."""
        if prev is self and len(self.index) == len(self.all_rows):  # no duplicate id: row i is row i
            return self.all_rows
        index = prev.index if prev is not None else {}
        return np.array([index.get(iid, -1) for iid in self.key[0]], dtype=np.int64)

    def pool(self, pool: str) -> _PoolRows:
        rows = self._by_pool.get(pool)
        if rows is None:
            rows = self._by_pool[pool] = self._pool_rows(pool)
        return rows

    def _pool_rows(self, pool: str) -> _PoolRows:
        _, _, roles, states = self.key
        if self._pools is None or self._masks is None:
            self._pools = np.array(self.key[1], dtype=object)
            role_arr = np.array(roles, dtype=object)
            self._masks = (
                np.isin(np.array(states, dtype=object), SERVING_STATES),
                np.isin(role_arr, ("prefill", "mixed")),
                np.isin(role_arr, ("decode", "mixed")),
            )
        serving_all, prompt_role, decode_role = self._masks
        in_pool = self._pools == pool
        serving = in_pool & serving_all
        counts: dict[str, dict[str, int]] = {}
        # pairs counted in C (Counter keeps first appearance, so the dicts' order is the loop's)
        members = np.flatnonzero(in_pool).tolist()
        for (role, state), k in Counter((roles[i], states[i]) for i in members).items():
            per_role = counts.setdefault(str(role), {})
            per_role[str(state)] = per_role.get(str(state), 0) + k
        return _PoolRows(
            in_pool=np.flatnonzero(in_pool),
            prompt=np.flatnonzero(in_pool & prompt_role),
            decode=np.flatnonzero(in_pool & decode_role),
            serving_decode=np.flatnonzero(serving & decode_role),
            serving_prompt=np.flatnonzero(serving & prompt_role),
            counts=counts,
        )


def _pool_load(pool: str, cur: InstanceSamples, d: _Deltas, complete: bool, rows: _PoolRows) -> PoolLoad:
    def gauge_sum(metric: str, sel: np.ndarray) -> float:
        g = cur.gauges.get(metric)
        return float(g[sel].sum()) if g is not None else math.nan

    kv = cur.gauges.get(names.KV_CACHE_USAGE_PERC)
    prompt_sel = rows.prompt
    # A P/D request is routed twice (to a prefill, then to a decode instance): arrivals are counted where
    # requests enter the pool, on prefill and mixed instances only.
    n_arrivals = float(d.arrivals[prompt_sel].sum())
    # Prompt demand as it arrives when the router exports it (pdscale:router_prompt_tokens_total); else the
    # tokens the instances processed, which flatten at their throughput while a queue builds.
    routed = d.routed_prompt[prompt_sel]
    at_arrival = bool(len(routed) and np.isfinite(routed).all())
    prompt = routed if at_arrival else d.prompt[prompt_sel]
    prompt_total = float(prompt.sum())
    ttft50, ttft90 = _quantiles(d.ttft, rows.in_pool)
    itl50, itl90 = _quantiles(d.itl, rows.in_pool)
    itl_mean, itl_gaps = _mean(d.itl, rows.serving_decode)
    readings = None
    if d.itl is not None and len(rows.serving_decode):
        sel = rows.serving_decode
        run, kvs = cur.gauges.get(names.NUM_REQUESTS_RUNNING), kv
        readings = DecodeReadings(
            gaps=d.itl.counts[sel, -1].astype(np.float64),
            gap_s=d.itl.sums[sel],
            running=run[sel] if run is not None else np.full(len(sel), np.nan),
            kv_usage=kvs[sel] if kvs is not None else np.full(len(sel), np.nan),
        )
    return PoolLoad(
        pool=pool,
        now_s=cur.now_s,
        counts={role: dict(states) for role, states in rows.counts.items()},
        arrival_rps=_rate(n_arrivals, d.dt_s),
        prompt_tps=_rate(prompt_total, d.dt_s),
        gen_tps=_rate(float(d.gen[rows.in_pool].sum()), d.dt_s),
        running=gauge_sum(names.NUM_REQUESTS_RUNNING, rows.serving_decode),
        waiting=gauge_sum(names.NUM_REQUESTS_WAITING, rows.serving_prompt),
        kv_usage=float(kv[rows.serving_decode].mean())
        if kv is not None and len(rows.serving_decode)
        else math.nan,
        ttft_p50_s=ttft50,
        ttft_p90_s=ttft90,
        itl_p50_s=itl50,
        itl_p90_s=itl90,
        mean_prompt_tokens=prompt_total / n_arrivals if n_arrivals > 0 else math.nan,
        complete=complete,
        prompt_at_arrival=at_arrival,
        completion_rps=_rate(float(d.success[rows.decode].sum()), d.dt_s),
        router_waiting=gauge_sum(names.ROUTER_QUEUE_SHARE, rows.serving_prompt)
        if names.ROUTER_QUEUE_SHARE in cur.gauges
        else 0.0,
        itl_mean_s=itl_mean,
        itl_gaps=itl_gaps,
        decode_readings=readings,
    )


class LoadAggregator:
    """Keeps the previous scrape and turns each new one into per-pool ``PoolLoad`` values."""

    def __init__(self) -> None:
        self._prev: InstanceSamples | None = None
        self._layout: _Layout | None = None  # the previous scrape's

    def update(self, cur: InstanceSamples, pools: list[str]) -> dict[str, PoolLoad]:
        """Per-pool load since the previous scrape (rates are NaN on the first call)."""
        prev_layout = self._layout
        layout = prev_layout if prev_layout is not None and prev_layout.same(cur) else _Layout(cur)
        d = _deltas(self._prev, layout.rows_in(prev_layout), cur)
        complete = self._prev is not None
        self._prev, self._layout = cur, layout
        return {pool: _pool_load(pool, cur, d, complete, layout.pool(pool)) for pool in pools}
