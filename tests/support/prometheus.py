"""A real Prometheus server for tests: Debian's ``prometheus`` binary on a free loopback port.

Usage::

    job = ScrapeJob(job="vllm", targets=("127.0.0.1:8000",), scrape_interval_s=1.0, honor_labels=True)
    with PrometheusServer(prometheus_bin, jobs=[job]) as prom:
        prom.wait_for_query('vllm:num_requests_running', timeout_s=5.0)

History for training or source tests is written as OpenMetrics text and turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics`` (``backfill_openmetrics``); start the server on that
data dir with a long retention (``retention="10y"``) or the old blocks are deleted at start-up.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

LOG_TAIL_LINES = 30
# Prometheus 2.x's discovery manager hands new targets to the scrape manager on a fixed 5 s tick, so the
# first sample of a fresh server arrives ~5-6 s after /-/ready (measured 5.8 s). Budget waits with it.
DISCOVERY_DELAY_S = 5.0
_PORT_RETRIES = 3
# A Unix time above this is in milliseconds (1e11 s is the year 5138): promtool would accept it silently.
_MAX_PLAUSIBLE_UNIX_S = 1e11


class PrometheusError(RuntimeError):
    """Prometheus or promtool failed; the message carries the last log lines."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the kernel picks it; a race with other processes is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _quote(value: str) -> str:
    return json.dumps(value)  # YAML is a superset of JSON: a JSON string is a safe YAML scalar


