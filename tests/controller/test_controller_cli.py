"""``pdscale controller`` (embedded default) and ``pdscale config check`` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from training.pdscale_cli import app

runner = CliRunner()


def test_embedded_default_runs_both_policies_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "controller.json"
    result = runner.invoke(app, ["controller", "--duration-s", "90", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "predictive vs reactive" in result.output
    doc = json.loads(out.read_text())
    for name in ("predictive", "reactive"):
        figures = doc["policies"][name]
        assert figures["dropped"] == 0
        assert figures["completed"] == figures["requests"] > 0
        assert figures["gpu_seconds"] > 0


def test_config_check_accepts_a_valid_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_s: 1\npools:\n  - name: chat\n    policy: {headroom: 0.2, standby_decode: 1}\n")
    result = runner.invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "chat" in result.output


def test_config_check_names_every_bad_field(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "pools:\n  - name: chat\n    policy: {headroom: -1, min_decode: 9, max_decode: 2}\n    slo_ttft_ms: 0\n"
    )
    result = runner.invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2
    assert "pools.0.policy.headroom" in result.output
    assert "pools.0.slo_ttft_ms" in result.output


def test_config_check_rejects_unknown_fields_and_bad_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_seconds: 1\n")
    result = runner.invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2 and "tick_seconds" in result.output
    cfg.write_text("pools: [unclosed\n")
    result = runner.invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2 and "not valid YAML" in result.output
