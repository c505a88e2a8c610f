"""Training on a trace replayed through the simulator (``training.replay_frames``, ``fit --replay``): the series
are what the loop's forecaster received, channel by channel; the splits are by time; the CLI records the source."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from controller.config import PolicyConfig
from controller.replay_policies import PredictivePolicy, _epoch_offset
from forecaster.baselines import Holt
from forecaster.checkpoint import load_checkpoint
from forecaster.features import frame_to_inputs
from forecaster.types import CHANNELS, ForecastBatch, Forecaster
from serving.sim.fleet import single_pool
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.workload.named import workload
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.data import sha256_file
from training.fit import FrameSource, LabelConfig, build_series
from training.replay_frames import (
    REPLAY_POLICIES,
    FrameRecorder,
    RecordingPolicy,
    replay_frame,
    replay_source,
    trace_digest,
)

# Wide enough that rich's error panel never wraps a path (under xdist tmp_path is longer: .../popen-gw0/...)
runner = CliRunner(env={"COLUMNS": "400"})


def _trace(duration_s: float = 240.0, seed: int = 3):  # type: ignore[no-untyped-def]
    return generate(SyntheticParams(duration_s=duration_s, rate_rps=3, burst_multiplier=6), seed=seed)


class _Spy:
    """The test's own record of every (x, mask) the controller's forecaster was given (no code shared with
    ``FrameRecorder``)."""

    def __init__(self, inner: Forecaster) -> None:
        self.inner, self.name, self.horizon_s = inner, inner.name, inner.horizon_s
        self.seen: list[tuple[float, np.ndarray, np.ndarray]] = []

    def reset(self, node_ids):  # type: ignore[no-untyped-def]
        self.seen = []
        self.inner.reset(node_ids)

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        self.seen.append((now_s, np.array(x, dtype=np.float64), np.array(mask, dtype=bool)))
        return self.inner.step(x, mask, now_s=now_s)


@pytest.fixture(scope="module")
def replayed():  # type: ignore[no-untyped-def]
    trace = _trace()
    got = replay_frame(trace, policy="predictive-holt")
    spies: list[_Spy] = []

    def make() -> Forecaster:
        spies.append(_Spy(Holt()))
        return spies[-1]

    fleet = single_pool()
    replay(fleet, {fleet.pools[0].name: trace}, PredictivePolicy(PolicyConfig(), forecaster=make))
    return got, spies[-1].seen


def test_replayed_series_equal_what_the_forecaster_received(replayed) -> None:  # type: ignore[no-untyped-def]
    got, seen = replayed
    x, mask = frame_to_inputs(got.frame)  # what FrameSource training reads
    assert x.shape == (1, len(seen), len(CHANNELS))
    times = np.array([s[0] for s in seen])
    np.testing.assert_allclose(got.frame.times_s, times)
    for c, ch in enumerate(CHANNELS):
        want = np.array([np.where(m[0, c], v[0, c], np.nan) for _, v, m in seen])
        np.testing.assert_array_equal(x[0, :, c], want, err_msg=ch)
        np.testing.assert_array_equal(mask[0, :, c], np.isfinite(want), err_msg=ch)
    # the loop's channels a trace cannot give are filled in, and generation is counted as generated
    for ch in ("running", "kv_usage", "gen_tps"):
        assert np.isfinite(x[0, :, CHANNELS.index(ch)]).mean() > 0.9, ch


def test_training_series_are_the_recorded_inputs_split_by_time(replayed) -> None:  # type: ignore[no-untyped-def]
    got, seen = replayed
    labels = LabelConfig(holdout_frac=0.2, val_frac=0.2)
    ss = build_series(
        [], [FrameSource("replay:x", got.frame, kind="replay", info={"policy": "p"})], labels=labels
    )
    (train,), (val,) = ss.train, ss.val
    n_t = len(seen)
    cut_val, cut_test = int(n_t * 0.6), int(n_t * 0.8)
    assert len(train) == cut_val and len(val) == cut_test - cut_val  # the hold-out (last 20 %) is never read
    x = np.array([np.where(m[0], v[0], np.nan) for _, v, m in seen], dtype=np.float32)
    np.testing.assert_array_equal(train.x_raw, x[:cut_val])
    np.testing.assert_array_equal(val.x_raw, x[cut_val:cut_test])
    assert val.t0_unix_s == pytest.approx(seen[cut_val][0])
    # a training target never reaches into validation: the last horizon_s rows of train are unscored
    h = int(labels.horizon_s)
    assert np.isnan(train.totals[-h:]).all()
    src = ss.summary["sources"][0]
    assert src["kind"] == "replay" and src["policy"] == "p" and src["train_steps"] == cut_val


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=30), st.floats(0, 1e9, allow_nan=False))
def test_recorder_frame_puts_each_step_on_its_grid_point(gaps: list[int], t0: float) -> None:
    rec = FrameRecorder(Holt())
    rec.reset(["a", "b"])
    times = t0 + np.concatenate([[0], np.cumsum(gaps)]).astype(np.float64)
    rng = np.random.default_rng(len(gaps))
    for t in times:
        x = rng.uniform(0, 10, (2, len(CHANNELS)))
        rec.step(x, x > 2, now_s=float(t))
    f = rec.frame()
    assert f.metrics == CHANNELS and f.node_ids == ("a", "b")
    idx = np.rint(times - times[0]).astype(int)
    np.testing.assert_array_equal(f.values[:, :, idx], np.stack(rec.inputs, -1))
    others = np.setdiff1d(np.arange(len(f.times_s)), idx)
    assert np.isnan(f.values[:, :, others]).all()  # a tick never stepped is unknown, not zero


def test_recording_policy_records_what_the_pipeline_gives_its_forecaster(replayed) -> None:  # type: ignore[no-untyped-def]
    """The baseline policies' recorder (its own LoadAggregator, outside the pipeline) against the spy inside a
    predictive policy's pipeline, on the same replay: the same numbers, channel by channel, tick by tick."""
    _, seen_holt = replayed
    spies: list[_Spy] = []

    def make() -> Forecaster:
        spies.append(_Spy(Holt()))
        return spies[-1]

    rec = RecordingPolicy(PredictivePolicy(PolicyConfig(), forecaster=make))
    fleet = single_pool()
    replay(fleet, {fleet.pools[0].name: _trace()}, rec)
    seen = spies[-1].seen
    assert len(seen) == len(seen_holt) == len(rec.frame().times_s) > 200
    np.testing.assert_allclose(rec.frame().times_s, [t for t, _, _ in seen])
    for c, ch in enumerate(CHANNELS):
        want = np.array([np.where(m[0, c], v[0, c], np.nan) for _, v, m in seen])
        np.testing.assert_array_equal(rec.frame().values[0, c], want, err_msg=ch)


