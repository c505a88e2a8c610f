"""``pdscale replay --fleet``: the fleet file, model selection, the static budget split and the JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, ...)
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.fleet_file import (
    FleetFileError,
    load_fleet_file,
    replay_fleet,
    select_model,
    static_split,
)
from serving.sim.replay_cli import replay_cmd
from serving.workload.trace import Trace
from serving.workload.writers import write_trace

FIGURES = ("gpu_seconds", "slo_attainment", "requests", "completed", "dropped")


def poisson(rate_rps: float, duration_s: float, prompt: int, output: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * duration_s)
    arrivals = np.sort(rng.uniform(0.0, duration_s, n))
    arrivals -= arrivals[0]
    return Trace.from_arrays(arrivals, np.full(n, prompt), np.full(n, output))


def fleet_file(tmp_path: Path, budget: int = 12, extra: str = "") -> Path:
    (tmp_path / "traces").mkdir(exist_ok=True)
    write_trace(poisson(4.0, 60.0, 1000, 50, seed=1), tmp_path / "traces" / "chat.csv", "azure")
    write_trace(poisson(1.0, 60.0, 6000, 100, seed=2), tmp_path / "traces" / "docs.jsonl", "mooncake")
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"""gpu_budget: {budget}
pools:
  - name: chat
    profile: llama3-8b/a100
    trace: traces/chat.csv
    slo_ttft_ms: 1000
    slo_itl_ms: 50
    prefill: {{min: 1, max: 4}}
    decode: {{min: 1, max: 4}}
  - name: docs
    profile: llama3-8b/a100
    trace: traces/docs.jsonl
    slo_ttft_ms: 5000
    slo_itl_ms: 100
{extra}"""
    )
    return path


def test_the_file_loads_with_traces_relative_to_it(tmp_path: Path) -> None:
    fleet = load_fleet_file(fleet_file(tmp_path))
    assert [p.name for p in fleet.spec.pools] == ["chat", "docs"]
    assert fleet.spec.gpu_budget == 12
    assert fleet.spec.pool("chat").prefill == RoleCounts(initial=1, min=1, max=4)
    assert fleet.traces["docs"].format == "mooncake" and len(fleet.traces["chat"]) > 150
    short = load_fleet_file(fleet_file(tmp_path), duration_s=10.0)
    assert float(short.traces["chat"].arrival_s.max()) < 10.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param("    slo_ttft_ms: -1\n", "pools.1.slo_ttft_ms", id="bad-slo"),
        pytest.param("    colour: blue\n", "pools.1.colour", id="unknown-field"),
        pytest.param("    prefill: {min: 3, max: 2}\n", "prefill.max=2 is below", id="bounds"),
    ],
)
def test_errors_name_the_file_and_the_field(tmp_path: Path, extra: str, message: str) -> None:
    path = fleet_file(tmp_path, extra=extra)
    with pytest.raises(FleetFileError) as err:
        load_fleet_file(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_a_missing_trace_names_the_pool_and_the_path(tmp_path: Path) -> None:
    path = fleet_file(tmp_path)
    (tmp_path / "traces" / "docs.jsonl").unlink()
    with pytest.raises(FleetFileError, match=r"pools\[1\] \(docs\)\.trace: no such file .*docs\.jsonl"):
        load_fleet_file(path)


def test_a_model_column_selects_rows_and_an_unknown_model_lists_the_names(tmp_path: Path) -> None:
    base = poisson(2.0, 30.0, 500, 40, seed=3)
    codes = (np.arange(len(base)) % 3 == 0).astype(np.int16)  # every third request is GPT-4
    multi = replace(base, model=codes, model_names=("ChatGPT", "GPT-4"), source="multi")
    gpt4 = select_model(multi, "GPT-4")
    assert len(gpt4) == int(codes.sum()) and np.all(gpt4.model == 1)
    assert np.array_equal(gpt4.arrival_s, base.arrival_s[codes == 1])  # the file's clock is kept
    with pytest.raises(FleetFileError, match=r"'Llama' is not in trace multi \(models: 'ChatGPT', 'GPT-4'\)"):
        select_model(multi, "Llama")
    with pytest.raises(FleetFileError, match="no model column"):
        select_model(base, "ChatGPT")

    write_trace(multi, tmp_path / "burst.csv", "burstgpt")
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "gpu_budget: 8\npools:\n"
        "  - {name: a, trace: burst.csv, model: ChatGPT}\n"
        "  - {name: b, trace: burst.csv, model: GPT-4}\n"
    )
    fleet = load_fleet_file(path)
    assert len(fleet.traces["a"]) + len(fleet.traces["b"]) == len(multi)


def test_static_split_follows_peak_demand_and_adds_up() -> None:
    small, big = PoolSpec(name="small"), PoolSpec(name="big")
    traces = {"small": poisson(1.0, 120.0, 500, 50, seed=4), "big": poisson(20.0, 120.0, 4000, 200, seed=5)}
    fleet = FleetSpec(pools=(small, big), gpu_budget=20)
    split = static_split(fleet, traces)
    assert sum(split.values()) == 20
    assert split["big"] > split["small"] >= 1


def check_figures(doc: dict[str, object], pools: tuple[str, ...]) -> None:
    for key in FIGURES:
        assert key in doc, key
    per_pool = doc["pools"]
    assert isinstance(per_pool, dict) and tuple(per_pool) == pools
    for figures in per_pool.values():
        for key in (*FIGURES, "unfinished", "ttft_ms", "itl_ms", "e2e_ms", "gpu_budget", "profile"):
            assert key in figures, key
        assert figures["e2e_ms"]["p50"] is not None and figures["e2e_ms"]["p50"] > 0  # known in both splits
    assert doc["requests"] == sum(p["requests"] for p in per_pool.values())
    assert doc["gpu_seconds"] == pytest.approx(sum(p["gpu_seconds"] for p in per_pool.values()))


@pytest.mark.parametrize("split", ["shared", "static"])
def test_a_two_pool_fleet_replays_under_the_controller(tmp_path: Path, split: str) -> None:
    fleet = load_fleet_file(fleet_file(tmp_path))
    result = replay_fleet(fleet.spec, fleet.traces, "reactive", split=split)
    doc = result.to_json()
    json.dumps(doc, allow_nan=False)
    check_figures(doc, ("chat", "docs"))
    assert doc["completed"] == doc["requests"] > 0
    assert doc["split"] == split and doc["policy"] == "reactive"
    budgets = [p["gpu_budget"] for p in doc["pools"].values()]
    assert budgets == [12, 12] if split == "shared" else sum(budgets) == 12


def test_per_pool_policy_overrides_reach_the_factory_which_validates_them(tmp_path: Path) -> None:
    path = fleet_file(tmp_path, extra="    policy: {target_utilization: 0.5}\n")
    fleet = load_fleet_file(path)
    assert fleet.policy_params == {"docs": {"target_utilization": 0.5}}
    for split in ("shared", "static"):
        replay_fleet(fleet.spec, fleet.traces, "reactive", split=split, pool_params=fleet.policy_params)
    bad = load_fleet_file(fleet_file(tmp_path, extra="    policy: {target_utilization: 7}\n"))
    for split in ("shared", "static"):
        with pytest.raises(ValueError, match=r"pools\[docs\]\.policy: target_utilization"):
            replay_fleet(bad.spec, bad.traces, "reactive", split=split, pool_params=bad.policy_params)


def test_cli_writes_the_fleet_json_and_rejects_single_pool_options(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(replay_cmd)
    out = tmp_path / "out.json"
    path = fleet_file(tmp_path)
    args = ["--fleet", str(path), "--policy", "static-peak", "--budget-split", "static", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    check_figures(json.loads(out.read_text()), ("chat", "docs"))
    clash = CliRunner().invoke(app, ["--fleet", str(path), "--trace", str(path)])
    assert clash.exit_code == 2 and "--trace" in clash.output
    bad_split = CliRunner().invoke(app, ["--fleet", str(path), "--budget-split", "halves"])
    assert bad_split.exit_code == 2 and "shared, static" in bad_split.output


def test_the_bundled_example_fleet_loads_with_its_traces() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "fleet-two-models.yaml"
    fleet = load_fleet_file(path)
    assert [p.profile for p in fleet.spec.pools] == ["llama3-8b/a100", "llama2-70b/a100"]
    assert all(len(t) > 1000 and float(t.arrival_s.max()) < 1000.0 for t in fleet.traces.values())
    split = static_split(fleet.spec, fleet.traces)
    assert sum(split.values()) == fleet.spec.gpu_budget and split["longdoc"] > split["chat"]


def test_the_shared_split_turns_the_fleet_reserve_on_and_static_keeps_independent_controllers(
    tmp_path: Path,
) -> None:
    from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy

    fleet = load_fleet_file(fleet_file(tmp_path))
    seen: list[dict[str, object]] = []

    def capture(options: PolicyOptions) -> ReplayPolicy:
        seen.append(dict(options.params))
        return make_policy("static-peak", options)

    replay_fleet(fleet.spec, fleet.traces, capture, split="shared")
    assert seen[-1]["fleet_reserve"] is True and "gpu_shares" in seen[-1]
    seen.clear()
    replay_fleet(fleet.spec, fleet.traces, capture, split="static")
    assert [("fleet_reserve" in p) for p in seen] == [False, False]
    seen.clear()
    replay_fleet(fleet.spec, fleet.traces, capture, split="static", reserve={"hold_s": 60.0})
    assert [p["fleet_reserve"] for p in seen] == [{"hold_s": 60.0}] * 2
    seen.clear()
    replay_fleet(fleet.spec, fleet.traces, capture, split="shared", reserve=False)
    assert "fleet_reserve" not in seen[-1]


def test_a_one_pool_fleet_replays_as_pdscale_replay_policy_does() -> None:
    """One pool: no fleet reserve (nothing to pool it with) and no shares, so `--fleet` with the same bounds and
    budget is the `--policy` replay. The reserve step trimmed the pool's plans to its floor + one instance: on
    the first 300 s of Azure code reactive fell from 96.7 % to 89.8 % SLO."""
    from serving.sim.fleet import single_pool
    from serving.sim.replay import PolicyOptions, make_policy, replay
    from serving.workload.readers import read_trace

    root = Path(__file__).resolve().parents[2]
    trace = read_trace(root / "datasets" / "azure2023" / "AzureLLMInferenceTrace_code.dev_before_1850.csv")
    trace = trace.window(0.0, 300.0)
    spec = single_pool(gpu_budget=64)
    alone = replay(spec, {"default": trace}, make_policy("reactive", PolicyOptions())).to_json()
    fleet = replay_fleet(spec, {"default": trace}, "reactive", split="shared").to_json()
    for key in ("requests", "completed", "slo_attainment", "gpu_seconds", "scale_events", "ttft_ms"):
        assert fleet[key] == alone[key], key


def test_a_one_pool_shared_fleet_hands_the_policy_no_reserve_and_no_shares(tmp_path: Path) -> None:
    from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy

    fleet = load_fleet_file(fleet_file(tmp_path))
    one = replace(fleet.spec, pools=fleet.spec.pools[:1])
    seen: list[dict[str, object]] = []

    def capture(options: PolicyOptions) -> ReplayPolicy:
        seen.append(dict(options.params))
        return make_policy("static-peak", options)

    replay_fleet(one, {"chat": fleet.traces["chat"]}, capture, split="shared")
    assert "fleet_reserve" not in seen[-1] and "gpu_shares" not in seen[-1]
    replay_fleet(one, {"chat": fleet.traces["chat"]}, capture, split="shared", reserve=True)
    assert seen[-1]["fleet_reserve"] is True  # asked for: still on
