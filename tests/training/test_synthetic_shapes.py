"""``train-forecaster fit --synthetic-shapes mixed``: waves and level shifts beside the MMPP, at rates chosen.

The default (``mmpp`` at 0.5-40 req/s) must stay the shipped checkpoint's data bit for bit; the mixed draw
must actually contain the shapes it names, inside the rate range it is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from forecaster.checkpoint import load_checkpoint
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.trace import Trace
from serving.workload.writers import write_trace
from training import synthetic as syn
from training.cli import app

runner = CliRunner()


def _draw_with_same_rng(
    fn: Callable[[np.random.Generator, float], Trace], seed: int, n: int
) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [fn(rng, 600.0).arrival_s for _ in range(n)]


def test_the_default_is_the_shipped_mmpp_bit_for_bit() -> None:
    assert syn.synthetic_fn() is syn.bursty_synthetic
    # an explicit range equal to the default gives the same draws as the old hard-coded range
    ours = _draw_with_same_rng(syn.synthetic_fn("mmpp", syn.DEFAULT_RATE_RANGE), 3, 3)
    old = _draw_with_same_rng(syn.bursty_synthetic, 3, 3)
    for a, b in zip(ours, old, strict=True):
        np.testing.assert_array_equal(a, b)


def _rate_per_minute(arrivals: np.ndarray, duration_s: float) -> np.ndarray:
    return np.bincount((arrivals // 60).astype(int), minlength=int(duration_s // 60))[: int(duration_s // 60)]


def test_steps_shift_the_mean_rate_between_segments() -> None:
    params = SyntheticParams(duration_s=3600.0, rate_rps=5.0, burst_multiplier=1.0)
    shifted = 0
    for seed in range(6):
        t = syn._steps(np.random.default_rng(seed), params, (0.05, 100.0))
        assert t is not None
        assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[-1] <= 3600.0 + 1
        per_min = _rate_per_minute(t.arrival_s, 3600.0)
        # a Poisson stream at one rate has minute counts within a factor ~1.6 of each other at 300/min;
        # a shift of up to x8 up or down between segments shows as a much wider spread
        if per_min.max() > 2.5 * max(per_min.min(), 1):
            shifted += 1
    assert shifted >= 4


def test_a_wave_modulates_the_rate_slowly() -> None:
    rng = np.random.default_rng(0)
    base = SyntheticParams(duration_s=3600.0, rate_rps=10.0, burst_multiplier=1.0)
    wave = syn._wave(rng, base)
    assert syn.WAVE_AMPLITUDE[0] <= wave.diurnal_amplitude <= syn.WAVE_AMPLITUDE[1]
    assert syn.WAVE_PERIOD_S[0] <= wave.diurnal_period_s <= syn.WAVE_PERIOD_S[1]
    t = generate(wave, seed=1)
    per_min = _rate_per_minute(t.arrival_s, 3600.0)
    flat = _rate_per_minute(generate(base, seed=1).arrival_s, 3600.0)
    assert per_min.std() > 3 * flat.std()


def _shape(source: str) -> str:
    if source.startswith("steps("):
        return "step"
    return "mmpp" if "diurnal_amplitude=0.0," in source else "wave"


def _mean_rates(source: str) -> list[float]:
    """Every mean rate the trace was drawn at: the segments' for steps, else the parameter set's."""
    if source.startswith("steps(rates=["):
        return [float(v) for v in source[len("steps(rates=[") : source.index("]")].split(",")]
    (rate,) = re.findall(r"rate_rps=([0-9.e+-]+)", source)
    return [float(rate)]


def test_mixed_draws_every_shape_in_about_its_share() -> None:
    n = 60
    shapes = [_shape(syn.mixed_synthetic(np.random.default_rng(s), 600.0).source) for s in range(n)]
    for name, share in (
        ("wave", syn.WAVE_PROB),
        ("step", syn.STEP_PROB),
        ("mmpp", 1 - syn.WAVE_PROB - syn.STEP_PROB),
    ):
        assert abs(shapes.count(name) / n - share) < 0.15, (name, shapes.count(name))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lo=st.floats(0.02, 5.0), span=st.floats(1.0, 200.0))
def test_mixed_traces_are_ordered_and_drawn_inside_the_rate_range(seed: int, lo: float, span: float) -> None:
    hi = lo * span
    t = syn.mixed_synthetic(np.random.default_rng(seed), 900.0, rate_range=(lo, hi))
    assert len(t) >= 1
    assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[0] >= 0
    assert t.arrival_s[-1] <= 900.0 + 1
    for rate in _mean_rates(t.source):
        assert lo * (1 - 1e-5) <= rate <= hi * (1 + 1e-5)


def test_bad_shapes_or_rates_are_errors() -> None:
    with pytest.raises(ValueError, match="one of mmpp, mixed"):
        syn.synthetic_fn("sawtooth")
    with pytest.raises(ValueError, match="0 < low <= high"):
        syn.synthetic_fn("mixed", (5.0, 1.0))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--synthetic-shapes", "sawtooth"], "--synthetic-shapes 'sawtooth': one of mmpp, mixed"),
        (["--synthetic-rate-range", "40,1"], "--synthetic-rate-range '40,1': give LOW,HIGH"),
    ],
    ids=["shape", "rates"],
)
def test_fit_rejects_bad_synthetic_options(tmp_path: Path, extra: list[str], named: str) -> None:
    trace = tmp_path / "empty.csv"  # checked before any trace is read
    trace.write_text("")
    result = runner.invoke(app, ["fit", "--trace", str(trace), "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code != 0
    assert named in " ".join(result.output.replace("│", " ").split())


def test_a_tiny_fit_with_the_mix_records_it(tmp_path: Path) -> None:
    trace = generate(SyntheticParams(duration_s=600, rate_rps=3, burst_multiplier=6), seed=11)
    csv = write_trace(trace, tmp_path / "tiny.csv", "azure")
    args = [
        "fit", "--trace", str(csv), "--out", str(tmp_path / "run"), "--epochs", "1", "--seq-len", "64",
        "--burn-in", "8", "--batch-size", "4", "--windows-per-epoch", "4", "--hidden", "8", "--layers", "1",
        "--heads", "2", "--window", "4", "--copies", "1", "--synthetic", "2", "--synthetic-duration-s", "300",
        "--synthetic-shapes", "mixed", "--synthetic-rate-range", "0.1,50", "--accelerator", "cpu",
        "--threads", "1", "--quiet", "--checkpoint-out", str(tmp_path / "c.safetensors"),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = load_checkpoint(tmp_path / "c.safetensors").meta
    (synthetic,) = [s for s in meta["sources"] if s["kind"] == "synthetic"]
    assert synthetic["shapes"] == "mixed" and synthetic["rate_range"] == [0.1, 50.0]
