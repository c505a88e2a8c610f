"""The targets' horizon travels with the series (a level-relative data module cannot train on totals over
another horizon than it decodes with), and ``--token-range`` reaches the augmented copies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forecaster.features import DEFAULT_SCHEMA, LEVEL_SCHEMA
from serving.workload.synthetic import SyntheticParams, generate
from serving.workload.trace import Trace
from training.data import NodeSeries, node_series_from_trace
from training.datamodule import (
    DEFAULT_HORIZON_S,
    ForecastDataModule,
    SequenceDataset,
    fit_normalizer,
    resolve_horizon,
)
from training.fit import AugmentConfig, LabelConfig, augmented_copies

TRACE = generate(SyntheticParams(duration_s=300, rate_rps=4, burst_multiplier=3), seed=5)


def _series(horizon_s: int, name: str = "t") -> NodeSeries:
    lab = LabelConfig(horizon_s=horizon_s)
    return node_series_from_trace(
        name, TRACE, t0_s=0.0, t1_s=300.0, horizon_s=horizon_s, onsets=lab.onsets, lead_s=3, after_s=2
    )


def test_series_remember_their_horizon_and_the_module_takes_it() -> None:
    s = _series(3)
    assert s.horizon_s == 3.0
    nz = fit_normalizer([s], LEVEL_SCHEMA)
    dm = ForecastDataModule([s], [], nz, schema=LEVEL_SCHEMA)
    assert dm.horizon_s == 3.0
    assert dm.train_dataset(0).horizon_s == 3.0
    ds = SequenceDataset([s], np.array([[0, 0]]), seq_len=32, normalizer=nz, schema=LEVEL_SCHEMA)
    assert ds.horizon_s == 3.0


@pytest.mark.parametrize("where", ["module", "dataset", "normalizer"])
def test_a_mismatched_horizon_is_an_error_naming_both(where: str) -> None:
    s = _series(3, "code#1")
    nz = fit_normalizer([s], LEVEL_SCHEMA, horizon_s=3.0)
    with pytest.raises(ValueError, match=r"horizon_s=5 but the series' targets are totals over 3 s.*code#1"):
        if where == "module":
            ForecastDataModule([s], [], nz, schema=LEVEL_SCHEMA, horizon_s=5.0)
        elif where == "dataset":
            SequenceDataset(
                [s], np.array([[0, 0]]), seq_len=32, normalizer=nz, schema=LEVEL_SCHEMA, horizon_s=5.0
            )
        else:
            fit_normalizer([s], LEVEL_SCHEMA, horizon_s=5.0)


def test_mixed_horizons_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"different horizons: 3 s \(e.g. 'a'\), 5 s \(e.g. 'b'\)"):
        resolve_horizon([_series(3, "a"), _series(5, "b")], None, LEVEL_SCHEMA, "here")


def test_unknown_horizon_needs_one_only_for_level_relative_schemas() -> None:
    s = _series(5)
    bare = NodeSeries("bare", s.x_raw, s.totals, s.burst)  # built by hand: horizon unknown
    with pytest.raises(ValueError, match="level-relative schema needs the targets' horizon"):
        resolve_horizon([bare], None, LEVEL_SCHEMA, "fit_normalizer")
    assert resolve_horizon([bare], None, DEFAULT_SCHEMA, "x") == DEFAULT_HORIZON_S
    assert resolve_horizon([bare], 4.0, LEVEL_SCHEMA, "x") == 4.0


def test_token_range_bounds_the_augmented_token_lengths() -> None:
    part = TRACE
    cfg = AugmentConfig(copies_per_source=40, token_range=(0.25, 8.0), superpose_prob=0.0)
    copies = augmented_copies([part], cfg, np.random.default_rng(0))
    factors = []
    for desc, t in copies:
        p_fac, o_fac = (float(v) for v in desc.split("tokens=")[1].split()[0].split("/"))
        assert 0.25 - 5e-3 <= p_fac <= 8.0 + 5e-3 and 0.25 - 5e-3 <= o_fac <= 8.0 + 5e-3
        factors.append(p_fac)
        assert isinstance(t, Trace)
    # log-uniform over 5 octaves: both ends are reached, far beyond the old x0.5-2
    assert min(factors) < 0.5 and max(factors) > 2.0
    span = math.log(max(factors) / min(factors)) / math.log(32.0)
    assert span > 0.7


def test_token_range_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="token_range"):
        AugmentConfig(token_range=(4.0, 1.0))
