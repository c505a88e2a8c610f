"""The controller's own metrics and health endpoints: ``/metrics``, ``/healthz``, ``/readyz``.

Metrics live in a private ``CollectorRegistry`` (never the process-global one, so two controllers in one
test process do not collide). ``/healthz`` answers 200 while the loop keeps turning: the last loop
iteration ended less than ``stuck_after_s`` ago (a tick that hangs, e.g. on a stuck API call, turns it
503). ``/readyz`` answers 200 once a first tick succeeded, whether this replica leads or follows (a
follower is warm: it scrapes and decides, it only does not apply).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controller.clock import Clock
from controller.policy import PoolForecast, ScalingPlan
from controller.policy.types import ROLES
from serving.sim.samples import STANDBY_PROMOTIONS_TOTAL, TAIL_PROMOTIONS_TOTAL, InstanceSamples

ERROR_KINDS: tuple[str, ...] = (
    "source_unavailable",
    "actuator_unavailable",
    "permanent",
    "unexpected",
    "leader_election",
)
TICK_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Telemetry:
    """Every metric the daemon exports, and the health state behind ``/healthz`` and ``/readyz``.

    ``stuck_after_s``: ``/healthz`` fails when no loop iteration ended for this long (the daemon sets it
    to a few ticks plus the longest retry wait).
    """

    def __init__(self, clock: Clock, *, stuck_after_s: float = 30.0) -> None:
        if not (math.isfinite(stuck_after_s) and stuck_after_s > 0):
            raise ValueError(f"Telemetry.stuck_after_s must be a positive number, got {stuck_after_s!r}")
        self.clock = clock
        self.stuck_after_s = stuck_after_s
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        p = "pdscale_controller_"
        self.target_replicas = Gauge(
            p + "target_replicas", "Replicas the last plan asked for", ["pool", "role", "tier"], registry=r
        )
        self.current_replicas = Gauge(
            p + "current_replicas", "Replicas the cluster is set to (spec)", ["pool", "role"], registry=r
        )
        self.degraded = Gauge(p + "degraded", "1 while demand exceeds max replicas", ["pool"], registry=r)
        self.silence_hold = Gauge(
            p + "silence_hold",
            "1 while a pool's arrivals have stopped dead after a steady stream (an outage upstream?): no scale-down",
            ["pool"],
            registry=r,
        )
        self.latency_correction = Gauge(
            p + "latency_correction",
            "Factor the pool's capacities are sized with: its engines' measured step time over the profile's"
            " (1 = the profile, or policy.latency_correction off)",
            ["pool"],
            registry=r,
        )
        self.latency_estimate = Gauge(
            p + "latency_estimate",
            "Smoothed measured / modelled inter-token time of the pool's decode instances (NaN: no reading yet)",
            ["pool"],
            registry=r,
        )
        self.decisions = Counter(
            p + "decisions", "Decisions by outcome (plan / no_opinion)", ["pool", "outcome"], registry=r
        )
        self.changes = Counter(
            p + "scale_changes", "Replica writes applied (or, in dry-run, that would be)",
            ["pool", "role", "tier", "direction"], registry=r,
        )  # fmt: skip
        self.forecast_arrivals_p90 = Gauge(
            p + "forecast_arrivals_p90_rps", "p90 forecast of arrivals per second", ["pool"], registry=r
        )
        self.forecast_burst = Gauge(
            p + "forecast_burst_probability", "Forecast probability that a burst starts", ["pool"], registry=r
        )
        self.errors = Counter(p + "errors", "Errors caught by the loop, by kind", ["kind"], registry=r)
        self.tick_seconds = Histogram(
            p + "tick_seconds", "Duration of one control tick", buckets=TICK_BUCKETS_S, registry=r
        )
        self.ticks = Counter(p + "ticks", "Ticks by outcome (ok / error)", ["outcome"], registry=r)
        self.last_success = Gauge(
            p + "last_success_timestamp_seconds", "Unix time of the last successful tick", registry=r
        )
        self.leader = Gauge(p + "is_leader", "1 while this replica holds the lease", registry=r)
        self.forecaster_fallback = Gauge(
            p + "forecaster_fallback",
            "1 when the learned forecaster could not be loaded and a baseline runs instead",
            registry=r,
        )
        self.forecaster_info = Gauge(p + "forecaster_info", "The forecaster in use", ["name"], registry=r)
        self.incomplete = Counter(
            p + "incomplete_observations",
            "Pool observations that were incomplete (first scrape, vanished instances): no scale-down on them",
            ["pool"],
            registry=r,
        )
        self.forecast_failures = Counter(
            p + "forecast_failures", "Ticks whose forecast failed (measured load used)", registry=r
        )
        self.tail_promotions = Gauge(
            p + "serving_tail_promotions",
            "Tail-request promotions counted by the serving instances (sum of pdscale:tail_promotions_total over"
            " the instances alive now), by pool",
            ["pool"],
            registry=r,
        )
        self.standby_promotions = Gauge(
            p + "serving_standby_promotions",
            "Standby instances promoted for a waiting tail request (sum of pdscale:standby_promotions_total over"
            " the instances alive now), by pool",
            ["pool"],
            registry=r,
        )
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        self._lock = threading.Lock()
        self._last_loop_s = clock.monotonic()
        self._ready = False
        self._is_leader = False

    # -- updates from the loop -------------------------------------------------------------------

    def loop_turned(self) -> None:
        """The loop finished an iteration (successful or not): it is not stuck."""
        with self._lock:
            self._last_loop_s = self.clock.monotonic()

    def tick_ok(self, now_s: float, duration_s: float) -> None:
        self.tick_seconds.observe(duration_s)
        self.ticks.labels(outcome="ok").inc()
        self.last_success.set(now_s)
        with self._lock:
            self._ready = True

    def error(self, kind: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"Telemetry.error: unknown kind {kind!r}; kinds are {ERROR_KINDS}")
        self.errors.labels(kind=kind).inc()

    def set_leader(self, leader: bool) -> None:
        self.leader.set(1.0 if leader else 0.0)
        with self._lock:
            self._is_leader = leader

    def set_forecaster(self, name: str, fallback: bool) -> None:
        self.forecaster_info.labels(name=name).set(1.0)
        self.forecaster_fallback.set(1.0 if fallback else 0.0)

    def pool_current(self, pool: str, replicas: Mapping[str, int]) -> None:
        for role in ROLES:
            self.current_replicas.labels(pool=pool, role=role).set(replicas.get(role, 0))

    def pool_decision(
        self, pool: str, plan: ScalingPlan | None, forecast: PoolForecast | None, complete: bool = True
    ) -> None:
        if not complete:
            self.incomplete.labels(pool=pool).inc()
        self.decisions.labels(pool=pool, outcome="plan" if plan is not None else "no_opinion").inc()
        if forecast is not None:
            self.forecast_arrivals_p90.labels(pool=pool).set(forecast.rate(forecast.arrivals_p90))
            self.forecast_burst.labels(pool=pool).set(forecast.burst_prob)
        else:
            self.forecast_arrivals_p90.labels(pool=pool).set(math.nan)
            self.forecast_burst.labels(pool=pool).set(math.nan)
        if plan is None:
            return
        for role in ROLES:
            self.target_replicas.labels(pool=pool, role=role, tier="active").set(plan.count(role))
            self.target_replicas.labels(pool=pool, role=role, tier="standby").set(plan.standby(role))
        self.degraded.labels(pool=pool).set(1.0 if plan.degrade else 0.0)
        self.silence_hold.labels(pool=pool).set(1.0 if plan.silent else 0.0)

    def pool_latency(self, pool: str, scale: float, estimate: float) -> None:
        """The latency correction's applied factor and its estimate (``controller.latency_correction``)."""
        self.latency_correction.labels(pool=pool).set(scale)
        self.latency_estimate.labels(pool=pool).set(estimate)

    def serving_counters(self, samples: InstanceSamples) -> None:
        """Mirror the serving side's tail-request counters per pool (absent metric: gauge left as it was)."""
        pools = np.asarray(samples.pools, dtype=object)
        for metric, gauge in (
            (TAIL_PROMOTIONS_TOTAL, self.tail_promotions),
            (STANDBY_PROMOTIONS_TOTAL, self.standby_promotions),
        ):
            values = samples.counters.get(metric)
            if values is None:
                continue
            for pool in sorted(set(samples.pools)):
                gauge.labels(pool=pool).set(float(np.nansum(values[pools == pool])))

    def change(self, pool: str, role: str, tier: str, before: int, after: int) -> None:
        direction = "up" if after > before else "down"
        self.changes.labels(pool=pool, role=role, tier=tier, direction=direction).inc()

    # -- health ----------------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        with self._lock:
            idle_s = self.clock.monotonic() - self._last_loop_s
        if idle_s > self.stuck_after_s:
            return (
                False,
                f"loop stuck: no iteration ended for {idle_s:.1f} s (limit {self.stuck_after_s:g} s)",
            )
        return True, f"ok: last loop iteration {idle_s:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        with self._lock:
            ready, leader = self._ready, self._is_leader
        role = "leader" if leader else "follower"
        return (True, f"ready ({role})") if ready else (False, "not ready: no successful tick yet")

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TelemetryServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` of a ``Telemetry`` on ``host:port`` (0 = any free
    port; read ``port`` after ``start``) in a daemon thread. A context manager."""

    def __init__(self, telemetry: Telemetry, port: int, host: str = "0.0.0.0") -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"TelemetryServer.port must be in [0, 65535], got {port}")
        self.telemetry = telemetry
        self.host = host
        self._port = port
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("TelemetryServer.port: not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("TelemetryServer.start: already started")
        self._server = ThreadingHTTPServer((self.host, self._port), _handler(self.telemetry))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="telemetry", daemon=True).start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> TelemetryServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _handler(telemetry: Telemetry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, telemetry.render(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, text = telemetry.healthy() if path == "/healthz" else telemetry.ready()
                self._send(200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(
                    404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8"
                )

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's signature
            return

    return Handler
