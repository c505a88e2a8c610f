"""The length guard as the controller loads it (ControllerConfig.forecaster_length_guard, forecaster/lengths.py)."""

from __future__ import annotations

import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.daemon import load_forecaster
from controller.forecasting import ChannelSubset, load_default_forecaster, without_length_guard
from forecaster.baselines import Holt
from forecaster.inference import NumpyLearnedForecaster
from forecaster.types import CHANNELS


def _long_prompts(t: int = 80) -> tuple[np.ndarray, np.ndarray]:
    x = np.full((t, 1, len(CHANNELS)), np.nan)
    x[:, 0, CHANNELS.index("arrival_rps")] = 4.0
    x[:, 0, CHANNELS.index("prompt_tps")] = 4.0 * 15_000  # Mooncake-like prompts, outside the shipped range
    x[:, 0, CHANNELS.index("gen_tps")] = 4.0 * 200
    return x, np.isfinite(x)


def _learned(f: object) -> NumpyLearnedForecaster:
    """The network inside what the controller loads (the shipped model is trained on 3 channels: a subset)."""
    inner = f.inner if isinstance(f, ChannelSubset) else f
    assert isinstance(inner, NumpyLearnedForecaster)
    return inner


def test_the_shipped_checkpoint_loads_guarded_and_the_switch_turns_it_off() -> None:
    assert ControllerConfig().forecaster_length_guard is True
    guarded = load_default_forecaster()
    assert _learned(guarded).length_range is not None
    plain = load_default_forecaster(length_guard=False)
    assert _learned(plain).length_range is None
    f, why = load_forecaster(None, length_guard=False)
    assert why is None and _learned(f).length_range is None
    x, mask = _long_prompts()
    guarded.reset(["pool"])
    plain.reset(["pool"])
    for t in range(len(x)):
        g = guarded.step(x[t], mask[t], now_s=1.7e9 + t)
        p = plain.step(x[t], mask[t], now_s=1.7e9 + t)
    # after 10 requests the pool is outside the range: its token forecasts follow its arrivals x 15,000
    np.testing.assert_allclose(g.prompt_tokens_p90, g.arrivals_p90 * 15_000, rtol=1e-9)
    np.testing.assert_allclose(g.gen_tokens_p50, g.arrivals_p50 * 200, rtol=1e-9)
    assert not np.allclose(p.arrivals_p50, g.arrivals_p50)  # the unguarded network reads the token rates


def test_without_length_guard_reaches_inside_a_channel_subset_and_leaves_baselines_alone() -> None:
    learned = _learned(load_default_forecaster())
    assert learned.length_range is not None
    without_length_guard(ChannelSubset(learned, CHANNELS[:3]))
    assert learned.length_range is None
    holt = Holt()
    without_length_guard(holt)  # no guard to switch off: nothing happens
    assert not hasattr(holt, "length_range")


@pytest.mark.parametrize("value", ["maybe", 3])
def test_the_config_field_rejects_non_booleans(value: object) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="forecaster_length_guard"):
        ControllerConfig.model_validate({"forecaster_length_guard": value})
