"""Training data: splits by time, augmentation, targets and labels, windows, the data module."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.features import Normalizer
from forecaster.types import CHANNELS
from serving.workload.trace import Trace
from training.augment import (
    MaskingConfig,
    circular_shift,
    drift_tokens,
    mask_channels,
    rate_scale,
    scale_tokens,
    superpose,
    thin,
    time_scale,
)
from training.data import (
    NodeSeries,
    burst_label,
    cut_window,
    node_series_from_trace,
    node_series_from_values,
    split_trace,
    window_starts,
)
from training.datamodule import (
    ForecastDataModule,
    SequenceDataset,
    WindowConfig,
    fit_normalizer,
    random_starts,
)
from training.fit import AugmentConfig, LabelConfig, TraceSource, augmented_copies, build_series


def poisson_trace(rate_rps: float, duration_s: float, seed: int, source: str = "t") -> Trace:
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * duration_s)
    arrival = np.sort(rng.uniform(0, duration_s, n))
    arrival -= arrival[0]
    return Trace.from_arrays(arrival, rng.integers(1, 500, n), rng.integers(1, 50, n), source=source)


def no_onsets(counts: np.ndarray) -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


# -- splits ----------------------------------------------------------------------------------------


def test_split_is_time_ordered_and_disjoint() -> None:
    tr = poisson_trace(5, 1000, 0)
    sp = split_trace(tr, holdout_frac=0.3, val_frac=0.1)
    assert sp.train.arrival_s.max() < sp.cut_val_s <= sp.val.arrival_s.min()
    assert sp.val.arrival_s.max() < sp.cut_test_s <= sp.test.arrival_s.min()
    assert len(sp.train) + len(sp.val) + len(sp.test) == len(tr)
    assert sp.cut_test_s == pytest.approx(tr.duration_s * 0.7)
    assert sp.cut_val_s == pytest.approx(tr.duration_s * 0.6)


@pytest.mark.parametrize(
    ("holdout", "val"), [(-0.1, 0.1), (0.5, 0.5), (1.0, 0.0)], ids=["neg", "sum1", "all"]
)
def test_split_rejects_bad_fractions(holdout: float, val: float) -> None:
    with pytest.raises(ValueError, match="holdout_frac"):
        split_trace(poisson_trace(1, 100, 0), holdout_frac=holdout, val_frac=val)


def test_build_series_never_reads_the_holdout() -> None:
    """Augmented and training series only contain requests from before the validation cut."""
    tr = poisson_trace(4, 1000, 1, source="real")
    # mark the held-out part with huge prompts: any leak shows up in the training series' prompt channel
    sp = split_trace(tr)
    big = np.where(tr.arrival_s >= sp.cut_val_s, 10**9, tr.prompt_tokens)
    marked = Trace.from_arrays(tr.arrival_s, big, tr.output_tokens, source="real")
    out = build_series(
        [TraceSource("real", marked)],
        labels=LabelConfig(),
        augment=AugmentConfig(copies_per_source=4, synthetic_traces=0, token_range=(1.0, 1.0)),
        seed=3,
    )
    prompt = CHANNELS.index("prompt_tps")
    assert len(out.train) == 5
    for s in out.train:
        assert np.nanmax(s.x_raw[:, prompt]) < 1e8, s.name
    # validation does see the validation part (not the test part: the test cut is at 70 %)
    assert np.nanmax(out.val[0].x_raw[:, prompt]) >= 1e9
    assert len(out.val[0]) == pytest.approx(0.1 * tr.duration_s, abs=2)


# -- augmentation ----------------------------------------------------------------------------------


def test_time_scale_changes_rate_not_count() -> None:
    tr = poisson_trace(5, 200, 2)
    fast = time_scale(tr, 2.0)
    assert len(fast) == len(tr)
    assert fast.duration_s == pytest.approx(tr.duration_s / 2)
    np.testing.assert_array_equal(fast.prompt_tokens, tr.prompt_tokens)
    with pytest.raises(ValueError, match="speed"):
        time_scale(tr, 0.0)


@given(factor=st.floats(0.1, 6.0), seed=st.integers(0, 1000))
@settings(max_examples=25, deadline=None)
def test_rate_scale_keeps_order_span_and_scales_count(factor: float, seed: int) -> None:
    tr = poisson_trace(20, 100, seed)
    out = rate_scale(tr, factor, np.random.default_rng(seed))
    assert np.all(np.diff(out.arrival_s) >= 0)
    assert out.arrival_s.min() >= tr.arrival_s.min() - 1e-9
    assert out.arrival_s.max() <= tr.arrival_s.max() + 1.0
    expected = factor * len(tr)
    assert abs(len(out) - expected) < 5 * np.sqrt(expected) + 5


def test_thin_and_superpose() -> None:
    tr = poisson_trace(10, 100, 3)
    rng = np.random.default_rng(0)
    assert len(thin(tr, 0.0, rng)) == 0
    assert len(thin(tr, 1.0, rng)) == len(tr)
    both = superpose([tr, tr], [0.0, 0.5])
    assert len(both) == 2 * len(tr)
    assert np.all(np.diff(both.arrival_s) >= 0)
    with pytest.raises(ValueError, match="offsets"):
        superpose([tr, tr], [0.0])


def test_circular_shift_keeps_the_set_of_gaps() -> None:
    tr = poisson_trace(3, 50, 4)
    shifted = circular_shift(tr, 7.0)
    assert len(shifted) == len(tr)
    assert np.all(np.diff(shifted.arrival_s) >= 0)
    assert sorted(shifted.prompt_tokens.tolist()) == sorted(tr.prompt_tokens.tolist())


def test_scale_tokens() -> None:
    tr = poisson_trace(3, 50, 5)
    out = scale_tokens(tr, 2.0, 0.5)
    np.testing.assert_array_equal(out.prompt_tokens, tr.prompt_tokens * 2)
    assert out.output_tokens.min() >= 1
    with pytest.raises(ValueError, match="prompt_factor"):
        scale_tokens(tr, -1.0, 1.0)


def test_drift_tokens_moves_lengths_slowly_and_leaves_arrivals() -> None:
    tr = poisson_trace(20, 3000, 7)
    tr = Trace.from_arrays(tr.arrival_s, np.full(len(tr), 1000), np.full(len(tr), 100), source="t")
    out = drift_tokens(tr, 0.5, 300.0, np.random.default_rng(1))
    np.testing.assert_array_equal(out.arrival_s, tr.arrival_s)
    lp, lo = np.log(out.prompt_tokens / 1000.0), np.log(out.output_tokens / 100.0)
    assert 0.3 < lp.std() < 0.7 and 0.3 < lo.std() < 0.7  # the stationary law's sigma, roughly (one path)
    assert abs(np.corrcoef(lp, lo)[0, 1]) < 0.5  # prompts and outputs drift apart
    near = np.abs(np.diff(lp)).mean()  # requests 0.05 s apart: almost the same factor
    assert near < 0.05 * lp.std()
    again = drift_tokens(tr, 0.5, 300.0, np.random.default_rng(1))
    np.testing.assert_array_equal(again.prompt_tokens, out.prompt_tokens)
    for bad in ({"sigma": 0.0}, {"timescale_s": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            drift_tokens(tr, **{"sigma": 0.5, "timescale_s": 300.0, **bad}, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="token_drift must be >= 0"):
        AugmentConfig(token_drift=-0.1)


def test_augmented_copies_draw_nothing_more_without_drift() -> None:
    tr = poisson_trace(5, 300, 6)
    plain = augmented_copies([tr], AugmentConfig(copies_per_source=3), np.random.default_rng(0))
    off = augmented_copies(
        [tr], AugmentConfig(copies_per_source=3, token_drift=0.0), np.random.default_rng(0)
    )
    assert [d for d, _ in plain] == [d for d, _ in off]
    on = augmented_copies([tr], AugmentConfig(copies_per_source=3, token_drift=0.5), np.random.default_rng(0))
    assert all("drift=0.5" in d for d, _ in on)
    np.testing.assert_array_equal(on[0][1].arrival_s, plain[0][1].arrival_s)  # the first copy's draws agree
    assert not np.array_equal(on[0][1].prompt_tokens, plain[0][1].prompt_tokens)


def test_mask_channels_hides_without_touching_input() -> None:
    values = np.ones((100, len(CHANNELS)), dtype=np.float32)
    out = mask_channels(values, np.random.default_rng(0), MaskingConfig(channel_prob=1.0, gap_prob=0.0))
    assert np.isnan(out).all()
    assert np.isfinite(values).all()
    gap = mask_channels(values, np.random.default_rng(0), MaskingConfig(channel_prob=0.0, gap_prob=1.0))
    hidden_rows = np.isnan(gap).all(axis=1)
    assert 2 <= hidden_rows.sum() <= 30
    assert not np.isnan(gap[~hidden_rows]).any()


def test_mask_tokens_hides_both_token_channels_together_and_zero_draws_nothing() -> None:
    values = np.arange(200 * len(CHANNELS), dtype=np.float64).reshape(200, len(CHANNELS))
    tokens = [CHANNELS.index("prompt_tps"), CHANNELS.index("gen_tps")]
    for seed in range(20):  # 0: the same hidden channels and gap, and the generator left where it was
        r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
        plain = mask_channels(values, r1, MaskingConfig())
        with_cols = mask_channels(values, r2, MaskingConfig(token_prob=0.0), tokens)
        np.testing.assert_array_equal(plain, with_cols)
        assert r1.random() == r2.random()
    off = MaskingConfig(channel_prob=0.0, gap_prob=0.0)
    always = mask_channels(values, np.random.default_rng(0), MaskingConfig(0.0, 0.0, (2, 30), 1.0), tokens)
    assert np.isnan(always[:, tokens]).all()
    others = [c for c in range(len(CHANNELS)) if c not in tokens]
    np.testing.assert_array_equal(
        always[:, others], mask_channels(values, np.random.default_rng(0), off)[:, others]
    )
    hidden = [
        np.isnan(
            mask_channels(values, np.random.default_rng(s), MaskingConfig(0.0, 0.0, (2, 30), 0.5), tokens)[
                0, tokens
            ]
        ).all()
        for s in range(400)
    ]
    assert 0.42 < np.mean(hidden) < 0.58  # about half the sequences


def test_augmented_copies_differ_from_the_original() -> None:
    tr = poisson_trace(5, 300, 6)
    copies = augmented_copies([tr], AugmentConfig(copies_per_source=5), np.random.default_rng(0))
    assert len(copies) == 5
    assert len({len(t) for _, t in copies}) > 1


# -- targets, labels, windows ----------------------------------------------------------------------


def test_node_series_targets_are_future_totals() -> None:
    arrival = np.array([0.2, 1.5, 1.7, 3.1, 6.0, 9.9])
    tr = Trace.from_arrays(arrival, np.full(6, 10), np.full(6, 2))
    s = node_series_from_trace("t", tr, t0_s=0.0, t1_s=10.0, horizon_s=2, onsets=no_onsets, lead_s=3)
    # per-second counts: [1, 2, 0, 1, 0, 0, 1, 0, 0, 1]; target[t] = counts[t+1] + counts[t+2]
    np.testing.assert_array_equal(s.totals[:8, 0], [2, 1, 1, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(s.totals[:8, 1], 10 * s.totals[:8, 0])
    assert np.isnan(s.totals[8:]).all()
    assert np.isnan(s.burst[8:]).all() and (s.burst[:8] == 0).all()


def test_burst_label_band_around_onsets() -> None:
    lab = burst_label(np.array([10, 40]), 50, lead_s=3, after_s=2)
    np.testing.assert_array_equal(np.flatnonzero(lab), [7, 8, 9, 10, 11, 12, 37, 38, 39, 40, 41, 42])
    edge = burst_label(np.array([0, 49]), 50, lead_s=3, after_s=2)
    np.testing.assert_array_equal(np.flatnonzero(edge), [0, 1, 2, 46, 47, 48, 49])


def test_node_series_uses_the_onset_definition() -> None:
    counts = np.zeros(200)
    counts[150:160] = 20.0
    x = np.full((200, len(CHANNELS)), np.nan)
    x[:, 0], x[:, 1], x[:, 2] = counts, counts * 100, counts * 10
    from forecaster.burst import burst_onsets

    s = node_series_from_values("n", x, horizon_s=5, onsets=lambda c: burst_onsets(c, 5), lead_s=3)
    onsets = burst_onsets(counts, 5)
    assert len(onsets) == 1
    assert s.burst[onsets[0]] == 1.0 and s.burst[onsets[0] - 3] == 1.0 and s.burst[onsets[0] - 4] == 0.0


def test_unknown_inputs_make_targets_unknown() -> None:
    x = np.ones((50, len(CHANNELS)))
    x[20, 0] = np.nan
    s = node_series_from_values("n", x, horizon_s=5, onsets=no_onsets, lead_s=3)
    assert np.isnan(s.totals[15:20, 0]).all()
    assert np.isfinite(s.totals[14, 0]) and np.isfinite(s.totals[20, 0])
    assert np.isnan(s.burst[15:20]).all()


@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=5),
    seq=st.integers(8, 600),
    burn=st.integers(0, 7),
)
@settings(max_examples=50, deadline=None)
def test_validation_windows_score_each_step_once(lengths: list[int], seq: int, burn: int) -> None:
    starts = window_starts(lengths, seq, seq - burn)
    for i, n in enumerate(lengths):
        scored = np.zeros(n + seq, dtype=int)
        for _, s in starts[starts[:, 0] == i]:
            scored[s + burn : s + seq] += 1
        assert (scored[burn:n] == 1).all()


def test_cut_window_pads_with_unknown() -> None:
    s = node_series_from_values("n", np.ones((20, len(CHANNELS))), horizon_s=2, onsets=no_onsets, lead_s=1)
    x, y, b = cut_window(s, 10, 16)
    assert x.shape == (16, len(CHANNELS)) and y.shape == (16, 3) and b.shape == (16,)
    assert np.isnan(x[10:]).all() and np.isnan(y[8:]).all() and np.isnan(b[8:]).all()


def test_node_series_rejects_misaligned_arrays() -> None:
    with pytest.raises(ValueError, match="do not align"):
        NodeSeries("bad", np.zeros((5, len(CHANNELS))), np.zeros((4, 3)), np.zeros(5))


# -- dataset / data module -------------------------------------------------------------------------


def _series(n: int = 3, length: int = 700) -> list[NodeSeries]:
    return [
        node_series_from_trace(
            f"s{i}",
            poisson_trace(3 + i, length, i),
            t0_s=0.0,
            t1_s=float(length),
            horizon_s=5,
            onsets=no_onsets,
            lead_s=3,
        )
        for i in range(n)
    ]


def test_dataset_items_are_encoded_and_reproducible() -> None:
    series = _series()
    norm = fit_normalizer(series)
    starts = random_starts([len(s) for s in series], 128, 4, np.random.default_rng(0))
    ds = SequenceDataset(series, starts, seq_len=128, normalizer=norm, masking=MaskingConfig(), seed=1)
    a, b = ds[2], ds[2]
    assert (
        a["x"].shape == (128, norm_inputs(norm)) and a["y"].shape == (128, 3) and a["burst"].shape == (128,)
    )
    assert a["x"].dtype.is_floating_point
    assert (a["x"] == b["x"]).all()
    # the normalised target decodes back to the raw total
    s_idx, start = starts[2]
    raw = series[s_idx].totals[start : start + 128]
    back = norm.denormalize_targets(a["y"].numpy().astype(np.float64))
    ok = np.isfinite(raw)
    np.testing.assert_allclose(back[ok], raw[ok], rtol=1e-4, atol=1e-3)


def norm_inputs(norm: Normalizer) -> int:
    return 2 * len(norm.channels) + 2


def test_random_starts_stay_inside_series() -> None:
    starts = random_starts([100, 1000], 200, 500, np.random.default_rng(0))
    assert set(starts[:, 0].tolist()) == {0, 1}
    assert (starts[starts[:, 0] == 0, 1] == 0).all()  # shorter than a window: start 0, padded
    assert starts[starts[:, 0] == 1, 1].max() <= 800


def test_datamodule_draws_new_windows_each_epoch() -> None:
    series = _series()
    dm = ForecastDataModule(
        series,
        series[:1],
        fit_normalizer(series),
        WindowConfig(seq_len=64, burn_in=8, batch_size=4, windows_per_epoch=8),
    )
    e0, e0b, e1 = dm.train_dataset(0), dm.train_dataset(0), dm.train_dataset(1)
    np.testing.assert_array_equal(e0.starts, e0b.starts)
    assert not np.array_equal(e0.starts, e1.starts)
    batch = next(iter(dm.val_dataloader()))
    assert batch["x"].shape[1:] == (64, 22)


def test_window_config_validates() -> None:
    with pytest.raises(ValueError, match="burn_in"):
        WindowConfig(seq_len=10, burn_in=10)


def test_metric_frames_become_per_node_series() -> None:
    from forecaster.types import MetricFrame
    from training.fit import FrameSource

    n_t = 1000
    rng = np.random.default_rng(0)
    counts = rng.poisson(4.0, (2, n_t)).astype(np.float64)
    values = np.stack([np.cumsum(counts, axis=1), counts], axis=1)  # [N, M, T]
    frame = MetricFrame(
        node_ids=("a", "b"),
        metrics=("pdscale:router_requests_total", "vllm:num_requests_running"),
        times_s=1.7e9 + np.arange(n_t, dtype=np.float64),
        values=values,
    )
    out = build_series([], [FrameSource("prom", frame)], augment=AugmentConfig(synthetic_traces=0))
    assert [s.name for s in out.train] == ["prom/a", "prom/b"]
    assert [len(s) for s in out.train] == [600, 600] and [len(s) for s in out.val] == [100, 100]
    arr, running = CHANNELS.index("arrival_rps"), CHANNELS.index("running")
    np.testing.assert_array_equal(out.train[1].x_raw[1:, arr], counts[1, 1:600])  # counter → rate
    np.testing.assert_array_equal(out.val[0].x_raw[:, running], counts[0, 600:700])
    assert np.isnan(out.train[0].x_raw[0, arr])  # no rate before the second sample
    assert out.summary["sources"][0]["kind"] == "prometheus"
