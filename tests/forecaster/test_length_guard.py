"""The length guard (forecaster/lengths.py): trailing mean lengths, the range, and the guarded forecaster."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.checkpoint import read_checkpoint, read_metadata, save_checkpoint
from forecaster.features import DEFAULT_SCHEMA, FeatureError, Normalizer
from forecaster.inference import NumpyLearnedForecaster
from forecaster.lengths import (
    LENGTH_HALFLIFE_S,
    LENGTH_MIN_ARRIVALS,
    LengthRange,
    LengthState,
    guarded_mask,
    length_range_of,
    length_series,
    training_length_range,
)
from forecaster.network import LstmAttentionNet
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS
from tests.support.forecast_series import rate_series, step_with_churn

T0_S = 1.7e9
SHIPPED = Path(__file__).resolve().parents[2] / "forecaster" / "checkpoints" / "default.safetensors"
A, P, G = (CHANNELS.index(c) for c in ("arrival_rps", "prompt_tps", "gen_tps"))
RANGE = LengthRange(prompt=(100.0, 4000.0), output=(10.0, 1000.0))


def _forecaster(seed: int = 0, length_range: LengthRange | None = RANGE) -> LearnedForecaster:
    torch.manual_seed(seed)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=8, heads=2, window=5)
    return LearnedForecaster(
        net, DEFAULT_SCHEMA, Normalizer.identity(DEFAULT_SCHEMA), 5.0, "guard", length_range=length_range
    )


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 60), seed=st.integers(0, 10_000), drop=st.floats(0.0, 0.6))
def test_streaming_lengths_equal_offline(t: int, seed: int, drop: float) -> None:
    x, mask = rate_series(3, t, seed, drop=drop)
    offline = length_series(x, mask, CHANNELS)
    state = LengthState(3, CHANNELS)
    for i in range(t):
        np.testing.assert_allclose(
            state.update(x[:, i], mask[:, i]), offline[:, i], rtol=1e-9, equal_nan=True
        )


def test_lengths_are_ratios_of_ewmas_known_after_enough_requests_and_frozen_while_unknown() -> None:
    x = np.full((1, 40, len(CHANNELS)), np.nan)
    x[0, :, A], x[0, :, P], x[0, :, G] = 1.0, 1000.0, 50.0
    x[0, 20:, P] = 3000.0  # longer prompts from t = 20
    mask = np.isfinite(x)
    mask[0, 30:35, G] = False  # one channel unknown: the step counts for none of the sums
    lens = length_series(x, mask, CHANNELS)[0]
    known = np.isfinite(lens).all(axis=-1)
    assert not known[: int(LENGTH_MIN_ARRIVALS) - 1].any() and known[int(LENGTH_MIN_ARRIVALS) - 1 :].all()
    np.testing.assert_allclose(lens[10:20], [[1000.0, 50.0]] * 10)
    d = 0.5 ** (1.0 / LENGTH_HALFLIFE_S)
    w_old, w_new = d**10 * (1 - d**20), 1 - d**10  # the EWMA weights of the 20 old and 10 new steps at t = 29
    np.testing.assert_allclose(lens[29, 0], (1000.0 * w_old + 3000.0 * w_new) / (w_old + w_new), rtol=1e-9)
    np.testing.assert_allclose(lens[30:35], np.repeat(lens[29:30], 5, axis=0), rtol=1e-12)  # frozen
    # no token channels in the schema: never known
    assert np.isnan(length_series(x[..., [A]], mask[..., [A]], ("arrival_rps",))).all()


def test_range_outside_doc_round_trip_and_errors() -> None:
    lens = np.array(
        [[100.0, 10.0], [4000.0, 1000.0], [99.0, 500.0], [500.0, 1001.0], [np.nan, 5000.0], [np.nan, np.nan]]
    )
    assert RANGE.outside(lens).tolist() == [
        False,
        False,
        True,
        True,
        True,
        False,
    ]  # NaN alone is never outside
    assert LengthRange.from_doc(json.loads(json.dumps(RANGE.to_doc()))) == RANGE
    assert length_range_of({}) is None and length_range_of({"length_range": None}) is None
    with pytest.raises(FeatureError, match=r"length_range\.output must be \[low, high\]"):
        LengthRange.from_doc({"prompt": [1, 2], "output": [3]})
    with pytest.raises(FeatureError, match=r"length_range\.prompt must be two numbers"):
        LengthRange.from_doc({"prompt": ["a", 2], "output": [3, 4]})
    with pytest.raises(FeatureError, match=r"LengthRange\.prompt must be finite"):
        LengthRange(prompt=(5.0, 1.0), output=(1.0, 2.0))
    with pytest.raises(FeatureError, match="must be an object"):
        LengthRange.from_doc([1, 2])


def test_inside_the_range_the_guard_changes_nothing() -> None:
    x, mask = rate_series(2, 40, 1)
    times = T0_S + np.arange(40.0)
    guarded = _forecaster(3).predict_sequence(x, mask, times)
    plain = _forecaster(3, None).predict_sequence(x, mask, times)
    np.testing.assert_array_equal(guarded.totals, plain.totals)
    np.testing.assert_array_equal(guarded.burst_prob, plain.burst_prob)


def test_outside_the_range_the_network_sees_arrivals_only_and_tokens_follow_arrivals() -> None:
    x, mask = rate_series(2, 40, 2, prompt=9000.0)  # prompts beyond the range's 4,000
    times = T0_S + np.arange(40.0)
    guarded = _forecaster(4).predict_sequence(x, mask, times)
    lens = length_series(x, mask, CHANNELS)
    outside = RANGE.outside(lens)
    unknown = ~np.isfinite(lens).all(axis=-1)
    assert outside[:, 5:].all() and unknown[:, 0].all() and not outside[unknown].any()
    hidden = _forecaster(4, None).predict_sequence(x, guarded_mask(mask, outside, CHANNELS), times)
    for q in (0.5, 0.9):
        np.testing.assert_allclose(guarded.get("arrivals", q), hidden.get("arrivals", q), rtol=1e-6)
        arr = guarded.get("arrivals", q)
        for target, col in (("prompt_tokens", 0), ("gen_tokens", 1)):
            got = guarded.get(target, q)
            np.testing.assert_allclose(got[outside], (arr * lens[..., col])[outside], rtol=1e-9)
            np.testing.assert_allclose(got[~outside], hidden.get(target, q)[~outside], rtol=1e-6)


def test_streaming_numpy_equals_predict_sequence_with_the_guard_and_node_churn(tmp_path: Path) -> None:
    f = _forecaster(5)
    path = tmp_path / "g.safetensors"
    save_checkpoint(path, f.net, f.schema, f.normalizer, 5.0, {"length_range": RANGE.to_doc()})
    torch_f = LearnedForecaster.load(path)
    assert torch_f.length_range == RANGE
    numpy_f = NumpyLearnedForecaster.load(path, dtype=np.float64)
    assert numpy_f.length_range == RANGE
    x, mask = rate_series(3, 40, 6, drop=0.2)
    x[1, :, P] *= 12.0  # node b: prompts ~9,600 tokens, outside
    times = T0_S + np.arange(40.0)
    seq = torch_f.predict_sequence(x, mask, times)
    # at step 17 the node set changes; b keeps its trailing lengths
    for t, out, rows in step_with_churn(numpy_f, x, mask, 17, ["c", "x", "b", "a"]):
        for name, got, q in (
            ("arrivals", out.arrivals_p50, 0.5),
            ("prompt_tokens", out.prompt_tokens_p90, 0.9),
            ("gen_tokens", out.gen_tokens_p50, 0.5),
        ):
            np.testing.assert_allclose(
                got[rows], seq.get(name, q)[:, t], rtol=1e-5, atol=1e-6, err_msg=f"{name} t={t}"
            )


def test_training_length_range_takes_the_quantiles_of_known_trailing_lengths() -> None:
    short = rate_series(1, 300, 7, prompt=500.0, output=100.0, drop=0.0)
    long_ = rate_series(1, 300, 8, prompt=3000.0, output=400.0, drop=0.0)
    got = training_length_range([(short[0][0], short[1][0]), (long_[0][0], long_[1][0])], CHANNELS)
    assert got is not None
    # the bounds come from the trailing means (a 10-request mean is noisy early on): near each series' mean
    assert 300 < got.prompt[0] < 500 < 3000 < got.prompt[1] < 4500
    assert 50 < got.output[0] < 100 < 400 < got.output[1] < 700
    empty = np.zeros((5, len(CHANNELS))), np.zeros((5, len(CHANNELS)), dtype=bool)
    assert training_length_range([empty], CHANNELS) is None


def test_the_shipped_checkpoint_records_the_range_its_recipe_gives() -> None:
    from training.length_range import recipe_length_range

    meta = read_metadata(SHIPPED)["meta"]
    recorded = length_range_of(meta)
    assert recorded is not None
    assert recorded.prompt[0] < 200 and 5000 < recorded.prompt[1] < 6500  # Azure code + conv x 0.5-2
    rebuilt = recipe_length_range(meta)
    assert rebuilt is not None
    np.testing.assert_allclose(rebuilt.prompt, recorded.prompt, rtol=1e-9)
    np.testing.assert_allclose(rebuilt.output, recorded.output, rtol=1e-9)


def test_writing_the_range_keeps_the_weights_and_the_model_version(tmp_path: Path) -> None:
    from training.length_range import RecipeError, main, recipe_length_range, write_length_range

    f = _forecaster(6, None)
    path = tmp_path / "old.safetensors"
    version = save_checkpoint(path, f.net, f.schema, f.normalizer, 5.0, {"note": "before the guard"})
    before = read_checkpoint(path)
    assert before.meta.get("length_range") is None and LearnedForecaster.load(path).length_range is None
    write_length_range(path, RANGE)
    after = read_checkpoint(path)
    assert after.model_version == version and after.meta["note"] == "before the guard"
    assert all(np.array_equal(before.weights[k], after.weights[k]) for k in before.weights)
    assert LearnedForecaster.load(path).length_range == RANGE
    with pytest.raises(RecipeError, match="does not hold a recipe"):
        recipe_length_range({"note": "x"})
    replay = {**read_metadata(SHIPPED)["meta"], "sources": [{"kind": "replay", "source": "mmpp"}]}
    with pytest.raises(RecipeError, match=r"'replay'.*refit it"):
        recipe_length_range(replay)
    assert main([str(path)]) == 2  # its meta has no recipe: an error, nothing written
    copy = tmp_path / "shipped.safetensors"
    shutil.copy(SHIPPED, copy)
    assert main([str(copy)]) == 0
