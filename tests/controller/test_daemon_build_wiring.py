"""``build_daemon`` wires the config's optional parts: the router drain around the Kubernetes actuator (checked
by structure, and end to end with the real router on loopback and the in-process API server), the pools'
guaranteed GPU shares into the pipeline, and the onset detector around the forecaster."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.actuators.base import ActuatorError, ActuatorUnavailable, ReplicaBounds
from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, LABEL_TIER, KubernetesActuator
from controller.actuators.router_admin import DrainingActuator, PodDeletionCostMarker, RouterAdmin
from controller.clock import VirtualClock
from controller.config import ControllerConfig
from controller.daemon import (
    MAX_RETRY_S,
    STUCK_AFTER_TICKS,
    DaemonOptions,
    KubePods,
    build_daemon,
    stuck_after_s,
    wrap_draining,
)
from controller.forecasting import load_default_forecaster, with_onset_detector
from controller.policy.types import ScalingPlan
from forecaster.baselines import EWMA
from forecaster.burst import OnsetBoostedForecaster
from serving.router.app import Router
from serving.router.config import RouterConfig
from tests.controller.test_daemon import ScriptedSource
from tests.controller.test_router_admin import FakeVllm, LoopThread, RecordingActuator
from tests.support.kube_apiserver import FakeKubeApiServer

NS = "llm"
NO_CKPT = "/nonexistent/model.safetensors"  # the Holt fallback: no torch in these tests


def config(**changes: Any) -> ControllerConfig:
    doc: dict[str, Any] = {
        "source": {"kind": "prometheus", "url": "http://127.0.0.1:9"},
        "actuator": {"kind": "kubernetes", "namespace": NS},
        "forecaster_checkpoint": NO_CKPT,
        "pools": [
            {
                "name": "chat",
                "policy": {
                    "standby_decode": 0,
                    "standby_sizing": "flat",
                    "burst_reserve": "off",
                    "scale_down_delay_s": 0.0,
                    "max_decode": 8,
                    "max_prefill": 8,
                },
            }
        ],
    }
    for key, value in changes.items():
        if key == "router_admin":
            doc["actuator"]["router_admin"] = value
        else:
            doc[key] = value
    return ControllerConfig.model_validate(doc)


@pytest.fixture
def kube() -> Iterator[tuple[FakeKubeApiServer, k8s.ApiClient]]:
    with FakeKubeApiServer() as server:
        for role, replicas in (("prefill", 1), ("decode", 2)):
            labels = {LABEL_POOL: "chat", LABEL_ROLE: role, LABEL_TIER: "active"}
            server.add_deployment(NS, f"chat-{role}", replicas=replicas, labels=labels, match_labels=labels)
        cfg = k8s.Configuration()
        cfg.host = server.url
        cfg.retries = False
        yield server, k8s.ApiClient(cfg)


def build(cfg: ControllerConfig, client: Any = None, clock: VirtualClock | None = None) -> Any:
    return build_daemon(
        cfg,
        DaemonOptions(),
        clock=clock or VirtualClock(),
        source=ScriptedSource(pools=("chat",)),
        client=client,
    )


# -- the router drain ---------------------------------------------------------------------------------


def test_router_admin_wraps_the_kubernetes_actuator(
    kube: tuple[FakeKubeApiServer, k8s.ApiClient], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = config(
        router_admin={
            "pools": {"chat": {"url": "http://chat-router.llm.svc", "token_file": str(token)}},
            "drain_timeout_s": 45,
        }
    )
    daemon = build(cfg, kube[1])
    act = daemon.actuator
    assert isinstance(act, DrainingActuator)
    assert isinstance(act.inner, KubernetesActuator) and act.inner.namespace == NS
    (router,) = act.routers.values()
    assert (list(act.routers), router.base_url, router.token) == (
        ["chat"],
        "http://chat-router.llm.svc",
        "s3cret",
    )
    assert act.settings.drain_timeout_s == 45.0
    assert isinstance(act.marker, PodDeletionCostMarker) and act.marker.namespace == NS
    assert isinstance(act.marker.core, KubePods)
    # the liveness limit grows by the drain: a leader waiting on a drain is not "stuck"
    assert (
        daemon.telemetry.stuck_after_s
        == stuck_after_s(cfg)
        == (STUCK_AFTER_TICKS * cfg.tick_s + MAX_RETRY_S + cfg.source.timeout_s + 45.0)
    )


def test_without_router_admin_the_actuator_is_not_wrapped(
    kube: tuple[FakeKubeApiServer, k8s.ApiClient],
) -> None:
    assert isinstance(build(config(), kube[1]).actuator, KubernetesActuator)


def test_mark_pods_false_drains_without_a_marker(kube: tuple[FakeKubeApiServer, k8s.ApiClient]) -> None:
    cfg = config(router_admin={"pools": {"chat": {"url": "http://r"}}, "mark_pods": False})
    act = build(cfg, kube[1]).actuator
    assert isinstance(act, DrainingActuator) and act.marker is None and act.routers["chat"].token is None


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_an_unusable_token_file_stops_the_start_naming_the_field(
    kube: tuple[FakeKubeApiServer, k8s.ApiClient], tmp_path: Path, problem: str
) -> None:
    token = tmp_path / "token"
    if problem == "empty":
        token.write_text("  \n")
    cfg = config(router_admin={"pools": {"chat": {"url": "http://r", "token_file": str(token)}}})
    with pytest.raises(ValueError, match=r"actuator\.router_admin\.pools\.chat\.token_file: .*token"):
        build(cfg, kube[1])


@pytest.fixture
def router() -> Iterator[tuple[LoopThread, str, dict[str, FakeVllm]]]:
    loop = LoopThread()
    fakes = {name: FakeVllm(name) for name in ("p0", "d0", "d1")}
    urls = {name: loop.serve(f.app()) for name, f in fakes.items()}
    backends = [
        {"id": n, "url": urls[n], "role": "prefill" if n.startswith("p") else "decode"} for n in fakes
    ]
    url = loop.serve(Router(RouterConfig(port=0, poll_interval_s=0, backends=tuple(backends))).build_app())
    try:
        yield loop, url, fakes
    finally:
        for f in fakes.values():
            f.release.set()
        loop.close()


def test_a_daemon_tick_drains_the_router_backend_before_the_scale_patch(
    kube: tuple[FakeKubeApiServer, k8s.ApiClient], router: tuple[LoopThread, str, dict[str, FakeVllm]]
) -> None:
    """Low load on 2 decode replicas: the daemon built from the config drains one decode backend on the real
    router, then patches chat-decode to 1 — and the scale patch comes only after the drain."""
    server, api = kube
    _, url, _ = router
    cfg = config(router_admin={"pools": {"chat": {"url": url}}, "mark_pods": False})
    clock = VirtualClock()
    daemon = build_daemon(
        cfg,
        DaemonOptions(),
        clock=clock,
        source=ScriptedSource(pools=("chat",), prompt_tps=500.0, gen_tps=50.0, arrival_rps=1.0, running=1.0),
        client=api,
    )
    notes: list[str] = []
    for _ in range(30):
        report = daemon.tick()
        assert report.ok, report.message
        notes += [n for r in report.applied.values() for n in r.notes]
        clock.advance(1.0)
        if server.deployment(NS, "chat-decode")["spec"]["replicas"] == 1:
            break
    assert server.deployment(NS, "chat-decode")["spec"]["replicas"] == 1
    left = {b.id: b for b in RouterAdmin(url).backends()}
    assert set(left) == {"p0", "d1"}  # d0 was drained (and, idle, removed) before the scale-down
    assert any("drained ['d0']" in n for n in notes), notes


def test_advisory_mode_never_calls_the_router(kube: tuple[FakeKubeApiServer, k8s.ApiClient]) -> None:
    """--dry-run: the wrapped actuator patches nothing, so nothing is drained (a dead router is never called)."""
    server, api = kube
    cfg = config(router_admin={"pools": {"chat": {"url": "http://127.0.0.1:9"}}})
    clock = VirtualClock()
    source = ScriptedSource(pools=("chat",), prompt_tps=500.0, gen_tps=50.0, arrival_rps=1.0, running=1.0)
    daemon = build_daemon(cfg, DaemonOptions(dry_run=True), clock=clock, source=source, client=api)
    assert isinstance(daemon.actuator, DrainingActuator)
    planned = []
    for _ in range(10):
        report = daemon.tick()
        assert report.ok, report.message
        planned += [r.targets["decode"][0] for r in report.applied.values() if r.dry_run]
        clock.advance(1.0)
    assert 1 in planned  # it would have scaled decode 2 -> 1 ...
    assert server.deployment(NS, "chat-decode")["spec"]["replicas"] == 2  # ... and patched nothing


def test_losing_the_lease_mid_drain_puts_the_backends_back(
    router: tuple[LoopThread, str, dict[str, FakeVllm]],
) -> None:
    """A busy backend keeps the drain waiting; the lease is polled while it waits, and a replica that lost it
    stops (temporary error) with the drained backend registered again and nothing scaled."""
    import threading
    import urllib.request

    _, url, fakes = router
    admin = RouterAdmin(url)

    def post() -> None:
        req = urllib.request.Request(
            f"{url}/v1/completions",
            data=b'{"model": "tiny", "prompt": "x", "max_tokens": 4}',
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).read()

    workers = [threading.Thread(target=post, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    for _ in range(500):  # both decode backends hold one request
        if sum(b.in_flight for b in admin.backends() if b.role == "decode") >= 2:
            break
        threading.Event().wait(0.01)

    class Lost:
        polls = 0

        def poll(self) -> bool:
            self.polls += 1
            return False

    lost = Lost()
    inner = RecordingActuator(admin)
    cfg = config(router_admin={"pools": {"chat": {"url": url}}, "mark_pods": False})
    act = wrap_draining(inner, cfg, None, clock=VirtualClock(), elector=lost)
    with pytest.raises(ActuatorUnavailable, match="lost the leader lease"):
        act.apply(ScalingPlan("chat", 1, 1, 0, 0), ReplicaBounds())
    assert lost.polls == 1 and inner.seen == []  # nothing was scaled
    after = {b.id: b for b in admin.backends()}
    assert set(after) == {"p0", "d0", "d1"} and not any(b.draining for b in after.values())
    for f in fakes.values():
        f.release.set()
    for w in workers:
        w.join(10)


def test_mark_pods_needs_a_kubernetes_client() -> None:
    cfg = config(router_admin={"pools": {"chat": {"url": "http://r"}}})
    with pytest.raises(ValueError, match="mark_pods needs a Kubernetes API client"):
        wrap_draining(RecordingActuator(RouterAdmin("http://r")), cfg, None, clock=VirtualClock())


@pytest.mark.parametrize(
    ("status", "error", "text"),
    [
        (403, ActuatorError, "needs pods list and patch: render the manifests with --router-drain"),
        (503, ActuatorUnavailable, "HTTP 503"),
        (404, ActuatorError, "HTTP 404"),
    ],
)
def test_pod_marking_errors_are_the_actuators_errors(
    kube: tuple[FakeKubeApiServer, k8s.ApiClient], status: int, error: type[Exception], text: str
) -> None:
    server, api = kube
    pods = KubePods(k8s.CoreV1Api(api), request_timeout_s=2.0)
    server.inject_status(f"/api/v1/namespaces/{NS}/pods", status, count=1)
    with pytest.raises(error, match=text) as err:
        pods.list_namespaced_pod(NS, label_selector="pdscale.io/pool=chat")
    assert isinstance(err.value, ActuatorUnavailable) == (error is ActuatorUnavailable)


# -- GPU shares and the onset detector ---------------------------------------------------------------


def test_gpu_shares_reach_the_pipeline() -> None:
    pools = [{"name": "chat", "gpu_share": 6}, {"name": "code", "gpu_share": 2}, {"name": "batch"}]
    cfg = config(gpu_budget=10, pools=pools, actuator={"kind": "dry-run"})
    daemon = build(cfg)
    assert daemon.pipeline.gpu_budget == 10
    assert daemon.pipeline.gpu_shares == {"chat": 6, "code": 2}
    assert build(config(actuator={"kind": "dry-run"})).pipeline.gpu_shares == {}


def test_the_burst_detector_wraps_the_forecaster_only_when_configured() -> None:
    on = build(config(actuator={"kind": "dry-run"}, forecaster_burst_detector=True)).pipeline.forecaster
    assert isinstance(on, OnsetBoostedForecaster) and on.name == "holt+onset"
    off = build(config(actuator={"kind": "dry-run"})).pipeline.forecaster
    assert off.name == "holt" and not isinstance(off, OnsetBoostedForecaster)


def test_the_replay_default_is_unchanged_and_wrapping_is_idempotent() -> None:
    plain = load_default_forecaster(Path(NO_CKPT))  # what replay_policies and the demo load
    assert not isinstance(plain, OnsetBoostedForecaster)
    wrapped = with_onset_detector(EWMA())
    assert isinstance(wrapped, OnsetBoostedForecaster) and with_onset_detector(wrapped) is wrapped
    assert wrapped.name == "ewma+onset"


def test_the_wrapped_daemon_ticks_and_starts_without_torch() -> None:
    code = (
        "import sys\n"
        "from controller.config import ControllerConfig\n"
        "from controller.daemon import DaemonOptions, build_daemon\n"
        "from controller.clock import VirtualClock\n"
        "from tests.controller.test_daemon import ScriptedSource\n"
        "cfg = ControllerConfig.model_validate({'source': {'kind': 'prometheus', 'url': 'http://127.0.0.1:9'},\n"
        f"    'actuator': {{'kind': 'dry-run'}}, 'forecaster_checkpoint': {NO_CKPT!r},\n"
        "    'forecaster_burst_detector': True, 'forecaster_combination': 'all'})\n"
        "clock = VirtualClock()\n"
        "d = build_daemon(cfg, DaemonOptions(), clock=clock, source=ScriptedSource(pools=('default',)))\n"
        "for _ in range(70):\n"
        "    assert d.tick().ok\n"
        "    clock.advance(1.0)\n"
        "assert d.pipeline.forecaster.name == 'holt+onset'\n"
        "heavy = [m for m in ('torch', 'lightning', 'statsmodels') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
