"""Faults the daemon must survive. Each: nothing lost, no unsafe scale-down, a clear log line AND a metric.

Prometheus faults use the real Prometheus; Kubernetes faults the fake API server; time is a virtual clock.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, KubernetesActuator
from controller.clock import VirtualClock
from controller.config import ControllerConfig, PolicyConfig
from controller.daemon import Daemon, DaemonOptions, build_daemon
from controller.leader import LeaderElector, LeaderSettings
from controller.sources.prometheus import PrometheusSource
from serving.sim import samples as s
from serving.sim.fleet import PoolSpec
from tests.controller.test_daemon import FlakyActuator, ScriptedSource, cluster, events, make_daemon, metric
from tests.support.kube_apiserver import FakeKubeApiServer
from tests.support.prometheus import PrometheusServer

NS = "llm"
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/{{}}/scale"


def ticks(daemon: Daemon, clock: VirtualClock, n: int) -> list[bool]:
    out = []
    for _ in range(n):
        out.append(daemon.tick().ok)
        clock.advance(1.0)
    return out


# -- Prometheus ----------------------------------------------------------------------------------


@pytest.mark.prometheus
def test_prometheus_down_is_temporary_and_holds_the_scale(
    start_prometheus: Callable[..., PrometheusServer], caplog: pytest.LogCaptureFixture
) -> None:
    prom = start_prometheus([])
    clock = VirtualClock()
    actuator = FlakyActuator(cluster(prefill=3, decode=3))
    daemon = make_daemon(ScriptedSource(), actuator, clock)
    daemon.source = PrometheusSource(prom.url, timeout_s=2.0)
    assert ticks(daemon, clock, 1) == [True]  # up, but nothing exported yet: no opinion
    prom.stop()
    caplog.set_level(logging.INFO)
    report = daemon.tick()
    assert not report.ok and report.kind == "source_unavailable" and report.retry_after_s is not None
    assert metric(daemon, "pdscale_controller_errors_total", kind="source_unavailable") == 1
    assert "unreachable" in events(caplog, "error")[0].getMessage()
    assert actuator.applied == [] and actuator.current("a").role("prefill").replicas == 3


@pytest.mark.prometheus
def test_prometheus_too_slow_for_the_tick(
    start_prometheus: Callable[..., PrometheusServer], caplog: pytest.LogCaptureFixture
) -> None:
    prom = start_prometheus([])
    clock = VirtualClock()
    daemon = make_daemon(ScriptedSource(), cluster(), clock)
    caplog.set_level(logging.INFO)
    daemon.source = PrometheusSource(prom.url, timeout_s=1e-6)  # the deadline passes before the answer
    assert daemon.tick().kind == "source_unavailable"
    # a server that accepts and never answers
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        daemon.source = PrometheusSource(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout_s=0.3)
        assert daemon.tick().kind == "source_unavailable"
    assert metric(daemon, "pdscale_controller_errors_total", kind="source_unavailable") == 2
    messages = [r.getMessage() for r in events(caplog, "error")]
    assert "no time left" in messages[0] and "did not answer" in messages[1]


# -- data ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["missing", "nan"])
def test_missing_or_nan_series_means_no_opinion(fault: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=100.0, gen_tps=10.0, running=1.0)  # low load: a cut would be tempting
    actuator = FlakyActuator(cluster(prefill=6, decode=6))
    daemon = make_daemon(source, actuator, clock, policy=PolicyConfig(standby_decode=0, scale_down_delay_s=0))
    caplog.set_level(logging.INFO)
    if fault == "missing":
        source.missing = {s.GENERATION_TOKENS_TOTAL}
    else:
        source.nan = {s.PROMPT_TOKENS_TOTAL}
    assert all(ticks(daemon, clock, 5))
    assert actuator.applied == [] and actuator.current("a").role("decode").replicas == 6
    assert metric(daemon, "pdscale_controller_decisions_total", pool="a", outcome="no_opinion") == 5
    assert all("no opinion" in r.getMessage() for r in events(caplog, "decision"))


def test_a_node_vanishing_mid_tick_does_not_scale_down(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    source = ScriptedSource()
    state = cluster(prefill=4, decode=4)
    policy = PolicyConfig(standby_decode=0, scale_down_delay_s=0, max_scale_down_per_min=600)
    daemon = make_daemon(source, state, clock, policy=policy)
    ticks(daemon, clock, 3)
    before = state.current("a")
    caplog.set_level(logging.INFO)
    source.hidden = {"a-prefill-0"}  # its load disappears with it
    assert ticks(daemon, clock, 1) == [True]
    after = state.current("a")
    assert after.role("prefill").replicas >= before.role("prefill").replicas
    assert events(caplog, "vanished")[0].instances == ["a-prefill-0"]  # type: ignore[attr-defined]
    assert metric(daemon, "pdscale_controller_incomplete_observations_total", pool="a") >= 1


def test_a_burst_beyond_max_degrades_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=2_000.0)
    state = cluster()
    policy = PolicyConfig(standby_decode=0, max_prefill=4, max_decode=4, degrade_recover_s=5.0, ramp_up_s=0)
    daemon = make_daemon(source, state, clock, policy=policy)
    caplog.set_level(logging.INFO)
    ticks(daemon, clock, 3)
    source.prompt_tps = 2_000_000.0
    ticks(daemon, clock, 3)
    assert state.current("a").role("prefill").replicas == 4  # held at max, never above
    assert metric(daemon, "pdscale_controller_degraded", pool="a") == 1
    assert [r.degrade for r in events(caplog, "degrade")] == [True]  # type: ignore[attr-defined]
    source.prompt_tps = 2_000.0
    ticks(daemon, clock, 40)  # the Holt forecast decays over ~20 s, then demand stays calm degrade_recover_s
    assert metric(daemon, "pdscale_controller_degraded", pool="a") == 0
    assert [r.degrade for r in events(caplog, "degrade")] == [True, False]  # type: ignore[attr-defined]


def test_traffic_that_stops_dead_holds_the_pool_with_a_log_line_and_a_metric(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from controller.audit import AuditLog, read_audit

    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=60_000.0, arrival_rps=60.0)
    state = cluster()
    caplog.set_level(logging.INFO)
    with AuditLog(tmp_path / "audit.jsonl") as audit:
        policy = PolicyConfig(standby_decode=0, silence_hold_s=120.0)
        daemon = make_daemon(source, state, clock, policy=policy, audit=audit)
        ticks(daemon, clock, 80)  # a steady minute and more
        before = state.current("a").role("prefill").replicas
        assert before > 1 and metric(daemon, "pdscale_controller_silence_hold", pool="a") == 0
        source.prompt_tps, source.gen_tps, source.arrival_rps, source.running = (
            0.0,
            0.0,
            0.0,
            0.0,
        )  # the outage
        ticks(daemon, clock, 100)  # past the 60-s scale-down window, inside the hold
        assert state.current("a").role("prefill").replicas == before
        assert metric(daemon, "pdscale_controller_silence_hold", pool="a") == 1
        (start,) = events(caplog, "silence")
        assert start.silent and "no arrival" in start.getMessage()  # type: ignore[attr-defined]
        ticks(daemon, clock, 40)  # the hold runs out (what the pool keeps then is the other stages' business)
        assert metric(daemon, "pdscale_controller_silence_hold", pool="a") == 0
        assert [r.silent for r in events(caplog, "silence")] == [True, False]  # type: ignore[attr-defined]
    silent = [bool(e["plan"] and e["plan"]["silent"]) for e in read_audit(tmp_path / "audit.jsonl")]
    assert not any(silent[:80]) and all(silent[100:175]) and not any(silent[-20:])


def test_engines_slower_than_their_profile_are_sized_at_their_speed_with_a_reason_and_a_metric(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from controller.audit import AuditLog, read_audit
    from serving.sim.latency import get_latency_model

    profile = PoolSpec().profile
    running = 40.0  # ScriptedSource's decode instance: 40 sequences; prompts 1,000 tokens, outputs 100
    step_s = float(get_latency_model(profile).decode_step_ms(running, 1000.0 + 100.0 / 2)) / 1e3
    prefill = {}
    caplog.set_level(logging.INFO)
    for itl_s in (step_s, 1.8 * step_s):  # as the profile says, then 1.8 x slower
        clock = VirtualClock()
        state = cluster()
        with AuditLog(tmp_path / f"audit-{itl_s}.jsonl") as audit:
            source = ScriptedSource(running=running, itl_s=itl_s)
            daemon = make_daemon(source, state, clock, policy=PolicyConfig(standby_decode=0), audit=audit)
            ticks(daemon, clock, 60)
        prefill[itl_s] = state.current("a").role("prefill").replicas
        estimate = metric(daemon, "pdscale_controller_latency_estimate", pool="a")
        assert estimate == pytest.approx(itl_s / step_s, rel=0.02)
        applied = metric(daemon, "pdscale_controller_latency_correction", pool="a")
        entries = read_audit(tmp_path / f"audit-{itl_s}.jsonl")
        said = [any("latency correction" in r for r in e["reasons"]) for e in entries if e["plan"]]
        if itl_s == step_s:
            assert applied == 1.0 and not any(said)
            assert events(caplog, "latency_correction") == []
        else:
            assert applied == pytest.approx(1.8, rel=0.05)
            assert not any(said[:29]) and all(said[31:])  # after 30 s of readings, on every plan
            (line,) = events(caplog, "latency_correction")  # once, when the factor moved
            assert line.factor == applied and "1.80x" in line.getMessage()  # type: ignore[attr-defined]
    # the factor measured on decode sizes prefill too: 20,000 prompt tokens/s need 2 instances of the profile's
    # speed, 4 at 1.8 x its step time
    assert prefill[1.8 * step_s] > prefill[step_s]


# -- Kubernetes ---------------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(status_follows_spec=False) as server:
        for role in ("prefill", "decode"):
            server.add_deployment(NS, f"a-{role}", replicas=1, labels={LABEL_POOL: "a", LABEL_ROLE: role})
            server.set_ready_replicas(NS, f"a-{role}", 1)
        yield server


def api(kube: FakeKubeApiServer) -> object:
    from kubernetes import client as k8s

    cfg = k8s.Configuration()
    cfg.host = kube.url
    cfg.retries = False
    return k8s.ApiClient(cfg)


def kube_actuator(kube: FakeKubeApiServer, timeout_s: float = 2.0) -> KubernetesActuator:
    return KubernetesActuator(NS, api(kube), request_timeout_s=timeout_s)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "code"),
    [("conflict", 409), ("server-error", 500), ("timeout", 0)],
    ids=["409", "500", "timeout"],
)
def test_api_server_faults_are_temporary_and_nothing_is_lost(
    kube: FakeKubeApiServer, fault: str, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=60_000.0)
    daemon = make_daemon(source, kube_actuator(kube, timeout_s=0.5), clock)
    ticks(daemon, clock, 1)  # first scrape: no rates yet, nothing to apply
    path = SCALE.format("a-prefill")
    if fault == "timeout":
        kube.inject_hang(path, 1.5, method="PATCH")
    else:
        # one failed apply: a 500 once; a 409 on every attempt (1 + the actuator's 3 conflict retries)
        kube.inject_status(path, code, count=4 if code == 409 else 1, method="PATCH")
    caplog.set_level(logging.INFO)
    assert ticks(daemon, clock, 1) == [True]  # the tick goes on: one pool's apply failed
    assert metric(daemon, "pdscale_controller_errors_total", kind="actuator_unavailable") == 1
    assert "apply a failed (actuator_unavailable)" in events(caplog, "error")[0].getMessage()
    ticks(daemon, clock, 2)  # the plan is applied once the API server answers again
    assert kube.deployment(NS, "a-prefill")["spec"]["replicas"] >= 5


def test_killed_mid_scale_and_restarted_recovers_from_the_cluster(
    kube: FakeKubeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    first = make_daemon(ScriptedSource(prompt_tps=60_000.0), kube_actuator(kube), clock)
    ticks(first, clock, 3)
    scaled = kube.deployment(NS, "a-prefill")["spec"]["replicas"]
    assert scaled >= 5 and kube.deployment(NS, "a-prefill")["status"]["readyReplicas"] == 1  # mid-scale
    del first  # killed: its memory is gone
    caplog.set_level(logging.INFO)
    kube.clear_requests()
    low = ScriptedSource(prompt_tps=500.0, gen_tps=50.0, running=1.0)
    second = make_daemon(low, kube_actuator(kube), clock)
    assert all(ticks(second, clock, 20))  # within scale_down_delay_s (30 s)
    assert events(caplog, "recovered")[0].replicas["a"]["prefill"] == scaled  # type: ignore[attr-defined]
    assert metric(second, "pdscale_controller_current_replicas", pool="a", role="prefill") == scaled
    assert not [r for r in kube.requests if r.method == "PATCH"], "no scale-down right after a restart"
    assert kube.deployment(NS, "a-prefill")["spec"]["replicas"] == scaled


def test_two_replicas_only_the_leader_applies_and_the_other_takes_over(kube: FakeKubeApiServer) -> None:
    clock = VirtualClock()

    def replica(identity: str) -> Daemon:
        settings = LeaderSettings(namespace=NS, identity=identity)
        elector = LeaderElector.from_client(api(kube), settings, clock)
        return make_daemon(ScriptedSource(prompt_tps=60_000.0), kube_actuator(kube), clock, elector=elector)

    a, b = replica("a"), replica("b")
    for _ in range(4):
        ra, rb = a.tick(), b.tick()
        clock.advance(1.0)
        assert (ra.leader, rb.leader) == (True, False)
        assert not rb.applied
    assert kube.deployment(NS, "a-prefill")["spec"]["replicas"] >= 5
    assert metric(a, "pdscale_controller_is_leader") == 1 and metric(b, "pdscale_controller_is_leader") == 0
    # a dies without releasing; b leads once the lease has expired on its clock
    led = []
    for _ in range(25):
        led.append(b.tick().leader)
        clock.advance(1.0)
    assert not led[0] and led[-1]
    assert metric(b, "pdscale_controller_is_leader") == 1


# -- forecaster ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "corrupt", "mismatched"])
def test_forecaster_checkpoint_problems_fall_back_to_the_baseline(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "model.safetensors"
    if damage == "corrupt":
        ckpt.write_bytes(b"\x00\x01 definitely not safetensors")
    elif damage == "mismatched":  # a valid safetensors file that is not a pdscale checkpoint
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"w": np.zeros(2, dtype=np.float32)}, str(ckpt))
    cfg = ControllerConfig.model_validate(
        {
            "source": {"kind": "prometheus", "url": "http://127.0.0.1:9"},
            "actuator": {"kind": "dry-run"},
            "forecaster_checkpoint": str(ckpt),
            "pools": [{"name": "a", "policy": {"standby_decode": 0}}],
        }
    )
    caplog.set_level(logging.INFO)
    clock = VirtualClock()
    daemon = build_daemon(cfg, DaemonOptions(), clock=clock, source=ScriptedSource(prompt_tps=60_000.0))
    assert daemon.pipeline.forecaster.name == "holt"  # the onset detector is off by default
    assert metric(daemon, "pdscale_controller_forecaster_fallback") == 1
    (line,) = events(caplog, "forecaster_fallback")
    assert str(ckpt) in line.getMessage()
    results = ticks(daemon, clock, 3)
    assert all(results)
    assert metric(daemon, "pdscale_controller_target_replicas", pool="a", role="prefill", tier="active") >= 5


def test_stop_during_a_hung_api_call_finishes_that_tick(kube: FakeKubeApiServer) -> None:
    clock = VirtualClock()
    daemon = make_daemon(ScriptedSource(), kube_actuator(kube, timeout_s=1.0), clock)
    kube.inject_hang(f"/apis/apps/v1/namespaces/{NS}/deployments", 0.5, count=1)
    stopper = threading.Timer(0.1, daemon.request_stop)
    stopper.start()
    failed = daemon.run()
    stopper.join()
    assert daemon.ticks == 1 and failed == 0  # the hung list answered within the timeout; then it stopped
