"""The Prometheus source: one scrape of the whole fleet as ``InstanceSamples``, and per-pool history.

``PrometheusSource.scrape(now_s)`` answers the same type as the simulator's ``observe()``, so
``controller.sources.aggregate.LoadAggregator`` turns either into per-pool load. It sends one instant query
per metric for the whole fleet (never one per instance) and accepts both spellings of vLLM's names:
Prometheus 3 (or a text-format scrape) keeps ``vllm:x``; Prometheus 2 scraping OpenMetrics from
``prometheus_client`` >= 0.23 stores ``vllm_x``. Counters may come with or without ``_total``.

Unknown is not zero: an instance without a series of some metric gets NaN there; a series whose labels do
not say which instance/pool/role it is is counted in ``stats().unmapped`` and logged, never dropped
silently and never turned into a zero. Prometheus down or too slow raises ``SourceUnavailable`` (temporary:
the daemon's error boundary counts it and keeps the current scale).

``history(start_s, end_s, step_s)`` reads per-pool channels (``forecaster.types.CHANNELS``) with range
queries cut into chunks of at most ``max_points`` steps (Prometheus refuses more than 11,000 points per
series per query); ``query_range_chunked`` is the reusable part.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from controller.settings import ROLE_VALUES, LabelMap, PrometheusSettings
from forecaster.types import CHANNELS, MetricFrame
from serving.sim import samples as names
from serving.sim.samples import Histogram, InstanceSamples

log = logging.getLogger(__name__)

MAX_POINTS_PER_QUERY = 10_000  # Prometheus' limit is 11,000 per series per query; keep clear of the edge
DEFAULT_RETRY_AFTER_S = 1.0

# canonical name -> the PromQL regex on __name__ that matches every spelling of it
GAUGES: dict[str, str] = {
    names.NUM_REQUESTS_RUNNING: "vllm[:_]num_requests_running",
    names.NUM_REQUESTS_WAITING: "vllm[:_]num_requests_waiting",
    names.KV_CACHE_USAGE_PERC: "vllm[:_]kv_cache_usage_perc",
}
COUNTERS: dict[str, str] = {
    names.PROMPT_TOKENS_TOTAL: "vllm[:_]prompt_tokens(_total)?",
    names.GENERATION_TOKENS_TOTAL: "vllm[:_]generation_tokens(_total)?",
    names.NUM_PREEMPTIONS_TOTAL: "vllm[:_]num_preemptions(_total)?",
    names.REQUEST_SUCCESS_TOTAL: "vllm[:_]request_success(_total)?",  # finished requests (all reasons)
    names.ROUTER_REQUESTS_TOTAL: "pdscale[:_]router_requests(_total)?",
    names.ROUTER_PROMPT_TOKENS_TOTAL: "pdscale[:_]router_prompt_tokens(_total)?",
    names.ROUTER_DISPATCHED_TOTAL: "pdscale[:_]router_dispatched(_total)?",
}
# the router's queues, per pool (its `pool` label) and stage: requests not yet sent to any instance
ROUTER_QUEUE = "pdscale[:_]router_queue_length"
ENTRY_STAGES = ("prefill", "mixed")  # where requests enter a pool: their router queue is waiting demand
HISTOGRAMS: dict[str, str] = {
    names.TIME_TO_FIRST_TOKEN_SECONDS: "vllm[:_]time_to_first_token_seconds_bucket",
    names.INTER_TOKEN_LATENCY_SECONDS: "vllm[:_]inter_token_latency_seconds_bucket",
}
# histograms whose ``_sum`` is read too (one more query each): the ITL's mean is what the latency correction
# compares with the latency model (``controller.latency_correction``); a quantile off its coarse buckets is not
HISTOGRAM_SUMS: dict[str, str] = {
    names.INTER_TOKEN_LATENCY_SECONDS: "vllm[:_]inter_token_latency_seconds_sum",
}
_MEAN_GAUGES = frozenset({names.KV_CACHE_USAGE_PERC})
# the router's per-backend counters: optional (absent = no router), and attributed only to instances the
# vLLM series name (a router scraped as its own target would otherwise read as one more instance)
_ROUTER_COUNTERS = frozenset(
    {names.ROUTER_REQUESTS_TOTAL, names.ROUTER_PROMPT_TOKENS_TOTAL, names.ROUTER_DISPATCHED_TOTAL}
)
_HTTP_CODE = re.compile(r"HTTP Status Code (\d{3})")


class SourceError(RuntimeError):
    """The source cannot answer and retrying will not help (a rejected query, a malformed answer)."""


class SourceUnavailable(SourceError):
    """Prometheus is down, overloaded or too slow: temporary; try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PrometheusQuerier(Protocol):
    """The two calls this module needs from a Prometheus client (``PrometheusConnect`` fits)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None, timeout: Any = None) -> Any: ...

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
        timeout: Any = None,
    ) -> Any: ...


@dataclass(frozen=True)
class SourceStats:
    """Counters of the source since it was made (export them as the daemon's own metrics)."""

    scrapes: int = 0
    failures: int = 0
    unmapped: Mapping[str, int] = field(default_factory=dict)  # metric -> series whose labels did not map
    spelling_conflicts: int = 0  # instance-metric pairs seen under two spellings (the canonical one won)


@dataclass(frozen=True)
class _Identity:
    instance: str
    pool: str
    role: str
    node: str


def identify(labels: Mapping[str, str], label_map: LabelMap) -> _Identity | str:
    """Who a series belongs to, or why it cannot be told (a reason string)."""
    instance = labels.get(label_map.instance, "")
    if not instance:
        return f"no {label_map.instance!r} label"
    pool = labels.get(label_map.pool, "")
    if not pool and label_map.pool_fallback is not None:
        pool = labels.get(label_map.pool_fallback, "")
    if not pool:
        fallback = f" or {label_map.pool_fallback!r}" if label_map.pool_fallback else ""
        return f"no {label_map.pool!r}{fallback} label"
    role = labels.get(label_map.role, "") or "mixed"
    if role not in ROLE_VALUES:
        return f"{label_map.role}={role!r} is not one of {ROLE_VALUES}"
    node = labels.get(label_map.node, "") if label_map.node is not None else ""
    return _Identity(instance, pool, role, node or instance)


def _spelling_rank(series_name: str, canonical: str) -> int:
    """Lower wins when one instance reports a metric under two names: canonical, then colon, then other."""
    if series_name == canonical:
        return 0
    return 1 if ":" in series_name else 2


def _http_code(err: Exception) -> int | None:
    m = _HTTP_CODE.search(str(err))
    return int(m.group(1)) if m else None


class PrometheusSource:
    """Reads the fleet's vLLM metrics from Prometheus (see the module docstring).

    ``timeout_s`` bounds a whole ``scrape`` (every query shares one deadline); ``clock`` is a monotonic
    clock for that deadline (inject one in tests). ``querier`` replaces the HTTP client (tests, or a client
    configured elsewhere); otherwise a ``PrometheusConnect`` with no retries is built for ``url``.
    """

    def __init__(
        self,
        url: str,
        *,
        labels: LabelMap | None = None,
        timeout_s: float = 2.0,
        bearer_token: str | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        max_points: int = MAX_POINTS_PER_QUERY,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        querier: PrometheusQuerier | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"PrometheusSource.timeout_s must be a positive number, got {timeout_s!r}")
        if not 1 <= max_points <= 11_000:
            raise ValueError(f"PrometheusSource.max_points must be in [1, 11000], got {max_points}")
        self.url = url.rstrip("/")
        self.labels = labels if labels is not None else LabelMap()
        self.timeout_s = timeout_s
        self.max_points = max_points
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._client = querier if querier is not None else _connect(self.url, bearer_token, ca_file, insecure)
        self._scrapes = 0
        self._failures = 0
        self._unmapped: dict[str, int] = {}
        self._spelling_conflicts = 0

    @classmethod
    def from_settings(cls, settings: PrometheusSettings, **kwargs: Any) -> PrometheusSource:
        """Build from validated settings (the bearer token is read from its file here)."""
        token = settings.bearer_token_file.read_text().strip() if settings.bearer_token_file else None
        return cls(
            settings.url,
            labels=settings.labels,
            timeout_s=settings.timeout_s,
            bearer_token=token,
            ca_file=str(settings.ca_file) if settings.ca_file else None,
            insecure=settings.insecure,
            max_points=settings.max_points,
            **kwargs,
        )

    def stats(self) -> SourceStats:
        return SourceStats(self._scrapes, self._failures, dict(self._unmapped), self._spelling_conflicts)

    # -- queries ---------------------------------------------------------------------------------

    def _call(self, what: str, deadline: float, fn: Callable[[float], Any]) -> Any:
        """Run one HTTP call with what is left of the deadline; map failures to the source's errors."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        left = deadline - self._clock()
        if left <= 0:
            raise SourceUnavailable(
                f"Prometheus at {self.url}: no time left for {what} (timeout_s={self.timeout_s})",
                self.retry_after_s,
            )
        try:
            return fn(left)
        except requests.exceptions.Timeout as err:
            raise SourceUnavailable(
                f"Prometheus at {self.url} did not answer {what} within {left:.2f} s", self.retry_after_s
            ) from err
        except requests.exceptions.ConnectionError as err:
            raise SourceUnavailable(
                f"Prometheus at {self.url} unreachable ({what}): {err}", self.retry_after_s
            ) from err
        except PrometheusApiClientException as err:
            code = _http_code(err)
            if code is not None and (code >= 500 or code == 429):
                raise SourceUnavailable(
                    f"Prometheus at {self.url} answered {what}: {err}", self.retry_after_s
                ) from err
            raise SourceError(f"Prometheus at {self.url} rejected {what}: {err}") from err
        except (ValueError, KeyError, TypeError) as err:  # JSON that is not a Prometheus answer
            raise SourceError(f"Prometheus at {self.url}: malformed answer to {what}: {err!r}") from err

    def _instant(self, promql: str, now_s: float, deadline: float) -> list[dict[str, Any]]:
        def run(left: float) -> Any:
            params = {"time": f"{now_s:.3f}", "timeout": _duration(left)}
            return self._client.custom_query(promql, params=params, timeout=(left, left))

        result = self._call(f"query {promql!r}", deadline, run)
        if not isinstance(result, list):
            raise SourceError(
                f"Prometheus at {self.url}: query {promql!r} did not return a vector: {result!r}"
            )
        return result

    def _note_unmapped(
        self, metric: str, reason: str, labels: Mapping[str, str], tally: dict[str, int]
    ) -> None:
        self._unmapped[metric] = self._unmapped.get(metric, 0) + 1
        if metric not in tally:
            log.warning(
                "prometheus source: %s series %s has %s; counted as unmapped", metric, dict(labels), reason
            )
        tally[metric] = tally.get(metric, 0) + 1

    # -- scrape ----------------------------------------------------------------------------------

    def scrape(self, now_s: float) -> InstanceSamples:
        """Every instance Prometheus knows at ``now_s`` (Unix seconds), all ``active``; NaN where missing."""
        self._scrapes += 1
        deadline = self._clock() + self.timeout_s
        try:
            try:
                return self._scrape(now_s, deadline)
            # a vector whose rows are not samples (no "metric"/"value", a value that is not a number)
            except (KeyError, IndexError, TypeError, ValueError) as err:
                raise SourceError(
                    f"Prometheus at {self.url}: malformed instant-query answer: {err!r}"
                ) from err
        except SourceError:
            self._failures += 1
            raise

    def _scrape(self, now_s: float, deadline: float) -> InstanceSamples:
        who: dict[str, _Identity] = {}
        tally: dict[str, int] = {}
        scalar: dict[str, dict[str, float]] = {}  # metric -> instance -> value
        buckets: dict[str, dict[str, dict[float, float]]] = {}  # metric -> instance -> le -> count
        for metric, regex in (*GAUGES.items(), *COUNTERS.items()):
            rows = self._instant(f'{{__name__=~"{regex}"}}', now_s, deadline)
            scalar[metric] = self._per_instance(metric, rows, who, tally)
        for metric, regex in HISTOGRAMS.items():
            rows = self._instant(f'{{__name__=~"{regex}"}}', now_s, deadline)
            buckets[metric] = self._buckets(metric, rows, who, tally)
        sums: dict[str, dict[str, float]] = {}  # metric -> instance -> sum of observations
        for metric, regex in HISTOGRAM_SUMS.items():
            rows = self._instant(f'{{__name__=~"{regex}"}}', now_s, deadline)
            sums[metric] = self._per_instance(metric + "_sum", rows, who, tally)
        queues = self._router_queues(self._instant(f'{{__name__=~"{ROUTER_QUEUE}"}}', now_s, deadline), tally)
        if tally:
            log.warning("prometheus source: unmapped series this scrape: %s", tally)
        ids = tuple(sorted(who))
        n = len(ids)
        gauges: dict[str, np.ndarray] = {}
        counters: dict[str, np.ndarray] = {}
        for metric, per in scalar.items():
            if not per and metric in _ROUTER_COUNTERS:
                continue  # the router's counters are optional: absent means "not deployed", left out (NaN rates)
            arr = np.array([per.get(i, math.nan) for i in ids], dtype=np.float64).reshape(n)
            (gauges if metric in GAUGES else counters)[metric] = arr
        histograms = {m: _histogram(per, ids, sums.get(m)) for m, per in buckets.items() if per}
        samples = InstanceSamples(
            now_s=now_s,
            instance_ids=ids,
            pools=tuple(who[i].pool for i in ids),
            roles=tuple(who[i].role for i in ids),
            nodes=tuple(who[i].node for i in ids),
            states=("active",) * n,  # Prometheus sees serving instances only; the actuator supplies the rest
            gauges=gauges,
            counters=counters,
            histograms=histograms,
        )
        samples, unplaced = add_router_queues(samples, queues)
        for pool, left in unplaced.items():
            if left > 0:
                log.warning("prometheus source: pool %s: %g requests queued at the router not counted: no"
                            " prefill or mixed instance (or no waiting gauge) to count them on", pool, left,
                            extra={"event": "router_backlog_unplaced"})  # fmt: skip
        return samples

    def _router_queues(
        self, rows: list[dict[str, Any]], tally: dict[str, int]
    ) -> dict[str, dict[str, float]]:
        """The router queues' requests per pool and stage (summed over priority classes and routers), each
        series under its best-ranked spelling; a series without a pool label is counted as unmapped."""
        metric = names.ROUTER_QUEUE_LENGTH
        best: dict[tuple[str, frozenset[tuple[str, str]]], tuple[int, float]] = {}
        for row in rows:
            labels = row["metric"]
            pool = labels.get(self.labels.pool, "")
            if not pool and self.labels.pool_fallback is not None:
                pool = labels.get(self.labels.pool_fallback, "")
            if not pool:
                self._note_unmapped(
                    metric, f"no {self.labels.pool!r} label (name the router's pool)", labels, tally
                )
                continue
            key = (pool, frozenset((k, v) for k, v in labels.items() if k != "__name__"))
            rank = _spelling_rank(labels.get("__name__", ""), metric)
            value = float(row["value"][1])
            have = best.get(key)
            if have is not None and have[0] != rank:
                self._spelling_conflicts += 1
            if have is None or rank < have[0]:
                best[key] = (rank, value)
        out: dict[str, dict[str, float]] = {}
        for (pool, labelset), (_, value) in best.items():
            stage = dict(labelset).get("stage", "")
            if math.isfinite(value):
                per = out.setdefault(pool, {})
                per[stage] = per.get(stage, 0.0) + value
        return out

    def _per_instance(
        self, metric: str, rows: list[dict[str, Any]], who: dict[str, _Identity], tally: dict[str, int]
    ) -> dict[str, float]:
        """Per instance: the sum (mean for KV usage) of its series under its best-ranked spelling."""
        best: dict[str, tuple[int, list[float]]] = {}
        conflicted: set[str] = set()
        for row in rows:
            labels = row["metric"]
            ident = identify(labels, self.labels)
            if isinstance(ident, str):
                self._note_unmapped(metric, ident, labels, tally)
                continue
            if metric in _ROUTER_COUNTERS and ident.instance not in who:
                self._note_unmapped(
                    metric, f"instance {ident.instance!r}, named by no vLLM series", labels, tally
                )
                continue
            who.setdefault(ident.instance, ident)
            rank = _spelling_rank(labels.get("__name__", ""), metric)
            value = float(row["value"][1])
            have = best.get(ident.instance)
            if have is None or rank < have[0]:
                if have is not None:
                    conflicted.add(ident.instance)
                best[ident.instance] = (rank, [value])
            elif rank == have[0]:
                have[1].append(value)
            else:
                conflicted.add(ident.instance)
        self._spelling_conflicts += len(conflicted)
        mean = metric in _MEAN_GAUGES
        return {i: (sum(v) / len(v) if mean else sum(v)) for i, (_, v) in best.items()}

    def _buckets(
        self, metric: str, rows: list[dict[str, Any]], who: dict[str, _Identity], tally: dict[str, int]
    ) -> dict[str, dict[float, float]]:
        best: dict[str, tuple[int, dict[float, float]]] = {}
        for row in rows:
            labels = row["metric"]
            ident = identify(labels, self.labels)
            le_text = labels.get("le")
            if isinstance(ident, str) or le_text is None:
                self._note_unmapped(
                    metric, ident if isinstance(ident, str) else "no 'le' label", labels, tally
                )
                continue
            who.setdefault(ident.instance, ident)
            rank = _spelling_rank(labels.get("__name__", ""), metric + "_bucket")
            have = best.get(ident.instance)
            if have is None or rank < have[0]:
                have = best[ident.instance] = (rank, {})
            if rank == have[0]:
                le = float(le_text)
                have[1][le] = have[1].get(le, 0.0) + float(row["value"][1])
        return {i: b for i, (_, b) in best.items()}

    # -- history ---------------------------------------------------------------------------------

    def history(
        self,
        start_s: float,
        end_s: float,
        step_s: float,
        *,
        rate_window_s: float | None = None,
        timeout_s: float = 60.0,
    ) -> MetricFrame:
        """Per-pool channels (``forecaster.types.CHANNELS``) at ``start_s + k * step_s`` up to ``end_s``.

        Node ids of the frame are pool names. Rates use ``rate()`` over ``rate_window_s`` (default
        ``max(4 * step_s, 4 s)``: at least two scrapes at the usual 1-2 s intervals); the channels mean what
        the live scrape's ``PoolLoad`` means (the forecaster is warmed on what it will then be stepped with):
        running is summed over the pool's decode and mixed instances, waiting over its prefill and mixed
        instances plus the requests its router queues for those stages (``pdscale:router_queue_length``,
        one range query for the fleet, either spelling; a step without a router series adds nothing, a
        step whose servers' waiting is unknown stays unknown), KV usage is averaged over its decode/mixed
        instances, latency quantiles come from ``histogram_quantile`` over the pool's summed bucket rates. A
        step without data is NaN.
        """
        window_s = rate_window_s if rate_window_s is not None else max(4.0 * step_s, 4.0)
        per_channel: dict[str, dict[str, np.ndarray]] = {}
        n_steps = _n_steps(start_s, end_s, step_s)
        for channel, promql in channel_queries(self.labels, window_s).items():
            series = query_range_chunked(
                self._range_call(self._clock() + timeout_s),
                promql,
                start_s=start_s,
                end_s=end_s,
                step_s=step_s,
                max_points=self.max_points,
            )
            per_channel[channel] = self._per_pool(series)
        pools = tuple(sorted({p for chan in per_channel.values() for p in chan}))
        values = np.full((len(pools), len(CHANNELS), n_steps), np.nan)
        for c, channel in enumerate(CHANNELS):
            for n, pool in enumerate(pools):
                got = per_channel.get(channel, {}).get(pool)
                if got is not None:
                    values[n, c, :] = got
        queued = self._per_pool(
            query_range_chunked(
                self._range_call(self._clock() + timeout_s),
                router_queue_query(self.labels),
                start_s=start_s,
                end_s=end_s,
                step_s=step_s,
                max_points=self.max_points,
            )
        )
        w = CHANNELS.index("waiting")
        for n, pool in enumerate(pools):
            queue = queued.get(pool)
            if queue is not None:  # NaN waiting + a queue stays NaN: a partial sum is not the backlog
                values[n, w, :] = np.where(np.isnan(queue), values[n, w, :], values[n, w, :] + queue)
        return MetricFrame(
            node_ids=pools,
            metrics=CHANNELS,
            times_s=start_s + step_s * np.arange(n_steps, dtype=np.float64),
            values=values,
        )

    def _range_call(self, deadline: float) -> RangeCall:
        def call(promql: str, params: dict[str, str], span: tuple[datetime, datetime]) -> Any:
            def run(left: float) -> Any:
                return self._client.custom_query_range(
                    promql,
                    start_time=span[0],
                    end_time=span[1],
                    step=params["step"],
                    params={**params, "timeout": _duration(left)},
                    timeout=(left, left),
                )

            return self._call(f"range query {promql!r}", deadline, run)

        return call

    def _per_pool(self, series: Sequence[RangeSeries]) -> dict[str, np.ndarray]:
        """Pool name -> values; a series labelled with the pool wins, the fallback label only fills gaps."""
        lm = self.labels
        out: dict[str, np.ndarray] = {}
        ranked = sorted(series, key=lambda s: lm.pool not in s.labels)
        for s in ranked:
            pool = s.labels.get(lm.pool) or (s.labels.get(lm.pool_fallback, "") if lm.pool_fallback else "")
            if not pool:
                continue
            have = out.get(pool)
            out[pool] = s.values if have is None else np.where(np.isnan(have), s.values, have)
        return out


def add_router_queues(
    samples: InstanceSamples, queues: Mapping[str, Mapping[str, float]]
) -> tuple[InstanceSamples, dict[str, float]]:
    """``samples`` with each pool's router queues (pool -> stage -> requests) of the entry stages (prefill,
    mixed) added to the waiting requests of that pool's instances of the stage, shared evenly (a stage
    without instances goes to the pool's other entry instances), and per pool the requests left unplaced
    (the pool has no entry instance, or the waiting gauge is absent). An instance whose waiting is unknown
    (NaN) stays unknown: the pool's backlog is then unknown, never a partial sum read as the whole. The shares
    added are also kept as their own gauge (``ROUTER_QUEUE_SHARE``): they wait for any instance, the rest of
    the waiting gauge for its own."""
    waiting = samples.gauges.get(names.NUM_REQUESTS_WAITING)
    unplaced: dict[str, float] = {}
    backlogs = {
        pool: {stage: n for stage in ENTRY_STAGES if (n := per.get(stage, 0.0)) > 0}
        for pool, per in queues.items()
    }
    if not any(backlogs.values()):
        return samples, unplaced
    if waiting is None:
        return samples, {pool: sum(b.values()) for pool, b in backlogs.items() if b}
    out = np.array(waiting, dtype=np.float64, copy=True)
    share = np.zeros(len(out))
    roles = np.array(samples.roles, dtype=object)
    pools = np.array(samples.pools, dtype=object)
    for pool, backlog in backlogs.items():
        in_pool = pools == pool
        for stage, n in backlog.items():
            sel = in_pool & (roles == stage)
            if not sel.any():
                sel = in_pool & np.isin(roles, ENTRY_STAGES)
            if not sel.any():
                unplaced[pool] = unplaced.get(pool, 0.0) + n
                continue
            share[sel] += n / int(sel.sum())
    out += share
    gauges = {**samples.gauges, names.NUM_REQUESTS_WAITING: out, names.ROUTER_QUEUE_SHARE: share}
    return replace(samples, gauges=gauges), unplaced


def _histogram(
    per: Mapping[str, Mapping[float, float]], ids: Sequence[str], sums: Mapping[str, float] | None = None
) -> Histogram:
    """Cumulative bucket counts on the union of bounds (+Inf last).

    An instance lacking a bound another instance has takes the count of its next lower bound (cumulative
    counts never decrease, so this is a lower bound, never an invented observation). An instance without
    the histogram at all has an all-zero row: it contributes no observations. ``sums``: each instance's
    ``_sum`` series (``HISTOGRAM_SUMS``); NaN where it is not read or not there (unknown, never zero).
    """
    finite = sorted({le for b in per.values() for le in b if math.isfinite(le)})
    cols = [*finite, math.inf]
    counts = np.zeros((len(ids), len(cols)), dtype=np.int64)
    for r, iid in enumerate(ids):
        b = per.get(iid)
        if not b:
            continue
        last = 0.0
        for c, le in enumerate(cols):
            last = b.get(le, last)
            counts[r, c] = round(last)
        counts[r] = np.maximum.accumulate(counts[r])
    got = sums or {}
    return Histogram(
        bounds_s=tuple(finite),
        counts=counts,
        sums=np.array([got.get(i, math.nan) for i in ids], dtype=np.float64),
    )


# -- PromQL for history --------------------------------------------------------------------------


def _spellings(regex: str) -> tuple[str, str]:
    """``vllm[:_]x`` → (``vllm:x``, ``vllm_x``): colon first, so it wins where both exist."""
    return regex.replace("[:_]", ":"), regex.replace("[:_]", "_")


def _by_pool(label_map: LabelMap, agg: str, inner: Callable[[str], str], extra: str = "") -> str:
    """``agg by (pool) (inner)``, and where a series has no pool label, by the fallback label instead."""
    p = label_map.pool
    with_pool = f"{agg} by ({p}{extra}) ({inner(f'{p}!=' + chr(34) * 2)})"
    if label_map.pool_fallback is None:
        return with_pool
    f = label_map.pool_fallback
    return (
        f"({with_pool}) or ({agg} by ({f}{extra}) ({inner(f'{p}=' + chr(34) * 2 + f',{f}!=' + chr(34) * 2)}))"
    )


def _either_spelling(regex: str, build: Callable[[str], str]) -> str:
    colon, underscore = _spellings(regex)
    return f"({build(colon)}) or ({build(underscore)})"


def _selector(name_re: str, *matchers: str) -> Callable[[str], str]:
    """A series selector on ``__name__ =~ name_re`` and ``matchers``, plus the pool matcher it is given."""
    return lambda m: "{" + ",".join([f'__name__=~"{name_re}"', *matchers, m]) + "}"


def router_queue_query(label_map: LabelMap) -> str:
    """PromQL, per pool: the requests its router queues for the entry stages (``ENTRY_STAGES``), summed over
    priority classes and routers: what the live scrape adds to the pool's waiting (``add_router_queues``)."""
    stages = f'stage=~"{"|".join(ENTRY_STAGES)}"'
    return _either_spelling(ROUTER_QUEUE, lambda r: _by_pool(label_map, "sum", _selector(r, stages)))


def channel_queries(label_map: LabelMap, window_s: float) -> dict[str, str]:
    """The PromQL of every history channel, per pool (see ``PrometheusSource.history``; the router queue,
    added to ``waiting`` there, is ``router_queue_query``)."""
    w = f"{window_s:g}s"
    role = label_map.role
    sel = _selector

    def rate(name_re: str, *matchers: str) -> Callable[[str], str]:
        return lambda m: f"rate({sel(name_re, *matchers)(m)}[{w}])"

    def counter(metric: str, *matchers: str) -> str:
        return _either_spelling(COUNTERS[metric], lambda r: _by_pool(label_map, "sum", rate(r, *matchers)))

    def gauge(metric: str, agg: str, *matchers: str) -> str:
        return _either_spelling(GAUGES[metric], lambda r: _by_pool(label_map, agg, sel(r, *matchers)))

    def quantile(q: float, metric: str) -> str:
        buckets = _either_spelling(HISTOGRAMS[metric], lambda r: _by_pool(label_map, "sum", rate(r), ",le"))
        return f"histogram_quantile({q}, {buckets})"

    return {
        "arrival_rps": counter(names.ROUTER_REQUESTS_TOTAL, f'{role}!="decode"'),  # a P/D request enters once
        "prompt_tps": counter(names.PROMPT_TOKENS_TOTAL, f'{role}!="decode"'),
        "gen_tps": counter(names.GENERATION_TOKENS_TOTAL),
        # as PoolLoad: sequences decoding (a prefill instance's running are prefilling) and requests queued
        # for prefill (a decode instance's waiting are prefilled and wait for a slot)
        "running": gauge(names.NUM_REQUESTS_RUNNING, "sum", f'{role}!="prefill"'),
        "waiting": gauge(names.NUM_REQUESTS_WAITING, "sum", f'{role}!="decode"'),
        "kv_usage": gauge(names.KV_CACHE_USAGE_PERC, "avg", f'{role}!="prefill"'),
        "ttft_p50_s": quantile(0.5, names.TIME_TO_FIRST_TOKEN_SECONDS),
        "ttft_p90_s": quantile(0.9, names.TIME_TO_FIRST_TOKEN_SECONDS),
        "itl_p50_s": quantile(0.5, names.INTER_TOKEN_LATENCY_SECONDS),
        "itl_p90_s": quantile(0.9, names.INTER_TOKEN_LATENCY_SECONDS),
    }


# -- chunked range queries (the reusable part) ---------------------------------------------------


@dataclass(frozen=True, eq=False)
class RangeSeries:
    """One series on the query grid: ``values[k]`` at ``start_s + k * step_s``, NaN = no sample."""

    labels: Mapping[str, str]
    values: np.ndarray


RangeCall = Callable[[str, dict[str, str], tuple[datetime, datetime]], Any]


def _n_steps(start_s: float, end_s: float, step_s: float) -> int:
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number, got {step_s!r}")
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
        raise ValueError(f"need finite start_s <= end_s, got start_s={start_s!r}, end_s={end_s!r}")
    return math.floor((end_s - start_s) / step_s + 1e-9) + 1


def query_range_chunked(
    call: RangeCall,
    promql: str,
    *,
    start_s: float,
    end_s: float,
    step_s: float,
    max_points: int = MAX_POINTS_PER_QUERY,
) -> list[RangeSeries]:
    """A range query over ``[start_s, end_s]`` cut into chunks of at most ``max_points`` steps, merged by labels.

    ``call(promql, params, (start, end))`` runs one chunk; ``params`` carries exact ``start``/``end``/``step``
    (``PrometheusConnect`` rounds its datetime arguments to whole seconds; its ``params`` win over them).
    Chunks do not overlap: chunk ``j`` covers steps ``[j * max_points, (j + 1) * max_points)``.
    """
    if not 1 <= max_points <= 11_000:
        raise ValueError(f"max_points must be in [1, 11000], got {max_points}")
    n_steps = _n_steps(start_s, end_s, step_s)
    merged: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
    for k0 in range(0, n_steps, max_points):
        k1 = min(n_steps, k0 + max_points) - 1
        t0, t1 = start_s + k0 * step_s, start_s + k1 * step_s
        params = {"start": f"{t0:.3f}", "end": f"{t1:.3f}", "step": f"{step_s:g}"}
        span = (datetime.fromtimestamp(t0, tz=UTC), datetime.fromtimestamp(t1, tz=UTC))
        result = call(promql, params, span)
        if not isinstance(result, list):
            raise SourceError(f"range query {promql!r} did not return a matrix: {result!r}")
        for item in result:
            key = tuple(sorted((str(k), str(v)) for k, v in item.get("metric", {}).items()))
            grid = merged.setdefault(key, np.full(n_steps, np.nan))
            points = np.asarray(item.get("values", []), dtype=np.float64).reshape(-1, 2)
            idx = np.rint((points[:, 0] - start_s) / step_s).astype(np.int64)
            ok = (idx >= k0) & (idx <= k1)
            grid[idx[ok]] = points[ok, 1]
    return [RangeSeries(labels=dict(key), values=vals) for key, vals in merged.items()]


def _connect(url: str, bearer_token: str | None, ca_file: str | None, insecure: bool) -> PrometheusQuerier:
    """A ``PrometheusConnect`` that never retries (the daemon's next tick is the retry)."""
    import requests
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    session = requests.Session()
    session.verify = False if insecure else (ca_file or True)
    headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
    client: PrometheusQuerier = PrometheusConnect(
        url=url, headers=headers, session=session, retry=Retry(total=0, read=False)
    )
    return client


def _duration(seconds: float) -> str:
    """A PromQL duration (whole milliseconds: Prometheus 2 rejects fractional seconds such as ``2.000s``)."""
    return f"{max(1, int(seconds * 1000))}ms"
