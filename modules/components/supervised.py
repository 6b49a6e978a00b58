"""``SupervisedTask``: a network passed in, trained on ``(x, y)`` batches with cross-entropy or squared error.

The task every method that trains a generic architecture shares (the reference MLP, weight drift): the
network is a *task network* chosen by ``class_path`` in the YAML and built here with the sizes the CLI
links from the DataModule, ``net(input_shape, num_classes)``. Classification of ``x`` (logits ``(B, C)``)
and next-token prediction (logits ``(B, T, V)`` against ``y (B, T)``) are the same loss on flattened rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.metrics import Accuracy
from modules.components.mlp import MLP

#: builds a task network from one sample's shape and the number of outputs
NetFactory = Callable[[tuple[int, ...], int], nn.Module]


class SupervisedTask(PaperTask, abstract=True):
    """``net(x)`` against integer targets ``y``; logs ``<stage>/loss``, ``<stage>/acc`` (and ``/bpc`` for tokens).

    Args:
        net: the task network, ``net(input_shape, num_classes) -> nn.Module`` (``class_path`` of an MLP,
            ResNet, ViT, TinyGPT ... with its ``init_args``; the two sizes come from the data).
        loss: ``ce`` (cross-entropy) or ``mse`` (squared error to one-hot targets, mean over classes).
        input_shape: one input sample's shape (linked from the DataModule).
        num_classes: outputs; the vocabulary for next-token data (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``.
    """

    def __init__(
        self,
        net: NetFactory = lambda shape, n: MLP(shape, n, hidden=[64, 64], activation="relu"),
        loss: Literal["ce", "mse"] = "ce",
        input_shape: tuple[int, ...] = (4,),
        num_classes: int = 3,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"acc": Accuracy(), "bpc": WeightedMean()})
        self.loss_kind = loss
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.net = net(self.input_shape, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def diagnostic_forward(self, batch: Any) -> Tensor:
        """The forward pass on a batch's inputs (``modules.protocols.DiagnosticForward``)."""
        return self(batch[0])

    def loss_fn(self, logits: Tensor, y: Tensor, reduction: Literal["mean", "none"] = "mean") -> Tensor:
        """The loss of ``logits (N, C)`` against ``y (N,)``: their mean, or one value per row."""
        if self.loss_kind == "ce":
            return F.cross_entropy(logits, y, reduction=reduction)
        per_row = F.mse_loss(logits, F.one_hot(y, self.num_classes).to(logits.dtype), reduction="none").mean(-1)
        return per_row.mean() if reduction == "mean" else per_row

    def per_sample_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """``modules.protocols.PerSampleLoss``: each sample's loss (its tokens' mean), ``(B,)``."""
        x, y = batch
        logits = self(x)
        rows = self.loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        return rows.reshape(y.shape[0], -1).mean(1)

    def step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> StepOutput:
        x, y = batch
        logits = self(x)
        tokens = logits.dim() == 3
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        loss = self.loss_fn(logits, y)
        # bits per token: the token-weighted cross-entropy in bits, for next-token data only
        bpc = (loss / math.log(2), y.numel()) if tokens and self.loss_kind == "ce" else None
        return StepOutput(loss, n=y.numel(), preds=logits.argmax(-1), target=y, inputs={"bpc": bpc})

    def predict_batch(self, batch: Any) -> Tensor:
        """Class probabilities."""
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return self(x).softmax(-1)
