"""Record the length guard's range in a checkpoint made before the guard existed.

``train-forecaster fit`` writes ``meta.length_range`` itself (``training.fit.build_series``: the range of the
trailing mean prompt and output lengths over its training series, ``forecaster.lengths``). A checkpoint from
an older fit has none and runs unguarded. This rebuilds its training series from the recipe its metadata
records (the trace files, checked by sha256; the augmentation, labels, synthetic traffic and seed) exactly
as ``fit`` builds them, and writes the range into its metadata. The weights and ``model_version`` are not
touched (the file is rewritten with the same tensors).

    python -m training.length_range forecaster/checkpoints/default.safetensors            # print the range
    python -m training.length_range forecaster/checkpoints/default.safetensors --write    # and record it

Only trace and synthetic sources can be rebuilt: a checkpoint trained on Prometheus history or replays is
refused with the source named (refit it instead; the new fit records its range).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from forecaster.checkpoint import CheckpointError, read_metadata, update_meta
from forecaster.lengths import LengthRange, training_length_range
from forecaster.types import CHANNELS

ROOT = Path(__file__).resolve().parents[1]


class RecipeError(ValueError):
    """A checkpoint whose training series cannot be rebuilt from its metadata; the message says why."""


def _fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()}


def recipe_length_range(meta: dict[str, Any], root: Path = ROOT) -> LengthRange | None:
    """The range ``fit`` would have recorded: the checkpoint's training series rebuilt from ``meta``."""
    from serving.workload.readers import read_trace
    from training.augment import MaskingConfig
    from training.cli import _synthetic_fn
    from training.data import sha256_file
    from training.fit import AugmentConfig, LabelConfig, TraceSource, build_series

    try:
        aug, labels, seed = dict(meta["augment"]), dict(meta["labels"]), int(meta["seed"])
        sources = list(meta["sources"])
        # the summary is asdict(AugmentConfig), its tuples written as JSON lists: read it back the same way
        masking = MaskingConfig(**_fields(aug.pop("masking", {})))
        augment = AugmentConfig(**_fields(aug), masking=masking)
        label_config = LabelConfig(**labels)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecipeError(
            f"the checkpoint's meta does not hold a recipe this code reads ({exc}): refit it"
        ) from exc
    traces: list[TraceSource] = []
    synthetic = None
    for src in sources:
        kind = src.get("kind")
        if kind == "trace":
            path = Path(src["source"])
            path = path if path.is_absolute() else root / path
            if not path.exists():
                raise RecipeError(f"training trace {src['source']} is not at {path}")
            digest = sha256_file(path)
            if src.get("sha256") and digest != src["sha256"]:
                raise RecipeError(
                    f"training trace {path}: sha256 {digest} is not the recorded {src['sha256']}"
                )
            traces.append(TraceSource(str(src["source"]), read_trace(path), digest))
        elif kind == "synthetic":
            rates = src.get("rate_range")
            synthetic = _synthetic_fn(
                str(src.get("shapes", "mmpp")), None if rates is None else (float(rates[0]), float(rates[1]))
            )
        else:
            raise RecipeError(f"source kind {kind!r} ({src.get('source', '?')}) cannot be rebuilt: refit it")
    series = build_series(traces, labels=label_config, augment=augment, synthetic=synthetic, seed=seed)
    return training_length_range([(s.x_raw, np.isfinite(s.x_raw)) for s in series.train], CHANNELS)


def write_length_range(path: Path, lengths: LengthRange) -> None:
    """Rewrite ``path`` with ``meta.length_range`` set; tensors and every other field unchanged."""
    update_meta(path, {"length_range": lengths.to_doc()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--write", action="store_true", help="record the range in the checkpoint's metadata")
    args = ap.parse_args(argv)
    try:
        meta = read_metadata(args.checkpoint).get("meta", {})
        lengths = recipe_length_range(meta)
    except (CheckpointError, RecipeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if lengths is None:
        print(f"error: {args.checkpoint}: no training series has known token lengths", file=sys.stderr)
        return 2
    print(json.dumps(lengths.to_doc()))
    if args.write:
        write_length_range(args.checkpoint, lengths)
        print(f"wrote meta.length_range to {args.checkpoint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
