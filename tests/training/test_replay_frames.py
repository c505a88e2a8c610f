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
from controller.replay_policies import PredictivePolicy
from forecaster.baselines import Holt
from forecaster.checkpoint import load_checkpoint
from forecaster.features import frame_to_inputs
from forecaster.types import CHANNELS, ForecastBatch, Forecaster
from serving.sim.fleet import single_pool
from serving.sim.replay import replay
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.writers import write_trace
from training.cli import app
from training.data import sha256_file
from training.fit import FrameSource, LabelConfig, build_series
from training.replay_frames import FrameRecorder, replay_frame

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
