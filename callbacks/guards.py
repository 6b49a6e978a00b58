"""Stop cleanly on a NaN/inf or diverged loss and mark Ctrl-C as KILLED with a checkpoint written."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.checkpoints import LastCheckpoint
from errors import ConfigError, NonFiniteLossError

__all__ = ["DivergedLossError", "FiniteLossGuard", "InterruptCheckpoint", "NonFiniteLossError"]


class DivergedLossError(NonFiniteLossError):
    """Training produced a finite loss past the guard's bound (a learning rate far too high)."""


class FiniteLossGuard(Callback):
    """Stop training at a NaN/inf loss or a diverged one, naming the step where it first appeared.

    The step losses are kept (detached, on their device) and checked together every
    ``check_every_n_steps`` steps and before every validation and epoch end: one host sync per check, none
    per step (a GPU keeps running ahead), and no checkpoint is ever written from weights past a bad step.
    Lightning's ``EarlyStopping(check_finite=True, divergence_threshold=...)`` checks a logged metric at
    validation only (epochs late for a step-level blow-up), needs a threshold per task, and stops the fit as
    a success: the run would end FINISHED at chance level. Here the exception marks the MLflow run FAILED.

    Args:
        check_every_n_steps: steps between checks (each check is one host sync).
        divergence_factor: a finite loss whose magnitude exceeds this multiple of the first checked loss's
            (at least 1.0, so a loss that starts near zero is not held to a bound near zero) counts as
            diverged; None: only NaN/inf stop. 1e4: a loss ten thousand times its start (and at least 1e4) is
            not training any more (``--model.optimizer.lr 1e6`` on yinyang reaches 8.5e18), and a bound that
            loose leaves room for losses that rise before they fall.
        max_loss: an absolute bound on the loss's magnitude instead of the relative one.
    """

    def __init__(self, check_every_n_steps: int = 10, divergence_factor: float | None = 1e4,
                 max_loss: float | None = None) -> None:
        if check_every_n_steps <= 0:
            raise ConfigError(f"check_every_n_steps must be positive, got {check_every_n_steps}")
        if divergence_factor is not None and divergence_factor <= 1 or max_loss is not None and max_loss <= 0:
            raise ConfigError(f"divergence_factor must be > 1 and max_loss > 0, got {divergence_factor}, {max_loss}")
        self.check_every_n_steps = check_every_n_steps
        self.divergence_factor = divergence_factor
        self.max_loss = max_loss
        self.bound: float | None = max_loss  # set at the first check from the first loss, kept in checkpoints
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
        # one tensor op per step (about 1 us) for the usual scalar loss; its first element otherwise
        loss = loss.detach()
        self._losses.append(loss if loss.dim() == 0 else loss.reshape(-1)[0])
        self._steps.append(self._step)
        if len(self._losses) >= self.check_every_n_steps:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        if not self._losses:
            return
        losses = torch.stack(self._losses)
        steps, self._losses, self._steps = self._steps, [], []
        if self.bound is None and self.divergence_factor is not None:
            first = float(losses[0])  # one extra sync, once per run
            if math.isfinite(first):
                self.bound = self.divergence_factor * max(abs(first), 1.0)
        # |loss| <= bound is False for NaN and for +-inf too: one comparison checks both (an infinite bound
        # would let an infinite loss through, so it falls back to the finiteness check)
        if self.bound is not None and math.isfinite(self.bound):
            good = losses.abs() <= self.bound
        else:
            good = torch.isfinite(losses)
        if bool(good.all()):
            return
        bad = ~good
        i = int(bad.nonzero()[0])
        value = float(losses[i])
        kept = self._last_checkpoint(trainer)
        after = (f"the last checkpoint before it, {kept}, is kept" if kept else "no checkpoint had been written yet")
        fix = "Lower the learning rate, check the data, or enable gradient clipping (--trainer.gradient_clip_val)"
        where = f"at step {steps[i]} (epoch {trainer.current_epoch})"
        if math.isfinite(value):
            raise DivergedLossError(
                f"the training loss diverged {where}: {value:.3g} is past the guard's bound {self.bound:.3g}; "
                f"training stopped, the MLflow run is marked FAILED and {after}. {fix}, or set the bound "
                "(a FiniteLossGuard in trainer.callbacks with divergence_factor or max_loss)"
            )
        raise NonFiniteLossError(
            f"the training loss became NaN or infinite {where}; training stopped, the MLflow run is marked FAILED "
            f"and {after}. {fix}"
        )

    @staticmethod
    def _last_checkpoint(trainer: L.Trainer) -> Path | None:
        """The newest resumable checkpoint on disk (``last.ckpt``), if one was written."""
        for callback in trainer.callbacks:
            if isinstance(callback, LastCheckpoint) and callback.path.is_file():
                return callback.path
        return None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"bound": self.bound}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.max_loss is None:  # a resume keeps the bound its first loss set, not the resumed step's loss
            self.bound = state_dict.get("bound")


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
