"""The controller daemon: every ``tick_s`` scrape → decide → apply, with one error boundary.

One tick (``Daemon.tick``):

1. poll the leader election (if any): only the leader applies; followers do everything else (warm);
2. read every pool's replicas from the actuator — the cluster's state, never a remembered guess, so a
   controller killed mid-scale and restarted carries on from what the cluster has (its first tick also
   seeds the policy's hysteresis from those counts: no scale-down before ``scale_down_delay_s``);
3. scrape the source (Prometheus) at ``clock.time()``;
4. ``Pipeline.tick``: aggregate → forecast → observation → ``decide`` → GPU budget;
5. apply each pool's plan (``None`` = no opinion: nothing is applied, so unknown data never scales down),
   write the audit log and the metrics.

Errors are caught at one boundary (``_failed``), counted by kind (``source_unavailable``,
``actuator_unavailable``, ``permanent``, ``unexpected``), logged with their message, and the loop goes on;
a temporary error delays the next tick by its ``retry_after_s`` (capped at ``max_retry_s``). A failure to
apply one pool's plan does not stop the others. Ticks are time-based (a late tick is not made up twice).
SIGTERM/SIGINT finish the current tick, release the lease and stop (``serve`` returns 0).

Structured logs: every record carries ``event`` and friends as ``extra`` fields; ``JsonFormatter`` writes
them as one JSON object per line (``pdscale controller --log-format json``).
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from controller.actuators.base import (
    Actuator,
    ActuatorError,
    ActuatorUnavailable,
    ApplyResult,
    PoolReplicas,
    ReplicaBounds,
)
from controller.audit import AuditLog, decision_record
from controller.clock import Clock, WallClock
from controller.config import ControllerConfig
from controller.leader import LeaderElector, LeaderSettings
from controller.pipeline import Pipeline, PoolCounts, PoolDecision, PoolSetup, TickResult, setups_from_config
from controller.policy.types import ROLES
from controller.sources.prometheus import SourceError, SourceUnavailable
from controller.telemetry import Telemetry, TelemetryServer
from forecaster.types import Forecaster
from serving.sim.samples import InstanceSamples

if TYPE_CHECKING:
    from controller.forecasting import CombinationMode
    from serving.pools.manager import PoolManager, PoolSettings

log = logging.getLogger(__name__)

MAX_RETRY_S = 30.0  # a temporary error never delays the next tick longer than this
STUCK_AFTER_TICKS = 5  # /healthz fails after this many ticks (plus the longest retry wait) without progress
SLEEP_SLICE_S = 0.25  # the wall-clock wait is cut in slices so a stop request is seen promptly


class MetricsSource(Protocol):
    """Where the loop's per-instance samples come from (``PrometheusSource``)."""

    def scrape(self, now_s: float) -> InstanceSamples: ...


def counts_from_replicas(r: PoolReplicas) -> PoolCounts:
    """A pool's counts as the actuator reads them: spec replicas, ready ones serving, the rest starting."""
    return PoolCounts(
        replicas={role: r.role(role).replicas for role in ROLES},
        active={role: r.role(role).ready for role in ROLES},
        standby={role: r.role(role).standby_ready for role in ROLES},
        provisioning={role: max(r.role(role).replicas - r.role(role).ready, 0) for role in ROLES},
    )


def classify(exc: BaseException) -> tuple[str, float | None]:
    """The error's kind for the metrics and its retry delay (None = permanent: retry at the next tick)."""
    if isinstance(exc, SourceUnavailable):
        return "source_unavailable", exc.retry_after_s
    if isinstance(exc, ActuatorUnavailable):
        return "actuator_unavailable", exc.retry_after_s
    if isinstance(exc, SourceError | ActuatorError):
        return "permanent", None
    return "unexpected", None


@dataclass(frozen=True)
class TickReport:
    """What one tick did: ``ok`` False when an error ended it (its ``kind`` and ``message``)."""

    now_s: float
    ok: bool
    leader: bool
    result: TickResult | None = None
    applied: Mapping[str, ApplyResult] = field(default_factory=dict)
    kind: str | None = None
    message: str | None = None
    retry_after_s: float | None = None


