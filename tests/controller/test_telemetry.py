"""The controller's own /metrics, /healthz and /readyz over HTTP, driven by a virtual clock."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from controller.clock import VirtualClock
from controller.telemetry import Telemetry, TelemetryServer
from tests.controller.test_daemon import ScriptedSource, cluster, make_daemon


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5.0) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readyz_after_the_first_good_tick_and_healthz_fails_when_the_loop_is_stuck() -> None:
    clock = VirtualClock()
    source = ScriptedSource()
    daemon = make_daemon(source, cluster(), clock)
    assert daemon.telemetry is not None
    daemon.telemetry.stuck_after_s = 10.0
    with TelemetryServer(daemon.telemetry, 0, host="127.0.0.1") as server:
        assert get(server.port, "/readyz")[0] == 503
        assert get(server.port, "/healthz")[0] == 200
        assert daemon.tick().ok
        code, text = get(server.port, "/readyz")
        assert code == 200 and "leader" in text
        clock.advance(11.0)  # no loop iteration for longer than stuck_after_s
        code, text = get(server.port, "/healthz")
        assert code == 503 and "stuck" in text
        daemon.tick()
        assert get(server.port, "/healthz")[0] == 200
        assert get(server.port, "/nope")[0] == 404


def test_metrics_page_has_decisions_forecasts_errors_latency_and_last_success() -> None:
    clock = VirtualClock()
    source = ScriptedSource(prompt_tps=60_000.0)
    daemon = make_daemon(source, cluster(), clock)
    daemon.run(max_ticks=8)
    assert daemon.telemetry is not None
    with TelemetryServer(daemon.telemetry, 0, host="127.0.0.1") as server:
        code, text = get(server.port, "/metrics")
    assert code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    target = samples[
        ("pdscale_controller_target_replicas", (("pool", "a"), ("role", "prefill"), ("tier", "active")))
    ]
    assert target >= 5
    assert samples[("pdscale_controller_forecast_arrivals_p90_rps", (("pool", "a"),))] > 0
    assert 0 <= samples[("pdscale_controller_forecast_burst_probability", (("pool", "a"),))] <= 1
    assert samples[("pdscale_controller_errors_total", (("kind", "unexpected"),))] == 0
    assert samples[("pdscale_controller_tick_seconds_count", ())] == 8
    assert samples[("pdscale_controller_last_success_timestamp_seconds", ())] == clock.time()  # the 8th tick
    assert samples[("pdscale_controller_forecaster_info", (("name", "holt"),))] == 1


def test_registries_are_private() -> None:
    a, b = Telemetry(VirtualClock()), Telemetry(VirtualClock())
    a.error("permanent")
    assert a.registry.get_sample_value("pdscale_controller_errors_total", {"kind": "permanent"}) == 1
    assert b.registry.get_sample_value("pdscale_controller_errors_total", {"kind": "permanent"}) == 0


def test_serving_tail_counters_are_mirrored_per_pool() -> None:
    import numpy as np

    from serving.sim.samples import STANDBY_PROMOTIONS_TOTAL, TAIL_PROMOTIONS_TOTAL, InstanceSamples

    telemetry = Telemetry(VirtualClock())
    samples = InstanceSamples(
        now_s=0.0,
        instance_ids=("p0", "p1", "q0"),
        pools=("chat", "chat", "docs"),
        roles=("prefill", "prefill", "prefill"),
        nodes=("n0", "n1", "n2"),
        states=("active", "active", "active"),
        counters={
            TAIL_PROMOTIONS_TOTAL: np.array([3.0, 4.0, 1.0]),
            STANDBY_PROMOTIONS_TOTAL: np.array([1.0, 0, 0]),
        },
    )
    telemetry.serving_counters(samples)
    found = {
        (s.name, s.labels["pool"]): s.value
        for family in text_string_to_metric_families(telemetry.render().decode())
        for s in family.samples
        if "serving_" in s.name
    }
    assert found == {
        ("pdscale_controller_serving_tail_promotions", "chat"): 7.0,
        ("pdscale_controller_serving_tail_promotions", "docs"): 1.0,
        ("pdscale_controller_serving_standby_promotions", "chat"): 1.0,
        ("pdscale_controller_serving_standby_promotions", "docs"): 0.0,
    }
