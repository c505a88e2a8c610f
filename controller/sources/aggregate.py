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


def _deltas(prev: InstanceSamples | None, prev_index: dict[str, int], cur: InstanceSamples) -> _Deltas:
    n = len(cur.instance_ids)
    rows = np.array([prev_index.get(iid, -1) for iid in cur.instance_ids], dtype=np.int64)
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
        return Histogram(h.bounds_s, np.where(d.min(axis=1, keepdims=True) < 0, h.counts, d), h.sums)

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


def _rate(values: np.ndarray, dt_s: float) -> float:
    if not math.isfinite(dt_s) or dt_s <= 0 or np.isnan(values).any():
        return math.nan
    return float(values.sum() / dt_s)


def _quantiles(h: Histogram | None, mask: np.ndarray) -> tuple[float, float]:
    if h is None:
        return math.nan, math.nan
    summed = h.counts[mask].sum(axis=0)
    return histogram_quantile(0.5, h.bounds_s, summed), histogram_quantile(0.9, h.bounds_s, summed)


@dataclass(frozen=True)
class _Masks:
    """Per-instance selections of one scrape that do not depend on the pool: computed once per scrape, not
    once per pool (with many pools the per-pool string comparisons were a fifth of a tick)."""

    pools: np.ndarray  # object array of pool names
    roles: np.ndarray
    states: np.ndarray
    serving: np.ndarray  # bool: active or draining
    prompt_role: np.ndarray  # bool: prefill or mixed (where requests enter a pool)
    decode_role: np.ndarray  # bool: decode or mixed

    @classmethod
    def of(cls, cur: InstanceSamples) -> _Masks:
        roles = np.array(cur.roles, dtype=object)
        states = np.array(cur.states, dtype=object)
        return cls(
            pools=np.array(cur.pools, dtype=object),
            roles=roles,
            states=states,
            serving=np.isin(states, SERVING_STATES),
            prompt_role=np.isin(roles, ("prefill", "mixed")),
            decode_role=np.isin(roles, ("decode", "mixed")),
        )


def _pool_load(pool: str, cur: InstanceSamples, d: _Deltas, complete: bool, m: _Masks) -> PoolLoad:
    in_pool = m.pools == pool
    serving = in_pool & m.serving
    counts: dict[str, dict[str, int]] = {}
    # pairs counted in C (Counter keeps first appearance, so the dicts' order is the loop's)
    pairs = zip(m.roles[in_pool].tolist(), m.states[in_pool].tolist(), strict=True)
    for (role, state), k in Counter(pairs).items():
        per_role = counts.setdefault(str(role), {})
        per_role[str(state)] = per_role.get(str(state), 0) + k

    def gauge_sum(metric: str, sel: np.ndarray) -> float:
        g = cur.gauges.get(metric)
        return float(g[sel].sum()) if g is not None else math.nan

    kv = cur.gauges.get(names.KV_CACHE_USAGE_PERC)
    kv_sel = serving & m.decode_role
    prompt_sel = in_pool & m.prompt_role
    decode_sel = in_pool & m.decode_role
    # A P/D request is routed twice (to a prefill, then to a decode instance): arrivals are counted where
    # requests enter the pool, on prefill and mixed instances only.
    n_arrivals = float(d.arrivals[prompt_sel].sum())
    # Prompt demand as it arrives when the router exports it (pdscale:router_prompt_tokens_total); else the
    # tokens the instances processed, which flatten at their throughput while a queue builds.
    routed = d.routed_prompt[prompt_sel]
    at_arrival = bool(len(routed) and np.isfinite(routed).all())
    prompt = routed if at_arrival else d.prompt[prompt_sel]
    prompt_total = float(prompt.sum())
    ttft50, ttft90 = _quantiles(d.ttft, in_pool)
    itl50, itl90 = _quantiles(d.itl, in_pool)
    return PoolLoad(
        pool=pool,
        now_s=cur.now_s,
        counts=counts,
        arrival_rps=_rate(d.arrivals[prompt_sel], d.dt_s),
        prompt_tps=_rate(prompt, d.dt_s),
        gen_tps=_rate(d.gen[in_pool], d.dt_s),
        running=gauge_sum(names.NUM_REQUESTS_RUNNING, serving & decode_sel),
        waiting=gauge_sum(names.NUM_REQUESTS_WAITING, serving & prompt_sel),
        kv_usage=float(kv[kv_sel].mean()) if kv is not None and kv_sel.any() else math.nan,
        ttft_p50_s=ttft50,
        ttft_p90_s=ttft90,
        itl_p50_s=itl50,
        itl_p90_s=itl90,
        mean_prompt_tokens=prompt_total / n_arrivals if n_arrivals > 0 else math.nan,
        complete=complete,
        prompt_at_arrival=at_arrival,
        completion_rps=_rate(d.success[decode_sel], d.dt_s),
    )


class LoadAggregator:
    """Keeps the previous scrape and turns each new one into per-pool ``PoolLoad`` values."""

    def __init__(self) -> None:
        self._prev: InstanceSamples | None = None
        self._prev_index: dict[str, int] = {}

    def update(self, cur: InstanceSamples, pools: list[str]) -> dict[str, PoolLoad]:
        """Per-pool load since the previous scrape (rates are NaN on the first call)."""
        d = _deltas(self._prev, self._prev_index, cur)
        complete = self._prev is not None
        self._prev = cur
        self._prev_index = {iid: i for i, iid in enumerate(cur.instance_ids)}
        masks = _Masks.of(cur)
        return {pool: _pool_load(pool, cur, d, complete, masks) for pool in pools}
