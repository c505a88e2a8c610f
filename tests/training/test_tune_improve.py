"""training/tune.py's "improve" objective (beat the defaults on every training trace), per-trace specs, the
train/test split table and its verdicts, and `pdscale tune --objective improve --holdout` end to end."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import typer
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from controller.config import PolicyConfig
from forecaster.baselines import Holt
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace
from serving.workload.writers import write_trace
from training import tune
from training.tune import Baseline, Candidate, Evaluation, StepResult


def small_trace(seed: int, duration_s: float = 90.0) -> Trace:
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=3.0,
        burst_multiplier=4.0,
        calm_mean_s=40.0,
        burst_mean_s=10.0,
        prompt=LengthDist(median_tokens=800.0, sigma=0.5, max_tokens=4000),
        output=LengthDist(median_tokens=80.0, sigma=0.5, max_tokens=500),
        start_time=datetime(2023, 11, 16, 18, 0, 0),
    )
    return generate(params, seed)


def ev(*steps: tuple[str, str, float, float]) -> Evaluation:
    """An evaluation from (trace, step, SLO attainment, GPU-s) rows of 1000 requests each."""
    return Evaluation(
        tuple(StepResult(name, 1000, slo * 1000, gpu, 0.0, group) for group, name, slo, gpu in steps)
    )


# -- trace specs ---------------------------------------------------------------------------------------
def test_parse_plain_and_with_options() -> None:
    plain = tune.parse_trace_spec("data/code.csv")
    assert plain == tune.TraceSpec("data/code.csv", "data/code.csv")
    spec = tune.parse_trace_spec(
        "data/mooncake.jsonl:ttft_ms=10000, itl_ms=60,duration_s=1800,slo_target=0.95"
    )
    assert (spec.path, spec.ttft_ms, spec.itl_ms, spec.duration_s, spec.slo_target) == (
        "data/mooncake.jsonl", 10000.0, 60.0, 1800.0, 0.95,
    )  # fmt: skip
    assert spec.label.startswith("mooncake.jsonl:ttft_ms=10000")
    # a ':' with no '=' after it belongs to the file name
    assert tune.parse_trace_spec("c:/traces/x.csv").path == "c:/traces/x.csv"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x.csv:ttft=5", "--holdout 'x.csv:ttft=5': unknown key 'ttft' (expected one of ttft_ms, itl_ms"),
        ("x.csv:ttft_ms=fast", "ttft_ms='fast' is not a number"),
        ("x.csv:ttft_ms=0", "ttft_ms must be a finite number > 0, got 0"),
        ("x.csv:itl_ms=-3", "itl_ms must be a finite number > 0"),
        ("x.csv:duration_s=inf", "duration_s must be a finite number > 0"),
        ("x.csv:slo_target=99", "slo_target must be in [0, 1], got 99"),
        ("x.csv:ttft_ms=1,ttft_ms=2", "ttft_ms given twice"),
        ("x.csv:ttft_ms=1,,itl_ms=2", "'' is not key=value"),
        (":ttft_ms=1", "no file name before the ':'"),
    ],
    ids=["unknown", "nan-text", "zero", "negative", "inf", "target", "twice", "empty-item", "no-file"],
)
def test_parse_errors_name_option_argument_and_key(text: str, message: str) -> None:
    with pytest.raises(tune.TuneError) as err:
        tune.parse_trace_spec(text, "--holdout")
    assert str(err.value).startswith(f"--holdout {text!r}: ")
    assert message in str(err.value)


def test_load_steps_uses_each_trace_options() -> None:
    s = tune.TuneSettings(chunks=2, duration_s=60.0, slo_ttft_ms=1000.0, slo_itl_ms=50.0)
    a, b = small_trace(1), small_trace(2)
    steps = tune.load_steps(s, [("a.csv", a), ("b.csv:ttft_ms=3000,duration_s=80,slo_target=0.9", b)])
    bname = "b.csv:ttft_ms=3000,duration_s=80,slo_target=0.9"
    by = {st_.source: st_ for st_ in steps}
    assert [st_.source for st_ in steps] == ["a.csv", "a.csv", bname, bname]
    pool_a, pool_b = by["a.csv"].fleet.pools[0], by[bname].fleet.pools[0]
    assert (pool_a.slo_ttft_ms, pool_b.slo_ttft_ms, pool_b.slo_itl_ms) == (1000.0, 3000.0, 50.0)
    assert sum(len(x.trace) for x in steps if x.source == "a.csv") == len(a.window(0.0, 60.0))
    assert sum(len(x.trace) for x in steps if x.source != "a.csv") == len(b.window(0.0, 80.0))
    assert by["a.csv"].slo_target is None and steps[-1].slo_target == 0.9


# -- the improve objective -----------------------------------------------------------------------------
BASE = ev(
    ("big", "big[1/2]", 0.98, 9000.0), ("big", "big[2/2]", 0.98, 9000.0), ("small", "small", 0.90, 100.0)
)


def baseline(reachable_small: bool = False) -> Baseline:
    return Baseline(BASE, {"big": 0.95, "small": 0.99}, {"big": True, "small": reachable_small})


def test_defaults_score_one_and_references() -> None:
    b = baseline()
    assert b.reference("big", 0.98) == 0.98  # the defaults already beat the target: keep their SLO
    assert b.reference("small", 0.90) == 0.90  # target unreachable: the defaults' own SLO
    assert baseline(reachable_small=True).reference("small", 0.90) == 0.99  # reachable: the target
    assert tune.improve_objective(BASE, b, 100.0) == pytest.approx(1.0)
    assert b.default_score(100.0) == pytest.approx(1.0)
    # a reachable target the defaults miss puts the defaults above 1: 1 + 100 x 0.09 on that trace
    assert baseline(True).default_score(100.0) == pytest.approx((1.0 + 10.0) / 2)


def test_keeping_slo_and_cutting_gpu_scores_better_losing_slo_scores_worse() -> None:
    b = baseline()
    cheaper = ev(
        ("big", "big[1/2]", 0.98, 8000.0), ("big", "big[2/2]", 0.985, 8000.0), ("small", "small", 0.91, 90.0)
    )
    assert tune.improve_objective(cheaper, b, 100.0) < 1.0
    # 20 % fewer GPU-s bought with 2 points of SLO on one trace: worse than the defaults
    traded = ev(
        ("big", "big[1/2]", 0.96, 7200.0), ("big", "big[2/2]", 0.96, 7200.0), ("small", "small", 0.90, 80.0)
    )
    scores = tune.improve_scores(traded, b, 100.0)
    assert scores["big"].deficit == pytest.approx(0.02) and scores["big"].score == pytest.approx(0.8 * 3.0)
    assert tune.improve_objective(traded, b, 100.0) > 1.0
    # more SLO at more GPU-s is not an improvement either (the reference is the defaults' SLO)
    costly = ev(
        ("big", "big[1/2]", 0.999, 12000.0),
        ("big", "big[2/2]", 0.999, 12000.0),
        ("small", "small", 0.95, 150.0),
    )
    assert tune.improve_objective(costly, b, 100.0) > 1.0


def test_each_trace_weighs_the_same_whatever_its_gpu_seconds() -> None:
    # -10 % on the small trace outweighs +5 % on one 100x bigger: the mean of ratios, not of GPU-s
    trial = ev(
        ("big", "big[1/2]", 0.98, 9450.0), ("big", "big[2/2]", 0.98, 9450.0), ("small", "small", 0.90, 90.0)
    )
    assert tune.improve_objective(trial, baseline(), 100.0) == pytest.approx((1.05 + 0.9) / 2)
    assert trial.gpu_seconds > BASE.gpu_seconds


def test_partial_evaluation_is_scored_against_the_same_steps() -> None:
    first = ev(("big", "big[1/2]", 0.97, 4500.0))  # half the defaults' GPU-s on that step, 1 point lost
    s = tune.improve_scores(first, baseline(), 100.0)
    assert list(s) == ["big"]
    assert s["big"].gpu_ratio == pytest.approx(0.5) and s["big"].score == pytest.approx(0.5 * 2.0)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.5, 2.0), st.floats(0.0, 0.05), st.floats(0.0, 0.05))
def test_score_rises_with_gpu_and_with_lost_slo(ratio: float, loss_a: float, loss_b: float) -> None:
    def trial(loss: float, r: float) -> Evaluation:
        return ev(("big", "big[1/2]", 0.98 - loss, 9000 * r), ("big", "big[2/2]", 0.98 - loss, 9000 * r),
                  ("small", "small", 0.90, 100.0))  # fmt: skip

    b = baseline()
    lo, hi = sorted((loss_a, loss_b))
    assert tune.improve_objective(trial(lo, ratio), b, 100.0) <= tune.improve_objective(
        trial(hi, ratio), b, 100.0
    )
    assert tune.improve_objective(trial(lo, ratio), b, 100.0) <= tune.improve_objective(
        trial(lo, ratio * 1.1), b, 100.0
    )


def test_make_baseline_probes_only_missed_targets() -> None:
    s = tune.TuneSettings(chunks=1)
    steps = tune.load_steps(s, [("a", small_trace(1, 60.0)), ("b:slo_target=1", small_trace(2, 60.0))])
    b = tune.make_baseline(steps, Holt, slo_target=0.01)
    assert b.targets == {"a": 0.01, "b:slo_target=1": 1.0}
    assert b.reachable["a"] and "a" not in b.probe_slo  # the defaults reach 1 %: no probe
    d = b.default.by_trace()["b:slo_target=1"].slo_attainment
    if d < 1.0:  # the defaults miss 100 %: the probe decided
        assert b.reachable["b:slo_target=1"] == (b.probe_slo["b:slo_target=1"] >= 1.0)
    assert b.default_score(100.0) >= 1.0
    assert json.dumps(b.to_json())  # JSON-able


def test_improve_needs_a_baseline() -> None:
    with pytest.raises(tune.TuneError, match="baseline"):
        tune.make_objective(tune.TuneSettings(mode="improve"), [], Holt, 0)
    with pytest.raises(tune.TuneError, match="baseline"):
        tune.choose_for([Candidate(0, 0.9, 1.0, score=0.5)], tune.TuneSettings(mode="improve"))


def test_choose_improve_keeps_the_defaults_unless_beaten() -> None:
    defaults = Candidate(tune.DEFAULTS_TRIAL, 0.9, 100.0, {}, 1.0)
    cands = [Candidate(0, 0.9, 95.0, {"headroom": 0.2}, 0.95), Candidate(1, 0.95, 150.0, {}, 1.4)]
    choice = tune.choose_improve(cands, defaults)
    assert (
        choice.candidate.number == 0
        and choice.feasible
        and "0.9500 against the defaults' 1.0000" in choice.rule
    )
    kept = tune.choose_improve(cands[1:], defaults)
    assert kept.candidate is defaults and not kept.feasible and "defaults are kept" in kept.rule
    with pytest.raises(tune.TuneError, match="nothing to choose"):
        tune.choose_improve([Candidate(2, 0.9, 1.0)], defaults)


def test_default_params_are_the_defaults() -> None:
    d = tune.default_params()
    assert set(d) == {p.name for p in tune.SEARCH_SPACE}
    assert tune.config_from_params(d) == PolicyConfig()


def test_local_space_is_a_neighbourhood_of_the_defaults() -> None:
    base = PolicyConfig().model_dump()
    full = {p.name: p for p in tune.SEARCH_SPACE}
    local = tune.local_space(tune.SEARCH_SPACE, 2.0)
    assert tune.space_problems(local) == []
    for p in local:
        d = base[p.name]
        assert full[p.name].low <= p.low <= d <= p.high <= full[p.name].high, p
        if p.integer:
            assert p.high - p.low <= 2
        elif d > 0:
            assert p.low >= d / 2 - 1e-12 and p.high <= d * 2 + 1e-12
    names = {p.name for p in local}
    if not full["pd_ratio_max"].low <= base["pd_ratio_max"] <= full["pd_ratio_max"].high:
        assert "pd_ratio_max" not in names  # 0 = no bound is not in [1, 8]: kept at the default
    assert tune.TuneSettings(around_defaults=2.0).space == local
    assert tune.TuneSettings().space == tune.SEARCH_SPACE
    assert "around_defaults" in "".join(tune.TuneSettings(around_defaults=1.0).problems())


def test_improve_study_seeds_the_defaults_and_reports_scores() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = tune.TuneSettings(mode="improve", chunks=2, forecaster="holt", penalty=100.0, traces=("a", "b"))
    steps = tune.load_steps(s, [("a", small_trace(1, 60.0)), ("b", small_trace(2, 60.0))])
    b = tune.make_baseline(steps, Holt, s.slo_target)
    study = tune.open_study(s, None, "i", seed=1, worker=0, n_trials=3, prune_startup=1, prune_warmup=0)
    tune.run_worker(study, tune.make_objective(s, steps, Holt, 0, b), 3)
    first = study.get_trials()[0]
    assert first.user_attrs["seeded"] == "defaults" and first.params == tune.default_params()
    # the seeded trial is the defaults themselves: it scores exactly the defaults' score
    assert first.value == pytest.approx(b.default_score(s.penalty))
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert t.value == pytest.approx(t.user_attrs["score"])
        assert set(t.user_attrs["per_trace"]) == {"a", "b"}
        assert len(t.intermediate_values) == 3  # steps 0..2 reported, the last one is the value
    choice = tune.choose_for(tune.candidates(study), s, b)
    assert choice.feasible == (choice.candidate.number != tune.DEFAULTS_TRIAL)


# -- verdicts and the split table ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("slo", "gpu", "want"),
    [
        (0.95, 80.0, "dominates"),  # same SLO, -20 % GPU-s
        (0.97, 100.0, "dominates"),  # +2 points, same GPU-s
        (0.9495, 99.5, "same"),  # within 0.1 point and 1 %
        (0.97, 130.0, "trade-off"),
        (0.93, 80.0, "trade-off"),
        (0.93, 100.0, "worse"),
        (0.95, 120.0, "worse"),
        (0.93, 120.0, "worse"),
        (math.nan, 50.0, "worse"),
    ],
)
def test_verdict(slo: float, gpu: float, want: str) -> None:
    default = ev(("t", "t", 0.95, 100.0))
    assert tune.verdict(default, ev(("t", "t", slo, gpu))) == want
    assert want in tune.VERDICTS


def test_split_table_rows_per_trace() -> None:
    s = tune.TuneSettings(chunks=2)
    train = tune.load_steps(s, [("a", small_trace(1, 60.0)), ("b", small_trace(2, 60.0))])
    held = tune.load_steps(s, [("c:ttft_ms=500", small_trace(3, 60.0))], chunks=1, option="--holdout")
    tuned = tune.config_from_params({"headroom": 0.8, "standby_decode": 4})
    default_train = tune.evaluate(PolicyConfig(), train, Holt)
    rows = tune.split_table(train, held, tuned, Holt, train_default=default_train)
    assert [(r.name, r.role) for r in rows] == [("a", "train"), ("b", "train"), ("c:ttft_ms=500", "held-out")]
    assert rows[0].default.requests == sum(len(x.trace) for x in train if x.source == "a")
    assert rows[0].default == default_train.by_trace()["a"]  # the baseline is reused, not replayed again
    doc = rows[2].to_json()
    assert doc["verdict"] == rows[2].verdict in tune.VERDICTS
    assert doc["gpu_ratio"] == pytest.approx(rows[2].tuned.gpu_seconds / rows[2].default.gpu_seconds)
    # the same config on both sides: the same figures, verdict "same"
    same = tune.split_table(train[:1], held, PolicyConfig(), Holt)
    assert {r.verdict for r in same} == {"same"} and all(r.gpu_ratio == 1.0 for r in same)


# -- the CLI -------------------------------------------------------------------------------------------
def _cli() -> typer.Typer:

    from training.tune_cli import tune_cmd

    cli = typer.Typer()
    cli.command()(tune_cmd)
    return cli


def test_cli_improve_with_holdouts(tmp_path: Path) -> None:
    a = write_trace(small_trace(1, 60.0), tmp_path / "a.csv", "azure")
    b = write_trace(small_trace(2, 90.0), tmp_path / "b.csv", "azure")
    c = write_trace(small_trace(3, 60.0), tmp_path / "c.csv", "azure")
    out, js = tmp_path / "best.yaml", tmp_path / "r.json"
    args = [
        "--trace", str(a), "--trace", f"{b}:ttft_ms=2000,duration_s=60", "--holdout", f"{c}:ttft_ms=800",
        "--trials", "3", "--forecaster", "holt", "--chunks", "1", "--study", "imp", "--out", str(out),
        "--json", str(js),
    ]  # fmt: skip
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    doc = json.loads(js.read_text())
    # improve's defaults: penalty 100, no SLO target (each trace keeps its defaults' SLO)
    assert doc["settings"]["mode"] == "improve" and doc["settings"]["penalty"] == 100.0
    assert doc["settings"]["slo_target"] == 0.0
    assert all(b["reference_slo"] == b["default"]["slo_attainment"] for b in doc["baseline"].values())
    assert set(doc["baseline"]) == {str(a), f"{b}:ttft_ms=2000,duration_s=60"}
    rows = doc["comparisons"]
    assert [(r["trace"], r["role"]) for r in rows] == [
        (str(a), "train"), (f"{b}:ttft_ms=2000,duration_s=60", "train"), (f"{c}:ttft_ms=800", "held-out"),
    ]  # fmt: skip
    assert doc["held_out_verdicts"] == {f"{c}:ttft_ms=800": rows[2]["verdict"]}
    best = doc["best"]
    if best["trial"] == tune.DEFAULTS_TRIAL:  # nothing beat the defaults: they are written, and compare same
        assert doc["defaults_better"] and yaml.safe_load(out.read_text())["pools"][0]["policy"] == {}
        assert {r["verdict"] for r in rows} == {"same"}
    else:
        assert best["score"] < doc["defaults_score"] and not doc["defaults_better"]


def test_cli_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    a = write_trace(small_trace(1, 30.0), tmp_path / "a.csv", "azure")
    result = CliRunner().invoke(
        _cli(), ["--trace", str(a), "--holdout", f"{a}:ttft=3", "--out", str(tmp_path / "b.yaml")]
    )
    assert result.exit_code == 2
    assert "--holdout" in result.output and "unknown key 'ttft'" in result.output
