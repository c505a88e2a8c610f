"""The config sections that wire issue 6/8 pieces into the daemon: ``actuator.router_admin``,
``pools[].gpu_share`` and ``forecaster_burst_detector`` — accepted, rejected naming the field, and shown by
``pdscale config check``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from controller.config import ConfigError, ControllerConfig, load_yaml_model
from training.pdscale_cli import app

runner = CliRunner()

LIVE: dict[str, Any] = {
    "source": {"kind": "prometheus", "url": "http://prometheus:9090"},
    "actuator": {"kind": "kubernetes", "namespace": "llm"},
    "pools": [{"name": "chat"}, {"name": "code"}],
}


def live(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(LIVE)
    for key, value in changes.items():
        if key == "router_admin":
            doc["actuator"]["router_admin"] = value
        else:
            doc[key] = value
    return doc


def messages(doc: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as err:
        ControllerConfig.model_validate(doc)
    return "\n".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.value.errors())


def test_router_admin_section_is_read_with_its_defaults() -> None:
    cfg = ControllerConfig.model_validate(
        live(router_admin={"pools": {"chat": {"url": "http://chat-router.llm.svc", "token_file": "/t"}}})
    )
    ra = cfg.actuator.router_admin
    assert ra is not None
    assert (ra.pools["chat"].url, ra.pools["chat"].token_file) == ("http://chat-router.llm.svc", Path("/t"))
    assert (ra.drain_timeout_s, ra.mark_pods) == (120.0, True)
    assert ControllerConfig.model_validate(live()).actuator.router_admin is None  # off unless configured


@pytest.mark.parametrize(
    ("router_admin", "kind", "field"),
    [
        pytest.param({"pools": {}}, "kubernetes", "actuator.router_admin.pools", id="no-pools"),
        pytest.param(
            {"pools": {"chat": {}}}, "kubernetes", "actuator.router_admin.pools.chat.url", id="no-url"
        ),
        pytest.param(
            {"pools": {"chat": {"url": "chat-router:8080"}}},
            "kubernetes",
            "actuator.router_admin.pools.chat.url",
            id="url-without-scheme",
        ),
        pytest.param(
            {"pools": {"chat": {"url": "http://r"}}, "drain_timeout_s": 0},
            "kubernetes",
            "actuator.router_admin.drain_timeout_s",
            id="zero-timeout",
        ),
        pytest.param(
            {"pools": {"chat": {"url": "http://r", "tokn_file": "/t"}}},
            "kubernetes",
            "actuator.router_admin.pools.chat.tokn_file",
            id="misspelt-field",
        ),
        pytest.param(
            {"pools": {"chat": {"url": "http://r"}}, "mark_pods": "sometimes"},
            "kubernetes",
            "actuator.router_admin.mark_pods",
            id="mark-pods-not-bool",
        ),
        pytest.param({"pools": {"chat": {"url": "http://r"}}}, "dry-run", "router_admin:", id="dry-run"),
        pytest.param(
            {"pools": {"chta": {"url": "http://r"}}},
            "kubernetes",
            "actuator.router_admin.pools",
            id="unknown-pool",
        ),
    ],
)
def test_router_admin_errors_name_the_field(router_admin: dict[str, Any], kind: str, field: str) -> None:
    doc = live(router_admin=router_admin)
    doc["actuator"]["kind"] = kind
    assert field in messages(doc)


def test_an_unknown_router_pool_is_named_with_the_configured_ones() -> None:
    text = messages(live(router_admin={"pools": {"chta": {"url": "http://r"}}}))
    assert "['chta'] are not configured pools ['chat', 'code']" in text


def test_gpu_shares_need_a_budget_and_fit_in_it() -> None:
    ok = ControllerConfig.model_validate(
        live(gpu_budget=8, pools=[{"name": "chat", "gpu_share": 5}, {"name": "code", "gpu_share": 3}])
    )
    assert ok.gpu_shares() == {"chat": 5, "code": 3}
    partial = ControllerConfig.model_validate(
        live(gpu_budget=8, pools=[{"name": "chat", "gpu_share": 2}, {"name": "code"}])
    )
    assert partial.gpu_shares() == {"chat": 2}  # a pool without a share is left out, not given 0
    assert ControllerConfig.model_validate(live()).gpu_shares() == {}

    no_budget = messages(live(pools=[{"name": "chat", "gpu_share": 2}, {"name": "code", "gpu_share": 1}]))
    assert (
        "pools.0.gpu_share" in no_budget
        and "pools.1.gpu_share" in no_budget
        and "needs gpu_budget" in no_budget
    )
    over = messages(
        live(gpu_budget=8, pools=[{"name": "chat", "gpu_share": 5}, {"name": "code", "gpu_share": 4}])
    )
    assert "add up to 9 GPUs (chat: 5, code: 4), more than gpu_budget 8" in over
    assert "pools.0.gpu_share" in messages(live(gpu_budget=8, pools=[{"name": "chat", "gpu_share": -1}]))


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=64),
    shares=st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=64)), min_size=1, max_size=4),
)
def test_shares_are_accepted_exactly_when_they_fit_the_budget(budget: int, shares: list[int | None]) -> None:
    pools = [{"name": f"p{i}", "gpu_share": s} for i, s in enumerate(shares)]
    doc = live(gpu_budget=budget, pools=pools)
    fits = sum(s for s in shares if s is not None) <= budget
    if fits:
        cfg = ControllerConfig.model_validate(doc)
        assert cfg.gpu_shares() == {f"p{i}": s for i, s in enumerate(shares) if s is not None}
    else:
        assert "more than gpu_budget" in messages(doc)


def test_burst_detector_is_off_by_default_and_can_be_turned_on() -> None:
    assert ControllerConfig().forecaster_burst_detector is False
    assert (
        ControllerConfig.model_validate({"forecaster_burst_detector": True}).forecaster_burst_detector is True
    )
    assert "forecaster_burst_detector" in messages({"forecaster_burst_detector": "maybe"})


def test_the_errors_name_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(live(router_admin={"pools": {"chat": {"url": "router"}}})))
    with pytest.raises(ConfigError, match=r"c\.yaml: actuator\.router_admin\.pools\.chat\.url"):
        load_yaml_model(path, ControllerConfig)


def test_config_check_accepts_and_summarises_the_three_options(tmp_path: Path) -> None:
    path = tmp_path / "live.yaml"
    doc = live(
        gpu_budget=8,
        pools=[
            {"name": "chat", "gpu_share": 4},
            {"name": "code", "policy": {"silence_hold_s": 0, "latency_correction": "off"}},
        ],
        router_admin={"pools": {"chat": {"url": "http://chat-router.llm.svc"}}, "drain_timeout_s": 90},
        forecaster_burst_detector=False,
        forecaster_combination="arrivals",
    )
    path.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "GPU budget 8; guaranteed shares: chat 4" in result.output
    assert "router drain before scale-down: chat -> http://chat-router.llm.svc; timeout 90 s" in result.output
    assert "onset burst detector: off" in result.output
    assert "online forecast combination: arrivals" in result.output
    assert "forecaster length guard: on" in result.output
    assert (
        "silence hold (no scale-down while arrivals have stopped dead): chat 120 s, code off" in result.output
    )
    assert (
        "latency correction (capacities at the engines' measured speed): chat on, code off" in result.output
    )


def test_config_check_rejects_each_broken_option(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    doc = live(
        pools=[{"name": "chat", "gpu_share": 4}, {"name": "code"}],
        router_admin={"pools": {"chat": {"url": "http://r"}}, "drain_timeout_s": -5},
    )
    path.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "actuator.router_admin.drain_timeout_s" in result.output
    path.write_text(yaml.safe_dump(live(pools=[{"name": "chat", "gpu_share": 4}])))
    result = runner.invoke(app, ["config", "check", str(path)])
    assert (
        result.exit_code == 2 and "pools.0.gpu_share" in result.output and "needs gpu_budget" in result.output
    )