class Daemon:
    """The imperative shell around ``Pipeline`` (see the module docstring).

    ``elector`` None = this replica always leads (one controller). ``telemetry``/``audit`` optional.
    ``gpu_shares``: pool -> GPUs of ``gpu_budget`` guaranteed to it (``Pipeline(gpu_shares=...)``).
    ``forecaster_fallback``: why the configured forecaster could not be used (logged and exported once).
    """

    def __init__(
        self,
        pools: Sequence[PoolSetup],
        source: MetricsSource,
        actuator: Actuator,
        forecaster: Forecaster,
        *,
        clock: Clock,
        tick_s: float,
        gpu_budget: int | None = None,
        gpu_shares: Mapping[str, int] | None = None,
        telemetry: Telemetry | None = None,
        audit: AuditLog | None = None,
        elector: LeaderElector | None = None,
        max_retry_s: float = MAX_RETRY_S,
        forecaster_fallback: str | None = None,
    ) -> None:
        if not (math.isfinite(tick_s) and tick_s > 0):
            raise ValueError(f"Daemon.tick_s must be a positive number, got {tick_s!r}")
        if not (math.isfinite(max_retry_s) and max_retry_s >= 0):
            raise ValueError(f"Daemon.max_retry_s must be >= 0, got {max_retry_s!r}")
        self.pools = list(pools)
        self.bounds = {p.name: ReplicaBounds.from_policy(p.policy) for p in self.pools}
        self.source = source
        self.actuator = actuator
        self.clock = clock
        self.tick_s = tick_s
        self.max_retry_s = max_retry_s
        self.telemetry = telemetry
        self.audit = audit
        self.elector = elector
        self.pipeline = Pipeline(self.pools, forecaster, gpu_budget=gpu_budget, gpu_shares=gpu_shares)
        for (
            track
        ) in self.pipeline.tracks.values():  # load the capacity model now, not in the first tick (~1 s)
            track.capacity.get(math.nan, math.nan)
        self.recovered = False
        self.ticks = 0
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._elector_failures = 0
        self._degraded: set[str] = set()
        self._silent: set[str] = set()
        self._latency_scale: dict[str, float] = {}  # pool -> the latency correction's factor last logged
        self._closers: list[tuple[str, Callable[[], None]]] = []
        if telemetry is not None:
            telemetry.set_forecaster(forecaster.name, forecaster_fallback is not None)
        if forecaster_fallback is not None:
            log.warning(
                "forecaster fallback: %s; the policy runs on the %s baseline (measured load is a floor)",
                forecaster_fallback,
                forecaster.name,
                extra={"event": "forecaster_fallback", "forecaster": forecaster.name},
            )

    # -- control ---------------------------------------------------------------------------------

    def on_close(self, what: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the daemon closes (last registered, first run): what it owns, e.g. a local pool."""
        self._closers.append((what, fn))

    def close(self) -> None:
        """Release what the daemon owns (``on_close``), each once, newest first; a failure is logged and the
        others still run. Idempotent. ``serve`` calls it on every exit. Interrupted (a second SIGTERM while a
        pool stops), the unfinished one stays registered, so the caller's next ``close`` finishes it."""
        while self._closers:
            what, fn = self._closers[-1]
            try:
                fn()
                self._closers.pop()
            except Exception as exc:
                self._closers.pop()
                log.error("closing %s failed: %s: %s", what, type(exc).__name__, exc,
                          extra={"event": "close_failed", "what": what})  # fmt: skip

    def request_stop(self) -> None:
        """Stop after the current tick (safe from a signal handler or another thread)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, max_ticks: int | None = None) -> int:
        """Tick every ``tick_s`` until stopped or ``max_ticks`` ticks ran; returns the number of failed ticks."""
        failed = 0
        next_s = self.clock.monotonic()
        n = 0
        while not self._stop.is_set() and (max_ticks is None or n < max_ticks):
            self._sleep_until(next_s)
            if self._stop.is_set():
                break
            started = self.clock.monotonic()
            report = self.tick()
            n += 1
            failed += 0 if report.ok else 1
            next_s = max(next_s + self.tick_s, started)  # time-based; an overrun is not made up twice
            if report.retry_after_s is not None:
                next_s = max(next_s, self.clock.monotonic() + min(report.retry_after_s, self.max_retry_s))
            if max_ticks is not None and n >= max_ticks:
                break
        if self.elector is not None:
            self.elector.release()
            if self.telemetry is not None:
                self.telemetry.set_leader(False)
        log.info("controller stopped after %d tick(s), %d failed", n, failed, extra={"event": "stopped"})
        return failed

    def _sleep_until(self, deadline_s: float) -> None:
        while not self._stop.is_set():
            left = deadline_s - self.clock.monotonic()
            if left <= 0:
                return
            self.clock.sleep(min(left, SLEEP_SLICE_S))

    # -- one tick --------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One scrape → decide → apply; every error is caught here, counted, logged and reported."""
        started = self.clock.monotonic()
        now_s = self.clock.time()
        leader = True
        try:
            leader = self._leader()
            counts = self._read_counts(now_s)
            samples = self.source.scrape(now_s)
            if self.telemetry is not None:
                self.telemetry.serving_counters(samples)
            result = self.pipeline.tick(samples, counts, now_s)
            applied = self._apply_all(result, counts, leader)
        except Exception as exc:  # the one error boundary: count, log, keep running
            return self._failed(exc, now_s, started, leader)
        finally:
            self.ticks += 1
            if self.telemetry is not None:
                self.telemetry.loop_turned()
        if self.audit is not None:
            self.audit.flush()
        duration = self.clock.monotonic() - started
        if self.telemetry is not None:
            self.telemetry.tick_ok(now_s, duration)
        return TickReport(now_s, True, leader, result, applied)

    def _leader(self) -> bool:
        if self.elector is None:
            if self.telemetry is not None:
                self.telemetry.set_leader(True)
            return True
        leader = self.elector.poll()
        new_failures = self.elector.failures - self._elector_failures
        self._elector_failures = self.elector.failures
        if self.telemetry is not None:
            self.telemetry.set_leader(leader)
            for _ in range(new_failures):
                self.telemetry.error("leader_election")
        return leader

    def _read_counts(self, now_s: float) -> dict[str, PoolCounts]:
        counts = {}
        for pool in self.pools:
            counts[pool.name] = counts_from_replicas(self.actuator.current(pool.name))
            if self.telemetry is not None:
                self.telemetry.pool_current(pool.name, counts[pool.name].replicas)
        if not self.recovered:
            self.pipeline.recover(counts, now_s)
            self.recovered = True
            log.info(
                "recovered from the cluster's state: %s",
                {p: dict(c.replicas) for p, c in counts.items()},
                extra={"event": "recovered", "replicas": {p: dict(c.replicas) for p, c in counts.items()}},
            )
        return counts

    def _apply_all(
        self, result: TickResult, counts: Mapping[str, PoolCounts], leader: bool
    ) -> dict[str, ApplyResult]:
        applied: dict[str, ApplyResult] = {}
        if result.forecast_error is not None and self.telemetry is not None:
            self.telemetry.forecast_failures.inc()
        for name, decision in result.decisions.items():
            if self.telemetry is not None:
                complete = decision.observation.complete
                self.telemetry.pool_decision(name, decision.plan, decision.forecast, complete)
                self.telemetry.pool_latency(name, decision.latency_scale, decision.latency_estimate)
            self._note_degrade(name, decision)
            self._note_silence(name, decision)
            self._note_latency(name, decision)
            if decision.vanished:
                log.warning(
                    "pool %s: instances vanished from the scrape: %s; no scale-down on this tick",
                    name,
                    list(decision.vanished),
                    extra={"event": "vanished", "pool": name, "instances": list(decision.vanished)},
                )
            outcome: ApplyResult | None = None
            skipped: str | None = None
            error: str | None = None
            if decision.plan is None:
                skipped = "no opinion"
            elif not leader:
                skipped = "follower"
            else:
                try:
                    outcome = self.actuator.apply(decision.plan, self.bounds[name])
                    applied[name] = outcome
                except Exception as exc:  # one pool's failure does not stop the others
                    error = f"{type(exc).__name__}: {exc}"
                    self._count_error(exc, f"apply {name}")
                    self.pipeline.rollback(name)
            self._log_decision(result.now_s, decision, outcome, skipped, leader)
            if outcome is not None and self.telemetry is not None:
                for c in outcome.changes:
                    self.telemetry.change(c.pool, c.role, c.tier, c.before, c.after)
            if self.audit is not None:
                self.audit.write(
                    decision_record(
                        result.now_s, decision, counts[name], leader=leader, applied=outcome,
                        skipped=skipped, error=error, forecaster=result.forecaster,
                    )
                )  # fmt: skip
        return applied

    def _note_degrade(self, pool: str, decision: PoolDecision) -> None:
        """Say it once when demand goes beyond max replicas (degradation) and once when it is lifted."""
        if decision.plan is not None:
            why = "; ".join(r for r in decision.reasons if r.startswith(("degrade", "need")))
            self._note_flag(
                pool, decision.plan.degrade, self._degraded, ("degrade", "degrade"),
                f"demand beyond max replicas: degrading ({why})", "degradation lifted",
            )  # fmt: skip

    def _note_silence(self, pool: str, decision: PoolDecision) -> None:
        """Say it once when a pool's arrivals stop dead (the policy holds its capacity: an outage upstream?) and
        once when the hold ends."""
        if decision.plan is not None:
            why = next((r for r in decision.reasons if r.startswith("silence")), "arrivals stopped dead")
            self._note_flag(
                pool, decision.plan.silent, self._silent, ("silence", "silent"), why,
                "silence hold over (arrivals are back, a queue waits, or the hold ran out)",
            )  # fmt: skip

    def _note_latency(self, pool: str, decision: PoolDecision) -> None:
        """One line each time the latency correction's factor changes (it moves in 5 % steps, rarely): a warning
        when the pool is sized at another speed than its profile's, an info line when it is back to the profile."""
        scale, before = decision.latency_scale, self._latency_scale.get(pool, 1.0)
        if scale == before:
            return
        self._latency_scale[pool] = scale
        extra = {
            "event": "latency_correction",
            "pool": pool,
            "factor": scale,
            "estimate": decision.latency_estimate,
        }
        if scale != 1.0:
            log.warning(
                "pool %s: engines measured %.2fx the profile's decode step time (estimate %.3f): capacities sized at"
                " that speed (policy.latency_correction)", pool, scale, decision.latency_estimate, extra=extra,
            )  # fmt: skip
        else:
            log.info(
                "pool %s: engines back within 15 %% of the profile: capacities at the profile's",
                pool,
                extra=extra,
            )

    @staticmethod
    def _note_flag(
        pool: str, on: bool, held: set[str], event: tuple[str, str], started: str, ended: str
    ) -> None:
        """A warning when ``pool``'s flag turns on, an info line when it turns off: ``event`` is the log event's
        name and the field that carries the flag; ``held`` remembers the pools whose flag is on."""
        name, flag = event
        if on and pool not in held:
            held.add(pool)
            log.warning("pool %s: %s", pool, started, extra={"event": name, "pool": pool, flag: True})
        elif not on and pool in held:
            held.discard(pool)
            log.info("pool %s: %s", pool, ended, extra={"event": name, "pool": pool, flag: False})

    def _log_decision(
        self, now_s: float, d: PoolDecision, outcome: ApplyResult | None, skipped: str | None, leader: bool
    ) -> None:
        plan = d.plan
        counts = {"prefill": plan.prefill, "decode": plan.decode} if plan is not None else None
        changes = [f"{c.role}/{c.tier} {c.before}->{c.after}" for c in outcome.changes] if outcome else []
        level = logging.INFO if changes or plan is None else logging.DEBUG
        log.log(
            level,
            "pool %s: %s%s",
            d.pool,
            f"plan {counts}" if counts is not None else "no opinion (load unknown): holding",
            f"; applied {changes}" if changes else (f"; {skipped}" if plan is not None and skipped else ""),
            extra={
                "event": "decision",
                "pool": d.pool,
                "plan": counts,
                "changes": changes,
                "skipped": skipped,
                "leader": leader,
                "reasons": list(d.reasons),
            },
        )

    def _count_error(self, exc: BaseException, where: str) -> tuple[str, float | None]:
        kind, retry = classify(exc)
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if self.telemetry is not None:
            self.telemetry.error(kind)
        log.log(
            logging.ERROR if kind == "unexpected" else logging.WARNING,
            "%s failed (%s): %s: %s",
            where,
            kind,
            type(exc).__name__,
            exc,
            exc_info=exc if kind == "unexpected" else None,
            extra={"event": "error", "kind": kind, "where": where, "retry_after_s": retry},
        )
        return kind, retry

    def _failed(self, exc: Exception, now_s: float, started: float, leader: bool) -> TickReport:
        kind, retry = self._count_error(exc, "tick")
        if self.telemetry is not None:
            self.telemetry.ticks.labels(outcome="error").inc()
            self.telemetry.tick_seconds.observe(self.clock.monotonic() - started)
        return TickReport(now_s, False, leader, kind=kind, message=str(exc), retry_after_s=retry)


# -- building one from a config ------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def load_forecaster(
    path: Path | None,
    *,
    burst_detector: bool = False,
    combination: CombinationMode = "off",
    length_guard: bool = True,
) -> tuple[Forecaster, str | None]:
    """``controller.forecasting.load_default_forecaster`` plus why it fell back (None = it did not).
    ``burst_detector``: wrap it with the onset detector (``ControllerConfig.forecaster_burst_detector``);
    ``combination``: run it inside the online combination (``ControllerConfig.forecaster_combination``);
    ``length_guard``: ``ControllerConfig.forecaster_length_guard``."""
    from controller.forecasting import load_default_forecaster

    capture = _Capture()
    logger = logging.getLogger("controller.forecasting")
    logger.addHandler(capture)
    try:
        forecaster = load_default_forecaster(
            path, burst_detector=burst_detector, combination=combination, length_guard=length_guard
        )
    finally:
        logger.removeHandler(capture)
    return forecaster, (capture.messages[-1] if capture.messages else None)


