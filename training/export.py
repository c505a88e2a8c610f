"""Lightning ``.ckpt`` (from ``train-forecaster fit``) → the small inference checkpoint (safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_NET_PREFIX = "net."


def export_lightning_checkpoint(ckpt: str | Path, out: str | Path) -> str:
    """Rebuild the network from a ``.ckpt`` and write it with ``save_checkpoint``; return the model version.

    Raises ``ValueError`` naming the file when it is not a ``fit`` checkpoint (missing hyper-parameters,
    or weights that do not match them).
    """
    import torch

    from forecaster.checkpoint import save_checkpoint
    from forecaster.network import LstmAttentionNet, NetConfig
    from training.fit import normalizer_from_extra

    path = Path(ckpt)
    if not path.is_file():
        raise ValueError(f"{path}: no such Lightning checkpoint")
    try:
        doc: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises pickle / zip errors of several types
        raise ValueError(f"{path}: not a readable Lightning checkpoint: {e}") from e
    hparams = doc.get("hyper_parameters")
    state = doc.get("state_dict")
    if not isinstance(hparams, dict) or not isinstance(state, dict) or "net_config" not in hparams:
        raise ValueError(
            f"{path}: no hyper_parameters.net_config / state_dict: not written by train-forecaster fit"
        )
    try:
        schema, normalizer, horizon_s = normalizer_from_extra(dict(hparams.get("extra") or {}))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    net = LstmAttentionNet.from_config(NetConfig.from_dict(hparams["net_config"]))
    weights = {k[len(_NET_PREFIX) :]: v for k, v in state.items() if k.startswith(_NET_PREFIX)}
    try:
        net.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: weights do not match the stored net_config: {e}") from e
    meta = dict((hparams.get("extra") or {}).get("summary") or {})
    meta["exported_from"] = str(path)
    return save_checkpoint(out, net.float(), schema, normalizer, horizon_s, meta)
