"""PolicyConfig.headroom_decode: decode's own headroom (stage 2, the burst reserve's level, the standby's sizing),
applied while no ramp is projected; prefill keeps ``headroom``. None (the default) is the policy as before."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_fixtures import ctx, forecast, obs
from pydantic import ValidationError
from typer.testing import CliRunner

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages
from training.pdscale_cli import app


@pytest.mark.parametrize(
    ("decode_h", "ramp", "expected"),
    [
        (None, False, (0.3, 0.3)),
        (None, True, (0.3, 0.3)),
        (0.0, False, (0.3, 0.0)),
        (0.1, False, (0.3, 0.1)),
        (0.0, True, (0.3, 0.3)),
    ],
    ids=["unset", "unset-ramp", "zero", "tenth", "ramp-keeps-headroom"],
)
def test_role_headroom(decode_h: float | None, ramp: bool, expected: tuple[float, float]) -> None:
    assert stages.role_headroom(0.3, decode_h, ramp) == expected


def test_with_headroom_sizes_decode_on_its_own_headroom_and_prefill_on_the_shared_one() -> None:
    need = stages.Need(2.5, 2.5, 0.0, ())
    assert stages.with_headroom(need, 0.3)[:2] == (4, 4)  # ceil(3.25)
    p, d, why = stages.with_headroom(need, 0.3, 0.0)
    assert (p, d) == (4, 3)
    assert "decode's 0%" in why
    assert stages.with_headroom(need, 0.3, 0.3)[2] == stages.with_headroom(need, 0.3)[2]


@given(
    need_p=st.floats(0.0, 200.0),
    need_d=st.floats(0.0, 200.0),
    h=st.floats(0.0, 5.0),
    dh=st.floats(0.0, 5.0),
)
def test_decode_target_follows_its_headroom_and_never_falls_below_the_need(
    need_p: float, need_d: float, h: float, dh: float
) -> None:
    need = stages.Need(need_p, need_d, 0.0, ())
    p_shared, d_shared, _ = stages.with_headroom(need, h)
    p, d, _ = stages.with_headroom(need, h, dh)
    assert p == p_shared  # prefill never moves
    assert d >= math.ceil(need_d - 1e-9)
    assert (d <= d_shared) if dh <= h else (d >= d_shared)


def _decode_plan(cfg: PolicyConfig, rps: float) -> int:
    """Decode's planned active replicas after a minute of steady load from one decode (no ramp, no burst),
    each tick's plan applied at once."""
    state, decode = PoolState(), 1
    for t in range(60):
        o = obs(
            now_s=1000.0 + t,
            arrival_rps=rps,
            forecast=forecast(rps=rps),
            replicas={"prefill": 2, "decode": decode},
            active={"prefill": 2, "decode": decode},
            standby={"prefill": 0, "decode": 0},
            running_seqs=10.0,
        )
        plan, state = decide(ctx(o, cfg=cfg), state)
        assert plan is not None
        decode = plan.decode
    return decode


def test_decide_plans_less_decode_with_a_lower_decode_headroom_on_steady_load() -> None:
    base = PolicyConfig(burst_reserve="off", standby_sizing="flat", standby_decode=0, buffer_multiplier=0.0)
    # Little: 12 req/s x 200 tokens / (2000 / 64 tokens/s per sequence) = 76.8 sequences = 1.2 instances
    shared = _decode_plan(base, 12.0)
    own = _decode_plan(base.model_copy(update={"headroom_decode": 0.0}), 12.0)
    assert shared == 2 and own == 2  # ceil(1.2 x 1.3) = ceil(1.2) = 2: rounding hides it at this load
    shared = _decode_plan(base, 30.0)  # 192 sequences = 3.0 instances
    own = _decode_plan(base.model_copy(update={"headroom_decode": 0.0}), 30.0)
    assert (shared, own) == (4, 3)


@pytest.mark.parametrize("bad", [-0.1, 5.5, "lots"])
def test_headroom_decode_rejects_bad_values(bad: object) -> None:
    with pytest.raises(ValidationError, match="headroom_decode"):
        PolicyConfig.model_validate({"headroom_decode": bad})


def test_config_check_names_headroom_decode(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pools:\n  - name: chat\n    policy: {headroom_decode: -1}\n")
    result = CliRunner().invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2
    assert "pools.0.policy.headroom_decode" in result.output
    cfg.write_text("pools:\n  - name: chat\n    policy: {headroom_decode: 0.1}\n")
    assert CliRunner().invoke(app, ["config", "check", str(cfg)]).exit_code == 0
