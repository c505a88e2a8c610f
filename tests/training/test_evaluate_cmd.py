"""training/evaluate.py: the scoring protocol, --score-from, the CLI's files and errors, the learned model."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from forecaster.features import future_sums, series_from_trace
from serving.workload.trace import Trace
from training.evaluate import EvaluationError, evaluate, evaluate_cmd, parse_score_from

START = datetime(2023, 11, 16, 18, 0, 0)
BASELINES = ["last_value", "ewma", "holt", "seasonal_naive", "arima"]


def _trace(duration_s: int = 900, seed: int = 5) -> Trace:
    """Poisson arrivals at 2/s with 20 s bursts at 15/s every 150 s."""
    rng = np.random.default_rng(seed)
    t = np.arange(duration_s)
    rate = np.where(t % 150 >= 130, 15.0, 2.0)
    n = rng.poisson(rate)
    arr = np.sort(np.repeat(t, n) + rng.random(n.sum()))
    arr -= arr[0]
    tr = Trace.from_arrays(
        arr, rng.integers(10, 4000, len(arr)), rng.integers(1, 300, len(arr)), source="syn"
    )
    return Trace(**{**tr.__dict__, "start_time": START, "format": "azure"})


def _write_azure(tr: Trace, path: Path) -> None:
    assert tr.start_time is not None
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for a, p, o in zip(
        tr.arrival_s.tolist(), tr.prompt_tokens.tolist(), tr.output_tokens.tolist(), strict=True
    ):
        ts = tr.start_time + timedelta(seconds=a)
        lines.append(f"{ts:%Y-%m-%d %H:%M:%S}.{ts.microsecond:06d}0,{p},{o}")
    path.write_text("\r\n".join(lines) + "\r\n")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return _trace()


def test_score_from_forms(trace: Trace) -> None:
    assert parse_score_from("+300", trace) == 300.0
    assert parse_score_from("50%", trace) == pytest.approx(trace.duration_s / 2)
    assert parse_score_from("2023-11-16T18:05:00", trace) == pytest.approx(300.0)
    assert parse_score_from("2023-11-16T18:05:00+00:00", trace) == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("+5000", "outside", id="after-end"),
        pytest.param("2023-11-16T17:59:00", "outside", id="before-start"),
        pytest.param("2023-11-16T19:00:00", "outside", id="iso-after-end"),
        pytest.param("100%", "percentage", id="percent-100"),
        pytest.param("yesterday", "neither", id="garbage"),
    ],
)
def test_score_from_errors_are_clear(trace: Trace, text: str, match: str) -> None:
    with pytest.raises(EvaluationError, match=match):
        parse_score_from(text, trace)


def test_iso_score_from_needs_a_wall_clock_start() -> None:
    tr = _trace(200)
    bare = Trace(**{**tr.__dict__, "start_time": None})
    with pytest.raises(EvaluationError, match=r"no wall-clock start.*\+SECONDS"):
        parse_score_from("2023-11-16T18:01:00", bare)


def test_evaluate_scores_every_baseline_on_the_protocol(trace: Trace) -> None:
    r = evaluate(trace, score_from="+600", use_default_checkpoint=False, with_arima=False)
    counts = series_from_trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens).arrivals
    n_steps = len(counts)
    # decisions at times 600 .. n_steps - 5 (index i decides at i + 1 and needs a full target)
    assert r.scored_points == n_steps - 5 - 599
    assert r.time_s[0] == 600.0
    np.testing.assert_array_equal(r.target, future_sums(counts, 5.0)[599 : n_steps - 5])
    assert list(r.models) == BASELINES[:4]
    doc = r.as_json()
    fields = {"points", "mae", "rmse", "pinball_p90", "coverage_p90"}
    assert set(doc["models"]["ewma"]) == fields | {"prompt_tokens", "gen_tokens"}
    assert set(doc["models"]["ewma"]["gen_tokens"]) == fields
    assert doc["models"]["ewma"]["gen_tokens"]["mae"] > doc["models"]["ewma"]["mae"]  # tokens >> requests
    assert {"model", "recall", "precision", "mean_lead_s", "burst_threshold"} <= set(doc["burst"])
    assert doc["burst"]["model"] in BASELINES
    assert list(doc["burst_by_model"]) == BASELINES[:4]
    assert doc["burst_by_model"][doc["burst"]["model"]]["recall"] == doc["burst"]["recall"]
    # no causal model beats the Poisson floor on a Poisson trace
    assert all(r.noise_floor_mae < s.mae for s in r.models.values())
    # burst onsets every 150 s in the scored part: 600..900 holds the ones at 725 and 875
    assert r.burst.onsets == 2
    json.dumps(doc)  # no NaN or numpy scalars in the document


def test_cli_writes_json_predictions_and_plot(tmp_path: Path) -> None:
    tr = _trace(500)
    src = tmp_path / "t.csv"
    _write_azure(tr, src)
    app = typer.Typer()
    app.command("evaluate")(evaluate_cmd)
    app.command("noop")(lambda: None)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "evaluate", str(src), "--score-from", "+300", "--baselines-only", "--no-arima",
            "--json", str(out / "e.json"), "--predictions", str(out / "p.csv"), "--plot", str(out / "p.png"),
            "--format", "json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "e.json").read_text())
    assert list(doc["models"]) == ["last_value", "ewma", "holt", "seasonal_naive"]
    rows = (out / "p.csv").read_text().splitlines()
    assert rows[0] == "time_s,target,p50,p90,burst_prob"
    assert len(rows) - 1 == doc["scored_points"]
    assert rows[1].startswith("300,")
    assert (out / "p.png").stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["evaluate", str(src), "--score-from", "+9999", "--baselines-only"])
    assert bad.exit_code == 2
    assert "outside" in bad.output


def test_learned_model_is_scored_and_drives_the_burst_alarms(tmp_path: Path, trace: Trace) -> None:
    torch = pytest.importorskip("torch")
    from forecaster.checkpoint import save_checkpoint
    from forecaster.features import DEFAULT_SCHEMA, Normalizer, trace_inputs, trace_targets
    from forecaster.network import LstmAttentionNet

    torch.manual_seed(0)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=8, heads=2, window=8)
    ser = series_from_trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens)
    x, mask = trace_inputs(ser)
    nz = Normalizer.fit(x, mask, trace_targets(ser))
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(path, net, DEFAULT_SCHEMA, nz, 5.0, {})
    r = evaluate(trace, checkpoint=path, score_from="+600", with_arima=False)
    assert list(r.models) == [*BASELINES[:4], "learned", "combined"]
    assert r.burst_model == "learned"
    assert r.models["learned"].points == r.scored_points
    with pytest.raises(EvaluationError, match="horizon"):
        evaluate(trace, checkpoint=path, horizon_s=10, score_from="+600", with_arima=False)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:100])
    with pytest.raises(EvaluationError, match="cannot use checkpoint"):
        evaluate(trace, checkpoint=broken, score_from="+600", with_arima=False)
    with pytest.raises(EvaluationError, match="does not exist"):
        evaluate(trace, checkpoint=tmp_path / "nope.safetensors", score_from="+600", with_arima=False)


def _tiny_checkpoint(tmp_path: Path, trace: Trace) -> Path:
    torch = pytest.importorskip("torch")
    from forecaster.checkpoint import save_checkpoint
    from forecaster.features import DEFAULT_SCHEMA, Normalizer, trace_inputs, trace_targets
    from forecaster.network import LstmAttentionNet

    torch.manual_seed(1)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=8, heads=2, window=8)
    ser = series_from_trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens)
    x, mask = trace_inputs(ser)
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(path, net, DEFAULT_SCHEMA, Normalizer.fit(x, mask, trace_targets(ser)), 5.0, {})
    return path


def test_the_json_has_the_network_and_its_combination_as_two_rows(tmp_path: Path, trace: Trace) -> None:
    path = _tiny_checkpoint(tmp_path, trace)
    src = tmp_path / "t.csv"
    _write_azure(trace, src)
    app = typer.Typer()
    app.command("evaluate")(evaluate_cmd)
    app.command("noop")(lambda: None)
    args = ["--checkpoint", str(path), "--score-from", "+600", "--no-arima", "--format", "json"]
    done = CliRunner().invoke(app, ["evaluate", str(src), "--json", str(tmp_path / "a.json"), *args])
    assert done.exit_code == 0, done.output
    doc = json.loads((tmp_path / "a.json").read_text())
    learned, combined = doc["models"]["learned"], doc["models"]["combined"]
    assert learned["points"] == combined["points"] == doc["scored_points"]
    assert learned["mae"] != combined["mae"]  # an untrained network: the baselines take over
    weights = doc["combination"]["mean_weights"]
    for target in ("arrivals", "prompt_tokens", "gen_tokens"):
        for q in ("p50", "p90"):
            assert sum(weights[target][q].values()) == pytest.approx(1.0)
            assert set(weights[target][q]) == {"network", "ewma", "holt", "last_value"}
    assert doc["burst"]["model"] == "learned"
    # the CLI steps second by second; the offline path (benchmarks) gives the same rows
    offline = evaluate(trace, checkpoint=path, score_from="+600", with_arima=False, offline=True)
    for name in ("learned", "combined"):
        assert offline.models[name].mae == pytest.approx(doc["models"][name]["mae"], rel=1e-3)
    alone = CliRunner().invoke(
        app, ["evaluate", str(src), "--json", str(tmp_path / "b.json"), "--no-combination", *args]
    )
    assert alone.exit_code == 0, alone.output
    doc = json.loads((tmp_path / "b.json").read_text())
    assert "combined" not in doc["models"] and "combination" not in doc and "learned" in doc["models"]


def test_cli_takes_the_trace_as_an_option_as_the_issue_spells_it(tmp_path: Path) -> None:
    tr = _trace(400)
    src = tmp_path / "t.csv"
    _write_azure(tr, src)
    app = typer.Typer()
    app.command("evaluate")(evaluate_cmd)
    app.command("noop")(lambda: None)
    args = ["--score-from", "+300", "--baselines-only", "--no-arima", "--format", "json"]
    by_option = CliRunner().invoke(
        app, ["evaluate", "--trace", str(src), "--json", str(tmp_path / "a.json"), *args]
    )
    assert by_option.exit_code == 0, by_option.output
    by_argument = CliRunner().invoke(app, ["evaluate", str(src), "--json", str(tmp_path / "b.json"), *args])
    assert by_argument.exit_code == 0, by_argument.output
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())
    neither = CliRunner().invoke(app, ["evaluate", *args])
    assert neither.exit_code == 2 and "--trace FILE" in neither.output
    both = CliRunner().invoke(app, ["evaluate", str(src), "--trace", str(src), *args])
    assert both.exit_code == 2


def test_the_length_guard_is_reported_and_only_engages_on_lengths_never_trained_on(tmp_path: Path) -> None:
    """The shipped checkpoint records its training lengths (forecaster.lengths): on Azure-like lengths the
    guard stays off (the JSON says 0 % of the seconds); on ~15,000-token prompts it hides the token channels,
    says so in the table, and the token forecasts follow the arrivals (their MAE is far below the raw
    network's, which reads a token rate it never saw)."""
    app = typer.Typer()
    app.command("evaluate")(evaluate_cmd)
    app.command("noop")(lambda: None)
    tr = _trace(600)
    src = tmp_path / "short.csv"
    _write_azure(tr, src)
    args = ["--score-from", "+300", "--no-arima", "--no-combination"]
    done = CliRunner().invoke(app, ["evaluate", str(src), "--json", str(tmp_path / "a.json"), *args])
    assert done.exit_code == 0, done.output
    guard = json.loads((tmp_path / "a.json").read_text())["length_guard"]
    assert guard["outside_share"] == 0.0 and "length guard:" not in done.output
    assert guard["range"]["prompt"][1] > 4000  # the shipped range: Azure code + conv x 0.5-2
    long_ = Trace(**{**tr.__dict__, "prompt_tokens": tr.prompt_tokens * 0 + 15_000})
    src = tmp_path / "long.csv"
    _write_azure(long_, src)
    done = CliRunner().invoke(app, ["evaluate", str(src), "--json", str(tmp_path / "b.json"), *args])
    assert done.exit_code == 0, done.output
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["length_guard"]["outside_share"] == 1.0
    assert doc["length_guard"]["prompt_len_median"] == pytest.approx(15_000)
    assert "length guard: on 100% of the scored seconds" in " ".join(done.output.split())
    from controller.forecasting import without_length_guard
    from forecaster.streaming import LearnedForecaster
    from training.evaluate import default_checkpoint

    ckpt = default_checkpoint()
    assert ckpt is not None
    raw = LearnedForecaster.load(ckpt)
    without_length_guard(raw)
    unguarded = evaluate(long_, score_from="+300", with_arima=False, learned=raw, combination=None)
    assert unguarded.length_guard is None
    guarded_mae = doc["models"]["learned"]["prompt_tokens"]["mae"]
    assert guarded_mae < 0.7 * unguarded.token_models["learned"]["prompt_tokens"].mae
