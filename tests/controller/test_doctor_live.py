"""``pdscale doctor`` against the real Debian Prometheus and the in-process Kubernetes API server.

One module-scoped Prometheus scrapes, every second, a small exporter whose series are planted: a healthy
pool, a decode instance whose KV usage sits at 0.99 while preemptions rise, a prefill instance with a queue
running at a trickle, a pool whose TTFT tail is far over its SLO while one prefill instance idles, and a
configured pool with no series at all. The controller's own metrics come from the real ``Telemetry``.
Each fault must come out as warn/fail with its fix; the healthy pool alone passes (exit code 0).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import typer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from typer.testing import CliRunner

from controller.actuators.kubernetes import api_client
from controller.clock import WallClock
from controller.doctor import (
    Check,
    DoctorInputs,
    KubeClientProbe,
    PromHttp,
    exit_code,
    run_doctor,
)
from controller.doctor_cli import doctor_cmd
from controller.telemetry import Telemetry, TelemetryServer
from tests.support.kube_apiserver import AccessRule, FakeKubeApiServer
from tests.support.prometheus import PrometheusServer, ScrapeJob

pytestmark = pytest.mark.prometheus

WINDOW_S = 8.0  # the failure-sign window of these tests (production default 15 min)
BOUNDS_S = (0.1, 0.5, 1.0, 5.0, 10.0)


@dataclass(frozen=True)
class Planted:
    """One fake vLLM instance: fixed gauges, counters growing at fixed rates from the exporter's start."""

    instance: str
    pool: str
    role: str
    running: float = 1.0
    waiting: float = 0.0
    kv: float = 0.3
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    router_rps: float = 0.0
    preempt_per_s: float = 0.0
    ttft_rps: float = 0.0
    ttft_bucket: int = 1  # index into BOUNDS_S of the bucket every TTFT lands in


FLEET: tuple[Planted, ...] = (
    Planted("healthy-p0", "healthy", "prefill", running=2, prompt_tps=2000, router_rps=4, ttft_rps=4),
    Planted("healthy-d0", "healthy", "decode", running=8, kv=0.4, gen_tps=400, ttft_rps=4),
    Planted("kvfull-p0", "kvfull", "prefill", running=1, prompt_tps=1000, router_rps=2),
    Planted("kvfull-d0", "kvfull", "decode", running=40, kv=0.99, gen_tps=300, preempt_per_s=0.5),
    Planted("slow-p0", "slowprefill", "prefill", running=1, waiting=6, prompt_tps=50, router_rps=0.1),
    Planted("slow-d0", "slowprefill", "decode", running=1, kv=0.1, gen_tps=10),
    Planted(
        "imb-p0",
        "imbalanced",
        "prefill",
        running=4,
        waiting=8,
        prompt_tps=12000,
        router_rps=2,
        ttft_rps=2,
        ttft_bucket=4,
    ),
    Planted("imb-p1", "imbalanced", "prefill", running=0, waiting=0),
    Planted("imb-d0", "imbalanced", "decode", running=4, kv=0.3, gen_tps=100),
)

# the same fault under the other spelling (vllm_x, scraped as OpenMetrics)
UNDERSCORE_FLEET: tuple[Planted, ...] = (
    Planted("under-p0", "under", "prefill", running=1, prompt_tps=1000, router_rps=2),
    Planted("under-d0", "under", "decode", running=40, kv=0.99, gen_tps=300, preempt_per_s=0.5),
)


@dataclass(eq=False)
class _Planted(Collector):
    fleet: tuple[Planted, ...]
    t0: float

    def collect(self) -> Iterator[Metric]:
        dt = time.time() - self.t0
        keys = ["instance", "model_name", "pool", "role"]
        fam: dict[str, Metric] = {
            "running": GaugeMetricFamily("vllm:num_requests_running", "running", labels=keys),
            "waiting": GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=keys),
            "kv": GaugeMetricFamily("vllm:kv_cache_usage_perc", "kv", labels=keys),
            "prompt": CounterMetricFamily("vllm:prompt_tokens", "prompt", labels=keys),
            "gen": CounterMetricFamily("vllm:generation_tokens", "gen", labels=keys),
            "pre": CounterMetricFamily("vllm:num_preemptions", "preemptions", labels=keys),
            "router": CounterMetricFamily("pdscale:router_requests", "routed", labels=keys),
            "ttft": HistogramMetricFamily("vllm:time_to_first_token_seconds", "ttft", labels=keys),
        }
        for p in self.fleet:
            v = [p.instance, "m", p.pool, p.role]
            fam["running"].add_metric(v, p.running)  # type: ignore[attr-defined]
            fam["waiting"].add_metric(v, p.waiting)  # type: ignore[attr-defined]
            if p.role != "prefill":
                fam["kv"].add_metric(v, p.kv)  # type: ignore[attr-defined]
                fam["pre"].add_metric(v, p.preempt_per_s * dt)  # type: ignore[attr-defined]
            if p.role != "decode":
                fam["prompt"].add_metric(v, p.prompt_tps * dt)  # type: ignore[attr-defined]
                fam["router"].add_metric(v, p.router_rps * dt)  # type: ignore[attr-defined]
            fam["gen"].add_metric(v, p.gen_tps * dt)  # type: ignore[attr-defined]
            n = float(int(p.ttft_rps * dt))
            buckets = [(f"{b:g}", n if i >= p.ttft_bucket else 0.0) for i, b in enumerate(BOUNDS_S)]
            fam["ttft"].add_metric(v, [*buckets, ("+Inf", n)], sum_value=n)  # type: ignore[attr-defined]
        yield from fam.values()


