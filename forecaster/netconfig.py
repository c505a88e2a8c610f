"""The network's hyper-parameters and the shapes of the weights they imply (no torch here).

Shared by the torch model (``forecaster.network``), the torch-free inference (``forecaster.inference``) and the
checkpoint reader (``forecaster.checkpoint``), so a checkpoint is checked against one definition of its
tensors whether or not torch is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NetConfig:
    """Hyper-parameters of :class:`LstmAttentionNet` (stored in checkpoints)."""

    n_inputs: int
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    window: int = 60
    n_targets: int = 3
    quantiles: tuple[float, ...] = (0.5, 0.9)
    #: Baseline skip (see :class:`LstmAttentionNet`): half-lives (steps) of the EWMAs of the inputs
    #: ``baseline_inputs`` (one encoded-input column per target) whose learned affine map is added to every
    #: quantile, so the network learns a correction to a smoothed level. Empty = off (older checkpoints).
    baseline_halflives: tuple[float, ...] = ()
    baseline_inputs: tuple[int, ...] = ()
    #: For each of ``baseline_inputs``, the encoded column of its mask (1 = observed), or -1: no mask.
    baseline_masks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        for name in ("n_inputs", "hidden", "layers", "heads", "window", "n_targets"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.baseline_halflives:
            if any(not (h > 0 and math.isfinite(h)) for h in self.baseline_halflives):
                problems.append(
                    f"baseline_halflives must be positive steps, got {list(self.baseline_halflives)}"
                )
            if len(self.baseline_inputs) != self.n_targets or len(self.baseline_masks) != self.n_targets:
                problems.append(
                    f"baseline_inputs {list(self.baseline_inputs)} and baseline_masks "
                    f"{list(self.baseline_masks)} need one entry per target ({self.n_targets})"
                )
            cols = [*self.baseline_inputs, *(m for m in self.baseline_masks if m != -1)]
            if any(not 0 <= c < self.n_inputs for c in cols):
                problems.append(
                    f"baseline input/mask columns {cols} must lie in [0, n_inputs={self.n_inputs})"
                )
        elif self.baseline_inputs or self.baseline_masks:
            problems.append("baseline_inputs / baseline_masks given without baseline_halflives")
        if self.hidden % max(self.heads, 1):
            problems.append(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        q = list(self.quantiles)
        if not q or any(not 0 < v < 1 for v in q) or q != sorted(set(q)):
            problems.append(f"quantiles must be strictly increasing values in (0, 1), got {q}")
        if problems:
            raise ValueError("NetConfig: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_inputs": self.n_inputs,
            "hidden": self.hidden,
            "layers": self.layers,
            "heads": self.heads,
            "window": self.window,
            "n_targets": self.n_targets,
            "quantiles": list(self.quantiles),
            **(
                {
                    "baseline_halflives": list(self.baseline_halflives),
                    "baseline_inputs": list(self.baseline_inputs),
                    "baseline_masks": list(self.baseline_masks),
                }
                if self.baseline_halflives
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NetConfig:
        ints = {"n_inputs", "hidden", "layers", "heads", "window", "n_targets"}
        known = ints | {"quantiles", "baseline_halflives", "baseline_inputs", "baseline_masks"}
        unknown = sorted(set(d) - known)
        if unknown or "n_inputs" not in d:
            raise ValueError(
                f"NetConfig dict: unknown field(s) {unknown}, or missing 'n_inputs' (got {sorted(d)})"
            )
        kw: dict[str, Any] = {k: int(v) for k, v in d.items() if k in ints}
        for k in ("quantiles", "baseline_halflives"):
            if k in d:
                kw[k] = tuple(float(v) for v in d[k])
        for k in ("baseline_inputs", "baseline_masks"):
            if k in d:
                kw[k] = tuple(int(v) for v in d[k])
        return cls(**kw)


def parameter_shapes(cfg: NetConfig) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor ``LstmAttentionNet.from_config(cfg).state_dict()`` holds (a test checks
    the two agree for every option), so a checkpoint's weights are checked without building the network."""
    h, g = cfg.hidden, 4 * cfg.hidden  # PyTorch's LSTM stacks the gates i, f, g, o
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(cfg.layers):
        shapes[f"lstm.weight_ih_l{layer}"] = (g, cfg.n_inputs if layer == 0 else h)
        shapes[f"lstm.weight_hh_l{layer}"] = (g, h)
        shapes[f"lstm.bias_ih_l{layer}"] = (g,)
        shapes[f"lstm.bias_hh_l{layer}"] = (g,)
    for name, n_in, n_out in (
        ("q_proj", h, h),
        ("k_proj", h, h),
        ("v_proj", h, h),
        ("o_proj", h, h),
        ("trunk.0", 2 * h, h),
        ("quantile_head", h, cfg.n_targets * len(cfg.quantiles)),
        ("burst_head", h, 1),
    ):
        shapes[f"{name}.weight"] = (n_out, n_in)
        shapes[f"{name}.bias"] = (n_out,)
    if cfg.baseline_halflives:
        shapes["baseline_weight"] = (cfg.n_targets, len(cfg.baseline_halflives))
        shapes["baseline_bias"] = (cfg.n_targets,)
    return shapes
