"""The two checkpoints of a run: the best epoch's weights, and the last training state to resume from.

- ``BestCheckpoint`` (``best-epoch<NNN>.ckpt``): the weights and hyperparameters of the epoch with the best
  value of the module's ``monitor``, for ``test``/``predict --ckpt_path best``. Weights only: the
  optimizer and loop state would make every improvement cost a full save.
- ``LastCheckpoint`` (``last.ckpt``): the full training state (weights, optimizer, loops, callbacks, the
  data order), independent of the best, for ``fit --ckpt_path last``. Written at an epoch end when at least
  ``min_interval_s`` seconds have passed since the previous write, within an epoch every ``every_s``
  seconds when the training data is resumable mid-epoch (paperlab's loaders are), and always when training
  ends. An interrupt therefore loses at most ``every_s`` seconds, or one epoch, or ``min_interval_s``
  seconds of epochs shorter than that. Epochs of tiny models take a fraction of a second; a full save and
  the metrics flush that goes with it cost tens of milliseconds, which would otherwise double such a run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from errors import ConfigError

LAST = "last.ckpt"


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` keeping the single best epoch's weights by ``monitor`` (see the module docstring).

    Lightning reads a callback's ``state_key`` on every hook call and ``ModelCheckpoint`` formats it from
    its arguments each time; they never change, so it is built once.
    """

    def __init__(self, dirpath: str, monitor: str | None = None, mode: str = "max") -> None:
        super().__init__(
            dirpath=dirpath, filename="best-epoch{epoch:03d}", auto_insert_metric_name=False, monitor=monitor,
            mode=mode, save_top_k=1, save_last=False, save_weights_only=True,
        )
        self._key = super().state_key

    @property
    def state_key(self) -> str:
        return self._key


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` with the whole training state (see the module docstring).

    Args:
        dirpath: the run's checkpoint folder.
        min_interval_s: skip an epoch-end write when the previous one is more recent than this (0: every
            epoch end).
        every_s: also write within an epoch once this many seconds have passed since the previous write
            (only when every training loader is resumable: ``state_dict``/``load_state_dict``).
    """

    save_weights_only = False  # what the MLflow logger reads: metrics are flushed with resumable saves

    def __init__(self, dirpath: str, min_interval_s: float = 1.0, every_s: float = 300.0) -> None:
        if min_interval_s < 0 or every_s <= 0:
            raise ConfigError(f"min_interval_s must be >= 0 and every_s > 0, got {min_interval_s}, {every_s}")
        self.dirpath = dirpath
        self.min_interval_s = min_interval_s
        self.every_s = every_s
        self._written_at: float | None = None
        self._started_at = time.monotonic()
        self._written_step = -1
        self._resumable = False

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / LAST

    def save(self, trainer: L.Trainer) -> None:
        """Write ``last.ckpt`` now (every rank calls it; the strategy writes once)."""
        trainer.save_checkpoint(str(self.path), weights_only=False)
        self._written_at = time.monotonic()
        self._written_step = trainer.global_step
        for logger in trainer.loggers:
            logger.after_save_checkpoint(self)

    def _elapsed(self) -> float:
        return time.monotonic() - (self._written_at if self._written_at is not None else self._started_at)

    @staticmethod
    def _agreed(trainer: L.Trainer, due: bool) -> bool:
        # the same decision on every rank (save_checkpoint is collective): rank 0's clock decides
        return bool(trainer.strategy.broadcast(due, src=0)) if trainer.world_size > 1 else due

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started_at = time.monotonic()
        loaders = trainer.train_dataloader
        loaders = loaders.values() if isinstance(loaders, dict) else loaders if isinstance(loaders, list | tuple) else [loaders]
        self._resumable = all(callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None))
                              for x in loaders)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._resumable or (trainer.world_size > 1 and batch_idx % 50):
            return  # under DDP the clock is agreed on every 50th batch: a collective per step would cost
        if self._agreed(trainer, self._elapsed() >= self.every_s):
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._agreed(trainer, self._written_at is None or self._elapsed() >= self.min_interval_s):
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._written_step:
            self.save(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"written_step": self._written_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._written_step = int(state_dict.get("written_step", -1))
