"""Reference method: an MLP classifier that proves the pipe (data -> module -> callbacks -> MLflow).

Not a paper: the baseline every paper's method is compared with, and the smallest complete example of the
project's conventions (typed arguments with defaults, torchmetrics per stage, epoch-level logging).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchmetrics
from lightning import LightningModule
from torch import Tensor

from modules.components.epoch_metrics import EpochMetrics
from modules.components.mlp import MLP


class MLPClassifier(LightningModule):
    """Softmax classifier ``MLP(in_dim -> hidden -> num_classes)`` trained with cross-entropy and Adam.

    Args:
        in_dim: number of input features.
        num_classes: number of classes.
        hidden: widths of the hidden layers.
        activation: activation after every hidden layer (``modules.components.activations``).
        lr: Adam learning rate.
        weight_decay: Adam (decoupled, AdamW) weight decay.
        lr_step, lr_gamma: StepLR schedule (multiply the lr by ``lr_gamma`` every ``lr_step`` epochs;
            ``lr_step = 0`` keeps it constant).
    """

    paper_id = "reference"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        in_dim: int = 4,
        num_classes: int = 3,
        hidden: list[int] = [64, 64],  # noqa: B006 - jsonargparse shows the default in --help
        activation: str = "relu",
        lr: float = 1e-2,
        weight_decay: float = 0.0,
        lr_step: int = 0,
        lr_gamma: float = 1.0,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.save_hyperparameters()
        self.net = MLP(in_dim, hidden, num_classes, activation=activation)
        acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.epoch_metrics = EpochMetrics({"acc": acc})

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        if x.flatten(1).shape[-1] != self.hparams.in_dim:
            raise ValueError(
                f"the data has {x.flatten(1).shape[-1]} features but the model expects in_dim="
                f"{self.hparams.in_dim}; set --model.init_args.in_dim"
            )
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.epoch_metrics.update(stage, loss, logits.argmax(-1), y)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def on_train_epoch_end(self) -> None:
        self.epoch_metrics.log_epoch(self, "train")

    def on_validation_epoch_end(self) -> None:
        self.epoch_metrics.log_epoch(self, "val")

    def on_test_epoch_end(self) -> None:
        self.epoch_metrics.log_epoch(self, "test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self):  # noqa: ANN201 - Lightning accepts several return shapes
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if self.hparams.lr_step <= 0:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=self.hparams.lr_step, gamma=self.hparams.lr_gamma)
        return {"optimizer": opt, "lr_scheduler": sched}
