"""training/tune.py: the search space table, chunking, the objective's figures, choosing and writing the best."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from controller.config import ControllerConfig, PolicyConfig, load_yaml_model
from forecaster.baselines import Holt
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace
from training import tune
from training.tune import Candidate, SearchParam

START = datetime(2023, 11, 16, 18, 0, 0)


def small_trace(seed: int = 1, duration_s: float = 150.0) -> Trace:
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=3.0,
        burst_multiplier=4.0,
        calm_mean_s=40.0,
        burst_mean_s=10.0,
        prompt=LengthDist(median_tokens=800.0, sigma=0.5, max_tokens=4000),
        output=LengthDist(median_tokens=80.0, sigma=0.5, max_tokens=500),
        start_time=START,
    )
    return generate(params, seed)


# -- the table -----------------------------------------------------------------------------------------
def test_space_fits_policy_config() -> None:
    assert tune.space_problems(tune.SEARCH_SPACE) == []
    names = {p.name for p in tune.SEARCH_SPACE}
    assert names <= set(PolicyConfig.model_fields)
    # the parameters are all searched
    assert {"buffer_multiplier", "standby_decode", "burst_threshold", "qps_change_alert_per_min", "ramp_up_s",
            "scale_down_delay_s", "headroom", "pd_ratio_min", "pd_ratio_max"} <= names  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (SearchParam("no_such_field", 0.0, 1.0), "has no field 'no_such_field'"),
        (SearchParam("headroom", 0.0, 6.0), "outside the field's bound Le(le=5.0)"),
        (SearchParam("burst_threshold", 0.0, 0.5), "outside the field's bound Gt(gt=0.0)"),
        (SearchParam("tolerance", 0.0, 1.0), "outside the field's bound Lt(lt=1.0)"),
        (SearchParam("ramp_up_s", 0.0, 100.0, log=True), "log range needs low > 0"),
        (SearchParam("headroom", 1.0, 1.0), "empty range"),
        (SearchParam("standby_decode", 0, 4), "the field is <class 'int'>, the table searches float"),
        (SearchParam("headroom", 0, 2, integer=True), "the table searches int"),
    ],
    ids=["unknown", "above-le", "at-gt", "at-lt", "log-zero", "empty", "int-as-float", "float-as-int"],
)
def test_space_problems_name_the_entry(entry: SearchParam, message: str) -> None:
    problems = tune.space_problems([entry])
    assert len(problems) == 1
    assert f"SEARCH_SPACE[{entry.name}]" in problems[0] and message in problems[0]


def test_space_duplicate() -> None:
    p = SearchParam("headroom", 0.0, 1.0)
    assert any("listed twice" in m for m in tune.space_problems([p, p]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=len(tune.SEARCH_SPACE), max_size=len(tune.SEARCH_SPACE)))
def test_every_point_of_the_space_is_a_valid_config(u: list[float]) -> None:
    params: dict[str, float | int] = {}
    for p, x in zip(tune.SEARCH_SPACE, u, strict=True):
        if p.log:
            v = float(np.exp(np.log(p.low) + x * (np.log(p.high) - np.log(p.low))))
        else:
            v = p.low + x * (p.high - p.low)
        params[p.name] = round(v) if p.integer else min(max(v, p.low), p.high)
    cfg = tune.config_from_params(params)  # raises on any invalid combination (e.g. P:D min > max)
    assert cfg.pd_ratio_min <= cfg.pd_ratio_max


def test_changed_fields() -> None:
    cfg = tune.config_from_params({"headroom": 0.3, "standby_decode": 4})
    assert tune.changed_fields(cfg) == {"standby_decode": 4}


# -- steps ---------------------------------------------------------------------------------------------
def test_split_steps_rebases_and_keeps_every_request() -> None:
    trace = small_trace()
    steps = tune.split_steps("t", trace, 3, tune.TuneSettings().fleet())
    assert [s.name for s in steps] == ["t[1/3]", "t[2/3]", "t[3/3]"]
    assert sum(len(s.trace) for s in steps) == len(trace)
    edges = np.linspace(0.0, trace.arrival_s[-1], 4)
    for i, s in enumerate(steps):
        assert s.trace.arrival_s[0] >= 0.0
        assert s.trace.arrival_s[-1] < edges[i + 1] - edges[i] + 1e-9
        assert s.trace.start_time == START + timedelta(seconds=float(edges[i]))
    # the last request is in the last chunk, re-based
    assert steps[-1].trace.arrival_s[-1] == pytest.approx(trace.arrival_s[-1] - edges[2])


def test_split_steps_skips_empty_windows() -> None:
    trace = Trace.from_arrays(np.array([0.0, 0.5, 99.0]), np.array([10, 10, 10]), np.array([5, 5, 5]))
    steps = tune.split_steps("t", trace, 4, tune.TuneSettings().fleet())
    assert [s.name for s in steps] == ["t[1/4]", "t[4/4]"]


def test_settings_problems() -> None:
    bad = tune.TuneSettings(mode="both", slo_target=1.5, chunks=0, forecaster="arima")  # type: ignore[arg-type]
    text = "\n".join(bad.problems())
    for word in ("objective 'both'", "slo_target", "chunks", "forecaster 'arima'"):
        assert word in text


# -- evaluation ----------------------------------------------------------------------------------------
def test_evaluate_totals_and_early_stop() -> None:
    trace = small_trace()
    steps = tune.split_steps("t", trace, 2, tune.TuneSettings().fleet())
    seen: list[tuple[int, int]] = []

    def after(i: int, ev: tune.Evaluation) -> None:
        seen.append((i, ev.requests))

    ev = tune.evaluate(PolicyConfig(), steps, Holt, after_step=after)
    assert ev.requests == len(trace)
    assert [i for i, _ in seen] == [0, 1] and seen[0][1] == len(steps[0].trace)
    assert 0.0 <= ev.slo_attainment <= 1.0 and ev.gpu_seconds > 0
    assert ev.violation_rate == pytest.approx(1 - ev.slo_attainment)

    class Stop(Exception):
        pass

    def stop(i: int, ev: tune.Evaluation) -> None:
        raise Stop

    with pytest.raises(Stop):
        tune.evaluate(PolicyConfig(), steps, Holt, after_step=stop)


@pytest.mark.parametrize(
    ("slo", "want"),
    [(0.995, 100.0), (0.99, 100.0), (0.89, 100.0 * (1 + 10 * 0.1)), (float("nan"), 100.0 * (1 + 10 * 0.99))],
    ids=["above", "at", "deficit", "unknown"],
)
def test_penalised_gpu_seconds(slo: float, want: float) -> None:
    assert tune.penalised_gpu_seconds(100.0, slo, 0.99, 10.0) == pytest.approx(want)


# -- choosing ------------------------------------------------------------------------------------------
CANDS = [
    Candidate(0, 0.999, 900.0),
    Candidate(1, 0.995, 700.0),
    Candidate(2, 0.95, 300.0),
    Candidate(3, 0.99, 800.0),  # dominated by 1
    Candidate(4, 0.80, 300.0),  # dominated by 2
]


def test_choose_least_gpu_meeting_target() -> None:
    choice = tune.choose(CANDS, 0.99)
    assert choice.candidate.number == 1 and choice.feasible
    assert "least GPU-seconds" in choice.rule


def test_choose_best_slo_when_none_meets_target() -> None:
    choice = tune.choose(CANDS, 0.9999)
    assert choice.candidate.number == 0 and not choice.feasible
    assert "best SLO" in choice.rule


def test_choose_least_penalised_when_none_meets_target() -> None:
    # GPU-s x (1 + 10 x deficit): #2 449.7 beats #1 734.3, #3 879.9, #4 899.7, #0 908.1
    choice = tune.choose(CANDS, 0.9999, penalty=10.0)
    assert choice.candidate.number == 2 and not choice.feasible
    assert "1 + 10 x SLO deficit" in choice.rule
    # a feasible trial still wins over any penalised one
    assert tune.choose(CANDS, 0.99, penalty=10.0).candidate.number == 1


def test_choose_nothing() -> None:
    with pytest.raises(tune.TuneError, match="no completed trial"):
        tune.choose([], 0.99)


def test_pareto_front_and_choice_on_it() -> None:
    front = tune.pareto_front(CANDS)
    assert [c.number for c in front] == [2, 1, 0]
    for target in (0.5, 0.96, 0.99, 0.999, 1.0):
        assert tune.choose(CANDS, target).candidate in front
        assert tune.choose(CANDS, target, penalty=10.0).candidate in front


# -- writing the best ----------------------------------------------------------------------------------
def test_best_yaml_is_accepted_by_config_check(tmp_path: Path) -> None:
    from training.pdscale_cli import app

    settings_ = tune.TuneSettings(traces=("a.csv",), slo_ttft_ms=2000.0, profile="llama3-8b/a100")
    params = {
        "headroom": 0.55,
        "standby_decode": 3,
        "pd_ratio_min": 0.0,
        "pd_ratio_max": 4.0,
        "ramp_up_s": 120.0,
    }
    choice = tune.choose([Candidate(7, 0.995, 1234.0, params)], 0.99)
    path = tmp_path / "best.yaml"
    path.write_text(tune.config_yaml(choice, settings_, "s", "sqlite:///x.db"))
    text = path.read_text()
    assert text.startswith("# pdscale tune: study 's' (sqlite:///x.db), trial 7\n")
    doc = yaml.safe_load(text)
    # only what differs from the defaults
    assert doc["pools"][0]["policy"] == {"headroom": 0.55, "standby_decode": 3, "pd_ratio_max": 4.0}
    result = CliRunner().invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    cfg = load_yaml_model(path, ControllerConfig)
    assert cfg.pools[0].slo_ttft_ms == 2000.0
    assert cfg.pools[0].policy == tune.config_from_params(params)


# -- the study -----------------------------------------------------------------------------------------
def test_constrained_study_reports_and_records(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings_ = tune.TuneSettings(mode="constrained", chunks=3, forecaster="holt", traces=("t",))
    steps = tune.load_steps(settings_, [("t", small_trace(duration_s=120.0))])
    study = tune.open_study(
        settings_, None, "c", seed=3, worker=0, n_trials=4, prune_startup=1, prune_warmup=0
    )
    objective = tune.make_objective(settings_, steps, Holt, worker=0)
    assert tune.run_worker(study, objective, 4) == 4
    trials = study.get_trials()
    assert len(trials) == 4
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete
    for t in complete:
        assert set(t.intermediate_values) == {0, 1}  # the last step is not reported, the trial ends there
        assert t.user_attrs["slo_deficit"] == pytest.approx(0.99 - t.user_attrs["slo_attainment"])
        assert t.value == pytest.approx(
            tune.penalised_gpu_seconds(
                t.user_attrs["gpu_seconds"], t.user_attrs["slo_attainment"], 0.99, 10.0
            )
        )
    # a second worker call on a full study runs nothing
    assert tune.run_worker(study, objective, 4) == 0


def test_joining_with_other_settings_is_an_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    a = tune.TuneSettings(mode="constrained", chunks=2, traces=("x",))
    tune.open_study(a, tune.storage_for(url), "s", seed=0, worker=0, n_trials=2)
    with pytest.raises(tune.TuneError, match="chunks: study has 2, this worker 3"):
        tune.open_study(
            tune.TuneSettings(mode="constrained", chunks=3, traces=("x",)),
            tune.storage_for(url), "s", seed=0, worker=1, n_trials=2,
        )  # fmt: skip
    with pytest.raises(tune.TuneError, match="objective"):
        tune.open_study(
            tune.TuneSettings(mode="pareto", chunks=2, traces=("x",)),
            tune.storage_for(url), "s", seed=0, worker=1, n_trials=2,
        )  # fmt: skip


def test_bad_storage_url_names_it() -> None:
    with pytest.raises(tune.TuneError, match="--storage nosuchdb://x"):
        tune.storage_for("nosuchdb://x")


def test_a_trial_worse_than_the_median_is_pruned() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings_ = tune.TuneSettings(mode="constrained", chunks=3, forecaster="holt", traces=("t",))
    steps = tune.load_steps(settings_, [("t", small_trace(duration_s=120.0))])
    study = tune.open_study(
        settings_, None, "p", seed=0, worker=0, n_trials=2, prune_startup=1, prune_warmup=0
    )
    base = {p.name: p.low for p in tune.SEARCH_SPACE}  # no standby, no headroom: cheap
    costly = {**base, "standby_prefill": 4, "standby_decode": 6, "headroom": 1.0, "buffer_multiplier": 4.0}
    study.enqueue_trial(base)
    study.enqueue_trial(costly)
    tune.run_worker(study, tune.make_objective(settings_, steps, Holt, worker=0), 2)
    first, second = study.get_trials()
    assert first.state == optuna.trial.TrialState.COMPLETE
    assert second.state == optuna.trial.TrialState.PRUNED, (
        first.intermediate_values,
        second.intermediate_values,
    )
    assert (
        second.user_attrs["steps_done"] == 1 and second.intermediate_values[0] > first.intermediate_values[0]
    )


def test_running_objective_projects_to_the_whole_evaluation() -> None:
    trace = Trace.from_arrays(np.arange(0.0, 300.0, 1.0), np.full(300, 100), np.full(300, 10))
    settings_ = tune.TuneSettings(slo_target=0.9, penalty=10.0)
    steps = tune.split_steps("t", trace, 3, settings_.fleet())  # three ~100-s windows
    half = tune.Evaluation((tune.StepResult("a", 100, 100.0, 50.0, 0.0),))
    assert tune.running_objective(half, steps, settings_) == pytest.approx(50.0 * 3, rel=0.02)
    missed = tune.Evaluation((tune.StepResult("a", 100, 80.0, 50.0, 0.0),))  # 80 % against 90 %
    assert tune.running_objective(missed, steps, settings_) == pytest.approx(50.0 * 3 * 2.0, rel=0.02)
    full = tune.Evaluation(tuple(tune.StepResult(s.name, 100, 100.0, 50.0, 0.0) for s in steps))
    assert tune.running_objective(full, steps, settings_) == pytest.approx(150.0)


@pytest.mark.parametrize(
    ("current", "startup", "warmup", "pruned"),
    [
        ({0: 5.0, 1: 15.0}, 3, 1, False),  # below the step-1 median (20)
        ({0: 5.0, 1: 25.0}, 3, 1, True),  # above it, though its step-0 value is the best of all
        ({0: 50.0}, 3, 1, False),  # step 0 is warm-up
        ({0: 50.0}, 3, 0, True),  # step-0 median 10
        ({0: 5.0, 1: 25.0}, 4, 1, False),  # only 3 completed trials reported step 1
        ({0: 5.0, 1: float("nan")}, 3, 1, True),  # unknown is not good
    ],
    ids=["below", "above-best-earlier", "warmup", "no-warmup", "startup", "nan"],
)
def test_same_step_median_pruner(current: dict[int, float], startup: int, warmup: int, pruned: bool) -> None:
    study = optuna.create_study()
    for values in ({0: 10.0, 1: 10.0}, {0: 10.0, 1: 20.0}, {0: 10.0, 1: 30.0}):
        study.add_trial(optuna.trial.create_trial(value=0.0, intermediate_values=values))
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, intermediate_values=current)
    assert tune.SameStepMedianPruner(startup, warmup).prune(study, trial) is pruned
