"""Forecaster checkpoints: one safetensors file, weights plus JSON metadata embedded in its header.

The header's ``__metadata__`` holds one key, ``pdscale``, whose value is a JSON document::

    {"format": "pdscale-forecaster", "format_version": 1, "model_version": "...",
     "horizon_s": 5.0, "schema": {...FeatureSchema...}, "normalizer": {...Normalizer...},
     "net": {...NetConfig...}, "meta": {...training-data summary, free-form...},
     "code_version": {"pdscale": "0.1.0", "git_commit": "..." | null}}

``safetensors`` never unpickles, so loading an untrusted file cannot run code. Every failure to load is a
:class:`CheckpointError` whose message starts with the file's path.

Reading and every check (:func:`read_checkpoint`) use numpy only, so the controller, which runs the network
with ``forecaster.inference``, never imports torch; :func:`load_checkpoint` (training, export, evaluate) builds
the torch network from what it read, and :func:`save_checkpoint` needs torch too (both import it when called).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open

from forecaster.features import FeatureError, FeatureSchema, Normalizer
from forecaster.netconfig import NetConfig, parameter_shapes

if TYPE_CHECKING:
    import torch

    from forecaster.network import LstmAttentionNet

CHECKPOINT_FORMAT = "pdscale-forecaster"
CHECKPOINT_FORMAT_VERSION = 1
_META_KEY = "pdscale"


class CheckpointError(Exception):
    """A checkpoint that cannot be used: missing, corrupt, or not matching what the caller expects."""


@dataclass(frozen=True, eq=False)
class CheckpointInfo:
    """What a checked checkpoint says besides its weights (shared by :class:`CheckpointData` and
    :class:`LoadedCheckpoint`)."""

    path: Path
    schema: FeatureSchema
    normalizer: Normalizer
    horizon_s: float
    net_config: NetConfig
    model_version: str
    meta: dict[str, Any] = field(default_factory=dict)
    code_version: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class CheckpointData(CheckpointInfo):
    """A checked checkpoint without torch: ``weights`` are float32 numpy arrays named as in the network's
    ``state_dict``, their shapes those ``net_config`` implies (:func:`forecaster.netconfig.parameter_shapes`)."""

    weights: dict[str, np.ndarray] = field(kw_only=True)


@dataclass(frozen=True, eq=False)
class LoadedCheckpoint(CheckpointInfo):
    """A checkpoint ready for inference: ``net`` is in eval mode, float32, on the CPU."""

    net: LstmAttentionNet = field(kw_only=True)


def code_version() -> dict[str, Any]:
    """The installed pdscale version and, when this checkout is a git repository, its HEAD commit."""
    try:
        version = importlib_metadata.version("pdscale")
    except importlib_metadata.PackageNotFoundError:
        version = "unknown"
    commit: str | None = None
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if res.returncode == 0:
            commit = res.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"pdscale": version, "git_commit": commit}


def _weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(
    path: str | Path,
    net: LstmAttentionNet,
    schema: FeatureSchema,
    normalizer: Normalizer,
    horizon_s: float,
    meta: Mapping[str, Any] | None = None,
    *,
    model_version: str | None = None,
    code: Mapping[str, Any] | None = None,
) -> str:
    """Write ``net``'s weights and everything needed to use them; returns the model version.

    ``meta`` is a free-form, JSON-serialisable summary of the training data and run. ``model_version``
    defaults to ``lstm-attn-<first 12 hex of the weights' sha256>`` (stable for the same weights);
    ``code`` defaults to :func:`code_version`. Raises :class:`CheckpointError` when the parts disagree.
    """
    from safetensors.torch import save_file

    path = Path(path)
    cfg = net.config
    problems = []
    if cfg.n_inputs != schema.n_inputs:
        problems.append(f"network n_inputs {cfg.n_inputs} != schema inputs {schema.n_inputs}")
    if cfg.n_targets != len(schema.targets):
        problems.append(f"network n_targets {cfg.n_targets} != schema targets {len(schema.targets)}")
    if normalizer.channels != schema.channels or normalizer.targets != schema.targets:
        problems.append("normalizer channels/targets differ from the schema's")
    if not (horizon_s > 0 and math.isfinite(horizon_s)):
        problems.append(f"horizon_s must be positive, got {horizon_s}")
    if problems:
        raise CheckpointError(f"{path}: refusing to save: " + "; ".join(problems))
    import torch

    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in net.state_dict().items()}
    version = model_version or f"lstm-attn-{_weights_digest(tensors)[:12]}"
    doc = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "model_version": version,
        "horizon_s": float(horizon_s),
        "schema": schema.to_dict(),
        "normalizer": normalizer.to_dict(),
        "net": cfg.to_dict(),
        "meta": dict(meta or {}),
        "code_version": dict(code) if code is not None else code_version(),
    }
    try:
        header = json.dumps(doc, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: metadata is not plain JSON ({e})") from e
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={_META_KEY: header})
    tmp.chmod(0o644)  # safetensors creates 0600; a shipped checkpoint is read by other users
    tmp.replace(path)  # atomic: a reader never sees half a file
    return version


def update_meta(path: str | Path, updates: Mapping[str, Any]) -> None:
    """Rewrite the checkpoint at ``path`` with ``updates`` merged into its ``meta`` (the training summary);
    the tensors, ``model_version`` and every other field are unchanged. Atomic, as :func:`save_checkpoint`."""
    from safetensors.numpy import save_file

    path = Path(path)
    doc, tensors = _read(path, weights=True)
    doc["meta"] = {**dict(doc.get("meta") or {}), **updates}
    try:
        header = json.dumps(doc, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: metadata is not plain JSON ({e})") from e
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={_META_KEY: header})
    tmp.chmod(0o644)
    tmp.replace(path)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The checkpoint's metadata document without loading the weights."""
    path = Path(path)
    doc, _ = _read(path, weights=False)
    return doc