def test_a_reactive_replay_records_without_changing_its_decisions() -> None:
    trace = _trace()
    got = replay_frame(trace, policy="reactive")
    plain = replay(single_pool(), {"default": trace}, make_policy("reactive", PolicyOptions()))
    assert got.info["replay_slo_attainment"] == plain.slo_attainment
    assert got.info["replay_gpu_seconds"] == plain.gpu_seconds
    assert got.info["forecaster"] is None and got.info["checkpoint"] is None
    # every request that arrived after the first scrape is counted once by the arrival channel
    arrivals = got.frame.series("arrival_rps")[0]
    t0 = got.frame.times_s[0] - _epoch_offset(trace)
    before = int(np.sum(trace.arrival_s - trace.arrival_s[0] <= t0))
    assert len(trace) - before <= np.nansum(arrivals) <= len(trace)
    for ch in ("running", "kv_usage", "gen_tps", "ttft_p90_s"):
        assert np.isfinite(got.frame.series(ch)).mean() > 0.5, ch
    # the fleet-state channels follow the policy that drove the fleet: reactive is not predictive-holt
    holt = replay_frame(trace, policy="predictive-holt")
    assert not np.array_equal(got.frame.series("running"), holt.frame.series("running"), equal_nan=True)


def test_replay_source_builds_a_named_workload_as_bench_policies_does() -> None:
    src = replay_source("sine@101")
    trace, fleet = workload("sine@101", None, 600.0)
    assert trace_digest(src.trace) == trace_digest(trace) and len(src.trace) == len(trace)
    assert (
        (src.slo_ttft_ms, src.slo_itl_ms)
        == (fleet.pools[0].slo_ttft_ms, fleet.pools[0].slo_itl_ms)
        == (
            3000.0,
            35.0,
        )
    )
    assert src.info["workload"] == "sine@101" and src.info["scored_row"] is None
    # a reference row is named by its requests, whatever it is called
    assert replay_source("mmpp@5").info["scored_row"] == "mmpp"
    assert replay_source("mmpp@3").info["scored_row"] == "mmpp@3"
    assert replay_source("mmpp@6").info["scored_row"] is None


def test_replay_source_of_a_file_and_of_file_prefix_agree(tmp_path: Path) -> None:
    csv = write_trace(_trace(120), tmp_path / "t.csv", "azure")
    a, b = replay_source(str(csv)), replay_source(f"file:{csv}")
    assert a.info == b.info and a.info["trace_sha256"] == sha256_file(csv)
    assert (a.slo_ttft_ms, a.slo_itl_ms) == (1000.0, 50.0) and a.info["scored_row"] is None
    with pytest.raises(ValueError, match="no such file"):
        replay_source(f"file:{tmp_path / 'gone.csv'}")


