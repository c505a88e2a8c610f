"""Which forecaster the controller runs: the shipped (or configured) checkpoint, else a baseline.

torch is imported only here, and only when a checkpoint is actually loaded: the reactive fallback and
every other policy start without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import forecaster
from forecaster.baselines import Holt
from forecaster.types import Forecaster

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT = Path(forecaster.__file__).parent / "checkpoints" / "default.safetensors"


def load_default_forecaster(path: Path | None = None) -> Forecaster:
    """Load ``path`` (default: the shipped checkpoint). A missing, corrupt or mismatched checkpoint falls
    back to the Holt baseline, logged with the reason — the controller keeps running either way."""
    ckpt = path or DEFAULT_CHECKPOINT
    if not ckpt.exists():
        log.warning("forecaster checkpoint %s not found: falling back to the Holt baseline", ckpt)
        return Holt()
    try:
        from forecaster.checkpoint import CheckpointError
        from forecaster.streaming import LearnedForecaster
    except ImportError as exc:  # torch missing
        log.warning("cannot load the learned forecaster (%s): falling back to the Holt baseline", exc)
        return Holt()
    try:
        return LearnedForecaster.load(ckpt, num_threads=1)
    except (CheckpointError, ValueError) as exc:
        log.warning("forecaster checkpoint %s unusable (%s): falling back to the Holt baseline", ckpt, exc)
        return Holt()
