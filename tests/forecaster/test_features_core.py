"""forecaster.features: schema, normaliser, encoding, frames, traces and targets."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.features import (
    DEFAULT_SCHEMA,
    GENERATION_TOKENS_TOTAL,
    NUM_REQUESTS_RUNNING,
    PROMPT_TOKENS_TOTAL,
    ROUTER_REQUESTS_TOTAL,
    FeatureError,
    FeatureSchema,
    Normalizer,
    counter_rate,
    encode_inputs,
    encode_step,
    frame_to_inputs,
    future_sums,
    series_from_trace,
    trace_inputs,
    trace_targets,
)
from forecaster.types import CHANNELS, TARGETS, MetricFrame


def _random_inputs(seed: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 5.0, size=(*shape, len(CHANNELS)))
    mask = rng.random(x.shape) > 0.1
    y = rng.gamma(2.0, 50.0, size=(*shape, len(TARGETS)))
    return x, mask, y


# --- schema -------------------------------------------------------------------------------------------


def test_schema_width_and_names_agree() -> None:
    s = DEFAULT_SCHEMA
    assert s.n_inputs == len(s.input_names) == 2 * len(CHANNELS) + 2
    assert s.input_names[len(CHANNELS)] == "arrival_rps_mask"


def test_schema_roundtrip_and_diff() -> None:
    s = DEFAULT_SCHEMA
    assert FeatureSchema.from_dict(s.to_dict()) == s
    assert s.diff(s) == []
    other = dataclasses.replace(
        s, channels=(*s.channels[:-1], "queue_depth"), masked=s.masked, step_s=2.0, version=s.version + 1
    )
    diffs = s.diff(other)
    text = "\n".join(diffs)
    assert "version" in text and "step_s" in text
    assert "missing ['itl_p90_s']" in text and "extra ['queue_depth']" in text


def test_schema_diff_reports_reorder_and_mask_flags() -> None:
    s = DEFAULT_SCHEMA
    swapped = dataclasses.replace(s, channels=(s.channels[1], s.channels[0], *s.channels[2:]))
    assert any("different order" in d for d in s.diff(swapped))
    unmasked = dataclasses.replace(s, masked=(False, *s.masked[1:]))
    assert s.diff(unmasked) == ["masked: mask flag differs for ['arrival_rps']"]


def test_schema_rejects_bad_fields() -> None:
    with pytest.raises(FeatureError, match="masked"):
        FeatureSchema(masked=(True,))
    with pytest.raises(FeatureError, match="time_features"):
        FeatureSchema(time_features=("moon_phase",))
    with pytest.raises(FeatureError, match="lacks field"):
        FeatureSchema.from_dict({"channels": []})


# --- normaliser ----------------------------------------------------------------------------------------


def test_normalizer_roundtrip_dict() -> None:
    x, m, y = _random_inputs(0, (2, 50))
    nz = Normalizer.fit(x, m, y)
    assert Normalizer.from_dict(nz.to_dict()) == nz
    with pytest.raises(
        FeatureError, match=r"std must be positive and finite; bad entries \{'arrival_rps': 0.0"
    ):
        Normalizer.from_dict({**nz.to_dict(), "std": [0.0] * len(CHANNELS)})
    with pytest.raises(FeatureError, match="'mean' has 3 entries"):
        Normalizer.from_dict({**nz.to_dict(), "mean": [0.0] * 3})


def test_normalizer_standardises_observed_training_values() -> None:
    x, m, y = _random_inputs(1, (3, 400))
    nz = Normalizer.fit(x, m, y)
    z, ok = nz.normalize_inputs(x, m)
    for c in range(len(CHANNELS)):
        vals = z[..., c][ok[..., c]]
        assert abs(vals.mean()) < 1e-9
        assert abs(vals.std() - 1.0) < 1e-9
    yn = nz.normalize_targets(y)
    assert np.allclose(yn.reshape(-1, 3).mean(0), 0.0, atol=1e-9)
    assert np.allclose(nz.denormalize_targets(yn), y)


def test_normalizer_fit_ignores_the_validation_split() -> None:
    """Statistics fitted with train_end never read time steps >= train_end (nor targets reaching past it)."""
    x, m, y = _random_inputs(2, (2, 300))
    train_end, h = 200, 5
    a = Normalizer.fit(x, m, y, train_end=train_end, horizon_steps=h)
    x2, y2 = x.copy(), y.copy()
    x2[:, train_end:] *= 1000.0
    y2[:, train_end - h :] *= 1000.0  # targets at t >= train_end - h sum values at or after train_end
    b = Normalizer.fit(x2, m, y2, train_end=train_end, horizon_steps=h)
    assert a == b
    # ... and the statistics do depend on the data they are given (this test can fail):
    assert Normalizer.fit(x2, m, y2) != Normalizer.fit(x, m, y)
    c = Normalizer.fit(x, m, y2, train_end=train_end, horizon_steps=0)
    assert c.target_mean != a.target_mean


def test_normalizer_ignores_masked_entries_and_unobserved_channels() -> None:
    x, m, y = _random_inputs(3, (1, 100))
    m[..., 0] = False
    x2 = x.copy()
    x2[..., 0] = 1e9
    assert Normalizer.fit(x, m, y) == Normalizer.fit(x2, m, y)
    nz = Normalizer.fit(x, m, y)
    assert nz.mean[0] == 0.0 and nz.std[0] == 1.0


# --- encoding ------------------------------------------------------------------------------------------


def test_outage_is_not_idle() -> None:
    """An unknown value encodes differently from an observed zero (value column and mask column)."""
    x, m, y = _random_inputs(4, (1, 100))
    nz = Normalizer.fit(x, m, y)
    idle = encode_step(np.zeros((1, 10)), np.ones((1, 10), bool), nz, 0.0)
    outage = encode_step(np.full((1, 10), np.nan), np.zeros((1, 10), bool), nz, 0.0)
    assert np.all(np.isfinite(outage))
    c = len(CHANNELS)
    assert np.all(outage[0, c : 2 * c] == 0.0) and np.all(idle[0, c : 2 * c] == 1.0)
    assert not np.allclose(idle[0, :c], outage[0, :c])


def test_negative_and_nan_values_are_unknown_even_if_flagged_observed() -> None:
    nz = Normalizer.identity()
    x = np.array([[-1.0, np.nan, 2.0, 0, 0, 0, 0, 0, 0, 0]])
    out = encode_step(x, np.ones_like(x, bool), nz, 0.0)
    c = len(CHANNELS)
    assert out[0, c] == 0.0 and out[0, c + 1] == 0.0 and out[0, c + 2] == 1.0
    assert out[0, 0] == 0.0 and out[0, 2] == pytest.approx(np.log1p(2.0))


def test_encode_step_equals_rows_of_encode_inputs() -> None:
    x, m, y = _random_inputs(5, (4, 30))
    nz = Normalizer.fit(x, m, y)
    times = 1.7e9 + np.arange(30.0)
    seq = encode_inputs(x, m, nz, times)
    assert seq.shape == (4, 30, DEFAULT_SCHEMA.n_inputs) and seq.dtype == np.float32
    for t in (0, 17, 29):
        np.testing.assert_array_equal(encode_step(x[:, t], m[:, t], nz, float(times[t])), seq[:, t])


def test_time_features_follow_time_of_day_and_need_a_time() -> None:
    nz = Normalizer.identity()
    x, m = np.zeros((1, 10)), np.ones((1, 10), bool)
    midnight = encode_step(x, m, nz, 86_400.0 * 20_000)
    six_am = encode_step(x, m, nz, 86_400.0 * 20_000 + 6 * 3600)
    assert midnight[0, -2:] == pytest.approx([0.0, 1.0], abs=1e-6)
    assert six_am[0, -2:] == pytest.approx([1.0, 0.0], abs=1e-6)
    with pytest.raises(FeatureError, match="now_s"):
        encode_step(x, m, nz, float("nan"))


def test_encode_rejects_wrong_width() -> None:
    with pytest.raises(FeatureError, match="10 channels"):
        encode_step(np.zeros((2, 9)), np.ones((2, 9), bool), Normalizer.identity(), 0.0)


# --- frames --------------------------------------------------------------------------------------------


def test_frame_to_inputs_counters_gauges_and_gaps() -> None:
    times = 1000.0 + np.arange(6.0)
    reqs = np.array([10, 12, 15, np.nan, 20, 3.0])  # gap at t=3, reset at t=5
    prompt = np.array([0, 100, 300, 600, 1000, 1500.0])
    running = np.array([1, 2, 3, 4, 5, 6.0])
    values = np.stack([reqs, prompt, running])[None]  # [1, 3, 6]
    frame = MetricFrame(
        ("n0",), (ROUTER_REQUESTS_TOTAL, PROMPT_TOKENS_TOTAL, NUM_REQUESTS_RUNNING), times, values
    )
    x, mask = frame_to_inputs(frame)
    assert x.shape == (1, 6, len(CHANNELS))
    arr = x[0, :, CHANNELS.index("arrival_rps")]
    np.testing.assert_array_equal(arr[[1, 2]], [2.0, 3.0])
    assert np.isnan(arr[[0, 3, 4, 5]]).all()  # first step, both sides of the gap, the reset
    np.testing.assert_array_equal(x[0, 1:, CHANNELS.index("prompt_tps")], [100, 200, 300, 400, 500])
    np.testing.assert_array_equal(x[0, :, CHANNELS.index("running")], running)
    assert not mask[0, :, CHANNELS.index("gen_tps")].any()  # no generation counter in this frame
    np.testing.assert_array_equal(mask, np.isfinite(x))


def test_frame_channel_by_own_name_wins() -> None:
    times = np.arange(3.0)
    values = np.array([[[0.1, 0.2, 0.3], [0.0, 5.0, 10.0]]])
    frame = MetricFrame(("n0",), ("ttft_p90_s", GENERATION_TOKENS_TOTAL), times, values)
    x, _ = frame_to_inputs(frame)
    np.testing.assert_array_equal(x[0, :, CHANNELS.index("ttft_p90_s")], [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(x[0, 1:, CHANNELS.index("gen_tps")], [5.0, 5.0])


def test_frame_with_wrong_step_is_an_error() -> None:
    frame = MetricFrame(("n0",), ("running",), np.arange(0.0, 10.0, 2.0), np.zeros((1, 1, 5)))
    with pytest.raises(FeatureError, match=r"2\.0 s"):
        frame_to_inputs(frame)


def test_counter_rate_uses_time_spacing() -> None:
    np.testing.assert_allclose(
        counter_rate(np.array([0.0, 10.0, 30.0]), np.array([0.0, 2.0, 4.0]))[1:], [5, 10]
    )


# --- traces and targets --------------------------------------------------------------------------------


def test_series_from_trace_bins_by_second() -> None:
    s = series_from_trace(
        np.array([0.0, 0.5, 1.0, 3.9]), np.array([10, 20, 30, 40]), np.array([1, 2, 3, 4]), step_s=1.0
    )
    np.testing.assert_array_equal(s.arrivals, [2, 1, 0, 1])
    np.testing.assert_array_equal(s.prompt_tokens, [30, 30, 0, 40])
    np.testing.assert_array_equal(s.gen_tokens, [3, 3, 0, 4])
    fixed = series_from_trace(np.array([0.0, 5.0]), np.array([1, 1]), np.array([1, 1]), duration_s=3.0)
    np.testing.assert_array_equal(fixed.arrivals, [1, 0, 0])


def test_trace_inputs_mask_what_a_trace_cannot_tell() -> None:
    s = series_from_trace(np.array([0.0, 1.5]), np.array([10, 20]), np.array([1, 2]))
    x, mask = trace_inputs(s)
    assert mask[:, :3].all() and not mask[:, 3:].any()
    np.testing.assert_array_equal(x[:, 0], [1, 1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40),
    st.integers(1, 8),
)
def test_future_sums_matches_a_direct_sum(values: list[float], h: int) -> None:
    s = np.array(values)
    out = future_sums(s, float(h))
    for t in range(len(s)):
        if t + h < len(s):
            assert out[t] == pytest.approx(s[t + 1 : t + 1 + h].sum(), rel=1e-9, abs=1e-6)
        else:
            assert np.isnan(out[t])


def test_future_sums_nan_window_and_errors() -> None:
    s = np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.0])
    out = future_sums(s, 2.0)
    assert np.isnan(out[[0, 1]]).all()  # windows covering index 2
    np.testing.assert_array_equal(out[2:5], [9.0, 11.0, 13.0])
    with pytest.raises(FeatureError, match="multiple"):
        future_sums(s, 2.5)


def test_trace_targets_shape_and_order() -> None:
    s = series_from_trace(np.arange(20.0), np.full(20, 10), np.full(20, 3))
    y = trace_targets(s, horizon_s=5.0)
    assert y.shape == (20, 3)
    np.testing.assert_array_equal(y[0], [5, 50, 15])
    assert np.isnan(y[15:]).all()


def test_features_import_without_torch() -> None:
    """The controller imports features for the reactive path; torch must stay off that path."""
    code = "import sys, forecaster, forecaster.types, forecaster.features; print('torch' in sys.modules)"
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert res.stdout.strip() == "False"


def test_replace_does_not_touch_the_original_normalizer() -> None:
    nz = Normalizer.identity()
    x, m = np.ones((1, len(CHANNELS))), np.ones((1, len(CHANNELS)), bool)
    before = encode_step(x, m, nz, 0.0)
    shifted = dataclasses.replace(nz, mean=(5.0,) * len(CHANNELS))
    assert not np.array_equal(encode_step(x, m, shifted, 0.0), before)
    np.testing.assert_array_equal(encode_step(x, m, nz, 0.0), before)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        min_size=len(CHANNELS),
        max_size=len(CHANNELS),
    ),
    st.lists(st.booleans(), min_size=len(CHANNELS), max_size=len(CHANNELS)),
)
def test_encoding_is_always_finite_and_masks_what_is_unknown(
    values: list[float], observed: list[bool]
) -> None:
    x, m = np.array([values]), np.array([observed])
    out = encode_step(x, m, Normalizer.identity(), 1.7e9)
    assert np.all(np.isfinite(out))
    c = len(CHANNELS)
    mask_cols = out[0, c : 2 * c].astype(bool)
    assert not np.any(mask_cols & ~m[0])  # never observed when the caller said unknown
    assert not np.any(mask_cols & ~np.isfinite(x[0]))
