"""The direct source: scrape a local pool's servers and its router over HTTP, no Prometheus in between.

``DirectSource(pool).scrape(now_s)`` fetches every *active* member's ``/metrics`` and the router's
``/metrics`` (in parallel, one deadline of ``timeout_s`` for all), parses the text pages with
``prometheus_client``'s parser, labels each series with the member's id, pool, role and node (as a
Prometheus scrape config would), and hands them to ``PrometheusSource`` through an in-memory querier
(``PageQuerier``): the name tables, both spellings, the per-instance sums and the histogram assembly are
Prometheus' own code, not a copy. Router counters (``pdscale:router_*``, labelled ``instance_id``) are
attributed to the member they name. The router's queues (``pdscale:router_queue_length``, requests waiting
for a backend slot) are demand the pool has not taken yet: the prefill and mixed stages' are added to the
pool's waiting requests (``vllm:num_requests_waiting`` of that stage's members, shared evenly), so a backlog
at the gateway reads as one at the servers; the decode stage's is left out, as the aggregator leaves out a
decode server's own waiting requests (already prefilled).

Unknown is not zero: a member whose page cannot be fetched or parsed stays in the scrape with NaN gauges
and counters (the pool's load reads unknown: the policy holds), is counted in ``stats().failed`` and
logged, and the tick goes on; on such a tick the latency histograms are left out (their quantiles are
unknown), so the member's return is not read as a burst of observations. A router page that fails leaves
the router counters and queues out (arrivals unknown, the backlog at the servers only). Standby members are not scraped: they serve nothing, and the
actuator reports them (``LocalPoolActuator.current``).
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from controller.settings import LabelMap
from controller.sources.prometheus import (
    COUNTERS,
    GAUGES,
    HISTOGRAM_SUMS,
    HISTOGRAMS,
    PrometheusSource,
    SourceError,
    add_router_queues,
)
from serving.sim.samples import InstanceSamples

log = logging.getLogger(__name__)

# what the in-memory querier answers: the instant selector PrometheusSource.scrape sends per metric
_SELECTOR = re.compile(r'^\{__name__=~"(?P<regex>[^"]+)"\}$')
# every sample name PrometheusSource reads (its own tables): only those lines of a page are parsed
_WANTED = re.compile(
    "|".join(
        f"(?:{r})"
        for r in (*GAUGES.values(), *COUNTERS.values(), *HISTOGRAMS.values(), *HISTOGRAM_SUMS.values())
    )
)
_LABELS = LabelMap(instance="instance", pool="pool", role="role", node="node", pool_fallback=None)
_IDENTITY = ("instance", "pool", "role", "node")
_QUEUE_NAME = re.compile(r"pdscale[:_]router_queue_length")
T = TypeVar("T")


class PoolView(Protocol):
    """What the source needs of a pool (``serving.pools.manager.PoolManager`` has it)."""

    name: str
    url: str  # the router's base URL ("" before ``up``)

    def state(self) -> dict[str, Any]:
        """The state file's document: ``instances`` with ``id``, ``role``, ``tier``, ``url``, ``node``."""
        ...


@dataclass(frozen=True)
class Member:
    """One server the source scrapes: its id, role, node (its id when dedicated) and base URL."""

    id: str
    role: str
    node: str
    url: str


def members_of(pool: PoolView) -> tuple[Member, ...]:
    """The pool's active members, from its state document (standby ones are left out, see the module doc)."""
    doc = pool.state()
    out = []
    for i, inst in enumerate(doc.get("instances", [])):
        try:
            if inst.get("tier", "active") != "active":
                continue
            out.append(
                Member(
                    str(inst["id"]), str(inst["role"]), str(inst.get("node") or inst["id"]), str(inst["url"])
                )
            )
        except (KeyError, AttributeError) as err:
            raise SourceError(f"pool {pool.name}: state instances[{i}] lacks {err}: {inst!r}") from err
    return tuple(out)


@dataclass
class DirectStats:
    """Counters since the source was made: scrapes, and failed page fetches per member id (``router``
    for the router's page)."""

    scrapes: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return sum(self.failed.values())


Row = dict[
    str, Any
]  # one instant-vector sample as Prometheus answers it: {"metric": labels, "value": [t, "v"]}