@dataclass(frozen=True)
class DaemonOptions:
    """Command-line choices beside the config file."""

    dry_run: bool = False  # kubernetes actuator in advisory mode
    leader: LeaderSettings | None = None  # None = no leader election (one replica)
    metrics_port: int | None = None  # overrides the config's (0 = any free port)
    in_cluster: bool = False


def build_source(cfg: ControllerConfig, pool: PoolManager | None = None) -> MetricsSource:
    """The configured source: ``prometheus``, or ``direct`` over ``pool`` (the daemon's local pool)."""
    from controller.settings import LabelMap, PrometheusSettings
    from controller.sources.prometheus import PrometheusSource

    s = cfg.source
    if s.kind == "direct":
        from controller.sources.direct import DirectSource

        if pool is None:
            raise ValueError("source.kind 'direct' scrapes the local pool: it needs actuator.kind 'local'")
        return DirectSource(pool, timeout_s=s.timeout_s)
    if s.kind != "prometheus" or s.url is None:
        raise ValueError(f"the daemon reads Prometheus or its local pool: source.kind is {s.kind!r}")
    labels = LabelMap(instance=s.instance_label, pool=s.pool_label, role=s.role_label)
    settings = PrometheusSettings(
        url=s.url,
        labels=labels,
        timeout_s=s.timeout_s,
        bearer_token_file=s.bearer_token_file,
        ca_file=s.ca_file,
    )
    return PrometheusSource.from_settings(settings)


