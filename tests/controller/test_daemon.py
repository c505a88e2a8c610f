"""The daemon loop on a virtual clock: time-based ticks, the one error boundary, no opinion = no write,
the audit log, restart recovery and graceful stop. Helpers here are reused by the fault tests."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from controller.actuators.base import (
    ActuatorUnavailable,
    ApplyResult,
    PoolReplicas,
    ReplicaBounds,
    RoleReplicas,
)
from controller.actuators.dryrun import DryRunActuator
from controller.audit import AuditLog, read_audit
from controller.clock import VirtualClock
from controller.config import PolicyConfig
from controller.daemon import Daemon, classify
from controller.pipeline import PoolSetup
from controller.policy import ScalingPlan
from controller.sources.prometheus import SourceError, SourceUnavailable
from controller.telemetry import Telemetry
from forecaster.baselines import Holt
from serving.sim import samples as s
from serving.sim.fleet import PoolSpec

POLICY = PolicyConfig(standby_decode=0, max_prefill=8, max_decode=8, scale_down_delay_s=30.0)


@dataclass
class ScriptedSource:
    """Per-instance vLLM samples whose counters grow at set rates (per pool: one prefill, one decode).

    ``prompt_tps``/``gen_tps`` can change between scrapes; ``failures`` are raised by the next scrapes;
    ``nan`` names counters exported as NaN, ``missing`` counters not exported at all; ``hidden`` instances are left out (a node gone from the scrape).
    """

    pools: Sequence[str] = ("a",)
    prompt_tps: float = 20_000.0
    gen_tps: float = 2_000.0
    arrival_rps: float = 20.0
    running: float = 40.0
    failures: list[Exception] = field(default_factory=list)
    nan: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    hidden: set[str] = field(default_factory=set)
    itl_s: float | None = None  # set: decode instances export an ITL histogram, one gap per token, each itl_s
    scrapes: list[float] = field(default_factory=list)
    _totals: dict[str, float] = field(default_factory=dict)
    _last_s: float = math.nan

    def scrape(self, now_s: float) -> s.InstanceSamples:
        self.scrapes.append(now_s)
        if self.failures:
            raise self.failures.pop(0)
        dt = now_s - self._last_s if math.isfinite(self._last_s) else 0.0
        self._last_s = now_s
        for key, rate in (("prompt", self.prompt_tps), ("gen", self.gen_tps), ("req", self.arrival_rps)):
            self._totals[key] = self._totals.get(key, 0.0) + rate * dt
        ids = [f"{p}-{r}-0" for p in self.pools for r in ("prefill", "decode")]
        keep = [i for i in ids if i not in self.hidden]
        n_pools = len(self.pools)
        prefill = np.array([i.split("-")[1] == "prefill" for i in keep])

        def col(on_prefill: float, on_decode: float) -> np.ndarray:
            return np.where(prefill, on_prefill, on_decode).astype(np.float64)

        counters = {
            s.PROMPT_TOKENS_TOTAL: col(self._totals["prompt"] / n_pools, 0.0),
            s.GENERATION_TOKENS_TOTAL: col(0.0, self._totals["gen"] / n_pools),
            s.ROUTER_REQUESTS_TOTAL: col(self._totals["req"] / n_pools, 0.0),
        }
        for name in self.nan:
            counters[name] = np.full(len(keep), np.nan)
        for name in self.missing:
            counters.pop(name, None)
        histograms = {}
        if self.itl_s is not None:
            gaps = np.round(col(0.0, self._totals["gen"] / n_pools)).astype(np.int64)
            bounds = (self.itl_s / 2, 2 * self.itl_s)  # every gap in the middle bucket
            counts = np.stack([np.zeros_like(gaps), gaps, gaps], axis=1)
            histograms[s.INTER_TOKEN_LATENCY_SECONDS] = s.Histogram(bounds, counts, gaps * self.itl_s)
        return s.InstanceSamples(
            now_s=now_s,
            instance_ids=tuple(keep),
            pools=tuple(i.split("-")[0] for i in keep),
            roles=tuple(i.split("-")[1] for i in keep),
            nodes=tuple(keep),
            states=("active",) * len(keep),
            gauges={
                s.NUM_REQUESTS_RUNNING: col(0.0, self.running / n_pools),
                s.NUM_REQUESTS_WAITING: col(0.0, 0.0),
                s.KV_CACHE_USAGE_PERC: col(0.0, 0.2),
            },
            counters=counters,
            histograms=histograms,
        )


class FlakyActuator:
    """A DryRunActuator that raises the queued ``failures`` on ``apply`` (or on ``current`` when marked)."""

    def __init__(self, inner: DryRunActuator) -> None:
        self.inner = inner
        self.failures: list[Exception] = []
        self.current_failures: list[Exception] = []
        self.applied: list[ScalingPlan] = []

    def current(self, pool: str) -> PoolReplicas:
        if self.current_failures:
            raise self.current_failures.pop(0)
        return self.inner.current(pool)

    def apply(self, plan: ScalingPlan, bounds: ReplicaBounds) -> ApplyResult:
        if self.failures:
            raise self.failures.pop(0)
        self.applied.append(plan)
        return self.inner.apply(plan, bounds)


def cluster(pools: Sequence[str] = ("a",), prefill: int = 1, decode: int = 1) -> DryRunActuator:
    return DryRunActuator(
        {
            p: {"prefill": RoleReplicas(prefill, prefill), "decode": RoleReplicas(decode, decode)}
            for p in pools
        }
    )


def make_daemon(
    source: ScriptedSource,
    actuator: object,
    clock: VirtualClock,
    *,
    policy: PolicyConfig = POLICY,
    tick_s: float = 1.0,
    audit: AuditLog | None = None,
    gpu_budget: int | None = None,
    **kwargs: object,
) -> Daemon:
    pools = [PoolSetup(PoolSpec(name=p), policy) for p in source.pools]
    return Daemon(
        pools,
        source,
        actuator,  # type: ignore[arg-type]
        Holt(trailing_s=6),  # forecasts after six observations (the default waits a minute)
        clock=clock,
        tick_s=tick_s,
        telemetry=Telemetry(clock),
        audit=audit,
        gpu_budget=gpu_budget,
        **kwargs,  # type: ignore[arg-type]
    )


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    assert daemon.telemetry is not None
    value = daemon.telemetry.registry.get_sample_value(name, labels)
    return math.nan if value is None else value


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


# -- tests -----------------------------------------------------------------------------------------


def test_ticks_follow_the_clock_and_a_temporary_error_waits_its_retry_delay() -> None:
    clock = VirtualClock()
    source = ScriptedSource()
    daemon = make_daemon(source, cluster(), clock, tick_s=2.0, max_retry_s=7.0)
    source.failures = [
        SourceUnavailable("down", retry_after_s=5.0),
        SourceUnavailable("down", retry_after_s=60.0),
    ]
    t0 = clock.time()
    failed = daemon.run(max_ticks=5)
    assert failed == 2
    gaps = np.diff(np.array(source.scrapes) - t0)
    # tick 1 fails (retry 5 s), tick 2 fails (retry 60 s capped to 7), then every 2 s
    assert gaps.tolist() == pytest.approx([5.0, 7.0, 2.0, 2.0])


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (SourceUnavailable("prometheus down", 1.0), "source_unavailable"),
        (SourceError("bad query"), "permanent"),
        (ActuatorUnavailable("api 503", 1.0), "actuator_unavailable"),
        (RuntimeError("bug"), "unexpected"),
    ],
    ids=["source-unavailable", "permanent", "actuator-unavailable", "unexpected"],
)
def test_error_boundary_counts_logs_and_keeps_running(
    error: Exception, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    source = ScriptedSource()
    actuator = FlakyActuator(cluster())
    if isinstance(error, ActuatorUnavailable):
        actuator.current_failures.append(error)
    else:
        source.failures.append(error)
    daemon = make_daemon(source, actuator, clock)
    caplog.set_level(logging.INFO)
    reports = []
    for _ in range(4):
        reports.append(daemon.tick())
        clock.advance(1.0)
    assert [r.ok for r in reports] == [False, True, True, True]
    assert reports[0].kind == kind == classify(error)[0]
    assert metric(daemon, "pdscale_controller_errors_total", kind=kind) == 1.0
    assert [getattr(r, "kind", None) for r in events(caplog, "error")] == [kind]
    assert str(error) in events(caplog, "error")[0].getMessage()
    assert actuator.applied, "the loop recovered and applied a plan"


def test_no_opinion_on_unknown_data_applies_nothing(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    clock = VirtualClock()
    source = ScriptedSource(nan={s.PROMPT_TOKENS_TOTAL})
    actuator = FlakyActuator(cluster(prefill=5, decode=5))
    with AuditLog(tmp_path / "audit.jsonl") as audit:
        daemon = make_daemon(source, actuator, clock, audit=audit)
        caplog.set_level(logging.INFO)
        for _ in range(4):
            assert daemon.tick().ok
            clock.advance(1.0)
    assert actuator.applied == []
    assert actuator.inner.current("a").role("prefill").replicas == 5
    assert metric(daemon, "pdscale_controller_decisions_total", pool="a", outcome="no_opinion") == 4.0
    assert all(r.skipped == "no opinion" for r in events(caplog, "decision"))  # type: ignore[attr-defined]
    lines = read_audit(tmp_path / "audit.jsonl")
    assert len(lines) == 4 and all(e["plan"] is None and e["applied"] is None for e in lines)
    assert lines[-1]["load"]["prompt_tps"] is None  # NaN is written as null, never 0


def test_audit_log_records_plan_reasons_forecast_and_change(tmp_path: Path) -> None:
    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=60_000.0)
    with AuditLog(tmp_path / "audit.jsonl") as audit:
        daemon = make_daemon(source, cluster(), clock, audit=audit)
        daemon.run(max_ticks=8)
    lines = read_audit(tmp_path / "audit.jsonl")
    assert [e["pool"] for e in lines] == ["a"] * 8
    last = lines[-1]
    assert last["plan"]["prefill"] >= 5  # 60k tok/s over ~12k per instance, plus headroom
    assert last["reasons"] and any("load:" in r for r in last["reasons"])
    assert last["forecast"] is not None and last["forecaster"] == "holt"
    changed = [e for e in lines if e["applied"] and e["applied"]["changes"]]
    assert changed and changed[0]["applied"]["changes"][0]["before"] == 1
    assert last["leader"] is True and last["time_s"] == pytest.approx(clock.time())


def test_restart_recovers_from_the_cluster_and_waits_before_scaling_down() -> None:
    """A controller killed after scaling decode to 6 restarts on low load: it reads 6 from the cluster and
    does not scale down before scale_down_delay_s (a fresh policy state would cut at once)."""
    clock = VirtualClock()
    state = cluster(prefill=6, decode=6)
    source = ScriptedSource(prompt_tps=1_000.0, gen_tps=100.0, running=2.0)
    daemon = make_daemon(source, state, clock)
    seen = []
    for _ in range(40):
        assert daemon.tick().ok
        seen.append(state.current("a").role("prefill").replicas)
        clock.advance(1.0)
    first_drop = next(i for i, n in enumerate(seen) if n < 6)
    assert first_drop >= POLICY.scale_down_delay_s - 1
    assert seen[-1] < 6, "after the delay the controller does scale down"


def test_request_stop_from_another_thread_finishes_the_tick_and_returns() -> None:
    clock = VirtualClock()
    source = ScriptedSource()
    daemon = make_daemon(source, cluster(), clock)
    timer = threading.Timer(0.2, daemon.request_stop)
    timer.start()
    daemon.run()  # would run forever without the stop
    timer.join()
    assert daemon.ticks >= 1 and daemon.stopping


def test_the_daemon_starts_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, controller.daemon, controller.leader, controller.telemetry, controller.cli\n"
        "from controller.daemon import load_forecaster\n"
        "f, why = load_forecaster(__import__('pathlib').Path('/nonexistent.safetensors'))\n"
        "assert f.name == 'holt' and why and 'not found' in why, why\n"
        "assert 'torch' not in sys.modules, 'torch on the daemon import path'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