def wanted_lines(text: str) -> str:
    """The sample lines of a page whose metric name the Prometheus source reads (``GAUGES``, ``COUNTERS``,
    ``HISTOGRAMS`` and the ``_sum`` of ``HISTOGRAM_SUMS``); comments and every other series are dropped before parsing. A vLLM page has ~300
    samples of which ~60 are read: parsing only those is most of the scrape's CPU saved
    (bench/bench_direct_source.py). The parser reads the kept lines as untyped samples, names unchanged."""
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for stop in ("{", " "):
            i = line.find(stop)
            if 0 <= i < end:
                end = i
        if _WANTED.fullmatch(line[:end]):
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


def page_rows(text: str, identity: Mapping[str, str], now_s: float) -> list[Row]:
    """The samples of one text-format page the source reads (``wanted_lines``) as instant-vector rows,
    labelled with ``identity``."""
    rows: list[Row] = []
    for family in text_string_to_metric_families(wanted_lines(text)):
        for s in family.samples:
            labels = {**s.labels, "__name__": s.name, **identity}
            rows.append({"metric": labels, "value": [now_s, repr(float(s.value))]})
    return rows


def router_rows(text: str, members: Mapping[str, Member], pool: str, now_s: float) -> list[Row]:
    """The router page's per-backend series (label ``instance_id``), attributed to the members they name;
    series of backends that are not active members (removed, standby) and router-wide series are dropped."""
    rows: list[Row] = []
    for family in text_string_to_metric_families(wanted_lines(text)):
        for s in family.samples:
            m = members.get(s.labels.get("instance_id", ""))
            if m is None:
                continue
            identity = {"instance": m.id, "pool": pool, "role": m.role, "node": m.node}
            rows.append(
                {
                    "metric": {**s.labels, "__name__": s.name, **identity},
                    "value": [now_s, repr(float(s.value))],
                }
            )
    return rows


def router_queue(text: str) -> dict[str, float]:
    """Requests waiting in the router page's queues per stage (``pdscale:router_queue_length``, summed over
    priority classes); a stage not on the page is absent."""
    keep = [line for line in text.splitlines() if line and line[0] != "#" and _QUEUE_NAME.match(line)]
    out: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(keep) + "\n" if keep else ""):
        for s in family.samples:
            if _QUEUE_NAME.fullmatch(s.name):
                stage = s.labels.get("stage", "")
                out[stage] = out.get(stage, 0.0) + float(s.value)
    return out


def add_router_backlog(samples: InstanceSamples, queue: Mapping[str, float]) -> tuple[InstanceSamples, float]:
    """``samples`` (one pool's) with the router's prefill and mixed queues added to the waiting requests of
    that stage's members, and the requests left unplaced: ``prometheus.add_router_queues`` for one pool."""
    pool = samples.pools[0] if samples.pools else ""
    out, unplaced = add_router_queues(samples, {pool: queue})
    return out, unplaced.get(pool, 0.0)


class PageQuerier:
    """An in-memory Prometheus for ``PrometheusSource``: answers ``{__name__=~"RE"}`` over the rows given
    to ``load`` (Prometheus' regex matching is anchored: ``re.fullmatch``). Any other query is a
    ``SourceError`` (the source sends no other)."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[Row]] = {}

    def load(self, rows: Sequence[Row]) -> None:
        by_name: dict[str, list[Row]] = {}
        for row in rows:
            by_name.setdefault(row["metric"]["__name__"], []).append(row)
        self._by_name = by_name

    def custom_query(self, query: str, params: dict[str, Any] | None = None, timeout: Any = None) -> Any:
        m = _SELECTOR.match(query)
        if m is None:
            raise SourceError(f'direct source: cannot answer {query!r} (only {{__name__=~"RE"}} selectors)')
        regex = re.compile(m.group("regex"))
        return [row for name, rows in self._by_name.items() if regex.fullmatch(name) for row in rows]

    def custom_query_range(self, query: str, *args: Any, **kwargs: Any) -> Any:
        raise SourceError(
            "direct source: no history (it keeps no series); use a Prometheus source for history"
        )


def fetch_page(url: str, timeout_s: float) -> str:
    """GET ``url`` as text; ``OSError``/``ValueError`` on any failure (refused, timeout, non-200)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        return str(resp.read().decode("utf-8", errors="replace"))


