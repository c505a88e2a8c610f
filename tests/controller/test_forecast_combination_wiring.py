"""The online forecast combination in the controller: ``forecaster_combination`` and ``with_combination``."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.forecasting import (
    DEFAULT_CHECKPOINT,
    combination_config,
    load_default_forecaster,
    with_combination,
    with_onset_detector,
)
from forecaster.baselines import EWMA, Holt
from forecaster.combination import CombinationConfig, CombinedForecaster
from forecaster.types import CHANNELS

NO_CKPT = Path("/nonexistent/model.safetensors")


def test_the_config_and_the_loader_default_agree() -> None:
    default = inspect.signature(load_default_forecaster).parameters["combination"].default
    assert ControllerConfig().forecaster_combination == default == "off"


def test_the_modes_name_what_is_combined() -> None:
    assert combination_config("off") is None
    assert combination_config("all") == CombinationConfig()
    assert combination_config("arrivals") == CombinationConfig(targets=("arrivals",))
    with pytest.raises(ValueError, match="forecaster_combination"):
        ControllerConfig.model_validate({"forecaster_combination": "on"})


def test_baselines_and_wrapped_forecasters_are_left_alone() -> None:
    holt = load_default_forecaster(NO_CKPT, combination="all")  # the fallback: nothing to combine
    assert isinstance(holt, Holt)
    assert with_combination(EWMA()).name == "ewma"
    boosted = with_onset_detector(Holt())
    assert with_combination(boosted) is boosted


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no shipped checkpoint")
def test_the_shipped_checkpoint_runs_inside_the_combination_when_asked() -> None:
    pytest.importorskip("torch")
    plain = load_default_forecaster()
    combined = load_default_forecaster(combination="all")
    assert not isinstance(plain, CombinedForecaster)
    assert isinstance(combined, CombinedForecaster) and combined.name == f"{plain.name}+combination"
    assert with_combination(combined) is combined
    both = load_default_forecaster(combination="all", burst_detector=True)
    assert both.name == f"{plain.name}+combination+onset"
    # one pool, 2 req/s: a forecast every tick, the network's burst probability untouched
    combined.reset(["pool"])
    plain.reset(["pool"])
    x = np.zeros((1, len(CHANNELS)))
    x[0, CHANNELS.index("arrival_rps")] = 2.0
    mask = np.zeros_like(x, dtype=bool)
    mask[0, CHANNELS.index("arrival_rps")] = True
    for t in range(20):
        a = combined.step(x, mask, now_s=1.7e9 + t)
        b = plain.step(x, mask, now_s=1.7e9 + t)
        assert np.isfinite(a.arrivals_p90[0]) and a.burst_prob[0] == pytest.approx(b.burst_prob[0])
