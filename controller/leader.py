"""Leader election with a Kubernetes ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Several controller replicas may run; only the lease holder applies plans, the others keep scraping and
deciding (warm) and take over when the holder stops renewing:

- Everyone polls the Lease every ``retry_period_s`` (``poll()`` is called from the daemon's tick and is
  rate-limited to that period).
- The holder renews by writing ``renewTime`` (a PUT carrying the ``resourceVersion`` it read, so two
  writers cannot both win: the loser gets 409). A holder that could not renew for ``renew_deadline_s``
  stops leading at once — before the lease can expire for the others — and says so.
- A follower takes the lease over when the record (holder, renew time) has not changed for
  ``lease_duration_s`` of ITS OWN clock since it last saw it change. Expiry is judged on the local clock,
  never by comparing the holder's timestamps with ours (clock skew between machines).

Time comes from an injected ``Clock``; API failures are logged and counted, never raised from ``poll``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.clock import Clock

log = logging.getLogger(__name__)


class LeaderSettings(BaseModel):
    """Lease timing, as client-go's defaults (15 / 10 / 2 s): ``lease_duration_s`` > ``renew_deadline_s``
    > ``retry_period_s``, so a holder gives up leading before anyone else may take over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lease_name: str = Field("pdscale-controller", min_length=1, max_length=253)
    namespace: str = Field("default", min_length=1, max_length=63)
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        min_length=1,
        description="this replica's name in the Lease (default: hostname-pid)",
    )
    lease_duration_s: float = Field(15.0, gt=0.0, le=3600.0, description="followers wait this long")
    renew_deadline_s: float = Field(10.0, gt=0.0, le=3600.0, description="the holder gives up after this")
    retry_period_s: float = Field(2.0, gt=0.0, le=600.0, description="how often the Lease is polled")
    request_timeout_s: float = Field(5.0, gt=0.0, le=120.0)

    @model_validator(mode="after")
    def _order(self) -> LeaderSettings:
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s:
            raise ValueError(
                "need lease_duration_s > renew_deadline_s > retry_period_s, got "
                f"{self.lease_duration_s:g} / {self.renew_deadline_s:g} / {self.retry_period_s:g}"
            )
        return self


@dataclass(frozen=True)
class _Record:
    holder: str
    renew: str
    transitions: int