def build_actuator(
    cfg: ControllerConfig,
    options: DaemonOptions,
    client: Any | None,
    *,
    clock: Clock | None = None,
    elector: LeasePoller | None = None,
    pool: PoolManager | None = None,
) -> Actuator:
    """The configured actuator; with ``actuator.router_admin``, wrapped in ``DrainingActuator`` (see
    ``wrap_draining``: ``clock`` times the drain, ``elector`` is kept renewed while it waits). Kind
    ``local`` scales ``pool`` (``LocalPoolActuator``; ``build_daemon`` makes it with ``local_pool``)."""
    if cfg.actuator.kind == "local":
        from controller.actuators.local import LocalPoolActuator

        if pool is None:
            raise ValueError(
                "actuator.kind 'local' needs its PoolManager (build_daemon makes it from actuator.pool)"
            )
        return LocalPoolActuator(pool)
    inner = _base_actuator(cfg, options, client)
    if cfg.actuator.router_admin is None:
        return inner
    return wrap_draining(inner, cfg, client, clock=clock or WallClock(), elector=elector)


def _base_actuator(cfg: ControllerConfig, options: DaemonOptions, client: Any | None) -> Actuator:
    from controller.actuators.base import RoleReplicas

    if cfg.actuator.kind == "dry-run":
        from controller.actuators.dryrun import DryRunActuator

        # advisory mode without a cluster: pretend the pools sit at their minimum
        initial = {
            p.name: {
                "prefill": RoleReplicas(p.policy.min_prefill, p.policy.min_prefill),
                "decode": RoleReplicas(p.policy.min_decode, p.policy.min_decode),
            }
            for p in cfg.pools
        }
        return DryRunActuator(initial)
    if cfg.actuator.kind != "kubernetes":
        raise ValueError(
            f"the daemon scales Kubernetes, a local pool or runs dry: actuator.kind is {cfg.actuator.kind!r}"
        )
    from controller.actuators.kubernetes import KubernetesActuator

    if client is None:
        raise ValueError("the kubernetes actuator needs an API client (kubeconfig or in-cluster)")
    return KubernetesActuator(
        cfg.actuator.namespace,
        client,
        request_timeout_s=cfg.actuator.request_timeout_s,
        dry_run=options.dry_run,
    )


