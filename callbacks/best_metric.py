"""Log ``<monitor>_best`` next to the monitored metric: the MLflow table shows a metric's last value."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from errors import ConfigError


def improves(value: float, best: float | None, mode: str) -> bool:
    """Whether ``value`` is better than ``best`` (None: nothing yet) for a metric whose ``mode`` is ``max`` or
    ``min`` (a seed-parallel fit keeps one best per seed with it)."""
    return best is None or (value > best if mode == "max" else value < best)


class BestMetric(Callback):
    """After every validation, log the best value so far of ``monitor`` as ``<monitor>_best``.

    Args:
        monitor: the metric name, for example ``val/acc``.
        mode: ``max`` or ``min``.
    """

    def __init__(self, monitor: str = "val/acc", mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ConfigError(f"mode must be 'max' or 'min', got {mode!r}")
        self.monitor = monitor
        self.mode = mode
        self.best: float | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])
        if math.isfinite(value) and improves(value, self.best, self.mode):
            self.best = value
        if self.best is not None and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({f"{self.monitor}_best": self.best}, step=trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")
