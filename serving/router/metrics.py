"""The router's own Prometheus metrics, in their own registry (served at the router's ``/metrics``).

Names use the ``pdscale:`` prefix as the simulator's exporter does; ``pdscale:router_requests_total``
keeps the simulator's meaning (requests routed to each backend, labelled by ``instance_id``, counted as they
arrive: a request that must wait for a slot is counted at once on one of its stage's backends, so the
pool's sum is the arrival rate even while the fleet is saturated), so a controller reads real and simulated
fleets alike. ``pdscale:router_dispatched_total`` counts what each backend was actually sent (every attempt,
after any queue wait). ``pdscale:router_queue_length`` is the backlog the controller adds to the pool's
waiting requests. Pages are classic text format 0.0.4, which keeps the colons.

Every series on the page carries the router's ``pool`` label when the router names its pool
(``RouterConfig.pool``, ``pdscale router --pool``; the pool manager passes its own name), so a Prometheus
source can tell whose queue and counters they are; a router with no pool name exports no ``pool`` label.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

M = TypeVar("M", bound=MetricWrapperBase)

# Proxy overhead is sub-millisecond when healthy: fine buckets up to 50 ms.
OVERHEAD_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05,
)  # fmt: skip


class _WithLabel(Collector):
    """Every sample of ``inner`` with one more label (the router's pool), added when the page is made: the
    request path keeps binding the metrics' own labels only."""

    def __init__(self, inner: CollectorRegistry, name: str, value: str) -> None:
        self.inner, self.name, self.value = inner, name, value

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s._replace(labels={**s.labels, self.name: self.value}) for s in family.samples]
            yield out


class RouterMetrics:
    """Every metric the router exports. One instance per router. ``pool``: the pool the router fronts,
    a ``pool`` label on every series of the page ("": none)."""

    def __init__(self, pool: str = "") -> None:
        self.pool = pool
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.page_registry = r  # what the page shows: the metrics, with the pool label when named
        if pool:
            self.page_registry = CollectorRegistry(auto_describe=False)
            self.page_registry.register(_WithLabel(r, "pool", pool))
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.client_requests = Counter(
            "pdscale:router_client_requests",
            "Client requests answered, by priority class, route (pd or mixed), endpoint and HTTP status.",
            ["priority_class", "route", "endpoint", "status"],
            registry=r,
        )
        self.backend_requests = Counter(
            "pdscale:router_requests",
            "Requests routed to this instance, counted as they arrive at the router (a request that waits for"
            " a slot is counted on arrival, on one of its stage's instances; retries are not counted again):"
            " the pool's arrival rate even while every instance is busy.",
            ["instance_id", "role", "node"],
            registry=r,
        )
        self.dispatched = Counter(
            "pdscale:router_dispatched",
            "Requests the router sent to this instance (after any queue wait; every attempt).",
            ["instance_id", "role", "node"],
            registry=r,
        )
        self.backend_prompt_tokens = Counter(
            "pdscale:router_prompt_tokens",
            "Prompt tokens (the router's estimate) of the requests sent to this prefill or mixed instance, counted"
            " with pdscale:router_requests: prompt demand as it arrives, where vllm:prompt_tokens_total counts it"
            " as processed.",
            ["instance_id", "role", "node"],
            registry=r,
        )
        self.queue_length = Gauge(
            "pdscale:router_queue_length",
            "Requests waiting for a backend slot, by stage and priority class (the controller's direct source"
            " adds the prefill and mixed stages' to the pool's waiting requests).",
            ["stage", "priority_class"],
            registry=r,
        )
        self.in_flight = Gauge(
            "pdscale:router_backend_in_flight",
            "Requests the router has in flight on each backend.",
            ["instance_id", "role"],
            registry=r,
        )
        self.overhead = Histogram(
            "pdscale:router_proxy_overhead_seconds",
            "Time the router adds to a request: handler time to first byte minus backend and queue time.",
            ["route"],
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "pdscale:router_queue_wait_seconds",
            "Time requests waited for a backend slot.",
            ["stage", "priority_class"],
            registry=r,
        )
        self.backend_errors = Counter(
            "pdscale:router_backend_errors",
            "Backend failures seen by the router (connection, timeout, 5xx, bad prefill answer).",
            ["instance_id", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "pdscale:router_retries",
            "Requests tried again (route pd or mixed) after a backend failed before any byte reached the client.",
            ["route"],
            registry=r,
        )

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, bound once and kept: the request path skips prometheus_client's
        label validation and lock (~15 µs a call). Not for metrics that get ``clear()``-ed (the gauges
        ``queue_length`` and ``in_flight``): a kept child would outlive its clearing."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        child: M = found
        return child

    def page(self) -> bytes:
        return generate_latest(self.page_registry)
