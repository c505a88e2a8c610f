"""The LightningModule: ``LstmAttentionNet`` trained with pinball loss (p50/p90) plus burst BCE.

Loss at every position after the burn-in: ``pinball(quantiles, y) + burst_weight * bce(burst_logit,
burst)``, both over scored (finite) targets only. AdamW, the learning rate halved when the validation loss
plateaus; gradients are clipped by the Trainer (``gradient_clip_val``).

Scale-free pinball (``naive_scaled``, on by default): each sequence's pinball loss is divided by the mean
absolute error of the last-value forecast on that same sequence (MASE-style; in normalised target space the
last-value forecast of position t is simply the target at t − horizon), floored at ``naive_floor``. Without
it the loss is dominated by bursty sequences (errors ~1 in normalised log units) and smooth traffic (errors
~0.1) never gets the long averaging it needs; with it every sequence counts by how much better than
"repeat the last H seconds" the model does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import lightning as L
import torch
from torch import Tensor

from forecaster.network import LstmAttentionNet, NetConfig, burst_bce, pinball_loss


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and loss settings.

    ``burst_weight``: weight of the burst BCE next to the pinball loss (both are O(1) in normalised units).
    ``burst_pos_weight``: up-weights the rare positive burst labels (a few % of steps).
    """

    lr: float = 3e-3
    weight_decay: float = 1e-4
    burn_in: int = 32
    burst_weight: float = 0.5
    burst_pos_weight: float = 4.0
    max_epochs: int = 30
    naive_scaled: bool = True
    naive_floor: float = 0.1
    horizon_steps: int = 5
    lr_patience: int = 3
    has_val: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.burn_in < 0:
            problems.append(f"burn_in must be >= 0, got {self.burn_in}")
        if self.burst_weight < 0 or not self.burst_pos_weight > 0:
            problems.append(
                f"burst_weight must be >= 0 and burst_pos_weight > 0, got {self.burst_weight}, "
                f"{self.burst_pos_weight}"
            )
        if self.max_epochs < 1:
            problems.append(f"max_epochs must be >= 1, got {self.max_epochs}")
        if problems:
            raise ValueError("OptimConfig: " + "; ".join(problems))


class ForecastModule(L.LightningModule):
    """Wraps the network; logs ``train_loss``, ``val_loss``, ``val_pinball``, ``val_burst_bce``, ``val_mae_p50``."""

    def __init__(
        self, net_config: dict[str, Any], optim_config: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> None:
        """``extra``: JSON-ready schema, normaliser, horizon and data summary, kept in the ``.ckpt``
        hyper-parameters so ``train-forecaster export`` can rebuild the inference checkpoint from it."""
        super().__init__()
        # plain dicts, so Lightning can store them in the .ckpt hyper-parameters and rebuild the module
        self.save_hyperparameters()
        self.extra = dict(extra or {})
        self.net_config = NetConfig.from_dict(net_config)
        self.optim = OptimConfig(**optim_config)
        self.net = LstmAttentionNet.from_config(self.net_config)

    @classmethod
    def create(
        cls, net_config: NetConfig, optim: OptimConfig, extra: dict[str, Any] | None = None
    ) -> ForecastModule:
        return cls(net_config.to_dict(), asdict(optim), extra)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.net(x)
        return out.quantiles, out.burst_logit

    def _losses(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        quantiles, logit = self(batch["x"])
        b = self.optim.burn_in
        q, y, lg, burst = quantiles[:, b:], batch["y"][:, b:], logit[:, b:], batch["burst"][:, b:]
        pin = pinball_loss(q, y, self.net_config.quantiles)
        bce = burst_bce(lg, burst, pos_weight=self.optim.burst_pos_weight)
        ok = torch.isfinite(y)
        mae = (q[..., 0] - torch.where(ok, y, q[..., 0])).abs().sum() / ok.sum().clamp_min(1)
        fit = self._scaled_pinball(q, y, batch["y"]) if self.optim.naive_scaled else pin
        return {
            "loss": fit + self.optim.burst_weight * bce,
            "pinball": pin,
            "burst_bce": bce,
            "mae_p50": mae,
            "scored": ok[..., 0].sum(),
        }

    def _scaled_pinball(self, q: Tensor, y: Tensor, y_full: Tensor) -> Tensor:
        """Per-sequence pinball over the last-value forecast's error on the same sequence (see module doc)."""
        h = self.optim.horizon_steps
        naive = (y_full[:, h:] - y_full[:, :-h]).abs()
        n_ok = torch.isfinite(naive)
        naive_err = torch.where(n_ok, naive, torch.zeros_like(naive)).sum((1, 2)) / n_ok.sum(
            (1, 2)
        ).clamp_min(1)
        weight = 1.0 / naive_err.clamp_min(self.optim.naive_floor)
        levels = torch.as_tensor(self.net_config.quantiles, dtype=q.dtype, device=q.device)
        ok = torch.isfinite(y)
        err = torch.where(ok, y, torch.zeros_like(y)).unsqueeze(-1) - q
        loss = torch.maximum(levels * err, (levels - 1.0) * err).mean(-1) * ok.to(q.dtype)
        per_seq = loss.sum((1, 2)) / ok.sum((1, 2)).clamp_min(1)
        return (weight * per_seq).sum() / weight.sum()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        losses = self._losses(batch)
        n = batch["x"].shape[0]
        self.log("train_loss", losses["loss"], prog_bar=True, batch_size=n, on_step=True, on_epoch=True)
        self.log("train_pinball", losses["pinball"], batch_size=n, on_epoch=True)
        self.log("train_burst_bce", losses["burst_bce"], batch_size=n, on_epoch=True)
        return losses["loss"]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        losses = self._losses(batch)
        n = int(losses["scored"].item()) or 1
        self.log("val_loss", losses["loss"], prog_bar=True, batch_size=n, sync_dist=True)
        self.log("val_pinball", losses["pinball"], batch_size=n, sync_dist=True)
        self.log("val_burst_bce", losses["burst_bce"], batch_size=n, sync_dist=True)
        self.log("val_mae_p50", losses["mae_p50"], batch_size=n, sync_dist=True)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.optim.lr, weight_decay=self.optim.weight_decay)
        # on a plateau rather than a fixed schedule: runs are often cut by --max-minutes, not by epochs
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="min", factor=0.5, patience=self.optim.lr_patience, min_lr=self.optim.lr / 32
        )
        monitor = "val_loss" if self.optim.has_val else "train_loss"
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": "epoch", "monitor": monitor},
        }
