"""Requests no instance can hold (a prompt larger than the KV cache): rejected, as a real vLLM server refuses
them, counted in every report, named by their trace line; the rest of the trace replays."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, ...)
from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import RejectedRequestWarning, Simulator, kv_needs
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import OverContextWarning, PolicyOptions, make_policy, replay, static_peak_counts
from serving.workload.readers import read_trace
from serving.workload.trace import Trace
from serving.workload.writers import write_trace

HUGE = 2_000_000  # past llama3-8b/a100's 434,512 KV tokens per instance


def code_like(n: int = 40, huge_at: tuple[int, ...] = (1, 3)) -> Trace:
    """n requests at 2 req/s, 1,000-token prompts, 50-token outputs; the rows ``huge_at`` ask for HUGE tokens."""
    prompt = np.full(n, 1000)
    prompt[list(huge_at)] = HUGE
    return Trace.from_arrays(np.arange(n) / 2.0, prompt, np.full(n, 50), source="mem.csv")


def fixed_replay(trace: Trace, fleet: FleetSpec | None = None) -> object:
    return replay(fleet or single_pool(), {"default": trace}, make_policy("fixed", PolicyOptions()))


def test_the_replay_completes_and_every_report_counts_the_rejected(tmp_path: Path) -> None:
    with pytest.warns(RejectedRequestWarning, match=r"2 of 40 requests .* 2,000,001 KV tokens on a prefill"):
        report = replay(single_pool(), {"default": code_like()}, make_policy("reactive", PolicyOptions()))
    doc = report.to_json()
    assert (doc["requests"], doc["completed"], doc["rejected"], doc["unfinished"]) == (40, 38, 2, 0)
    assert doc["pools"]["default"]["rejected"] == 2
    assert doc["slo_attainment"] <= 38 / 40  # a rejected request is a miss
    assert np.isnan(report.request_ttft_ms[[1, 3]]).all()
    from training.policy_bench import policy_figures

    assert policy_figures(report, None).to_json()["rejected"] == 2  # pdscale bench's JSON


@pytest.mark.parametrize("split", ["shared", "static"])
def test_fleet_replay_sums_the_rejected_over_its_pools(split: str) -> None:
    from dataclasses import replace

    from serving.sim.fleet_file import replay_fleet

    one = single_pool().pools[0]
    spec = FleetSpec(pools=(replace(one, name="a"), replace(one, name="b")), gpu_budget=8)
    traces = {"a": code_like(20, (2,)), "b": code_like(10, (0, 9))}
    with pytest.warns(RejectedRequestWarning):
        doc = replay_fleet(spec, traces, "static-peak", split=split).to_json()
    assert (doc["requests"], doc["completed"], doc["rejected"], doc["unfinished"]) == (30, 27, 3, 0)
    assert [doc["pools"][p]["rejected"] for p in "ab"] == [1, 2]
    assert all(p["unfinished"] == 0 for p in doc["pools"].values())


def test_the_warning_names_the_first_rejected_request_by_its_file_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(code_like(12, (4, 7)), path, "azure")  # rows 4 and 7: lines 6 and 9 (the header is line 1)
    trace = read_trace(path)
    with pytest.warns(RejectedRequestWarning, match=rf"{path}:6: 2 of 12 requests"):
        fixed_replay(trace)


def test_pdscale_replay_prints_and_writes_the_rejected(tmp_path: Path) -> None:
    from serving.sim.replay_cli import replay_cmd

    path, out = tmp_path / "t.csv", tmp_path / "out.json"
    write_trace(code_like(), path, "azure")
    app = typer.Typer()
    app.command()(replay_cmd)
    result = CliRunner().invoke(app, ["--trace", str(path), "--policy", "static-peak", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "rejected" in result.output and json.loads(out.read_text())["rejected"] == 2


def test_over_context_counts_only_requests_that_were_served() -> None:
    # cpu-tiny: max_model_len 1,024, KV 1,048,576 tokens: 2,000 is past the window but fits, HUGE does not
    trace = Trace.from_arrays(np.arange(4.0), np.array([100, 2000, HUGE, 100]), np.full(4, 8), source="t.csv")
    fleet = single_pool(profile="cpu-tiny", mixed=1, max_per_role=1)
    with pytest.warns(OverContextWarning, match="1 of 4 requests"), pytest.warns(RejectedRequestWarning):
        report = replay(fleet, {"default": trace}, make_policy("fixed", PolicyOptions(mixed=1)))
    assert (report.over_context, report.rejected, report.completed) == (1, 1, 3)


def test_policies_size_for_the_served_load_only() -> None:
    """A rejected request is no load: static-peak (and the oracle, through the replay) size without it."""
    pool = single_pool().pools[0]
    with_huge, without = code_like(40, (5,)), code_like(40, ())
    served = without.take(np.flatnonzero(np.arange(40) != 5))
    assert static_peak_counts(pool, with_huge) == static_peak_counts(pool, served)


def test_a_trace_that_fits_is_unchanged_and_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RejectedRequestWarning)
        report = fixed_replay(code_like(20, ()))
    assert report.rejected == 0 and report.completed == 20  # type: ignore[attr-defined]


PROFILE = AnalyticProfile()  # 16,384 KV tokens per instance
LAT = AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01)


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.integers(0, 40_000), min_size=1, max_size=25),
    outputs=st.integers(0, 3000),
    mixed=st.booleans(),
)
def test_every_request_is_completed_rejected_or_unfinished(
    prompts: list[int], outputs: int, mixed: bool
) -> None:
    n = len(prompts)
    trace = Trace.from_arrays(np.arange(n) * 0.1, np.array(prompts), np.full(n, outputs))
    fleet = single_pool(mixed=1) if mixed else single_pool()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RejectedRequestWarning)
        sim = Simulator(fleet, {"default": trace}, models=analytic_models(PROFILE, LAT))
    sim.run_to_completion(limit_s=3600.0)
    rep = sim.report()
    needs = kv_needs(trace)
    roles = ("mixed",) if mixed else ("prefill", "decode")
    too_big = np.zeros(n, dtype=bool)
    for role in roles:
        too_big |= needs[role] > PROFILE.kv_capacity_tokens
    assert rep.rejected == int(too_big.sum())
    assert rep.requests == rep.completed + rep.rejected + rep.unfinished
    assert rep.unfinished == 0  # everything that fits is served


def test_pdscale_plan_sizes_the_served_requests_and_says_how_many_it_left_out(tmp_path: Path) -> None:
    from serving.sim.plan_cli import plan_cmd

    path, out = tmp_path / "t.csv", tmp_path / "plan.json"
    write_trace(code_like(), path, "azure")
    app = typer.Typer()
    app.command()(plan_cmd)

    def args(trace: Path) -> list[str]:
        return ["--trace", str(trace), "--slo-ttft-ms", "1000", "--slo-itl-ms", "50", "--json", str(out)]

    result = CliRunner().invoke(app, args(path))
    assert result.exit_code == 0, result.output  # the 2M-token prompts made the peak window's mean unservable
    doc = json.loads(out.read_text())
    assert doc["rejected"] == 2 and "2 of 40 requests" in result.output
    alone = tmp_path / "served.csv"
    write_trace(code_like(40, ()).take(np.flatnonzero(~np.isin(np.arange(40), [1, 3]))), alone, "azure")
    CliRunner().invoke(app, args(alone))
    served = json.loads(out.read_text())
    assert (doc["prefill"], doc["decode"]) == (served["prefill"], served["decode"])
