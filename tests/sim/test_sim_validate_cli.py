"""`pdscale sim validate --real-json`: the recorded quiet-machine runs replay through the simulator, no server."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from serving.sim.cli import sim_app

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
CONV = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"
RECORDED = ROOT / "serving/sim/profiles/validation"


def test_a_recorded_run_is_compared_without_a_server(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    res = CliRunner().invoke(
        sim_app,
        [
            "validate",
            str(CODE),
            "--real-json",
            str(RECORDED / "code_rows0-119_1rps_quiet.json"),
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    (rows,) = doc["compare"].values()
    assert set(rows) == {"ttft_ms.p50", "ttft_ms.p90", "itl_ms.p50", "itl_ms.p90"}
    for row in rows.values():
        assert row["real"] > 0 and row["sim"] > 0
        assert row["sim_over_real"] == row["sim"] / row["real"]


def test_a_recorded_run_of_another_trace_is_refused() -> None:
    res = CliRunner().invoke(
        sim_app, ["validate", str(CODE), "--real-json", str(RECORDED / "conv_rows0-119_1rps_quiet.json")]
    )
    assert res.exit_code == 2
    assert "error:" in res.output


def test_a_missing_recording_is_a_clear_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(sim_app, ["validate", str(CONV), "--real-json", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "nope.json" in res.output
