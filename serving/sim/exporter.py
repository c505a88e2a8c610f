"""Real-time mode: serve every simulated instance's ``/metrics`` over HTTP so a real Prometheus scrapes it.

One threaded loopback HTTP server carries the whole fleet:

- ``GET /instances/{instance_id}/metrics`` — one instance, like one vLLM pod's ``/metrics``;
- ``GET /metrics`` — every serving instance in one page (for a single static target with ``honor_labels``);
- ``GET /targets.json`` — the instances in Prometheus ``file_sd``/``http_sd`` format, one target group per
  instance, with ``__metrics_path__`` pointing at its page and labels ``instance``, ``instance_id``,
  ``pool``, ``role``, ``node``. Instances come and go with scale events; ``http_sd_configs`` picks that up.

``run_realtime`` drives a ``Simulator``'s virtual clock from wall time (``speed`` virtual seconds per wall
second) and publishes ``observe()`` to the exporter after every step.

A scrape config for it::

    scrape_configs:
      - job_name: pdscale-sim
        scrape_interval: 1s
        honor_labels: true
        http_sd_configs: [{url: "http://127.0.0.1:PORT/targets.json", refresh_interval: 1s}]

Pages are always the classic text format 0.0.4, whatever the scraper's ``Accept`` header asks for: that
keeps vLLM's colons (``vllm:num_requests_running``) on every Prometheus version (OpenMetrics output from
``prometheus_client`` >= 0.23 turns them into underscores). Every series carries vLLM's own labels
``model_name`` and ``engine`` plus ``instance_id``, ``pool``, ``role`` and ``node``, so the series are the same
whichever page was scraped. A NaN gauge (unknown) is left out of the page rather than exported; an instance
that is ``provisioning`` or ``failed`` answers 503, as a pod whose server is not up would.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from serving.sim.samples import InstanceSamples

CONTENT_TYPE_TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
SERIES_LABELS: tuple[str, ...] = ("model_name", "engine", "instance_id", "pool", "role", "node")
NOT_SERVING_STATES = frozenset({"provisioning", "failed"})
_INSTANCE_PATH = re.compile(r"^/instances/([^/]+)/metrics$")

# HELP strings, as vLLM words them where it exports the metric.
_HELP: dict[str, str] = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:request_success_total": "Count of successfully processed requests.",
    "pdscale:router_requests_total": "Requests the pdscale router sent to this instance.",
    "pdscale:router_prompt_tokens_total": "Prompt tokens of the requests routed to this entry instance.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
}


class ExporterError(ValueError):
    """An ``InstanceSamples`` value that cannot be exported; the message names the field."""


class NotServingError(LookupError):
    """The instance exists but its metrics endpoint is not up (``provisioning`` or ``failed``)."""


def _check_samples(samples: InstanceSamples) -> None:
    n = len(samples.instance_ids)
    for name in ("pools", "roles", "nodes", "states"):
        got = len(getattr(samples, name))
        if got != n:
            raise ExporterError(f"InstanceSamples.{name} has {got} entries, instance_ids has {n}")
    if len(set(samples.instance_ids)) != n:
        raise ExporterError("InstanceSamples.instance_ids has duplicates")
    bad_ids = [i for i in samples.instance_ids if not i or "/" in i]
    if bad_ids:
        raise ExporterError(f"InstanceSamples.instance_ids must be non-empty and contain no '/': {bad_ids!r}")
    for kind, table in (("gauges", samples.gauges), ("counters", samples.counters)):
        for metric, values in table.items():
            if np.shape(values) != (n,):
                raise ExporterError(
                    f"InstanceSamples.{kind}[{metric!r}] has shape {np.shape(values)}, want ({n},)"
                )
    for metric, hist in samples.histograms.items():
        want = (n, len(hist.bounds_s) + 1)
        if np.shape(hist.counts) != want:
            raise ExporterError(
                f"InstanceSamples.histograms[{metric!r}].counts has shape {np.shape(hist.counts)}, want {want}"
            )
        if np.shape(hist.sums) != (n,):
            raise ExporterError(
                f"InstanceSamples.histograms[{metric!r}].sums has shape {np.shape(hist.sums)}"
            )


@dataclass(frozen=True, eq=False)
class _Snapshot:
    samples: InstanceSamples
    index: Mapping[str, int]
    label_values: tuple[tuple[str, ...], ...]  # per instance, in SERIES_LABELS order
    serving: np.ndarray  # bool [N]: instances whose metrics endpoint is up
    pages: dict[str | None, bytes] = field(default_factory=dict)  # rendered once per snapshot


class _SnapshotCollector:
    """A prometheus_client collector over a fixed set of instance rows of one snapshot."""

    def __init__(self, snap: _Snapshot, rows: np.ndarray) -> None:
        self._snap = snap
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        s, rows = self._snap.samples, self._rows
        labels = list(SERIES_LABELS)
        for name, values in s.gauges.items():
            gauge = GaugeMetricFamily(name, _HELP.get(name, name), labels=labels)
            vals = np.asarray(values, dtype=np.float64)
            for i in rows:
                if not np.isnan(vals[i]):
                    gauge.add_metric(self._snap.label_values[i], float(vals[i]))
            yield gauge
        for name, values in s.counters.items():
            counter = CounterMetricFamily(name, _HELP.get(name, name), labels=labels)
            vals = np.asarray(values, dtype=np.float64)
            for i in rows:
                if not np.isnan(vals[i]):
                    counter.add_metric(self._snap.label_values[i], float(vals[i]))
            yield counter
        for name, hist in s.histograms.items():
            family = HistogramMetricFamily(name, _HELP.get(name, name), labels=labels)
            les = [repr(float(b)) for b in hist.bounds_s] + ["+Inf"]
            for i in rows:
                buckets = list(zip(les, (float(c) for c in hist.counts[i]), strict=True))
                family.add_metric(self._snap.label_values[i], buckets, sum_value=float(hist.sums[i]))
            yield family


def render_text(snap: _Snapshot, rows: np.ndarray) -> bytes:
    """The text-format 0.0.4 page for the given instance rows."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, rows))
    return generate_latest(registry)