@pytest.mark.parametrize("policy", REPLAY_POLICIES)
def test_every_replay_policy_records_a_frame(policy: str) -> None:
    got = replay_frame(_trace(90, seed=4), policy=policy)
    assert got.info["policy"] == policy and len(got.frame.times_s) >= 90
    assert np.isfinite(got.frame.series("arrival_rps")).mean() > 0.9


def test_replay_frame_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="nope"):
        replay_frame(_trace(60), policy="nope")
    with pytest.raises(ValueError, match="speed"):
        replay_frame(_trace(60), speed=0.0)


def _tiny_fit(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "fit", "--out", str(tmp_path / "run"), "--epochs", "1", "--seq-len", "64", "--burn-in", "8",
        "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1", "--heads", "2",
        "--window", "4", "--copies", "1", "--synthetic", "0", "--accelerator", "cpu", "--threads", "1",
        "--quiet", *extra,
    ]  # fmt: skip


def test_fit_replay_end_to_end_records_what_was_replayed(tmp_path: Path) -> None:
    csv = write_trace(_trace(300), tmp_path / "tiny.csv", "azure")
    ck = tmp_path / "c.safetensors"
    args = _tiny_fit(
        tmp_path, "--replay", str(csv), "--replay-policy", "predictive-holt", "--replay-speed", "1.5",
        "--trace", str(csv), "--checkpoint-out", str(ck),
    )  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    sources = load_checkpoint(ck).meta["sources"]
    assert [s["kind"] for s in sources] == ["trace", "replay"]
    rep = sources[1]
    assert rep["trace_sha256"] == sha256_file(csv)
    assert rep["policy"] == "predictive-holt" and rep["profile"] == "llama3-8b/a100" and rep["speed"] == 1.5
    assert rep["steps"] >= 300 / 1.5


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--replay-policy", "bogus"], "--replay-policy"),
        (["--replay-speed", "0"], "--replay-speed"),
        (["--replay-profile", "nope/gpu"], "--replay-profile"),
    ],
)
def test_fit_replay_option_errors_name_the_option(tmp_path: Path, extra: list[str], named: str) -> None:
    csv = write_trace(_trace(60), tmp_path / "t.csv", "azure")
    result = runner.invoke(app, _tiny_fit(tmp_path, "--replay", str(csv), *extra))
    assert result.exit_code != 0
    assert named in result.output


def test_fit_replay_of_generated_workloads_records_them(tmp_path: Path) -> None:
    ck = tmp_path / "c.safetensors"
    args = _tiny_fit(
        tmp_path,
        "--replay",
        "mmpp@7",
        "--replay",
        "mmpp@5",
        "--replay-speed",
        "4",
        "--checkpoint-out",
        str(ck),
    )
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "reference row 'mmpp'" in result.output  # mmpp@5 is the scored mmpp row
    fresh, scored = load_checkpoint(ck).meta["sources"]
    assert fresh["kind"] == scored["kind"] == "replay" and fresh["policy"] == "reactive"
    assert fresh["workload"] == "mmpp@7" and fresh["scored_row"] is None
    assert scored["workload"] == "mmpp@5" and scored["scored_row"] == "mmpp"
    assert fresh["requests_sha256"] == trace_digest(workload("mmpp@7", None, 600.0)[0])
    assert fresh["slo_ttft_ms"] == 1000.0 and fresh["steps"] >= 1200 / 4


def test_fit_replay_of_an_unknown_workload_names_the_option_and_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, _tiny_fit(tmp_path, "--replay", "mmpq"))
    assert result.exit_code != 0
    out = " ".join(result.output.split())
    assert "--replay mmpq" in out and "not a workload name" in out and "mmpp-holdout" in out


def test_fit_replay_missing_file_names_it(tmp_path: Path) -> None:
    result = runner.invoke(app, _tiny_fit(tmp_path, "--replay", str(tmp_path / "gone.csv")))
    assert result.exit_code != 0
    assert "gone.csv" in result.output and "--replay" in result.output


def test_fit_replay_of_a_single_request_names_the_file(tmp_path: Path) -> None:
    tr = _trace(60)
    t0 = float(tr.arrival_s[0])
    one = tr.window(t0, t0 + 1e-6)
    assert len(one) == 1
    csv = write_trace(one, tmp_path / "one.csv", "azure")
    result = runner.invoke(app, _tiny_fit(tmp_path, "--replay", str(csv)))
    assert result.exit_code != 0
    assert "one.csv" in result.output and "--replay" in result.output and "nothing to replay" in result.output
