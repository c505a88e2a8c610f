"""pdscale plan: sizing from the capacity model, trace windows, the CLI, and the replay check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from serving.sim.capacity import instances_needed
from serving.sim.hardware import get_profile
from serving.sim.latency import latency_model_for
from serving.sim.plan import (
    LoadPoint,
    PlanError,
    parse_prices,
    plan_capacity,
    poisson_trace,
    trace_sizings,
    verify_plan,
    window_loads,
)
from serving.sim.plan_cli import plan_cmd
from serving.workload.trace import Trace
from serving.workload.writers import write_trace

PROFILE = "llama3-8b/a100"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_cmd)

    @app.command("other")
    def other() -> None:  # a second command keeps "plan" a subcommand, as in pdscale
        """Unused."""

    return app


def test_plan_is_the_capacity_model_with_headroom() -> None:
    profile = get_profile(PROFILE)
    direct = instances_needed(profile, latency_model_for(profile), 26.0, 1024, 256, 500, 30)
    plan = plan_capacity([PROFILE], LoadPoint(20.0, 1024, 256), 500, 30, headroom=0.3)
    assert (plan.first.prefill, plan.first.decode) == (direct.prefill, direct.decode)
    assert plan.first.gpus == (direct.prefill + direct.decode) * profile.gpus


def test_tp_profile_counts_gpus_per_instance() -> None:
    plan = plan_capacity(["llama2-70b/a100"], LoadPoint(5.0, 1024, 256), 2000, 60, headroom=0.0)
    p = plan.first
    assert p.profile.gpus > 1
    assert p.gpus == (p.prefill + p.decode) * p.profile.gpus


@settings(max_examples=25, deadline=None)
@given(
    rate=st.floats(0.5, 60.0),
    isl=st.integers(64, 4096),
    osl=st.integers(16, 1024),
)
def test_each_pool_covers_its_share_and_single_ceil_starves_exactly_when_smaller(
    rate: float, isl: int, osl: int
) -> None:
    p = plan_capacity([PROFILE], LoadPoint(rate, isl, osl), 2000, 50, headroom=0.0).first
    assert p.prefill >= p.prefill_share > p.prefill - 1
    assert p.decode >= p.decode_share > p.decode - 1
    # no split of the single-ceil total covers both shares exactly when it is below the separate total
    splits_ok = any(
        a >= p.prefill_share and p.single_ceil_total - a >= p.decode_share
        for a in range(p.single_ceil_total + 1)
    )
    assert splits_ok == (not p.starved_by_single_ceil)


def test_prices_cost_and_errors() -> None:
    assert parse_prices(["llama2-7b/h100=4.5"]) == {"llama2-7b/h100": 4.5}
    for bad in ("llama2-7b/h100", "x=abc", "x=-1", "=3"):
        with pytest.raises(PlanError, match="--price"):
            parse_prices([bad])
    plan = plan_capacity(
        [PROFILE, "llama2-7b/h100"], LoadPoint(20, 1024, 256), 500, 30, prices={"llama2-7b/h100": 4.0}
    )
    a100, h100 = plan.profiles
    assert math.isnan(a100.cost_usd_per_hour)
    assert h100.cost_usd_per_hour == pytest.approx(4.0 * h100.gpus)
    with pytest.raises(PlanError, match="llama2-70b/h100"):
        plan_capacity([PROFILE], LoadPoint(20, 1024, 256), 500, 30, prices={"llama2-70b/h100": 1.0})


def test_unreachable_slo_names_the_profile() -> None:
    with pytest.raises(PlanError, match=r"given sizing: llama3-8b/a100: TTFT SLO 5"):
        plan_capacity([PROFILE], LoadPoint(20, 4096, 256), 5, 30)


def _naive_windows(trace: Trace, w: int) -> list[tuple[int, float, float]]:
    sec = np.floor(trace.arrival_s - trace.arrival_s[0]).astype(int)
    n_sec = int(sec[-1]) + 1
    width = min(w, n_sec)
    out = []
    for start in range(max(n_sec - w + 1, 1)):
        m = (sec >= start) & (sec < start + width)
        out.append(
            (
                int(m.sum()),
                float(np.maximum(trace.prompt_tokens[m], 1).sum()),
                float(np.maximum(trace.output_tokens[m], 1).sum()),
            )
        )
    return out


@settings(max_examples=30, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 7.0), min_size=1, max_size=60),
    w=st.integers(1, 20),
    seed=st.integers(0, 100),
)
def test_window_loads_match_a_naive_count(gaps: list[float], w: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(gaps) - gaps[0]
    n = len(arrival)
    trace = Trace.from_arrays(arrival, rng.integers(0, 50, n), rng.integers(0, 50, n))
    wl = window_loads(trace, float(w))
    naive = _naive_windows(trace, w)
    assert [
        (int(c), float(p), float(o)) for c, p, o in zip(wl.count, wl.prompt_sum, wl.output_sum, strict=True)
    ] == naive


def test_trace_sizings_order_and_prefill_decode_windows_apart() -> None:
    # 300 s at 5 req/s of long prompts, then 120 s at 10 req/s of long outputs: the pools peak apart
    rng = np.random.default_rng(1)
    a = np.sort(rng.uniform(0, 300, 1500))
    b = np.sort(rng.uniform(300, 420, 1200))
    trace = Trace.from_arrays(
        np.concatenate([a, b]),
        np.concatenate([np.full(1500, 3000), np.full(1200, 100)]),
        np.concatenate([np.full(1500, 50), np.full(1200, 800)]),
    )
    sizings = {s.name: s for s in trace_sizings(trace, 60.0)}
    assert list(sizings) == ["peak", "p99", "p90", "mean"]
    peak = sizings["peak"]
    assert peak.prefill_load.mean_prompt_tokens == pytest.approx(3000, rel=0.05)
    assert peak.decode_load.mean_output_tokens == pytest.approx(800, rel=0.05)
    tps = [sizings[k].prefill_load.prompt_tps for k in ("peak", "p99", "p90")]
    assert tps == sorted(tps, reverse=True)
    assert sizings["mean"].prefill_load.rate_rps == pytest.approx(2700 / 420, rel=0.01)


def test_empty_trace_is_an_error() -> None:
    empty = Trace.from_arrays(np.zeros(0), np.zeros(0), np.zeros(0))
    with pytest.raises(PlanError, match="no requests"):
        trace_sizings(empty)


def test_cli_json_has_top_level_and_per_profile_counts(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--rate-rps", "20", "--isl", "1024", "--osl", "256", "--slo-ttft-ms", "500"]
    args += ["--slo-itl-ms", "30", "--profile", PROFILE, "--profile", "llama2-7b/h100"]
    args += ["--price", "llama2-7b/h100=4", "--explain", "--verify", "--json", str(out)]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    expected = plan_capacity([PROFILE, "llama2-7b/h100"], LoadPoint(20, 1024, 256), 500, 30, headroom=0.3)
    assert (doc["prefill"], doc["decode"], doc["gpus"]) == (
        expected.first.prefill,
        expected.first.decode,
        expected.first.gpus,
    )
    h100 = doc["profiles"]["llama2-7b/h100"]
    assert h100["cost_usd_per_hour"] == pytest.approx(4.0 * h100["gpus"])
    assert doc["profiles"][PROFILE]["cost_usd_per_hour"] is None
    assert "bounded by" in result.output
    verification = doc["verification"]
    assert verification["planned"]["prefill"] == doc["prefill"]
    assert verification["planned"]["meets"]  # with 30 % headroom


def test_cli_trace_mode(tmp_path: Path) -> None:
    trace_file = write_trace(poisson_trace(8.0, 700, 120, 200.0, seed=3), tmp_path / "t.jsonl", "mooncake")
    out = tmp_path / "plan.json"
    args = ["plan", "--trace", str(trace_file), "--slo-ttft-ms", "800", "--slo-itl-ms", "40"]
    result = CliRunner().invoke(_app(), [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert set(doc["sizings"]) == {"peak", "p99", "p90", "mean"}
    assert doc["prefill"] == doc["sizings"]["peak"]["prefill"]
    assert doc["sizings"]["peak"]["prefill"] >= doc["sizings"]["mean"]["prefill"]
    bad = CliRunner().invoke(_app(), [*args, "--rate-rps", "3"], env={"COLUMNS": "300"})
    assert bad.exit_code != 0 and "drop --rate-rps" in bad.output


def test_cli_unknown_profile_lists_known() -> None:
    args = ["plan", "--rate-rps", "1", "--isl", "10", "--osl", "10", "--slo-ttft-ms", "500"]
    result = CliRunner().invoke(
        _app(), [*args, "--slo-itl-ms", "30", "--profile", "gpt/tpu"], env={"COLUMNS": "300"}
    )
    assert result.exit_code != 0
    assert "llama3-8b/a100" in result.output


# -- the plan against the simulator (issue 9) ------------------------------------------------------------
def test_replay_at_the_plan_meets_and_one_fewer_in_each_pool_does_not() -> None:
    """20 req/s Poisson, fixed 1024/256 tokens, 120 s, llama3-8b/a100, fixed policy, no headroom.

    meets = simulator SLO attainment >= 0.99 (per request: TTFT <= 500 ms and mean ITL <= 30 ms).
    Findings (docs/BENCHMARKS.md, bench/bench_plan.py): prefill-1 fails narrowly (attainment ~0.99): its
    P90 TTFT is well within the SLO, i.e. the M/D/1 prefill model is conservative for P90 TTFT.
    """
    trace = poisson_trace(20.0, 1024, 256, 120.0, seed=0)
    plan = plan_capacity([PROFILE], LoadPoint(20.0, 1024, 256), 500, 30, headroom=0.0).first
    assert (plan.prefill, plan.decode) == (3, 2)
    v = verify_plan(plan, trace, 500, 30)
    assert v.planned.meets
    assert v.one_fewer_prefill is not None and not v.one_fewer_prefill.meets
    assert v.one_fewer_decode is not None and not v.one_fewer_decode.meets
    assert v.tight


# (rate_rps, isl, osl, slo_ttft_ms, slo_itl_ms); the same cases as bench/bench_plan.py
_CASES = [
    (20.0, 512, 512, 500.0, 40.0),
    (20.0, 2048, 128, 1000.0, 50.0),
    (30.0, 1500, 300, 800.0, 35.0),
    (12.0, 4096, 256, 1500.0, 40.0),
]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: f"{c[0]:g}rps-{c[1]}-{c[2]}")
def test_plan_meets_and_decode_minus_one_fails(case: tuple[float, int, int, float, float]) -> None:
    rate, isl, osl, ttft, itl = case
    plan = plan_capacity([PROFILE], LoadPoint(rate, isl, osl), ttft, itl, headroom=0.0).first
    v = verify_plan(plan, poisson_trace(rate, isl, osl, 120.0, seed=0), ttft, itl)
    assert v.planned.meets
    assert v.planned.ttft_p90_ms <= ttft and v.planned.itl_mean_ms <= itl
    if v.one_fewer_decode is not None:
        assert not v.one_fewer_decode.meets


@pytest.mark.xfail(
    strict=True,
    reason="the M/D/1 prefill model is conservative for pools of several instances: each instance sees "
    "smoother-than-Poisson arrivals (round-robin / least-loaded split), so one fewer still meets the SLO "
    "(see docs/BENCHMARKS.md, pdscale plan section); an XPASS means the model got tighter",
)
@pytest.mark.parametrize("case", _CASES[2:], ids=lambda c: f"{c[0]:g}rps-{c[1]}-{c[2]}")
def test_prefill_minus_one_fails_for_larger_pools(case: tuple[float, int, int, float, float]) -> None:
    rate, isl, osl, ttft, itl = case
    plan = plan_capacity([PROFILE], LoadPoint(rate, isl, osl), ttft, itl, headroom=0.0).first
    v = verify_plan(plan, poisson_trace(rate, isl, osl, 120.0, seed=0), ttft, itl)
    assert v.one_fewer_prefill is not None and not v.one_fewer_prefill.meets