class LeasePoller(Protocol):
    """What the drain needs of a ``LeaderElector``: ``poll()`` renews (rate-limited) and says if it leads."""

    def poll(self) -> bool: ...


def read_token(path: Path, field_name: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace dropped); ValueError naming ``field_name``."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"{field_name}: cannot read {path}: {exc.strerror or exc}") from exc
    if not token:
        raise ValueError(f"{field_name}: {path} is empty")
    return token


class KubePods:
    """``PodLister`` for ``PodDeletionCostMarker`` over a ``CoreV1Api``: every call has the request timeout,
    and the API's errors become the actuators' (transport, 409, 429 and 5xx: ``ActuatorUnavailable``; 401 and
    403: ``ActuatorError`` naming the RBAC the marker needs; other statuses: ``ActuatorError``)."""

    def __init__(self, core: Any, *, request_timeout_s: float, retry_after_s: float = 2.0) -> None:
        self.core = core
        self.request_timeout_s = request_timeout_s
        self.retry_after_s = retry_after_s

    def list_namespaced_pod(self, namespace: str, *, label_selector: str = "") -> Any:
        what = f"list pods {label_selector} in namespace {namespace!r}"
        return self._call(what, self.core.list_namespaced_pod, namespace, label_selector=label_selector)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any:
        what = f"patch pod {namespace}/{name} (pod-deletion-cost)"
        return self._call(what, self.core.patch_namespaced_pod, name, namespace, body)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self.request_timeout_s, **kwargs)
        except urllib3.exceptions.HTTPError as err:
            raise ActuatorUnavailable(
                f"Kubernetes API: {what}: {type(err).__name__}: {err}", self.retry_after_s
            ) from err
        except ApiException as err:
            status = err.status or 0
            text = f"Kubernetes API: {what}: HTTP {status}: {err.reason}"
            if status in (0, 409, 429) or status >= 500:
                raise ActuatorUnavailable(text, self.retry_after_s) from err
            if status in (401, 403):
                raise ActuatorError(
                    f"{text} (the router drain's pod marking needs pods list and patch: render the manifests"
                    " with --router-drain, or set actuator.router_admin.mark_pods: false)"
                ) from err
            raise ActuatorError(text) from err


