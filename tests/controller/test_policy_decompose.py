"""bench_policies --decompose reads the predictive plan's reasons back into GPU-seconds per stage. Each stage
must get what the stage functions say it added: a changed reason text the reader no longer parses would
move that stage's GPU-seconds into 'hysteresis' (the remainder) and fail here."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
from policy_fixtures import CAP, ctx, forecast, obs

from controller.config import PolicyConfig
from controller.policy import PoolState, ScalingPlan, decide, stages

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"
TICKS, GPUS = 30, 2


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _decompose(cfg: PolicyConfig, **kw: object) -> dict[str, object]:
    decisions: list[tuple[float, ScalingPlan]] = []
    state = PoolState()
    for t in range(TICKS):
        plan, state = decide(ctx(obs(now_s=1000.0 + t, **kw), cfg=cfg), state)
        assert plan is not None
        decisions.append((1000.0 + t, plan))
    out: dict[str, object] = _bench().decompose(decisions, gpus=GPUS)
    return out


@pytest.mark.parametrize("running", [100.0, 1500.0], ids=["running-below-need", "backlog-above-little"])
def test_capacity_headroom_and_buffer_are_read_back(running: float) -> None:
    cfg = PolicyConfig(burst_reserve="off")
    out = _decompose(cfg, running_seqs=running)
    added = out["added"]
    assert isinstance(added, dict)
    need = stages.capacity_target(obs(running_seqs=running), CAP, 1.0, cfg.provision_lead_s, offered=True)
    assert need is not None
    cap_d = math.ceil(need.decode - 1e-9)
    _, head_d, _ = stages.with_headroom(need, cfg.headroom)
    buf_d, _, _ = stages.buffer_target(need.running_seqs, head_d, cfg.buffer_multiplier, CAP)
    per_tick = TICKS * GPUS
    assert added["capacity", "decode"] == pytest.approx(cap_d * per_tick)
    assert added["headroom", "decode"] == pytest.approx((head_d - cap_d) * per_tick)
    assert added["buffer", "decode"] == pytest.approx((buf_d - head_d) * per_tick)
    little = 10.0 * 200.0 / (CAP.decode_tps / CAP.decode_seqs)  # 64 sequences
    assert out["running_over_little"] == pytest.approx(running / little)


def test_promoted_standby_is_read_back_as_alert() -> None:
    cfg = PolicyConfig(standby_sizing="flat", standby_decode=2, burst_reserve="off")
    out = _decompose(cfg, forecast=forecast(burst=0.99))
    added = out["added"]
    assert isinstance(added, dict)
    assert added["alert", "decode"] == pytest.approx(2 * TICKS * GPUS)
    assert added["standby", "decode"] == pytest.approx(2 * TICKS * GPUS)