class PlantedExporter:
    """Serves the planted fleet as one page on a free port: the text format (vLLM's colon names), or with
    ``openmetrics`` the OpenMetrics format, where prometheus_client writes ``vllm_x`` (the other spelling)."""

    def __init__(self, fleet: tuple[Planted, ...], *, openmetrics: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Planted(fleet, time.time()))
        registry = self.registry
        self.failing = failing = threading.Event()  # set: every scrape gets HTTP 500 (a failed scrape)
        render = generate_openmetrics if openmetrics else generate_latest
        ctype = (
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
            if openmetrics
            else "text/plain; version=0.0.4; charset=utf-8"
        )

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if failing.is_set():
                    self.send_error(500, "planted scrape failure")
                    return
                body = render(registry)
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Live:
    prom: PrometheusServer
    exporter: PlantedExporter


@pytest.fixture(scope="module")
def live(prometheus_bin: str) -> Iterator[Live]:
    exporter = PlantedExporter(FLEET)
    underscore = PlantedExporter(UNDERSCORE_FLEET, openmetrics=True)
    telemetry = Telemetry(WallClock())
    stop = threading.Event()

    def ticking() -> None:  # a controller whose ticks take 20 ms
        while not stop.wait(0.1):
            telemetry.tick_ok(time.time(), 0.02)

    ticker = threading.Thread(target=ticking, daemon=True)
    ticker.start()
    with TelemetryServer(telemetry, 0, "127.0.0.1") as tserver:
        jobs = [
            ScrapeJob("vllm", (exporter.target, underscore.target), scrape_interval_s=1.0, honor_labels=True),
            ScrapeJob("pdscale-controller", (f"127.0.0.1:{tserver.port}",), scrape_interval_s=1.0),
        ]
        with PrometheusServer(prometheus_bin, jobs) as prom:
            prom.wait_for_query("vllm:num_requests_running", timeout_s=20.0)
            prom.wait_for_query("vllm_num_requests_running", timeout_s=10.0)
            prom.wait_for_query("pdscale_controller_tick_seconds_count", timeout_s=10.0)
            time.sleep(WINDOW_S)  # a window of samples: rates, increases and queued steps
            yield Live(prom, exporter)
    stop.set()
    exporter.close()
    underscore.close()


POOLS_YAML = """
tick_s: 1.0
source: {{kind: prometheus, url: "{url}"}}
actuator: {{kind: kubernetes, namespace: llm}}
pools:
{pools}
"""


def write_config(path: Path, url: str, pools: list[str]) -> Path:
    lines = "\n".join(f"  - {{name: {p}, profile: llama3-8b/a100, slo_ttft_ms: 1000}}" for p in pools)
    path.write_text(POOLS_YAML.format(url=url, pools=lines))
    return path


def kube_server(*, deny_patch_scale: bool) -> FakeKubeApiServer:
    rules = [
        AccessRule("list", "apps", "deployments"),
        AccessRule("get", "apps", "deployments"),
        AccessRule("get", "apps", "deployments", "scale"),
        AccessRule("get", "coordination.k8s.io", "leases"),
        AccessRule("create", "coordination.k8s.io", "leases"),
        AccessRule("update", "coordination.k8s.io", "leases"),
    ]
    if not deny_patch_scale:
        rules.append(AccessRule("patch", "apps", "deployments", "scale"))
    server = FakeKubeApiServer(access_rules=rules, enforce_rbac=True)
    for pool in ("healthy", "kvfull", "slowprefill", "imbalanced", "nometrics", "under"):
        for role in ("prefill", "decode"):
            labels = {"pdscale.io/pool": pool, "pdscale.io/role": role, "pdscale.io/tier": "active"}
            server.add_deployment("llm", f"{pool}-{role}", labels=labels, match_labels=labels)
    return server