def wrap_draining(
    inner: Actuator,
    cfg: ControllerConfig,
    client: Any | None,
    *,
    clock: Clock,
    elector: LeasePoller | None = None,
) -> Actuator:
    """``inner`` in a ``DrainingActuator`` for ``cfg.actuator.router_admin`` (which must be set).

    One ``RouterAdmin`` per listed pool (token read from its ``token_file`` now: a missing file stops the
    start-up, naming the field), a ``PodDeletionCostMarker`` over ``client`` when ``mark_pods``. The drain
    waits on ``clock``; while it waits the lease is renewed, and a replica that loses it mid-drain stops
    (``ActuatorUnavailable``: the drained backends are put back and the new leader decides).
    """
    from controller.actuators.router_admin import (
        DeletionMarker,
        DrainingActuator,
        DrainSettings,
        PodDeletionCostMarker,
        RouterAdmin,
    )

    ra = cfg.actuator.router_admin
    if ra is None:
        raise ValueError("wrap_draining: the config has no actuator.router_admin section")
    routers = {}
    for pool, endpoint in ra.pools.items():
        token = None
        if endpoint.token_file is not None:
            token = read_token(endpoint.token_file, f"actuator.router_admin.pools.{pool}.token_file")
        routers[pool] = RouterAdmin(endpoint.url, token=token, timeout_s=cfg.actuator.request_timeout_s)
    marker: DeletionMarker | None = None
    if ra.mark_pods:
        if client is None:
            raise ValueError(
                "actuator.router_admin.mark_pods needs a Kubernetes API client (kubeconfig or in-cluster)"
            )
        from kubernetes import client as k8s

        pods = KubePods(k8s.CoreV1Api(client), request_timeout_s=cfg.actuator.request_timeout_s)
        marker = PodDeletionCostMarker(pods, cfg.actuator.namespace)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if elector is not None and not elector.poll():
            raise ActuatorUnavailable("lost the leader lease while draining router backends: stopped", 0.0)

    settings = DrainSettings(drain_timeout_s=ra.drain_timeout_s)
    return DrainingActuator(
        inner, routers, marker=marker, settings=settings, clock=clock.monotonic, sleep=sleep
    )


