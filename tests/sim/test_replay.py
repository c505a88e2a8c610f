"""Trace replay: policies, the report's JSON, static-peak sizing, and the ``pdscale replay`` command."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import (
    PolicyOptions,
    ReplayView,
    ScaleCommand,
    StaticPeakPolicy,
    make_policy,
    peak_windows,
    policy_names,
    register_policy,
    replay,
)
from serving.sim.replay_cli import replay_cmd
from serving.workload.trace import Trace

MODELS = analytic_models(
    AnalyticProfile(kv_capacity_tokens=200_000, max_num_seqs=128, max_num_batched_tokens=2048),
    AnalyticLatency(
        base_ms=10.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2, decode_ms_per_context_token=2e-5
    ),
)


def poisson(rate_rps: float, duration_s: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.2) + 5))
    arrival = arrival[arrival < duration_s]
    n = len(arrival)
    return Trace.from_arrays(arrival - arrival[0], rng.integers(200, 1800, n), rng.integers(20, 200, n))


def test_report_json_has_the_promised_keys_and_is_strict_json() -> None:
    tr = poisson(5, 20)
    rep = replay(single_pool(), {"default": tr}, make_policy("fixed", PolicyOptions(1, 1)), models=MODELS)
    doc = rep.to_json()
    for key in ("requests", "completed", "dropped", "ttft_ms", "itl_ms", "slo_attainment", "gpu_seconds",
                "scale_events", "wall_s", "policy", "profile"):  # fmt: skip
        assert key in doc, key
    assert set(doc["ttft_ms"]) == set(doc["itl_ms"]) == {"p50", "p90", "p99"}
    assert doc["requests"] == doc["completed"] == len(tr) and doc["dropped"] == 0
    assert doc["policy"] == "fixed"
    json.dumps(doc, allow_nan=False)


def test_static_peak_meets_the_slo_where_an_undersized_fixed_fleet_does_not() -> None:
    # ~40 k prompt tokens/s: several llama3-8b/a100 prefill instances' worth (real profile and latency model)
    tr = poisson(40, 60)
    static = make_policy("static-peak")
    rep_static = replay(single_pool(), {"default": tr}, static)
    assert isinstance(static, StaticPeakPolicy)
    assert static.sizing["default"]["prefill"] >= 2
    assert rep_static.slo_attainment >= 0.99
    rep_small = replay(single_pool(), {"default": tr}, make_policy("fixed", PolicyOptions(1, 1)))
    assert rep_small.slo_attainment < 0.5
    assert rep_small.completed == len(tr)  # queued, not dropped: the drain finishes them
    # fixed fleets hold their GPUs for the whole replay, drain included
    assert rep_small.gpu_seconds == pytest.approx(2 * rep_small.sim_end_s)
    assert rep_static.gpu_seconds == pytest.approx(
        sum(static.sizing["default"].values()) * rep_static.sim_end_s
    )


def test_without_drain_the_unfinished_are_reported_not_dropped() -> None:
    tr = poisson(40, 30)
    rep = replay(
        single_pool(), {"default": tr}, make_policy("fixed", PolicyOptions(1, 1)), models=MODELS, drain=False
    )
    assert rep.unfinished > 0
    assert rep.completed + rep.unfinished == rep.requests and rep.dropped == 0


def test_peak_windows_find_the_prompt_and_the_output_peaks_apart() -> None:
    # 0-100 s: 100 long-output requests; 200-210 s: 200 long-prompt requests
    arrival = np.concatenate([np.linspace(0, 100, 100, endpoint=False), np.linspace(200, 210, 200)])
    prompt = np.concatenate([np.full(100, 10), np.full(200, 1000)])
    output = np.concatenate([np.full(100, 5000), np.full(200, 10)])
    by_prompt, by_output = peak_windows(Trace.from_arrays(arrival, prompt, output), window_s=60)
    assert by_prompt.t_start_s <= 200 and by_prompt.t_start_s + 60 > 210
    assert by_prompt.rate_rps == pytest.approx(200 / 60)
    assert by_prompt.prompt_tps == pytest.approx(200 * 1000 / 60)
    assert by_output.t_start_s < 100 and by_output.mean_output_tokens == 5000


class StepUp:
    """A registered test policy: one decode instance, two from t=5 s."""

    name = "step-up"

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        self.views: list[ReplayView] = []

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        self.views.append(view)
        return [ScaleCommand("default", "decode", 2 if now_s >= 5.0 else 1)]


def test_a_registered_policy_drives_the_simulator_and_sees_the_scrape() -> None:
    register_policy("step-up", lambda options: StepUp())
    assert "step-up" in policy_names()
    policy = make_policy("step-up")
    rep = replay(single_pool(), {"default": poisson(5, 20)}, policy, models=MODELS)
    assert rep.scale_events == 1
    assert isinstance(policy, StepUp)
    view = policy.views[10]
    assert view.counts["default"]["decode"]["provisioning"] == 1
    assert "vllm:num_requests_running" in view.samples.gauges
    assert rep.timeline is not None and rep.timeline.holding_gpu.max() == 3


def test_unknown_policy_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="static-peak"):
        make_policy("nope")


def test_cli_replays_a_trace_file_with_the_real_profile(tmp_path: Path) -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s:02d}.000000,{300 + 10 * s},{20 + s}" for s in range(40)]
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n")
    app = typer.Typer()
    app.command()(replay_cmd)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        app,
        ["--trace", str(path), "--policy", "fixed", "--prefill", "1", "--decode", "2", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["requests"] == doc["completed"] == 40 and doc["dropped"] == 0
    assert doc["profile"] == "llama3-8b/a100" and doc["slo_attainment"] == 1.0
    assert "SLO attainment" in result.output
    bad = CliRunner().invoke(app, ["--trace", str(path), "--policy", "nope"])
    assert bad.exit_code == 2 and "unknown replay policy" in bad.output


def test_cli_tail_promotion_and_output_prediction_reach_the_simulator(tmp_path: Path) -> None:
    # 60 long prompts in 2 s on one prefill instance: the queue passes half the 1-s TTFT SLO
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{s // 30:02d}.{(s % 30) * 33000:06d},8000,20" for s in range(60)]
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(rows) + "\n")
    app = typer.Typer()
    app.command()(replay_cmd)
    runs = {}
    for name, extra in {"off": [], "on": ["--tail-fraction", "0.5", "--predict-output"]}.items():
        out = tmp_path / f"{name}.json"
        args = [
            "--trace",
            str(path),
            "--policy",
            "fixed",
            "--prefill",
            "1",
            "--decode",
            "1",
            "--standby",
            "1",
        ]
        result = CliRunner().invoke(app, [*args, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(out.read_text())
    assert runs["off"]["pools"]["default"].get("tail_promotions", 0) == 0
    on = runs["on"]["pools"]["default"]
    assert on["tail_promotions"] > 0 and on["standby_promotions"] >= 1
    assert runs["on"]["completed"] == runs["off"]["completed"] == 60
    fleet_clash = CliRunner().invoke(app, ["--fleet", str(path), "--tail-fraction", "0.5"])
    assert fleet_clash.exit_code != 0 and "--tail-fraction" in fleet_clash.output


def test_a_decode_starved_pd_fleet_shows_in_ttft_not_itl() -> None:
    # 4 decode slots per instance, ~110 steps of ~11 ms per request: one decode instance serves ~3.6 req/s
    models = analytic_models(
        AnalyticProfile(kv_capacity_tokens=200_000, max_num_seqs=4, max_num_batched_tokens=2048),
        AnalyticLatency(
            base_ms=10.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2, decode_ms_per_context_token=2e-5
        ),
    )
    tr = poisson(5, 30)
    starved = replay(single_pool(), {"default": tr}, make_policy("fixed", PolicyOptions(2, 1)), models=models)
    ample = replay(single_pool(), {"default": tr}, make_policy("fixed", PolicyOptions(2, 3)), models=models)
    assert starved.completed == ample.completed == len(tr)
    # the wait for a decode slot is part of TTFT (the client's first token comes from the decode instance)
    assert starved.ttft_ms["p99"] > 5_000.0 and starved.slo_attainment < 0.5
    assert starved.itl_ms["p99"] < 15.0  # the decode steps themselves stay fast
    assert ample.ttft_ms["p99"] < 200.0 and ample.slo_attainment == 1.0


def test_the_bundled_trace_replays_and_drains_completely() -> None:
    from serving.sim.replay_cli import default_trace_path
    from serving.workload.readers import read_trace

    tr = read_trace(default_trace_path())
    rep = replay(single_pool(), {"default": tr}, make_policy("static-peak"))
    assert rep.requests == rep.completed == len(tr) > 10_000
    assert rep.unfinished == 0 and rep.dropped == 0 and rep.slo_attainment > 0.99