class DirectSource:
    """Scrapes a local pool directly (see the module docstring). ``fetch(url, timeout_s)`` replaces the
    HTTP GET (tests); ``clock`` is the monotonic clock of the scrape deadline."""

    def __init__(
        self,
        pool: PoolView,
        *,
        timeout_s: float = 2.0,
        fetch: Callable[[str, float], str] = fetch_page,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 16,
    ) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"DirectSource.timeout_s must be a positive number, got {timeout_s!r}")
        self.pool = pool
        self.timeout_s = timeout_s
        self._fetch = fetch
        self._clock = clock
        self._max_workers = max_workers
        self._querier = PageQuerier()
        self.inner = PrometheusSource(
            "direct://" + pool.name, labels=_LABELS, timeout_s=timeout_s, querier=self._querier, clock=clock
        )
        self._stats = DirectStats()

    def stats(self) -> DirectStats:
        return DirectStats(self._stats.scrapes, dict(self._stats.failed))

    def _get(self, key: str, url: str) -> str | None:
        try:
            return self._fetch(url, self.timeout_s)
        except (OSError, ValueError, urllib.error.URLError) as err:
            self._stats.failed[key] = self._stats.failed.get(key, 0) + 1
            log.warning("direct source: %s: GET %s failed: %s", key, url, err,
                        extra={"event": "scrape_failed", "instance": key})  # fmt: skip
            return None

    def scrape(self, now_s: float) -> InstanceSamples:
        """Every active member at ``now_s``: NaN where its page failed (see the module docstring)."""
        self._stats.scrapes += 1
        members = members_of(self.pool)
        targets = [(m.id, f"{m.url}/metrics") for m in members]
        if self.pool.url:
            targets.append(("router", f"{self.pool.url}/metrics"))
        pages: dict[str, str | None] = {}
        if targets:
            with ThreadPoolExecutor(max_workers=min(self._max_workers, len(targets))) as ex:
                got = ex.map(lambda t: self._get(*t), targets)
                pages = {key: page for (key, _), page in zip(targets, got, strict=True)}
        rows: list[Row] = []
        failed: set[str] = set()
        by_id = {m.id: m for m in members}
        for m in members:
            identity = {"instance": m.id, "pool": self.pool.name, "role": m.role, "node": m.node}
            page = pages.get(m.id)
            parsed = self._parse(m.id, page, partial(page_rows, identity=identity, now_s=now_s))
            if parsed is None:
                failed.add(m.id)
            else:
                rows.extend(parsed)
        router_page = pages.get("router")
        queue: dict[str, float] = {}
        if router_page is not None:

            def parse(page: str) -> tuple[list[Row], dict[str, float]]:
                return router_rows(page, by_id, self.pool.name, now_s), router_queue(page)

            got_router = self._parse("router", router_page, parse)
            if got_router is not None:
                rows.extend(got_router[0])
                queue = got_router[1]
        self._querier.load(rows)
        complete = self._complete(self.inner.scrape(now_s), members, failed)
        samples, unplaced = add_router_backlog(complete, queue)
        if unplaced > 0:
            log.warning("direct source: pool %s: %g requests queued at the router not counted: no prefill or"
                        " mixed member to count them on", self.pool.name, unplaced,
                        extra={"event": "router_backlog_unplaced"})  # fmt: skip
        return samples

    def _parse(self, key: str, page: str | None, parse: Callable[[str], T]) -> T | None:
        if page is None:
            return None
        try:
            return parse(page)
        except ValueError as err:  # prometheus_client's parser raises ValueError on a malformed page
            self._stats.failed[key] = self._stats.failed.get(key, 0) + 1
            log.warning("direct source: %s: malformed /metrics page: %s", key, err,
                        extra={"event": "scrape_failed", "instance": key})  # fmt: skip
            return None

    def _complete(self, got: InstanceSamples, members: Sequence[Member], failed: set[str]) -> InstanceSamples:
        """``got`` over every active member, in id order: NaN rows for the ones without series."""
        ids = tuple(sorted(m.id for m in members))
        if got.instance_ids == ids and not failed:
            return got
        by_id = {m.id: m for m in members}
        index = {iid: i for i, iid in enumerate(got.instance_ids)}
        rows = np.array([index.get(i, -1) for i in ids], dtype=np.int64)
        known = (rows >= 0) & ~np.isin(np.array(ids, dtype=object), list(failed))

        def widen(values: np.ndarray) -> np.ndarray:
            return np.where(known, values[np.maximum(rows, 0)] if len(values) else np.nan, np.nan)

        return replace(
            got,
            instance_ids=ids,
            pools=(self.pool.name,) * len(ids),
            roles=tuple(by_id[i].role for i in ids),
            nodes=tuple(by_id[i].node for i in ids),
            states=("active",) * len(ids),
            gauges={k: widen(v) for k, v in got.gauges.items()},
            counters={k: widen(v) for k, v in got.counters.items()},
            histograms={} if failed or not known.all() else got.histograms,
        )