def kube_client(cfg: ControllerConfig, options: DaemonOptions) -> Any:
    from controller.actuators.kubernetes import api_client

    return api_client(kubeconfig=cfg.actuator.kubeconfig, in_cluster=options.in_cluster)


def build_daemon(
    cfg: ControllerConfig,
    options: DaemonOptions = DaemonOptions(),
    *,
    clock: Clock | None = None,
    source: MetricsSource | None = None,
    client: Any | None = None,
    audit: AuditLog | None = None,
    pool_factory: PoolFactory | None = None,
) -> Daemon:
    """A daemon for a validated config (source ``prometheus`` or ``direct``; actuator ``kubernetes``,
    ``dry-run`` or ``local``).

    ``source`` and ``client`` (a Kubernetes ``ApiClient``) replace the ones the config describes. From the
    config: ``actuator.router_admin`` wraps the actuator in ``DrainingActuator`` (``wrap_draining``),
    ``pools[].gpu_share`` become the pipeline's ``gpu_shares``, ``forecaster_combination`` runs a learned
    forecaster inside the online combination, ``forecaster_burst_detector`` wraps it with the onset detector.

    Kind ``local``: the daemon owns a ``PoolManager`` for ``actuator.pool`` (made by ``pool_factory``,
    default ``local_pool``; tests inject fake servers). Everything else is built first; the pool comes up
    last (its router URL is logged), the healer starts, and ``Daemon.close`` (``serve`` calls it on every
    exit) stops every server. A failure while building stops what was started.
    """
    clock = clock or WallClock()
    pool: PoolManager | None = None
    if cfg.actuator.kind == "local":
        pool = (pool_factory or local_pool)(pool_settings(cfg), cfg.pools[0].name)
    if source is None:
        source = build_source(cfg, pool)
    needs_kube = cfg.actuator.kind == "kubernetes" or options.leader is not None
    if client is None and needs_kube:
        client = kube_client(cfg, options)
    elector = LeaderElector.from_client(client, options.leader, clock) if options.leader is not None else None
    actuator = build_actuator(cfg, options, client, clock=clock, elector=elector, pool=pool)
    forecaster, fallback = load_forecaster(
        cfg.forecaster_checkpoint,
        burst_detector=cfg.forecaster_burst_detector,
        combination=cfg.forecaster_combination,
        length_guard=cfg.forecaster_length_guard,
    )
    telemetry = Telemetry(clock, stuck_after_s=stuck_after_s(cfg))
    if audit is None and cfg.audit_log is not None:
        audit = AuditLog(cfg.audit_log)
    daemon = Daemon(
        setups_from_config(cfg),
        source,
        actuator,
        forecaster,
        clock=clock,
        tick_s=cfg.tick_s,
        gpu_budget=cfg.gpu_budget,
        gpu_shares=cfg.gpu_shares() or None,
        telemetry=telemetry,
        audit=audit,
        elector=elector,
        forecaster_fallback=fallback,
    )
    if pool is not None:
        daemon.on_close(f"local pool {pool.name}", pool.down)
        try:
            start_local_pool(pool, cfg)
        except BaseException:
            daemon.close()
            raise
    return daemon


PoolFactory = Callable[["PoolSettings", str], "PoolManager"]


def pool_settings(cfg: ControllerConfig) -> PoolSettings:
    """``PoolSettings`` for ``actuator.pool`` (the tiny model is built under ``work_dir`` when ``model_dir``
    is not given); a bad value is a ValueError naming the ``actuator.pool`` field."""
    from serving.pools.manager import PoolSettings

    lp = cfg.actuator.pool
    if lp is None:
        raise ValueError("actuator.pool: missing (actuator.kind 'local' needs it)")
    model_dir = lp.model_dir
    if model_dir is None:
        from serving.pools.tinymodel import build_tiny_model

        model_dir = build_tiny_model(lp.work_dir / "tiny", seed=0)
    elif not (model_dir / "config.json").exists():
        raise ValueError(
            f"actuator.pool.model_dir: {model_dir}/config.json not found (not a model directory)"
        )
    mixed: dict[str, Any] = {}
    if lp.placement == "mixed-node":
        given = {"prefill_mem_frac": lp.prefill_mem_frac, "decode_mem_frac": lp.decode_mem_frac,
                 "decode_min_mem_frac": lp.decode_min_mem_frac, "node_kv_space_gib": lp.node_kv_space_gib}  # fmt: skip
        mixed = {"placement": lp.placement, **{k: v for k, v in given.items() if v is not None}}
    try:
        return PoolSettings(
            model_dir=model_dir,
            work_dir=lp.work_dir,
            router_host=lp.router_host,
            router_port=lp.router_port,
            max_num_seqs=lp.max_num_seqs,
            num_gpu_blocks_override=lp.num_gpu_blocks_override,
            max_model_len=lp.max_model_len,
            health_timeout_s=lp.health_timeout_s,
            drain_timeout_s=lp.drain_timeout_s,
            state_path=lp.state_path,
            **mixed,
        )
    except ValueError as exc:
        raise ValueError(f"actuator.pool: {exc}") from exc


