"""The two tasks of FRAC (paper 002-02), both on a ``FracSSMNet`` passed in as the ``net`` factory:
``FracSSMLM`` (token sequences) and ``FracSSMRegressor`` (real series)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.supervised import NetFactory
from modules.frac_ssm.metrics import LAG_BUCKETS, LagAccuracy
from modules.frac_ssm.net import FracSSMNet


class _FracSSMTask(PaperTask, abstract=True):
    """What both tasks share: the network's memory kernels and fractional orders."""

    paper_id = "002-02"
    net: FracSSMNet

    def _make_net(self, net: NetFactory, input_shape: tuple[int, ...], out_dim: int) -> FracSSMNet:
        built = net(tuple(input_shape), out_dim)
        if not isinstance(built, FracSSMNet):  # the tasks read its backbone, embedding and head
            raise ConfigError(f"net must build a modules.frac_ssm.net.FracSSMNet, got {type(built).__name__}")
        return built

    def memory_kernels(self, batch: Any) -> list[Tensor]:
        """``modules.protocols.MemoryKernels``: per layer, the log of every channel's realised memory kernel
        ``(C, L - 1)`` at lags ``1 .. L - 1`` under the ``Delta`` the layer computes on the batch (an impulse
        at the first position; ``SelectiveSSMBlock.log_memory_kernel``)."""
        was = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self.net.backbone.log_memory_kernels(self.net.embed(batch[0]))
        finally:
            self.train(was)

    def alphas(self) -> list[Tensor]:
        """``alpha_c`` of every layer (empty for the exponential kernel)."""
        return [a.detach() for b in self.net.backbone.blocks if (a := b.alpha()) is not None]

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        if stage == "train" and self.alphas():
            out["train/alpha_mean"] = torch.cat(self.alphas()).mean()
        return out


class FracSSMLM(_FracSSMTask):
    """FRAC (or its exponential baseline) on token sequences.

    Batches ``(tokens (B, L), targets (B, L), lags (B, L))`` (``datamodules.long_memory``; targets -100 where
    no answer is due) or plain next-token ``(x (B, L), y (B, L))``. Loss: cross-entropy over the answered
    positions. Logs ``acc`` and, for recall batches, ``acc_lag1_32``, ``acc_lag32_256`` and
    ``acc_lag256_1024`` (answers with lag in [1, 32), [32, 256), >= 256).

    Args:
        net: the network ``net(input_shape, vocab_size)``, a ``modules.frac_ssm.net.FracSSMNet`` (its
            ``init_args``: the kernel, widths, rate grid; default: d_model 128, 4 layers, FRAC).
        vocab_size: token vocabulary (linked from the DataModule).
        input_shape: one sequence's shape ``(L,)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask`` (default AdamW, lr 1e-3).
    """

    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = FracSSMNet,
        vocab_size: int = 64,
        input_shape: tuple[int, ...] = (1100,),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"acc": LagAccuracy()}
        for lo, hi in LAG_BUCKETS:
            metrics[f"acc_lag{lo}_{hi}"] = LagAccuracy(lo, hi if hi != LAG_BUCKETS[-1][1] else None)
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if vocab_size < 2:
            raise ConfigError(f"vocab_size must be >= 2, got {vocab_size}")
        if len(input_shape) != 1:
            raise ConfigError(f"FracSSMLM takes token sequences of shape (L,), got input_shape {tuple(input_shape)}")
        self.vocab_size = vocab_size
        self.net = self._make_net(net, input_shape, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``(B, L, V)``."""
        return self.net(tokens)

    @torch.no_grad()
    def decode_logits(self, tokens: Tensor, prefix: int = 0) -> Tensor:
        """Logits ``(B, L, V)`` with the first ``prefix`` tokens prefilled by the parallel scan and the rest
        decoded one token at a time with the bounded recurrent state (equal to ``forward`` up to rounding)."""
        net = self.net
        tokens = tokens.long()
        b, n_len = tokens.shape
        out = []
        if prefix > 0:
            h, states = net.backbone.prefill(net.embed(tokens[:, :prefix]))
            out.append(net.head(h))
        else:
            states = net.backbone.init_states(b, net.embedding.weight.dtype)
        for t in range(prefix, n_len):
            h_t, states = net.backbone.step(net.embed(tokens[:, t]), states)
            out.append(net.head(h_t)[:, None])
        return torch.cat(out, 1)

    def step(self, batch: tuple[Tensor, ...], stage: Stage) -> StepOutput:
        if len(batch) == 3:
            tokens, targets, lags = batch
        elif len(batch) == 2:
            (tokens, targets), lags = batch, None
        else:
            raise ConfigError(f"FracSSMLM takes (tokens, targets[, lags]) batches, got {len(batch)} tensors")
        targets = targets.long()
        h = self.net.hidden(tokens)
        mask = targets != -100
        logits = self.net.head(h[mask])  # only where an answer is due
        y = targets[mask]
        loss = F.cross_entropy(logits, y)
        preds = logits.argmax(-1)
        lag = lags[mask].long() if lags is not None else None
        inputs: dict[str, Any] = {"acc": (preds, y, torch.zeros_like(y) if lag is None else lag)}
        for lo, hi in LAG_BUCKETS:
            inputs[f"acc_lag{lo}_{hi}"] = (preds, y, lag) if lag is not None else None
        return StepOutput(loss, n=int(y.numel()), inputs=inputs)


class FracSSMRegressor(_FracSSMTask):
    """FRAC (or its exponential baseline) for next-step prediction of real series (ARFIMA).

    Batches ``(x (B, L, 1), y (B, L)[, y_opt (B, L)])``: ``y_t`` is the value after ``x_t``; ``y_opt`` an
    optimal predictor's forecast. Loss: MSE over all positions. Logs ``mse``, ``mse_opt`` (the optimal
    predictor's MSE on the same batches) and ``mse_ratio = mse / mse_opt`` when ``y_opt`` is given.

    Args:
        net: the network ``net(input_shape, 1)``, a ``modules.frac_ssm.net.FracSSMNet`` (see ``FracSSMLM``).
        input_shape: one series' shape ``(L, features)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask`` (default AdamW, lr 1e-3).
    """

    monitor = "val/mse"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = FracSSMNet,
        input_shape: tuple[int, ...] = (1100, 1),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"mse": WeightedMean(), "mse_opt": WeightedMean()})
        if len(input_shape) != 2:
            raise ConfigError(f"FracSSMRegressor needs series of shape (L, features), got input_shape {input_shape}")
        self.net = self._make_net(net, input_shape, 1)  # one prediction per step: the next value

    def forward(self, x: Tensor) -> Tensor:
        """Predictions ``(B, L)`` of the next value."""
        return self.net(x)[..., 0]

    def step(self, batch: tuple[Tensor, ...], stage: Stage) -> StepOutput:
        x, y = batch[0], batch[1]
        pred = self(x)
        loss = F.mse_loss(pred, y)
        n = int(y.numel())
        inputs: dict[str, Any] = {"mse": (loss.detach(), n), "mse_opt": None}
        if len(batch) > 2:
            inputs["mse_opt"] = (F.mse_loss(batch[2], y), n)
        return StepOutput(loss, n=n, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out = super().extra_epoch_metrics(stage, values)
        if f"{stage}/mse_opt" in values:
            out[f"{stage}/mse_ratio"] = values[f"{stage}/mse"] / values[f"{stage}/mse_opt"]
        return out
