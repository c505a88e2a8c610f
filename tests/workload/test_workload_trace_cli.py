"""``pdscale trace`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from serving.workload.cli import trace_app
from serving.workload.readers import read_trace

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
runner = CliRunner()

KEYS = {
    "requests",
    "duration_s",
    "mean_rate_rps",
    "peak_rate_rps_1s",
    "peak_rate_rps_5s",
    "cv_5s",
    "prompt_tokens_mean",
    "output_tokens_mean",
    "failed",
    "format",
    "first_time",
    "last_time",
    "models",
}


def test_stats_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    result = runner.invoke(trace_app, ["stats", str(CODE), "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) >= KEYS
    assert data["requests"] == 6118 and data["peak_rate_rps_1s"] == 67.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "peak_rate_rps_5s" in result.output


def test_stats_on_malformed_copy_fails_with_file_and_line(tmp_path: Path) -> None:
    lines = CODE.read_bytes().split(b"\r\n")
    lines[1234] = lines[1234].replace(b",", b",x", 1)
    bad = tmp_path / "code_bad.csv"
    bad.write_bytes(b"\r\n".join(lines))
    result = runner.invoke(trace_app, ["stats", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:1235: not a number (column ContextTokens" in result.output.replace("\n", "")


def test_stats_unknown_format_message(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("foo,bar\n1,2\n")
    result = runner.invoke(trace_app, ["stats", str(p)])
    assert result.exit_code == 2 and "unknown trace format" in result.output
    assert "--format" in result.output.replace("\n", "")


def test_stats_single_request_writes_null_rate(tmp_path: Path) -> None:
    p = tmp_path / "one.jsonl"
    p.write_text('{"timestamp": 7, "input_length": 3, "output_length": 1}\n')
    out = tmp_path / "one.json"
    result = runner.invoke(trace_app, ["stats", str(p), "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 1 and data["mean_rate_rps"] is None and data["duration_s"] == 0.0


def test_generate_then_stats(tmp_path: Path) -> None:
    for fmt in ("azure", "mooncake", "burstgpt"):
        out = tmp_path / f"g.{fmt}"
        args = [
            "generate",
            "--out",
            str(out),
            "--format",
            fmt,
            "--duration-s",
            "120",
            "--seed",
            "3",
            "--rate-rps",
            "4",
            "--model",
            "ChatGPT",
        ]
        result = runner.invoke(trace_app, args)
        assert result.exit_code == 0, result.output
        assert read_trace(out).format == fmt
    again = tmp_path / "again.azure"
    runner.invoke(
        trace_app,
        [
            "generate",
            "--out",
            str(again),
            "--format",
            "azure",
            "--duration-s",
            "120",
            "--seed",
            "3",
            "--rate-rps",
            "4",
            "--model",
            "ChatGPT",
        ],
    )
    assert again.read_bytes() == (tmp_path / "g.azure").read_bytes()


def test_generate_rejects_bad_params(tmp_path: Path) -> None:
    result = runner.invoke(trace_app, ["generate", "--out", str(tmp_path / "x"), "--rate-rps", "-2"])
    assert result.exit_code == 2 and "rate_rps" in result.output


def test_head_and_help() -> None:
    result = runner.invoke(trace_app, ["head", str(CODE), "-n", "3"])
    assert result.exit_code == 0 and "4808" in result.output
    for cmd in ("stats", "generate", "head"):
        help_text = runner.invoke(trace_app, [cmd, "--help"]).output
        assert "Example" in help_text


def test_stats_reports_reordered_rows_as_warning(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    rows = [(0, 1), (900, 2), (400, 3), (3000, 4)]
    p.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 1}}\n' for t, n in rows))
    out = tmp_path / "r.json"
    result = runner.invoke(trace_app, ["stats", str(p), "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["requests"] == 4 and data["duration_s"] == 3.0
    assert len(data["warnings"]) == 1 and ":3: 1 rows arrived up to 0.5 s" in data["warnings"][0]
    strict = runner.invoke(trace_app, ["stats", str(p), "--max-reorder-s", "0.1"])
    assert strict.exit_code == 2 and "r.jsonl:3: arrival goes back 0.5 s" in strict.output.replace("\n", "")
