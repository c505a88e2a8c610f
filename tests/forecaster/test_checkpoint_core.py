"""forecaster.checkpoint: round trip, golden output, and every way a checkpoint can be wrong.

The golden checkpoint ``data/golden_tiny.safetensors`` and its outputs ``data/golden_tiny.json`` are
regenerated only deliberately: ``PDSCALE_REGEN_GOLDEN=1 .venv/bin/pytest tests/forecaster/test_checkpoint_core.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from forecaster.checkpoint import CheckpointError, load_checkpoint, read_metadata, save_checkpoint
from forecaster.features import DEFAULT_SCHEMA, Normalizer, encode_inputs
from forecaster.network import LstmAttentionNet
from forecaster.types import CHANNELS, TARGETS

DATA = Path(__file__).parent / "data"
GOLDEN_CKPT = DATA / "golden_tiny.safetensors"
GOLDEN_OUT = DATA / "golden_tiny.json"


def _tiny_net(seed: int = 0, hidden: int = 8) -> LstmAttentionNet:
    torch.manual_seed(seed)
    return LstmAttentionNet(DEFAULT_SCHEMA.n_inputs, hidden=hidden, layers=2, heads=2, window=4)


def _normalizer() -> Normalizer:
    rng = np.random.default_rng(0)
    x = rng.gamma(2.0, 5.0, size=(2, 100, len(CHANNELS)))
    y = rng.gamma(2.0, 50.0, size=(2, 100, len(TARGETS)))
    return Normalizer.fit(x, np.ones(x.shape, bool), y)


def _golden_input() -> np.ndarray:
    rng = np.random.default_rng(42)
    x = rng.gamma(2.0, 5.0, size=(2, 12, len(CHANNELS)))
    mask = rng.random(x.shape) > 0.2
    x[~mask] = np.nan
    return encode_inputs(x, mask, _normalizer(), 1.7e9 + np.arange(12.0))


def _save(path: Path, net: LstmAttentionNet | None = None) -> str:
    return save_checkpoint(
        path, net or _tiny_net(), DEFAULT_SCHEMA, _normalizer(), 5.0, {"trace": "unit-test", "rows": 12}
    )


def test_golden_output_of_tiny_checkpoint() -> None:
    if os.environ.get("PDSCALE_REGEN_GOLDEN") == "1":
        DATA.mkdir(exist_ok=True)
        net = _tiny_net()
        save_checkpoint(
            GOLDEN_CKPT, net, DEFAULT_SCHEMA, _normalizer(), 5.0, {"purpose": "golden test"},
            model_version="golden-tiny", code={"pdscale": "golden", "git_commit": None},
        )  # fmt: skip
        with torch.no_grad():
            out = net(torch.from_numpy(_golden_input()))
        GOLDEN_OUT.write_text(
            json.dumps({"quantiles": out.quantiles.tolist(), "burst_logit": out.burst_logit.tolist()})
        )
    ckpt = load_checkpoint(GOLDEN_CKPT, expect_schema=DEFAULT_SCHEMA)
    assert ckpt.model_version == "golden-tiny" and ckpt.horizon_s == 5.0
    golden = json.loads(GOLDEN_OUT.read_text())
    with torch.no_grad():
        out = ckpt.net(torch.from_numpy(_golden_input()))
    np.testing.assert_allclose(out.quantiles.numpy(), np.array(golden["quantiles"]), atol=1e-5)
    np.testing.assert_allclose(out.burst_logit.numpy(), np.array(golden["burst_logit"]), atol=1e-5)
    assert GOLDEN_CKPT.stat().st_size < 32_000


def test_roundtrip_keeps_weights_and_metadata(tmp_path: Path) -> None:
    net = _tiny_net(seed=3)
    path = tmp_path / "m.safetensors"
    version = _save(path, net)
    assert version.startswith("lstm-attn-")
    ckpt = load_checkpoint(path, expect_schema=DEFAULT_SCHEMA)
    assert ckpt.model_version == version
    assert ckpt.schema == DEFAULT_SCHEMA and ckpt.normalizer == _normalizer()
    assert ckpt.net_config == net.config and ckpt.horizon_s == 5.0
    assert ckpt.meta == {"trace": "unit-test", "rows": 12}
    assert set(ckpt.code_version) == {"pdscale", "git_commit"}
    assert not ckpt.net.training
    for k, v in net.state_dict().items():
        torch.testing.assert_close(ckpt.net.state_dict()[k], v, rtol=0, atol=0)
    assert read_metadata(path)["model_version"] == version
    # same weights → same version; different weights → different version
    assert _save(tmp_path / "again.safetensors", net) == version
    assert _save(tmp_path / "other.safetensors", _tiny_net(seed=4)) != version


def test_schema_mismatch_lists_the_differences(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    _save(path)
    expected = dataclasses.replace(DEFAULT_SCHEMA, step_s=2.0, version=DEFAULT_SCHEMA.version + 1)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, expect_schema=expected)
    msg = str(err.value)
    assert str(path) in msg and "step_s: 2.0 != 1.0" in msg and "version:" in msg


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nope\.safetensors: no such checkpoint file"):
        load_checkpoint(tmp_path / "nope.safetensors")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:8] + b"\x00garbage" + b[16:], id="corrupt-header"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"this is not a checkpoint at all", id="text"),
    ],
)
def test_damaged_file_is_a_clear_error(tmp_path: Path, damage: object) -> None:
    path = tmp_path / "m.safetensors"
    _save(path)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=r"m\.safetensors: not a readable safetensors checkpoint"):
        load_checkpoint(path)


def test_plain_safetensors_without_metadata_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError, match="without pdscale metadata"):
        load_checkpoint(path)


def test_hyperparameters_that_do_not_match_the_weights(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, _tiny_net(hidden=8), DEFAULT_SCHEMA, _normalizer(), 5.0)
    big = _tiny_net(hidden=12)
    doc = read_metadata(path)
    doc["net"]["hidden"] = 12  # metadata claims hidden=12, weights are hidden=8
    tensors = {k: v.contiguous() for k, v in load_checkpoint(path).net.state_dict().items()}
    save_file(tensors, str(path), metadata={"pdscale": json.dumps(doc)})
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert "weights do not match the stored hyper-parameters" in msg
    assert (
        "lstm.weight_ih_l0: weights (32, 22)" in msg
        and str(tuple(big.state_dict()["lstm.weight_ih_l0"].shape)) in msg
    )


def test_save_refuses_inconsistent_parts(tmp_path: Path) -> None:
    net = LstmAttentionNet(7, hidden=8, heads=2, window=4)
    with pytest.raises(CheckpointError, match="n_inputs 7 != schema inputs 22"):
        save_checkpoint(tmp_path / "x.safetensors", net, DEFAULT_SCHEMA, _normalizer(), 5.0)
    with pytest.raises(CheckpointError, match="not plain JSON"):
        save_checkpoint(
            tmp_path / "y.safetensors", _tiny_net(), DEFAULT_SCHEMA, _normalizer(), 5.0, {"x": object()}
        )
    assert not list(tmp_path.iterdir())
