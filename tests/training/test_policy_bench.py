"""``pdscale bench`` (training/policy_bench.py, training/bench_cli.py): every policy side by side.

One module-scoped CLI run over two short synthetic traces (~120 s each, Holt forecaster) feeds the shape
and figure checks; the error paths run without replays.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.config import ConfigError
from controller.replay_policies import PredictivePolicy
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace
from serving.workload.writers import write_trace
from training.pdscale_cli import app
from training.policy_bench import (
    POLICIES,
    BenchSettings,
    aggregate,
    bench_json,
    load_predictive_config,
    make_bench_policy,
    run_trace,
    trace_names,
)

FIGURE_KEYS = {
    "error",
    "requests",
    "completed",
    "unfinished",
    "over_context",
    "rejected",
    "slo_attainment",
    "ttft_ms",
    "itl_ms",
    "gpu_seconds",
    "gpu_hours",
    "gpu_ratio_to_oracle",
    "scale_events",
    "wall_s",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trace(seed: int, rate_rps: float) -> Trace:
    params = SyntheticParams(
        duration_s=120.0,
        rate_rps=rate_rps,
        burst_multiplier=5.0,
        calm_mean_s=40.0,
        burst_mean_s=15.0,
        prompt=LengthDist(median_tokens=1200.0, sigma=0.6, max_tokens=6000),
        output=LengthDist(median_tokens=120.0, sigma=0.6, max_tokens=800),
    )
    return generate(params, seed=seed)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("traces")
    return [
        write_trace(_trace(3, 6.0), d / "bursty.csv", "azure"),
        write_trace(_trace(4, 3.0), d / "calm.jsonl", "mooncake"),
    ]


@pytest.fixture(scope="module")
def cli_run(traces: list[Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--forecaster", "holt", "--json", str(out / "b.json"), "--plots", str(out / "plots")]
    for t in traces:
        args += ["--trace", str(t)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads((out / "b.json").read_text()), out / "plots", res.output


def test_json_has_every_policy_per_trace_and_aggregated(cli_run: tuple[dict[str, Any], Path, str]) -> None:
    doc, _, _ = cli_run
    assert list(doc["traces"]) == ["bursty", "calm"]
    for t in doc["traces"].values():
        assert set(t) >= {"source", "format", "requests", "profile", "slo_ttft_ms", "slo_itl_ms", "policies"}
        assert list(t["policies"]) == list(POLICIES)
        for f in t["policies"].values():
            assert set(f) == FIGURE_KEYS
            assert f["error"] is None
            assert set(f["ttft_ms"]) == {"p50", "p90", "p99"}
            assert f["requests"] == t["requests"]
    assert list(doc["policies"]) == list(POLICIES)
    assert doc["settings"]["forecaster"] == "holt"


def test_oracle_ratio_is_one_and_static_peak_never_rescales(
    cli_run: tuple[dict[str, Any], Path, str],
) -> None:
    doc, _, _ = cli_run
    for t in doc["traces"].values():
        assert t["policies"]["oracle"]["gpu_ratio_to_oracle"] == pytest.approx(1.0)
        assert t["policies"]["static-peak"]["scale_events"] == 0
        for f in t["policies"].values():
            assert f["gpu_ratio_to_oracle"] == pytest.approx(
                f["gpu_seconds"] / t["policies"]["oracle"]["gpu_seconds"]
            )
    # the bursty trace makes the autoscalers move: a bench where nothing scaled would test little
    assert doc["traces"]["bursty"]["policies"]["reactive"]["scale_events"] > 0


def test_aggregate_sums_gpu_seconds_and_weights_slo_by_requests(
    cli_run: tuple[dict[str, Any], Path, str],
) -> None:
    doc, _, _ = cli_run
    per = [t["policies"] for t in doc["traces"].values()]
    for name, agg in doc["policies"].items():
        assert agg["gpu_seconds"] == pytest.approx(sum(p[name]["gpu_seconds"] for p in per))
        assert agg["requests"] == sum(p[name]["requests"] for p in per)
        assert agg["scale_events"] == sum(p[name]["scale_events"] for p in per)
        weighted = sum(p[name]["slo_attainment"] * p[name]["requests"] for p in per) / agg["requests"]
        assert agg["slo_attainment"] == pytest.approx(weighted)
        oracle = sum(p["oracle"]["gpu_seconds"] for p in per)
        assert agg["gpu_ratio_to_oracle"] == pytest.approx(agg["gpu_seconds"] / oracle)


def test_tables_and_plots_written(cli_run: tuple[dict[str, Any], Path, str]) -> None:
    _, plots, output = cli_run
    for name in ("bursty", "calm"):
        for kind in ("capacity", "ttft-cdf"):
            png = plots / f"{kind}-{name}.png"
            assert png.read_bytes()[:8] == PNG_MAGIC, png
    assert "policies side by side — bursty" in output
    assert "policies side by side — all traces" in output


def test_ratio_unknown_without_oracle_reads_dash_and_null(traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    args = ["bench", "-t", str(traces[1]), "-p", "static-peak", "--json", str(out), "--duration-s", "60"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert list(doc["traces"]["calm"]["policies"]) == ["static-peak"]
    assert doc["traces"]["calm"]["policies"]["static-peak"]["gpu_ratio_to_oracle"] is None
    row = next(line for line in res.output.splitlines() if "static-peak" in line)
    assert " - │" in row  # the '/oracle' cell


def test_bad_config_names_file_and_field(traces: list[Path], tmp_path: Path) -> None:
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("pools:\n  - name: default\n    policy:\n      headroom: -1\n")
    res = CliRunner().invoke(app, ["bench", "-t", str(traces[0]), "--config", str(cfg)])
    assert res.exit_code == 2
    assert str(cfg) in res.output and "pools.0.policy.headroom" in res.output
    with pytest.raises(ConfigError, match="no such file"):
        load_predictive_config(tmp_path / "absent.yaml")


def test_config_reaches_the_predictive_policy(tmp_path: Path) -> None:
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("pools:\n  - policy:\n      headroom: 0.55\n      standby_decode: 1\n")
    settings = BenchSettings(predictive=load_predictive_config(cfg), forecaster="holt")
    policy = make_bench_policy("predictive", settings)
    assert isinstance(policy, PredictivePolicy)
    assert policy.config.headroom == 0.55 and policy.config.standby_decode == 1
    assert bench_json([], settings)["settings"]["predictive_policy"]["headroom"] == 0.55


def test_missing_trace_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    res = CliRunner().invoke(app, ["bench", "--trace", str(missing)])
    assert res.exit_code == 2
    assert "trace file not found" in res.output and str(missing) in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--forecaster", "lstm"], "--forecaster must be one of default, holt"),
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be a finite number > 0"),
        (["--duration-s", "-5"], "--duration-s must be a finite number > 0"),
    ],
    ids=["unknown-policy", "unknown-forecaster", "zero-slo", "negative-duration"],
)
def test_bad_options_rejected_before_any_replay(traces: list[Path], args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["bench", "-t", str(traces[0]), *args])
    assert res.exit_code == 2
    assert message in res.output


def test_seed_table_subcommand_still_runs() -> None:
    args = [
        "bench",
        "seed-table",
        "--qps",
        "4",
        "--gpus",
        "2",
        "--prefill",
        "1",
        "--isl",
        "256",
        "--osl",
        "16",
    ]
    res = CliRunner().invoke(app, [*args, "--duration-s", "20", "--drain-s", "10"])
    assert res.exit_code == 0, res.output
    assert "Seed table" in res.output


def test_bench_options_refused_with_a_subcommand(traces: list[Path]) -> None:
    res = CliRunner().invoke(app, ["bench", "--trace", str(traces[0]), "seed-table", "--qps", "4"])
    assert res.exit_code == 2
    assert "without a subcommand" in res.output


def test_run_trace_reports_progress_to_the_end_of_each_replay() -> None:
    seen: dict[str, float] = {}

    def progress(trace: str, policy: str, done: float) -> None:
        assert trace == "t" and 0.0 <= done <= 1.0
        seen[policy] = max(seen.get(policy, 0.0), done)

    trace = _trace(3, 6.0).window(0.0, 40.0)
    settings = BenchSettings(policies=("static-peak", "oracle"), forecaster="holt")
    bench = run_trace("t", trace, settings, progress=progress)
    assert seen == {"static-peak": 1.0, "oracle": 1.0}
    figs = aggregate([bench])
    assert figs["oracle"].gpu_ratio_to_oracle == pytest.approx(1.0)
    assert figs["static-peak"].requests == len(trace)
    assert math.isfinite(figs["static-peak"].slo_attainment)


def test_trace_names_are_unique_and_file_safe() -> None:
    names = trace_names([Path("a/x y.csv"), Path("b/x y.csv"), Path("c/x y.jsonl")])
    assert names == ["x_y", "x_y-2", "x_y-3"]


def test_a_failed_replay_is_reported_and_the_others_still_run(traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    args = ["bench", "-t", str(traces[0]), "-p", "static-peak", "-p", "oracle", "--slo-ttft-ms", "5"]
    res = CliRunner().invoke(app, [*args, "--json", str(out), "--duration-s", "60"])
    assert res.exit_code == 1
    assert "static-peak failed:" in res.output and "1 of 2 replays failed" in res.output
    doc = json.loads(out.read_text())
    failed = doc["traces"]["bursty"]["policies"]["static-peak"]
    assert "out of reach" in failed["error"] and failed["gpu_seconds"] is None
    assert doc["policies"]["static-peak"]["error"].startswith("bursty: ")
    assert doc["traces"]["bursty"]["policies"]["oracle"]["error"] is None
    assert doc["traces"]["bursty"]["policies"]["oracle"]["gpu_seconds"] > 0
