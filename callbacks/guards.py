"""Stop cleanly on a NaN/inf loss and mark Ctrl-C as KILLED with a checkpoint written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from errors import ConfigError, NonFiniteLossError

__all__ = ["FiniteLossGuard", "InterruptCheckpoint", "NonFiniteLossError"]


class FiniteLossGuard(Callback):
    """Stop training at a NaN/inf loss, naming the step where it first appeared.

    The step losses are kept (detached, on their device) and checked together every
    ``check_every_n_steps`` steps and before every validation and epoch end, so the guard adds no per-step
    host sync on a GPU and no checkpoint is ever written from non-finite weights. The exception marks the
    MLflow run FAILED; the last checkpoint written before the bad step stays the newest one.
    """

    def __init__(self, check_every_n_steps: int = 10) -> None:
        if check_every_n_steps <= 0:
            raise ConfigError(f"check_every_n_steps must be positive, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        self._losses: list[torch.Tensor] = []
        self._steps: list[int] = []
        self._step = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step = trainer.global_step  # the optimizer step this batch contributes to

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        self._losses.append(loss.detach().reshape(-1)[:1])
        self._steps.append(self._step)
        if len(self._losses) >= self.check_every_n_steps:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        if not self._losses:
            return
        bad = ~torch.isfinite(torch.cat(self._losses))
        steps, self._losses, self._steps = self._steps, [], []
        if bool(bad.any()):
            first = steps[int(bad.nonzero()[0])]
            raise NonFiniteLossError(
                f"the training loss became NaN or infinite at step {first} (epoch {trainer.current_epoch}); "
                "training stopped, the MLflow run is marked FAILED and the last good checkpoint is kept. "
                "Lower the learning rate, check the data, or enable gradient clipping "
                "(--trainer.gradient_clip_val)"
            )

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)


class InterruptCheckpoint(Callback):
    """On Ctrl-C: write ``interrupted.ckpt`` into ``dirpath`` (the MLflow logger marks the run KILLED).

    ``last.ckpt`` stays the last epoch-end checkpoint, so ``--ckpt_path last`` resumes exactly (mid-epoch
    state of the data order is not saved); ``interrupted.ckpt`` keeps the weights at the interruption.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt):
            return
        if self.dirpath and trainer.state.fn == "fit":
            trainer.save_checkpoint(str(Path(self.dirpath) / "interrupted.ckpt"), weights_only=False)