def run_cli(args: list[str]) -> tuple[int, str]:
    app = typer.Typer()
    app.command()(doctor_cmd)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    return result.exit_code, result.output


def by_key(checks: list[Check]) -> dict[tuple[str, str], Check]:
    return {(c.name, c.subject): c for c in checks}


def test_healthy_pool_passes_through_the_cli(live: Live, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", live.prom.url, ["healthy"])
    with kube_server(deny_patch_scale=False) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        out = tmp_path / "doctor.json"
        code, text = run_cli(
            [
                "--config",
                str(cfg),
                "--kubeconfig",
                str(kubeconfig),
                "--window",
                f"{WINDOW_S:g}s",
                "--json",
                str(out),
            ]
        )
    doc = json.loads(out.read_text())
    verdicts = {(c["name"], c["subject"]): c["verdict"] for c in doc["checks"]}
    assert code == 0, text
    bad = {k: v for k, v in verdicts.items() if v not in ("ok", "skip")}
    assert bad == {}, json.dumps(doc["checks"], indent=1)
    for must_be_ok in [
        ("prometheus reachable", ""), ("scrape interval", ""), ("clock skew", ""), ("series labels", ""),
        ("vllm metrics", "healthy"), ("forecaster checkpoint", ""), ("rbac", ""), ("deployments", "healthy"),
        ("decode kv pressure", "healthy"), ("tail ttft vs idle capacity", "healthy"),
        ("controller tick latency", ""),
    ]:  # fmt: skip
        assert verdicts[must_be_ok] == "ok", (must_be_ok, doc["checks"])
    assert verdicts[("router", "")] == "skip"


def test_planted_faults_are_reported_with_their_fixes(live: Live, tmp_path: Path) -> None:
    pools = ["healthy", "kvfull", "slowprefill", "imbalanced", "nometrics", "under"]
    cfg = write_config(tmp_path / "c.yaml", live.prom.url, pools)
    with kube_server(deny_patch_scale=True) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        out = tmp_path / "doctor.json"
        code, text = run_cli(
            [
                "--config",
                str(cfg),
                "--kubeconfig",
                str(kubeconfig),
                "--window",
                f"{WINDOW_S:g}s",
                "--json",
                str(out),
            ]
        )
    assert code == 1, text
    checks = {(c["name"], c["subject"]): c for c in json.loads(out.read_text())["checks"]}

    nometrics = checks[("vllm metrics", "nometrics")]
    assert nometrics["verdict"] == "fail" and "pool='nometrics'" in nometrics["detail"]
    assert "pool label" in nometrics["fix"]

    kv = checks[("decode kv pressure", "kvfull")]
    assert kv["verdict"] == "fail", kv
    assert "kvfull-d0" in kv["detail"] and "--max-num-seqs" in kv["fix"] and "decode" in kv["fix"]
    under = checks[("decode kv pressure", "under")]  # the same sign in the vllm_x spelling
    assert under["verdict"] == "fail" and "under-d0" in under["detail"], under
    assert checks[("vllm metrics", "under")]["verdict"] == "ok"

    prefill = checks[("prefill throughput", "slowprefill")]
    assert prefill["verdict"] == "warn", prefill
    assert "slow-p0" in prefill["detail"] and "attention backend" in prefill["fix"]
    assert "max-num-batched-tokens" in prefill["fix"]

    ttft = checks[("tail ttft vs idle capacity", "imbalanced")]
    assert ttft["verdict"] == "warn", ttft
    assert "imb-p1 sat idle" in ttft["detail"] and "imb-p0 had a queue" in ttft["detail"]
    assert "routing imbalance" in ttft["fix"]

    rbac = checks[("rbac", "")]
    assert rbac["verdict"] == "fail" and "patch deployments/scale" in rbac["detail"], rbac
    assert "get deployments/scale" not in rbac["detail"]

    # a prefill instance with a queue at the profile's pace is not slow; the healthy pool stays ok throughout
    assert checks[("prefill throughput", "imbalanced")]["verdict"] == "ok"
    for name in ("vllm metrics", "decode kv pressure", "tail ttft vs idle capacity"):
        assert checks[(name, "healthy")]["verdict"] == "ok", checks[(name, "healthy")]


def test_clock_skew_is_measured_against_the_injected_clock(live: Live) -> None:
    inputs = DoctorInputs(tick_s=1.0, window_s=WINDOW_S)
    prom = PromHttp(live.prom.url)
    try:
        ahead = by_key(run_doctor(inputs, prom=prom, clock=lambda: time.time() + 30.0))
        in_step = by_key(run_doctor(inputs, prom=prom, clock=time.time))
    finally:
        prom.close()
    assert ahead[("clock skew", "")].verdict == "fail"
    skew = re.search(r"clock is (-?[0-9.]+) s from", ahead[("clock skew", "")].detail)
    assert skew is not None, ahead[("clock skew", "")].detail
    assert float(skew.group(1)) == pytest.approx(-30.0, abs=0.5)  # the round trip blurs it by milliseconds
    assert "NTP" in ahead[("clock skew", "")].fix
    assert in_step[("clock skew", "")].verdict == "ok"


def test_without_a_config_every_pool_found_is_checked_and_rbac_is_skipped(live: Live) -> None:
    prom = PromHttp(live.prom.url)
    try:
        checks = by_key(run_doctor(DoctorInputs(window_s=WINDOW_S), prom=prom, kube_hint="pass --kubeconfig"))
    finally:
        prom.close()
    pools = {s for (name, s) in checks if name == "vllm metrics"}
    assert pools == {"healthy", "kvfull", "slowprefill", "imbalanced", "under"}
    assert checks[("rbac", "")].verdict == "skip" and "--kubeconfig" in checks[("rbac", "")].fix
    assert checks[("prefill throughput", "slowprefill")].verdict == "skip"  # no profile without a config
    assert checks[("decode kv pressure", "kvfull")].verdict == "fail"


def test_long_scrape_interval_fails(prometheus_bin: str, live: Live) -> None:
    job = ScrapeJob("vllm", (live.exporter.target,), scrape_interval_s=30.0, honor_labels=True)
    with PrometheusServer(prometheus_bin, [job]) as slow:
        prom = PromHttp(slow.url)
        try:
            checks = by_key(run_doctor(DoctorInputs(tick_s=1.0, window_s=WINDOW_S), prom=prom))
        finally:
            prom.close()
    scrape = checks[("scrape interval", "")]
    assert scrape.verdict == "fail"
    assert "vllm=30s" in scrape.detail and "scrape_interval" in scrape.fix


def test_one_failed_scrape_does_not_read_as_metrics_nobody_exports(prometheus_bin: str) -> None:
    """A failed scrape ends every series of its target at once (stale markers): an instant query then finds
    none of them. The inventory reads the series of the last few scrapes instead (CI once saw the healthy
    pool's TTFT histogram "not exported" after a scrape timed out on a loaded machine)."""
    from controller.doctor import fetch_inventory
    from controller.settings import LabelMap

    exporter = PlantedExporter(FLEET[:2])
    try:
        job = ScrapeJob("vllm", (exporter.target,), scrape_interval_s=1.0, honor_labels=True)
        with PrometheusServer(prometheus_bin, [job]) as prom:
            prom.wait_for_query("vllm:time_to_first_token_seconds_count", timeout_s=20.0)
            exporter.failing.set()
            prom.wait_for_query('up{job="vllm"} == 0', timeout_s=10.0)
            # stale markers: gone from instant queries
            assert prom.query("vllm:time_to_first_token_seconds_count") == []
            api = PromHttp(prom.url)
            try:
                inventory = fetch_inventory(api, LabelMap(), time.time(), lookback_s=5.0)
                instant = fetch_inventory(api, LabelMap())
            finally:
                api.close()
    finally:
        exporter.close()
    ttft = {m.instance for m in inventory.present["vllm:time_to_first_token_seconds"]}
    assert ttft == {"healthy-p0", "healthy-d0"}
    assert inventory.pools() == ("healthy",)
    assert instant.pools() == ()  # what the doctor read before: nothing exported


def test_unreachable_prometheus_fails_and_the_rest_still_runs(tmp_path: Path) -> None:
    from tests.support.prometheus import free_port

    prom = PromHttp(f"http://127.0.0.1:{free_port()}", timeout_s=2.0)
    try:
        checks = run_doctor(DoctorInputs(), prom=prom)
    finally:
        prom.close()
    keyed = by_key(checks)
    assert keyed[("prometheus reachable", "")].verdict == "fail"
    assert (
        keyed[("forecaster checkpoint", "")].verdict == "ok"
    )  # the shipped checkpoint, no metrics to compare
    assert exit_code(checks) == 1


def test_kube_probe_reads_access_reviews_from_the_api_server(tmp_path: Path) -> None:
    with kube_server(deny_patch_scale=True) as kube:
        probe = KubeClientProbe(api_client(kubeconfig=kube.write_kubeconfig(tmp_path / "kc")))
        assert probe.can("llm", "get", "apps", "deployments", "scale") is True
        assert probe.can("llm", "patch", "apps", "deployments", "scale") is False
        found = sorted(probe.deployments("llm", "healthy"))
    assert found == [("healthy-decode", "decode", "active"), ("healthy-prefill", "prefill", "active")]