class LeaderElector:
    """One replica's view of the Lease (see the module docstring). ``api`` is a ``CoordinationV1Api``."""

    def __init__(self, api: Any, settings: LeaderSettings, clock: Clock) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.identity = settings.identity
        self._leader = False
        self._last_renew_s = -math.inf  # monotonic time of our last successful write as holder
        self._last_attempt_s = -math.inf
        self._observed: _Record | None = None
        self._observed_at_s = -math.inf  # monotonic time the observed record last changed
        self.failures = 0  # API errors seen (the daemon counts them as ``leader_election``)

    @classmethod
    def from_client(cls, client: Any, settings: LeaderSettings, clock: Clock) -> LeaderElector:
        from kubernetes import client as k8s

        return cls(k8s.CoordinationV1Api(client), settings, clock)

    @property
    def is_leader(self) -> bool:
        return self._leader

    def poll(self) -> bool:
        """Renew or try to acquire when ``retry_period_s`` has passed; True while this replica leads."""
        now = self.clock.monotonic()
        if now - self._last_attempt_s >= self.settings.retry_period_s:
            self._last_attempt_s = now
            self._try()
        if self._leader and now - self._last_renew_s > self.settings.renew_deadline_s:
            self._set_leader(False, f"could not renew the lease for {now - self._last_renew_s:.1f} s")
        return self._leader

    def release(self) -> None:
        """On a graceful stop: hand the lease back (holder cleared) so a follower need not wait it out."""
        if not self._leader:
            return
        try:
            lease = self._read()
            if lease is not None and (lease.spec.holder_identity or "") == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = self._wall()
                self._replace(lease)
        except Exception as exc:  # releasing is a courtesy: the lease expires anyway
            log.warning("leader election: could not release lease %s: %s", self._where(), exc)
        self._set_leader(False, "released on shutdown")

    # -- internals -------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"{self.settings.namespace}/{self.settings.lease_name}"

    def _wall(self) -> datetime:
        return datetime.fromtimestamp(self.clock.time(), tz=UTC)

    def _set_leader(self, leader: bool, why: str) -> None:
        if leader != self._leader:
            verb = "became leader" if leader else "stopped leading"
            level = logging.INFO if leader or why == "released on shutdown" else logging.WARNING
            log.log(
                level,
                "leader election: %s %s of lease %s: %s",
                self.identity,
                verb,
                self._where(),
                why,
                extra={"event": "leader", "leader": leader, "identity": self.identity},
            )
        self._leader = leader

    def _read(self) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_namespaced_lease(
                self.settings.lease_name,
                self.settings.namespace,
                _request_timeout=self.settings.request_timeout_s,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def _replace(self, lease: Any) -> Any:
        return self.api.replace_namespaced_lease(
            self.settings.lease_name,
            self.settings.namespace,
            lease,
            _request_timeout=self.settings.request_timeout_s,
        )

    def _try(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._try_once()
        except ApiException as err:
            self.failures += 1
            if err.status == 409:
                log.info("leader election: lease %s changed under us (409); retrying later", self._where())
                return
            log.warning(
                "leader election: lease %s: HTTP %s %s", self._where(), err.status, err.reason,
                extra={"event": "leader_error", "status": err.status},
            )  # fmt: skip
        except Exception as exc:  # transport errors, timeouts: the renew deadline decides what they mean
            self.failures += 1
            log.warning(
                "leader election: lease %s unreachable: %s: %s", self._where(), type(exc).__name__, exc,
                extra={"event": "leader_error"},
            )  # fmt: skip

    def _try_once(self) -> None:
        from kubernetes import client as k8s

        now_mono, wall = self.clock.monotonic(), self._wall()
        lease = self._read()
        duration = max(1, math.ceil(self.settings.lease_duration_s))
        if lease is None:
            body = k8s.V1Lease(
                metadata=k8s.V1ObjectMeta(name=self.settings.lease_name, namespace=self.settings.namespace),
                spec=k8s.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=duration,
                    acquire_time=wall,
                    renew_time=wall,
                    lease_transitions=0,
                ),
            )
            self.api.create_namespaced_lease(
                self.settings.namespace, body, _request_timeout=self.settings.request_timeout_s
            )
            self._won(now_mono, "created the lease")
            return
        spec = lease.spec or k8s.V1LeaseSpec()
        record = _Record(spec.holder_identity or "", str(spec.renew_time), int(spec.lease_transitions or 0))
        if record != self._observed:
            self._observed, self._observed_at_s = record, now_mono
        if record.holder == self.identity:
            spec.renew_time = wall
            spec.lease_duration_seconds = duration
            lease.spec = spec
            self._replace(lease)
            self._won(now_mono, "renewed")
            return
        if self._leader:
            self._set_leader(False, f"the lease is held by {record.holder!r}")
        expired = now_mono - self._observed_at_s >= self.settings.lease_duration_s
        if record.holder and not expired:
            return
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = duration
        spec.acquire_time = wall
        spec.renew_time = wall
        spec.lease_transitions = record.transitions + (1 if record.holder else 0)
        lease.spec = spec
        self._replace(lease)  # carries the resourceVersion read: a racing follower gets 409
        previous = f"from {record.holder!r} (no renewal seen for {now_mono - self._observed_at_s:.1f} s)"
        self._won(now_mono, f"took over {previous}" if record.holder else "acquired the free lease")

    def _won(self, now_mono: float, why: str) -> None:
        self._last_renew_s = now_mono
        self._observed = None
        self._set_leader(True, why)