def local_pool(settings: PoolSettings, name: str) -> PoolManager:
    """The default ``PoolFactory``: a ``PoolManager`` launching real vLLM servers."""
    from serving.pools.manager import PoolManager

    return PoolManager(settings, name=name)


def start_local_pool(pool: PoolManager, cfg: ControllerConfig) -> str:
    """``pool.up`` with ``actuator.pool``'s counts (servers start in parallel), then the healer when
    ``heal``; logs and returns the router's URL. On failure ``up`` has stopped what it started."""
    lp = cfg.actuator.pool
    if lp is None:
        raise ValueError("actuator.pool: missing (actuator.kind 'local' needs it)")
    log.info(
        "starting local pool %s: %d prefill + %d decode, standby %d prefill + %d decode (logs in %s)",
        pool.name, lp.prefill, lp.decode, lp.standby_prefill, lp.standby_decode, lp.work_dir / "logs",
        extra={"event": "pool_starting", "pool": pool.name},
    )  # fmt: skip
    url = pool.up(
        prefill=lp.prefill,
        decode=lp.decode,
        standby_prefill=lp.standby_prefill,
        standby_decode=lp.standby_decode,
    )
    if lp.heal:
        pool.start_healer()
    log.info("local pool %s serving: router %s", pool.name, url,
             extra={"event": "pool_up", "pool": pool.name, "router_url": url})  # fmt: skip
    return url


def stuck_after_s(cfg: ControllerConfig) -> float:
    """How long ``/healthz`` lets one loop iteration run: a few ticks, the longest retry wait and a scrape
    timeout, plus, with the router drain, one ``drain_timeout_s`` per drained pool (a tick applies the pools
    one after the other, and each may wait that long: the liveness probe must not kill a draining leader),
    and with a local pool its ``health_timeout_s + drain_timeout_s`` (its scale waits for both)."""
    limit = STUCK_AFTER_TICKS * cfg.tick_s + MAX_RETRY_S + cfg.source.timeout_s
    ra = cfg.actuator.router_admin
    if ra is not None:
        limit += ra.drain_timeout_s * len(ra.pools)
    lp = cfg.actuator.pool
    if lp is not None:  # a local scale waits for cold starts and drains inside the tick
        limit += lp.health_timeout_s + lp.drain_timeout_s
    return limit


@contextmanager
def stop_on_signals(daemon: Daemon) -> Iterator[None]:
    """SIGTERM and SIGINT ask the daemon to stop after its tick (main thread only; restored on exit)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info(
            "signal %s: stopping after this tick", signal.Signals(signum).name, extra={"event": "signal"}
        )
        daemon.request_stop()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def serve(daemon: Daemon, *, metrics_port: int | None, max_ticks: int | None = None) -> int:
    """Run ``daemon`` with its endpoints on ``metrics_port`` (None = none) until a signal or ``max_ticks``.

    Returns the process exit code: 0 after a graceful stop; 1 when ``max_ticks`` was given and every tick
    failed (``--once`` against an unreachable Prometheus must not look like success).
    """
    server = None
    if metrics_port is not None and daemon.telemetry is not None:
        server = TelemetryServer(daemon.telemetry, metrics_port)
        server.start()
        log.info("serving /metrics, /healthz, /readyz on port %d", server.port, extra={"event": "listening"})
    try:
        with stop_on_signals(daemon):
            failed = daemon.run(max_ticks=max_ticks)
    finally:
        if server is not None:
            server.stop()
        if daemon.audit is not None:
            daemon.audit.close()
        daemon.close()
    if max_ticks is not None and daemon.ticks and failed == daemon.ticks:
        return 1
    return 0


# -- structured logs ----------------------------------------------------------------------------

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    """Log to stderr as JSON lines (``json``) or plain text (``text``)."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be 'json' or 'text', got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.Formatter.converter = time.gmtime