@dataclass(frozen=True)
class ScrapeJob:
    """One ``scrape_configs`` entry.

    ``targets`` are ``host:port`` strings with the same ``labels``; ``http_sd_url`` (e.g. an exporter's
    ``/targets.json``) lets Prometheus discover targets and their labels itself, every ``refresh_s``.
    """

    job: str
    targets: tuple[str, ...] = ()
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float | None = None  # default: the scrape interval
    metrics_path: str = "/metrics"
    honor_labels: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    http_sd_url: str | None = None
    refresh_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("ScrapeJob.job must not be empty")
        if not self.targets and self.http_sd_url is None:
            raise ValueError(f"ScrapeJob {self.job!r}: give targets or http_sd_url")
        if not self.scrape_interval_s > 0:
            raise ValueError(f"ScrapeJob.scrape_interval_s must be > 0, got {self.scrape_interval_s}")

    def to_yaml(self) -> str:
        timeout_s = self.scrape_timeout_s if self.scrape_timeout_s is not None else self.scrape_interval_s
        lines = [
            f"  - job_name: {_quote(self.job)}",
            f"    scrape_interval: {_duration(self.scrape_interval_s)}",
            f"    scrape_timeout: {_duration(timeout_s)}",
            f"    metrics_path: {_quote(self.metrics_path)}",
            f"    honor_labels: {'true' if self.honor_labels else 'false'}",
        ]
        if self.targets:
            lines.append("    static_configs:")
            lines.append(f"      - targets: [{', '.join(_quote(t) for t in self.targets)}]")
            if self.labels:
                lines.append("        labels:")
                lines.extend(f"          {_quote(k)}: {_quote(v)}" for k, v in self.labels.items())
        if self.http_sd_url is not None:
            lines.append("    http_sd_configs:")
            lines.append(f"      - url: {_quote(self.http_sd_url)}")
            lines.append(f"        refresh_interval: {_duration(self.refresh_s)}")
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    """A Prometheus duration string; milliseconds keep sub-second intervals exact."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be at least 1 ms, got {seconds} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def render_config(
    jobs: Sequence[ScrapeJob],
    *,
    evaluation_interval_s: float = 1.0,
    out_of_order_window_s: float | None = None,
) -> str:
    """The ``prometheus.yml`` text for these jobs."""
    lines = ["global:", f"  evaluation_interval: {_duration(evaluation_interval_s)}"]
    if out_of_order_window_s is not None:
        lines += ["storage:", "  tsdb:", f"    out_of_order_time_window: {_duration(out_of_order_window_s)}"]
    lines.append("scrape_configs:" if jobs else "scrape_configs: []")
    lines.extend(job.to_yaml() for job in jobs)
    return "\n".join(lines) + "\n"


class PrometheusServer:
    """A Prometheus process on ``127.0.0.1:<free port>`` with its own data dir; a context manager.

    ``data_dir=None`` makes a temporary directory that ``stop()`` removes; a given ``data_dir`` is
    kept (so backfilled blocks can be served). The remote-write receiver and the admin API are on.
    """

    def __init__(
        self,
        binary: str = "prometheus",
        jobs: Sequence[ScrapeJob] = (),
        *,
        data_dir: str | os.PathLike[str] | None = None,
        retention: str | None = None,
        evaluation_interval_s: float = 1.0,
        out_of_order_window_s: float | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.jobs = tuple(jobs)
        self.retention = retention
        self.evaluation_interval_s = evaluation_interval_s
        self.out_of_order_window_s = out_of_order_window_s
        self.extra_args = tuple(extra_args)
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self._work_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        if self._port is None:
            raise PrometheusError("PrometheusServer.url: the server has not been started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def data_dir(self) -> Path:
        if self._given_data_dir is not None:
            return self._given_data_dir
        if self._work_dir is None:
            raise PrometheusError("PrometheusServer.data_dir: the server has not been started")
        return self._work_dir / "data"

    @property
    def log_path(self) -> Path:
        if self._work_dir is None:
            raise PrometheusError("PrometheusServer.log_path: the server has not been started")
        return self._work_dir / "prometheus.log"

    def start(self) -> None:
        """Write the config and launch the process (returns at once; see ``wait_ready``)."""
        if self._proc is not None:
            raise PrometheusError("PrometheusServer.start: already started")
        resolved = shutil.which(self.binary)
        if resolved is None:
            raise PrometheusError(f"Prometheus binary {self.binary!r} not found on PATH")
        self._work_dir = Path(tempfile.mkdtemp(prefix="pdscale-prom-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._work_dir / "prometheus.yml"
        config.write_text(
            render_config(
                self.jobs,
                evaluation_interval_s=self.evaluation_interval_s,
                out_of_order_window_s=self.out_of_order_window_s,
            )
        )
        self._port = free_port()
        args = [
            resolved,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self._port}",
            "--web.enable-remote-write-receiver",
            "--web.enable-admin-api",
            "--web.enable-lifecycle",
        ]
        if self.retention is not None:
            args.append(f"--storage.tsdb.retention.time={self.retention}")
        args.extend(self.extra_args)
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def wait_ready(self, timeout_s: float = 15.0) -> None:
        """Poll ``/-/ready`` until it answers 200; raise ``PrometheusError`` with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is None:
                raise PrometheusError("PrometheusServer.wait_ready: the server has not been started")
            code = self._proc.poll()
            if code is not None:
                raise PrometheusError(
                    f"Prometheus exited with status {code} before ready:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() >= deadline:
                raise PrometheusError(
                    f"Prometheus not ready after {timeout_s} s at {self.url}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate (SIGTERM), wait, then kill; remove the temp dir (a given ``data_dir`` is kept)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines Prometheus logged."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, PrometheusError):
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> PrometheusServer:
        # The free port can be taken by another process between probing and binding: retry that case only.
        for attempt in range(_PORT_RETRIES):
            self.start()
            try:
                self.wait_ready()
                return self
            except PrometheusError as err:
                port_lost = "address already in use" in str(err)
                self.stop()
                if not port_lost or attempt == _PORT_RETRIES - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- HTTP API (plain urllib, so the fixture needs no client library) -------------------------

    def api(self, path: str, params: Mapping[str, str | float] | None = None) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data`` field; an API error raises ``PrometheusError``."""
        query = urllib.parse.urlencode({k: str(v) for k, v in (params or {}).items()})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10.0) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            raise PrometheusError(
                f"GET {url}: HTTP {err.code}: {err.read().decode(errors='replace')}"
            ) from err
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query: the ``result`` list (vector, one entry per series)."""
        data = self.api("query", {"query": promql})
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for_targets_up(self, timeout_s: float = DISCOVERY_DELAY_S + 5.0, *, count: int = 1) -> None:
        """Wait until at least ``count`` active targets exist and every one is ``up``."""
        deadline = time.monotonic() + timeout_s
        while True:
            active = self.api("targets")["activeTargets"]
            health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active]
            if len(active) >= count and all(h == "up" for _, h, _ in health):
                return
            if time.monotonic() >= deadline:
                raise PrometheusError(f"targets not all up within {timeout_s} s (want {count}): {health!r}")
            time.sleep(0.1)

    def wait_for_query(
        self,
        promql: str,
        *,
        timeout_s: float,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        poll_s: float = 0.2,
    ) -> list[dict[str, Any]]:
        """Poll an instant query until ``predicate(result)`` holds; raise with the last result otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                targets = self.api("targets")
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets["activeTargets"]]
                raise PrometheusError(
                    f"query {promql!r} did not satisfy the condition within {timeout_s} s; "
                    f"last result: {result!r}; targets: {health!r}"
                )
            time.sleep(poll_s)


# -- backfill ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Series:
    """One time series to backfill: ``timestamps_s`` strictly increasing Unix seconds, ``values`` aligned."""

    name: str
    labels: Mapping[str, str]
    timestamps_s: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        ts = np.asarray(self.timestamps_s, dtype=np.float64)
        vs = np.asarray(self.values, dtype=np.float64)
        where = f"Series {self.name}{dict(self.labels)}"
        if ts.ndim != 1 or ts.shape != vs.shape:
            raise ValueError(
                f"{where}: timestamps_s {ts.shape} and values {vs.shape} must be equal 1-D shapes"
            )
        if len(ts) and not np.all(np.isfinite(ts)):
            raise ValueError(f"{where}: timestamps_s must be finite")
        if len(ts) > 1 and not np.all(np.diff(ts) > 0):
            bad = int(np.argmax(np.diff(ts) <= 0)) + 1
            raise ValueError(f"{where}: timestamps_s must be strictly increasing; index {bad} is {ts[bad]}")
        if len(ts) and ts[-1] > _MAX_PLAUSIBLE_UNIX_S:
            raise ValueError(
                f"{where}: timestamp {ts[-1]} looks like milliseconds; OpenMetrics wants seconds"
            )


def _escape_label_value(value: str) -> str:
    """OpenMetrics knows exactly three escapes (backslash, double quote, newline); the rest is raw UTF-8."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label_value(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def openmetrics_text(series: Iterable[Series]) -> str:
    """OpenMetrics exposition of ``series``: grouped by metric name (a family may not interleave), ``# EOF``.

    Timestamps are written in seconds with millisecond precision, as promtool expects.
    """
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    chunks: list[str] = []
    for name, group in by_name.items():
        chunks.append(f"# TYPE {name} unknown\n")
        for s in group:
            prefix = f"{name}{_label_text(s.labels)} "
            ts_text = np.char.mod("%.3f", np.asarray(s.timestamps_s, dtype=np.float64))
            vals = np.asarray(s.values, dtype=np.float64)
            val_text = np.char.mod("%.17g", vals).astype("U32")  # %.17g round-trips a float64 exactly
            val_text[np.isnan(vals)] = "NaN"
            val_text[np.isposinf(vals)] = "+Inf"
            val_text[np.isneginf(vals)] = "-Inf"
            lines = np.char.add(np.char.add(np.char.add(prefix, val_text), " "), ts_text)
            chunks.append("\n".join(lines.tolist()) + "\n" if len(lines) else "")
    chunks.append("# EOF\n")
    return "".join(chunks)


def backfill_openmetrics(
    series: Iterable[Series],
    data_dir: str | os.PathLike[str],
    *,
    promtool: str = "promtool",
    timeout_s: float = 300.0,
) -> Path:
    """Write ``series`` as TSDB blocks into ``data_dir`` (created if needed) with promtool; return it.

    Serve them with ``PrometheusServer(data_dir=data_dir, retention="10y")``.
    """
    resolved = shutil.which(promtool)
    if resolved is None:
        raise PrometheusError(f"promtool binary {promtool!r} not found on PATH")
    out = Path(data_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", suffix=".om", prefix="pdscale-backfill-", delete=False
    ) as fh:
        fh.write(openmetrics_text(series))
        src = fh.name
    try:
        proc = subprocess.run(
            [resolved, "tsdb", "create-blocks-from", "openmetrics", src, str(out)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    finally:
        os.unlink(src)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise PrometheusError(f"promtool create-blocks-from openmetrics failed ({proc.returncode}):\n{tail}")
    return out
