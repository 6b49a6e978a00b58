"""Paper 000-09 (Bug or Feature²): train an MLP, ResNet, ViT or tiny GPT with a chosen activation, loss and
optimiser, so the ``WeightDrift`` and ``ActivationStats`` callbacks can watch what the weights reading
``h = phi(z)`` do.

The paper's mechanism: for ``z' = W h + b`` with ``h >= 0`` (or mostly positive, ``E[phi(z)] > 0``),
``dL/dW = (dL/dz') h^T``; if ``E[dL/dz']`` is non-negative on the units that fire, the expected gradient
is non-negative and descent drives the mean of ``W`` negative, which zeroes more ReLUs (sparsity).
Whether that holds depends on the loss and optimiser: this module makes both selectable.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchmetrics
from lightning import LightningModule
from torch import Tensor, nn

from modules.components.epoch_metrics import EpochMetrics
from modules.components.mlp import MLP
from modules.components.resnet import ResNet
from modules.components.tiny_gpt import TinyGPT
from modules.components.vit import ViT

ARCHS = ("mlp", "resnet", "vit", "gpt")


class WeightDriftModel(LightningModule):
    """One LightningModule for the four architectures of the paper, classification or next-token prediction.

    Args:
        arch: ``mlp`` | ``resnet`` | ``vit`` (classification of ``x``) or ``gpt`` (next-character prediction,
            batches ``(x (B, T), y (B, T))``).
        activation: phi, the hidden activation (``modules.components.activations``).
        loss: ``ce`` (cross-entropy) or ``mse`` (squared error to one-hot targets, mean over classes).
        optimizer: ``sgd`` or ``adamw``; ``lr``, ``momentum`` (SGD), ``betas`` (AdamW), ``weight_decay``
            (0 by default: decay pulls weights to 0 and masks the drift).
        in_dim, num_classes, hidden, init: the MLP (``init="kaiming"``: He-normal weights, zero biases;
            ``"default"``: PyTorch's uniform init).
        image_size, in_channels: image geometry for ResNet and ViT.
        resnet_widths, resnet_blocks: ResNet stage widths and blocks per stage.
        vit_patch, vit_dim, vit_depth, vit_heads: ViT geometry.
        vocab_size, block_size, n_layer, n_head, n_embd: the tiny GPT (defaults: minGPT's gpt-nano).
    """

    paper_id = "000-09"
    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(
        self,
        arch: str = "mlp",
        activation: str = "relu",
        loss: str = "ce",
        optimizer: str = "adamw",
        lr: float = 1e-3,
        momentum: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        in_dim: int = 64,
        num_classes: int = 10,
        hidden: list[int] = [256, 256, 256],  # noqa: B006 - jsonargparse shows the default in --help
        init: str = "kaiming",
        image_size: int = 8,
        in_channels: int = 1,
        resnet_widths: list[int] = [16, 32, 64],  # noqa: B006
        resnet_blocks: int = 1,
        vit_patch: int = 2,
        vit_dim: int = 48,
        vit_depth: int = 3,
        vit_heads: int = 3,
        vocab_size: int = 128,
        block_size: int = 64,
        n_layer: int = 3,
        n_head: int = 3,
        n_embd: int = 48,
    ) -> None:
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")
        if loss not in ("ce", "mse"):
            raise ValueError(f"unknown loss {loss!r}; choose 'ce' or 'mse'")
        if optimizer not in ("sgd", "adamw"):
            raise ValueError(f"unknown optimizer {optimizer!r}; choose 'sgd' or 'adamw'")
        if init not in ("kaiming", "default"):
            raise ValueError(f"unknown init {init!r}; choose 'kaiming' or 'default'")
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.save_hyperparameters()
        self.net = self.build_net()
        self.n_out = vocab_size if arch == "gpt" else num_classes
        acc = torchmetrics.classification.MulticlassAccuracy(self.n_out, average="micro", validate_args=False)
        self.epoch_metrics = EpochMetrics({"acc": acc})

    def build_net(self) -> nn.Module:
        h = self.hparams
        if h.arch == "mlp":
            net = MLP(h.in_dim, h.hidden, h.num_classes, activation=h.activation)
            if h.init == "kaiming":
                for m in net.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                        nn.init.zeros_(m.bias)
            return net
        if h.arch == "resnet":
            return ResNet(h.in_channels, h.num_classes, h.resnet_widths, h.resnet_blocks, h.activation)
        if h.arch == "vit":
            return ViT(
                h.image_size,
                h.vit_patch,
                h.in_channels,
                h.num_classes,
                h.vit_dim,
                h.vit_depth,
                h.vit_heads,
                activation=h.activation,
            )
        return TinyGPT(h.vocab_size, h.block_size, h.n_layer, h.n_head, h.n_embd, activation=h.activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def diagnostic_forward(self, batch: tuple[Tensor, ...]) -> Tensor:
        """The forward pass on a batch's inputs (the protocol diagnostic callbacks call)."""
        return self(batch[0])

    def _loss(self, logits: Tensor, y: Tensor) -> Tensor:
        logits, y = logits.reshape(-1, self.n_out), y.reshape(-1)
        if self.hparams.loss == "ce":
            return F.cross_entropy(logits, y)
        return F.mse_loss(logits, F.one_hot(y, self.n_out).to(logits.dtype))

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        if self.hparams.arch == "mlp" and x.flatten(1).shape[-1] != self.hparams.in_dim:
            raise ValueError(
                f"the data has {x.flatten(1).shape[-1]} features but the model expects in_dim="
                f"{self.hparams.in_dim}; set --model.init_args.in_dim"
            )
        if self.hparams.arch in ("resnet", "vit") and x.dim() != 4:
            raise ValueError(
                f"{self.hparams.arch} needs images (B, C, H, W): set data.init_args.image_shape: true"
            )
        logits = self(x)
        loss = self._loss(logits, y)
        # Weighted by targets (tokens for the GPT), logged once per epoch: per-step self.log costs ~1 ms.
        self.epoch_metrics.update(stage, loss, logits.reshape(-1, self.n_out).argmax(-1), y.reshape(-1))
        return loss

    def _log_epoch(self, stage: str) -> None:
        logged = self.epoch_metrics.log_epoch(self, stage)
        if self.hparams.arch == "gpt" and self.hparams.loss == "ce" and f"{stage}/loss" in logged:
            self.log(f"{stage}/bpc", logged[f"{stage}/loss"] / math.log(2), on_step=False, on_epoch=True)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        h = self.hparams
        params = self.trainer.model.parameters() if self._trainer is not None else self.parameters()
        if h.optimizer == "sgd":
            return torch.optim.SGD(params, lr=h.lr, momentum=h.momentum, weight_decay=h.weight_decay)
        return torch.optim.AdamW(params, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay)
