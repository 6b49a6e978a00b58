"""Opt-in system metrics (CPU, memory, disk, network, GPU when present) in the MLflow run.

Lightning's ``MLFlowLogger`` ignores ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``; this callback starts MLflow's
own ``SystemMetricsMonitor`` on the run (rank 0) when fit starts and stops it when fit ends or fails.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from errors import ConfigError
from tracking.figures import mlflow_logger
from tracking.mlflow_logger import PaperlabMLFlowLogger


class SystemMetrics(Callback):
    """Args:
    sampling_interval: seconds between samples.
    samples_before_logging: samples averaged into each logged point.
    """

    def __init__(self, sampling_interval: float = 10.0, samples_before_logging: int = 1) -> None:
        if sampling_interval <= 0 or samples_before_logging <= 0:
            raise ConfigError("sampling_interval and samples_before_logging must be positive")
        self.sampling_interval = sampling_interval
        self.samples_before_logging = samples_before_logging
        self._monitor = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = mlflow_logger(trainer)
        if not isinstance(logger, PaperlabMLFlowLogger) or not trainer.is_global_zero:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._monitor = SystemMetricsMonitor(
            logger.run_id,
            sampling_interval=self.sampling_interval,
            samples_before_logging=self.samples_before_logging,
            resume_logging=True,
            tracking_uri=logger.tracking_uri,
        )
        self._monitor.start()

    def _stop(self) -> None:
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()