class SimMetricsExporter:
    """Serves the latest ``InstanceSamples`` on one loopback port; ``update()`` swaps it atomically.

    ``model_names`` maps a pool to the ``model_name`` label (default: the pool name).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_names: Mapping[str, str] | None = None,
        engine: str = "0",
    ) -> None:
        self._host = host
        self._port = port
        self._model_names = dict(model_names or {})
        self._engine = engine
        self._snapshot: _Snapshot | None = None
        self._server: ThreadingHTTPServer | None = None
        self._bound_port: int | None = None  # kept after stop(): handler threads may still be answering
        self._thread: threading.Thread | None = None

    # -- data ------------------------------------------------------------------------------------

    def update(self, samples: InstanceSamples) -> None:
        """Publish a new scrape of the fleet (validated first; scrapes see either the old or the new one)."""
        _check_samples(samples)
        label_values = tuple(
            (self._model_names.get(pool, pool), self._engine, iid, pool, role, node)
            for iid, pool, role, node in zip(
                samples.instance_ids, samples.pools, samples.roles, samples.nodes, strict=True
            )
        )
        serving = np.array([st not in NOT_SERVING_STATES for st in samples.states], dtype=bool)
        index = {iid: i for i, iid in enumerate(samples.instance_ids)}
        self._snapshot = _Snapshot(samples, index, label_values, serving)  # one reference swap: atomic

    @property
    def now_s(self) -> float:
        """Simulated time of the published snapshot (NaN before the first ``update``)."""
        snap = self._snapshot
        return snap.samples.now_s if snap is not None else float("nan")

    def targets(self) -> list[dict[str, object]]:
        """``file_sd``/``http_sd`` target groups: one per instance of the current snapshot."""
        snap = self._snapshot
        if snap is None:
            return []
        address = f"{self._host}:{self.port}"
        groups: list[dict[str, object]] = []
        for iid, (model, engine, _, pool, role, node) in zip(
            snap.samples.instance_ids, snap.label_values, strict=True
        ):
            groups.append(
                {
                    "targets": [address],
                    "labels": {
                        "__metrics_path__": f"/instances/{urllib.parse.quote(iid, safe='')}/metrics",
                        "instance": iid,
                        "instance_id": iid,
                        "pool": pool,
                        "role": role,
                        "node": node,
                        "model_name": model,
                        "engine": engine,
                    },
                }
            )
        return groups

    def render(self, instance_id: str | None = None) -> bytes:
        """The page ``/metrics`` (``None``) or ``/instances/{instance_id}/metrics`` would answer.

        Raises ``KeyError`` for an unknown instance and ``NotServingError`` for one that is not serving.
        """
        snap = self._snapshot
        if snap is None:
            if instance_id is not None:
                raise KeyError(instance_id)
            return b""
        cached = snap.pages.get(instance_id)  # two racing scrapes may both render: harmless
        if cached is not None:
            return cached
        if instance_id is None:
            rows = np.flatnonzero(snap.serving)
        else:
            row = snap.index[instance_id]
            if not snap.serving[row]:
                raise NotServingError(
                    f"instance {instance_id!r} is {snap.samples.states[row]}, not serving metrics"
                )
            rows = np.array([row])
        page = snap.pages[instance_id] = render_text(snap, rows)
        return page

    # -- HTTP ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("SimMetricsExporter.port: call start() first")
        return self._bound_port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        return f"http://{self._host}:{self.port}"

    @property
    def targets_url(self) -> str:
        """The ``http_sd_configs`` URL (``/targets.json``)."""
        return f"{self.url}/targets.json"

    def start(self) -> None:
        """Bind (port 0 = a free port picked by the kernel) and serve in a daemon thread."""
        if self._server is not None:
            raise RuntimeError("SimMetricsExporter.start: already started")
        self._server = ThreadingHTTPServer((self._host, self._port), _make_handler(self))
        self._server.daemon_threads = True
        self._bound_port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="sim-exporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> SimMetricsExporter:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _make_handler(exporter: SimMetricsExporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body in one buffered write, sent without Nagle's delay: otherwise a keep-alive client's
        # delayed ACK adds ~40 ms to every request.
        wbufsize = -1
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path == "/metrics":
                self._send(200, exporter.render(), CONTENT_TYPE_TEXT_004)
            elif path == "/targets.json":
                self._send(200, json.dumps(exporter.targets()).encode(), "application/json")
            elif match := _INSTANCE_PATH.match(path):
                iid = urllib.parse.unquote(match.group(1))
                try:
                    self._send(200, exporter.render(iid), CONTENT_TYPE_TEXT_004)
                except KeyError:
                    self._send(404, f"no instance {iid!r}\n".encode(), "text/plain; charset=utf-8")
                except NotServingError as err:
                    self._send(503, f"{err}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's signature
            return  # scrapes every second would flood stderr

    return Handler


# -- the real-time driver --------------------------------------------------------------------------


class ObservableSim(Protocol):
    """What ``run_realtime`` needs of ``serving.sim.engine.Simulator``."""

    now_s: float

    def run_until(self, t_s: float) -> None: ...

    def observe(self) -> InstanceSamples: ...


class RealtimeClock(Protocol):
    """Wall time for the driver; tests inject one whose ``sleep`` advances ``monotonic``."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def run_realtime(
    simulator: ObservableSim,
    exporter: SimMetricsExporter,
    *,
    until_s: float,
    speed: float = 1.0,
    step_s: float = 0.1,
    clock: RealtimeClock | None = None,
    stop: threading.Event | None = None,
    on_tick: Callable[[float], None] | None = None,
) -> float:
    """Advance ``simulator`` with wall time until its clock reaches ``until_s``; return the final ``now_s``.

    Every ``step_s`` wall seconds the simulator runs to ``start + elapsed_wall * speed`` (a late wake-up
    catches up, it never skips), its ``observe()`` is published with ``exporter.update`` and ``on_tick(now_s)``
    is called — the place for a controller to call ``simulator.set_target``, on this same thread (the
    simulator is not thread-safe). ``stop`` ends the run early. Example: a 10-minute trace replayed in one
    minute at ``speed=10.0`` while a real Prometheus scrapes the exporter every second.
    """
    if not speed > 0 or not math.isfinite(speed):
        raise ValueError(f"run_realtime: speed must be a positive finite number, got {speed}")
    if not step_s > 0:
        raise ValueError(f"run_realtime: step_s must be > 0, got {step_s}")
    if until_s < simulator.now_s:
        raise ValueError(f"run_realtime: until_s={until_s} is before the simulator's now_s={simulator.now_s}")
    wall = clock if clock is not None else SystemClock()
    start_wall_s, start_sim_s = wall.monotonic(), simulator.now_s
    exporter.update(simulator.observe())
    while simulator.now_s < until_s and not (stop is not None and stop.is_set()):
        if stop is not None and clock is None:
            stop.wait(step_s)  # wakes at once when stopped
        else:
            wall.sleep(step_s)
        target_s = min(until_s, start_sim_s + (wall.monotonic() - start_wall_s) * speed)
        if target_s > simulator.now_s:
            simulator.run_until(target_s)
        exporter.update(simulator.observe())
        if on_tick is not None:
            on_tick(simulator.now_s)
    return simulator.now_s