def _read(path: Path, *, weights: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    tensors: dict[str, np.ndarray] = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            header = (f.metadata() or {}).get(_META_KEY)
            if weights:
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as e:  # safetensors raises its own error types and OSError for bad headers / truncation
        raise CheckpointError(
            f"{path}: not a readable safetensors checkpoint (corrupt or truncated?): {e}"
        ) from e
    if header is None:
        raise CheckpointError(
            f"{path}: safetensors file without pdscale metadata (not a forecaster checkpoint)"
        )
    try:
        doc = json.loads(header)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: metadata is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: metadata 'format' is not {CHECKPOINT_FORMAT!r}")
    if doc.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format_version {doc.get('format_version')!r}, this code reads "
            f"{CHECKPOINT_FORMAT_VERSION}"
        )
    missing = [k for k in ("model_version", "horizon_s", "schema", "normalizer", "net") if k not in doc]
    if missing:
        raise CheckpointError(f"{path}: metadata lacks field(s) {missing}")
    return doc, tensors


def read_checkpoint(path: str | Path, expect_schema: FeatureSchema | None = None) -> CheckpointData:
    """Read and check a checkpoint with numpy only (no torch).

    Raises :class:`CheckpointError` naming the file when it is missing, corrupt or truncated, when its
    schema differs from ``expect_schema`` (listing every difference), or when the stored hyper-parameters
    do not match the weights' shapes (listing the mismatching tensors).
    """
    path = Path(path)
    doc, tensors = _read(path, weights=True)
    try:
        schema = FeatureSchema.from_dict(doc["schema"])
        normalizer = Normalizer.from_dict(doc["normalizer"])
        cfg = NetConfig.from_dict(doc["net"])
    except (FeatureError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid metadata: {e}") from e
    if expect_schema is not None:
        diffs = expect_schema.diff(schema)
        if diffs:
            raise CheckpointError(
                f"{path}: feature schema differs from the expected one (expected → checkpoint): "
                + "; ".join(diffs)
            )
    if cfg.n_inputs != schema.n_inputs:
        raise CheckpointError(f"{path}: net n_inputs {cfg.n_inputs} != schema's {schema.n_inputs} inputs")
    expected = parameter_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    problems = [f"{k}: missing" for k in sorted(set(expected) - set(got))]
    problems += [f"{k}: unexpected tensor" for k in sorted(set(got) - set(expected))]
    problems += [
        f"{k}: weights {got[k]} but hyper-parameters {cfg.to_dict()} imply {expected[k]}"
        for k in sorted(set(expected) & set(got))
        if expected[k] != got[k]
    ]
    if problems:
        raise CheckpointError(
            f"{path}: weights do not match the stored hyper-parameters: " + "; ".join(problems)
        )
    return CheckpointData(
        path=path,
        weights={k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
        schema=schema,
        normalizer=normalizer,
        horizon_s=float(doc["horizon_s"]),
        net_config=cfg,
        model_version=str(doc["model_version"]),
        meta=dict(doc.get("meta") or {}),
        code_version=dict(doc.get("code_version") or {}),
    )


def load_checkpoint(path: str | Path, expect_schema: FeatureSchema | None = None) -> LoadedCheckpoint:
    """Load a checkpoint for inference with torch: :func:`read_checkpoint` (every check, the same errors),
    then the network built from its hyper-parameters and weights (imports torch)."""
    import torch

    from forecaster.network import LstmAttentionNet

    data = read_checkpoint(path, expect_schema)
    net = LstmAttentionNet.from_config(data.net_config)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in data.weights.items()}, strict=True)
    net.eval()
    info = {f.name: getattr(data, f.name) for f in fields(CheckpointInfo)}
    return LoadedCheckpoint(net=net, **info)
