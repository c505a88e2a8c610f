"""Synthetic per-node channel series and a stepping loop with node churn, shared by the forecaster tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from forecaster.inference import StreamingBase
from forecaster.types import CHANNELS, ForecastBatch

T0_S = 1.7e9


def rate_series(
    n: int,
    t: int,
    seed: int,
    *,
    rate: float = 5.0,
    prompt: float = 800.0,
    output: float = 200.0,
    drop: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, t, C], mask)``: Poisson arrivals at ``rate``/s, gamma(4) prompt and output lengths of the given
    means, a running count; ``drop`` of the values hidden (NaN, mask False)."""
    rng = np.random.default_rng(seed)
    x = np.full((n, t, len(CHANNELS)), np.nan)
    a = rng.poisson(rate, size=(n, t)).astype(np.float64)
    x[..., CHANNELS.index("arrival_rps")] = a
    x[..., CHANNELS.index("prompt_tps")] = a * rng.gamma(4.0, prompt / 4.0, size=(n, t))
    x[..., CHANNELS.index("gen_tps")] = a * rng.gamma(4.0, output / 4.0, size=(n, t))
    x[..., CHANNELS.index("running")] = rng.gamma(2.0, 3.0, size=(n, t))
    mask = np.isfinite(x) & (rng.random(x.shape) > drop)
    x[~mask] = np.nan
    return x, mask


def step_with_churn(
    f: StreamingBase, x: np.ndarray, mask: np.ndarray, churn_at: int, order: Sequence[str]
) -> Iterator[tuple[int, ForecastBatch, list[int]]]:
    """Step ``f`` through series ``x``/``mask`` of nodes "a", "b", "c", …; at step ``churn_at`` the tracked
    set becomes ``order`` (new nodes get NaN inputs). Yields (step, forecast, the rows of "a", "b", … in it)."""
    names = [chr(ord("a") + i) for i in range(x.shape[0])]
    f.reset(names)
    for t in range(x.shape[1]):
        if t == churn_at:
            f.ensure_nodes(list(order))
        ids = f.node_ids
        rows = [ids.index(k) for k in names]
        xx = np.full((len(ids), len(CHANNELS)), np.nan)
        mm = np.zeros((len(ids), len(CHANNELS)), dtype=bool)
        xx[rows], mm[rows] = x[:, t], mask[:, t]
        yield t, f.step(xx, mm, T0_S + t), rows
